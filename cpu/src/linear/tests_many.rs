//! [`linear_many`]: several calls run as one pool job give each call's own results, bit for bit
//! ([`linear`] alone on the fast path, [`linear_ref`] on the reference path), for every weight
//! dtype with f32 and with quantized activations, on awkward sizes: weight rows not a multiple
//! of any tile, calls of one row (a decode step's experts), of several rows, and of none.

use super::*;
use crate::testutil::vals;
use crate::threads::Threads;

/// Plain bytes of an `n × k` weight of `t` with random values.
fn weight(t: WeightType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let v = vals(n * k, seed, -1.0, 1.0);
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

/// Each call's (rows, n): one-row calls (decode), a call without rows, several rows, weight
/// rows not a multiple of 2, 4, 8 or 16.
const CALLS: [(usize, usize); 6] = [(1, 67), (1, 130), (0, 33), (3, 5), (9, 67), (1, 1)];

#[test]
fn many_calls_in_one_job_equal_each_call_alone() {
    let pools: Vec<Threads> = [1, 2, 3]
        .iter()
        .map(|&n| Threads::new(n).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    for t in WeightType::ALL {
        let k = if t.is_kquant() { 512 } else { 96 };
        let ws: Vec<Vec<u8>> = (CALLS.iter().enumerate())
            .map(|(i, &(_, n))| weight(t, n, k, 7 + i as u64))
            .collect();
        let xs: Vec<Vec<f32>> = (CALLS.iter().enumerate())
            .map(|(i, &(r, _))| vals(r * k, 100 + i as u64, -2.0, 2.0))
            .collect();
        let bias = vals(130, 3, -0.5, 0.5);
        for quant_act in [false, true] {
            let args: Vec<LinearArgs> = (CALLS.iter().enumerate())
                .map(|(i, &(rows, n))| LinearArgs {
                    x: &xs[i],
                    rows,
                    k,
                    w: &ws[i],
                    wtype: t,
                    n,
                    bias: (i % 2 == 1).then_some(&bias[..n]),
                    quant_act,
                })
                .collect();
            let what = format!("{} quant_act={quant_act}", t.name());
            // the reference path: each call's linear_ref
            let want: Vec<Vec<f32>> = (args.iter())
                .map(|a| {
                    let mut o = vec![0f32; a.rows * a.n];
                    linear_ref(a, &mut o).unwrap_or_else(|e| panic!("{what}: {e}"));
                    o
                })
                .collect();
            assert_eq!(many(None, &args), want, "{what}: reference");
            for th in &pools {
                let alone: Vec<Vec<f32>> = (args.iter())
                    .map(|a| {
                        let mut o = vec![0f32; a.rows * a.n];
                        linear(th, a, &mut o).unwrap_or_else(|e| panic!("{what}: {e}"));
                        o
                    })
                    .collect();
                assert_eq!(many(Some(th), &args), alone, "{what}: {} threads", th.n());
            }
        }
    }
}

/// The outputs of `args` run through [`linear_many`].
fn many(th: Option<&Threads>, args: &[LinearArgs]) -> Vec<Vec<f32>> {
    let mut outs: Vec<Vec<f32>> = args.iter().map(|a| vec![f32::NAN; a.rows * a.n]).collect();
    let mut calls: Vec<LinearCall> = (args.iter().zip(outs.iter_mut()))
        .map(|(a, o)| LinearCall { args: *a, out: o })
        .collect();
    linear_many(th, &mut calls).unwrap_or_else(|e| panic!("{e}"));
    outs
}

/// The error of `run` over two calls of the Q4_0 weight `w` (`n` rows, k = 64), the second
/// with an output one value short.
fn second_call_short(
    w: &[u8],
    n: usize,
    run: fn(Option<&Threads>, &mut [LinearCall]) -> Result<(), String>,
) -> String {
    let x = vals(64, 2, -1.0, 1.0);
    let a = LinearArgs {
        x: &x,
        rows: 1,
        k: 64,
        w,
        wtype: WeightType::Q4_0,
        n,
        bias: None,
        quant_act: true,
    };
    let (mut o1, mut o2) = (vec![0f32; n], vec![0f32; n - 1]);
    let mut calls = [
        LinearCall {
            args: a,
            out: &mut o1,
        },
        LinearCall {
            args: a,
            out: &mut o2,
        },
    ];
    run(None, &mut calls).unwrap_err()
}

#[test]
fn a_bad_call_is_named() {
    let e = second_call_short(&weight(WeightType::Q4_0, 4, 64, 1), 4, linear_many);
    assert!(e.starts_with("call 1:") && e.contains("output"), "{e}");
}

/// [`linear_interleaved_many`]: weights of one input (q/k/v, gate/up) as one job give each
/// weight's [`linear_interleaved`] result bit for bit, for every interleaved dtype, with one
/// and several activation rows, weight row counts of 1 to 5 groups; calls that do not share
/// their input (or are float weights, or without `quant_act`) run one by one, also exactly.
#[test]
fn interleaved_weights_of_one_input_in_one_job_equal_each_alone() {
    let pools: Vec<Threads> = [1, 2, 3]
        .iter()
        .map(|&n| Threads::new(n).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let kinds = [
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q8_0,
        WeightType::Q4K,
        WeightType::Q5K,
        WeightType::Q6K,
        WeightType::Q2K,
        WeightType::Q3K,
        WeightType::F16,
    ];
    let ns = [80usize, 16, 48];
    for t in kinds {
        let k = if t.is_kquant() { 512 } else { 96 };
        let ws: Vec<Vec<u8>> = (ns.iter().enumerate())
            .map(|(i, &n)| {
                let plain = weight(t, n, k, 31 + i as u64);
                let mut w = vec![0u8; plain.len()];
                interleaved::interleave(t, &plain, n, k, &mut w).unwrap_or_else(|e| panic!("{e}"));
                w
            })
            .collect();
        let bias = vals(80, 5, -0.5, 0.5);
        for (rows, quant_act) in [(1usize, true), (5, true), (1, false)] {
            let xs = [vals(rows * k, 9, -2.0, 2.0), vals(rows * k, 10, -2.0, 2.0)];
            for shared in [true, false] {
                let args: Vec<LinearArgs> = (ns.iter().enumerate())
                    .map(|(i, &n)| LinearArgs {
                        x: &xs[if shared { 0 } else { i % 2 }],
                        rows,
                        k,
                        w: &ws[i],
                        wtype: t,
                        n,
                        bias: (i != 1).then_some(&bias[..n]),
                        quant_act,
                    })
                    .collect();
                let what = format!(
                    "{} rows={rows} quant_act={quant_act} shared={shared}",
                    t.name()
                );
                for th in pools.iter().map(Some).chain([None]) {
                    let alone: Vec<Vec<f32>> = (args.iter())
                        .map(|a| {
                            let mut o = vec![0f32; a.rows * a.n];
                            linear_interleaved(th, a, &mut o)
                                .unwrap_or_else(|e| panic!("{what}: {e}"));
                            o
                        })
                        .collect();
                    let mut outs: Vec<Vec<f32>> =
                        args.iter().map(|a| vec![f32::NAN; a.rows * a.n]).collect();
                    let mut calls: Vec<LinearCall> = (args.iter().zip(outs.iter_mut()))
                        .map(|(a, o)| LinearCall { args: *a, out: o })
                        .collect();
                    linear_interleaved_many(th, &mut calls)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(outs, alone, "{what}: {:?} threads", th.map(|t| t.n()));
                }
            }
        }
    }
}

#[test]
fn interleaved_many_names_a_bad_call() {
    let plain = weight(WeightType::Q4_0, 16, 64, 1);
    let mut w = vec![0u8; plain.len()];
    interleaved::interleave(WeightType::Q4_0, &plain, 16, 64, &mut w)
        .unwrap_or_else(|e| panic!("{e}"));
    let e = second_call_short(&w, 16, linear_interleaved_many);
    assert!(e.starts_with("call 1:") && e.contains("output"), "{e}");
}
