//! The engine: one scheduler thread owns the model and a paged KV pool and runs steps. Each step
//! packs one decode token of every running sequence together with prompt chunks of waiting
//! ones into one batched forward (continuous batching: requests join at token boundaries and
//! leave without stalling others). Cancelled or finished requests give their blocks back at once;
//! when blocks run out, the newest sequence is preempted (its blocks freed, its tokens
//! recomputed later).

use crate::metrics::Metrics;
use fastllm::generate::{Llm, Sampler, SamplingParams};
use fastllm::model::{PagedKvPool, PagedSeqState};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
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
            max_batch_prefill_tokens: 4096,
            max_batch_total_tokens: kv_blocks * block_size,
            max_concurrent_requests: 128,
            max_input_tokens: max_total.saturating_sub(1).max(1),
            max_total_tokens: max_total,
        }
    }
}

/// Why a request finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-sequence token or stop string.
    Stop,
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
    tx: mpsc::Sender<GenRequest>,
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
        let pool = PagedKvPool::new(&llm.model, config.kv_blocks, config.block_size)?;
        let (tx, rx) = mpsc::channel();
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let sched = Scheduler {
            llm,
            pool,
            cfg: config.clone(),
            metrics: metrics.clone(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: in_flight.clone(),
            eos: Vec::new(),
        };
        std::thread::Builder::new()
            .name("fastllm-scheduler".into())
            .spawn(move || sched.run(rx))
            .map_err(|e| {
                fastllm::Error::Device(format!("cannot start the scheduler thread: {e}"))
            })?;
        Ok(Engine {
            tx,
            metrics,
            config,
            in_flight,
        })
    }

    /// The limits in force.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues a request, or refuses it.
    pub fn submit(&self, req: GenRequest) -> Result<(), SubmitError> {
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
        self.metrics.requests_total.fetch_add(1, Ordering::Relaxed);
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst);
        if n >= c.max_concurrent_requests {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.metrics.rejected_total.fetch_add(1, Ordering::Relaxed);
            return Err(SubmitError::Overloaded);
        }
        self.tx.send(req).map_err(|_| {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            SubmitError::Stopped
        })
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
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
    t_start: Instant,
    t_last: Option<Instant>,
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
}

