//! Tensor parallelism (Megatron-style) over a group of ranks, one worker thread per rank.
//!
//! * [`ShardPlan`] (`model::shard`) decides which slice of every tensor each rank holds: q/k/v and gate/up
//!   column-parallel by whole heads and 32-wide blocks of the MLP; o_proj and down_proj
//!   row-parallel (their biases on rank 0 only), each followed by a sum all-reduce; the
//!   embedding vocab-parallel (each rank holds a slice of rows plus one zero row that ids
//!   outside its slice map to, then an all-reduce); the LM head column-parallel over the vocab
//!   (the driver concatenates the ranks' logits on the host, where the single-device model also
//!   returns them; a greedy step instead has each rank send its best (id, logit) per row, and
//!   the driver keeps the largest); norms replicated. Fused weights (phi3 `qkv_proj` /
//!   `gate_up_proj`, GPT-2 `c_attn`, Bloom's per-head `query_key_value`) are split per
//!   component.
//! * Attention is split by KV-head groups so that every rank keeps whole GQA groups: evenly
//!   when the KV heads divide by the ranks; unevenly (some ranks get one group more) when there
//!   are more KV heads than ranks but they do not divide (SmolLM2: 3 KV heads on 2 ranks give 1
//!   and 2 groups, i.e. 3 and 6 of its 9 query heads); a KV head shared by several ranks when
//!   the ranks divide by the KV heads (each takes part of the group's query heads); otherwise
//!   attention is replicated on every rank (no all-reduce after o_proj) and only the MLP and
//!   the vocabulary are split.
//! * [`ShardedSource`] (`model::shard`) is a [`WeightSource`] over the full model's source that hands each rank
//!   its slices (host copies of just the slice; the `.flm` mapping is never copied whole).
//! * A rank's [`Model`] is an ordinary model over its local config (its heads, its MLP width,
//!   its vocabulary slice + 1) with a [`Collective`] for the all-reduces. It takes the paths a
//!   single device takes: one-token decode steps and padded batched decode steps are recorded
//!   as CUDA graphs and replayed, the all-reduces (enqueued on the rank's stream) recorded with
//!   the rest of the step.
//! * [`TpGroup`] (its driver side in `model::tp_group`) runs the ranks on worker threads, each building its model with the executor
//!   and all-reduce the caller's [`RankBuilder`] makes (the devices are built at the program's
//!   edge: `load::cpu_group`, `load::cuda_group`); the driver `Model` (`Model::driver`)
//!   forwards `forward` / `new_cache` to them, so generation, the CLI, the C API and Python
//!   work unchanged on top.

pub use super::shard::{AttentionSplit, ShardPlan, ShardedSource};
pub(crate) use super::tp_group::prefixed;
pub use super::tp_group::{GroupHealth, TpGroup};

use super::paged::PagedKvPool;
use super::paged_batch::{BatchDecode, PagedBatch};
use super::precision::Precision;
use super::rank_top::{top_candidates, top_rows};
use super::tp_group::{stopped, RankTp};
use super::tp_link::{recv_polling, Cmd, Link, RankLogits, RankTop, RemoteRank, Reply, GPU_POLL};
use super::transformer::{KvCache, Model};
use super::weights::WeightSource;
use crate::data::{Data, DeviceKind};
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::parallel::Collective;
use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

/// Builds rank `rank`'s model over `exec` (`comm` its communicator).
#[allow(clippy::too_many_arguments)]
pub fn rank_model(
    plan: &ShardPlan,
    rank: usize,
    source: Arc<dyn WeightSource>,
    exec: Executor,
    comm: Arc<dyn Collective>,
    precision: Precision,
    low_memory: bool,
    opts: &crate::options::RuntimeOptions,
) -> Result<Model> {
    // rank 0 adds a row-parallel layer's bias in its product, which then stays f32: half
    // partial sums only where no such layer has one, so every rank all-reduces one dtype
    let biased = plan.row_parallel_biases()?.iter().any(|n| source.has(n));
    let src = Arc::new(ShardedSource::new(source, plan, rank)?);
    let m = Model::with_options(
        plan.local_config(rank),
        src,
        exec,
        precision,
        low_memory,
        opts,
    )?;
    m.into_rank(RankTp {
        comm,
        reduce_attention: plan.splits_attention(),
        half_partials: !biased,
        alibi_heads: (plan.config().num_heads, plan.heads(rank).0.start),
    })
}

/// Builds a rank's model inside its worker thread.
pub type RankBuilder = Box<dyn FnOnce() -> Result<Model> + Send>;

/// A rank's KV caches and pools, and how it runs a [`Cmd`] on its model.
#[derive(Default)]
pub(crate) struct RankState {
    caches: HashMap<u64, KvCache>,
    pools: HashMap<u64, PagedKvPool>,
}

fn rank_logits(l: Data) -> Result<RankLogits> {
    let (rows, width) = (l.dim(0), l.dim(-1));
    Ok((rows, width, l.to_f32_vec()?))
}

