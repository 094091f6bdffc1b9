//! `Linear` on the GPU: `y = x·Wᵀ + b` with f32 activations. F32 weights with several rows go
//! through cuBLAS SGEMM (when cuBLAS loads); every other case (decode rows, F16/BF16 and the
//! Q8_0/Q4_0/Q4_1 block weights) runs the `linear_{dtype}` kernels, which dequantize in
//! registers. With `quant_act = 1` and a block weight, activation rows are first quantized to
//! Q8_0 (bit-identical to the CPU reference) and dotted in integers (`linear_q8act_{dtype}`).

use super::buffer::CudaBuffer;
use super::buffer::{dptr, ensure_out};
use super::embedding::weight_suffix;
use super::gpu::{int, long, Gpu, KArg};
use super::op_err;
use crate::data::DataType;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex};

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    ops.insert(
        "Linear",
        Box::new(Linear {
            gpu: gpu.clone(),
            scratch: Mutex::new(None),
        }),
    );
}

/// Activation rows per block of the `linear_*` kernels (`LIN_ROWS` in kernels/linear.cu).
const LIN_ROWS: usize = 4;
/// Output features per block (warps per 256-thread block).
const LIN_FEATURES: usize = 8;
/// From this many rows on, F32 weights use cuBLAS.
const BLAS_MIN_ROWS: usize = 2;

struct Linear {
    gpu: Arc<Gpu>,
    /// Quantized activations for `quant_act = 1`, grown as needed (one stream: reuse is safe).
    scratch: Mutex<Option<CudaBuffer>>,
}

impl Linear {
    fn sgemm(&self, x: u64, w: u64, y: u64, m: usize, n: usize, k: usize) -> Result<bool> {
        let Some(blas) = self.gpu.blas() else {
            return Ok(false);
        };
        let (m, n, k) = match (i32::try_from(m), i32::try_from(n), i32::try_from(k)) {
            (Ok(m), Ok(n), Ok(k)) => (m, n, k),
            _ => return Ok(false),
        };
        let blas = blas
            .lock()
            .map_err(|_| Error::Device("cuBLAS handle poisoned".into()))?;
        self.gpu.bind()?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        use cudarc::cublas::sys::cublasOperation_t as Op;
        // Row-major y[m,n] = x[m,k]·W[n,k]ᵀ is column-major yᵀ[n,m] = W·xᵀ with W read transposed.
        // SAFETY: x, w, y are device buffers of m·k, n·k and m·n floats (checked in reshape).
        unsafe {
            cudarc::cublas::result::sgemm(
                *blas.handle(),
                Op::CUBLAS_OP_T,
                Op::CUBLAS_OP_N,
                n,
                m,
                k,
                &alpha,
                w as *const f32,
                k,
                x as *const f32,
                k,
                &beta,
                y as *mut f32,
                n,
            )
        }
        .map_err(|e| Error::Device(format!("cuBLAS sgemm: {e}")))?;
        Ok(true)
    }
}

