//! f32 matrix products for one batch entry: `MatMul` (`out[m, n] = alpha · A[m, k] · B[k, n]`)
//! and `MatMulTransB` (`out[m, n] = alpha · A[m, k] · B[n, k]ᵀ`), scalar references and fast
//! paths. `MatMul` streams rows of `B` into an output row with AXPYs (the output row stays in
//! L1); `MatMulTransB` is a `Linear` with F32 weights and reuses its driver.
//!
//! Sizes are validated here (errors are `String`s); batching is the caller's job.

use super::{linear, linear_ref, LinearArgs, WeightType};
use crate::threads::Threads;

/// The sizes of one product.
#[derive(Clone, Copy, Debug)]
pub struct MatMulShape {
    /// Rows of `A` and of the output.
    pub m: usize,
    /// Inner dimension.
    pub k: usize,
    /// Columns of the output.
    pub n: usize,
}

fn check(s: MatMulShape, a: &[f32], b: &[f32], out: &[f32]) -> Result<(), String> {
    for (name, len, rows, cols) in [
        ("input0", a.len(), s.m, s.k),
        ("input1", b.len(), s.k, s.n),
        ("output", out.len(), s.m, s.n),
    ] {
        if len < rows.saturating_mul(cols) {
            return Err(format!("{name} has {len} values, need {rows} x {cols}"));
        }
    }
    Ok(())
}

/// Reference `MatMul`: `out[i][j] = alpha * Σ_l a[i][l] * b[l][j]`, summed in order of `l`.
pub fn matmul_ref(
    s: MatMulShape,
    a: &[f32],
    b: &[f32],
    alpha: f32,
    out: &mut [f32],
) -> Result<(), String> {
    check(s, a, b, out)?;
    for i in 0..s.m {
        for j in 0..s.n {
            let mut acc = 0f32;
            for l in 0..s.k {
                acc += a[i * s.k + l] * b[l * s.n + j];
            }
            out[i * s.n + j] = alpha * acc;
        }
    }
    Ok(())
}

/// `y += s * x` (AVX2 when available).
fn axpy(y: &mut [f32], s: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            // SAFETY: feature checked at run time.
            unsafe { axpy_avx2(y, s, x) };
            return;
        }
    }
    for (a, b) in y.iter_mut().zip(x) {
        *a += s * b;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(y: &mut [f32], s: f32, x: &[f32]) {
    use std::arch::x86_64::*;
    let n = y.len().min(x.len());
    let sv = _mm256_set1_ps(s);
    let (yp, xp) = (y.as_mut_ptr(), x.as_ptr());
    let mut i = 0;
    while i + 16 <= n {
        let a = _mm256_fmadd_ps(sv, _mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)));
        let b = _mm256_fmadd_ps(
            sv,
            _mm256_loadu_ps(xp.add(i + 8)),
            _mm256_loadu_ps(yp.add(i + 8)),
        );
        _mm256_storeu_ps(yp.add(i), a);
        _mm256_storeu_ps(yp.add(i + 8), b);
        i += 16;
    }
    while i + 8 <= n {
        let a = _mm256_fmadd_ps(sv, _mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)));
        _mm256_storeu_ps(yp.add(i), a);
        i += 8;
    }
    for j in i..n {
        *yp.add(j) += s * *xp.add(j);
    }
}

/// Fast `MatMul`: output rows split across `threads`, each row built by AXPYs of `B`'s rows.
pub fn matmul(
    threads: &Threads,
    s: MatMulShape,
    a: &[f32],
    b: &[f32],
    alpha: f32,
    out: &mut [f32],
) -> Result<(), String> {
    check(s, a, b, out)?;
    if s.m == 0 || s.n == 0 {
        return Ok(());
    }
    let min_rows = (1usize << 15).div_ceil(s.k.max(1) * s.n).max(1);
    threads.for_row_chunks(&mut out[..s.m * s.n], s.n, min_rows, |i0, chunk| {
        for (t, row) in chunk.chunks_exact_mut(s.n).enumerate() {
            let i = i0 + t;
            row.fill(0.0);
            for l in 0..s.k {
                axpy(row, a[i * s.k + l], &b[l * s.n..(l + 1) * s.n]);
            }
            scale(row, alpha);
        }
    });
    Ok(())
}

fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 slice is a valid byte slice of 4x the length (u8 has alignment 1).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn trans_b_args<'a>(s: MatMulShape, a: &'a [f32], b: &'a [f32]) -> LinearArgs<'a> {
    LinearArgs {
        x: a,
        rows: s.m,
        k: s.k,
        w: as_bytes(b),
        wtype: WeightType::F32,
        n: s.n,
        bias: None,
        quant_act: false,
    }
}

fn scale(out: &mut [f32], alpha: f32) {
    if alpha != 1.0 {
        out.iter_mut().for_each(|v| *v *= alpha);
    }
}

/// Reference `MatMulTransB`: `out[i][j] = alpha * Σ_l a[i][l] * b[j][l]`, summed in order.
pub fn matmul_trans_b_ref(
    s: MatMulShape,
    a: &[f32],
    b: &[f32],
    alpha: f32,
    out: &mut [f32],
) -> Result<(), String> {
    trans_b_through(s, a, b, alpha, out, linear_ref)
}

/// Fast `MatMulTransB` (the `Linear` F32 kernels and driver).
pub fn matmul_trans_b(
    threads: &Threads,
    s: MatMulShape,
    a: &[f32],
    b: &[f32],
    alpha: f32,
    out: &mut [f32],
) -> Result<(), String> {
    trans_b_through(s, a, b, alpha, out, |args, o| linear(threads, args, o))
}

/// `MatMulTransB` as a `Linear` with F32 weights run by `linear_fn`, then scaled by `alpha`.
fn trans_b_through(
    s: MatMulShape,
    a: &[f32],
    b: &[f32],
    alpha: f32,
    out: &mut [f32],
    linear_fn: impl FnOnce(&LinearArgs, &mut [f32]) -> Result<(), String>,
) -> Result<(), String> {
    check(s, a, b, out)?;
    linear_fn(&trans_b_args(s, a, b), out)?;
    scale(&mut out[..s.m * s.n], alpha);
    Ok(())
}
