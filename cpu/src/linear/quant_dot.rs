//! Exact-precision dots of one block-quantized weight row (Q8_0, Q4_0, Q4_1; layouts in
//! `crate::quant`) with up to [`MAX_ROWS`] f32 activation rows: weight blocks are dequantized
//! (in registers, on the fast path) and multiplied with f32 FMAs — no activation quantization.
//!
//! Every kernel has the [`FloatRowsFn`] contract (`k % 32 == 0`, checked by the caller). This
//! module must not split work across threads or know about bias/output.

use super::block_ref::block_rows_ref;
use super::{FloatRowsFn, MAX_ROWS};
use crate::quant::{
    dequantize_q4_0, dequantize_q4_1, dequantize_q8_0, Q4_0_BYTES, Q4_1_BYTES, Q8_0_BYTES, QK,
};

/// Reference Q8_0 × f32 kernel.
pub fn rows_q8_0_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    block_rows_ref::<QK>((dequantize_q8_0, Q8_0_BYTES), w, x, k, rows, out)
}

/// Reference Q4_0 × f32 kernel.
pub fn rows_q4_0_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    block_rows_ref::<QK>((dequantize_q4_0, Q4_0_BYTES), w, x, k, rows, out)
}

/// Reference Q4_1 × f32 kernel.
pub fn rows_q4_1_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    block_rows_ref::<QK>((dequantize_q4_1, Q4_1_BYTES), w, x, k, rows, out)
}

/// The fastest exact Q8_0 kernel for this CPU.
pub fn pick_q8_0() -> FloatRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return avx2::rows_q8_0;
        }
    }
    rows_q8_0_ref
}

/// The fastest exact Q4_0 kernel for this CPU.
pub fn pick_q4_0() -> FloatRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return avx2::rows_q4_0;
        }
    }
    rows_q4_0_ref
}

/// The fastest exact Q4_1 kernel for this CPU.
pub fn pick_q4_1() -> FloatRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return avx2::rows_q4_1;
        }
    }
    rows_q4_1_ref
}

/// The register-tiled kernel ([`super::TileF32Fn`] contract, but `w` holds block rows) that
/// dequantizes block weights in registers with the values of [`pick_row_to_f32`]'s converter
/// and sums them with the arithmetic of `float_dot::pick_tile_f32`'s kernel, if this CPU has one
/// (AVX-512): the exact-precision GEMV reads block rows in place and gives the bits of the GEMM,
/// which converts tiles first, so a row's result does not depend on the number of rows (Q5_0:
/// the values of `crate::quant::dequantize_q5_0`, its GEMM's converter).
pub fn pick_tile_direct(t: super::WeightType) -> Option<super::TileF32Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() {
            return match t {
                super::WeightType::Q8_0 => Some(avx512::tile_q8_0),
                super::WeightType::Q4_0 => Some(avx512::tile_q4_0),
                super::WeightType::Q4_1 => Some(avx512::tile_q4_1),
                super::WeightType::Q5_0 => Some(avx512::tile_q5_0),
                _ => None,
            };
        }
    }
    let _ = t;
    None
}

