//! `fastllm serve`: its flags, and the server started over a model file, a synthetic model or
//! the driver of a tensor-parallel group.

use super::{group_spec, load_model, resolve, watch_group, Bars, ModelArgs};
use clap::Args;
use fastllm::load::{load_with, GroupMember};
use fastllm::Result;

/// The flags of `fastllm serve`.
#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub m: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` (visible in the process list: prefer
    /// --api-key-file).
    #[arg(long, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from the first line of this file.
    #[arg(long)]
    pub api_key_file: Option<String>,
    /// KV cache budget in MiB (default: from free memory).
    #[arg(long, default_value_t = 0)]
    pub kv_cache_mb: usize,
    /// Requests in flight (running + waiting); more get HTTP 429 (default 128).
    #[arg(long)]
    pub max_concurrent_requests: Option<usize>,
    /// Prompt tokens processed in one step; longer prompts are prefilled in chunks
    /// (default 4096; on the CPU 512, which bounds a step's working memory).
    #[arg(long)]
    pub max_batch_prefill_tokens: Option<usize>,
    /// Prompt + allowed output tokens of all running requests together (default: the KV
    /// cache's capacity).
    #[arg(long)]
    pub max_batch_total_tokens: Option<usize>,
    /// Prompt tokens of one request (default: max-total-tokens - 1).
    #[arg(long)]
    pub max_input_tokens: Option<usize>,
    /// Prompt + generated tokens of one request (default: the model's context, at most
    /// the KV cache's capacity).
    #[arg(long)]
    pub max_total_tokens: Option<usize>,
    /// While a batch runs, waiting requests join only if at least floor(running × RATIO)
    /// of them fit (TGI semantics; default 0: join as soon as they fit, since prefill is
    /// chunked into the running steps).
    #[arg(long, allow_negative_numbers = true)]
    pub waiting_served_ratio: Option<f32>,
    /// Steps of the running batch after which waiting requests join regardless of the
    /// ratio (default 20).
    #[arg(long)]
    pub max_waiting_tokens: Option<usize>,
    /// Reuse KV blocks of earlier requests that share a prompt prefix (true|false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub prefix_caching: bool,
    /// Serve a random-weight model of this shape instead of a file (llama-3-8b,
    /// llama-3.2-1b, qwen2-0.5b, tiny, qwen3-30b-a3b, moe-small, moe-tiny), with a
    /// byte-level stand-in tokenizer: for load
    /// tests; its text is meaningless.
    #[arg(long)]
    pub synthetic: Option<String>,
    /// Weight dtype of a synthetic model: f16, int8 (Q8_0), int4 (Q4_0), q4_k or q6_k.
    #[arg(long, default_value = "f16")]
    pub dtype: String,
    /// On SIGTERM/SIGINT, seconds running requests may take to finish before they are
    /// ended (streams then get an error event and their end marker).
    #[arg(long, default_value_t = 30.0, allow_negative_numbers = true)]
    pub drain_timeout: f64,
    /// Allow browser pages from this origin (scheme://host, with :port where it is not the
    /// default, or * for any) to call the API (CORS).
    #[arg(long)]
    pub cors_origin: Option<String>,
}

/// Runs `fastllm serve` until the server stops (`no_progress`: the server loads its model
/// without bars).
pub fn run(a: ServeArgs, no_progress: bool, bars: &mut Bars) -> Result<()> {
    let m = &a.m;
    let group = group_spec(m)?;
    if group.as_ref().is_some_and(|g| g.node_rank > 0) {
        // the other nodes serve no HTTP: they follow node 0's steps, then exit
        load_model(m, bars)?;
        return Ok(());
    }
    let (host, port) = (&a.host, a.port);
    let addr: std::net::SocketAddr = format!("{host}:{port}")
        .parse()
        .map_err(|_| fastllm::Error::invalid(format!("bad address {host}:{port}")))?;
    let api_key = match &a.api_key_file {
        Some(f) => Some(fastllm_serve::read_api_key_file(f).map_err(fastllm::Error::invalid)?),
        None => a.api_key.clone(),
    };
    let drain_timeout = std::time::Duration::try_from_secs_f64(a.drain_timeout).map_err(|_| {
        fastllm::Error::invalid(format!(
            "--drain-timeout must be a number of seconds >= 0, got {}",
            a.drain_timeout
        ))
    })?;
    let opts = m.load_options(group.is_some())?;
    let (path, name) = model_source(m, a.synthetic.as_deref(), &a.dtype, &opts.runtime, bars)?;
    let so = fastllm_serve::ServeOptions {
        addr,
        model_name: name,
        device: opts.device.clone(),
        drain_timeout,
        cors_origin: a.cors_origin.clone(),
        api_key,
        kv_cache_mb: a.kv_cache_mb,
        max_concurrent_requests: a.max_concurrent_requests,
        max_batch_prefill_tokens: a.max_batch_prefill_tokens,
        max_batch_total_tokens: a.max_batch_total_tokens,
        max_input_tokens: a.max_input_tokens,
        max_total_tokens: a.max_total_tokens,
        waiting_served_ratio: a.waiting_served_ratio,
        max_waiting_tokens: a.max_waiting_tokens,
        prefix_caching: Some(a.prefix_caching),
    };
    let (synthetic, dtype) = (a.synthetic, a.dtype);
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
    Ok(())
}

/// The model file to serve (`None` for a synthetic model) and the name the API reports; a
/// synthetic model's shape and dtype are checked here, before anything binds or loads.
fn model_source(
    m: &ModelArgs,
    synthetic: Option<&str>,
    dtype: &str,
    runtime: &fastllm::options::RuntimeOptions,
    bars: &mut Bars,
) -> Result<(Option<std::path::PathBuf>, String)> {
    match synthetic {
        Some(shape) => {
            if m.model.is_some() {
                return Err(fastllm::Error::invalid(
                    "--synthetic and -m/--model are exclusive",
                ));
            }
            fastllm::model::synthetic::config(shape)?;
            fastllm::model::synthetic::weight_dtype(dtype)?;
            Ok((None, format!("{shape}-{dtype}-synthetic")))
        }
        None => {
            let path = resolve(m.model.as_deref(), runtime, bars)?;
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok((Some(path), name))
        }
    }
}
