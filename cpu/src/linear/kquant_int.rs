//! Integer dots for `quant_act = 1` with K-quant weights (Q4_K, Q5_K, Q6_K; layouts in
//! `crate::kquant`): one weight row against up to [`MAX_ROWS`] activation rows quantized to Q8_0
//! blocks of 32 ([`Q8Rows`]). A 32-value activation block lines up with one Q4_K/Q5_K sub-block
//! and with two Q6_K scale groups of 16, so per activation block the products are summed exactly
//! in integers and scaled once:
//! - Q4_K/Q5_K: `d·sc[j]·dx·Σ q·x − dmin·m[j]·(dx·Σx)` (the second factor is `Q8Rows::ds[..][1]`);
//! - Q6_K: `d·dx·(sc[2j]·Σ_{first 16} (q−32)·x + sc[2j+1]·Σ_{last 16} (q−32)·x)`.
//!
//! Kernels: scalar reference, AVX2 (`maddubs`/`madd`), and AVX-512 VNNI (`vpdpbusd`, two
//! activation blocks per instruction, weights prefetched a few super-blocks ahead). Every kernel
//! has the [`IntRowsFn`] contract with `acts.blocks % 8 == 0` (checked by the caller). This
//! module must not split work across threads or know about bias/output.

use super::act_quant::Q8Rows;
use super::{IntRowsFn, WeightType, MAX_ROWS};
use crate::kquant::{q6_k_value, scales_mins, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES};
use crate::quant::rd_f16 as f16_at;

/// Activation blocks (of 32) per super-block.
const SUB: usize = 8;

/// Reference Q4_K (`Q5 = false`) / Q5_K × Q8_0 kernel.
fn rows_q45_ref<const Q5: bool>(
    w: &[u8],
    a: &Q8Rows,
    row0: usize,
    rows: usize,
    out: &mut [f32; MAX_ROWS],
) {
    let (bytes, qs_at) = if Q5 {
        (Q5_K_BYTES, 48)
    } else {
        (Q4_K_BYTES, 16)
    };
    for (r, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
        let base = (row0 + r) * a.blocks;
        let mut acc = 0f32;
        for (sb, blk) in w.chunks_exact(bytes).take(a.blocks / SUB).enumerate() {
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            let (sc, m) = scales_mins(&blk[4..16]);
            for j in 0..SUB {
                let i = base + sb * SUB + j;
                let xq = &a.qs[i * 32..i * 32 + 32];
                let q = &blk[qs_at + 32 * (j / 2)..qs_at + 32 * (j / 2) + 32];
                let mut isum = 0i32;
                for l in 0..32 {
                    let lo = (q[l] >> (4 * (j % 2))) & 0xF;
                    let hi = if Q5 { ((blk[16 + l] >> j) & 1) << 4 } else { 0 };
                    isum += (lo | hi) as i32 * xq[l] as i32;
                }
                let [dx, sx] = a.ds[i];
                acc += d * ((sc >> (8 * j)) & 0xff) as f32 * dx * isum as f32;
                acc -= dmin * ((m >> (8 * j)) & 0xff) as f32 * sx;
            }
        }
        *o = acc;
    }
}

/// Reference Q4_K × Q8_0 kernel.
pub fn rows_q4_k_ref(w: &[u8], a: &Q8Rows, row0: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    rows_q45_ref::<false>(w, a, row0, rows, out)
}

/// Reference Q5_K × Q8_0 kernel.
pub fn rows_q5_k_ref(w: &[u8], a: &Q8Rows, row0: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    rows_q45_ref::<true>(w, a, row0, rows, out)
}

/// Reference Q6_K × Q8_0 kernel.
pub fn rows_q6_k_ref(w: &[u8], a: &Q8Rows, row0: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    for (r, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
        let base = (row0 + r) * a.blocks;
        let mut acc = 0f32;
        for (sb, blk) in w.chunks_exact(Q6_K_BYTES).take(a.blocks / SUB).enumerate() {
            let d = f16_at(blk, 208);
            for j in 0..SUB {
                let i = base + sb * SUB + j;
                let xq = &a.qs[i * 32..i * 32 + 32];
                let mut half = [0i32; 2];
                for (l, &x) in xq.iter().enumerate() {
                    let q = q6_k_value(blk, 32 * j + l) as i32 - 32;
                    half[l / 16] += q * x as i32;
                }
                let sc = |g: usize| blk[192 + g] as i8 as i32;
                let isum = sc(2 * j) * half[0] + sc(2 * j + 1) * half[1];
                acc += d * a.ds[i][0] * isum as f32;
            }
        }
        *o = acc;
    }
}

