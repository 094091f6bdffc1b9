//! Activations and softmax: SiLU, GELU (tanh and erf forms), the gated forms SwiGLU and GeGLU
//! (`act(x[..d]) · x[d..]`), GPT-OSS's clamped SwiGLU over separate gate and up inputs
//! ([`clamped_swiglu`]), SiLU times a separate up input ([`silu_mul`]), soft-capping
//! (`cap·tanh(x/cap)`) and a max-subtracted softmax over rows. References compute each value in
//! f64; fast paths are AVX2 (vector `exp`/`tanh`/`erf`; SiLU on AVX-512 where the CPU has it)
//! and split large inputs over the thread pool.
//!
//! Slices of different lengths are treated as their common prefix; this module never panics on
//! sizes and must not know about tensors.

use crate::erf::{erf_f64, erf_fast, erfc_f64};
use crate::threads::Threads;
use crate::vecmath as vm;

/// `sqrt(2/π)`, the GELU tanh-form constant.
const GELU_K: f64 = 0.797_884_560_802_865_4;
/// Chunk of a flat array handed to one task.
const FLAT_CHUNK: usize = 4096;
/// Chunk of [`silu_mul`] (a decode step's MLP width splits over the threads: an exp and a
/// divide per value cost more than a task's hand-off from 2048 values on).
const MAP_CHUNK: usize = 1024;

/// A pointwise activation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    /// `x·σ(x)`.
    Silu,
    /// `0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))`.
    GeluTanh,
    /// `0.5·x·(1 + erf(x/√2))`.
    GeluErf,
    /// `cap·tanh(x/cap)`.
    SoftCap(f32),
}

/// The activation of one value, in f64 (the reference).
pub fn act_ref(act: Act, x: f32) -> f32 {
    let x = x as f64;
    let y = match act {
        Act::Silu => x / (1.0 + (-x).exp()),
        Act::GeluTanh => 0.5 * x * (1.0 + (GELU_K * (x + 0.044715 * x * x * x)).tanh()),
        Act::GeluErf => {
            // 1 + erf(z) = erfc(-z): no cancellation for negative z
            let z = x * std::f64::consts::FRAC_1_SQRT_2;
            if z < 0.0 {
                0.5 * x * erfc_f64(-z)
            } else {
                0.5 * x * (1.0 + erf_f64(z))
            }
        }
        Act::SoftCap(c) => {
            let c = c as f64;
            c * (x / c).tanh()
        }
    };
    y as f32
}

/// The activation of one value in f32 (the fast path's scalar tail).
fn act_f32(act: Act, x: f32) -> f32 {
    match act {
        Act::Silu => x / (1.0 + (-x).exp()),
        // 0.5·x·(1 + tanh z) = x·σ(2z), exact algebra without cancellation for negative x
        Act::GeluTanh => x / (1.0 + (-2.0 * GELU_K as f32 * (x + 0.044715 * x * x * x)).exp()),
        Act::GeluErf => 0.5 * x * (1.0 + erf_fast(x * std::f32::consts::FRAC_1_SQRT_2)),
        Act::SoftCap(c) => c * (x / c).tanh(),
    }
}

/// Reference: `out[i] = act(x[i])`.
pub fn act_map_ref(act: Act, x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = act_ref(act, v);
    }
}

/// Fast single-threaded `out[i] = act(x[i])`.
fn act_map_inline(act: Act, x: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if act == Act::Silu && crate::simd::has_avx512() {
            // SAFETY: AVX-512 checked at run time.
            unsafe { avx512_silu(x, out) };
            return;
        }
        if crate::simd::has_avx2_fma() {
            // SAFETY: AVX2/FMA checked at run time.
            let done = unsafe { avx2_map(act, x, out) };
            for (o, &v) in out.iter_mut().zip(x).skip(done) {
                *o = act_f32(act, v);
            }
            return;
        }
    }
    for (o, &v) in out.iter_mut().zip(x) {
        *o = act_f32(act, v);
    }
}

/// Fast: `out[i] = act(x[i])`, parallel over chunks when large.
pub fn act_map(th: &Threads, act: Act, x: &[f32], out: &mut [f32]) {
    let n = out.len().min(x.len());
    let out = &mut out[..n];
    th.for_row_chunks(out, FLAT_CHUNK.min(n.max(1)), 4, |r0, oc| {
        let start = r0 * FLAT_CHUNK.min(n.max(1));
        act_map_inline(act, x.get(start..).unwrap_or(&[]), oc);
    });
}

