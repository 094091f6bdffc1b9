//! Kernel-level tests: every fast kernel against its scalar reference, and the references
//! against a float64 product of the dequantized weights.

use super::matmul::{matmul, matmul_ref, matmul_trans_b, matmul_trans_b_ref, MatMulShape};
use super::*;
use crate::threads::Threads;
use crate::{kquant, kquant_low, mxfp4, quant};
use half::{bf16, f16};

fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545F4914F6CDD1D) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A block type's values per block, bytes per block, quantizer and dequantizer.
type BlockCodec = (usize, usize, fn(&[f32], &mut [u8]), fn(&[u8], &mut [f32]));

/// The codec of block type `t`; `None` for the float types.
fn block_codec(t: WeightType) -> Option<BlockCodec> {
    Some(match t {
        WeightType::F32 | WeightType::F16 | WeightType::BF16 => return None,
        WeightType::Q8_0 => (
            32,
            quant::Q8_0_BYTES,
            quant::quantize_q8_0,
            quant::dequantize_q8_0,
        ),
        WeightType::Q4_0 => (
            32,
            quant::Q4_0_BYTES,
            quant::quantize_q4_0,
            quant::dequantize_q4_0,
        ),
        WeightType::Q4_1 => (
            32,
            quant::Q4_1_BYTES,
            quant::quantize_q4_1,
            quant::dequantize_q4_1,
        ),
        WeightType::Q5_0 => (
            32,
            quant::Q5_0_BYTES,
            quant::quantize_q5_0,
            quant::dequantize_q5_0,
        ),
        WeightType::Q4K => (
            256,
            kquant::Q4_K_BYTES,
            kquant::quantize_q4_k,
            kquant::dequantize_q4_k,
        ),
        WeightType::Q5K => (
            256,
            kquant::Q5_K_BYTES,
            kquant::quantize_q5_k,
            kquant::dequantize_q5_k,
        ),
        WeightType::Q6K => (
            256,
            kquant::Q6_K_BYTES,
            kquant::quantize_q6_k,
            kquant::dequantize_q6_k,
        ),
        WeightType::Q2K => (
            256,
            kquant_low::Q2_K_BYTES,
            kquant_low::quantize_q2_k,
            kquant_low::dequantize_q2_k,
        ),
        WeightType::Q3K => (
            256,
            kquant_low::Q3_K_BYTES,
            kquant_low::quantize_q3_k,
            kquant_low::dequantize_q3_k,
        ),
        WeightType::Mxfp4 => (
            32,
            mxfp4::MXFP4_BYTES,
            mxfp4::quantize_mxfp4,
            mxfp4::dequantize_mxfp4,
        ),
    })
}

/// Encodes `v` as `t` and returns (bytes, the values the bytes really hold).
fn encode(t: WeightType, v: &[f32]) -> (Vec<u8>, Vec<f32>) {
    if let Some((qb, bytes, quantize, dequantize)) = block_codec(t) {
        let mut b = vec![0u8; v.len() / qb * bytes];
        quantize(v, &mut b);
        let mut deq = vec![0f32; v.len()];
        dequantize(&b, &mut deq);
        return (b, deq);
    }
    let round = |x: f32| match t {
        WeightType::F16 => f16::from_f32(x).to_f32(),
        WeightType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    };
    let bytes = v
        .iter()
        .flat_map(|&x| match t {
            WeightType::F16 => f16::from_f32(x).to_le_bytes().to_vec(),
            WeightType::BF16 => bf16::from_f32(x).to_le_bytes().to_vec(),
            _ => x.to_le_bytes().to_vec(),
        })
        .collect();
    (bytes, v.iter().map(|&x| round(x)).collect())
}

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den.max(1e-30)
}

#[test]
fn linear_fast_and_ref_match_f64() {
    let threads = Threads::new(2).unwrap();
    for t in WeightType::ALL {
        // K-quants: 1, 3, 2 and 5 super-blocks per row
        let shapes: &[(usize, usize, usize)] = if t.is_kquant() {
            &[(1, 256, 7), (3, 768, 67), (5, 512, 9), (9, 1280, 33)]
        } else {
            &[(1, 64, 7), (3, 96, 67), (5, 160, 9), (9, 576, 33)]
        };
        for &(rows, k, n) in shapes {
            for quant_act in [false, true] {
                let x = rand_vec(rows * k, 1);
                let (w, wd) = encode(t, &rand_vec(n * k, 2));
                let bias = rand_vec(n, 3);
                let a = LinearArgs {
                    x: &x,
                    rows,
                    k,
                    w: &w,
                    wtype: t,
                    n,
                    bias: Some(&bias),
                    quant_act,
                };
                let mut r = vec![0f32; rows * n];
                let mut f = vec![0f32; rows * n];
                linear_ref(&a, &mut r).unwrap();
                linear(&threads, &a, &mut f).unwrap();
                let exact: Vec<f32> = (0..rows * n)
                    .map(|o| {
                        let (i, j) = (o / n, o % n);
                        let s: f64 = (0..k)
                            .map(|l| x[i * k + l] as f64 * wd[j * k + l] as f64)
                            .sum();
                        (s + bias[j] as f64) as f32
                    })
                    .collect();
                let name = format!("{} rows={rows} k={k} n={n} qa={quant_act}", t.name());
                assert!(nmse(&f, &r) < 1e-10, "{name}: fast vs ref {}", nmse(&f, &r));
                let tol = if quant_act && (t.is_block() || t.has_own_kernels()) {
                    5e-4
                } else {
                    1e-10
                };
                assert!(
                    nmse(&r, &exact) < tol,
                    "{name}: ref vs f64 {}",
                    nmse(&r, &exact)
                );
            }
        }
    }
}

/// Every K-quant weight type.
const KQUANTS: [WeightType; 5] = [
    WeightType::Q2K,
    WeightType::Q3K,
    WeightType::Q4K,
    WeightType::Q5K,
    WeightType::Q6K,
];

#[test]
fn own_kernel_types_simd_match_reference() {
    let (float, int) = own_kernel_cases();
    assert_own_float_cases(float);
    assert_own_int_cases(int);
}

