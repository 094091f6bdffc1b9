//! `ModelConfig` from a Hugging Face `config.json` (+ `generation_config.json`), per
//! architecture, and the `generation.*` metadata. Reads both the transformers ≥ 5
//! `rope_parameters` object and the older `rope_theta` / `rope_scaling` keys. Unknown
//! architectures and rope types are refused by name.

use super::hf_rope::{hf_rope, HfRope};
use crate::error::{Error, Result};
use crate::format::flm::{MetaValue, Metadata};
use crate::model::{ModelConfig, MoeConfig, MoeScoring, RopeScaling, RopeStyle, SwigluClamp};
use serde_json::Value;

/// Architectures the converter knows (HF `model_type`).
pub const HF_ARCHITECTURES: [&str; 14] = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "bloom",
    "gpt2",
    "phi3",
    "gemma2",
    "gemma3_text",
    "glm",
    "mixtral",
    "qwen3_moe",
    "deepseek_v3",
    "gpt_oss",
];

struct Json<'a> {
    v: &'a Value,
    path: &'a str,
}

impl Json<'_> {
    fn get(&self, keys: &[&str]) -> Option<&Value> {
        keys.iter()
            .filter_map(|k| self.v.get(*k))
            .find(|v| !v.is_null())
    }
    fn size(&self, keys: &[&str]) -> Result<Option<usize>> {
        match self.get(keys) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .map(Some)
                .ok_or_else(|| {
                    Error::format(
                        self.path,
                        format!("{} must be a non-negative integer", keys[0]),
                    )
                }),
        }
    }
    fn need_size(&self, keys: &[&str]) -> Result<usize> {
        self.size(keys)?
            .ok_or_else(|| Error::format(self.path, format!("missing {}", keys.join(" or "))))
    }
    fn float(&self, keys: &[&str]) -> Result<Option<f32>> {
        match self.get(keys) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| Error::format(self.path, format!("{} must be a number", keys[0]))),
        }
    }
}

/// Token ids from an int, a list of ints, or null.
fn ids(v: Option<&Value>, path: &str, what: &str) -> Result<Vec<u32>> {
    let one = |x: &Value| {
        x.as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| {
                Error::format(path, format!("{what} must be a token id or a list of them"))
            })
    };
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(one).collect(),
        Some(x) => Ok(vec![one(x)?]),
    }
}

fn activation(arch: &str, name: Option<&str>, path: &str) -> Result<String> {
    let name = name.unwrap_or(match arch {
        "gpt2" => "gelu_new",
        "bloom" => "bloom_gelu",
        "gemma2" | "gemma3" => "gelu_pytorch_tanh",
        _ => "silu",
    });
    Ok(match name {
        "silu" | "swish" => "silu",
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" | "gelu_tanh" | "bloom_gelu" => "gelu_tanh",
        "gelu" => "gelu",
        other => return Err(Error::Unsupported(format!("{path}: activation {other:?}"))),
    }
    .to_string())
}

/// The architecture of a parsed `config.json` (`model_type`), refused when unknown.
pub fn hf_architecture(v: &Value, path: &str) -> Result<String> {
    let arch = v
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::format(path, "config.json has no model_type"))?;
    if !HF_ARCHITECTURES.contains(&arch) {
        return Err(Error::Unsupported(format!(
            "{path}: architecture {arch:?} (supported: {})",
            HF_ARCHITECTURES.join(", ")
        )));
    }
    // Gemma-3's text model (`gemma3_text`) is the `gemma3` architecture
    Ok(match arch {
        "gemma3_text" => "gemma3",
        a => a,
    }
    .to_string())
}

