//! Batched (a few rows) GPU products: the `linear_mma` kernels (block weights read once for all
//! activation rows, dequantized in registers, tensor cores; F16 weights loaded into registers) against a scalar reference of the
//! same arithmetic (activations and dequantized weights rounded to f16, products summed in
//! f64), and the int8 `linear_mmq` kernels of every compiled tile shape against the product of
//! the Q8_0-quantized activations and the dequantized weights (summed in f64), on awkward
//! shapes: rows not a multiple of the 8-row tile, more rows than one slice, outputs not a
//! multiple of the block's weight rows, k of an odd number of chunks, forced k splits, several
//! weights in one launch, biases, `accumulate` and f16 outputs; the int8 tile shapes that add
//! the blocks of k in order give the same bits for a row whatever the row count; several
//! weights in one launch give the bits of separate launches on every path. Also the
//! F16-weight products of 2..15 rows (cuBLAS) against the exact product.
//!
//! Without a GPU every test passes without work and the binary says once, on stderr past the
//! test harness's capture, "SKIPPED: no CUDA device (...)" (CI has none).

#![cfg(feature = "cuda")]

mod common;

use fastllm::data::{decode_to_f32, encode_from_f32, Data, DataType};
use fastllm::devices::cpu::CpuDevice;
use fastllm::devices::cuda::CudaDevice;
use fastllm::harness::{nmse, CaseRng};
use fastllm::{BaseDevice, DataDict, Executor, FloatDict, IntDict};
use std::sync::Arc;

fn gpu() -> Option<Arc<CudaDevice>> {
    match CudaDevice::new(0) {
        Ok(d) => Some(Arc::new(d)),
        Err(e) => {
            common::skipped(&format!("no CUDA device ({e})"));
            None
        }
    }
}

fn cuda_executor(dev: &Arc<CudaDevice>) -> Executor {
    let mut e = Executor::new();
    e.add_device(dev.clone());
    e.add_device(Arc::new(CpuDevice::new(0).unwrap()));
    e
}

/// Values rounded to f16 and back.
fn round_f16(v: &[f32]) -> Vec<f32> {
    let bytes = encode_from_f32(DataType::F16, v).unwrap();
    let mut out = vec![0f32; v.len()];
    decode_to_f32(DataType::F16, &bytes, &mut out).unwrap();
    out
}

/// `x·Wᵀ (+ b)` with x and the dequantized W rounded to f16, summed in f64.
fn reference(x: &Data, w: &Data, b: Option<&Data>) -> Vec<f32> {
    let (m, k, n) = (x.count() / x.dim(-1), x.dim(-1), w.dim(0));
    let xs = round_f16(&x.to_f32_vec().unwrap());
    let ws = round_f16(&w.to_f32_vec().unwrap());
    let bs = b.map(|b| b.to_f32_vec().unwrap());
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        for j in 0..n {
            let mut s = 0f64;
            for i in 0..k {
                s += xs[r * k + i] as f64 * ws[j * k + i] as f64;
            }
            y[r * n + j] = (s + bs.as_ref().map_or(0.0, |b| b[j] as f64)) as f32;
        }
    }
    y
}

/// Only the f32 accumulation order differs from the reference.
const SAME_ARITHMETIC_NMSE: f64 = 1e-10;

/// Values quantized to Q8_0 (32-value blocks along rows) and dequantized.
fn round_q8(v: &[f32]) -> Vec<f32> {
    let bytes = encode_from_f32(DataType::Q8_0, v).unwrap();
    let mut out = vec![0f32; v.len()];
    decode_to_f32(DataType::Q8_0, &bytes, &mut out).unwrap();
    out
}

/// `x·Wᵀ (+ b)` with x quantized to Q8_0 and W dequantized, summed in f64 (the arithmetic of
/// the int8 kernels up to the f32 rounding of each block's scaled sum).
fn reference_q8(x: &Data, w: &Data, b: Option<&Data>) -> Vec<f32> {
    let (m, k, n) = (x.count() / x.dim(-1), x.dim(-1), w.dim(0));
    let xs = round_q8(&x.to_f32_vec().unwrap());
    let ws = w.to_f32_vec().unwrap();
    let bs = b.map(|b| b.to_f32_vec().unwrap());
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        for j in 0..n {
            let mut s = 0f64;
            for i in 0..k {
                s += xs[r * k + i] as f64 * ws[j * k + i] as f64;
            }
            y[r * n + j] = (s + bs.as_ref().map_or(0.0, |b| b[j] as f64)) as f32;
        }
    }
    y
}

