//! Integer dots for `quant_act = 1` with the low-bit K-quant weights (Q2_K, Q3_K; layouts in
//! `crate::kquant_low`): one weight row against up to [`MAX_ROWS`] activation rows quantized to
//! Q8_0 blocks of 32 ([`Q8Rows`]). A 32-value activation block `j` of a super-block is one 2-bit
//! plane of 32 consecutive `qs` bytes and covers two scale groups of 16, so per activation block:
//! - Q2_K: `d·dx·(sc₀·Σ₀ q·x + sc₁·Σ₁ q·x) − dmin·dx·(m₀·Σ₀ x + m₁·Σ₁ x)`;
//! - Q3_K: `d·dx·(sc₀·Σ₀ (q−4)·x + sc₁·Σ₁ (q−4)·x)` (signed 6-bit scales),
//!
//! where `Σ₀`/`Σ₁` run over the block's first/last 16 values, summed exactly in integers.
//!
//! Kernels: scalar reference, AVX2 (`maddubs`/`madd`), and AVX-512 VNNI (`vpdpbusd`, two
//! activation blocks per instruction; the mins and offsets from the activations' 16-value sums
//! `Q8Rows::sum16`, computed once per activation row: call `Q8Rows::prepare_sum16` first). Every
//! kernel has the [`super::IntRowsFn`] contract (picked by `super::kquant_int::pick`) with `acts.blocks % 8 == 0` (checked by the caller). This module must not split work across threads or know about bias/output.

use super::act_quant::Q8Rows;
use super::MAX_ROWS;
use crate::kquant_low::{q2_k_value, q3_k_scales, q3_k_value, Q2_K_BYTES, Q3_K_BYTES};
use crate::quant::rd_f16 as f16_at;

/// Activation blocks (of 32) per super-block.
const SUB: usize = 8;

/// Reference Q2_K × Q8_0 kernel.
pub fn rows_q2_k_ref(w: &[u8], a: &Q8Rows, row0: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    for (r, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
        let base = (row0 + r) * a.blocks;
        let mut acc = 0f32;
        for (sb, blk) in w.chunks_exact(Q2_K_BYTES).take(a.blocks / SUB).enumerate() {
            let (d, dmin) = (f16_at(blk, 80), f16_at(blk, 82));
            for j in 0..SUB {
                let i = base + sb * SUB + j;
                let (mut qx, mut sx) = ([0i32; 2], [0i32; 2]);
                for (l, &x) in a.qs[i * 32..i * 32 + 32].iter().enumerate() {
                    qx[l / 16] += q2_k_value(blk, 32 * j + l) as i32 * x as i32;
                    sx[l / 16] += x as i32;
                }
                let (s0, s1) = (blk[2 * j] as i32, blk[2 * j + 1] as i32);
                let isum = (s0 & 15) * qx[0] + (s1 & 15) * qx[1];
                let msum = (s0 >> 4) * sx[0] + (s1 >> 4) * sx[1];
                let dx = a.ds[i][0];
                acc += d * dx * isum as f32 - dmin * dx * msum as f32;
            }
        }
        *o = acc;
    }
}

