//! Dots of one Q5_0 weight row (layout in `crate::quant`) with up to [`MAX_ROWS`] activation
//! rows: exact ([`FloatRowsFn`]: each block dequantized, then f32 FMAs) and `quant_act`
//! ([`IntRowsFn`]: against Q8_0 activation blocks, `d·dx·(Σ q·x − 16·Σx)` summed exactly in
//! integers per block, as llama.cpp's `vec_dot_q5_0_q8_0`), each as a scalar reference and an
//! AVX2 kernel (`quant_act` also AVX-512 VNNI, two blocks a step), plus the row → f32 converter
//! of the GEMM path.
//!
//! Kernels have their type's contract (`k % 32 == 0`, checked by the caller). This module must
//! not split work across threads or know about bias/output.

use super::act_quant::Q8Rows;
use super::{FloatRowsFn, IntRowsFn, RowToF32Fn, MAX_ROWS};
use crate::quant::{dequantize_q5_0, q5_0_value, Q5_0_BYTES, QK};
use half::f16;

/// Reference Q5_0 × f32 kernel.
pub fn rows_q5_0_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    super::block_ref::block_rows_ref::<QK>((dequantize_q5_0, Q5_0_BYTES), w, x, k, rows, out)
}

/// Reference Q5_0 × Q8_0 kernel.
pub fn rows_q5_0_int_ref(
    w: &[u8],
    a: &Q8Rows,
    row0: usize,
    rows: usize,
    out: &mut [f32; MAX_ROWS],
) {
    for (r, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
        let base = (row0 + r) * a.blocks;
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(Q5_0_BYTES).take(a.blocks).enumerate() {
            let xq = &a.qs[(base + b) * QK..(base + b + 1) * QK];
            let isum: i32 = xq
                .iter()
                .enumerate()
                .map(|(j, &x)| (q5_0_value(blk, j) as i32 - 16) * x as i32)
                .sum();
            let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            acc += d * a.ds[base + b][0] * isum as f32;
        }
        *o = acc;
    }
}

/// The fastest exact Q5_0 kernel for this CPU.
pub fn pick() -> FloatRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return avx2::rows_q5_0;
        }
    }
    rows_q5_0_ref
}

/// The fastest Q5_0 × Q8_0 kernel for this CPU.
pub fn pick_int() -> IntRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if super::int_tile::has_vnni() {
            return avx512::rows_q5_0_int;
        }
        if crate::simd::has_avx2_fma() {
            return avx2::rows_q5_0_int;
        }
    }
    rows_q5_0_int_ref
}

/// The Q5_0 × Q8_0 tile of several weight rows for this CPU, if it has one (the sums of
/// [`pick_int`]'s kernel, entry by entry).
pub fn pick_int_tile() -> Option<super::IntTileFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if super::int_tile::has_vnni() {
            return Some(avx512::tile_q5_0);
        }
    }
    None
}

/// Whole-row Q5_0 dequantization (the GEMM path's tile converter).
pub fn row_to_f32() -> RowToF32Fn {
    row_q5_0
}

