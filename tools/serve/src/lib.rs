//! `fastllm serve`: a scheduler thread doing continuous batching over a paged KV cache
//! ([`engine`]) with grammar-constrained decoding ([`grammar`]), Prometheus-style metrics ([`metrics`]), an HTTP front end with OpenAI- and
//! TGI-compatible endpoints ([`http`]), and a graceful stop on SIGTERM/SIGINT ([`shutdown`]).

pub mod engine;
pub mod grammar;
pub mod http;
pub mod load;
pub mod metrics;
pub mod seed;
pub mod shutdown;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Options of `fastllm serve`.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to bind.
    pub addr: SocketAddr,
    /// Model name reported by the API.
    pub model_name: String,
    /// Bearer token required on every endpoint but /health.
    pub api_key: Option<String>,
    /// KV cache budget in MiB (0 = a quarter of available memory, at most 4 GiB).
    pub kv_cache_mb: usize,
    /// Overrides of the engine limits (None = defaults).
    pub max_concurrent_requests: Option<usize>,
    /// See [`engine::EngineConfig`].
    pub max_batch_prefill_tokens: Option<usize>,
    /// See [`engine::EngineConfig`].
    pub max_batch_total_tokens: Option<usize>,
    /// See [`engine::EngineConfig`].
    pub max_input_tokens: Option<usize>,
    /// See [`engine::EngineConfig`].
    pub max_total_tokens: Option<usize>,
    /// See [`engine::EngineConfig`].
    pub waiting_served_ratio: Option<f32>,
    /// See [`engine::EngineConfig`].
    pub max_waiting_tokens: Option<usize>,
    /// See [`engine::EngineConfig`] (None = on).
    pub prefix_caching: Option<bool>,
    /// Device the model runs on, as given to the loader (reported by the startup log and
    /// `/info`).
    pub device: String,
    /// After SIGTERM/SIGINT, how long running requests may go on before they are ended.
    pub drain_timeout: Duration,
    /// Origin allowed to call the API from a browser (`*` = any); None = no CORS headers.
    pub cors_origin: Option<String>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            model_name: String::new(),
            api_key: None,
            kv_cache_mb: 0,
            max_concurrent_requests: None,
            max_batch_prefill_tokens: None,
            max_batch_total_tokens: None,
            max_input_tokens: None,
            max_total_tokens: None,
            waiting_served_ratio: None,
            max_waiting_tokens: None,
            prefix_caching: None,
            device: "cpu".into(),
            drain_timeout: Duration::from_secs(30),
            cors_origin: None,
        }
    }
}

/// Reads the API key from `path`: its first line, surrounding whitespace removed. An unreadable
/// or empty file is an error naming the file.
pub fn read_api_key_file(path: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read --api-key-file {path}: {e}"))?;
    let key = text.lines().next().unwrap_or("").trim();
    if key.is_empty() {
        return Err(format!("--api-key-file {path}: the first line is empty"));
    }
    Ok(key.to_string())
}

impl ServeOptions {
    /// Checks the options that have no safe interpretation (a message names the bad one).
    pub fn validate(&self) -> Result<(), String> {
        if self.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return Err("--api-key must not be empty".into());
        }
        if let Some(o) = &self.cors_origin {
            http::guard::check_cors_origin(o)?;
        }
        if let Some(r) = self.waiting_served_ratio {
            if !r.is_finite() || r < 0.0 {
                return Err(format!(
                    "--waiting-served-ratio must be a finite number >= 0, got {r}"
                ));
            }
        }
        Ok(())
    }
}

/// The KV cache budget in MiB: `o`'s, or (0) a quarter of available memory, at most 4 GiB.
pub fn kv_budget_mb(o: &ServeOptions) -> usize {
    if o.kv_cache_mb > 0 {
        o.kv_cache_mb
    } else {
        default_kv_mb()
    }
}

/// The engine limits for `llm` under `o`.
pub fn engine_config(llm: &fastllm::generate::Llm, o: &ServeOptions) -> engine::EngineConfig {
    let mut c = engine::EngineConfig::for_model(llm, kv_budget_mb(o));
    if let Some(v) = o.max_concurrent_requests {
        c.max_concurrent_requests = v.max(1);
    }
    if let Some(v) = o.max_batch_prefill_tokens {
        c.max_batch_prefill_tokens = v.max(1);
    }
    if let Some(v) = o.max_batch_total_tokens {
        c.max_batch_total_tokens = v.max(1);
    }
    if let Some(v) = o.waiting_served_ratio {
        c.waiting_served_ratio = if v.is_finite() { v.max(0.0) } else { 0.0 };
    }
    if let Some(v) = o.max_waiting_tokens {
        c.max_waiting_tokens = v;
    }
    if let Some(v) = o.prefix_caching {
        c.prefix_caching = v;
    }
    if let Some(v) = o.max_total_tokens {
        c.max_total_tokens = v.clamp(2, c.max_total_tokens);
    }
    if let Some(v) = o.max_input_tokens {
        c.max_input_tokens = v.clamp(1, c.max_total_tokens - 1);
    } else {
        c.max_input_tokens = c.max_input_tokens.min(c.max_total_tokens - 1);
    }
    c
}

fn default_kv_mb() -> usize {
    let avail_kb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<usize>().ok())
                })
        })
        .unwrap_or(4 << 20);
    (avail_kb / 1024 / 4).clamp(64, 4096)
}

