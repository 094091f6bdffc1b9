//! `ModelConfig` from GGUF metadata (`{arch}.*` keys: llama, qwen2, qwen3, phi3, gemma3, qwen3moe,
//! deepseek2, gpt-oss) and the chat template. Missing required keys are errors naming the key and
//! the file.

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

/// The required size at metadata `key`: an error naming the key and the file when it is
/// missing or not a size. The one reader of required sizes for every architecture.
pub(super) fn size(g: &GgufFile, key: &str) -> Result<usize> {
    g.get_u64(key)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| Error::format(&g.path, format!("missing or invalid metadata {key}")))
}

fn id(g: &GgufFile, key: &str) -> Option<u32> {
    g.get_u64(key).and_then(|v| u32::try_from(v).ok())
}

impl ModelConfig {
    /// Builds the config from a GGUF file's metadata and tensor index.
    pub fn from_gguf(g: &GgufFile) -> Result<ModelConfig> {
        let arch = gguf_architecture(g)?;
        let k = |s: &str| format!("{arch}.{s}");
        let hidden = size(g, &k("embedding_length"))?;
        let heads = size(g, &k("attention.head_count"))?;
        if heads == 0 {
            return Err(Error::format(&g.path, "attention.head_count is 0"));
        }
        let kv_heads = g
            .get_u64(&k("attention.head_count_kv"))
            .map(|v| v as usize)
            .unwrap_or(heads);
        let head_dim = g
            .get_u64(&k("attention.key_length"))
            .map(|v| v as usize)
            .unwrap_or(hidden / heads);
        let vocab_size = vocab_size(g, &arch)?;
        let context_length = size(g, &k("context_length"))?;
        let rope_dim = g
            .get_u64(&k("rope.dimension_count"))
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        let rope_scaling = gguf_rope_scaling(g, &arch, context_length, rope_dim)?;
        let eos_ids = id(g, "tokenizer.ggml.eos_token_id").into_iter().collect();
        let num_layers = size(g, &k("block_count"))?;
        let moe = gguf_moe(g, &arch, num_layers)?;
        let intermediate_size = match &moe {
            Some(m) => g
                .get_u64(&k("feed_forward_length"))
                .map_or(m.expert_intermediate, |v| v as usize),
            None => size(g, &k("feed_forward_length"))?,
        };
        let mut c = ModelConfig {
            architecture: match (arch.as_str(), &moe) {
                ("llama", Some(_)) => "mixtral".into(),
                ("qwen3moe", _) => "qwen3_moe".into(),
                ("deepseek2", _) => "deepseek_v3".into(),
                ("gpt-oss", _) => "gpt_oss".into(),
                _ => arch.clone(),
            },
            vocab_size,
            hidden_size: hidden,
            intermediate_size,
            num_layers,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            context_length,
            norm_eps: g
                .get_f64(&k("attention.layer_norm_rms_epsilon"))
                .ok_or_else(|| {
                    Error::format(
                        &g.path,
                        format!("missing {}", k("attention.layer_norm_rms_epsilon")),
                    )
                })? as f32,
            rope_theta: g.get_f64(&k("rope.freq_base")).unwrap_or(10000.0) as f32,
            rope_dim,
            rope_style: RopeStyle::Neox,
            rope_scaling,
            rope_local_theta: 0.0,
            tie_embeddings: g.tensor("output.weight").is_none(),
            hidden_act: "silu".into(),
            attn_logit_softcap: 0.0,
            final_logit_softcap: 0.0,
            sliding_window: 0,
            sliding_layers: Vec::new(),
            query_pre_attn_scalar: 0.0,
            bos_id: id(g, "tokenizer.ggml.bos_token_id"),
            eos_ids,
            moe,
            mla: None,
        };
        match arch.as_str() {
            "gemma3" => gemma3(g, &mut c)?,
            "phi3" => phi3(g, &mut c),
            "deepseek2" => super::gguf_mla::deepseek2(g, &mut c)?,
            "gpt-oss" => gpt_oss(g, &mut c)?,
            _ => {}
        }
        Ok(c)
    }
}

