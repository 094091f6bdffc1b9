//! `fastllm bench`: prompt processing and decode speed of a model file or a synthetic
//! random-weight model, llama-bench style (median of the reps), optionally with many sequences
//! decoding at once through the paged KV cache.

use super::{device_of, follow, group_spec, load_llm, resolve, Bars, ModelArgs};
use clap::Args;
use fastllm::model::tp_process::GroupRole;
use fastllm::model::{Model, Precision};
use fastllm::Result;
use std::sync::Arc;
use std::time::Instant;

/// The flags of `fastllm bench`.
#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub m: ModelArgs,
    /// Prompt tokens.
    #[arg(short = 'p', default_value_t = 128)]
    pub pp: usize,
    /// Generated tokens.
    #[arg(short = 'n', default_value_t = 128)]
    pub tg: usize,
    /// Context depth of the generation test: each rep first fills the cache with this many
    /// prompt tokens (untimed), then times -n decode steps after them (llama-bench's -d).
    #[arg(short = 'd', long = "depth", default_value_t = 0)]
    pub depth: usize,
    /// Capacity (tokens) of the generation test's KV cache, as a session would allocate
    /// for its context; 0 = just enough (depth + n + 2). The GPU decode kernel is sized
    /// for the capacity, its work for the tokens actually cached.
    #[arg(long, default_value_t = 0)]
    pub kv_capacity: usize,
    /// Most prompt rows per forward step (llama-bench's -ub; 0: a prompt in one step); default:
    /// the model's (512 on the CPU, a prompt in one step on a GPU).
    #[arg(long)]
    pub ubatch: Option<usize>,
    /// Repetitions (median reported).
    #[arg(short = 'r', default_value_t = 5)]
    pub reps: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Measure a random-weight model of this shape instead of a file: llama-3-8b,
    /// llama-3.2-1b, qwen2-0.5b, or the mixture-of-experts qwen3-30b-a3b, moe-small,
    /// moe-tiny (weights generated on the host, uploaded at load).
    #[arg(long)]
    pub synthetic: Option<String>,
    /// Weight dtype of a synthetic model: f16, int8 (Q8_0), int4 (Q4_0), q4_k or q6_k.
    #[arg(long, default_value = "int4")]
    pub dtype: String,
    /// Also measure decoding this many sequences at once (paged KV cache, 16-token
    /// prompts cached first, then -n timed decode steps, each picking every sequence's
    /// token on the device); reported as batch_tg_tok_s (all sequences' tokens per second).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// How those steps run: graphs (padded to a batch bucket, recorded and replayed as
    /// CUDA graphs), eager (padded, op by op), off (op by op over exactly the batch) or
    /// auto (graphs where the device records them, else off).
    #[arg(long, default_value = "auto")]
    pub batch_decode: String,
    /// Print the per-op host time of the generation runs to stderr (GPU ops are queued
    /// asynchronously, so on a GPU this is the host's dispatch cost per op).
    #[arg(long)]
    pub profile: bool,
}

/// Runs `fastllm bench` (`bars`: the load's bars and one line per rep on a terminal).
pub fn run(a: &BenchArgs, bars: &mut Bars) -> Result<()> {
    if a.pp == 0 && a.tg == 0 {
        return Err(fastllm::Error::invalid(
            "nothing to measure: -p and -n are both 0",
        ));
    }
    let tg_cap = if a.kv_capacity == 0 {
        a.depth + a.tg + 2
    } else {
        a.kv_capacity
    };
    if tg_cap < a.depth + a.tg {
        return Err(fastllm::Error::invalid(format!(
            "--kv-capacity {} cannot hold the depth {} and the {} generated tokens",
            a.kv_capacity, a.depth, a.tg
        )));
    }
    let lt = Instant::now();
    let mut bm = bench_model(&a.m, a.synthetic.as_deref(), &a.dtype, bars)?;
    let load_s = lt.elapsed().as_secs_f64();
    if a.batch > 1 {
        set_batch_mode(&mut bm.model, &a.batch_decode)?;
    }
    if let Some(rows) = a.ubatch {
        bm.model.set_prefill_chunk(rows)?;
    }
    let model = &bm.model;
    let ctx = model.config().context_length;
    if a.pp > ctx || a.depth + a.tg > ctx {
        return Err(fastllm::Error::invalid(format!(
            "-p {} or -d {} + -n {} exceed the model's context of {ctx} tokens",
            a.pp, a.depth, a.tg
        )));
    }
    // deterministic pseudo-random prompt tokens, like llama-bench
    let vocab = model.config().vocab_size as u64;
    let mut x = 0x1234_5678u64;
    let mut tok = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % vocab) as u32
    };
    let prompt: Vec<u32> = (0..a.pp.max(1)).map(|_| tok()).collect();
    let gen: Vec<u32> = (0..a.tg).map(|_| tok()).collect();
    let context: Vec<u32> = (0..a.depth).map(|_| tok()).collect();
    let (pp_t, tg_t) = time_single(a, model, (&prompt, &gen, &context), tg_cap, bars)?;
    let mut btg_t = Vec::new();
    if a.batch > 1 && a.tg > 0 {
        model.executor().profiler().reset();
        for _ in 0..a.reps.max(1) {
            btg_t.push(batch_decode(model, a.batch, a.tg, &mut tok, a.profile)?);
        }
        if a.profile {
            eprintln!("decode of {} sequences at once:", a.batch);
            eprint!("{}", model.executor().profiler().report());
        }
    }
    let r = Measured {
        pps: median(pp_t),
        tgs: median(tg_t),
        btgs: (a.batch > 1 && a.tg > 0).then(|| median(btg_t)),
        load_s,
        rss: peak_rss_mib(),
        tg_cap,
    };
    if a.json {
        report_json(a, &bm, &r)
    } else {
        report_table(a, &bm, &r);
        Ok(())
    }
}

