//! A long prompt's working memory on the CPU is bounded by the prefill chunk, not by the prompt:
//! the heap's peak over a `Model::forward` of many chunks' worth of tokens (into a cache reserved
//! beforehand) grows far less than the same prompt run as one step; chunked steps give the logits
//! and the cache of one step; a CPU model chunks by default, and a model whose rotation depends
//! on the length a step reaches refuses to. The heap is counted by this binary's allocator, so
//! the whole check is one test (tests of one binary run on parallel threads).

mod common;

use fastllm::convert::convert;
use fastllm::generate::Llm;
use fastllm::load::{load, LoadOptions};
use fastllm::model::CPU_PREFILL_CHUNK;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::SeqCst) + by;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are updated.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(l);
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        LIVE.fetch_sub(l.size(), Ordering::SeqCst);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = System.realloc(p, l, new);
        if !q.is_null() {
            LIVE.fetch_sub(l.size(), Ordering::SeqCst);
            grew(new);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn tiny(arch: &str) -> Llm {
    let dir = common::fixtures().join("tiny");
    let d = std::env::temp_dir().join(format!("fastllm-prefill-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let out: PathBuf = d.join(format!("{arch}.flm"));
    convert(&dir.join(arch), &out, &Default::default(), &mut |_| {}).unwrap();
    let opts = LoadOptions {
        threads: 2,
        ..Default::default()
    };
    load(&out, &opts).unwrap_or_else(|e| panic!("load {arch}: {e}"))
}

/// Pseudo-random token ids below `vocab`.
fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    let mut x = 0x9e37_79b9u32;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x % vocab as u32
        })
        .collect()
}

/// Heap bytes the forward of `n` tokens needed at its peak beyond what was live before it (the
/// cache, reserved for `n` tokens, is made first; a warm-up step sizes the thread pool's state).
fn forward_peak(llm: &Llm, n: usize) -> usize {
    let m = &llm.model;
    let toks = tokens(n, m.config().vocab_size);
    let mut warm = m.new_cache(1).unwrap();
    m.forward(&mut warm, &toks[..1], false).unwrap();
    drop(warm);
    let mut cache = m.new_cache(n).unwrap();
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    m.forward(&mut cache, &toks, false).unwrap();
    PEAK.load(Ordering::SeqCst) - base
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// All-position logits of `toks` and the logits of one decode step after them.
fn logits_and_next(llm: &Llm, toks: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let m = &llm.model;
    let mut c = m.new_cache(toks.len() + 1).unwrap();
    let all = m.forward(&mut c, toks, true).unwrap().to_f32_vec().unwrap();
    let next = m
        .forward(&mut c, &[7], false)
        .unwrap()
        .to_f32_vec()
        .unwrap();
    (all, next)
}

#[test]
fn prefill_memory_is_bounded_by_the_chunk() {
    let mut llm = tiny("llama");
    assert_eq!(llm.model.prefill_chunk(), CPU_PREFILL_CHUNK);
    let (chunk, long) = (16, 240); // the fixture's context is 256

    llm.model.set_prefill_chunk(chunk).unwrap();
    let (c_short, c_long) = (forward_peak(&llm, chunk), forward_peak(&llm, long));
    llm.model.set_prefill_chunk(0).unwrap();
    let (w_short, w_long) = (forward_peak(&llm, chunk), forward_peak(&llm, long));
    println!(
        "peak heap of a forward, {chunk} / {long} tokens: chunked {c_short} / {c_long} B, \
         one step {w_short} / {w_long} B"
    );
    let (c_growth, w_growth) = (c_long.saturating_sub(c_short), w_long - w_short);
    // one step's working tensors grow with its 15× more rows; chunked, only small per-token
    // state (the token ids and positions of the call) grows
    assert!(
        w_growth > 4 * c_short,
        "one step's peak hardly grows ({w_short} -> {w_long} B): the measurement cannot tell"
    );
    assert!(
        c_growth * 8 < w_growth,
        "chunked prefill's peak grows with the prompt: {c_short} -> {c_long} B \
         (one step: {w_short} -> {w_long} B)"
    );

    // the same logits and the same cache (the next step's logits) as one step
    let toks = tokens(100, llm.model.config().vocab_size);
    let (w_all, w_next) = logits_and_next(&llm, &toks);
    llm.model.set_prefill_chunk(chunk).unwrap();
    let (c_all, c_next) = logits_and_next(&llm, &toks);
    let (d_all, d_next) = (max_diff(&c_all, &w_all), max_diff(&c_next, &w_next));
    println!("chunked vs one step: logits {d_all:.1e}, next step {d_next:.1e}");
    assert!(d_all <= 1e-4 && d_next <= 1e-4, "{d_all} / {d_next}");
    let last = llm.model.config().vocab_size * (toks.len() - 1);
    let mut c = llm.model.new_cache(toks.len()).unwrap();
    let only_last = llm.model.forward(&mut c, &toks, false).unwrap();
    let d_last = max_diff(&only_last.to_f32_vec().unwrap(), &c_all[last..]);
    assert!(
        d_last <= 1e-4,
        "last-row logits differ from all rows' by {d_last}"
    );
    assert_eq!(c.len(), toks.len());

    // a rotation that depends on the length a step reaches sees the prompt in one step
    let mut lr = tiny("phi3-longrope");
    assert_eq!(lr.model.prefill_chunk(), 0);
    let e = lr.model.set_prefill_chunk(chunk).unwrap_err().to_string();
    assert!(e.contains("depends on the length"), "{e}");
}
