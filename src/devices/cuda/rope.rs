//! `RotaryEmbedding` on the GPU (f32, in place): neox or interleaved pairs, angles from `cos`/`sin`
//! tables, `inv_freq`, or `theta`, formed in double as in the CPU reference. An optional second
//! mutable tensor `input1` [s, heads1, hd] (same rows and head size) is rotated in the same
//! launch with the same positions (a decode step's keys along with its queries); the CPU
//! devices do not take it, so only callers that know the device has it pass it.
//!
//! `RotaryTables` (GPU only): the `cos`/`sin` tables [s, rot/2] of a step's positions, formed
//! with the same double-precision expressions as the kernel's own angles, so a model computes
//! them once per step and every layer's `RotaryEmbedding` reads them (bit-equal results).

use super::buffer::{dptr, ensure_out};
use super::gpu::{int, Gpu, KArg};
use super::{all_f32, op_err};
use crate::data::DataType;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    ops.insert("RotaryEmbedding", Box::new(Rotary(gpu.clone())));
    ops.insert("RotaryTables", Box::new(RotaryTables(gpu.clone())));
}

/// `RotaryTables`: `cos`, `sin` [s, rot/2] (F32) of `positions` (I32 [s]) with `inv_freq`
/// [rot/2] or `theta` (module doc).
struct RotaryTables(Arc<Gpu>);

impl RotaryTables {
    /// (s, rot) after validating the arguments.
    fn shape(d: &DataDict, i: &IntDict) -> Result<(usize, usize)> {
        const OP: &str = "RotaryTables";
        let s = d.require(OP, "positions")?.count();
        let rot = usize::try_from(i.get_or("rotary_dim", 0)).unwrap_or(0);
        if rot == 0 || rot % 2 != 0 {
            return Err(op_err(
                OP,
                format!("rotary_dim {rot} must be even and positive"),
            ));
        }
        if let Some(f) = d.get("inv_freq") {
            if f.count() < rot / 2 {
                return Err(op_err(
                    OP,
                    format!("inv_freq {:?} needs {} entries", f.dims(), rot / 2),
                ));
            }
        }
        Ok((s, rot))
    }
}

impl Operator for RotaryTables {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("positions") == Some(DataType::I32)
            && d.get("positions").is_some_and(|p| p.is_contiguous())
            && all_f32(d, &["inv_freq"])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let (s, rot) = Self::shape(d, i)?;
        for name in ["cos", "sin"] {
            ensure_out(
                &self.0,
                d.require_mut("RotaryTables", name)?,
                DataType::F32,
                &[s, rot / 2],
            )?;
        }
        Ok(())
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let (s, rot) = Self::shape(d, i)?;
        if s == 0 {
            return Ok(());
        }
        let pos = dptr(d.require("RotaryTables", "positions")?, "positions")?;
        let inv = match d.get("inv_freq") {
            Some(t) => dptr(t, "inv_freq")?,
            None => 0,
        };
        let cp = dptr(d.require("RotaryTables", "cos")?, "cos")?;
        let sp = dptr(d.require("RotaryTables", "sin")?, "sin")?;
        self.0.launch(
            "rotary_tables_f32",
            Gpu::grid_for(s * (rot / 2), 256),
            256,
            &[
                KArg::Ptr(pos),
                KArg::Ptr(inv),
                int(s, "rows")?,
                int(rot, "rotary_dim")?,
                KArg::F32(f.get_or("theta", 10000.0)),
                KArg::I32((inv != 0) as i32),
                KArg::Ptr(cp),
                KArg::Ptr(sp),
            ],
        )
    }
}

struct Rotary(Arc<Gpu>);

