//! Benchmark of the CPU matrix kernels through `Executor::run`: `Linear` GEMV (1 row) and GEMM
//! (64 rows) for every weight dtype (and `quant_act = 1` for block types) at LLM-sized shapes,
//! printed as GFLOP/s and weight GB/s next to a plain memory-read bandwidth measured in the same
//! run (SIMD sum over a 1 GiB buffer, same thread count); plus the executor's dispatch overhead
//! (a 1-element `AddTo`, µs per call).
//!
//! `cargo bench --bench linear -- [--threads N] [--quick] [--gemv] [--dtype LIST]`
//! (`--quick`: only the five small shapes; `--gemv`: skip the 64-row GEMMs; `--dtype q4_0,f16`:
//! only those weight dtypes).
//!
//! `--dram SHAPE` (`llama-3.2-1b`, `qwen2.5-0.5b`, `llama-3-8b`) instead times what a decode token
//! reads: one-row `Linear`s (`quant_act = 1` for block dtypes) over every layer's q, k, v, o, gate,
//! up and down matrices of that model shape, each layer its own buffers, so the weights (far larger
//! than the L3) stream from DRAM as in real decode; `--layers N` caps the layer count (memory);
//! `--rows N` gives every `Linear` N activation rows (N sequences decoding together);
//! `--by-matrix` also times each matrix kind (q, k, v, o, gate, up, down) of every layer alone.

use fastllm::data::encode_from_f32;
use fastllm::{Data, DataDict, DataType, Executor, FloatDict, IntDict};
use fastllm_cpu::linear::interleaved;
use fastllm_cpu::threads::Threads;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Opts {
    threads: usize,
    quick: bool,
    gemv_only: bool,
    /// Only these weight dtypes (`--dtype q4_0,q4_1`); all when empty.
    dtypes: Vec<String>,
    /// Model shape of the DRAM-streaming decode pass (`--dram`).
    dram: Option<String>,
    /// Most layers of the `--dram` pass.
    layers: usize,
    /// Activation rows of every `Linear` of the `--dram` pass (1: a decode token; more: a batch
    /// of sequences decoding together).
    rows: usize,
    /// `--by-matrix`: the `--dram` pass also times each matrix kind (q, k, …) over all layers.
    by_matrix: bool,
}

fn opts() -> Opts {
    let args: Vec<String> = std::env::args().collect();
    let mut o = Opts {
        threads: 2,
        quick: false,
        gemv_only: false,
        dtypes: Vec::new(),
        dram: None,
        layers: usize::MAX,
        rows: 1,
        by_matrix: false,
    };
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--threads" => {
                o.threads = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(2);
                i += 1;
            }
            "--quick" => o.quick = true,
            "--dram" => {
                o.dram = args.get(i + 1).cloned();
                i += 1;
            }
            "--layers" => {
                o.layers = args
                    .get(i + 1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(usize::MAX);
                i += 1;
            }
            "--rows" => {
                o.rows = args
                    .get(i + 1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1)
                    .max(1);
                i += 1;
            }
            "--gemv" => o.gemv_only = true,
            "--by-matrix" => o.by_matrix = true,
            "--dtype" => {
                o.dtypes = args
                    .get(i + 1)
                    .map(|v| v.split(',').map(str::to_string).collect())
                    .unwrap_or_default();
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    o
}

/// Sum of a slice with 4 AVX2 accumulators (plain loop elsewhere).
fn simd_sum(v: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if fastllm_cpu::simd::has_avx2_fma() {
            // SAFETY: feature checked.
            return unsafe { sum_avx2(v) };
        }
    }
    v.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(v: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut a = [_mm256_setzero_ps(); 4];
    let p = v.as_ptr();
    let mut i = 0;
    while i + 32 <= v.len() {
        for (j, acc) in a.iter_mut().enumerate() {
            *acc = _mm256_add_ps(*acc, _mm256_loadu_ps(p.add(i + 8 * j)));
        }
        i += 32;
    }
    let s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), s);
    out.iter().sum::<f32>() + v[i..].iter().sum::<f32>()
}

/// Read bandwidth in GB/s: best of 5 passes over a 1 GiB buffer, split over the pool.
fn read_bandwidth(threads: &Threads) -> f64 {
    let n = (1usize << 30) / 4;
    let buf: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let total = Mutex::new(0f32);
    let chunk = 1 << 20;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t0 = Instant::now();
        threads.for_rows(n / chunk, 1, |r| {
            let s = simd_sum(&buf[r.start * chunk..r.end * chunk]);
            *total.lock().unwrap() += s;
        });
        best = best.min(t0.elapsed().as_secs_f64());
    }
    black_box(total.into_inner().unwrap());
    (n * 4) as f64 / best / 1e9
}

