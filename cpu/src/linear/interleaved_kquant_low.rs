//! The integer `Linear` kernels of interleaved Q2_K and Q3_K weights (16 rows side by side, the
//! layout of [`super::interleaved_kquant`]: vector `V_m` of a super-block holds plain word `m`
//! of each row, in plain order; Q3_K's 2-byte `d` sit at the group's start).
//!
//! | format | plain super-block (`crate::kquant_low`) | one super-block of a group |
//! |---|---|---|
//! | Q2_K | 84 bytes: 16 scale bytes, 64 `qs`, `d, dmin` | 21 vectors (1344 bytes) |
//! | Q3_K | 110 bytes: 32 `hmask`, 64 `qs`, 12 scale bytes, `d` | 27 vectors (1728 bytes) + 32 bytes of `d` at the group's start |
//!
//! A `qs` vector holds four bytes of all 16 rows; its four 2-bit planes are values `4u..4u + 4`
//! of four consecutive activation blocks (Q3_K's third bits from the `hmask` vector of the same
//! word `u`), so one plane meets one broadcast 4-byte activation piece in a `vpdpbusd`.
//!
//! Activations are Q8_0 blocks of 32 ([`Q8Rows`], with [`Q8Rows::sum16`]: call
//! [`Q8Rows::prepare_sum16`] first). Per activation block `b` of a super-block, with `Σ₀`/`Σ₁`
//! over its first/last 16 values, summed exactly in integers, then added in block order (the
//! scalar reference and the SIMD kernels alike):
//! - Q2_K: `acc += (sc[2b]·Σ₀ q·x + sc[2b+1]·Σ₁ q·x) · (d·dx)` and
//!   `accm += (m[2b]·Σ₀ x + m[2b+1]·Σ₁ x) · (dmin·dx)`; the result is `acc − accm`;
//! - Q3_K: `acc += (sc[2b]·Σ₀ (q − 4)·x + sc[2b+1]·Σ₁ (q − 4)·x) · (d·dx)` (signed scales).
//!
//! This module must not split work across threads or know about tensors.

use super::act_quant::Q8Rows;
use super::interleaved::{InterleavedFn, GROUP_ROWS};
use super::interleaved_kquant::gather;
use super::{WeightType, MAX_ROWS};
use crate::kquant_low::{q2_k_value, q3_k_scales, q3_k_value, Q2_K_BYTES, Q3_K_BYTES};
use crate::quant::rd_f16 as f16_at;

/// Activation blocks (of 32) per super-block.
const SUB: usize = 8;

/// Scalar reference of the Q2_K group kernel: each row's plain super-block is gathered back
/// from the words, then the module's integer math in block order.
fn ref_q2(
    g: &[u8],
    acts: &Q8Rows,
    row0: usize,
    rows: usize,
    out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
) {
    let nb = acts.blocks;
    let mut pb = [0u8; Q2_K_BYTES];
    for (r, o) in out.iter_mut().enumerate().take(rows) {
        for (j, oj) in o.iter_mut().enumerate() {
            let (mut acc, mut accm) = (0f32, 0f32);
            for sb in 0..nb / SUB {
                gather(g, nb / SUB, sb, j, &mut pb);
                let (d, dmin) = (f16_at(&pb, 80), f16_at(&pb, 82));
                for b in 0..SUB {
                    let a = (row0 + r) * nb + sb * SUB + b;
                    let x = &acts.qs[a * 32..][..32];
                    let (mut isum, mut msum) = (0i32, 0i32);
                    for (h, xh) in x.chunks_exact(16).enumerate() {
                        let s = pb[2 * b + h] as i32;
                        let qx: i32 = (xh.iter().enumerate())
                            .map(|(l, &xl)| q2_k_value(&pb, 32 * b + 16 * h + l) as i32 * xl as i32)
                            .sum();
                        isum += (s & 15) * qx;
                        msum += (s >> 4) * acts.sum16[a][h];
                    }
                    let dx = acts.ds[a][0];
                    acc = (isum as f32).mul_add(d * dx, acc);
                    accm = (msum as f32).mul_add(dmin * dx, accm);
                }
            }
            *oj = acc - accm;
        }
    }
}

