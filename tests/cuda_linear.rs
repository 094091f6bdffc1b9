//! `Linear` and the MLP ops on the CUDA device against the CPU reference or the exact product:
//! tensor-core prefill, the one-row GEMV plans, long rows, reused and fused activation
//! quantization, multi-weight calls, `accumulate`, half-precision outputs and inputs, `SiluMul`.
//!
//! Without a GPU every test passes without work and the binary says once, on stderr past the
//! test harness's capture, "SKIPPED: no CUDA device (...)" (CI has none).

#![cfg(feature = "cuda")]

mod common;

use common::cuda::{cuda_executor, gpu, reference, run_linear};
use fastllm::data::{Data, DataType, DeviceKind};
use fastllm::harness::{nmse, CaseRng};
use fastllm::{BaseDevice, DataDict, FloatDict, IntDict};

/// f16 activations (and f16-dequantized block weights): NMSE against the exact f32 product is
/// about (2^-11)²/3 per rounded operand ≈ 1e-7; bf16 activations (bf16 weights): 2^-8 → ~5e-6.
const TC_F16_NMSE: f64 = 2e-6;
const TC_BF16_NMSE: f64 = 1e-4;
/// Q8_0 activations (the int8 products of block weights up to `Q8_COPY_MAX_ROWS` rows):
/// 2^-8 of each 32-value block's largest value → ~1.5e-5.
const TC_Q8_NMSE: f64 = 5e-5;

#[test]
fn tensor_core_linear_matches_exact_reference() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let reference = reference();
    let mut rng = CaseRng::new(21);
    // (rows, k, n): above TC_MIN_ROWS; the last one is larger than one 128 MiB f16 weight
    // tile (16400 · 4096 · 2 bytes), so block weights are dequantized in two tiles.
    let shapes = [
        (16usize, 256usize, 67usize),
        (40, 512, 300),
        (16, 4096, 16400),
    ];
    for wt in [
        DataType::F16,
        DataType::BF16,
        DataType::Q8_0,
        DataType::Q4_0,
        DataType::Q4_1,
    ] {
        for &(m, k, n) in &shapes {
            if n > 1000 && !wt.is_quantized() {
                continue;
            }
            let x = rng.data(DataType::F32, &[m, k]);
            let w = rng.data(wt, &[n, k]);
            let b = rng.data(DataType::F32, &[n]);
            let r = run_linear(&reference, &x, &w, Some(&b), 0);
            let (gx, gw, gb) = (
                dev.upload(&x).unwrap(),
                dev.upload(&w).unwrap(),
                dev.upload(&b).unwrap(),
            );
            // block weights: the device's choice (int8 products of Q8_0 activations at these
            // rows) and the f16 tensor-core path of dequantized tiles (mma = 1)
            let modes: &[i32] = if wt.is_quantized() { &[0, 1] } else { &[0] };
            for &mode in modes {
                let mut t = Data::empty(DataType::F32);
                let mut d = DataDict::new()
                    .with("input", &gx)
                    .with("weight", &gw)
                    .with("bias", &gb)
                    .with_mut("output", &mut t);
                let ints = IntDict::new().with("quant_act", 1).with("mma", mode);
                cuda.run("Linear", &mut d, &FloatDict::new(), &ints)
                    .unwrap();
                let t = t.to_owned_host().unwrap();
                let (e, bad) = nmse(&t.to_f32_vec().unwrap(), &r.to_f32_vec().unwrap());
                let tol = if wt == DataType::BF16 {
                    TC_BF16_NMSE
                } else if wt.is_quantized() && mode == 0 {
                    TC_Q8_NMSE
                } else {
                    TC_F16_NMSE
                };
                println!("tensor-core Linear {wt} mma={mode} [{m}x{k}]·[{n}x{k}]ᵀ: nmse vs exact {e:.2e} (bound {tol:.0e})");
                assert!(
                    !bad && e <= tol,
                    "{wt} mma={mode} m={m} k={k} n={n}: nmse {e:.3e} > {tol:.0e}"
                );
            }
        }
    }
}