/// The fast whole-row dequantizer for a block type (for GEMM tiles), if this CPU has one.
pub fn pick_row_to_f32(t: super::WeightType) -> Option<super::RowToF32Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return match t {
                super::WeightType::Q8_0 => Some(avx2::row_q8_0),
                super::WeightType::Q4_0 => Some(avx2::row_q4_0),
                super::WeightType::Q4_1 => Some(avx2::row_q4_1),
                _ => None,
            };
        }
    }
    let _ = t;
    None
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! AVX2 dequantize-in-registers kernels; only called after `simd::has_avx2_fma()`.
    use super::super::MAX_ROWS;
    use crate::linear::{f16_at_avx2 as f16_at, hsum_avx2 as hsum};
    use crate::quant::{Q4_0_BYTES, Q4_1_BYTES, Q8_0_BYTES, QK};
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn i8x8(p: *const u8) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
    }

    /// The 32 values of a Q8_0 block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn deq_q8_0(b: *const u8) -> [__m256; 4] {
        let d = f16_at(b);
        let q = b.add(2);
        [
            _mm256_mul_ps(d, i8x8(q)),
            _mm256_mul_ps(d, i8x8(q.add(8))),
            _mm256_mul_ps(d, i8x8(q.add(16))),
            _mm256_mul_ps(d, i8x8(q.add(24))),
        ]
    }

    /// The 32 nibbles of a 16-byte run: low nibbles (elements 0..16), high nibbles (16..32).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn nibbles(q: *const u8) -> (__m128i, __m128i) {
        let t = _mm_loadu_si128(q as *const __m128i);
        let m = _mm_set1_epi8(15);
        (_mm_and_si128(t, m), _mm_and_si128(_mm_srli_epi16(t, 4), m))
    }

    /// `d * v` for the low 8 signed bytes of `v`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scaled_i8(v: __m128i, d: __m256) -> __m256 {
        _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)))
    }

    /// `d * v + m` for the low 8 unsigned bytes of `v`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn affine_u8(v: __m128i, d: __m256, m: __m256) -> __m256 {
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), d, m)
    }

    /// The 32 values of a Q4_0 block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn deq_q4_0(b: *const u8) -> [__m256; 4] {
        let d = f16_at(b);
        let (lo, hi) = nibbles(b.add(2));
        let e = _mm_set1_epi8(8);
        let (lo, hi) = (_mm_sub_epi8(lo, e), _mm_sub_epi8(hi, e));
        [
            scaled_i8(lo, d),
            scaled_i8(_mm_srli_si128(lo, 8), d),
            scaled_i8(hi, d),
            scaled_i8(_mm_srli_si128(hi, 8), d),
        ]
    }

    /// The 32 values of a Q4_1 block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn deq_q4_1(b: *const u8) -> [__m256; 4] {
        let d = f16_at(b);
        let m = f16_at(b.add(2));
        let (lo, hi) = nibbles(b.add(4));
        [
            affine_u8(lo, d, m),
            affine_u8(_mm_srli_si128(lo, 8), d, m),
            affine_u8(hi, d, m),
            affine_u8(_mm_srli_si128(hi, 8), d, m),
        ]
    }

    macro_rules! quant_rows {
        ($name:ident, $inner:ident, $deq:ident, $bytes:expr) => {
            /// `R` activation rows with `A` accumulators per row.
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $inner<const R: usize, const A: usize>(
                w: &[u8],
                x: &[f32],
                k: usize,
                out: &mut [f32; MAX_ROWS],
            ) {
                let wp = w.as_ptr();
                let xp = x.as_ptr();
                let mut acc = [[_mm256_setzero_ps(); A]; R];
                for b in 0..k / QK {
                    let wv = $deq(wp.add(b * $bytes));
                    for (r, a) in acc.iter_mut().enumerate() {
                        let xb = xp.add(r * k + b * QK);
                        // spelled out so every accumulator index is a constant
                        a[0] = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(xb), a[0]);
                        a[1 % A] = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xb.add(8)), a[1 % A]);
                        a[2 % A] = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(xb.add(16)), a[2 % A]);
                        a[3 % A] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(xb.add(24)), a[3 % A]);
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    let mut s = a[0];
                    for v in &a[1..] {
                        s = _mm256_add_ps(s, *v);
                    }
                    out[r] = hsum(s);
                }
            }

            /// AVX2 kernel ([`super::super::FloatRowsFn`] contract).
            pub unsafe fn $name(
                w: &[u8],
                x: &[f32],
                k: usize,
                rows: usize,
                out: &mut [f32; MAX_ROWS],
            ) {
                // 4 accumulators per row whatever the row count (a row's sum does not depend
                // on its batch); more than 2 rows run as pairs (the weight row stays in L1)
                match rows {
                    1 => $inner::<1, 4>(w, x, k, out),
                    2 => $inner::<2, 4>(w, x, k, out),
                    _ => {
                        let mut hi = [0f32; MAX_ROWS];
                        $inner::<2, 4>(w, x, k, out);
                        if rows == 3 {
                            $inner::<1, 4>(w, &x[2 * k..], k, &mut hi);
                        } else {
                            $inner::<2, 4>(w, &x[2 * k..], k, &mut hi);
                        }
                        out[2..rows.min(MAX_ROWS)].copy_from_slice(&hi[..rows.min(MAX_ROWS) - 2]);
                    }
                }
            }
        };
    }

    macro_rules! row_to_f32 {
        ($name:ident, $deq:ident, $bytes:expr) => {
            /// Dequantizes a whole row ([`super::super::RowToF32Fn`] contract).
            #[target_feature(enable = "avx2,fma,f16c")]
            pub unsafe fn $name(w: &[u8], k: usize, out: &mut [f32]) {
                let (wp, op) = (w.as_ptr(), out.as_mut_ptr());
                for b in 0..k / QK {
                    let v = $deq(wp.add(b * $bytes));
                    for (u, x) in v.iter().enumerate() {
                        _mm256_storeu_ps(op.add(b * QK + 8 * u), *x);
                    }
                }
            }
        };
    }

    row_to_f32!(row_q8_0, deq_q8_0, Q8_0_BYTES);
    row_to_f32!(row_q4_0, deq_q4_0, Q4_0_BYTES);
    row_to_f32!(row_q4_1, deq_q4_1, Q4_1_BYTES);

    quant_rows!(rows_q8_0, rows_q8_0_n, deq_q8_0, Q8_0_BYTES);
    quant_rows!(rows_q4_0, rows_q4_0_n, deq_q4_0, Q4_0_BYTES);
    quant_rows!(rows_q4_1, rows_q4_1_n, deq_q4_1, Q4_1_BYTES);
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! AVX-512 tiles over block weights; only called after `simd::has_avx512()`.
    use super::super::MAX_ROWS;
    use crate::linear::f16_at_avx2 as f16_at;
    use crate::quant::{Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q8_0_BYTES, QK};
    use std::arch::x86_64::*;

    // The dequantizers give the values of `avx2::deq_*` (same integer steps, one conversion and
    // one multiply or FMA per value), 16 per vector: elements 0..16 and 16..32 of the block.

    /// The f16 at `p` widened and broadcast to 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn scale(p: *const u8) -> __m512 {
        let d = _mm512_castps256_ps512(f16_at(p));
        _mm512_shuffle_f32x4::<0>(d, d)
    }

    /// The 32 nibbles of a 16-byte run as dwords: low nibbles (elements 0..16),
    /// high nibbles (16..32).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn nibbles(q: *const u8) -> (__m512i, __m512i) {
        let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(q as *const __m128i));
        let m = _mm512_set1_epi32(15);
        (_mm512_and_si512(v, m), _mm512_srli_epi32::<4>(v))
    }

    /// The 32 values of a Q8_0 block.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn deq_q8_0(b: *const u8) -> [__m512; 2] {
        let d = scale(b);
        let q = b.add(2) as *const __m128i;
        let v = |p| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p)));
        [_mm512_mul_ps(d, v(q)), _mm512_mul_ps(d, v(q.add(1)))]
    }

    /// The 32 values of a Q4_0 block.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn deq_q4_0(b: *const u8) -> [__m512; 2] {
        let d = scale(b);
        let (lo, hi) = nibbles(b.add(2));
        let e = _mm512_set1_epi32(8);
        let v = |q| _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(q, e)));
        [v(lo), v(hi)]
    }

    /// The 32 values of a Q4_1 block.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn deq_q4_1(b: *const u8) -> [__m512; 2] {
        let (d, m) = (scale(b), scale(b.add(2)));
        let (lo, hi) = nibbles(b.add(4));
        let v = |q| _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), d, m);
        [v(lo), v(hi)]
    }

    /// The 32 values of a Q5_0 block: `(q − 16) · d`, q the 5-bit value (high bit i of the
    /// block's 32-bit `qh` for element i).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn deq_q5_0(b: *const u8) -> [__m512; 2] {
        let d = scale(b);
        let t = _mm_loadu_si128(b.add(6) as *const __m128i);
        let m = _mm_set1_epi8(15);
        let (lo, hi) = (_mm_and_si128(t, m), _mm_and_si128(_mm_srli_epi16(t, 4), m));
        let qh = (b.add(2) as *const u32).read_unaligned();
        let sixteen = _mm_set1_epi8(16);
        // the high bit adds 16; then − 16: values −16..=15
        let lo = _mm_sub_epi8(_mm_mask_add_epi8(lo, qh as u16, lo, sixteen), sixteen);
        let hi = _mm_sub_epi8(
            _mm_mask_add_epi8(hi, (qh >> 16) as u16, hi, sixteen),
            sixteen,
        );
        let v = |q| _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
        [v(lo), v(hi)]
    }

    macro_rules! quant_tile {
        ($name:ident, $inner:ident, $deq:ident, $bytes:expr) => {
            /// `R` activation rows × `C` block weight rows (`k / 32` blocks each), one
            /// accumulator per entry, 16 values per step in order.
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            unsafe fn $inner<const R: usize, const C: usize>(
                w: &[u8],
                x: &[f32],
                k: usize,
                out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
            ) {
                let rb = k / QK * $bytes;
                let (wp, xp) = (w.as_ptr(), x.as_ptr());
                let mut acc = [[_mm512_setzero_ps(); C]; R];
                for b in 0..k / QK {
                    let mut wv = [[_mm512_setzero_ps(); 2]; C];
                    for (c, v) in wv.iter_mut().enumerate() {
                        *v = $deq(wp.add(c * rb + b * $bytes));
                    }
                    for (r, a) in acc.iter_mut().enumerate() {
                        let xb = xp.add(r * k + b * QK);
                        let (x0, x1) = (_mm512_loadu_ps(xb), _mm512_loadu_ps(xb.add(16)));
                        for c in 0..C {
                            a[c] = _mm512_fmadd_ps(wv[c][0], x0, a[c]);
                            a[c] = _mm512_fmadd_ps(wv[c][1], x1, a[c]);
                        }
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    for (c, v) in a.iter().enumerate() {
                        out[c][r] = _mm512_reduce_add_ps(*v);
                    }
                }
            }

            /// [`super::super::TileF32Fn`] contract over block rows.
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            pub unsafe fn $name(
                w: &[u8],
                x: &[f32],
                k: usize,
                rows: usize,
                cols: usize,
                out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
            ) {
                by_rows_cols!($inner [], rows, cols, (w, x, k, out))
            }
        };
    }

    quant_tile!(tile_q8_0, tile_q8_0_n, deq_q8_0, Q8_0_BYTES);
    quant_tile!(tile_q4_0, tile_q4_0_n, deq_q4_0, Q4_0_BYTES);
    quant_tile!(tile_q4_1, tile_q4_1_n, deq_q4_1, Q4_1_BYTES);
    quant_tile!(tile_q5_0, tile_q5_0_n, deq_q5_0, Q5_0_BYTES);
}