impl ModelConfig {
    /// Builds the config from `config.json` text and optional `generation_config.json` text;
    /// `path` names the file in errors.
    pub fn from_hf_json(config: &str, generation: Option<&str>, path: &str) -> Result<ModelConfig> {
        let v: Value = serde_json::from_str(config)
            .map_err(|e| Error::format(path, format!("invalid JSON: {e}")))?;
        let arch = hf_architecture(&v, path)?;
        let j = Json { v: &v, path };
        let (hidden, heads, head_dim, kv_heads) = attention_sizes(&j)?;
        let num_layers = j.need_size(&["num_hidden_layers", "n_layer"])?;
        let (intermediate, context_length) = mlp_and_context(&j, &arch, hidden)?;
        refuse_unsupported(&v, &arch, path)?;
        let rope = hf_rope(&v, path, context_length)?;
        let (rope_dim, context_length) = rope_extent(&arch, head_dim, &rope, context_length);
        let tie_default = matches!(arch.as_str(), "gpt2" | "bloom" | "gemma2" | "gemma3");
        let tie_embeddings = v
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(tie_default);
        let act_name = ["hidden_activation", "hidden_act", "activation_function"]
            .iter()
            .find_map(|k| v.get(*k).and_then(Value::as_str));
        let hidden_act = activation(&arch, act_name, path)?;
        let sliding_window = match v.get("use_sliding_window").and_then(Value::as_bool) {
            Some(false) => 0,
            _ => j.size(&["sliding_window"])?.unwrap_or(0),
        };
        let sliding_layers = sliding_layers(&j, &arch, num_layers, sliding_window)?;
        let (bos_id, eos_ids) = bos_eos(&v, generation, path)?;
        let vocab_size = j.need_size(&["vocab_size", "padded_vocab_size"])?;
        let mut config = ModelConfig {
            architecture: arch.clone(),
            vocab_size,
            hidden_size: hidden,
            intermediate_size: intermediate,
            num_layers,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            context_length,
            norm_eps: j
                .float(&["rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"])?
                .unwrap_or(1e-5),
            rope_theta: rope.theta,
            rope_dim,
            rope_style: if arch == "glm" {
                RopeStyle::Interleaved
            } else {
                RopeStyle::Neox
            },
            rope_scaling: rope.scaling,
            rope_local_theta: rope.local_theta,
            tie_embeddings,
            hidden_act,
            attn_logit_softcap: j.float(&["attn_logit_softcapping"])?.unwrap_or(0.0),
            final_logit_softcap: j.float(&["final_logit_softcapping"])?.unwrap_or(0.0),
            sliding_window,
            sliding_layers,
            query_pre_attn_scalar: j.float(&["query_pre_attn_scalar"])?.unwrap_or(0.0),
            bos_id,
            eos_ids,
            moe: moe_config(&j, &arch, num_layers, intermediate)?,
            mla: None,
        };
        if arch == "deepseek_v3" {
            super::hf_mla::latent_attention(&v, path, &mut config)?;
        }
        Ok(config)
    }
}

/// Refuses, by name, the checkpoints of a known architecture that do not run: bidirectional
/// (embedding) models and GPT-OSS checkpoints quantized other than with MXFP4 experts.
fn refuse_unsupported(v: &Value, arch: &str, path: &str) -> Result<()> {
    if v.get("use_bidirectional_attention")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return Err(Error::Unsupported(format!(
            "{path}: use_bidirectional_attention (an embedding model; only causal decoders run)"
        )));
    }
    if let Some(m) = v
        .pointer("/quantization_config/quant_method")
        .and_then(Value::as_str)
        .filter(|m| arch == "gpt_oss" && *m != "mxfp4")
    {
        return Err(Error::Unsupported(format!(
            "{path}: a GPT-OSS checkpoint quantized as {m:?} (only the MXFP4 expert blocks, \
             quant_method \"mxfp4\", and unquantized checkpoints are read)"
        )));
    }
    Ok(())
}

/// `(rotary dims per head, context length)`: no rotary dims for GPT-2 and Bloom (learned or
/// ALiBi positions); dynamic NTK stretches the base past max_position_embeddings, up to
/// `factor` times it.
fn rope_extent(
    arch: &str,
    head_dim: usize,
    rope: &HfRope,
    context_length: usize,
) -> (usize, usize) {
    let rope_dim = if matches!(arch, "gpt2" | "bloom") {
        0
    } else {
        (head_dim as f64 * rope.partial).round() as usize
    };
    let context_length = match rope.scaling {
        RopeScaling::Dynamic { factor, .. } if factor > 1.0 => {
            (context_length as f64 * factor as f64) as usize
        }
        _ => context_length,
    };
    (rope_dim, context_length)
}

