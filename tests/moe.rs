//! Mixture-of-experts models beyond the fixture logits (`tests/models.rs` has those): the MoE
//! FFN stage against a float64 computation of its definition on awkward routings, with the
//! experts one by one and stacked for the grouped `MoeLinear` products; GGUF files
//! with llama.cpp's MoE names (stacked `ffn_*_exps` experts, `ffn_gate_inp`, `expert_*` keys)
//! give the same logits as the HF original; missing expert metadata is refused by name; the
//! experts stay as the file holds them (views of its mapping); low-memory mode reads only the
//! routed experts, each once per step however many of the step's tokens chose it.

mod common;

use common::gguf::{gguf_file, safetensors_f32, Kv};
use fastllm::convert::{convert, ConvertOptions, TargetDtype};
use fastllm::data::{Data, DataType};
use fastllm::executor::Executor;
use fastllm::load::{load, LoadOptions};
use fastllm::model::moe::{moe_ffn, stack_experts, stack_layer_experts, MoeStep, MOE_BUFS};
use fastllm::model::{
    MapSource, Model, MoeConfig, MoeNames, MoeScoring, Precision, WeightSource, Weights,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

fn fixture(arch: &str) -> PathBuf {
    common::tiny_fixture(arch)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-moe-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

// ---- the FFN stage against its definition ----------------------------------------------

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

const NAMES: MoeNames = MoeNames {
    router: "gate",
    score_bias: Some("gate.bias_for_choice"),
    experts: "experts",
    proj: ("g", "u", "d"),
    shared: Some("shared"),
};

/// Float64 `Σ_j w_j · down(silu(gate x) · up x)` over the chosen experts, plus the shared one.
#[allow(clippy::too_many_arguments)]
fn reference_ffn(
    src: &BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    cfg: &MoeConfig,
    x: &[f32],
    d: usize,
    logits_route: &[(usize, f64)],
    t: usize,
    out: &mut [f64],
) {
    let mv = |name: &str, v: &[f64]| -> Vec<f64> {
        let (dims, w) = &src[name];
        (0..dims[0])
            .map(|r| (0..dims[1]).map(|c| w[r * dims[1] + c] as f64 * v[c]).sum())
            .collect()
    };
    let mlp = |p: &str, v: &[f64]| -> Vec<f64> {
        let g = mv(&format!("{p}.g.weight"), v);
        let u = mv(&format!("{p}.u.weight"), v);
        let a: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        mv(&format!("{p}.d.weight"), &a)
    };
    let xv: Vec<f64> = x[t * d..(t + 1) * d].iter().map(|&v| v as f64).collect();
    out.fill(0.0);
    for &(e, w) in logits_route {
        let y = mlp(&format!("l.experts.{e}"), &xv);
        out.iter_mut().zip(y).for_each(|(o, y)| *o += w * y);
    }
    if cfg.shared_intermediate > 0 {
        let y = mlp("l.shared", &xv);
        out.iter_mut().zip(y).for_each(|(o, y)| *o += y);
    }
}

/// The float64 routing of one token's logits (softmax or sigmoid, groups, bias, renorm, scale).
fn reference_route(cfg: &MoeConfig, l: &[f32], bias: &[f32]) -> Vec<(usize, f64)> {
    let e = cfg.experts;
    let s: Vec<f64> = match cfg.scoring {
        MoeScoring::Softmax => {
            let m = l.iter().map(|&v| v as f64).fold(f64::MIN, f64::max);
            let z: f64 = l.iter().map(|&v| (v as f64 - m).exp()).sum();
            l.iter().map(|&v| (v as f64 - m).exp() / z).collect()
        }
        MoeScoring::Sigmoid => l
            .iter()
            .map(|&v| 1.0 / (1.0 + (-(v as f64)).exp()))
            .collect(),
    };
    let c: Vec<f64> = s.iter().zip(bias).map(|(s, &b)| s + b as f64).collect();
    let gs = e / cfg.groups;
    let mut gscore: Vec<(usize, f64)> = (0..cfg.groups)
        .map(|g| {
            let mut v: Vec<f64> = c[g * gs..(g + 1) * gs].to_vec();
            v.sort_by(|a, b| b.total_cmp(a));
            (g, v.iter().take(2).sum())
        })
        .collect();
    gscore.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let groups: Vec<usize> = gscore.iter().take(cfg.topk_groups).map(|g| g.0).collect();
    let mut cand: Vec<usize> = (0..e).filter(|i| groups.contains(&(i / gs))).collect();
    cand.sort_by(|&a, &b| c[b].total_cmp(&c[a]).then(a.cmp(&b)));
    cand.truncate(cfg.experts_per_token);
    let sum: f64 = cand.iter().map(|&i| s[i]).sum();
    cand.iter()
        .map(|&i| {
            let w = if cfg.normalize { s[i] / sum } else { s[i] };
            (i, w * cfg.routed_scale as f64)
        })
        .collect()
}

/// Runs the stage on random weights with router logits steered by `steer(t, e)` and compares
/// with the float64 definition.
fn check_stage(label: &str, cfg: MoeConfig, tokens: usize, steer: impl Fn(usize, usize) -> f32) {
    let (d, inner) = (24, 20);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ tokens as u64);
    let mut src = BTreeMap::new();
    let mut put = |name: String, dims: Vec<usize>, v: Vec<f32>| {
        src.insert(name, (dims, v));
    };
    for e in 0..cfg.experts {
        for (p, dims) in [("g", [inner, d]), ("u", [inner, d]), ("d", [d, inner])] {
            put(
                format!("l.experts.{e}.{p}.weight"),
                dims.to_vec(),
                rng.vec(d * inner, 0.3),
            );
        }
    }
    for (p, dims) in [("g", [inner, d]), ("u", [inner, d]), ("d", [d, inner])] {
        put(
            format!("l.shared.{p}.weight"),
            dims.to_vec(),
            rng.vec(d * inner, 0.3),
        );
    }
    let bias = rng.vec(cfg.experts, 0.05);
    put(
        "l.gate.bias_for_choice".into(),
        vec![cfg.experts],
        bias.clone(),
    );
    // the router weight maps x to the steered logits: x's first `experts` dims are the steer
    let mut gate = vec![0f32; cfg.experts * d];
    for e in 0..cfg.experts {
        gate[e * d + e] = 1.0;
    }
    put("l.gate.weight".into(), vec![cfg.experts, d], gate);
    let mut x = rng.vec(tokens * d, 1.0);
    for t in 0..tokens {
        for e in 0..cfg.experts {
            x[t * d + e] = steer(t, e);
        }
    }
    let mut map = MapSource::new();
    for (n, (dims, v)) in &src {
        map.insert(n.clone(), Data::from_f32(dims, v).unwrap());
    }
    let mut weights = Weights::new(Arc::new(map), false).unwrap();
    let exec = Executor::cpu(2).unwrap();
    let xd = Data::from_f32(&[tokens, d], &x).unwrap();
    // per expert, then with the experts stacked (the grouped `MoeLinear` path)
    for grouped in [false, true] {
        if grouped {
            let n = stack_layer_experts(&mut weights, (&cfg, &NAMES), "l.").unwrap();
            assert_eq!(n, 3, "{label}: the three projections are stacked");
            assert!(weights.resident("l.experts.0.g.weight").is_none());
        }
        let st = MoeStep {
            exec: &exec,
            weights: &weights,
            quant_act: false,
            act: "silu",
        };
        let mut out = Data::empty(DataType::F32);
        let mut scratch: Vec<Data> = (0..MOE_BUFS).map(|_| Data::empty(DataType::F32)).collect();
        moe_ffn(&st, &cfg, &NAMES, "l.", (&xd, &mut scratch), &mut out).unwrap();
        let got = out.to_f32_vec().unwrap();
        let mut want = vec![0f64; d];
        for t in 0..tokens {
            let route = reference_route(&cfg, &x[t * d..t * d + cfg.experts], &bias);
            reference_ffn(&src, &cfg, &x, d, &route, t, &mut want);
            for (i, (g, w)) in got[t * d..(t + 1) * d].iter().zip(&want).enumerate() {
                assert!(
                    (*g as f64 - w).abs() < 1e-5,
                    "{label} (grouped {grouped}): token {t} dim {i}: {g} vs {w}"
                );
            }
        }
    }
}

fn cfg(experts: usize, k: usize) -> MoeConfig {
    MoeConfig {
        experts,
        experts_per_token: k,
        expert_intermediate: 20,
        scoring: MoeScoring::Softmax,
        groups: 1,
        topk_groups: 1,
        normalize: true,
        routed_scale: 1.0,
        shared_intermediate: 0,
        layers: vec![true],
        swiglu_clamp: None,
    }
}

#[test]
fn stage_matches_its_definition_on_awkward_routings() {
    // expert 4 of 5 never chosen (its logit is far below the others)
    check_stage("an expert with no token", cfg(5, 2), 7, |t, e| {
        if e == 4 {
            -9.0
        } else {
            ((t * 3 + e * 5) % 7) as f32 * 0.4
        }
    });
    // one token, top-k equal to the expert count: every expert runs
    check_stage("one token to every expert", cfg(6, 6), 1, |_, e| {
        e as f32 * 0.3
    });
    check_stage("top-k = experts, 5 tokens", cfg(3, 3), 5, |t, e| {
        (t + e) as f32 * 0.2
    });
    // DeepSeek-V3 style: sigmoid scores, 4 groups, 2 chosen, bias, scaling, shared expert
    let ds = MoeConfig {
        scoring: MoeScoring::Sigmoid,
        groups: 4,
        topk_groups: 2,
        routed_scale: 2.5,
        shared_intermediate: 20,
        ..cfg(8, 3)
    };
    check_stage("sigmoid, groups, shared", ds, 9, |t, e| {
        ((t * 7 + e * 3) % 11) as f32 * 0.35 - 1.5
    });
    // no renormalisation (Qwen3-MoE with norm_topk_prob false)
    let raw = MoeConfig {
        normalize: false,
        ..cfg(8, 2)
    };
    check_stage("softmax without renorm", raw, 4, |t, e| {
        ((t + 2 * e) % 5) as f32
    });
}

// ---- GGUF ------------------------------------------------------------------------------

/// The HF tensors of a MoE fixture under llama.cpp's names: q/k rows permuted for `llama`,
/// experts stacked [experts, out, in].
fn gguf_tensors(
    src: &BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    arch: &str,
    layers: usize,
    experts: usize,
    heads: (usize, usize),
) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let (moe, proj) = if arch == "llama" {
        ("block_sparse_moe", ["w1", "w3", "w2"])
    } else {
        ("mlp", ["gate_proj", "up_proj", "down_proj"])
    };
    let get = |n: &str| {
        src.get(n)
            .unwrap_or_else(|| panic!("fixture lacks {n}"))
            .clone()
    };
    let mut t = Vec::new();
    let mut put = |n: String, (d, v): (Vec<usize>, Vec<f32>)| t.push((n, d, v));
    put("token_embd.weight".into(), get("model.embed_tokens.weight"));
    put("output_norm.weight".into(), get("model.norm.weight"));
    put("output.weight".into(), get("lm_head.weight"));
    let permute = |(d, v): (Vec<usize>, Vec<f32>), h: usize| {
        let (rows, cols) = (d[0], d[1]);
        let mut out = vec![0f32; v.len()];
        for r in 0..rows {
            let g = fastllm::convert::names::unpermuted_source_row(r, rows, h);
            out[g * cols..(g + 1) * cols].copy_from_slice(&v[r * cols..(r + 1) * cols]);
        }
        (d, out)
    };
    for l in 0..layers {
        let p = format!("model.layers.{l}.");
        let b = format!("blk.{l}.");
        let qk = arch == "llama";
        let q = get(&format!("{p}self_attn.q_proj.weight"));
        let k = get(&format!("{p}self_attn.k_proj.weight"));
        put(
            format!("{b}attn_q.weight"),
            if qk { permute(q, heads.0) } else { q },
        );
        put(
            format!("{b}attn_k.weight"),
            if qk { permute(k, heads.1) } else { k },
        );
        put(
            format!("{b}attn_v.weight"),
            get(&format!("{p}self_attn.v_proj.weight")),
        );
        put(
            format!("{b}attn_output.weight"),
            get(&format!("{p}self_attn.o_proj.weight")),
        );
        put(
            format!("{b}attn_norm.weight"),
            get(&format!("{p}input_layernorm.weight")),
        );
        put(
            format!("{b}ffn_norm.weight"),
            get(&format!("{p}post_attention_layernorm.weight")),
        );
        if !qk {
            put(
                format!("{b}attn_q_norm.weight"),
                get(&format!("{p}self_attn.q_norm.weight")),
            );
            put(
                format!("{b}attn_k_norm.weight"),
                get(&format!("{p}self_attn.k_norm.weight")),
            );
        }
        put(
            format!("{b}ffn_gate_inp.weight"),
            get(&format!("{p}{moe}.gate.weight")),
        );
        for (g, hf) in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
            .iter()
            .zip(proj)
        {
            let mut dims = Vec::new();
            let mut all = Vec::new();
            for e in 0..experts {
                let (d, v) = get(&format!("{p}{moe}.experts.{e}.{hf}.weight"));
                dims = d;
                all.extend(v);
            }
            put(
                format!("{b}{g}.weight"),
                (vec![experts, dims[0], dims[1]], all),
            );
        }
    }
    t
}

