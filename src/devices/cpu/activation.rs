//! Activation operators on the CPU: `Softmax`, `Silu`, `Gelu`, `SoftCap` (same shape out) and the
//! gated `Swiglu`, `GeluGated` (`[.., 2d]` → `[.., d]`), `SiluMul` (`silu(input0) · input1`, one
//! shape: the fused `Silu` + `MulTo` of a step's pass), and `ClampedSwiglu` (GPT-OSS: gate
//! `input0` and up `input1` of one shape, floats `alpha` and `limit`). Validates, sizes the output and calls
//! `fastllm_cpu::activation` (reference or fast by kernel mode). Must not hold kernel arithmetic.

use super::args::{check_tensor, dtype_in, f32s, f32s_mut, need, rows_last};
use super::CpuContext;
use crate::data::DataType::F32;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::activation::{self as k, Act, GluClamp};
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert(CLAMPED, Box::new(ClampedSwiglu(ctx.clone())));
    ops.insert(SILU_MUL, Box::new(SiluMul(ctx.clone())));
    for kind in [
        Kind::Softmax,
        Kind::Silu,
        Kind::Gelu,
        Kind::SoftCap,
        Kind::Swiglu,
        Kind::GeluGated,
    ] {
        ops.insert(
            kind.name(),
            Box::new(Activation {
                ctx: ctx.clone(),
                kind,
            }),
        );
    }
}

/// Which activation operator.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Softmax,
    Silu,
    Gelu,
    SoftCap,
    Swiglu,
    GeluGated,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Softmax => "Softmax",
            Kind::Silu => "Silu",
            Kind::Gelu => "Gelu",
            Kind::SoftCap => "SoftCap",
            Kind::Swiglu => "Swiglu",
            Kind::GeluGated => "GeluGated",
        }
    }
    fn gated(self) -> bool {
        matches!(self, Kind::Swiglu | Kind::GeluGated)
    }
    /// The pointwise function, from the parameters.
    fn act(self, f: &FloatDict, i: &IntDict) -> Result<Act> {
        let gelu = |i: &IntDict| match i.get_or("approx", 1) {
            1 => Ok(Act::GeluTanh),
            0 => Ok(Act::GeluErf),
            a => Err(Error::op(
                self.name(),
                format!("parameter 'approx' must be 0 or 1, got {a}"),
            )),
        };
        match self {
            Kind::Silu | Kind::Swiglu | Kind::Softmax => Ok(Act::Silu),
            Kind::Gelu | Kind::GeluGated => gelu(i),
            Kind::SoftCap => match f.get("cap") {
                Some(c) if c > 0.0 && c.is_finite() => Ok(Act::SoftCap(c)),
                Some(c) => Err(Error::op(
                    "SoftCap",
                    format!("parameter 'cap' must be a positive number, got {c}"),
                )),
                None => Err(Error::op("SoftCap", "missing parameter 'cap'")),
            },
        }
    }
}

/// One activation operator.
struct Activation {
    ctx: Arc<CpuContext>,
    kind: Kind,
}

impl Operator for Activation {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let op = self.kind.name();
        self.kind.act(f, i)?;
        let x = d.require(op, "input")?;
        check_tensor(op, "input", x)?;
        f32s(op, "input", x)?;
        let mut dims = x.dims().to_vec();
        if self.kind.gated() {
            let (_, n) = rows_last(&dims);
            if !n.is_multiple_of(2) {
                return Err(Error::op(
                    op,
                    format!("'input' {dims:?}: last dim must be even (gate and up halves)"),
                ));
            }
            if let Some(l) = dims.last_mut() {
                *l = n / 2;
            }
        }
        d.require_mut(op, "output")?.resize(F32, &dims)
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let op = self.kind.name();
        let act = self.kind.act(f, i)?;
        let ([x], out) = d.io(op, ["input"], "output")?;
        let x = need(op, "input", x)?;
        let n = rows_last(x.dims()).1;
        let x = f32s(op, "input", x)?;
        let o = f32s_mut(op, "output", out)?;
        let th = &self.ctx.threads;
        match (self.kind, self.ctx.reference()) {
            (Kind::Softmax, true) => k::softmax_ref(x, o, n),
            (Kind::Softmax, false) => k::softmax(th, x, o, n),
            (kind, true) if kind.gated() => k::gated_ref(act, x, o, n / 2),
            (kind, false) if kind.gated() => k::gated(th, act, x, o, n / 2),
            (_, true) => k::act_map_ref(act, x, o),
            (_, false) => k::act_map(th, act, x, o),
        }
        Ok(())
    }
}

