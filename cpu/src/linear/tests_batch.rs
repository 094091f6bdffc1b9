//! Batch invariance: a row's `Linear` output is bit-equal whether the row runs alone or in a
//! batch of any size, on the fast (threaded SIMD) path, in the plain and the interleaved layout,
//! for every weight dtype with quantized activations (`fast` precision) and with f32 activations
//! (`exact`). K-quant and Q5_0 weights in `exact` precision hold it below
//! [`GEMM_MIN_ROWS`](super::GEMM_MIN_ROWS) rows; from there on AVX-512 they run as converted
//! f32 tiles, whose sums are ordered differently. Likewise a weight's output is bit-equal whether
//! it runs alone or in one [`linear_interleaved_multi`] call with other weights of its input.

use super::*;
use crate::threads::Threads;

fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Plain bytes of an `n × k` weight of `t` with random values.
fn weight(t: WeightType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let v = rand_vec(n * k, seed);
    let rb = t.row_bytes(k).unwrap_or(0);
    let mut b = vec![0u8; n * rb];
    match t {
        WeightType::F32 => b = v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        WeightType::F16 => {
            b = v
                .iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect()
        }
        WeightType::BF16 => {
            b = v
                .iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect()
        }
        WeightType::Q8_0 => crate::quant::quantize_q8_0(&v, &mut b),
        WeightType::Q4_0 => crate::quant::quantize_q4_0(&v, &mut b),
        WeightType::Q4_1 => crate::quant::quantize_q4_1(&v, &mut b),
        WeightType::Q5_0 => crate::quant::quantize_q5_0(&v, &mut b),
        WeightType::Q4K => crate::kquant::quantize_q4_k(&v, &mut b),
        WeightType::Q5K => crate::kquant::quantize_q5_k(&v, &mut b),
        WeightType::Q6K => crate::kquant::quantize_q6_k(&v, &mut b),
        WeightType::Q2K => crate::kquant_low::quantize_q2_k(&v, &mut b),
        WeightType::Q3K => crate::kquant_low::quantize_q3_k(&v, &mut b),
    }
    b
}

/// Runs rows `r0..r0 + rows` of `x` through the weight; the output rows.
fn run(th: &Threads, a: &LinearArgs, x: &[f32], r0: usize, rows: usize, inter: bool) -> Vec<f32> {
    let args = LinearArgs {
        x: &x[r0 * a.k..(r0 + rows) * a.k],
        rows,
        ..*a
    };
    let mut out = vec![0f32; rows * a.n];
    let r = if inter {
        linear_interleaved(Some(th), &args, &mut out)
    } else {
        linear(th, &args, &mut out)
    };
    r.unwrap_or_else(|e| panic!("{e}"));
    out
}

#[test]
fn a_rows_output_does_not_depend_on_the_batch() {
    let th = Threads::new(2).unwrap_or_else(|e| panic!("{e}"));
    const BATCHES: [usize; 5] = [1, 2, 3, 7, 16];
    let mut bad = Vec::new();
    // (n, k): rows not a multiple of any tile; k a few blocks, or many
    for (n, k) in [(67usize, 96usize), (80, 576), (48, 1536)] {
        let x = rand_vec(16 * k, (n * k) as u64);
        let bias = rand_vec(n, 7);
        for t in WeightType::ALL {
            if t.row_bytes(k).is_none() {
                continue; // (K-quants: only the k that is whole super-blocks)
            }
            let w = weight(t, n, k, (n + k) as u64);
            let inter = n % interleaved::GROUP_ROWS == 0 && interleaved::available_for(t);
            let wi = if inter {
                let mut o = vec![0u8; w.len()];
                interleaved::interleave(t, &w, n, k, &mut o).unwrap_or_else(|e| panic!("{e}"));
                Some(o)
            } else {
                None
            };
            for quant_act in [false, true] {
                for (layout, wb) in [("plain", Some(&w)), ("interleaved", wi.as_ref())] {
                    let Some(wb) = wb else { continue };
                    let a = LinearArgs {
                        x: &x,
                        rows: 16,
                        k,
                        w: wb,
                        wtype: t,
                        n,
                        bias: Some(&bias),
                        quant_act,
                    };
                    let il = layout == "interleaved";
                    let solo: Vec<Vec<f32>> = (0..16).map(|r| run(&th, &a, &x, r, 1, il)).collect();
                    for b in BATCHES {
                        // every row of the 16, in batches of b starting at each multiple of b
                        let mut r0 = 0;
                        while r0 < 16 {
                            let rows = b.min(16 - r0);
                            let got = run(&th, &a, &x, r0, rows, il);
                            let exact_gemm =
                                t.has_own_kernels() && !quant_act && rows >= GEMM_MIN_ROWS;
                            for r in (0..rows).filter(|_| !exact_gemm) {
                                let g = &got[r * n..(r + 1) * n];
                                let want = &solo[r0 + r];
                                let same =
                                    g.iter().zip(want).all(|(p, q)| p.to_bits() == q.to_bits());
                                if !same {
                                    bad.push(format!(
                                        "{} {layout} quant_act={quant_act} {n}x{k}: row {} in a batch of {rows}",
                                        t.name(),
                                        r0 + r
                                    ));
                                }
                            }
                            r0 += rows;
                        }
                    }
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "rows that differ from their solo result:\n{}",
        bad.join("\n")
    );
}

/// Several interleaved weights of one input in one call: each output bit-equal to that weight's
/// own `linear_interleaved` call (SIMD and reference), for row counts of the 4-row and the 8-row
/// kernels, weights of different row counts (one task may run on from one weight into the next).
#[test]
fn several_weights_in_one_call_equal_separate_calls() {
    let th = Threads::new(2).unwrap_or_else(|e| panic!("{e}"));
    let types = [
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q8_0,
        WeightType::Q4K,
        WeightType::Q6K,
    ];
    for t in types {
        let k = if t.is_kquant() { 512 } else { 96 };
        let ns = [48usize, 16, 32];
        let ws: Vec<Vec<u8>> = ns
            .iter()
            .map(|&n| {
                let w = weight(t, n, k, (n * 7 + k) as u64);
                let mut o = vec![0u8; w.len()];
                interleaved::interleave(t, &w, n, k, &mut o).unwrap_or_else(|e| panic!("{e}"));
                o
            })
            .collect();
        let biases: Vec<Vec<f32>> = ns.iter().map(|&n| rand_vec(n, n as u64)).collect();
        for rows in [1usize, 3, 5, 8, 11] {
            let x = rand_vec(rows * k, (rows + k) as u64);
            let parts: Vec<LinearArgs> = (0..3)
                .map(|i| LinearArgs {
                    x: &x,
                    rows,
                    k,
                    w: &ws[i],
                    wtype: t,
                    n: ns[i],
                    bias: (i != 1).then_some(biases[i].as_slice()),
                    quant_act: true,
                })
                .collect();
            for threads in [Some(&th), None] {
                let mut got: Vec<Vec<f32>> = ns.iter().map(|&n| vec![0f32; rows * n]).collect();
                let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|v| v.as_mut_slice()).collect();
                linear_interleaved_multi(threads, &parts, &mut outs)
                    .unwrap_or_else(|e| panic!("{e}"));
                for (i, p) in parts.iter().enumerate() {
                    let mut want = vec![0f32; rows * ns[i]];
                    linear_interleaved(threads, p, &mut want).unwrap_or_else(|e| panic!("{e}"));
                    let same = got[i]
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{} weight {i} of 3, {rows} rows, simd {}: differs from its own call",
                        t.name(),
                        threads.is_some()
                    );
                }
            }
        }
    }
}