/// Sets how `--batch` steps run (`auto` keeps the model's choice).
fn set_batch_mode(model: &mut Model, mode: &str) -> Result<()> {
    use fastllm::model::BatchDecode;
    let mode = match mode {
        "auto" => model.batch_decode(),
        "graphs" => BatchDecode::Graphs,
        "eager" => BatchDecode::Eager,
        "off" => BatchDecode::Off,
        other => {
            return Err(fastllm::Error::invalid(format!(
                "--batch-decode {other}: expected auto, graphs, eager or off"
            )))
        }
    };
    if mode != model.batch_decode() {
        model.set_batch_decode(mode)?;
    }
    Ok(())
}

/// The single-sequence measurements, one value per rep: prompt processing of `prompt` in a
/// fresh cache, and decoding `gen` one token at a time after `context` in a cache of `tg_cap`
/// tokens (kept across reps and cleared before each, as a chat session keeps its cache).
fn time_single(
    a: &BenchArgs,
    model: &Model,
    (prompt, gen, context): (&[u32], &[u32], &[u32]),
    tg_cap: usize,
    bars: &mut Bars,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (pp, tg) = (a.pp, a.tg);
    let mut pp_t = Vec::new();
    let mut tg_t = Vec::new();
    // warm-up: on a GPU the whole prompt (its first run allocates scratch buffers sized for
    // it and creates library handles, which a timed run must not pay), on the CPU a few tokens
    {
        let on_gpu = model
            .executor()
            .devices()
            .first()
            .is_some_and(|d| d.kind() != fastllm::DeviceKind::Cpu)
            || model.tensor_parallel() > 1;
        let n = if on_gpu {
            prompt.len()
        } else {
            prompt.len().min(8)
        };
        let mut c = model.new_cache(pp + tg + 2)?;
        model.forward(&mut c, &prompt[..n], false)?;
    }
    // the decode cache's warm-up steps size the buffers and record the CUDA graph of the
    // decode step (a one-time cost per cache, like the prompt warm-up above), so the reps time
    // the steady state
    let mut tg_cache = model.new_cache(tg_cap)?;
    for &g in gen.iter().take(DECODE_WARMUP_STEPS) {
        model.forward_greedy(&mut tg_cache, &[g])?;
    }
    for rep in 0..a.reps.max(1) {
        if pp > 0 {
            let mut c = model.new_cache(pp + 1)?;
            let t = Instant::now();
            model.forward(&mut c, prompt, false)?;
            pp_t.push(pp as f64 / t.elapsed().as_secs_f64());
        }
        if tg > 0 {
            tg_cache.clear()?;
            if !context.is_empty() {
                model.forward(&mut tg_cache, context, false)?;
            }
            model.executor().profiler().set_enabled(a.profile);
            let t = Instant::now();
            // greedy selection on the model's device: only the id comes back per step
            for &g in gen {
                model.forward_greedy(&mut tg_cache, &[g])?;
            }
            tg_t.push(tg as f64 / t.elapsed().as_secs_f64());
            model.executor().profiler().set_enabled(false);
        }
        bars.bench_rep(rep + 1, a.reps.max(1), &rep_rates(&pp_t, &tg_t));
    }
    if a.profile {
        eprint!("{}", model.executor().profiler().report());
    }
    Ok((pp_t, tg_t))
}

