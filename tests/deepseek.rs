//! DeepSeek-V3 beyond the fixture logits (`tests/models.rs` has those): GGUF files with
//! llama.cpp's `deepseek2` names and keys give the same logits as the HF original, both with the
//! combined `attn_kv_b` and with the per-head `attn_k_b` / `attn_v_b` split (and the `_mla` key
//! lengths of files that cache the latent); missing latent-attention metadata and expert counts
//! are refused by name; the latent attention stage (absorbed queries over the cached latent)
//! equals the HF definition (full per-head keys and values) in float64 on shapes unlike the
//! fixture's, as a prefill and then one token per step; the model's KV cache holds the latent (one row of
//! `kv_lora_rank + rope` values per token and layer), not per-head keys and values.

mod common;

use common::gguf::{gguf_file, safetensors_f32, Kv};
use fastllm::convert::{convert, ConvertOptions, TargetDtype};
use fastllm::data::{Data, DataType};
use fastllm::executor::Executor;
use fastllm::load::{load, LoadOptions};
use fastllm::model::mla::{self, MlaStep};
use fastllm::model::{KvStore, MapSource, MlaConfig, MlaNames, Precision, Weights};
use fastllm::ops::{self, AttentionParams, OutputCopy, RotaryParams, RotaryStyle};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

fn fixture() -> PathBuf {
    common::tiny_fixture("deepseek_v3")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-deepseek-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn config() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap()).unwrap()
}

/// `kv_b` [heads·(nope + v), rank] as llama.cpp splits it: `k_b` [heads, rank, nope] (each
/// head's key rows transposed) and `v_b` [heads, v, rank].
fn split_kv_b(w: &[f32], heads: usize, nope: usize, v: usize, rank: usize) -> (Vec<f32>, Vec<f32>) {
    let mut k = Vec::new();
    let mut vv = Vec::new();
    for h in 0..heads {
        let rows = &w[h * (nope + v) * rank..(h + 1) * (nope + v) * rank];
        for c in 0..rank {
            k.extend((0..nope).map(|j| rows[j * rank + c]));
        }
        vv.extend_from_slice(&rows[nope * rank..]);
    }
    (k, vv)
}

/// The fixture's tensors under llama.cpp's `deepseek2` names; `split` writes `attn_k_b` /
/// `attn_v_b` instead of `attn_kv_b`.
fn gguf_tensors(src: &BTreeMap<String, (Vec<usize>, Vec<f32>)>, c: &Value, split: bool) -> Tensors {
    let u = |k: &str| c[k].as_u64().unwrap() as usize;
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
    let dense = u("first_k_dense_replace");
    for l in 0..u("num_hidden_layers") {
        let p = format!("model.layers.{l}.");
        let b = format!("blk.{l}.");
        for (g, hf) in [
            ("attn_norm", "input_layernorm"),
            ("ffn_norm", "post_attention_layernorm"),
            ("attn_q_a", "self_attn.q_a_proj"),
            ("attn_q_a_norm", "self_attn.q_a_layernorm"),
            ("attn_q_b", "self_attn.q_b_proj"),
            ("attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"),
            ("attn_kv_a_norm", "self_attn.kv_a_layernorm"),
            ("attn_output", "self_attn.o_proj"),
        ] {
            put(format!("{b}{g}.weight"), get(&format!("{p}{hf}.weight")));
        }
        let kv_b = get(&format!("{p}self_attn.kv_b_proj.weight"));
        if split {
            let (h, n, v, r) = (
                u("num_attention_heads"),
                u("qk_nope_head_dim"),
                u("v_head_dim"),
                u("kv_lora_rank"),
            );
            let (k, vv) = split_kv_b(&kv_b.1, h, n, v, r);
            put(format!("{b}attn_k_b.weight"), (vec![h, r, n], k));
            put(format!("{b}attn_v_b.weight"), (vec![h, v, r], vv));
        } else {
            put(format!("{b}attn_kv_b.weight"), kv_b);
        }
        let projs = [
            ("ffn_gate", "gate_proj"),
            ("ffn_up", "up_proj"),
            ("ffn_down", "down_proj"),
        ];
        if l < dense {
            for (g, hf) in projs {
                put(
                    format!("{b}{g}.weight"),
                    get(&format!("{p}mlp.{hf}.weight")),
                );
            }
            continue;
        }
        put(
            format!("{b}ffn_gate_inp.weight"),
            get(&format!("{p}mlp.gate.weight")),
        );
        put(
            format!("{b}exp_probs_b.bias"),
            get(&format!("{p}mlp.gate.e_score_correction_bias")),
        );
        for (g, hf) in projs {
            let (mut dims, mut all) = (Vec::new(), Vec::new());
            for e in 0..u("n_routed_experts") {
                let (d, v) = get(&format!("{p}mlp.experts.{e}.{hf}.weight"));
                dims = d;
                all.extend(v);
            }
            put(
                format!("{b}{g}_exps.weight"),
                (vec![u("n_routed_experts"), dims[0], dims[1]], all),
            );
            put(
                format!("{b}{g}_shexp.weight"),
                get(&format!("{p}mlp.shared_experts.{hf}.weight")),
            );
        }
    }
    t
}