#[test]
fn silu_mul_matches_silu_then_mul() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let reference = reference();
    let mut rng = CaseRng::new(7);
    for dims in [
        vec![1usize, 1],
        vec![3, 1000],
        vec![1, 14336],
        vec![5, 7, 33],
    ] {
        let g = rng.data_range(DataType::F32, &dims, -6.0, 6.0);
        let u = rng.data(DataType::F32, &dims);
        let mut r = Data::empty(DataType::F32);
        {
            let mut d = DataDict::new().with("input", &g).with_mut("output", &mut r);
            reference
                .run("Silu", &mut d, &FloatDict::new(), &IntDict::new())
                .unwrap();
            let mut d = DataDict::new()
                .with_mut("input0", &mut r)
                .with("input1", &u);
            reference
                .run("MulTo", &mut d, &FloatDict::new(), &IntDict::new())
                .unwrap();
        }
        let mut t = Data::empty(DataType::F32);
        let mut d = DataDict::new()
            .with("input0", &g)
            .with("input1", &u)
            .with_mut("output", &mut t);
        cuda.run("SiluMul", &mut d, &FloatDict::new(), &IntDict::new())
            .unwrap();
        assert!(matches!(t.device(), DeviceKind::Cuda(_)));
        let (e, bad) = nmse(
            &t.to_owned_host().unwrap().to_f32_vec().unwrap(),
            &r.to_f32_vec().unwrap(),
        );
        assert!(!bad && e < 1e-12, "{dims:?}: nmse {e:.3e}");
    }
}

#[test]
fn linear_reuse_act_requantizes_another_input() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(5);
    let k = 512;
    let w = dev.upload(&rng.data(DataType::Q4_0, &[96, k])).unwrap();
    let wf = dev.upload(&rng.data(DataType::F16, &[96, k])).unwrap();
    let x1 = dev.upload(&rng.data(DataType::F32, &[1, k])).unwrap();
    let x2 = dev.upload(&rng.data(DataType::F32, &[1, k])).unwrap();
    let lin = |x: &Data, w: &Data, reuse: i32| -> Vec<f32> {
        let mut y = Data::empty(DataType::F32);
        let mut d = DataDict::new()
            .with("input", x)
            .with("weight", w)
            .with_mut("output", &mut y);
        cuda.run(
            "Linear",
            &mut d,
            &FloatDict::new(),
            &IntDict::new().with("quant_act", 1).with("reuse_act", reuse),
        )
        .unwrap();
        y.to_owned_host().unwrap().to_f32_vec().unwrap()
    };
    let fresh1 = lin(&x1, &w, 0);
    let fresh2 = lin(&x2, &w, 0);
    // same input right after: reused, same result
    assert_eq!(lin(&x2, &w, 1), fresh2);
    // another input with the flag: quantized again
    assert_eq!(lin(&x1, &w, 1), fresh1);
    // an F16 product in between leaves nothing to reuse
    lin(&x2, &w, 0);
    lin(&x1, &wf, 0);
    assert_eq!(lin(&x1, &w, 1), fresh1);
}

