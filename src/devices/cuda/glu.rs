//! `ClampedSwiglu` on the GPU (f32): GPT-OSS's expert activation,
//! `output = (clamp(input1, −limit, limit) + 1) · g·σ(alpha·g)` with `g = min(input0, limit)`
//! (`clamped_swiglu_f32` in kernels/elementwise.cu); floats `alpha`, `limit`.

use super::buffer::{dptr, ensure_out};
use super::gpu::{long, Gpu, KArg};
use super::{all_f32, op_err};
use crate::data::DataType;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use std::sync::Arc;

const OP: &str = "ClampedSwiglu";

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    ops.insert(OP, Box::new(ClampedSwiglu(gpu.clone())));
}

/// The `alpha` and `limit` of a call (finite, `limit` > 0).
fn params(f: &FloatDict) -> Result<(f32, f32)> {
    match (f.get("alpha"), f.get("limit")) {
        (Some(a), Some(l)) if a.is_finite() && l.is_finite() && l > 0.0 => Ok((a, l)),
        (Some(a), Some(l)) => Err(op_err(
            OP,
            format!("parameters alpha {a} / limit {l} must be finite, limit > 0"),
        )),
        _ => Err(op_err(OP, "needs parameters 'alpha' and 'limit'")),
    }
}

struct ClampedSwiglu(Arc<Gpu>);

impl Operator for ClampedSwiglu {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        all_f32(d, &["input0", "input1"])
            && d.get("input0").is_some_and(|x| x.is_contiguous())
            && d.get("input1").is_some_and(|x| x.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        params(f)?;
        let g = d.require(OP, "input0")?;
        let u = d.require(OP, "input1")?;
        if g.dims() != u.dims() {
            return Err(op_err(
                OP,
                format!(
                    "gate {:?} and up {:?} must have one shape",
                    g.dims(),
                    u.dims()
                ),
            ));
        }
        let dims = g.dims().to_vec();
        ensure_out(&self.0, d.require_mut(OP, "output")?, DataType::F32, &dims)
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        let (alpha, limit) = params(f)?;
        let ([g, u], y) = d.io(OP, ["input0", "input1"], "output")?;
        let g = g.ok_or_else(|| op_err(OP, "missing input 'input0'"))?;
        let u = u.ok_or_else(|| op_err(OP, "missing input 'input1'"))?;
        let n = y.count();
        if n == 0 {
            return Ok(());
        }
        self.0.launch(
            "clamped_swiglu_f32",
            Gpu::grid_for(n, 256),
            256,
            &[
                KArg::Ptr(dptr(g, "input0")?),
                KArg::Ptr(dptr(u, "input1")?),
                KArg::Ptr(dptr(y, "output")?),
                long(n, "values")?,
                KArg::F32(alpha),
                KArg::F32(limit),
            ],
        )
    }
}
