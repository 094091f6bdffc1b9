//! GGUF import of the architectures and rope scalings llama.cpp writes with their own keys and
//! tensors: a tiny Hugging Face fixture written out as a GGUF the way llama.cpp's converter
//! names and describes it (f32 tensors), converted back, gives the same logits as the fixture
//! converted directly — Gemma-3 (norms stored as `1 + w`, the sliding-window pattern, the
//! sliding layers' base), Qwen2 with YaRN (`rope.scaling.*`), Phi-3 with LongRoPE
//! (`rope_factors_short/long.weight`, `rope.scaling.attn_factor`), GPT-OSS (stacked experts with
//! biases, the router's bias, `attn_sinks`, the sliding pattern, YaRN), Qwen2 with a linear
//! scaling, and Llama-3 with its llama3 scaling carried only by `rope_freqs.weight` (q/k rows
//! permuted the llama.cpp way). Metadata errors (an unknown rope type, `dynamic`, which
//! llama.cpp's GGUF keys cannot carry, a missing factor or factors tensor, GPT-OSS without its
//! sliding window or expert count) are refused naming the key or tensor.

mod common;

use fastllm::convert::{convert, ConvertOptions, TargetDtype};
use fastllm::data::{encode_from_f32, DataType};
use fastllm::format::flm::{FlmFile, LoadMode};
use fastllm::format::gguf::GgufFile;
use fastllm::model::{Model, Precision};
use fastllm::Executor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-gguf-archs-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn fixture(arch: &str) -> PathBuf {
    common::tiny_fixture(arch)
}

/// A GGUF metadata value: its type code and encoded bytes.
type Kv = (String, u32, Vec<u8>);

fn gstr(v: &str) -> Vec<u8> {
    let mut b = (v.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(v.as_bytes());
    b
}
fn kv_str(k: &str, v: &str) -> Kv {
    (k.into(), 8, gstr(v))
}
fn kv_u32(k: &str, v: usize) -> Kv {
    (k.into(), 4, (v as u32).to_le_bytes().to_vec())
}
fn kv_f32(k: &str, v: f32) -> Kv {
    (k.into(), 6, v.to_le_bytes().to_vec())
}
fn kv_bools(k: &str, v: &[bool]) -> Kv {
    let mut b = 7u32.to_le_bytes().to_vec();
    b.extend_from_slice(&(v.len() as u64).to_le_bytes());
    b.extend(v.iter().map(|&x| x as u8));
    (k.into(), 9, b)
}

/// A GGUF v3 file of `kv` and f32 `tensors` (name, row-major dims, values).
fn gguf_bytes(kv: &[Kv], tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
    let typed: Vec<Typed> = tensors
        .iter()
        .map(|(n, d, v)| (n.clone(), d.clone(), F32, f32_bytes(v)))
        .collect();
    gguf_typed_bytes(kv, &typed)
}

/// ggml type codes of the test files.
const F32: u32 = 0;
const MXFP4: u32 = 39;

/// A tensor of any ggml type: name, row-major dims, type code, its bytes.
type Typed = (String, Vec<usize>, u32, Vec<u8>);

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A GGUF v3 file of `kv` and `tensors`.
fn gguf_typed_bytes(kv: &[Kv], tensors: &[Typed]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    for (k, t, v) in kv {
        b.extend(gstr(k));
        b.extend_from_slice(&t.to_le_bytes());
        b.extend_from_slice(v);
    }
    let mut off = 0u64;
    for (name, dims, ty, data) in tensors {
        b.extend(gstr(name));
        b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims.iter().rev() {
            b.extend_from_slice(&(*d as u64).to_le_bytes());
        }
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&off.to_le_bytes());
        off += (data.len() as u64).div_ceil(32) * 32;
    }
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    for (_, _, _, data) in tensors {
        b.extend_from_slice(data);
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
    }
    b
}

