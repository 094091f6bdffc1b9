//! `ModelConfig` ⇄ `model.*` metadata keys (see `docs/flm-format.md` for the list). Owns the
//! key names and their types; validation beyond "present, right type, fits" is the model's job.

use super::meta::{MetaValue, Metadata};
use crate::error::{Error, Result};
use crate::model::{ModelConfig, MoeConfig, MoeScoring, RopeScaling, RopeStyle, SwigluClamp};

fn u32_of(key: &str, v: usize) -> Result<MetaValue> {
    u32::try_from(v)
        .map(MetaValue::U32)
        .map_err(|_| Error::invalid(format!("model config {key} = {v} does not fit in u32")))
}

impl ModelConfig {
    /// The `model.*` metadata entries describing this config.
    pub fn to_metadata(&self) -> Result<Metadata> {
        let mut m = Metadata::new();
        let s = |v: &str| MetaValue::Str(v.to_string());
        m.insert("model.architecture".into(), s(&self.architecture));
        for (k, v) in [
            ("model.vocab_size", self.vocab_size),
            ("model.hidden_size", self.hidden_size),
            ("model.intermediate_size", self.intermediate_size),
            ("model.num_layers", self.num_layers),
            ("model.num_heads", self.num_heads),
            ("model.num_kv_heads", self.num_kv_heads),
            ("model.head_dim", self.head_dim),
            ("model.context_length", self.context_length),
            ("model.rope_dim", self.rope_dim),
            ("model.sliding_window", self.sliding_window),
        ] {
            m.insert(k.into(), u32_of(k, v)?);
        }
        for (k, v) in [
            ("model.norm_eps", self.norm_eps),
            ("model.rope_theta", self.rope_theta),
            ("model.attn_logit_softcap", self.attn_logit_softcap),
            ("model.final_logit_softcap", self.final_logit_softcap),
            ("model.query_pre_attn_scalar", self.query_pre_attn_scalar),
        ] {
            m.insert(k.into(), MetaValue::F32(v));
        }
        let style = match self.rope_style {
            RopeStyle::Neox => "neox",
            RopeStyle::Interleaved => "interleaved",
        };
        m.insert("model.rope_style".into(), s(style));
        match &self.rope_scaling {
            RopeScaling::None => {
                m.insert("model.rope_scaling.type".into(), s("none"));
            }
            RopeScaling::Linear { factor } => {
                m.insert("model.rope_scaling.type".into(), s("linear"));
                m.insert("model.rope_scaling.factor".into(), MetaValue::F32(*factor));
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context_length,
            } => {
                m.insert("model.rope_scaling.type".into(), s("llama3"));
                m.insert("model.rope_scaling.factor".into(), MetaValue::F32(*factor));
                m.insert(
                    "model.rope_scaling.low_freq_factor".into(),
                    MetaValue::F32(*low_freq_factor),
                );
                m.insert(
                    "model.rope_scaling.high_freq_factor".into(),
                    MetaValue::F32(*high_freq_factor),
                );
                m.insert(
                    "model.rope_scaling.original_context_length".into(),
                    MetaValue::U32(*original_context_length),
                );
            }
            RopeScaling::Yarn {
                factor,
                original_context_length,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            } => {
                m.insert("model.rope_scaling.type".into(), s("yarn"));
                for (k, v) in [
                    ("factor", *factor),
                    ("beta_fast", *beta_fast),
                    ("beta_slow", *beta_slow),
                    ("attention_factor", *attention_factor),
                ] {
                    m.insert(format!("model.rope_scaling.{k}"), MetaValue::F32(v));
                }
                m.insert(
                    "model.rope_scaling.original_context_length".into(),
                    MetaValue::U32(*original_context_length),
                );
                m.insert(
                    "model.rope_scaling.truncate".into(),
                    MetaValue::Bool(*truncate),
                );
            }
            RopeScaling::LongRope {
                original_context_length,
                attention_factor,
                short_factor,
                long_factor,
            } => {
                m.insert("model.rope_scaling.type".into(), s("longrope"));
                m.insert(
                    "model.rope_scaling.original_context_length".into(),
                    MetaValue::U32(*original_context_length),
                );
                m.insert(
                    "model.rope_scaling.attention_factor".into(),
                    MetaValue::F32(*attention_factor),
                );
                let arr =
                    |v: &[f32]| MetaValue::Array(v.iter().map(|&x| MetaValue::F32(x)).collect());
                m.insert("model.rope_scaling.short_factor".into(), arr(short_factor));
                m.insert("model.rope_scaling.long_factor".into(), arr(long_factor));
            }
            RopeScaling::Dynamic {
                factor,
                original_context_length,
            } => {
                m.insert("model.rope_scaling.type".into(), s("dynamic"));
                m.insert("model.rope_scaling.factor".into(), MetaValue::F32(*factor));
                m.insert(
                    "model.rope_scaling.original_context_length".into(),
                    MetaValue::U32(*original_context_length),
                );
            }
        }
        if self.rope_local_theta > 0.0 {
            m.insert(
                "model.rope_local_theta".into(),
                MetaValue::F32(self.rope_local_theta),
            );
        }
        m.insert(
            "model.tie_embeddings".into(),
            MetaValue::Bool(self.tie_embeddings),
        );
        m.insert("model.hidden_act".into(), s(&self.hidden_act));
        m.insert(
            "model.sliding_layers".into(),
            MetaValue::Array(
                self.sliding_layers
                    .iter()
                    .map(|&b| MetaValue::Bool(b))
                    .collect(),
            ),
        );
        if let Some(b) = self.bos_id {
            m.insert("model.bos_id".into(), MetaValue::U32(b));
        }
        m.insert(
            "model.eos_ids".into(),
            MetaValue::Array(self.eos_ids.iter().map(|&e| MetaValue::U32(e)).collect()),
        );
        if let Some(moe) = &self.moe {
            moe_to_metadata(moe, &mut m)?;
        }
        Ok(m)
    }

