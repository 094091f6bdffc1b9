//! Wide register-tiled integer GEMM kernels for `quant_act = 1` with AVX-512 VNNI: up to
//! [`WIDE_ROWS`] (8) activation rows × [`WIDE_COLS`] (2) weight rows, two blocks per step in
//! 512-bit registers. Each weight block pair is expanded once and used by all 8 rows (the 4×4
//! tiles of [`super::int_tile`] expand it for 4), and the per-pair work is 4 instructions:
//!
//! - Q4_0 (`q − 8`) and Q8_0 weights are used as signed bytes against unsigned activations
//!   `x + 128`; the correction `128·Σq` is formed once per weight block (per column and step, in
//!   the same 4-byte lanes), not per row, and subtracted lane by lane; per block the integer sum
//!   stays exact and equal to the scalar reference's;
//! - Q4_1's `min · (dx·Σx)` term is not accumulated per step: the f16 `[d, m]` pairs of a
//!   column are kept for 16 blocks and the term is added once per 8 blocks with one masked FMA
//!   against the `[dx, dx·Σx]` pairs of the activations (the same float products as the
//!   reference, summed in another order);
//! - nibbles are expanded with two 128-bit broadcasts, one masked shift and one AND, and block
//!   scales with two f16 broadcasts and one conversion.
//!
//! Kernels have the [`IntWideFn`] contract. This module must not split work across threads.

use super::act_quant::Q8Rows;

/// Activation rows of one wide tile.
pub const WIDE_ROWS: usize = 8;
/// Weight rows (output columns) of one wide tile.
pub const WIDE_COLS: usize = 2;

/// A wide integer tile: `out[c][r]` = the integer block dot of weight row `c` (rows `rb` bytes
/// apart in `w`) with activation row `row0 + r`, for `r < rows`, `c < cols`.
///
/// # Safety
/// `1 <= rows <= WIDE_ROWS`, `1 <= cols <= WIDE_COLS`, `row0 + rows <= acts.rows`, `w` holds
/// `cols` rows of `acts.blocks` blocks of the kernel's type `rb` bytes apart, and the CPU has
/// the features the kernel was picked for.
pub type IntWideFn = unsafe fn(
    w: &[u8],
    rb: usize,
    acts: &Q8Rows,
    row0: usize,
    rows: usize,
    cols: usize,
    out: &mut [[f32; WIDE_ROWS]; WIDE_COLS],
);

