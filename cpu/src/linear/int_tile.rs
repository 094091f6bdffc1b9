//! Register-tiled integer GEMM kernels for `quant_act = 1`: up to 4 activation rows × 4 weight
//! rows, two blocks per step in 512-bit registers. Q4_0/Q4_1 with AVX-512 BW (`maddubs`/`madd`)
//! or VNNI (`vpdpbusd`); Q8_0 with VNNI only (its `q + 128` bytes would saturate `maddubs`).
//!
//! Per block the integer sum is exact and equal to the scalar reference's: Q4_0 computes
//! `Σ q·x − 8·Σx` (= `Σ (q − 8)·x`) with unsigned nibbles (`maddubs` cannot saturate: 15·127·2),
//! Q8_0 `Σ (q + 128)·x − 128·Σx`, Q4_1 `Σ q·x` plus the float min term `mw · (dx·Σx)`. Block scales are formed as outer
//! products of per-row and per-column scale vectors, shared across the tile.
//!
//! Kernels have the [`IntTileFn`] contract. This module must not split work across threads.

#[cfg(target_arch = "x86_64")]
use super::IntTileFn;
#[cfg(target_arch = "x86_64")]
use super::WeightType;

/// True when AVX-512 (per `simd`) and AVX-512 VNNI are available (cached).
#[cfg(target_arch = "x86_64")]
pub fn has_vnni() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| crate::simd::has_avx512() && is_x86_feature_detected!("avx512vnni"))
}

