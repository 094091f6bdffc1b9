//! Dot products of one float weight row (F32, F16 or BF16, raw little-endian bytes) with up to
//! [`MAX_ROWS`] f32 activation rows: the scalar references, the AVX2+FMA+F16C fast paths and
//! AVX-512 (F/BW/VL) paths, picked at run time.
//!
//! Every kernel here has the [`FloatRowsFn`] contract; the caller (the driver in `mod.rs`)
//! checks the sizes. This module must not split work across threads or know about bias/output.

use super::{FloatRowsFn, MAX_ROWS};
use half::{bf16, f16};

/// Reads weight element `i` of an F32 row.
#[inline]
fn w_f32(w: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]])
}

/// Reads weight element `i` of an F16 row.
#[inline]
fn w_f16(w: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([w[2 * i], w[2 * i + 1]]).to_f32()
}

/// Reads weight element `i` of a BF16 row.
#[inline]
fn w_bf16(w: &[u8], i: usize) -> f32 {
    bf16::from_le_bytes([w[2 * i], w[2 * i + 1]]).to_f32()
}

/// Plain sequential dot of every activation row with the weight row read by `get`.
#[inline]
fn rows_ref(
    get: fn(&[u8], usize) -> f32,
    w: &[u8],
    x: &[f32],
    k: usize,
    rows: usize,
    out: &mut [f32; MAX_ROWS],
) {
    for (r, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
        let xr = &x[r * k..(r + 1) * k];
        let mut acc = 0f32;
        for (i, &xv) in xr.iter().enumerate() {
            acc += get(w, i) * xv;
        }
        *o = acc;
    }
}

/// Reference F32 kernel ([`FloatRowsFn`] contract).
pub fn rows_f32_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    rows_ref(w_f32, w, x, k, rows, out)
}

/// Reference F16 kernel ([`FloatRowsFn`] contract).
pub fn rows_f16_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    rows_ref(w_f16, w, x, k, rows, out)
}

/// Reference BF16 kernel ([`FloatRowsFn`] contract).
pub fn rows_bf16_ref(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    rows_ref(w_bf16, w, x, k, rows, out)
}

/// Portable fast F32 kernel: eight independent partial sums the compiler can vectorize.
pub fn rows_f32_portable(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]) {
    for (r, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
        let xr = &x[r * k..(r + 1) * k];
        let mut acc = [0f32; 8];
        let mut xc = xr.chunks_exact(8);
        let mut wc = w[..4 * k].chunks_exact(32);
        for (xs, ws) in (&mut xc).zip(&mut wc) {
            for (j, a) in acc.iter_mut().enumerate() {
                *a += w_f32(ws, j) * xs[j];
            }
        }
        let mut s: f32 = acc.iter().sum();
        let done = k - xc.remainder().len();
        for (i, &xv) in xc.remainder().iter().enumerate() {
            s += w_f32(w, done + i) * xv;
        }
        *o = s;
    }
}

/// The fastest F32 kernel for this CPU.
pub fn pick_f32() -> FloatRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() {
            return avx512::rows_f32;
        }
        if crate::simd::has_avx2_fma() {
            return avx2::rows_f32;
        }
    }
    rows_f32_portable
}

/// How far ahead (bytes) the AVX-512 float row kernels prefetch their weight stream.
/// (The distance the 14336x4096 f16 GEMV streams fastest at on Zen 5.)
pub(crate) const PF_FLOAT_BYTES: usize = 2048;

/// The fastest F16 kernel for this CPU.
pub fn pick_f16() -> FloatRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() {
            return avx512::rows_f16;
        }
        if crate::simd::has_avx2_fma() {
            return avx2::rows_f16;
        }
    }
    rows_f16_ref
}

/// The register-tiled kernel reading F16/BF16 weight rows in place with the arithmetic of
/// [`pick_tile_f32`]'s kernel (the same bits as converting the rows to f32 first), if this CPU
/// has one (AVX-512); the one-row GEMV of float weights uses it, so a row's result does not
/// depend on how many rows run with it.
pub fn pick_tile_direct(t: super::WeightType) -> Option<super::TileF32Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() {
            return match t {
                super::WeightType::F32 => Some(avx512::tile_f32),
                super::WeightType::F16 => Some(avx512::tile_f16),
                super::WeightType::BF16 => Some(avx512::tile_bf16),
                _ => None,
            };
        }
    }
    let _ = t;
    None
}