/// The vocabulary size: `{arch}.vocab_size`, else the number of tokenizer tokens, else the
/// embedding's rows.
fn vocab_size(g: &GgufFile, arch: &str) -> Result<usize> {
    match g.get_u64(&format!("{arch}.vocab_size")) {
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
fn phi3(g: &GgufFile, c: &mut ModelConfig) {
    c.sliding_window = g
        .get_u64("phi3.attention.sliding_window")
        .map_or(0, |v| v as usize);
    if c.sliding_window > 0 {
        c.sliding_layers = vec![true; c.num_layers];
    }
}

/// Gemma-3's settings beyond the llama family's: GELU-tanh, scaled attention as llama.cpp sets
/// it (`head_dim^-0.5`, or `(hidden/heads)^-0.5` for the 62-layer 27B), sliding-window layers
/// (all but every `sliding_window_pattern`-th, 6 by default, or an explicit per-layer list)
/// with their own rotary base (`rope.freq_base_swa`, 10000 by default), final soft-capping.
fn gemma3(g: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    let k = |s: &str| format!("gemma3.{s}");
    c.hidden_act = "gelu_tanh".into();
    c.query_pre_attn_scalar = if c.num_layers == 62 {
        (c.hidden_size / c.num_heads) as f32
    } else {
        c.head_dim as f32
    };
    c.final_logit_softcap = g.get_f64(&k("final_logit_softcapping")).unwrap_or(0.0) as f32;
    c.sliding_window = g
        .get_u64(&k("attention.sliding_window"))
        .map_or(0, |v| v as usize);
    if c.sliding_window > 0 {
        let key = k("attention.sliding_window_pattern");
        c.sliding_layers = match g.get(&key) {
            Some(v) if v.as_array().is_some() => {
                let a = v.as_array().unwrap_or_default();
                if a.len() != c.num_layers {
                    return Err(Error::format(
                        &g.path,
                        format!("{key} has {} entries for {} layers", a.len(), c.num_layers),
                    ));
                }
                a.iter()
                    .map(|b| {
                        b.as_bool().ok_or_else(|| {
                            Error::format(&g.path, format!("{key} must hold booleans"))
                        })
                    })
                    .collect::<Result<Vec<bool>>>()?
            }
            Some(v) => {
                let n = v.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                    Error::format(&g.path, format!("{key} must be a positive integer"))
                })? as usize;
                (0..c.num_layers).map(|i| i % n < n - 1).collect()
            }
            None => (0..c.num_layers).map(|i| i % 6 < 5).collect(),
        };
        c.rope_local_theta = g.get_f64(&k("rope.freq_base_swa")).unwrap_or(10000.0) as f32;
    }
    Ok(())
}

/// GPT-OSS's settings beyond the llama family's: sliding-window layers alternating with full
/// ones from the first (llama.cpp's pattern of 2; `attention.sliding_window` is required), the
/// experts' clamped SwiGLU (alpha 1.702, limit 7, as llama.cpp fixes them), and YaRN with the
/// ramp's ends left fractional (HF `truncate: false`).
fn gpt_oss(g: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    let key = "gpt-oss.attention.sliding_window";
    c.sliding_window = g
        .get_u64(key)
        .and_then(|v| usize::try_from(v).ok())
        .filter(|&v| v > 0)
        .ok_or_else(|| Error::format(&g.path, format!("missing or invalid metadata {key}")))?;
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
fn gguf_moe(g: &GgufFile, arch: &str, layers: usize) -> Result<Option<MoeConfig>> {
    let k = |s: &str| format!("{arch}.{s}");
    let has_experts = g
        .tensors
        .iter()
        .any(|t| t.name.contains("_exps.") || t.name.contains("ffn_gate_inp."));
    if !matches!(arch, "qwen3moe" | "gpt-oss")
        && !has_experts
        && g.get_u64(&k("expert_count")).is_none_or(|n| n == 0)
    {
        return Ok(None);
    }
    let need = |key: &str| -> Result<usize> {
        g.get_u64(&k(key))
            .and_then(|v| usize::try_from(v).ok())
            .filter(|&v| v > 0)
            .ok_or_else(|| {
                Error::format(
                    &g.path,
                    format!(
                        "a mixture-of-experts model needs metadata {} (missing or 0)",
                        k(key)
                    ),
                )
            })
    };
    let experts = need("expert_count")?;
    let experts_per_token = need("expert_used_count")?;
    let expert_intermediate = match g.get_u64(&k("expert_feed_forward_length")) {
        Some(v) => v as usize,
        None => need("feed_forward_length")?,
    };
    let scoring = match g.get_u64(&k("expert_gating_func")) {
        None | Some(1) => MoeScoring::Softmax,
        Some(2) => MoeScoring::Sigmoid,
        Some(other) => {
            return Err(Error::Unsupported(format!(
                "{}: {} = {other} (1 = softmax and 2 = sigmoid are supported)",
                g.path,
                k("expert_gating_func")
            )))
        }
    };
    let groups = g
        .get_u64(&k("expert_group_count"))
        .map_or(1, |v| v.max(1) as usize);
    let dense = g.get_u64(&k("leading_dense_block_count")).unwrap_or(0) as usize;
    Ok(Some(MoeConfig {
        experts,
        experts_per_token,
        expert_intermediate,
        scoring,
        groups,
        topk_groups: g
            .get_u64(&k("expert_group_used_count"))
            .map_or(groups, |v| v.max(1) as usize),
        normalize: !matches!(
            g.get(&k("expert_weights_norm")),
            Some(crate::format::gguf::GgufValue::Bool(false))
        ),
        routed_scale: g
            .get_f64(&k("expert_weights_scale"))
            .map_or(1.0, |v| v as f32),
        shared_intermediate: 0,
        layers: (0..layers).map(|i| i >= dense).collect(),
        swiglu_clamp: None,
    }))
}
