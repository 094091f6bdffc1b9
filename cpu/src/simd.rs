//! Run-time CPU feature detection, cached (one atomic load per query), which a program may cap
//! once per process (`limit`) before the first kernel runs.

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

/// The best level this CPU supports.
fn detect() -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        let avx512 = avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl");
        if avx512 {
            return SimdLevel::Avx512;
        }
        if avx2 {
            return SimdLevel::Avx2;
        }
    }
    SimdLevel::Portable
}

/// The level of this process, fixed at its first query or [`limit`].
static LEVEL: OnceLock<SimdLevel> = OnceLock::new();

/// The SIMD level the kernels use: the best this CPU has, or lower after [`limit`].
pub fn level() -> SimdLevel {
    *LEVEL.get_or_init(detect)
}

/// Caps the level at `max` for the rest of the process. Must come before the level is first
/// used (any kernel call fixes it); `Err` with the fixed level when that level is above `max`.
pub fn limit(max: SimdLevel) -> Result<(), SimdLevel> {
    let fixed = *LEVEL.get_or_init(|| detect().min(max));
    if fixed <= max {
        Ok(())
    } else {
        Err(fixed)
    }
}

/// True when AVX2, FMA and F16C are available.
pub fn has_avx2_fma() -> bool {
    level() >= SimdLevel::Avx2
}

/// True when AVX-512 F/BW/VL are available.
pub fn has_avx512() -> bool {
    level() >= SimdLevel::Avx512
}

/// True on CPUs whose hardware prefetcher leaves the block-weight streams short of the read
/// bandwidth, so that the interleaved kernels issue their own prefetch hints: Intel's. On a Xeon
/// (Cascade Lake, 2 threads) the hints took Q4_0 decode from 79 % to 95 % of the read bandwidth;
/// on AMD Zen 5 the kernels streamed at the read bandwidth without them and the hints of the
/// K-quant kernels cost more than they hid.
pub fn wants_weight_prefetch() -> bool {
    static INTEL: OnceLock<bool> = OnceLock::new();
    *INTEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let r = std::arch::x86_64::__cpuid(0);
            let mut vendor = [0u8; 12];
            vendor[..4].copy_from_slice(&r.ebx.to_le_bytes());
            vendor[4..8].copy_from_slice(&r.edx.to_le_bytes());
            vendor[8..].copy_from_slice(&r.ecx.to_le_bytes());
            &vendor == b"GenuineIntel"
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}
