//! Mixture-of-experts operators on the CPU: `MoeRoute` (router logits → chosen experts and
//! weights), `MoeDispatch` (slots grouped by expert), `MoeLinear` (the grouped expert product
//! over stacked expert weights, or over each expert's own tensor as loaded) and `MoeCombine` (weighted sum of the experts' outputs per
//! token). Validates, sizes outputs and calls `fastllm_cpu::moe` / `fastllm_cpu::linear`. The
//! argument checks ([`route_params`], [`dispatch_dims`], [`combine_shapes`],
//! [`linear_shapes`]) are shared with the CUDA device. Must not hold kernel arithmetic.

use super::args::{check_tensor, check_vec, dtype_in, f32s, f32s_mut, i32s, need, non_neg};
use super::CpuContext;
use crate::data::Data;
use crate::data::DataType::{self, F32, I32};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::linear::{self as lk, LinearArgs, WeightType};
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

/// A `MoeLinear` call's sizes, checked: `input` F32 [rows, k], the weights (see
/// [`expert_weights_dims`]), `dispatch` I32 [experts + 1 + slots]; int `k` (choices per
/// token, ≥ 1) and `gather` (0 or 1, default 0: `input` has one row per dispatch position; 1:
/// one per token, rows·k = slots).
pub fn linear_shapes(d: &DataDict, i: &IntDict) -> Result<MoeLinearShape> {
    const OP: &str = "MoeLinear";
    let x = d.require(OP, "input")?;
    let disp = d.require(OP, "dispatch")?;
    for (n, t) in [("input", x), ("dispatch", disp)] {
        check_tensor(OP, n, t)?;
    }
    let (rows, k) = matrix(OP, "input", x.dims())?;
    let (experts, n, kw) = expert_weights_dims(d, i)?;
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
                "input {:?}, weights [{experts}, {n}, {kw}], dispatch {:?}, k = {choices}, \
                 gather = {gather}: need input [rows, k], weights [experts ≥ 1, n, k] and a \
                 dispatch of experts + 1 + slots entries with slots = rows·k (gather) or rows",
                x.dims(),
                disp.dims()
            ),
        ));
    }
    Ok(MoeLinearShape {
        experts,
        n,
        k,
        slots: slots.unwrap_or(0),
        choices,
        gather,
    })
}

/// The name of expert `e`'s own weight in the per-expert form of `MoeLinear`.
pub fn expert_weight_name(e: usize) -> String {
    format!("weight.{e}")
}

/// The name of expert `e`'s own bias in the per-expert form of `MoeLinear`.
pub fn expert_bias_name(e: usize) -> String {
    format!("bias.{e}")
}

/// The expert of a per-expert argument name (`weight.{e}` / `bias.{e}`) with prefix `what`.
fn expert_of_name(name: &str, what: &str) -> Option<usize> {
    name.strip_prefix(what)?.strip_prefix('.')?.parse().ok()
}

