//! The rope scaling of a GGUF file, from llama.cpp's metadata keys: `{arch}.rope.scaling.type`
//! (`none`, `linear`, `yarn`, `longrope`), `.factor`, `.original_context_length`,
//! `.attn_factor`, YaRN's `.yarn_attn_factor` / `.yarn_beta_fast` / `.yarn_beta_slow` /
//! `.yarn_log_multiplier`, and LongRoPE's `rope_factors_short.weight` /
//! `rope_factors_long.weight` tensors. Unknown types (and `dynamic`, which llama.cpp's GGUF keys
//! cannot describe) and missing keys are errors naming them.

use super::ggml_dequant::dequantize;
use crate::error::{Error, Result};
use crate::format::gguf::GgufFile;
use crate::model::RopeScaling;

/// The GGUF tensors that carry LongRoPE's factors (read into the config, not stored).
pub const ROPE_FACTOR_TENSORS: [&str; 2] =
    ["rope_factors_short.weight", "rope_factors_long.weight"];

/// The rope scaling types a GGUF may name.
const TYPES: &str = "none, linear, yarn, longrope";

fn f32_tensor(g: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = g
        .tensor(name)
        .ok_or_else(|| Error::format(&g.path, format!("longrope rope scaling without {name}")))?;
    let n: u64 = t.dims.iter().product();
    if n as usize != len {
        return Err(Error::format(
            &g.path,
            format!("{name} has {n} values, expected {len} (rope dimension count / 2)"),
        ));
    }
    let mut out = vec![0f32; len];
    dequantize(t.ggml_type, &g.read_tensor_bytes(t)?, &mut out)
        .map_err(|e| Error::format(&g.path, format!("{name}: {e}")))?;
    Ok(out)
}

/// YaRN's default attention factor (`0.1·m·ln(s) + 1`, 1 for `s ≤ 1`).
fn mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

/// The `{arch}.rope.scaling.*` keys of one GGUF file.
struct ScalingKeys<'a> {
    g: &'a GgufFile,
    arch: &'a str,
    /// The model's context (the default original context).
    context_length: usize,
}

impl ScalingKeys<'_> {
    fn key(&self, s: &str) -> String {
        format!("{}.rope.scaling.{s}", self.arch)
    }

    fn float(&self, s: &str) -> Option<f64> {
        self.g.get_f64(&self.key(s))
    }

    /// `.factor`, which the scaling needs.
    fn factor(&self) -> Result<f64> {
        self.float("factor").ok_or_else(|| {
            Error::format(
                &self.g.path,
                format!("rope scaling needs {}", self.key("factor")),
            )
        })
    }

    /// `.original_context_length`, else the model's context.
    fn original_context(&self) -> Result<u32> {
        let key = self.key("original_context_length");
        let v = self.g.get_u64(&key).unwrap_or(self.context_length as u64);
        u32::try_from(v)
            .map_err(|_| Error::format(&self.g.path, format!("{key} = {v} is too large")))
    }

    /// `.type`; without one, llama.cpp applies a factor linearly.
    fn kind(&self) -> Result<&str> {
        match self.g.get(&self.key("type")) {
            None => Ok("linear"),
            Some(v) => v.as_str().ok_or_else(|| {
                Error::format(
                    &self.g.path,
                    format!("{} is not a string", self.key("type")),
                )
            }),
        }
    }
}

/// The rope scaling of GGUF `g` (architecture `arch`), whose context is `context_length` and
/// rotary dim `rope_dim`.
pub fn gguf_rope_scaling(
    g: &GgufFile,
    arch: &str,
    context_length: usize,
    rope_dim: usize,
) -> Result<RopeScaling> {
    let keys = ScalingKeys {
        g,
        arch,
        context_length,
    };
    Ok(match keys.kind()? {
        "none" => RopeScaling::None,
        // llama.cpp's default type, a no-op without a factor
        "linear" => match keys.float("factor") {
            None => RopeScaling::None,
            Some(f) if f == 0.0 || f == 1.0 => RopeScaling::None,
            Some(f) => RopeScaling::Linear { factor: f as f32 },
        },
        "yarn" => yarn(&keys)?,
        "longrope" => longrope(&keys, rope_dim)?,
        "dynamic" => {
            return Err(Error::Unsupported(format!(
                "{}: rope scaling type \"dynamic\" in {}: llama.cpp's GGUF keys define no dynamic NTK scaling (supported: {TYPES}); convert the Hugging Face checkpoint, whose config's rope_scaling carries it",
                g.path,
                keys.key("type")
            )))
        }
        other => {
            return Err(Error::Unsupported(format!(
                "{}: rope scaling type {other:?} in {} (supported: {TYPES})",
                g.path,
                keys.key("type")
            )))
        }
    })
}

/// YaRN: the factor, the original context, the betas and the attention factor (given, or
/// llama.cpp's from the log multiplier), times `.attn_factor`.
fn yarn(keys: &ScalingKeys) -> Result<RopeScaling> {
    let factor = keys.factor()?;
    let attention = match keys.float("yarn_attn_factor") {
        Some(a) => a,
        None => match keys.float("yarn_log_multiplier") {
            Some(m) if m != 0.0 => mscale(factor, 1.0) / mscale(factor, m),
            _ => mscale(factor, 1.0),
        },
    } * keys.float("attn_factor").unwrap_or(1.0);
    Ok(RopeScaling::Yarn {
        factor: factor as f32,
        original_context_length: keys.original_context()?,
        beta_fast: keys.float("yarn_beta_fast").unwrap_or(32.0) as f32,
        beta_slow: keys.float("yarn_beta_slow").unwrap_or(1.0) as f32,
        attention_factor: attention as f32,
        truncate: true,
    })
}

/// LongRoPE: the original context, the attention factor (given, or from the context ratio)
/// and the short and long factors from their tensors (`rope_dim / 2` values each).
fn longrope(keys: &ScalingKeys, rope_dim: usize) -> Result<RopeScaling> {
    let orig = keys.original_context()?;
    let scale = keys.context_length as f64 / orig.max(1) as f64;
    let attention = keys.float("attn_factor").unwrap_or(if scale <= 1.0 {
        1.0
    } else {
        (1.0 + scale.ln() / (orig as f64).ln()).sqrt()
    });
    Ok(RopeScaling::LongRope {
        original_context_length: orig,
        attention_factor: attention as f32,
        short_factor: f32_tensor(keys.g, ROPE_FACTOR_TENSORS[0], rope_dim / 2)?,
        long_factor: f32_tensor(keys.g, ROPE_FACTOR_TENSORS[1], rope_dim / 2)?,
    })
}