/// The last rep's rates for its progress line, e.g. `pp 512.3 tok/s tg 40.1 tok/s `.
fn rep_rates(pp_t: &[f64], tg_t: &[f64]) -> String {
    let last = |v: &[f64], what: &str| v.last().map(|r| format!("{what} {r:.1} tok/s "));
    [last(pp_t, "pp"), last(tg_t, "tg")]
        .into_iter()
        .flatten()
        .collect()
}

/// What a bench run measured (tokens per second are medians over the reps).
struct Measured {
    pps: f64,
    tgs: f64,
    /// All sequences' tokens per second with `--batch`.
    btgs: Option<f64>,
    load_s: f64,
    rss: f64,
    tg_cap: usize,
}

/// CPU threads the model's first device uses (1 without a device).
fn threads_of(m: &ModelArgs, model: &Model) -> usize {
    model
        .executor()
        .devices()
        .first()
        .map(|_| {
            if m.threads == 0 {
                std::thread::available_parallelism()
                    .map(|v| v.get())
                    .unwrap_or(1)
            } else {
                m.threads
            }
        })
        .unwrap_or(1)
}

/// The measurements as one JSON object on stdout.
fn report_json(a: &BenchArgs, bm: &BenchModel, r: &Measured) -> Result<()> {
    let (m, model) = (&a.m, &bm.model);
    println!(
        "{}",
        serde_json::json!({
            "model": bm.name, "device": device_of(m)?, "tp": model.tensor_parallel(),
            "threads": threads_of(m, model), "precision": m.precision,
            "weight_bytes_per_token": bm.weight_bytes,
            "pp": a.pp, "tg": a.tg, "depth": a.depth, "kv_capacity": r.tg_cap, "reps": a.reps,
            "pp_tok_s": r.pps, "tg_tok_s": r.tgs, "load_s": r.load_s, "peak_rss_mib": r.rss,
            "tg_weight_gb_s": bm.weight_bytes.map(|b| b as f64 * r.tgs / 1e9),
            "batch": a.batch, "batch_tg_tok_s": r.btgs,
            "batch_decode": format!("{:?}", model.batch_decode()).to_lowercase(),
            "kv_dtype": model.kv_dtype().name(),
            "kv_bytes_per_token": model.kv_bytes_per_token(),
        })
    );
    Ok(())
}

/// The measurements as a llama-bench style table, then load time, memory and KV cache lines.
fn report_table(a: &BenchArgs, bm: &BenchModel, r: &Measured) {
    let (m, model) = (&a.m, &bm.model);
    let (pp, tg, depth, threads) = (a.pp, a.tg, a.depth, threads_of(m, model));
    println!("| model | threads | precision | test | t/s |");
    println!("|---|---|---|---|---|");
    let name = &match model.tensor_parallel_devices() {
        Some(d) => format!("{} [tp={} {d}]", bm.name, model.tensor_parallel()),
        None => bm.name.clone(),
    };
    if pp > 0 {
        println!(
            "| {name} | {threads} | {} | pp{pp} | {:.2} |",
            m.precision, r.pps
        );
    }
    if tg > 0 {
        let at = if depth > 0 {
            format!(" @ d{depth}")
        } else {
            String::new()
        };
        println!(
            "| {name} | {threads} | {} | tg{tg}{at} | {:.2} |",
            m.precision, r.tgs
        );
    }
    if let Some(b) = r.btgs {
        println!(
            "| {name} | {threads} | {} | tg{tg} x batch {} | {b:.2} |",
            m.precision, a.batch
        );
    }
    println!(
        "load {:.3} s, peak RSS {:.1} MiB, KV cache {} ({:.2} KiB per token)",
        r.load_s,
        r.rss,
        model.kv_dtype(),
        model.kv_bytes_per_token() as f64 / 1024.0
    );
    if let (Some(b), true) = (bm.weight_bytes, tg > 0) {
        println!(
            "weights read per token {:.3} GB: {:.1} GB/s at tg",
            b as f64 / 1e9,
            b as f64 * r.tgs / 1e9
        );
    }
}