/// llama.cpp's `deepseek2.*` keys for the fixture's config; `mla_lengths` writes the key and
/// value lengths of a file that caches the latent (with the per-head ones as `_mla` keys).
fn gguf_kv(c: &Value, mla_lengths: bool) -> Vec<(String, Kv)> {
    let u = |k: &str| c[k].as_u64().unwrap() as u32;
    let k = |s: &str| format!("deepseek2.{s}");
    let (rank, rope) = (u("kv_lora_rank"), u("qk_rope_head_dim"));
    let (key, value) = (u("qk_nope_head_dim") + rope, u("v_head_dim"));
    let mut kv = vec![
        ("general.architecture".into(), Kv::Str("deepseek2".into())),
        (k("context_length"), Kv::U32(u("max_position_embeddings"))),
        (k("vocab_size"), Kv::U32(u("vocab_size"))),
        (k("embedding_length"), Kv::U32(u("hidden_size"))),
        (k("block_count"), Kv::U32(u("num_hidden_layers"))),
        (k("feed_forward_length"), Kv::U32(u("intermediate_size"))),
        (k("attention.head_count"), Kv::U32(u("num_attention_heads"))),
        (
            k("attention.layer_norm_rms_epsilon"),
            Kv::F32(c["rms_norm_eps"].as_f64().unwrap() as f32),
        ),
        (
            k("rope.freq_base"),
            Kv::F32(c["rope_parameters"]["rope_theta"].as_f64().unwrap() as f32),
        ),
        (k("rope.dimension_count"), Kv::U32(rope)),
        (k("attention.q_lora_rank"), Kv::U32(u("q_lora_rank"))),
        (k("attention.kv_lora_rank"), Kv::U32(rank)),
        (
            k("leading_dense_block_count"),
            Kv::U32(u("first_k_dense_replace")),
        ),
        (k("expert_count"), Kv::U32(u("n_routed_experts"))),
        (k("expert_used_count"), Kv::U32(u("num_experts_per_tok"))),
        (
            k("expert_feed_forward_length"),
            Kv::U32(u("moe_intermediate_size")),
        ),
        (k("expert_shared_count"), Kv::U32(u("n_shared_experts"))),
        (
            k("expert_weights_scale"),
            Kv::F32(c["routed_scaling_factor"].as_f64().unwrap() as f32),
        ),
        (k("expert_gating_func"), Kv::U32(2)),
        (k("expert_group_count"), Kv::U32(u("n_group"))),
        (k("expert_group_used_count"), Kv::U32(u("topk_group"))),
    ];
    if mla_lengths {
        kv.extend([
            (k("attention.head_count_kv"), Kv::U32(1)),
            (k("attention.key_length"), Kv::U32(rank + rope)),
            (k("attention.value_length"), Kv::U32(rank)),
            (k("attention.key_length_mla"), Kv::U32(key)),
            (k("attention.value_length_mla"), Kv::U32(value)),
        ]);
    } else {
        kv.extend([
            (
                k("attention.head_count_kv"),
                Kv::U32(u("num_attention_heads")),
            ),
            (k("attention.key_length"), Kv::U32(key)),
            (k("attention.value_length"), Kv::U32(value)),
        ]);
    }
    kv
}

