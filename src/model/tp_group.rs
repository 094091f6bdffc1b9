//! The driver's side of a tensor-parallel group ([`TpGroup`]): it sends every rank the same
//! step in lock step over their links, gathers the ranks' logits (or best candidates) into the
//! whole vocabulary's, notices a rank that failed alone, and holds the caches and pools that
//! live on the ranks (`RemoteCache`, `RemotePool`). Also what a rank's model needs to know
//! about its group (`RankTp`). The ranks themselves are built and run by
//! `model::tensor_parallel` (threads) and `model::tp_process` (processes).

use super::paged_batch::{BatchDecode, PagedBatch};
use super::shard::ShardPlan;
use super::tp_link::{Cmd, Link, RankLogits, RankTop, Reply};
use crate::data::Data;
use crate::error::{Error, Result};
use crate::parallel::Collective;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What a rank's model needs to know about its group.
pub(crate) struct RankTp {
    /// The all-reduce.
    pub comm: Arc<dyn Collective>,
    /// An all-reduce follows o_proj (attention is split).
    pub reduce_attention: bool,
    /// `fast` row-parallel products may be all-reduced in their half tensor-core form (no
    /// row-parallel layer has a bias, which rank 0 alone would add in f32).
    pub half_partials: bool,
    /// ALiBi: (global head count, first local head).
    pub alibi_heads: (usize, usize),
}

/// The ranks of a tensor-parallel group, each a worker thread owning its model and its KV
/// caches, driven in lock step (see the module docs).
pub struct TpGroup {
    plan: ShardPlan,
    /// How the first rank runs batched decode steps (the driver reports it).
    batch_decode: BatchDecode,
    links: Mutex<Vec<Link>>,
    /// Why the group stopped, once a rank failed in a way that leaves the ranks out of step.
    failure: Mutex<Option<String>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next_id: AtomicU64,
    label: String,
}

/// Whether a group stopped, without keeping it alive (see `Model::group_health`).
pub struct GroupHealth(std::sync::Weak<TpGroup>);

impl GroupHealth {
    pub(crate) fn of(g: &Arc<TpGroup>) -> GroupHealth {
        GroupHealth(Arc::downgrade(g))
    }
    /// `Some(why)` once the group stopped; `None` while it runs.
    pub fn failure(&self) -> Option<String> {
        self.0.upgrade().and_then(|g| g.failure())
    }
    /// Whether the group still exists (its model was not dropped).
    pub fn exists(&self) -> bool {
        self.0.strong_count() > 0
    }
}

/// `e` with `what: ` in front of its message, same variant (so the status code is kept).
pub(crate) fn prefixed(what: &str, e: Error) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
        Error::Unsupported(m) => Error::Unsupported(format!("{what}: {m}")),
        Error::Device(m) => Error::Device(format!("{what}: {m}")),
        Error::OutOfMemory(m) => Error::OutOfMemory(format!("{what}: {m}")),
        Error::ContextFull(m) => Error::ContextFull(format!("{what}: {m}")),
        other => other,
    }
}

pub(super) fn stopped(r: usize) -> Error {
    Error::Device(format!("tensor-parallel rank {r} stopped"))
}

impl TpGroup {
    /// A group over `links` to its ranks in rank order (`threads` the workers of those that
    /// run in this process), whose first rank runs batched decode steps in `batch_decode`.
    pub(super) fn new(
        plan: ShardPlan,
        batch_decode: BatchDecode,
        links: Vec<Link>,
        threads: Vec<JoinHandle<()>>,
        label: &str,
    ) -> TpGroup {
        TpGroup {
            plan,
            batch_decode,
            links: Mutex::new(links),
            failure: Mutex::new(None),
            threads: Mutex::new(threads),
            next_id: AtomicU64::new(1),
            label: label.to_string(),
        }
    }

    /// The plan.
    pub fn plan(&self) -> &ShardPlan {
        &self.plan
    }

