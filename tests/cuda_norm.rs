//! `RMSNorm` with a residual (`input1`) on the CUDA device, the form the device's `add_norm`
//! pass makes of `AddTo` then `RMSNorm`: the sum it leaves in the input and the normalized
//! rows equal the two plain calls bit for bit, for f32, f16 and bf16 residuals, rows that take
//! the float4 kernels and rows that do not, one row added to every row, with and without the
//! copies for the next `Linear`;
//! `AddTo` of f16 / bf16 rows into f32 ones is exact; a residual of another shape is an error,
//! and the CPU refuses the residual form.
//!
//! Without a GPU every test passes without work and the binary says once, on stderr past the
//! test harness's capture, "SKIPPED: no CUDA device (...)" (CI has none).

#![cfg(feature = "cuda")]

mod common;

use common::cuda::{cuda_executor, gpu, reference, run_linear};
use fastllm::data::{Data, DataType};
use fastllm::harness::CaseRng;
use fastllm::ops::OutputCopy;
use fastllm::{BaseDevice, DataDict, Executor, FloatDict, IntDict};

/// `input += input1` on `exec`.
fn add_to(exec: &Executor, x: &mut Data, r: &Data) {
    let mut d = DataDict::new().with_mut("input0", x).with("input1", r);
    exec.run(
        "AddTo",
        &mut d,
        &FloatDict::new().with("alpha", 1.0),
        &IntDict::new(),
    )
    .unwrap();
}

/// `RMSNorm` of `x` into a new tensor, first adding `r` into `x` when given.
fn rms(exec: &Executor, x: &mut Data, r: Option<&Data>, w: &Data, copy: OutputCopy) -> Data {
    let mut h = Data::empty(DataType::F32);
    let mut d = DataDict::new()
        .with_mut("input", x)
        .with("weight", w)
        .with_mut("output", &mut h);
    if let Some(r) = r {
        d.insert("input1", r);
    }
    exec.run(
        "RMSNorm",
        &mut d,
        &FloatDict::new().with("eps", 1e-5),
        &IntDict::new().with("quantize_output", copy.param()),
    )
    .unwrap();
    drop(d);
    h
}

fn host(d: &Data) -> Vec<f32> {
    d.to_owned_host().unwrap().to_f32_vec().unwrap()
}