fn base_kv(arch: &str, c: &Value, experts: usize, extra: &[(&str, Kv)]) -> Vec<(String, Kv)> {
    let u = |k: &str| c[k].as_u64().unwrap() as u32;
    let k = |s: &str| format!("{arch}.{s}");
    let mut kv = vec![
        ("general.architecture".into(), Kv::Str(arch.into())),
        (k("context_length"), Kv::U32(u("max_position_embeddings"))),
        (k("vocab_size"), Kv::U32(u("vocab_size"))),
        (k("embedding_length"), Kv::U32(u("hidden_size"))),
        (k("block_count"), Kv::U32(u("num_hidden_layers"))),
        (k("feed_forward_length"), Kv::U32(u("intermediate_size"))),
        (k("attention.head_count"), Kv::U32(u("num_attention_heads"))),
        (
            k("attention.head_count_kv"),
            Kv::U32(u("num_key_value_heads")),
        ),
        (
            k("attention.layer_norm_rms_epsilon"),
            Kv::F32(c["rms_norm_eps"].as_f64().unwrap() as f32),
        ),
        (
            k("rope.freq_base"),
            Kv::F32(c["rope_parameters"]["rope_theta"].as_f64().unwrap() as f32),
        ),
        (k("expert_count"), Kv::U32(experts as u32)),
        (k("expert_used_count"), Kv::U32(u("num_experts_per_tok"))),
    ];
    for (n, v) in extra {
        let v = match v {
            Kv::U32(x) => Kv::U32(*x),
            Kv::F32(x) => Kv::F32(*x),
            Kv::Str(x) => Kv::Str(x.clone()),
            Kv::Strs(x) => Kv::Strs(x.clone()),
        };
        kv.push((k(n), v));
    }
    kv
}

