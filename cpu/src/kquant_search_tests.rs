//! Tests of the scale-searching K-quant quantizers: values already on a block's grid come back
//! bit-exact; every value gets its nearest representable level given the block's scales
//! (checked in f64 through the scalar dequantizers); the search is at least as accurate as plain
//! round-to-nearest; the refit never makes a block worse.

use super::*;
use crate::kquant::{self, scales_mins};
use crate::testutil::{nmse, vals};
use half::f16;
use rand::{Rng, SeedableRng};

type Quant = fn(&[f32], &mut [u8], bool);
type Dequant = fn(&[u8], &mut [f32]);

struct Kind {
    name: &'static str,
    quant: Quant,
    rtn: fn(&[f32], &mut [u8]),
    dequant: Dequant,
    bytes: usize,
}

const KINDS: [Kind; 3] = [
    Kind {
        name: "q4_k",
        quant: quantize_q4_k,
        rtn: kquant::quantize_q4_k,
        dequant: kquant::dequantize_q4_k,
        bytes: Q4_K_BYTES,
    },
    Kind {
        name: "q5_k",
        quant: quantize_q5_k,
        rtn: kquant::quantize_q5_k,
        dequant: kquant::dequantize_q5_k,
        bytes: Q5_K_BYTES,
    },
    Kind {
        name: "q6_k",
        quant: quantize_q6_k,
        rtn: kquant::quantize_q6_k,
        dequant: kquant::dequantize_q6_k,
        bytes: Q6_K_BYTES,
    },
];

fn run(k: &Kind, x: &[f32], refine: bool) -> (Vec<u8>, Vec<f32>) {
    let mut b = vec![0u8; x.len() / QK_K * k.bytes];
    (k.quant)(x, &mut b, refine);
    let mut y = vec![0f32; x.len()];
    (k.dequant)(&b, &mut y);
    (b, y)
}

/// Test tensors: Gaussian-like, uniform, all-positive, one large outlier per block, sparse with
/// zeros, constant, all zeros, tiny magnitudes; 1, 3 and 7 super-blocks.
fn awkward_inputs() -> Vec<Vec<f32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(25);
    let mut out = Vec::new();
    for (i, blocks) in [1usize, 3, 7].into_iter().enumerate() {
        let n = blocks * QK_K;
        let gauss: Vec<f32> = (0..n)
            .map(|_| (0..4).map(|_| rng.gen_range(-1.0f32..1.0)).sum::<f32>() * 0.02)
            .collect();
        out.push(gauss.clone());
        out.push(vals(n, 7 + i as u64, -3.0, 3.0));
        out.push(vals(n, 11 + i as u64, 0.5, 2.0));
        let mut spiky = gauss.clone();
        for b in 0..blocks {
            spiky[b * QK_K + 37] = 0.9;
        }
        out.push(spiky);
        out.push(
            gauss
                .iter()
                .enumerate()
                .map(|(j, &v)| if j % 3 == 0 { 0.0 } else { v })
                .collect(),
        );
        out.push(vec![-0.25; n]);
        out.push(vec![0.0; n]);
        out.push(gauss.iter().map(|v| v * 1e-3).collect());
    }
    out
}

#[test]
fn on_grid_values_round_trip_bit_exact() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for refine in [false, true] {
        // Q4_K / Q5_K: largest scale and min are 63, every sub-block uses levels 0 and nmax.
        for (k, nmax) in [(&KINDS[0], 15u8), (&KINDS[1], 31)] {
            let (d, dmin) = (f16_round(0.0123), f16_round(0.0071));
            let mut x = vec![0f32; QK_K];
            for j in 0..8 {
                let sc = if j == 2 { 63 } else { rng.gen_range(1..=63u8) };
                let m = if j == 5 { 63 } else { rng.gen_range(0..=63u8) };
                for l in 0..32 {
                    let q = match l {
                        0 => 0,
                        1 => nmax,
                        _ => rng.gen_range(0..=nmax),
                    };
                    x[32 * j + l] = d * sc as f32 * q as f32 - dmin * m as f32;
                }
            }
            let (_, y) = run(k, &x, refine);
            assert_eq!(x, y, "{} refine={refine}", k.name);
        }
        // Q6_K: group 0's scale is -128 (the largest); every group has a value at level -32.
        let d = f16_round(0.0009);
        let mut x = vec![0f32; QK_K];
        for g in 0..16 {
            let sc: i8 = if g == 0 {
                -128
            } else {
                rng.gen_range(-127..=127i8)
            };
            let sc = if sc == 0 { 5 } else { sc };
            for l in 0..16 {
                let q = if l == 3 {
                    -32
                } else {
                    rng.gen_range(-31..=31i32)
                };
                x[16 * g + l] = d * sc as f32 * q as f32;
            }
        }
        let (_, y) = run(&KINDS[2], &x, refine);
        assert_eq!(x, y, "q6_k refine={refine}");
    }
}

