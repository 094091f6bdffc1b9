//! Mixture of experts on the GPU (kernels/moe.cu): `MoeRoute`, `MoeDispatch`, `MoeLinear` (the
//! grouped expert product over stacked expert weights) and `MoeCombine`. A step's routing, its
//! grouping by expert and the expert products stay on the device: `MoeLinear` reads the
//! dispatch offsets on the GPU, so a decode step needs no host sync. With the int `checked = 1`
//! the route and dispatch are trusted (they come from the GPU's own `MoeRoute` / `MoeDispatch`);
//! otherwise they are read back and checked on the host first, so a bad route is an `Err`. The
//! kernels clamp expert indices either way, so memory outside the tensors is never read.
//! Argument checks are those of the CPU device (`devices::cpu::moe`).

use super::buffer::{dptr, ensure_out};
use super::gpu::{int, long, Gpu, KArg};
use super::op_err;
use crate::data::{Data, DataType, Storage};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::devices::cpu::moe::{
    combine_shapes, dispatch_dims, linear_shapes, route_params, MoeLinearShape,
};
use crate::error::Result;
use fastllm_cpu::moe::Scoring;
use std::sync::Arc;

/// Most experts `MoeRoute` and `MoeDispatch` take (their shared-memory tables); more fall back
/// to the CPU.
const MAX_EXPERTS: usize = 1024;
/// Most expert groups `MoeRoute` takes (a 32-bit group mask).
const MAX_GROUPS: usize = 32;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    ops.insert("MoeRoute", Box::new(MoeRoute(gpu.clone())));
    ops.insert("MoeDispatch", Box::new(MoeDispatch(gpu.clone())));
    ops.insert("MoeCombine", Box::new(MoeCombine(gpu.clone())));
    ops.insert("MoeLinear", Box::new(MoeLinear(gpu.clone())));
}

/// True when `name` is present, of `dtype` and contiguous.
fn arg_ok(d: &DataDict, name: &str, dtype: DataType) -> bool {
    d.get(name)
        .is_some_and(|x| x.dtype() == dtype && x.is_contiguous())
}