impl RankState {
    /// Runs `cmd`; `None` for the commands that have no reply (frees).
    pub(crate) fn handle(&mut self, model: &Model, cmd: Cmd) -> Option<Reply> {
        let reply = self.run(model, cmd)?;
        // a reduction inside the device's operators that gave up waiting for a peer
        let health = model.tp.as_ref().map_or(Ok(()), |tp| tp.comm.health());
        Some(match (reply, health) {
            (Reply::Logits(Ok(_)), Err(e)) => Reply::Logits(Err(e)),
            (Reply::Top(Ok(_)), Err(e)) => Reply::Top(Err(e)),
            (Reply::Done(Ok(())), Err(e)) => Reply::Done(Err(e)),
            (r, _) => r,
        })
    }

    fn run(&mut self, model: &Model, cmd: Cmd) -> Option<Reply> {
        let missing = |what: &str, id: u64| Error::invalid(format!("no {what} {id} on this rank"));
        Some(match cmd {
            Cmd::NewCache { id, cap } => Reply::Done(model.new_cache(cap).map(|c| {
                self.caches.insert(id, c);
            })),
            Cmd::Truncate { id, len } => Reply::Done(match self.caches.get_mut(&id) {
                Some(c) => c.truncate(len),
                None => Err(missing("KV cache", id)),
            }),
            Cmd::Free { id } => {
                self.caches.remove(&id);
                return None;
            }
            Cmd::Forward {
                id,
                tokens,
                all,
                top: false,
            } => Reply::Logits(match self.caches.get_mut(&id) {
                Some(c) => model.forward(c, &tokens, all).and_then(rank_logits),
                None => Err(missing("KV cache", id)),
            }),
            Cmd::Forward {
                id,
                tokens,
                top: true,
                ..
            } => Reply::Top(match self.caches.get_mut(&id) {
                Some(c) => rank_forward_top(model, c, &tokens),
                None => Err(missing("KV cache", id)),
            }),
            Cmd::NewPool {
                id,
                blocks,
                block_size,
            } => Reply::Done(PagedKvPool::new(model, blocks, block_size).map(|p| {
                self.pools.insert(id, p);
            })),
            Cmd::FreePool { id } => {
                self.pools.remove(&id);
                return None;
            }
            Cmd::Paged { id, batch, top } => match self.pools.get_mut(&id) {
                Some(p) => rank_paged(model, p, &batch, top),
                None if top => Reply::Top(Err(missing("paged KV pool", id))),
                None => Reply::Logits(Err(missing("paged KV pool", id))),
            },
        })
    }
}

/// A planned paged step on a rank: a decode step padded to a bucket (recorded and replayed
/// where the rank's device records work) when the rank's model takes that path, else op by op;
/// the first `b.rows.len()` logits rows come back whole, or (`top`) as each row's best
/// candidate.
fn rank_paged(model: &Model, pool: &mut PagedKvPool, b: &PagedBatch, top: bool) -> Reply {
    let n = b.rows.len();
    let pick = |l: &Data| -> Result<Reply> {
        Ok(if top {
            Reply::Top(Ok(rank_top(model, l, n)?))
        } else {
            Reply::Logits(Ok(first_rows(l, n)?))
        })
    };
    let r = match model.decode_bucket(b) {
        Some(rows) => model.paged_decode_step(pool, b, rows).and_then(pick),
        None => model.paged_step_device(pool, b).and_then(|l| pick(&l)),
    };
    r.unwrap_or_else(|e| match top {
        true => Reply::Top(Err(e)),
        false => Reply::Logits(Err(e)),
    })
}

/// The first `n` rows of `logits` on the host.
fn first_rows(logits: &Data, n: usize) -> Result<RankLogits> {
    let w = logits.dim(-1);
    let host = logits.to_owned_host()?;
    let v = host.as_f32()?;
    let v = v
        .get(..n * w)
        .ok_or_else(|| Error::invalid("a rank's step gave too few logits rows"))?;
    Ok((n, w, v.to_vec()))
}

/// A rank's one-token step after cache `c` and the best candidate of its vocabulary slice:
/// from the recorded decode step, which picks it on the device (`Model::decode_recorded`,
/// `rank_top::topk_into`), where the step takes that path, else after the step op by op.
fn rank_forward_top(model: &Model, c: &mut KvCache, tokens: &[u32]) -> Result<RankTop> {
    let real = model.config().vocab_size.saturating_sub(1);
    match model.decode_recorded(c, tokens)? {
        Some(top) => top_rows(&top, 1, real),
        None => {
            let l = model.forward_device(c, tokens, false)?;
            rank_top(model, &l, 1)
        }
    }
}

/// The best candidate of each of the first `n` rows of a rank's `logits` (`TopK` where the
/// logits are), over the rank's vocabulary slice only: a tied embedding's zero row adds a
/// column past the slice (logit 0) that is skipped (`TopK` of 2 then).
fn rank_top(model: &Model, logits: &Data, n: usize) -> Result<RankTop> {
    // a rank's local vocabulary is its slice plus the zero row
    let real = model.config().vocab_size.saturating_sub(1);
    top_candidates(model.executor(), logits, n, real)
}

