//! AVX-512 integer GEMV kernels for `quant_act = 1` with one activation row: Q4_0/Q4_1 weights
//! × Q8_0 activations, up to 4 weight rows at once so every activation load (bytes, scales,
//! block sums) is shared by them. Two blocks per step in a 512-bit register, AVX-512 BW
//! `vpmaddubsw` + `vpmaddwd`: for CPUs without VNNI (with VNNI one row takes the wide kernel of
//! `int_wide`, the kernel batches take, so a row's output does not depend on its batch).
//!
//! The integer math per block is the scalar reference's, exactly: Q4_0 computes
//! `Σ q·x − 8·Σx` (= `Σ (q − 8)·x`; the `−8·Σx` is the accumulator's start value), Q4_1 `Σ q·x`
//! plus the float min term `mw · (dx·Σx)`. Floats as in the AVX2 kernel: per lane
//! `acc += (dw·dx) · isum`, lanes summed at the end.
//!
//! Layout trick: a step's 32 weight bytes `[q0 | q1]` expand to `[q0 lo | q1 lo | q0 hi | q1 hi]`
//! (nibbles), so the activation bytes are permuted once per step to the same order instead of
//! shuffling every weight row.
//!
//! Kernels have the [`super::IntTileFn`] contract (any `rows`; built for `rows = 1`). This
//! module must not split work across threads.

#[cfg(target_arch = "x86_64")]
use super::{IntTileFn, WeightType};

