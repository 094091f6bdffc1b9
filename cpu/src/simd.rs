//! Run-time CPU feature detection, cached (one atomic load per query).

use std::sync::OnceLock;

/// Detected SIMD level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// No usable x86 SIMD beyond the baseline (or not x86).
    Portable,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL (with AVX2/FMA).
    Avx512,
}

fn detect() -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    {
        if std::env::var_os("FASTLLM_NO_SIMD").is_some() {
            return SimdLevel::Portable;
        }
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        let avx512 = avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && std::env::var_os("FASTLLM_NO_AVX512").is_none();
        if avx512 {
            return SimdLevel::Avx512;
        }
        if avx2 {
            return SimdLevel::Avx2;
        }
    }
    SimdLevel::Portable
}

/// The SIMD level of this CPU (set `FASTLLM_NO_SIMD` / `FASTLLM_NO_AVX512` to force lower).
pub fn level() -> SimdLevel {
    static L: OnceLock<SimdLevel> = OnceLock::new();
    *L.get_or_init(detect)
}

/// True when AVX2, FMA and F16C are available.
pub fn has_avx2_fma() -> bool {
    level() >= SimdLevel::Avx2
}

/// True when AVX-512 F/BW/VL are available.
pub fn has_avx512() -> bool {
    level() >= SimdLevel::Avx512
}