    /// How the ranks run paged steps of one token per sequence (the first rank's mode).
    pub fn batch_decode(&self) -> BatchDecode {
        self.batch_decode
    }

    /// What the ranks run on, e.g. `cuda:0,1`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Why the group stopped, if a rank failed and left the others out of step (a rank of
    /// another process that disconnected, or an error on some ranks but not all).
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }

    /// Marks the group stopped and tells the ranks of other processes why (they exit).
    fn fail(&self, links: &[Link], why: String) -> Error {
        for l in links {
            if let Link::Remote(r) = l {
                r.abort(&why);
            }
        }
        if let Ok(mut f) = self.failure.lock() {
            f.get_or_insert(why.clone());
        }
        Error::Device(format!("tensor-parallel group stopped: {why}"))
    }

    fn all(&self, make: impl Fn(usize) -> Cmd) -> Result<Vec<Reply>> {
        let links = self
            .links
            .lock()
            .map_err(|_| Error::Device("tensor-parallel group poisoned".into()))?;
        if let Some(why) = self.failure() {
            return Err(Error::Device(format!(
                "tensor-parallel group stopped: {why}"
            )));
        }
        for (r, l) in links.iter().enumerate() {
            if let Err(e) = l.send(make(r)) {
                return Err(self.fail(&links, format!("{} rank {r}: {e}", self.label)));
            }
        }
        let mut replies = Vec::with_capacity(links.len());
        let mut lost = None;
        for (r, l) in links.iter().enumerate() {
            match l.recv() {
                Ok(rep) => replies.push(rep),
                Err(e) => {
                    lost.get_or_insert(format!("{} rank {r}: {e}", self.label));
                }
            }
        }
        if let Some(why) = lost {
            return Err(self.fail(&links, why));
        }
        let failed = replies.iter().filter(|r| r.is_err()).count();
        if failed > 0 && failed < replies.len() {
            // Some ranks ran the step and some did not: their caches disagree from now on.
            let (r, e) = replies
                .iter()
                .enumerate()
                .find_map(|(r, rep)| rep.err_text().map(|e| (r, e)))
                .unwrap_or((0, String::new()));
            return Err(self.fail(&links, format!("{} rank {r} failed alone: {e}", self.label)));
        }
        Ok(replies)
    }

    fn done(replies: Vec<Reply>) -> Result<()> {
        for r in replies {
            match r {
                Reply::Done(r) => r?,
                _ => return Err(Error::invalid("unexpected rank reply")),
            }
        }
        Ok(())
    }

    /// A KV cache of `cap` tokens on every rank.
    pub(crate) fn new_cache(self: &Arc<Self>, cap: usize) -> Result<RemoteCache> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        Self::done(self.all(|_| Cmd::NewCache { id, cap })?)?;
        Ok(RemoteCache {
            group: self.clone(),
            id,
        })
    }

    fn truncate(&self, id: u64, len: usize) -> Result<()> {
        Self::done(self.all(|_| Cmd::Truncate { id, len })?)
    }

    fn free(&self, id: u64, pool: bool) {
        if let Ok(links) = self.links.lock() {
            for l in links.iter() {
                let _ = l.send(if pool {
                    Cmd::FreePool { id }
                } else {
                    Cmd::Free { id }
                });
            }
        }
    }

    /// A paged KV pool of `blocks` blocks of `block_size` tokens on every rank.
    pub(crate) fn new_pool(
        self: &Arc<Self>,
        blocks: usize,
        block_size: usize,
    ) -> Result<RemotePool> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        Self::done(self.all(|_| Cmd::NewPool {
            id,
            blocks,
            block_size,
        })?)?;
        Ok(RemotePool {
            group: self.clone(),
            id,
        })
    }

    /// The ranks' replies to the paged step `b` over `pool` (each rank given its own token
    /// ids), their logits or, with `top`, their best candidates.
    fn paged(&self, pool: &RemotePool, b: &PagedBatch, top: bool) -> Result<Vec<Reply>> {
        let id = pool.id;
        self.all(|r| Cmd::Paged {
            id,
            batch: PagedBatch {
                tokens: self.plan.local_ids(r, &b.tokens),
                ..b.clone()
            },
            top,
        })
    }

    /// Runs a planned paged step on every rank and gathers the logits.
    pub(crate) fn forward_paged(&self, pool: &RemotePool, b: &PagedBatch) -> Result<Data> {
        let replies = self.paged(pool, b, false)?;
        let mut parts = Vec::with_capacity(replies.len());
        for (r, rep) in replies.into_iter().enumerate() {
            match rep {
                Reply::Logits(Ok(p)) => parts.push(p),
                Reply::Logits(Err(e)) => {
                    return Err(prefixed(&format!("{} rank {r}", self.label), e))
                }
                _ => return Err(Error::invalid("unexpected rank reply")),
            }
        }
        gather_logits(&self.plan, &parts)
    }

    /// Runs `tokens` on every rank after cache `cache`'s `before` tokens and gathers the
    /// logits [rows, vocab] on the host. On an error every rank is rewound to `before`.
    pub(crate) fn forward(
        &self,
        cache: &RemoteCache,
        before: usize,
        tokens: &[u32],
        all: bool,
    ) -> Result<Data> {
        let id = cache.id;
        let replies = self.all(|r| Cmd::Forward {
            id,
            tokens: self.plan.local_ids(r, tokens),
            all,
            top: false,
        })?;
        let mut parts = Vec::with_capacity(replies.len());
        let mut err = None;
        for (r, rep) in replies.into_iter().enumerate() {
            match rep {
                Reply::Logits(Ok(p)) => parts.push(p),
                Reply::Logits(Err(e)) => {
                    err.get_or_insert(prefixed(&format!("{} rank {r}", self.label), e));
                }
                _ => {
                    err.get_or_insert(Error::invalid("unexpected rank reply"));
                }
            }
        }
        if let Some(e) = err {
            let _ = self.truncate(id, before);
            return Err(e);
        }
        gather_logits(&self.plan, &parts)
    }
}