/// The values of `x` (on the device or the host) as raw little-endian 32-bit words.
fn host_words(x: &Data) -> Result<Vec<u32>> {
    let bytes = match x.storage() {
        Storage::Device(b) => b.to_host()?,
        _ => x.bytes()?.to_vec(),
    };
    Ok(bytes
        .chunks_exact(4)
        .take(x.count())
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn host_f32(x: &Data) -> Result<Vec<f32>> {
    Ok(host_words(x)?.into_iter().map(f32::from_bits).collect())
}

fn host_i32(x: &Data) -> Result<Vec<i32>> {
    Ok(host_words(x)?.into_iter().map(|w| w as i32).collect())
}

/// The dispatch of `route` (k choices per row) for `experts`, computed on the host: an `Err`
/// naming the problem when the route is not valid.
fn host_dispatch(op: &str, route: &Data, k: usize, experts: usize) -> Result<Vec<i32>> {
    let rv = host_f32(route)?;
    let mut out = vec![0i32; experts + 1 + rv.len() / 2];
    fastllm_cpu::moe::dispatch(&rv, k, experts, &mut out).map_err(|e| op_err(op, e))?;
    Ok(out)
}

fn trusted(i: &IntDict) -> bool {
    i.get_or("checked", 0) != 0
}

struct MoeRoute(Arc<Gpu>);

impl Operator for MoeRoute {
    fn can_run(&self, d: &DataDict, _: &FloatDict, i: &IntDict) -> bool {
        arg_ok(d, "input", DataType::F32)
            && (!d.contains("bias") || arg_ok(d, "bias", DataType::F32))
            && d.get("input").is_some_and(|x| x.dim(-1) <= MAX_EXPERTS)
            && i.get_or("groups", 1) as usize <= MAX_GROUPS
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let p = route_params(d, f, i)?;
        let rows = d.require("MoeRoute", "input")?.dim(0);
        ensure_out(
            &self.0,
            d.require_mut("MoeRoute", "output")?,
            DataType::F32,
            &[rows, p.k, 2],
        )
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "MoeRoute";
        let p = route_params(d, f, i)?;
        let ([x, b], out) = d.io(OP, ["input", "bias"], "output")?;
        let x = x.ok_or_else(|| op_err(OP, "missing input 'input'"))?;
        let rows = u32::try_from(x.dim(0)).map_err(|_| op_err(OP, "too many rows"))?;
        if rows == 0 {
            return Ok(());
        }
        let bias = b.map(|b| dptr(b, "bias")).transpose()?.unwrap_or(0);
        self.0.launch(
            "moe_route_f32",
            (rows, 1, 1),
            32,
            &[
                KArg::Ptr(dptr(x, "input")?),
                KArg::Ptr(bias),
                KArg::Ptr(dptr(out, "output")?),
                int(p.experts, "experts")?,
                int(p.k, "k")?,
                KArg::I32((p.scoring == Scoring::Sigmoid) as i32),
                int(p.groups, "groups")?,
                int(p.topk_groups, "topk_groups")?,
                KArg::I32(p.normalize as i32),
                KArg::F32(p.scale),
            ],
        )
    }
}

struct MoeDispatch(Arc<Gpu>);

impl Operator for MoeDispatch {
    fn can_run(&self, d: &DataDict, _: &FloatDict, i: &IntDict) -> bool {
        arg_ok(d, "input", DataType::F32)
            && i.get("experts")
                .is_some_and(|e| (1..=MAX_EXPERTS as i32).contains(&e))
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "MoeDispatch";
        let (rows, k, experts) = dispatch_dims(d, i)?;
        if !trusted(i) {
            host_dispatch(OP, d.require(OP, "input")?, k, experts)?;
        }
        let dims = [experts + 1 + rows * k];
        ensure_out(&self.0, d.require_mut(OP, "output")?, DataType::I32, &dims)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "MoeDispatch";
        let (rows, k, experts) = dispatch_dims(d, i)?;
        let ([r], out) = d.io(OP, ["input"], "output")?;
        let r = r.ok_or_else(|| op_err(OP, "missing input 'input'"))?;
        self.0.launch(
            "moe_dispatch_f32",
            (1, 1, 1),
            256,
            &[
                KArg::Ptr(dptr(r, "input")?),
                KArg::Ptr(dptr(out, "output")?),
                long(rows * k, "slots")?,
                int(experts, "experts")?,
            ],
        )
    }
}

/// Unless trusted, checks on the host that `dispatch` is the dispatch of `route` for `experts`.
fn check_dispatch(op: &str, d: &DataDict, i: &IntDict, experts: usize, k: usize) -> Result<()> {
    if trusted(i) {
        return Ok(());
    }
    let want = host_dispatch(op, d.require(op, "route")?, k, experts)?;
    if host_i32(d.require(op, "dispatch")?)? != want {
        return Err(op_err(
            op,
            "'dispatch' is not the MoeDispatch of 'route' (pass checked = 1 only for a dispatch made on the device)",
        ));
    }
    Ok(())
}

struct MoeCombine(Arc<Gpu>);

impl Operator for MoeCombine {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        arg_ok(d, "input", DataType::F32)
            && arg_ok(d, "route", DataType::F32)
            && arg_ok(d, "dispatch", DataType::I32)
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "MoeCombine";
        let (rows, k, dd) = combine_shapes(d)?;
        let disp = d.require(OP, "dispatch")?.dim(0);
        let experts = disp.saturating_sub(rows * k + 1);
        if experts == 0 {
            return Err(op_err(
                OP,
                format!("dispatch of {disp} entries for {rows}·{k} slots names {experts} experts"),
            ));
        }
        check_dispatch(OP, d, i, experts, k)?;
        ensure_out(
            &self.0,
            d.require_mut(OP, "output")?,
            DataType::F32,
            &[rows, dd],
        )
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "MoeCombine";
        let (rows, k, dd) = combine_shapes(d)?;
        let ([x, r, disp], out) = d.io(OP, ["input", "route", "dispatch"], "output")?;
        let x = x.ok_or_else(|| op_err(OP, "missing input 'input'"))?;
        let r = r.ok_or_else(|| op_err(OP, "missing input 'route'"))?;
        let disp = disp.ok_or_else(|| op_err(OP, "missing input 'dispatch'"))?;
        let experts = disp.dim(0).saturating_sub(rows * k + 1);
        let blocks = u32::try_from(rows).map_err(|_| op_err(OP, "too many rows"))?;
        if blocks == 0 || dd == 0 {
            return Ok(());
        }
        self.0.launch(
            "moe_combine_f32",
            (blocks, 1, 1),
            256,
            &[
                KArg::Ptr(dptr(x, "input")?),
                KArg::Ptr(dptr(r, "route")?),
                KArg::Ptr(dptr(disp, "dispatch")?),
                KArg::Ptr(dptr(out, "output")?),
                int(k, "k")?,
                int(experts, "experts")?,
                long(dd, "d")?,
            ],
        )
    }
}

/// The weight dtypes `MoeLinear` has kernels for.
fn weight_suffix(t: DataType) -> Option<&'static str> {
    use DataType::*;
    matches!(
        t,
        F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q4K | Q5K | Q6K
    )
    .then(|| t.name())
}

