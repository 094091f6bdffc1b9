//! `Attention` on the GPU (f32): one block per (query, head) with an online softmax over key
//! chunks (kernels/attention.cu); causal mask, sliding window, GQA, ALiBi and soft-capping.
//! `k`/`v` may be KV caches expanded on axis 0.
//!
//! Prefill with `fast = 1` (the `fast` precision) and at least [`TC_MIN_QUERIES`] queries goes
//! through cuBLAS instead: per chunk of queries, scores = q·kᵀ·scale (TF32 tensor cores,
//! strided-batched over the KV heads, once per query head of a GQA group) into a scratch
//! buffer, `attn_softmax_f32` turns them into probabilities in place (mask, window, ALiBi,
//! soft-capping), and out = p·v (TF32) is written straight into `[sq, nh, hdv]`. The scores are
//! materialised (at most [`SCORE_BYTES`] per chunk), so this is not a fused flash kernel.

use super::blas::{gemm, Elem, Gemm, Operand};
use super::buffer::{dptr, ensure_out, CudaBuffer};
use super::gpu::{int, long, Gpu, KArg};
use super::{all_f32, op_err};
use crate::data::DataType;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex};

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    ops.insert(
        "Attention",
        Box::new(Attention(gpu.clone(), Mutex::new(None))),
    );
}

/// Largest q/k head size (`qs[1024]` in the kernel).
const MAX_HD: usize = 1024;
/// Largest v head size (`ATT_THREADS * ATT_DPT`).
const MAX_HDV: usize = 512;

/// From this many queries on, `fast = 1` attention uses the cuBLAS path.
pub const TC_MIN_QUERIES: usize = 64;
/// Most bytes of scores materialised at once (the query chunk is sized to fit).
const SCORE_BYTES: usize = 256 << 20;

/// The device and the score scratch of the cuBLAS path.
struct Attention(Arc<Gpu>, Mutex<Option<CudaBuffer>>);

/// Pointers and sizes of one attention call, for the cuBLAS path.
struct TcArgs {
    q: u64,
    k: u64,
    v: u64,
    slopes: u64,
    out: u64,
    sq: usize,
    skv: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    hdv: usize,
    scale: f32,
    softcap: f32,
    causal: bool,
    window: i32,
}

impl Attention {
    /// The cuBLAS path (module doc). `Ok(false)` when cuBLAS is not loaded.
    fn tensor_core(&self, a: &TcArgs) -> Result<bool> {
        if self.0.blas().is_none() {
            return Ok(false);
        }
        let group = a.nh / a.nkv;
        let row_bytes = a.nh * a.skv * 4;
        let qc = (SCORE_BYTES / row_bytes.max(1)).clamp(1, a.sq);
        let mut guard = self
            .1
            .lock()
            .map_err(|_| Error::Device("Attention scratch poisoned".into()))?;
        let need = qc * row_bytes;
        if guard.as_ref().is_none_or(|b| b.len_bytes() < need) {
            *guard = None;
            *guard = Some(CudaBuffer::zeroed(&self.0, need)?);
        }
        let sp = guard.as_ref().map(|b| b.ptr()).unwrap_or(0);
        let f32op = |ptr: u64, ld: usize, stride: usize| Operand {
            ptr,
            elem: Elem::F32,
            ld,
            stride,
        };
        let mut i0 = 0;
        while i0 < a.sq {
            let n = qc.min(a.sq - i0);
            // keys any query of this chunk can see
            let kend = if a.causal {
                (a.skv + i0 + n).saturating_sub(a.sq).min(a.skv)
            } else {
                a.skv
            };
            for g in 0..group {
                // scoresᵀ (column-major [kend, n], ld skv) = K_h · Q_hᵀ for heads h = kh·group + g
                let ok = gemm(
                    &self.0,
                    &Gemm {
                        ta: true,
                        tb: false,
                        m: kend,
                        n,
                        k: a.hd,
                        a: f32op(a.k, a.nkv * a.hd, a.hd),
                        b: f32op(
                            a.q + 4 * ((i0 * a.nh + g) * a.hd) as u64,
                            a.nh * a.hd,
                            group * a.hd,
                        ),
                        c: f32op(sp + 4 * (g * n * a.skv) as u64, a.skv, group * n * a.skv),
                        batch: a.nkv,
                        alpha: a.scale,
                        tf32: true,
                    },
                )?;
                if !ok {
                    return Ok(false);
                }
            }
            if kend > 0 {
                self.0.launch(
                    "attn_softmax_f32",
                    (
                        u32::try_from(n).map_err(|_| op_err("Attention", "too many queries"))?,
                        u32::try_from(a.nh).map_err(|_| op_err("Attention", "too many heads"))?,
                        1,
                    ),
                    256,
                    &[
                        KArg::Ptr(sp),
                        KArg::Ptr(a.slopes),
                        int(n, "chunk")?,
                        int(i0, "chunk start")?,
                        int(a.sq, "sq")?,
                        int(a.skv, "skv")?,
                        long(a.skv, "score row")?,
                        int(kend, "keys")?,
                        KArg::F32(a.softcap),
                        KArg::I32(a.causal as i32),
                        KArg::I32(a.window),
                    ],
                )?;
            }
            for g in 0..group {
                // outᵀ (column-major [hdv, n], ld nh·hdv) = V_hᵀ · P_hᵀ
                let ok = gemm(
                    &self.0,
                    &Gemm {
                        ta: false,
                        tb: false,
                        m: a.hdv,
                        n,
                        k: kend,
                        a: f32op(a.v, a.nkv * a.hdv, a.hdv),
                        b: f32op(sp + 4 * (g * n * a.skv) as u64, a.skv, group * n * a.skv),
                        c: f32op(
                            a.out + 4 * ((i0 * a.nh + g) * a.hdv) as u64,
                            a.nh * a.hdv,
                            group * a.hdv,
                        ),
                        batch: a.nkv,
                        alpha: 1.0,
                        tf32: true,
                    },
                )?;
                if !ok {
                    return Ok(false);
                }
            }
            i0 += n;
        }
        Ok(true)
    }
}

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
        let causal = i.get_or("causal", 1);
        let (qp, kp, vp, op) = (
            dptr(q, "q")?,
            dptr(k, "k")?,
            dptr(v, "v")?,
            dptr(out, "output")?,
        );
        // Causal with fewer keys than queries leaves early queries without keys: the kernel
        // below handles that (zeros), the cuBLAS path needs every chunk to see a key.
        if i.get_or("fast", 0) != 0 && sq >= TC_MIN_QUERIES && skv > 0 && (causal == 0 || skv >= sq)
        {
            let args = TcArgs {
                q: qp,
                k: kp,
                v: vp,
                slopes: sp,
                out: op,
                sq,
                skv,
                nh,
                nkv,
                hd,
                hdv,
                scale,
                softcap: f.get_or("softcap", 0.0),
                causal: causal != 0,
                window,
            };
            if self.tensor_core(&args)? {
                return Ok(());
            }
        }
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
                KArg::Ptr(qp),
                KArg::Ptr(kp),
                KArg::Ptr(vp),
                KArg::Ptr(sp),
                KArg::Ptr(op),
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
                KArg::I32(causal),
                KArg::I32(window),
            ],
        )
    }
}
