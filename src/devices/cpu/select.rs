//! Selection operators on the CPU: `TopK` (`[.., n]` → `[.., k, 2]` (index, value) pairs,
//! descending) and `ArgMax` (`[.., n]` → I32 `[..]`, or `[1]` for a vector). Validates, sizes
//! outputs and calls `fastllm_cpu::select`. Must not hold kernel arithmetic.

use super::args::{check_tensor, dtype_in, f32s, need, non_neg, rows_last};
use super::CpuContext;
use crate::data::DataType::{F32, I32};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::select as k;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert("TopK", Box::new(TopK(ctx.clone())));
    ops.insert("ArgMax", Box::new(ArgMax(ctx.clone())));
}

/// Leading dims of `dims` (all but the last), `[1]` for a vector.
fn lead(dims: &[usize]) -> Vec<usize> {
    match dims.split_last() {
        Some((_, l)) if !l.is_empty() => l.to_vec(),
        _ => vec![1],
    }
}

/// The validated `k` for an input with rows of `n`.
fn read_k(n: usize, i: &IntDict, dims: &[usize]) -> Result<usize> {
    let k = non_neg(
        "TopK",
        "k",
        i.get("k")
            .ok_or_else(|| Error::op("TopK", "missing parameter 'k'"))?,
    )?;
    if k == 0 || k > n {
        return Err(Error::op(
            "TopK",
            format!("k = {k} must be in 1..={n} for input {dims:?}"),
        ));
    }
    Ok(k)
}

/// `TopK`: the `k` largest values of each row.
struct TopK(Arc<CpuContext>);

impl Operator for TopK {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let x = d.require("TopK", "input")?;
        check_tensor("TopK", "input", x)?;
        f32s("TopK", "input", x)?;
        let k = read_k(rows_last(x.dims()).1, i, x.dims())?;
        let mut od = lead(x.dims());
        od.extend([k, 2]);
        d.require_mut("TopK", "output")?.resize(F32, &od)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "TopK";
        let ([x], out) = d.io(OP, ["input"], "output")?;
        let x = need(OP, "input", x)?;
        let n = rows_last(x.dims()).1;
        let kk = read_k(n, i, x.dims())?;
        let x = f32s(OP, "input", x)?;
        let o = super::args::f32s_mut(OP, "output", out)?;
        if self.0.reference() {
            k::topk_ref(x, n, kk, o);
        } else {
            k::topk(&self.0.threads, x, n, kk, o);
        }
        Ok(())
    }
}

/// `ArgMax`: index of the largest value of each row.
struct ArgMax(Arc<CpuContext>);

impl Operator for ArgMax {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let x = d.require("ArgMax", "input")?;
        check_tensor("ArgMax", "input", x)?;
        f32s("ArgMax", "input", x)?;
        if rows_last(x.dims()).1 == 0 {
            return Err(Error::op(
                "ArgMax",
                format!("'input' {:?} has empty rows", x.dims()),
            ));
        }
        let od = lead(x.dims());
        d.require_mut("ArgMax", "output")?.resize(I32, &od)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "ArgMax";
        let ([x], out) = d.io(OP, ["input"], "output")?;
        let x = need(OP, "input", x)?;
        let n = rows_last(x.dims()).1;
        let x = f32s(OP, "input", x)?;
        super::args::check_dtype(OP, "output", out, I32)?;
        let o = out.as_i32_mut().map_err(|e| Error::op(OP, e))?;
        if self.0.reference() {
            k::argmax_ref(x, n, o);
        } else {
            k::argmax(&self.0.threads, x, n, o);
        }
        Ok(())
    }
}