/// A byte-level tokenizer of `n` tokens as GGUF metadata (the 256 byte symbols, then fillers).
fn tokenizer_kv(n: usize) -> Vec<Kv> {
    let mut arr = 8u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&(n as u64).to_le_bytes());
    let mut extra = 0u32;
    for i in 0..n as u32 {
        let t = if i < 256 {
            let printable =
                (33..=126).contains(&i) || (161..=172).contains(&i) || (174..=255).contains(&i);
            if printable {
                char::from_u32(i).unwrap().to_string()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap().to_string()
            }
        } else {
            format!("<t{i}>")
        };
        arr.extend(gstr(&t));
    }
    let mut merges = 8u32.to_le_bytes().to_vec();
    merges.extend_from_slice(&1u64.to_le_bytes());
    merges.extend(gstr("a b"));
    vec![
        kv_str("tokenizer.ggml.model", "gpt2"),
        kv_str("tokenizer.ggml.pre", "gpt-2"),
        ("tokenizer.ggml.tokens".into(), 9, arr),
        ("tokenizer.ggml.merges".into(), 9, merges),
    ]
}

/// llama.cpp's name of HF tensor `name` in architecture `arch`.
fn gguf_name(arch: &str, name: &str) -> String {
    match name {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.").unwrap();
    let (layer, rest) = rest.split_once('.').unwrap();
    let (part, suffix) = rest.rsplit_once('.').unwrap();
    let g = match (arch, part) {
        (_, "self_attn.q_proj") => "attn_q",
        (_, "self_attn.k_proj") => "attn_k",
        (_, "self_attn.v_proj") => "attn_v",
        (_, "self_attn.o_proj") => "attn_output",
        (_, "self_attn.q_norm") => "attn_q_norm",
        (_, "self_attn.k_norm") => "attn_k_norm",
        (_, "self_attn.qkv_proj") => "attn_qkv",
        (_, "input_layernorm") => "attn_norm",
        ("gemma3" | "gpt-oss", "post_attention_layernorm") => "post_attention_norm",
        ("gpt-oss", "mlp.router") => "ffn_gate_inp",
        ("gpt-oss", "self_attn") if suffix == "sinks" => {
            return format!("blk.{layer}.attn_sinks.weight")
        }
        (_, "post_attention_layernorm") => "ffn_norm",
        (_, "pre_feedforward_layernorm") => "ffn_norm",
        (_, "post_feedforward_layernorm") => "post_ffw_norm",
        (_, "mlp.gate_proj") => "ffn_gate",
        (_, "mlp.up_proj") => "ffn_up",
        (_, "mlp.gate_up_proj") => "ffn_up",
        (_, "mlp.down_proj") => "ffn_down",
        other => panic!("no GGUF name for {other:?}"),
    };
    format!("blk.{layer}.{g}.{suffix}")
}

/// One expert's tensor: its index, dims and values.
type Expert = (usize, Vec<usize>, Vec<f32>);

/// The fixture `arch` converted directly (f32), and written as a GGUF of GGUF architecture
/// `garch` with the extra metadata `kv` and tensors `extra`, converted back.
fn both_ways(
    arch: &str,
    garch: &str,
    kv: Vec<Kv>,
    extra: Vec<(String, Vec<usize>, Vec<f32>)>,
) -> (PathBuf, PathBuf) {
    let (hf, g) = fixture_gguf(&fixture(arch), arch, garch, kv, extra, F32);
    let opts = ConvertOptions {
        dtype: TargetDtype::F32,
    };
    let back = tmp(&format!("{arch}-gguf.flm"));
    convert(&g, &back, &opts, &mut |_| {}).unwrap();
    (hf, back)
}

/// The HF model directory `src` (named `arch` in the files' names) converted directly (f32) and
/// written as a GGUF of GGUF architecture `garch` with the extra metadata `kv` and tensors
/// `extra`, the experts' weight matrices stored as `expert_type` (F32 or MXFP4), llama's q/k
/// rows permuted as llama.cpp's converter writes them; returns the two files' paths (unique per
/// call).
fn fixture_gguf(
    src: &Path,
    arch: &str,
    garch: &str,
    kv: Vec<Kv>,
    extra: Vec<(String, Vec<usize>, Vec<f32>)>,
    expert_type: u32,
) -> (PathBuf, PathBuf) {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let opts = ConvertOptions {
        dtype: TargetDtype::F32,
    };
    let hf = tmp(&format!("{arch}-hf-{call}.flm"));
    convert(src, &hf, &opts, &mut |_| {}).unwrap();
    let f = FlmFile::open(&hf, LoadMode::Mmap).unwrap();
    let c = f.config().clone();
    let k = |s: &str| format!("{garch}.{s}");
    let mut meta = vec![
        kv_str("general.architecture", garch),
        kv_u32(&k("context_length"), c.context_length),
        kv_u32(&k("vocab_size"), c.vocab_size),
        kv_u32(&k("embedding_length"), c.hidden_size),
        kv_u32(&k("block_count"), c.num_layers),
        kv_u32(&k("feed_forward_length"), c.intermediate_size),
        kv_u32(&k("attention.head_count"), c.num_heads),
        kv_u32(&k("attention.head_count_kv"), c.num_kv_heads),
        kv_u32(&k("attention.key_length"), c.head_dim),
        kv_u32(&k("rope.dimension_count"), c.rope_dim),
        kv_f32(&k("rope.freq_base"), c.rope_theta),
        kv_f32(&k("attention.layer_norm_rms_epsilon"), c.norm_eps),
    ];
    meta.extend(kv);
    meta.extend(tokenizer_kv(c.vocab_size));
    let mut tensors: Vec<Typed> = extra
        .into_iter()
        .map(|(n, d, v)| (n, d, F32, f32_bytes(&v)))
        .collect();
    // experts' tensors, stacked as llama.cpp's `ffn_*_exps` (expert order) after the loop
    let mut stacks: std::collections::BTreeMap<String, Vec<Expert>> = Default::default();
    for name in f.tensor_names() {
        let t = f.tensor(name).unwrap();
        let mut v = t.to_f32_vec().unwrap();
        if let Some((pre, rest)) = name.split_once(".mlp.experts.") {
            let (e, rest) = rest.split_once('.').unwrap();
            let (proj, suffix) = rest.split_once('.').unwrap();
            let layer = pre.strip_prefix("model.layers.").unwrap();
            let g = format!(
                "blk.{layer}.ffn_{}_exps.{suffix}",
                proj.trim_end_matches("_proj")
            );
            let dims = t.dims().to_vec();
            stacks
                .entry(g)
                .or_default()
                .push((e.parse().unwrap(), dims, v));
            continue;
        }
        if garch == "gemma3" && name.ends_with("norm.weight") {
            v.iter_mut().for_each(|x| *x += 1.0); // llama.cpp stores Gemma's norms as 1 + w
        }
        let heads = if name.ends_with("q_proj.weight") {
            c.num_heads
        } else {
            c.num_kv_heads
        };
        if garch == "llama" && (name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight"))
        {
            v = permuted_rows(&v, t.dims()[0], heads);
        }
        tensors.push((
            gguf_name(garch, name),
            t.dims().to_vec(),
            F32,
            f32_bytes(&v),
        ));
    }
    for (g, mut parts) in stacks {
        parts.sort_by_key(|p| p.0);
        let mut dims = vec![parts.len()];
        dims.extend(&parts[0].1);
        let v: Vec<f32> = parts.into_iter().flat_map(|p| p.2).collect();
        let (ty, bytes) = if expert_type == MXFP4 && g.ends_with(".weight") {
            (MXFP4, encode_from_f32(DataType::Mxfp4, &v).unwrap())
        } else {
            (F32, f32_bytes(&v))
        };
        tensors.push((g, dims, ty, bytes));
    }
    let g = tmp(&format!("{arch}-{call}.gguf"));
    std::fs::write(&g, gguf_typed_bytes(&meta, &tensors)).unwrap();
    (hf, g)
}

/// The rows of an HF q or k matrix `v` (`rows` rows of `heads` heads) in the order llama.cpp's
/// converter writes a llama GGUF's (each head's rotary halves interleaved).
fn permuted_rows(v: &[f32], rows: usize, heads: usize) -> Vec<f32> {
    let cols = v.len() / rows;
    let mut out = vec![0f32; v.len()];
    for r in 0..rows {
        let g = fastllm::convert::names::unpermuted_source_row(r, rows, heads);
        out[g * cols..(g + 1) * cols].copy_from_slice(&v[r * cols..(r + 1) * cols]);
    }
    out
}

fn logits(flm: &Path, ids: &[u32]) -> Vec<f32> {
    logits_in(flm, ids, Precision::Exact)
}

fn logits_in(flm: &Path, ids: &[u32], precision: Precision) -> Vec<f32> {
    let file = FlmFile::open(flm, LoadMode::Mmap).unwrap();
    let config = file.config().clone();
    let m = Model::new(
        config,
        Arc::new(file),
        Executor::cpu(2).unwrap(),
        precision,
        false,
    )
    .unwrap();
    let mut cache = m.new_cache(ids.len()).unwrap();
    m.forward(&mut cache, ids, true)
        .unwrap()
        .to_f32_vec()
        .unwrap()
}

/// Max |Δlogit| between the two conversions over 48 tokens (past the rope variants' original
/// context of 32, and the sliding window of 8).
fn compare(hf: &Path, gguf: &Path) -> f32 {
    let ids: Vec<u32> = (0..48).map(|i| (i * 37 + 5) % 500).collect();
    let (a, b) = (logits(hf, &ids), logits(gguf, &ids));
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn gemma3_gguf_equals_hf() {
    let kv = vec![
        kv_u32("gemma3.attention.sliding_window", 8),
        kv_bools("gemma3.attention.sliding_window_pattern", &[true, false]),
        kv_f32("gemma3.rope.freq_base_swa", 10000.0),
    ];
    let (hf, gguf) = both_ways("gemma3", "gemma3", kv, Vec::new());
    let (a, b) = (
        FlmFile::open(&hf, LoadMode::Mmap).unwrap().config().clone(),
        FlmFile::open(&gguf, LoadMode::Mmap)
            .unwrap()
            .config()
            .clone(),
    );
    assert_eq!(
        (
            b.sliding_layers.clone(),
            b.rope_local_theta,
            b.query_pre_attn_scalar
        ),
        (
            a.sliding_layers.clone(),
            a.rope_local_theta,
            a.query_pre_attn_scalar
        )
    );
    let d = compare(&hf, &gguf);
    assert!(d <= 1e-4, "gemma3 GGUF vs HF: max |Δlogit| {d}");
}

#[test]
fn yarn_gguf_equals_hf() {
    let kv = vec![
        kv_str("qwen2.rope.scaling.type", "yarn"),
        kv_f32("qwen2.rope.scaling.factor", 4.0),
        kv_u32("qwen2.rope.scaling.original_context_length", 32),
    ];
    let (hf, gguf) = both_ways("qwen2-yarn", "qwen2", kv, Vec::new());
    let d = compare(&hf, &gguf);
    assert!(d <= 1e-4, "qwen2-yarn GGUF vs HF: max |Δlogit| {d}");
}

/// The fixture `arch`'s files in a directory of their own, its `config.json` edited by `edit`.
fn edited_fixture(arch: &str, tag: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let dir = tmp(tag);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(fixture(arch)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    dir
}

/// Linear rope scaling (positions divided by the factor) from an HF config's `rope_parameters`
/// and from a GGUF's `rope.scaling.type` / `.factor`: the same config and the same logits, which
/// differ from the unscaled model's.
#[test]
fn linear_gguf_equals_hf() {
    let dir = edited_fixture("qwen2", "qwen2-linear-src", |c| {
        c["rope_parameters"]["rope_type"] = serde_json::json!("linear");
        c["rope_parameters"]["factor"] = serde_json::json!(2.0);
    });
    let kv = vec![
        kv_str("qwen2.rope.scaling.type", "linear"),
        kv_f32("qwen2.rope.scaling.factor", 2.0),
    ];
    let (hf, g) = fixture_gguf(&dir, "qwen2-linear", "qwen2", kv, Vec::new(), F32);
    let back = tmp("qwen2-linear-gguf.flm");
    let opts = ConvertOptions {
        dtype: TargetDtype::F32,
    };
    convert(&g, &back, &opts, &mut |_| {}).unwrap();
    let scaling = |p: &Path| {
        FlmFile::open(p, LoadMode::Mmap)
            .unwrap()
            .config()
            .rope_scaling
            .clone()
    };
    let want = fastllm::model::RopeScaling::Linear { factor: 2.0 };
    assert_eq!(scaling(&hf), want, "from the HF config");
    assert_eq!(scaling(&back), want, "from the GGUF metadata");
    let d = compare(&hf, &back);
    assert!(d <= 1e-4, "linear GGUF vs HF: max |Δlogit| {d}");
    let (plain, _) = fixture_gguf(
        &fixture("qwen2"),
        "qwen2-plain",
        "qwen2",
        Vec::new(),
        Vec::new(),
        F32,
    );
    let off = compare(&hf, &plain);
    assert!(off > 1e-3, "the linear factor changed nothing ({off:.2e})");
}

/// A Llama-3 GGUF carries its llama3 rope scaling only as `rope_freqs.weight` (per-pair
/// divisors, no metadata keys): written that way from the tiny llama3-rope-scaling fixture
/// (q/k rows permuted as llama.cpp's converter writes them), it gives the HF original's logits;
/// without the tensor the logits differ.
#[test]
fn llama3_rope_freqs_gguf_equals_hf() {
    let c: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("llama3-rope-scaling").join("config.json")).unwrap(),
    )
    .unwrap();
    let p = &c["rope_parameters"];
    let f = |k: &str| p[k].as_f64().unwrap();
    let div = common::rope::llama3_divisors(
        f("rope_theta"),
        c["head_dim"].as_u64().unwrap() as usize,
        f("factor"),
        f("low_freq_factor"),
        f("high_freq_factor"),
        f("original_max_position_embeddings"),
    );
    assert!(div.iter().any(|d| *d > 1.5), "no frequency scaled: {div:?}");
    let freqs = vec![("rope_freqs.weight".to_string(), vec![div.len()], div)];
    let (hf, gguf) = both_ways("llama3-rope-scaling", "llama", Vec::new(), freqs);
    let d = compare(&hf, &gguf);
    assert!(
        d <= 1e-4,
        "llama3 GGUF with rope_freqs vs HF: max |Δlogit| {d}"
    );
    let (_, plain) = both_ways("llama3-rope-scaling", "llama", Vec::new(), Vec::new());
    let off = compare(&hf, &plain);
    assert!(
        off > 1e-3,
        "dropping rope_freqs changed nothing ({off:.2e})"
    );
}

fn longrope_factors(arch: &str) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(arch).join("config.json")).unwrap())
            .unwrap();
    let list = |k: &str| -> Vec<f32> {
        c["rope_parameters"][k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect()
    };
    let (s, l) = (list("short_factor"), list("long_factor"));
    vec![
        ("rope_factors_short.weight".into(), vec![s.len()], s),
        ("rope_factors_long.weight".into(), vec![l.len()], l),
    ]
}

