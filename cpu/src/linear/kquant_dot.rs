//! Exact-precision dots of one K-quant weight row (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; layouts in
//! `crate::kquant` and `crate::kquant_low`) with up to [`MAX_ROWS`] f32 activation rows: each 256-value super-block is
//! dequantized once into a stack buffer, then multiplied with every activation row (f32 FMAs on
//! the fast path) — no activation quantization. Also the row → f32 converters the GEMM path uses.
//!
//! Every kernel has the [`FloatRowsFn`] contract with `k % 256 == 0` (checked by the caller). This
//! module must not split work across threads or know about bias/output.

use super::{FloatRowsFn, RowToF32Fn, WeightType, MAX_ROWS};
use crate::kquant::{
    dequantize_q4_k, dequantize_q5_k, dequantize_q6_k, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K,
};
use crate::kquant_low::{dequantize_q2_k, dequantize_q3_k, Q2_K_BYTES, Q3_K_BYTES};

/// A super-block dequantizer and its block size.
type Deq = super::block_ref::BlockDeq;

fn deq_of(t: WeightType) -> Deq {
    match t {
        WeightType::Q2K => (dequantize_q2_k, Q2_K_BYTES),
        WeightType::Q3K => (dequantize_q3_k, Q3_K_BYTES),
        WeightType::Q4K => (dequantize_q4_k, Q4_K_BYTES),
        WeightType::Q5K => (dequantize_q5_k, Q5_K_BYTES),
        _ => (dequantize_q6_k, Q6_K_BYTES),
    }
}

/// Dequantizes every super-block of the row and dots it with each activation row in order.
#[inline]
fn rows_ref(deq: Deq, w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    super::block_ref::block_rows_ref::<QK_K>(deq, w, x, k, rows, out)
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

/// Reference Q2_K × f32 kernel.
pub fn rows_q2_k_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    rows_ref(deq_of(WeightType::Q2K), w, x, k, rows, out)
}

/// Reference Q3_K × f32 kernel.
pub fn rows_q3_k_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    rows_ref(deq_of(WeightType::Q3K), w, x, k, rows, out)
}

/// The reference kernel of K-quant type `t` (`None` for other types).
pub fn pick_ref(t: WeightType) -> Option<FloatRowsFn> {
    Some(match t {
        WeightType::Q2K => rows_q2_k_ref,
        WeightType::Q3K => rows_q3_k_ref,
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
                WeightType::Q2K => avx2::rows_q2_k,
                WeightType::Q3K => avx2::rows_q3_k,
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
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return Some(match t {
                WeightType::Q2K => row_q2_k,
                WeightType::Q3K => row_q3_k,
                WeightType::Q4K => avx2::row_q4_k,
                WeightType::Q5K => avx2::row_q5_k,
                WeightType::Q6K => avx2::row_q6_k,
                _ => return None,
            });
        }
    }
    Some(match t {
        WeightType::Q2K => row_q2_k,
        WeightType::Q3K => row_q3_k,
        WeightType::Q4K => row_q4_k,
        WeightType::Q5K => row_q5_k,
        WeightType::Q6K => row_q6_k,
        _ => return None,
    })
}

/// # Safety
/// [`RowToF32Fn`] contract (`k % 256 == 0`).
unsafe fn row_q2_k(w: &[u8], k: usize, out: &mut [f32]) {
    dequantize_q2_k(&w[..k / QK_K * Q2_K_BYTES], &mut out[..k]);
}

