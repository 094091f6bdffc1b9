//! Elementwise kernels: `add_to` (x += alpha·y), `add` (out = a + alpha·b), `mul` by a scalar,
//! `mul_to` (x *= y), the in-place ones also with `y` broadcast over rows. Scalar references and
//! AVX2 fast paths (AVX-512 for `add_to`, selected at run time); large inputs are split over the thread pool.
//!
//! Slices of different lengths are treated as their common prefix; this module never panics on
//! sizes and must not know about tensors.

use crate::threads::Threads;

/// Values handed to one task by the flat (same-shape) fast paths.
const FLAT_CHUNK: usize = 32 * 1024;

/// Reference: `x[i] += alpha * y[i]`.
pub fn add_to_ref(x: &mut [f32], y: &[f32], alpha: f32) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += alpha * b;
    }
}

/// Fast: `x[i] += alpha * y[i]` (AVX2/FMA when available), on the calling thread.
pub fn add_to(x: &mut [f32], y: &[f32], alpha: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() && x.len() >= 32 {
            // SAFETY: feature checked at run time.
            unsafe { add_to_avx512(x, y, alpha) };
            return;
        }
        if crate::simd::has_avx2_fma() && x.len() >= 16 {
            // SAFETY: feature checked at run time.
            unsafe { add_to_avx2(x, y, alpha) };
            return;
        }
    }
    add_to_ref(x, y, alpha)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn add_to_avx512(x: &mut [f32], y: &[f32], alpha: f32) {
    use std::arch::x86_64::*;
    let n = x.len().min(y.len());
    let a = _mm512_set1_ps(alpha);
    let mut i = 0;
    while i + 16 <= n {
        let px = x.as_mut_ptr().add(i);
        let v = _mm512_fmadd_ps(a, _mm512_loadu_ps(y.as_ptr().add(i)), _mm512_loadu_ps(px));
        _mm512_storeu_ps(px, v);
        i += 16;
    }
    if i < n {
        let k = ((1u32 << (n - i)) - 1) as __mmask16;
        let px = x.as_mut_ptr().add(i);
        let v = _mm512_fmadd_ps(
            a,
            _mm512_maskz_loadu_ps(k, y.as_ptr().add(i)),
            _mm512_maskz_loadu_ps(k, px),
        );
        _mm512_mask_storeu_ps(px, k, v);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn add_to_avx2(x: &mut [f32], y: &[f32], alpha: f32) {
    use std::arch::x86_64::*;
    let n = x.len().min(y.len());
    let a = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i + 8 <= n {
        let px = x.as_mut_ptr().add(i);
        let v = _mm256_fmadd_ps(a, _mm256_loadu_ps(y.as_ptr().add(i)), _mm256_loadu_ps(px));
        _mm256_storeu_ps(px, v);
        i += 8;
    }
    add_to_ref(&mut x[i..n], &y[i..n], alpha);
}

/// Reference: `x[r][i] += alpha * y[i]` for every row `r` of `x` (rows of `y.len()`; a
/// same-shape `y` is one row).
pub fn add_to_rows_ref(x: &mut [f32], y: &[f32], alpha: f32) {
    if y.is_empty() {
        return;
    }
    for xr in x.chunks_mut(y.len()) {
        for (i, a) in xr.iter_mut().enumerate() {
            *a += alpha * y[i];
        }
    }
}

/// Fast [`add_to_rows_ref`], parallel when large.
pub fn add_to_rows(th: &Threads, x: &mut [f32], y: &[f32], alpha: f32) {
    let d = y.len();
    if d == 0 {
        return;
    }
    if d >= x.len() {
        // same shape: split the flat arrays
        th.for_row_chunks(x, FLAT_CHUNK, 1, |r0, xc| {
            add_to(xc, y.get(r0 * FLAT_CHUNK..).unwrap_or(&[]), alpha)
        });
    } else {
        th.for_row_chunks(x, d, crate::vecmath::min_rows_for(d), |_, xc| {
            for xr in xc.chunks_mut(d) {
                add_to(xr, y, alpha);
            }
        });
    }
}

/// Reference: `out[i] = a[i] + alpha * b[i]`.
pub fn add_ref(a: &[f32], b: &[f32], alpha: f32, out: &mut [f32]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x + alpha * y;
    }
}

/// Fast [`add_ref`], parallel when large.
pub fn add(th: &Threads, a: &[f32], b: &[f32], alpha: f32, out: &mut [f32]) {
    th.for_row_chunks(out, FLAT_CHUNK, 1, |r0, oc| {
        let s = r0 * FLAT_CHUNK;
        let av = a.get(s..).unwrap_or(&[]);
        let n = oc.len().min(av.len());
        oc[..n].copy_from_slice(&av[..n]);
        add_to(&mut oc[..n], b.get(s..).unwrap_or(&[]), alpha);
    });
}

/// Reference: `out[i] = x[i] * v`.
pub fn mul_ref(x: &[f32], v: f32, out: &mut [f32]) {
    for (o, &a) in out.iter_mut().zip(x) {
        *o = a * v;
    }
}

/// Fast [`mul_ref`], parallel when large (the multiply itself auto-vectorises).
pub fn mul(th: &Threads, x: &[f32], v: f32, out: &mut [f32]) {
    th.for_row_chunks(out, FLAT_CHUNK, 1, |r0, oc| {
        mul_ref(x.get(r0 * FLAT_CHUNK..).unwrap_or(&[]), v, oc)
    });
}

/// Reference: `x[r][i] *= y[i]` for every row of `x` (rows of `y.len()`; same shape = one row).
pub fn mul_to_rows_ref(x: &mut [f32], y: &[f32]) {
    if y.is_empty() {
        return;
    }
    for xr in x.chunks_mut(y.len()) {
        for (i, a) in xr.iter_mut().enumerate() {
            *a *= y[i];
        }
    }
}

fn mul_to_inline(x: &mut [f32], y: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() && x.len() >= 16 {
            // SAFETY: feature checked at run time.
            unsafe { mul_to_avx2(x, y) };
            return;
        }
    }
    for (a, b) in x.iter_mut().zip(y) {
        *a *= b;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn mul_to_avx2(x: &mut [f32], y: &[f32]) {
    use std::arch::x86_64::*;
    let n = x.len().min(y.len());
    let mut i = 0;
    while i + 8 <= n {
        let px = x.as_mut_ptr().add(i);
        _mm256_storeu_ps(
            px,
            _mm256_mul_ps(_mm256_loadu_ps(px), _mm256_loadu_ps(y.as_ptr().add(i))),
        );
        i += 8;
    }
    for (a, b) in x[i..n].iter_mut().zip(&y[i..n]) {
        *a *= b;
    }
}

/// Fast [`mul_to_rows_ref`], parallel when large.
pub fn mul_to_rows(th: &Threads, x: &mut [f32], y: &[f32]) {
    let d = y.len();
    if d == 0 {
        return;
    }
    if d >= x.len() {
        th.for_row_chunks(x, FLAT_CHUNK, 1, |r0, xc| {
            mul_to_inline(xc, y.get(r0 * FLAT_CHUNK..).unwrap_or(&[]))
        });
    } else {
        th.for_row_chunks(x, d, crate::vecmath::min_rows_for(d), |_, xc| {
            for xr in xc.chunks_mut(d) {
                mul_to_inline(xr, y);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{nmse, vals};

    #[test]
    fn fast_matches_reference_on_awkward_sizes() {
        let th = Threads::new(2).unwrap();
        for (n, d) in [
            (1usize, 1usize),
            (7, 7),
            (33, 11),
            (1000, 1000),
            (40000, 40000),
            (40000, 100),
        ] {
            let x = vals(n, 1, -1.0, 1.0);
            let y = vals(d, 2, -1.0, 1.0);
            let (mut r, mut f) = (x.clone(), x.clone());
            add_to_rows_ref(&mut r, &y, 0.3);
            add_to_rows(&th, &mut f, &y, 0.3);
            assert!(nmse(&f, &r) < 1e-14, "add_to n={n} d={d}");
            let (mut r, mut f) = (x.clone(), x.clone());
            mul_to_rows_ref(&mut r, &y);
            mul_to_rows(&th, &mut f, &y);
            assert_eq!(f, r, "mul_to n={n} d={d}");
            let b = vals(n, 3, -1.0, 1.0);
            let (mut r, mut f) = (vec![0.0; n], vec![0.0; n]);
            add_ref(&x, &b, -2.0, &mut r);
            add(&th, &x, &b, -2.0, &mut f);
            assert!(nmse(&f, &r) < 1e-14, "add n={n}");
            mul_ref(&x, 1.5, &mut r);
            mul(&th, &x, 1.5, &mut f);
            assert_eq!(f, r, "mul n={n}");
        }
    }

    /// Both SIMD levels of `add_to`, called directly.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn add_to_every_simd_level() {
        for n in [16usize, 17, 31, 32, 47, 100] {
            let y = vals(n, 4, -1.0, 1.0);
            let mut r = vals(n, 5, -1.0, 1.0);
            let (mut a2, mut a5) = (r.clone(), r.clone());
            add_to_ref(&mut r, &y, 0.7);
            if crate::simd::has_avx2_fma() {
                // SAFETY: checked just above.
                unsafe { add_to_avx2(&mut a2, &y, 0.7) };
                assert!(nmse(&a2, &r) < 1e-14, "avx2 n={n}");
            }
            if crate::simd::has_avx512() {
                // SAFETY: checked just above.
                unsafe { add_to_avx512(&mut a5, &y, 0.7) };
                assert!(nmse(&a5, &r) < 1e-14, "avx512 n={n}");
            }
        }
    }

    #[test]
    fn broadcast_reference_is_rowwise() {
        let mut x = vec![1.0f32; 6];
        add_to_rows_ref(&mut x, &[1.0, 2.0, 3.0], 2.0);
        assert_eq!(x, [3.0, 5.0, 7.0, 3.0, 5.0, 7.0]);
        mul_to_rows_ref(&mut x, &[1.0, 0.5, 2.0]);
        assert_eq!(x, [3.0, 2.5, 14.0, 3.0, 2.5, 14.0]);
    }
}
