//! What a conversion is asked to do: the target dtype (`--dtype`), and the progress events reported while tensors stream. Plain data; no I/O.

use super::quant_mix::QuantMix;
use crate::error::{Error, Result};

/// The `--dtype` of a conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetDtype {
    /// Everything f32.
    F32,
    /// Weights f16.
    F16,
    /// Weights bf16.
    BF16,
    /// Weights Q8_0.
    Int8,
    /// Weights Q4_0.
    Int4,
    /// Weights Q4_1.
    Int4Min,
    /// Keep the source's types where `.flm` has them (GGUF Q5_1 becomes Q8_0).
    Keep,
    /// Keep the source's types where `.flm` has them and dequantize the others to F32: every
    /// weight keeps its exact value (what the `exact` precision needs to match a reference
    /// computed on the dequantized weights), at up to 8× the source's size for those tensors.
    Lossless,
    /// One of llama.cpp's quantization mixes (`q4_k_m`, `q5_k_m`, `q6_k`, `q8_0`, `q4_0`), from
    /// an f32/f16/bf16 source, with llama.cpp's per-tensor choices (see `convert::quant_mix`).
    Mix(QuantMix),
}

impl TargetDtype {
    /// Parses `f32|f16|bf16|int8|int4|int4-min|q4_k_m|q5_k_m|q6_k|q8_0|q4_0|keep|lossless`.
    pub fn parse(s: &str) -> Result<TargetDtype> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => TargetDtype::F32,
            "f16" | "float16" => TargetDtype::F16,
            "bf16" | "bfloat16" => TargetDtype::BF16,
            "int8" => TargetDtype::Int8,
            "int4" => TargetDtype::Int4,
            "q4_k_m" => TargetDtype::Mix(QuantMix::Q4KM),
            "q5_k_m" => TargetDtype::Mix(QuantMix::Q5KM),
            "q6_k" => TargetDtype::Mix(QuantMix::Q6K),
            "q8_0" => TargetDtype::Mix(QuantMix::Q8_0),
            "q4_0" => TargetDtype::Mix(QuantMix::Q4_0),
            "int4-min" | "int4_min" | "q4_1" => TargetDtype::Int4Min,
            "keep" => TargetDtype::Keep,
            "lossless" => TargetDtype::Lossless,
            other => {
                return Err(Error::invalid(format!(
                "unknown dtype {other:?} (expected f32, f16, bf16, int8, int4, int4-min, q4_k_m, \
                 q5_k_m, q6_k, q8_0, q4_0, keep or lossless)"
            )))
            }
        })
    }

    /// The name as written on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TargetDtype::F32 => "f32",
            TargetDtype::F16 => "f16",
            TargetDtype::BF16 => "bf16",
            TargetDtype::Int8 => "int8",
            TargetDtype::Int4 => "int4",
            TargetDtype::Int4Min => "int4-min",
            TargetDtype::Keep => "keep",
            TargetDtype::Lossless => "lossless",
            TargetDtype::Mix(m) => m.name(),
        }
    }
}

/// Options of one conversion.
#[derive(Clone, Copy, Debug)]
pub struct ConvertOptions {
    /// Target dtype.
    pub dtype: TargetDtype,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            dtype: TargetDtype::Keep,
        }
    }
}

/// Reported after each tensor is written.
#[derive(Clone, Debug)]
pub struct Progress<'a> {
    /// 1-based index of the tensor just written.
    pub done: usize,
    /// Number of tensors.
    pub total: usize,
    /// Its `.flm` name.
    pub name: &'a str,
    /// Its stored dtype.
    pub dtype: crate::data::DataType,
    /// Its stored size in bytes.
    pub bytes: usize,
}