/// `(hidden size, heads, head size, KV heads)`; the head size defaults to hidden / heads, which
/// must then divide.
fn attention_sizes(j: &Json) -> Result<(usize, usize, usize, usize)> {
    let hidden = j.need_size(&["hidden_size", "n_embd", "n_embed"])?;
    let heads = j.need_size(&["num_attention_heads", "n_head"])?;
    if heads == 0 || !hidden.is_multiple_of(heads) && j.size(&["head_dim"])?.is_none() {
        return Err(Error::format(
            j.path,
            format!("{heads} heads do not divide hidden size {hidden}"),
        ));
    }
    let head_dim = j.size(&["head_dim"])?.unwrap_or(hidden / heads);
    let kv_heads = j
        .size(&["num_key_value_heads", "multi_query_group_num"])?
        .unwrap_or(heads);
    Ok((hidden, heads, head_dim, kv_heads))
}

/// `(MLP intermediate size, context length)`: GPT-2 and Bloom default the MLP to 4 × hidden;
/// Bloom (ALiBi, no position limit in its config) to the 2048 it was trained at.
fn mlp_and_context(j: &Json, arch: &str, hidden: usize) -> Result<(usize, usize)> {
    let intermediate = match arch {
        "gpt2" | "bloom" => j.size(&["n_inner"])?.unwrap_or(4 * hidden),
        _ => j.need_size(&["intermediate_size"])?,
    };
    let context_length = match arch {
        "bloom" => j.size(&["seq_length"])?.unwrap_or(2048),
        _ => j.need_size(&["max_position_embeddings", "n_positions", "n_ctx"])?,
    };
    Ok((intermediate, context_length))
}

/// Which layers use the sliding window (empty without one): as `layer_types` lists them, else
/// every other layer (Gemma-2), all but every `sliding_window_pattern`-th (Gemma-3, 6 by
/// default), or all of them.
fn sliding_layers(
    j: &Json,
    arch: &str,
    num_layers: usize,
    sliding_window: usize,
) -> Result<Vec<bool>> {
    Ok(match j.v.get("layer_types").and_then(Value::as_array) {
        Some(types) if sliding_window > 0 => {
            if types.len() != num_layers {
                return Err(Error::format(
                    j.path,
                    format!(
                        "layer_types has {} entries for {num_layers} layers",
                        types.len()
                    ),
                ));
            }
            types
                .iter()
                .map(|t| t.as_str() == Some("sliding_attention"))
                .collect()
        }
        _ if sliding_window > 0 && arch == "gemma2" => {
            (0..num_layers).map(|i| i % 2 == 0).collect()
        }
        _ if sliding_window > 0 && arch == "gemma3" => {
            // every `sliding_window_pattern`-th layer is global (6 by default)
            let n = j.size(&["sliding_window_pattern", "_sliding_window_pattern"])?;
            let n = n.unwrap_or(6).max(1);
            (0..num_layers).map(|i| (i + 1) % n != 0).collect()
        }
        _ if sliding_window > 0 => vec![true; num_layers],
        _ => Vec::new(),
    })
}

/// The BOS id and the EOS ids of `config.json`, with `generation_config.json`'s EOS ids added
/// and its BOS id used where the config has none.
fn bos_eos(v: &Value, generation: Option<&str>, path: &str) -> Result<(Option<u32>, Vec<u32>)> {
    let mut eos_ids = ids(v.get("eos_token_id"), path, "eos_token_id")?;
    let mut bos_id = ids(v.get("bos_token_id"), path, "bos_token_id")?
        .first()
        .copied();
    if let Some(g) = generation {
        let g: Value = serde_json::from_str(g).map_err(|e| {
            Error::format(path, format!("generation_config.json: invalid JSON: {e}"))
        })?;
        for e in ids(
            g.get("eos_token_id"),
            path,
            "generation_config eos_token_id",
        )? {
            if !eos_ids.contains(&e) {
                eos_ids.push(e);
            }
        }
        if bos_id.is_none() {
            bos_id = ids(g.get("bos_token_id"), path, "bos_token_id")?
                .first()
                .copied();
        }
    }
    Ok((bos_id, eos_ids))
}