/// Reference gated activation over rows of `2d`: `out[r][i] = act(x[r][i]) · x[r][d + i]`.
pub fn gated_ref(act: Act, x: &[f32], out: &mut [f32], d: usize) {
    if d == 0 {
        return;
    }
    for (xr, or) in x.chunks_exact(2 * d).zip(out.chunks_exact_mut(d)) {
        let (g, u) = xr.split_at(d);
        for ((o, &a), &b) in or.iter_mut().zip(g).zip(u) {
            *o = (act_ref(act, a) as f64 * b as f64) as f32;
        }
    }
}

/// Fast gated activation (same contract as [`gated_ref`]).
pub fn gated(th: &Threads, act: Act, x: &[f32], out: &mut [f32], d: usize) {
    if d == 0 {
        return;
    }
    th.for_row_chunks(out, d, vm::min_rows_for(d), |r0, oc| {
        for (xr, or) in x.chunks_exact(2 * d).skip(r0).zip(oc.chunks_exact_mut(d)) {
            let (g, u) = xr.split_at(d);
            act_map_inline(act, g, or);
            for (o, &b) in or.iter_mut().zip(u) {
                *o *= b;
            }
        }
    });
}

/// The parameters of GPT-OSS's clamped SwiGLU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GluClamp {
    /// The sigmoid's slope (`g·σ(alpha·g)`).
    pub alpha: f32,
    /// The gate is clamped to at most `limit`, the up input to `[-limit, limit]`.
    pub limit: f32,
}

/// Reference clamped SwiGLU (in f64): `out = (clamp(up, −L, L) + 1) · g·σ(alpha·g)` with
/// `g = min(gate, L)`, elementwise over the common length of the slices.
pub fn clamped_swiglu_ref(gate: &[f32], up: &[f32], out: &mut [f32], c: GluClamp) {
    let (a, l) = (c.alpha as f64, c.limit as f64);
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let g = (g as f64).min(l);
        let u = (u as f64).clamp(-l, l);
        *o = ((u + 1.0) * g / (1.0 + (-a * g).exp())) as f32;
    }
}

/// Fast clamped SwiGLU (same contract as [`clamped_swiglu_ref`]): the sigmoid through the
/// vector SiLU (`g·σ(a·g) = silu(a·g) / a`), split over the pool in chunks.
pub fn clamped_swiglu(th: &Threads, gate: &[f32], up: &[f32], out: &mut [f32], c: GluClamp) {
    let n = out.len().min(gate.len()).min(up.len());
    let out = &mut out[..n];
    if c.alpha == 0.0 {
        return clamped_swiglu_ref(gate, up, out, c);
    }
    let rl = FLAT_CHUNK.min(n.max(1));
    th.for_row_chunks(out, rl, 1, |r0, oc| {
        let start = r0 * rl;
        let (g, u) = (&gate[start..start + oc.len()], &up[start..start + oc.len()]);
        let t: Vec<f32> = g.iter().map(|&g| c.alpha * g.min(c.limit)).collect();
        act_map_inline(Act::Silu, &t, oc);
        for (o, &u) in oc.iter_mut().zip(u) {
            *o = *o / c.alpha * (u.clamp(-c.limit, c.limit) + 1.0);
        }
    });
}

/// Reference `out[i] = silu(gate[i]) · up[i]` over the common length: the SiLU in f64, rounded,
/// then the f32 product (what [`act_map_ref`] followed by a product gives).
pub fn silu_mul_ref(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = act_ref(Act::Silu, g) * u;
    }
}

/// Fast [`silu_mul_ref`]: the values [`act_map`] then an f32 product give, bit for bit, in one
/// pass; large inputs split over the pool.
pub fn silu_mul(th: &Threads, gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = out.len().min(gate.len()).min(up.len());
    let out = &mut out[..n];
    let rl = MAP_CHUNK.min(n.max(1));
    th.for_row_chunks(out, rl, 1, |r0, oc| {
        let start = r0 * rl;
        let (g, u) = (&gate[start..start + oc.len()], &up[start..start + oc.len()]);
        act_map_inline(Act::Silu, g, oc);
        for (o, &u) in oc.iter_mut().zip(u) {
            *o *= u;
        }
    });
}

/// Reference softmax over rows of `n` (max-subtracted, f64 sums).
pub fn softmax_ref(x: &[f32], out: &mut [f32], n: usize) {
    if n == 0 {
        return;
    }
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let m = xr.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let s: f64 = xr.iter().map(|&v| (v as f64 - m).exp()).sum();
        for (o, &v) in or.iter_mut().zip(xr) {
            *o = ((v as f64 - m).exp() / s) as f32;
        }
    }
}