fn logits(flm: &Path, ids: &[u32]) -> Vec<f32> {
    let llm = load(
        flm,
        &LoadOptions {
            threads: 2,
            precision: Precision::Exact,
            ..Default::default()
        },
    )
    .unwrap();
    let mut cache = llm.model.new_cache(ids.len()).unwrap();
    llm.model
        .forward(&mut cache, ids, true)
        .unwrap()
        .to_f32_vec()
        .unwrap()
}

fn gguf_equals_hf(fixture_name: &str, gguf_arch: &str, extra: &[(&str, Kv)]) {
    let dir = fixture(fixture_name);
    let c: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let experts = c["num_local_experts"].as_u64().unwrap() as usize;
    let src = safetensors_f32(&dir.join("model.safetensors"));
    let heads = (
        c["num_attention_heads"].as_u64().unwrap() as usize,
        c["num_key_value_heads"].as_u64().unwrap() as usize,
    );
    let layers = c["num_hidden_layers"].as_u64().unwrap() as usize;
    let tensors = gguf_tensors(&src, gguf_arch, layers, experts, heads);
    let gguf = tmp(&format!("{fixture_name}.gguf"));
    gguf_file(&gguf, base_kv(gguf_arch, &c, experts, extra), &tensors);
    let (a, b) = (
        tmp(&format!("{fixture_name}-gguf.flm")),
        tmp(&format!("{fixture_name}-hf.flm")),
    );
    let keep = ConvertOptions {
        dtype: TargetDtype::parse("keep").unwrap(),
    };
    let report = convert(&gguf, &a, &keep, &mut |_| {}).unwrap();
    assert_eq!(report.architecture, fixture_name);
    convert(&dir, &b, &keep, &mut |_| {}).unwrap();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let ids: Vec<u32> = reference["cases"][0]["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let (la, lb) = (logits(&a, &ids), logits(&b, &ids));
    let worst = la
        .iter()
        .zip(&lb)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= 1e-5,
        "{fixture_name}: GGUF vs HF logits differ by {worst}"
    );
}