/// # Safety
/// [`RowToF32Fn`] contract (`k % 256 == 0`).
unsafe fn row_q3_k(w: &[u8], k: usize, out: &mut [f32]) {
    dequantize_q3_k(&w[..k / QK_K * Q3_K_BYTES], &mut out[..k]);
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
    //! Super-block dequantization (AVX2, into a stack buffer) + AVX2 FMA dots; only called
    //! after `simd::has_avx2_fma()`.
    use super::super::kquant_simd::{f16v, q45_pair, q6_half};
    use super::super::{WeightType, MAX_ROWS};
    use super::Deq;
    use crate::kquant::{scales_mins, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K};
    use crate::linear::hsum_avx2 as hsum;
    use std::arch::x86_64::*;

    /// `out[..32] = s · q − m` for 32 unsigned bytes `q` (same rounding as the scalar code: a
    /// product, then a difference).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scale32(q: __m256i, s: f32, m: f32, out: *mut f32) {
        let mut b = [0u8; 32];
        _mm256_storeu_si256(b.as_mut_ptr() as *mut __m256i, q);
        let (sv, mv) = (_mm256_set1_ps(s), _mm256_set1_ps(m));
        for t in 0..4 {
            let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.as_ptr().add(8 * t) as *const __m128i));
            let y = _mm256_sub_ps(_mm256_mul_ps(sv, _mm256_cvtepi32_ps(v)), mv);
            _mm256_storeu_ps(out.add(8 * t), y);
        }
    }

    /// One Q4_K (`Q5 = false`) or Q5_K super-block dequantized into `out`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn deq_q45<const Q5: bool>(blk: &[u8], out: &mut [f32]) {
        let p = blk.as_ptr();
        let (d, dmin) = (f16v(p), f16v(p.add(2)));
        let (sc, m) = scales_mins(&blk[4..16]);
        let qs_at = if Q5 { 48 } else { 16 };
        let qh = if Q5 {
            _mm256_loadu_si256(p.add(16) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        for c in 0..4 {
            let [lo, hi] = q45_pair::<Q5>(p.add(qs_at + 32 * c), qh, c);
            for (j, q) in [(2 * c, lo), (2 * c + 1, hi)] {
                let s = d * ((sc >> (8 * j)) & 0xff) as f32;
                let mn = dmin * ((m >> (8 * j)) & 0xff) as f32;
                scale32(q, s, mn, out.as_mut_ptr().add(32 * j));
            }
        }
    }

    /// One Q6_K super-block dequantized into `out`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn deq_q6(blk: &[u8], out: &mut [f32]) {
        let p = blk.as_ptr();
        let d = f16v(p.add(208));
        for h in 0..2 {
            let v = q6_half(p, h);
            for (g, vg) in v.iter().enumerate() {
                let mut b = [0i8; 32];
                let sw = _mm256_sub_epi8(*vg, _mm256_set1_epi8(32));
                _mm256_storeu_si256(b.as_mut_ptr() as *mut __m256i, sw);
                let e0 = 128 * h + 32 * g;
                for t in 0..4 {
                    let e = e0 + 8 * t;
                    let s = _mm256_set1_ps(d * (blk[192 + e / 16] as i8) as f32);
                    let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                        b.as_ptr().add(8 * t) as *const __m128i
                    ));
                    _mm256_storeu_ps(
                        out.as_mut_ptr().add(e),
                        _mm256_mul_ps(s, _mm256_cvtepi32_ps(q)),
                    );
                }
            }
        }
    }

    /// The AVX2 super-block dequantizer of `t` and its block size (Q2_K and Q3_K: the scalar
    /// one; their dots still run on AVX2 FMAs).
    fn deq_of(t: WeightType) -> Deq {
        // SAFETY (of the calls through these pointers): only made after `has_avx2_fma()`.
        fn q4(b: &[u8], o: &mut [f32]) {
            unsafe { deq_q45::<false>(b, o) }
        }
        fn q5(b: &[u8], o: &mut [f32]) {
            unsafe { deq_q45::<true>(b, o) }
        }
        fn q6(b: &[u8], o: &mut [f32]) {
            unsafe { deq_q6(b, o) }
        }
        match t {
            WeightType::Q2K | WeightType::Q3K => super::deq_of(t),
            WeightType::Q4K => (q4, Q4_K_BYTES),
            WeightType::Q5K => (q5, Q5_K_BYTES),
            _ => (q6, Q6_K_BYTES),
        }
    }

    /// AVX2 whole-row dequantization ([`super::super::RowToF32Fn`] contract, `k % 256 == 0`).
    unsafe fn row(t: WeightType, w: &[u8], k: usize, out: &mut [f32]) {
        let (deq, bytes) = deq_of(t);
        for (b, o) in w.chunks_exact(bytes).zip(out[..k].chunks_exact_mut(QK_K)) {
            deq(b, o);
        }
    }

    /// AVX2 Q4_K row → f32.
    pub unsafe fn row_q4_k(w: &[u8], k: usize, out: &mut [f32]) {
        row(WeightType::Q4K, w, k, out)
    }

    /// AVX2 Q5_K row → f32.
    pub unsafe fn row_q5_k(w: &[u8], k: usize, out: &mut [f32]) {
        row(WeightType::Q5K, w, k, out)
    }

    /// AVX2 Q6_K row → f32.
    pub unsafe fn row_q6_k(w: &[u8], k: usize, out: &mut [f32]) {
        row(WeightType::Q6K, w, k, out)
    }

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

    /// AVX2 Q2_K × f32 ([`super::super::FloatRowsFn`] contract).
    pub unsafe fn rows_q2_k(w: &[u8], x: &[f32], k: usize, n: usize, o: &mut [f32; MAX_ROWS]) {
        rows(WeightType::Q2K, w, x, k, n, o)
    }

    /// AVX2 Q3_K × f32 ([`super::super::FloatRowsFn`] contract).
    pub unsafe fn rows_q3_k(w: &[u8], x: &[f32], k: usize, n: usize, o: &mut [f32; MAX_ROWS]) {
        rows(WeightType::Q3K, w, x, k, n, o)
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
