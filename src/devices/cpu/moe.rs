//! Mixture-of-experts operators on the CPU: `MoeRoute` (router logits → chosen experts and
//! weights), `MoeDispatch` (slots grouped by expert), `MoeLinear` (the grouped expert product
//! over stacked expert weights) and `MoeCombine` (weighted sum of the experts' outputs per
//! token). Validates, sizes outputs and calls `fastllm_cpu::moe` / `fastllm_cpu::linear`. The
//! argument checks ([`route_params`], [`dispatch_dims`], [`combine_shapes`],
//! [`linear_shapes`]) are shared with the CUDA device. Must not hold kernel arithmetic.

use super::args::{check_tensor, check_vec, dtype_in, f32s, f32s_mut, i32s, need, non_neg};
use super::CpuContext;
use crate::data::Data;
use crate::data::DataType::{F32, I32};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::linear::{self as lk, LinearArgs};
use fastllm_cpu::moe::{self as k, RouteParams, Scoring};
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert("MoeRoute", Box::new(MoeRoute));
    ops.insert("MoeDispatch", Box::new(MoeDispatch));
    ops.insert("MoeCombine", Box::new(MoeCombine(ctx.clone())));
    ops.insert("MoeLinear", Box::new(MoeLinear(ctx.clone())));
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

