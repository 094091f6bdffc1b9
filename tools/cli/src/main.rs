//! `fastllm`: run, chat, bench, logits, perplexity, tokenize, detokenize and info over a model (a
//! `.flm` file, a GGUF file or a Hugging Face directory; the default model when `-m` is omitted).
//! Errors print one line on stderr and exit non-zero; long steps draw progress bars on a terminal.

use clap::{Args, Parser, Subcommand};
use fastllm::generate::{GenerateParams, Llm, Prefill, SamplingParams, Session};
use fastllm::load::{load_with, GroupMember, LoadOptions};
use fastllm::model::tp_process::GroupRole;
use fastllm::model::Precision;
use fastllm::options::RuntimeOptions;
use fastllm::parallel::rendezvous::GroupSpec;
use fastllm::Result;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

mod perplexity;
mod progress;

use progress::{Bars, PREFILL_CHUNK};

#[derive(Parser)]
#[command(name = "fastllm", version, about = "Portable LLM inference")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Draw no progress bars (they are drawn on stderr only when it is a terminal).
    #[arg(long, global = true)]
    no_progress: bool,
}

#[derive(Args, Clone)]
struct ModelArgs {
    /// Model: .flm file, GGUF file or Hugging Face directory (default: SmolLM2-135M-Instruct, fetched once).
    #[arg(short = 'm', long = "model")]
    model: Option<String>,
    /// CPU threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Device: cpu, cuda, cuda:N, or cuda:0,1[,...] (tensor parallelism over those GPUs).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Tensor parallelism over N GPUs (with --device cuda or cuda:K: GPUs K..K+N).
    #[arg(long, default_value_t = 0)]
    tp: usize,
    /// Processes the --tp ranks are spread over (one per host, or one per GPU); each runs this
    /// same command with its own --node-rank.
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    /// This process's number in 0..--nnodes; node 0 runs the command, the others follow it.
    #[arg(long, default_value_t = 0)]
    node_rank: usize,
    /// HOST:PORT where node 0 listens for the other nodes (needed with --nnodes > 1).
    #[arg(long)]
    rendezvous: Option<String>,
    /// Seconds to wait for every node at the start, and for a rank during a step.
    #[arg(long, default_value_t = 300)]
    rendezvous_timeout: u64,
    /// Keep weights on disk and read each layer when it runs.
    #[arg(long)]
    low_memory: bool,
    /// fast (int8 activations in quantized matmuls) or exact (f32 activations).
    #[arg(long, default_value = "fast")]
    precision: String,
    /// KV cache dtype: f16, q8_0 or f32 (default: f16 on the CPU in fast precision, else f32).
    #[arg(long)]
    kv_dtype: Option<String>,
    /// GPU: run one-token decode steps op by op instead of replaying a recorded CUDA graph
    /// (for debugging; env FASTLLM_DECODE_GRAPHS=0).
    #[arg(long)]
    no_cuda_graphs: bool,
    /// GPU: run every op in its plain form, none of the fused ones (for debugging; env
    /// FASTLLM_FUSED_OPS=0).
    #[arg(long)]
    no_fused_ops: bool,
    /// GPU: refuse a model whose weights need more than N MiB on any one GPU (0 = no cap; env
    /// FASTLLM_GPU_MEMORY_CAP_MB).
    #[arg(long, value_name = "N")]
    gpu_memory_cap_mb: Option<usize>,
    /// CPU: the highest SIMD level the kernels use: portable, avx2 or avx512 (env FASTLLM_SIMD).
    #[arg(long, value_name = "LEVEL")]
    simd: Option<String>,
}

impl ModelArgs {
    /// The run-time switches: the environment's, then these flags.
    fn runtime(&self) -> Result<RuntimeOptions> {
        let mut o = RuntimeOptions::from_env()?;
        o.cuda_graphs &= !self.no_cuda_graphs;
        o.fused_ops &= !self.no_fused_ops;
        if let Some(mb) = self.gpu_memory_cap_mb {
            o.gpu_memory_cap = fastllm::options::cap_from_mib(mb)?;
        }
        if let Some(level) = &self.simd {
            o.simd = Some(fastllm::options::parse_simd(level)?);
        }
        Ok(o)
    }

    /// The load options of these flags; `in_group`: a process of a group names its own
    /// devices (--tp counts the whole group's ranks).
    fn load_options(&self, in_group: bool) -> Result<LoadOptions> {
        Ok(LoadOptions {
            threads: self.threads,
            device: if in_group {
                self.device.clone()
            } else {
                device_of(self)?
            },
            low_memory: self.low_memory,
            precision: Precision::parse(&self.precision)?,
            runtime: self.runtime()?,
            kv_dtype: self.kv_dtype()?,
        })
    }