impl Rotary {
    /// (s, heads, hd, rot) after validating the arguments.
    fn shape(d: &DataDict, i: &IntDict) -> Result<(usize, usize, usize, usize)> {
        let x = d.require("RotaryEmbedding", "input")?;
        let (s, heads, hd) = match x.dims() {
            [s, h, hd] => (*s, *h, *hd),
            other => {
                return Err(op_err(
                    "RotaryEmbedding",
                    format!("input {other:?} must be [s, heads, hd]"),
                ))
            }
        };
        let rot = i.get_or("rotary_dim", hd as i32);
        let rot = usize::try_from(rot).unwrap_or(usize::MAX);
        if rot > hd || rot % 2 != 0 {
            return Err(op_err(
                "RotaryEmbedding",
                format!("rotary_dim {rot} must be even and ≤ head dim {hd}"),
            ));
        }
        let tables = d.get("cos").is_some() && d.get("sin").is_some();
        match d.get("positions") {
            Some(pos) if pos.count() != s => {
                return Err(op_err(
                    "RotaryEmbedding",
                    format!("positions {:?} must have {s} entries", pos.dims()),
                ))
            }
            None if !tables => return Err(op_err("RotaryEmbedding", "missing input 'positions'")),
            _ => {}
        }
        if let Some(f) = d.get("inv_freq") {
            if f.count() < rot / 2 {
                return Err(op_err(
                    "RotaryEmbedding",
                    format!("inv_freq {:?} needs {} entries", f.dims(), rot / 2),
                ));
            }
        }
        match (d.get("cos"), d.get("sin")) {
            (Some(c), Some(sn)) => {
                if c.count() < s * (rot / 2) || sn.count() < s * (rot / 2) {
                    return Err(op_err(
                        "RotaryEmbedding",
                        format!("cos/sin tables must be [{s}, {}]", rot / 2),
                    ));
                }
            }
            (None, None) => {}
            _ => {
                return Err(op_err(
                    "RotaryEmbedding",
                    "give both 'cos' and 'sin' or neither",
                ))
            }
        }
        if let Some(x1) = d.get("input1") {
            let ok = x1.dtype() == DataType::F32
                && x1.is_contiguous()
                && x1.dims().len() == 3
                && x1.dim(0) == s
                && x1.dim(2) == hd;
            if !ok {
                return Err(op_err(
                    "RotaryEmbedding",
                    format!(
                        "input1 {} {:?} must be F32 [{s}, heads, {hd}]",
                        x1.dtype(),
                        x1.dims()
                    ),
                ));
            }
        }
        Ok((s, heads, hd, rot))
    }
}

impl Operator for Rotary {
    fn can_run(&self, d: &DataDict, _: &FloatDict, i: &IntDict) -> bool {
        d.dtype("input") == Some(DataType::F32)
            && (d.dtype("positions") == Some(DataType::I32)
                || (d.get("cos").is_some() && d.get("positions").is_none()))
            && all_f32(d, &["inv_freq", "cos", "sin"])
            && d.get("input").is_some_and(|x| x.is_contiguous())
            && matches!(i.get_or("style", 0), 0 | 1)
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        Self::shape(d, i)?;
        if d.contains("input1") {
            d.require_mut("RotaryEmbedding", "input1")?;
        }
        d.require_mut("RotaryEmbedding", "input").map(|_| ())
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let (s, heads, hd, rot) = Self::shape(d, i)?;
        let (x1p, heads1) = match d.get("input1") {
            Some(x1) => (dptr(x1, "input1")?, x1.dim(1)),
            None => (0, 0),
        };
        let ([pos, inv, cs, sn], x) = d.io(
            "RotaryEmbedding",
            ["positions", "inv_freq", "cos", "sin"],
            "input",
        )?;
        let opt = |t: Option<&crate::data::Data>, n: &str| {
            t.map(|t| dptr(t, n)).transpose().map(|p| p.unwrap_or(0))
        };
        let (ip, cp, spp) = (opt(inv, "inv_freq")?, opt(cs, "cos")?, opt(sn, "sin")?);
        let mode = if cp != 0 {
            2
        } else if ip != 0 {
            1
        } else {
            0
        };
        // one thread per (row, group of ROPE_HEADS heads, pair): see kernels/rope.cu
        const ROPE_HEADS: usize = 8;
        let n = s * (heads + heads1).div_ceil(ROPE_HEADS) * (rot / 2);
        self.0.launch(
            "rotary_f32",
            Gpu::grid_for(n, 256),
            256,
            &[
                KArg::Ptr(dptr(x, "input")?),
                KArg::Ptr(opt(pos, "positions")?),
                KArg::Ptr(ip),
                KArg::Ptr(cp),
                KArg::Ptr(spp),
                int(s, "rows")?,
                int(heads, "heads")?,
                int(hd, "head dim")?,
                int(rot, "rotary_dim")?,
                KArg::I32(i.get_or("style", 0)),
                KArg::F32(f.get_or("theta", 10000.0)),
                KArg::I32(mode),
                KArg::Ptr(x1p),
                int(heads1, "input1 heads")?,
            ],
        )
    }
}
