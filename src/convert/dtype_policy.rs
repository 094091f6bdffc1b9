//! Which dtype each tensor is stored in, and the conversion of one tensor's values to it. Rules
//! (see `docs/flm-format.md`): norms, biases and 1-D tensors are F32; quantized targets need rows
//! that are a multiple of 32 (else F16); `keep` keeps `.flm`-representable source types (GGUF
//! Q5_0 and the K-quants Q2_K..Q6_K included) and turns the others (GGUF Q5_1) into Q8_0, `lossless` turns
//! them into F32; a llama.cpp mix (`q4_k_m`, …) is planned over the whole model up front
//! ([`DtypePlan`], rules in `convert::quant_mix`). K-quant blocks are encoded with the
//! scale-searching quantizers of `fastllm_cpu::kquant_search`.

use super::options::TargetDtype;
use super::quant_mix::{always_f32, plan, MixTensor};
use crate::data::{encode_from_f32, DataType, QK};
use crate::error::{Error, Result};
use crate::model::ModelConfig;
use rayon::prelude::*;

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
        // planned for the whole model by `DtypePlan`; alone, the mix's 32-block fallback
        TargetDtype::Mix(_) => quant(DataType::Q8_0),
    }
}

/// The stored dtype of every tensor of one conversion.
pub enum DtypePlan {
    /// Each tensor on its own ([`stored_dtype`]).
    PerTensor(TargetDtype),
    /// Decided for the whole model (a llama.cpp mix), in the order tensors are written.
    Planned(Vec<DataType>),
}

impl DtypePlan {
    /// The plan for `target`; for a mix, `tensors()` lists every tensor of the model of
    /// `config` in the order they will be written.
    pub fn new(
        target: TargetDtype,
        config: &ModelConfig,
        tensors: impl FnOnce() -> Result<Vec<MixTensor>>,
    ) -> Result<DtypePlan> {
        Ok(match target {
            TargetDtype::Mix(mix) => {
                let spec = crate::model::arch::lookup(&config.architecture)?;
                let experts = config.moe.as_ref().map_or(0, |m| m.experts);
                let layers_experts = (config.num_layers, experts);
                DtypePlan::Planned(plan(mix, spec, layers_experts, &tensors()?)?)
            }
            t => DtypePlan::PerTensor(t),
        })
    }

    /// The stored dtype of the `index`-th tensor written (`name`, stored `dims`, the source's
    /// `.flm`-equivalent type).
    pub fn dtype(
        &self,
        index: usize,
        name: &str,
        dims: &[usize],
        source: Option<DataType>,
    ) -> Result<DataType> {
        match self {
            DtypePlan::PerTensor(t) => Ok(stored_dtype(*t, name, dims, source)),
            DtypePlan::Planned(v) => v.get(index).copied().ok_or_else(|| {
                Error::invalid(format!("tensor {name}: not in the conversion's dtype plan"))
            }),
        }
    }
}

/// Super-blocks per parallel task of the K-quant search.
const KQUANT_TASK_BLOCKS: usize = 64;

/// Encodes f32 values (a whole tensor, row-major) into `dtype`; K-quants with the scale search
/// (in parallel over groups of super-blocks).
pub fn encode(dtype: DataType, values: &[f32]) -> Result<Vec<u8>> {
    use fastllm_cpu::kquant_search as ks;
    let quant: fn(&[f32], &mut [u8], bool) = match dtype {
        DataType::Q4K => ks::quantize_q4_k,
        DataType::Q5K => ks::quantize_q5_k,
        DataType::Q6K => ks::quantize_q6_k,
        _ => return encode_from_f32(dtype, values),
    };
    let mut out = vec![0u8; crate::data::bytes_for(dtype, &[values.len()])?];
    let (n, b) = (dtype.block_elems(), dtype.block_bytes());
    out.par_chunks_mut(b * KQUANT_TASK_BLOCKS)
        .zip(values.par_chunks(n * KQUANT_TASK_BLOCKS))
        .for_each(|(o, x)| quant(x, o, true));
    Ok(out)
}
