//! Elementwise kernels: `add_to` (x += alpha * y) and friends. Scalar reference and fast path.

/// Reference: `x[i] += alpha * y[i]`.
pub fn add_to_ref(x: &mut [f32], y: &[f32], alpha: f32) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += alpha * b;
    }
}

/// Fast: `x[i] += alpha * y[i]` (AVX2/FMA when available).
pub fn add_to(x: &mut [f32], y: &[f32], alpha: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() && x.len() >= 16 {
            // SAFETY: feature checked at run time.
            unsafe { add_to_avx2(x, y, alpha) };
            return;
        }
    }
    add_to_ref(x, y, alpha)
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