/// Scalar reference of the Q3_K group kernel.
fn ref_q3(
    g: &[u8],
    acts: &Q8Rows,
    row0: usize,
    rows: usize,
    out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
) {
    let nb = acts.blocks;
    let mut pb = [0u8; Q3_K_BYTES];
    for (r, o) in out.iter_mut().enumerate().take(rows) {
        for (j, oj) in o.iter_mut().enumerate() {
            let mut acc = 0f32;
            for sb in 0..nb / SUB {
                gather(g, nb / SUB, sb, j, &mut pb);
                let d = f16_at(&pb, 108);
                let sc = q3_k_scales(&pb[96..108]);
                for b in 0..SUB {
                    let a = (row0 + r) * nb + sb * SUB + b;
                    let x = &acts.qs[a * 32..][..32];
                    let mut isum = 0i32;
                    for (h, xh) in x.chunks_exact(16).enumerate() {
                        let qx: i32 = (xh.iter().enumerate())
                            .map(|(l, &xl)| {
                                (q3_k_value(&pb, 32 * b + 16 * h + l) as i32 - 4) * xl as i32
                            })
                            .sum();
                        isum += sc[2 * b + h] as i32 * qx;
                    }
                    acc = (isum as f32).mul_add(d * acts.ds[a][0], acc);
                }
            }
            *oj = acc;
        }
    }
}

/// The scalar reference kernel for interleaved Q2_K/Q3_K weights (`None` for other types).
pub(super) fn pick_ref(t: WeightType) -> Option<InterleavedFn> {
    Some(match t {
        WeightType::Q2K => ref_q2,
        WeightType::Q3K => ref_q3,
        _ => return None,
    })
}

