//! Perplexity of a model over a text, defined as llama.cpp's `llama-perplexity` defines it:
//! the whole text is tokenized once (with BOS when the tokenizer adds one), cut into
//! non-overlapping windows of `n_ctx` tokens, each window is run from an empty cache with its
//! first token replaced by BOS (when the tokenizer adds one), and only the second half of each
//! window is scored: the logits at positions `n_ctx/2 ..= n_ctx-2` predict the tokens after
//! them. PPL = exp(mean NLL) over all scored tokens; its error is the standard error of the
//! mean NLL carried through the exponential (see [`NllStats::ppl_err`]).
//!
//! [`evaluate`] hands every window's scored logits to a callback, which is how
//! [`kl`] saves them to a base file or compares them against one.

pub mod kl;
mod kl_row;
mod stats;

pub use stats::{log_softmax_row, NllStats};

use super::session::Llm;
use crate::error::{Error, Result};
use crate::model::{KvCache, Model};
use rayon::prelude::*;

/// What to measure: the window size, how many windows at most, and the tokens per forward call.
#[derive(Clone, Copy, Debug)]
pub struct PerplexityParams {
    /// Tokens per window (llama.cpp's `-c`); at least 3, so that a window scores a token.
    pub n_ctx: usize,
    /// Windows to evaluate at most (`None`: every whole window of the text).
    pub max_chunks: Option<usize>,
    /// Tokens per forward call (a window is run in calls of at most this many tokens).
    pub batch: usize,
}

impl PerplexityParams {
    /// Checks the values that need no model: `n_ctx ≥ 3`, `batch ≥ 1`, `max_chunks ≥ 1`.
    pub fn validate(&self) -> Result<()> {
        let c = self.n_ctx;
        if c < 3 {
            return Err(Error::invalid(format!(
                "context -c {c} is too small: a window scores the tokens of its second half, \
                 so -c must be at least 3"
            )));
        }
        if self.batch == 0 {
            return Err(Error::invalid("--batch must be at least 1"));
        }
        if self.max_chunks == Some(0) {
            return Err(Error::invalid("--chunks must be at least 1"));
        }
        Ok(())
    }
}

impl Default for PerplexityParams {
    fn default() -> Self {
        PerplexityParams {
            n_ctx: 512,
            max_chunks: None,
            batch: 512,
        }
    }
}

/// The windows a text is cut into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Tokens per window.
    pub n_ctx: usize,
    /// Windows evaluated.
    pub chunks: usize,
    /// Position of the first scored logit row in a window (`n_ctx / 2`).
    pub first: usize,
    /// The id that replaces each window's first token (`None` when the tokenizer adds no BOS).
    pub bos: Option<u32>,
}

impl Plan {
    /// Checks `params` against a text of `n_tokens` tokens and a model whose context holds
    /// `model_ctx` tokens, and picks the windows.
    pub fn new(
        n_tokens: usize,
        bos: Option<u32>,
        params: &PerplexityParams,
        model_ctx: usize,
    ) -> Result<Plan> {
        params.validate()?;
        let c = params.n_ctx;
        if c > model_ctx {
            return Err(Error::invalid(format!(
                "context -c {c} exceeds the model's context length of {model_ctx} tokens"
            )));
        }
        if n_tokens < c.saturating_mul(2) {
            return Err(Error::invalid(format!(
                "the text has {n_tokens} tokens; -c {c} needs at least {} (2 × c)",
                c.saturating_mul(2)
            )));
        }
        let whole = n_tokens / c;
        let chunks = params.max_chunks.map_or(whole, |m| m.min(whole));
        Ok(Plan {
            n_ctx: c,
            chunks,
            first: c / 2,
            bos,
        })
    }

    /// Tokens scored per window (`n_ctx - 1 - first`).
    pub fn scored_per_chunk(&self) -> usize {
        self.n_ctx - 1 - self.first
    }

    /// The tokens window `chunk` runs: its slice of `tokens`, first token replaced by BOS.
    pub fn window(&self, tokens: &[u32], chunk: usize) -> Result<Vec<u32>> {
        let start = chunk * self.n_ctx;
        let mut w = tokens
            .get(start..start + self.n_ctx)
            .ok_or_else(|| Error::invalid(format!("window {chunk} lies past the text's end")))?
            .to_vec();
        if let (Some(b), Some(t)) = (self.bos, w.first_mut()) {
            *t = b;
        }
        Ok(w)
    }

    /// The tokens the scored rows of window `chunk` predict (the text's, not BOS).
    pub fn targets<'a>(&self, tokens: &'a [u32], chunk: usize) -> Result<&'a [u32]> {
        let start = chunk * self.n_ctx + self.first + 1;
        tokens
            .get(start..chunk * self.n_ctx + self.n_ctx)
            .ok_or_else(|| Error::invalid(format!("window {chunk} lies past the text's end")))
    }
}

