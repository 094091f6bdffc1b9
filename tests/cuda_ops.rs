//! The CUDA device against the CPU reference: every op-harness case runs on an executor with the
//! CUDA device first (CPU fallback second) and on the scalar reference CPU device, with identical
//! inputs, compared by NMSE with the case's threshold. Also: the no-GPU path is an `Err`, the KV
//! cache grows in place on the device, and two measurements (copy bandwidth, Q4_1 GEMV).
//!
//! Without a GPU every test prints "SKIPPED: no CUDA device" and passes (CI has none).

#![cfg(feature = "cuda")]

use fastllm::data::{Data, DataType, DeviceKind};
use fastllm::devices::cpu::{CpuDevice, KernelMode};
use fastllm::devices::cuda::CudaDevice;
use fastllm::harness::{all_cases, nmse, ArgKind, CaseRng, OpCase};
use fastllm::{BaseDevice, DataDict, Executor, FloatDict, IntDict};
use std::sync::Arc;
use std::time::Instant;

fn gpu() -> Option<Arc<CudaDevice>> {
    match CudaDevice::new(0) {
        Ok(d) => Some(Arc::new(d)),
        Err(e) => {
            println!("SKIPPED: no CUDA device ({e})");
            None
        }
    }
}

fn reference() -> Executor {
    let mut e = Executor::new();
    e.add_device(Arc::new(
        CpuDevice::with_mode(1, KernelMode::Reference).unwrap(),
    ));
    e
}

fn cuda_executor(dev: &Arc<CudaDevice>) -> Executor {
    let mut e = Executor::new();
    e.add_device(dev.clone());
    e.add_device(Arc::new(CpuDevice::new(0).unwrap()));
    e
}

fn clone_arg(d: &Data) -> Data {
    if !d.is_allocated() {
        return Data::empty(d.dtype());
    }
    let mut c = d.to_owned_host().unwrap();
    if let Some(axis) = (0..d.dims().len()).find(|&i| d.dims()[i] != d.capacity()[i]) {
        c.reserve(axis, d.capacity()[axis]).unwrap();
    }
    c
}

fn run_case(exec: &Executor, case: &OpCase, args: &mut [Data]) -> fastllm::Result<()> {
    let mut dict = DataDict::new();
    for (a, d) in case.args.iter().zip(args.iter_mut()) {
        match a.kind {
            ArgKind::In => dict.insert(a.name, d),
            _ => dict.insert_mut(a.name, d),
        }
    }
    let mut fl = FloatDict::new();
    for (n, v) in &case.floats {
        fl.insert(n, *v);
    }
    let mut il = IntDict::new();
    for (n, v) in &case.ints {
        il.insert(n, *v);
    }
    exec.run(case.op, &mut dict, &fl, &il)
}

/// Runs one case on both executors; Ok((worst nmse, ran on the GPU)) or Err(description).
fn check(case: &OpCase, cuda: &Executor, reference: &Executor) -> Result<(f64, bool), String> {
    let mut r: Vec<Data> = case.args.iter().map(|a| clone_arg(&a.data)).collect();
    let mut t: Vec<Data> = case.args.iter().map(|a| clone_arg(&a.data)).collect();
    let ref_result = run_case(reference, case, &mut r);
    let test_result = run_case(cuda, case, &mut t);
    match (ref_result, test_result) {
        (Err(_), Err(_)) => return Ok((0.0, false)), // both reject the arguments
        (Err(e), Ok(())) => return Err(format!("reference failed ({e}) but CUDA accepted")),
        (Ok(()), Err(e)) => return Err(format!("CUDA failed: {e}")),
        (Ok(()), Ok(())) => {}
    }
    let mut worst = 0f64;
    let mut on_gpu = false;
    for ((a, r), t) in case.args.iter().zip(&r).zip(&t) {
        if a.kind == ArgKind::In {
            continue;
        }
        on_gpu |= matches!(t.device(), DeviceKind::Cuda(_));
        let t = t
            .to_owned_host()
            .map_err(|e| format!("download {}: {e}", a.name))?;
        if t.dims() != r.dims() || t.dtype() != r.dtype() {
            return Err(format!(
                "{}: {} {:?} vs reference {} {:?}",
                a.name,
                t.dtype(),
                t.dims(),
                r.dtype(),
                r.dims()
            ));
        }
        let (e, bad) = nmse(&t.to_f32_vec().unwrap(), &r.to_f32_vec().unwrap());
        if bad {
            return Err(format!("{}: NaN/Inf mismatch", a.name));
        }
        worst = worst.max(e);
    }
    if worst.is_nan() || worst > case.max_nmse {
        return Err(format!("nmse {worst:.3e} > {:.1e}", case.max_nmse));
    }
    Ok((worst, on_gpu))
}