/// The AVX-512 VNNI kernel for interleaved Q2_K/Q3_K weights (`None` for other types); only
/// for a CPU that has [`super::interleaved::available`].
#[cfg(target_arch = "x86_64")]
pub(super) fn simd(t: WeightType) -> Option<InterleavedFn> {
    Some(match t {
        WeightType::Q2K => avx512::group_q2_k,
        WeightType::Q3K => avx512::group_q3_k,
        _ => return None,
    })
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The kernels; only called after `interleaved::available()`. Each pass takes at most two
    //! activation rows, so that the per-block sums stay in registers.
    use super::super::act_quant::Q8Rows;
    use super::super::interleaved::avx512::piece;
    use super::super::interleaved_kquant::avx512::{field, ld, prefetch, prefetch_l2};
    use super::super::interleaved_kquant::vec_bytes;
    use super::super::MAX_ROWS;
    use super::{GROUP_ROWS, SUB};
    use crate::kquant_low::{Q2_K_BYTES, Q3_K_BYTES};
    use std::arch::x86_64::*;

    /// Super-blocks ahead of the one being computed that are prefetched into L2, half a
    /// super-block per half computed (past a group's end too: the next group follows; a
    /// prefetch never faults).
    const PREFETCH_AHEAD: usize = 4;

    /// Bit `a` (0..8) of every byte of `hm` moved to bit 2, other bits cleared.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn third_bit(hm: __m512i, a: usize) -> __m512i {
        let s = if a < 2 {
            _mm512_sll_epi16(hm, _mm_cvtsi32_si128(2 - a as i32))
        } else {
            _mm512_srl_epi16(hm, _mm_cvtsi32_si128(a as i32 - 2))
        };
        _mm512_and_si512(s, _mm512_set1_epi8(4))
    }

    /// The scale bytes of all 16 rows as four vectors, lane `j` of vector `i` holding groups
    /// `4i..4i + 4` of row `j` (one byte each): Q2_K's plain scale/min bytes (words 0..4), or
    /// Q3_K's `sc + 32` unpacked from its three packed-scale words 24..27
    /// (`crate::kquant_low::q3_k_scales`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn scale_words<const Q3: bool>(v: *const u8) -> [__m512i; 4] {
        if !Q3 {
            return std::array::from_fn(|i| ld(v.add(64 * i)));
        }
        let (a0, a1, t) = (ld(v.add(64 * 24)), ld(v.add(64 * 25)), ld(v.add(64 * 26)));
        let (m4, m2) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(3));
        let hi = |n: u32| _mm512_slli_epi32::<4>(_mm512_and_si512(field(t, n, -1), m2));
        let lo = |v: __m512i, n: u32| _mm512_and_si512(field(v, n, -1), m4);
        [
            _mm512_or_si512(lo(a0, 0), hi(0)),
            _mm512_or_si512(lo(a1, 0), hi(2)),
            _mm512_or_si512(lo(a0, 4), hi(4)),
            _mm512_or_si512(lo(a1, 4), hi(6)),
        ]
    }

    /// The scale of group `gi` of all 16 rows as i32 lanes (Q2_K: its low 4 bits; Q3_K: signed).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn scale<const Q3: bool>(w: &[__m512i; 4], gi: usize) -> __m512i {
        let n = 8 * (gi % 4) as u32;
        if Q3 {
            _mm512_sub_epi32(field(w[gi / 4], n, 63), _mm512_set1_epi32(32))
        } else {
            field(w[gi / 4], n, 15)
        }
    }

    /// Runs `$body` four times with `$t` = 0, 1, 2, 3 (unrolled, so that arrays indexed by
    /// `$t` stay in registers and shift counts are immediates).
    macro_rules! unroll4 {
        ($t:ident, $body:block) => {{
            {
                const $t: usize = 0;
                $body
            }
            {
                const $t: usize = 1;
                $body
            }
            {
                const $t: usize = 2;
                $body
            }
            {
                const $t: usize = 3;
                $body
            }
        }};
    }

    /// The integer sums `sc₀·Σ₀ + sc₁·Σ₁` of blocks `4H..4H + 4` of the super-block at `v` (its
    /// scale bytes `scw`) against activation rows whose block `4H` is `a0[r]`, for all 16 rows.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn block_sums<const R: usize, const Q3: bool, const H: usize>(
        v: *const u8,
        scw: &[__m512i; 4],
        acts: &Q8Rows,
        a0: [usize; R],
    ) -> [[__m512i; 4]; R] {
        let qs_word = if Q3 { 8 } else { 4 };
        let (xs, s16, m3) = (acts.qs.as_ptr(), acts.sum16.as_ptr(), _mm512_set1_epi8(3));
        let mut isum = [[_mm512_setzero_si512(); 4]; R];
        for half in 0..2 {
            let mut s = [[_mm512_setzero_si512(); 4]; R];
            for (r, sr) in s.iter_mut().enumerate().filter(|_| Q3) {
                for (t, st) in sr.iter_mut().enumerate() {
                    *st = _mm512_set1_epi32(-4 * (*s16.add(a0[r] + t))[half]);
                }
            }
            for u in 4 * half..4 * half + 4 {
                let q = ld(v.add(64 * (qs_word + 8 * H + u)));
                let hm = if Q3 { ld(v.add(64 * u)) } else { q };
                unroll4!(T, {
                    let lo = _mm512_srli_epi16::<{ 2 * T as u32 }>(q);
                    let p = if Q3 {
                        _mm512_ternarylogic_epi32::<0xEC>(lo, third_bit(hm, 4 * H + T), m3)
                    } else {
                        _mm512_and_si512(lo, m3)
                    };
                    for (r, sr) in s.iter_mut().enumerate() {
                        let x = xs.add((a0[r] + T) * 32 + 4 * u);
                        sr[T] = _mm512_dpbusd_epi32(sr[T], p, piece(x));
                    }
                });
            }
            unroll4!(T, {
                let sc = scale::<Q3>(scw, 2 * (4 * H + T) + half);
                for r in 0..R {
                    isum[r][T] = _mm512_add_epi32(isum[r][T], _mm512_mullo_epi32(s[r][T], sc));
                }
            });
        }
        isum
    }

    /// Q2_K (`Q3 = false`) / Q3_K: all super-blocks of one group against activation rows
    /// `row0..row0 + R` into `out[..R]`. Q3_K's offset 4 enters each 16-value sum as its
    /// starting value `−4·Σx`; Q2_K's mins are summed apart (`accm`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn low<const R: usize, const Q3: bool>(
        g: &[u8],
        acts: &Q8Rows,
        row0: usize,
        out: &mut [[f32; GROUP_ROWS]],
    ) {
        let vb = vec_bytes(if Q3 { Q3_K_BYTES } else { Q2_K_BYTES });
        let nb = acts.blocks;
        let (base, ds, s16) = (g.as_ptr(), acts.ds.as_ptr(), acts.sum16.as_ptr());
        // Q3_K: the 16 f16 `d` of each super-block, then the vectors
        let dbase = base;
        let base = if Q3 {
            base.add(2 * GROUP_ROWS * (nb / SUB))
        } else {
            base
        };
        if Q3 {
            prefetch(dbase, 32 * (nb / SUB));
        }
        let mut acc = [_mm512_setzero_ps(); R];
        let mut accm = [_mm512_setzero_ps(); R];
        for sb in 0..nb / SUB {
            let v = base.add(sb * vb);
            let (d, dmin) = if Q3 {
                let d = _mm256_loadu_si256(dbase.add(32 * sb) as *const __m256i);
                (_mm512_cvtph_ps(d), _mm512_setzero_ps())
            } else {
                let w = ld(v.add(64 * 20));
                let dmin = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(w));
                (
                    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w)),
                    _mm512_cvtph_ps(dmin),
                )
            };
            let scw = scale_words::<Q3>(v);
            for h in 0..2 {
                prefetch_l2(
                    v.wrapping_add(PREFETCH_AHEAD * vb + h * vb / 2),
                    vb / 2 + 64,
                );
                let a0: [usize; R] = std::array::from_fn(|r| (row0 + r) * nb + sb * SUB + 4 * h);
                let isum = if h == 0 {
                    block_sums::<R, Q3, 0>(v, &scw, acts, a0)
                } else {
                    block_sums::<R, Q3, 1>(v, &scw, acts, a0)
                };
                unroll4!(T, {
                    let gi = 2 * (4 * h + T);
                    let m0 = field(scw[gi / 4], 8 * (gi % 4) as u32 + 4, 15);
                    let m1 = field(scw[gi / 4], 8 * (gi % 4) as u32 + 12, 15);
                    for r in 0..R {
                        let a = a0[r] + T;
                        let dx = _mm512_set1_ps((*ds.add(a))[0]);
                        let i = _mm512_cvtepi32_ps(isum[r][T]);
                        acc[r] = _mm512_fmadd_ps(i, _mm512_mul_ps(d, dx), acc[r]);
                        if !Q3 {
                            let [sx0, sx1] = *s16.add(a);
                            let ms = _mm512_add_epi32(
                                _mm512_mullo_epi32(m0, _mm512_set1_epi32(sx0)),
                                _mm512_mullo_epi32(m1, _mm512_set1_epi32(sx1)),
                            );
                            let m = _mm512_cvtepi32_ps(ms);
                            accm[r] = _mm512_fmadd_ps(m, _mm512_mul_ps(dmin, dx), accm[r]);
                        }
                    }
                });
            }
        }
        for r in 0..R {
            _mm512_storeu_ps(out[r].as_mut_ptr(), _mm512_sub_ps(acc[r], accm[r]));
        }
    }

    /// Defines the [`super::InterleavedFn`] `$name`, which runs `low::<_, $q3>` over `n`
    /// activation rows, two at a time.
    macro_rules! pairs {
        ($(#[$doc:meta])* $name:ident, $q3:expr) => {
            $(#[$doc])*
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            pub unsafe fn $name(
                g: &[u8],
                a: &Q8Rows,
                r0: usize,
                n: usize,
                o: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
            ) {
                let mut r = 0;
                while r < n {
                    match n - r {
                        1 => low::<1, $q3>(g, a, r0 + r, &mut o[r..]),
                        _ => low::<2, $q3>(g, a, r0 + r, &mut o[r..]),
                    }
                    r += 2;
                }
            }
        };
    }

    pairs!(
        /// Q2_K ([`super::InterleavedFn`]; needs [`Q8Rows::sum16`]).
        group_q2_k, false
    );
    pairs!(
        /// Q3_K ([`super::InterleavedFn`]; needs [`Q8Rows::sum16`]).
        group_q3_k, true
    );
}
