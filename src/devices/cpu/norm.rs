//! Normalisation operators on the CPU: `RMSNorm` and `LayerNorm` over the last axis. Validates
//! shapes and dtypes, sizes the output, and calls the `fastllm_cpu::norm` kernels (reference or
//! fast by kernel mode). Must not hold kernel arithmetic.

use super::args::{check_tensor, check_vec, dtype_in, f32s, f32s_mut, need, rows_last};
use super::CpuContext;
use crate::data::DataType::F32;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use fastllm_cpu::norm as k;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert("RMSNorm", Box::new(RmsNorm(ctx.clone())));
    ops.insert("LayerNorm", Box::new(LayerNorm(ctx.clone())));
}

/// Validates `input` and the per-channel vectors, and sizes `output` like `input`.
fn shape_norm(op: &str, d: &mut DataDict, vecs: &[&str]) -> Result<()> {
    let x = d.require(op, "input")?;
    check_tensor(op, "input", x)?;
    f32s(op, "input", x)?;
    let dims = x.dims().to_vec();
    let (_, n) = rows_last(&dims);
    for v in vecs {
        check_vec(op, v, Some(d.require(op, v)?), n)?;
    }
    d.require_mut(op, "output")?.resize(F32, &dims)
}

/// `RMSNorm`: `x / sqrt(mean(x²) + eps) * weight`.
struct RmsNorm(Arc<CpuContext>);

impl Operator for RmsNorm {
    fn can_run(&self, d: &DataDict, _: &FloatDict, ints: &IntDict) -> bool {
        // the residual form (`input1`, `all_reduce`) is the CUDA device's fused pass only
        dtype_in(d, "input", &[F32])
            && dtype_in(d, "weight", &[F32])
            && !d.contains("input1")
            && ints.get_or("all_reduce", 0) == 0
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        shape_norm("RMSNorm", d, &["weight"])
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "RMSNorm";
        let eps = f.get_or("eps", 1e-5);
        let ([x, w], out) = d.io(OP, ["input", "weight"], "output")?;
        let x = need(OP, "input", x)?;
        let n = rows_last(x.dims()).1;
        let x = f32s(OP, "input", x)?;
        let w = f32s(OP, "weight", need(OP, "weight", w)?)?;
        let o = f32s_mut(OP, "output", out)?;
        if self.0.reference() {
            k::rms_norm_ref(x, w, o, n, eps);
        } else {
            k::rms_norm(&self.0.threads, x, w, o, n, eps);
        }
        Ok(())
    }
}

/// `LayerNorm`: `(x - mean) / sqrt(var + eps) * gamma + beta`.
struct LayerNorm(Arc<CpuContext>);

impl Operator for LayerNorm {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32]) && dtype_in(d, "gamma", &[F32]) && dtype_in(d, "beta", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        shape_norm("LayerNorm", d, &["gamma", "beta"])
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "LayerNorm";
        let eps = f.get_or("eps", 1e-5);
        let ([x, g, b], out) = d.io(OP, ["input", "gamma", "beta"], "output")?;
        let x = need(OP, "input", x)?;
        let n = rows_last(x.dims()).1;
        let x = f32s(OP, "input", x)?;
        let g = f32s(OP, "gamma", need(OP, "gamma", g)?)?;
        let b = f32s(OP, "beta", need(OP, "beta", b)?)?;
        let o = f32s_mut(OP, "output", out)?;
        if self.0.reference() {
            k::layer_norm_ref(x, g, b, o, n, eps);
        } else {
            k::layer_norm(&self.0.threads, x, g, b, o, n, eps);
        }
        Ok(())
    }
}
