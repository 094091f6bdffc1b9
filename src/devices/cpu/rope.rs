//! The `RotaryEmbedding` operator on the CPU: validates the in-place `input [s, heads, hd]`,
//! `positions`, and the frequency source (`cos`+`sin` tables, `inv_freq`, or `theta`), then calls
//! `fastllm_cpu::rope`; and `RotaryTables`, the `cos`/`sin` tables a step forms once for all its
//! layers' rotations. Must not hold kernel arithmetic.

use super::args::{
    check_dtype, check_tensor, check_vec, dtype_in, f32s, f32s_mut, i32s, need, non_neg,
};
use super::CpuContext;
use crate::data::DataType::{F32, I32};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::rope::{self as k, RopeFreqs, RopeShape, RopeStyle};
use std::sync::Arc;

const OP: &str = "RotaryEmbedding";

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert(OP, Box::new(Rotary(ctx.clone())));
    ops.insert(TABLES, Box::new(RotaryTables));
}

const TABLES: &str = "RotaryTables";

/// `RotaryTables`: `cos`, `sin` [s, rot/2] (F32) of `positions` (I32 [s]) with `inv_freq`
/// [rot/2] or `theta`: the angles a step's rotations share, formed once.
struct RotaryTables;

impl RotaryTables {
    /// (s, rot) after validating the arguments.
    fn shape(d: &DataDict, f: &FloatDict, i: &IntDict) -> Result<(usize, usize)> {
        let p = d.require(TABLES, "positions")?;
        check_tensor(TABLES, "positions", p)?;
        check_dtype(TABLES, "positions", p, I32)?;
        let rot = non_neg(TABLES, "rotary_dim", i.get_or("rotary_dim", 0))?;
        if rot == 0 || !rot.is_multiple_of(2) {
            return Err(Error::op(
                TABLES,
                format!("rotary_dim {rot} must be even and positive"),
            ));
        }
        check_vec(TABLES, "inv_freq", d.get("inv_freq"), rot / 2)?;
        let theta = f.get_or("theta", 10000.0);
        if d.get("inv_freq").is_none() && !(theta.is_finite() && theta > 0.0) {
            return Err(Error::op(
                TABLES,
                format!("parameter 'theta' must be positive, got {theta}"),
            ));
        }
        Ok((p.count(), rot))
    }
}

impl Operator for RotaryTables {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "positions", &[I32]) && dtype_in(d, "inv_freq", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let (s, rot) = Self::shape(d, f, i)?;
        for name in ["cos", "sin"] {
            d.require_mut(TABLES, name)?.resize(F32, &[s, rot / 2])?;
        }
        Ok(())
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let (s, rot) = Self::shape(d, f, i)?;
        let (mut cos, mut sin) = (vec![0f32; s * rot / 2], vec![0f32; s * rot / 2]);
        {
            let positions = i32s(TABLES, "positions", d.require(TABLES, "positions")?)?;
            let freqs = match d.get("inv_freq") {
                Some(v) => RopeFreqs::InvFreq(f32s(TABLES, "inv_freq", v)?),
                None => RopeFreqs::Theta(f.get_or("theta", 10000.0)),
            };
            k::tables(positions, rot, freqs, &mut cos, &mut sin);
        }
        for (name, v) in [("cos", cos), ("sin", sin)] {
            let out = f32s_mut(TABLES, name, d.require_mut(TABLES, name)?)?;
            match out.get_mut(..v.len()) {
                Some(o) => o.copy_from_slice(&v),
                None => return Err(Error::op(TABLES, format!("'{name}' was not sized"))),
            }
        }
        Ok(())
    }
}

/// Validates every argument; returns the shape and style.
fn check(d: &DataDict, f: &FloatDict, i: &IntDict) -> Result<(RopeShape, RopeStyle)> {
    let x = d.require(OP, "input")?;
    check_tensor(OP, "input", x)?;
    check_dtype(OP, "input", x, F32)?;
    let &[s, heads, hd] = x.dims() else {
        return Err(Error::op(
            OP,
            format!("'input' must be [s, heads, hd], got {:?}", x.dims()),
        ));
    };
    let rot = non_neg(OP, "rotary_dim", i.get_or("rotary_dim", hd as i32))?;
    if rot == 0 || !rot.is_multiple_of(2) || rot > hd {
        return Err(Error::op(
            OP,
            format!(
                "rotary_dim {rot} must be even, > 0 and ≤ head size {hd} (input {:?})",
                x.dims()
            ),
        ));
    }
    let style = match i.get_or("style", 0) {
        0 => RopeStyle::Neox,
        1 => RopeStyle::Interleaved,
        v => {
            return Err(Error::op(
                OP,
                format!("parameter 'style' must be 0 (neox) or 1 (interleaved), got {v}"),
            ))
        }
    };
    let half = rot / 2;
    match (d.get("cos"), d.get("sin")) {
        (Some(c), Some(sn)) => {
            for (name, t) in [("cos", c), ("sin", sn)] {
                check_dtype(OP, name, t, F32)?;
                if t.dims() != [s, half] {
                    return Err(Error::op(
                        OP,
                        format!("'{name}' must be [{s}, {half}], got {:?}", t.dims()),
                    ));
                }
            }
        }
        (None, None) => {
            let p = d.require(OP, "positions")?;
            check_dtype(OP, "positions", p, I32)?;
            if p.dims() != [s] {
                return Err(Error::op(
                    OP,
                    format!(
                        "'positions' must be [{s}] (one per row of input {:?}), got {:?}",
                        x.dims(),
                        p.dims()
                    ),
                ));
            }
            check_vec(OP, "inv_freq", d.get("inv_freq"), half)?;
            if d.get("inv_freq").is_none() {
                let theta = f.get_or("theta", 10000.0);
                if !(theta.is_finite() && theta > 0.0) {
                    return Err(Error::op(
                        OP,
                        format!("parameter 'theta' must be positive, got {theta}"),
                    ));
                }
            }
        }
        _ => return Err(Error::op(OP, "'cos' and 'sin' must be given together")),
    }
    Ok((RopeShape { s, heads, hd, rot }, style))
}

/// `RotaryEmbedding`, in place on `input`.
struct Rotary(Arc<CpuContext>);

impl Operator for Rotary {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32])
            && dtype_in(d, "positions", &[I32])
            && ["inv_freq", "cos", "sin"]
                .iter()
                .all(|n| dtype_in(d, n, &[F32]))
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        check(d, f, i).map(|_| ())
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let (sh, style) = check(d, f, i)?;
        let theta = f.get_or("theta", 10000.0);
        let ([pos, inv, cos, sin], x) =
            d.io(OP, ["positions", "inv_freq", "cos", "sin"], "input")?;
        let freqs = match (cos, sin, inv) {
            (Some(c), Some(s), _) => RopeFreqs::CosSin {
                cos: f32s(OP, "cos", c)?,
                sin: f32s(OP, "sin", s)?,
            },
            (_, _, Some(v)) => RopeFreqs::InvFreq(f32s(OP, "inv_freq", v)?),
            _ => RopeFreqs::Theta(theta),
        };
        let positions: &[i32] = match pos {
            Some(p) => i32s(OP, "positions", p)?,
            None => &[],
        };
        if !matches!(freqs, RopeFreqs::CosSin { .. }) {
            need(OP, "positions", pos)?;
        }
        let x = f32s_mut(OP, "input", x)?;
        if self.0.reference() {
            k::rope_ref(x, positions, &sh, style, freqs);
        } else {
            k::rope(&self.0.threads, x, positions, &sh, style, freqs);
        }
        Ok(())
    }
}
