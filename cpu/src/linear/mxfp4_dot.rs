//! Dots of one MXFP4 weight row (layout in `crate::mxfp4`) with up to [`MAX_ROWS`] activation
//! rows: exact ([`FloatRowsFn`]: each block decoded to f32, then f32 FMAs) and `quant_act`
//! ([`IntRowsFn`]: against Q8_0 activation blocks, `2^(e−128)·dx·Σ E2M1_X2[q]·x` with the sum
//! over a block exact in integers: the doubled E2M1 values are a 16-entry int8 table looked up
//! with a byte shuffle, the block scale a power of two).
//!
//! Kernels: scalar references, AVX2 (exact and int8: `maddubs` on `|w|` and `sign(x, w)`), and
//! AVX-512 VNNI (int8: two blocks per `vpdpbusd` on the table offset by +12, the offset taken
//! back with a second `vpdpbusd` against the constant 12), plus the row → f32 converter of the
//! GEMM path. Kernels have their type's contract (`k % 32 == 0`, checked by the caller). This
//! module must not split work across threads or know about bias/output.

use super::act_quant::Q8Rows;
use super::{FloatRowsFn, IntRowsFn, RowToF32Fn, MAX_ROWS};
use crate::mxfp4::{dequantize_mxfp4, e8m0_half, mxfp4_nibble, E2M1_X2, MXFP4_BYTES};
use crate::quant::QK;

/// Reference MXFP4 × f32 kernel.
pub fn rows_mxfp4_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    super::block_ref::block_rows_ref::<QK>((dequantize_mxfp4, MXFP4_BYTES), w, x, k, rows, out)
}

/// Reference MXFP4 × Q8_0 kernel.
pub fn rows_mxfp4_int_ref(
    w: &[u8],
    a: &Q8Rows,
    row0: usize,
    rows: usize,
    out: &mut [f32; MAX_ROWS],
) {
    for (r, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
        let base = (row0 + r) * a.blocks;
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(MXFP4_BYTES).take(a.blocks).enumerate() {
            let xq = &a.qs[(base + b) * QK..(base + b + 1) * QK];
            let isum: i32 = xq
                .iter()
                .enumerate()
                .map(|(j, &x)| E2M1_X2[mxfp4_nibble(blk, j) as usize] as i32 * x as i32)
                .sum();
            acc += e8m0_half(blk[0]) * a.ds[base + b][0] * isum as f32;
        }
        *o = acc;
    }
}

/// The fastest exact MXFP4 kernel for this CPU.
pub fn pick() -> FloatRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return avx2::rows_mxfp4;
        }
    }
    rows_mxfp4_ref
}

/// The fastest MXFP4 × Q8_0 kernel for this CPU.
pub fn pick_int() -> IntRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if super::int_tile::has_vnni() {
            return avx512::rows_mxfp4_int;
        }
        if crate::simd::has_avx2_fma() {
            return avx2::rows_mxfp4_int;
        }
    }
    rows_mxfp4_int_ref
}

/// Whole-row MXFP4 dequantization (the GEMM path's tile converter), the fastest for this CPU
/// (every one decodes exactly like [`dequantize_mxfp4`]).
pub fn row_to_f32() -> RowToF32Fn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return avx2::row_mxfp4;
        }
    }
    row_mxfp4
}