    /// The `--kv-dtype` (`None`: the device's default); an unknown name is an error naming it.
    fn kv_dtype(&self) -> Result<Option<fastllm::model::KvDtype>> {
        self.kv_dtype
            .as_deref()
            .map(fastllm::model::KvDtype::parse)
            .transpose()
    }
}

// Numeric flags accept a leading '-' so that a negative value reaches the sampling
// validator and gets its message instead of "unexpected argument".
#[derive(Args, Clone)]
struct SampleArgs {
    /// Tokens to generate.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128)]
    n: usize,
    /// Temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Sample only among the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    top_k: usize,
    /// Nucleus: sample among the most likely tokens whose probabilities sum to P (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    min_p: f32,
    /// Penalty on tokens already seen, CTRL style (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    repeat_penalty: f32,
    /// Random seed of sampling (default: a fresh one, printed on stderr).
    #[arg(long)]
    seed: Option<u64>,
    /// Stop string (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
}

impl SampleArgs {
    /// The sampling parameters; without --seed a sampled run gets a fresh seed, printed on
    /// stderr so that the run can be repeated.
    fn params(&self) -> SamplingParams {
        let seed = fastllm_serve::seed::seed_or_fresh(self.seed);
        if self.seed.is_none() && self.temperature > 0.0 {
            eprintln!("fastllm: sampling with --seed {seed}");
        }
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            seed,
            ..Default::default()
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text from a prompt, streaming it to stdout.
    Run {
        #[command(flatten)]
        m: ModelArgs,
        #[command(flatten)]
        s: SampleArgs,
        /// Prompt text.
        #[arg(short = 'p', long)]
        prompt: Option<String>,
        /// Read the prompt from a file.
        #[arg(short = 'f', long)]
        file: Option<String>,
        /// Wrap the prompt in the model's chat template.
        #[arg(long)]
        chat: bool,
        /// System message (chat).
        #[arg(long)]
        system: Option<String>,
        /// Print the per-op profile at the end.
        #[arg(long)]
        profile: bool,
    },
    /// Interactive multi-turn chat (Ctrl-D to quit).
    Chat {
        #[command(flatten)]
        m: ModelArgs,
        #[command(flatten)]
        s: SampleArgs,
        /// System message.
        #[arg(long)]
        system: Option<String>,
    },
    /// Prompt-processing and generation speed (llama-bench style).
    Bench {
        #[command(flatten)]
        m: ModelArgs,
        /// Prompt tokens.
        #[arg(short = 'p', default_value_t = 128)]
        pp: usize,
        /// Generated tokens.
        #[arg(short = 'n', default_value_t = 128)]
        tg: usize,
        /// Context depth of the generation test: each rep first fills the cache with this many
        /// prompt tokens (untimed), then times -n decode steps after them (llama-bench's -d).
        #[arg(short = 'd', long = "depth", default_value_t = 0)]
        depth: usize,
        /// Capacity (tokens) of the generation test's KV cache, as a session would allocate
        /// for its context; 0 = just enough (depth + n + 2). The GPU decode kernel is sized
        /// for the capacity, its work for the tokens actually cached.
        #[arg(long, default_value_t = 0)]
        kv_capacity: usize,
        /// Repetitions (median reported).
        #[arg(short = 'r', default_value_t = 5)]
        reps: usize,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
        /// Measure a random-weight model of this shape instead of a file: llama-3-8b,
        /// llama-3.2-1b, qwen2-0.5b, or the mixture-of-experts qwen3-30b-a3b, moe-small,
        /// moe-tiny (weights generated on the host, uploaded at load).
        #[arg(long)]
        synthetic: Option<String>,
        /// Weight dtype of a synthetic model: f16, int8 (Q8_0), int4 (Q4_0), q4_k or q6_k.
        #[arg(long, default_value = "int4")]
        dtype: String,
        /// Also measure decoding this many sequences at once (paged KV cache, 16-token
        /// prompts cached first, then -n timed decode steps, each picking every sequence's
        /// token on the device); reported as batch_tg_tok_s (all sequences' tokens per second).
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// How those steps run: graphs (padded to a batch bucket, recorded and replayed as
        /// CUDA graphs), eager (padded, op by op), off (op by op over exactly the batch) or
        /// auto (graphs where the device records them, else off).
        #[arg(long, default_value = "auto")]
        batch_decode: String,
        /// Print the per-op host time of the generation runs to stderr (GPU ops are queued
        /// asynchronously, so on a GPU this is the host's dispatch cost per op).
        #[arg(long)]
        profile: bool,
    },
    /// Top next-token logits at every position, as JSON: {"ids", "tokens" (their text),
    /// "positions": [{"top": [[id, logit, text], ...]}]}.
    Logits {
        #[command(flatten)]
        m: ModelArgs,
        /// Prompt text (tokenized with the model's tokenizer).
        #[arg(long)]
        prompt: Option<String>,
        /// Comma-separated token ids.
        #[arg(long)]
        ids: Option<String>,
        /// Most likely next tokens listed per position.
        #[arg(long, default_value_t = 5)]
        top: usize,
        /// Write all last-position logits as little-endian f32.
        #[arg(long)]
        out: Option<String>,
    },
    /// Perplexity over a text file (llama-perplexity's method), with KL divergence to a base run.
    Perplexity(perplexity::PerplexityArgs),
    /// Print token ids of a text as a JSON array.
    Tokenize {
        /// Model whose tokenizer is used (default: the default model).
        #[arg(short = 'm', long = "model")]
        model: Option<String>,
        /// Do not parse special tokens written in the text.
        #[arg(long)]
        no_special: bool,
        /// Read the text from a file.
        #[arg(short = 'f', long)]
        file: Option<String>,
        /// Text to tokenize.
        text: Option<String>,
    },
    /// Print the text of comma-separated token ids.
    Detokenize {
        /// Model whose tokenizer is used (default: the default model).
        #[arg(short = 'm', long = "model")]
        model: Option<String>,
        /// Comma-separated token ids.
        ids: String,
    },
    /// Model metadata, tokenizer, tensors and memory needed (a .flm or GGUF file is described as
    /// it is; a Hugging Face directory is converted first).
    Info {
        /// Model file or directory (default: the default model).
        model: Option<String>,
    },
    /// Fetch a model if needed and print its GGUF path: `smollm2` (the default model) or
    /// `gemma3-270m` (Gemma 3 270M Q4_K_M, for its reference tests).
    Fetch {
        /// Which model.
        #[arg(default_value = "smollm2")]
        name: String,
    },
    /// HTTP server: OpenAI- and TGI-compatible API with continuous batching.
    Serve {
        #[command(flatten)]
        m: ModelArgs,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Port to listen on.
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Require `Authorization: Bearer KEY` (visible in the process list: prefer
        /// --api-key-file).
        #[arg(long, conflicts_with = "api_key_file")]
        api_key: Option<String>,
        /// Read the API key from the first line of this file.
        #[arg(long)]
        api_key_file: Option<String>,
        /// KV cache budget in MiB (default: from free memory).
        #[arg(long, default_value_t = 0)]
        kv_cache_mb: usize,
        /// Requests in flight (running + waiting); more get HTTP 429 (default 128).
        #[arg(long)]
        max_concurrent_requests: Option<usize>,
        /// Prompt tokens processed in one step; longer prompts are prefilled in chunks
        /// (default 4096).
        #[arg(long)]
        max_batch_prefill_tokens: Option<usize>,
        /// Prompt + allowed output tokens of all running requests together (default: the KV
        /// cache's capacity).
        #[arg(long)]
        max_batch_total_tokens: Option<usize>,
        /// Prompt tokens of one request (default: max-total-tokens - 1).
        #[arg(long)]
        max_input_tokens: Option<usize>,
        /// Prompt + generated tokens of one request (default: the model's context, at most
        /// the KV cache's capacity).
        #[arg(long)]
        max_total_tokens: Option<usize>,
        /// While a batch runs, waiting requests join only if at least floor(running × RATIO)
        /// of them fit (TGI semantics; default 0: join as soon as they fit, since prefill is
        /// chunked into the running steps).
        #[arg(long, allow_negative_numbers = true)]
        waiting_served_ratio: Option<f32>,
        /// Steps of the running batch after which waiting requests join regardless of the
        /// ratio (default 20).
        #[arg(long)]
        max_waiting_tokens: Option<usize>,
        /// Reuse KV blocks of earlier requests that share a prompt prefix (true|false).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        prefix_caching: bool,
        /// Serve a random-weight model of this shape instead of a file (llama-3-8b,
        /// llama-3.2-1b, qwen2-0.5b, tiny, qwen3-30b-a3b, moe-small, moe-tiny), with a
        /// byte-level stand-in tokenizer: for load
        /// tests; its text is meaningless.
        #[arg(long)]
        synthetic: Option<String>,
        /// Weight dtype of a synthetic model: f16, int8 (Q8_0), int4 (Q4_0), q4_k or q6_k.
        #[arg(long, default_value = "f16")]
        dtype: String,
        /// On SIGTERM/SIGINT, seconds running requests may take to finish before they are
        /// ended (streams then get an error event and their end marker).
        #[arg(long, default_value_t = 30.0, allow_negative_numbers = true)]
        drain_timeout: f64,
        /// Allow browser pages from this origin (scheme://host[:port], or * for any) to call
        /// the API (CORS).
        #[arg(long)]
        cors_origin: Option<String>,
    },
    /// Load test a running server: concurrent streaming completions, then req/s, tok/s, TTFT, ITL.
    BenchServe {
        /// Server address host:port (this machine).
        #[arg(long, default_value = "127.0.0.1:8080")]
        addr: String,
        /// Streams open at once.
        #[arg(short = 'c', long, default_value_t = 8)]
        concurrency: usize,
        /// Requests in all.
        #[arg(long, default_value_t = 32)]
        requests: usize,
        /// Tokens generated per request.
        #[arg(short = 'n', long, default_value_t = 64)]
        max_tokens: usize,
        /// Prompt of every request (a completion, not a chat).
        #[arg(
            long,
            default_value = "Write a short story about a robot learning to paint."
        )]
        prompt: String,
        /// Stop after this many seconds.
        #[arg(long, default_value_t = 300)]
        max_seconds: u64,
        /// Sampling temperature of every request (0 = greedy).
        #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
        temperature: f32,
        /// Nucleus (top-p) of every request (1 = off).
        #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
        top_p: f32,
        /// Let requests end at an end-of-sequence token (default: each generates -n tokens).
        #[arg(long)]
        stop_at_eos: bool,
    },
}