/// Fast softmax over rows of `n`.
pub fn softmax(th: &Threads, x: &[f32], out: &mut [f32], n: usize) {
    if n == 0 {
        return;
    }
    th.for_row_chunks(out, n, vm::min_rows_for(n), |r0, oc| {
        for (xr, or) in x.chunks_exact(n).skip(r0).zip(oc.chunks_exact_mut(n)) {
            or.copy_from_slice(xr);
            let m = vm::max(or);
            let s = vm::exp_sub_sum(or, m);
            vm::scale(or, 1.0 / s);
        }
    });
}

/// AVX2 body of [`act_map_inline`]; returns how many leading elements it wrote.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_map(act: Act, x: &[f32], out: &mut [f32]) -> usize {
    use crate::vecmath::avx2 as v;
    use std::arch::x86_64::*;
    let n = x.len().min(out.len());
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        let a = _mm256_loadu_ps(x.as_ptr().add(i));
        let y = match act {
            Act::Silu => v::silu(a),
            Act::GeluTanh => {
                // x·σ(2z) with z = √(2/π)(x + 0.044715x³)
                let a3 = _mm256_mul_ps(_mm256_mul_ps(a, a), a);
                let m2z = _mm256_mul_ps(
                    _mm256_set1_ps(-2.0 * GELU_K as f32),
                    _mm256_fmadd_ps(_mm256_set1_ps(0.044715), a3, a),
                );
                _mm256_div_ps(a, _mm256_add_ps(one, v::exp(m2z)))
            }
            Act::GeluErf => {
                let z = _mm256_mul_ps(a, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
                _mm256_mul_ps(_mm256_mul_ps(half, a), _mm256_add_ps(one, erf_avx2(z)))
            }
            Act::SoftCap(c) => {
                let t = v::tanh(_mm256_mul_ps(a, _mm256_set1_ps(1.0 / c)));
                _mm256_mul_ps(_mm256_set1_ps(c), t)
            }
        };
        _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
        i += 8;
    }
    i
}

/// `out[i] = x[i]·σ(x[i])` on 16 lanes (the AVX2 path's arithmetic: `x / (1 + exp(-x))`
/// with the same `exp` scheme), the tail masked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn avx512_silu(x: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = x.len().min(out.len());
    let one = _mm512_set1_ps(1.0);
    let mut i = 0;
    while i < n {
        let m = if n - i >= 16 {
            0xFFFF
        } else {
            ((1u32 << (n - i)) - 1) as __mmask16
        };
        let a = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
        let e = crate::vecmath::avx512::exp(_mm512_sub_ps(_mm512_setzero_ps(), a));
        let y = _mm512_div_ps(a, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), m, y);
        i += 16;
    }
}

