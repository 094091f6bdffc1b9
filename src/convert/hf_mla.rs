//! The DeepSeek-V3 parts of an HF `config.json`: the latent attention sizes (and the
//! `head_dim` / `num_kv_heads` / `rope_dim` of its cached latent row, see `model::mla`), the
//! softmax scale's YaRN `mscale_all_dim`, and the routed + shared experts. Sizes without a
//! default are required; routing settings default as HF's `DeepseekV3Config` does.

use crate::error::{Error, Result};
use crate::model::{MlaConfig, ModelConfig, MoeConfig, MoeScoring, RopeStyle};
use serde_json::Value;

fn opt_size(v: &Value, path: &str, key: &str) -> Result<Option<usize>> {
    match v.get(key).filter(|x| !x.is_null()) {
        None => Ok(None),
        Some(x) => x
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| Error::format(path, format!("{key} must be a non-negative integer"))),
    }
}

fn need_size(v: &Value, path: &str, key: &str) -> Result<usize> {
    opt_size(v, path, key)?.ok_or_else(|| Error::format(path, format!("missing {key}")))
}

fn opt_float(v: &Value, path: &str, key: &str) -> Result<Option<f64>> {
    match v.get(key).filter(|x| !x.is_null()) {
        None => Ok(None),
        Some(x) => x
            .as_f64()
            .map(Some)
            .ok_or_else(|| Error::format(path, format!("{key} must be a number"))),
    }
}

/// HF `yarn_get_mscale`.
fn mscale(factor: f64, m: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * m * factor.ln() + 1.0
    }
}