#[test]
fn qwen3moe_gguf_equals_hf() {
    gguf_equals_hf(
        "qwen3_moe",
        "qwen3moe",
        &[
            ("expert_feed_forward_length", Kv::U32(64)),
            ("attention.key_length", Kv::U32(24)),
            ("attention.value_length", Kv::U32(24)),
        ],
    );
}

#[test]
fn mixtral_gguf_equals_hf() {
    gguf_equals_hf("mixtral", "llama", &[]);
}

#[test]
fn gguf_without_expert_count_is_refused_by_name() {
    // (fixture, GGUF architecture, heads, kv heads, experts)
    for (fx, arch, h, kv, n) in [
        ("qwen3_moe", "qwen3moe", 4, 2, 8),
        ("mixtral", "llama", 4, 2, 4),
    ] {
        let dir = fixture(fx);
        let c: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let src = safetensors_f32(&dir.join("model.safetensors"));
        let tensors = gguf_tensors(&src, arch, 2, n, (h, kv));
        for key in ["expert_count", "expert_used_count"] {
            let missing = format!("{arch}.{key}");
            let kv: Vec<(String, Kv)> = base_kv(arch, &c, n, &[])
                .into_iter()
                .filter(|(k, _)| *k != missing)
                .collect();
            let gguf = tmp(&format!("no-{key}-{arch}.gguf"));
            gguf_file(&gguf, kv, &tensors);
            let opts = ConvertOptions::default();
            let e = convert(&gguf, &tmp("no-experts.flm"), &opts, &mut |_| {})
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&missing) && e.contains(&format!("no-{key}")),
                "{e}"
            );
        }
    }
}

