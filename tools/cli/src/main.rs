//! `fastllm`: run, chat, bench, logits, perplexity, tokenize, detokenize and info over a model (a
//! `.flm` file, a GGUF file or a Hugging Face directory; the default model when `-m` is omitted).
//! Errors print one line on stderr and exit non-zero; long steps draw progress bars on a terminal.

use clap::{Args, Parser, Subcommand};
use fastllm::generate::{GenerateParams, Llm, Prefill, SamplingParams, Session};
use fastllm::load::{load_with, GroupMember, LoadOptions};
use fastllm::model::Precision;
use fastllm::options::RuntimeOptions;
use fastllm::parallel::rendezvous::GroupSpec;
use fastllm::Result;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

mod bench_cmd;
mod perplexity;
mod progress;
mod serve_cmd;

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
    /// KV cache dtype: f16, q8_0 or f32 (default: f16 in fast precision, else f32).
    #[arg(long)]
    kv_dtype: Option<String>,
    /// GPU: run one-token decode steps op by op instead of replaying a recorded CUDA graph
    /// (for debugging; env FASTLLM_DECODE_GRAPHS=0).
    #[arg(long)]
    no_cuda_graphs: bool,
    /// Run every op in its plain form, none of the fused ones (same results; for debugging;
    /// env FASTLLM_FUSED_OPS=0).
    #[arg(long)]
    no_fused_ops: bool,
    /// GPU: every sequence's results independent of the batch it runs in (same bits alone and
    /// batched; slower; env FASTLLM_BATCH_INVARIANT=1).
    #[arg(long)]
    batch_invariant: bool,
    /// Tensor parallelism: sum with NCCL instead of the peer-to-peer kernels that a group of
    /// GPUs reaching each other's memory uses (env FASTLLM_PEER_ALL_REDUCE=0).
    #[arg(long)]
    no_peer_all_reduce: bool,
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
        o.batch_invariant |= self.batch_invariant;
        o.peer_all_reduce &= !self.no_peer_all_reduce;
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

    /// The generation parameters of `run` and `chat` (`chat`: through the chat template).
    fn generate_params(&self, chat: bool, system: Option<String>) -> GenerateParams {
        GenerateParams {
            max_new_tokens: self.n,
            sampling: self.params(),
            stop: self.stop.clone(),
            chat,
            system,
        }
    }
}

/// Writes a streamed piece of text to stdout at once (a closed stdout is not an error here).
fn print_piece(piece: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(piece.as_bytes());
    let _ = o.flush();
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
    Bench(bench_cmd::BenchArgs),
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
    Serve(serve_cmd::ServeArgs),
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
        batch_invariant: false,
        no_peer_all_reduce: false,
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
            let prompt = read_text(
                prompt,
                file,
                "give a prompt with -p TEXT or -f FILE",
                "give either -p or -f, not both",
            )?;
            run_prompt(&m, &s, &prompt, (chat, system), profile, t0, bars)?
        }
        Cmd::Chat { m, s, system } => chat(&m, &s, system, bars)?,
        Cmd::Bench(a) => bench_cmd::run(&a, bars)?,
        Cmd::Logits {
            m,
            prompt,
            ids,
            top,
            out,
        } => logits(&m, prompt, ids, top, out, bars)?,
        Cmd::Perplexity(a) => perplexity::run(a, bars)?,
        Cmd::Tokenize {
            model,
            no_special,
            file,
            text,
        } => {
            let llm = load_model(&model_only(&model), bars)?;
            let text = read_text(
                text,
                file,
                "give exactly one of TEXT or -f FILE",
                "give exactly one of TEXT or -f FILE",
            )?;
            let ids = llm.tokenizer.encode(&text, false, !no_special)?;
            println!("{}", serde_json::json!(ids));
        }
        Cmd::Detokenize { model, ids } => {
            let llm = load_model(&model_only(&model), bars)?;
            let ids = parse_ids(&ids)?;
            println!("{}", llm.tokenizer.decode(&ids, false)?);
        }
        Cmd::Serve(a) => serve_cmd::run(a, no_progress, bars)?,
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
        } => bench_serve(fastllm_serve::load::LoadOptions {
            addr,
            concurrency,
            requests,
            max_tokens,
            prompt,
            max_duration: std::time::Duration::from_secs(max_seconds),
            temperature,
            top_p,
            stop_at_eos,
        })?,
        Cmd::Fetch { name } => fetch(&name, bars)?,
        Cmd::Info { model } => info(model.as_deref(), bars)?,
    }
    Ok(())
}