fn logits(flm: &Path, ids: &[u32]) -> Vec<f32> {
    let opts = LoadOptions {
        threads: 2,
        precision: Precision::Exact,
        ..Default::default()
    };
    let llm = load(flm, &opts).unwrap();
    let mut cache = llm.model.new_cache(ids.len()).unwrap();
    llm.model
        .forward(&mut cache, ids, true)
        .unwrap()
        .to_f32_vec()
        .unwrap()
}

fn keep() -> ConvertOptions {
    ConvertOptions {
        dtype: TargetDtype::parse("keep").unwrap(),
    }
}

#[test]
fn deepseek2_gguf_equals_hf() {
    let c = config();
    let src = safetensors_f32(&fixture().join("model.safetensors"));
    let hf = tmp("hf.flm");
    convert(&fixture(), &hf, &keep(), &mut |_| {}).unwrap();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap())
            .unwrap();
    let ids: Vec<u32> = reference["cases"][0]["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let want = logits(&hf, &ids);
    for split in [false, true] {
        let gguf = tmp(&format!("split-{split}.gguf"));
        gguf_file(&gguf, gguf_kv(&c, split), &gguf_tensors(&src, &c, split));
        let flm = tmp(&format!("split-{split}.flm"));
        let report = convert(&gguf, &flm, &keep(), &mut |_| {}).unwrap();
        assert_eq!(report.architecture, "deepseek_v3");
        let got = logits(&flm, &ids);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-5,
            "deepseek2 GGUF (k_b/v_b split: {split}) vs HF logits differ by {worst}"
        );
    }
}

#[test]
fn deepseek2_gguf_without_latent_sizes_or_expert_counts_is_refused_by_name() {
    let c = config();
    let src = safetensors_f32(&fixture().join("model.safetensors"));
    let tensors = gguf_tensors(&src, &c, false);
    for key in [
        "deepseek2.attention.kv_lora_rank",
        "deepseek2.rope.dimension_count",
        "deepseek2.attention.value_length",
        "deepseek2.expert_count",
        "deepseek2.expert_used_count",
    ] {
        let kv: Vec<(String, Kv)> = gguf_kv(&c, false)
            .into_iter()
            .filter(|(k, _)| k != key)
            .collect();
        let gguf = tmp("no-key.gguf");
        gguf_file(&gguf, kv, &tensors);
        let e = convert(&gguf, &tmp("no-key.flm"), &keep(), &mut |_| {})
            .expect_err(key)
            .to_string();
        assert!(e.contains(key), "{key}: {e}");
    }
}

#[test]
fn deepseek2_gguf_with_v2_group_routing_or_nextn_layers_is_refused() {
    let c = config();
    let src = safetensors_f32(&fixture().join("model.safetensors"));
    let kv: Vec<(String, Kv)> = gguf_kv(&c, false)
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "deepseek2.expert_gating_func" => (k, Kv::U32(1)),
            _ => (k, v),
        })
        .collect();
    let gguf = tmp("v2-groups.gguf");
    gguf_file(&gguf, kv, &gguf_tensors(&src, &c, false));
    let e = convert(&gguf, &tmp("v2-groups.flm"), &keep(), &mut |_| {})
        .expect_err("softmax gating with groups")
        .to_string();
    assert!(e.contains("group_limited_greedy"), "{e}");
    let mut kv = gguf_kv(&c, false);
    kv.push(("deepseek2.nextn_predict_layers".into(), Kv::U32(1)));
    gguf_file(&gguf, kv, &gguf_tensors(&src, &c, false));
    let e = convert(&gguf, &tmp("nextn.flm"), &keep(), &mut |_| {})
        .expect_err("nextn layers")
        .to_string();
    assert!(e.contains("deepseek2.nextn_predict_layers"), "{e}");
}