// ---- memory ----------------------------------------------------------------------------

#[test]
fn experts_stay_as_the_file_holds_them() {
    let out = tmp("qwen3_moe-int8.flm");
    let int8 = ConvertOptions {
        dtype: TargetDtype::parse("int8").unwrap(),
    };
    convert(&fixture("qwen3_moe"), &out, &int8, &mut |_| {}).unwrap();
    let llm = load(
        &out,
        &LoadOptions {
            threads: 2,
            precision: Precision::Fast,
            ..Default::default()
        },
    )
    .unwrap();
    let m = &llm.model;
    for l in 0..2 {
        for e in 0..8 {
            for p in ["gate_proj", "up_proj", "down_proj"] {
                let n = format!("model.layers.{l}.mlp.experts.{e}.{p}.weight");
                assert_eq!(m.weight_dtype(&n), Some(DataType::Q8_0), "{n}");
                // a view of the file's mapping, not a copy in memory of its own
                assert_eq!(m.weight_is_mapped(&n), Some(true), "{n} is not mapped");
            }
        }
    }
    // a dense matrix the CPU re-forms for its kernels (where it has them) is held in memory
    let q = "model.layers.1.self_attn.q_proj.weight";
    if m.weight_dtype(q) != Some(DataType::Q8_0) {
        assert_eq!(m.weight_is_mapped(q), Some(false), "{q}");
    }
}

