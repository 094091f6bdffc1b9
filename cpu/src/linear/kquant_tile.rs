//! Exact-precision register tiles over Q4_K / Q5_K weight rows (AVX-512, the [`TileF32Fn`]
//! contract with `w` holding super-block rows): each super-block is dequantized in registers to
//! the values of `kquant_dot`'s row converters (`s · q − m`, a product then a difference) and
//! summed with the arithmetic of `float_dot`'s f32 tile (one accumulator per entry, 16 values
//! per step in order). So the GEMV of a few rows gives the bits of the GEMM, which converts rows
//! first, and a row's result does not depend on the number of rows.
//!
//! `k % 256 == 0` (checked by the caller). This module must not split work across threads or
//! know about bias/output.

use super::{TileF32Fn, WeightType};

/// The tile for `t` (Q4_K or Q5_K) if this CPU has one (AVX-512).
pub fn pick_tile_direct(t: WeightType) -> Option<TileF32Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() {
            return match t {
                WeightType::Q4K => Some(avx512::tile_q4_k),
                WeightType::Q5K => Some(avx512::tile_q5_k),
                _ => None,
            };
        }
    }
    let _ = t;
    None
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! AVX-512 tiles; only called after `simd::has_avx512()`.
    use super::super::kquant_simd::{f16v, q45_pair};
    use super::super::MAX_ROWS;
    use crate::kquant::{scales_mins, Q4_K_BYTES, Q5_K_BYTES, QK_K};
    use std::arch::x86_64::*;

    /// `s · q − m` for the 16 unsigned bytes `q`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn scaled(q: __m128i, s: __m512, m: __m512) -> __m512 {
        _mm512_sub_ps(
            _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q))),
            m,
        )
    }

    /// The 64 values of sub-blocks `2·pair` and `2·pair + 1` of the super-block at `p`, whose
    /// `d`, `dmin` and packed scales and mins are `head`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn pair_values<const Q5: bool>(
        p: *const u8,
        head: (f32, f32, u64, u64),
        pair: usize,
    ) -> [__m512; 4] {
        let (d, dmin, sc, m) = head;
        let qh = if Q5 {
            _mm256_loadu_si256(p.add(16) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        let qs_at = if Q5 { 48 } else { 16 };
        let q = q45_pair::<Q5>(p.add(qs_at + 32 * pair), qh, pair);
        let mut v = [_mm512_setzero_ps(); 4];
        for (h, qj) in q.iter().enumerate() {
            let j = 2 * pair + h;
            let s = _mm512_set1_ps(d * ((sc >> (8 * j)) & 0xff) as f32);
            let mn = _mm512_set1_ps(dmin * ((m >> (8 * j)) & 0xff) as f32);
            v[2 * h] = scaled(_mm256_castsi256_si128(*qj), s, mn);
            v[2 * h + 1] = scaled(_mm256_extracti128_si256::<1>(*qj), s, mn);
        }
        v
    }

    /// `R` activation rows × `C` weight rows of `k / 256` super-blocks each.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn tile_n<const Q5: bool, const R: usize, const C: usize>(
        w: &[u8],
        x: &[f32],
        k: usize,
        out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
    ) {
        let bs = if Q5 { Q5_K_BYTES } else { Q4_K_BYTES };
        let nsb = k / QK_K;
        let rb = nsb * bs;
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        for sb in 0..nsb {
            let mut head = [(0f32, 0f32, 0u64, 0u64); C];
            for (c, h) in head.iter_mut().enumerate() {
                let p = wp.add(c * rb + sb * bs);
                let (sc, m) = scales_mins(std::slice::from_raw_parts(p.add(4), 12));
                *h = (f16v(p), f16v(p.add(2)), sc, m);
            }
            for pair in 0..4 {
                let mut wv = [[_mm512_setzero_ps(); 4]; C];
                for (c, v) in wv.iter_mut().enumerate() {
                    *v = pair_values::<Q5>(wp.add(c * rb + sb * bs), head[c], pair);
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    let xb = xp.add(r * k + sb * QK_K + 64 * pair);
                    for (u, off) in [0usize, 16, 32, 48].into_iter().enumerate() {
                        let xv = _mm512_loadu_ps(xb.add(off));
                        for (ac, wc) in a.iter_mut().zip(&wv) {
                            *ac = _mm512_fmadd_ps(wc[u], xv, *ac);
                        }
                    }
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (c, v) in a.iter().enumerate() {
                out[c][r] = _mm512_reduce_add_ps(*v);
            }
        }
    }

    macro_rules! kquant_tile {
        ($name:ident, $q5:literal) => {
            /// [`super::TileF32Fn`] contract over super-block rows.
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            pub unsafe fn $name(
                w: &[u8],
                x: &[f32],
                k: usize,
                rows: usize,
                cols: usize,
                out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
            ) {
                by_rows_cols!(tile_n [$q5,], rows, cols, (w, x, k, out))
            }
        };
    }

    kquant_tile!(tile_q4_k, false);
    kquant_tile!(tile_q5_k, true);
}