// ---- the latent attention stage against its definition ---------------------------------

struct Rng(u64);
impl Rng {
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                (((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
            })
            .collect()
    }
}

/// A KV store that appends to growing f32 caches (as the model's contiguous cache does).
struct Store {
    k: Data,
    v: Data,
}

impl KvStore for Store {
    fn attend(
        &mut self,
        e: &Executor,
        _layer: usize,
        q: &Data,
        k: &Data,
        v: &Data,
        p: &AttentionParams,
        out: &mut Data,
    ) -> fastllm::Result<()> {
        ops::cat_direct(e, &mut self.k, k, 0)?;
        ops::cat_direct(e, &mut self.v, v, 0)?;
        ops::attention(e, q, &self.k, &self.v, p, out)
    }
}

/// One latent attention shape: (heads, q_lora_rank, kv_lora_rank, nope, rope, v).
type Shape = (usize, usize, usize, usize, usize, usize);

const NAMES: MlaNames = MlaNames {
    q: "q",
    q_a: "qa",
    q_a_norm: "qan",
    q_b: "qb",
    kv_a: "kva",
    kv_a_norm: "kvan",
    kv_b: "kvb",
    k_b: "kb",
    v_b: "vb",
};

fn mat(w: &BTreeMap<String, (Vec<usize>, Vec<f32>)>, n: &str, x: &[f64]) -> Vec<f64> {
    let (d, v) = &w[&format!("l.{n}.weight")];
    (0..d[0])
        .map(|r| (0..d[1]).map(|c| v[r * d[1] + c] as f64 * x[c]).sum())
        .collect()
}

fn rms(w: &BTreeMap<String, (Vec<usize>, Vec<f32>)>, n: &str, x: &[f64]) -> Vec<f64> {
    let g = &w[&format!("l.{n}.weight")].1;
    let m = (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + 1e-6).sqrt();
    x.iter().zip(g).map(|(v, g)| v / m * *g as f64).collect()
}

/// Rotates `x` (rope dims) at position `p` with base 10000: pairs (2i, 2i+1) when
/// `interleaved`, else (i, i + r/2); returned in the input's layout.
fn rot(x: &[f64], p: usize, interleaved: bool) -> Vec<f64> {
    let r = x.len();
    let mut o = x.to_vec();
    for i in 0..r / 2 {
        let a = p as f64 * 10000f64.powf(-2.0 * i as f64 / r as f64);
        let (j, k) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + r / 2)
        };
        o[j] = x[j] * a.cos() - x[k] * a.sin();
        o[k] = x[k] * a.cos() + x[j] * a.sin();
    }
    o
}

