//! `ModelConfig` ⇄ `model.*` metadata keys (see `docs/flm-format.md` for the list). Owns the
//! key names and their types; validation beyond "present, right type, fits" is the model's job.

use super::meta::{MetaValue, Metadata};
use crate::error::{Error, Result};
use crate::model::{
    MlaConfig, ModelConfig, MoeConfig, MoeScoring, RopeScaling, RopeStyle, SwigluClamp,
};

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
        rope_scaling_to_metadata(&self.rope_scaling, &mut m);
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
        if let Some(mla) = &self.mla {
            mla_to_metadata(mla, &mut m)?;
        }
        Ok(m)
    }

    /// Rebuilds a config from `model.*` metadata; `path` names the file in errors.
    pub fn from_metadata(m: &Metadata, path: &str) -> Result<ModelConfig> {
        let r = Keys { m, path };
        let rope_style = match r.string("model.rope_style")?.as_str() {
            "neox" => RopeStyle::Neox,
            "interleaved" => RopeStyle::Interleaved,
            other => {
                return Err(Error::format(
                    path,
                    format!("unknown model.rope_style {other:?}"),
                ))
            }
        };
        let rope_local_theta = match m.get("model.rope_local_theta") {
            None => 0.0,
            Some(_) => r.float("model.rope_local_theta")?,
        };
        let bos_id = match m.get("model.bos_id") {
            None => None,
            Some(_) => Some(r.u32("model.bos_id")?),
        };
        Ok(ModelConfig {
            architecture: r.string("model.architecture")?,
            vocab_size: r.size("model.vocab_size")?,
            hidden_size: r.size("model.hidden_size")?,
            intermediate_size: r.size("model.intermediate_size")?,
            num_layers: r.size("model.num_layers")?,
            num_heads: r.size("model.num_heads")?,
            num_kv_heads: r.size("model.num_kv_heads")?,
            head_dim: r.size("model.head_dim")?,
            context_length: r.size("model.context_length")?,
            norm_eps: r.float("model.norm_eps")?,
            rope_theta: r.float("model.rope_theta")?,
            rope_dim: r.size("model.rope_dim")?,
            rope_style,
            rope_scaling: rope_scaling_from_metadata(&r)?,
            rope_local_theta,
            tie_embeddings: r.bool("model.tie_embeddings")?,
            hidden_act: r.string("model.hidden_act")?,
            attn_logit_softcap: r.float("model.attn_logit_softcap")?,
            final_logit_softcap: r.float("model.final_logit_softcap")?,
            sliding_window: r.size("model.sliding_window")?,
            sliding_layers: r.bools("model.sliding_layers")?,
            query_pre_attn_scalar: r.float("model.query_pre_attn_scalar")?,
            bos_id,
            eos_ids: r.u32s("model.eos_ids")?,
            moe: moe_from_metadata(&r)?,
            mla: mla_from_metadata(&r)?,
        })
    }
}

/// Typed reads of `model.*` keys; a missing key or one of another type is an error naming the
/// key and the file.
struct Keys<'a> {
    m: &'a Metadata,
    path: &'a str,
}