impl TpGroup {
    /// Runs a planned paged step on every rank and picks each row's token greedily from the
    /// ranks' best candidates (only one (index, logit) pair per row and rank crosses to the
    /// host, not the logits).
    pub(crate) fn forward_paged_greedy(
        &self,
        pool: &RemotePool,
        b: &PagedBatch,
    ) -> Result<Vec<u32>> {
        let replies = self.paged(pool, b, true)?;
        let parts = self.tops(replies)?;
        combine_top(&self.plan, &parts)
    }

    /// Runs `tokens` on every rank after cache `cache`'s `before` tokens and picks the token
    /// after the last one greedily, as [`TpGroup::forward_paged_greedy`]. On an error every
    /// rank is rewound to `before`.
    pub(crate) fn forward_greedy(
        &self,
        cache: &RemoteCache,
        before: usize,
        tokens: &[u32],
    ) -> Result<u32> {
        let id = cache.id;
        let replies = self.all(|r| Cmd::Forward {
            id,
            tokens: self.plan.local_ids(r, tokens),
            all: false,
            top: true,
        })?;
        match self
            .tops(replies)
            .and_then(|parts| combine_top(&self.plan, &parts))
        {
            Ok(ids) => ids
                .first()
                .copied()
                .ok_or_else(|| Error::invalid("the ranks returned no token")),
            Err(e) => {
                let _ = self.truncate(id, before);
                Err(e)
            }
        }
    }

    /// The ranks' candidates, or the first rank's error.
    fn tops(&self, replies: Vec<Reply>) -> Result<Vec<RankTop>> {
        let mut parts = Vec::with_capacity(replies.len());
        for (r, rep) in replies.into_iter().enumerate() {
            match rep {
                Reply::Top(Ok(p)) => parts.push(p),
                Reply::Top(Err(e)) => return Err(prefixed(&format!("{} rank {r}", self.label), e)),
                _ => return Err(Error::invalid("unexpected rank reply")),
            }
        }
        Ok(parts)
    }
}