/// Each block's integer sum is scaled in f32 (one or two roundings per block); the GPU's and the
/// host's Q8_0 rounding of an activation may differ in the last step now and then.
const INT8_ARITHMETIC_NMSE: f64 = 1e-7;

/// Runs `Linear` (quant_act) with weights `ws` (biases `bs`, outputs `ys` pre-filled when
/// `accumulate`) and the call's ints; returns the outputs on the host.
fn run_linear(
    exec: &Executor,
    x: &Data,
    ws: &[&Data],
    bs: &[Option<&Data>],
    ys: &mut [Data],
    ints: &IntDict,
) -> Vec<Vec<f32>> {
    const NAMES: [(&str, &str, &str); 3] = [
        ("weight", "bias", "output"),
        ("weight1", "bias1", "output1"),
        ("weight2", "bias2", "output2"),
    ];
    {
        let mut d = DataDict::new().with("input", x);
        for (i, (w, b)) in ws.iter().zip(bs).enumerate() {
            d.insert(NAMES[i].0, w);
            if let Some(b) = b {
                d.insert(NAMES[i].1, b);
            }
        }
        for (i, y) in ys.iter_mut().enumerate() {
            d.insert_mut(NAMES[i].2, y);
        }
        exec.run("Linear", &mut d, &FloatDict::new(), ints).unwrap();
    }
    ys.iter()
        .map(|y| y.to_owned_host().unwrap().to_f32_vec().unwrap())
        .collect()
}

fn check(what: &str, got: &[f32], want: &[f32], tol: f64) {
    let (e, bad) = nmse(got, want);
    assert!(!bad && e <= tol, "{what}: nmse {e:.3e} > {tol:.0e}");
}

#[test]
fn mma_linear_matches_f16_reference_on_awkward_shapes() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(91);
    // (rows, k, n, forced splits): 1280 = five 256-value chunks; 70 and 130 rows take two and
    // three slices of 64 rows (mma = 2 forces the kernels there); from 17 rows on both block
    // widths (128 and 256 weight rows) are asked for (wide blocks exist for Q8_0 from 33 rows:
    // 300 outputs end inside a second one)
    let shapes = [
        (2usize, 256usize, 1usize, 0usize),
        (3, 512, 67, 0),
        (7, 1280, 129, 0),
        (9, 256, 300, 0),
        (17, 1280, 130, 3),
        (33, 768, 257, 2),
        (40, 512, 300, 2),
        (64, 512, 128, 0),
        (70, 512, 200, 0),
        (130, 256, 45, 1),
    ];
    let mut checked = 0;
    for wt in [
        DataType::Q4_0,
        DataType::Q4_1,
        DataType::Q8_0,
        DataType::F16,
    ] {
        for &(m, k, n, splits) in &shapes {
            let x = rng.data(DataType::F32, &[m, k]);
            let w = rng.data(wt, &[n, k]);
            let b = rng.data(DataType::F32, &[n]);
            let want = reference(&x, &w, Some(&b));
            let (gx, gw, gb) = (
                dev.upload(&x).unwrap(),
                dev.upload(&w).unwrap(),
                dev.upload(&b).unwrap(),
            );
            let widths: &[i32] = if m >= 17 { &[128, 256] } else { &[0] };
            let mut outs = Vec::new();
            for &rows in widths {
                let ints = IntDict::new()
                    .with("quant_act", 1)
                    .with("mma", 2)
                    .with("mma_splits", splits as i32)
                    .with("mma_rows", rows);
                // poisoned outputs: every element must be written
                let mut ys = [Data::from_f32(&[m, n], &vec![f32::NAN; m * n]).unwrap()];
                ys[0] = dev.upload(&ys[0]).unwrap();
                let got = run_linear(&cuda, &gx, &[&gw], &[Some(&gb)], &mut ys, &ints);
                check(
                    &format!("{wt} m={m} k={k} n={n} splits={splits} rows={rows}"),
                    &got[0],
                    &want,
                    SAME_ARITHMETIC_NMSE,
                );
                outs.push(got.into_iter().next().unwrap());
                checked += 1;
            }
            // the same k split: the same additions in the same order, whatever the block width
            if splits > 0 && outs.len() == 2 {
                let same = outs[0]
                    .iter()
                    .zip(&outs[1])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{wt} m={m} k={k} n={n}: block widths differ");
            }
        }
    }
    println!("linear_mma: {checked} products equal to the f16 reference");
}