/// The wide kernel for `t` if this CPU has one (AVX-512 VNNI).
pub fn pick(t: super::WeightType) -> Option<IntWideFn> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::WeightType;
        if super::int_tile::has_vnni() {
            let f: IntWideFn = match t {
                WeightType::Q4_0 => avx512::wide_q4_0,
                WeightType::Q4_1 => avx512::wide_q4_1,
                WeightType::Q8_0 => avx512::wide_q8_0,
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
    //! AVX-512 F/BW/VL + VNNI; only called after `int_tile::has_vnni()`.
    use super::{Q8Rows, WIDE_COLS, WIDE_ROWS};
    use crate::quant::{Q4_0_BYTES, Q4_1_BYTES, Q8_0_BYTES, QK};
    use std::arch::x86_64::*;

    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q8_0: u8 = 2;

    /// Blocks whose Q4_1 `[d, m]` pairs are kept before their min term is added.
    const CHUNK: usize = 16;

    /// `[f16(p0) ×8 | f16(p1) ×8]` widened to f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn scales(p0: *const u8, p1: *const u8) -> __m512 {
        let d0 = (p0 as *const u16).read_unaligned() as i16;
        let d1 = (p1 as *const u16).read_unaligned() as i16;
        _mm512_cvtph_ps(_mm256_mask_set1_epi16(_mm256_set1_epi16(d0), 0xFF00, d1))
    }

    /// The 64 weight bytes of blocks `b0`, `b1` in activation order: unsigned nibbles for
    /// Q4_1, signed values for Q4_0 (`q − 8`) and Q8_0.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn quants<const K: u8>(b0: *const u8, b1: *const u8) -> __m512i {
        if K == Q8_0 {
            let lo = _mm256_loadu_si256(b0.add(2) as *const __m256i);
            let hi = _mm256_loadu_si256(b1.add(2) as *const __m256i);
            return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        }
        let off = if K == Q4_1 { 4 } else { 2 };
        let q0 = _mm_loadu_si128(b0.add(off) as *const __m128i);
        let q1 = _mm_loadu_si128(b1.add(off) as *const __m128i);
        // [q0 | q0 | q1 | q1], then the high nibbles into 128-bit lanes 1 and 3
        let v = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(q0), 0xFF00, q1);
        let v = _mm512_mask_srli_epi16(v, 0xFF00_FF00, v, 4);
        let q = _mm512_and_si512(v, _mm512_set1_epi8(15));
        if K == Q4_0 {
            _mm512_sub_epi8(q, _mm512_set1_epi8(8))
        } else {
            q
        }
    }

    /// Q4_1's min term of blocks `cb..ce` added to `acc`: Σ m·(dx·Σx), the odd lanes of the
    /// weights' `[d, m]` pairs `dm` (as read in the block loop) times the activations' `[dx,
    /// dx·Σx]` pairs at `ds` (rows `row0..row0 + R` of `nb` blocks).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn add_q4_1_mins<const R: usize, const C: usize>(
        acc: &mut [[__m512; C]; R],
        dm: &[[u32; CHUNK]; C],
        ds: *const [f32; 2],
        (row0, nb): (usize, usize),
        (cb, ce): (usize, usize),
    ) {
        let mut h = cb;
        while h < ce {
            let valid = (ce - h).min(8);
            let lanes: __mmask16 = ((1u32 << (2 * valid)) - 1) as __mmask16;
            for c in 0..C {
                let mv = _mm512_cvtph_ps(_mm256_loadu_si256(
                    dm[c].as_ptr().add(h - cb) as *const __m256i
                ));
                for (r, ar) in acc.iter_mut().enumerate() {
                    let i = (row0 + r) * nb + h;
                    let sv = _mm512_maskz_loadu_ps(lanes, ds.add(i) as *const f32);
                    ar[c] = _mm512_mask3_fmadd_ps(mv, sv, ar[c], 0xAAAA);
                }
            }
            h += 8;
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn wide<const R: usize, const C: usize, const K: u8>(
        w: &[u8],
        rb: usize,
        a: &Q8Rows,
        row0: usize,
        out: &mut [[f32; WIDE_ROWS]; WIDE_COLS],
    ) {
        let bytes = block_bytes(K);
        let nb = a.blocks;
        let wp = w.as_ptr();
        let qs = a.qs.as_ptr();
        let ds = a.ds.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let didx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
        let bias = _mm512_set1_epi8(-128);
        let mut cb = 0;
        while cb < nb {
            let ce = (cb + CHUNK).min(nb);
            let mut dm = [[0u32; CHUNK]; C];
            let mut b = cb;
            while b < ce {
                let two = b + 1 < ce;
                let mut wq = [_mm512_setzero_si512(); C];
                let mut wd = [_mm512_setzero_ps(); C];
                let mut wc = [_mm512_setzero_si512(); C];
                for c in 0..C {
                    let b0 = wp.add(c * rb + b * bytes);
                    let b1 = if two { b0.add(bytes) } else { b0 };
                    // the next column pair at the same block, one step ahead of its use (a
                    // prefetch never faults; the address is only formed, not dereferenced)
                    _mm_prefetch::<_MM_HINT_T0>(b0.wrapping_add(C * rb + 64) as *const i8);
                    wq[c] = quants::<K>(b0, b1);
                    wd[c] = scales(b0, b1);
                    if K != Q4_1 {
                        // 128·Σq per 4-byte lane: (x + 128)·q − 128·q = x·q, lane by lane
                        wc[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, wq[c]);
                    }
                    if K == Q4_1 {
                        dm[c][b - cb] = (b0 as *const u32).read_unaligned();
                        if two {
                            dm[c][b - cb + 1] = (b1 as *const u32).read_unaligned();
                        }
                    }
                }
                let (bm, dmask): (__mmask64, __mmask8) =
                    if two { (!0, 0xF) } else { (0xFFFF_FFFF, 0x3) };
                for (r, ar) in acc.iter_mut().enumerate() {
                    let i = (row0 + r) * nb + b;
                    let x = _mm512_maskz_loadu_epi8(bm, qs.add(i * QK));
                    let dsv =
                        _mm512_castps128_ps512(_mm_maskz_loadu_ps(dmask, ds.add(i) as *const f32));
                    let xd = _mm512_permutexvar_ps(didx, dsv);
                    // Q4_0/Q8_0: unsigned x + 128 against signed weights (a missing second
                    // block gives 128·q − 128·q = 0 in its lanes)
                    let xu = if K == Q4_1 {
                        x
                    } else {
                        _mm512_xor_si512(x, bias)
                    };
                    for c in 0..C {
                        let p = if K == Q4_1 {
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[c], xu)
                        } else {
                            _mm512_sub_epi32(
                                _mm512_dpbusd_epi32(_mm512_setzero_si512(), xu, wq[c]),
                                wc[c],
                            )
                        };
                        ar[c] =
                            _mm512_fmadd_ps(_mm512_mul_ps(wd[c], xd), _mm512_cvtepi32_ps(p), ar[c]);
                    }
                }
                b += 2;
            }
            if K == Q4_1 {
                add_q4_1_mins(&mut acc, &dm, ds, (row0, nb), (cb, ce));
            }
            cb = ce;
        }
        store_sums(&acc, out);
    }

    /// Each accumulator's lanes summed into `out[column][row]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn store_sums<const R: usize, const C: usize>(
        acc: &[[__m512; C]; R],
        out: &mut [[f32; WIDE_ROWS]; WIDE_COLS],
    ) {
        for (r, ar) in acc.iter().enumerate() {
            for (c, v) in ar.iter().enumerate() {
                out[c][r] = _mm512_reduce_add_ps(*v);
            }
        }
    }

    /// Bytes of one weight block of kind `k`.
    const fn block_bytes(k: u8) -> usize {
        match k {
            Q4_0 => Q4_0_BYTES,
            Q4_1 => Q4_1_BYTES,
            _ => Q8_0_BYTES,
        }
    }

    macro_rules! wide_fn {
        ($name:ident, $kind:expr) => {
            /// AVX-512 VNNI wide tile ([`super::IntWideFn`] contract).
            pub unsafe fn $name(
                w: &[u8],
                rb: usize,
                a: &Q8Rows,
                row0: usize,
                rows: usize,
                cols: usize,
                out: &mut [[f32; WIDE_ROWS]; WIDE_COLS],
            ) {
                macro_rules! by_cols {
                    ($r:literal) => {
                        match cols {
                            1 => wide::<$r, 1, { $kind }>(w, rb, a, row0, out),
                            _ => wide::<$r, 2, { $kind }>(w, rb, a, row0, out),
                        }
                    };
                }
                match rows {
                    1 => by_cols!(1),
                    2 => by_cols!(2),
                    3 => by_cols!(3),
                    4 => by_cols!(4),
                    5 => by_cols!(5),
                    6 => by_cols!(6),
                    7 => by_cols!(7),
                    _ => by_cols!(8),
                }
            }
        };
    }

    wide_fn!(wide_q4_0, Q4_0);
    wide_fn!(wide_q4_1, Q4_1);
    wide_fn!(wide_q8_0, Q8_0);
}
