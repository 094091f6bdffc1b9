//! Exact-precision dots of one K-quant weight row (Q4_K, Q5_K, Q6_K; layouts in
//! `crate::kquant`) with up to [`MAX_ROWS`] f32 activation rows: each 256-value super-block is
//! dequantized once into a stack buffer, then multiplied with every activation row (f32 FMAs on
//! the fast path) — no activation quantization. Also the row → f32 converters the GEMM path uses.
//!
//! Every kernel has the [`FloatRowsFn`] contract with `k % 256 == 0` (checked by the caller). This
//! module must not split work across threads or know about bias/output.

use super::{FloatRowsFn, RowToF32Fn, WeightType, MAX_ROWS};
use crate::kquant::{
    dequantize_q4_k, dequantize_q5_k, dequantize_q6_k, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K,
};

/// A super-block dequantizer and its block size.
type Deq = (fn(&[u8], &mut [f32]), usize);

fn deq_of(t: WeightType) -> Deq {
    match t {
        WeightType::Q4K => (dequantize_q4_k, Q4_K_BYTES),
        WeightType::Q5K => (dequantize_q5_k, Q5_K_BYTES),
        _ => (dequantize_q6_k, Q6_K_BYTES),
    }
}

/// Dequantizes every super-block of the row and dots it with each activation row in order.
#[inline]
fn rows_ref(
    (deq, bytes): Deq,
    w: &[u8],
    x: &[f32],
    k: usize,
    rows: usize,
    out: &mut [f32; MAX_ROWS],
) {
    let rows = rows.min(MAX_ROWS);
    let mut acc = [0f32; MAX_ROWS];
    let mut wf = [0f32; QK_K];
    for (b, blk) in w.chunks_exact(bytes).take(k / QK_K).enumerate() {
        deq(blk, &mut wf);
        for (r, a) in acc.iter_mut().enumerate().take(rows) {
            let xb = &x[r * k + b * QK_K..r * k + (b + 1) * QK_K];
            for (wv, xv) in wf.iter().zip(xb) {
                *a += wv * xv;
            }
        }
    }
    out[..rows].copy_from_slice(&acc[..rows]);
}

/// Reference Q4_K × f32 kernel.
pub fn rows_q4_k_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    rows_ref(deq_of(WeightType::Q4K), w, x, k, rows, out)
}

/// Reference Q5_K × f32 kernel.
pub fn rows_q5_k_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    rows_ref(deq_of(WeightType::Q5K), w, x, k, rows, out)
}

/// Reference Q6_K × f32 kernel.
pub fn rows_q6_k_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    rows_ref(deq_of(WeightType::Q6K), w, x, k, rows, out)
}

/// The reference kernel of K-quant type `t` (`None` for other types).
pub fn pick_ref(t: WeightType) -> Option<FloatRowsFn> {
    Some(match t {
        WeightType::Q4K => rows_q4_k_ref,
        WeightType::Q5K => rows_q5_k_ref,
        WeightType::Q6K => rows_q6_k_ref,
        _ => return None,
    })
}

/// The fastest exact kernel of K-quant type `t` for this CPU (`None` for other types).
pub fn pick(t: WeightType) -> Option<FloatRowsFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return Some(match t {
                WeightType::Q4K => avx2::rows_q4_k,
                WeightType::Q5K => avx2::rows_q5_k,
                WeightType::Q6K => avx2::rows_q6_k,
                _ => return None,
            });
        }
    }
    pick_ref(t)
}

/// Whole-row dequantization of K-quant type `t` into f32 (the GEMM path's tile converter).
pub fn pick_row_to_f32(t: WeightType) -> Option<RowToF32Fn> {
    Some(match t {
        WeightType::Q4K => row_q4_k,
        WeightType::Q5K => row_q5_k,
        WeightType::Q6K => row_q6_k,
        _ => return None,
    })
}

/// # Safety
/// [`RowToF32Fn`] contract (`k % 256 == 0`).
unsafe fn row_q4_k(w: &[u8], k: usize, out: &mut [f32]) {
    dequantize_q4_k(&w[..k / QK_K * Q4_K_BYTES], &mut out[..k]);
}

/// # Safety
/// [`RowToF32Fn`] contract (`k % 256 == 0`).
unsafe fn row_q5_k(w: &[u8], k: usize, out: &mut [f32]) {
    dequantize_q5_k(&w[..k / QK_K * Q5_K_BYTES], &mut out[..k]);
}

/// # Safety
/// [`RowToF32Fn`] contract (`k % 256 == 0`).
unsafe fn row_q6_k(w: &[u8], k: usize, out: &mut [f32]) {
    dequantize_q6_k(&w[..k / QK_K * Q6_K_BYTES], &mut out[..k]);
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! Super-block dequantization (scalar, into a stack buffer) + AVX2 FMA dots; only called
    //! after `simd::has_avx2_fma()`.
    use super::super::{WeightType, MAX_ROWS};
    use super::{deq_of, Deq};
    use crate::kquant::QK_K;
    use crate::linear::hsum_avx2 as hsum;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows_n<const R: usize>(
        (deq, bytes): Deq,
        w: &[u8],
        x: &[f32],
        k: usize,
        out: &mut [f32; MAX_ROWS],
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut wf = [0f32; QK_K];
        for (b, blk) in w.chunks_exact(bytes).take(k / QK_K).enumerate() {
            deq(blk, &mut wf);
            for (r, ac) in acc.iter_mut().enumerate() {
                let xp = x.as_ptr().add(r * k + b * QK_K);
                for i in (0..QK_K).step_by(16) {
                    let w0 = _mm256_loadu_ps(wf.as_ptr().add(i));
                    let w1 = _mm256_loadu_ps(wf.as_ptr().add(i + 8));
                    ac[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp.add(i)), ac[0]);
                    ac[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp.add(i + 8)), ac[1]);
                }
            }
        }
        for (r, ac) in acc.iter().enumerate() {
            out[r] = hsum(_mm256_add_ps(ac[0], ac[1]));
        }
    }

    #[inline]
    unsafe fn rows(t: WeightType, w: &[u8], x: &[f32], k: usize, n: usize, o: &mut [f32; 4]) {
        let d = deq_of(t);
        match n {
            1 => rows_n::<1>(d, w, x, k, o),
            2 => rows_n::<2>(d, w, x, k, o),
            3 => rows_n::<3>(d, w, x, k, o),
            _ => rows_n::<4>(d, w, x, k, o),
        }
    }

    /// AVX2 Q4_K × f32 ([`super::super::FloatRowsFn`] contract).
    pub unsafe fn rows_q4_k(w: &[u8], x: &[f32], k: usize, n: usize, o: &mut [f32; MAX_ROWS]) {
        rows(WeightType::Q4K, w, x, k, n, o)
    }

    /// AVX2 Q5_K × f32 ([`super::super::FloatRowsFn`] contract).
    pub unsafe fn rows_q5_k(w: &[u8], x: &[f32], k: usize, n: usize, o: &mut [f32; MAX_ROWS]) {
        rows(WeightType::Q5K, w, x, k, n, o)
    }

    /// AVX2 Q6_K × f32 ([`super::super::FloatRowsFn`] contract).
    pub unsafe fn rows_q6_k(w: &[u8], x: &[f32], k: usize, n: usize, o: &mut [f32; MAX_ROWS]) {
        rows(WeightType::Q6K, w, x, k, n, o)
    }
}