#[test]
fn mmq_linear_matches_q8_reference_on_awkward_shapes() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(95);
    // (rows, k, n, forced splits): 1152 = nine 128-value chunks; 65..128 rows take the 16-tile
    // kernel, 130 rows two slices (mma = 3 forces the int8 kernels)
    let shapes = [
        (2usize, 128usize, 1usize, 0usize),
        (3, 384, 67, 0),
        (7, 1152, 129, 0),
        (9, 128, 300, 0),
        (17, 640, 130, 3),
        (33, 768, 257, 2),
        (64, 512, 128, 0),
        (70, 512, 200, 0),
        (100, 1152, 77, 4),
        (100, 384, 300, 0),
        (128, 256, 65, 0),
        (128, 640, 333, 0),
        (130, 384, 45, 1),
    ];
    let mut checked = 0;
    for wt in [DataType::Q4_0, DataType::Q4_1, DataType::Q8_0] {
        for &(m, k, n, splits) in &shapes {
            let x = rng.data(DataType::F32, &[m, k]);
            let w = rng.data(wt, &[n, k]);
            let b = rng.data(DataType::F32, &[n]);
            let want = reference_q8(&x, &w, Some(&b));
            let (gx, gw, gb) = (
                dev.upload(&x).unwrap(),
                dev.upload(&w).unwrap(),
                dev.upload(&b).unwrap(),
            );
            // every compiled tile shape of the row count (mmq_shape past the last: the last)
            for shape in 0..MMQ_SHAPES {
                let ints = IntDict::new()
                    .with("quant_act", 1)
                    .with("mma", 3)
                    .with("mma_splits", splits as i32)
                    .with("mmq_shape", shape);
                // poisoned outputs: every element must be written
                let mut ys = [Data::from_f32(&[m, n], &vec![f32::NAN; m * n]).unwrap()];
                ys[0] = dev.upload(&ys[0]).unwrap();
                let got = run_linear(&cuda, &gx, &[&gw], &[Some(&gb)], &mut ys, &ints);
                check(
                    &format!("int8 {wt} m={m} k={k} n={n} splits={splits} shape={shape}"),
                    &got[0],
                    &want,
                    INT8_ARITHMETIC_NMSE,
                );
                checked += 1;
            }
        }
    }
    println!("linear_mmq: {checked} products equal to the q8 reference");
}

/// The most tile shapes `linear_mmq` compiles for one row count.
const MMQ_SHAPES: i32 = 2;

#[test]
fn mmq_shapes_that_add_blocks_in_order_give_the_same_bits_for_any_row_count() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(97);
    let (k, n) = (1152usize, 300usize);
    for wt in [DataType::Q4_0, DataType::Q4_1, DataType::Q8_0] {
        let x = rng.data(DataType::F32, &[128, k]);
        let w = dev.upload(&rng.data(wt, &[n, k])).unwrap();
        // (rows, shape): the shapes with one warp per block of k (wk = 1) at 8..128 rows; with
        // the same k split, a row's products do not depend on the other rows
        let mut first: Option<Vec<f32>> = None;
        for &(m, shape) in &[(8usize, 1i32), (16, 1), (32, 0), (64, 0), (128, 0)] {
            let xs = x.to_f32_vec().unwrap()[..m * k].to_vec();
            let gx = dev.upload(&Data::from_f32(&[m, k], &xs).unwrap()).unwrap();
            let ints = IntDict::new()
                .with("quant_act", 1)
                .with("mma", 3)
                .with("mma_splits", 3)
                .with("mmq_shape", shape);
            let mut ys = [dev
                .upload(&Data::from_f32(&[m, n], &vec![0.0; m * n]).unwrap())
                .unwrap()];
            let got = run_linear(&cuda, &gx, &[&w], &[None], &mut ys, &ints);
            let rows8 = got[0][..8 * n].to_vec();
            match &first {
                None => first = Some(rows8),
                Some(f) => assert!(
                    f.iter()
                        .zip(&rows8)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{wt} m={m} shape={shape}: the first 8 rows differ from the 8-row product"
                ),
            }
        }
    }
}