    /// Rebuilds a config from `model.*` metadata; `path` names the file in errors.
    pub fn from_metadata(m: &Metadata, path: &str) -> Result<ModelConfig> {
        let get = |k: &str| {
            m.get(k)
                .ok_or_else(|| Error::format(path, format!("metadata key {k} missing")))
        };
        let bad = |k: &str| Error::format(path, format!("metadata key {k} has the wrong type"));
        let size = |k: &str| -> Result<usize> {
            get(k)?
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| bad(k))
        };
        let float =
            |k: &str| -> Result<f32> { get(k)?.as_f64().map(|v| v as f32).ok_or_else(|| bad(k)) };
        let string = |k: &str| -> Result<String> {
            get(k)?.as_str().map(str::to_string).ok_or_else(|| bad(k))
        };
        let u32s = |k: &str| -> Result<Vec<u32>> {
            get(k)?
                .as_array()
                .ok_or_else(|| bad(k))?
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|v| u32::try_from(v).ok())
                        .ok_or_else(|| bad(k))
                })
                .collect()
        };
        let orig = || -> Result<u32> {
            u32::try_from(size("model.rope_scaling.original_context_length")?)
                .map_err(|_| bad("model.rope_scaling.original_context_length"))
        };
        let f32s = |k: &str| -> Result<Vec<f32>> {
            get(k)?
                .as_array()
                .ok_or_else(|| bad(k))?
                .iter()
                .map(|v| v.as_f64().map(|v| v as f32).ok_or_else(|| bad(k)))
                .collect()
        };
        let rope_style = match string("model.rope_style")?.as_str() {
            "neox" => RopeStyle::Neox,
            "interleaved" => RopeStyle::Interleaved,
            other => {
                return Err(Error::format(
                    path,
                    format!("unknown model.rope_style {other:?}"),
                ))
            }
        };
        let rope_scaling = match string("model.rope_scaling.type")?.as_str() {
            "none" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: float("model.rope_scaling.factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: float("model.rope_scaling.factor")?,
                low_freq_factor: float("model.rope_scaling.low_freq_factor")?,
                high_freq_factor: float("model.rope_scaling.high_freq_factor")?,
                original_context_length: orig()?,
            },
            "yarn" => RopeScaling::Yarn {
                factor: float("model.rope_scaling.factor")?,
                original_context_length: orig()?,
                beta_fast: float("model.rope_scaling.beta_fast")?,
                beta_slow: float("model.rope_scaling.beta_slow")?,
                attention_factor: float("model.rope_scaling.attention_factor")?,
                truncate: get("model.rope_scaling.truncate")?
                    .as_bool()
                    .ok_or_else(|| bad("model.rope_scaling.truncate"))?,
            },
            "longrope" => RopeScaling::LongRope {
                original_context_length: orig()?,
                attention_factor: float("model.rope_scaling.attention_factor")?,
                short_factor: f32s("model.rope_scaling.short_factor")?,
                long_factor: f32s("model.rope_scaling.long_factor")?,
            },
            "dynamic" => RopeScaling::Dynamic {
                factor: float("model.rope_scaling.factor")?,
                original_context_length: orig()?,
            },
            other => {
                return Err(Error::format(
                    path,
                    format!("unknown model.rope_scaling.type {other:?}"),
                ))
            }
        };
        let rope_local_theta = match m.get("model.rope_local_theta") {
            None => 0.0,
            Some(v) => v
                .as_f64()
                .map(|v| v as f32)
                .ok_or_else(|| bad("model.rope_local_theta"))?,
        };
        let sliding_layers = get("model.sliding_layers")?
            .as_array()
            .ok_or_else(|| bad("model.sliding_layers"))?
            .iter()
            .map(|v| v.as_bool().ok_or_else(|| bad("model.sliding_layers")))
            .collect::<Result<Vec<_>>>()?;
        let bos_id = match m.get("model.bos_id") {
            None => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|v| u32::try_from(v).ok())
                    .ok_or_else(|| bad("model.bos_id"))?,
            ),
        };
        Ok(ModelConfig {
            architecture: string("model.architecture")?,
            vocab_size: size("model.vocab_size")?,
            hidden_size: size("model.hidden_size")?,
            intermediate_size: size("model.intermediate_size")?,
            num_layers: size("model.num_layers")?,
            num_heads: size("model.num_heads")?,
            num_kv_heads: size("model.num_kv_heads")?,
            head_dim: size("model.head_dim")?,
            context_length: size("model.context_length")?,
            norm_eps: float("model.norm_eps")?,
            rope_theta: float("model.rope_theta")?,
            rope_dim: size("model.rope_dim")?,
            rope_style,
            rope_scaling,
            rope_local_theta,
            tie_embeddings: get("model.tie_embeddings")?
                .as_bool()
                .ok_or_else(|| bad("model.tie_embeddings"))?,
            hidden_act: string("model.hidden_act")?,
            attn_logit_softcap: float("model.attn_logit_softcap")?,
            final_logit_softcap: float("model.final_logit_softcap")?,
            sliding_window: size("model.sliding_window")?,
            sliding_layers,
            query_pre_attn_scalar: float("model.query_pre_attn_scalar")?,
            bos_id,
            eos_ids: u32s("model.eos_ids")?,
            moe: moe_from_metadata(m, path)?,
        })
    }
}

