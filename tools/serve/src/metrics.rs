//! Server metrics: gauges, counters and latency histograms, rendered in the Prometheus text
//! format by `GET /metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A fixed-bucket latency histogram (seconds).
pub struct Histogram {
    bounds: &'static [f64],
    counts: Mutex<(Vec<u64>, f64, u64)>,
}

/// Bucket bounds in seconds.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

impl Histogram {
    /// An empty histogram over `bounds`.
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: Mutex::new((vec![0; bounds.len()], 0.0, 0)),
        }
    }
    /// Records one observation.
    pub fn observe(&self, v: f64) {
        if let Ok(mut c) = self.counts.lock() {
            for (i, b) in self.bounds.iter().enumerate() {
                if v <= *b {
                    c.0[i] += 1;
                }
            }
            c.1 += v;
            c.2 += 1;
        }
    }
    /// Observation count.
    pub fn count(&self) -> u64 {
        self.counts.lock().map(|c| c.2).unwrap_or(0)
    }
    fn render(&self, name: &str, help: &str, out: &mut String) {
        let Ok(c) = self.counts.lock() else { return };
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        for (b, n) in self.bounds.iter().zip(&c.0) {
            out.push_str(&format!("{name}_bucket{{le=\"{b}\"}} {n}\n"));
        }
        out.push_str(&format!(
            "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}\n",
            c.2, c.1, c.2
        ));
    }
}

/// All server metrics.
pub struct Metrics {
    /// Requests waiting for admission.
    pub queue_len: AtomicU64,
    /// Sequences in the running batch.
    pub running: AtomicU64,
    /// KV blocks in use.
    pub kv_blocks_used: AtomicU64,
    /// KV blocks free (including cached blocks no request holds).
    pub kv_blocks_free: AtomicU64,
    /// Cached (prefix-cache) blocks no request holds; evicted when blocks are needed.
    pub kv_blocks_cached: AtomicU64,
    /// Prompt tokens whose prefill was skipped thanks to the prefix cache.
    pub prefix_cache_hit_tokens_total: AtomicU64,
    /// Requests received.
    pub requests_total: AtomicU64,
    /// Requests refused (429).
    pub rejected_total: AtomicU64,
    /// Generated tokens.
    pub tokens_generated_total: AtomicU64,
    /// Prompt tokens processed.
    pub prompt_tokens_total: AtomicU64,
    /// Forward steps run.
    pub steps_total: AtomicU64,
    /// Sequences fed one token in a forward step, summed over steps (divided by
    /// `steps_total`: how full the decode batches ran).
    pub one_token_rows_total: AtomicU64,
    /// Forward steps that carried a prompt chunk of two or more tokens.
    pub prefill_steps_total: AtomicU64,
    /// Microseconds the engine spent inside the model's forward steps.
    pub model_micros_total: AtomicU64,
    /// Microseconds the engine spent on everything else of its rounds that ran a step
    /// (admission, planning, sampling rows, text decoding, stop strings, sending events).
    pub scheduler_micros_total: AtomicU64,
    /// Time to first token.
    pub ttft: Histogram,
    /// Time between tokens of one request.
    pub inter_token: Histogram,
    started: std::time::Instant,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            queue_len: AtomicU64::new(0),
            running: AtomicU64::new(0),
            kv_blocks_used: AtomicU64::new(0),
            kv_blocks_free: AtomicU64::new(0),
            kv_blocks_cached: AtomicU64::new(0),
            prefix_cache_hit_tokens_total: AtomicU64::new(0),
            requests_total: AtomicU64::new(0),
            rejected_total: AtomicU64::new(0),
            tokens_generated_total: AtomicU64::new(0),
            prompt_tokens_total: AtomicU64::new(0),
            steps_total: AtomicU64::new(0),
            one_token_rows_total: AtomicU64::new(0),
            prefill_steps_total: AtomicU64::new(0),
            model_micros_total: AtomicU64::new(0),
            scheduler_micros_total: AtomicU64::new(0),
            ttft: Histogram::new(LATENCY_BUCKETS),
            inter_token: Histogram::new(LATENCY_BUCKETS),
            started: std::time::Instant::now(),
        }
    }
}

/// A gauge's or counter's name, help text and value.
type Scalar = (&'static str, &'static str, f64);

impl Metrics {
    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for (name, help, kind, v) in self.scalars() {
            s.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
            ));
        }
        self.ttft.render(
            "fastllm_time_to_first_token_seconds",
            "Time from request to first token",
            &mut s,
        );
        self.inter_token.render(
            "fastllm_inter_token_latency_seconds",
            "Time between consecutive tokens of a request",
            &mut s,
        );
        s
    }

    /// `(name, help, type, value)` of every gauge and counter.
    fn scalars(&self) -> Vec<(&'static str, &'static str, &'static str, f64)> {
        let gauges = self
            .gauges()
            .into_iter()
            .map(|(n, h, v)| (n, h, "gauge", v));
        let counters = self
            .counters()
            .into_iter()
            .map(|(n, h, v)| (n, h, "counter", v));
        gauges.chain(counters).collect()
    }

    /// `(name, help, value)` of every gauge.
    fn gauges(&self) -> [Scalar; 6] {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let up = self.started.elapsed().as_secs_f64().max(1e-9);
        [
            (
                "fastllm_queue_size",
                "Requests waiting for admission",
                g(&self.queue_len),
            ),
            (
                "fastllm_batch_size",
                "Sequences in the running batch",
                g(&self.running),
            ),
            (
                "fastllm_kv_blocks_used",
                "KV cache blocks in use",
                g(&self.kv_blocks_used),
            ),
            (
                "fastllm_kv_blocks_free",
                "KV cache blocks free",
                g(&self.kv_blocks_free),
            ),
            (
                "fastllm_kv_blocks_cached",
                "Prefix-cache blocks no request holds (counted as free; evicted on demand)",
                g(&self.kv_blocks_cached),
            ),
            (
                "fastllm_generated_tokens_per_second",
                "Mean generated tokens per second since start",
                g(&self.tokens_generated_total) / up,
            ),
        ]
    }

    /// `(name, help, value)` of every counter.
    fn counters(&self) -> [Scalar; 10] {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let secs = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-6;
        [
            (
                "fastllm_prefix_cache_hit_tokens_total",
                "Prompt tokens served from the prefix cache (prefill skipped)",
                g(&self.prefix_cache_hit_tokens_total),
            ),
            ("fastllm_requests_total", "Requests received", g(&self.requests_total)),
            (
                "fastllm_requests_rejected_total",
                "Requests refused for overload",
                g(&self.rejected_total),
            ),
            (
                "fastllm_generated_tokens_total",
                "Tokens generated",
                g(&self.tokens_generated_total),
            ),
            (
                "fastllm_prompt_tokens_total",
                "Prompt tokens processed",
                g(&self.prompt_tokens_total),
            ),
            ("fastllm_steps_total", "Batched forward steps", g(&self.steps_total)),
            (
                "fastllm_one_token_rows_total",
                "Sequences fed one token per forward step, summed over steps",
                g(&self.one_token_rows_total),
            ),
            (
                "fastllm_prefill_steps_total",
                "Forward steps that carried a prompt chunk of two or more tokens",
                g(&self.prefill_steps_total),
            ),
            (
                "fastllm_model_seconds_total",
                "Time the engine spent inside forward steps",
                secs(&self.model_micros_total),
            ),
            (
                "fastllm_scheduler_seconds_total",
                "Time the engine spent around its forward steps (planning, sampling rows, text, events)",
                secs(&self.scheduler_micros_total),
            ),
        ]
    }
}
