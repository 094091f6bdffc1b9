//! The `Attention` operator on the CPU: validates `q [sq, nh, hd]`, `k [skv, nkv, hd]`,
//! `v [skv, nkv, hdv]` (K/V may be caches expanded on axis 0, in f32, f16 or q8_0; a q8_0 cache
//! stores each head row padded to whole blocks of 32, see `super::kv`), optional ALiBi
//! `alibi_slopes [nh]` and attention `sinks [nh]`, and the parameters; sizes `output [sq, nh, hdv]`; calls
//! `fastllm_cpu::attention`. Must not hold kernel arithmetic.

use super::args::{check_tensor, check_vec, dtype_in, f32s, f32s_mut, need, non_neg};
use super::kv::{kv_rows, stored_head_dim, KV_DTYPES};
use super::CpuContext;
use crate::data::{Data, DataType, DataType::F32};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::attention::{self as k, AttnParams, HeadTerms};
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
    if name == "q" {
        f32s(OP, name, x)?;
    } else {
        kv_rows(OP, name, x)?;
    }
    Ok(x.dims())
}

/// The value head size of `v` (`[skv, nkv, stored]`): a q8_0 cache pads rows to whole blocks, so
/// a stored width equal to the padded `hd` means `hd`.
fn value_head_dim(v: &Data, hd: usize) -> usize {
    let stored = v.dims()[2];
    if v.dtype() == F32 || v.dtype() == DataType::F16 {
        stored
    } else if stored_head_dim(v.dtype(), hd) == stored {
        hd
    } else {
        stored
    }
}

/// Validates every argument and returns the call's parameters.
fn params(d: &DataDict, f: &FloatDict, i: &IntDict) -> Result<AttnParams> {
    let q = three_d("q", d.require(OP, "q")?)?;
    let kk = d.require(OP, "k")?;
    let kd = three_d("k", kk)?;
    let v = d.require(OP, "v")?;
    let vd = three_d("v", v)?;
    let (sq, nh, hd) = (q[0], q[1], q[2]);
    let (skv, nkv) = (kd[0], kd[1]);
    if kd[2] != stored_head_dim(kk.dtype(), hd) || vd[0] != skv || vd[1] != nkv {
        return Err(Error::op(
            OP,
            format!(
                "q {q:?}, k {} {kd:?}, v {vd:?}: k must be [skv, nkv, hd of q (q8_0: padded to \
                 32)] and v [skv, nkv, hdv]",
                kk.dtype()
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
    check_vec(OP, "sinks", d.get("sinks"), nh)?;
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
        hdv: value_head_dim(v, hd),
        scale,
        softcap,
        causal,
        window,
    })
}

/// `Attention`: causal / windowed / GQA / ALiBi / soft-capped scaled dot-product attention with
/// optional sinks.
struct Attention(Arc<CpuContext>);

impl Operator for Attention {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        ["q", "alibi_slopes", "sinks"]
            .iter()
            .all(|n| dtype_in(d, n, &[F32]))
            && ["k", "v"].iter().all(|n| dtype_in(d, n, &KV_DTYPES))
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let p = params(d, f, i)?;
        d.require_mut(OP, "output")?
            .resize(F32, &[p.sq, p.nh, p.hdv])
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let p = params(d, f, i)?;
        let names = ["q", "k", "v", "alibi_slopes", "sinks"];
        let ([q, kk, v, s, sk], out) = d.io(OP, names, "output")?;
        let q = f32s(OP, "q", need(OP, "q", q)?)?;
        let kk = kv_rows(OP, "k", need(OP, "k", kk)?)?;
        let v = kv_rows(OP, "v", need(OP, "v", v)?)?;
        let heads = HeadTerms {
            alibi: s.map(|s| f32s(OP, "alibi_slopes", s)).transpose()?,
            sinks: sk.map(|s| f32s(OP, "sinks", s)).transpose()?,
        };
        let o = f32s_mut(OP, "output", out)?;
        if self.0.reference() {
            k::attention_ref_kv(q, kk, v, heads, o, &p);
        } else {
            k::attention_kv(&self.0.threads, q, kk, v, heads, o, &p);
        }
        Ok(())
    }
}
