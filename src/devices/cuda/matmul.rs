//! `MatMul` and `MatMulTransB` on the GPU (f32, batched, through cuBLAS without TF32, so the
//! products keep f32 precision): `output[.., m, n] = alpha · input0[.., m, k] · B` with
//! `input1` [.., k, n] (`MatMul`) or [.., n, k] (`MatMulTransB`, B = input1ᵀ). Leading dims equal,
//! or `input1` 2-D and broadcast over every batch. Latent attention's per-head products run here.
//! Where cuBLAS is not loaded the ops are not offered (the CPU device runs them).

use super::blas::{gemm, Elem, Gemm, Operand};
use super::buffer::{dptr, ensure_out};
use super::gpu::Gpu;
use super::op_err;
use crate::data::DataType;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use std::sync::Arc;

/// Registers `MatMul` and `MatMulTransB`.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    for trans_b in [false, true] {
        ops.insert(
            name(trans_b),
            Box::new(MatMul {
                gpu: gpu.clone(),
                trans_b,
            }),
        );
    }
}

fn name(trans_b: bool) -> &'static str {
    if trans_b {
        "MatMulTransB"
    } else {
        "MatMul"
    }
}

struct MatMul {
    gpu: Arc<Gpu>,
    trans_b: bool,
}

/// The sizes of one batched product.
struct Shape {
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    broadcast_b: bool,
    out: Vec<usize>,
}

impl MatMul {
    fn shape(&self, d: &DataDict) -> Result<Shape> {
        let op = name(self.trans_b);
        let (ad, bd) = (
            d.require(op, "input0")?.dims(),
            d.require(op, "input1")?.dims(),
        );
        let bad = || {
            op_err(
                op,
                format!(
                    "input0 {ad:?} and input1 {bd:?} do not multiply (need [.., m, k] and {})",
                    if self.trans_b {
                        "[.., n, k]"
                    } else {
                        "[.., k, n]"
                    }
                ),
            )
        };
        if ad.len() < 2 || bd.len() < 2 {
            return Err(bad());
        }
        let (m, k) = (ad[ad.len() - 2], ad[ad.len() - 1]);
        let (kb, n) = if self.trans_b {
            (bd[bd.len() - 1], bd[bd.len() - 2])
        } else {
            (bd[bd.len() - 2], bd[bd.len() - 1])
        };
        let lead = &ad[..ad.len() - 2];
        let broadcast_b = bd.len() == 2 && ad.len() > 2;
        if kb != k || (!broadcast_b && lead != &bd[..bd.len() - 2]) {
            return Err(bad());
        }
        let mut out = lead.to_vec();
        out.extend([m, n]);
        Ok(Shape {
            batch: lead.iter().product(),
            m,
            k,
            n,
            broadcast_b,
            out,
        })
    }
}

impl Operator for MatMul {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        let ok = |n: &str| {
            d.get(n)
                .is_some_and(|x| x.dtype() == DataType::F32 && x.is_contiguous())
        };
        // (k = 0 is left to the CPU device, which writes the zeros)
        self.gpu.blas().is_some()
            && ok("input0")
            && ok("input1")
            && d.get("input0").is_some_and(|x| x.dim(-1) > 0)
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let s = self.shape(d)?;
        let op = name(self.trans_b);
        ensure_out(
            &self.gpu,
            d.require_mut(op, "output")?,
            DataType::F32,
            &s.out,
        )
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        let op = name(self.trans_b);
        let s = self.shape(d)?;
        let ([a, b], c) = d.io(op, ["input0", "input1"], "output")?;
        let a = a.ok_or_else(|| op_err(op, "missing input 'input0'"))?;
        let b = b.ok_or_else(|| op_err(op, "missing input 'input1'"))?;
        let f32op = |ptr, ld, stride| Operand {
            ptr,
            elem: Elem::F32,
            ld,
            stride,
        };
        // row-major C = A·op(B) is column-major Cᵀ = op(B)ᵀ·Aᵀ: cuBLAS's A is B, its B is A
        let b_stride = if s.broadcast_b { 0 } else { s.k * s.n };
        let g = Gemm {
            ta: self.trans_b,
            tb: false,
            m: s.n,
            n: s.m,
            k: s.k,
            a: f32op(
                dptr(b, "input1")?,
                if self.trans_b { s.k } else { s.n },
                b_stride,
            ),
            b: f32op(dptr(a, "input0")?, s.k, s.m * s.k),
            c: f32op(dptr(c, "output")?, s.n, s.m * s.n),
            batch: s.batch,
            alpha: f.get_or("alpha", 1.0),
            beta: 0.0,
            tf32: false,
        };
        if !gemm(&self.gpu, &g)? {
            return Err(op_err(op, "cuBLAS is not loaded"));
        }
        Ok(())
    }
}
