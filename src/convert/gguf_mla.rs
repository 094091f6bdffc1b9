//! DeepSeek-V2/V3 GGUF metadata (llama.cpp's `deepseek2` architecture): the latent attention
//! sizes (`attention.q_lora_rank`, `attention.kv_lora_rank`, `rope.dimension_count`, and the
//! per-head dims from `attention.key_length_mla` / `value_length_mla`, or from `key_length` /
//! `value_length` in files written before llama.cpp cached the latent), the shared experts
//! (`expert_shared_count`), and YaRN's softmax scale as llama.cpp forms it (`(attn_factor ·
//! (1 + yarn_log_multiplier · ln factor))²`, with the rotation itself left unscaled).
//! DeepSeek-V2's group-limited greedy routing (softmax gating with expert groups) and files
//! whose `block_count` includes multi-token-prediction layers are refused.

use super::gguf_keys::GgufKeys;
use crate::error::{Error, Result};
use crate::model::{MlaConfig, ModelConfig, MoeScoring, RopeScaling, RopeStyle};

/// Fills `c.mla` (and the cached row's `head_dim` / `num_kv_heads` / `rope_dim`), the shared
/// experts' size and the YaRN scales of a `deepseek2` GGUF.
pub(super) fn deepseek2(k: &GgufKeys, c: &mut ModelConfig) -> Result<()> {
    let path = &k.g.path;
    if let Some(n) = k.u64("nextn_predict_layers").filter(|&n| n > 0) {
        return Err(Error::Unsupported(format!(
            "{path}: {} = {n}: multi-token-prediction layers counted in block_count",
            k.key("nextn_predict_layers")
        )));
    }
    let rank = k.size("attention.kv_lora_rank")?;
    let rope = k.size("rope.dimension_count")?;
    let (key_len, value_len) = if k.u64("attention.key_length_mla").is_some() {
        (
            k.size("attention.key_length_mla")?,
            k.size("attention.value_length_mla")?,
        )
    } else {
        (
            k.size("attention.key_length")?,
            k.size("attention.value_length")?,
        )
    };
    if key_len <= rope || rope == 0 || rope % 2 != 0 {
        return Err(k.error(format!(
            "deepseek2: key length {key_len} must exceed the even rope dims {rope}"
        )));
    }
    let mut score_scale = 1.0;
    if let RopeScaling::Yarn {
        factor,
        attention_factor,
        ..
    } = &mut c.rope_scaling
    {
        let log_mul = k.f64("rope.scaling.yarn_log_multiplier").unwrap_or(0.0);
        let attn = k.f64("rope.scaling.attn_factor").unwrap_or(1.0);
        let m = attn * (1.0 + log_mul * (*factor as f64).ln());
        score_scale = (m * m) as f32;
        *attention_factor = 1.0;
    }
    c.mla = Some(MlaConfig {
        q_lora_rank: k.size_or("attention.q_lora_rank", 0),
        kv_lora_rank: rank,
        nope_dim: key_len - rope,
        v_head_dim: value_len,
        score_scale,
    });
    c.head_dim = rank + rope;
    c.num_kv_heads = 1;
    c.rope_dim = rope;
    c.rope_style = RopeStyle::Interleaved;
    if let Some(m) = &mut c.moe {
        if m.scoring == MoeScoring::Softmax && m.topk_groups < m.groups {
            // DeepSeek-V2 ranks a group by its best expert; the router here ranks DeepSeek-V3's
            // way (the sum of the best two sigmoid scores)
            return Err(Error::Unsupported(format!(
                "{}: deepseek2 with softmax gating and group-limited routing ({} of {} groups: \
                 DeepSeek-V2's group_limited_greedy)",
                path, m.topk_groups, m.groups
            )));
        }
        let shared = k.size_or("expert_shared_count", 0);
        m.shared_intermediate = shared * m.expert_intermediate;
    }
    Ok(())
}