#[test]
fn residual_norm_equals_add_to_then_norm() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(41);
    let mut checked = 0;
    // (rows, row): float4 kernels (decode row, 20 prefill rows, a row of 4 · 4 · 1024), and rows
    // that are not (a row not a multiple of 4, one too long)
    let shapes = [
        (1usize, 4096usize),
        (20, 512),
        (3, 16384),
        (5, 70),
        (2, 37),
        (1, 16388),
    ];
    for rt in [DataType::F32, DataType::F16, DataType::BF16] {
        for (m, k) in shapes {
            let x0 = rng.data_range(DataType::F32, &[m, k], -4.0, 4.0);
            let r = dev.upload(&rng.data(rt, &[m, k])).unwrap();
            let w = dev.upload(&rng.data(DataType::F32, &[k])).unwrap();
            // the exact sum, from the host values
            let want_x: Vec<f32> = x0
                .to_f32_vec()
                .unwrap()
                .iter()
                .zip(host(&r))
                .map(|(a, b)| a + b)
                .collect();
            let copies: &[OutputCopy] = if k % 32 == 0 && m == 1 {
                &[OutputCopy::None, OutputCopy::Q8]
            } else if k % 32 == 0 && m >= 16 {
                &[OutputCopy::None, OutputCopy::F16, OutputCopy::Bf16]
            } else {
                &[OutputCopy::None]
            };
            for &copy in copies {
                let mut x1 = dev.upload(&x0).unwrap();
                add_to(&cuda, &mut x1, &r);
                assert_eq!(host(&x1), want_x, "AddTo of {rt} rows, {m}x{k}");
                let h1 = rms(&cuda, &mut x1, None, &w, copy);
                let mut x2 = dev.upload(&x0).unwrap();
                let h2 = rms(&cuda, &mut x2, Some(&r), &w, copy);
                let ctx = format!("{rt} residual, {m}x{k}, copy {copy:?}");
                assert_eq!(host(&x2), want_x, "sum left in the input, {ctx}");
                assert_eq!(host(&h2), host(&h1), "normalized rows, {ctx}");
                if copy != OutputCopy::None {
                    // the next Linear reads the copy the fused norm left
                    let wt = match copy {
                        OutputCopy::Bf16 => DataType::BF16,
                        OutputCopy::F16 => DataType::F16,
                        _ => DataType::Q4_0,
                    };
                    let lw = dev.upload(&rng.data(wt, &[24, k])).unwrap();
                    let plain = {
                        let h = rms(
                            &cuda,
                            &mut dev.upload(&want_x_data(&want_x, m, k)).unwrap(),
                            None,
                            &w,
                            OutputCopy::None,
                        );
                        host(&run_linear(&cuda, &h, &lw, None, 1))
                    };
                    let mut x3 = dev.upload(&x0).unwrap();
                    let h3 = rms(&cuda, &mut x3, Some(&r), &w, copy);
                    assert_eq!(
                        host(&run_linear(&cuda, &h3, &lw, None, 1)),
                        plain,
                        "Linear after, {ctx}"
                    );
                }
                checked += 1;
            }
        }
    }
    // one residual row added to every row (AddTo's broadcast), with and without a copy
    for rt in [DataType::F32, DataType::F16] {
        for (m, k, copy) in [
            (3usize, 64usize, OutputCopy::None),
            (20, 512, OutputCopy::F16),
        ] {
            let x0 = rng.data_range(DataType::F32, &[m, k], -4.0, 4.0);
            let r = dev.upload(&rng.data(rt, &[k])).unwrap();
            let w = dev.upload(&rng.data(DataType::F32, &[k])).unwrap();
            let mut x1 = dev.upload(&x0).unwrap();
            add_to(&cuda, &mut x1, &r);
            let h1 = rms(&cuda, &mut x1, None, &w, copy);
            let mut x2 = dev.upload(&x0).unwrap();
            let h2 = rms(&cuda, &mut x2, Some(&r), &w, copy);
            let ctx = format!("one {rt} row, {m}x{k}, copy {copy:?}");
            assert_eq!(host(&x2), host(&x1), "sum left in the input, {ctx}");
            assert_eq!(host(&h2), host(&h1), "normalized rows, {ctx}");
            checked += 1;
        }
    }
    println!("RMSNorm with a residual: {checked} cases bit-equal to AddTo then RMSNorm");
}

/// The host tensor of `m` rows of `k` values `v`.
fn want_x_data(v: &[f32], m: usize, k: usize) -> Data {
    Data::from_f32(&[m, k], v).unwrap()
}

/// The error of `RMSNorm` of `x` with the residual `r` on `exec`.
fn residual_norm_error(exec: &Executor, x: &mut Data, r: &Data, w: &Data) -> String {
    let mut h = Data::empty(DataType::F32);
    let mut d = DataDict::new()
        .with_mut("input", x)
        .with("input1", r)
        .with("weight", w)
        .with_mut("output", &mut h);
    exec.run("RMSNorm", &mut d, &FloatDict::new(), &IntDict::new())
        .unwrap_err()
        .to_string()
}

#[test]
fn residual_of_another_shape_is_an_error() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(47);
    let mut x = dev.upload(&rng.data(DataType::F32, &[2, 64])).unwrap();
    let r = dev.upload(&rng.data(DataType::F16, &[1, 64])).unwrap();
    let w = dev.upload(&rng.data(DataType::F32, &[64])).unwrap();
    let e = residual_norm_error(&cuda, &mut x, &r, &w);
    assert!(e.contains("input1"), "{e}");
}

#[test]
fn cpu_refuses_the_residual_form() {
    let mut rng = CaseRng::new(43);
    let mut x = rng.data(DataType::F32, &[2, 8]);
    let r = rng.data(DataType::F32, &[2, 8]);
    let w = rng.data(DataType::F32, &[8]);
    let e = residual_norm_error(&reference(), &mut x, &r, &w);
    assert!(e.contains("RMSNorm"), "{e}");
}