#[test]
fn mmq_linear_segments_and_accumulate() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(96);
    for wt in [DataType::Q4_0, DataType::Q4_1, DataType::Q8_0] {
        for &(m, k, splits) in &[(5usize, 512usize, 0usize), (24, 768, 3), (61, 384, 0)] {
            // three weights in one launch (q/k/v-like), a bias on the second only
            let ns = [100usize, 37, 37];
            let x = rng.data(DataType::F32, &[m, k]);
            let ws: Vec<Data> = ns.iter().map(|&n| rng.data(wt, &[n, k])).collect();
            let b1 = rng.data(DataType::F32, &[ns[1]]);
            let bs_host = [None, Some(&b1), None];
            let gx = dev.upload(&x).unwrap();
            let gws: Vec<Data> = ws.iter().map(|w| dev.upload(w).unwrap()).collect();
            let gbs = [None, Some(dev.upload(&b1).unwrap()), None];
            // the int8 kernels (mma = 3; the device's choice up to Q8_COPY_MAX_ROWS)
            let ints = IntDict::new()
                .with("quant_act", 1)
                .with("mma", 3)
                .with("mma_splits", splits as i32);
            let mut ys: Vec<Data> = ns
                .iter()
                .map(|&n| dev.upload(&Data::from_f32(&[m, n], &vec![f32::NAN; m * n]).unwrap()))
                .collect::<Result<_, _>>()
                .unwrap();
            let wrefs: Vec<&Data> = gws.iter().collect();
            let brefs: Vec<Option<&Data>> = gbs.iter().map(|b| b.as_ref()).collect();
            let got = run_linear(&cuda, &gx, &wrefs, &brefs, &mut ys, &ints);
            for i in 0..3 {
                let want = reference_q8(&x, &ws[i], bs_host[i]);
                check(
                    &format!("int8 {wt} segment {i} m={m}"),
                    &got[i],
                    &want,
                    INT8_ARITHMETIC_NMSE,
                );
            }
            // accumulate: y = y0 + x·Wᵀ (one weight)
            let n = ns[0];
            let y0 = rng.data(DataType::F32, &[m, n]);
            let mut ys = [dev.upload(&y0).unwrap()];
            let acc = ints.clone().with("accumulate", 1);
            let got = run_linear(&cuda, &gx, &wrefs[..1], &[None], &mut ys, &acc);
            let prod = reference_q8(&x, &ws[0], None);
            let want: Vec<f32> = y0
                .to_f32_vec()
                .unwrap()
                .iter()
                .zip(&prod)
                .map(|(a, b)| a + b)
                .collect();
            check(
                &format!("int8 {wt} accumulate m={m}"),
                &got[0],
                &want,
                INT8_ARITHMETIC_NMSE,
            );
        }
    }
}

