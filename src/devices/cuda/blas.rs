//! cuBLAS matrix products on the device's stream (column-major, as cuBLAS sees them): the
//! tensor-core paths of `Linear` (f16/bf16 inputs, f32 accumulate and output) and of prefill
//! `Attention` (f32 inputs with TF32 tensor cores). Knows nothing about ops.

use super::gpu::Gpu;
use crate::error::{Error, Result};
use cudarc::cublas::result::CublasError;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasHandle_t, cublasOperation_t, cudaDataType,
};
use std::ffi::c_void;

/// Element type of a cuBLAS operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// f32.
    F32,
}

impl Elem {
    fn cuda(self) -> cudaDataType {
        match self {
            Elem::F16 => cudaDataType::CUDA_R_16F,
            Elem::Bf16 => cudaDataType::CUDA_R_16BF,
            Elem::F32 => cudaDataType::CUDA_R_32F,
        }
    }
}

/// One operand: device address, element type, leading dimension and batch stride (elements).
#[derive(Clone, Copy, Debug)]
pub struct Operand {
    /// Device address of the first element.
    pub ptr: u64,
    /// Element type.
    pub elem: Elem,
    /// Leading dimension (column-major).
    pub ld: usize,
    /// Elements between consecutive matrices of a batch.
    pub stride: usize,
}

/// `C = alpha·op(A)·op(B) + beta·C` for `batch` matrices, column-major: op(A) is m×k, op(B)
/// k×n, C m×n (f32). `ta`/`tb` read A/B transposed. `tf32` lets f32 inputs use TF32 tensor
/// cores; f16/bf16 inputs always accumulate in f32.
#[derive(Clone, Copy, Debug)]
pub struct Gemm {
    /// Read A transposed.
    pub ta: bool,
    /// Read B transposed.
    pub tb: bool,
    /// Rows of op(A) and C.
    pub m: usize,
    /// Columns of op(B) and C.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// A.
    pub a: Operand,
    /// B.
    pub b: Operand,
    /// C (f32).
    pub c: Operand,
    /// Matrices in the batch (1: a plain GEMM).
    pub batch: usize,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of what C held (0: C is overwritten; 1: the product is added to it).
    pub beta: f32,
    /// TF32 tensor cores for f32 inputs.
    pub tf32: bool,
}

fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(format!("cuBLAS: {what} = {v} exceeds i32")))
}

fn i64_of(v: usize, what: &str) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::invalid(format!("cuBLAS: {what} = {v} exceeds i64")))
}

/// Runs `g` on `gpu`'s stream. `Ok(false)` when cuBLAS is not loaded (the caller falls back to
/// its own kernels); `Err` when cuBLAS rejects the call.
pub fn gemm(gpu: &Gpu, g: &Gemm) -> Result<bool> {
    gemm_on(gpu, 0, g)
}

/// [`gemm`] on lane `lane`: 0 is the stream, `i` > 0 side stream `i − 1` (between
/// [`Gpu::fork`] and [`Gpu::join`]). `Ok(false)` when that lane has no cuBLAS.
pub fn gemm_on(gpu: &Gpu, lane: usize, g: &Gemm) -> Result<bool> {
    let handle = match lane {
        0 => gpu.blas(),
        i => gpu.side_blas(i - 1),
    };
    let Some(blas) = handle else {
        return Ok(false);
    };
    if g.m == 0 || g.n == 0 || g.batch == 0 {
        return Ok(true);
    }
    let call = Call::of(g)?;
    let blas = blas
        .lock()
        .map_err(|_| Error::Device("cuBLAS handle poisoned".into()))?;
    gpu.bind()?;
    let r = if g.batch == 1 {
        call.one(*blas.handle(), g)
    } else {
        call.batched(*blas.handle(), g)?
    };
    r.map_err(|e| Error::Device(format!("cuBLAS GEMM ({g:?}): {e}")))?;
    Ok(true)
}

/// The arguments of a GEMM as cuBLAS takes them (sizes checked to fit its integers).
struct Call {
    ta: cublasOperation_t,
    tb: cublasOperation_t,
    m: i32,
    n: i32,
    k: i32,
    lda: i32,
    ldb: i32,
    ldc: i32,
    compute: cublasComputeType_t,
}

impl Call {
    fn of(g: &Gemm) -> Result<Call> {
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        let compute = if g.tf32 && g.a.elem == Elem::F32 {
            cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        Ok(Call {
            ta: op(g.ta),
            tb: op(g.tb),
            m: i32_of(g.m, "m")?,
            n: i32_of(g.n, "n")?,
            k: i32_of(g.k, "k")?,
            lda: i32_of(g.a.ld, "lda")?,
            ldb: i32_of(g.b.ld, "ldb")?,
            ldc: i32_of(g.c.ld, "ldc")?,
            compute,
        })
    }

    /// One product (`cublasGemmEx`).
    fn one(&self, handle: cublasHandle_t, g: &Gemm) -> std::result::Result<(), CublasError> {
        let alpha_p = &g.alpha as *const f32 as *const c_void;
        let beta_p = &g.beta as *const f32 as *const c_void;
        // SAFETY: the caller passes device buffers holding the m×k, k×n and m×n matrices with
        // these leading dimensions; alpha/beta are host scalars (default pointer mode).
        unsafe {
            cudarc::cublas::result::gemm_ex(
                handle,
                self.ta,
                self.tb,
                self.m,
                self.n,
                self.k,
                alpha_p,
                g.a.ptr as *const c_void,
                g.a.elem.cuda(),
                self.lda,
                g.b.ptr as *const c_void,
                g.b.elem.cuda(),
                self.ldb,
                beta_p,
                g.c.ptr as *mut c_void,
                g.c.elem.cuda(),
                self.ldc,
                self.compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
    }

    /// `g.batch` products at the operands' strides (`cublasGemmStridedBatchedEx`).
    fn batched(
        &self,
        handle: cublasHandle_t,
        g: &Gemm,
    ) -> Result<std::result::Result<(), CublasError>> {
        let batch = i32_of(g.batch, "batch")?;
        let (sa, sb, sc) = (
            i64_of(g.a.stride, "stride A")?,
            i64_of(g.b.stride, "stride B")?,
            i64_of(g.c.stride, "stride C")?,
        );
        let alpha_p = &g.alpha as *const f32 as *const c_void;
        let beta_p = &g.beta as *const f32 as *const c_void;
        // SAFETY: as in `one`, for `batch` matrices at the given element strides.
        Ok(unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                handle,
                self.ta,
                self.tb,
                self.m,
                self.n,
                self.k,
                alpha_p,
                g.a.ptr as *const c_void,
                g.a.elem.cuda(),
                self.lda,
                sa,
                g.b.ptr as *const c_void,
                g.b.elem.cuda(),
                self.ldb,
                sb,
                beta_p,
                g.c.ptr as *mut c_void,
                g.c.elem.cuda(),
                self.ldc,
                sc,
                batch,
                self.compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        })
    }
}