/// The tiled integer kernel for `t` if this CPU has one.
pub fn pick(t: super::WeightType) -> Option<super::IntTileFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if has_vnni() {
            let f: IntTileFn = match t {
                WeightType::Q4_0 => avx512::tile_q4_0_vnni,
                WeightType::Q4_1 => avx512::tile_q4_1_vnni,
                WeightType::Q8_0 => avx512::tile_q8_0_vnni,
                _ => return None,
            };
            return Some(f);
        }
        if crate::simd::has_avx512() {
            let f: IntTileFn = match t {
                WeightType::Q4_0 => avx512::tile_q4_0,
                WeightType::Q4_1 => avx512::tile_q4_1,
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
    //! AVX-512 F/BW/VL tiles; only called after `simd::has_avx512()`.
    use super::super::act_quant::Q8Rows;
    use super::super::MAX_ROWS;
    use crate::quant::{Q4_0_BYTES, Q4_1_BYTES, Q8_0_BYTES, QK};
    use std::arch::x86_64::*;

    /// Per-column data of one 2-block step: the 64 nibbles, `[dw ×8 | dw' ×8]`, and
    /// `[mw, 0 ×7 | mw', 0 ×7]`.
    #[derive(Clone, Copy)]
    struct Col {
        q: __m512i,
        d: __m512,
        m: __m512,
    }

    /// Expands blocks `b0` and `b1` (pointers to the blocks; `qs` at `off`) of one weight row.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn col(b0: *const u8, b1: *const u8, off: usize, has_min: bool) -> Col {
        let t = _mm256_set_m128i(
            _mm_loadu_si128(b1.add(off) as *const __m128i),
            _mm_loadu_si128(b0.add(off) as *const __m128i),
        );
        let m4 = _mm256_set1_epi8(15);
        let lo = _mm256_and_si256(t, m4);
        let hi = _mm256_and_si256(_mm256_srli_epi16(t, 4), m4);
        let z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        // [q0 lo, q1 lo, q0 hi, q1 hi] -> [q0 lo, q0 hi, q1 lo, q1 hi]
        let q = _mm512_shuffle_i64x2(z, z, 0xD8);
        let (u0, u1) = if has_min {
            (
                (b0 as *const i32).read_unaligned(),
                (b1 as *const i32).read_unaligned(),
            )
        } else {
            (
                (b0 as *const u16).read_unaligned() as i32,
                (b1 as *const u16).read_unaligned() as i32,
            )
        };
        // [d0, m0, d1, m1]
        let dm = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_set_epi32(0, 0, u1, u0)));
        let d = _mm512_permutexvar_ps(
            _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0),
            dm,
        );
        let m = if has_min {
            _mm512_maskz_permutexvar_ps(
                0x0101,
                _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1),
                dm,
            )
        } else {
            _mm512_setzero_ps()
        };
        Col { q, d, m }
    }

    /// Q8_0 blocks `b0`, `b1` as unsigned bytes `q + 128` (the caller subtracts `128·Σx`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn col_q8(b0: *const u8, b1: *const u8) -> Col {
        let lo = _mm256_loadu_si256(b0.add(2) as *const __m256i);
        let hi = _mm256_loadu_si256(b1.add(2) as *const __m256i);
        let q = _mm512_xor_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
            _mm512_set1_epi8(-128),
        );
        let u0 = (b0 as *const u16).read_unaligned() as i32;
        let u1 = (b1 as *const u16).read_unaligned() as i32;
        // f16 lanes: [d0, 0, d1, 0]
        let dm = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_set_epi32(0, 0, u1, u0)));
        let d = _mm512_permutexvar_ps(
            _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0),
            dm,
        );
        Col {
            q,
            d,
            m: _mm512_setzero_ps(),
        }
    }

    /// Per-row data of one step: the 64 (or 32) activation bytes, `[dx ×8 | dx' ×8]`,
    /// `[sx ×8 | sx' ×8]` and `[Σx, 0 ×7 | Σx', 0 ×7]` (integers).
    struct Row {
        x: __m512i,
        d: __m512,
        s: __m512,
        n: __m512i,
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn row(a: &Q8Rows, i: usize, two: bool) -> Row {
        let (bm, dm, sm): (__mmask64, __mmask8, __mmask8) = if two {
            (!0, 0xF, 0x3)
        } else {
            (0xFFFF_FFFF, 0x3, 0x1)
        };
        let x = _mm512_maskz_loadu_epi8(bm, a.qs.as_ptr().add(i * QK));
        let ds = _mm512_castps128_ps512(_mm_maskz_loadu_ps(dm, a.ds.as_ptr().add(i) as *const f32));
        let d = _mm512_permutexvar_ps(
            _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0),
            ds,
        );
        let s = _mm512_permutexvar_ps(
            _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
            ds,
        );
        let sums = _mm512_castsi128_si512(_mm_maskz_loadu_epi32(sm, a.sum.as_ptr().add(i)));
        let n = _mm512_maskz_permutexvar_epi32(
            0x0101,
            _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0),
            sums,
        );
        Row { x, d, s, n }
    }

    /// Weight kinds of the tiles.
    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q8_0: u8 = 2;

    /// `maddubs` + `madd`: 16 lanes of 4-byte u8×i8 dot sums (no saturation for our ranges).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn dot_bw(w: __m512i, x: __m512i) -> __m512i {
        _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1))
    }

    /// VNNI `vpdpbusd`: the same sums in one instruction, accumulated in i32 (never saturates).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn dot_vnni(w: __m512i, x: __m512i) -> __m512i {
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x)
    }

    macro_rules! tile_impl {
        ($name:ident, $dot:ident, $($feat:tt)*) => {
            /// `R` rows × `C` columns of kind `K`, two blocks per step.
            #[inline]
            #[target_feature(enable = $($feat)*)]
            unsafe fn $name<const R: usize, const C: usize, const K: u8>(
                w: &[u8],
                rb: usize,
                a: &Q8Rows,
                row0: usize,
                out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
            ) {
                let (bytes, off) = match K {
                    Q4_0 => (Q4_0_BYTES, 2),
                    Q4_1 => (Q4_1_BYTES, 4),
                    _ => (Q8_0_BYTES, 2),
                };
                let nb = a.blocks;
                let wp = w.as_ptr();
                let mut acc = [[_mm512_setzero_ps(); C]; R];
                let mut b = 0;
                while b < nb {
                    let two = b + 1 < nb;
                    let zero = Col {
                        q: _mm512_setzero_si512(),
                        d: _mm512_setzero_ps(),
                        m: _mm512_setzero_ps(),
                    };
                    let mut cols = [zero; C];
                    for (c, cv) in cols.iter_mut().enumerate() {
                        let b0 = wp.add(c * rb + b * bytes);
                        let b1 = if two { b0.add(bytes) } else { b0 };
                        *cv = if K == Q8_0 { col_q8(b0, b1) } else { col(b0, b1, off, K == Q4_1) };
                    }
                    for (r, ar) in acc.iter_mut().enumerate() {
                        let x = row(a, (row0 + r) * nb + b, two);
                        // exact integer correction: Q4_0 `Σ(q-8)x = Σqx - 8Σx`,
                        // Q8_0 `Σqx = Σ(q+128)x - 128Σx`
                        let corr = match K {
                            Q4_0 => _mm512_slli_epi32(x.n, 3),
                            Q8_0 => _mm512_slli_epi32(x.n, 7),
                            _ => _mm512_setzero_si512(),
                        };
                        for (c, cv) in cols.iter().enumerate() {
                            let p = _mm512_sub_epi32($dot(cv.q, x.x), corr);
                            let sc = _mm512_mul_ps(cv.d, x.d);
                            ar[c] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(p), ar[c]);
                            if K == Q4_1 {
                                ar[c] = _mm512_fmadd_ps(cv.m, x.s, ar[c]);
                            }
                        }
                    }
                    b += 2;
                }
                for (r, ar) in acc.iter().enumerate() {
                    for (c, v) in ar.iter().enumerate() {
                        out[c][r] = _mm512_reduce_add_ps(*v);
                    }
                }
            }
        };
    }

    tile_impl!(tile_bw, dot_bw, "avx512f,avx512bw,avx512vl,avx2,fma,f16c");
    tile_impl!(
        tile_vnni,
        dot_vnni,
        "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
    );

    macro_rules! tile_fn {
        ($name:ident, $inner:ident, $kind:expr) => {
            /// AVX-512 tile ([`super::super::IntTileFn`] contract).
            pub unsafe fn $name(
                w: &[u8],
                rb: usize,
                a: &Q8Rows,
                row0: usize,
                rows: usize,
                cols: usize,
                out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
            ) {
                macro_rules! by_cols {
                    ($r:literal) => {
                        match cols {
                            1 => $inner::<$r, 1, { $kind }>(w, rb, a, row0, out),
                            2 => $inner::<$r, 2, { $kind }>(w, rb, a, row0, out),
                            3 => $inner::<$r, 3, { $kind }>(w, rb, a, row0, out),
                            _ => $inner::<$r, 4, { $kind }>(w, rb, a, row0, out),
                        }
                    };
                }
                match rows {
                    1 => by_cols!(1),
                    2 => by_cols!(2),
                    3 => by_cols!(3),
                    _ => by_cols!(4),
                }
            }
        };
    }

    tile_fn!(tile_q4_0, tile_bw, Q4_0);
    tile_fn!(tile_q4_1, tile_bw, Q4_1);
    tile_fn!(tile_q4_0_vnni, tile_vnni, Q4_0);
    tile_fn!(tile_q4_1_vnni, tile_vnni, Q4_1);
    tile_fn!(tile_q8_0_vnni, tile_vnni, Q8_0);
}
