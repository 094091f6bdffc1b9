//! Selection on the GPU (f32 rows): `ArgMax` (I32 indices, lowest index on ties) and `TopK`
//! ((index, value) pairs, descending, ties by lower index).

use super::buffer::{dptr, ensure_out};
use super::gpu::{long, Gpu, KArg};
use super::op_err;
use crate::data::DataType;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    ops.insert(
        "ArgMax",
        Box::new(Select {
            gpu: gpu.clone(),
            topk: false,
        }),
    );
    ops.insert(
        "TopK",
        Box::new(Select {
            gpu: gpu.clone(),
            topk: true,
        }),
    );
}

/// Largest `k` the GPU TopK takes (it makes k passes over the row).
const MAX_K: usize = 256;

struct Select {
    gpu: Arc<Gpu>,
    topk: bool,
}

/// (leading dims, or [1] for 1-D; row length).
fn rows(dims: &[usize]) -> (Vec<usize>, usize) {
    match dims.split_last() {
        Some((n, l)) if !l.is_empty() => (l.to_vec(), *n),
        Some((n, _)) => (vec![1], *n),
        None => (vec![1], 0),
    }
}

impl Select {
    fn op(&self) -> &'static str {
        if self.topk {
            "TopK"
        } else {
            "ArgMax"
        }
    }
    fn k(&self, n: usize, i: &IntDict) -> Result<usize> {
        let k = i
            .get("k")
            .ok_or_else(|| op_err("TopK", "missing parameter 'k'"))?;
        usize::try_from(k)
            .ok()
            .filter(|&k| k >= 1 && k <= n)
            .ok_or_else(|| op_err("TopK", format!("k = {k} must be in 1..={n}")))
    }
}

impl Operator for Select {
    fn can_run(&self, d: &DataDict, _: &FloatDict, i: &IntDict) -> bool {
        d.dtype("input") == Some(DataType::F32)
            && d.get("input").is_some_and(|x| x.is_contiguous())
            && (!self.topk
                || i.get("k")
                    .and_then(|k| usize::try_from(k).ok())
                    .is_some_and(|k| k <= MAX_K))
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let op = self.op();
        let x = d.require(op, "input")?;
        let (mut od, n) = rows(x.dims());
        if n == 0 {
            return Err(op_err(op, format!("'input' {:?} has empty rows", x.dims())));
        }
        if self.topk {
            let k = self.k(n, i)?;
            od.extend([k, 2]);
            ensure_out(&self.gpu, d.require_mut(op, "output")?, DataType::F32, &od)
        } else {
            ensure_out(&self.gpu, d.require_mut(op, "output")?, DataType::I32, &od)
        }
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let op = self.op();
        let ([x], y) = d.io(op, ["input"], "output")?;
        let x = x.ok_or_else(|| op_err(op, "missing input 'input'"))?;
        let (lead, n) = rows(x.dims());
        let r = u32::try_from(lead.iter().product::<usize>())
            .map_err(|_| op_err(op, "too many rows"))?;
        let (xp, yp) = (KArg::Ptr(dptr(x, "input")?), KArg::Ptr(dptr(y, "output")?));
        if self.topk {
            let k = self.k(n, i)?;
            self.gpu.launch(
                "topk_f32",
                (r, 1, 1),
                1024,
                &[xp, yp, long(n, "n")?, KArg::I32(k as i32)],
            )
        } else {
            self.gpu
                .launch("argmax_f32", (r, 1, 1), 1024, &[xp, yp, long(n, "n")?])
        }
    }
}
