//! Elementwise operators on the CPU: `AddTo`.

use super::CpuContext;
use crate::data::DataType;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::elementwise as k;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert("AddTo", Box::new(AddTo(ctx.clone())));
}

/// `AddTo`: `input0 += alpha * input1` (same shape; f32).
struct AddTo(Arc<CpuContext>);

impl Operator for AddTo {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input0") == Some(DataType::F32) && d.dtype("input1") == Some(DataType::F32)
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let a = d.require("AddTo", "input0")?;
        let b = d.require("AddTo", "input1")?;
        if a.dims() != b.dims() {
            return Err(Error::op(
                "AddTo",
                format!("input0 {:?} and input1 {:?} differ in shape", a.dims(), b.dims()),
            ));
        }
        Ok(())
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        let alpha = f.get_or("alpha", 1.0);
        let ([y], x) = d.io("AddTo", ["input1"], "input0")?;
        let y = y.ok_or_else(|| Error::op("AddTo", "missing input 'input1'"))?.as_f32()?;
        let x = x.as_f32_mut()?;
        if self.0.reference() {
            k::add_to_ref(x, y, alpha);
        } else {
            k::add_to(x, y, alpha);
        }
        Ok(())
    }
}
