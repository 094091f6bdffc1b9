//! The `Attention` operator on the CPU: validates `q [sq, nh, hd]`, `k [skv, nkv, hd]`,
//! `v [skv, nkv, hdv]` (K/V may be caches expanded on axis 0), optional ALiBi `alibi_slopes [nh]`,
//! and the parameters; sizes `output [sq, nh, hdv]`; calls `fastllm_cpu::attention`. Must not hold
//! kernel arithmetic.

use super::args::{check_tensor, check_vec, dtype_in, f32s, f32s_mut, need, non_neg};
use super::CpuContext;
use crate::data::{Data, DataType::F32};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::attention::{self as k, AttnParams};
use std::sync::Arc;

const OP: &str = "Attention";

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert(OP, Box::new(Attention(ctx.clone())));
}

fn three_d<'a>(name: &str, x: &'a Data) -> Result<&'a [usize]> {
    check_tensor(OP, name, x)?;
    if x.dims().len() != 3 {
        return Err(Error::op(
            OP,
            format!("'{name}' must be 3-D, got {:?}", x.dims()),
        ));
    }
    f32s(OP, name, x)?;
    Ok(x.dims())
}

/// Validates every argument and returns the call's parameters.
fn params(d: &DataDict, f: &FloatDict, i: &IntDict) -> Result<AttnParams> {
    let q = three_d("q", d.require(OP, "q")?)?;
    let kd = three_d("k", d.require(OP, "k")?)?;
    let vd = three_d("v", d.require(OP, "v")?)?;
    let (sq, nh, hd) = (q[0], q[1], q[2]);
    let (skv, nkv) = (kd[0], kd[1]);
    if kd[2] != hd || vd[0] != skv || vd[1] != nkv {
        return Err(Error::op(
            OP,
            format!(
                "q {q:?}, k {kd:?}, v {vd:?}: k must be [skv, nkv, hd of q] and v [skv, nkv, hdv]"
            ),
        ));
    }
    if hd == 0 || nkv == 0 || nh == 0 {
        return Err(Error::op(
            OP,
            format!("q {q:?}, k {kd:?}: head counts and head size must be > 0"),
        ));
    }
    if !nh.is_multiple_of(nkv) {
        return Err(Error::op(
            OP,
            format!("{nh} query heads (q {q:?}) are not a multiple of {nkv} KV heads (k {kd:?})"),
        ));
    }
    check_vec(OP, "alibi_slopes", d.get("alibi_slopes"), nh)?;
    let causal = match i.get_or("causal", 1) {
        0 => false,
        1 => true,
        c => {
            return Err(Error::op(
                OP,
                format!("parameter 'causal' must be 0 or 1, got {c}"),
            ))
        }
    };
    if causal && skv < sq {
        return Err(Error::op(
            OP,
            format!("causal attention needs skv ≥ sq (q {q:?}, k {kd:?})"),
        ));
    }
    let window = non_neg(OP, "sliding_window", i.get_or("sliding_window", 0))?;
    let scale = f.get_or("scale", 1.0 / (hd as f32).sqrt());
    let softcap = f.get_or("softcap", 0.0);
    if !scale.is_finite() || !softcap.is_finite() || softcap < 0.0 {
        return Err(Error::op(
            OP,
            format!("parameters scale {scale} / softcap {softcap} must be finite, softcap ≥ 0"),
        ));
    }
    Ok(AttnParams {
        sq,
        skv,
        nh,
        nkv,
        hd,
        hdv: vd[2],
        scale,
        softcap,
        causal,
        window,
    })
}

/// `Attention`: causal / windowed / GQA / ALiBi / soft-capped scaled dot-product attention.
struct Attention(Arc<CpuContext>);

impl Operator for Attention {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        ["q", "k", "v", "alibi_slopes"]
            .iter()
            .all(|n| dtype_in(d, n, &[F32]))
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let p = params(d, f, i)?;
        d.require_mut(OP, "output")?
            .resize(F32, &[p.sq, p.nh, p.hdv])
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let p = params(d, f, i)?;
        let ([q, kk, v, s], out) = d.io(OP, ["q", "k", "v", "alibi_slopes"], "output")?;
        let q = f32s(OP, "q", need(OP, "q", q)?)?;
        let kk = f32s(OP, "k", need(OP, "k", kk)?)?;
        let v = f32s(OP, "v", need(OP, "v", v)?)?;
        let s = match s {
            Some(s) => Some(f32s(OP, "alibi_slopes", s)?),
            None => None,
        };
        let o = f32s_mut(OP, "output", out)?;
        if self.0.reference() {
            k::attention_ref(q, kk, v, s, o, &p);
        } else {
            k::attention(&self.0.threads, q, kk, v, s, o, &p);
        }
        Ok(())
    }
}