/// The (experts, n, k) of a `MoeLinear` call's weights, checked: either `weight` [experts, n, k]
/// (the stacked matrices) with optional `bias` F32 [experts, n], or (per-expert form, int
/// `experts`) `weight.{e}` [n, k] for some experts `e < experts` (one dtype and shape for all)
/// with optional `bias.{e}` F32 [n].
fn expert_weights_dims(d: &DataDict, i: &IntDict) -> Result<(usize, usize, usize)> {
    const OP: &str = "MoeLinear";
    if let Some(w) = d.get("weight") {
        check_tensor(OP, "weight", w)?;
        let &[experts, n, k] = w.dims() else {
            return Err(Error::op(
                OP,
                format!("'weight' must be [experts, n, k], got {:?}", w.dims()),
            ));
        };
        check_bias(OP, d.get("bias"), experts, n)?;
        return Ok((experts, n, k));
    }
    let experts = size_param(OP, i, "experts", None).map_err(|_| {
        Error::op(
            OP,
            "needs 'weight' [experts, n, k], or 'weight.{e}' per expert with int 'experts'",
        )
    })?;
    let mut shape: Option<(DataType, usize, usize)> = None;
    for (name, t) in d.iter() {
        let (e, want) = if let Some(e) = expert_of_name(name, "weight") {
            (e, None)
        } else if let Some(e) = expert_of_name(name, "bias") {
            (e, Some(()))
        } else {
            continue;
        };
        check_tensor(OP, name, t)?;
        let bad = |m: String| Err(Error::op(OP, format!("'{name}' {m}")));
        if e >= experts {
            return bad(format!("names an expert outside 0..{experts}"));
        }
        match (want, shape) {
            (None, None) => {
                let (n, k) = matrix(OP, name, t.dims())?;
                shape = Some((t.dtype(), n, k));
            }
            (None, Some((dt, n, k))) if t.dtype() != dt || t.dims() != [n, k] => {
                return bad(format!(
                    "is {} {:?}, the other experts' weights {dt} [{n}, {k}]",
                    t.dtype(),
                    t.dims()
                ));
            }
            _ => {}
        }
    }
    let (_, n, k) = shape.unwrap_or((F32, 0, 0));
    for (name, t) in d.iter() {
        if expert_of_name(name, "bias").is_some() && (t.dtype() != F32 || t.dims() != [n]) {
            return Err(Error::op(
                OP,
                format!(
                    "'{name}' must be F32 [{n}], got {} {:?}",
                    t.dtype(),
                    t.dims()
                ),
            ));
        }
    }
    Ok((experts, n, k))
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
/// its rows, experts without entries are not touched. The routed experts' products run as one
/// job on the thread pool (their columns handed out together).
struct MoeLinear(Arc<CpuContext>);

/// A weight dtype `MoeLinear` reads: plain (not interleaved) with `Linear` kernels.
fn expert_dtype_ok(t: DataType) -> bool {
    !t.is_interleaved() && super::linear::weight_type(t).is_some()
}

impl Operator for MoeLinear {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        let per_expert = d
            .iter()
            .filter(|(n, _)| expert_of_name(n, "weight").is_some())
            .all(|(_, w)| expert_dtype_ok(w.dtype()));
        dtype_in(d, "input", &[F32])
            && dtype_in(d, "dispatch", &[I32])
            && dtype_in(d, "bias", &[F32])
            && match d.dtype("weight") {
                Some(t) => expert_dtype_ok(t),
                None => per_expert,
            }
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let s = linear_shapes(d, i)?;
        d.require_mut("MoeLinear", "output")?
            .resize(F32, &[s.slots, s.n])
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "MoeLinear";
        let s = linear_shapes(d, i)?;
        let quant_act = i.get_or("quant_act", 0) != 0;
        let (ins, out) = d.io_rest(OP, "output")?;
        let get = |n: &str| ins.iter().find(|(m, _)| *m == n).map(|(_, t)| *t);
        let x = f32s(OP, "input", need(OP, "input", get("input"))?)?;
        let disp = i32s(OP, "dispatch", need(OP, "dispatch", get("dispatch"))?)?;
        let (offsets, list) = disp.split_at(s.experts + 1);
        let mut xs = Vec::new();
        if s.gather {
            xs.reserve(s.slots * s.k);
            for &slot in list {
                let row = source_row(slot, &s)?;
                xs.extend_from_slice(&x[row * s.k..(row + 1) * s.k]);
            }
        }
        let x = if s.gather { &xs[..] } else { x };
        let weights = ExpertWeights::new(&get, s.n)?;
        let mut rest = f32s_mut(OP, "output", out)?;
        let mut calls = Vec::new();
        for (e, win) in offsets.windows(2).enumerate() {
            let (a, z) = expert_range(win, s.slots)?;
            let (oe, tail) = std::mem::take(&mut rest).split_at_mut((z - a) * s.n);
            rest = tail;
            if a == z {
                continue;
            }
            let (w, wtype, bias) = weights.expert(&get, e)?;
            let args = LinearArgs {
                x: &x[a * s.k..z * s.k],
                rows: z - a,
                k: s.k,
                w,
                wtype,
                n: s.n,
                bias,
                quant_act,
            };
            calls.push(lk::LinearCall { args, out: oe });
        }
        let threads = (!self.0.reference()).then_some(&self.0.threads);
        lk::linear_many(threads, &mut calls).map_err(|e| Error::op(OP, e))
    }
}

/// Where a `MoeLinear` call's expert matrices are: the stacked `weight` (and `bias`), or the
/// experts' own `weight.{e}` (and `bias.{e}`).
enum ExpertWeights<'a> {
    /// [experts, n, k] bytes, its dtype, n, the bytes of one expert's matrix and the stacked
    /// bias [experts, n].
    Stacked(&'a [u8], WeightType, usize, usize, Option<&'a [f32]>),
    /// One tensor per expert.
    Each,
}

impl<'a> ExpertWeights<'a> {
    fn new(get: &dyn Fn(&str) -> Option<&'a Data>, n: usize) -> Result<Self> {
        const OP: &str = "MoeLinear";
        let Some(w) = get("weight") else {
            return Ok(ExpertWeights::Each);
        };
        let wtype = super::linear::weight_type(w.dtype())
            .ok_or_else(|| Error::op(OP, format!("weight dtype {}", w.dtype())))?;
        let rb = w
            .dtype()
            .row_bytes(w.dim(-1))
            .map_err(|e| Error::op(OP, e))?;
        let b = get("bias").map(|b| f32s(OP, "bias", b)).transpose()?;
        let wb = w.bytes().map_err(|e| Error::op(OP, e))?;
        Ok(ExpertWeights::Stacked(wb, wtype, n, n * rb, b))
    }

    /// Expert `e`'s weight bytes, dtype and bias (an `Err` naming the missing weight).
    #[allow(clippy::type_complexity)]
    fn expert(
        &self,
        get: &dyn Fn(&str) -> Option<&'a Data>,
        e: usize,
    ) -> Result<(&'a [u8], WeightType, Option<&'a [f32]>)> {
        const OP: &str = "MoeLinear";
        if let ExpertWeights::Stacked(wb, wtype, n, mb, b) = *self {
            let bias = b.map(|b| &b[e * n..(e + 1) * n]);
            return Ok((&wb[e * mb..(e + 1) * mb], wtype, bias));
        }
        let name = expert_weight_name(e);
        let w = get(&name).ok_or_else(|| {
            Error::op(
                OP,
                format!("expert {e} has dispatch entries but no '{name}'"),
            )
        })?;
        let wtype = super::linear::weight_type(w.dtype())
            .ok_or_else(|| Error::op(OP, format!("'{name}' dtype {}", w.dtype())))?;
        let b = get(&expert_bias_name(e))
            .map(|b| f32s(OP, "bias", b))
            .transpose()?;
        Ok((w.bytes().map_err(|e| Error::op(OP, e))?, wtype, b))
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