/// A `.flm` source that records the names of the tensors read.
struct Counting {
    inner: fastllm::format::flm::FlmFile,
    read: Mutex<Vec<String>>,
}

impl WeightSource for Counting {
    fn tensor(&self, name: &str) -> fastllm::Result<Data> {
        self.read.lock().unwrap().push(name.to_string());
        self.inner.tensor(name)
    }
    fn has(&self, name: &str) -> bool {
        self.inner.has(name)
    }
    fn names(&self) -> Vec<String> {
        self.inner.names()
    }
}

#[test]
fn low_memory_reads_only_routed_experts() {
    let out = tmp("qwen3_moe-lowmem.flm");
    let keep = ConvertOptions {
        dtype: TargetDtype::parse("keep").unwrap(),
    };
    convert(&fixture("qwen3_moe"), &out, &keep, &mut |_| {}).unwrap();
    let file = fastllm::format::flm::FlmFile::open(&out, fastllm::format::flm::LoadMode::LowMemory)
        .unwrap();
    let config = file.config().clone();
    let src = Arc::new(Counting {
        inner: file,
        read: Mutex::new(Vec::new()),
    });
    let model = Model::new(
        config,
        src.clone(),
        Executor::cpu(2).unwrap(),
        Precision::Exact,
        true,
    )
    .unwrap();
    let mut cache = model.new_cache(8).unwrap();
    src.read.lock().unwrap().clear();
    model.forward(&mut cache, &[7], false).unwrap(); // one token: k = 2 of 8 experts a layer
    let read = src.read.lock().unwrap().clone();
    for l in 0..2 {
        let experts: std::collections::BTreeSet<&str> = read
            .iter()
            .filter_map(|n| {
                n.strip_prefix(&format!("model.layers.{l}.mlp.experts."))
                    .and_then(|r| r.split('.').next())
            })
            .collect();
        let reads = read
            .iter()
            .filter(|n| n.starts_with(&format!("model.layers.{l}.mlp.experts.")))
            .count();
        assert_eq!(experts.len(), 2, "layer {l} read experts {experts:?}");
        assert_eq!(
            reads, 6,
            "layer {l}: each routed expert's 3 projections once"
        );
    }
    // a step of many tokens: each expert some token chose is read once for all its tokens
    src.read.lock().unwrap().clear();
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 500).collect();
    let mut cache = model.new_cache(ids.len()).unwrap();
    model.forward(&mut cache, &ids, false).unwrap();
    let read = src.read.lock().unwrap().clone();
    for l in 0..2 {
        let names: Vec<&String> = read
            .iter()
            .filter(|n| n.starts_with(&format!("model.layers.{l}.mlp.experts.")))
            .collect();
        let distinct: std::collections::BTreeSet<&String> = names.iter().copied().collect();
        assert_eq!(
            names.len(),
            distinct.len(),
            "layer {l}: an expert tensor read twice in one step"
        );
        // 24 tokens × 2 choices over 8 experts: more than 2 experts run
        assert!(
            distinct.len() > 6 && distinct.len().is_multiple_of(3),
            "layer {l}: read {distinct:?}"
        );
    }
}

#[test]
fn experts_are_stacked_only_where_the_grouped_path_runs() {
    let (d, inner, experts) = (8usize, 4usize, 3usize);
    let mut rng = Rng(7);
    let mut map = MapSource::new();
    for e in 0..experts {
        for (p, dims) in [("g", [inner, d]), ("u", [inner, d]), ("d", [d, inner])] {
            let v = rng.vec(d * inner, 0.3);
            let t = Data::from_f32(&dims, &v).unwrap();
            // expert 2's down projection in another dtype: that layer stays per expert
            let t = if e == 2 && p == "d" {
                let bytes = fastllm::data::encode_from_f32(DataType::F16, &v).unwrap();
                Data::from_bytes(DataType::F16, &dims, &bytes).unwrap()
            } else {
                t
            };
            map.insert(format!("l.experts.{e}.{p}.weight"), t);
        }
    }
    let cfg = MoeConfig {
        expert_intermediate: inner,
        ..cfg(experts, 2)
    };
    let mut w = Weights::new(Arc::new(map), false).unwrap();
    assert_eq!(
        stack_layer_experts(&mut w, (&cfg, &NAMES), "l.").unwrap(),
        0
    );
    assert!(w.resident("l.experts.0.g.weight").is_some());
    // a CPU first device keeps the experts as loaded (mapped from the file)
    let cpu = fastllm::devices::cpu::CpuDevice::new(1).unwrap();
    let prefix = |_: usize| "l.".to_string();
    assert_eq!(
        stack_experts(&mut w, (&cfg, &NAMES), 1, &prefix, &cpu).unwrap(),
        0
    );
}