const CLAMPED: &str = "ClampedSwiglu";

/// The shape of the gate `input0` and up `input1` of `op` (valid f32 tensors of one shape).
fn gate_up_dims(op: &str, d: &DataDict) -> Result<Vec<usize>> {
    let g = d.require(op, "input0")?;
    let u = d.require(op, "input1")?;
    for (n, t) in [("input0", g), ("input1", u)] {
        check_tensor(op, n, t)?;
        f32s(op, n, t)?;
    }
    if g.dims() != u.dims() {
        return Err(Error::op(
            op,
            format!(
                "gate {:?} and up {:?} must have one shape",
                g.dims(),
                u.dims()
            ),
        ));
    }
    Ok(g.dims().to_vec())
}

/// The `alpha` and `limit` of a `ClampedSwiglu` call (both finite, `limit` > 0).
fn glu_clamp(f: &FloatDict) -> Result<GluClamp> {
    let (alpha, limit) = match (f.get("alpha"), f.get("limit")) {
        (Some(a), Some(l)) => (a, l),
        _ => return Err(Error::op(CLAMPED, "needs parameters 'alpha' and 'limit'")),
    };
    if !alpha.is_finite() || !limit.is_finite() || limit <= 0.0 {
        return Err(Error::op(
            CLAMPED,
            format!("parameters alpha {alpha} / limit {limit} must be finite, limit > 0"),
        ));
    }
    Ok(GluClamp { alpha, limit })
}

/// `ClampedSwiglu`: `output = (clamp(input1, −limit, limit) + 1) · g·σ(alpha·g)` with
/// `g = min(input0, limit)`.
struct ClampedSwiglu(Arc<CpuContext>);

impl Operator for ClampedSwiglu {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input0", &[F32]) && dtype_in(d, "input1", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        glu_clamp(f)?;
        let dims = gate_up_dims(CLAMPED, d)?;
        d.require_mut(CLAMPED, "output")?.resize(F32, &dims)
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        let c = glu_clamp(f)?;
        let ([g, u], out) = d.io(CLAMPED, ["input0", "input1"], "output")?;
        let g = f32s(CLAMPED, "input0", need(CLAMPED, "input0", g)?)?;
        let u = f32s(CLAMPED, "input1", need(CLAMPED, "input1", u)?)?;
        let o = f32s_mut(CLAMPED, "output", out)?;
        if self.0.reference() {
            k::clamped_swiglu_ref(g, u, o, c);
        } else {
            k::clamped_swiglu(&self.0.threads, g, u, o, c);
        }
        Ok(())
    }
}

const SILU_MUL: &str = "SiluMul";

/// `SiluMul`: `output = silu(input0) · input1` over two inputs of one shape (what `Silu` then
/// `MulTo` compute, bit for bit). `quantize_output` must be 0: the CPU keeps no output copies.
struct SiluMul(Arc<CpuContext>);

impl SiluMul {
    /// Validates the arguments; returns the shape.
    fn dims(d: &DataDict, i: &IntDict) -> Result<Vec<usize>> {
        if i.get_or("quantize_output", 0) != 0 {
            return Err(Error::op(
                SILU_MUL,
                "quantize_output is not supported on the CPU (must be 0)",
            ));
        }
        gate_up_dims(SILU_MUL, d)
    }
}

impl Operator for SiluMul {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        dtype_in(d, "input0", &[F32]) && dtype_in(d, "input1", &[F32])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let dims = Self::dims(d, i)?;
        d.require_mut(SILU_MUL, "output")?.resize(F32, &dims)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        Self::dims(d, i)?;
        let ([g, u], out) = d.io(SILU_MUL, ["input0", "input1"], "output")?;
        let g = f32s(SILU_MUL, "input0", need(SILU_MUL, "input0", g)?)?;
        let u = f32s(SILU_MUL, "input1", need(SILU_MUL, "input1", u)?)?;
        let o = f32s_mut(SILU_MUL, "output", out)?;
        if self.0.reference() {
            k::silu_mul_ref(g, u, o);
        } else {
            k::silu_mul(&self.0.threads, g, u, o);
        }
        Ok(())
    }
}
