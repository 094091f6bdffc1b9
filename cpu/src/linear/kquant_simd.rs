//! SIMD unpacking shared by the K-quant kernels ([`super::kquant_dot`], [`super::kquant_int`],
//! [`super::kquant_low_int`]): the f16 super-block scales, the 32-value planes of Q4_K/Q5_K
//! nibbles (with Q5_K's fifth bits), of Q6_K's six-bit values and of Q2_K/Q3_K's 2-bit fields,
//! and the AVX-512 lane permutations that spread 16 per-group factors over `vpdpbusd` results.
//! Byte layouts are `crate::kquant`'s and `crate::kquant_low`'s.
//!
//! Every function needs the CPU features in its `target_feature` list (callers check them).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// The little-endian f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16v(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
        (p as *const u16).read_unaligned() as i32,
    )))
}

/// Two i16 scale lanes: `a` for the first 16 values of a 32-value block, `b` for the last 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn halves(a: i16, b: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a))
}

/// `Σ w·x` over each 16-value half of a 32-value block times its scale (the i16 lanes of `scv`,
/// [`halves`]), as f32 lanes (summed: the block's dot): signed weights `sw` against the
/// activation block at `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn signed_block_dot(sw: __m256i, scv: __m256i, x: *const i8) -> __m256 {
    let xv = _mm256_loadu_si256(x as *const __m256i);
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(sw, sw), _mm256_sign_epi8(xv, sw));
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, scv))
}

/// Sub-blocks `2c` and `2c + 1` (32 values each, `c` in 0..4) of a Q4_K (`Q5 = false`) or Q5_K
/// super-block: the low / high nibbles of the 32 `qs` bytes at `qs`, with Q5_K's fifth bits
/// from `qh` (its 32 `qh` bytes; ignored for Q4_K).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q45_pair<const Q5: bool>(qs: *const u8, qh: __m256i, c: usize) -> [__m256i; 2] {
    let m4 = _mm256_set1_epi8(0xF);
    let v = _mm256_loadu_si256(qs as *const __m256i);
    let mut lo = _mm256_and_si256(v, m4);
    let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if Q5 {
        let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32));
        let b0 = _mm256_and_si256(h, _mm256_set1_epi8(1));
        let b1 = _mm256_and_si256(_mm256_srli_epi16(h, 1), _mm256_set1_epi8(1));
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(b0, 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(b1, 4));
    }
    [lo, hi]
}

/// The 4 × 32 six-bit values (0..=63, offset 32) of half `h` of the Q6_K super-block at `blk`:
/// values `128h + 32g ..` in register `g`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6_half(blk: *const u8, h: usize) -> [__m256i; 4] {
    let (m4, m2) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(3));
    let ql0 = _mm256_loadu_si256(blk.add(64 * h) as *const __m256i);
    let ql1 = _mm256_loadu_si256(blk.add(64 * h + 32) as *const __m256i);
    let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
    let hb = |s: i32| {
        let t = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s));
        _mm256_slli_epi16(_mm256_and_si256(t, m2), 4)
    };
    [
        _mm256_or_si256(_mm256_and_si256(ql0, m4), hb(0)),
        _mm256_or_si256(_mm256_and_si256(ql1, m4), hb(2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), hb(4)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), hb(6)),
    ]
}

/// 2-bit plane `s` (0..4) of 32 `qs` bytes: `(v >> 2s) & 3` per byte.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn low2_plane_avx2(v: __m256i, s: usize) -> __m256i {
    let t = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * s as i32));
    _mm256_and_si256(t, _mm256_set1_epi8(3))
}

/// Two 256-bit halves as one 512-bit register (`lo` in the low half).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// `a` in the low eight lanes and `b` in the high eight (the scales of two blocks side by side).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn pair_ps(a: f32, b: f32) -> __m512 {
    let lo = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(a)));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        lo,
        _mm256_castps_pd(_mm256_set1_ps(b)),
    ))
}

/// Prefetches `bytes` bytes from `p` into L1, one cache line at a time (`p` may point past the
/// end of its buffer: a prefetch never faults).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn prefetch(p: *const u8, bytes: usize) {
    let mut o = 0;
    while o < bytes {
        _mm_prefetch(p.wrapping_add(o) as *const i8, _MM_HINT_T0);
        o += 64;
    }
}

/// Lane `g` (a group of 16 values of a super-block) → the word of its activation block's scale
/// `dx` in 8 `[dx, sx]` pairs loaded as 16 floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn group_dx() -> __m512i {
    _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14)
}

/// For the `vpdpbusd` result of values `64p..64p + 64` (lanes of 4 values), the permutation
/// `[p]` that puts the factor of group `4p + lane / 4` in every lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn group_quads() -> [__m512i; 4] {
    std::array::from_fn(|p| {
        let g = 4 * p as i32;
        _mm512_setr_epi32(
            g,
            g,
            g,
            g,
            g + 1,
            g + 1,
            g + 1,
            g + 1,
            g + 2,
            g + 2,
            g + 2,
            g + 2,
            g + 3,
            g + 3,
            g + 3,
            g + 3,
        )
    })
}
