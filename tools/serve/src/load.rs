//! A load generator for `fastllm bench-serve`: N concurrent streaming requests (bounded count and
//! duration) against a server on this machine, reporting requests/s, output tokens/s, time to
//! first token and inter-token latency percentiles. Plain HTTP/1.1 over `std::net` (loopback use).
//! Requests ask the server to generate past end-of-sequence tokens (`ignore_eos`) unless told
//! otherwise, so every request produces its `max_tokens`; a run that produced no tokens is an
//! error ([`LoadReport::check`]).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Load parameters.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// `host:port` of the server.
    pub addr: String,
    /// Concurrent streams.
    pub concurrency: usize,
    /// Total requests.
    pub requests: usize,
    /// Tokens per request.
    pub max_tokens: usize,
    /// Prompt text.
    pub prompt: String,
    /// Stop after this long even if requests remain.
    pub max_duration: Duration,
    /// Sampling temperature of every request (0 = greedy).
    pub temperature: f32,
    /// Nucleus of every request (1 = off).
    pub top_p: f32,
    /// Let requests end at an end-of-sequence token (else they generate `max_tokens`).
    pub stop_at_eos: bool,
}

/// Results.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    /// Completed requests.
    pub completed: usize,
    /// Failed requests.
    pub failed: usize,
    /// Wall time.
    pub seconds: f64,
    /// Output tokens (the server's count, from each stream's final usage).
    pub tokens: usize,
    /// The first failure's message.
    pub first_error: Option<String>,
    /// TTFT samples (s).
    pub ttft: Vec<f64>,
    /// Inter-token samples (s).
    pub itl: Vec<f64>,
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    s[((s.len() - 1) as f64 * p).round() as usize]
}

impl LoadReport {
    /// A one-screen summary.
    pub fn summary(&self) -> String {
        format!(
            "requests {} ok / {} failed in {:.2}s: {:.2} req/s, {:.1} output tok/s\nTTFT p50 {:.1} ms p99 {:.1} ms; inter-token p50 {:.1} ms p99 {:.1} ms",
            self.completed,
            self.failed,
            self.seconds,
            self.completed as f64 / self.seconds.max(1e-9),
            self.tokens as f64 / self.seconds.max(1e-9),
            pct(&self.ttft, 0.5) * 1e3,
            pct(&self.ttft, 0.99) * 1e3,
            pct(&self.itl, 0.5) * 1e3,
            pct(&self.itl, 0.99) * 1e3,
        )
    }
    /// An error when the run measured nothing: every request failed, or none produced a token.
    pub fn check(&self) -> Result<(), String> {
        if self.completed == 0 {
            return Err(match &self.first_error {
                Some(e) => format!("every request failed; the first: {e}"),
                None => "no request completed".into(),
            });
        }
        if self.tokens == 0 {
            return Err(
                "the requests produced no tokens (each ended at once); give a prompt the model \
                 continues, or drop --stop-at-eos"
                    .into(),
            );
        }
        Ok(())
    }
    /// Output tokens per second.
    pub fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(1e-9)
    }
    /// A percentile of inter-token latency (s).
    pub fn itl_pct(&self, p: f64) -> f64 {
        pct(&self.itl, p)
    }
}

/// The server's count of generated tokens in a stream's final chunk, if `data` is one.
fn usage_tokens(data: &str) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_str(data).ok()?;
    v.get("usage")?
        .get("completion_tokens")?
        .as_u64()
        .map(|n| n as usize)
}

/// One streaming completion; returns (ttft, inter-token gaps, tokens).
fn one(addr: &str, body: &str, deadline: Instant) -> Result<(f64, Vec<f64>, usize), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10)),
    ))
    .map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).map_err(|e| e.to_string())?;
    if !status.contains(" 200 ") {
        // the connection closes after the answer: its last line is the JSON error body
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut r, &mut rest);
        let body = rest.lines().last().unwrap_or("").trim().to_string();
        return Err(format!("HTTP status: {} {body}", status.trim()));
    }
    let (mut ttft, mut gaps, mut n, mut last) = (0.0, Vec::new(), 0usize, None::<Instant>);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            break;
        }
        let l = line.trim();
        if let Some(data) = l.strip_prefix("data: ") {
            if data == "[DONE]" {
                return Ok((ttft, gaps, n));
            }
            if let Some(u) = usage_tokens(data) {
                n = u;
            }
            if data.contains("\"text\":\"\"") {
                continue;
            }
            let now = Instant::now();
            match last {
                None => ttft = (now - t0).as_secs_f64(),
                Some(t) => gaps.push((now - t).as_secs_f64()),
            }
            last = Some(now);
        }
    }
    Err("stream ended without [DONE]".into())
}

/// Runs the load and reports.
pub fn run(o: &LoadOptions) -> LoadReport {
    let body = serde_json::json!({
        "prompt": o.prompt,
        "max_tokens": o.max_tokens,
        "temperature": o.temperature,
        "top_p": o.top_p,
        "ignore_eos": !o.stop_at_eos,
        "stream": true
    })
    .to_string();
    let report = Arc::new(Mutex::new(LoadReport::default()));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t0 = Instant::now();
    let deadline = t0 + o.max_duration;
    std::thread::scope(|sc| {
        for _ in 0..o.concurrency.max(1) {
            let (report, next, body) = (report.clone(), next.clone(), body.clone());
            sc.spawn(move || loop {
                if next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= o.requests
                    || Instant::now() >= deadline
                {
                    return;
                }
                let r = one(&o.addr, &body, deadline);
                if let Ok(mut rep) = report.lock() {
                    match r {
                        Ok((ttft, gaps, n)) => {
                            rep.completed += 1;
                            rep.tokens += n;
                            rep.ttft.push(ttft);
                            rep.itl.extend(gaps);
                        }
                        Err(e) => {
                            rep.failed += 1;
                            rep.first_error.get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    let mut rep = report.lock().map(|r| r.clone()).unwrap_or_default();
    rep.seconds = t0.elapsed().as_secs_f64();
    rep
}
