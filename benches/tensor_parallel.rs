//! Where two-GPU decode time goes, one line per measurement: NCCL all-reduce latency at decode,
//! batch and prefill sizes (eager, and 64 decode-sized all-reduces recorded as one graph), the
//! peer-to-peer all-reduce fused with the residual add and the next norm against one GPU's add
//! then norm (f16 partial rows of 4096, 64 launches recorded as one graph), and
//! the decode rate of one GPU alone against two independent single-GPU models decoding at the
//! same time from two threads of this process (shared driver and launch costs).
//!
//!   cargo bench --bench tensor_parallel
//!
//! Needs two GPUs and NCCL; without them it prints "SKIPPED: …" and exits successfully.

#[path = "../tests/common/mod.rs"]
mod common;

use fastllm::devices::cuda::{gpu, nccl, CudaDevice};
use fastllm::load::model_for;
use fastllm::model::{Model, Precision, WeightSource};
use fastllm::ops::OutputCopy;
use fastllm::parallel::Collective;
use fastllm::{BaseDevice, Data, DataDict, DataType, Executor, FloatDict, IntDict};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    if let Err(e) = gpu::probe(1) {
        common::skipped(&format!("the tensor-parallel bench needs 2 GPUs: {e}"));
        return;
    }
    if let Err(e) = nccl::probe() {
        common::skipped(&format!("{e}"));
        return;
    }
    println!("NCCL version {:?}", nccl::version());
    let id = nccl::NcclId::new().unwrap();
    let ranks: Vec<_> = (0..2)
        .map(|r| std::thread::spawn(move || all_reduce_times(r, &id)))
        .collect();
    for (r, h) in ranks.into_iter().enumerate() {
        for (what, us) in h.join().unwrap() {
            println!("rank {r}: {what}: {us:.1} us each");
        }
    }
    launch_contention();
}

/// Microseconds per all-reduce on rank `r` of two: f32 and f16 vectors of a decode row, a batch
/// of 64 rows and a 2048-token prefill, eager; and 64 decode rows recorded as one graph.
fn all_reduce_times(r: usize, id: &nccl::NcclId) -> Vec<(String, f64)> {
    let dev = Arc::new(CudaDevice::new(r as u32).unwrap());
    dev.warm_up().unwrap(); // the kernels load before a peer waits on this rank
    let comm = nccl::NcclComm::new(dev.gpu(), id, r, 2).unwrap();
    let mut y = dev
        .upload(&Data::from_f32(&[8], &[r as f32 + 1.0; 8]).unwrap())
        .unwrap();
    comm.all_reduce_sum(&mut y).unwrap();
    assert_eq!(y.to_owned_host().unwrap().to_f32_vec().unwrap(), [3.0; 8]);
    let mut out = Vec::new();
    times(&dev, &comm, "NCCL", &mut out);
    norm_times(&dev, false, "one GPU's AddTo then RMSNorm", &mut out);
    if let Some(g) = comm
        .enable_p2p(true, std::time::Duration::from_secs(60))
        .unwrap()
    {
        times(&dev, &comm, "peer-to-peer", &mut out);
        dev.attach_group(g).unwrap();
        norm_times(
            &dev,
            true,
            "peer-to-peer all-reduce, add and RMSNorm fused",
            &mut out,
        );
    }
    out
}

/// Microseconds per residual add and norm of f16 partial rows of 4096 into f32 rows, with the
/// f16 copy the next product reads where there are 16 rows or more: 64 launches recorded as
/// one graph. With `fused` (a group attached to `dev`), the fused all-reduce form; else `AddTo`
/// then `RMSNorm`.
fn norm_times(dev: &Arc<CudaDevice>, fused: bool, how: &str, out: &mut Vec<(String, f64)>) {
    let mut exec = Executor::new();
    exec.add_device(dev.clone());
    for rows in [1usize, 8, 64, 512, 2048] {
        let up = |d: Data| dev.upload(&d).unwrap();
        let mut x = up(Data::zeros(DataType::F32, &[rows, 4096]).unwrap());
        let b = up(Data::zeros(DataType::F16, &[rows, 4096]).unwrap());
        let w = up(Data::from_f32(&[4096], &[1.0; 4096]).unwrap());
        let mut h = Data::empty(DataType::F32);
        let copy = if rows >= 16 {
            OutputCopy::F16
        } else {
            OutputCopy::None
        };
        let step = |x: &mut Data, h: &mut Data| {
            if !fused {
                let mut a = DataDict::new().with_mut("input0", x).with("input1", &b);
                exec.run("AddTo", &mut a, &FloatDict::new(), &IntDict::new())
                    .unwrap();
            }
            common::cuda::rms_norm_into(&exec, x, fused.then_some(&b), &w, copy, h);
        };
        step(&mut x, &mut h);
        let reps = if rows > 64 { 10 } else { 50 };
        let us = per_launch_in_graph(dev, reps, || step(&mut x, &mut h));
        out.push((
            format!("add and norm of {rows} x 4096 f16 rows, {how}, 64 in a graph"),
            us,
        ));
        if fused && rows >= 512 {
            for split in [1, 2] {
                let mut run = || {
                    let xbw = (&mut x, Some(&b), &w);
                    common::cuda::rms_norm_split_into(&exec, xbw, OutputCopy::F16, &mut h, split)
                };
                run();
                let us = per_launch_in_graph(dev, 10, run);
                out.push((
                    format!("add and norm of {rows} x 4096 f16 rows, {how}, rows split over the ranks (row_split {split}), 64 in a graph"),
                    us,
                ));
            }
        }
    }
}

