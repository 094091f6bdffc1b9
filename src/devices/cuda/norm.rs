//! Row-wise operators on the GPU (f32): `RMSNorm`, `LayerNorm`, `Softmax`.
//!
//! `RMSNorm` with `input1` (f32, f16 or bf16 rows of the input's shape, or one row added to
//! every row, as `AddTo` takes) first adds it into the input (`input += input1`, the input
//! passed mutably) and normalizes the sum: the residual add of [`super::fuse`]'s `add_norm`
//! pass, with the bits of `AddTo` followed by `RMSNorm`. With `all_reduce` it sums `input1` over
//! the GPU's tensor-parallel group first, and with `row_split` (from the fuse pass) the ranks
//! may split the rows: see [`super::p2p::P2pGroup::split_launch`].

use super::act_quant::{ActForm, ActQuant};
use super::buffer::{dptr, ensure_out};
use super::gpu::{int, Gpu, KArg};
use super::linear::TC_MIN_ROWS;
use super::p2p::{group_of, GroupSlot, NormLaunch};
use super::{all_f32, op_err};
use crate::data::DataType;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>, act: &Arc<ActQuant>, group: &GroupSlot) {
    ops.insert(
        "RMSNorm",
        Box::new(RowOp {
            gpu: gpu.clone(),
            kind: Kind::Rms,
            act: act.clone(),
            group: group.clone(),
        }),
    );
    ops.insert(
        "LayerNorm",
        Box::new(RowOp {
            gpu: gpu.clone(),
            kind: Kind::Layer,
            act: act.clone(),
            group: group.clone(),
        }),
    );
    ops.insert(
        "Softmax",
        Box::new(RowOp {
            gpu: gpu.clone(),
            kind: Kind::Softmax,
            act: act.clone(),
            group: group.clone(),
        }),
    );
}

#[derive(Clone, Copy)]
enum Kind {
    Rms,
    Layer,
    Softmax,
}

struct RowOp {
    gpu: Arc<Gpu>,
    kind: Kind,
    /// The group `RMSNorm` with `all_reduce` sums over.
    group: GroupSlot,
    /// Where `RMSNorm` with `quantize_output = 1` also leaves its output as Q8_0 rows for the
    /// next `Linear` (2 / 3: f16 / bf16 rows for its tensor-core path, at `TC_MIN_ROWS` rows or
    /// more).
    act: Arc<ActQuant>,
}

impl RowOp {
    fn op(&self) -> &'static str {
        match self.kind {
            Kind::Rms => "RMSNorm",
            Kind::Layer => "LayerNorm",
            Kind::Softmax => "Softmax",
        }
    }
    fn params(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::Rms => &["weight"],
            Kind::Layer => &["gamma", "beta"],
            Kind::Softmax => &[],
        }
    }
}

/// The kernels' code of a residual's dtype (`bdt`): 0 f32, 1 f16, 2 bf16.
fn residual_code(t: DataType) -> Option<i32> {
    match t {
        DataType::F32 => Some(0),
        DataType::F16 => Some(1),
        DataType::BF16 => Some(2),
        _ => None,
    }
}

/// A residual the norm adds first: its address and [`residual_code`].
type Residual = (u64, i32);

/// Float4s per thread of `rmsnorm_v4_f32` and its variants (`RMS_V4` in the kernel source).
const RMS_V4: usize = 4;

/// Threads of an `rmsnorm_v4*` launch over rows of `row` values: `RMS_V4` float4s each.
fn rms_threads(row: usize) -> u32 {
    ((row / 4).div_ceil(RMS_V4).div_ceil(32).clamp(1, 32) * 32) as u32
}

