//! Integer dots for `quant_act = 1`: one block-quantized weight row (Q8_0, Q4_0, Q4_1) against
//! up to [`MAX_ROWS`] activation rows already quantized to Q8_0 ([`Q8Rows`]). Per block the
//! products are summed exactly in integers, then scaled: `dw * dx * Σ qw·qx` (Q4_0 uses `qw - 8`;
//! Q4_1 adds `mw * (dx * Σ qx)`). This is llama.cpp's `vec_dot_q4_0_q8_0` scheme; the AVX2 path
//! uses `maddubs`/`madd` like it. Scalar reference and fast path do the same integer math, so
//! they differ only in the order of the float sums.
//!
//! Every kernel has the [`IntRowsFn`] contract (checked by the caller). This module must not split
//! work across threads or know about bias/output.

use super::act_quant::Q8Rows;
use super::{IntRowsFn, MAX_ROWS};
use crate::quant::{Q4_0_BYTES, Q4_1_BYTES, Q8_0_BYTES, QK};
use half::f16;

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Reference Q8_0 × Q8_0 kernel.
pub fn rows_q8_0_ref(w: &[u8], a: &Q8Rows, row0: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    for (r, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
        let base = (row0 + r) * a.blocks;
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(Q8_0_BYTES).take(a.blocks).enumerate() {
            let xq = &a.qs[(base + b) * QK..(base + b + 1) * QK];
            let isum: i32 = blk[2..]
                .iter()
                .zip(xq)
                .map(|(&q, &x)| (q as i8 as i32) * x as i32)
                .sum();
            acc += f16_at(blk, 0) * a.ds[base + b][0] * isum as f32;
        }
        *o = acc;
    }
}

/// Reference Q4_0 × Q8_0 kernel.
pub fn rows_q4_0_ref(w: &[u8], a: &Q8Rows, row0: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    for (r, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
        let base = (row0 + r) * a.blocks;
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(Q4_0_BYTES).take(a.blocks).enumerate() {
            let xq = &a.qs[(base + b) * QK..(base + b + 1) * QK];
            let mut isum = 0i32;
            for j in 0..16 {
                let q = blk[2 + j];
                isum += ((q & 15) as i32 - 8) * xq[j] as i32;
                isum += ((q >> 4) as i32 - 8) * xq[j + 16] as i32;
            }
            acc += f16_at(blk, 0) * a.ds[base + b][0] * isum as f32;
        }
        *o = acc;
    }
}

/// Reference Q4_1 × Q8_0 kernel.
pub fn rows_q4_1_ref(w: &[u8], a: &Q8Rows, row0: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    for (r, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
        let base = (row0 + r) * a.blocks;
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(Q4_1_BYTES).take(a.blocks).enumerate() {
            let xq = &a.qs[(base + b) * QK..(base + b + 1) * QK];
            let mut isum = 0i32;
            for j in 0..16 {
                let q = blk[4 + j];
                isum += (q & 15) as i32 * xq[j] as i32;
                isum += (q >> 4) as i32 * xq[j + 16] as i32;
            }
            let [dx, sx] = a.ds[base + b];
            acc += f16_at(blk, 0) * dx * isum as f32;
            acc += f16_at(blk, 2) * sx;
        }
        *o = acc;
    }
}

/// The fastest Q8_0 × Q8_0 kernel for this CPU.
pub fn pick_q8_0() -> IntRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return avx2::rows_q8_0;
        }
    }
    rows_q8_0_ref
}

/// The fastest Q4_0 × Q8_0 kernel for this CPU.
pub fn pick_q4_0() -> IntRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return avx2::rows_q4_0;
        }
    }
    rows_q4_0_ref
}