/// Microseconds per call of `launch`: 64 calls recorded as one graph on `dev`, replayed five
/// times, then timed over `reps` replays.
fn per_launch_in_graph(dev: &CudaDevice, reps: usize, mut launch: impl FnMut()) -> f64 {
    dev.begin_recording().unwrap();
    for _ in 0..64 {
        launch();
    }
    let g = dev.end_recording().unwrap();
    for _ in 0..5 {
        assert!(dev.replay(g.as_ref()).unwrap());
    }
    dev.synchronize().unwrap();
    let t = Instant::now();
    for _ in 0..reps {
        dev.replay(g.as_ref()).unwrap();
    }
    dev.synchronize().unwrap();
    t.elapsed().as_secs_f64() * 1e6 / (reps as f64 * 64.0)
}

/// [`all_reduce_times`] of `comm`'s current all-reduce (`how`).
fn times(dev: &CudaDevice, comm: &nccl::NcclComm, how: &str, out: &mut Vec<(String, f64)>) {
    for dt in [DataType::F32, DataType::F16] {
        for n in [4096usize, 64 * 4096, 2048 * 4096] {
            let mut x = dev.upload(&Data::zeros(dt, &[n]).unwrap()).unwrap();
            for _ in 0..10 {
                comm.all_reduce_sum(&mut x).unwrap();
            }
            dev.synchronize().unwrap();
            let iters = if n > 1 << 20 { 50 } else { 1000 };
            let t = Instant::now();
            for _ in 0..iters {
                comm.all_reduce_sum(&mut x).unwrap();
            }
            dev.synchronize().unwrap();
            let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
            out.push((format!("all-reduce of {n} {dt:?}, eager, {how}"), us));
        }
        let mut x = dev.upload(&Data::zeros(dt, &[4096]).unwrap()).unwrap();
        let us = per_launch_in_graph(dev, 50, || comm.all_reduce_sum(&mut x).unwrap());
        out.push((
            format!("all-reduce of 4096 {dt:?}, 64 in a graph, {how}"),
            us,
        ));
    }
}

/// Decode tokens/s of `m` over `n` single-token steps after a 4-token prompt.
fn decode_rate(m: &Model, n: usize) -> f64 {
    let vocab = m.config().vocab_size;
    let p: Vec<u32> = (0..4).map(|i| ((i * 7919 + 13) % vocab) as u32).collect();
    let mut c = m.new_cache(p.len() + n + 1).unwrap();
    m.forward(&mut c, &p, false).unwrap();
    let t = Instant::now();
    for i in 0..n {
        m.forward(&mut c, &[p[i % 4]], false).unwrap();
    }
    n as f64 / t.elapsed().as_secs_f64()
}

/// A random-weight llama-3.2-1b (f16) on `device`.
fn model_on(device: &str) -> Model {
    let cfg = fastllm::model::synthetic::config("llama-3.2-1b").unwrap();
    let src: Arc<dyn WeightSource> =
        Arc::new(fastllm::model::SyntheticSource::new(&cfg, DataType::F16).unwrap());
    model_for(
        cfg,
        src,
        device,
        2,
        Precision::Fast,
        false,
        &Default::default(),
    )
    .unwrap()
}

/// Decode rate of one GPU alone, then of two independent models on cuda:0 and cuda:1 decoding
/// at once.
fn launch_contention() {
    let solo = {
        let m = model_on("cuda:0");
        decode_rate(&m, 20);
        decode_rate(&m, 128)
    };
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let pair: Vec<f64> = (0..2)
        .map(|r| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let m = model_on(&format!("cuda:{r}"));
                decode_rate(&m, 20);
                barrier.wait();
                decode_rate(&m, 128)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    println!(
        "llama-3.2-1b f16 decode: one GPU alone {solo:.1} tok/s; two independent models on cuda:0 and cuda:1 at once {:.1} and {:.1} tok/s",
        pair[0], pair[1]
    );
}