/// The representable values of element `e` of a super-block, in f64, from its header bytes.
fn levels(k: &Kind, b: &[u8], e: usize) -> Vec<f64> {
    let rd = |at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f64();
    if k.name == "q6_k" {
        let s = rd(208) * (b[192 + e / 16] as i8) as f64;
        return (-32..32).map(|q| s * q as f64).collect();
    }
    let (sc, m) = scales_mins(&b[4..16]);
    let j = e / 32;
    let s = rd(0) * ((sc >> (8 * j)) & 0xff) as f64;
    let mn = rd(2) * ((m >> (8 * j)) & 0xff) as f64;
    let nmax = if k.name == "q4_k" { 15 } else { 31 };
    (0..=nmax).map(|q| s * q as f64 - mn).collect()
}

#[test]
fn every_value_gets_its_nearest_level() {
    for k in &KINDS {
        for x in awkward_inputs() {
            for refine in [false, true] {
                let (b, y) = run(k, &x, refine);
                for (e, (&v, &got)) in x.iter().zip(&y).enumerate() {
                    let blk = &b[e / QK_K * k.bytes..][..k.bytes];
                    let lv = levels(k, blk, e % QK_K);
                    if lv.iter().all(|&l| l == lv[0]) {
                        continue; // a zero scale: the level is irrelevant
                    }
                    let best = lv
                        .iter()
                        .map(|l| (l - v as f64).abs())
                        .fold(f64::MAX, f64::min);
                    let err = (got as f64 - v as f64).abs();
                    assert!(
                        err <= best + 4e-7 * (v.abs() + got.abs()) as f64 + 1e-12,
                        "{} refine={refine} element {e}: {v} → {got}, nearest level is {best} away",
                        k.name
                    );
                }
            }
        }
    }
}

#[test]
fn search_beats_round_to_nearest() {
    // summed NMSE over the varied inputs (Gaussian-like, uniform, positive, spiky, sparse: the
    // search minimizes a weighted error, so one tensor may come out slightly worse in plain
    // NMSE); constant, zero and tiny inputs no worse than round-to-nearest; a bound on the
    // Gaussian-like ones
    let bound = [0.010, 0.0025, 7e-4];
    for (k, max_nmse) in KINDS.iter().zip(bound) {
        let (mut search, mut refined, mut rtn) = (0f64, 0f64, 0f64);
        for (i, x) in awkward_inputs().into_iter().enumerate() {
            let mut rb = vec![0u8; x.len() / QK_K * k.bytes];
            (k.rtn)(&x, &mut rb);
            let mut y = vec![0f32; x.len()];
            (k.dequant)(&rb, &mut y);
            let (r, s, e) = (
                nmse(&y, &x),
                nmse(&run(k, &x, false).1, &x),
                nmse(&run(k, &x, true).1, &x),
            );
            if i % 8 < 5 {
                (rtn, search, refined) = (rtn + r, search + s, refined + e);
            } else {
                assert!(
                    e <= r * 1.05 + 1e-12,
                    "{} input {i}: {e} vs rtn {r}",
                    k.name
                );
            }
            if i % 8 == 0 {
                assert!(e <= max_nmse, "{} input {i}: nmse {e} > {max_nmse}", k.name);
            }
        }
        eprintln!(
            "{}: summed NMSE rtn {rtn:.4e} search {search:.4e} refined {refined:.4e}",
            k.name
        );
        assert!(
            search < 0.95 * rtn,
            "{}: search {search} vs rtn {rtn}",
            k.name
        );
        assert!(
            refined <= 1.01 * search,
            "{}: refined {refined} vs search {search}",
            k.name
        );
    }
}

#[test]
fn refit_never_raises_a_blocks_weighted_error() {
    for x in awkward_inputs() {
        for xb in x.chunks_exact(QK_K) {
            let w = rms_weights(xb);
            for (nmax, sweep) in [(15, (-1.0, 0.1, 20)), (31, (-0.5, 0.1, 15))] {
                let plain = min_block(xb, nmax, sweep, false);
                let refined = min_block(xb, nmax, sweep, true);
                assert!(min_block_error(xb, &w, &refined) <= min_block_error(xb, &w, &plain));
            }
            let (plain, refined) = (signed_block(xb, false), signed_block(xb, true));
            assert!(signed_block_error(xb, &refined) <= signed_block_error(xb, &plain));
        }
    }
}