#[test]
fn mma_linear_segments_accumulate_and_half_outputs() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(92);
    for wt in [DataType::Q4_0, DataType::Q8_0, DataType::F16] {
        for &(m, k, splits) in &[(5usize, 512usize, 0usize), (24, 768, 3)] {
            // three weights in one launch (q/k/v-like), a bias on the second only
            let ns = [100usize, 37, 37];
            let x = rng.data(DataType::F32, &[m, k]);
            let ws: Vec<Data> = ns.iter().map(|&n| rng.data(wt, &[n, k])).collect();
            let b1 = rng.data(DataType::F32, &[ns[1]]);
            let bs_host = [None, Some(&b1), None];
            let gx = dev.upload(&x).unwrap();
            let gws: Vec<Data> = ws.iter().map(|w| dev.upload(w).unwrap()).collect();
            let gbs = [None, Some(dev.upload(&b1).unwrap()), None];
            let ints = IntDict::new()
                .with("quant_act", 1)
                .with("mma", 2)
                .with("mma_splits", splits as i32);
            let mut ys: Vec<Data> = ns
                .iter()
                .map(|&n| dev.upload(&Data::from_f32(&[m, n], &vec![f32::NAN; m * n]).unwrap()))
                .collect::<Result<_, _>>()
                .unwrap();
            let wrefs: Vec<&Data> = gws.iter().collect();
            let brefs: Vec<Option<&Data>> = gbs.iter().map(|b| b.as_ref()).collect();
            let got = run_linear(&cuda, &gx, &wrefs, &brefs, &mut ys, &ints);
            for i in 0..3 {
                let want = reference(&x, &ws[i], bs_host[i]);
                check(
                    &format!("{wt} segment {i} m={m}"),
                    &got[i],
                    &want,
                    SAME_ARITHMETIC_NMSE,
                );
            }
            // accumulate: y = y0 + x·Wᵀ (one weight)
            let n = ns[0];
            let y0 = rng.data(DataType::F32, &[m, n]);
            let mut ys = [dev.upload(&y0).unwrap()];
            let acc = ints.clone().with("accumulate", 1);
            let got = run_linear(&cuda, &gx, &wrefs[..1], &[None], &mut ys, &acc);
            let prod = reference(&x, &ws[0], None);
            let want: Vec<f32> = y0
                .to_f32_vec()
                .unwrap()
                .iter()
                .zip(&prod)
                .map(|(a, b)| a + b)
                .collect();
            check(
                &format!("{wt} accumulate m={m}"),
                &got[0],
                &want,
                SAME_ARITHMETIC_NMSE,
            );
        }
    }
    // f16 outputs (the gated MLP's half_output = 2), from TC_MIN_ROWS rows on
    let (m, k, n) = (20usize, 512usize, 150usize);
    let x = rng.data(DataType::F32, &[m, k]);
    let w = rng.data(DataType::Q4_0, &[n, k]);
    let mut y = Data::empty(DataType::F32);
    let (gx, gw) = (dev.upload(&x).unwrap(), dev.upload(&w).unwrap());
    let mut d = DataDict::new()
        .with("input", &gx)
        .with("weight", &gw)
        .with_mut("output", &mut y);
    let ints = IntDict::new()
        .with("quant_act", 1)
        .with("half_output", 2)
        .with("mma", 2);
    cuda.run("Linear", &mut d, &FloatDict::new(), &ints)
        .unwrap();
    assert_eq!(y.dtype(), DataType::F16, "half_output gives f16 outputs");
    let want = round_f16(&reference(&x, &w, None));
    // one f16 rounding of the output: relative 2^-11 per element
    let got = y.to_owned_host().unwrap().to_f32_vec().unwrap();
    check("f16 outputs", &got, &want, 1e-6);
}

/// The outputs of a product of `x` with the weights `ws` (biases `bs`) as one launch, starting
/// from fresh copies of the host tensors `y0` (`accumulate`) or NaN.
fn segments_from(
    dev: &CudaDevice,
    exec: &Executor,
    x: &Data,
    ws: &[&Data],
    bs: &[Option<&Data>],
    y0: Option<&[Data]>,
    ints: &IntDict,
) -> Vec<Vec<f32>> {
    let m = x.dims()[0];
    let mut ys: Vec<Data> = ws
        .iter()
        .enumerate()
        .map(|(i, w)| match y0 {
            Some(y) => dev.upload(&y[i]).unwrap(),
            None => {
                let n = w.dims()[0];
                dev.upload(&Data::from_f32(&[m, n], &vec![f32::NAN; m * n]).unwrap())
                    .unwrap()
            }
        })
        .collect();
    run_linear(exec, x, ws, bs, &mut ys, ints)
}

