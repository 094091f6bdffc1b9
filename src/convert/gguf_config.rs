//! `ModelConfig` from GGUF metadata (`{arch}.*` keys of the llama family: llama, qwen2, qwen3)
//! and the chat template. Missing required keys are errors naming the key and the file.

use crate::error::{Error, Result};
use crate::format::gguf::GgufFile;
use crate::model::{ModelConfig, RopeScaling, RopeStyle};

/// GGUF architectures the converter knows.
pub const GGUF_ARCHITECTURES: [&str; 3] = ["llama", "qwen2", "qwen3"];

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

fn size(g: &GgufFile, key: &str) -> Result<usize> {
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
        let vocab_size = match g.get_u64(&k("vocab_size")) {
            Some(v) => v as usize,
            None => g
                .get_array("tokenizer.ggml.tokens")
                .map(|a| a.len())
                .or_else(|| {
                    g.tensor("token_embd.weight")
                        .and_then(|t| t.dims.get(1).map(|&d| d as usize))
                })
                .ok_or_else(|| Error::format(&g.path, "cannot tell the vocabulary size"))?,
        };
        let rope_scaling = match g.get_str(&k("rope.scaling.type")) {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: g
                    .get_f64(&k("rope.scaling.factor"))
                    .ok_or_else(|| Error::format(&g.path, "linear rope scaling without a factor"))?
                    as f32,
            },
            Some(other) => {
                return Err(Error::Unsupported(format!(
                    "{}: rope scaling {other:?}",
                    g.path
                )))
            }
        };
        let eos_ids = id(g, "tokenizer.ggml.eos_token_id").into_iter().collect();
        Ok(ModelConfig {
            architecture: if arch == "llama" {
                "llama".into()
            } else {
                arch.clone()
            },
            vocab_size,
            hidden_size: hidden,
            intermediate_size: size(g, &k("feed_forward_length"))?,
            num_layers: size(g, &k("block_count"))?,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            context_length: size(g, &k("context_length"))?,
            norm_eps: g
                .get_f64(&k("attention.layer_norm_rms_epsilon"))
                .ok_or_else(|| {
                    Error::format(
                        &g.path,
                        format!("missing {}", k("attention.layer_norm_rms_epsilon")),
                    )
                })? as f32,
            rope_theta: g.get_f64(&k("rope.freq_base")).unwrap_or(10000.0) as f32,
            rope_dim: g
                .get_u64(&k("rope.dimension_count"))
                .map(|v| v as usize)
                .unwrap_or(head_dim),
            rope_style: RopeStyle::Neox,
            rope_scaling,
            tie_embeddings: g.tensor("output.weight").is_none(),
            hidden_act: "silu".into(),
            attn_logit_softcap: 0.0,
            final_logit_softcap: 0.0,
            sliding_window: 0,
            sliding_layers: Vec::new(),
            query_pre_attn_scalar: 0.0,
            bos_id: id(g, "tokenizer.ggml.bos_token_id"),
            eos_ids,
            moe: None,
        })
    }
}
