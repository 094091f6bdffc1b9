//! Perplexity on a tiny converted fixture model against a float64 computation of the same
//! definition made here from the model's logits, window planning and its errors, and the
//! KL-divergence base file: a round trip of one model against itself, and the mismatches it
//! must refuse.

mod common;

use fastllm::convert::convert;
use fastllm::generate::perplexity::kl::{BaseHeader, BaseReader, BaseWriter, KlStats};
use fastllm::generate::perplexity::{self, NllStats, PerplexityParams, Plan};
use fastllm::generate::Llm;
use fastllm::load::{load, LoadOptions};
use fastllm::model::Precision;
use std::path::{Path, PathBuf};

fn tmpdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-ppl-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tiny_llama() -> Llm {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let out = tmpdir().join("llama.flm");
    if !out.exists() {
        let dir = common::tiny_fixture("llama");
        convert(&dir, &out, &Default::default(), &mut |_| {}).unwrap();
    }
    let opts = LoadOptions {
        threads: 2,
        precision: Precision::Exact,
        ..Default::default()
    };
    load(&out, &opts).unwrap()
}

const TEXT: &str = "The quick brown fox jumps over the lazy dog. A perplexity tool cuts a text \
    into windows, runs each window from an empty cache and scores the second half of it. \
    Numbers like 12345 and 2026, punctuation (commas; colons: dashes - and quotes \"like this\") \
    and words of several lengths make the tokens varied enough for a small model to disagree \
    with itself now and then. Once more: the quick brown fox jumps over the lazy dog again.";

/// The perplexity definition computed independently: windows of `c` tokens with the first
/// replaced by BOS when the text starts with it, each run in one forward call, the logits of
/// positions c/2 ..= c-2 scored against the next token with an f64 log-softmax.
fn reference(llm: &Llm, tokens: &[u32], c: usize, chunks: usize) -> (f64, f64, usize) {
    let vocab = llm.model.config().vocab_size;
    let bos = llm.tokenizer.bos_id().filter(|b| tokens.first() == Some(b));
    let (mut sum, mut sum2, mut n) = (0f64, 0f64, 0usize);
    for k in 0..chunks {
        let mut w = tokens[k * c..(k + 1) * c].to_vec();
        if let Some(b) = bos {
            w[0] = b;
        }
        let mut cache = llm.model.new_cache(c).unwrap();
        let logits = llm.model.forward(&mut cache, &w, true).unwrap();
        let logits = logits.to_f32_vec().unwrap();
        for p in c / 2..c - 1 {
            let row: Vec<f64> = logits[p * vocab..(p + 1) * vocab]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            let nll = lse - row[tokens[k * c + p + 1] as usize];
            sum += nll;
            sum2 += nll * nll;
            n += 1;
        }
    }
    let mean = sum / n as f64;
    let var = sum2 / n as f64 - mean * mean;
    let ppl = mean.exp();
    (ppl, (var / (n as f64 - 1.0)).sqrt() * ppl, n)
}

fn run(llm: &Llm, tokens: &[u32], plan: &Plan, batch: usize) -> NllStats {
    perplexity::evaluate(&llm.model, tokens, plan, batch, &mut |_, _| Ok(())).unwrap()
}

#[test]
fn perplexity_matches_a_float64_reference() {
    let llm = tiny_llama();
    let (tokens, bos) = perplexity::tokenize(&llm, TEXT).unwrap();
    let c = 24;
    assert!(
        tokens.len() >= 3 * c,
        "fixture text too short: {}",
        tokens.len()
    );
    let ctx = llm.model.config().context_length;
    let params = PerplexityParams {
        n_ctx: c,
        max_chunks: None,
        batch: 512,
    };
    let plan = Plan::new(tokens.len(), bos, &params, ctx).unwrap();
    assert_eq!(plan.chunks, tokens.len() / c);
    let (want, want_err, n) = reference(&llm, &tokens, c, plan.chunks);
    // one call per half window, and awkward small calls: the same definition either way
    for batch in [512, 5, 1] {
        let got = run(&llm, &tokens, &plan, batch);
        assert_eq!(got.count, n);
        assert_eq!(got.count, plan.chunks * plan.scored_per_chunk());
        let rel = (got.ppl() - want).abs() / want;
        assert!(rel < 1e-4, "batch {batch}: PPL {} vs {want}", got.ppl());
        let err = got.ppl_err().unwrap();
        assert!(
            (err - want_err).abs() / want_err < 1e-3,
            "{err} vs {want_err}"
        );
    }
    assert!(want > 1.0 && want.is_finite());
    // --chunks limits the windows
    let two = Plan::new(
        tokens.len(),
        bos,
        &PerplexityParams {
            max_chunks: Some(2),
            ..params
        },
        ctx,
    )
    .unwrap();
    assert_eq!(two.chunks, 2);
    let (want2, _, _) = reference(&llm, &tokens, c, 2);
    assert!((run(&llm, &tokens, &two, 7).ppl() - want2).abs() / want2 < 1e-4);
}