/// Float64 attention of the HF definition (full per-head keys and values from `kv_b`) for
/// every token of `x` [s, hidden]: [s, heads·v].
fn reference(
    w: &BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    sh: Shape,
    x: &[f32],
    hidden: usize,
    interleaved: bool,
) -> Vec<f64> {
    let (h, ql, rank, n, r, v) = sh;
    let s = x.len() / hidden;
    let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..s {
        let xt: Vec<f64> = x[t * hidden..(t + 1) * hidden]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let q = if ql > 0 {
            mat(w, "qb", &rms(w, "qan", &mat(w, "qa", &xt)))
        } else {
            mat(w, "q", &xt)
        };
        let kva = mat(w, "kva", &xt);
        let kr = rot(&kva[rank..], t, interleaved);
        let kv = mat(w, "kvb", &rms(w, "kvan", &kva[..rank]));
        for hh in 0..h {
            let qh = &q[hh * (n + r)..(hh + 1) * (n + r)];
            let mut qf = qh[..n].to_vec();
            qf.extend(rot(&qh[n..], t, interleaved));
            qs.push(qf);
            let kh = &kv[hh * (n + v)..(hh + 1) * (n + v)];
            let mut kf = kh[..n].to_vec();
            kf.extend(&kr);
            ks.push(kf);
            vs.push(kh[n..].to_vec());
        }
    }
    let scale = 1.0 / ((n + r) as f64).sqrt();
    let mut out = vec![0f64; s * h * v];
    for t in 0..s {
        for hh in 0..h {
            let q = &qs[t * h + hh];
            let sc: Vec<f64> = (0..=t)
                .map(|j| {
                    q.iter()
                        .zip(&ks[j * h + hh])
                        .map(|(a, b)| a * b)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = sc.iter().map(|s| (s - m).exp()).sum();
            for (j, s) in sc.iter().enumerate() {
                for (o, vv) in out[(t * h + hh) * v..(t * h + hh + 1) * v]
                    .iter_mut()
                    .zip(&vs[j * h + hh])
                {
                    *o += (s - m).exp() / z * vv;
                }
            }
        }
    }
    out
}

/// The stage on random weights of shape `sh`: a prefill of `pre` tokens then one token per
/// step through the store, against [`reference`].
fn check_stage(sh: Shape, interleaved: bool, pre: usize, total: usize) {
    let (h, ql, rank, n, r, v) = sh;
    let hidden = 20;
    let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ (h * 131 + rank * 7 + ql) as u64);
    let mut w = BTreeMap::new();
    let mut put = |name: &str, dims: Vec<usize>, sc: f32| {
        let vals = rng.vec(dims.iter().product(), sc);
        w.insert(format!("l.{name}.weight"), (dims, vals));
    };
    if ql > 0 {
        put("qa", vec![ql, hidden], 0.4);
        put("qan", vec![ql], 1.0);
        put("qb", vec![h * (n + r), ql], 0.4);
    } else {
        put("q", vec![h * (n + r), hidden], 0.4);
    }
    put("kva", vec![rank + r, hidden], 0.4);
    put("kvan", vec![rank], 1.0);
    put("kvb", vec![h * (n + v), rank], 0.4);
    let x = rng.vec(total * hidden, 1.0);
    let mut map = MapSource::new();
    for (k, (d, vals)) in &w {
        map.insert(k.clone(), Data::from_f32(d, vals).unwrap());
    }
    let mut weights = Weights::new(std::sync::Arc::new(map), false).unwrap();
    let m = MlaConfig {
        q_lora_rank: ql,
        kv_lora_rank: rank,
        nope_dim: n,
        v_head_dim: v,
        score_scale: 1.0,
    };
    mla::prepare(&mut weights, &NAMES, &m, h, "l.").unwrap();
    let exec = Executor::cpu(2).unwrap();
    let st = MlaStep {
        exec: &exec,
        weights: &weights,
        quant_act: false,
        heads: h,
        rope_dim: r,
        rope_q_scale: 1.0,
    };
    let ap = AttentionParams {
        scale: m.attention_scale(r),
        softcap: 0.0,
        sliding_window: 0,
        alibi: None,
        fast: false,
        output_copy: OutputCopy::None,
        sinks: None,
    };
    let mut store = Store {
        k: Data::zeros(DataType::F32, &[0, 1, rank + r]).unwrap(),
        v: Data::zeros(DataType::F32, &[0, 1, rank + r]).unwrap(),
    };
    store.k.reserve(0, total).unwrap();
    store.v.reserve(0, total).unwrap();
    let mut got = Vec::new();
    let mut at = 0;
    while at < total {
        let len = if at == 0 { pre } else { 1 };
        let pos: Vec<i32> = (at..at + len).map(|p| p as i32).collect();
        let pos = Data::from_i32(&[len], &pos).unwrap();
        let rope = RotaryParams {
            positions: &pos,
            inv_freq: None,
            rotary_dim: r,
            style: if interleaved {
                RotaryStyle::Interleaved
            } else {
                RotaryStyle::Neox
            },
            theta: 10000.0,
            tables: None,
        };
        let xs = Data::from_f32(&[len, hidden], &x[at * hidden..(at + len) * hidden]).unwrap();
        let mut out = Data::empty(DataType::F32);
        mla::mla_attention(
            &st, &m, &NAMES, "l.", 0, &xs, &rope, &mut store, &ap, &mut out,
        )
        .unwrap();
        got.extend(out.to_f32_vec().unwrap());
        at += len;
    }
    let want = reference(&w, sh, &x, hidden, interleaved);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (*g as f64 - w).abs() < 1e-5,
            "{sh:?} interleaved {interleaved}: value {i}: {g} vs {w}"
        );
    }
}