impl Scheduler {
    fn run(mut self, rx: mpsc::Receiver<GenRequest>) {
        self.eos = self.llm.eos_ids();
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
            self.drop_cancelled();
            self.admit();
            self.publish();
            if self.running.is_empty() {
                continue;
            }
            self.step();
            self.publish();
        }
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
        self.waiting.push_back(Seq {
            n_prompt: tokens.len(),
            tokens,
            req,
            fed: 0,
            state: PagedSeqState::new(),
            sampler,
            text_sent: 0,
            text: String::new(),
            t_start: Instant::now(),
            t_last: None,
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

    /// Moves waiting sequences into the running batch while the total-token budget allows.
    fn admit(&mut self) {
        let budget = |s: &Seq| s.n_prompt + s.req.max_new_tokens;
        let mut used: usize = self.running.iter().map(budget).sum();
        while let Some(s) = self.waiting.front() {
            if !self.running.is_empty() && used + budget(s) > self.cfg.max_batch_total_tokens {
                break;
            }
            used += budget(s);
            if let Some(s) = self.waiting.pop_front() {
                self.running.push(s);
            }
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

    fn step(&mut self) {
        // plan: decode tokens first, then prompt chunks within the prefill budget and free blocks
        let plan = loop {
            let mut plan: Vec<(usize, usize)> = Vec::new(); // (running index, tokens to feed)
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
                break Vec::new();
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
            break plan;
        };
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
            return;
        }
        // run the batch
        let result = {
            let mut states: Vec<(usize, usize, PagedSeqState)> = Vec::with_capacity(plan.len());
            for &(i, n) in &plan {
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
            let r = self.llm.model.forward_paged(&mut self.pool, &mut batch);
            drop(batch);
            for (i, _, st) in states {
                self.running[i].state = st;
            }
            r
        };
        self.metrics.steps_total.fetch_add(1, Ordering::Relaxed);
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                // fail every sequence of the batch; keep serving others
                let msg = e.to_string();
                let mut idx: Vec<usize> = plan.iter().map(|p| p.0).collect();
                idx.sort_unstable_by(|a, b| b.cmp(a));
                for i in idx {
                    let s = self.running.remove(i);
                    self.finish(s, Some(Event::Error(msg.clone())));
                }
                return;
            }
        };
        let mut done: Vec<(usize, Option<Event>)> = Vec::new();
        for (&(i, n), l) in plan.iter().zip(logits) {
            let s = &mut self.running[i];
            s.fed += n;
            if s.fed < s.n_prompt {
                self.metrics
                    .prompt_tokens_total
                    .fetch_add(n as u64, Ordering::Relaxed);
                continue;
            }
            if s.fed < s.tokens.len() {
                continue; // recomputing after preemption
            }
            let history = s.tokens.clone();
            let tok = match s.sampler.sample(&l, &history) {
                Ok(t) => t,
                Err(e) => {
                    done.push((i, Some(Event::Error(e.to_string()))));
                    continue;
                }
            };
            let now = Instant::now();
            match s.t_last {
                None => self.metrics.ttft.observe((now - s.t_start).as_secs_f64()),
                Some(t) => self.metrics.inter_token.observe((now - t).as_secs_f64()),
            }
            s.t_last = Some(now);
            let n_gen = s.tokens.len() - s.n_prompt;
            if self.eos.contains(&tok) {
                done.push((
                    i,
                    Some(Event::Done {
                        reason: FinishReason::Stop,
                        prompt_tokens: s.n_prompt,
                        completion_tokens: n_gen,
                    }),
                ));
                continue;
            }
            s.tokens.push(tok);
            self.metrics
                .tokens_generated_total
                .fetch_add(1, Ordering::Relaxed);
            let n_gen = n_gen + 1;
            let gen = &s.tokens[s.n_prompt..];
            let text = self.llm.tokenizer.decode(gen, true).unwrap_or_default();
            // hold back an incomplete UTF-8 tail (decoded as U+FFFD)
            let stable = text.trim_end_matches('\u{FFFD}').len();
            s.text = text;
            let mut finish = None;
            let mut emit_to = stable;
            if let Some(cut) = s
                .req
                .stop
                .iter()
                .filter(|x| !x.is_empty())
                .filter_map(|x| s.text.find(x.as_str()))
                .min()
            {
                emit_to = cut.max(s.text_sent);
                finish = Some(FinishReason::Stop);
            } else {
                let max_stop = s.req.stop.iter().map(|x| x.len()).max().unwrap_or(0);
                if max_stop > 1 {
                    let mut c = stable.saturating_sub(max_stop - 1);
                    while c > 0 && !s.text.is_char_boundary(c) {
                        c -= 1;
                    }
                    emit_to = c.max(s.text_sent);
                }
            }
            if finish.is_none()
                && (n_gen >= s.req.max_new_tokens || s.tokens.len() >= self.cfg.max_total_tokens)
            {
                finish = Some(FinishReason::Length);
                if emit_to < stable {
                    emit_to = stable;
                }
            }
            let piece = s.text.get(s.text_sent..emit_to).unwrap_or("").to_string();
            s.text_sent = s.text_sent.max(emit_to);
            if s.req
                .events
                .send(Event::Token {
                    id: tok,
                    text: piece,
                })
                .is_err()
            {
                done.push((i, None));
                continue;
            }
            if let Some(reason) = finish {
                done.push((
                    i,
                    Some(Event::Done {
                        reason,
                        prompt_tokens: s.n_prompt,
                        completion_tokens: n_gen,
                    }),
                ));
            }
        }
        done.sort_unstable_by_key(|d| std::cmp::Reverse(d.0));
        for (i, ev) in done {
            let s = self.running.remove(i);
            self.finish(s, ev);
        }
    }
}
