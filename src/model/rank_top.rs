//! A tensor-parallel rank's best candidates of its vocabulary slice: `TopK` of its logits
//! rows, with the k that skips the zero column a rank's slice ends with, and the (column,
//! value) pairs read back. Shared by the rank's recorded decode step (`model::transformer`) and
//! its replies to the driver (`model::tensor_parallel`).

use crate::data::{Data, DataType};
use crate::error::{Error, Result};
use crate::executor::Executor;

/// `TopK` of `logits`' rows into `out` ([rows, k, 2] f32 (column, value) pairs): k = 2 where
/// the rows are wider than `real` columns (so one of the two lies inside them), else 1. A
/// rank's recorded decode step ends with it.
pub(super) fn topk_into(exec: &Executor, logits: &Data, real: usize, out: &mut Data) -> Result<()> {
    let width = logits.dim(-1);
    let k = if width > real { 2.min(width) } else { 1 };
    crate::ops::topk(exec, logits, k, out)
}

/// The best of the first `real` columns of each of the first `n` rows of `logits` (`TopK`
/// on `exec`): (column, value), the lowest column among equal maxima.
pub(super) fn top_candidates(
    exec: &Executor,
    logits: &Data,
    n: usize,
    real: usize,
) -> Result<Vec<(u32, f32)>> {
    let mut top = Data::empty(DataType::F32);
    topk_into(exec, logits, real, &mut top)?;
    top_rows(&top.to_owned_host()?, n, real)
}

/// The best candidate below column `real` of each of the first `n` rows of `TopK` pairs
/// ([rows, k, 2] f32 on the host).
pub(super) fn top_rows(top: &Data, n: usize, real: usize) -> Result<Vec<(u32, f32)>> {
    let k = top.dim(-2);
    let v = top.as_f32()?;
    (0..n)
        .map(|row| {
            let cands = v.get(row * 2 * k..(row + 1) * 2 * k).unwrap_or(&[]);
            cands
                .chunks_exact(2)
                .map(|c| (c[0] as u32, c[1]))
                .find(|&(i, _)| (i as usize) < real)
                .ok_or_else(|| Error::invalid(format!("TopK gave no candidate for row {row}")))
        })
        .collect()
}