/// Unless trusted, checks on the host that the dispatch offsets ascend and every entry is a slot.
fn check_linear_dispatch(d: &DataDict, i: &IntDict, s: &MoeLinearShape) -> Result<()> {
    if trusted(i) {
        return Ok(());
    }
    let v = host_i32(d.require("MoeLinear", "dispatch")?)?;
    let (off, list) = v.split_at(s.experts + 1);
    let slots = s.slots as i64;
    let ascending =
        off[0] == 0 && off.windows(2).all(|w| w[0] <= w[1]) && off[s.experts] as i64 == slots;
    if !ascending || list.iter().any(|&e| e < 0 || e as i64 >= slots) {
        return Err(op_err(
            "MoeLinear",
            format!(
                "'dispatch' is not a grouping of {slots} slots over {} experts",
                s.experts
            ),
        ));
    }
    Ok(())
}

struct MoeLinear(Arc<Gpu>);

impl Operator for MoeLinear {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        arg_ok(d, "input", DataType::F32)
            && arg_ok(d, "dispatch", DataType::I32)
            && (!d.contains("bias") || arg_ok(d, "bias", DataType::F32))
            && d.get("weight")
                .is_some_and(|w| w.is_contiguous() && weight_suffix(w.dtype()).is_some())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let s = linear_shapes(d, i)?;
        check_linear_dispatch(d, i, &s)?;
        let dims = [s.slots, s.n];
        ensure_out(
            &self.0,
            d.require_mut("MoeLinear", "output")?,
            DataType::F32,
            &dims,
        )
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "MoeLinear";
        let s = linear_shapes(d, i)?;
        let ([x, w, b, disp], out) = d.io(OP, ["input", "weight", "bias", "dispatch"], "output")?;
        let x = x.ok_or_else(|| op_err(OP, "missing input 'input'"))?;
        let w = w.ok_or_else(|| op_err(OP, "missing input 'weight'"))?;
        let disp = disp.ok_or_else(|| op_err(OP, "missing input 'dispatch'"))?;
        let suffix = weight_suffix(w.dtype())
            .ok_or_else(|| op_err(OP, format!("weight dtype {}", w.dtype())))?;
        if s.slots == 0 || s.n == 0 {
            return Ok(());
        }
        let bias = b.map(|b| dptr(b, "bias")).transpose()?.unwrap_or(0);
        let grid = (
            u32::try_from(s.n.div_ceil(8)).map_err(|_| op_err(OP, "n too large"))?,
            s.experts.min(s.slots) as u32,
            1,
        );
        self.0.launch(
            &format!("moe_linear_{suffix}"),
            grid,
            256,
            &[
                KArg::Ptr(dptr(x, "input")?),
                KArg::Ptr(dptr(w, "weight")?),
                KArg::Ptr(bias),
                KArg::Ptr(dptr(disp, "dispatch")?),
                KArg::Ptr(dptr(out, "output")?),
                int(s.experts, "experts")?,
                int(s.n, "n")?,
                int(s.k, "k")?,
                long(w.dtype().row_bytes(s.k)?, "row bytes")?,
                int(s.choices, "k")?,
                KArg::I32(s.gather as i32),
            ],
        )
    }
}