#[test]
fn longrope_gguf_equals_hf() {
    // the attention factor as llama.cpp's converter writes it: from max / original positions
    let scale = 512f64 / 32.0;
    let attn = (1.0 + scale.ln() / 32f64.ln()).sqrt() as f32;
    let kv = vec![
        kv_str("phi3.rope.scaling.type", "longrope"),
        kv_u32("phi3.rope.scaling.original_context_length", 32),
        kv_f32("phi3.rope.scaling.attn_factor", attn),
    ];
    let (hf, gguf) = both_ways(
        "phi3-longrope",
        "phi3",
        kv,
        longrope_factors("phi3-longrope"),
    );
    let d = compare(&hf, &gguf);
    assert!(d <= 1e-4, "phi3-longrope GGUF vs HF: max |Δlogit| {d}");
}

/// The conversion error of a tiny qwen2 GGUF with the rope metadata `kv` and tensors `extra`.
fn rope_error(tag: &str, kv: Vec<Kv>, extra: Vec<(String, Vec<usize>, Vec<f32>)>) -> String {
    let mut meta = vec![
        kv_str("general.architecture", "qwen2"),
        kv_u32("qwen2.context_length", 64),
        kv_u32("qwen2.embedding_length", 64),
        kv_u32("qwen2.block_count", 1),
        kv_u32("qwen2.feed_forward_length", 64),
        kv_u32("qwen2.attention.head_count", 4),
        kv_f32("qwen2.attention.layer_norm_rms_epsilon", 1e-6),
    ];
    meta.extend(kv);
    meta.extend(tokenizer_kv(256));
    let g = tmp(&format!("{tag}.gguf"));
    std::fs::write(&g, gguf_bytes(&meta, &extra)).unwrap();
    let out = tmp(&format!("{tag}.flm"));
    let e = convert(&g, &out, &ConvertOptions::default(), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(!out.exists(), "{tag}: an output was written");
    assert!(e.contains(g.to_str().unwrap()), "{tag}: {e}");
    e
}

#[test]
fn gguf_rope_metadata_errors_are_named() {
    let e = rope_error(
        "unknown",
        vec![kv_str("qwen2.rope.scaling.type", "ntk-by-parts")],
        Vec::new(),
    );
    assert!(
        e.contains("ntk-by-parts") && e.contains("qwen2.rope.scaling.type") && e.contains("yarn"),
        "{e}"
    );
    // llama.cpp's GGUF keys have no dynamic NTK type: refused naming the type and the way out
    let e = rope_error(
        "dynamic",
        vec![kv_str("qwen2.rope.scaling.type", "dynamic")],
        Vec::new(),
    );
    assert!(
        e.contains("\"dynamic\"")
            && e.contains("qwen2.rope.scaling.type")
            && e.contains("Hugging Face"),
        "{e}"
    );
    let e = rope_error(
        "yarn-no-factor",
        vec![kv_str("qwen2.rope.scaling.type", "yarn")],
        Vec::new(),
    );
    assert!(e.contains("qwen2.rope.scaling.factor"), "{e}");
    let e = rope_error(
        "longrope-no-factors",
        vec![
            kv_str("qwen2.rope.scaling.type", "longrope"),
            kv_u32("qwen2.rope.scaling.original_context_length", 32),
        ],
        Vec::new(),
    );
    assert!(e.contains("rope_factors_short.weight"), "{e}");
    let e = rope_error(
        "longrope-short",
        vec![
            kv_str("qwen2.rope.scaling.type", "longrope"),
            kv_u32("qwen2.rope.scaling.original_context_length", 32),
        ],
        vec![
            ("rope_factors_short.weight".into(), vec![3], vec![1.0; 3]),
            ("rope_factors_long.weight".into(), vec![8], vec![1.0; 8]),
        ],
    );
    assert!(
        e.contains("rope_factors_short.weight") && e.contains("expected 8"),
        "{e}"
    );
    let e = rope_error(
        "type-not-string",
        vec![kv_u32("qwen2.rope.scaling.type", 3)],
        Vec::new(),
    );
    assert!(e.contains("qwen2.rope.scaling.type"), "{e}");
}

/// llama.cpp's `gpt-oss` keys for the tiny fixture (4 experts, top-2 of inner 128, window 8,
/// YaRN factor 32 over 4096 positions).
fn gpt_oss_kv() -> Vec<Kv> {
    vec![
        kv_u32("gpt-oss.expert_count", 4),
        kv_u32("gpt-oss.expert_used_count", 2),
        kv_u32("gpt-oss.expert_feed_forward_length", 128),
        kv_u32("gpt-oss.attention.sliding_window", 8),
        kv_str("gpt-oss.rope.scaling.type", "yarn"),
        kv_f32("gpt-oss.rope.scaling.factor", 32.0),
        kv_u32("gpt-oss.rope.scaling.original_context_length", 4096),
    ]
}

#[test]
fn gpt_oss_gguf_equals_hf() {
    let (hf, gguf) = both_ways("gpt_oss", "gpt-oss", gpt_oss_kv(), Vec::new());
    let (a, b) = (
        FlmFile::open(&hf, LoadMode::Mmap).unwrap().config().clone(),
        FlmFile::open(&gguf, LoadMode::Mmap)
            .unwrap()
            .config()
            .clone(),
    );
    assert_eq!(b.architecture, "gpt_oss");
    assert_eq!(
        (&b.sliding_layers, b.sliding_window, &b.rope_scaling, &b.moe),
        (&a.sliding_layers, a.sliding_window, &a.rope_scaling, &a.moe)
    );
    let d = compare(&hf, &gguf);
    assert!(d <= 1e-4, "gpt_oss GGUF vs HF: max |Δlogit| {d}");
}

#[test]
fn gpt_oss_gguf_without_window_or_experts_is_refused_by_key() {
    for missing in ["gpt-oss.attention.sliding_window", "gpt-oss.expert_count"] {
        let kv: Vec<Kv> = gpt_oss_kv()
            .into_iter()
            .filter(|k| k.0 != missing)
            .collect();
        let opts = ConvertOptions {
            dtype: TargetDtype::F32,
        };
        let hf = tmp("gpt_oss-missing-hf.flm");
        convert(&fixture("gpt_oss"), &hf, &opts, &mut |_| {}).unwrap();
        let f = FlmFile::open(&hf, LoadMode::Mmap).unwrap();
        let c = f.config().clone();
        let mut meta = vec![
            kv_str("general.architecture", "gpt-oss"),
            kv_u32("gpt-oss.context_length", c.context_length),
            kv_u32("gpt-oss.embedding_length", c.hidden_size),
            kv_u32("gpt-oss.block_count", c.num_layers),
            kv_u32("gpt-oss.attention.head_count", c.num_heads),
            kv_u32("gpt-oss.attention.head_count_kv", c.num_kv_heads),
            kv_u32("gpt-oss.attention.key_length", c.head_dim),
            kv_f32("gpt-oss.attention.layer_norm_rms_epsilon", c.norm_eps),
        ];
        meta.extend(kv);
        meta.extend(tokenizer_kv(c.vocab_size));
        let g = tmp("gpt_oss-missing.gguf");
        std::fs::write(&g, gguf_bytes(&meta, &[])).unwrap();
        let e = convert(&g, &tmp("gpt_oss-missing.flm"), &opts, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains(missing), "without {missing}: {e}");
    }
}

/// Max |Δ| of two logit vectors of the same length.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// GPT-OSS with its experts' matrices in MXFP4, as llama.cpp writes the real checkpoints:
/// `keep` stores the blocks bit-exact as MXFP4, and that model gives the logits of the same GGUF
/// converted to f32 (the experts dequantized), in `exact` precision (the same values) and in
/// `fast` (int8 activations against the blocks).
#[test]
fn gpt_oss_mxfp4_experts_are_kept_and_match_their_dequantized_model() {
    let (_, g) = fixture_gguf(
        &fixture("gpt_oss"),
        "gpt_oss",
        "gpt-oss",
        gpt_oss_kv(),
        Vec::new(),
        MXFP4,
    );
    let (keep, deq) = (tmp("gpt_oss-mxfp4-keep.flm"), tmp("gpt_oss-mxfp4-f32.flm"));
    for (out, dtype) in [(&keep, TargetDtype::Keep), (&deq, TargetDtype::F32)] {
        convert(&g, out, &ConvertOptions { dtype }, &mut |_| {}).unwrap();
    }
    let f = FlmFile::open(&keep, LoadMode::Mmap).unwrap();
    f.verify().unwrap();
    let layers = f.config().num_layers;
    let gg = GgufFile::open(&g).unwrap();
    let mut kept = 0;
    for (proj, gname) in [("gate", "gate"), ("up", "up"), ("down", "down")] {
        for l in 0..layers {
            let src = gg
                .tensors
                .iter()
                .find(|t| t.name == format!("blk.{l}.ffn_{gname}_exps.weight"))
                .unwrap();
            let bytes = gg.read_tensor_bytes(src).unwrap();
            let per = bytes.len() / 4;
            for e in 0..4 {
                let name = format!("model.layers.{l}.mlp.experts.{e}.{proj}_proj.weight");
                let t = f.tensor(&name).unwrap();
                assert_eq!(t.dtype(), DataType::Mxfp4, "{name}");
                assert_eq!(t.bytes().unwrap(), &bytes[e * per..(e + 1) * per], "{name}");
                kept += 1;
            }
        }
    }
    assert_eq!(kept, 3 * 4 * layers);
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 500).collect();
    let reference = logits_in(&deq, &ids, Precision::Exact);
    let d = max_diff(&logits_in(&keep, &ids, Precision::Exact), &reference);
    assert!(d <= 1e-4, "MXFP4 exact vs dequantized: max |Δlogit| {d}");
    let d = max_diff(&logits_in(&keep, &ids, Precision::Fast), &reference);
    println!("MXFP4 fast vs dequantized exact: max |Δlogit| {d}");
    assert!(d <= 1e-2, "MXFP4 fast vs dequantized: max |Δlogit| {d}");
}