/// Reference Q3_K × Q8_0 kernel.
pub fn rows_q3_k_ref(w: &[u8], a: &Q8Rows, row0: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    for (r, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
        let base = (row0 + r) * a.blocks;
        let mut acc = 0f32;
        for (sb, blk) in w.chunks_exact(Q3_K_BYTES).take(a.blocks / SUB).enumerate() {
            let d = f16_at(blk, 108);
            let sc = q3_k_scales(&blk[96..108]);
            for j in 0..SUB {
                let i = base + sb * SUB + j;
                let mut half = [0i32; 2];
                for (l, &x) in a.qs[i * 32..i * 32 + 32].iter().enumerate() {
                    half[l / 16] += (q3_k_value(blk, 32 * j + l) as i32 - 4) * x as i32;
                }
                let isum = sc[2 * j] as i32 * half[0] + sc[2 * j + 1] as i32 * half[1];
                acc += d * a.ds[i][0] * isum as f32;
            }
        }
        *o = acc;
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! AVX2 Q2_K/Q3_K integer dots; only called after `simd::has_avx2_fma()`.
    use super::super::act_quant::Q8Rows;
    use super::super::kquant_int::rows_fn;
    use super::super::kquant_simd::{f16v, halves, low2_plane_avx2, signed_block_dot};
    use super::super::MAX_ROWS;
    use super::SUB;
    use crate::kquant_low::{q3_k_scales, Q2_K_BYTES, Q3_K_BYTES};
    use crate::linear::hsum_avx2 as hsum;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q2_n<const R: usize>(w: &[u8], a: &Q8Rows, row0: usize, out: &mut [f32; MAX_ROWS]) {
        let nb = a.blocks;
        let (wp, xs, ds) = (w.as_ptr(), a.qs.as_ptr(), a.ds.as_ptr() as *const f32);
        let ones = _mm256_set1_epi8(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for sb in 0..nb / SUB {
            let blk = wp.add(sb * Q2_K_BYTES);
            let (d, dmin) = (f16v(blk.add(80)), f16v(blk.add(82)));
            let planes = [
                _mm256_loadu_si256(blk.add(16) as *const __m256i),
                _mm256_loadu_si256(blk.add(48) as *const __m256i),
            ];
            for j in 0..SUB {
                let q = low2_plane_avx2(planes[j / 4], j % 4);
                let (s0, s1) = (*blk.add(2 * j) as i16, *blk.add(2 * j + 1) as i16);
                let scv = halves(s0 & 15, s1 & 15);
                let mv = halves(s0 >> 4, s1 >> 4);
                for (r, ac) in acc.iter_mut().enumerate() {
                    let i = (row0 + r) * nb + sb * SUB + j;
                    let x = _mm256_loadu_si256(xs.add(32 * i) as *const __m256i);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), scv);
                    let m = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, x), mv);
                    let dx = *ds.add(2 * i);
                    ac[0] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(p), ac[0]);
                    ac[1] =
                        _mm256_fmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(m), ac[1]);
                }
            }
        }
        for (r, ac) in acc.iter().enumerate() {
            out[r] = hsum(ac[0]) - hsum(ac[1]);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q3_n<const R: usize>(w: &[u8], a: &Q8Rows, row0: usize, out: &mut [f32; MAX_ROWS]) {
        let nb = a.blocks;
        let (wp, xs, ds) = (w.as_ptr(), a.qs.as_ptr(), a.ds.as_ptr() as *const f32);
        let (one, four) = (_mm256_set1_epi8(1), _mm256_set1_epi8(4));
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for sb in 0..nb / SUB {
            let blk = wp.add(sb * Q3_K_BYTES);
            let d = f16v(blk.add(108));
            let sc = q3_k_scales(std::slice::from_raw_parts(blk.add(96), 12));
            let hm = _mm256_loadu_si256(blk as *const __m256i);
            let planes = [
                _mm256_loadu_si256(blk.add(32) as *const __m256i),
                _mm256_loadu_si256(blk.add(64) as *const __m256i),
            ];
            for j in 0..SUB {
                let lo = low2_plane_avx2(planes[j / 4], j % 4);
                let hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(j as i32)), one);
                let sw = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)), four);
                let scv = halves(sc[2 * j] as i16, sc[2 * j + 1] as i16);
                for (r, ac) in acc.iter_mut().enumerate() {
                    let i = (row0 + r) * nb + sb * SUB + j;
                    let p = signed_block_dot(sw, scv, xs.add(32 * i));
                    let s = _mm256_set1_ps(d * *ds.add(2 * i));
                    ac[j % 2] = _mm256_fmadd_ps(s, p, ac[j % 2]);
                }
            }
        }
        for (r, ac) in acc.iter().enumerate() {
            out[r] = hsum(_mm256_add_ps(ac[0], ac[1]));
        }
    }

    rows_fn!(
        /// AVX2 Q2_K kernel ([`super::super::IntRowsFn`] contract).
        rows_q2_k, q2_n
    );

    rows_fn!(
        /// AVX2 Q3_K kernel ([`super::super::IntRowsFn`] contract).
        rows_q3_k, q3_n
    );
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! AVX-512 VNNI Q2_K/Q3_K integer dots: 64 weight values × 64 activation bytes per
    //! `vpdpbusd`; only called after `int_tile::has_vnni()`.
    use super::super::act_quant::Q8Rows;
    use super::super::kquant_int::rows_fn;
    use super::super::kquant_simd::{f16v, group_dx, group_quads, join, low2_plane_avx2, prefetch};
    use super::super::MAX_ROWS;
    use super::SUB;
    use crate::kquant_low::{q3_k_scales, Q2_K_BYTES, Q3_K_BYTES};
    use std::arch::x86_64::*;

    /// Super-blocks ahead of the one being computed that are prefetched.
    const PREFETCH_AHEAD: usize = 4;

    /// The 8 × 32 values of a super-block as 4 registers of two activation blocks each: the
    /// 2-bit planes of `qs` (at `blk + qs_at`), with Q3_K's high bits from `hmask` (at `blk`)
    /// when `HM`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn values<const HM: bool>(blk: *const u8, qs_at: usize) -> [__m512i; 4] {
        let planes = [
            _mm256_loadu_si256(blk.add(qs_at) as *const __m256i),
            _mm256_loadu_si256(blk.add(qs_at + 32) as *const __m256i),
        ];
        let hm = _mm256_loadu_si256(blk as *const __m256i);
        let one = _mm256_set1_epi8(1);
        let v = |j: usize| {
            let lo = low2_plane_avx2(planes[j / 4], j % 4);
            if HM {
                let hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(j as i32)), one);
                _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2))
            } else {
                lo
            }
        };
        std::array::from_fn(|p| join(v(2 * p), v(2 * p + 1)))
    }

    /// The 16 group sums `Σ x` of super-block `i0 / 8` (blocks `i0..i0 + 8`) as f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn group_sums(a: &Q8Rows, i0: usize) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_loadu_si512(a.sum16.as_ptr().add(i0) as *const _))
    }

    /// `acc` plus the dots of a super-block's values `wv` with its 256 activation values at `x`,
    /// each group of 16 times its factor (lane `g` of `f`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn scaled_dots(
        wv: &[__m512i; 4],
        x: *const i8,
        f: __m512,
        perm: &[__m512i; 4],
        mut acc: __m512,
    ) -> __m512 {
        for (p, wq) in wv.iter().enumerate() {
            let xv = _mm512_loadu_si512(x.add(64 * p) as *const _);
            let q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), *wq, xv));
            acc = _mm512_fmadd_ps(q, _mm512_permutexvar_ps(perm[p], f), acc);
        }
        acc
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn q2_n<const R: usize>(w: &[u8], a: &Q8Rows, row0: usize, out: &mut [f32; MAX_ROWS]) {
        let nb = a.blocks;
        let (wp, xs, ds) = (w.as_ptr(), a.qs.as_ptr(), a.ds.as_ptr() as *const f32);
        let (dx_of_group, perm) = (group_dx(), group_quads());
        let mut acc = [_mm512_setzero_ps(); R];
        let mut accm = [_mm512_setzero_ps(); R];
        let nsb = nb / SUB;
        for sb in 0..nsb {
            let blk = wp.add(sb * Q2_K_BYTES);
            if sb + PREFETCH_AHEAD < nsb {
                prefetch(blk.add(PREFETCH_AHEAD * Q2_K_BYTES), Q2_K_BYTES);
            }
            let s8 = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk as *const __m128i));
            let sc = _mm512_cvtepi32_ps(_mm512_and_si512(s8, _mm512_set1_epi32(15)));
            let mn = _mm512_cvtepi32_ps(_mm512_srli_epi32(s8, 4));
            let sc = _mm512_mul_ps(sc, _mm512_set1_ps(f16v(blk.add(80))));
            let mn = _mm512_mul_ps(mn, _mm512_set1_ps(f16v(blk.add(82))));
            let wv = values::<false>(blk, 16);
            for r in 0..R {
                let i0 = (row0 + r) * nb + sb * SUB;
                let dx = _mm512_permutexvar_ps(dx_of_group, _mm512_loadu_ps(ds.add(2 * i0)));
                let f = _mm512_mul_ps(sc, dx);
                acc[r] = scaled_dots(&wv, xs.add(32 * i0), f, &perm, acc[r]);
                // the mins: Σ_g dmin·m_g·dx_g·Σ_g x, one lane per group
                let fm = _mm512_mul_ps(mn, dx);
                accm[r] = _mm512_fmadd_ps(fm, group_sums(a, i0), accm[r]);
            }
        }
        for r in 0..R {
            out[r] = _mm512_reduce_add_ps(_mm512_sub_ps(acc[r], accm[r]));
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn q3_n<const R: usize>(w: &[u8], a: &Q8Rows, row0: usize, out: &mut [f32; MAX_ROWS]) {
        let nb = a.blocks;
        let (wp, xs, ds) = (w.as_ptr(), a.qs.as_ptr(), a.ds.as_ptr() as *const f32);
        let (dx_of_group, perm) = (group_dx(), group_quads());
        let mut acc = [_mm512_setzero_ps(); R];
        let mut acco = [_mm512_setzero_ps(); R];
        let nsb = nb / SUB;
        for sb in 0..nsb {
            let blk = wp.add(sb * Q3_K_BYTES);
            if sb + PREFETCH_AHEAD < nsb {
                prefetch(blk.add(PREFETCH_AHEAD * Q3_K_BYTES), Q3_K_BYTES);
            }
            let s = q3_k_scales(std::slice::from_raw_parts(blk.add(96), 12));
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                s.as_ptr() as *const __m128i
            )));
            let sc = _mm512_mul_ps(sc, _mm512_set1_ps(f16v(blk.add(108))));
            let wv = values::<true>(blk, 32);
            for r in 0..R {
                let i0 = (row0 + r) * nb + sb * SUB;
                let dx = _mm512_permutexvar_ps(dx_of_group, _mm512_loadu_ps(ds.add(2 * i0)));
                let f = _mm512_mul_ps(sc, dx);
                acc[r] = scaled_dots(&wv, xs.add(32 * i0), f, &perm, acc[r]);
                // the offset 4 of the stored values: Σ_g f_g·4·Σ_g x
                acco[r] = _mm512_fmadd_ps(f, group_sums(a, i0), acco[r]);
            }
        }
        for r in 0..R {
            let o = _mm512_mul_ps(acco[r], _mm512_set1_ps(4.0));
            out[r] = _mm512_reduce_add_ps(_mm512_sub_ps(acc[r], o));
        }
    }

    rows_fn!(
        /// AVX-512 VNNI Q2_K kernel ([`super::super::IntRowsFn`] contract).
        rows_q2_k, q2_n
    );

    rows_fn!(
        /// AVX-512 VNNI Q3_K kernel ([`super::super::IntRowsFn`] contract).
        rows_q3_k, q3_n
    );
}