/// The fastest Q4_1 × Q8_0 kernel for this CPU.
pub fn pick_q4_1() -> IntRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return avx2::rows_q4_1;
        }
    }
    rows_q4_1_ref
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! AVX2 integer dots (`maddubs`/`madd`); only called after `simd::has_avx2_fma()`.
    use super::super::act_quant::Q8Rows;
    use super::super::MAX_ROWS;
    use crate::linear::hsum_avx2 as hsum;
    use crate::quant::{Q4_0_BYTES, Q4_1_BYTES, Q8_0_BYTES, QK};
    use std::arch::x86_64::*;

    /// The 32 nibbles of a 16-byte run as bytes 0..=15, in element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn nibbles(q: *const u8) -> __m256i {
        let t = _mm_loadu_si128(q as *const __m128i);
        let v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
        _mm256_and_si256(v, _mm256_set1_epi8(15))
    }

    /// Signed × signed bytes: 8 lanes of 4-product sums.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_ss(w: __m256i, x: __m256i) -> __m256i {
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }

    /// Unsigned × signed bytes: 8 lanes of 4-product sums.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_us(w: __m256i, x: __m256i) -> __m256i {
        let p = _mm256_maddubs_epi16(w, x);
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }

    /// `[d, m, ..]` from the block's first 4 bytes (for Q4_1 `m` is the min; for the other
    /// types lane 1 is unused).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dm_at(b: *const u8) -> __m128 {
        _mm_cvtph_ps(_mm_cvtsi32_si128((b as *const i32).read_unaligned()))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_q8_0(b: *const u8) -> __m256i {
        _mm256_loadu_si256(b.add(2) as *const __m256i)
    }

    /// Q4_0 nibbles as unsigned 0..=15 (the `- 8` is applied to the integer sum).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_q4_0(b: *const u8) -> __m256i {
        nibbles(b.add(2))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_q4_1(b: *const u8) -> __m256i {
        nibbles(b.add(4))
    }

    macro_rules! int_rows {
        ($name:ident, $inner:ident, $load:ident, $dot:ident, $bytes:expr, $has_min:expr, $minus8:expr) => {
            /// `R` activation rows; two accumulators per row (even/odd blocks). The block
            /// scales are formed in a vector: `[dw, mw] * [dx, sx]`; lane 0 scales the integer
            /// dot, lane 1 (Q4_1's min term) is summed in `mins`.
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $inner<const R: usize>(
                w: &[u8],
                a: &Q8Rows,
                row0: usize,
                out: &mut [f32; MAX_ROWS],
            ) {
                let wp = w.as_ptr();
                let nb = a.blocks;
                let qs = a.qs.as_ptr();
                let ds = a.ds.as_ptr() as *const f32;
                let sum8 = a.sum8.as_ptr();
                let mut acc = [[_mm256_setzero_ps(); 2]; R];
                let mut mins = [_mm_setzero_ps(); R];
                // one block into accumulator `$s` (a constant, so `acc` stays in registers)
                macro_rules! step {
                    ($b:expr, $s:literal) => {{
                        let b = $b;
                        let blk = wp.add(b * $bytes);
                        let v = $load(blk);
                        let dm = dm_at(blk);
                        for (r, ac) in acc.iter_mut().enumerate() {
                            let i = (row0 + r) * nb + b;
                            let x = _mm256_loadu_si256(qs.add(i * QK) as *const __m256i);
                            let p = _mm_mul_ps(
                                dm,
                                _mm_castpd_ps(_mm_load_sd(ds.add(2 * i) as *const f64)),
                            );
                            let mut d = $dot(v, x);
                            if $minus8 {
                                // Σ q·x − 8·Σx = Σ (q − 8)·x, exactly
                                d = _mm256_sub_epi32(
                                    d,
                                    _mm256_loadu_si256(sum8.add(i) as *const __m256i),
                                );
                            }
                            ac[$s] = _mm256_fmadd_ps(
                                _mm256_broadcastss_ps(p),
                                _mm256_cvtepi32_ps(d),
                                ac[$s],
                            );
                            if $has_min {
                                mins[r] = _mm_add_ps(mins[r], p);
                            }
                        }
                    }};
                }
                let mut b = 0;
                while b + 2 <= nb {
                    step!(b, 0);
                    step!(b + 1, 1);
                    b += 2;
                }
                if b < nb {
                    step!(b, 0);
                }
                for (r, ac) in acc.iter().enumerate() {
                    let m = if $has_min {
                        _mm_cvtss_f32(_mm_movehdup_ps(mins[r]))
                    } else {
                        0.0
                    };
                    out[r] = hsum(_mm256_add_ps(ac[0], ac[1])) + m;
                }
            }

            /// AVX2 kernel ([`super::super::IntRowsFn`] contract).
            pub unsafe fn $name(
                w: &[u8],
                a: &Q8Rows,
                row0: usize,
                rows: usize,
                out: &mut [f32; MAX_ROWS],
            ) {
                match rows {
                    1 => $inner::<1>(w, a, row0, out),
                    2 => $inner::<2>(w, a, row0, out),
                    3 => $inner::<3>(w, a, row0, out),
                    _ => $inner::<4>(w, a, row0, out),
                }
            }
        };
    }

    int_rows!(
        rows_q8_0,
        rows_q8_0_n,
        load_q8_0,
        dot_ss,
        Q8_0_BYTES,
        false,
        false
    );
    int_rows!(
        rows_q4_0,
        rows_q4_0_n,
        load_q4_0,
        dot_us,
        Q4_0_BYTES,
        false,
        true
    );
    int_rows!(
        rows_q4_1,
        rows_q4_1_n,
        load_q4_1,
        dot_us,
        Q4_1_BYTES,
        true,
        false
    );
}