/// MXFP4 tensors that cannot be read are refused naming the tensor: a row that is not whole
/// blocks, a block with the NaN exponent 0xFF, a stack with more experts than the metadata
/// says, and a flipped bit in the `.flm` (the tensor checksum).
#[test]
fn broken_mxfp4_tensors_are_refused_by_name() {
    let kv = |experts: usize| {
        let mut kv = gpt_oss_kv();
        kv.retain(|k| k.0 != "gpt-oss.expert_count");
        kv.push(kv_u32("gpt-oss.expert_count", experts));
        kv
    };
    let (_, g) = fixture_gguf(
        &fixture("gpt_oss"),
        "gpt_oss",
        "gpt-oss",
        kv(4),
        Vec::new(),
        MXFP4,
    );
    let bytes = std::fs::read(&g).unwrap();
    let gg = GgufFile::open(&g).unwrap();
    let t = gg
        .tensors
        .iter()
        .find(|t| t.name == "blk.1.ffn_up_exps.weight")
        .unwrap();
    let at = (gg.data_offset + t.offset) as usize;
    let opts = ConvertOptions {
        dtype: TargetDtype::Keep,
    };
    let err = |bytes: &[u8], tag: &str| {
        let p = tmp(&format!("broken-{tag}.gguf"));
        std::fs::write(&p, bytes).unwrap();
        convert(&p, &tmp(&format!("broken-{tag}.flm")), &opts, &mut |_| {})
            .unwrap_err()
            .to_string()
    };
    // the third block's exponent byte
    let mut nan = bytes.clone();
    nan[at + 2 * 17] = 0xFF;
    let e = err(&nan, "nan");
    assert!(
        e.contains("blk.1.ffn_up_exps.weight") && e.contains("MXFP4"),
        "{e}"
    );
    // a row of 40 values (the row length is the tensor's first ggml dim)
    let mut short = bytes.clone();
    let name_at = short
        .windows(t.name.len())
        .position(|w| w == t.name.as_bytes())
        .unwrap();
    let dim0 = name_at + t.name.len() + 4;
    short[dim0..dim0 + 8].copy_from_slice(&40u64.to_le_bytes());
    let e = err(&short, "row");
    assert!(
        e.contains("blk.1.ffn_up_exps.weight") && e.contains("MXFP4"),
        "{e}"
    );
    // the metadata says 3 experts, the stacks hold 4
    let (_, g3) = fixture_gguf(
        &fixture("gpt_oss"),
        "gpt_oss",
        "gpt-oss",
        kv(3),
        Vec::new(),
        MXFP4,
    );
    let e = err(&std::fs::read(&g3).unwrap(), "experts");
    assert!(e.contains("_exps.") && e.contains("3 experts"), "{e}");
    // a flipped bit in a kept MXFP4 tensor of the .flm
    let out = tmp("mxfp4-flip.flm");
    convert(&g, &out, &opts, &mut |_| {}).unwrap();
    let name = "model.layers.1.mlp.experts.2.up_proj.weight";
    let off = FlmFile::open(&out, LoadMode::Mmap)
        .unwrap()
        .tensor_info(name)
        .unwrap()
        .offset as usize;
    let mut flm = std::fs::read(&out).unwrap();
    flm[off + 17 + 5] ^= 0x04;
    std::fs::write(&out, &flm).unwrap();
    for mode in [LoadMode::Mmap, LoadMode::LowMemory] {
        let f = FlmFile::open(&out, mode).unwrap();
        let e = f.tensor(name).unwrap_err().to_string();
        assert!(e.contains("checksum") && e.contains(name), "{mode:?}: {e}");
    }
}