impl RowOp {
    /// RMSNorm of `rows` rows of `row` values with float4 loads (`row % 4 == 0`, 16-byte
    /// aligned, `row ≤ 4 · RMS_V4 · 1024`; `base` the kernel's first arguments), writing as well
    /// the half rows (from [`TC_MIN_ROWS`] rows) or Q8_0 rows the next `Linear` reads when
    /// `copy` asks for them; `out` is the output's address, which keys those rows.
    /// With `residual` (its address and [`residual_code`]) the `addrmsnorm_v4*` kernels add it
    /// into the input first.
    ///
    /// With `peer` (how the group runs it) the residual is this rank's partial sum, all-reduced
    /// over the group first: `p2p_ll_addrmsnorm_v4*` (values pushed with their epoch, each row
    /// split over `peer.n` blocks of `peer.threads`) or `p2p_addrmsnorm_v4*` (a grid of
    /// `peer.blocks` looping over the rows).
    fn rms_v4(
        &self,
        mut grid: (u32, u32, u32),
        (rows, row): (usize, usize),
        out: u64,
        base: [KArg; 5],
        (copy, residual, peer): (Option<ActForm>, Option<Residual>, Option<NormLaunch>),
    ) -> Result<()> {
        let mut threads = rms_threads(row);
        let mut args = base.to_vec();
        let mut tail = Vec::new();
        let prefix = match (residual, peer) {
            (Some((r, code)), Some(p)) => {
                args.extend([KArg::Ptr(r), KArg::I32(code)]);
                tail.extend([
                    KArg::I32(p.pushed as i32),
                    p.ctx,
                    KArg::I32(p.n),
                    KArg::I32(p.epoch),
                ]);
                grid = (p.blocks, 1, 1);
                threads = p.threads;
                p.kernel
            }
            (Some((r, code)), None) => {
                args.extend([KArg::Ptr(r), KArg::I32(code)]);
                "addrmsnorm"
            }
            _ => "rmsnorm",
        };
        if let Some(form @ (ActForm::F16 | ActForm::Bf16)) = copy {
            if rows >= TC_MIN_ROWS {
                let (hs, key) = self.act.half_slot(out, rows, row, form)?;
                args.extend([KArg::Ptr(hs), KArg::I32((form == ActForm::Bf16) as i32)]);
                args.extend(tail);
                self.gpu
                    .launch(&format!("{prefix}_v4h_f32"), grid, threads, &args)?;
                return self.act.set(key, true);
            }
        }
        if copy == Some(ActForm::Q8) && row.is_multiple_of(32) {
            // also write the Q8_0 rows the next `Linear` (quant_act) reads
            let (qs, ds, key) = self.act.slots(out, rows, row)?;
            args.extend([KArg::Ptr(qs), KArg::Ptr(ds)]);
            args.extend(tail);
            self.gpu
                .launch(&format!("{prefix}_v4q_f32"), grid, threads, &args)?;
            return self.act.set(key, true);
        }
        args.extend(tail);
        self.gpu
            .launch(&format!("{prefix}_v4_f32"), grid, threads, &args)
    }

    /// The row-split fused norm `l` ([`super::p2p::P2pGroup::split_launch`]) of this rank's
    /// partial at `r` (`ptrs`: x, weight, output, r; `code` its [`residual_code`]), leaving the
    /// half copy `copy` for the next `Linear` and only this rank's rows of x. `Err` where the
    /// rows cannot take it (no half copy asked, or rows the float4 kernels do not take): the
    /// other norms of the step's chain split, so the whole-row kernels would read stale rows.
    fn split_rms(
        &self,
        mut l: NormLaunch,
        g: &super::p2p::P2pGroup,
        (rows, row): (usize, usize),
        [xp, wp, yp, rp]: [u64; 4],
        (code, eps): (i32, f32),
        copy: Option<ActForm>,
    ) -> Result<()> {
        let Some(form @ (ActForm::F16 | ActForm::Bf16)) = copy else {
            return Err(op_err(
                "RMSNorm",
                format!(
                    "row_split over {rows} rows of {row} needs the half copy for the next Linear \
                     and 16-byte aligned rows of a multiple of 4 values"
                ),
            ));
        };
        l.epoch = g.take_epoch()?;
        let (hs, key) = self.act.half_slot(yp, rows, row, form)?;
        let args = [
            KArg::Ptr(xp),
            KArg::Ptr(wp),
            KArg::Ptr(yp),
            int(row, "row length")?,
            KArg::F32(eps),
            KArg::Ptr(rp),
            KArg::I32(code),
            KArg::Ptr(hs),
            KArg::I32((form == ActForm::Bf16) as i32),
            l.ctx,
            KArg::I32(l.n),
            KArg::I32(l.epoch),
        ];
        self.gpu.launch(
            &format!("{}_v4h_f32", l.kernel),
            (l.blocks, 1, 1),
            l.threads,
            &args,
        )?;
        g.mark_split();
        self.act.set_split(key)
    }

