//! Batched decode through the paged KV pool, as the serve engine runs it: `B` sequences of a
//! `P`-token prompt, then `T` decode steps of all `B` at once; prints tokens/s and the
//! executor's per-op profile.
//!
//! `cargo run --release -p fastllm-serve --example decode_batch -- MODEL THREADS B P T [DEVICE [greedy]]`
//!
//! `MODEL` is a `.flm` file or `synthetic:SHAPE:DTYPE` (a random-weight model as in
//! `fastllm bench --synthetic`, e.g. `synthetic:llama-3.2-1b:f16`); `DEVICE` is `cpu` (default),
//! `cuda` or `cuda:N`.

use fastllm::load::{load, LoadOptions};
use fastllm::model::{synthetic, Model, PagedKvPool, PagedSeqState, Precision, SyntheticSource};
use std::sync::Arc;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: usize| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let path = a
        .get(1)
        .ok_or("usage: decode_batch MODEL [threads B P T device]")?;
    let (threads, b, p, t) = (arg(2, 2), arg(3, 8), arg(4, 20), arg(5, 32));
    let device = a.get(6).cloned().unwrap_or_else(|| "cpu".into());
    let model = match path.strip_prefix("synthetic:") {
        Some(spec) => {
            let (shape, dtype) = spec.split_once(':').unwrap_or((spec, "f16"));
            let cfg = synthetic::config(shape)?;
            let src = Arc::new(SyntheticSource::new(&cfg, synthetic::weight_dtype(dtype)?)?);
            let exec = fastllm::load::executor_for(&device, threads, &Default::default())?;
            Model::new(cfg, src, exec, Precision::Fast, false)?
        }
        None => {
            load(
                std::path::Path::new(path),
                &LoadOptions {
                    threads,
                    device: device.clone(),
                    ..Default::default()
                },
            )?
            .model
        }
    };
    let m = &model;
    let mut pool = PagedKvPool::new(m, b * (p + t + 16).div_ceil(16) + 4, 16)?;
    let mut states: Vec<PagedSeqState> = (0..b).map(|_| PagedSeqState::new()).collect();
    let prompt: Vec<u32> = (0..p as u32).map(|i| 100 + i * 7).collect();
    for st in states.iter_mut() {
        m.forward_paged(&mut pool, &mut [(st, &prompt[..])])?;
    }
    // one untimed decode step (first-use uploads, kernel compilation)
    {
        let tok = [42u32];
        let mut batch: Vec<(&mut PagedSeqState, &[u32])> =
            states.iter_mut().map(|s| (s, &tok[..])).collect();
        m.forward_paged(&mut pool, &mut batch)?;
    }
    let ex = m.executor();
    ex.profiler().set_enabled(true);
    // FASTLLM_PROFILE_SYNC=1: device time per op (waits for the GPU after each op)
    ex.profiler()
        .set_sync(std::env::var_os("FASTLLM_PROFILE_SYNC").is_some());
    ex.profiler().reset();
    // `greedy` as the 8th argument: select on the device (`forward_paged_greedy`, what the
    // engine does when every request is greedy) and feed the picked tokens back
    let greedy = a.get(7).is_some_and(|v| v == "greedy");
    let mut next: Vec<[u32; 1]> = vec![[42u32]; b];
    let t0 = Instant::now();
    for _ in 0..t {
        let mut batch: Vec<(&mut PagedSeqState, &[u32])> = states
            .iter_mut()
            .zip(&next)
            .map(|(s, tok)| (s, &tok[..]))
            .collect();
        if greedy {
            let ids = m.forward_paged_greedy(&mut pool, &mut batch)?;
            next = ids.iter().map(|&t| [t]).collect();
        } else {
            m.forward_paged(&mut pool, &mut batch)?;
        }
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "B={b} threads={threads} device={device}: {:.2} ms/step, {:.1} tok/s",
        dt * 1e3 / t as f64,
        (b * t) as f64 / dt
    );
    print!("{}", ex.profiler().report());
    Ok(())
}
