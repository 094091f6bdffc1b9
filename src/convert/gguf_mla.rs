//! DeepSeek-V2/V3 GGUF metadata (llama.cpp's `deepseek2` architecture): the latent attention
//! sizes (`attention.q_lora_rank`, `attention.kv_lora_rank`, `rope.dimension_count`, and the
//! per-head dims from `attention.key_length_mla` / `value_length_mla`, or from `key_length` /
//! `value_length` in files written before llama.cpp cached the latent), the shared experts
//! (`expert_shared_count`), and YaRN's softmax scale as llama.cpp forms it (`(attn_factor ·
//! (1 + yarn_log_multiplier · ln factor))²`, with the rotation itself left unscaled).
//! DeepSeek-V2's group-limited greedy routing (softmax gating with expert groups) and files
//! whose `block_count` includes multi-token-prediction layers are refused.

use super::gguf_config::size;
use crate::error::{Error, Result};
use crate::format::gguf::GgufFile;
use crate::model::{MlaConfig, ModelConfig, MoeScoring, RopeScaling, RopeStyle};

/// Fills `c.mla` (and the cached row's `head_dim` / `num_kv_heads` / `rope_dim`), the shared
/// experts' size and the YaRN scales of a `deepseek2` GGUF.
pub fn deepseek2(g: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    let k = |s: &str| format!("deepseek2.{s}");
    if let Some(n) = g.get_u64(&k("nextn_predict_layers")).filter(|&n| n > 0) {
        return Err(Error::Unsupported(format!(
            "{}: {} = {n}: multi-token-prediction layers counted in block_count",
            g.path,
            k("nextn_predict_layers")
        )));
    }
    let rank = size(g, &k("attention.kv_lora_rank"))?;
    let rope = size(g, &k("rope.dimension_count"))?;
    let (key_len, value_len) = if g.get_u64(&k("attention.key_length_mla")).is_some() {
        (
            size(g, &k("attention.key_length_mla"))?,
            size(g, &k("attention.value_length_mla"))?,
        )
    } else {
        (
            size(g, &k("attention.key_length"))?,
            size(g, &k("attention.value_length"))?,
        )
    };
    if key_len <= rope || rope == 0 || rope % 2 != 0 {
        return Err(Error::format(
            &g.path,
            format!("deepseek2: key length {key_len} must exceed the even rope dims {rope}"),
        ));
    }
    let mut score_scale = 1.0;
    if let RopeScaling::Yarn {
        factor,
        attention_factor,
        ..
    } = &mut c.rope_scaling
    {
        let log_mul = g
            .get_f64(&k("rope.scaling.yarn_log_multiplier"))
            .unwrap_or(0.0);
        let attn = g.get_f64(&k("rope.scaling.attn_factor")).unwrap_or(1.0);
        let m = attn * (1.0 + log_mul * (*factor as f64).ln());
        score_scale = (m * m) as f32;
        *attention_factor = 1.0;
    }
    c.mla = Some(MlaConfig {
        q_lora_rank: g
            .get_u64(&k("attention.q_lora_rank"))
            .map_or(0, |v| v as usize),
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
                g.path, m.topk_groups, m.groups
            )));
        }
        let shared = g.get_u64(&k("expert_shared_count")).unwrap_or(0) as usize;
        m.shared_intermediate = shared * m.expert_intermediate;
    }
    Ok(())
}
