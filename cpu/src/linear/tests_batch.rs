//! Batch invariance: a row's `Linear` output is bit-equal whether the row runs alone or in a
//! batch of any size, on the fast (threaded SIMD) path, in the plain and the interleaved layout,
//! for every weight dtype with quantized activations (`fast` precision) and with f32 activations
//! (`exact`). Q2_K, Q3_K and Q6_K weights in `exact` precision, and Q4_K, Q5_K and Q5_0 on a CPU
//! without AVX-512, hold it below [`GEMM_MIN_ROWS`](super::GEMM_MIN_ROWS) rows; from there on
//! they run as converted f32 tiles, whose sums are ordered differently from their GEMV kernels'.

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
        WeightType::Mxfp4 => crate::mxfp4::quantize_mxfp4(&v, &mut b),
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
                            // the GEMV tiles of Q5_0, Q4_K and Q5_K give the GEMM's bits
                            // where the CPU has them
                            let direct = quant_dot::pick_tile_direct(t).is_some()
                                || kquant_tile::pick_tile_direct(t).is_some();
                            let exact_gemm = t.has_own_kernels()
                                && !direct
                                && !quant_act
                                && rows >= GEMM_MIN_ROWS;
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
