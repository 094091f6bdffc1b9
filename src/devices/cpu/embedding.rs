//! The `Embedding` operator on the CPU: validates token ids (I32, each in `0..vocab`) and the
//! weight (`[vocab, d]` in F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K), sizes `output [.., d]` and calls
//! `fastllm_cpu::embedding`. Must not hold kernel arithmetic.

use super::args::{check_dtype, check_tensor, i32s, need};
use super::CpuContext;
use crate::data::{Data, DataType};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::embedding::{self as k, WeightFormat};
use std::sync::Arc;

const OP: &str = "Embedding";

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert(OP, Box::new(Embedding(ctx.clone())));
}

fn format_of(t: DataType) -> Option<WeightFormat> {
    Some(match t {
        DataType::F32 => WeightFormat::F32,
        DataType::F16 => WeightFormat::F16,
        DataType::BF16 => WeightFormat::BF16,
        DataType::Q8_0 => WeightFormat::Q8_0,
        DataType::Q4_0 => WeightFormat::Q4_0,
        DataType::Q4_1 => WeightFormat::Q4_1,
        DataType::Q5_0 => WeightFormat::Q5_0,
        DataType::Q4K => WeightFormat::Q4K,
        DataType::Q5K => WeightFormat::Q5K,
        DataType::Q6K => WeightFormat::Q6K,
        DataType::Q2K => WeightFormat::Q2K,
        DataType::Q3K => WeightFormat::Q3K,
        DataType::Mxfp4 => return None,
        DataType::Q8_0Interleaved
        | DataType::Q4_0Interleaved
        | DataType::Q4_1Interleaved
        | DataType::F16Interleaved
        | DataType::BF16Interleaved
        | DataType::Q4KInterleaved
        | DataType::Q5KInterleaved
        | DataType::Q6KInterleaved
        | DataType::Q2KInterleaved
        | DataType::Q3KInterleaved => return format_of(t.plain()),
        DataType::I32 => return None,
    })
}

/// Validates ids and weight; returns (format, vocab, d).
fn check(ids: &Data, w: &Data) -> Result<(WeightFormat, usize, usize)> {
    check_tensor(OP, "input", ids)?;
    check_tensor(OP, "weight", w)?;
    let ids_v = i32s(OP, "input", ids)?;
    let fmt = format_of(w.dtype()).ok_or_else(|| {
        Error::op(
            OP,
            format!("'weight' dtype {} is not a weight type", w.dtype()),
        )
    })?;
    let &[vocab, d] = w.dims() else {
        return Err(Error::op(
            OP,
            format!("'weight' must be [vocab, d], got {:?}", w.dims()),
        ));
    };
    if let Some((t, &bad)) = ids_v
        .iter()
        .enumerate()
        .find(|(_, &id)| id < 0 || id as usize >= vocab)
    {
        return Err(Error::op(
            OP,
            format!("token id {bad} at position {t} is outside the vocabulary 0..{vocab}"),
        ));
    }
    Ok((fmt, vocab, d))
}

/// `Embedding`: `output[i] = weight[input[i]]`.
struct Embedding(Arc<CpuContext>);

impl Operator for Embedding {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        super::args::dtype_in(d, "input", &[DataType::I32])
            && d.dtype("weight").is_none_or(|t| format_of(t).is_some())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let ids = d.require(OP, "input")?;
        let (_, _, dim) = check(ids, d.require(OP, "weight")?)?;
        let mut od = ids.dims().to_vec();
        od.push(dim);
        d.require_mut(OP, "output")?.resize(DataType::F32, &od)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let ([ids, w], out) = d.io(OP, ["input", "weight"], "output")?;
        let (ids, w) = (need(OP, "input", ids)?, need(OP, "weight", w)?);
        let (fmt, _, dim) = check(ids, w)?;
        let ids = i32s(OP, "input", ids)?;
        let wb = w
            .bytes()
            .map_err(|e| Error::op(OP, format!("'weight': {e}")))?;
        check_dtype(OP, "output", out, DataType::F32)?;
        let o = super::args::f32s_mut(OP, "output", out)?;
        if w.dtype().is_interleaved() {
            return interleaved_rows(fmt, w, dim, ids, o);
        }
        if self.0.reference() {
            k::embedding_ref(fmt, wb, dim, ids, o);
        } else {
            k::embedding(&self.0.threads, fmt, wb, dim, ids, o);
        }
        Ok(())
    }
}

/// `Embedding` over an interleaved weight: each id's row is taken back to the plain block layout
/// (one row, on the calling thread) and decoded by the plain kernel.
fn interleaved_rows(
    fmt: WeightFormat,
    w: &Data,
    dim: usize,
    ids: &[i32],
    o: &mut [f32],
) -> Result<()> {
    let rb = fmt.row_bytes(dim).ok_or_else(|| {
        Error::op(
            OP,
            format!("'weight' rows of {dim} values are not whole blocks"),
        )
    })?;
    let mut row = vec![0u8; rb];
    for (&id, out) in ids.iter().zip(o.chunks_exact_mut(dim.max(1))) {
        w.plain_row(id as usize, &mut row)
            .map_err(|e| Error::op(OP, format!("'weight': {e}")))?;
        k::embedding_ref(fmt, &row, dim, &[0], out);
    }
    Ok(())
}