/// How long a rank's channel polls before it sleeps: `tp_link::GPU_POLL` for a model on a GPU,
/// none for one on the CPUs.
fn polls(model: &Model) -> Duration {
    let gpu = model
        .executor()
        .devices()
        .iter()
        .any(|d| d.kind() != DeviceKind::Cpu);
    if gpu {
        GPU_POLL
    } else {
        Duration::ZERO
    }
}

fn worker(model: Model, rx: Receiver<Cmd>, tx: Sender<Reply>) {
    let mut state = RankState::default();
    let poll = polls(&model);
    while let Ok(cmd) = recv_polling(&rx, poll) {
        if let Some(reply) = state.handle(&model, cmd) {
            if tx.send(reply).is_err() {
                break;
            }
        }
    }
}

impl TpGroup {
    /// Starts one worker thread per rank, each building its model with its builder (ranks
    /// that create an NCCL communicator must run concurrently, hence the threads), and waits
    /// until every rank is ready.
    pub fn start(plan: ShardPlan, builders: Vec<RankBuilder>, label: &str) -> Result<TpGroup> {
        Self::start_with_remote(plan, builders, Vec::new(), label)
    }

    /// Like [`TpGroup::start`] for a group whose first ranks are threads of this process
    /// (`builders`) and whose others are ranks of other processes (`remote`, in rank order).
    pub(crate) fn start_with_remote(
        plan: ShardPlan,
        builders: Vec<RankBuilder>,
        remote: Vec<RemoteRank>,
        label: &str,
    ) -> Result<TpGroup> {
        if builders.len() + remote.len() != plan.world() {
            return Err(Error::invalid("one builder or remote rank per rank"));
        }
        let mut links = Vec::new();
        let mut threads = Vec::new();
        let mut ready = Vec::new();
        for (r, b) in builders.into_iter().enumerate() {
            let (ctx, crx) = channel::<Cmd>();
            let (rtx, rrx) = channel::<Reply>();
            let (ok_tx, ok_rx) = channel::<Result<(BatchDecode, Duration)>>();
            let h = std::thread::Builder::new()
                .name(format!("fastllm-tp{r}"))
                .spawn(move || match b() {
                    Ok(m) => {
                        if ok_tx.send(Ok((m.batch_decode(), polls(&m)))).is_ok() {
                            worker(m, crx, rtx);
                        }
                    }
                    Err(e) => {
                        let _ = ok_tx.send(Err(e));
                    }
                })
                .map_err(|e| Error::Device(format!("spawning rank {r}: {e}")))?;
            threads.push(h);
            ready.push((ok_rx, ctx, rrx));
        }
        let mut first_err = None;
        let mut modes = Vec::new();
        for (r, (rx, tx, replies)) in ready.into_iter().enumerate() {
            let (mode, poll) = match rx.recv().unwrap_or_else(|_| Err(stopped(r))) {
                Ok(m) => m,
                Err(e) => {
                    first_err.get_or_insert(prefixed(&format!("{label} rank {r}"), e));
                    (BatchDecode::Off, Duration::ZERO)
                }
            };
            modes.push(mode);
            links.push(Link::Local {
                tx,
                rx: replies,
                poll,
            });
        }
        links.extend(remote.into_iter().map(Link::Remote));
        if let Some(e) = first_err {
            drop(links);
            for t in threads {
                let _ = t.join();
            }
            return Err(e);
        }
        // the ranks of other processes load the same way as this process's first
        let batch_decode = modes.first().copied().unwrap_or(BatchDecode::Off);
        Ok(TpGroup::new(plan, batch_decode, links, threads, label))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::synthetic;
    use crate::model::tp_group::combine_top;

    #[test]
    fn top_candidates_skip_the_zero_column_and_combine_by_lowest_id() {
        let exec = Executor::cpu(1).unwrap();
        // two rows of a 3-token slice plus the zero column; row 1 ties at columns 0 and 2
        let l = Data::from_f32(&[2, 4], &[-3., -1., -2., 0., 5., 1., 5., 0.]).unwrap();
        let t = top_candidates(&exec, &l, 2, 3).unwrap();
        assert_eq!(t, vec![(1, -1.), (0, 5.)]);
        // without a zero column the whole row counts
        let l = Data::from_f32(&[1, 3], &[0.5, 2., 2.]).unwrap();
        assert_eq!(top_candidates(&exec, &l, 1, 3).unwrap(), vec![(1, 2.)]);
        let plan = ShardPlan::new(&synthetic::config("llama-3-8b").unwrap(), 2).unwrap();
        let second = plan.vocab[1].start as u32;
        // equal maxima on two ranks: the lower id (rank 0's) wins; a larger one on rank 1 wins
        let ids = combine_top(&plan, &[vec![(7, 1.), (7, 1.)], vec![(2, 1.), (3, 1.5)]]).unwrap();
        assert_eq!(ids, vec![7, second + 3]);
        assert!(combine_top(&plan, &[vec![(7, f32::NAN)], vec![(2, 1.)]]).is_err());
        assert!(combine_top(&plan, &[vec![(7, 1.)], vec![]]).is_err());
        assert!(combine_top(&plan, &[vec![(200000, 1.)], vec![(2, 1.)]]).is_err());
    }
}