    /// `input += input1`, then `output = RMSNorm(input)` in one launch where the rows take the
    /// float4 kernels and `input1` has the input's shape (`Ok(true)`); otherwise only the add,
    /// by `AddTo`'s kernel (one `input1` row is added to every row), and `Ok(false)`: the
    /// plain norm follows.
    fn add_rms(&self, d: &mut DataDict, f: &FloatDict, ints: &IntDict) -> Result<bool> {
        const OP: &str = "RMSNorm";
        let eps = f.get_or("eps", 1e-5);
        let ([w, r], [x, y]) = d.io_many(OP, ["weight", "input1"], ["input", "output"])?;
        let (Some(w), Some(r), Some(x), Some(y)) = (w, r, x, y) else {
            return Err(op_err(
                OP,
                "the residual form needs input (mutable), input1, weight and output",
            ));
        };
        let code = residual_code(r.dtype())
            .ok_or_else(|| op_err(OP, format!("input1 must be f32, f16 or bf16, got {r:?}")))?;
        let row = x.dim(-1);
        let rows = x.count() / row.max(1);
        let (xp, wp, yp, rp) = (
            dptr(x, "input")?,
            dptr(w, "weight")?,
            dptr(y, "output")?,
            dptr(r, "input1")?,
        );
        let aligned = [xp, wp, yp, rp].iter().all(|p| p % 16 == 0);
        let whole = r.count() == x.count();
        let reduce = ints.get_or("all_reduce", 0) != 0;
        let peer = if reduce {
            let g = group_of(&self.group, OP)?;
            if !whole {
                return Err(op_err(OP, "all_reduce needs input1 of the input's shape"));
            }
            let split = ints.get_or("row_split", 0);
            if let Some(l) = g
                .split_launch(rows, row, rms_threads(row), split == 2)
                .filter(|_| split != 0)
            {
                let copy = ActForm::from_param(ints.get_or("quantize_output", 0));
                let fits = row % 4 == 0 && aligned && row <= 4 * RMS_V4 * 1024;
                let ptrs = [xp, wp, yp, rp];
                self.split_rms(l, g, (rows, row), ptrs, (code, eps), copy.filter(|_| fits))?;
                return Ok(true);
            }
            let pushed = g.take_ll_pushed(rp)?;
            let mut fits = g.norm_launch(rows, row, r.dtype().block_bytes(), rms_threads(row));
            if let Some(l) = fits.as_mut() {
                l.pushed = pushed && l.low_latency;
            }
            if fits.is_none() || row % 4 != 0 || !aligned || row > 4 * RMS_V4 * 1024 {
                // the sum added by the group's plain all-reduce, then the plain norm
                g.all_reduce(&self.gpu, rp, (r.count(), r.dtype()), Some(xp))?;
                return Ok(false);
            }
            if let Some(l) = fits.as_mut() {
                l.epoch = g.take_epoch()?;
            }
            fits
        } else {
            None
        };
        if whole && row % 4 == 0 && aligned && row <= 4 * RMS_V4 * 1024 {
            let grid = (
                u32::try_from(rows).map_err(|_| op_err(OP, "too many rows"))?,
                1,
                1,
            );
            let base = [
                KArg::Ptr(xp),
                KArg::Ptr(wp),
                KArg::Ptr(yp),
                int(row, "row length")?,
                KArg::F32(eps),
            ];
            let copy = ActForm::from_param(ints.get_or("quantize_output", 0));
            self.rms_v4(grid, (rows, row), yp, base, (copy, Some((rp, code)), peer))?;
            return Ok(true);
        }
        let r = (rp, r.count(), r.dtype());
        super::elementwise::add_to_kernel(&self.gpu, (xp, x.count()), r, 1.0)?;
        Ok(false)
    }
}

