//! Vector primitives shared by the non-matrix kernels: sums, dot products, maxima and a
//! vectorised `exp` (Cephes polynomial), each with an AVX-512 path and an AVX2+FMA path chosen at
//! run time (see [`crate::simd`]) and a portable fallback. Slices of different lengths are treated as their common prefix.
//!
//! This module owns only arithmetic over slices; it must not know about ops or tensors.

/// Rows of `row_len` elements that make one parallel task worth its overhead (about 32k values).
pub fn min_rows_for(row_len: usize) -> usize {
    (32 * 1024 / row_len.max(1)).max(1)
}

/// Sum of `x`.
pub fn sum(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() && x.len() >= 16 {
            // SAFETY: AVX-512 F/BW/VL checked at run time.
            return unsafe { avx512::sum(x) };
        }
        if crate::simd::has_avx2_fma() && x.len() >= 16 {
            // SAFETY: AVX2/FMA checked at run time.
            return unsafe { avx2::sum(x) };
        }
    }
    x.iter().sum()
}

/// Sum of squares of `x`.
pub fn sum_sq(x: &[f32]) -> f32 {
    dot(x, x)
}

/// Sum of `(x - m)²`.
pub fn sum_sq_diff(x: &[f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() && x.len() >= 16 {
            // SAFETY: AVX-512 F/BW/VL checked at run time.
            return unsafe { avx512::sum_sq_diff(x, m) };
        }
        if crate::simd::has_avx2_fma() && x.len() >= 16 {
            // SAFETY: AVX2/FMA checked at run time.
            return unsafe { avx2::sum_sq_diff(x, m) };
        }
    }
    x.iter().map(|v| (v - m) * (v - m)).sum()
}

/// Dot product of `a` and `b` (over the common prefix).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() && a.len().min(b.len()) >= 16 {
            // SAFETY: AVX-512 F/BW/VL checked at run time.
            return unsafe { avx512::dot(a, b) };
        }
        if crate::simd::has_avx2_fma() && a.len().min(b.len()) >= 16 {
            // SAFETY: AVX2/FMA checked at run time.
            return unsafe { avx2::dot(a, b) };
        }
    }
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Largest value of `x` (`-inf` for an empty slice; NaN is ignored).
pub fn max(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() && x.len() >= 16 {
            // SAFETY: AVX-512 F/BW/VL checked at run time.
            return unsafe { avx512::max(x) };
        }
        if crate::simd::has_avx2_fma() && x.len() >= 16 {
            // SAFETY: AVX2/FMA checked at run time.
            return unsafe { avx2::max(x) };
        }
    }
    x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// `x[i] = exp(x[i] - m)`; returns the sum of the new values.
pub fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() && x.len() >= 8 {
            // SAFETY: AVX-512 F/BW/VL checked at run time.
            return unsafe { avx512::exp_sub_sum(x, m) };
        }
        if crate::simd::has_avx2_fma() && x.len() >= 8 {
            // SAFETY: AVX2/FMA checked at run time.
            return unsafe { avx2::exp_sub_sum(x, m) };
        }
    }
    let mut s = 0f32;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        s += *v;
    }
    s
}

/// `y[i] += a * x[i]`.
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    crate::elementwise::add_to(y, x, a)
}