/// Several weights in one launch give the bits of separate launches on every path (the GEMV
/// kernels, `linear_mma`, `linear_mmq`, cuBLAS on dequantized tiles or F16 weights), also where
/// the weights' own plans split k differently (a long first weight, 640 rows: one split; the
/// short ones two), with biases and `accumulate`; and a product with `accumulate` (no bias)
/// gives the bits of the product added to the outputs afterwards (`AddTo`).
#[test]
fn multi_weight_launches_equal_separate_launches_bit_for_bit() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(94);
    let k = 1024;
    for wt in [DataType::Q4_0, DataType::Q8_0, DataType::F16] {
        let ns = [10_300usize, 37, 300];
        let ws: Vec<Data> = ns
            .iter()
            .map(|&n| dev.upload(&rng.data(wt, &[n, k])).unwrap())
            .collect();
        let b1 = dev.upload(&rng.data(DataType::F32, &[ns[1]])).unwrap();
        let wrefs: Vec<&Data> = ws.iter().collect();
        let brefs = [None, Some(&b1), None];
        // (rows, mma): one-row and 5-row GEMV, the f16 and int8 tensor-core kernels, cuBLAS
        for (m, mode) in [
            (1usize, 0),
            (5, 1),
            (5, 2),
            (640, 2),
            (5, 3),
            (640, 3),
            (40, 1),
        ] {
            let x = dev.upload(&rng.data(DataType::F32, &[m, k])).unwrap();
            for acc in [false, true] {
                let ints = IntDict::new()
                    .with("quant_act", 1)
                    .with("mma", mode)
                    .with("accumulate", acc as i32);
                let y0: Option<Vec<Data>> = acc.then(|| {
                    ns.iter()
                        .map(|&n| rng.data(DataType::F32, &[m, n]))
                        .collect()
                });
                let y0 = y0.as_deref();
                let one = segments_from(&dev, &cuda, &x, &wrefs, &brefs, y0, &ints);
                let bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
                let case = format!("{wt} m={m} mma={mode} acc={acc}");
                for i in 0..3 {
                    let yi = y0.map(|y| &y[i..i + 1]);
                    let sep = segments_from(
                        &dev,
                        &cuda,
                        &x,
                        &wrefs[i..i + 1],
                        &brefs[i..i + 1],
                        yi,
                        &ints,
                    );
                    assert!(
                        bits(&one[i]) == bits(&sep[0]),
                        "{case}: weight {i} of the launch differs from its own launch"
                    );
                    let Some(y0) = y0.filter(|_| i != 1) else {
                        continue;
                    };
                    // accumulate = the plain product, then y0 + it (f32, as AddTo adds)
                    let plain = IntDict::new().with("quant_act", 1).with("mma", mode);
                    let p = segments_from(&dev, &cuda, &x, &wrefs[i..i + 1], &[None], None, &plain);
                    let y0 = y0[i].to_f32_vec().unwrap();
                    let added: Vec<f32> = y0.iter().zip(&p[0]).map(|(a, b)| a + b).collect();
                    assert!(
                        bits(&sep[0]) == bits(&added),
                        "{case}: weight {i} accumulated differs from its product added afterwards"
                    );
                }
            }
        }
    }
}

#[test]
fn mma_and_cublas_paths_agree_with_the_gemv_and_dequantized_paths() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(93);
    // the device's choice (mma = 0) against the paths without linear_mma (mma = 1): q8
    // activations below TC_MIN_ROWS rows, f16 dequantized tiles through cuBLAS above; F16
    // weights through cuBLAS from 2 rows
    for wt in [
        DataType::Q4_0,
        DataType::Q4_1,
        DataType::Q8_0,
        DataType::F16,
    ] {
        for &(m, k, n) in &[(2usize, 512usize, 70usize), (8, 1024, 300), (40, 256, 129)] {
            let x = rng.data(DataType::F32, &[m, k]);
            let w = rng.data(wt, &[n, k]);
            let (gx, gw) = (dev.upload(&x).unwrap(), dev.upload(&w).unwrap());
            let out = |mode: i32| {
                let ints = IntDict::new().with("quant_act", 1).with("mma", mode);
                let mut ys = [Data::empty(DataType::F32)];
                run_linear(&cuda, &gx, &[&gw], &[None], &mut ys, &ints).remove(0)
            };
            let (new, old) = (out(0), out(1));
            // q8 activations (old path below 16 rows) round to 2^-8 of the block's largest value
            check(&format!("{wt} m={m} k={k} n={n}"), &new, &old, 1e-4);
            if wt == DataType::F16 {
                check(
                    &format!("{wt} m={m} exact"),
                    &new,
                    &reference(&x, &w, None),
                    SAME_ARITHMETIC_NMSE,
                );
            }
        }
    }
}

/// The product options a caller can get wrong (`mma_rows` other than 0 / 128 / 256, negative
/// `mma_splits` or `mmq_shape`) are refused with the option's name, nothing written.
#[test]
fn bad_product_options_are_refused_by_name() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(17);
    let (m, k, n) = (32usize, 256usize, 64usize);
    let x = dev.upload(&rng.data(DataType::F32, &[m, k])).unwrap();
    let w = dev.upload(&rng.data(DataType::Q4_0, &[n, k])).unwrap();
    for (name, v) in [
        ("mma_rows", 100),
        ("mma_rows", -1),
        ("mma_splits", -1),
        ("mmq_shape", -2),
    ] {
        let ints = IntDict::new()
            .with("quant_act", 1)
            .with("mma", 2)
            .with(name, v);
        let mut y = Data::empty(DataType::F32);
        let mut d = DataDict::new()
            .with("input", &x)
            .with("weight", &w)
            .with_mut("output", &mut y);
        let e = cuda
            .run("Linear", &mut d, &FloatDict::new(), &ints)
            .expect_err(&format!("{name} = {v} was accepted"));
        assert!(e.to_string().contains(name), "{name} = {v}: {e}");
    }
}