/// The mixture-of-experts part of an HF config (`None` for a dense architecture).
fn moe_config(
    j: &Json,
    arch: &str,
    layers: usize,
    intermediate: usize,
) -> Result<Option<MoeConfig>> {
    let experts = || j.need_size(&["num_local_experts", "num_experts", "n_routed_experts"]);
    let bool_key = |k: &str, default: bool| j.v.get(k).and_then(Value::as_bool).unwrap_or(default);
    let base = |experts: usize, inner: usize| -> Result<MoeConfig> {
        Ok(MoeConfig {
            experts,
            experts_per_token: j.need_size(&["num_experts_per_tok"])?,
            expert_intermediate: inner,
            scoring: MoeScoring::Softmax,
            groups: 1,
            topk_groups: 1,
            normalize: true,
            routed_scale: 1.0,
            shared_intermediate: 0,
            layers: vec![true; layers],
            swiglu_clamp: None,
        })
    };
    Ok(Some(match arch {
        "mixtral" => base(experts()?, intermediate)?,
        // softmax over the chosen logits = the renormalised softmax over all of them
        "gpt_oss" => MoeConfig {
            swiglu_clamp: Some(SwigluClamp {
                alpha: j.float(&["swiglu_alpha"])?.unwrap_or(1.702),
                limit: j.float(&["swiglu_limit"])?.unwrap_or(7.0),
            }),
            ..base(experts()?, intermediate)?
        },
        "qwen3_moe" => {
            let step = j.size(&["decoder_sparse_step"])?.unwrap_or(1).max(1);
            let dense: Vec<u64> = j
                .get(&["mlp_only_layers"])
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            MoeConfig {
                normalize: bool_key("norm_topk_prob", false),
                layers: (0..layers)
                    .map(|i| !dense.contains(&(i as u64)) && (i + 1) % step == 0)
                    .collect(),
                ..base(experts()?, j.need_size(&["moe_intermediate_size"])?)?
            }
        }
        "deepseek_v3" => super::hf_mla::deepseek_moe(j.v, j.path, layers)?,
        _ => return Ok(None),
    }))
}

fn scalar(v: &Value) -> Option<MetaValue> {
    Some(match v {
        Value::Bool(b) => MetaValue::Bool(*b),
        Value::String(s) => MetaValue::Str(s.clone()),
        Value::Number(n) => match n.as_i64() {
            Some(i) => MetaValue::I64(i),
            None => MetaValue::F64(n.as_f64()?),
        },
        _ => return None,
    })
}

/// `generation.*` entries from `generation_config.json` text: numbers, bools, strings and
/// homogeneous arrays of those; nulls, objects and bookkeeping keys are skipped.
pub fn generation_metadata(text: &str, path: &str) -> Result<Metadata> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| Error::format(path, format!("invalid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| Error::format(path, "not a JSON object"))?;
    let mut m = Metadata::new();
    for (k, v) in obj {
        if k.starts_with('_') || k == "transformers_version" {
            continue;
        }
        let value = match v {
            Value::Array(a) => {
                let items: Option<Vec<MetaValue>> = a.iter().map(scalar).collect();
                match items {
                    Some(items)
                        if items.windows(2).all(|w| {
                            std::mem::discriminant(&w[0]) == std::mem::discriminant(&w[1])
                        }) =>
                    {
                        MetaValue::Array(items)
                    }
                    _ => continue,
                }
            }
            other => match scalar(other) {
                Some(s) => s,
                None => continue,
            },
        };
        m.insert(format!("generation.{k}"), value);
    }
    Ok(m)
}
