//! Dots of one Q5_0 weight row (layout in `crate::quant`) with up to [`MAX_ROWS`] activation
//! rows: exact ([`FloatRowsFn`]: each block dequantized, then f32 FMAs) and `quant_act`
//! ([`IntRowsFn`]: against Q8_0 activation blocks, `d·dx·(Σ q·x − 16·Σx)` summed exactly in
//! integers per block, as llama.cpp's `vec_dot_q5_0_q8_0`), each as a scalar reference and an
//! AVX2 kernel, plus the row → f32 converter of the GEMM path.
//!
//! Kernels have their type's contract (`k % 32 == 0`, checked by the caller). This module must
//! not split work across threads or know about bias/output.

use super::act_quant::Q8Rows;
use super::{FloatRowsFn, IntRowsFn, RowToF32Fn, MAX_ROWS};
use crate::quant::{dequantize_q5_0, q5_0_value, Q5_0_BYTES, QK};
use half::f16;

/// Reference Q5_0 × f32 kernel.
pub fn rows_q5_0_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    super::block_ref::block_rows_ref::<QK>((dequantize_q5_0, Q5_0_BYTES), w, x, k, rows, out)
}

/// Reference Q5_0 × Q8_0 kernel.
pub fn rows_q5_0_int_ref(
    w: &[u8],
    a: &Q8Rows,
    row0: usize,
    rows: usize,
    out: &mut [f32; MAX_ROWS],
) {
    for (r, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
        let base = (row0 + r) * a.blocks;
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(Q5_0_BYTES).take(a.blocks).enumerate() {
            let xq = &a.qs[(base + b) * QK..(base + b + 1) * QK];
            let isum: i32 = xq
                .iter()
                .enumerate()
                .map(|(j, &x)| (q5_0_value(blk, j) as i32 - 16) * x as i32)
                .sum();
            let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            acc += d * a.ds[base + b][0] * isum as f32;
        }
        *o = acc;
    }
}

/// The fastest exact Q5_0 kernel for this CPU.
pub fn pick() -> FloatRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return avx2::rows_q5_0;
        }
    }
    rows_q5_0_ref
}

/// The fastest Q5_0 × Q8_0 kernel for this CPU.
pub fn pick_int() -> IntRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return avx2::rows_q5_0_int;
        }
    }
    rows_q5_0_int_ref
}

/// Whole-row Q5_0 dequantization (the GEMM path's tile converter).
pub fn row_to_f32() -> RowToF32Fn {
    row_q5_0
}

/// # Safety
/// [`RowToF32Fn`] contract (`k % 32 == 0`).
unsafe fn row_q5_0(w: &[u8], k: usize, out: &mut [f32]) {
    dequantize_q5_0(&w[..k / QK * Q5_0_BYTES], &mut out[..k]);
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! AVX2 Q5_0 kernels; only called after `simd::has_avx2_fma()`.
    use super::super::act_quant::Q8Rows;
    use super::super::block_float::avx2::{rows, SignedBlock};
    use super::super::MAX_ROWS;
    use crate::linear::hsum_avx2 as hsum;
    use crate::quant::{Q5_0_BYTES, QK};
    use std::arch::x86_64::*;

    /// The 32 five-bit values (0..=31) of the block at `b`, in element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(b: *const u8) -> __m256i {
        let t = _mm_loadu_si128(b.add(6) as *const __m128i);
        let nib = _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16(t, 4), t),
            _mm256_set1_epi8(15),
        );
        let qh = _mm256_set1_epi32((b.add(2) as *const i32).read_unaligned());
        // byte i gets byte i / 8 of qh (each 128-bit lane holds qh's 4 bytes at 0..4)
        let idx = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, idx), bit), bit);
        _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(16)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn d_at(b: *const u8) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            (b as *const u16).read_unaligned() as i32,
        )))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn int_n<const R: usize>(w: &[u8], a: &Q8Rows, row0: usize, out: &mut [f32; MAX_ROWS]) {
        let nb = a.blocks;
        let (wp, xs, ds, s8) = (
            w.as_ptr(),
            a.qs.as_ptr(),
            a.ds.as_ptr() as *const f32,
            a.sum8.as_ptr(),
        );
        let one = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..nb {
            let blk = wp.add(b * Q5_0_BYTES);
            let v = values(blk);
            let d = d_at(blk);
            for (r, ac) in acc.iter_mut().enumerate() {
                let i = (row0 + r) * nb + b;
                let x = _mm256_loadu_si256(xs.add(i * QK) as *const __m256i);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(v, x), one);
                // Σ q·x − 16·Σx = Σ (q − 16)·x, exactly (sum8 lane 0 holds 8·Σx)
                let c = _mm256_slli_epi32(_mm256_loadu_si256(s8.add(i) as *const __m256i), 1);
                let p = _mm256_cvtepi32_ps(_mm256_sub_epi32(p, c));
                *ac = _mm256_fmadd_ps(_mm256_set1_ps(d * *ds.add(2 * i)), p, *ac);
            }
        }
        for (r, ac) in acc.iter().enumerate() {
            out[r] = hsum(*ac);
        }
    }

    /// Q5_0 blocks for the shared exact kernel: values `q − 16` and the f16 scale.
    pub(in super::super) struct Q5_0;

    impl SignedBlock for Q5_0 {
        const BYTES: usize = Q5_0_BYTES;
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn values(b: *const u8) -> __m256i {
            _mm256_sub_epi8(values(b), _mm256_set1_epi8(16))
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scale(b: *const u8) -> f32 {
            d_at(b)
        }
    }

    /// AVX2 Q5_0 × Q8_0 kernel ([`super::IntRowsFn`] contract).
    pub unsafe fn rows_q5_0_int(w: &[u8], a: &Q8Rows, row0: usize, n: usize, o: &mut [f32; 4]) {
        match n {
            1 => int_n::<1>(w, a, row0, o),
            2 => int_n::<2>(w, a, row0, o),
            3 => int_n::<3>(w, a, row0, o),
            _ => int_n::<4>(w, a, row0, o),
        }
    }

    /// AVX2 Q5_0 × f32 kernel ([`super::FloatRowsFn`] contract).
    pub unsafe fn rows_q5_0(w: &[u8], x: &[f32], k: usize, n: usize, o: &mut [f32; MAX_ROWS]) {
        rows::<Q5_0>(w, x, k, n, o)
    }
}