/// The checked parameters of a `MoeRoute` call (the message names what is wrong).
pub fn route_params(d: &DataDict, f: &FloatDict, i: &IntDict) -> Result<RouteParams> {
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

impl Operator for MoeRoute {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32]) && dtype_in(d, "bias", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let p = route_params(d, f, i)?;
        let rows = d.require("MoeRoute", "input")?.dim(0);
        d.require_mut("MoeRoute", "output")?
            .resize(F32, &[rows, p.k, 2])
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "MoeRoute";
        let p = route_params(d, f, i)?;
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

/// A `MoeDispatch` call's (rows, k, experts), checked.
pub fn dispatch_dims(d: &DataDict, i: &IntDict) -> Result<(usize, usize, usize)> {
    const OP: &str = "MoeDispatch";
    let r = d.require(OP, "input")?;
    check_tensor(OP, "input", r)?;
    let (rows, kk) = route_dims(OP, r.dims())?;
    let experts = size_param(OP, i, "experts", None)?;
    if experts == 0 {
        return Err(Error::op(OP, "parameter 'experts' must be ≥ 1"));
    }
    Ok((rows, kk, experts))
}

impl Operator for MoeDispatch {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let (rows, kk, experts) = dispatch_dims(d, i)?;
        d.require_mut("MoeDispatch", "output")?
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

/// A `MoeCombine` call's (rows, k, d), checked.
pub fn combine_shapes(d: &DataDict) -> Result<(usize, usize, usize)> {
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

impl Operator for MoeCombine {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32])
            && dtype_in(d, "route", &[F32])
            && dtype_in(d, "dispatch", &[I32])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let (rows, _, dd) = combine_shapes(d)?;
        d.require_mut("MoeCombine", "output")?
            .resize(F32, &[rows, dd])
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "MoeCombine";
        let (_, kk, dd) = combine_shapes(d)?;
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

/// The sizes of a `MoeLinear` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeLinearShape {
    /// Experts (the weight's first dim).
    pub experts: usize,
    /// Output features per expert.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// Rows of the output: every (token, choice) slot of the dispatch.
    pub slots: usize,
    /// Choices per token (the token of dispatch entry `s` is `s / choices`).
    pub choices: usize,
    /// `input` rows are tokens (gathered through the dispatch) rather than dispatch positions.
    pub gather: bool,
}

/// A `MoeLinear` call's sizes, checked: `input` F32 [rows, k], `weight` [experts, n, k],
/// optional `bias` F32 [experts, n], `dispatch` I32 [experts + 1 + slots]; int `k` (choices per
/// token, ≥ 1) and `gather` (0 or 1, default 0: `input` has one row per dispatch position; 1:
/// one per token, rows·k = slots).
pub fn linear_shapes(d: &DataDict, i: &IntDict) -> Result<MoeLinearShape> {
    const OP: &str = "MoeLinear";
    let x = d.require(OP, "input")?;
    let w = d.require(OP, "weight")?;
    let disp = d.require(OP, "dispatch")?;
    for (n, t) in [("input", x), ("weight", w), ("dispatch", disp)] {
        check_tensor(OP, n, t)?;
    }
    let (rows, k) = matrix(OP, "input", x.dims())?;
    let &[experts, n, kw] = w.dims() else {
        return Err(Error::op(
            OP,
            format!("'weight' must be [experts, n, k], got {:?}", w.dims()),
        ));
    };
    let choices = size_param(OP, i, "k", None)?;
    let gather = match i.get_or("gather", 0) {
        0 => false,
        1 => true,
        v => return Err(Error::op(OP, format!("'gather' must be 0 or 1, got {v}"))),
    };
    let slots = (disp.dims().len() == 1)
        .then(|| disp.dim(0).checked_sub(experts + 1))
        .flatten();
    let want_rows = slots.map(|s| if gather { s / choices.max(1) } else { s });
    let fits = slots.is_some_and(|s| !gather || s.is_multiple_of(choices.max(1)));
    if kw != k || experts == 0 || choices == 0 || !fits || want_rows != Some(rows) {
        return Err(Error::op(
            OP,
            format!(
                "input {:?}, weight {:?}, dispatch {:?}, k = {choices}, gather = {gather}: need \
                 input [rows, k], weight [experts ≥ 1, n, k] and a dispatch of experts + 1 + \
                 slots entries with slots = rows·k (gather) or rows",
                x.dims(),
                w.dims(),
                disp.dims()
            ),
        ));
    }
    check_bias(OP, d.get("bias"), experts, n)?;
    Ok(MoeLinearShape {
        experts,
        n,
        k,
        slots: slots.unwrap_or(0),
        choices,
        gather,
    })
}

/// An optional `bias` must be F32 [experts, n].
fn check_bias(op: &str, b: Option<&Data>, experts: usize, n: usize) -> Result<()> {
    match b {
        Some(b) if b.dtype() != F32 || b.dims() != [experts, n] => Err(Error::op(
            op,
            format!(
                "'bias' must be F32 [{experts}, {n}], got {} {:?}",
                b.dtype(),
                b.dims()
            ),
        )),
        _ => Ok(()),
    }
}

/// `MoeLinear`: for every dispatch position `j` (expert `e`),
/// `output[j] = x(j) · weight[e]ᵀ + bias[e]`; each expert's weight rows are read once for all
/// its rows, experts without entries are not touched.
struct MoeLinear(Arc<CpuContext>);

impl Operator for MoeLinear {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32])
            && dtype_in(d, "dispatch", &[I32])
            && dtype_in(d, "bias", &[F32])
            && d.dtype("weight")
                .is_some_and(|t| !t.is_interleaved() && super::linear::weight_type(t).is_some())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let s = linear_shapes(d, i)?;
        d.require_mut("MoeLinear", "output")?
            .resize(F32, &[s.slots, s.n])
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "MoeLinear";
        let s = linear_shapes(d, i)?;
        let ([x, w, b, disp], out) = d.io(OP, ["input", "weight", "bias", "dispatch"], "output")?;
        let x = f32s(OP, "input", need(OP, "input", x)?)?;
        let w = need(OP, "weight", w)?;
        let wtype = super::linear::weight_type(w.dtype())
            .ok_or_else(|| Error::op(OP, format!("weight dtype {}", w.dtype())))?;
        let wb = w.bytes().map_err(|e| Error::op(OP, e))?;
        let b = b.map(|b| f32s(OP, "bias", b)).transpose()?;
        let disp = i32s(OP, "dispatch", need(OP, "dispatch", disp)?)?;
        let o = f32s_mut(OP, "output", out)?;
        let rb = w.dtype().row_bytes(s.k).map_err(|e| Error::op(OP, e))?;
        let threads = (!self.0.reference()).then_some(&self.0.threads);
        let (offsets, list) = disp.split_at(s.experts + 1);
        let mut xs = Vec::new();
        for (e, win) in offsets.windows(2).enumerate() {
            let (a, z) = expert_range(win, s.slots)?;
            if a == z {
                continue;
            }
            xs.clear();
            for (j, &slot) in (a..z).zip(&list[a..z]) {
                let row = if s.gather { source_row(slot, &s)? } else { j };
                xs.extend_from_slice(&x[row * s.k..(row + 1) * s.k]);
            }
            let args = LinearArgs {
                x: &xs,
                rows: z - a,
                k: s.k,
                w: &wb[e * s.n * rb..(e + 1) * s.n * rb],
                wtype,
                n: s.n,
                bias: b.map(|b| &b[e * s.n..(e + 1) * s.n]),
                quant_act: i.get_or("quant_act", 0) != 0,
            };
            let oe = &mut o[a * s.n..z * s.n];
            match threads {
                Some(t) => lk::linear(t, &args, oe),
                None => lk::linear_ref(&args, oe),
            }
            .map_err(|e| Error::op(OP, e))?;
        }
        Ok(())
    }
}

/// An expert's entries `win[0]..win[1]` of the dispatch list, checked against `slots`.
fn expert_range(win: &[i32], slots: usize) -> Result<(usize, usize)> {
    match (usize::try_from(win[0]), usize::try_from(win[1])) {
        (Ok(a), Ok(z)) if a <= z && z <= slots => Ok((a, z)),
        _ => Err(Error::op(
            "MoeLinear",
            format!("dispatch offsets {win:?} are not ascending within 0..={slots}"),
        )),
    }
}

/// The token row of a dispatch entry (`slot`) in gather mode, checked.
fn source_row(slot: i32, s: &MoeLinearShape) -> Result<usize> {
    usize::try_from(slot)
        .ok()
        .filter(|&v| v < s.slots)
        .map(|v| v / s.choices)
        .ok_or_else(|| {
            Error::op(
                "MoeLinear",
                format!("dispatch entry {slot} is outside 0..{}", s.slots),
            )
        })
}