/// The `model.moe.*` entries of a mixture-of-experts config.
fn moe_to_metadata(moe: &MoeConfig, m: &mut Metadata) -> Result<()> {
    for (k, v) in [
        ("model.moe.experts", moe.experts),
        ("model.moe.experts_per_token", moe.experts_per_token),
        ("model.moe.expert_intermediate", moe.expert_intermediate),
        ("model.moe.groups", moe.groups),
        ("model.moe.topk_groups", moe.topk_groups),
        ("model.moe.shared_intermediate", moe.shared_intermediate),
    ] {
        m.insert(k.into(), u32_of(k, v)?);
    }
    let scoring = match moe.scoring {
        MoeScoring::Softmax => "softmax",
        MoeScoring::Sigmoid => "sigmoid",
    };
    m.insert("model.moe.scoring".into(), MetaValue::Str(scoring.into()));
    m.insert("model.moe.normalize".into(), MetaValue::Bool(moe.normalize));
    m.insert(
        "model.moe.routed_scale".into(),
        MetaValue::F32(moe.routed_scale),
    );
    m.insert(
        "model.moe.layers".into(),
        MetaValue::Array(moe.layers.iter().map(|&b| MetaValue::Bool(b)).collect()),
    );
    if let Some(c) = moe.swiglu_clamp {
        m.insert("model.moe.swiglu_alpha".into(), MetaValue::F32(c.alpha));
        m.insert("model.moe.swiglu_limit".into(), MetaValue::F32(c.limit));
    }
    Ok(())
}

