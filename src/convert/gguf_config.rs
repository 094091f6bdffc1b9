//! `ModelConfig` from GGUF metadata (`{arch}.*` keys: llama, qwen2, qwen3, phi3, gemma3, qwen3moe,
//! deepseek2, gpt-oss) and the chat template. Missing required keys are errors naming the key and
//! the file.

use super::gguf_keys::GgufKeys;
use super::gguf_rope::gguf_rope_scaling;
use crate::error::{Error, Result};
use crate::format::gguf::GgufFile;
use crate::model::{ModelConfig, MoeConfig, MoeScoring, RopeStyle};

/// GGUF architectures the converter knows.
pub const GGUF_ARCHITECTURES: [&str; 8] = [
    "llama",
    "qwen2",
    "qwen3",
    "phi3",
    "gemma3",
    "qwen3moe",
    "deepseek2",
    "gpt-oss",
];

/// The GGUF architecture, refused when unknown.
pub fn gguf_architecture(g: &GgufFile) -> Result<String> {
    let arch = g
        .architecture()
        .ok_or_else(|| Error::format(&g.path, "no general.architecture"))?;
    if !GGUF_ARCHITECTURES.contains(&arch) {
        return Err(Error::Unsupported(format!(
            "{}: GGUF architecture {arch:?} (supported: {})",
            g.path,
            GGUF_ARCHITECTURES.join(", ")
        )));
    }
    Ok(arch.to_string())
}

fn id(g: &GgufFile, key: &str) -> Option<u32> {
    g.get_u64(key).and_then(|v| u32::try_from(v).ok())
}

impl ModelConfig {
    /// Builds the config from a GGUF file's metadata and tensor index.
    pub fn from_gguf(g: &GgufFile) -> Result<ModelConfig> {
        let arch = gguf_architecture(g)?;
        let k = GgufKeys::new(g, &arch);
        let hidden = k.size("embedding_length")?;
        let heads = k.size("attention.head_count")?;
        if heads == 0 {
            return Err(k.error("attention.head_count is 0"));
        }
        let head_dim = k.size_or("attention.key_length", hidden / heads);
        let context_length = k.size("context_length")?;
        let rope_dim = k.size_or("rope.dimension_count", head_dim);
        let num_layers = k.size("block_count")?;
        let moe = gguf_moe(&k, num_layers)?;
        let intermediate_size = match &moe {
            Some(m) => k.size_or("feed_forward_length", m.expert_intermediate),
            None => k.size("feed_forward_length")?,
        };
        let norm_key = "attention.layer_norm_rms_epsilon";
        let norm_eps = k
            .f64(norm_key)
            .ok_or_else(|| k.error(format!("missing {}", k.key(norm_key))))?;
        let mut c = ModelConfig {
            architecture: config_architecture(&arch, moe.is_some()),
            vocab_size: vocab_size(&k)?,
            hidden_size: hidden,
            intermediate_size,
            num_layers,
            num_heads: heads,
            num_kv_heads: k.size_or("attention.head_count_kv", heads),
            head_dim,
            context_length,
            norm_eps: norm_eps as f32,
            rope_theta: k.f64("rope.freq_base").unwrap_or(10000.0) as f32,
            rope_dim,
            rope_style: RopeStyle::Neox,
            rope_scaling: gguf_rope_scaling(g, &arch, context_length, rope_dim)?,
            rope_local_theta: 0.0,
            tie_embeddings: g.tensor("output.weight").is_none(),
            hidden_act: "silu".into(),
            attn_logit_softcap: 0.0,
            final_logit_softcap: 0.0,
            sliding_window: 0,
            sliding_layers: Vec::new(),
            query_pre_attn_scalar: 0.0,
            bos_id: id(g, "tokenizer.ggml.bos_token_id"),
            eos_ids: id(g, "tokenizer.ggml.eos_token_id").into_iter().collect(),
            moe,
            mla: None,
        };
        match arch.as_str() {
            "gemma3" => gemma3(&k, &mut c)?,
            "phi3" => phi3(&k, &mut c),
            "deepseek2" => super::gguf_mla::deepseek2(&k, &mut c)?,
            "gpt-oss" => gpt_oss(&k, &mut c)?,
            _ => {}
        }
        Ok(c)
    }
}

/// The architecture name of the config for GGUF architecture `arch` (a llama file with
/// experts is Mixtral).
fn config_architecture(arch: &str, moe: bool) -> String {
    match (arch, moe) {
        ("llama", true) => "mixtral",
        ("qwen3moe", _) => "qwen3_moe",
        ("deepseek2", _) => "deepseek_v3",
        ("gpt-oss", _) => "gpt_oss",
        _ => arch,
    }
    .into()
}

/// The vocabulary size: `{arch}.vocab_size`, else the number of tokenizer tokens, else the
/// embedding's rows.
fn vocab_size(k: &GgufKeys) -> Result<usize> {
    let g = k.g;
    match k.u64("vocab_size") {
        Some(v) => Ok(v as usize),
        None => g
            .get_array("tokenizer.ggml.tokens")
            .map(|a| a.len())
            .or_else(|| {
                g.tensor("token_embd.weight")
                    .and_then(|t| t.dims.get(1).map(|&d| d as usize))
            })
            .ok_or_else(|| Error::format(&g.path, "cannot tell the vocabulary size")),
    }
}