impl Keys<'_> {
    fn get(&self, k: &str) -> Result<&MetaValue> {
        self.m
            .get(k)
            .ok_or_else(|| Error::format(self.path, format!("metadata key {k} missing")))
    }

    fn bad(&self, k: &str) -> Error {
        Error::format(self.path, format!("metadata key {k} has the wrong type"))
    }

    fn size(&self, k: &str) -> Result<usize> {
        self.get(k)?
            .as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| self.bad(k))
    }

    fn u32(&self, k: &str) -> Result<u32> {
        self.get(k)?
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| self.bad(k))
    }

    fn float(&self, k: &str) -> Result<f32> {
        self.get(k)?
            .as_f64()
            .map(|v| v as f32)
            .ok_or_else(|| self.bad(k))
    }

    fn bool(&self, k: &str) -> Result<bool> {
        self.get(k)?.as_bool().ok_or_else(|| self.bad(k))
    }

    fn string(&self, k: &str) -> Result<String> {
        self.get(k)?
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| self.bad(k))
    }

    /// The elements of the array at `k`, each read by `one`.
    fn array<T>(&self, k: &str, one: impl Fn(&MetaValue) -> Option<T>) -> Result<Vec<T>> {
        self.get(k)?
            .as_array()
            .ok_or_else(|| self.bad(k))?
            .iter()
            .map(|v| one(v).ok_or_else(|| self.bad(k)))
            .collect()
    }

    fn u32s(&self, k: &str) -> Result<Vec<u32>> {
        self.array(k, |v| v.as_u64().and_then(|v| u32::try_from(v).ok()))
    }

    fn f32s(&self, k: &str) -> Result<Vec<f32>> {
        self.array(k, |v| v.as_f64().map(|v| v as f32))
    }

    fn bools(&self, k: &str) -> Result<Vec<bool>> {
        self.array(k, MetaValue::as_bool)
    }
}

/// The rope scaling from `model.rope_scaling.*`.
fn rope_scaling_from_metadata(r: &Keys) -> Result<RopeScaling> {
    let orig = || r.u32("model.rope_scaling.original_context_length");
    Ok(match r.string("model.rope_scaling.type")?.as_str() {
        "none" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: r.float("model.rope_scaling.factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: r.float("model.rope_scaling.factor")?,
            low_freq_factor: r.float("model.rope_scaling.low_freq_factor")?,
            high_freq_factor: r.float("model.rope_scaling.high_freq_factor")?,
            original_context_length: orig()?,
        },
        "yarn" => RopeScaling::Yarn {
            factor: r.float("model.rope_scaling.factor")?,
            original_context_length: orig()?,
            beta_fast: r.float("model.rope_scaling.beta_fast")?,
            beta_slow: r.float("model.rope_scaling.beta_slow")?,
            attention_factor: r.float("model.rope_scaling.attention_factor")?,
            truncate: r.bool("model.rope_scaling.truncate")?,
        },
        "longrope" => RopeScaling::LongRope {
            original_context_length: orig()?,
            attention_factor: r.float("model.rope_scaling.attention_factor")?,
            short_factor: r.f32s("model.rope_scaling.short_factor")?,
            long_factor: r.f32s("model.rope_scaling.long_factor")?,
        },
        "dynamic" => RopeScaling::Dynamic {
            factor: r.float("model.rope_scaling.factor")?,
            original_context_length: orig()?,
        },
        other => {
            return Err(Error::format(
                r.path,
                format!("unknown model.rope_scaling.type {other:?}"),
            ))
        }
    })
}