#[test]
fn cuda_matches_cpu_reference_on_every_harness_case() {
    let Some(dev) = gpu() else { return };
    println!("device: {}", dev.description());
    let t0 = Instant::now();
    dev.warm_up().unwrap();
    println!("kernels ready in {:.2} s", t0.elapsed().as_secs_f64());
    let cuda = cuda_executor(&dev);
    let reference = reference();
    let cases = all_cases();
    assert!(!cases.is_empty());
    let (mut failures, mut gpu_cases) = (Vec::new(), 0);
    let mut per_op: std::collections::BTreeMap<&str, (usize, usize, f64)> = Default::default();
    for case in &cases {
        let e = per_op.entry(case.op).or_default();
        e.0 += 1;
        match check(case, &cuda, &reference) {
            Ok((err, on_gpu)) => {
                if on_gpu {
                    gpu_cases += 1;
                    e.1 += 1;
                }
                e.2 = e.2.max(err);
            }
            Err(f) => failures.push(format!("{}: {f}", case.name())),
        }
    }
    println!(
        "{:<16} {:>6} {:>6} {:>10}",
        "op", "cases", "on GPU", "max nmse"
    );
    for (op, (n, g, e)) in &per_op {
        println!("{op:<16} {n:>6} {g:>6} {e:>10.2e}");
    }
    println!(
        "{} cases, {gpu_cases} ran on the GPU, {} failures",
        cases.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn missing_device_is_an_error_not_a_panic() {
    match CudaDevice::new(0) {
        Err(e) => {
            println!("SKIPPED: no CUDA device ({e})");
            assert!(e.to_string().contains("CUDA"), "{e}");
        }
        Ok(_) => {
            let e = CudaDevice::new(4096)
                .err()
                .expect("ordinal 4096 must not exist");
            assert!(e.to_string().contains("no CUDA device"), "{e}");
        }
    }
}

#[test]
fn kv_cache_grows_in_place_on_the_gpu() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(7);
    let mut host = Data::zeros(DataType::F32, &[0, 2, 8]).unwrap();
    host.reserve(0, 3).unwrap();
    let mut kv = dev.upload(&host).unwrap();
    for step in 0..7 {
        let x = rng.data(DataType::F32, &[1 + step % 2, 2, 8]);
        host.append(&x, 0).unwrap();
        let mut d = DataDict::new()
            .with_mut("input0", &mut kv)
            .with("input1", &x);
        cuda.run(
            "CatDirect",
            &mut d,
            &FloatDict::new(),
            &IntDict::new().with("axis", 0),
        )
        .unwrap();
        assert!(
            matches!(kv.device(), DeviceKind::Cuda(_)),
            "cache left the GPU"
        );
        assert_eq!(kv.dims(), host.dims());
        assert_eq!(
            kv.to_owned_host().unwrap().to_f32_vec().unwrap(),
            host.to_f32_vec().unwrap()
        );
    }
}

#[test]
fn copy_bandwidth_and_q4_1_gemv_speed() {
    let Some(dev) = gpu() else { return };
    let g = dev.gpu();
    // Device-to-device copy of 1 GiB.
    let n = 1usize << 30;
    let src =
        fastllm::devices::cuda::buffer::alloc_data(g, DataType::F32, &[n / 4], &[n / 4]).unwrap();
    let dst =
        fastllm::devices::cuda::buffer::alloc_data(g, DataType::F32, &[n / 4], &[n / 4]).unwrap();
    let (sp, dp) = (
        fastllm::devices::cuda::buffer::dptr(&src, "src").unwrap(),
        fastllm::devices::cuda::buffer::dptr(&dst, "dst").unwrap(),
    );
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    g.htod(&pattern, sp).unwrap();
    g.dtod(sp, dp, n).unwrap();
    g.sync().unwrap();
    let reps = 10;
    let t0 = Instant::now();
    for _ in 0..reps {
        g.dtod(sp, dp, n).unwrap();
    }
    g.sync().unwrap();
    let dt = t0.elapsed().as_secs_f64() / reps as f64;
    let mut back = vec![0u8; 4096];
    g.dtoh(dp, &mut back).unwrap();
    assert_eq!(back, pattern);
    println!(
        "PERF d2d copy 1 GiB: {:.3} ms, {:.0} GB/s (read+write)",
        dt * 1e3,
        2.0 * n as f64 / dt / 1e9
    );
    // Host-to-device.
    let host = vec![1u8; 256 << 20];
    let t0 = Instant::now();
    g.htod(&host, sp).unwrap();
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "PERF h2d copy 256 MiB (pageable): {:.1} GB/s",
        host.len() as f64 / dt / 1e9
    );
    drop((src, dst));

    // Q4_1 GEMV (decode Linear), weight [n, k] resident on the GPU.
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(3);
    for (nn, k) in [(4096usize, 4096usize), (14336, 4096), (576, 576)] {
        let w = dev.upload(&rng.data(DataType::Q4_1, &[nn, k])).unwrap();
        let x = dev.upload(&rng.data(DataType::F32, &[1, k])).unwrap();
        let mut y = Data::empty(DataType::F32);
        let run = |y: &mut Data| {
            let mut d = DataDict::new()
                .with("input", &x)
                .with("weight", &w)
                .with_mut("output", y);
            cuda.run("Linear", &mut d, &FloatDict::new(), &IntDict::new())
                .unwrap();
        };
        run(&mut y);
        dev.synchronize().unwrap();
        let reps = 50;
        let t0 = Instant::now();
        for _ in 0..reps {
            run(&mut y);
        }
        dev.synchronize().unwrap();
        let dt = t0.elapsed().as_secs_f64() / reps as f64;
        let bytes = DataType::Q4_1.row_bytes(k).unwrap() * nn;
        println!(
            "PERF Linear q4_1 m=1 [{nn}, {k}]: {:.1} us, {:.0} GB/s of weights",
            dt * 1e6,
            bytes as f64 / dt / 1e9
        );
        assert!(matches!(y.device(), DeviceKind::Cuda(_)));
    }
}
