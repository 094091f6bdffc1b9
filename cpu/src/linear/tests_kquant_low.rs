//! Tests of the Q2_K/Q3_K kernels on random super-blocks (every bit pattern of values, scales
//! and mins, with sane f16 `d`/`dmin`): the SIMD integer kernels against the scalar reference,
//! and the reference's integer math against a float64 dot of the dequantized weights with the
//! dequantized Q8_0 activations.

use super::act_quant::{quantize_rows_ref, Q8Rows};
use super::{kquant_int, kquant_low_int, IntRowsFn, WeightType, MAX_ROWS};
use crate::kquant_low::{dequantize_q2_k, dequantize_q3_k, Q2_K_BYTES, Q3_K_BYTES};
use crate::testutil::vals;
use half::f16;

/// `n` random super-blocks of `t` whose f16 fields hold small finite values.
fn blocks(t: WeightType, n: usize, seed: u64) -> Vec<u8> {
    let (bytes, f16_at): (usize, &[usize]) = match t {
        WeightType::Q2K => (Q2_K_BYTES, &[80, 82]),
        _ => (Q3_K_BYTES, &[108]),
    };
    let raw = vals(n * bytes, seed, 0.0, 256.0);
    let mut b: Vec<u8> = raw.iter().map(|v| (*v as u32).min(255) as u8).collect();
    for (s, blk) in b.chunks_exact_mut(bytes).enumerate() {
        for (i, &at) in f16_at.iter().enumerate() {
            let v = 0.002 + ((s * 7 + i * 3) % 11) as f32 / 1000.0;
            blk[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
    b
}

fn dequant(t: WeightType, w: &[u8], out: &mut [f32]) {
    match t {
        WeightType::Q2K => dequantize_q2_k(w, out),
        _ => dequantize_q3_k(w, out),
    }
}

/// Row `r` of `q` as f32 (`d · q`).
fn act_row(q: &Q8Rows, r: usize) -> Vec<f32> {
    (0..q.blocks * 32)
        .map(|e| {
            let i = r * q.blocks + e / 32;
            q.ds[i][0] * q.qs[i * 32 + e % 32] as f32
        })
        .collect()
}

fn kernels(t: WeightType) -> Vec<(&'static str, IntRowsFn)> {
    #[allow(unused_mut)]
    let mut out: Vec<(&'static str, IntRowsFn)> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            out.push((
                "avx2",
                match t {
                    WeightType::Q2K => kquant_low_int::avx2::rows_q2_k,
                    _ => kquant_low_int::avx2::rows_q3_k,
                },
            ));
        }
        if super::int_tile::has_vnni() {
            out.push((
                "avx512-vnni",
                match t {
                    WeightType::Q2K => kquant_low_int::avx512::rows_q2_k,
                    _ => kquant_low_int::avx512::rows_q3_k,
                },
            ));
        }
    }
    out
}

#[test]
fn low_kquant_int_kernels_match_reference_and_f64() {
    for t in [WeightType::Q2K, WeightType::Q3K] {
        let rf = kquant_int::pick_ref(t).unwrap();
        for (sbs, seed) in [(1usize, 1u64), (3, 2), (7, 3)] {
            let k = 256 * sbs;
            let w = blocks(t, sbs, seed);
            let mut wd = vec![0f32; k];
            dequant(t, &w, &mut wd);
            let x = vals((MAX_ROWS + 1) * k, seed + 10, -2.0, 2.0);
            let mut q = Q8Rows::default();
            quantize_rows_ref(&x, MAX_ROWS + 1, k, &mut q).unwrap();
            q.prepare_sum16();
            for rows in 1..=MAX_ROWS {
                let mut want = [0f32; MAX_ROWS];
                // SAFETY: `w` holds `q.blocks / 8` super-blocks; rows 1..=rows exist.
                unsafe { rf(&w, &q, 1, rows, &mut want) };
                // per row: the float64 dot and the sum of |terms| (the scale of rounding errors)
                let f64_dots: Vec<(f64, f64)> = (0..rows)
                    .map(|r| {
                        let xr = act_row(&q, 1 + r);
                        let terms = wd.iter().zip(&xr).map(|(a, b)| *a as f64 * *b as f64);
                        terms.fold((0.0, 0.0), |(s, m), v| (s + v, m + v.abs()))
                    })
                    .collect();
                for (r, &(exact, scale)) in f64_dots.iter().enumerate() {
                    let err = (want[r] as f64 - exact).abs();
                    assert!(
                        err <= 1e-5 * scale,
                        "{} k={k} ref vs f64: {} vs {exact}",
                        t.name(),
                        want[r]
                    );
                }
                for (name, f) in kernels(t) {
                    let mut got = [0f32; MAX_ROWS];
                    // SAFETY: as above; the kernel's CPU features were checked in `kernels`.
                    unsafe { f(&w, &q, 1, rows, &mut got) };
                    for (r, &(_, scale)) in f64_dots.iter().enumerate() {
                        assert!(
                            ((got[r] - want[r]) as f64).abs() <= 1e-5 * scale,
                            "{} {name} k={k} rows={rows} row {r}: {} vs {}",
                            t.name(),
                            got[r],
                            want[r]
                        );
                    }
                }
            }
        }
    }
}