/// `y[i] *= a`.
pub fn scale(y: &mut [f32], a: f32) {
    for v in y.iter_mut() {
        *v *= a;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! AVX2+FMA bodies; every function requires the features (checked by the callers).
    use std::arch::x86_64::*;

    /// Horizontal sum of the 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Horizontal max of the 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub unsafe fn hmax(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_max_ps(lo, hi);
        let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_max_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// `exp(x)` on 8 lanes (Cephes `expf`: range reduction by ln 2, degree-6 polynomial; about
    /// 2 ulp; inputs clamped to ±88.37).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub unsafe fn exp(x: __m256) -> __m256 {
        let x = _mm256_min_ps(x, _mm256_set1_ps(88.376_26));
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.336_54));
        let fx = _mm256_fmadd_ps(
            x,
            _mm256_set1_ps(std::f32::consts::LOG2_E),
            _mm256_set1_ps(0.5),
        );
        let fx = _mm256_floor_ps(fx);
        let x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693_359_4), x);
        let x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.121_944_4e-4), x);
        let mut y = _mm256_set1_ps(1.987_569_1e-4);
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.398_199_9e-3));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.333_452e-3));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.166_579_6e-2));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(0.166_666_65));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(0.5));
        let x2 = _mm256_mul_ps(x, x);
        y = _mm256_fmadd_ps(y, x2, x);
        y = _mm256_add_ps(y, _mm256_set1_ps(1.0));
        let e = _mm256_cvttps_epi32(fx);
        let e = _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23);
        _mm256_mul_ps(y, _mm256_castsi256_ps(e))
    }

    /// `tanh(x)` on 8 lanes as `sign(x)·(1 - e)/(1 + e)` with `e = exp(-2|x|)`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub unsafe fn tanh(x: __m256) -> __m256 {
        let sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0));
        let ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
        let e = exp(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0)));
        let one = _mm256_set1_ps(1.0);
        let t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
        _mm256_or_ps(t, sign)
    }

    /// `x·σ(x)` on 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub unsafe fn silu(x: __m256) -> __m256 {
        let e = exp(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    }

    /// Sum of `x`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn sum(x: &[f32]) -> f32 {
        let n = x.len();
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x.as_ptr().add(i)));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x.as_ptr().add(i + 8)));
            i += 16;
        }
        let mut s = hsum(_mm256_add_ps(a0, a1));
        for v in &x[i..] {
            s += v;
        }
        s
    }

    /// Sum of `(x - m)²`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn sum_sq_diff(x: &[f32], m: f32) -> f32 {
        let n = x.len();
        let mv = _mm256_set1_ps(m);
        let mut a0 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            let d = _mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), mv);
            a0 = _mm256_fmadd_ps(d, d, a0);
            i += 8;
        }
        let mut s = hsum(a0);
        for v in &x[i..] {
            s += (v - m) * (v - m);
        }
        s
    }

    /// Dot product over the common prefix.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
        );
        let mut i = 0;
        while i + 32 <= n {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), a0);
            a1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                a1,
            );
            a2 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 16)),
                _mm256_loadu_ps(pb.add(i + 16)),
                a2,
            );
            a3 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 24)),
                _mm256_loadu_ps(pb.add(i + 24)),
                a3,
            );
            i += 32;
        }
        while i + 8 <= n {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), a0);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    /// Largest value (NaN skipped).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn max(x: &[f32]) -> f32 {
        let n = x.len();
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i + 8 <= n {
            // max_ps returns the second operand when either is NaN: keep `m` second so NaN is skipped
            m = _mm256_max_ps(_mm256_loadu_ps(x.as_ptr().add(i)), m);
            i += 8;
        }
        let mut s = hmax(m);
        for &v in &x[i..] {
            s = s.max(v);
        }
        s
    }

    /// `x = exp(x - m)`; returns the sum.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
        let n = x.len();
        let mv = _mm256_set1_ps(m);
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            let p = x.as_mut_ptr().add(i);
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
            _mm256_storeu_ps(p, e);
            acc = _mm256_add_ps(acc, e);
            i += 8;
        }
        let mut s = hsum(acc);
        for v in &mut x[i..] {
            *v = (*v - m).exp();
            s += *v;
        }
        s
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    //! AVX-512 bodies; every function requires F/BW/VL (checked by the callers). Tails use masked
    //! loads and stores.
    use std::arch::x86_64::*;

    /// Mask of the first `n` (< 16) lanes.
    #[inline]
    fn tail(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }

    /// `exp(x)` on 16 lanes (the Cephes scheme of the AVX2 path; `scalef` applies 2^n).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    pub unsafe fn exp(x: __m512) -> __m512 {
        let x = _mm512_min_ps(x, _mm512_set1_ps(88.376_26));
        let x = _mm512_max_ps(x, _mm512_set1_ps(-87.336_54));
        let fx = _mm512_fmadd_ps(
            x,
            _mm512_set1_ps(std::f32::consts::LOG2_E),
            _mm512_set1_ps(0.5),
        );
        let fx = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(fx);
        let x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693_359_4), x);
        let x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.121_944_4e-4), x);
        let mut y = _mm512_set1_ps(1.987_569_1e-4);
        y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.398_199_9e-3));
        y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.333_452e-3));
        y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.166_579_6e-2));
        y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(0.166_666_65));
        y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(0.5));
        y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), x);
        y = _mm512_add_ps(y, _mm512_set1_ps(1.0));
        _mm512_scalef_ps(y, fx)
    }

    /// Sum of `x`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn sum(x: &[f32]) -> f32 {
        let n = x.len();
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            acc = _mm512_add_ps(acc, _mm512_loadu_ps(x.as_ptr().add(i)));
            i += 16;
        }
        if i < n {
            acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(tail(n - i), x.as_ptr().add(i)));
        }
        _mm512_reduce_add_ps(acc)
    }

    /// Sum of `(x - m)²`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn sum_sq_diff(x: &[f32], m: f32) -> f32 {
        let n = x.len();
        let mv = _mm512_set1_ps(m);
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            let d = _mm512_sub_ps(_mm512_loadu_ps(x.as_ptr().add(i)), mv);
            acc = _mm512_fmadd_ps(d, d, acc);
            i += 16;
        }
        if i < n {
            let k = tail(n - i);
            let d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x.as_ptr().add(i)), mv);
            acc = _mm512_fmadd_ps(d, d, acc);
        }
        _mm512_reduce_add_ps(acc)
    }

    /// Dot product over the common prefix.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut i = 0;
        while i + 32 <= n {
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), a0);
            a1 = _mm512_fmadd_ps(
                _mm512_loadu_ps(pa.add(i + 16)),
                _mm512_loadu_ps(pb.add(i + 16)),
                a1,
            );
            i += 32;
        }
        while i + 16 <= n {
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), a0);
            i += 16;
        }
        if i < n {
            let k = tail(n - i);
            a1 = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(k, pa.add(i)),
                _mm512_maskz_loadu_ps(k, pb.add(i)),
                a1,
            );
        }
        _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
    }

    /// Largest value (NaN skipped).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn max(x: &[f32]) -> f32 {
        let n = x.len();
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut m = ninf;
        let mut i = 0;
        while i + 16 <= n {
            // NaN in the first operand yields the second: NaN is skipped
            m = _mm512_max_ps(_mm512_loadu_ps(x.as_ptr().add(i)), m);
            i += 16;
        }
        if i < n {
            m = _mm512_max_ps(
                _mm512_mask_loadu_ps(ninf, tail(n - i), x.as_ptr().add(i)),
                m,
            );
        }
        _mm512_reduce_max_ps(m)
    }

    /// `x = exp(x - m)`; returns the sum.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
        let n = x.len();
        let mv = _mm512_set1_ps(m);
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            let p = x.as_mut_ptr().add(i);
            let e = exp(_mm512_sub_ps(_mm512_loadu_ps(p), mv));
            _mm512_storeu_ps(p, e);
            acc = _mm512_add_ps(acc, e);
            i += 16;
        }
        if i < n {
            let k = tail(n - i);
            let p = x.as_mut_ptr().add(i);
            let e = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p), mv));
            _mm512_mask_storeu_ps(p, k, e);
            acc = _mm512_mask_add_ps(acc, k, acc, e);
        }
        _mm512_reduce_add_ps(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761u32) ^ seed) % 2000) as f32 / 1000.0 - 1.0)
            .collect()
    }

    #[test]
    fn primitives_match_scalar_on_awkward_sizes() {
        for n in [0usize, 1, 7, 15, 16, 33, 100, 1023] {
            let a = data(n, 1);
            let b = data(n, 7);
            let d: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!(
                (dot(&a, &b) as f64 - d).abs() <= 1e-4 * (1.0 + d.abs()),
                "dot n={n}"
            );
            let s: f64 = a.iter().map(|x| *x as f64).sum();
            assert!(
                (sum(&a) as f64 - s).abs() <= 1e-4 * (1.0 + s.abs()),
                "sum n={n}"
            );
            let m = a.iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y));
            assert_eq!(max(&a), m, "max n={n}");
            let mut e = a.clone();
            let se = exp_sub_sum(&mut e, 0.5);
            for (x, y) in e.iter().zip(&a) {
                let r = ((*y as f64) - 0.5).exp();
                assert!(((*x as f64) - r).abs() <= 3e-7 * r, "exp n={n}");
            }
            let rs: f64 = a.iter().map(|y| (*y as f64 - 0.5).exp()).sum();
            assert!(
                (se as f64 - rs).abs() <= 1e-5 * rs.max(1.0),
                "exp sum n={n}"
            );
        }
    }

    /// Both SIMD levels, called directly (the dispatcher only ever picks the best one).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_simd_level_matches_scalar() {
        let levels = [crate::simd::has_avx2_fma(), crate::simd::has_avx512()];
        for n in [1usize, 5, 16, 17, 31, 33, 64, 100, 1023] {
            let a = data(n, 3);
            let b = data(n, 11);
            let d: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            let s: f32 = a.iter().sum();
            let ssd: f32 = a.iter().map(|v| (v - 0.1) * (v - 0.1)).sum();
            let m = a.iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y));
            let mut e_ref = a.clone();
            let es_ref: f32 = e_ref
                .iter_mut()
                .map(|v| {
                    *v = (*v - 0.2).exp();
                    *v
                })
                .sum();
            for (level, on) in levels.iter().enumerate() {
                if !on {
                    continue;
                }
                // SAFETY: the feature set of each level was checked just above.
                let (dd, ss, sd, mm, es, e) = unsafe {
                    let mut e = a.clone();
                    if level == 0 {
                        (
                            avx2::dot(&a, &b),
                            avx2::sum(&a),
                            avx2::sum_sq_diff(&a, 0.1),
                            avx2::max(&a),
                            avx2::exp_sub_sum(&mut e, 0.2),
                            e,
                        )
                    } else {
                        (
                            avx512::dot(&a, &b),
                            avx512::sum(&a),
                            avx512::sum_sq_diff(&a, 0.1),
                            avx512::max(&a),
                            avx512::exp_sub_sum(&mut e, 0.2),
                            e,
                        )
                    }
                };
                let close = |x: f32, y: f32| (x - y).abs() <= 1e-5 * (1.0 + y.abs());
                assert!(
                    close(dd, d) && close(ss, s) && close(sd, ssd) && close(es, es_ref),
                    "level {level} n={n}"
                );
                assert_eq!(mm, m, "max level {level} n={n}");
                for (x, y) in e.iter().zip(&e_ref) {
                    assert!((x - y).abs() <= 4e-7 * y, "exp level {level} n={n}");
                }
            }
        }
    }

    #[test]
    fn exp_is_accurate_over_its_range() {
        let xs: Vec<f32> = (0..4000).map(|i| -80.0 + i as f32 * 0.04).collect();
        let mut e = xs.clone();
        exp_sub_sum(&mut e, 0.0);
        for (x, y) in xs.iter().zip(&e) {
            let r = (*x as f64).exp();
            assert!(
                ((*y as f64) - r).abs() <= 4e-7 * r,
                "exp({x}) = {y}, want {r}"
            );
        }
    }
}
