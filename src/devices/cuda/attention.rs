//! `Attention` on the GPU (f32): one block per (query, head) with an online softmax over key
//! chunks (kernels/attention.cu); causal mask, sliding window, GQA, ALiBi and soft-capping.
//! `k`/`v` may be KV caches expanded on axis 0.

use super::buffer::{dptr, ensure_out};
use super::gpu::{int, long, Gpu, KArg};
use super::{all_f32, op_err};
use crate::data::DataType;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    ops.insert("Attention", Box::new(Attention(gpu.clone())));
}

/// Largest q/k head size (`qs[1024]` in the kernel).
const MAX_HD: usize = 1024;
/// Largest v head size (`ATT_THREADS * ATT_DPT`).
const MAX_HDV: usize = 512;

struct Attention(Arc<Gpu>);

fn dims3(d: &crate::data::Data, name: &str) -> Result<[usize; 3]> {
    match d.dims() {
        [a, b, c] => Ok([*a, *b, *c]),
        other => Err(op_err("Attention", format!("{name} {other:?} must be 3-D"))),
    }
}

impl Operator for Attention {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        let shapes_ok = match (d.get("q"), d.get("k"), d.get("v")) {
            (Some(q), Some(k), Some(v)) => {
                q.is_contiguous()
                    && k.is_contiguous()
                    && v.is_contiguous()
                    && q.dim(-1) <= MAX_HD
                    && v.dim(-1) <= MAX_HDV
            }
            _ => false,
        };
        shapes_ok && all_f32(d, &["q", "k", "v", "alibi_slopes"])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let [sq, nh, hd] = dims3(d.require("Attention", "q")?, "q")?;
        let [skv, nkv, hdk] = dims3(d.require("Attention", "k")?, "k")?;
        let [skv2, nkv2, hdv] = dims3(d.require("Attention", "v")?, "v")?;
        if hdk != hd || skv2 != skv || nkv2 != nkv || nkv == 0 || nh % nkv != 0 {
            return Err(op_err(
                "Attention",
                format!("q [{sq}, {nh}, {hd}], k [{skv}, {nkv}, {hdk}], v [{skv2}, {nkv2}, {hdv}] do not match"),
            ));
        }
        if let Some(s) = d.get("alibi_slopes") {
            if s.count() != nh {
                return Err(op_err(
                    "Attention",
                    format!("alibi_slopes {:?} must have {nh} entries", s.dims()),
                ));
            }
        }
        ensure_out(
            &self.0,
            d.require_mut("Attention", "output")?,
            DataType::F32,
            &[sq, nh, hdv],
        )
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let ([q, k, v, s], out) = d.io("Attention", ["q", "k", "v", "alibi_slopes"], "output")?;
        let q = q.ok_or_else(|| op_err("Attention", "missing input 'q'"))?;
        let k = k.ok_or_else(|| op_err("Attention", "missing input 'k'"))?;
        let v = v.ok_or_else(|| op_err("Attention", "missing input 'v'"))?;
        let [sq, nh, hd] = dims3(q, "q")?;
        let [skv, nkv, _] = dims3(k, "k")?;
        let hdv = v.dim(-1);
        let sp = match s {
            Some(s) => dptr(s, "alibi_slopes")?,
            None => 0,
        };
        let scale = f.get_or("scale", 1.0 / (hd.max(1) as f32).sqrt());
        let window = i.get_or("sliding_window", 0).max(0);
        let gx = u32::try_from(sq).map_err(|_| op_err("Attention", "too many queries"))?;
        let gy = u32::try_from(nh)
            .ok()
            .filter(|&h| h <= 65535)
            .ok_or_else(|| op_err("Attention", "too many heads"))?;
        self.0.launch(
            "attention_f32",
            (gx, gy, 1),
            128,
            &[
                KArg::Ptr(dptr(q, "q")?),
                KArg::Ptr(dptr(k, "k")?),
                KArg::Ptr(dptr(v, "v")?),
                KArg::Ptr(sp),
                KArg::Ptr(dptr(out, "output")?),
                int(sq, "sq")?,
                int(skv, "skv")?,
                int(nh, "heads")?,
                int(nkv, "kv heads")?,
                int(hd, "head dim")?,
                int(hdv, "v head dim")?,
                long(nkv * hd, "k row")?,
                long(nkv * hdv, "v row")?,
                KArg::F32(scale),
                KArg::F32(f.get_or("softcap", 0.0)),
                KArg::I32(i.get_or("causal", 1)),
                KArg::I32(window),
            ],
        )
    }
}