/// The token of each row: the best of the ranks' candidates (the lowest id among equal
/// maxima, as `ArgMax`). NaN or +Inf is an `Err`, as in the host sampler.
pub(super) fn combine_top(plan: &ShardPlan, parts: &[RankTop]) -> Result<Vec<u32>> {
    let n = parts.first().map_or(0, |p| p.len());
    let mut out = Vec::with_capacity(n);
    for row in 0..n {
        let mut best: Option<(usize, f32)> = None;
        for (r, p) in parts.iter().enumerate() {
            let slice = plan.vocab.get(r).cloned().unwrap_or(0..0);
            let (i, v) = match p.get(row) {
                Some(&(i, v)) if p.len() == n && (i as usize) < slice.len() => (i as usize, v),
                _ => {
                    return Err(Error::invalid(format!(
                        "rank {r} returned a bad candidate for row {row}"
                    )))
                }
            };
            if v.is_nan() || v == f32::INFINITY {
                return Err(Error::invalid(format!(
                    "the logits of row {row} hold NaN or +Inf"
                )));
            }
            if best.is_none_or(|(_, b)| v > b) {
                best = Some((slice.start + i, v));
            }
        }
        let (id, _) = best.ok_or_else(|| Error::invalid("a group without ranks"))?;
        out.push(u32::try_from(id).map_err(|_| Error::invalid("token id too large"))?);
    }
    Ok(out)
}

/// Concatenates the ranks' vocabulary slices of the logits (each rank's first
/// `vocab[r].len()` columns; a tied embedding's zero row adds one column that is dropped).
fn gather_logits(plan: &ShardPlan, parts: &[RankLogits]) -> Result<Data> {
    let rows = parts.first().map(|p| p.0).unwrap_or(0);
    let vocab = plan.config().vocab_size;
    let mut out = vec![0f32; rows * vocab];
    let mut col = 0;
    for (r, (pr, width, v)) in parts.iter().enumerate() {
        let vl = plan.vocab.get(r).map(|v| v.len()).unwrap_or(0);
        if *pr != rows || *width < vl || v.len() != pr * width {
            return Err(Error::invalid(format!(
                "rank {r} returned logits [{pr}, {width}] for a vocabulary slice of {vl}"
            )));
        }
        for row in 0..rows {
            out[row * vocab + col..row * vocab + col + vl]
                .copy_from_slice(&v[row * width..row * width + vl]);
        }
        col += vl;
    }
    Data::from_f32(&[rows, vocab], &out)
}

impl Drop for TpGroup {
    fn drop(&mut self) {
        if let Ok(mut l) = self.links.lock() {
            l.clear();
        }
        if let Ok(mut t) = self.threads.lock() {
            for h in t.drain(..) {
                let _ = h.join();
            }
        }
    }
}

/// A KV cache living on the ranks of a group (the driver's `KvCache` holds one).
pub(crate) struct RemoteCache {
    group: Arc<TpGroup>,
    id: u64,
}

impl RemoteCache {
    /// Rewinds every rank's cache to `len` tokens.
    pub(crate) fn truncate(&self, len: usize) -> Result<()> {
        self.group.truncate(self.id, len)
    }
    /// The group.
    pub(crate) fn group(&self) -> &Arc<TpGroup> {
        &self.group
    }
}

impl Drop for RemoteCache {
    fn drop(&mut self) {
        self.group.free(self.id, false);
    }
}

/// A paged KV pool living on the ranks of a group (the driver's `PagedKvPool` holds one).
pub(crate) struct RemotePool {
    group: Arc<TpGroup>,
    id: u64,
}

impl RemotePool {
    /// The group.
    pub(crate) fn group(&self) -> &Arc<TpGroup> {
        &self.group
    }
}

impl Drop for RemotePool {
    fn drop(&mut self) {
        self.group.free(self.id, true);
    }
}
