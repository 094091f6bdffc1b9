//! Which dtype each tensor is stored in, and the conversion of one tensor's values to it. Rules
//! (see `docs/flm-format.md`): norms, biases and 1-D tensors are F32; quantized targets need rows
//! that are a multiple of 32 (else F16); `keep` keeps `.flm`-representable source types (GGUF
//! Q4_K/Q5_K/Q6_K included) and turns the others (GGUF Q5_0/Q5_1) into Q8_0, `lossless` turns
//! them into F32.

use super::options::TargetDtype;
use crate::data::{encode_from_f32, DataType, QK};
use crate::error::Result;

/// True for tensors that always stay F32 (norm weights, biases, 1-D tensors).
pub fn always_f32(name: &str, dims: &[usize]) -> bool {
    dims.len() <= 1
        || name.ends_with(".bias")
        || name.contains("norm")
        || name.contains(".ln_")
        || name.contains("layernorm")
}

/// The stored dtype of tensor `name` of `dims`, given the target and the source's dtype
/// (`None` when the source type has no `.flm` equivalent).
pub fn stored_dtype(
    target: TargetDtype,
    name: &str,
    dims: &[usize],
    source: Option<DataType>,
) -> DataType {
    if always_f32(name, dims) {
        return DataType::F32;
    }
    let row = dims.last().copied().unwrap_or(0);
    let quantizable = row % QK == 0 && row > 0;
    let quant = |q: DataType| if quantizable { q } else { DataType::F16 };
    match target {
        TargetDtype::F32 => DataType::F32,
        TargetDtype::F16 => DataType::F16,
        TargetDtype::BF16 => DataType::BF16,
        TargetDtype::Int8 => quant(DataType::Q8_0),
        TargetDtype::Int4 => quant(DataType::Q4_0),
        TargetDtype::Int4Min => quant(DataType::Q4_1),
        TargetDtype::Keep => match source {
            Some(d) if d != DataType::I32 => d,
            _ => quant(DataType::Q8_0),
        },
        TargetDtype::Lossless => match source {
            Some(d) if d != DataType::I32 => d,
            _ => DataType::F32,
        },
    }
}

/// Encodes f32 values (a whole tensor, row-major) into `dtype`.
pub fn encode(dtype: DataType, values: &[f32]) -> Result<Vec<u8>> {
    encode_from_f32(dtype, values)
}
