//! Sampling on the GPU: `Sample` (one token id per f32 logits row; temperature, top-k, top-p,
//! min-p and a random word per row) and `ApplyPenalties` (repetition / presence / frequency
//! penalties in place). Same arguments and bit-identical results as the CPU operators
//! (`devices/cpu/sample.rs`, definition in `fastllm_cpu::sample`); kernels in
//! `kernels/sample.cu`, one block per row. Only the ids come back to the host.

use super::buffer::{dptr, ensure_out};
use super::gpu::{int, long, Gpu, KArg};
use super::op_err;
use crate::data::{Data, DataType};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    ops.insert("Sample", Box::new(Sample(gpu.clone())));
    ops.insert("ApplyPenalties", Box::new(ApplyPenalties(gpu.clone())));
}

/// Threads per row of the sampling kernel.
const THREADS: u32 = 1024;

/// (leading dims, or [1] for 1-D; row length).
fn rows(dims: &[usize]) -> (Vec<usize>, usize) {
    match dims.split_last() {
        Some((n, l)) if !l.is_empty() => (l.to_vec(), *n),
        Some((n, _)) => (vec![1], *n),
        None => (vec![1], 0),
    }
}

fn check(op: &str, name: &str, x: Option<&Data>, dt: DataType, dims: &[usize]) -> Result<()> {
    let x = x.ok_or_else(|| op_err(op, format!("missing input '{name}'")))?;
    if x.dtype() != dt || x.dims() != dims || !x.is_contiguous() {
        return Err(op_err(
            op,
            format!(
                "'{name}' must be a packed {dt} {dims:?} (one row per logits row), got {} {:?}",
                x.dtype(),
                x.dims()
            ),
        ));
    }
    Ok(())
}

struct Sample(Arc<Gpu>);

impl Sample {
    /// (leading dims, rows, n) after checking every input.
    fn shape(d: &DataDict) -> Result<(Vec<usize>, usize, usize)> {
        const OP: &str = "Sample";
        let x = d.require(OP, "input")?;
        let (lead, n) = rows(x.dims());
        if n == 0 {
            return Err(op_err(OP, format!("'input' {:?} has empty rows", x.dims())));
        }
        let r: usize = lead.iter().product();
        check(OP, "input", Some(x), DataType::F32, x.dims())?;
        check(OP, "params", d.get("params"), DataType::F32, &[r, 4])?;
        check(OP, "random", d.get("random"), DataType::I32, &[r, 2])?;
        Ok((lead, r, n))
    }
}

impl Operator for Sample {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input") == Some(DataType::F32) && d.get("input").is_some_and(|x| x.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let (lead, _, _) = Self::shape(d)?;
        ensure_out(
            &self.0,
            d.require_mut("Sample", "output")?,
            DataType::I32,
            &lead,
        )
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "Sample";
        let (_, r, n) = Self::shape(d)?;
        let ([x, p, rnd], y) = d.io(OP, ["input", "params", "random"], "output")?;
        let ptr = |v: Option<&Data>, what: &str| -> Result<KArg> {
            let v = v.ok_or_else(|| op_err(OP, format!("missing input '{what}'")))?;
            Ok(KArg::Ptr(dptr(v, what)?))
        };
        let args = [
            ptr(x, "input")?,
            ptr(p, "params")?,
            ptr(rnd, "random")?,
            KArg::Ptr(dptr(y, "output")?),
            long(n, "n")?,
        ];
        let grid = u32::try_from(r).map_err(|_| op_err(OP, "too many rows"))?;
        self.0.launch("sample_f32", (grid, 1, 1), THREADS, &args)
    }
}

struct ApplyPenalties(Arc<Gpu>);

impl ApplyPenalties {
    /// (rows, n, m) after checking every input.
    fn shape(d: &DataDict) -> Result<(usize, usize, usize)> {
        const OP: &str = "ApplyPenalties";
        let x = d.require(OP, "input")?;
        if x.dims().len() != 2 {
            return Err(op_err(
                OP,
                format!("'input' must be [rows, n], got {:?}", x.dims()),
            ));
        }
        let (r, n) = (x.dim(0), x.dim(1));
        check(OP, "input", Some(x), DataType::F32, &[r, n])?;
        let m = d
            .get("tokens")
            .and_then(|t| t.dims().get(1).copied())
            .unwrap_or(0);
        check(OP, "tokens", d.get("tokens"), DataType::I32, &[r, m])?;
        check(OP, "counts", d.get("counts"), DataType::I32, &[r, m])?;
        check(OP, "params", d.get("params"), DataType::F32, &[r, 3])?;
        Ok((r, n, m))
    }
}

impl Operator for ApplyPenalties {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input") == Some(DataType::F32) && d.get("input").is_some_and(|x| x.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        Self::shape(d).map(|_| ())
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "ApplyPenalties";
        let (r, n, m) = Self::shape(d)?;
        if r == 0 || m == 0 {
            return Ok(());
        }
        let ([t, c, p], x) = d.io(OP, ["tokens", "counts", "params"], "input")?;
        let ptr = |v: Option<&Data>, what: &str| -> Result<KArg> {
            let v = v.ok_or_else(|| op_err(OP, format!("missing input '{what}'")))?;
            Ok(KArg::Ptr(dptr(v, what)?))
        };
        let args = [
            KArg::Ptr(dptr(x, "input")?),
            ptr(t, "tokens")?,
            ptr(c, "counts")?,
            ptr(p, "params")?,
            long(n, "n")?,
            int(m, "m")?,
        ];
        let grid = u32::try_from(r).map_err(|_| op_err(OP, "too many rows"))?;
        self.0.launch("penalties_f32", (grid, 1, 1), 256, &args)
    }
}