/// # Safety
/// [`RowToF32Fn`] contract (`k % 32 == 0`).
unsafe fn row_q5_0(w: &[u8], k: usize, out: &mut [f32]) {
    dequantize_q5_0(&w[..k / QK * Q5_0_BYTES], &mut out[..k]);
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! AVX2 Q5_0 kernels; only called after `simd::has_avx2_fma()`.
    use super::super::act_quant::Q8Rows;
    use super::super::block_float::avx2::{rows, SignedBlock};
    use super::super::MAX_ROWS;
    use crate::linear::hsum_avx2 as hsum;
    use crate::quant::{Q5_0_BYTES, QK};
    use std::arch::x86_64::*;

    /// The low four bits of the 32 values of the block at `b`, in element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn nibbles(b: *const u8) -> __m256i {
        let t = _mm_loadu_si128(b.add(6) as *const __m128i);
        _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16(t, 4), t),
            _mm256_set1_epi8(15),
        )
    }

    /// The 32 five-bit values (0..=31) of the block at `b`, in element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(b: *const u8) -> __m256i {
        let nib = nibbles(b);
        let qh = _mm256_set1_epi32((b.add(2) as *const i32).read_unaligned());
        // byte i gets byte i / 8 of qh (each 128-bit lane holds qh's 4 bytes at 0..4)
        let idx = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, idx), bit), bit);
        _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(16)))
    }

    /// The block's f16 scale at `b`, widened.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn d_at(b: *const u8) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            (b as *const u16).read_unaligned() as i32,
        )))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn int_n<const R: usize>(w: &[u8], a: &Q8Rows, row0: usize, out: &mut [f32; MAX_ROWS]) {
        let nb = a.blocks;
        let (wp, xs, ds, s8) = (
            w.as_ptr(),
            a.qs.as_ptr(),
            a.ds.as_ptr() as *const f32,
            a.sum8.as_ptr(),
        );
        let one = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..nb {
            let blk = wp.add(b * Q5_0_BYTES);
            let v = values(blk);
            let d = d_at(blk);
            for (r, ac) in acc.iter_mut().enumerate() {
                let i = (row0 + r) * nb + b;
                let x = _mm256_loadu_si256(xs.add(i * QK) as *const __m256i);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(v, x), one);
                // Σ q·x − 16·Σx = Σ (q − 16)·x, exactly (sum8 lane 0 holds 8·Σx)
                let c = _mm256_slli_epi32(_mm256_loadu_si256(s8.add(i) as *const __m256i), 1);
                let p = _mm256_cvtepi32_ps(_mm256_sub_epi32(p, c));
                *ac = _mm256_fmadd_ps(_mm256_set1_ps(d * *ds.add(2 * i)), p, *ac);
            }
        }
        for (r, ac) in acc.iter().enumerate() {
            out[r] = hsum(*ac);
        }
    }

    /// Q5_0 blocks for the shared exact kernel: values `q − 16` and the f16 scale.
    pub(in super::super) struct Q5_0;

    impl SignedBlock for Q5_0 {
        const BYTES: usize = Q5_0_BYTES;
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn values(b: *const u8) -> __m256i {
            _mm256_sub_epi8(values(b), _mm256_set1_epi8(16))
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scale(b: *const u8) -> f32 {
            d_at(b)
        }
    }

    /// AVX2 Q5_0 × Q8_0 kernel ([`super::IntRowsFn`] contract).
    pub unsafe fn rows_q5_0_int(w: &[u8], a: &Q8Rows, row0: usize, n: usize, o: &mut [f32; 4]) {
        match n {
            1 => int_n::<1>(w, a, row0, o),
            2 => int_n::<2>(w, a, row0, o),
            3 => int_n::<3>(w, a, row0, o),
            _ => int_n::<4>(w, a, row0, o),
        }
    }

    /// AVX2 Q5_0 × f32 kernel ([`super::FloatRowsFn`] contract).
    pub unsafe fn rows_q5_0(w: &[u8], x: &[f32], k: usize, n: usize, o: &mut [f32; MAX_ROWS]) {
        rows::<Q5_0>(w, x, k, n, o)
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! AVX-512 VNNI Q5_0 × Q8_0 kernels; only called after `int_tile::has_vnni()`.
    use super::super::act_quant::Q8Rows;
    use super::super::kquant_simd::pair_ps;
    use super::super::MAX_ROWS;
    use super::avx2::{d_at, nibbles};
    use crate::quant::{Q5_0_BYTES, QK};
    use std::arch::x86_64::*;

    /// The 32 five-bit values (0..=31) of the block at `b`, in element order: the block's 32
    /// high bits (bit i for element i) are a byte mask that adds 16.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn values(b: *const u8) -> __m256i {
        let nib = nibbles(b);
        let qh = (b.add(2) as *const u32).read_unaligned();
        _mm256_mask_add_epi8(nib, qh, nib, _mm256_set1_epi8(16))
    }

    /// `R` activation rows × `C` weight rows (`rb` bytes apart), two blocks a step (the last one
    /// alone): every entry summed the same way whatever `R` and `C`, so a row's bits do not
    /// depend on the tile.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tile_n<const R: usize, const C: usize>(
        w: &[u8],
        rb: usize,
        a: &Q8Rows,
        row0: usize,
        out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
    ) {
        let nb = a.blocks;
        let (wp, xs, ds) = (w.as_ptr(), a.qs.as_ptr(), a.ds.as_ptr() as *const f32);
        let sixteen = _mm512_set1_epi8(16);
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut b = 0;
        while b + 2 <= nb {
            let mut v = [_mm512_setzero_si512(); C];
            let mut d = [[0f32; 2]; C];
            for c in 0..C {
                let (b0, b1) = (
                    wp.add(c * rb + b * Q5_0_BYTES),
                    wp.add(c * rb + (b + 1) * Q5_0_BYTES),
                );
                v[c] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(values(b0)), values(b1));
                d[c] = [d_at(b0), d_at(b1)];
            }
            for (r, ar) in acc.iter_mut().enumerate() {
                let i = (row0 + r) * nb + b;
                let x = _mm512_loadu_si512(xs.add(i * QK) as *const _);
                let zero = _mm512_setzero_si512();
                let corr = _mm512_dpbusd_epi32(zero, sixteen, x);
                let (dx0, dx1) = (*ds.add(2 * i), *ds.add(2 * i + 2));
                for c in 0..C {
                    let p = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, v[c], x), corr);
                    let s = pair_ps(d[c][0] * dx0, d[c][1] * dx1);
                    ar[c] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), ar[c]);
                }
            }
            b += 2;
        }
        if b < nb {
            for c in 0..C {
                let blk = wp.add(c * rb + b * Q5_0_BYTES);
                let (v, d) = (values(blk), d_at(blk));
                for (r, ar) in acc.iter_mut().enumerate() {
                    let i = (row0 + r) * nb + b;
                    let x = _mm256_loadu_si256(xs.add(i * QK) as *const __m256i);
                    let zero = _mm256_setzero_si256();
                    let p = _mm256_sub_epi32(
                        _mm256_dpbusd_epi32(zero, v, x),
                        _mm256_dpbusd_epi32(zero, _mm512_castsi512_si256(sixteen), x),
                    );
                    let t =
                        _mm256_mul_ps(_mm256_set1_ps(d * *ds.add(2 * i)), _mm256_cvtepi32_ps(p));
                    ar[c] = _mm512_add_ps(ar[c], _mm512_zextps256_ps512(t));
                }
            }
        }
        for (r, ar) in acc.iter().enumerate() {
            for (c, v) in ar.iter().enumerate() {
                out[c][r] = _mm512_reduce_add_ps(*v);
            }
        }
    }

    /// AVX-512 VNNI Q5_0 × Q8_0 tile ([`super::IntTileFn`] contract).
    pub unsafe fn tile_q5_0(
        w: &[u8],
        rb: usize,
        a: &Q8Rows,
        row0: usize,
        rows: usize,
        cols: usize,
        out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
    ) {
        by_rows_cols!(tile_n [], rows, cols, (w, rb, a, row0, out))
    }

    /// AVX-512 VNNI Q5_0 × Q8_0 kernel ([`super::IntRowsFn`] contract): the tile of one weight
    /// row.
    pub unsafe fn rows_q5_0_int(w: &[u8], a: &Q8Rows, row0: usize, n: usize, o: &mut [f32; 4]) {
        let mut t = [[0f32; MAX_ROWS]; MAX_ROWS];
        tile_q5_0(w, w.len(), a, row0, n, 1, &mut t);
        o.copy_from_slice(&t[0]);
    }
}