/// Tokenizes `text` as llama.cpp's perplexity tool does (BOS first when the tokenizer adds one,
/// special tokens written in the text kept as text). Returns the tokens and the BOS id that
/// replaces each window's first token (`None` when the tokenizer adds no BOS).
pub fn tokenize(llm: &Llm, text: &str) -> Result<(Vec<u32>, Option<u32>)> {
    let tokens = llm.tokenizer.encode(text, true, false)?;
    // the tokenizer adds BOS exactly when encoding the empty text with specials yields it
    let adds = llm.tokenizer.encode("", true, false)?;
    let bos = llm.tokenizer.bos_id().filter(|b| adds.first() == Some(b));
    Ok((tokens, bos))
}

/// The scored rows of one window, handed to [`evaluate`]'s callback.
pub struct ChunkScores<'a> {
    /// Window index (0-based).
    pub chunk: usize,
    /// Logits, `targets.len()` rows of `vocab` values: row `i` is the model's prediction of
    /// `targets[i]`.
    pub logits: &'a [f32],
    /// The tokens those rows predict.
    pub targets: &'a [u32],
    /// Vocabulary size (row length).
    pub vocab: usize,
    /// Each row's negative log-likelihood of its target.
    pub nll: &'a [f64],
}

/// Runs one window from an empty cache in calls of at most `batch` tokens and returns the
/// logits of positions `first ..= len-2` (the scored rows). Calls wholly before `first` keep
/// only their last row, so the unscored half costs no output projection.
pub fn scored_logits(
    model: &Model,
    cache: &mut KvCache,
    window: &[u32],
    first: usize,
    batch: usize,
) -> Result<Vec<f32>> {
    let n = window.len();
    if first + 1 >= n || batch == 0 {
        return Err(Error::invalid(format!(
            "window of {n} tokens scores nothing from position {first} (batch {batch})"
        )));
    }
    let vocab = model.config().vocab_size;
    cache.clear()?;
    let mut out = Vec::with_capacity((n - first) * vocab);
    // calls split at `first` so every call either keeps all its rows or none
    let mut start = 0;
    while start < n {
        let end = if start < first {
            (start + batch).min(first)
        } else {
            (start + batch).min(n)
        };
        let keep = start >= first;
        let l = model
            .forward(cache, &window[start..end], keep)?
            .to_f32_vec()?;
        if keep {
            out.extend_from_slice(&l);
        }
        start = end;
    }
    out.truncate((n - 1 - first) * vocab);
    if out.iter().any(|x| x.is_nan() || *x == f32::INFINITY) {
        return Err(Error::invalid("model produced NaN/Inf logits"));
    }
    Ok(out)
}

/// Each row's negative log-likelihood of its target (f64 log-softmax), rows in parallel.
pub fn row_nlls(logits: &[f32], targets: &[u32], vocab: usize) -> Result<Vec<f64>> {
    if vocab == 0 || logits.len() != targets.len() * vocab {
        return Err(Error::invalid(format!(
            "{} logits are not {} rows of {vocab}",
            logits.len(),
            targets.len()
        )));
    }
    logits
        .par_chunks(vocab)
        .zip(targets.par_iter())
        .map(|(row, &t)| {
            let x = *row.get(t as usize).ok_or_else(|| {
                Error::invalid(format!("token id {t} out of range (vocabulary {vocab})"))
            })?;
            Ok(log_softmax_row(row) - x as f64)
        })
        .collect()
}

/// Evaluates `plan`'s windows of `tokens`, calling `on_chunk` after each with its scored rows
/// and the statistics so far. Returns the statistics over every scored token.
pub fn evaluate(
    model: &Model,
    tokens: &[u32],
    plan: &Plan,
    batch: usize,
    on_chunk: &mut dyn FnMut(&ChunkScores, &NllStats) -> Result<()>,
) -> Result<NllStats> {
    let vocab = model.config().vocab_size;
    let mut cache = model.new_cache(plan.n_ctx)?;
    let mut stats = NllStats::default();
    for chunk in 0..plan.chunks {
        let window = plan.window(tokens, chunk)?;
        let targets = plan.targets(tokens, chunk)?;
        let logits = scored_logits(model, &mut cache, &window, plan.first, batch)?;
        let nll = row_nlls(&logits, targets, vocab)?;
        for &v in &nll {
            stats.add(v);
        }
        let scores = ChunkScores {
            chunk,
            logits: &logits,
            targets,
            vocab,
            nll: &nll,
        };
        on_chunk(&scores, &stats)?;
    }
    Ok(stats)
}