impl Operator for RowOp {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        let residual_ok = match d.get("input1") {
            None => true,
            Some(r) => {
                matches!(self.kind, Kind::Rms)
                    && residual_code(r.dtype()).is_some()
                    && r.is_contiguous()
            }
        };
        d.dtype("input") == Some(DataType::F32)
            && all_f32(d, self.params())
            && d.get("input").is_some_and(|x| x.is_contiguous())
            && residual_ok
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, ints: &IntDict) -> Result<()> {
        let op = self.op();
        let x = d.require(op, "input")?;
        let dims = x.dims().to_vec();
        let row = dims.last().copied().unwrap_or(0);
        if dims.is_empty() || row == 0 {
            return Err(op_err(
                op,
                format!("input {dims:?} needs a non-empty last dim"),
            ));
        }
        if d.get("input1").is_none() && ints.get_or("all_reduce", 0) != 0 {
            return Err(op_err(
                op,
                "all_reduce needs input1 (this rank's partial sum)",
            ));
        }
        if let Some(r) = d.get("input1") {
            // `AddTo`'s shapes: the input's, or one row added to every row
            if r.dims() != dims.as_slice() && r.dims() != [row] {
                return Err(op_err(
                    op,
                    format!(
                        "input1 {:?} must equal input {dims:?} or be one row of {row}",
                        r.dims()
                    ),
                ));
            }
        }
        for p in self.params() {
            let w = d.require(op, p)?;
            if w.count() != row {
                return Err(op_err(
                    op,
                    format!("{p} {:?} does not match rows of {row}", w.dims()),
                ));
            }
        }
        ensure_out(
            &self.gpu,
            d.require_mut(op, "output")?,
            DataType::F32,
            &dims,
        )
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, ints: &IntDict) -> Result<()> {
        if d.contains("input1") && self.add_rms(d, f, ints)? {
            return Ok(());
        }
        let op = self.op();
        let eps = f.get_or("eps", 1e-5);
        let ([x, w, g, b], y) = d.io(op, ["input", "weight", "gamma", "beta"], "output")?;
        let x = x.ok_or_else(|| op_err(op, "missing input 'input'"))?;
        let row = x.dim(-1);
        let rows = x.count() / row.max(1);
        let grid = (
            u32::try_from(rows).map_err(|_| op_err(op, "too many rows"))?,
            1,
            1,
        );
        let (xp, yp) = (KArg::Ptr(dptr(x, "input")?), KArg::Ptr(dptr(y, "output")?));
        let dd = int(row, "row length")?;
        match self.kind {
            Kind::Rms => {
                let w = w.ok_or_else(|| op_err(op, "missing input 'weight'"))?;
                let wp = dptr(w, "weight")?;
                let aligned = [dptr(x, "input")?, wp, dptr(y, "output")?]
                    .iter()
                    .all(|p| p % 16 == 0);
                if row % 4 == 0 && aligned && row <= 4 * RMS_V4 * 1024 {
                    let base = [xp, KArg::Ptr(wp), yp, dd, KArg::F32(eps)];
                    let copy = ActForm::from_param(ints.get_or("quantize_output", 0));
                    let how = (copy, None, None);
                    return self.rms_v4(grid, (rows, row), dptr(y, "output")?, base, how);
                }
                self.gpu.launch(
                    "rmsnorm_f32",
                    grid,
                    256,
                    &[xp, KArg::Ptr(dptr(w, "weight")?), yp, dd, KArg::F32(eps)],
                )
            }
            Kind::Layer => {
                let g = g.ok_or_else(|| op_err(op, "missing input 'gamma'"))?;
                let b = b.ok_or_else(|| op_err(op, "missing input 'beta'"))?;
                self.gpu.launch(
                    "layernorm_f32",
                    grid,
                    256,
                    &[
                        xp,
                        KArg::Ptr(dptr(g, "gamma")?),
                        KArg::Ptr(dptr(b, "beta")?),
                        yp,
                        dd,
                        KArg::F32(eps),
                    ],
                )
            }
            Kind::Softmax => self.gpu.launch("softmax_f32", grid, 256, &[xp, yp, dd]),
        }
    }
}