/// The softmax scale multiplier: `mscale(factor, mscale_all_dim)²` when the rope is scaled and
/// `mscale_all_dim` is set, else 1.
fn score_scale(v: &Value, path: &str) -> Result<f32> {
    let Some(rp) = ["rope_parameters", "rope_scaling"]
        .iter()
        .filter_map(|k| v.get(*k))
        .find(|r| r.is_object())
    else {
        return Ok(1.0);
    };
    let kind = rp
        .get("rope_type")
        .or_else(|| rp.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let all = opt_float(rp, path, "mscale_all_dim")?.unwrap_or(0.0);
    if kind == "default" || all == 0.0 {
        return Ok(1.0);
    }
    let factor = opt_float(rp, path, "factor")?.ok_or_else(|| {
        Error::format(
            path,
            "rope scaling with mscale_all_dim needs its factor (the attention scale uses it)",
        )
    })?;
    let m = mscale(factor, all);
    Ok((m * m) as f32)
}

/// Fills `c.mla` from config `v` and makes `head_dim` / `num_kv_heads` / `rope_dim` those of the
/// cached latent row; the rope pairing follows `rope_interleave` (true by default).
pub fn latent_attention(v: &Value, path: &str, c: &mut ModelConfig) -> Result<()> {
    let rank = need_size(v, path, "kv_lora_rank")?;
    let rope = need_size(v, path, "qk_rope_head_dim")?;
    if rope == 0 || rope % 2 != 0 {
        return Err(Error::format(
            path,
            format!("qk_rope_head_dim {rope} must be even and ≥ 2"),
        ));
    }
    let m = MlaConfig {
        q_lora_rank: opt_size(v, path, "q_lora_rank")?.unwrap_or(0),
        kv_lora_rank: rank,
        nope_dim: need_size(v, path, "qk_nope_head_dim")?,
        v_head_dim: need_size(v, path, "v_head_dim")?,
        score_scale: score_scale(v, path)?,
    };
    c.head_dim = rank + rope;
    c.num_kv_heads = 1;
    c.rope_dim = rope;
    let interleave = v
        .get("rope_interleave")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    c.rope_style = if interleave {
        RopeStyle::Interleaved
    } else {
        RopeStyle::Neox
    };
    c.mla = Some(m);
    Ok(())
}

/// DeepSeek-V3's experts: sigmoid scores with the choice bias, group-limited top-k, routed
/// scaling, `n_shared_experts` shared experts of `moe_intermediate_size` each, the first
/// `first_k_dense_replace` layers dense.
pub fn deepseek_moe(v: &Value, path: &str, layers: usize) -> Result<MoeConfig> {
    if let Some(f) = v.get("scoring_func").and_then(Value::as_str) {
        if f != "sigmoid" {
            return Err(Error::Unsupported(format!(
                "{path}: deepseek_v3 scoring_func {f:?} (only sigmoid)"
            )));
        }
    }
    let inner = need_size(v, path, "moe_intermediate_size")?;
    let shared = opt_size(v, path, "n_shared_experts")?.unwrap_or(1);
    let dense = opt_size(v, path, "first_k_dense_replace")?.unwrap_or(3);
    Ok(MoeConfig {
        experts: need_size(v, path, "n_routed_experts")?,
        experts_per_token: need_size(v, path, "num_experts_per_tok")?,
        expert_intermediate: inner,
        scoring: MoeScoring::Sigmoid,
        groups: opt_size(v, path, "n_group")?.unwrap_or(8),
        topk_groups: opt_size(v, path, "topk_group")?.unwrap_or(4),
        normalize: v
            .get("norm_topk_prob")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        routed_scale: opt_float(v, path, "routed_scaling_factor")?.unwrap_or(2.5) as f32,
        shared_intermediate: inner * shared,
        layers: (0..layers).map(|i| i >= dense).collect(),
        swiglu_clamp: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_variants_of_other_deepseek_shapes() {
        let v = serde_json::json!({
            "model_type": "deepseek_v3", "hidden_size": 96, "num_attention_heads": 6,
            "num_key_value_heads": 6, "num_hidden_layers": 4, "intermediate_size": 200,
            "max_position_embeddings": 256, "vocab_size": 300, "head_dim": 6,
            "q_lora_rank": null, "kv_lora_rank": 40, "qk_nope_head_dim": 10,
            "qk_rope_head_dim": 6, "v_head_dim": 12, "rope_interleave": false,
            "n_routed_experts": 12, "num_experts_per_tok": 3, "moe_intermediate_size": 20,
            "n_shared_experts": 2, "n_group": 4, "topk_group": 2, "norm_topk_prob": false,
            "routed_scaling_factor": 1.5, "first_k_dense_replace": 2,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                             "mscale": 0.5, "mscale_all_dim": 0.5}
        });
        let c = ModelConfig::from_hf_json(&v.to_string(), None, "config.json").unwrap();
        let m = c.mla.as_ref().unwrap();
        assert_eq!(
            (m.q_lora_rank, m.kv_lora_rank, m.nope_dim, m.v_head_dim),
            (0, 40, 10, 12)
        );
        assert_eq!((c.head_dim, c.num_kv_heads, c.rope_dim), (46, 1, 6));
        assert_eq!(c.rope_style, RopeStyle::Neox);
        let ms = 0.1 * 0.5 * 4f64.ln() + 1.0;
        assert!((m.score_scale as f64 - ms * ms).abs() < 1e-6);
        let e = c.moe.as_ref().unwrap();
        assert_eq!(
            (e.experts, e.experts_per_token, e.groups, e.topk_groups),
            (12, 3, 4, 2)
        );
        assert_eq!((e.expert_intermediate, e.shared_intermediate), (20, 40));
        assert!(!e.normalize && e.scoring == MoeScoring::Sigmoid);
        assert_eq!(e.routed_scale, 1.5);
        assert_eq!(e.layers, vec![false, false, true, true]);
        let mut bad = v.clone();
        bad["scoring_func"] = serde_json::json!("softmax");
        let err = ModelConfig::from_hf_json(&bad.to_string(), None, "config.json").unwrap_err();
        assert!(err.to_string().contains("scoring_func"), "{err}");
        let mut missing = v;
        missing.as_object_mut().unwrap().remove("kv_lora_rank");
        let err = ModelConfig::from_hf_json(&missing.to_string(), None, "config.json").unwrap_err();
        assert!(err.to_string().contains("kv_lora_rank"), "{err}");
    }

    #[test]
    fn yarn_mscale_all_dim_scales_the_scores() {
        let v: Value = serde_json::json!({
            "rope_scaling": {"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0}
        });
        let m = 0.1 * 40f64.ln() + 1.0;
        assert!((score_scale(&v, "c").unwrap() as f64 - m * m).abs() < 1e-6);
        let plain: Value = serde_json::json!({"rope_parameters": {"rope_type": "default"}});
        assert_eq!(score_scale(&plain, "c").unwrap(), 1.0);
        let no_factor: Value =
            serde_json::json!({"rope_scaling": {"type": "yarn", "mscale_all_dim": 1.0}});
        assert!(score_scale(&no_factor, "c").is_err());
    }
}