/// A float kernel and its reference: (type, ISA, reference, kernel).
type FloatCase = (WeightType, &'static str, FloatRowsFn, FloatRowsFn);
/// An integer kernel and its reference: (type, ISA, reference, kernel).
type IntCase = (WeightType, &'static str, IntRowsFn, IntRowsFn);

/// The K-quant, Q5_0 and MXFP4 SIMD kernels this CPU can run, each with its reference.
fn own_kernel_cases() -> (Vec<FloatCase>, Vec<IntCase>) {
    use crate::simd;
    let mut float: Vec<FloatCase> = Vec::new();
    let mut int: Vec<IntCase> = Vec::new();
    let refs = |t| {
        (
            kquant_dot::pick_ref(t).unwrap(),
            kquant_int::pick_ref(t).unwrap(),
        )
    };
    #[cfg(target_arch = "x86_64")]
    for t in KQUANTS {
        let (fr, ir) = refs(t);
        if simd::has_avx2_fma() {
            let (f, i): (FloatRowsFn, IntRowsFn) = match t {
                WeightType::Q2K => (kquant_dot::avx2::rows_q2_k, kquant_low_int::avx2::rows_q2_k),
                WeightType::Q3K => (kquant_dot::avx2::rows_q3_k, kquant_low_int::avx2::rows_q3_k),
                WeightType::Q4K => (kquant_dot::avx2::rows_q4_k, kquant_int::avx2::rows_q4_k),
                WeightType::Q5K => (kquant_dot::avx2::rows_q5_k, kquant_int::avx2::rows_q5_k),
                _ => (kquant_dot::avx2::rows_q6_k, kquant_int::avx2::rows_q6_k),
            };
            float.push((t, "avx2", fr, f));
            int.push((t, "avx2", ir, i));
        }
        if int_tile::has_vnni() {
            let i: IntRowsFn = match t {
                WeightType::Q2K => kquant_low_int::avx512::rows_q2_k,
                WeightType::Q3K => kquant_low_int::avx512::rows_q3_k,
                WeightType::Q4K => kquant_int::avx512::rows_q4_k,
                WeightType::Q5K => kquant_int::avx512::rows_q5_k,
                _ => kquant_int::avx512::rows_q6_k,
            };
            int.push((t, "avx512-vnni", ir, i));
        } else {
            eprintln!(
                "kquant_simd_kernels_match_reference: no AVX-512 VNNI here, VNNI kernels not run"
            );
        }
    }
    let _ = refs;
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx2_fma() {
        let t = WeightType::Q5_0;
        float.push((t, "avx2", q5_dot::rows_q5_0_ref, q5_dot::avx2::rows_q5_0));
        int.push((
            t,
            "avx2",
            q5_dot::rows_q5_0_int_ref,
            q5_dot::avx2::rows_q5_0_int,
        ));
        let t = WeightType::Mxfp4;
        let (fr, ir) = (mxfp4_dot::rows_mxfp4_ref, mxfp4_dot::rows_mxfp4_int_ref);
        float.push((t, "avx2", fr, mxfp4_dot::avx2::rows_mxfp4));
        int.push((t, "avx2", ir, mxfp4_dot::avx2::rows_mxfp4_int));
        if int_tile::has_vnni() {
            int.push((t, "avx512-vnni", ir, mxfp4_dot::avx512::rows_mxfp4_int));
            int.push((
                WeightType::Q5_0,
                "avx512-vnni",
                q5_dot::rows_q5_0_int_ref,
                q5_dot::avx512::rows_q5_0_int,
            ));
        }
    }
    (float, int)
}

#[test]
fn row_converters_decode_like_dequantization() {
    // the MXFP4 row converter decodes exactly like the scalar dequantization
    {
        let k = 1056;
        let (w, wd) = encode(WeightType::Mxfp4, &rand_vec(k, 16));
        let mut o = vec![0f32; k];
        // SAFETY: a whole row of k values.
        unsafe { mxfp4_dot::row_to_f32()(&w, k, &mut o) };
        assert_eq!(o, wd, "mxfp4 row converter");
    }
    // the GEMM path's row converters decode exactly like the scalar dequantization
    for t in KQUANTS {
        let k = 768;
        let (w, wd) = encode(t, &rand_vec(k, 15));
        let mut o = vec![0f32; k];
        // SAFETY: a whole row of k values; the converter was picked for this CPU.
        unsafe { kquant_dot::pick_row_to_f32(t).unwrap()(&w, k, &mut o) };
        assert_eq!(o, wd, "{} row converter", t.name());
    }
}

/// Each float case against its reference: 1, 3 and 7 super-blocks (or blocks), every row count,
/// activation rows read past the first.
fn assert_own_float_cases(float: Vec<FloatCase>) {
    for (t, name, rf, ff) in float {
        let ks: &[usize] = if t.is_kquant() {
            &[256, 768, 1792]
        } else {
            &[96, 640, 1056]
        };
        for &k in ks {
            for rows in 1..=MAX_ROWS {
                let x = rand_vec((rows + 1) * k, 11);
                let (w, _) = encode(t, &rand_vec(k, 12));
                let (mut a, mut b) = ([0f32; MAX_ROWS], [0f32; MAX_ROWS]);
                // SAFETY: sizes as the contract asks; the kernel's features checked above.
                unsafe {
                    rf(&w, &x[k..], k, rows, &mut a);
                    ff(&w, &x[k..], k, rows, &mut b);
                }
                let tag = format!("{} {name} exact k={k} rows={rows}", t.name());
                assert!(
                    nmse(&b[..rows], &a[..rows]) < 1e-10,
                    "{tag}: {a:?} vs {b:?}"
                );
            }
        }
    }
}

/// Each integer case against its reference, as [`assert_own_float_cases`] over Q8_0 activations.
fn assert_own_int_cases(int: Vec<IntCase>) {
    for (t, name, rf, ff) in int {
        let ks: &[usize] = if t.is_kquant() {
            &[256, 768, 1792]
        } else {
            &[96, 640, 1056]
        };
        for &k in ks {
            for rows in 1..=MAX_ROWS {
                let x = rand_vec((rows + 2) * k, 13);
                let mut q = act_quant::Q8Rows::default();
                act_quant::quantize_rows_ref(&x, rows + 2, k, &mut q).unwrap();
                q.prepare_sum16(); // (read by the AVX-512 Q2_K/Q3_K kernels)
                let (w, _) = encode(t, &rand_vec(k, 14));
                let (mut a, mut b) = ([0f32; MAX_ROWS], [0f32; MAX_ROWS]);
                // SAFETY: as above.
                unsafe {
                    rf(&w, &q, 2, rows, &mut a);
                    ff(&w, &q, 2, rows, &mut b);
                }
                let tag = format!("{} {name} int k={k} rows={rows}", t.name());
                assert!(
                    nmse(&b[..rows], &a[..rows]) < 1e-10,
                    "{tag}: {a:?} vs {b:?}"
                );
            }
        }
    }
}

#[test]
fn float_weights_with_odd_k() {
    let threads = Threads::new(2).unwrap();
    for t in [WeightType::F32, WeightType::F16, WeightType::BF16] {
        for k in [1, 7, 33, 45] {
            let x = rand_vec(6 * k, 4);
            let (w, _) = encode(t, &rand_vec(5 * k, 5));
            let a = LinearArgs {
                x: &x,
                rows: 6,
                k,
                w: &w,
                wtype: t,
                n: 5,
                bias: None,
                quant_act: false,
            };
            let (mut r, mut f) = (vec![0f32; 30], vec![0f32; 30]);
            linear_ref(&a, &mut r).unwrap();
            linear(&threads, &a, &mut f).unwrap();
            assert!(nmse(&f, &r) < 1e-12, "{} k={k}", t.name());
        }
    }
}

#[test]
fn bad_sizes_are_errors() {
    let threads = Threads::new(1).unwrap();
    let x = vec![0f32; 64];
    let w = vec![0u8; 100];
    let mut out = vec![0f32; 4];
    let a = LinearArgs {
        x: &x,
        rows: 1,
        k: 40,
        w: &w,
        wtype: WeightType::Q4_0,
        n: 1,
        bias: None,
        quant_act: false,
    };
    assert!(linear(&threads, &a, &mut out)
        .unwrap_err()
        .contains("multiple of 32"));
    let a = LinearArgs { k: 64, n: 4, ..a };
    assert!(linear(&threads, &a, &mut out)
        .unwrap_err()
        .contains("weight"));
    let a = LinearArgs { n: 1, rows: 2, ..a };
    assert!(linear_ref(&a, &mut out).unwrap_err().contains("input"));
}

#[test]
fn matmuls_match_reference() {
    let threads = Threads::new(2).unwrap();
    for &(m, k, n) in &[(1, 1, 1), (3, 17, 5), (33, 64, 70), (7, 130, 129)] {
        let s = MatMulShape { m, k, n };
        let a = rand_vec(m * k, 6);
        let b = rand_vec(k * n, 7);
        let (mut r, mut f) = (vec![0f32; m * n], vec![0f32; m * n]);
        matmul_ref(s, &a, &b, 0.5, &mut r).unwrap();
        matmul(&threads, s, &a, &b, 0.5, &mut f).unwrap();
        assert!(nmse(&f, &r) < 1e-12, "matmul {m}x{k}x{n}");
        let want: Vec<f32> = (0..m * n)
            .map(|o| {
                0.5 * (0..k)
                    .map(|l| a[o / n * k + l] * b[l * n + o % n])
                    .sum::<f32>()
            })
            .collect();
        assert!(nmse(&r, &want) < 1e-12);
        // transposed B: b viewed as [n, k]
        matmul_trans_b_ref(s, &a, &b, 2.0, &mut r).unwrap();
        matmul_trans_b(&threads, s, &a, &b, 2.0, &mut f).unwrap();
        assert!(nmse(&f, &r) < 1e-12, "matmul_trans_b {m}x{k}x{n}");
        let want: Vec<f32> = (0..m * n)
            .map(|o| {
                2.0 * (0..k)
                    .map(|l| a[o / n * k + l] * b[o % n * k + l])
                    .sum::<f32>()
            })
            .collect();
        assert!(nmse(&r, &want) < 1e-12);
    }
}

/// Every SIMD kernel this CPU can run (not only the one `pick_*` selects) against its reference.
#[cfg(target_arch = "x86_64")]
#[test]
fn every_simd_variant_matches_reference() {
    let (float, int) = core_simd_cases();
    assert_core_float_cases(float);
    assert_core_int_cases(int);
}

/// The float-type and Q8_0/Q4_0/Q4_1 SIMD kernels this CPU can run, each with its reference.
#[cfg(target_arch = "x86_64")]
fn core_simd_cases() -> (Vec<FloatCase>, Vec<IntCase>) {
    use crate::simd;
    use WeightType::{BF16, F16, F32, Q4_0, Q4_1, Q8_0};
    let mut float: Vec<FloatCase> = Vec::new();
    let mut int: Vec<IntCase> = Vec::new();
    if simd::has_avx2_fma() {
        let cases: [(WeightType, FloatRowsFn, FloatRowsFn); 6] = [
            (F32, float_dot::rows_f32_ref, float_dot::avx2::rows_f32),
            (F16, float_dot::rows_f16_ref, float_dot::avx2::rows_f16),
            (BF16, float_dot::rows_bf16_ref, float_dot::avx2::rows_bf16),
            (Q8_0, quant_dot::rows_q8_0_ref, quant_dot::avx2::rows_q8_0),
            (Q4_0, quant_dot::rows_q4_0_ref, quant_dot::avx2::rows_q4_0),
            (Q4_1, quant_dot::rows_q4_1_ref, quant_dot::avx2::rows_q4_1),
        ];
        float.extend(cases.map(|(t, r, f)| (t, "avx2", r, f)));
        let cases: [(WeightType, IntRowsFn, IntRowsFn); 3] = [
            (Q8_0, int_dot::rows_q8_0_ref, int_dot::avx2::rows_q8_0),
            (Q4_0, int_dot::rows_q4_0_ref, int_dot::avx2::rows_q4_0),
            (Q4_1, int_dot::rows_q4_1_ref, int_dot::avx2::rows_q4_1),
        ];
        int.extend(cases.map(|(t, r, f)| (t, "avx2", r, f)));
    }
    if simd::has_avx512() {
        let cases: [(WeightType, FloatRowsFn, FloatRowsFn); 3] = [
            (F32, float_dot::rows_f32_ref, float_dot::avx512::rows_f32),
            (F16, float_dot::rows_f16_ref, float_dot::avx512::rows_f16),
            (BF16, float_dot::rows_bf16_ref, float_dot::avx512::rows_bf16),
        ];
        float.extend(cases.map(|(t, r, f)| (t, "avx512", r, f)));
    }
    let portable: FloatRowsFn = float_dot::rows_f32_portable;
    float.push((F32, "portable", float_dot::rows_f32_ref, portable));
    (float, int)
}

/// Each float case against its reference on odd and block-sized k, every row count; single
/// dots can cancel to ~0, so the absolute error is bounded by the rounding scale.
#[cfg(target_arch = "x86_64")]
fn assert_core_float_cases(float: Vec<FloatCase>) {
    for (t, name, r, f) in float {
        let ks: &[usize] = if t.is_block() {
            &[32, 96, 544]
        } else {
            &[1, 15, 16, 33, 100, 544]
        };
        for &k in ks {
            let (w, _) = encode(t, &rand_vec(k, 9));
            let x = rand_vec(4 * k, 10);
            for rows in 1..=MAX_ROWS {
                let (mut a, mut b) = ([0f32; MAX_ROWS], [0f32; MAX_ROWS]);
                // SAFETY: sizes as in the contract; features checked above.
                unsafe {
                    r(&w, &x, k, rows, &mut a);
                    f(&w, &x, k, rows, &mut b);
                }
                // single dots can cancel to ~0, so bound the absolute error by the rounding scale
                let close = a
                    .iter()
                    .zip(&b)
                    .all(|(p, q)| (p - q).abs() <= 1e-6 * k as f32);
                assert!(
                    close,
                    "{} {name} k={k} rows={rows}: {a:?} vs {b:?}",
                    t.name()
                );
            }
        }
    }
}

/// Each integer case against its reference over Q8_0 activations, as [`assert_core_float_cases`].
#[cfg(target_arch = "x86_64")]
fn assert_core_int_cases(int: Vec<IntCase>) {
    for (t, name, r, f) in int {
        for k in [32usize, 64, 96, 544] {
            let (w, _) = encode(t, &rand_vec(k, 11));
            let mut q = act_quant::Q8Rows::default();
            act_quant::quantize_rows_ref(&rand_vec(5 * k, 12), 5, k, &mut q).unwrap();
            for rows in 1..=MAX_ROWS {
                let (mut a, mut b) = ([0f32; MAX_ROWS], [0f32; MAX_ROWS]);
                // SAFETY: sizes as in the contract; features checked above.
                unsafe {
                    r(&w, &q, 1, rows, &mut a);
                    f(&w, &q, 1, rows, &mut b);
                }
                // single dots can cancel to ~0, so bound the absolute error by the rounding scale
                let close = a
                    .iter()
                    .zip(&b)
                    .all(|(p, q)| (p - q).abs() <= 1e-6 * k as f32);
                assert!(
                    close,
                    "{} {name} k={k} rows={rows}: {a:?} vs {b:?}",
                    t.name()
                );
            }
        }
    }
}

/// The exact-precision tiles over block rows give the bits of the f32 tile kernel over the
/// dequantized rows (what the GEMM path computes), every (rows, cols), odd block counts.
#[test]
fn direct_block_tiles_match_the_f32_tile_bit_for_bit() {
    let Some(f32_tile) = float_dot::pick_tile_f32() else {
        println!("no tile kernel on this CPU; skipped");
        return;
    };
    for t in [
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
    ] {
        let Some(tile) = quant_dot::pick_tile_direct(t) else {
            println!("no direct {} tile on this CPU; skipped", t.name());
            continue;
        };
        for k in [32usize, 96, 640] {
            let (w, wd) = encode(t, &rand_vec(4 * k, 31));
            let x = rand_vec(4 * k, 32);
            let wf: Vec<u8> = wd.iter().flat_map(|v| v.to_le_bytes()).collect();
            for rows in 1..=MAX_ROWS {
                for cols in 1..=MAX_ROWS {
                    let (mut a, mut b) =
                        ([[0f32; MAX_ROWS]; MAX_ROWS], [[0f32; MAX_ROWS]; MAX_ROWS]);
                    // SAFETY: sizes as in the contracts; both picked for this CPU.
                    unsafe {
                        tile(&w, &x, k, rows, cols, &mut a);
                        f32_tile(&wf, &x, k, rows, cols, &mut b);
                    }
                    for c in 0..cols {
                        assert_eq!(
                            &a[c][..rows],
                            &b[c][..rows],
                            "{} k={k} {rows}x{cols} column {c}",
                            t.name()
                        );
                    }
                }
            }
        }
    }
}

/// The register-tiled f32 GEMM kernel against its reference, every (rows, cols) and odd k.
#[test]
fn tile_kernel_matches_reference() {
    let Some(tile) = float_dot::pick_tile_f32() else {
        println!("no tile kernel on this CPU; skipped");
        return;
    };
    for k in [1usize, 15, 16, 17, 100, 576] {
        let (w, _) = encode(WeightType::F32, &rand_vec(4 * k, 13));
        let x = rand_vec(4 * k, 14);
        for rows in 1..=MAX_ROWS {
            for cols in 1..=MAX_ROWS {
                let (mut a, mut b) = ([[0f32; MAX_ROWS]; MAX_ROWS], [[0f32; MAX_ROWS]; MAX_ROWS]);
                float_dot::tile_f32_ref(&w, &x, k, rows, cols, &mut a);
                // SAFETY: sizes as in the contract; picked for this CPU.
                unsafe { tile(&w, &x, k, rows, cols, &mut b) };
                for c in 0..cols {
                    for r in 0..rows {
                        let (p, q) = (a[c][r], b[c][r]);
                        assert!(
                            (p - q).abs() <= 1e-6 * k as f32,
                            "k={k} {rows}x{cols} [{c}][{r}]: {p} vs {q}"
                        );
                    }
                }
            }
        }
    }
}

/// Every tiled integer kernel this CPU can run against the per-row reference, every
/// (rows, cols), odd and even block counts.
#[cfg(target_arch = "x86_64")]
#[test]
fn int_tile_kernels_match_reference() {
    use int_tile::avx512 as t5;
    let mut variants: Vec<(WeightType, &str, IntRowsFn, IntTileFn)> = Vec::new();
    if crate::simd::has_avx512() {
        variants.push((
            WeightType::Q4_0,
            "bw",
            int_dot::rows_q4_0_ref,
            t5::tile_q4_0,
        ));
        variants.push((
            WeightType::Q4_1,
            "bw",
            int_dot::rows_q4_1_ref,
            t5::tile_q4_1,
        ));
    }
    if int_tile::has_vnni() {
        variants.push((
            WeightType::Q4_0,
            "vnni",
            int_dot::rows_q4_0_ref,
            t5::tile_q4_0_vnni,
        ));
        variants.push((
            WeightType::Q4_1,
            "vnni",
            int_dot::rows_q4_1_ref,
            t5::tile_q4_1_vnni,
        ));
        variants.push((
            WeightType::Q8_0,
            "vnni",
            int_dot::rows_q8_0_ref,
            t5::tile_q8_0_vnni,
        ));
        variants.push((
            WeightType::Q5_0,
            "vnni",
            q5_dot::rows_q5_0_int_ref,
            q5_dot::avx512::tile_q5_0,
        ));
    }
    if variants.is_empty() {
        println!("no tiled integer kernel on this CPU; skipped");
    }
    for (t, name, r, tile) in variants {
        for k in [32usize, 64, 96, 544] {
            let rb = t.row_bytes(k).unwrap();
            let (w, _) = encode(t, &rand_vec(4 * k, 15));
            let mut q = act_quant::Q8Rows::default();
            act_quant::quantize_rows_ref(&rand_vec(6 * k, 16), 6, k, &mut q).unwrap();
            for rows in 1..=MAX_ROWS {
                for cols in 1..=MAX_ROWS {
                    let mut got = [[0f32; MAX_ROWS]; MAX_ROWS];
                    // SAFETY: sizes as in the contract; features checked above.
                    unsafe { tile(&w, rb, &q, 2, rows, cols, &mut got) };
                    for c in 0..cols {
                        let mut want = [0f32; MAX_ROWS];
                        // SAFETY: as above.
                        unsafe { r(&w[c * rb..(c + 1) * rb], &q, 2, rows, &mut want) };
                        for r in 0..rows {
                            let (p, g) = (want[r], got[c][r]);
                            assert!(
                                (p - g).abs() <= 1e-5 * (1.0 + p.abs()),
                                "{} {name} k={k} {rows}x{cols} [{c}][{r}]: {p} vs {g}",
                                t.name()
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The Q5_0 VNNI tile gives every entry the bits of the one-row VNNI kernel (so a row's
/// output does not depend on how many rows and columns share its tile): block counts odd and
/// even, every (rows, cols).
#[cfg(target_arch = "x86_64")]
#[test]
fn q5_0_tile_is_bit_equal_to_its_row_kernel() {
    if !int_tile::has_vnni() {
        println!("no AVX-512 VNNI on this CPU; skipped");
        return;
    }
    let t = WeightType::Q5_0;
    for k in [32usize, 64, 96, 640, 1056] {
        let rb = t.row_bytes(k).unwrap();
        let (w, _) = encode(t, &rand_vec(4 * k, 21));
        let mut q = act_quant::Q8Rows::default();
        act_quant::quantize_rows_ref(&rand_vec(6 * k, 22), 6, k, &mut q).unwrap();
        for rows in 1..=MAX_ROWS {
            for cols in 1..=MAX_ROWS {
                let mut got = [[0f32; MAX_ROWS]; MAX_ROWS];
                // SAFETY: sizes as in the contract; VNNI checked above.
                unsafe { q5_dot::avx512::tile_q5_0(&w, rb, &q, 2, rows, cols, &mut got) };
                for (c, g) in got.iter().enumerate().take(cols) {
                    let mut want = [0f32; MAX_ROWS];
                    // SAFETY: as above.
                    unsafe {
                        q5_dot::avx512::rows_q5_0_int(
                            &w[c * rb..(c + 1) * rb],
                            &q,
                            2,
                            rows,
                            &mut want,
                        )
                    };
                    assert_eq!(&g[..rows], &want[..rows], "k={k} {rows}x{cols} column {c}");
                }
            }
        }
    }
}

/// The wide VNNI tiles (up to 8 rows × 2 columns) against the per-row reference: every
/// (rows, cols), block counts odd and even, below, at and across the 16-block chunk of the
/// Q4_1 min term; then `linear` with 2..=19 rows against `linear_ref` (row remainders).
#[cfg(target_arch = "x86_64")]
#[test]
fn int_wide_kernels_match_reference() {
    use int_wide::{avx512 as w8, IntWideFn, WIDE_COLS, WIDE_ROWS};
    if !int_tile::has_vnni() {
        println!("no AVX-512 VNNI on this CPU; skipped");
        return;
    }
    let variants: [(WeightType, IntRowsFn, IntWideFn); 3] = [
        (WeightType::Q4_0, int_dot::rows_q4_0_ref, w8::wide_q4_0),
        (WeightType::Q4_1, int_dot::rows_q4_1_ref, w8::wide_q4_1),
        (WeightType::Q8_0, int_dot::rows_q8_0_ref, w8::wide_q8_0),
    ];
    for (t, r, wide) in variants {
        for k in [32usize, 64, 96, 512, 544, 1024, 1056] {
            let rb = t.row_bytes(k).unwrap();
            let (w, _) = encode(t, &rand_vec(WIDE_COLS * k, 17));
            let mut q = act_quant::Q8Rows::default();
            act_quant::quantize_rows_ref(&rand_vec(11 * k, 18), 11, k, &mut q).unwrap();
            for rows in 1..=WIDE_ROWS {
                for cols in 1..=WIDE_COLS {
                    let mut got = [[0f32; WIDE_ROWS]; WIDE_COLS];
                    // SAFETY: sizes as in the contract; VNNI checked above.
                    unsafe { wide(&w, rb, &q, 3, rows, cols, &mut got) };
                    for c in 0..cols {
                        let mut want = [0f32; WIDE_ROWS];
                        let mut r0 = 0;
                        while r0 < rows {
                            let nr = (rows - r0).min(MAX_ROWS);
                            let mut part = [0f32; MAX_ROWS];
                            // SAFETY: as above.
                            unsafe { r(&w[c * rb..(c + 1) * rb], &q, 3 + r0, nr, &mut part) };
                            want[r0..r0 + nr].copy_from_slice(&part[..nr]);
                            r0 += nr;
                        }
                        for i in 0..rows {
                            let (p, g) = (want[i], got[c][i]);
                            assert!(
                                (p - g).abs() <= 1e-5 * (1.0 + p.abs()),
                                "{} k={k} {rows}x{cols} [{c}][{i}]: {p} vs {g}",
                                t.name()
                            );
                        }
                    }
                }
            }
        }
        // through `linear`: threads, column tiles, row blocks of 8 and their remainders, bias
        let threads = Threads::new(2).unwrap();
        for (rows, k, n) in [
            (2usize, 64usize, 5usize),
            (8, 576, 37),
            (9, 96, 3),
            (19, 1056, 66),
        ] {
            let (w, _) = encode(t, &rand_vec(n * k, 19));
            let x = rand_vec(rows * k, 20);
            let bias = rand_vec(n, 21);
            let args = LinearArgs {
                x: &x,
                rows,
                k,
                w: &w,
                wtype: t,
                n,
                bias: Some(&bias),
                quant_act: true,
            };
            let mut want = vec![0f32; rows * n];
            let mut got = vec![0f32; rows * n];
            linear_ref(&args, &mut want).unwrap();
            linear(&threads, &args, &mut got).unwrap();
            for (i, (p, g)) in want.iter().zip(&got).enumerate() {
                assert!(
                    (p - g).abs() <= 1e-5 * (1.0 + p.abs()),
                    "{} linear {rows}x{k}x{n} [{i}]: {p} vs {g}",
                    t.name()
                );
            }
        }
    }
}

/// The AVX-512 BW integer GEMV kernels against the per-row reference: awkward `k`
/// (odd and even block counts) and `n` (weight rows in groups of up to 4, remainders 1..3),
/// every activation row of a small batch; then `linear` with one row against `linear_ref`.
#[cfg(target_arch = "x86_64")]
#[test]
fn int_gemv_kernels_match_reference() {
    use int_gemv::avx512 as g;
    let mut variants: Vec<(WeightType, &str, IntRowsFn, IntTileFn)> = Vec::new();
    if crate::simd::has_avx512() {
        variants.push((WeightType::Q4_0, "bw", int_dot::rows_q4_0_ref, g::gemv_q4_0));
        variants.push((WeightType::Q4_1, "bw", int_dot::rows_q4_1_ref, g::gemv_q4_1));
    }
    if variants.is_empty() {
        println!("no AVX-512 GEMV kernel on this CPU; skipped");
    }
    for (t, name, r, gemv) in variants {
        for k in [32usize, 96, 4096 + 32] {
            let rb = t.row_bytes(k).unwrap();
            let mut q = act_quant::Q8Rows::default();
            act_quant::quantize_rows_ref(&rand_vec(3 * k, 18), 3, k, &mut q).unwrap();
            for n in [1usize, 3, 7, 67] {
                let (w, _) = encode(t, &rand_vec(n * k, 17 + n as u64));
                for row in 0..3 {
                    let mut c0 = 0;
                    while c0 < n {
                        let cols = (n - c0).min(MAX_ROWS);
                        let mut got = [[0f32; MAX_ROWS]; MAX_ROWS];
                        let wt = &w[c0 * rb..(c0 + cols) * rb];
                        // SAFETY: sizes as in the contract; features checked above.
                        unsafe { gemv(wt, rb, &q, row, 1, cols, &mut got) };
                        for (c, gc) in got.iter().enumerate().take(cols) {
                            let mut want = [0f32; MAX_ROWS];
                            let j = c0 + c;
                            // SAFETY: as above.
                            unsafe { r(&w[j * rb..(j + 1) * rb], &q, row, 1, &mut want) };
                            let (p, v) = (want[0], gc[0]);
                            // float sums in another order: error grows with the block count
                            let tol = 1e-6 * (k / 32) as f32 * (1.0 + p.abs());
                            assert!(
                                (p - v).abs() <= tol,
                                "{} {name} k={k} n={n} row={row} col={j}: {p} vs {v}",
                                t.name()
                            );
                        }
                        c0 += cols;
                    }
                }
            }
        }
    }
    // end to end: one activation row through `linear` (picks the GEMV kernel where it exists)
    let threads = Threads::new(2).unwrap();
    for t in [WeightType::Q4_0, WeightType::Q4_1] {
        for k in [32usize, 96, 4096 + 32] {
            for n in [1usize, 3, 7, 67] {
                assert_one_row_linear(&threads, t, k, n, 19);
            }
        }
    }
}

/// One activation row of `k` through `linear` (`quant_act`, with a bias) over `n` weight rows
/// of `t` against `linear_ref`; random values from seeds `seed`, `seed + 1`, `seed + 2`.
fn assert_one_row_linear(threads: &Threads, t: WeightType, k: usize, n: usize, seed: u64) {
    let (w, _) = encode(t, &rand_vec(n * k, seed));
    let x = rand_vec(k, seed + 1);
    let bias = rand_vec(n, seed + 2);
    let a = LinearArgs {
        x: &x,
        rows: 1,
        k,
        w: &w,
        wtype: t,
        n,
        bias: Some(&bias),
        quant_act: true,
    };
    let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
    linear_ref(&a, &mut want).unwrap();
    linear(threads, &a, &mut got).unwrap();
    let e = nmse(&got, &want);
    assert!(e < 1e-10, "{} k={k} n={n}: nmse {e}", t.name());
}

/// The streaming GEMV kernels against the per-row reference: block counts that are and are not
/// multiples of the 4-block group (1..7, 129, 131), several activation rows per call, weight rows
/// taken from the end of the buffer (the masked tail loads must not read past it); then `linear`
/// with one row (the case that picks this kernel).
#[cfg(target_arch = "x86_64")]
#[test]
fn int_split_kernels_match_reference() {
    let variants: Vec<(WeightType, IntRowsFn, IntRowsFn)> = [
        (WeightType::Q4_0, int_dot::rows_q4_0_ref as IntRowsFn),
        (WeightType::Q4_1, int_dot::rows_q4_1_ref as IntRowsFn),
        (WeightType::Q8_0, int_dot::rows_q8_0_ref as IntRowsFn),
    ]
    .into_iter()
    .filter_map(|(t, r)| int_split::pick_gemv(t).map(|s| (t, r, s)))
    .collect();
    if variants.is_empty() {
        println!("no AVX-512 VBMI/VNNI streaming GEMV on this CPU; skipped");
    }
    for (t, r, stream) in variants {
        for blocks in [1usize, 2, 3, 4, 5, 6, 7, 129, 131] {
            let k = blocks * 32;
            let rb = t.row_bytes(k).unwrap();
            let mut q = act_quant::Q8Rows::default();
            act_quant::quantize_rows_ref(&rand_vec(3 * k, 28 + blocks as u64), 3, k, &mut q)
                .unwrap();
            q.prepare_split();
            let n = 5;
            let (w, _) = encode(t, &rand_vec(n * k, 27 + blocks as u64));
            for j in 0..n {
                // exactly one row's bytes: a read past the row would be caught by Miri/ASan and
                // reads a neighbouring row otherwise (results would differ)
                let wr = w[j * rb..(j + 1) * rb].to_vec();
                for (row0, rows) in [(0usize, 1usize), (1, 2), (0, 3)] {
                    let (mut want, mut got) = ([0f32; MAX_ROWS], [f32::NAN; MAX_ROWS]);
                    // SAFETY: sizes as in the contract; kernel picked for this CPU.
                    unsafe {
                        r(&wr, &q, row0, rows, &mut want);
                        stream(&wr, &q, row0, rows, &mut got);
                    }
                    for i in 0..rows {
                        let (p, v) = (want[i], got[i]);
                        let tol = 1e-6 * blocks as f32 * (1.0 + p.abs());
                        assert!(
                            (p - v).abs() <= tol,
                            "{} blocks={blocks} col={j} row={}: {p} vs {v}",
                            t.name(),
                            row0 + i
                        );
                    }
                }
            }
            // unprepared activations fall back to the per-block kernels (same results)
            let mut plain = q.clone();
            act_quant::quantize_rows_ref(&rand_vec(3 * k, 28 + blocks as u64), 3, k, &mut plain)
                .unwrap();
            assert_eq!(
                plain.split.rows, 0,
                "re-quantization must drop the split layout"
            );
            let (mut want, mut got) = ([0f32; MAX_ROWS], [0f32; MAX_ROWS]);
            // SAFETY: as above.
            unsafe {
                r(&w[..rb], &plain, 0, 3, &mut want);
                stream(&w[..rb], &plain, 0, 3, &mut got);
            }
            for i in 0..3 {
                assert!((want[i] - got[i]).abs() <= 1e-5 * (1.0 + want[i].abs()));
            }
        }
    }
    // end to end through `linear` with one row
    let threads = Threads::new(2).unwrap();
    for t in [WeightType::Q4_0, WeightType::Q4_1, WeightType::Q8_0] {
        assert_one_row_linear(&threads, t, 4096 + 96, 101, 31);
    }
}

/// The split-layout wide tiles (Q4_0, Q4_1) against the per-row reference: block counts that
/// are and are not multiples of the 4-block group, every row count 1..=8 and column count 1..=2,
/// exactly sized weight buffers (the masked tail loads must stay inside them); the same call
/// without a prepared layout falls back to the other wide kernels.
#[cfg(target_arch = "x86_64")]
#[test]
fn int_split_wide_kernels_match_reference() {
    use int_wide::{WIDE_COLS, WIDE_ROWS};
    let variants: Vec<(WeightType, IntRowsFn, int_wide::IntWideFn)> = [
        (WeightType::Q4_0, int_dot::rows_q4_0_ref as IntRowsFn),
        (WeightType::Q4_1, int_dot::rows_q4_1_ref as IntRowsFn),
        (WeightType::Q8_0, int_dot::rows_q8_0_ref as IntRowsFn),
    ]
    .into_iter()
    .filter_map(|(t, r)| int_split::pick_wide(t).map(|w| (t, r, w)))
    .collect();
    if variants.is_empty() {
        println!("no AVX-512 VBMI/VNNI split tiles on this CPU; skipped");
    }
    for (t, r, wide) in variants {
        for k in [32usize, 64, 96, 160, 576, 1056] {
            let rb = t.row_bytes(k).unwrap();
            let (w, _) = encode(t, &rand_vec(WIDE_COLS * k, 37 + k as u64));
            let mut q = act_quant::Q8Rows::default();
            act_quant::quantize_rows_ref(&rand_vec(11 * k, 38), 11, k, &mut q).unwrap();
            let plain = q.clone();
            q.prepare_split();
            for acts in [&q, &plain] {
                for rows in 1..=WIDE_ROWS {
                    for cols in 1..=WIDE_COLS {
                        let wt = w[..cols * rb].to_vec();
                        let mut got = [[f32::NAN; WIDE_ROWS]; WIDE_COLS];
                        // SAFETY: sizes as in the contract; kernel picked for this CPU.
                        unsafe { wide(&wt, rb, acts, 3, rows, cols, &mut got) };
                        for (c, gc) in got.iter().enumerate().take(cols) {
                            for (i, &g) in gc.iter().enumerate().take(rows) {
                                let mut want = [0f32; MAX_ROWS];
                                // SAFETY: as above.
                                unsafe { r(&wt[c * rb..(c + 1) * rb], acts, 3 + i, 1, &mut want) };
                                let p = want[0];
                                assert!(
                                    (p - g).abs() <= 1e-5 * (1.0 + p.abs()),
                                    "{} k={k} {rows}x{cols} [{c}][{i}] prepared={}: {p} vs {g}",
                                    t.name(),
                                    acts.split.rows > 0
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The split-layout GEMV tile against the scalar reference and, bit for bit, against the
/// streaming GEMV on each weight row alone: block counts 1 to 7, 129 and 131, every column count
/// 1..=4 and row count 1..=4 over exactly sized buffers (7 weight rows, so tiles end short);
/// unprepared activations take the fallback.
#[cfg(target_arch = "x86_64")]
#[test]
fn int_split_gemv_tile_matches_reference_and_streaming_gemv() {
    let variants: Vec<(WeightType, IntRowsFn)> =
        [(WeightType::Q4_0, int_dot::rows_q4_0_ref as IntRowsFn)]
            .into_iter()
            .filter(|(t, _)| int_split::pick_gemv_tile(*t).is_some())
            .collect();
    if variants.is_empty() {
        println!("no AVX-512 VBMI/VNNI GEMV tile on this CPU; skipped");
    }
    for (t, r) in variants {
        let (Some(tile), Some(stream)) = (int_split::pick_gemv_tile(t), int_split::pick_gemv(t))
        else {
            unreachable!("both kernels need the same CPU features");
        };
        for blocks in [1usize, 2, 3, 4, 5, 7, 129, 131] {
            let k = blocks * 32;
            let rb = t.row_bytes(k).unwrap();
            let n = 7;
            let (w, _) = encode(t, &rand_vec(n * k, 41 + blocks as u64));
            let mut q = act_quant::Q8Rows::default();
            act_quant::quantize_rows_ref(&rand_vec(5 * k, 42 + blocks as u64), 5, k, &mut q)
                .unwrap();
            let plain = q.clone();
            q.prepare_split();
            for (acts, exact) in [(&q, true), (&plain, false)] {
                for c0 in 0..n {
                    for cols in 1..=MAX_ROWS.min(n - c0) {
                        let wt = w[c0 * rb..(c0 + cols) * rb].to_vec();
                        for (row0, rows) in [(0usize, 1usize), (1, 4), (2, 3)] {
                            let mut got = [[f32::NAN; MAX_ROWS]; MAX_ROWS];
                            // SAFETY: sizes as in the contract; kernel picked for this CPU.
                            unsafe { tile(&wt, rb, acts, row0, rows, cols, &mut got) };
                            for (c, gc) in got.iter().enumerate().take(cols) {
                                let wr = &wt[c * rb..(c + 1) * rb];
                                let (mut want, mut one) = ([0f32; MAX_ROWS], [0f32; MAX_ROWS]);
                                // SAFETY: as above.
                                unsafe {
                                    r(wr, acts, row0, rows, &mut want);
                                    stream(wr, acts, row0, rows, &mut one);
                                }
                                for i in 0..rows {
                                    let (p, g) = (want[i], gc[i]);
                                    let at = format!(
                                        "{} k={k} col={} row={}",
                                        t.name(),
                                        c0 + c,
                                        row0 + i
                                    );
                                    let tol = 1e-6 * blocks as f32 * (1.0 + p.abs());
                                    assert!((p - g).abs() <= tol, "{at}: {p} vs {g}");
                                    if exact {
                                        assert_eq!(
                                            one[i].to_bits(),
                                            g.to_bits(),
                                            "{at}: {} vs {g}",
                                            one[i]
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Interleaving: taking every row back gives the plain bytes back; interleaving refuses shapes it cannot
/// hold (rows not a multiple of 16, k not whole blocks, float types, short buffers).
#[test]
fn interleaved_layout_round_trips() {
    for t in [WeightType::Q4_0, WeightType::Q4_1, WeightType::Q8_0] {
        for (n, k) in [(16, 32), (32, 96), (48, 160)] {
            let (plain, _) = encode(t, &rand_vec(n * k, (n * 7 + k) as u64));
            let mut p = vec![0u8; plain.len()];
            interleaved::interleave(t, &plain, n, k, &mut p).unwrap();
            assert_ne!(
                p,
                plain,
                "{} {n}x{k}: interleaving changed nothing",
                t.name()
            );
            let rb = t.row_bytes(k).unwrap();
            let mut row = vec![0u8; rb];
            for r in 0..n {
                interleaved::plain_row(t, &p, n, k, r, &mut row).unwrap();
                assert_eq!(
                    row,
                    plain[r * rb..(r + 1) * rb],
                    "{} {n}x{k} row {r}",
                    t.name()
                );
            }
        }
        let (plain, _) = encode(t, &rand_vec(24 * 64, 3));
        let mut p = vec![0u8; plain.len()];
        assert!(
            interleaved::interleave(t, &plain, 24, 64, &mut p).is_err(),
            "24 rows"
        );
        assert!(
            interleaved::interleave(t, &plain[..100], 16, 64, &mut p).is_err(),
            "short input"
        );
        assert!(
            interleaved::interleave(t, &plain, 16, 48, &mut p).is_err(),
            "k = 48"
        );
        assert!(
            interleaved::plain_row(t, &plain, 16, 64, 16, &mut p).is_err(),
            "row 16 of 16"
        );
    }
    let f32w = vec![0u8; 16 * 32 * 4];
    let mut p = f32w.clone();
    assert!(interleaved::interleave(WeightType::F32, &f32w, 16, 32, &mut p).is_err());
}

/// The interleaved kernels: SIMD bit-equal to the scalar reference (same integer math, same float
/// order), and both equal to the plain integer path within float reordering, for awkward block
/// counts, several groups, activation row counts 1..=9, 13 and 17 (chunks of 4 with every
/// remainder), with a bias;
/// `quant_act = 0` (brought back to the plain layout first) equal to the plain exact path.
#[test]
fn interleaved_kernels_match_reference() {
    let threads = Threads::new(2).unwrap();
    for t in [WeightType::Q4_0, WeightType::Q4_1, WeightType::Q8_0] {
        for (n, k) in [(16, 32), (32, 96), (48, 224), (64, 4096)] {
            let (plain, _) = encode(t, &rand_vec(n * k, (n + 3 * k) as u64));
            let mut p = vec![0u8; plain.len()];
            interleaved::interleave(t, &plain, n, k, &mut p).unwrap();
            let bias = rand_vec(n, 99);
            for rows in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17] {
                let x = rand_vec(rows * k, (rows * 31 + k) as u64);
                for quant_act in [true, false] {
                    let a = LinearArgs {
                        x: &x,
                        rows,
                        k,
                        w: &p,
                        wtype: t,
                        n,
                        bias: Some(&bias),
                        quant_act,
                    };
                    let plain_args = LinearArgs { w: &plain, ..a };
                    let mut want = vec![0f32; rows * n];
                    linear_ref(&plain_args, &mut want).unwrap();
                    let mut r = vec![0f32; rows * n];
                    linear_interleaved(None, &a, &mut r).unwrap();
                    let mut f = vec![0f32; rows * n];
                    linear_interleaved(Some(&threads), &a, &mut f).unwrap();
                    let what = format!("{} {n}x{k} rows {rows} qa {quant_act}", t.name());
                    if quant_act {
                        assert_eq!(r, f, "{what}: SIMD differs from the interleaved reference");
                    }
                    let e = nmse(&r, &want);
                    assert!(e < 1e-10, "{what}: nmse {e} against the plain path");
                }
            }
        }
    }
}

/// `linear_interleaved` refuses weights it cannot take.
#[test]
fn interleaved_linear_refuses_bad_shapes() {
    let x = vec![0f32; 32];
    let w = vec![0u8; 8 * 18];
    let mut out = vec![0f32; 8];
    let a = LinearArgs {
        x: &x,
        rows: 1,
        k: 32,
        w: &w,
        wtype: WeightType::Q4_0,
        n: 8,
        bias: None,
        quant_act: true,
    };
    let e = linear_interleaved(None, &a, &mut out).unwrap_err();
    assert!(e.contains("multiple of 16"), "{e}");
}
