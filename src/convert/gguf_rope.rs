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

/// The rope scaling of GGUF `g` (architecture `arch`), whose context is `context_length` and
/// rotary dim `rope_dim`.
pub fn gguf_rope_scaling(
    g: &GgufFile,
    arch: &str,
    context_length: usize,
    rope_dim: usize,
) -> Result<RopeScaling> {
    let k = |s: &str| format!("{arch}.rope.scaling.{s}");
    let float = |s: &str| g.get_f64(&k(s));
    let factor = || {
        float("factor")
            .ok_or_else(|| Error::format(&g.path, format!("rope scaling needs {}", k("factor"))))
    };
    let orig = || -> Result<u32> {
        let v = g
            .get_u64(&k("original_context_length"))
            .unwrap_or(context_length as u64);
        u32::try_from(v).map_err(|_| {
            Error::format(
                &g.path,
                format!("{} = {v} is too large", k("original_context_length")),
            )
        })
    };
    // without a type, llama.cpp applies a factor linearly
    let kind = match g.get(&k("type")) {
        None => "linear",
        Some(v) => v
            .as_str()
            .ok_or_else(|| Error::format(&g.path, format!("{} is not a string", k("type"))))?,
    };
    Ok(match kind {
        "none" => RopeScaling::None,
        // llama.cpp's default type, a no-op without a factor
        "linear" => match float("factor") {
            None => RopeScaling::None,
            Some(f) if f == 0.0 || f == 1.0 => RopeScaling::None,
            Some(f) => RopeScaling::Linear { factor: f as f32 },
        },
        "yarn" => {
            let factor = factor()?;
            let attention = match float("yarn_attn_factor") {
                Some(a) => a,
                None => match float("yarn_log_multiplier") {
                    Some(m) if m != 0.0 => mscale(factor, 1.0) / mscale(factor, m),
                    _ => mscale(factor, 1.0),
                },
            } * float("attn_factor").unwrap_or(1.0);
            RopeScaling::Yarn {
                factor: factor as f32,
                original_context_length: orig()?,
                beta_fast: float("yarn_beta_fast").unwrap_or(32.0) as f32,
                beta_slow: float("yarn_beta_slow").unwrap_or(1.0) as f32,
                attention_factor: attention as f32,
                truncate: true,
            }
        }
        "longrope" => {
            let orig = orig()?;
            let scale = context_length as f64 / orig.max(1) as f64;
            let attention = float("attn_factor").unwrap_or(if scale <= 1.0 {
                1.0
            } else {
                (1.0 + scale.ln() / (orig as f64).ln()).sqrt()
            });
            RopeScaling::LongRope {
                original_context_length: orig,
                attention_factor: attention as f32,
                short_factor: f32_tensor(g, ROPE_FACTOR_TENSORS[0], rope_dim / 2)?,
                long_factor: f32_tensor(g, ROPE_FACTOR_TENSORS[1], rope_dim / 2)?,
            }
        }
        "dynamic" => {
            return Err(Error::Unsupported(format!(
                "{}: rope scaling type \"dynamic\" in {}: llama.cpp's GGUF keys define no dynamic NTK scaling (supported: {TYPES}); convert the Hugging Face checkpoint, whose config's rope_scaling carries it",
                g.path,
                k("type")
            )))
        }
        other => {
            return Err(Error::Unsupported(format!(
                "{}: rope scaling type {other:?} in {} (supported: {TYPES})",
                g.path,
                k("type")
            )))
        }
    })
}