/// `MoeLinear` over per-expert matrices (the CPU's form: each expert its own tensor, as a file
/// holds them) gives the stacked form's results bit for bit, Q4_0 with quantized activations
/// (the `fast` decode path) and F16, on awkward routings: an expert with no token, one token to
/// every expert, top-k = the expert count, weight rows not a multiple of any tile.
#[test]
fn per_expert_moe_linear_equals_stacked() {
    use fastllm::ops::{self, ExpertMatrix, MoeLinearRows};
    let exec = Executor::cpu(2).unwrap();
    let (n, kd) = (67, 96);
    // (experts, k, tokens); expert `experts - 1` is never chosen in the first case
    for (experts, k, tokens) in [(5, 2, 7), (6, 6, 1), (3, 3, 5), (4, 1, 1)] {
        let mut rng = Rng(0x51ed ^ (experts * 31 + tokens) as u64);
        let mut route = Vec::new();
        for t in 0..tokens {
            let used = if experts == 5 { 4 } else { experts };
            for j in 0..k {
                route.extend([((t + j) % used) as f32, rng.next().abs() + 0.1]);
            }
        }
        let route = Data::from_f32(&[tokens, k, 2], &route).unwrap();
        let mut disp = Data::empty(DataType::I32);
        ops::moe_dispatch(&exec, &route, experts, &mut disp).unwrap();
        let x = Data::from_f32(&[tokens, kd], &rng.vec(tokens * kd, 1.0)).unwrap();
        for (dtype, quant_act) in [(DataType::Q4_0, true), (DataType::F16, false)] {
            let w = rng.vec(experts * n * kd, 0.5);
            let enc = |dims: &[usize], v: &[f32]| {
                let b = fastllm::data::encode_from_f32(dtype, v).unwrap();
                Data::from_bytes(dtype, dims, &b).unwrap()
            };
            let stacked = enc(&[experts, n, kd], &w);
            let each: Vec<Data> = (0..experts)
                .map(|e| enc(&[n, kd], &w[e * n * kd..(e + 1) * n * kd]))
                .collect();
            let bias = rng.vec(experts * n, 0.2);
            let bias_s = Data::from_f32(&[experts, n], &bias).unwrap();
            let bias_e: Vec<Data> = (0..experts)
                .map(|e| Data::from_f32(&[n], &bias[e * n..(e + 1) * n]).unwrap())
                .collect();
            let rows = MoeLinearRows {
                dispatch: &disp,
                k,
                gather: true,
            };
            let mut want = Data::empty(DataType::F32);
            ops::moe_linear(
                &exec,
                &x,
                (&stacked, Some(&bias_s)),
                rows,
                quant_act,
                &mut want,
            )
            .unwrap();
            let list: Vec<ExpertMatrix> = (0..experts)
                .map(|e| (e, &each[e], Some(&bias_e[e])))
                .collect();
            let mut got = Data::empty(DataType::F32);
            ops::moe_linear_each(&exec, &x, (&list, experts), rows, quant_act, &mut got).unwrap();
            let label = format!("{experts} experts, k {k}, {tokens} tokens, {dtype}");
            assert_eq!(got.dims(), [tokens * k, n], "{label}");
            assert_eq!(
                got.to_f32_vec().unwrap(),
                want.to_f32_vec().unwrap(),
                "{label}"
            );
        }
    }
}
