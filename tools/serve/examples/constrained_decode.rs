//! What constrained decoding costs: `B` sequences decode `T` tokens through the paged KV pool
//! as the serve engine runs them, once free and once under a JSON schema (a grammar mask
//! computed per pick by llguidance, applied by the sampler), alternating the two `R` times;
//! prints decode tokens/s of both, the slowdown, and the mean time of one mask.
//!
//! `cargo run --release -p fastllm-serve --example constrained_decode -- MODEL [THREADS B T R]`

use fastllm::generate::{SampleRow, TokenMask};
use fastllm::load::{load, LoadOptions};
use fastllm::model::{PagedKvPool, PagedSeqState};
use fastllm_serve::grammar::{Constraint, GrammarSpec, Grammars};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A schema that keeps a model busy with structure: a list of at least 40 small objects.
fn spec() -> GrammarSpec {
    GrammarSpec::JsonSchema(json!({"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40},
        "items": {"type": "array", "minItems": 40, "items": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 24},
            "qty": {"type": "integer", "minimum": 0, "maximum": 1000},
            "fresh": {"type": "boolean"}}, "required": ["name", "qty", "fresh"],
            "additionalProperties": false}}},
        "required": ["title", "items"], "additionalProperties": false}))
}

struct Run {
    tokens: usize,
    total: Duration,
    masks: usize,
    mask_time: Duration,
}

/// Decodes `t` tokens for each of `b` sequences after `prompt`, constrained when `g` is given
/// (a finished grammar starts over, so every step is constrained).
fn run(
    llm: &fastllm::generate::Llm,
    prompt: &[u32],
    b: usize,
    t: usize,
    g: Option<&Grammars>,
) -> Res<Run> {
    let m = &llm.model;
    let mut pool = PagedKvPool::new(m, b * (prompt.len() + t + 16).div_ceil(16) + 4, 16)?;
    let mut states: Vec<PagedSeqState> = (0..b).map(|_| PagedSeqState::new()).collect();
    let mut next: Vec<u32> = Vec::with_capacity(b);
    for st in states.iter_mut() {
        let ids = m.forward_paged_sample(&mut pool, &mut [(st, prompt)], &[SampleRow::greedy()])?;
        next.push(ids[0]);
    }
    let fresh = |g: &Grammars| -> Res<Constraint> { Ok(g.compile(&spec())?) };
    let mut cons: Vec<Option<Constraint>> = match g {
        Some(g) => (0..b).map(|_| fresh(g).map(Some)).collect::<Res<_>>()?,
        None => (0..b).map(|_| None).collect(),
    };
    let (mut masks, mut mask_time) = (0, Duration::ZERO);
    let t0 = Instant::now();
    for _ in 0..t {
        let mut rows = Vec::with_capacity(b);
        for c in cons.iter_mut() {
            let mut row = SampleRow::greedy();
            if let Some(c) = c {
                let tm = Instant::now();
                let mask: TokenMask = c.mask()?;
                mask_time += tm.elapsed();
                masks += 1;
                row.mask = Some(mask);
            }
            rows.push(row);
        }
        let toks: Vec<[u32; 1]> = next.iter().map(|&x| [x]).collect();
        let mut batch: Vec<(&mut PagedSeqState, &[u32])> = states
            .iter_mut()
            .zip(&toks)
            .map(|(s, x)| (s, &x[..]))
            .collect();
        next = m.forward_paged_sample(&mut pool, &mut batch, &rows)?;
        for (c, &tok) in cons.iter_mut().zip(&next) {
            if let (Some(c), Some(g)) = (c.as_mut(), g) {
                if llm.eos_ids().contains(&tok) || c.commit(tok).is_err() || c.is_finished() {
                    *c = fresh(g)?;
                }
            }
        }
    }
    Ok(Run {
        tokens: b * t,
        total: t0.elapsed(),
        masks,
        mask_time,
    })
}

fn main() -> Res<()> {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: usize| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let path = a
        .get(1)
        .ok_or("usage: constrained_decode MODEL [THREADS B T R]")?;
    let (threads, b, t, r) = (arg(2, 2), arg(3, 1), arg(4, 64), arg(5, 3));
    let llm = Arc::new(load(
        std::path::Path::new(path),
        &LoadOptions {
            threads,
            ..Default::default()
        },
    )?);
    let text = llm.render_chat(
        &[fastllm::generate::ChatMessage::new(
            "user",
            "List the groceries for a week as JSON.",
        )],
        true,
    )?;
    let prompt = llm.tokenizer.encode(&text, false, true)?;
    let tc = Instant::now();
    let g = Grammars::new(llm.clone())?;
    println!(
        "grammar compiler set up in {:.1} ms",
        tc.elapsed().as_secs_f64() * 1e3
    );
    let tc = Instant::now();
    g.compile(&spec())?;
    println!(
        "schema compiled in {:.2} ms",
        tc.elapsed().as_secs_f64() * 1e3
    );
    run(&llm, &prompt, b, 4, Some(&g))?; // warm-up
    let (mut free, mut cons) = (Vec::new(), Vec::new());
    for _ in 0..r {
        free.push(run(&llm, &prompt, b, t, None)?);
        cons.push(run(&llm, &prompt, b, t, Some(&g))?);
    }
    let rate = |v: &[Run]| {
        v.iter().map(|x| x.tokens).sum::<usize>() as f64
            / v.iter().map(|x| x.total.as_secs_f64()).sum::<f64>()
    };
    let (f, c) = (rate(&free), rate(&cons));
    let masks: usize = cons.iter().map(|x| x.masks).sum();
    let mt: f64 = cons.iter().map(|x| x.mask_time.as_secs_f64()).sum();
    println!(
        "B={b} T={t} threads={threads}, {r} alternating runs: free {f:.1} tok/s, constrained \
         {c:.1} tok/s ({:+.1} %), mask {:.0} µs mean over {masks}",
        (c / f - 1.0) * 100.0,
        mt / masks.max(1) as f64 * 1e6
    );
    Ok(())
}
