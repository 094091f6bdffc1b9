//! KL divergence against a saved base run (llama.cpp's `--kl-divergence-base` idea): one run
//! saves each scored row's top log-probabilities to a base file, a later run of another model
//! (a quantization of the same network) on the same text compares its rows against them.
//!
//! # Base file format (version 1, all integers and floats little-endian)
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `FLMKLDB\0` |
//! | 4 | u32 version = 1 |
//! | 4 | u32 vocabulary size |
//! | 4 | u32 `n_ctx` (tokens per window) |
//! | 4 | u32 windows (chunks) |
//! | 4 | u32 `K`, log-probabilities kept per row (`min(128, vocab)`) |
//! | 4 × chunks × n_ctx | the text's tokens those windows cover (u32 each, before BOS replacement) |
//! | rows | chunks × (n_ctx − 1 − n_ctx/2) rows, window by window, each `8 + 8K` bytes: |
//!
//! A row: f32 log-probability of the row's target token; f32 ln of the probability mass outside
//! the top `K` (`-inf` when `K` covers the vocabulary); then `K` pairs (u32 token id, f32
//! log-probability) in descending probability (ties: lower id first).
//!
//! The KL divergence is computed over `K + 1` outcomes, the base's top `K` tokens and "the rest":
//! `Σ_k p_k (ln p_k − ln q_k) + p_rest (ln p_rest − ln q_rest)`. That is the exact KL when `K`
//! covers the vocabulary and otherwise a lower bound of it (merging outcomes never increases
//! KL) that differs only by the rest mass's internal disagreement.

use super::kl_row::{encode_row, row_kl, RowKl};
use super::{ChunkScores, Plan};

pub use super::kl_row::KlStats;
use crate::error::{Error, Result};
use rayon::prelude::*;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// The file's first 8 bytes.
pub const MAGIC: [u8; 8] = *b"FLMKLDB\0";
/// The format version written and read.
pub const VERSION: u32 = 1;
/// Log-probabilities kept per row (fewer when the vocabulary is smaller).
pub const TOP_K: usize = 128;

const HEADER_BYTES: u64 = 8 + 5 * 4;

/// The size of a base file with this header (`None` on overflow).
fn file_bytes(n_ctx: usize, chunks: usize, top_k: usize) -> Option<u64> {
    let (c, n, k) = (n_ctx as u64, chunks as u64, top_k as u64);
    let rows = n.checked_mul(c - 1 - c / 2)?;
    let tokens = n.checked_mul(c)?.checked_mul(4)?;
    rows.checked_mul(8 + 8 * k)?
        .checked_add(tokens)?
        .checked_add(HEADER_BYTES)
}

/// What a base file was made from: checked against the comparing run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseHeader {
    /// Vocabulary size.
    pub vocab: usize,
    /// Tokens per window.
    pub n_ctx: usize,
    /// Windows saved.
    pub chunks: usize,
    /// Log-probabilities per row.
    pub top_k: usize,
    /// The text's tokens the windows cover (`chunks × n_ctx`).
    pub tokens: Vec<u32>,
}

impl BaseHeader {
    /// The header of a run of `plan` over `tokens` with a vocabulary of `vocab`.
    pub fn of_run(plan: &Plan, tokens: &[u32], vocab: usize) -> Result<BaseHeader> {
        let n = plan.chunks * plan.n_ctx;
        let covered = tokens
            .get(..n)
            .ok_or_else(|| Error::invalid("the windows lie past the text's end"))?;
        Ok(BaseHeader {
            vocab,
            n_ctx: plan.n_ctx,
            chunks: plan.chunks,
            top_k: TOP_K.min(vocab),
            tokens: covered.to_vec(),
        })
    }

    fn row_bytes(&self) -> u64 {
        8 + 8 * self.top_k as u64
    }

    /// Checks that `run` (the comparing run's header) matches this base, naming what differs.
    pub fn check_matches(&self, run: &BaseHeader) -> Result<()> {
        let differs = |what: &str, base: usize, now: usize| {
            Err(Error::invalid(format!(
                "KL-divergence base: {what} differs: the base file has {base}, this run {now}"
            )))
        };
        if self.vocab != run.vocab {
            return differs("vocabulary size", self.vocab, run.vocab);
        }
        if self.n_ctx != run.n_ctx {
            return differs("context (-c)", self.n_ctx, run.n_ctx);
        }
        if self.chunks != run.chunks {
            return differs(
                "number of windows (--chunks or text length)",
                self.chunks,
                run.chunks,
            );
        }
        if let Some(i) = (0..self.tokens.len()).find(|&i| self.tokens.get(i) != run.tokens.get(i)) {
            return Err(Error::invalid(format!(
                "KL-divergence base: the text differs: token {i} is {} in the base file, {} in \
                 this run (another text or tokenizer)",
                self.tokens[i],
                run.tokens.get(i).map_or("absent".into(), |t| t.to_string())
            )));
        }
        Ok(())
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(path.display(), e)
}

/// Writes a base file window by window.
pub struct BaseWriter {
    w: BufWriter<File>,
    path: PathBuf,
    top_k: usize,
}

impl BaseWriter {
    /// Creates `path` (replacing it) and writes `header`.
    pub fn create(path: &Path, header: &BaseHeader) -> Result<BaseWriter> {
        let f = File::create(path).map_err(io_err(path))?;
        let mut w = BufWriter::new(f);
        let mut head = Vec::with_capacity(HEADER_BYTES as usize + 4 * header.tokens.len());
        head.extend_from_slice(&MAGIC);
        for v in [
            VERSION as usize,
            header.vocab,
            header.n_ctx,
            header.chunks,
            header.top_k,
        ] {
            head.extend_from_slice(&u32_of(v)?.to_le_bytes());
        }
        header
            .tokens
            .iter()
            .for_each(|t| head.extend_from_slice(&t.to_le_bytes()));
        w.write_all(&head).map_err(io_err(path))?;
        Ok(BaseWriter {
            w,
            path: path.to_path_buf(),
            top_k: header.top_k,
        })
    }