/// µs per `Executor::run` of a 1-element `AddTo`.
fn dispatch_us(e: &Executor) -> f64 {
    let mut x = Data::from_f32(&[1], &[1.0]).unwrap();
    let y = Data::from_f32(&[1], &[0.5]).unwrap();
    let (fl, il) = (FloatDict::new(), IntDict::new());
    let calls = 200_000;
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        for _ in 0..calls {
            let mut d = DataDict::new()
                .with_mut("input0", &mut x)
                .with("input1", &y);
            e.run("AddTo", &mut d, &fl, &il).unwrap();
        }
        best = best.min(t0.elapsed().as_secs_f64() * 1e6 / calls as f64);
    }
    best
}

fn weight(dtype: DataType, n: usize, k: usize) -> Data {
    let mut s = 0x1234_5678_9abc_def1u64;
    let v: Vec<f32> = (0..n * k)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Data::from_bytes(dtype, &[n, k], &encode_from_f32(dtype, &v).unwrap()).unwrap()
}

/// (best, median) time of `Linear` over enough calls to fill ~0.4 s (at least 5). The best time
/// is what the table's rates use (like the read bandwidth, a best of several passes): on a
/// shared machine it is the one least disturbed by other processes.
fn time_linear(e: &Executor, x: &Data, w: &Data, quant_act: i32) -> (Duration, Duration) {
    let mut out = Data::empty(DataType::F32);
    let (fl, il) = (
        FloatDict::new(),
        IntDict::new().with("quant_act", quant_act),
    );
    let run = |out: &mut Data| {
        let mut d = DataDict::new()
            .with("input", x)
            .with("weight", w)
            .with_mut("output", out);
        e.run("Linear", &mut d, &fl, &il).unwrap();
    };
    run(&mut out);
    let t0 = Instant::now();
    run(&mut out);
    let once = t0.elapsed().as_secs_f64();
    let reps = ((0.4 / once.max(1e-9)) as usize).clamp(5, 2000);
    let mut ts: Vec<Duration> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            run(&mut out);
            t.elapsed()
        })
        .collect();
    ts.sort();
    (ts[0], ts[ts.len() / 2])
}

fn main() {
    let o = opts();
    let threads = Threads::new(o.threads).unwrap();
    let e = Executor::cpu(o.threads).unwrap();
    let bw = read_bandwidth(&threads);
    let disp = dispatch_us(&e);
    println!(
        "threads {}  read bandwidth {:.1} GB/s  dispatch (AddTo, 1 element) {:.3} us/call",
        o.threads, bw, disp
    );
    if let Some(shape) = &o.dram {
        return dram_pass(&e, &o, shape, bw);
    }
    let mut shapes = vec![
        (576usize, 576usize),
        (1536, 576),
        (576, 1536),
        (2048, 640),
        (640, 2048),
    ];
    if !o.quick {
        shapes.extend([(4096, 4096), (14336, 4096), (4096, 14336)]);
    }
    let dtypes = [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::Q8_0,
        DataType::Q4_0,
        DataType::Q4_1,
        DataType::Q5_0,
        DataType::Q4K,
        DataType::Q6K,
        DataType::Mxfp4,
    ];
    let row_counts: &[usize] = if o.gemv_only { &[1] } else { &[1, 64] };
    println!(
        "{:<12} {:<6} {:>2} {:>4} {:>10} {:>10} {:>9} {:>9} {:>7}",
        "n x k", "weight", "qa", "rows", "best us", "median us", "GFLOP/s", "w GB/s", "w/read"
    );
    for &(n, k) in &shapes {
        for dt in dtypes {
            if !o.dtypes.is_empty() && !o.dtypes.iter().any(|d| d == dt.name()) {
                continue;
            }
            // K-quant rows are whole super-blocks (k a multiple of 256)
            if dt.row_bytes(k).is_err() {
                continue;
            }
            let w = weight(dt, n, k);
            let wbytes = w.bytes().unwrap().len() as f64;
            let qas: &[i32] = if dt.is_quantized() { &[0, 1] } else { &[0] };
            for &rows in row_counts {
                let x = Data::from_f32(&[rows, k], &vec![0.25f32; rows * k]).unwrap();
                for &qa in qas {
                    let (best, median) = time_linear(&e, &x, &w, qa);
                    let t = best.as_secs_f64();
                    let gflops = 2.0 * (rows * n * k) as f64 / t / 1e9;
                    let gbs = wbytes / t / 1e9;
                    println!(
                        "{:<12} {:<6} {:>2} {:>4} {:>10.1} {:>10.1} {:>9.1} {:>9.1} {:>6.0}%",
                        format!("{n}x{k}"),
                        dt.name(),
                        qa,
                        rows,
                        t * 1e6,
                        median.as_secs_f64() * 1e6,
                        gflops,
                        gbs,
                        100.0 * gbs / bw
                    );
                }
            }
        }
    }
}

/// (hidden, ffn, kv width, layers) of the model shapes of `--dram`.
fn dram_shape(name: &str) -> Option<(usize, usize, usize, usize)> {
    match name {
        "llama-3.2-1b" => Some((2048, 8192, 512, 16)),
        "qwen2.5-0.5b" => Some((896, 4864, 128, 24)),
        "llama-3-8b" => Some((4096, 14336, 1024, 32)),
        _ => None,
    }
}