/// Peak resident memory of this process (MiB; 0 where `/proc` does not say).
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// Total decode tokens/s of `batch` sequences decoding together: each sequence's 16-token
/// prompt is cached first (untimed, with one untimed decode step after it that sizes the
/// buffers), then `tg` decode steps of all sequences are timed, each picking its tokens on the
/// model's device (greedy) and feeding them back, as the server does: decode steps only, with
/// the prompts already cached, like llama-batched-bench's S_TG. `profile` records the timed
/// steps in the executor's profiler.
fn batch_decode(
    model: &fastllm::model::Model,
    batch: usize,
    tg: usize,
    tok: &mut impl FnMut() -> u32,
    profile: bool,
) -> Result<f64> {
    use fastllm::model::{PagedKvPool, PagedSeqState};
    let (bs, plen) = (16, 16);
    let mut pool = PagedKvPool::new(model, batch * (plen + tg + 2).div_ceil(bs), bs)?;
    let mut st: Vec<PagedSeqState> = (0..batch).map(|_| PagedSeqState::new()).collect();
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|_| (0..plen).map(|_| tok()).collect())
        .collect();
    let mut items: Vec<(&mut PagedSeqState, &[u32])> = st
        .iter_mut()
        .zip(&prompts)
        .map(|(s, p)| (s, p.as_slice()))
        .collect();
    let first = model.forward_paged_greedy(&mut pool, &mut items)?;
    let mut next: Vec<[u32; 1]> = first.iter().map(|&t| [t]).collect();
    let mut step = |next: &mut Vec<[u32; 1]>| -> Result<()> {
        let mut items: Vec<(&mut PagedSeqState, &[u32])> = st
            .iter_mut()
            .zip(next.iter())
            .map(|(s, n)| (s, n.as_slice()))
            .collect();
        let ids = model.forward_paged_greedy(&mut pool, &mut items)?;
        *next = ids.iter().map(|&t| [t]).collect();
        Ok(())
    };
    step(&mut next)?;
    model.executor().profiler().set_enabled(profile);
    let t = Instant::now();
    for _ in 0..tg {
        step(&mut next)?;
    }
    let tps = (batch * tg) as f64 / t.elapsed().as_secs_f64();
    model.executor().profiler().set_enabled(false);
    Ok(tps)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

/// The model `bench` measures: a file, or a synthetic random-weight model.
struct BenchModel {
    model: fastllm::model::Model,
    name: String,
    /// Weight bytes read per decoded token (synthetic models only).
    weight_bytes: Option<usize>,
}

fn bench_model(
    m: &ModelArgs,
    synthetic: Option<&str>,
    dtype: &str,
    bars: &mut Bars,
) -> Result<BenchModel> {
    use fastllm::model::synthetic;
    let Some(shape) = synthetic else {
        let path = resolve(m.model.as_deref(), &m.runtime()?, bars)?;
        let llm = load_llm(m, bars)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        return Ok(BenchModel {
            model: llm.model,
            name,
            weight_bytes: None,
        });
    };
    if m.model.is_some() {
        return Err(fastllm::Error::invalid(
            "--synthetic and -m/--model are exclusive",
        ));
    }
    let cfg = synthetic::config(shape)?;
    let dt = synthetic::weight_dtype(dtype)?;
    let src = Arc::new(fastllm::model::SyntheticSource::new(&cfg, dt)?);
    let weight_bytes = src.weight_bytes_per_token();
    if let Some(spec) = group_spec(m)? {
        let opts = m.load_options(true)?;
        let model = match fastllm::load::model_in_group(&spec, cfg, src, &opts)? {
            GroupRole::Driver(model) => *model,
            GroupRole::Follower(f) => follow(f, &spec)?,
        };
        return Ok(BenchModel {
            model,
            name: format!("{shape}-{dtype} (synthetic)"),
            weight_bytes: Some(weight_bytes),
        });
    }
    let mut model = fastllm::load::model_for(
        cfg,
        src,
        &device_of(m)?,
        m.threads,
        Precision::parse(&m.precision)?,
        m.low_memory,
        &m.runtime()?,
    )?;
    model.set_kv_dtype(m.kv_dtype()?)?;
    Ok(BenchModel {
        model,
        name: format!("{shape}-{dtype} (synthetic)"),
        weight_bytes: Some(weight_bytes),
    })
}

/// Untimed decode steps before the timed ones: the first runs op by op and sizes the buffers,
/// the second records the decode step's CUDA graph, the third replays it.
const DECODE_WARMUP_STEPS: usize = 3;