/// The reference kernel of K-quant type `t` (`None` for other types; Q2_K/Q3_K from
/// [`super::kquant_low_int`]).
pub fn pick_ref(t: WeightType) -> Option<IntRowsFn> {
    use super::kquant_low_int as low;
    Some(match t {
        WeightType::Q4K => rows_q4_k_ref,
        WeightType::Q5K => rows_q5_k_ref,
        WeightType::Q6K => rows_q6_k_ref,
        WeightType::Q2K => low::rows_q2_k_ref,
        WeightType::Q3K => low::rows_q3_k_ref,
        _ => return None,
    })
}

/// The fastest kernel of K-quant type `t` for this CPU (`None` for other types; Q2_K/Q3_K from
/// [`super::kquant_low_int`]).
pub fn pick(t: WeightType) -> Option<IntRowsFn> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::kquant_low_int as low;
        if super::int_tile::has_vnni() {
            return Some(match t {
                WeightType::Q4K => avx512::rows_q4_k,
                WeightType::Q5K => avx512::rows_q5_k,
                WeightType::Q6K => avx512::rows_q6_k,
                WeightType::Q2K => low::avx512::rows_q2_k,
                WeightType::Q3K => low::avx512::rows_q3_k,
                _ => return None,
            });
        }
        if crate::simd::has_avx2_fma() {
            return Some(match t {
                WeightType::Q4K => avx2::rows_q4_k,
                WeightType::Q5K => avx2::rows_q5_k,
                WeightType::Q6K => avx2::rows_q6_k,
                WeightType::Q2K => low::avx2::rows_q2_k,
                WeightType::Q3K => low::avx2::rows_q3_k,
                _ => return None,
            });
        }
    }
    pick_ref(t)
}

