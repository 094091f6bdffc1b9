//! Steps over the paged KV pool: a batch of sequences, each with a prompt chunk or one decode
//! token, run in one step ([`Model::forward_paged`] and its greedy, sampled and log-probability
//! forms). A step's blocks are reserved up front, its rows gathered into a [`PagedBatch`], and
//! it runs on a padded decode bucket (`model::paged_graph`), on a tensor-parallel group's ranks,
//! or op by op through `PagedAttention`.

use super::logprobs::{pick_logprobs, PickLogprobs};
use super::paged::{PagedKvPool, PagedSeqState};
use super::paged_batch::PagedBatch;
use super::sampler::SampleRow;
use super::step_kv::PagedIndex;
use super::transformer::{bad, to_host, KvSource, Model, Scratch};
use crate::data::{Data, DataType};
use crate::error::{Error, Result};
use crate::ops;
use std::sync::Arc;

impl Model {
    /// Runs one step for a batch of sequences whose KV caches live in a paged pool: each item
    /// gives its sequence state and its new tokens (a prompt chunk or one decode token).
    /// Blocks are allocated from the pool as needed (`Err` when it is exhausted, with nothing
    /// changed). Returns the logits after each item's last token.
    pub fn forward_paged(
        &self,
        pool: &mut PagedKvPool,
        batch: &mut [(&mut PagedSeqState, &[u32])],
    ) -> Result<Vec<Vec<f32>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        match self.run_paged(pool, batch, PagedMode::Logits)? {
            PagedOut::Logits(logits) => {
                let vocab = self.config.vocab_size;
                let rows_out = |v: &[f32]| v.chunks(vocab).map(|r| r.to_vec()).collect();
                if logits.is_contiguous() {
                    let v = logits.as_f32()?;
                    Ok(rows_out(v.get(..logits.count()).unwrap_or(v)))
                } else {
                    Ok(rows_out(&logits.to_f32_vec()?))
                }
            }
            _ => Err(Error::invalid("forward_paged: got ids, not logits")),
        }
    }

    /// [`Model::forward_paged`] followed by greedy selection: returns the argmax token after
    /// each item's last token (lowest id on ties, like the sampler's greedy). On a GPU the
    /// argmax runs there and only the ids come back (not rows × vocabulary logits). Where the
    /// logits are on the host, NaN or +Inf logits are an `Err` as in the sampler; on a GPU they
    /// are not inspected.
    pub fn forward_paged_greedy(
        &self,
        pool: &mut PagedKvPool,
        batch: &mut [(&mut PagedSeqState, &[u32])],
    ) -> Result<Vec<u32>> {
        self.paged_ids(pool, batch, PagedMode::Greedy)
    }

    /// [`Model::forward_paged`] followed by a pick per item with `rows[i]` (temperature,
    /// top-k, top-p, min-p, penalties, the item's random word; see [`Model::sample_rows`]):
    /// returns the token after each item's last token. On a GPU the selection runs there and
    /// only the ids come back; on the host it is the same selection, so the ids are the same
    /// for the same logits. NaN or +Inf logits (or only -Inf) in a row are an `Err`.
    pub fn forward_paged_sample(
        &self,
        pool: &mut PagedKvPool,
        batch: &mut [(&mut PagedSeqState, &[u32])],
        rows: &[SampleRow],
    ) -> Result<Vec<u32>> {
        if !batch.is_empty() {
            check_sample_rows("forward_paged_sample", rows, batch.len())?;
        }
        self.paged_ids(pool, batch, PagedMode::Sample(rows))
    }

    /// The ids a paged step picks in `mode` (greedy or sampled; none for an empty batch).
    fn paged_ids(
        &self,
        pool: &mut PagedKvPool,
        batch: &mut [(&mut PagedSeqState, &[u32])],
        mode: PagedMode,
    ) -> Result<Vec<u32>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        match self.run_paged(pool, batch, mode)? {
            PagedOut::Ids(ids) => Ok(ids),
            _ => Err(Error::invalid("paged step: got logits, not ids")),
        }
    }

    /// [`Model::forward_paged_sample`] that also gives each pick's log-probability and the
    /// `top_n` most likely tokens of each row, computed on the logits' device
    /// ([`super::logprobs`]).
    pub fn forward_paged_sample_logprobs(
        &self,
        pool: &mut PagedKvPool,
        batch: &mut [(&mut PagedSeqState, &[u32])],
        rows: &[SampleRow],
        top_n: usize,
    ) -> Result<(Vec<u32>, Vec<PickLogprobs>)> {
        if batch.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        check_sample_rows("forward_paged_sample_logprobs", rows, batch.len())?;
        if top_n > self.config.vocab_size {
            return Err(Error::invalid(format!(
                "top {top_n} exceeds the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        match self.run_paged(pool, batch, PagedMode::SampleLogprobs(rows, top_n))? {
            PagedOut::IdsLogprobs(ids, lp) => Ok((ids, lp)),
            _ => Err(Error::invalid(
                "forward_paged_sample_logprobs: got no logprobs",
            )),
        }
    }

    /// Runs one paged step over `batch` (blocks reserved, rows gathered, the step taken on the
    /// recorded bucket, the group or op by op) and returns what `mode` asks for; the items'
    /// lengths advance only when the step succeeded.
    fn run_paged(
        &self,
        pool: &mut PagedKvPool,
        batch: &mut [(&mut PagedSeqState, &[u32])],
        mode: PagedMode,
    ) -> Result<PagedOut> {
        if batch.is_empty() {
            return Err(Error::invalid("paged step: empty batch"));
        }
        self.reserve_blocks(pool, batch)?;
        let step = gather(pool.block_size, batch);
        let bucket = match mode {
            PagedMode::SampleLogprobs(..) => None,
            _ => self.decode_bucket(&step),
        };
        let out = match (self.group(), &pool.remote, bucket) {
            (None, None, Some(rows)) => {
                let logits = self.paged_decode_step(pool, &step, rows)?;
                self.pick_padded(logits, mode, step.seqs)?
            }
            (Some(g), Some(r), _) if Arc::ptr_eq(r.group(), g) => {
                if mode.greedy() {
                    PagedOut::Ids(g.forward_paged_greedy(r, &step)?)
                } else {
                    self.pick(g.forward_paged(r, &step)?, mode)?
                }
            }
            (None, None, None) => {
                let logits = self.paged_step_device(pool, &step)?;
                self.pick(logits, mode)?
            }
            _ => return Err(Error::invalid("paged KV pool belongs to another model")),
        };
        for (st, toks) in batch.iter_mut() {
            st.len += toks.len();
            pool.commit(st, toks);
        }
        Ok(out)
    }

    /// Checks a paged step against the pool and the model (the pool's shapes, each item's
    /// tokens and context, no write into a shared or cached block) and gives every item the
    /// blocks its new tokens need; nothing is allocated unless all of them fit.
    fn reserve_blocks(
        &self,
        pool: &mut PagedKvPool,
        batch: &mut [(&mut PagedSeqState, &[u32])],
    ) -> Result<()> {
        let c = &self.config;
        if (pool.remote.is_none() && pool.k.len() != c.num_layers)
            || pool.nkv != c.num_kv_heads
            || pool.head_dim != c.head_dim
        {
            return Err(Error::invalid("paged KV pool belongs to another model"));
        }
        let bs = pool.block_size;
        let mut need = 0usize;
        for (st, toks) in batch.iter() {
            if toks.is_empty() {
                return Err(Error::invalid("forward_paged: an item has no tokens"));
            }
            self.check_tokens(toks)?;
            if st.len + toks.len() > c.context_length {
                return Err(Error::ContextFull(format!(
                    "{} cached + {} new tokens exceed the context of {}",
                    st.len,
                    toks.len(),
                    c.context_length
                )));
            }
            need += (st.len + toks.len())
                .div_ceil(bs)
                .saturating_sub(st.blocks.len());
            // never write into a block another sequence can read (prefix cache)
            if let Some(held) = st.blocks.get(st.len / bs..) {
                if let Some(b) = held.iter().find(|&&b| !pool.writable(b)) {
                    return Err(Error::invalid(format!(
                        "paged KV pool: block {b} is shared or cached and cannot be written"
                    )));
                }
            }
        }
        if need > pool.free_blocks() {
            return Err(Error::OutOfMemory(format!(
                "paged KV pool: {need} blocks needed, {} free",
                pool.free_blocks()
            )));
        }
        for (st, toks) in batch.iter_mut() {
            while st.blocks.len() < (st.len + toks.len()).div_ceil(bs) {
                match pool.alloc() {
                    Some(b) => st.blocks.push(b),
                    None => return Err(Error::OutOfMemory("paged KV pool exhausted".into())),
                }
            }
        }
        Ok(())
    }

    /// The tokens (or host logits) `mode` asks for from a step's logits rows.
    fn pick(&self, logits: Data, mode: PagedMode) -> Result<PagedOut> {
        Ok(match mode {
            PagedMode::Greedy => PagedOut::Ids(self.argmax_rows(logits)?),
            PagedMode::Sample(rows) => PagedOut::Ids(self.sample_rows(&logits, rows)?),
            PagedMode::SampleLogprobs(rows, top_n) => {
                let ids = self.sample_rows(&logits, rows)?;
                let lp = pick_logprobs(&self.exec, &logits, &ids, top_n)?;
                PagedOut::IdsLogprobs(ids, lp)
            }
            PagedMode::Logits => PagedOut::Logits(to_host(logits)?),
        })
    }

    /// [`Model::pick`] over the first `n` rows of a padded decode step's `logits` (the padding
    /// rows are picked greedily and dropped).
    fn pick_padded(&self, logits: &Data, mode: PagedMode, n: usize) -> Result<PagedOut> {
        let vocab = self.config.vocab_size;
        let rows = logits.dim(0);
        match mode {
            PagedMode::Greedy => self.argmax_padded(logits, n),
            PagedMode::Sample(r) => {
                let mut all = r.to_vec();
                all.resize(rows, SampleRow::greedy());
                let mut ids = self.sample_rows(logits, &all)?;
                ids.truncate(n);
                Ok(PagedOut::Ids(ids))
            }
            PagedMode::Logits => {
                let host = logits.to_owned_host()?;
                let v = host.as_f32()?.get(..n * vocab).unwrap_or(&[]).to_vec();
                Ok(PagedOut::Logits(Data::from_f32(&[n, vocab], &v)?))
            }
            PagedMode::SampleLogprobs(..) => Err(Error::invalid(
                "padded decode step: log-probabilities run op by op",
            )),
        }
    }

    /// The argmax of each of the first `n` rows of a padded step's `logits` (lowest id on
    /// ties), computed where the logits are; only the ids come back.
    fn argmax_padded(&self, logits: &Data, n: usize) -> Result<PagedOut> {
        let mut ids = Data::empty(DataType::I32);
        ops::argmax(&self.exec, logits, &mut ids)?;
        let ids = to_host(ids)?;
        let ids = ids.as_i32()?.get(..n).unwrap_or(&[]).to_vec();
        let ids: Result<Vec<u32>> = ids
            .iter()
            .map(|&t| u32::try_from(t).map_err(|_| bad("ArgMax returned a negative id")))
            .collect();
        Ok(PagedOut::Ids(ids?))
    }

    /// Runs one planned paged step over `pool`'s storage (blocks already assigned); the logits
    /// are left where the last op wrote them.
    pub(super) fn paged_step_device(&self, pool: &mut PagedKvPool, b: &PagedBatch) -> Result<Data> {
        let index = PagedIndex {
            slots: Data::from_i32(&[b.slots.len()], &b.slots)?,
            q_starts: Data::from_i32(&[b.q_starts.len()], &b.q_starts)?,
            kv_lens: Data::from_i32(&[b.kv_lens.len()], &b.kv_lens)?,
            tables: Data::from_i32(&[b.seqs, b.max_blocks], &b.table)?,
            block_size: pool.block_size,
        };
        let mut scratch = Scratch::default();
        let runs: Vec<usize> = b.q_starts.iter().map(|&r| r.max(0) as usize).collect();
        let kv = KvSource::Paged(&mut pool.k, &mut pool.v, &index);
        self.forward_rows(&b.tokens, &b.pos, &b.rows, &runs, kv, &mut scratch)
    }
}

/// What a paged step returns: the logits rows, or the argmax of each row, or a sampled token
/// per row.
#[derive(Clone, Copy)]
enum PagedMode<'a> {
    Logits,
    Greedy,
    Sample(&'a [SampleRow]),
    /// Sampled, with log-probabilities and the top n of each row.
    SampleLogprobs(&'a [SampleRow], usize),
}

impl PagedMode<'_> {
    /// Every row picks its argmax (greedy, or sampled rows at temperature 0 with neither
    /// penalties nor a grammar mask).
    fn greedy(&self) -> bool {
        match self {
            PagedMode::Greedy => true,
            PagedMode::Sample(rows) => rows
                .iter()
                .all(|r| r.temperature <= 0.0 && r.penalties.is_none() && r.mask.is_none()),
            _ => false,
        }
    }
}

/// What a paged step returns: the logits rows, or (greedy, sampled) one id per row.
enum PagedOut {
    Logits(Data),
    Ids(Vec<u32>),
    IdsLogprobs(Vec<u32>, Vec<PickLogprobs>),
}

/// `Err` unless there is one sampling row per batch item.
fn check_sample_rows(what: &str, rows: &[SampleRow], items: usize) -> Result<()> {
    if rows.len() != items {
        return Err(Error::invalid(format!(
            "{what}: {} sampling rows for {items} items",
            rows.len()
        )));
    }
    Ok(())
}

/// The rows of a step over `batch` (blocks already reserved, `block_size` tokens each):
/// every item's new tokens with their positions and cache slots, where each item's rows
/// start, its key count after the step, its last row, and the block tables padded to the
/// longest.
fn gather(bs: usize, batch: &[(&mut PagedSeqState, &[u32])]) -> PagedBatch {
    let mut tokens = Vec::new();
    let mut pos = Vec::new();
    let mut slots = Vec::new();
    let mut q_starts = vec![0i32];
    let mut kv_lens = Vec::new();
    let mut rows = Vec::new();
    let max_blocks = batch
        .iter()
        .map(|(st, _)| st.blocks.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let mut table = vec![0i32; batch.len() * max_blocks];
    for (i, (st, toks)) in batch.iter().enumerate() {
        for (k, &t) in toks.iter().enumerate() {
            let p = st.len + k;
            tokens.push(t);
            pos.push(p as i32);
            slots.push((st.blocks[p / bs] as usize * bs + p % bs) as i32);
        }
        q_starts.push(tokens.len() as i32);
        kv_lens.push((st.len + toks.len()) as i32);
        rows.push(tokens.len() as i32 - 1);
        for (b, &id) in st.blocks.iter().enumerate() {
            table[i * max_blocks + b] = id as i32;
        }
    }
    PagedBatch {
        tokens,
        pos,
        rows,
        slots,
        q_starts,
        kv_lens,
        table,
        seqs: batch.len(),
        max_blocks,
    }
}