#[test]
fn plan_errors_name_the_problem() {
    let p = |c, chunks, batch| PerplexityParams {
        n_ctx: c,
        max_chunks: chunks,
        batch,
    };
    let msg = |r: fastllm::Result<Plan>| r.unwrap_err().to_string();
    assert!(msg(Plan::new(100, None, &p(2, None, 8), 256)).contains("at least 3"));
    assert!(msg(Plan::new(100, None, &p(60, None, 8), 256)).contains("needs at least 120"));
    assert!(msg(Plan::new(1000, None, &p(512, None, 8), 256)).contains("context length of 256"));
    assert!(msg(Plan::new(100, None, &p(8, Some(0), 8), 256)).contains("--chunks"));
    assert!(msg(Plan::new(100, None, &p(8, None, 0), 256)).contains("--batch"));
    let plan = Plan::new(100, Some(7), &p(8, Some(50), 8), 256).unwrap();
    assert_eq!(
        (plan.chunks, plan.first, plan.scored_per_chunk()),
        (12, 4, 3)
    );
    let tokens: Vec<u32> = (100..200).collect();
    assert_eq!(
        plan.window(&tokens, 1).unwrap(),
        vec![7, 109, 110, 111, 112, 113, 114, 115]
    );
    assert_eq!(plan.targets(&tokens, 1).unwrap(), &[113, 114, 115]);
}

/// Runs `plan` saving a base file at `path`.
fn save_base(llm: &Llm, tokens: &[u32], plan: &Plan, path: &Path) -> NllStats {
    let vocab = llm.model.config().vocab_size;
    let header = BaseHeader::of_run(plan, tokens, vocab).unwrap();
    let mut w = BaseWriter::create(path, &header).unwrap();
    let s =
        perplexity::evaluate(&llm.model, tokens, plan, 512, &mut |s, _| w.write_chunk(s)).unwrap();
    w.finish().unwrap();
    s
}

fn compare(
    llm: &Llm,
    tokens: &[u32],
    plan: &Plan,
    path: &Path,
) -> fastllm::Result<(NllStats, KlStats)> {
    let vocab = llm.model.config().vocab_size;
    let mut r = BaseReader::open(path)?;
    r.header
        .check_matches(&BaseHeader::of_run(plan, tokens, vocab)?)?;
    let mut acc = KlStats::default();
    let s = perplexity::evaluate(&llm.model, tokens, plan, 512, &mut |s, _| {
        r.compare_chunk(s, &mut acc)
    })?;
    Ok((s, acc))
}

#[test]
fn kl_divergence_round_trip_and_mismatches() {
    let llm = tiny_llama();
    let (tokens, bos) = perplexity::tokenize(&llm, TEXT).unwrap();
    let ctx = llm.model.config().context_length;
    let params = PerplexityParams {
        n_ctx: 20,
        max_chunks: None,
        batch: 512,
    };
    let plan = Plan::new(tokens.len(), bos, &params, ctx).unwrap();
    let path = tmpdir().join("base.bin");
    let base = save_base(&llm, &tokens, &plan, &path);

    let (s, kl) = compare(&llm, &tokens, &plan, &path).unwrap();
    assert_eq!(kl.count, s.count);
    assert!(
        kl.mean_kld().abs() < 1e-5,
        "KL of a model to itself: {}",
        kl.mean_kld()
    );
    assert_eq!(kl.top1(), 1.0);
    assert!((kl.base.ppl() - base.ppl()).abs() / base.ppl() < 1e-5);
    assert!((s.ppl() - base.ppl()).abs() / base.ppl() < 1e-6);

    // another window size, fewer windows, another text: refused, naming what differs
    let other = Plan::new(
        tokens.len(),
        bos,
        &PerplexityParams {
            n_ctx: 16,
            ..params
        },
        ctx,
    )
    .unwrap();
    let e = compare(&llm, &tokens, &other, &path)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("context (-c) differs") && e.contains("20") && e.contains("16"),
        "{e}"
    );
    let fewer = Plan::new(
        tokens.len(),
        bos,
        &PerplexityParams {
            max_chunks: Some(1),
            ..params
        },
        ctx,
    )
    .unwrap();
    let e = compare(&llm, &tokens, &fewer, &path)
        .unwrap_err()
        .to_string();
    assert!(e.contains("number of windows"), "{e}");
    let mut changed = tokens.clone();
    changed[25] = (changed[25] + 1) % 300;
    let e = compare(&llm, &changed, &plan, &path)
        .unwrap_err()
        .to_string();
    assert!(e.contains("text differs: token 25"), "{e}");

    // a truncated file and a file of something else
    let bytes = std::fs::read(&path).unwrap();
    let cut = tmpdir().join("cut.bin");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    let e = compare(&llm, &tokens, &plan, &cut).unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
    let junk = tmpdir().join("junk.bin");
    std::fs::write(&junk, vec![7u8; 64]).unwrap();
    let e = compare(&llm, &tokens, &plan, &junk)
        .unwrap_err()
        .to_string();
    assert!(e.contains("wrong magic"), "{e}");
}
