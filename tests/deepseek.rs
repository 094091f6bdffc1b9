//! DeepSeek-V3 beyond the fixture logits (`tests/models.rs` has those): GGUF files with
//! llama.cpp's `deepseek2` names and keys give the same logits as the HF original, both with the
//! combined `attn_kv_b` and with the per-head `attn_k_b` / `attn_v_b` split (and the `_mla` key
//! lengths of files that cache the latent); missing latent-attention metadata is refused by
//! name.

mod common;

use common::gguf::{gguf_file, safetensors_f32, Kv};
use fastllm::convert::{convert, ConvertOptions, TargetDtype};
use fastllm::load::{load, LoadOptions};
use fastllm::model::Precision;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/tiny/deepseek_v3")
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
fn deepseek2_gguf_without_latent_sizes_is_refused_by_name() {
    let c = config();
    let src = safetensors_f32(&fixture().join("model.safetensors"));
    let tensors = gguf_tensors(&src, &c, false);
    for key in [
        "deepseek2.attention.kv_lora_rank",
        "deepseek2.rope.dimension_count",
        "deepseek2.attention.value_length",
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