/// # Safety
/// [`RowToF32Fn`] contract (`k % 32 == 0`).
unsafe fn row_mxfp4(w: &[u8], k: usize, out: &mut [f32]) {
    dequantize_mxfp4(&w[..k / QK * MXFP4_BYTES], &mut out[..k]);
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! AVX2 MXFP4 kernels; only called after `simd::has_avx2_fma()`.
    use super::super::act_quant::Q8Rows;
    use super::super::block_float::avx2::{rows, SignedBlock};
    use super::super::MAX_ROWS;
    use crate::linear::hsum_avx2 as hsum;
    use crate::mxfp4::{e8m0_half, E2M1_X2, MXFP4_BYTES};
    use crate::quant::QK;
    use std::arch::x86_64::*;

    /// The 32 signed doubled E2M1 values of the block at `b`, in element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn values(b: *const u8) -> __m256i {
        let t = _mm_loadu_si128(b.add(1) as *const __m128i);
        let nib = _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16(t, 4), t),
            _mm256_set1_epi8(15),
        );
        let lut = _mm_loadu_si128(E2M1_X2.as_ptr() as *const __m128i);
        _mm256_shuffle_epi8(_mm256_set_m128i(lut, lut), nib)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn int_n<const R: usize>(w: &[u8], a: &Q8Rows, row0: usize, out: &mut [f32; MAX_ROWS]) {
        let nb = a.blocks;
        let (wp, xs, ds) = (w.as_ptr(), a.qs.as_ptr(), a.ds.as_ptr() as *const f32);
        let one = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..nb {
            let blk = wp.add(b * MXFP4_BYTES);
            let v = values(blk);
            let av = _mm256_sign_epi8(v, v);
            let d = e8m0_half(*blk);
            for (r, ac) in acc.iter_mut().enumerate() {
                let i = (row0 + r) * nb + b;
                let x = _mm256_loadu_si256(xs.add(i * QK) as *const __m256i);
                // |w|·sign(x, w) = w·x; pairs stay within i16 (|w| ≤ 12, |x| ≤ 127)
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(x, v)), one);
                let s = _mm256_set1_ps(d * *ds.add(2 * i));
                *ac = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), *ac);
            }
        }
        for (r, ac) in acc.iter().enumerate() {
            out[r] = hsum(*ac);
        }
    }

    /// MXFP4 blocks for the shared exact kernel: the doubled E2M1 values and half the
    /// power-of-two scale.
    pub(in super::super) struct Mxfp4;

    impl SignedBlock for Mxfp4 {
        const BYTES: usize = MXFP4_BYTES;
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn values(b: *const u8) -> __m256i {
            values(b)
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scale(b: *const u8) -> f32 {
            e8m0_half(*b)
        }
    }

    /// AVX2 whole-row dequantization ([`super::RowToF32Fn`] contract).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn row_mxfp4(w: &[u8], k: usize, out: &mut [f32]) {
        let (wp, op) = (w.as_ptr(), out.as_mut_ptr());
        for b in 0..k / QK {
            let blk = wp.add(b * MXFP4_BYTES);
            let v = values(blk);
            let d = _mm256_set1_ps(e8m0_half(*blk));
            let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            for (t, q) in [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)]
                .into_iter()
                .enumerate()
            {
                let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                // (a power-of-two scale: the product is exact)
                _mm256_storeu_ps(op.add(b * QK + 8 * t), _mm256_mul_ps(d, f));
            }
        }
    }

    /// AVX2 MXFP4 × Q8_0 kernel ([`super::IntRowsFn`] contract).
    pub unsafe fn rows_mxfp4_int(w: &[u8], a: &Q8Rows, row0: usize, n: usize, o: &mut [f32; 4]) {
        match n {
            1 => int_n::<1>(w, a, row0, o),
            2 => int_n::<2>(w, a, row0, o),
            3 => int_n::<3>(w, a, row0, o),
            _ => int_n::<4>(w, a, row0, o),
        }
    }

    /// AVX2 MXFP4 × f32 kernel ([`super::FloatRowsFn`] contract).
    pub unsafe fn rows_mxfp4(w: &[u8], x: &[f32], k: usize, n: usize, o: &mut [f32; MAX_ROWS]) {
        rows::<Mxfp4>(w, x, k, n, o)
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! AVX-512 VNNI MXFP4 × Q8_0 kernel; only called after `int_tile::has_vnni()`.
    use super::super::act_quant::Q8Rows;
    use super::super::kquant_simd::pair_ps;
    use super::super::MAX_ROWS;
    use crate::mxfp4::{e8m0_half, E2M1_X2, MXFP4_BYTES};
    use crate::quant::QK;
    use std::arch::x86_64::*;

    /// The E2M1 table offset by +12 (unsigned bytes 0..=24 for `vpdpbusd`).
    const OFFSET: i8 = 12;

    /// The unsigned (+12) values of the 16 nibbles of `qs` as 32 bytes in element order.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn nibbles(qs: *const u8) -> __m256i {
        let t = _mm_loadu_si128(qs as *const __m128i);
        _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16(t, 4), t),
            _mm256_set1_epi8(15),
        )
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn int_n<const R: usize>(w: &[u8], a: &Q8Rows, row0: usize, out: &mut [f32; MAX_ROWS]) {
        let nb = a.blocks;
        let (wp, xs, ds) = (w.as_ptr(), a.qs.as_ptr(), a.ds.as_ptr() as *const f32);
        let mut lut = [0i8; 16];
        for (l, v) in lut.iter_mut().zip(E2M1_X2) {
            *l = v + OFFSET;
        }
        let lut = _mm512_broadcast_i32x4(_mm_loadu_si128(lut.as_ptr() as *const __m128i));
        let off = _mm512_set1_epi8(OFFSET);
        let mut acc = [_mm512_setzero_ps(); R];
        let mut b = 0;
        // two blocks per step: lanes 0..8 block b, 8..16 block b + 1
        while b + 2 <= nb {
            let (b0, b1) = (wp.add(b * MXFP4_BYTES), wp.add((b + 1) * MXFP4_BYTES));
            let nib = _mm512_inserti64x4(
                _mm512_castsi256_si512(nibbles(b0.add(1))),
                nibbles(b1.add(1)),
                1,
            );
            let v = _mm512_shuffle_epi8(lut, nib);
            let (d0, d1) = (e8m0_half(*b0), e8m0_half(*b1));
            for (r, ac) in acc.iter_mut().enumerate() {
                let i = (row0 + r) * nb + b;
                let x = _mm512_loadu_si512(xs.add(i * QK) as *const _);
                let zero = _mm512_setzero_si512();
                let p = _mm512_sub_epi32(
                    _mm512_dpbusd_epi32(zero, v, x),
                    _mm512_dpbusd_epi32(zero, off, x),
                );
                let s = pair_ps(d0 * *ds.add(2 * i), d1 * *ds.add(2 * i + 2));
                *ac = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), *ac);
            }
            b += 2;
        }
        if b < nb {
            let blk = wp.add(b * MXFP4_BYTES);
            let v = _mm256_shuffle_epi8(_mm512_castsi512_si256(lut), nibbles(blk.add(1)));
            let off = _mm256_set1_epi8(OFFSET);
            let d = e8m0_half(*blk);
            for (r, ac) in acc.iter_mut().enumerate() {
                let i = (row0 + r) * nb + b;
                let x = _mm256_loadu_si256(xs.add(i * QK) as *const __m256i);
                let zero = _mm256_setzero_si256();
                let p = _mm256_sub_epi32(
                    _mm256_dpbusd_epi32(zero, v, x),
                    _mm256_dpbusd_epi32(zero, off, x),
                );
                let s = _mm256_set1_ps(d * *ds.add(2 * i));
                let t = _mm256_mul_ps(s, _mm256_cvtepi32_ps(p));
                *ac = _mm512_add_ps(*ac, _mm512_zextps256_ps512(t));
            }
        }
        for (r, ac) in acc.iter().enumerate() {
            out[r] = _mm512_reduce_add_ps(*ac);
        }
    }

    /// AVX-512 VNNI MXFP4 × Q8_0 kernel ([`super::IntRowsFn`] contract).
    pub unsafe fn rows_mxfp4_int(w: &[u8], a: &Q8Rows, row0: usize, n: usize, o: &mut [f32; 4]) {
        match n {
            1 => int_n::<1>(w, a, row0, o),
            2 => int_n::<2>(w, a, row0, o),
            3 => int_n::<3>(w, a, row0, o),
            _ => int_n::<4>(w, a, row0, o),
        }
    }
}