impl Operator for Linear {
    fn can_run(&self, d: &DataDict, _: &FloatDict, i: &IntDict) -> bool {
        let w_ok = d.dtype("weight").and_then(weight_suffix).is_some();
        let quant_act =
            i.get_or("quant_act", 0) != 0 && d.dtype("weight").is_some_and(|t| t.is_quantized());
        d.dtype("input") == Some(DataType::F32)
            && w_ok
            && (!quant_act || d.get("input").is_some_and(|x| x.dim(-1) % 32 == 0))
            && d.get("bias").is_none_or(|b| b.dtype() == DataType::F32)
            && d.get("input").is_some_and(|x| x.is_contiguous())
            && d.get("weight").is_some_and(|x| x.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let x = d.require("Linear", "input")?;
        let w = d.require("Linear", "weight")?;
        let k = x.dim(-1);
        if x.dims().is_empty() || w.dims().len() != 2 || w.dim(1) != k {
            return Err(op_err(
                "Linear",
                format!(
                    "input {:?} and weight {:?} do not match (weight must be [n, {k}])",
                    x.dims(),
                    w.dims()
                ),
            ));
        }
        let n = w.dim(0);
        if let Some(b) = d.get("bias") {
            if b.count() != n {
                return Err(op_err(
                    "Linear",
                    format!("bias {:?} does not match {n} outputs", b.dims()),
                ));
            }
        }
        let mut dims = x.dims().to_vec();
        if let Some(l) = dims.last_mut() {
            *l = n;
        }
        ensure_out(
            &self.gpu,
            d.require_mut("Linear", "output")?,
            DataType::F32,
            &dims,
        )
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, ints: &IntDict) -> Result<()> {
        let ([x, w, b], y) = d.io("Linear", ["input", "weight", "bias"], "output")?;
        let x = x.ok_or_else(|| op_err("Linear", "missing input 'input'"))?;
        let w = w.ok_or_else(|| op_err("Linear", "missing input 'weight'"))?;
        let (k, n) = (x.dim(-1), w.dim(0));
        let m = x.count() / k.max(1);
        let (xp, wp, yp) = (dptr(x, "input")?, dptr(w, "weight")?, dptr(y, "output")?);
        let bp = match b {
            Some(b) => dptr(b, "bias")?,
            None => 0,
        };
        if m == 0 || n == 0 {
            return Ok(());
        }
        if w.dtype() == DataType::F32 && m >= BLAS_MIN_ROWS && self.sgemm(xp, wp, yp, m, n, k)? {
            if bp != 0 {
                self.gpu.launch(
                    "addbias_f32",
                    Gpu::grid_for(m * n, 256),
                    256,
                    &[
                        KArg::Ptr(yp),
                        KArg::Ptr(bp),
                        long(m, "rows")?,
                        long(n, "n")?,
                    ],
                )?;
            }
            return Ok(());
        }
        let suffix = weight_suffix(w.dtype()).ok_or_else(|| op_err("Linear", "weight dtype"))?;
        let gx = u32::try_from(n.div_ceil(LIN_FEATURES))
            .map_err(|_| op_err("Linear", "too many outputs"))?;
        let gy =
            u32::try_from(m.div_ceil(LIN_ROWS)).map_err(|_| op_err("Linear", "too many rows"))?;
        if gy > 65535 {
            return Err(op_err(
                "Linear",
                format!("{m} rows exceed this kernel's grid"),
            ));
        }
        let tail = [
            KArg::Ptr(bp),
            KArg::Ptr(yp),
            int(m, "rows")?,
            int(n, "outputs")?,
            int(k, "k")?,
            long(w.dtype().row_bytes(k)?, "row bytes")?,
        ];
        let block = (32 * LIN_FEATURES) as u32;
        if ints.get_or("quant_act", 0) != 0 && w.dtype().is_quantized() {
            if k % 32 != 0 {
                return Err(op_err(
                    "Linear",
                    format!("quant_act needs k % 32 == 0, got {k}"),
                ));
            }
            let nblocks = m * k / 32;
            let need = m * k + nblocks * 8;
            let mut guard = self
                .scratch
                .lock()
                .map_err(|_| Error::Device("Linear scratch poisoned".into()))?;
            if guard.as_ref().is_none_or(|b| b.len_bytes() < need) {
                *guard = Some(CudaBuffer::zeroed(&self.gpu, need.next_power_of_two())?);
            }
            let sp = guard.as_ref().map(|b| b.ptr()).unwrap_or(0);
            let (qs, ds) = (sp, sp + (m * k) as u64);
            self.gpu.launch(
                "quantize_q8_f32",
                Gpu::grid_for(nblocks * 32, 256),
                256,
                &[
                    KArg::Ptr(xp),
                    KArg::Ptr(qs),
                    KArg::Ptr(ds),
                    long(nblocks, "blocks")?,
                ],
            )?;
            let mut args = vec![KArg::Ptr(qs), KArg::Ptr(ds), KArg::Ptr(wp)];
            args.extend(tail);
            return self
                .gpu
                .launch(&format!("linear_q8act_{suffix}"), (gx, gy, 1), block, &args);
        }
        let mut args = vec![KArg::Ptr(xp), KArg::Ptr(wp)];
        args.extend(tail);
        self.gpu
            .launch(&format!("linear_{suffix}"), (gx, gy, 1), block, &args)
    }
}