/// The device string after `--tp`: `cuda:0,1` for `--device cuda --tp 2`.
fn device_of(m: &ModelArgs) -> Result<String> {
    Ok(match fastllm::parallel::parse_gpu_group(&m.device, m.tp)? {
        Some(g) => format!(
            "cuda:{}",
            g.iter()
                .map(|o| o.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
        None => m.device.clone(),
    })
}

fn load_model(m: &ModelArgs, bars: &mut Bars) -> Result<Arc<Llm>> {
    Ok(Arc::new(load_llm(m, bars)?))
}

/// The `.flm` path of a model argument (see `default_model::resolve`), with bars for a
/// download and a conversion.
fn resolve(model: Option<&str>, rt: &RuntimeOptions, bars: &mut Bars) -> Result<PathBuf> {
    let path = fastllm::default_model::resolve_with(model, rt, &mut |p| bars.update(p));
    bars.finish();
    path
}

/// Loads the model of the flags; in a group of processes, node 0 gets the group's model and
/// the other nodes follow node 0 until it ends the group, then exit.
fn load_llm(m: &ModelArgs, bars: &mut Bars) -> Result<Llm> {
    let spec = group_spec(m)?;
    let opts = m.load_options(spec.is_some())?;
    let path = resolve(m.model.as_deref(), &opts.runtime, bars)?;
    let Some(spec) = spec else {
        let llm = load_with(&path, &opts, &mut |p| bars.update(p));
        bars.finish();
        return llm;
    };
    match fastllm::load::load_in_group(&path, &opts, &spec)? {
        GroupMember::Driver(llm) => {
            watch_group(&llm);
            Ok(*llm)
        }
        GroupMember::Follower(f) => follow(f, &spec),
    }
}

/// A node other than 0 serves node 0's steps until node 0 ends the group, then exits.
fn follow<T>(f: fastllm::model::tp_process::Follower, spec: &GroupSpec) -> Result<T> {
    eprintln!(
        "fastllm: node {} of {}: following node 0 at {}",
        f.node(),
        spec.nnodes,
        spec.addr
    );
    f.run()?;
    eprintln!("fastllm: node {}: node 0 ended the group", spec.node_rank);
    std::process::exit(0)
}

/// The process group of `--nnodes/--node-rank/--rendezvous`, `None` for one process.
fn group_spec(m: &ModelArgs) -> Result<Option<GroupSpec>> {
    if m.nnodes <= 1 {
        if m.node_rank != 0 || m.rendezvous.is_some() {
            return Err(fastllm::Error::invalid(
                "--node-rank and --rendezvous need --nnodes 2 or more",
            ));
        }
        return Ok(None);
    }
    let addr = m.rendezvous.as_deref().ok_or_else(|| {
        fastllm::Error::invalid("--nnodes > 1 needs --rendezvous HOST:PORT (node 0's address)")
    })?;
    let tp = if m.tp == 0 { m.nnodes } else { m.tp };
    Ok(Some(GroupSpec::new(
        tp,
        m.nnodes,
        m.node_rank,
        addr,
        std::time::Duration::from_secs(m.rendezvous_timeout),
    )?))
}

/// Node 0 of a group of processes exits with the reason once a rank in another process fails:
/// the group cannot run another step, and a server must not keep accepting requests.
fn watch_group(llm: &Llm) {
    let Some(health) = llm.model.group_health() else {
        return;
    };
    std::thread::spawn(move || {
        while health.exists() {
            if let Some(why) = health.failure() {
                eprintln!("fastllm: error: tensor-parallel group stopped: {why}");
                std::process::exit(1);
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    });
}

fn model_only(model: &Option<String>) -> ModelArgs {
    ModelArgs {
        model: model.clone(),
        threads: 1,
        device: "cpu".into(),
        tp: 0,
        nnodes: 1,
        node_rank: 0,
        rendezvous: None,
        rendezvous_timeout: 300,
        low_memory: false,
        precision: "fast".into(),
        kv_dtype: None,
        no_cuda_graphs: false,
        no_fused_ops: false,
        gpu_memory_cap_mb: None,
        simd: None,
    }
}

/// The text of one token as the tokenizer spells it (special tokens included).
fn token_text(llm: &Llm, id: u32) -> String {
    llm.tokenizer.decode(&[id], false).unwrap_or_default()
}

fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            t.trim()
                .parse::<u32>()
                .map_err(|_| fastllm::Error::invalid(format!("'{t}' is not a token id")))
        })
        .collect()
}

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

fn main() {
    let t0 = Instant::now();
    let cli = Cli::parse();
    let mut bars = Bars::new(cli.no_progress);
    if let Err(e) = run(cli, &mut bars, t0) {
        bars.finish();
        eprintln!("fastllm: error: {e}");
        std::process::exit(1);
    }
}

fn run(cli: Cli, bars: &mut Bars, t0: Instant) -> Result<()> {
    let no_progress = cli.no_progress;
    match cli.cmd {
        Cmd::Run {
            m,
            s,
            prompt,
            file,
            chat,
            system,
            profile,
        } => {
            let prompt = match (prompt, file) {
                (Some(p), None) => p,
                (None, Some(f)) => {
                    std::fs::read_to_string(&f).map_err(|e| fastllm::Error::io(&f, e))?
                }
                (None, None) => {
                    return Err(fastllm::Error::invalid(
                        "give a prompt with -p TEXT or -f FILE",
                    ))
                }
                (Some(_), Some(_)) => {
                    return Err(fastllm::Error::invalid("give either -p or -f, not both"))
                }
            };
            let llm = load_model(&m, bars)?;
            llm.model.executor().profiler().set_enabled(profile);
            let mut sess = Session::new(llm.clone(), 0)?;
            let params = GenerateParams {
                max_new_tokens: s.n,
                sampling: s.params(),
                stop: s.stop.clone(),
                chat,
                system,
            };
            let mut first: Option<f64> = None;
            let gen_t = Instant::now();
            let out = std::io::stdout();
            let prefill = Prefill {
                chunk: PREFILL_CHUNK,
                progress: &mut |p| bars.update(p),
            };
            let g = sess.generate_with(&prompt, &params, prefill, &mut |_, piece| {
                if first.is_none() {
                    first = Some(t0.elapsed().as_secs_f64());
                }
                let mut o = out.lock();
                let _ = o.write_all(piece.as_bytes());
                let _ = o.flush();
                true
            })?;
            println!();
            let dt = gen_t.elapsed().as_secs_f64();
            eprintln!(
                "fastllm: {} prompt tokens, {} generated ({:?}) in {:.2}s; first token after {:.3}s from start",
                g.prompt_tokens,
                g.tokens.len(),
                g.stop_reason,
                dt,
                first.unwrap_or(0.0)
            );
            if profile {
                eprint!("{}", llm.model.executor().profiler().report());
            }
        }
        Cmd::Chat { m, s, system } => {
            let llm = load_model(&m, bars)?;
            let mut sess = Session::new(llm, 0)?;
            let params = GenerateParams {
                max_new_tokens: s.n,
                sampling: s.params(),
                stop: s.stop.clone(),
                chat: true,
                system,
            };
            let stdin = std::io::stdin();
            eprint!("> ");
            for line in stdin.lock().lines() {
                let line = line.map_err(|e| fastllm::Error::io("stdin", e))?;
                if line.trim().is_empty() {
                    eprint!("> ");
                    continue;
                }
                let out = std::io::stdout();
                let prefill = Prefill {
                    chunk: PREFILL_CHUNK,
                    progress: &mut |p| bars.update(p),
                };
                sess.generate_with(&line, &params, prefill, &mut |_, piece| {
                    let mut o = out.lock();
                    let _ = o.write_all(piece.as_bytes());
                    let _ = o.flush();
                    true
                })?;
                println!();
                eprint!("> ");
            }
            eprintln!();
        }
        Cmd::Bench {
            m,
            pp,
            tg,
            depth,
            kv_capacity,
            reps,
            json,
            synthetic,
            dtype,
            batch,
            batch_decode,
            profile,
        } => bench(
            &m,
            pp,
            tg,
            (depth, kv_capacity),
            reps,
            json,
            synthetic.as_deref(),
            &dtype,
            (batch, &batch_decode),
            profile,
            bars,
        )?,
        Cmd::Logits {
            m,
            prompt,
            ids,
            top,
            out,
        } => {
            let llm = load_model(&m, bars)?;
            let ids = match (prompt, ids) {
                (Some(p), None) => llm.tokenizer.encode(&p, true, true)?,
                (None, Some(s)) => parse_ids(&s)?,
                _ => {
                    return Err(fastllm::Error::invalid(
                        "give exactly one of --prompt or --ids",
                    ))
                }
            };
            if ids.is_empty() {
                return Err(fastllm::Error::invalid("no tokens to evaluate"));
            }
            let mut cache = llm.model.new_cache(ids.len())?;
            let logits = llm.model.forward(&mut cache, &ids, true)?;
            let v = logits.to_f32_vec()?;
            let vocab = llm.model.config().vocab_size;
            let mut positions = Vec::new();
            for row in v.chunks(vocab) {
                let mut idx: Vec<usize> = (0..row.len()).collect();
                idx.sort_by(|&a, &b| {
                    row[b]
                        .partial_cmp(&row[a])
                        .unwrap_or(std::cmp::Ordering::Equal)
                });
                let topk: Vec<serde_json::Value> = idx
                    .iter()
                    .take(top)
                    .map(|&i| serde_json::json!([i, row[i], token_text(&llm, i as u32)]))
                    .collect();
                positions.push(serde_json::json!({ "top": topk }));
            }
            if let Some(path) = out {
                let last = v.chunks(vocab).last().unwrap_or(&[]);
                let bytes: Vec<u8> = last.iter().flat_map(|x| x.to_le_bytes()).collect();
                std::fs::write(&path, bytes).map_err(|e| fastllm::Error::io(&path, e))?;
            }
            let texts: Vec<String> = ids.iter().map(|&i| token_text(&llm, i)).collect();
            println!(
                "{}",
                serde_json::json!({ "ids": ids, "tokens": texts, "positions": positions })
            );
        }
        Cmd::Perplexity(a) => perplexity::run(a, bars)?,
        Cmd::Tokenize {
            model,
            no_special,
            file,
            text,
        } => {
            let llm = load_model(&model_only(&model), bars)?;
            let text = match (text, file) {
                (Some(t), None) => t,
                (None, Some(f)) => {
                    std::fs::read_to_string(&f).map_err(|e| fastllm::Error::io(&f, e))?
                }
                _ => {
                    return Err(fastllm::Error::invalid(
                        "give exactly one of TEXT or -f FILE",
                    ))
                }
            };
            let ids = llm.tokenizer.encode(&text, false, !no_special)?;
            println!("{}", serde_json::json!(ids));
        }
        Cmd::Detokenize { model, ids } => {
            let llm = load_model(&model_only(&model), bars)?;
            let ids = parse_ids(&ids)?;
            println!("{}", llm.tokenizer.decode(&ids, false)?);
        }
        Cmd::Serve {
            m,
            host,
            port,
            api_key,
            api_key_file,
            kv_cache_mb,
            max_concurrent_requests,
            max_batch_prefill_tokens,
            max_batch_total_tokens,
            max_input_tokens,
            max_total_tokens,
            waiting_served_ratio,
            max_waiting_tokens,
            prefix_caching,
            synthetic,
            dtype,
            drain_timeout,
            cors_origin,
        } => {
            let group = group_spec(&m)?;
            if group.as_ref().is_some_and(|g| g.node_rank > 0) {
                // the other nodes serve no HTTP: they follow node 0's steps, then exit
                load_model(&m, bars)?;
                return Ok(());
            }
            let addr: std::net::SocketAddr = format!("{host}:{port}")
                .parse()
                .map_err(|_| fastllm::Error::invalid(format!("bad address {host}:{port}")))?;
            let api_key = match api_key_file {
                Some(f) => {
                    Some(fastllm_serve::read_api_key_file(&f).map_err(fastllm::Error::invalid)?)
                }
                None => api_key,
            };
            let drain_timeout =
                std::time::Duration::try_from_secs_f64(drain_timeout).map_err(|_| {
                    fastllm::Error::invalid(format!(
                        "--drain-timeout must be a number of seconds >= 0, got {drain_timeout}"
                    ))
                })?;
            let opts = m.load_options(group.is_some())?;
            // a synthetic model's name and dtype are checked before anything binds or loads
            let (path, name) = match &synthetic {
                Some(shape) => {
                    if m.model.is_some() {
                        return Err(fastllm::Error::invalid(
                            "--synthetic and -m/--model are exclusive",
                        ));
                    }
                    fastllm::model::synthetic::config(shape)?;
                    fastllm::model::synthetic::weight_dtype(&dtype)?;
                    (None, format!("{shape}-{dtype}-synthetic"))
                }
                None => {
                    let path = resolve(m.model.as_deref(), &opts.runtime, bars)?;
                    let name = path
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    (Some(path), name)
                }
            };
            let so = fastllm_serve::ServeOptions {
                addr,
                model_name: name,
                device: opts.device.clone(),
                drain_timeout,
                cors_origin,
                api_key,
                kv_cache_mb,
                max_concurrent_requests,
                max_batch_prefill_tokens,
                max_batch_total_tokens,
                max_input_tokens,
                max_total_tokens,
                waiting_served_ratio,
                max_waiting_tokens,
                prefix_caching: Some(prefix_caching),
            };
            fastllm_serve::run(so, move || match (&path, &synthetic, &group) {
                (Some(p), _, Some(g)) => match fastllm::load::load_in_group(p, &opts, g)? {
                    GroupMember::Driver(llm) => {
                        watch_group(&llm);
                        Ok(*llm)
                    }
                    GroupMember::Follower(_) => Err(fastllm::Error::invalid("node 0 drives")),
                },
                (None, Some(_), Some(_)) => Err(fastllm::Error::invalid(
                    "--synthetic models are not served by a group of processes",
                )),
                (Some(p), _, None) => {
                    let mut bars = Bars::new(no_progress);
                    load_with(p, &opts, &mut |u| bars.update(u))
                }
                (None, Some(shape), None) => fastllm::load::load_synthetic(shape, &dtype, &opts),
                (None, None, _) => Err(fastllm::Error::invalid("no model to serve")),
            })
            .map_err(fastllm::Error::invalid)?;
        }
        Cmd::BenchServe {
            addr,
            concurrency,
            requests,
            max_tokens,
            prompt,
            max_seconds,
            temperature,
            top_p,
            stop_at_eos,
        } => {
            let o = fastllm_serve::load::LoadOptions {
                addr,
                concurrency,
                requests,
                max_tokens,
                prompt,
                max_duration: std::time::Duration::from_secs(max_seconds),
                temperature,
                top_p,
                stop_at_eos,
            };
            let report = fastllm_serve::load::run(&o);
            println!("{}", report.summary());
            report.check().map_err(fastllm::Error::invalid)?;
        }
        Cmd::Fetch { name } => {
            use fastllm::default_model::{default_gguf_with, gemma3_270m_gguf_with};
            let rt = RuntimeOptions::from_env()?;
            let path = match name.as_str() {
                "smollm2" => default_gguf_with(&rt, &mut |p| bars.update(p))?,
                "gemma3-270m" => gemma3_270m_gguf_with(&rt, &mut |p| bars.update(p))?,
                other => {
                    return Err(fastllm::Error::invalid(format!(
                        "unknown model {other:?} to fetch (known: smollm2, gemma3-270m)"
                    )))
                }
            };
            println!("{}", path.display())
        }
        Cmd::Info { model } => {
            // a GGUF file is described as it is (no conversion); a directory is converted first
            let given = model.as_deref().map(std::path::Path::new);
            let path = match given {
                Some(p) if p.is_file() => p.to_path_buf(),
                _ => resolve(model.as_deref(), &RuntimeOptions::from_env()?, bars)?,
            };
            print!("{}", fastllm::format::info::describe(&path)?);
        }
    }
    Ok(())
}

/// Tokens per second of `batch` sequences decoded together through the paged KV cache
/// (16-token prompts prefilled in one step first, then `tg` steps of one token each).
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

#[allow(clippy::too_many_arguments)]
fn bench(
    m: &ModelArgs,
    pp: usize,
    tg: usize,
    (depth, kv_capacity): (usize, usize),
    reps: usize,
    json: bool,
    synthetic: Option<&str>,
    dtype: &str,
    (batch, batch_mode): (usize, &str),
    profile: bool,
    bars: &mut Bars,
) -> Result<()> {
    if pp == 0 && tg == 0 {
        return Err(fastllm::Error::invalid(
            "nothing to measure: -p and -n are both 0",
        ));
    }
    let tg_cap = if kv_capacity == 0 {
        depth + tg + 2
    } else {
        kv_capacity
    };
    if tg_cap < depth + tg {
        return Err(fastllm::Error::invalid(format!(
            "--kv-capacity {kv_capacity} cannot hold the depth {depth} and the {tg} generated tokens"
        )));
    }
    let lt = Instant::now();
    let mut bm = bench_model(m, synthetic, dtype, bars)?;
    let load_s = lt.elapsed().as_secs_f64();
    if batch > 1 {
        use fastllm::model::BatchDecode;
        let mode = match batch_mode {
            "auto" => bm.model.batch_decode(),
            "graphs" => BatchDecode::Graphs,
            "eager" => BatchDecode::Eager,
            "off" => BatchDecode::Off,
            other => {
                return Err(fastllm::Error::invalid(format!(
                    "--batch-decode {other}: expected auto, graphs, eager or off"
                )))
            }
        };
        if mode != bm.model.batch_decode() {
            bm.model.set_batch_decode(mode)?;
        }
    }
    let model = &bm.model;
    let cfg = model.config().clone();
    // deterministic pseudo-random prompt tokens, like llama-bench
    let mut x = 0x1234_5678u64;
    let mut tok = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % cfg.vocab_size as u64) as u32
    };
    let prompt: Vec<u32> = (0..pp.max(1)).map(|_| tok()).collect();
    let gen: Vec<u32> = (0..tg).map(|_| tok()).collect();
    let context: Vec<u32> = (0..depth).map(|_| tok()).collect();
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
    // decode runs on one cache, cleared before each rep, as a chat session keeps its cache; its
    // warm-up steps size the buffers and record the CUDA graph of the decode step (a one-time
    // cost per cache, like the prompt warm-up above), so the reps time the steady state
    let mut tg_cache = model.new_cache(tg_cap)?;
    for &g in gen.iter().take(DECODE_WARMUP_STEPS) {
        model.forward_greedy(&mut tg_cache, &[g])?;
    }
    for rep in 0..reps.max(1) {
        if pp > 0 {
            let mut c = model.new_cache(pp + 1)?;
            let t = Instant::now();
            model.forward(&mut c, &prompt, false)?;
            pp_t.push(pp as f64 / t.elapsed().as_secs_f64());
        }
        if tg > 0 {
            tg_cache.clear()?;
            if depth > 0 {
                model.forward(&mut tg_cache, &context, false)?;
            }
            model.executor().profiler().set_enabled(profile);
            let t = Instant::now();
            // greedy selection on the model's device: only the id comes back per step
            for &g in &gen {
                model.forward_greedy(&mut tg_cache, &[g])?;
            }
            tg_t.push(tg as f64 / t.elapsed().as_secs_f64());
            model.executor().profiler().set_enabled(false);
        }
        let last = |v: &[f64], what: &str| v.last().map(|r| format!("{what} {r:.1} tok/s "));
        let rates: String = [last(&pp_t, "pp"), last(&tg_t, "tg")]
            .into_iter()
            .flatten()
            .collect();
        bars.bench_rep(rep + 1, reps.max(1), &rates);
    }
    if profile {
        eprint!("{}", model.executor().profiler().report());
    }
    let threads = model
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
        .unwrap_or(1);
    let mut btg_t = Vec::new();
    if batch > 1 && tg > 0 {
        model.executor().profiler().reset();
        for _ in 0..reps.max(1) {
            btg_t.push(batch_decode(model, batch, tg, &mut tok, profile)?);
        }
        if profile {
            eprintln!("decode of {batch} sequences at once:");
            eprint!("{}", model.executor().profiler().report());
        }
    }
    let btgs = (batch > 1 && tg > 0).then(|| median(btg_t));
    let (pps, tgs) = (median(pp_t), median(tg_t));
    let rss = peak_rss_mib();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "model": bm.name, "device": device_of(m)?, "tp": model.tensor_parallel(),
                "threads": threads, "precision": m.precision,
                "weight_bytes_per_token": bm.weight_bytes,
                "pp": pp, "tg": tg, "depth": depth, "kv_capacity": tg_cap, "reps": reps,
                "pp_tok_s": pps, "tg_tok_s": tgs, "load_s": load_s, "peak_rss_mib": rss,
                "tg_weight_gb_s": bm.weight_bytes.map(|b| b as f64 * tgs / 1e9),
                "batch": batch, "batch_tg_tok_s": btgs,
                "batch_decode": format!("{:?}", model.batch_decode()).to_lowercase(),
                "kv_dtype": model.kv_dtype().name(),
                "kv_bytes_per_token": model.kv_bytes_per_token(),
            })
        );
    } else {
        println!("| model | threads | precision | test | t/s |");
        println!("|---|---|---|---|---|");
        let name = &match model.tensor_parallel_devices() {
            Some(d) => format!("{} [tp={} {d}]", bm.name, model.tensor_parallel()),
            None => bm.name.clone(),
        };
        if pp > 0 {
            println!(
                "| {name} | {threads} | {} | pp{pp} | {pps:.2} |",
                m.precision
            );
        }
        if tg > 0 {
            let at = if depth > 0 {
                format!(" @ d{depth}")
            } else {
                String::new()
            };
            println!(
                "| {name} | {threads} | {} | tg{tg}{at} | {tgs:.2} |",
                m.precision
            );
        }
        if let Some(b) = btgs {
            println!(
                "| {name} | {threads} | {} | tg{tg} x batch {batch} | {b:.2} |",
                m.precision
            );
        }
        println!(
            "load {load_s:.3} s, peak RSS {rss:.1} MiB, KV cache {} ({:.2} KiB per token)",
            model.kv_dtype(),
            model.kv_bytes_per_token() as f64 / 1024.0
        );
        if let (Some(b), true) = (bm.weight_bytes, tg > 0) {
            println!(
                "weights read per token {:.3} GB: {:.1} GB/s at tg",
                b as f64 / 1e9,
                b as f64 * tgs / 1e9
            );
        }
    }
    Ok(())
}