/// Defines the public [`IntRowsFn`] `$name`, which hands its row count (1..=4) to
/// `$f::<R, $c..>`.
macro_rules! rows_fn {
    ($(#[$doc:meta])* $name:ident, $f:ident $(, $c:expr)*) => {
        $(#[$doc])*
        pub unsafe fn $name(w: &[u8], a: &Q8Rows, row0: usize, rows: usize, o: &mut [f32; 4]) {
            match rows {
                1 => $f::<1 $(, $c)*>(w, a, row0, o),
                2 => $f::<2 $(, $c)*>(w, a, row0, o),
                3 => $f::<3 $(, $c)*>(w, a, row0, o),
                _ => $f::<4 $(, $c)*>(w, a, row0, o),
            }
        }
    };
}
pub(super) use rows_fn;

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! AVX2 K-quant integer dots; only called after `simd::has_avx2_fma()`.
    use super::super::act_quant::Q8Rows;
    use super::super::kquant_simd::{f16v, halves, q45_pair, q6_half, signed_block_dot};
    use super::super::MAX_ROWS;
    use super::SUB;
    use crate::kquant::{scales_mins, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES};
    use crate::linear::hsum_avx2 as hsum;
    use std::arch::x86_64::*;

    /// Unsigned × signed bytes, pairs summed to i16, then × `scale` (i16 lanes) summed to i32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_us(w: __m256i, x: __m256i, scale: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), scale)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q45_n<const R: usize, const Q5: bool>(
        w: &[u8],
        a: &Q8Rows,
        row0: usize,
        out: &mut [f32; MAX_ROWS],
    ) {
        let (bytes, qs_at) = if Q5 {
            (Q5_K_BYTES, 48)
        } else {
            (Q4_K_BYTES, 16)
        };
        let nb = a.blocks;
        let (wp, xs, ds) = (w.as_ptr(), a.qs.as_ptr(), a.ds.as_ptr() as *const f32);
        let one = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut mins = [0f32; R];
        for sb in 0..nb / SUB {
            let blk = wp.add(sb * bytes);
            let (d, dmin) = (f16v(blk), f16v(blk.add(2)));
            let (sc, m) = scales_mins(std::slice::from_raw_parts(blk.add(4), 12));
            let qh = if Q5 {
                _mm256_loadu_si256(blk.add(16) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            for c in 0..4 {
                let [lo, hi] = q45_pair::<Q5>(blk.add(qs_at + 32 * c), qh, c);
                let s0 = d * ((sc >> (16 * c)) & 0xff) as f32;
                let s1 = d * ((sc >> (16 * c + 8)) & 0xff) as f32;
                for (r, ac) in acc.iter_mut().enumerate() {
                    let i = (row0 + r) * nb + sb * SUB + 2 * c;
                    let xl = _mm256_loadu_si256(xs.add(32 * i) as *const __m256i);
                    let xh = _mm256_loadu_si256(xs.add(32 * i + 32) as *const __m256i);
                    let pl = _mm256_cvtepi32_ps(dot_us(lo, xl, one));
                    let ph = _mm256_cvtepi32_ps(dot_us(hi, xh, one));
                    ac[0] = _mm256_fmadd_ps(_mm256_set1_ps(s0 * *ds.add(2 * i)), pl, ac[0]);
                    ac[1] = _mm256_fmadd_ps(_mm256_set1_ps(s1 * *ds.add(2 * i + 2)), ph, ac[1]);
                }
            }
            for (r, mn) in mins.iter_mut().enumerate() {
                let i0 = (row0 + r) * nb + sb * SUB;
                let mut s = 0f32;
                for j in 0..SUB {
                    s += ((m >> (8 * j)) & 0xff) as f32 * *ds.add(2 * (i0 + j) + 1);
                }
                *mn += dmin * s;
            }
        }
        for (r, ac) in acc.iter().enumerate() {
            out[r] = hsum(_mm256_add_ps(ac[0], ac[1])) - mins[r];
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q6_n<const R: usize>(w: &[u8], a: &Q8Rows, row0: usize, out: &mut [f32; MAX_ROWS]) {
        let nb = a.blocks;
        let (wp, xs, ds) = (w.as_ptr(), a.qs.as_ptr(), a.ds.as_ptr() as *const f32);
        let off = _mm256_set1_epi8(32);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for sb in 0..nb / SUB {
            let blk = wp.add(sb * Q6_K_BYTES);
            let d = f16v(blk.add(208));
            for h in 0..2 {
                let v = q6_half(blk, h);
                for (g, vg) in v.iter().enumerate() {
                    let j = 4 * h + g; // activation block within the super-block
                    let sw = _mm256_sub_epi8(*vg, off);
                    let sc0 = *blk.add(192 + 2 * j) as i8 as i16;
                    let sc1 = *blk.add(192 + 2 * j + 1) as i8 as i16;
                    let scv = halves(sc0, sc1);
                    for (r, ac) in acc.iter_mut().enumerate() {
                        let i = (row0 + r) * nb + sb * SUB + j;
                        let p = signed_block_dot(sw, scv, xs.add(32 * i));
                        let s = _mm256_set1_ps(d * *ds.add(2 * i));
                        ac[g % 2] = _mm256_fmadd_ps(s, p, ac[g % 2]);
                    }
                }
            }
        }
        for (r, ac) in acc.iter().enumerate() {
            out[r] = hsum(_mm256_add_ps(ac[0], ac[1]));
        }
    }

    rows_fn!(
        /// AVX2 Q4_K kernel ([`super::super::IntRowsFn`] contract).
        rows_q4_k, q45_n, false
    );

    rows_fn!(
        /// AVX2 Q5_K kernel ([`super::super::IntRowsFn`] contract).
        rows_q5_k, q45_n, true
    );

    rows_fn!(
        /// AVX2 Q6_K kernel ([`super::super::IntRowsFn`] contract).
        rows_q6_k, q6_n
    );
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! AVX-512 VNNI K-quant integer dots: 64 weight values × 64 activation bytes per `vpdpbusd`;
    //! only called after `int_tile::has_vnni()`.
    use super::super::act_quant::Q8Rows;
    use super::super::kquant_simd::{
        f16v, group_dx, group_quads, join, prefetch, q45_pair, q6_half,
    };
    use super::super::MAX_ROWS;
    use super::SUB;
    use crate::kquant::{scales_mins, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES};
    use std::arch::x86_64::*;

    /// Super-blocks ahead of the one being computed that are prefetched.
    const PREFETCH_AHEAD: usize = 4;

    /// Eight u8 (little-endian in `v`) as f32 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn u8x8(v: u64) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn q45_n<const R: usize, const Q5: bool>(
        w: &[u8],
        a: &Q8Rows,
        row0: usize,
        out: &mut [f32; MAX_ROWS],
    ) {
        let (bytes, qs_at) = if Q5 {
            (Q5_K_BYTES, 48)
        } else {
            (Q4_K_BYTES, 16)
        };
        let nb = a.blocks;
        let (wp, xs, ds) = (w.as_ptr(), a.qs.as_ptr(), a.ds.as_ptr() as *const f32);
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0);
        let pair = |c: i32| {
            _mm512_setr_epi32(
                2 * c,
                2 * c,
                2 * c,
                2 * c,
                2 * c,
                2 * c,
                2 * c,
                2 * c,
                2 * c + 1,
                2 * c + 1,
                2 * c + 1,
                2 * c + 1,
                2 * c + 1,
                2 * c + 1,
                2 * c + 1,
                2 * c + 1,
            )
        };
        let perm = [pair(0), pair(1), pair(2), pair(3)];
        let mut acc = [_mm512_setzero_ps(); R];
        let mut accm = [_mm256_setzero_ps(); R];
        let nsb = nb / SUB;
        for sb in 0..nsb {
            let blk = wp.add(sb * bytes);
            if sb + PREFETCH_AHEAD < nsb {
                prefetch(blk.add(PREFETCH_AHEAD * bytes), bytes);
            }
            let (d, dmin) = (f16v(blk), f16v(blk.add(2)));
            let (sc, m) = scales_mins(std::slice::from_raw_parts(blk.add(4), 12));
            let scf = _mm256_mul_ps(u8x8(sc), _mm256_set1_ps(d));
            let mf = _mm256_mul_ps(u8x8(m), _mm256_set1_ps(dmin));
            let qh = if Q5 {
                _mm256_loadu_si256(blk.add(16) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            let mut wv = [_mm512_setzero_si512(); 4];
            for (c, wc) in wv.iter_mut().enumerate() {
                let [lo, hi] = q45_pair::<Q5>(blk.add(qs_at + 32 * c), qh, c);
                *wc = join(lo, hi);
            }
            for r in 0..R {
                let i0 = (row0 + r) * nb + sb * SUB;
                let dsv = _mm512_loadu_ps(ds.add(2 * i0));
                let dx = _mm512_castps512_ps256(_mm512_permutexvar_ps(even, dsv));
                let sx = _mm512_castps512_ps256(_mm512_permutexvar_ps(odd, dsv));
                let s = _mm512_castps256_ps512(_mm256_mul_ps(scf, dx));
                for c in 0..4 {
                    let x = _mm512_loadu_si512(xs.add(32 * i0 + 64 * c) as *const _);
                    let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[c], x);
                    let sv = _mm512_permutexvar_ps(perm[c], s);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sv, acc[r]);
                }
                accm[r] = _mm256_fmadd_ps(mf, sx, accm[r]);
            }
        }
        for r in 0..R {
            let m = _mm512_castps256_ps512(accm[r]);
            let m = _mm512_maskz_mov_ps(0xff, m);
            out[r] = _mm512_reduce_add_ps(_mm512_sub_ps(acc[r], m));
        }
    }

    /// The 4 × 64 six-bit values (offset 32) of a Q6_K super-block, 64 values per register.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn q6_values(blk: *const u8) -> [__m512i; 4] {
        let (a, b) = (q6_half(blk, 0), q6_half(blk, 1));
        [
            join(a[0], a[1]),
            join(a[2], a[3]),
            join(b[0], b[1]),
            join(b[2], b[3]),
        ]
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn q6_n<const R: usize>(w: &[u8], a: &Q8Rows, row0: usize, out: &mut [f32; MAX_ROWS]) {
        let nb = a.blocks;
        let (wp, xs, ds) = (w.as_ptr(), a.qs.as_ptr(), a.ds.as_ptr() as *const f32);
        let off = _mm512_set1_epi8(32);
        let (dx_of_group, perm) = (group_dx(), group_quads());
        let mut acc = [_mm512_setzero_ps(); R];
        let nsb = nb / SUB;
        for sb in 0..nsb {
            let blk = wp.add(sb * Q6_K_BYTES);
            if sb + PREFETCH_AHEAD < nsb {
                prefetch(blk.add(PREFETCH_AHEAD * Q6_K_BYTES), Q6_K_BYTES);
            }
            let d = f16v(blk.add(208));
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                blk.add(192) as *const __m128i
            )));
            let sc = _mm512_mul_ps(sc, _mm512_set1_ps(d));
            let wv = q6_values(blk);
            for (r, ac) in acc.iter_mut().enumerate() {
                let i0 = (row0 + r) * nb + sb * SUB;
                let dsv = _mm512_loadu_ps(ds.add(2 * i0));
                let f = _mm512_mul_ps(sc, _mm512_permutexvar_ps(dx_of_group, dsv));
                for (p, wp) in wv.iter().enumerate() {
                    let x = _mm512_loadu_si512(xs.add(32 * i0 + 64 * p) as *const _);
                    let q = _mm512_dpbusd_epi32(_mm512_setzero_si512(), *wp, x);
                    let c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, x);
                    let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(q, c));
                    *ac = _mm512_fmadd_ps(v, _mm512_permutexvar_ps(perm[p], f), *ac);
                }
            }
        }
        for r in 0..R {
            out[r] = _mm512_reduce_add_ps(acc[r]);
        }
    }

    rows_fn!(
        /// AVX-512 VNNI Q4_K kernel ([`super::super::IntRowsFn`] contract).
        rows_q4_k, q45_n, false
    );

    rows_fn!(
        /// AVX-512 VNNI Q5_K kernel ([`super::super::IntRowsFn`] contract).
        rows_q5_k, q45_n, true
    );

    rows_fn!(
        /// AVX-512 VNNI Q6_K kernel ([`super::super::IntRowsFn`] contract).
        rows_q6_k, q6_n
    );
}
