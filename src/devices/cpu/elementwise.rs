//! Elementwise operators on the CPU: `Add` (out = input0 + alpha·input1), `AddTo`
//! (input0 += alpha·input1), `Mul` (out = input·v) and `MulTo` (input0 *= input1); the in-place
//! ones accept `input1` of the same shape or a `[d]` vector broadcast over rows of length `d`.
//! Validates, sizes outputs and calls `fastllm_cpu::elementwise`. Must not hold kernel arithmetic.

use super::args::{check_tensor, dtype_in, f32s, f32s_mut, need, rows_last};
use super::CpuContext;
use crate::data::{Data, DataType::F32};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::elementwise as k;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert("AddTo", Box::new(AddTo(ctx.clone())));
    ops.insert("MulTo", Box::new(MulTo(ctx.clone())));
    ops.insert("Add", Box::new(Add(ctx.clone())));
    ops.insert("Mul", Box::new(Mul(ctx.clone())));
}

fn two_f32(d: &DataDict) -> bool {
    dtype_in(d, "input0", &[F32]) && dtype_in(d, "input1", &[F32])
}

/// Checks that `b` has the shape of `a`, or (when `broadcast`) is `[d]` with `d` the last dim of `a`.
fn check_operands(op: &str, a: &Data, b: &Data, broadcast: bool) -> Result<()> {
    check_tensor(op, "input0", a)?;
    check_tensor(op, "input1", b)?;
    f32s(op, "input0", a)?;
    f32s(op, "input1", b)?;
    let same = a.dims() == b.dims();
    let row = broadcast && b.dims().len() == 1 && b.dims()[0] == rows_last(a.dims()).1;
    if !(same || row) {
        let how = if broadcast {
            " (or be [last dim of input0])"
        } else {
            ""
        };
        return Err(Error::op(
            op,
            format!(
                "input1 {:?} must have the shape of input0 {:?}{how}",
                b.dims(),
                a.dims()
            ),
        ));
    }
    Ok(())
}

/// `AddTo`: `input0 += alpha * input1`.
struct AddTo(Arc<CpuContext>);

impl Operator for AddTo {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        two_f32(d)
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        check_operands(
            "AddTo",
            d.require("AddTo", "input0")?,
            d.require("AddTo", "input1")?,
            true,
        )
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "AddTo";
        let alpha = f.get_or("alpha", 1.0);
        let ([y], x) = d.io(OP, ["input1"], "input0")?;
        let y = f32s(OP, "input1", need(OP, "input1", y)?)?;
        let x = f32s_mut(OP, "input0", x)?;
        if self.0.reference() {
            k::add_to_rows_ref(x, y, alpha);
        } else {
            k::add_to_rows(&self.0.threads, x, y, alpha);
        }
        Ok(())
    }
}

/// `MulTo`: `input0 *= input1`.
struct MulTo(Arc<CpuContext>);

impl Operator for MulTo {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        two_f32(d)
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        check_operands(
            "MulTo",
            d.require("MulTo", "input0")?,
            d.require("MulTo", "input1")?,
            true,
        )
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "MulTo";
        let ([y], x) = d.io(OP, ["input1"], "input0")?;
        let y = f32s(OP, "input1", need(OP, "input1", y)?)?;
        let x = f32s_mut(OP, "input0", x)?;
        if self.0.reference() {
            k::mul_to_rows_ref(x, y);
        } else {
            k::mul_to_rows(&self.0.threads, x, y);
        }
        Ok(())
    }
}

/// `Add`: `output = input0 + alpha * input1` (same shape).
struct Add(Arc<CpuContext>);

impl Operator for Add {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        two_f32(d)
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let a = d.require("Add", "input0")?;
        check_operands("Add", a, d.require("Add", "input1")?, false)?;
        let dims = a.dims().to_vec();
        d.require_mut("Add", "output")?.resize(F32, &dims)
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "Add";
        let alpha = f.get_or("alpha", 1.0);
        let ([a, b], out) = d.io(OP, ["input0", "input1"], "output")?;
        let a = f32s(OP, "input0", need(OP, "input0", a)?)?;
        let b = f32s(OP, "input1", need(OP, "input1", b)?)?;
        let o = f32s_mut(OP, "output", out)?;
        if self.0.reference() {
            k::add_ref(a, b, alpha, o);
        } else {
            k::add(&self.0.threads, a, b, alpha, o);
        }
        Ok(())
    }
}

/// `Mul`: `output = input * v`.
struct Mul(Arc<CpuContext>);

impl Operator for Mul {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let x = d.require("Mul", "input")?;
        check_tensor("Mul", "input", x)?;
        f32s("Mul", "input", x)?;
        let dims = x.dims().to_vec();
        d.require_mut("Mul", "output")?.resize(F32, &dims)
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "Mul";
        let v = f.get_or("v", 1.0);
        let ([x], out) = d.io(OP, ["input"], "output")?;
        let x = f32s(OP, "input", need(OP, "input", x)?)?;
        let o = f32s_mut(OP, "output", out)?;
        if self.0.reference() {
            k::mul_ref(x, v, o);
        } else {
            k::mul(&self.0.threads, x, v, o);
        }
        Ok(())
    }
}