/// [`erf_fast`] on 8 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn erf_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use crate::erf::{ERF_P, ERF_Q};
    use std::arch::x86_64::*;
    let x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(4.0)), _mm256_set1_ps(-4.0));
    let x2 = _mm256_mul_ps(x, x);
    let mut p = _mm256_set1_ps(ERF_P[0]);
    for c in &ERF_P[1..] {
        p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(*c));
    }
    let mut q = _mm256_set1_ps(ERF_Q[0]);
    for c in &ERF_Q[1..] {
        q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(*c));
    }
    _mm256_div_ps(_mm256_mul_ps(x, p), q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_mul_equals_silu_then_product_bit_for_bit() {
        let th = Threads::new(2).unwrap();
        for n in [0usize, 1, 7, 8, 9, 4864, 8192 + 13] {
            let g = crate::testutil::vals(n, 3, -12.0, 12.0);
            let u = crate::testutil::vals(n, 4, -2.0, 2.0);
            let mut want = vec![0f32; n];
            act_map(&th, Act::Silu, &g, &mut want);
            want.iter_mut().zip(&u).for_each(|(w, &u)| *w *= u);
            let mut got = vec![f32::NAN; n];
            silu_mul(&th, &g, &u, &mut got);
            assert_eq!(got, want, "n = {n}");
            let mut r = vec![0f32; n];
            act_map_ref(Act::Silu, &g, &mut r);
            r.iter_mut().zip(&u).for_each(|(w, &u)| *w *= u);
            let mut got = vec![f32::NAN; n];
            silu_mul_ref(&g, &u, &mut got);
            assert_eq!(got, r, "reference, n = {n}");
        }
    }
    use crate::testutil::{nmse, vals};

    const ACTS: [Act; 5] = [
        Act::Silu,
        Act::GeluTanh,
        Act::GeluErf,
        Act::SoftCap(30.0),
        Act::SoftCap(0.7),
    ];

    #[test]
    fn fast_matches_reference_on_awkward_sizes() {
        let th = Threads::new(2).unwrap();
        for n in [1usize, 7, 9, 33, 100, 5000, 20001] {
            // few values: keep them where no output is tiny (a lone tiny value makes NMSE relative)
            let lim = if n < 32 { 2.0 } else { 8.0 };
            let x = vals(n, n as u64, -lim, lim);
            for act in ACTS {
                let (mut r, mut f) = (vec![0.0; n], vec![0.0; n]);
                act_map_ref(act, &x, &mut r);
                act_map(&th, act, &x, &mut f);
                // the fast erf has ~2e-7 absolute error, the others a few ulp
                let tol = if act == Act::GeluErf { 1e-9 } else { 1e-12 };
                assert!(nmse(&f, &r) < tol, "{act:?} n={n}: {}", nmse(&f, &r));
            }
        }
        for (rows, d) in [(1usize, 1usize), (3, 7), (2, 33), (40, 1000)] {
            let x = vals(rows * 2 * d, 5, -4.0, 4.0);
            for act in [Act::Silu, Act::GeluTanh, Act::GeluErf] {
                let (mut r, mut f) = (vec![0.0; rows * d], vec![0.0; rows * d]);
                gated_ref(act, &x, &mut r, d);
                gated(&th, act, &x, &mut f, d);
                let tol = if act == Act::GeluErf { 1e-9 } else { 1e-12 };
                assert!(nmse(&f, &r) < tol, "gated {act:?} {rows}x{d}");
            }
            let x = vals(rows * d, 6, -20.0, 20.0);
            let (mut r, mut f) = (vec![0.0; rows * d], vec![0.0; rows * d]);
            softmax_ref(&x, &mut r, d);
            softmax(&th, &x, &mut f, d);
            assert!(nmse(&f, &r) < 1e-12, "softmax {rows}x{d}");
        }
    }

    #[test]
    fn reference_values() {
        assert!((act_ref(Act::Silu, 1.0) - 0.731_058_6).abs() < 1e-6);
        // gelu(1) exact = 0.8413447460685429, tanh form = 0.8411919906082768
        assert!((act_ref(Act::GeluErf, 1.0) as f64 - 0.841_344_746_068_542_9).abs() < 1e-7);
        assert!((act_ref(Act::GeluTanh, 1.0) as f64 - 0.841_191_990_608_276_8).abs() < 1e-7);
        assert!((act_ref(Act::SoftCap(2.0), 2.0) as f64 - 2.0 * 1f64.tanh()).abs() < 1e-7);
        let mut o = [0.0; 3];
        softmax_ref(&[1.0, 2.0, 3.0], &mut o, 3);
        let s = 1f64.exp() + 2f64.exp() + 3f64.exp();
        assert!((o[2] as f64 - 3f64.exp() / s).abs() < 1e-7);
    }
}

#[cfg(test)]
mod glu_tests {
    use super::*;
    use crate::testutil::{nmse, vals};

    #[test]
    fn clamped_swiglu_fast_matches_reference_on_awkward_sizes() {
        let th = Threads::new(2).unwrap();
        let c = GluClamp {
            alpha: 1.702,
            limit: 7.0,
        };
        // values beyond the limit on both sides, lengths around the chunk and vector sizes
        for n in [
            1usize,
            7,
            9,
            33,
            100,
            5000,
            FLAT_CHUNK + 3,
            3 * FLAT_CHUNK - 1,
        ] {
            let g = vals(n, n as u64, -12.0, 12.0);
            let u = vals(n, n as u64 + 1, -12.0, 12.0);
            let (mut r, mut f) = (vec![0.0; n], vec![0.0; n]);
            clamped_swiglu_ref(&g, &u, &mut r, c);
            clamped_swiglu(&th, &g, &u, &mut f, c);
            assert!(nmse(&f, &r) < 1e-12, "n={n}: {}", nmse(&f, &r));
        }
    }

    #[test]
    fn clamped_swiglu_clamps_both_inputs() {
        let c = GluClamp {
            alpha: 1.702,
            limit: 7.0,
        };
        let mut o = [0.0f32; 3];
        clamped_swiglu_ref(&[100.0, 1.0, -3.0], &[2.0, -50.0, 100.0], &mut o, c);
        let glu = |g: f64| g / (1.0 + (-1.702 * g).exp());
        let want = [3.0 * glu(7.0), -6.0 * glu(1.0), 8.0 * glu(-3.0)];
        for (a, b) in o.iter().zip(want) {
            assert!(
                (*a as f64 - b).abs() < 1e-5 * b.abs().max(1.0),
                "{a} vs {b}"
            );
        }
    }
}
