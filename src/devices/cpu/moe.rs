//! Mixture-of-experts operators on the CPU: `MoeRoute` (router logits → chosen experts and
//! weights), `MoeDispatch` (slots grouped by expert) and `MoeCombine` (weighted sum of the
//! experts' outputs per token). Validates, sizes outputs and calls `fastllm_cpu::moe`. Must not
//! hold kernel arithmetic.

use super::args::{check_tensor, check_vec, dtype_in, f32s, f32s_mut, i32s, need, non_neg};
use super::CpuContext;
use crate::data::DataType::{F32, I32};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::moe::{self as k, RouteParams, Scoring};
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert("MoeRoute", Box::new(MoeRoute));
    ops.insert("MoeDispatch", Box::new(MoeDispatch));
    ops.insert("MoeCombine", Box::new(MoeCombine(ctx.clone())));
}

/// A required int parameter ≥ 0.
fn size_param(op: &str, i: &IntDict, name: &str, default: Option<i32>) -> Result<usize> {
    let v = i
        .get(name)
        .or(default)
        .ok_or_else(|| Error::op(op, format!("missing parameter '{name}'")))?;
    non_neg(op, name, v)
}

/// A tensor's dims as `[rows, n]` (2-D required).
fn matrix(op: &str, name: &str, dims: &[usize]) -> Result<(usize, usize)> {
    match dims {
        [r, n] => Ok((*r, *n)),
        _ => Err(Error::op(op, format!("'{name}' must be 2-D, got {dims:?}"))),
    }
}

/// A route tensor's (rows, k): F32 [rows, k, 2].
fn route_dims(op: &str, dims: &[usize]) -> Result<(usize, usize)> {
    match dims {
        [r, kk, 2] if *kk > 0 => Ok((*r, *kk)),
        _ => Err(Error::op(
            op,
            format!("'route' must be [rows, k, 2] with k ≥ 1, got {dims:?}"),
        )),
    }
}

/// `MoeRoute`: `input` [rows, experts] logits (+ optional `bias` [experts]) → `output`
/// [rows, k, 2] (expert, weight).
struct MoeRoute;

impl MoeRoute {
    fn params(d: &DataDict, f: &FloatDict, i: &IntDict) -> Result<RouteParams> {
        const OP: &str = "MoeRoute";
        let x = d.require(OP, "input")?;
        check_tensor(OP, "input", x)?;
        let (_, experts) = matrix(OP, "input", x.dims())?;
        check_vec(OP, "bias", d.get("bias"), experts)?;
        let scoring = match i.get_or("scoring", 0) {
            0 => Scoring::Softmax,
            1 => Scoring::Sigmoid,
            v => {
                return Err(Error::op(
                    OP,
                    format!("parameter 'scoring' must be 0 (softmax) or 1 (sigmoid), got {v}"),
                ))
            }
        };
        let groups = size_param(OP, i, "groups", Some(1))?;
        let p = RouteParams {
            experts,
            k: size_param(OP, i, "k", None)?,
            scoring,
            groups,
            topk_groups: size_param(OP, i, "topk_groups", Some(groups as i32))?,
            normalize: match i.get_or("normalize", 1) {
                0 => false,
                1 => true,
                v => {
                    return Err(Error::op(
                        OP,
                        format!("'normalize' must be 0 or 1, got {v}"),
                    ))
                }
            },
            scale: f.get_or("scale", 1.0),
        };
        p.check()
            .map_err(|e| Error::op(OP, format!("{e} (input {:?})", x.dims())))?;
        Ok(p)
    }
}

impl Operator for MoeRoute {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32]) && dtype_in(d, "bias", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let p = Self::params(d, f, i)?;
        let rows = d.require("MoeRoute", "input")?.dim(0);
        d.require_mut("MoeRoute", "output")?
            .resize(F32, &[rows, p.k, 2])
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "MoeRoute";
        let p = Self::params(d, f, i)?;
        let ([x, b], out) = d.io(OP, ["input", "bias"], "output")?;
        let x = f32s(OP, "input", need(OP, "input", x)?)?;
        let b = b.map(|b| f32s(OP, "bias", b)).transpose()?;
        let o = f32s_mut(OP, "output", out)?;
        k::route(x, b, &p, o).map_err(|e| Error::op(OP, e))
    }
}

/// `MoeDispatch`: `input` route [rows, k, 2] → `output` I32 [experts + 1 + rows·k] (offsets,
/// then slots by expert).
struct MoeDispatch;

impl Operator for MoeDispatch {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "MoeDispatch";
        let r = d.require(OP, "input")?;
        check_tensor(OP, "input", r)?;
        let (rows, kk) = route_dims(OP, r.dims())?;
        let experts = size_param(OP, i, "experts", None)?;
        d.require_mut(OP, "output")?
            .resize(I32, &[experts + 1 + rows * kk])
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "MoeDispatch";
        let experts = size_param(OP, i, "experts", None)?;
        let ([r], out) = d.io(OP, ["input"], "output")?;
        let r = need(OP, "input", r)?;
        let (_, kk) = route_dims(OP, r.dims())?;
        let rv = f32s(OP, "input", r)?;
        super::args::check_dtype(OP, "output", out, I32)?;
        let o = out.as_i32_mut().map_err(|e| Error::op(OP, e))?;
        k::dispatch(rv, kk, experts, o).map_err(|e| Error::op(OP, e))
    }
}

/// `MoeCombine`: `input` [rows·k, d] expert outputs in dispatch order, `route`, `dispatch` →
/// `output` [rows, d].
struct MoeCombine(Arc<CpuContext>);

impl MoeCombine {
    /// Validates; returns (rows, k, d).
    fn shapes(d: &DataDict) -> Result<(usize, usize, usize)> {
        const OP: &str = "MoeCombine";
        let x = d.require(OP, "input")?;
        let r = d.require(OP, "route")?;
        let disp = d.require(OP, "dispatch")?;
        for (n, t) in [("input", x), ("route", r), ("dispatch", disp)] {
            check_tensor(OP, n, t)?;
        }
        let (rows, kk) = route_dims(OP, r.dims())?;
        let (slots, dd) = matrix(OP, "input", x.dims())?;
        if slots != rows * kk || disp.dims().len() != 1 || disp.dim(0) < slots {
            return Err(Error::op(
                OP,
                format!(
                    "input {:?} must be [rows·k, d] and dispatch {:?} hold ≥ rows·k slots for route {:?}",
                    x.dims(),
                    disp.dims(),
                    r.dims()
                ),
            ));
        }
        Ok((rows, kk, dd))
    }
}

impl Operator for MoeCombine {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32])
            && dtype_in(d, "route", &[F32])
            && dtype_in(d, "dispatch", &[I32])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let (rows, _, dd) = Self::shapes(d)?;
        d.require_mut("MoeCombine", "output")?
            .resize(F32, &[rows, dd])
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "MoeCombine";
        let (_, kk, dd) = Self::shapes(d)?;
        let ([x, r, disp], out) = d.io(OP, ["input", "route", "dispatch"], "output")?;
        let x = f32s(OP, "input", need(OP, "input", x)?)?;
        let r = f32s(OP, "route", need(OP, "route", r)?)?;
        let disp = i32s(OP, "dispatch", need(OP, "dispatch", disp)?)?;
        let o = f32s_mut(OP, "output", out)?;
        let res = if self.0.reference() {
            k::combine_ref(x, r, disp, kk, dd, o)
        } else {
            k::combine(&self.0.threads, x, r, disp, kk, dd, o)
        };
        res.map_err(|e| Error::op(OP, e))
    }
}
