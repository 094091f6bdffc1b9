//! Sampling operators on the CPU: `Sample` (one token id per logits row: temperature, top-k,
//! top-p, min-p, a random word per row; the definition is in `fastllm_cpu::sample`) and
//! `ApplyPenalties` (repetition / presence / frequency penalties on logits rows, in place).
//! Validates, sizes outputs and calls `fastllm_cpu::sample`. Must not hold kernel arithmetic.
//!
//! `Sample`: `input` F32 `[.., n]`, `params` F32 `[rows, 4]` = (temperature, top_k, top_p,
//! min_p), `random` I32 `[rows, 2]` = the row's random word (low, high 32 bits) → `output` I32
//! with the leading dims of `input` (`[1]` for a vector): the token id, or -1 for a row with
//! NaN/+Inf, only -Inf, or a temperature that is negative or not finite.
//!
//! `ApplyPenalties`: `input` F32 `[rows, n]` (in place), `tokens` and `counts` I32 `[rows, m]`
//! (each token at most once per row; ids outside `0..n` are padding), `params` F32 `[rows, 3]` =
//! (repetition, presence, frequency).

use super::args::{check_tensor, dtype_in, f32s, f32s_mut, i32s, need, rows_last};
use super::CpuContext;
use crate::data::Data;
use crate::data::DataType::{F32, I32};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::sample as k;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert("Sample", Box::new(Sample(ctx.clone())));
    ops.insert("ApplyPenalties", Box::new(ApplyPenalties));
}

/// Leading dims of `dims` (all but the last), `[1]` for a vector.
fn lead(dims: &[usize]) -> Vec<usize> {
    match dims.split_last() {
        Some((_, l)) if !l.is_empty() => l.to_vec(),
        _ => vec![1],
    }
}

/// Errors unless `x` is `[rows, cols]`.
fn check_table(op: &str, name: &str, x: &Data, rows: usize, cols: usize) -> Result<()> {
    if x.dims() != [rows, cols] {
        return Err(Error::op(
            op,
            format!(
                "'{name}' must be [{rows}, {cols}] (one row per logits row), got {:?}",
                x.dims()
            ),
        ));
    }
    Ok(())
}

/// The validated (rows, n) of `Sample`'s arguments.
fn sample_shape(d: &DataDict) -> Result<(usize, usize)> {
    const OP: &str = "Sample";
    let x = d.require(OP, "input")?;
    check_tensor(OP, "input", x)?;
    f32s(OP, "input", x)?;
    let (rows, n) = rows_last(x.dims());
    if n == 0 {
        return Err(Error::op(
            OP,
            format!("'input' {:?} has empty rows", x.dims()),
        ));
    }
    let p = d.require(OP, "params")?;
    super::args::check_dtype(OP, "params", p, F32)?;
    check_table(OP, "params", p, rows, 4)?;
    let r = d.require(OP, "random")?;
    super::args::check_dtype(OP, "random", r, I32)?;
    check_table(OP, "random", r, rows, 2)?;
    Ok((rows, n))
}

/// Per-row parameters from the `params` and `random` tables.
pub fn row_params(p: &[f32], r: &[i32]) -> Vec<k::RowParams> {
    p.chunks_exact(4)
        .zip(r.chunks_exact(2))
        .map(|(p, r)| k::RowParams {
            temperature: p[0],
            top_k: if p[1] >= 1.0 { p[1] as u32 } else { 0 },
            top_p: p[2],
            min_p: p[3],
            random: (r[0] as u32 as u64) | ((r[1] as u32 as u64) << 32),
        })
        .collect()
}

/// `Sample`: one token id per row.
struct Sample(Arc<CpuContext>);

impl Operator for Sample {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32]) && dtype_in(d, "params", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        sample_shape(d)?;
        let od = lead(d.require("Sample", "input")?.dims());
        d.require_mut("Sample", "output")?.resize(I32, &od)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "Sample";
        let (_, n) = sample_shape(d)?;
        let ([x, p, r], out) = d.io(OP, ["input", "params", "random"], "output")?;
        let x = f32s(OP, "input", need(OP, "input", x)?)?;
        let p = f32s(OP, "params", need(OP, "params", p)?)?;
        let r = i32s(OP, "random", need(OP, "random", r)?)?;
        let params = row_params(p, r);
        super::args::check_dtype(OP, "output", out, I32)?;
        let o = out.as_i32_mut().map_err(|e| Error::op(OP, e))?;
        if self.0.reference() {
            k::sample_ref(x, n, &params, o);
        } else {
            k::sample(&self.0.threads, x, n, &params, o);
        }
        Ok(())
    }
}

/// `ApplyPenalties`: penalties on logits rows, in place.
struct ApplyPenalties;

/// The validated (rows, n, m) of `ApplyPenalties`' arguments.
fn penalty_shape(d: &DataDict) -> Result<(usize, usize, usize)> {
    const OP: &str = "ApplyPenalties";
    let x = d.require(OP, "input")?;
    check_tensor(OP, "input", x)?;
    if x.dims().len() != 2 {
        return Err(Error::op(
            OP,
            format!("'input' must be [rows, n], got {:?}", x.dims()),
        ));
    }
    let (rows, n) = (x.dim(0), x.dim(1));
    let t = d.require(OP, "tokens")?;
    super::args::check_dtype(OP, "tokens", t, I32)?;
    let m = t.dims().get(1).copied().unwrap_or(0);
    check_table(OP, "tokens", t, rows, m)?;
    let c = d.require(OP, "counts")?;
    super::args::check_dtype(OP, "counts", c, I32)?;
    check_table(OP, "counts", c, rows, m)?;
    let p = d.require(OP, "params")?;
    super::args::check_dtype(OP, "params", p, F32)?;
    check_table(OP, "params", p, rows, 3)?;
    Ok((rows, n, m))
}

impl Operator for ApplyPenalties {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        penalty_shape(d).map(|_| ())
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "ApplyPenalties";
        let (_, n, m) = penalty_shape(d)?;
        let ([t, c, p], x) = d.io(OP, ["tokens", "counts", "params"], "input")?;
        let t = i32s(OP, "tokens", need(OP, "tokens", t)?)?;
        let c = i32s(OP, "counts", need(OP, "counts", c)?)?;
        let p = f32s(OP, "params", need(OP, "params", p)?)?;
        let x = f32s_mut(OP, "input", x)?;
        // one pass over a few slots per row: the reference is also the fast path
        k::apply_penalties_ref(x, n, t, c, m, p);
        Ok(())
    }
}