#[test]
fn multi_weight_linear_equals_one_weight_at_a_time() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(11);
    let mut checked = 0;
    for dt in [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::Q8_0,
        DataType::Q4_0,
        DataType::Q4_1,
    ] {
        // 1536 and 2048: several rows per warp in the bulk one-row kernels, so a warp's rows
        // can straddle two weights
        for k in [64usize, 96, 512, 1536, 2048, 4096] {
            for (m, biased) in [
                (1usize, true),
                (3, true),
                (20, true),
                (20, false),
                (64, false),
            ] {
                for quant_act in [0, 1] {
                    if dt.is_quantized() && k % 32 != 0 {
                        continue;
                    }
                    // without biases, f16/bf16 weights of tensor-core rows run side by side
                    let side_by_side =
                        matches!(dt, DataType::F16 | DataType::BF16) && quant_act == 1;
                    if !biased && !side_by_side {
                        continue;
                    }
                    let ns = [37usize, 8, 100];
                    let x = dev.upload(&rng.data(DataType::F32, &[m, k])).unwrap();
                    let ws: Vec<Data> = ns
                        .iter()
                        .map(|&n| dev.upload(&rng.data(dt, &[n, k])).unwrap())
                        .collect();
                    let b0 = dev.upload(&rng.data(DataType::F32, &[ns[0]])).unwrap();
                    let b2 = dev.upload(&rng.data(DataType::F32, &[ns[2]])).unwrap();
                    let bs = if biased {
                        [Some(&b0), None, Some(&b2)]
                    } else {
                        [None, None, None]
                    };
                    let ints = IntDict::new().with("quant_act", quant_act);
                    let mut outs = [
                        Data::empty(DataType::F32),
                        Data::empty(DataType::F32),
                        Data::empty(DataType::F32),
                    ];
                    {
                        let [o0, o1, o2] = &mut outs[..] else {
                            unreachable!()
                        };
                        let mut d = DataDict::new()
                            .with("input", &x)
                            .with("weight", &ws[0])
                            .with("weight1", &ws[1])
                            .with("weight2", &ws[2])
                            .with_mut("output", o0)
                            .with_mut("output1", o1)
                            .with_mut("output2", o2);
                        for (name, b) in [("bias", bs[0]), ("bias2", bs[2])] {
                            if let Some(b) = b {
                                d.insert(name, b);
                            }
                        }
                        cuda.run("Linear", &mut d, &FloatDict::new(), &ints)
                            .unwrap();
                    }
                    for i in 0..3 {
                        let mut y = Data::empty(DataType::F32);
                        let mut d = DataDict::new().with("input", &x).with("weight", &ws[i]);
                        if let Some(b) = bs[i] {
                            d.insert("bias", b);
                        }
                        d.insert_mut("output", &mut y);
                        cuda.run("Linear", &mut d, &FloatDict::new(), &ints)
                            .unwrap();
                        let a = outs[i].to_owned_host().unwrap();
                        let b = y.to_owned_host().unwrap();
                        assert_eq!(a.dims(), &[m, ns[i]]);
                        assert_eq!(
                            a.to_f32_vec().unwrap(),
                            b.to_f32_vec().unwrap(),
                            "{dt} k={k} m={m} quant_act={quant_act} biased={biased} weight {i}"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    println!("multi-weight Linear: {checked} outputs equal to single-weight calls");
}

#[test]
fn linear_accumulate_adds_the_product_to_the_output() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(17);
    let mut checked = 0;
    for dt in [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::Q8_0,
        DataType::Q4_0,
        DataType::Q4_1,
    ] {
        for k in [96usize, 256, 4096] {
            // one row (GEMV kernels), 3 rows (tiled kernels; SGEMM for F32), 20 rows (tensor
            // cores with quant_act)
            for m in [1usize, 3, 20] {
                for quant_act in [0, 1] {
                    let n = 75;
                    let x = dev.upload(&rng.data(DataType::F32, &[m, k])).unwrap();
                    let w = dev.upload(&rng.data(dt, &[n, k])).unwrap();
                    let b = dev.upload(&rng.data(DataType::F32, &[n])).unwrap();
                    let y0 = rng.data(DataType::F32, &[m, n]);
                    let ints = IntDict::new().with("quant_act", quant_act);
                    // the same device's product, then added on the host
                    let p = run_linear(&cuda, &x, &w, Some(&b), quant_act);
                    let want: Vec<f32> = p
                        .to_f32_vec()
                        .unwrap()
                        .iter()
                        .zip(y0.to_f32_vec().unwrap())
                        .map(|(p, y)| p + y)
                        .collect();
                    let mut y = dev.upload(&y0).unwrap();
                    {
                        let mut d = DataDict::new()
                            .with("input", &x)
                            .with("weight", &w)
                            .with("bias", &b)
                            .with_mut("output", &mut y);
                        cuda.run(
                            "Linear",
                            &mut d,
                            &FloatDict::new(),
                            &ints.clone().with("accumulate", 1),
                        )
                        .unwrap();
                    }
                    let got = y.to_owned_host().unwrap().to_f32_vec().unwrap();
                    let (e, bad) = nmse(&got, &want);
                    assert!(
                        !bad && e < 1e-12,
                        "{dt} k={k} m={m} quant_act={quant_act}: nmse {e:.3e}"
                    );
                    checked += 1;
                }
            }
        }
    }
    // an output that does not hold the product's shape is refused, not overwritten
    let x = dev.upload(&rng.data(DataType::F32, &[20, 64])).unwrap();
    let w = dev.upload(&rng.data(DataType::F16, &[8, 64])).unwrap();
    let mut y = dev.upload(&rng.data(DataType::F32, &[20, 9])).unwrap();
    let mut d = DataDict::new()
        .with("input", &x)
        .with("weight", &w)
        .with_mut("output", &mut y);
    let msg = cuda
        .run(
            "Linear",
            &mut d,
            &FloatDict::new(),
            &IntDict::new().with("accumulate", 1),
        )
        .unwrap_err()
        .to_string();
    assert!(msg.contains("accumulate"), "{msg}");
    println!("Linear accumulate: {checked} cases equal to product + output");
}

#[test]
fn norm_and_silu_mul_quantizing_for_the_next_linear_give_the_same_products() {
    use fastllm::ops::OutputCopy;
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(23);
    let mut checked = 0;
    // one row: Q8_0 rows for block weights; 20 rows: f16 / bf16 rows for the tensor-core path
    let cases = [
        (DataType::Q4_0, 1usize, OutputCopy::Q8),
        (DataType::Q4_1, 1, OutputCopy::Q8),
        (DataType::Q8_0, 1, OutputCopy::Q8),
        (DataType::Q4_0, 20, OutputCopy::F16),
        (DataType::Q8_0, 20, OutputCopy::F16),
        (DataType::F16, 20, OutputCopy::F16),
        (DataType::BF16, 20, OutputCopy::Bf16),
    ];
    for (dt, m, copy) in cases {
        for k in [64usize, 512, 4096] {
            let w = dev.upload(&rng.data(dt, &[72, k])).unwrap();
            let w1 = dev.upload(&rng.data(dt, &[40, k])).unwrap();
            let g = dev.upload(&rng.data(DataType::F32, &[k])).unwrap();
            let x = dev.upload(&rng.data(DataType::F32, &[m, k])).unwrap();
            let u = dev.upload(&rng.data(DataType::F32, &[m, k])).unwrap();
            let other = dev.upload(&rng.data(DataType::F32, &[m, k])).unwrap();
            let lin = |x: &Data| run_linear(&cuda, x, &w, None, 1).to_f32_vec().unwrap();
            // two weights in one call (the input converted once for both)
            let lin2 = |x: &Data| {
                let (mut o0, mut o1) = (Data::empty(DataType::F32), Data::empty(DataType::F32));
                let mut d = DataDict::new()
                    .with("input", x)
                    .with("weight", &w)
                    .with("weight1", &w1)
                    .with_mut("output", &mut o0)
                    .with_mut("output1", &mut o1);
                cuda.run(
                    "Linear",
                    &mut d,
                    &FloatDict::new(),
                    &IntDict::new().with("quant_act", 1),
                )
                .unwrap();
                drop(d);
                let mut v = o0.to_owned_host().unwrap().to_f32_vec().unwrap();
                v.extend(o1.to_owned_host().unwrap().to_f32_vec().unwrap());
                v
            };
            let norm = |c: OutputCopy| {
                let mut h = Data::empty(DataType::F32);
                fastllm::ops::rms_norm_quantizing(&cuda, &x, &g, 1e-5, &mut h, c).unwrap();
                h
            };
            let silu = |c: OutputCopy| {
                let mut h = Data::empty(DataType::F32);
                fastllm::ops::silu_mul_quantizing(&cuda, &x, &u, &mut h, c).unwrap();
                h
            };
            // the rows the producer left give exactly what converting in Linear gives
            let h = norm(OutputCopy::None);
            let (want, want2) = (lin(&h), lin2(&h));
            let h = norm(copy);
            assert_eq!(lin(&h), want, "RMSNorm {dt} m={m} k={k}");
            let h = norm(copy);
            assert_eq!(lin2(&h), want2, "RMSNorm, two weights, {dt} m={m} k={k}");
            let h = silu(OutputCopy::None);
            let want = lin(&h);
            let h = silu(copy);
            assert_eq!(lin(&h), want, "SiluMul {dt} m={m} k={k}");
            // a Linear of another input after a producer that left a copy converts its own input
            let want_other = lin(&other);
            let _h = norm(copy);
            assert_eq!(
                lin(&other),
                want_other,
                "other input after RMSNorm {dt} m={m} k={k}"
            );
            checked += 1;
        }
    }
    println!("RMSNorm/SiluMul leaving Q8_0/f16/bf16 copies: {checked} cases, products bit-equal");
}

#[test]
fn bulk_one_row_gemv_matches_the_reference_on_every_plan() {
    let Some(dev) = gpu() else { return };
    if dev.gpu().arch().0 < 9 {
        common::skipped("bulk-copy GEMV needs compute capability >= 9.0");
        return;
    }
    let cuda = cuda_executor(&dev);
    let cpu = reference();
    let mut rng = CaseRng::new(37);
    // k: 8 lanes per row × 2 half superblocks each (1536), 16 lanes × 1 / 2 (2048 / 3072), 32
    // lanes × 1 / 2 / 3 / 4 (4096, 8192, 8448, 14336); n = 1 (most warps idle), 9000 (warps
    // reuse their slots), odd counts (a warp's last group short)
    let shapes = [
        (1536usize, 45usize),
        (2048, 77),
        (3072, 61),
        (4096, 1),
        (4096, 9000),
        (8192, 150),
        (8448, 40),
        (14336, 300),
    ];
    let mut checked = 0;
    for dt in [DataType::Q4_0, DataType::Q4_1, DataType::Q8_0] {
        for (k, n) in shapes {
            let w = rng.data(dt, &[n, k]);
            let x = rng.data(DataType::F32, &[1, k]);
            let b = rng.data(DataType::F32, &[n]);
            let want = run_linear(&cpu, &x, &w, Some(&b), 1).to_f32_vec().unwrap();
            let (xg, wg, bg) = (
                dev.upload(&x).unwrap(),
                dev.upload(&w).unwrap(),
                dev.upload(&b).unwrap(),
            );
            // the bulk kernel (gemv_kernel = 3) and, for comparison, the register kernels
            for kernel in [3, 1, 2] {
                let mut y = Data::empty(DataType::F32);
                let mut d = DataDict::new()
                    .with("input", &xg)
                    .with("weight", &wg)
                    .with("bias", &bg)
                    .with_mut("output", &mut y);
                let ints = IntDict::new()
                    .with("quant_act", 1)
                    .with("gemv_kernel", kernel);
                cuda.run("Linear", &mut d, &FloatDict::new(), &ints)
                    .unwrap();
                let got = y.to_owned_host().unwrap().to_f32_vec().unwrap();
                let (e, bad) = nmse(&got, &want);
                assert!(
                    !bad && e < 1e-9,
                    "{dt} k={k} n={n} gemv_kernel={kernel}: nmse {e:.2e}"
                );
                checked += 1;
            }
        }
    }
    // a kernel choice that does not exist is refused
    let x = dev.upload(&rng.data(DataType::F32, &[1, 4096])).unwrap();
    let w = dev.upload(&rng.data(DataType::Q8_0, &[8, 4096])).unwrap();
    let mut y = Data::empty(DataType::F32);
    let mut d = DataDict::new()
        .with("input", &x)
        .with("weight", &w)
        .with_mut("output", &mut y);
    let msg = cuda
        .run(
            "Linear",
            &mut d,
            &FloatDict::new(),
            &IntDict::new().with("quant_act", 1).with("gemv_kernel", 7),
        )
        .unwrap_err()
        .to_string();
    assert!(msg.contains("gemv_kernel 7"), "{msg}");
    println!("bulk one-row GEMV (and sbx/sbh): {checked} products match the reference");
}

#[test]
fn long_row_gemv_matches_the_reference() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let cpu = reference();
    let mut rng = CaseRng::new(31);
    // rows of 33, 56 and 65 superblocks: one or two per lane, and a lane looping twice
    for k in [8448usize, 14336, 16640] {
        for dt in [DataType::Q4_0, DataType::Q4_1, DataType::Q8_0] {
            let w = rng.data(dt, &[40, k]);
            let x = rng.data(DataType::F32, &[1, k]);
            let want = run_linear(&cpu, &x, &w, None, 1).to_f32_vec().unwrap();
            let got = run_linear(
                &cuda,
                &dev.upload(&x).unwrap(),
                &dev.upload(&w).unwrap(),
                None,
                1,
            )
            .to_f32_vec()
            .unwrap();
            let (e, bad) = nmse(&got, &want);
            assert!(!bad && e < 1e-9, "{dt} k={k}: nmse {e:.2e}");
        }
    }
    println!("one-row GEMV with rows of 33/56/65 superblocks: matches the reference");
}

/// The half-precision MLP path of prefill: `Linear` with `half_output` writes F16/BF16 outputs
/// that are the f32 products rounded once (and ignores the flag below `TC_MIN_ROWS` rows, for
/// block weights up to `Q8_COPY_MAX_ROWS` rows, with a bias or `accumulate`); a half input is read as it is, giving the same bits as the f32 input
/// it came from; `SiluMul` on half inputs rounds silu(g)·u once.
#[test]
fn half_outputs_and_inputs_of_linear_and_silu_mul() {
    use fastllm::ops::OutputCopy;
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(29);
    // relative size of one rounding step: f16 2^-11, bf16 2^-8 (plus slack for subnormal-ish
    // magnitudes, measured against the largest output)
    let close = |got: &[f32], want: &[f32], rel: f32| -> f32 {
        let scale = want.iter().fold(0f32, |a, &v| a.max(v.abs())).max(1e-30);
        let worst = got
            .iter()
            .zip(want)
            .map(|(g, w)| (g - w).abs() / (w.abs().max(scale * 1e-3)))
            .fold(0f32, f32::max);
        assert!(
            worst <= rel,
            "worst relative rounding {worst:.3e} > {rel:.3e}"
        );
        worst
    };
    // fast-precision Linear of one input and `ws` (a bias on the first), asking for `copy`
    let linear = |x: &Data, ws: &[&Data], b: Option<&Data>, copy: OutputCopy| -> Vec<Data> {
        let mut outs: Vec<Data> = ws.iter().map(|_| Data::empty(DataType::F32)).collect();
        let mut parts: Vec<(&Data, Option<&Data>, &mut Data)> = ws
            .iter()
            .zip(outs.iter_mut())
            .enumerate()
            .map(|(i, (w, o))| (*w, b.filter(|_| i == 0), o))
            .collect();
        fastllm::ops::linear_multi_as(&cuda, x, &mut parts, true, copy).unwrap();
        drop(parts);
        outs
    };
    let mut cases = 0;
    for (wt, half, copy, rel) in [
        (DataType::F16, DataType::F16, OutputCopy::F16, 1.0 / 2048.0),
        (DataType::Q4_0, DataType::F16, OutputCopy::F16, 1.0 / 2048.0),
        (DataType::Q8_0, DataType::F16, OutputCopy::F16, 1.0 / 2048.0),
        (
            DataType::BF16,
            DataType::BF16,
            OutputCopy::Bf16,
            1.0 / 256.0,
        ),
    ] {
        for (m, k, n) in [
            (40usize, 256usize, 96usize),
            (16, 4096, 200),
            (5, 256, 64),
            (136, 256, 96),
        ] {
            // block weights up to Q8_COPY_MAX_ROWS rows take the int8 products of Q8_0 rows, which
            // ignore the flag like fewer than TC_MIN_ROWS rows do
            let halves_on =
                m >= 16 && !(wt.is_quantized() && m <= fastllm::device::Q8_COPY_MAX_ROWS);
            let x = dev.upload(&rng.data(DataType::F32, &[m, k])).unwrap();
            let w0 = dev.upload(&rng.data(wt, &[n, k])).unwrap();
            let w1 = dev.upload(&rng.data(wt, &[n + 8, k])).unwrap();
            let none = OutputCopy::None;
            let f32s = linear(&x, &[&w0, &w1], None, none);
            let halves = linear(&x, &[&w0, &w1], None, copy);
            for (h, f) in halves.iter().zip(&f32s) {
                let want_dt = if halves_on { half } else { DataType::F32 };
                assert_eq!(h.dtype(), want_dt, "{wt:?} m {m}: output dtype");
                let hv = h.to_owned_host().unwrap().to_f32_vec().unwrap();
                let fv = f.to_owned_host().unwrap().to_f32_vec().unwrap();
                if halves_on {
                    close(&hv, &fv, rel);
                } else {
                    assert_eq!(hv, fv, "{wt:?} m {m}: the flag must be ignored");
                }
            }
            // a bias or accumulate keeps f32 outputs
            let b = dev.upload(&rng.data(DataType::F32, &[n])).unwrap();
            let with_bias = linear(&x, &[&w0], Some(&b), copy);
            assert_eq!(with_bias[0].dtype(), DataType::F32, "{wt:?}: bias");
            if halves_on {
                // a half input equal to the f32 one after rounding: the same bits out
                let xh_host = x.to_owned_host().unwrap().to_f32_vec().unwrap();
                let xh = Data::from_bytes(
                    half,
                    &[m, k],
                    &fastllm::data::encode_from_f32(half, &xh_host).unwrap(),
                )
                .unwrap();
                let xr = Data::from_f32(&[m, k], &xh.to_f32_vec().unwrap()).unwrap();
                let (xh, xr) = (dev.upload(&xh).unwrap(), dev.upload(&xr).unwrap());
                let from_half = linear(&xh, &[&w0, &w1], None, none);
                let from_f32 = linear(&xr, &[&w0, &w1], None, none);
                for (a, b) in from_half.iter().zip(&from_f32) {
                    assert_eq!(a.dtype(), DataType::F32);
                    assert_eq!(
                        a.to_owned_host().unwrap().to_f32_vec().unwrap(),
                        b.to_owned_host().unwrap().to_f32_vec().unwrap(),
                        "{wt:?} m {m}: half input differs from its f32 value"
                    );
                }
                // and half in, half out (the down projection never does this, a chain could)
                let hh = linear(&xh, &[&w0], None, copy);
                assert_eq!(hh[0].dtype(), half);
                // a half input of the other form, or without quant_act, is not taken
                let mut y = Data::empty(DataType::F32);
                let mut d = DataDict::new()
                    .with("input", &xh)
                    .with("weight", &w0)
                    .with_mut("output", &mut y);
                let err = cuda.run("Linear", &mut d, &FloatDict::new(), &IntDict::new());
                assert!(
                    err.is_err(),
                    "{wt:?}: half input without quant_act must be refused"
                );
            }
            cases += 1;
        }
    }
    // SiluMul on half inputs: aligned rows (16-byte path), odd sizes (the one-at-a-time tail)
    for half in [DataType::F16, DataType::BF16] {
        let rel = if half == DataType::F16 {
            1.0 / 1024.0
        } else {
            1.0 / 128.0
        };
        for dims in [vec![40usize, 1000], vec![3, 37], vec![1, 7]] {
            let g = rng.data_range(half, &dims, -6.0, 6.0);
            let u = rng.data(half, &dims);
            let (gv, uv) = (g.to_f32_vec().unwrap(), u.to_f32_vec().unwrap());
            let want: Vec<f32> = gv
                .iter()
                .zip(&uv)
                .map(|(&a, &b)| (a as f64 / (1.0 + (-a as f64).exp()) * b as f64) as f32)
                .collect();
            let (g, u) = (dev.upload(&g).unwrap(), dev.upload(&u).unwrap());
            let mut y = Data::empty(DataType::F32);
            let mut d = DataDict::new()
                .with("input0", &g)
                .with("input1", &u)
                .with_mut("output", &mut y);
            cuda.run("SiluMul", &mut d, &FloatDict::new(), &IntDict::new())
                .unwrap();
            assert_eq!(y.dtype(), half, "{dims:?}");
            let got = y.to_owned_host().unwrap().to_f32_vec().unwrap();
            let worst = close(&got, &want, rel);
            println!("SiluMul {half:?} {dims:?}: worst relative error {worst:.2e}");
            cases += 1;
        }
    }
    // inputs of different dtypes are an error, not a silent reinterpretation
    let g = dev.upload(&rng.data(DataType::F16, &[4, 64])).unwrap();
    let u = dev.upload(&rng.data(DataType::F32, &[4, 64])).unwrap();
    let mut y = Data::empty(DataType::F32);
    let mut d = DataDict::new()
        .with("input0", &g)
        .with("input1", &u)
        .with_mut("output", &mut y);
    let mixed = cuda.run("SiluMul", &mut d, &FloatDict::new(), &IntDict::new());
    assert!(
        mixed.is_err(),
        "SiluMul of F16 and F32 inputs must be refused"
    );
    println!("half-precision Linear/SiluMul: {cases} cases");
}

/// The activation row as the GPU's `quantize_q8_f32` leaves it, dequantized: per 32 values
/// d = amax / 127, q = round-half-even(x / d) clamped to ±127 (with 1 / d), d stored as f16.
fn q8_round_trip(x: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for b in x.chunks(32) {
        let amax = b.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let ds = half::f16::from_f32(d).to_f32();
        out.extend(
            b.iter()
                .map(|v| (v * id).round_ties_even().clamp(-127.0, 127.0) * ds),
        );
    }
    out
}

#[test]
fn kquant_one_row_gemv_on_q8_activations_matches_the_reference() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let cpu = reference();
    let mut rng = CaseRng::new(41);
    // super-blocks per row: 1, 3, 5, 9 (a lane group's second step missing), 16, 17, 56; odd n
    let shapes = [
        (256usize, 7usize),
        (768, 33),
        (1280, 1),
        (2304, 19),
        (4096, 45),
        (4352, 9),
        (14336, 31),
    ];
    let mut checked = 0;
    for dt in [DataType::Q4K, DataType::Q6K] {
        for (k, n) in shapes {
            let ns = [n, 8, 3];
            let x = rng.data(DataType::F32, &[1, k]);
            let xq = Data::from_f32(&[1, k], &q8_round_trip(&x.to_f32_vec().unwrap())).unwrap();
            let ws: Vec<Data> = ns.iter().map(|&n| rng.data(dt, &[n, k])).collect();
            let b = rng.data(DataType::F32, &[n]);
            let y0 = rng.data(DataType::F32, &[1, ns[2]]);
            // the exact product of the quantized row (the int8 kernel's only rounding)
            let want: Vec<Vec<f32>> = (0..3)
                .map(|i| {
                    let bi = if i == 0 { Some(&b) } else { None };
                    let mut v = run_linear(&cpu, &xq, &ws[i], bi, 0).to_f32_vec().unwrap();
                    if i == 2 {
                        // weight 2 accumulates onto y0
                        let y0v = y0.to_f32_vec().unwrap();
                        v.iter_mut().zip(&y0v).for_each(|(a, b)| *a += b);
                    }
                    v
                })
                .collect();
            let xg = dev.upload(&x).unwrap();
            let wg: Vec<Data> = ws.iter().map(|w| dev.upload(w).unwrap()).collect();
            let bg = dev.upload(&b).unwrap();
            // one weight, then three in one call (segments) with accumulate on the third's
            let one = run_linear(&cuda, &xg, &wg[0], Some(&bg), 1)
                .to_f32_vec()
                .unwrap();
            let (e, bad) = nmse(&one, &want[0]);
            assert!(!bad && e < 1e-7, "{dt} k={k} n={n}: nmse {e:.2e}");
            // three weights in one call (segments), accumulating onto zeros, zeros and y0
            let zeros = |n: usize| {
                dev.upload(&Data::from_f32(&[1, n], &vec![0.0; n]).unwrap())
                    .unwrap()
            };
            let mut outs = [zeros(ns[0]), zeros(ns[1]), dev.upload(&y0).unwrap()];
            {
                let [o0, o1, o2] = &mut outs[..] else {
                    unreachable!()
                };
                let mut d = DataDict::new()
                    .with("input", &xg)
                    .with("weight", &wg[0])
                    .with("bias", &bg)
                    .with("weight1", &wg[1])
                    .with("weight2", &wg[2])
                    .with_mut("output", o0)
                    .with_mut("output1", o1)
                    .with_mut("output2", o2);
                let ints = IntDict::new().with("quant_act", 1).with("accumulate", 1);
                cuda.run("Linear", &mut d, &FloatDict::new(), &ints)
                    .unwrap();
            }
            for (i, o) in outs.iter().enumerate() {
                let got = o.to_owned_host().unwrap().to_f32_vec().unwrap();
                let (e, bad) = nmse(&got, &want[i]);
                assert!(!bad && e < 1e-7, "{dt} k={k} weight {i} of 3: nmse {e:.2e}");
            }
            checked += 1;
        }
    }
    println!("Q4_K/Q6_K one-row int8 GEMV: {checked} shapes match the reference");
}
