//! Harness cases for the matrix ops: `Linear` (every weight dtype × 1, 3, 9 and 64 rows × awkward
//! k/n, with and without bias, `quant_act` 0 and 1) and `MatMul` / `MatMulTransB` (2-D, batched,
//! broadcast `input1`, odd sizes, `alpha`).
//!
//! Thresholds (NMSE against the scalar reference device):
//! - `LINEAR_FLOAT_NMSE` (1e-9): float and exact-quantized weights. Both sides compute the same
//!   products in f32; only the summation order (8-lane partial sums, FMA) differs, which costs
//!   about `sqrt(k) · 2^-24` relative error per output (NMSE ~1e-12 measured).
//! - `LINEAR_QUANT_ACT_NMSE` (1e-9): `quant_act = 1`. The reference quantizes the activations
//!   bit-identically and does the same integer block dots, so again only the float sum order of
//!   the per-block results differs. (The distance of this precision to the exact result is
//!   tested separately, in `devices::cpu::linear`'s tests, at NMSE ≤ 5e-4.)
//! - `MATMUL_NMSE` (1e-9): f32 matmuls, same reasoning.

use super::{CaseRng, OpCase};
use crate::data::DataType::{self, *};

/// See the module doc.
const LINEAR_FLOAT_NMSE: f64 = 1e-9;
/// See the module doc.
const LINEAR_QUANT_ACT_NMSE: f64 = 1e-9;
/// See the module doc.
const MATMUL_NMSE: f64 = 1e-9;

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    linear_cases(v);
    matmul_cases(v);
}

fn linear_cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(7);
    // (k, n): k a multiple of 32 so every dtype takes it; n odd / not a multiple of anything.
    // (1056: 33 blocks, past two 16-block chunks of the wide VNNI tiles' Q4_1 min term)
    // k = 512 and 2304 are multiples of 256, which the GPU's 16-byte block GEMV takes (2 and 9
    // groups of 8 blocks per row: 4 and 8 lanes per row, some idle or looping).
    let block_shapes = [
        (32usize, 1usize),
        (96, 7),
        (160, 67),
        (576, 129),
        (1056, 5),
        (512, 37),
        (2304, 9),
    ];
    // extra k for float weights only (not multiples of the SIMD width), and one long row
    // (1056 = 4·256 + 32) that takes the GPU's grouped 16-byte f16/bf16 loop and its
    // predicated last group
    let float_shapes = [(33usize, 7usize), (45, 3), (100, 17), (1056, 3)];
    // K-quants: 1, 2, 5 and 9 super-blocks per row
    let kquant_shapes = [(256usize, 7usize), (512, 37), (1280, 67), (2304, 9)];
    let dtypes: [DataType; 13] = [
        F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q2K, Q3K, Q4K, Q5K, Q6K, Mxfp4,
    ];
    for wt in dtypes {
        let mut shapes: Vec<(usize, usize)> = if wt.is_kquant() {
            kquant_shapes.to_vec()
        } else {
            block_shapes.to_vec()
        };
        if !wt.is_quantized() {
            shapes.extend(float_shapes);
        }
        let quant_acts: &[i32] = if wt.is_quantized() { &[0, 1] } else { &[0] };
        for &(k, n) in &shapes {
            // 9 = one 8-row wide tile + 1
            for rows in [1usize, 3, 9, 64] {
                // 64 rows as [2, 32, k]: leading dims are flattened
                let in_dims: Vec<usize> = if rows == 64 {
                    vec![2, 32, k]
                } else {
                    vec![rows, k]
                };
                for with_bias in [false, true] {
                    for &qa in quant_acts {
                        let tol = if qa == 1 {
                            LINEAR_QUANT_ACT_NMSE
                        } else {
                            LINEAR_FLOAT_NMSE
                        };
                        let label = format!(
                            "{wt} input={in_dims:?} weight=[{n}, {k}] bias={with_bias} quant_act={qa}"
                        );
                        let mut c = OpCase::new("Linear", label, tol)
                            .input("input", rng.data(F32, &in_dims))
                            .input("weight", rng.data(wt, &[n, k]));
                        if with_bias {
                            c = c.input("bias", rng.data(F32, &[n]));
                        }
                        v.push(c.output("output", F32).int("quant_act", qa));
                    }
                }
            }
        }
    }
}

fn matmul_cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(8);
    // (input0 dims, input1 dims as for MatMul [.., k, n], alpha)
    // the last two have enough batches of enough work to be split over the threads by batch
    let shapes: [(&[usize], &[usize], f32); 8] = [
        (&[1, 1], &[1, 1], 1.0),
        (&[5, 17], &[17, 3], 1.0),
        (&[7, 64], &[64, 129], 0.125),
        (&[2, 3, 5, 17], &[2, 3, 17, 9], 1.0),
        (&[3, 33, 20], &[3, 20, 70], 0.5),
        (&[4, 6, 33], &[33, 7], 1.0),
        (&[16, 8, 64], &[16, 64, 40], 0.25),
        (&[12, 8, 64], &[64, 40], 1.0),
    ];
    for (a, b, alpha) in shapes {
        v.push(
            OpCase::new(
                "MatMul",
                format!("input0={a:?} input1={b:?} alpha={alpha}"),
                MATMUL_NMSE,
            )
            .input("input0", rng.data(F32, a))
            .input("input1", rng.data(F32, b))
            .output("output", F32)
            .float("alpha", alpha),
        );
        // the same sizes with input1 stored transposed: [.., n, k]
        let mut bt = b.to_vec();
        let l = bt.len();
        bt.swap(l - 1, l - 2);
        v.push(
            OpCase::new(
                "MatMulTransB",
                format!("input0={a:?} input1={bt:?} alpha={alpha}"),
                MATMUL_NMSE,
            )
            .input("input0", rng.data(F32, a))
            .input("input1", rng.data(F32, &bt))
            .output("output", F32)
            .float("alpha", alpha),
        );
    }
}