/// The text of `text` or of the file `file`: exactly one of them (`none` and `both` are the
/// errors otherwise).
fn read_text(text: Option<String>, file: Option<String>, none: &str, both: &str) -> Result<String> {
    match (text, file) {
        (Some(t), None) => Ok(t),
        (None, Some(f)) => std::fs::read_to_string(&f).map_err(|e| fastllm::Error::io(&f, e)),
        (None, None) => Err(fastllm::Error::invalid(none)),
        (Some(_), Some(_)) => Err(fastllm::Error::invalid(both)),
    }
}

/// `fastllm run`: streams the completion of `prompt` (`(chat, system)`: through the chat
/// template) to stdout, then its counts and timing (and the op profile) to stderr.
fn run_prompt(
    m: &ModelArgs,
    s: &SampleArgs,
    prompt: &str,
    (chat, system): (bool, Option<String>),
    profile: bool,
    t0: Instant,
    bars: &mut Bars,
) -> Result<()> {
    let llm = load_model(m, bars)?;
    llm.model.executor().profiler().set_enabled(profile);
    let mut sess = Session::new(llm.clone(), 0)?;
    let params = s.generate_params(chat, system);
    let mut first: Option<f64> = None;
    let gen_t = Instant::now();
    let prefill = Prefill {
        chunk: PREFILL_CHUNK,
        progress: &mut |p| bars.update(p),
    };
    let g = sess.generate_with(prompt, &params, prefill, &mut |_, piece| {
        if first.is_none() {
            first = Some(t0.elapsed().as_secs_f64());
        }
        print_piece(piece);
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
    Ok(())
}

/// `fastllm chat`: one turn per stdin line until end of input.
fn chat(m: &ModelArgs, s: &SampleArgs, system: Option<String>, bars: &mut Bars) -> Result<()> {
    let llm = load_model(m, bars)?;
    let mut sess = Session::new(llm, 0)?;
    let params = s.generate_params(true, system);
    let stdin = std::io::stdin();
    eprint!("> ");
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| fastllm::Error::io("stdin", e))?;
        if line.trim().is_empty() {
            eprint!("> ");
            continue;
        }
        let prefill = Prefill {
            chunk: PREFILL_CHUNK,
            progress: &mut |p| bars.update(p),
        };
        sess.generate_with(&line, &params, prefill, &mut |_, piece| {
            print_piece(piece);
            true
        })?;
        println!();
        eprint!("> ");
    }
    eprintln!();
    Ok(())
}

/// `fastllm logits`: the ids, their token texts and the `top` logits after each position as
/// JSON; `out` gets the last position's logits as raw f32.
fn logits(
    m: &ModelArgs,
    prompt: Option<String>,
    ids: Option<String>,
    top: usize,
    out: Option<String>,
    bars: &mut Bars,
) -> Result<()> {
    let llm = load_model(m, bars)?;
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
    Ok(())
}

/// `fastllm bench-serve`: the load test's summary; an error when it measured nothing.
fn bench_serve(o: fastllm_serve::load::LoadOptions) -> Result<()> {
    let report = fastllm_serve::load::run(&o);
    println!("{}", report.summary());
    report.check().map_err(fastllm::Error::invalid)
}

/// `fastllm fetch`: fetches a known model into the cache and prints its path.
fn fetch(name: &str, bars: &mut Bars) -> Result<()> {
    use fastllm::default_model::{default_gguf_with, gemma3_270m_gguf_with};
    let rt = RuntimeOptions::from_env()?;
    let path = match name {
        "smollm2" => default_gguf_with(&rt, &mut |p| bars.update(p))?,
        "gemma3-270m" => gemma3_270m_gguf_with(&rt, &mut |p| bars.update(p))?,
        other => {
            return Err(fastllm::Error::invalid(format!(
                "unknown model {other:?} to fetch (known: smollm2, gemma3-270m)"
            )))
        }
    };
    println!("{}", path.display());
    Ok(())
}

/// `fastllm info`: describes a model file (a GGUF file as it is; a directory once converted).
fn info(model: Option<&str>, bars: &mut Bars) -> Result<()> {
    // a GGUF file is described as it is (no conversion); a directory is converted first
    let given = model.map(std::path::Path::new);
    let path = match given {
        Some(p) if p.is_file() => p.to_path_buf(),
        _ => resolve(model, &RuntimeOptions::from_env()?, bars)?,
    };
    print!("{}", fastllm::format::info::describe(&path)?);
    Ok(())
}