/// The mixture-of-experts config from `model.moe.*` (`None` when `model.moe.experts` is absent:
/// a dense model).
fn moe_from_metadata(m: &Metadata, path: &str) -> Result<Option<MoeConfig>> {
    if m.get("model.moe.experts").is_none() {
        return Ok(None);
    }
    let bad = |k: &str| {
        Error::format(
            path,
            format!("metadata key {k} missing or of the wrong type"),
        )
    };
    let size = |k: &str| -> Result<usize> {
        m.get(k)
            .and_then(|v| v.as_u64())
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| bad(k))
    };
    let scoring = match m.get("model.moe.scoring").and_then(|v| v.as_str()) {
        Some("softmax") => MoeScoring::Softmax,
        Some("sigmoid") => MoeScoring::Sigmoid,
        Some(other) => {
            return Err(Error::format(
                path,
                format!("unknown model.moe.scoring {other:?}"),
            ))
        }
        None => return Err(bad("model.moe.scoring")),
    };
    let layers = m
        .get("model.moe.layers")
        .and_then(|v| v.as_array())
        .ok_or_else(|| bad("model.moe.layers"))?
        .iter()
        .map(|v| v.as_bool().ok_or_else(|| bad("model.moe.layers")))
        .collect::<Result<Vec<_>>>()?;
    let float = |k: &str| {
        m.get(k)
            .map(|v| v.as_f64().map(|v| v as f32).ok_or_else(|| bad(k)))
    };
    let swiglu_clamp = match (
        float("model.moe.swiglu_alpha").transpose()?,
        float("model.moe.swiglu_limit").transpose()?,
    ) {
        (None, None) => None,
        (Some(alpha), Some(limit)) => Some(SwigluClamp { alpha, limit }),
        (None, Some(_)) => return Err(bad("model.moe.swiglu_alpha")),
        (Some(_), None) => return Err(bad("model.moe.swiglu_limit")),
    };
    Ok(Some(MoeConfig {
        experts: size("model.moe.experts")?,
        experts_per_token: size("model.moe.experts_per_token")?,
        expert_intermediate: size("model.moe.expert_intermediate")?,
        scoring,
        groups: size("model.moe.groups")?,
        topk_groups: size("model.moe.topk_groups")?,
        normalize: m
            .get("model.moe.normalize")
            .and_then(|v| v.as_bool())
            .ok_or_else(|| bad("model.moe.normalize"))?,
        routed_scale: m
            .get("model.moe.routed_scale")
            .and_then(|v| v.as_f64())
            .ok_or_else(|| bad("model.moe.routed_scale"))? as f32,
        shared_intermediate: size("model.moe.shared_intermediate")?,
        layers,
        swiglu_clamp,
    }))
}