#[test]
fn latent_attention_matches_its_definition_on_other_shapes() {
    // (heads, q_lora_rank, kv_lora_rank, nope, rope, v): no query compression, odd sizes, v
    // wider than nope, one head
    for (sh, interleaved) in [
        ((3, 0, 20, 12, 6, 10), true),
        ((3, 0, 20, 12, 6, 10), false),
        ((5, 9, 7, 3, 4, 17), true),
        ((1, 16, 33, 8, 2, 5), false),
    ] {
        check_stage(sh, interleaved, 5, 9);
    }
}

/// The tiny DeepSeek-V3's KV cache reserves one row of `kv_lora_rank + rope` values per token
/// and layer (the latent and the rotated shared key, kept once), not the per-head keys and
/// values; a step through that cache still gives the whole-prompt logits.
#[test]
fn the_cache_holds_the_latent_not_full_keys_and_values() {
    let out = tmp("latent-cache.flm");
    convert(&fixture(), &out, &keep(), &mut |_| {}).unwrap();
    let llm = load(
        &out,
        &LoadOptions {
            threads: 2,
            precision: Precision::Exact,
            ..Default::default()
        },
    )
    .unwrap();
    let c = llm.model.config().clone();
    let m = c.mla.clone().expect("deepseek_v3 has latent attention");
    let (rank, rope) = (m.kv_lora_rank, c.rope_dim);
    assert_eq!((c.num_kv_heads, c.head_dim), (1, rank + rope));
    let cap = 48;
    let cache = llm.model.new_cache(cap).unwrap();
    let latent = c.num_layers * cap * (rank + rope) * 4; // f32 in `exact`
    let full = c.num_layers * cap * c.num_heads * (m.nope_dim + rope + m.v_head_dim) * 4;
    println!(
        "cache of {cap} tokens: {} bytes (latent {latent}, per-head keys and values {full})",
        cache.reserved_bytes()
    );
    assert_eq!(cache.reserved_bytes(), latent);
    assert!(latent < full);
    // prefill then one token per step through that cache equals one prefill of the same tokens
    let ids: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 500).collect();
    let whole = logits(&out, &ids);
    let mut cache = llm.model.new_cache(cap).unwrap();
    let mut rows = llm
        .model
        .forward(&mut cache, &ids[..8], true)
        .unwrap()
        .to_f32_vec()
        .unwrap();
    for t in &ids[8..] {
        let l = llm.model.forward(&mut cache, &[*t], false).unwrap();
        rows.extend(l.to_f32_vec().unwrap());
    }
    assert_eq!(cache.reserved_bytes(), latent);
    let worst = rows
        .iter()
        .zip(&whole)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "steps vs prefill: max |Δlogit| {worst}");
}
