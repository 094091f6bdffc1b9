//! Helpers of the CUDA test binaries (and the CUDA bench): the device or a skip, the executors
//! compared, argument copies, `Linear` runs and small comparisons. Each binary uses some of them.

#![allow(dead_code)]

use fastllm::data::{Data, DataType};
use fastllm::devices::cpu::{CpuDevice, KernelMode};
use fastllm::devices::cuda::CudaDevice;
use fastllm::{DataDict, Executor, FloatDict, IntDict};
use std::sync::Arc;

/// The first CUDA device, or `None` after reporting the skip.
pub fn gpu() -> Option<Arc<CudaDevice>> {
    match CudaDevice::new(0) {
        Ok(d) => Some(Arc::new(d)),
        Err(e) => {
            super::skipped(&format!("no CUDA device ({e})"));
            None
        }
    }
}

/// The scalar reference CPU device, alone.
pub fn reference() -> Executor {
    let mut e = Executor::new();
    e.add_device(Arc::new(
        CpuDevice::with_mode(1, KernelMode::Reference).unwrap(),
    ));
    e
}

/// The CUDA device first, the fast CPU device as the fallback for ops it lacks.
pub fn cuda_executor(dev: &Arc<CudaDevice>) -> Executor {
    let mut e = Executor::new();
    e.add_device(dev.clone());
    e.add_device(Arc::new(CpuDevice::new(0).unwrap()));
    e
}

/// A host copy of a case argument (unallocated stays unallocated), with its expansion capacity.
pub fn clone_arg(d: &Data) -> Data {
    if !d.is_allocated() {
        return Data::empty(d.dtype());
    }
    let mut c = d.to_owned_host().unwrap();
    if let Some(axis) = (0..d.dims().len()).find(|&i| d.dims()[i] != d.capacity()[i]) {
        c.reserve(axis, d.capacity()[axis]).unwrap();
    }
    c
}

/// Runs `Linear` on `exec`; returns the output on the host.
pub fn run_linear(exec: &Executor, x: &Data, w: &Data, b: Option<&Data>, quant_act: i32) -> Data {
    let mut y = Data::empty(DataType::F32);
    let mut d = DataDict::new().with("input", x).with("weight", w);
    if let Some(b) = b {
        d.insert("bias", b);
    }
    d.insert_mut("output", &mut y);
    exec.run(
        "Linear",
        &mut d,
        &FloatDict::new(),
        &IntDict::new().with("quant_act", quant_act),
    )
    .unwrap();
    y.to_owned_host().unwrap()
}

/// Max |a − b| over two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

/// The index of the largest value (the first of equal ones).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// `RMSNorm` of `x` into `h` (eps 1e-5), leaving the copy `copy` for the next `Linear`; with
/// `b`, first `x += Σ_ranks b` (`all_reduce`: the group's fused all-reduce, add and norm).
pub fn rms_norm_into(
    exec: &Executor,
    x: &mut Data,
    b: Option<&Data>,
    w: &Data,
    copy: fastllm::ops::OutputCopy,
    h: &mut Data,
) {
    rms_norm_split_into(exec, (x, b, w), copy, h, 0);
}

/// [`rms_norm_into`] with `row_split` (0: whole rows; 1 or 2: the ranks split the rows, see
/// `P2pGroup::split_launch`).
#[allow(dead_code)]
pub fn rms_norm_split_into(
    exec: &Executor,
    (x, b, w): (&mut Data, Option<&Data>, &Data),
    copy: fastllm::ops::OutputCopy,
    h: &mut Data,
    split: i32,
) {
    let mut d = DataDict::new()
        .with_mut("input", x)
        .with("weight", w)
        .with_mut("output", h);
    let mut ints = IntDict::new().with("quantize_output", copy.param());
    if let Some(b) = b {
        d.insert("input1", b);
        ints = ints.with("all_reduce", 1);
    }
    if split != 0 {
        ints = ints.with("row_split", split);
    }
    exec.run(
        "RMSNorm",
        &mut d,
        &FloatDict::new().with("eps", 1e-5),
        &ints,
    )
    .unwrap();
}