/// The GEMV kernel for `t` if this CPU has one (AVX-512 F/BW/VL).
pub fn pick(t: super::WeightType) -> Option<super::IntTileFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() {
            let f: IntTileFn = match t {
                WeightType::Q4_0 => avx512::gemv_q4_0,
                WeightType::Q4_1 => avx512::gemv_q4_1,
                _ => return None,
            };
            return Some(f);
        }
    }
    let _ = t;
    None
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! AVX-512 F/BW/VL GEMV; only called after `simd::has_avx512()`.
    use super::super::act_quant::Q8Rows;
    use super::super::MAX_ROWS;
    use crate::quant::{Q4_0_BYTES, Q4_1_BYTES, QK};
    use std::arch::x86_64::*;

    /// Software prefetch distance (bytes ahead in each weight row).
    const PF: usize = 1024;
    /// f16 words (= f32 lanes after widening) of block 0: 128-bit lanes 0 and 2; block 1: 1, 3.
    const W0: __mmask16 = 0x0F0F;
    const W1: __mmask16 = 0xF0F0;
    /// One f16 word per block: the first lane of each block (for the min term).
    const M0: __mmask16 = 0x0001;
    const M1: __mmask16 = 0x0010;

    /// Activation data of one step (shared by all weight rows).
    struct Act {
        /// 64 bytes `[x0[..16] | x1[..16] | x0[16..] | x1[16..]]`.
        x: __m512i,
        /// `dx` of each lane's block.
        d: __m512,
        /// `sx = dx·Σx` of each lane's block (Q4_1).
        s: __m512,
        /// Q4_0: `−8·Σx` in the first lane of each block, 0 elsewhere.
        c: __m512i,
    }

    macro_rules! gemv_impl {
        ($name:ident, $($feat:tt)*) => {
            /// Activation data of blocks `i`, `i + 1` (`TWO`) or `i` alone; Q4_1 when `MIN`.
            #[inline]
            #[target_feature(enable = $($feat)*)]
            unsafe fn $name<const TWO: bool, const MIN: bool>(a: &Q8Rows, i: usize) -> Act {
                let (bm, dm, sm): (__mmask64, __mmask8, __mmask8) =
                    if TWO { (!0, 0xF, 0x3) } else { (0xFFFF_FFFF, 0x3, 0x1) };
                let x = _mm512_maskz_loadu_epi8(bm, a.qs.as_ptr().add(i * QK));
                let x = _mm512_shuffle_i64x2(x, x, 0xD8);
                // [dx0, sx0, dx1, sx1]
                let ds = _mm512_castps128_ps512(_mm_maskz_loadu_ps(
                    dm,
                    a.ds.as_ptr().add(i) as *const f32,
                ));
                let d = _mm512_permutexvar_ps(
                    _mm512_set_epi32(2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0),
                    ds,
                );
                let s = _mm512_permutexvar_ps(
                    _mm512_set_epi32(3, 3, 3, 3, 1, 1, 1, 1, 3, 3, 3, 3, 1, 1, 1, 1),
                    ds,
                );
                let c = if !MIN {
                    let sums = _mm512_castsi128_si512(_mm_maskz_loadu_epi32(
                        sm,
                        a.sum.as_ptr().add(i),
                    ));
                    let n = _mm512_maskz_permutexvar_epi32(
                        0x0011,
                        _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0),
                        sums,
                    );
                    _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(n, 3))
                } else {
                    _mm512_setzero_si512()
                };
                Act { x, d, s, c }
            }
        };
    }

    /// The 64 nibbles of blocks `b0`, `b1` (`qs` at `off`) as `[q0 lo | q1 lo | q0 hi | q1 hi]`
    /// (block 1 zero when `!TWO`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn nibbles<const TWO: bool>(b0: *const u8, off: usize, bytes: usize) -> __m512i {
        let lo = _mm_loadu_si128(b0.add(off) as *const __m128i);
        let hi = if TWO {
            _mm_loadu_si128(b0.add(bytes + off) as *const __m128i)
        } else {
            _mm_setzero_si128()
        };
        let t = _mm256_set_m128i(hi, lo);
        let z = _mm512_inserti64x4(_mm512_castsi256_si512(t), t, 1);
        let z = _mm512_mask_srli_epi16(z, 0xFFFF_0000, z, 4);
        _mm512_and_si512(z, _mm512_set1_epi8(15))
    }

    /// `f16` at `p` into the f16 words of `m` (zero elsewhere), with block 1's at `p + bytes`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn halves<const TWO: bool>(
        p: *const u8,
        bytes: usize,
        m0: __mmask16,
        m1: __mmask16,
    ) -> __m512 {
        let v = _mm256_maskz_set1_epi16(m0, (p as *const i16).read_unaligned());
        let v = if TWO {
            _mm256_mask_set1_epi16(v, m1, (p.add(bytes) as *const i16).read_unaligned())
        } else {
            v
        };
        _mm512_cvtph_ps(v)
    }

    macro_rules! gemv_rows {
        ($name:ident, $act:ident, $dot:ident, $($feat:tt)*) => {
            /// `C` weight rows (`rb` bytes apart) × activation row `r`; Q4_1 when `MIN`.
            #[inline]
            #[target_feature(enable = $($feat)*)]
            unsafe fn $name<const C: usize, const MIN: bool>(
                w: &[u8],
                rb: usize,
                a: &Q8Rows,
                r: usize,
                out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
            ) {
                let (bytes, off) = if MIN { (Q4_1_BYTES, 4) } else { (Q4_0_BYTES, 2) };
                let nb = a.blocks;
                let base = r * nb;
                let wp = w.as_ptr();
                let mut acc = [_mm512_setzero_ps(); C];
                let mut mins = [_mm512_setzero_ps(); C];
                macro_rules! step {
                    ($b:expr, $two:literal) => {{
                        let b = $b;
                        let x = $act::<$two, MIN>(a, base + b);
                        for (c, (ac, mn)) in acc.iter_mut().zip(mins.iter_mut()).enumerate() {
                            let blk = wp.add(c * rb + b * bytes);
                            // 4 row streams at once: help the hardware prefetcher (a hint;
                            // never faults past the end)
                            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF) as *const i8);
                            let q = nibbles::<$two>(blk, off, bytes);
                            let p = $dot(x.c, q, x.x);
                            let dw = halves::<$two>(blk, bytes, W0, W1);
                            let sc = _mm512_mul_ps(dw, x.d);
                            *ac = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(p), *ac);
                            if MIN {
                                let mw = halves::<$two>(blk.add(2), bytes, M0, M1);
                                *mn = _mm512_fmadd_ps(mw, x.s, *mn);
                            }
                        }
                    }};
                }
                let mut b = 0;
                while b + 2 <= nb {
                    step!(b, true);
                    b += 2;
                }
                if b < nb {
                    step!(b, false);
                }
                for ((o, ac), mn) in out.iter_mut().zip(acc.iter()).zip(mins.iter()) {
                    let m = if MIN { _mm512_reduce_add_ps(*mn) } else { 0.0 };
                    o[0] = _mm512_reduce_add_ps(*ac) + m;
                }
            }
        };
    }

    gemv_impl!(act_bw, "avx512f,avx512bw,avx512vl,avx2,fma,f16c");

    /// `c + Σ` of 4-byte u8×i8 products per lane (`maddubs` + `madd`; cannot saturate for
    /// nibbles: 15·127·2 < 32767).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn dot_bw(c: __m512i, w: __m512i, x: __m512i) -> __m512i {
        _mm512_add_epi32(
            c,
            _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)),
        )
    }

    gemv_rows!(
        rows_bw,
        act_bw,
        dot_bw,
        "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
    );

    macro_rules! gemv_fn {
        ($name:ident, $inner:ident, $min:expr) => {
            /// AVX-512 GEMV ([`super::super::IntTileFn`] contract; activation rows one by one).
            pub unsafe fn $name(
                w: &[u8],
                rb: usize,
                a: &Q8Rows,
                row0: usize,
                rows: usize,
                cols: usize,
                out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
            ) {
                for t in 0..rows.min(MAX_ROWS) {
                    let mut o = [[0f32; MAX_ROWS]; MAX_ROWS];
                    match cols {
                        1 => $inner::<1, { $min }>(w, rb, a, row0 + t, &mut o),
                        2 => $inner::<2, { $min }>(w, rb, a, row0 + t, &mut o),
                        3 => $inner::<3, { $min }>(w, rb, a, row0 + t, &mut o),
                        _ => $inner::<4, { $min }>(w, rb, a, row0 + t, &mut o),
                    }
                    for (oc, v) in out.iter_mut().zip(o.iter()) {
                        oc[t] = v[0];
                    }
                }
            }
        };
    }

    gemv_fn!(gemv_q4_0, rows_bw, false);
    gemv_fn!(gemv_q4_1, rows_bw, true);
}
