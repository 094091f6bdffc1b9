//! `simd::limit` caps the level the kernels use (its own test binary: the level is per process).

use fastllm_cpu::simd::{self, SimdLevel};

#[test]
fn a_limit_before_first_use_caps_the_level_and_a_higher_one_later_is_refused_only_if_lower() {
    assert_eq!(simd::limit(SimdLevel::Portable), Ok(()));
    assert_eq!(simd::level(), SimdLevel::Portable);
    assert!(!simd::has_avx2_fma() && !simd::has_avx512());
    // a looser cap later is fine: the fixed level is already under it
    assert_eq!(simd::limit(SimdLevel::Avx512), Ok(()));
    assert_eq!(simd::level(), SimdLevel::Portable);
}