/// Binds, then loads the model with `load` in the background (/health answers 503 until it is
/// ready), and serves until SIGTERM or SIGINT; then drains (see [`shutdown`]).
pub fn run(
    o: ServeOptions,
    load: impl FnOnce() -> fastllm::Result<fastllm::generate::Llm> + Send + 'static,
) -> Result<(), String> {
    o.validate()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let state = http::AppState::configured(&o);
    let served = state.clone();
    let r = rt.block_on(async move {
        let state = served;
        let listener = tokio::net::TcpListener::bind(o.addr)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", o.addr))?;
        // the address bound (port 0 asks for a free one)
        let addr = listener.local_addr().unwrap_or(o.addr);
        eprintln!(
            "fastllm serve: listening on http://{addr} (model {} on {}; loading)",
            o.model_name, o.device
        );
        let st = state.clone();
        let opts = ServeOptions { addr, ..o.clone() };
        let loader = tokio::task::spawn_blocking(move || -> Result<(), String> {
            let llm = Arc::new(load().map_err(|e| e.to_string())?);
            // a budget from free memory is measured once, with the model loaded, and reported
            let from_free = opts.kv_cache_mb == 0;
            let opts = ServeOptions {
                kv_cache_mb: kv_budget_mb(&opts),
                ..opts
            };
            let cfg = engine_config(&llm, &opts);
            let line = ready_line(&opts, &cfg, from_free);
            st.set_ready(llm, cfg).map_err(|e| e.to_string())?;
            eprintln!("fastllm serve: {line}");
            Ok(())
        });
        tokio::spawn(async move {
            let r = match loader.await {
                Ok(r) => r,
                Err(e) => Err(format!("model loader failed: {e}")),
            };
            if let Err(e) = r {
                // nothing can be served without a model: report and stop the process
                eprintln!("fastllm serve: error: cannot load the model: {e}");
                std::process::exit(1);
            }
        });
        shutdown::serve(listener, state, shutdown::signal(), o.drain_timeout)
            .await
            .map_err(|e| format!("server error: {e}"))
    });
    // a model still loading must not hold the process
    rt.shutdown_background();
    // the scheduler ends its work and drops its KV pool before the process exits; the model
    // is dropped with `state`, here, not by an exit racing a scheduler thread
    state.stop_engine();
    r
}

/// The startup line once the model is loaded: address, model, device and KV budget (`o`'s,
/// taken from free memory when `from_free`).
pub fn ready_line(o: &ServeOptions, c: &engine::EngineConfig, from_free: bool) -> String {
    let kv_mb = if from_free {
        format!("{} MiB (from free memory)", o.kv_cache_mb)
    } else {
        format!("{} MiB", o.kv_cache_mb)
    };
    format!(
        "ready on http://{}: model {} on {}, KV cache {kv_mb} = {} blocks of {} tokens \
         ({} tokens, {} at {} bytes per token), up to {} concurrent requests, {} tokens per \
         request",
        o.addr,
        o.model_name,
        o.device,
        c.kv_blocks,
        c.block_size,
        c.kv_blocks * c.block_size,
        c.kv_dtype,
        c.kv_bytes_per_token,
        c.max_concurrent_requests,
        c.max_total_tokens
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_waiting_served_ratio_is_refused() {
        let mut o = ServeOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            model_name: "m".into(),
            kv_cache_mb: 16,
            ..Default::default()
        };
        assert!(o.validate().is_ok());
        for bad in [-0.5, f32::NAN, f32::INFINITY] {
            o.waiting_served_ratio = Some(bad);
            let e = o.validate().unwrap_err();
            assert!(e.contains("--waiting-served-ratio"), "{e}");
            // run() refuses before binding or loading anything
            let e = run(o.clone(), || Err(fastllm::Error::invalid("not reached"))).unwrap_err();
            assert!(e.contains("--waiting-served-ratio"), "{e}");
        }
        o.waiting_served_ratio = Some(1.2);
        assert!(o.validate().is_ok());
    }

    #[test]
    fn bad_api_key_and_cors_origin_are_refused() {
        let o = ServeOptions {
            api_key: Some("  ".into()),
            ..Default::default()
        };
        assert!(o.validate().unwrap_err().contains("--api-key"));
        for bad in ["", "example.com", "http://a b", "http://x.org/path"] {
            let o = ServeOptions {
                cors_origin: Some(bad.into()),
                ..Default::default()
            };
            let e = o.validate().unwrap_err();
            assert!(e.contains("--cors-origin"), "{bad}: {e}");
        }
        for good in ["*", "http://localhost:3000", "https://chat.example.org"] {
            let o = ServeOptions {
                cors_origin: Some(good.into()),
                ..Default::default()
            };
            assert!(o.validate().is_ok(), "{good}");
        }
    }

    #[test]
    fn api_key_file_gives_its_first_line() {
        let dir = std::env::temp_dir().join(format!("fastllm-keyfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("key");
        std::fs::write(&f, "  s3cret \nignored\n").unwrap();
        assert_eq!(read_api_key_file(f.to_str().unwrap()).unwrap(), "s3cret");
        std::fs::write(&f, "\n").unwrap();
        assert!(read_api_key_file(f.to_str().unwrap())
            .unwrap_err()
            .contains("empty"));
        let e = read_api_key_file(dir.join("missing").to_str().unwrap()).unwrap_err();
        assert!(e.contains("cannot read --api-key-file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