/// The register-tiled f32 GEMM kernel ([`super::TileF32Fn`]) if this CPU has one (AVX-512).
pub fn pick_tile_f32() -> Option<super::TileF32Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() {
            return Some(avx512::tile_f32);
        }
    }
    None
}

/// Reference for [`super::TileF32Fn`]: plain sequential dots.
pub fn tile_f32_ref(
    w: &[u8],
    x: &[f32],
    k: usize,
    rows: usize,
    cols: usize,
    out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
) {
    for (c, oc) in out.iter_mut().enumerate().take(cols.min(MAX_ROWS)) {
        let mut o = [0f32; MAX_ROWS];
        rows_f32_ref(&w[c * 4 * k..(c + 1) * 4 * k], x, k, rows, &mut o);
        *oc = o;
    }
}

/// The fastest BF16 kernel for this CPU.
pub fn pick_bf16() -> FloatRowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() {
            return avx512::rows_bf16;
        }
        if crate::simd::has_avx2_fma() {
            return avx2::rows_bf16;
        }
    }
    rows_bf16_ref
}

/// The fast whole-row converter to f32 for F16/BF16 (for GEMM tiles), if this CPU has one.
pub fn pick_row_to_f32(t: super::WeightType) -> Option<super::RowToF32Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return match t {
                super::WeightType::F16 => Some(avx2::row_f16),
                super::WeightType::BF16 => Some(avx2::row_bf16),
                _ => None,
            };
        }
    }
    let _ = t;
    None
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! AVX2+FMA+F16C float dots; only called after `simd::has_avx2_fma()`.
    use super::super::MAX_ROWS;
    use super::{w_bf16, w_f16, w_f32};
    use crate::linear::hsum_avx2 as hsum;
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f32(w: *const u8, i: usize) -> __m256 {
        _mm256_loadu_ps((w as *const f32).add(i))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f16(w: *const u8, i: usize) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i) as *const __m128i))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_bf16(w: *const u8, i: usize) -> __m256 {
        let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(w.add(2 * i) as *const __m128i));
        _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
    }

    macro_rules! float_rows {
        ($name:ident, $inner:ident, $load:ident, $get:ident) => {
            /// `R` activation rows, `U` vectors of 8 per step (`U` accumulators per row).
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $inner<const R: usize, const U: usize>(
                w: &[u8],
                x: &[f32],
                k: usize,
                out: &mut [f32; MAX_ROWS],
            ) {
                let wp = w.as_ptr();
                let xp = x.as_ptr();
                let mut acc = [[_mm256_setzero_ps(); U]; R];
                let mut i = 0;
                while i + 8 * U <= k {
                    let mut wv = [_mm256_setzero_ps(); U];
                    for (u, v) in wv.iter_mut().enumerate() {
                        *v = $load(wp, i + 8 * u);
                    }
                    for (r, a) in acc.iter_mut().enumerate() {
                        let xr = xp.add(r * k + i);
                        for u in 0..U {
                            a[u] = _mm256_fmadd_ps(wv[u], _mm256_loadu_ps(xr.add(8 * u)), a[u]);
                        }
                    }
                    i += 8 * U;
                }
                while i + 8 <= k {
                    let wv = $load(wp, i);
                    for (r, a) in acc.iter_mut().enumerate() {
                        a[0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xp.add(r * k + i)), a[0]);
                    }
                    i += 8;
                }
                for (r, a) in acc.iter().enumerate() {
                    let mut s = a[0];
                    for v in &a[1..] {
                        s = _mm256_add_ps(s, *v);
                    }
                    let mut t = hsum(s);
                    for j in i..k {
                        t += $get(w, j) * x[r * k + j];
                    }
                    out[r] = t;
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

    float_rows!(rows_f32, rows_f32_n, load_f32, w_f32);
    float_rows!(rows_f16, rows_f16_n, load_f16, w_f16);
    float_rows!(rows_bf16, rows_bf16_n, load_bf16, w_bf16);

    macro_rules! row_to_f32 {
        ($name:ident, $load:ident, $get:ident) => {
            /// Converts a whole row ([`super::super::RowToF32Fn`] contract).
            #[target_feature(enable = "avx2,fma,f16c")]
            pub unsafe fn $name(w: &[u8], k: usize, out: &mut [f32]) {
                let (wp, op) = (w.as_ptr(), out.as_mut_ptr());
                let mut i = 0;
                while i + 8 <= k {
                    _mm256_storeu_ps(op.add(i), $load(wp, i));
                    i += 8;
                }
                for j in i..k {
                    *op.add(j) = $get(w, j);
                }
            }
        };
    }

    row_to_f32!(row_f16, load_f16, w_f16);
    row_to_f32!(row_bf16, load_bf16, w_bf16);
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! AVX-512 float dots (16 lanes); only called after `simd::has_avx512()`.
    use super::super::MAX_ROWS;
    use super::{w_bf16, w_f16, w_f32};
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_f32(w: *const u8, i: usize) -> __m512 {
        _mm512_loadu_ps((w as *const f32).add(i))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_f16(w: *const u8, i: usize) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(w.add(2 * i) as *const __m256i))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_bf16(w: *const u8, i: usize) -> __m512 {
        let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(w.add(2 * i) as *const __m256i));
        _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))
    }

    /// Software prefetch distance (bytes of weights ahead of the loads) of the float row
    /// kernels; see [`super::PF_FLOAT_BYTES`].
    const PF: usize = super::PF_FLOAT_BYTES;

    macro_rules! float_rows {
        ($name:ident, $inner:ident, $load:ident, $get:ident, $es:expr) => {
            /// `R` activation rows, `U` vectors of 16 per step (`U` accumulators per row).
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            unsafe fn $inner<const R: usize, const U: usize>(
                w: &[u8],
                x: &[f32],
                k: usize,
                out: &mut [f32; MAX_ROWS],
            ) {
                let wp = w.as_ptr();
                let xp = x.as_ptr();
                let mut acc = [[_mm512_setzero_ps(); U]; R];
                let mut i = 0;
                while i + 16 * U <= k {
                    // prefetch hints never fault, so running past the row's end is harmless
                    let mut l = 0;
                    while l < 16 * U * $es {
                        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(i * $es + l + PF) as *const i8);
                        l += 64;
                    }
                    let mut wv = [_mm512_setzero_ps(); U];
                    for (u, v) in wv.iter_mut().enumerate() {
                        *v = $load(wp, i + 16 * u);
                    }
                    for (r, a) in acc.iter_mut().enumerate() {
                        let xr = xp.add(r * k + i);
                        for u in 0..U {
                            a[u] = _mm512_fmadd_ps(wv[u], _mm512_loadu_ps(xr.add(16 * u)), a[u]);
                        }
                    }
                    i += 16 * U;
                }
                while i + 16 <= k {
                    let wv = $load(wp, i);
                    for (r, a) in acc.iter_mut().enumerate() {
                        a[0] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xp.add(r * k + i)), a[0]);
                    }
                    i += 16;
                }
                for (r, a) in acc.iter().enumerate() {
                    let mut s = a[0];
                    for v in &a[1..] {
                        s = _mm512_add_ps(s, *v);
                    }
                    let mut t = _mm512_reduce_add_ps(s);
                    for j in i..k {
                        t += $get(w, j) * x[r * k + j];
                    }
                    out[r] = t;
                }
            }

            /// AVX-512 kernel ([`super::super::FloatRowsFn`] contract).
            pub unsafe fn $name(
                w: &[u8],
                x: &[f32],
                k: usize,
                rows: usize,
                out: &mut [f32; MAX_ROWS],
            ) {
                match rows {
                    1 => $inner::<1, 4>(w, x, k, out),
                    2 => $inner::<2, 4>(w, x, k, out),
                    3 => $inner::<3, 4>(w, x, k, out),
                    _ => $inner::<4, 4>(w, x, k, out),
                }
            }
        };
    }

    float_rows!(rows_f32, rows_f32_n, load_f32, w_f32, 4);
    float_rows!(rows_f16, rows_f16_n, load_f16, w_f16, 2);
    float_rows!(rows_bf16, rows_bf16_n, load_bf16, w_bf16, 2);

    /// Weight element types of [`tile_n`].
    const F32: u8 = 0;
    const F16: u8 = 1;
    const BF16: u8 = 2;

    /// 16 weights from element `i` of the row at `w` (type `T`), as f32; lanes past `m` are 0.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_masked<const T: u8>(w: *const u8, i: usize, m: __mmask16) -> __m512 {
        match T {
            F32 => _mm512_maskz_loadu_ps(m, (w as *const f32).add(i)),
            F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w.add(2 * i) as *const i16)),
            _ => {
                let h = _mm256_maskz_loadu_epi16(m, w.add(2 * i) as *const i16);
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
            }
        }
    }

    /// `R` activation rows × `C` weight rows of type `T` (rows `k` elements apart), 16 lanes per
    /// step, one accumulator per entry; the tail uses masked loads. Widening is exact, so F16/BF16
    /// rows give the bits of the same rows converted to f32 first: the GEMV (weights read in
    /// place) and the GEMM (tiles converted once) compute a row alike.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn tile_n<const T: u8, const R: usize, const C: usize>(
        w: &[u8],
        x: &[f32],
        k: usize,
        out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
    ) {
        let es = if T == F32 { 4 } else { 2 };
        let wp = w.as_ptr();
        let xp = x.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut i = 0;
        while i + 16 <= k {
            let mut wv = [_mm512_setzero_ps(); C];
            for (c, v) in wv.iter_mut().enumerate() {
                let row = wp.add(c * k * es);
                // the stream's next lines (a hint; never faults)
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(i * es + PF) as *const i8);
                *v = load_masked::<T>(row, i, 0xFFFF);
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(xp.add(r * k + i));
                for c in 0..C {
                    a[c] = _mm512_fmadd_ps(wv[c], xv, a[c]);
                }
            }
            i += 16;
        }
        if i < k {
            let m: __mmask16 = ((1u32 << (k - i)) - 1) as __mmask16;
            let mut wv = [_mm512_setzero_ps(); C];
            for (c, v) in wv.iter_mut().enumerate() {
                *v = load_masked::<T>(wp.add(c * k * es), i, m);
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_maskz_loadu_ps(m, xp.add(r * k + i));
                for c in 0..C {
                    a[c] = _mm512_fmadd_ps(wv[c], xv, a[c]);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (c, v) in a.iter().enumerate() {
                out[c][r] = _mm512_reduce_add_ps(*v);
            }
        }
    }

    /// [`tile_n`] dispatched on the row and column counts (1..=MAX_ROWS each).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn tile_t<const T: u8>(
        w: &[u8],
        x: &[f32],
        k: usize,
        rows: usize,
        cols: usize,
        out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
    ) {
        by_rows_cols!(tile_n [T,], rows, cols, (w, x, k, out))
    }

    /// AVX-512 tile kernel over F16 weight rows ([`super::super::TileF32Fn`] contract, but `w`
    /// holds F16 rows).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn tile_f16(
        w: &[u8],
        x: &[f32],
        k: usize,
        rows: usize,
        cols: usize,
        out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
    ) {
        tile_t::<F16>(w, x, k, rows, cols, out)
    }

    /// AVX-512 tile kernel over BF16 weight rows (as [`tile_f16`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn tile_bf16(
        w: &[u8],
        x: &[f32],
        k: usize,
        rows: usize,
        cols: usize,
        out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
    ) {
        tile_t::<BF16>(w, x, k, rows, cols, out)
    }

    /// AVX-512 tile kernel ([`super::super::TileF32Fn`] contract).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn tile_f32(
        w: &[u8],
        x: &[f32],
        k: usize,
        rows: usize,
        cols: usize,
        out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
    ) {
        tile_t::<F32>(w, x, k, rows, cols, out)
    }
}
