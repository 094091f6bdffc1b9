//! Row normalisations: RMSNorm and LayerNorm over rows of `d` values. The references accumulate
//! in f64, one row at a time; the fast paths use the SIMD reductions of [`crate::vecmath`] and
//! split rows over the thread pool when there are enough of them.
//!
//! This module owns the arithmetic only; shapes are validated by the caller (a short `weight`,
//! `gamma` or `beta` shortens the row that is written, it never reads out of bounds).

use crate::threads::Threads;
use crate::vecmath as vm;

/// Reference RMSNorm: `out = x / sqrt(mean(x²) + eps) * w`, per row of `d`.
pub fn rms_norm_ref(x: &[f32], w: &[f32], out: &mut [f32], d: usize, eps: f32) {
    if d == 0 {
        return;
    }
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss: f64 = xr.iter().map(|&v| v as f64 * v as f64).sum();
        let inv = 1.0 / (ss / d as f64 + eps as f64).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = (v as f64 * inv * g as f64) as f32;
        }
    }
}

/// Fast RMSNorm (same contract as [`rms_norm_ref`]).
pub fn rms_norm(th: &Threads, x: &[f32], w: &[f32], out: &mut [f32], d: usize, eps: f32) {
    if d == 0 {
        return;
    }
    th.for_row_chunks(out, d, vm::min_rows_for(d), |r0, oc| {
        for (xr, or) in x.chunks_exact(d).skip(r0).zip(oc.chunks_exact_mut(d)) {
            let inv = 1.0 / (vm::sum_sq(xr) / d as f32 + eps).sqrt();
            for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
                *o = v * inv * g;
            }
        }
    });
}

/// Reference LayerNorm: `out = (x - mean) / sqrt(var + eps) * gamma + beta`, per row of `d`
/// (biased variance).
pub fn layer_norm_ref(x: &[f32], gamma: &[f32], beta: &[f32], out: &mut [f32], d: usize, eps: f32) {
    if d == 0 {
        return;
    }
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean: f64 = xr.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
        let var: f64 = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for (((o, &v), &g), &b) in or.iter_mut().zip(xr).zip(gamma).zip(beta) {
            *o = ((v as f64 - mean) * inv * g as f64 + b as f64) as f32;
        }
    }
}

/// Fast LayerNorm (same contract as [`layer_norm_ref`]).
pub fn layer_norm(
    th: &Threads,
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    out: &mut [f32],
    d: usize,
    eps: f32,
) {
    if d == 0 {
        return;
    }
    th.for_row_chunks(out, d, vm::min_rows_for(d), |r0, oc| {
        for (xr, or) in x.chunks_exact(d).skip(r0).zip(oc.chunks_exact_mut(d)) {
            let mean = vm::sum(xr) / d as f32;
            let var = vm::sum_sq_diff(xr, mean) / d as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for (((o, &v), &g), &b) in or.iter_mut().zip(xr).zip(gamma).zip(beta) {
                *o = (v - mean) * inv * g + b;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{nmse, vals};

    #[test]
    fn fast_matches_reference_on_awkward_sizes() {
        let th = Threads::new(2).unwrap();
        for (rows, d) in [(1usize, 1usize), (3, 7), (5, 33), (64, 100), (300, 576)] {
            let x = vals(rows * d, 1, -2.0, 3.0);
            let w = vals(d, 2, 0.5, 1.5);
            let b = vals(d, 3, -1.0, 1.0);
            let (mut r, mut f) = (vec![0.0; rows * d], vec![0.0; rows * d]);
            rms_norm_ref(&x, &w, &mut r, d, 1e-5);
            rms_norm(&th, &x, &w, &mut f, d, 1e-5);
            assert!(nmse(&f, &r) < 1e-10, "rms {rows}x{d}");
            layer_norm_ref(&x, &w, &b, &mut r, d, 1e-5);
            layer_norm(&th, &x, &w, &b, &mut f, d, 1e-5);
            assert!(nmse(&f, &r) < 1e-10, "layer {rows}x{d}");
        }
    }

    #[test]
    fn reference_matches_hand_computed_row() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut o = [0.0; 4];
        rms_norm_ref(&x, &[1.0; 4], &mut o, 4, 0.0);
        let r = (7.5f64).sqrt() as f32;
        for (v, e) in o.iter().zip([1.0 / r, 2.0 / r, 3.0 / r, 4.0 / r]) {
            assert!((v - e).abs() < 1e-6);
        }
        layer_norm_ref(&x, &[2.0; 4], &[1.0; 4], &mut o, 4, 0.0);
        let s = (1.25f64).sqrt();
        for (v, e) in o.iter().zip([-1.5f64, -0.5, 0.5, 1.5]) {
            assert!((*v as f64 - (e / s * 2.0 + 1.0)).abs() < 1e-6);
        }
    }
}