/// Phi-3's sliding window (every layer; 0 = none).
fn phi3(k: &GgufKeys, c: &mut ModelConfig) {
    c.sliding_window = k.size_or("attention.sliding_window", 0);
    if c.sliding_window > 0 {
        c.sliding_layers = vec![true; c.num_layers];
    }
}

/// Gemma-3's settings beyond the llama family's: GELU-tanh, scaled attention as llama.cpp sets
/// it (`head_dim^-0.5`, or `(hidden/heads)^-0.5` for the 62-layer 27B), sliding-window layers
/// (all but every `sliding_window_pattern`-th, 6 by default, or an explicit per-layer list)
/// with their own rotary base (`rope.freq_base_swa`, 10000 by default), final soft-capping.
fn gemma3(k: &GgufKeys, c: &mut ModelConfig) -> Result<()> {
    c.hidden_act = "gelu_tanh".into();
    c.query_pre_attn_scalar = if c.num_layers == 62 {
        (c.hidden_size / c.num_heads) as f32
    } else {
        c.head_dim as f32
    };
    c.final_logit_softcap = k.f64("final_logit_softcapping").unwrap_or(0.0) as f32;
    c.sliding_window = k.size_or("attention.sliding_window", 0);
    if c.sliding_window > 0 {
        let key = k.key("attention.sliding_window_pattern");
        c.sliding_layers = match k.g.get(&key) {
            Some(v) if v.as_array().is_some() => {
                let a = v.as_array().unwrap_or_default();
                if a.len() != c.num_layers {
                    return Err(k.error(format!(
                        "{key} has {} entries for {} layers",
                        a.len(),
                        c.num_layers
                    )));
                }
                a.iter()
                    .map(|b| {
                        b.as_bool()
                            .ok_or_else(|| k.error(format!("{key} must hold booleans")))
                    })
                    .collect::<Result<Vec<bool>>>()?
            }
            Some(v) => {
                let n = v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| k.error(format!("{key} must be a positive integer")))?
                    as usize;
                (0..c.num_layers).map(|i| i % n < n - 1).collect()
            }
            None => (0..c.num_layers).map(|i| i % 6 < 5).collect(),
        };
        c.rope_local_theta = k.f64("rope.freq_base_swa").unwrap_or(10000.0) as f32;
    }
    Ok(())
}

/// GPT-OSS's settings beyond the llama family's: sliding-window layers alternating with full
/// ones from the first (llama.cpp's pattern of 2; `attention.sliding_window` is required), the
/// experts' clamped SwiGLU (alpha 1.702, limit 7, as llama.cpp fixes them), and YaRN with the
/// ramp's ends left fractional (HF `truncate: false`).
fn gpt_oss(k: &GgufKeys, c: &mut ModelConfig) -> Result<()> {
    c.sliding_window = k.positive("attention.sliding_window")?;
    c.sliding_layers = (0..c.num_layers).map(|i| i % 2 == 0).collect();
    if let crate::model::RopeScaling::Yarn { truncate, .. } = &mut c.rope_scaling {
        *truncate = false;
    }
    if let Some(m) = &mut c.moe {
        m.swiglu_clamp = Some(crate::model::SwigluClamp {
            alpha: 1.702,
            limit: 7.0,
        });
    }
    Ok(())
}

/// The mixture-of-experts config from llama.cpp's `{arch}.expert_*` keys: `None` for a dense
/// model (a llama file without experts); a MoE architecture or expert tensors without
/// `expert_count` / `expert_used_count` are errors naming the key.
fn gguf_moe(k: &GgufKeys, layers: usize) -> Result<Option<MoeConfig>> {
    let g = k.g;
    let has_experts = g
        .tensors
        .iter()
        .any(|t| t.name.contains("_exps.") || t.name.contains("ffn_gate_inp."));
    if !matches!(k.arch(), "qwen3moe" | "gpt-oss")
        && !has_experts
        && k.u64("expert_count").is_none_or(|n| n == 0)
    {
        return Ok(None);
    }
    let experts = k.positive("expert_count")?;
    let experts_per_token = k.positive("expert_used_count")?;
    let expert_intermediate = match k.u64("expert_feed_forward_length") {
        Some(v) => v as usize,
        None => k.positive("feed_forward_length")?,
    };
    let scoring = match k.u64("expert_gating_func") {
        None | Some(1) => MoeScoring::Softmax,
        Some(2) => MoeScoring::Sigmoid,
        Some(other) => {
            return Err(Error::Unsupported(format!(
                "{}: {} = {other} (1 = softmax and 2 = sigmoid are supported)",
                g.path,
                k.key("expert_gating_func")
            )))
        }
    };
    let groups = k.u64("expert_group_count").map_or(1, |v| v.max(1) as usize);
    let dense = k.size_or("leading_dense_block_count", 0);
    Ok(Some(MoeConfig {
        experts,
        experts_per_token,
        expert_intermediate,
        scoring,
        groups,
        topk_groups: k
            .u64("expert_group_used_count")
            .map_or(groups, |v| v.max(1) as usize),
        normalize: !matches!(
            g.get(&k.key("expert_weights_norm")),
            Some(crate::format::gguf::GgufValue::Bool(false))
        ),
        routed_scale: k.f64("expert_weights_scale").map_or(1.0, |v| v as f32),
        shared_intermediate: 0,
        layers: (0..layers).map(|i| i >= dense).collect(),
        swiglu_clamp: None,
    }))
}