/// Times one decode token's matmuls of a model shape with weights streaming from DRAM (see the
/// module doc), per weight dtype, in the file's layout and (where the CPU has the kernels)
/// interleaved as the CPU device holds them; as GB/s and the share of the read
/// bandwidth `bw`.
fn dram_pass(e: &Executor, o: &Opts, shape: &str, bw: f64) {
    let Some((h, f, kv, layers)) = dram_shape(shape) else {
        eprintln!("--dram: unknown shape {shape} (llama-3.2-1b, qwen2.5-0.5b, llama-3-8b)");
        std::process::exit(2);
    };
    let layers = layers.min(o.layers);
    let mats = [(h, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f)];
    let rows = o.rows;
    println!("{shape}: {layers} layers, {rows}-row Linear per matrix (q k v o gate up down)");
    println!(
        "{:<18} {:>10} {:>10} {:>9} {:>7}",
        "weight", "MB/token", "ms/token", "GB/s", "w/read"
    );
    let xs = [
        Data::from_f32(&[rows, h], &vec![0.25f32; rows * h]).unwrap(),
        Data::from_f32(&[rows, f], &vec![0.25f32; rows * f]).unwrap(),
    ];
    for dt in [
        DataType::Q4_0,
        DataType::Q4_1,
        DataType::Q8_0,
        DataType::Q4K,
        DataType::Q5K,
        DataType::Q6K,
        DataType::Q2K,
        DataType::Q3K,
        DataType::F16,
        DataType::BF16,
    ] {
        if !o.dtypes.is_empty() && !o.dtypes.iter().any(|d| d == dt.name()) {
            continue;
        }
        if let Some(&(_, k)) = mats.iter().find(|&&(_, k)| dt.row_bytes(k).is_err()) {
            println!(
                "{:<18} (rows of {k} values are not whole {} blocks)",
                dt.name(),
                dt.name()
            );
            continue;
        }
        let mut ws: Vec<Data> = (0..layers)
            .flat_map(|_| mats.iter().map(move |&(n, k)| weight(dt, n, k)))
            .collect();
        let bytes: usize = ws.iter().map(|w| w.bytes().unwrap().len()).sum();
        report(dt.name(), bytes, token_pass(e, &refs(&ws), &xs), bw);
        // the interleaved K-quant kernels are timed also where the device keeps a type plain
        let kernels = dt.kernel_type().is_some_and(|t| {
            interleaved::available_for(t) || (t.is_kquant() && interleaved::available())
        });
        if kernels {
            for w in ws.iter_mut() {
                *w = fastllm::interleave::interleave(w).unwrap().unwrap();
            }
            report(
                ws[0].dtype().name(),
                bytes,
                token_pass(e, &refs(&ws), &xs),
                bw,
            );
        }
        if o.by_matrix {
            by_matrix(e, &ws, &xs, bw);
        }
    }
}

/// The `--dram` pass per matrix kind: each kind's matrices of every layer, in turn.
fn by_matrix(e: &Executor, ws: &[Data], xs: &[Data; 2], bw: f64) {
    const KINDS: [&str; 7] = ["q", "k", "v", "o", "gate", "up", "down"];
    for (j, kind) in KINDS.iter().enumerate() {
        let sub: Vec<&Data> = ws.iter().skip(j).step_by(KINDS.len()).collect();
        let bytes: usize = sub.iter().map(|w| w.bytes().unwrap().len()).sum();
        let name = format!("  {kind} {}x{}", sub[0].dim(0), sub[0].dim(1));
        report(&name, bytes, token_pass(e, &sub, xs), bw);
    }
}

/// Median seconds of one pass of one-row `Linear`s over `ws` (input `xs[0]` or, for the down
/// projection, `xs[1]`), after one untimed pass.
fn token_pass(e: &Executor, ws: &[&Data], xs: &[Data; 2]) -> f64 {
    let qa = i32::from(ws[0].dtype().block_elems() > 1);
    let (fl, il) = (FloatDict::new(), IntDict::new().with("quant_act", qa));
    let mut out = Data::empty(DataType::F32);
    let mut pass = || {
        for w in ws {
            let x = &xs[usize::from(w.dim(-1) != xs[0].dim(-1))];
            let mut d = DataDict::new()
                .with("input", x)
                .with("weight", w)
                .with_mut("output", &mut out);
            e.run("Linear", &mut d, &fl, &il).unwrap();
        }
    };
    pass();
    let mut ts: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            pass();
            t.elapsed().as_secs_f64()
        })
        .collect();
    ts.sort_by(f64::total_cmp);
    ts[ts.len() / 2]
}

fn refs(ws: &[Data]) -> Vec<&Data> {
    ws.iter().collect()
}

/// One line of the `--dram` table.
fn report(name: &str, bytes: usize, t: f64, bw: f64) {
    let gbs = bytes as f64 / t / 1e9;
    println!(
        "{:<18} {:>10.1} {:>10.2} {:>9.1} {:>6.0}%",
        name,
        bytes as f64 / 1e6,
        t * 1e3,
        gbs,
        100.0 * gbs / bw
    );
}