    /// Appends one window's rows.
    pub fn write_chunk(&mut self, s: &ChunkScores) -> Result<()> {
        let k = self.top_k;
        let rows: Vec<Vec<u8>> = s
            .logits
            .par_chunks(s.vocab)
            .zip(s.nll.par_iter())
            .map(|(row, &nll)| encode_row(row, nll, k))
            .collect();
        for r in rows {
            self.w.write_all(&r).map_err(io_err(&self.path))?;
        }
        Ok(())
    }

    /// Flushes the file.
    pub fn finish(mut self) -> Result<()> {
        self.w.flush().map_err(io_err(&self.path))
    }
}

fn u32_of(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::invalid(format!("{v} does not fit the base file's u32")))
}

/// Reads a base file window by window.
pub struct BaseReader {
    r: BufReader<File>,
    path: PathBuf,
    /// What the file was made from.
    pub header: BaseHeader,
}

fn read_u32(r: &mut impl Read, path: &Path) -> Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b).map_err(io_err(path))?;
    Ok(u32::from_le_bytes(b))
}

impl BaseReader {
    /// Opens `path` and reads its header; a wrong magic, version or size is an error.
    pub fn open(path: &Path) -> Result<BaseReader> {
        let f = File::open(path).map_err(io_err(path))?;
        let size = f.metadata().map_err(io_err(path))?.len();
        let bad = |why: String| {
            Error::invalid(format!(
                "{}: not a usable KL-divergence base file: {why}",
                path.display()
            ))
        };
        if size < HEADER_BYTES {
            return Err(bad(format!("{size} bytes is shorter than the header")));
        }
        let mut r = BufReader::new(f);
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic).map_err(io_err(path))?;
        if magic != MAGIC {
            return Err(bad(
                "wrong magic (write one with --kl-divergence-base FILE --save)".into(),
            ));
        }
        let version = read_u32(&mut r, path)?;
        if version != VERSION {
            return Err(bad(format!(
                "version {version}, this build reads {VERSION}"
            )));
        }
        let mut f = [0usize; 4];
        for v in f.iter_mut() {
            *v = read_u32(&mut r, path)? as usize;
        }
        let [vocab, n_ctx, chunks, top_k] = f;
        if n_ctx < 3 || top_k == 0 || top_k > vocab {
            return Err(bad(format!(
                "inconsistent header (n_ctx {n_ctx}, K {top_k}, vocab {vocab})"
            )));
        }
        let want = file_bytes(n_ctx, chunks, top_k);
        if want != Some(size) {
            return Err(bad(format!(
                "{size} bytes, but its header describes {} (truncated or not a base file)",
                want.map_or("more than fits a u64".into(), |w| w.to_string())
            )));
        }
        let mut tokens = vec![0u32; chunks * n_ctx];
        for t in tokens.iter_mut() {
            *t = read_u32(&mut r, path)?;
        }
        let header = BaseHeader {
            vocab,
            n_ctx,
            chunks,
            top_k,
            tokens,
        };
        Ok(BaseReader {
            r,
            path: path.to_path_buf(),
            header,
        })
    }

    /// Compares one window's rows against the file's next rows, adding to `acc`.
    pub fn compare_chunk(&mut self, s: &ChunkScores, acc: &mut KlStats) -> Result<()> {
        let rb = self.header.row_bytes() as usize;
        let rows = s.nll.len();
        let mut buf = vec![0u8; rb * rows];
        self.r.read_exact(&mut buf).map_err(io_err(&self.path))?;
        let per_row: Vec<RowKl> = s
            .logits
            .par_chunks(s.vocab)
            .zip(buf.par_chunks(rb))
            .map(|(row, rec)| row_kl(row, rec))
            .collect();
        for r in per_row {
            acc.add(&r);
        }
        Ok(())
    }
}