/// The `model.rope_scaling.*` entries of a rope scaling.
fn rope_scaling_to_metadata(scaling: &RopeScaling, m: &mut Metadata) {
    let mut put = |k: &str, v: MetaValue| {
        m.insert(format!("model.rope_scaling.{k}"), v);
    };
    let f = MetaValue::F32;
    let kind = match scaling {
        RopeScaling::None => "none",
        RopeScaling::Linear { factor } => {
            put("factor", f(*factor));
            "linear"
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context_length,
        } => {
            put("factor", f(*factor));
            put("low_freq_factor", f(*low_freq_factor));
            put("high_freq_factor", f(*high_freq_factor));
            put(
                "original_context_length",
                MetaValue::U32(*original_context_length),
            );
            "llama3"
        }
        RopeScaling::Yarn {
            factor,
            original_context_length,
            beta_fast,
            beta_slow,
            attention_factor,
            truncate,
        } => {
            put("factor", f(*factor));
            put("beta_fast", f(*beta_fast));
            put("beta_slow", f(*beta_slow));
            put("attention_factor", f(*attention_factor));
            put(
                "original_context_length",
                MetaValue::U32(*original_context_length),
            );
            put("truncate", MetaValue::Bool(*truncate));
            "yarn"
        }
        RopeScaling::LongRope {
            original_context_length,
            attention_factor,
            short_factor,
            long_factor,
        } => {
            let arr = |v: &[f32]| MetaValue::Array(v.iter().map(|&x| f(x)).collect());
            put(
                "original_context_length",
                MetaValue::U32(*original_context_length),
            );
            put("attention_factor", f(*attention_factor));
            put("short_factor", arr(short_factor));
            put("long_factor", arr(long_factor));
            "longrope"
        }
        RopeScaling::Dynamic {
            factor,
            original_context_length,
        } => {
            put("factor", f(*factor));
            put(
                "original_context_length",
                MetaValue::U32(*original_context_length),
            );
            "dynamic"
        }
    };
    put("type", MetaValue::Str(kind.to_string()));
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
fn moe_from_metadata(r: &Keys) -> Result<Option<MoeConfig>> {
    if r.m.get("model.moe.experts").is_none() {
        return Ok(None);
    }
    let scoring = match r.string("model.moe.scoring")?.as_str() {
        "softmax" => MoeScoring::Softmax,
        "sigmoid" => MoeScoring::Sigmoid,
        other => {
            return Err(Error::format(
                r.path,
                format!("unknown model.moe.scoring {other:?}"),
            ))
        }
    };
    // GPT-OSS's clamped SwiGLU: both keys or neither
    let (alpha, limit) = ("model.moe.swiglu_alpha", "model.moe.swiglu_limit");
    let swiglu_clamp = match (r.m.get(alpha), r.m.get(limit)) {
        (None, None) => None,
        _ => Some(SwigluClamp {
            alpha: r.float(alpha)?,
            limit: r.float(limit)?,
        }),
    };
    Ok(Some(MoeConfig {
        experts: r.size("model.moe.experts")?,
        experts_per_token: r.size("model.moe.experts_per_token")?,
        expert_intermediate: r.size("model.moe.expert_intermediate")?,
        scoring,
        groups: r.size("model.moe.groups")?,
        topk_groups: r.size("model.moe.topk_groups")?,
        normalize: r.bool("model.moe.normalize")?,
        routed_scale: r.float("model.moe.routed_scale")?,
        shared_intermediate: r.size("model.moe.shared_intermediate")?,
        layers: r.bools("model.moe.layers")?,
        swiglu_clamp,
    }))
}

/// The `model.mla.*` entries of a latent-attention config.
fn mla_to_metadata(mla: &MlaConfig, m: &mut Metadata) -> Result<()> {
    for (k, v) in [
        ("model.mla.q_lora_rank", mla.q_lora_rank),
        ("model.mla.kv_lora_rank", mla.kv_lora_rank),
        ("model.mla.nope_dim", mla.nope_dim),
        ("model.mla.v_head_dim", mla.v_head_dim),
    ] {
        m.insert(k.into(), u32_of(k, v)?);
    }
    m.insert(
        "model.mla.score_scale".into(),
        MetaValue::F32(mla.score_scale),
    );
    Ok(())
}

/// The latent-attention config from `model.mla.*` (`None` when `model.mla.kv_lora_rank` is
/// absent: q/k/v heads).
fn mla_from_metadata(r: &Keys) -> Result<Option<MlaConfig>> {
    if r.m.get("model.mla.kv_lora_rank").is_none() {
        return Ok(None);
    }
    Ok(Some(MlaConfig {
        q_lora_rank: r.size("model.mla.q_lora_rank")?,
        kv_lora_rank: r.size("model.mla.kv_lora_rank")?,
        nope_dim: r.size("model.mla.nope_dim")?,
        v_head_dim: r.size("model.mla.v_head_dim")?,
        score_scale: r.float("model.mla.score_scale")?,
    }))
}
