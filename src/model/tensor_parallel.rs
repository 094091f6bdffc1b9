//! Tensor parallelism (Megatron-style) over a group of ranks, one worker thread per rank.
//!
//! * [`ShardPlan`] decides which slice of every tensor each rank holds: q/k/v and gate/up
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
//! * [`ShardedSource`] is a [`WeightSource`] over the full model's source that hands each rank
//!   its slices (host copies of just the slice; the `.flm` mapping is never copied whole).
//! * A rank's [`Model`] is an ordinary model over its local config (its heads, its MLP width,
//!   its vocabulary slice + 1) with a [`Collective`] for the all-reduces. It takes the paths a
//!   single device takes: one-token decode steps and padded batched decode steps are recorded
//!   as CUDA graphs and replayed, the all-reduces (enqueued on the rank's stream) recorded with
//!   the rest of the step.
//! * [`TpGroup`] runs the ranks on worker threads, each building its model with the executor
//!   and all-reduce the caller's [`RankBuilder`] makes (the devices are built at the program's
//!   edge: `load::cpu_group`, `load::cuda_group`); the driver `Model` (`Model::driver`)
//!   forwards `forward` / `new_cache` to them, so generation, the CLI, the C API and Python
//!   work unchanged on top.

use super::arch::{self, Mlp, Qkv};
use super::config::ModelConfig;
use super::paged::PagedKvPool;
use super::paged_graph::BatchDecode;
use super::precision::Precision;
use super::tp_process::RemoteRank;
use super::transformer::{KvCache, Model, PagedBatch};
use super::weights::WeightSource;
use crate::data::Data;
use crate::device::{DataDict, FloatDict, IntDict};
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::parallel::Collective;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// `[n*r/w, n*(r+1)/w)`: rank `r`'s part of `n` items split over `w` ranks.
fn split(n: usize, w: usize, r: usize) -> Range<usize> {
    n * r / w..n * (r + 1) / w
}

fn scale(r: &Range<usize>, k: usize) -> Range<usize> {
    r.start * k..r.end * k
}

fn shift(r: &Range<usize>, k: usize) -> Range<usize> {
    r.start + k..r.end + k
}

/// How attention is divided between the ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttentionSplit {
    /// Each rank holds whole KV-head groups (or part of one group's query heads with that KV
    /// head copied): `heads[r]` query heads and `kv_heads[r]` KV heads, global indices.
    Heads {
        /// Query heads per rank.
        heads: Vec<Range<usize>>,
        /// KV heads per rank.
        kv_heads: Vec<Range<usize>>,
    },
    /// Every rank computes the whole attention (head counts that cannot be split).
    Replicated,
}

/// Which slice of the model each rank of a `world`-rank group holds (see the module docs).
#[derive(Clone, Debug)]
pub struct ShardPlan {
    world: usize,
    config: ModelConfig,
    /// The attention split.
    pub attention: AttentionSplit,
    /// MLP inner features per rank.
    pub ffn: Vec<Range<usize>>,
    /// Vocabulary rows per rank (embedding and LM head).
    pub vocab: Vec<Range<usize>>,
}

impl ShardPlan {
    /// The plan for `config` over `world` ranks; `Err` when a dimension is too small to give
    /// every rank a part.
    pub fn new(config: &ModelConfig, world: usize) -> Result<ShardPlan> {
        let c = config;
        let spec = arch::lookup(&c.architecture)?;
        if world == 0 {
            return Err(Error::invalid("tensor parallelism needs at least one rank"));
        }
        if c.moe.is_some() {
            return Err(Error::Unsupported(format!(
                "{}: tensor parallelism of mixture-of-experts layers",
                c.architecture
            )));
        }
        if c.mla.is_some() {
            return Err(Error::Unsupported(format!(
                "{}: tensor parallelism of latent attention",
                c.architecture
            )));
        }
        let (nh, nkv) = (c.num_heads, c.num_kv_heads);
        if nkv == 0 || nh == 0 || !nh.is_multiple_of(nkv) {
            return Err(Error::Unsupported(format!(
                "{}: {nh} heads not divisible into {nkv} KV heads",
                c.architecture
            )));
        }
        let group = nh / nkv;
        let attention = if nkv >= world {
            let kv: Vec<_> = (0..world).map(|r| split(nkv, world, r)).collect();
            AttentionSplit::Heads {
                heads: kv.iter().map(|k| scale(k, group)).collect(),
                kv_heads: kv,
            }
        } else if world.is_multiple_of(nkv) && group.is_multiple_of(world / nkv) {
            let per = world / nkv;
            AttentionSplit::Heads {
                heads: (0..world)
                    .map(|r| shift(&split(group, per, r % per), (r / per) * group))
                    .collect(),
                kv_heads: (0..world).map(|r| r / per..r / per + 1).collect(),
            }
        } else {
            AttentionSplit::Replicated
        };
        // Bloom keeps q, k and v of a head together: it needs whole heads, which every split
        // above gives (it has as many KV heads as heads).
        if matches!(spec.qkv, Qkv::FusedPerHead(_)) && nh != nkv {
            return Err(Error::Unsupported(
                "per-head fused qkv needs as many KV heads as heads".into(),
            ));
        }
        let unit = if c.intermediate_size.is_multiple_of(32) {
            32
        } else {
            1
        };
        let units = c.intermediate_size / unit;
        if units < world {
            return Err(Error::Unsupported(format!(
                "MLP width {} too small for {world} ranks",
                c.intermediate_size
            )));
        }
        if c.vocab_size < world {
            return Err(Error::Unsupported(format!(
                "vocabulary {} too small for {world} ranks",
                c.vocab_size
            )));
        }
        Ok(ShardPlan {
            world,
            config: c.clone(),
            attention,
            ffn: (0..world)
                .map(|r| scale(&split(units, world, r), unit))
                .collect(),
            vocab: (0..world).map(|r| split(c.vocab_size, world, r)).collect(),
        })
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The full model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// True when attention is split (an all-reduce follows o_proj).
    pub fn splits_attention(&self) -> bool {
        matches!(self.attention, AttentionSplit::Heads { .. })
    }

    /// Rank `rank`'s query and KV heads (global indices).
    pub fn heads(&self, rank: usize) -> (Range<usize>, Range<usize>) {
        match &self.attention {
            AttentionSplit::Heads { heads, kv_heads } => (
                heads.get(rank).cloned().unwrap_or(0..0),
                kv_heads.get(rank).cloned().unwrap_or(0..0),
            ),
            AttentionSplit::Replicated => (0..self.config.num_heads, 0..self.config.num_kv_heads),
        }
    }

    /// The configuration rank `rank` runs: its heads, MLP width and vocabulary slice (+1 for
    /// the zero row of out-of-slice ids).
    pub fn local_config(&self, rank: usize) -> ModelConfig {
        let (h, kv) = self.heads(rank);
        let f = self.ffn.get(rank).cloned().unwrap_or(0..0);
        let v = self.vocab.get(rank).cloned().unwrap_or(0..0);
        ModelConfig {
            num_heads: h.len(),
            num_kv_heads: kv.len(),
            intermediate_size: f.len(),
            vocab_size: v.len() + 1,
            ..self.config.clone()
        }
    }

    /// `tokens` as rank `rank`'s local embedding rows (ids outside its slice → the zero row).
    pub fn local_ids(&self, rank: usize, tokens: &[u32]) -> Vec<u32> {
        let v = self.vocab.get(rank).cloned().unwrap_or(0..0);
        tokens
            .iter()
            .map(|&t| {
                if v.contains(&(t as usize)) {
                    (t as usize - v.start) as u32
                } else {
                    v.len() as u32
                }
            })
            .collect()
    }

    /// The slicing rules of rank `rank`, by tensor name (tensors not named are replicated).
    fn rules(&self, rank: usize) -> Result<HashMap<String, Rule>> {
        let c = &self.config;
        let spec = arch::lookup(&c.architecture)?;
        let hd = c.head_dim;
        let (h, kv) = self.heads(rank);
        let f = self.ffn.get(rank).cloned().unwrap_or(0..0);
        let mut m = HashMap::new();
        let both = |m: &mut HashMap<String, Rule>, n: &str, r: Rule| {
            m.insert(format!("{n}.bias"), r.clone());
            m.insert(format!("{n}.weight"), r);
        };
        for i in 0..c.num_layers {
            let ln = |n: &str| format!("{}{i}.{n}", spec.layer_prefix);
            let row_parallel = |m: &mut HashMap<String, Rule>, n: &str, cols: Range<usize>| {
                m.insert(format!("{n}.weight"), Rule::Cols(cols));
                if rank != 0 {
                    m.insert(format!("{n}.bias"), Rule::Absent);
                }
            };
            if self.splits_attention() {
                let (qd, kd) = (c.num_heads * hd, c.num_kv_heads * hd);
                match spec.qkv {
                    Qkv::Separate(q, k, v) => {
                        both(&mut m, &ln(q), Rule::Rows(vec![scale(&h, hd)]));
                        both(&mut m, &ln(k), Rule::Rows(vec![scale(&kv, hd)]));
                        both(&mut m, &ln(v), Rule::Rows(vec![scale(&kv, hd)]));
                    }
                    Qkv::Fused(n) => both(
                        &mut m,
                        &ln(n),
                        Rule::Rows(vec![
                            scale(&h, hd),
                            shift(&scale(&kv, hd), qd),
                            shift(&scale(&kv, hd), qd + kd),
                        ]),
                    ),
                    Qkv::FusedPerHead(n) => {
                        both(&mut m, &ln(n), Rule::Rows(vec![scale(&h, 3 * hd)]))
                    }
                    Qkv::Latent(_) => {} // refused by `ShardPlan::new`
                }
                row_parallel(&mut m, &ln(spec.o_proj), scale(&h, hd));
                if let Some(sk) = spec.attn_sinks {
                    m.insert(ln(sk), Rule::Rows(vec![h.clone()])); // one logit per query head
                }
            }
            match spec.mlp {
                Mlp::Gated(g, u, d) => {
                    both(&mut m, &ln(g), Rule::Rows(vec![f.clone()]));
                    both(&mut m, &ln(u), Rule::Rows(vec![f.clone()]));
                    row_parallel(&mut m, &ln(d), f.clone());
                }
                Mlp::GatedFused(gu, d) => {
                    let inter = c.intermediate_size;
                    both(
                        &mut m,
                        &ln(gu),
                        Rule::Rows(vec![f.clone(), shift(&f, inter)]),
                    );
                    row_parallel(&mut m, &ln(d), f.clone());
                }
                Mlp::Plain(u, d) => {
                    both(&mut m, &ln(u), Rule::Rows(vec![f.clone()]));
                    row_parallel(&mut m, &ln(d), f.clone());
                }
            }
        }
        let v = self.vocab.get(rank).cloned().unwrap_or(0..0);
        m.insert(format!("{}.weight", spec.embed), Rule::EmbedRows(v.clone()));
        m.insert(format!("{}.weight", spec.lm_head), Rule::Rows(vec![v]));
        Ok(m)
    }
}

/// How one tensor is cut for one rank.
#[derive(Clone, Debug)]
enum Rule {
    /// These rows of dim 0 (elements of a 1-D tensor), concatenated.
    Rows(Vec<Range<usize>>),
    /// These columns of a 2-D `[out, in]` weight (row-parallel layers).
    Cols(Range<usize>),
    /// These rows plus one zero row (the vocab-parallel embedding).
    EmbedRows(Range<usize>),
    /// Not on this rank (a row-parallel layer's bias lives on rank 0).
    Absent,
}

fn slice_rows(t: &Data, ranges: &[Range<usize>], zero_row: bool) -> Result<Data> {
    let dims = t.dims().to_vec();
    let rows = *dims.first().ok_or_else(|| Error::invalid("a 0-D tensor"))?;
    let bytes = t.bytes()?;
    let rb = if dims.len() == 1 {
        t.dtype().row_bytes(1)?
    } else {
        bytes.len() / rows.max(1)
    };
    let mut out = Vec::new();
    let mut n = 0;
    for r in ranges {
        if r.end > rows || r.start > r.end {
            return Err(Error::invalid(format!(
                "rows {r:?} of a tensor with {rows} rows"
            )));
        }
        out.extend_from_slice(bytes.get(r.start * rb..r.end * rb).unwrap_or(&[]));
        n += r.len();
    }
    if zero_row {
        out.resize(out.len() + rb, 0);
        n += 1;
    }
    let mut d = dims;
    d[0] = n;
    Data::from_bytes(t.dtype(), &d, &out)
}

fn slice_cols(t: &Data, cols: &Range<usize>) -> Result<Data> {
    let dims = t.dims();
    if dims.len() != 2 || cols.end > dims[1] || cols.start > cols.end {
        return Err(Error::invalid(format!(
            "columns {cols:?} of a tensor of dims {dims:?}"
        )));
    }
    let dt = t.dtype();
    let rb = dt.row_bytes(dims[1])?;
    let (c0, c1) = (dt.row_bytes(cols.start)?, dt.row_bytes(cols.end)?);
    let bytes = t.bytes()?;
    let mut out = Vec::with_capacity(dims[0] * (c1 - c0));
    for row in 0..dims[0] {
        out.extend_from_slice(bytes.get(row * rb + c0..row * rb + c1).unwrap_or(&[]));
    }
    Data::from_bytes(dt, &[dims[0], cols.len()], &out)
}

/// A rank's view of the full model's tensors: each tensor cut by the [`ShardPlan`].
pub struct ShardedSource {
    inner: Arc<dyn WeightSource>,
    rules: HashMap<String, Rule>,
}

impl ShardedSource {
    /// Rank `rank`'s tensors of `inner` under `plan`.
    pub fn new(inner: Arc<dyn WeightSource>, plan: &ShardPlan, rank: usize) -> Result<Self> {
        if rank >= plan.world {
            return Err(Error::invalid(format!(
                "rank {rank} of a {}-rank plan",
                plan.world
            )));
        }
        Ok(ShardedSource {
            inner,
            rules: plan.rules(rank)?,
        })
    }
}

impl WeightSource for ShardedSource {
    fn tensor(&self, name: &str) -> Result<Data> {
        let rule = self.rules.get(name);
        if matches!(rule, Some(Rule::Absent)) {
            return Err(Error::Unsupported(format!(
                "tensor '{name}' is held by rank 0"
            )));
        }
        let t = self.inner.tensor(name)?;
        let t = if t.is_contiguous() {
            t
        } else {
            t.to_owned_host()?
        };
        let r = match rule {
            None => return Ok(t),
            Some(Rule::Rows(rs)) => slice_rows(&t, rs, false),
            Some(Rule::EmbedRows(r)) => slice_rows(&t, std::slice::from_ref(r), true),
            Some(Rule::Cols(c)) => slice_cols(&t, c),
            Some(Rule::Absent) => Err(Error::invalid("absent")),
        };
        r.map_err(|e| Error::Unsupported(format!("sharding tensor '{name}': {e}")))
    }
    fn has(&self, name: &str) -> bool {
        !matches!(self.rules.get(name), Some(Rule::Absent)) && self.inner.has(name)
    }
    fn names(&self) -> Vec<String> {
        self.inner
            .names()
            .into_iter()
            .filter(|n| !matches!(self.rules.get(n), Some(Rule::Absent)))
            .collect()
    }
}

/// What a rank's model needs to know about its group.
pub(crate) struct RankTp {
    /// The all-reduce.
    pub comm: Arc<dyn Collective>,
    /// An all-reduce follows o_proj (attention is split).
    pub reduce_attention: bool,
    /// ALiBi: (global head count, first local head).
    pub alibi_heads: (usize, usize),
}

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
        alibi_heads: (plan.config.num_heads, plan.heads(rank).0.start),
    })
}

/// A step or cache operation sent to a rank.
pub(crate) enum Cmd {
    NewCache {
        id: u64,
        cap: usize,
    },
    Truncate {
        id: u64,
        len: usize,
    },
    Free {
        id: u64,
    },
    /// `tokens` after cache `id`'s: the logits of every new row (`all`) or of the last one;
    /// with `top`, only the last row's best candidate of the rank's vocabulary slice.
    Forward {
        id: u64,
        tokens: Vec<u32>,
        all: bool,
        top: bool,
    },
    NewPool {
        id: u64,
        blocks: usize,
        block_size: usize,
    },
    FreePool {
        id: u64,
    },
    /// A planned paged step on pool `id`: its logits rows, or with `top` each row's best
    /// candidate of the rank's vocabulary slice.
    Paged {
        id: u64,
        batch: PagedBatch,
        top: bool,
    },
}

/// Logits of one rank: rows, width, values.
pub(crate) type RankLogits = (usize, usize, Vec<f32>);

/// Each row's best logit of one rank's vocabulary slice: (index in the slice, value).
pub(crate) type RankTop = Vec<(u32, f32)>;

/// A rank's answer to a [`Cmd`].
pub(crate) enum Reply {
    Done(Result<()>),
    Logits(Result<RankLogits>),
    Top(Result<RankTop>),
}

/// The driver's channel to one rank: a worker thread of this process, or a rank of another
/// process (see `model::tp_process`).
enum Link {
    Local {
        tx: Sender<Cmd>,
        rx: Receiver<Reply>,
    },
    Remote(RemoteRank),
}

impl Reply {
    fn is_err(&self) -> bool {
        matches!(
            self,
            Reply::Done(Err(_)) | Reply::Logits(Err(_)) | Reply::Top(Err(_))
        )
    }
    fn err_text(&self) -> Option<String> {
        match self {
            Reply::Done(Err(e)) | Reply::Logits(Err(e)) | Reply::Top(Err(e)) => Some(e.to_string()),
            _ => None,
        }
    }
}

impl Link {
    fn send(&self, cmd: Cmd) -> std::result::Result<(), String> {
        match self {
            Link::Local { tx, .. } => tx.send(cmd).map_err(|_| "its worker stopped".to_string()),
            Link::Remote(r) => r.send(&cmd),
        }
    }
    fn recv(&self) -> std::result::Result<Reply, String> {
        match self {
            Link::Local { rx, .. } => rx.recv().map_err(|_| "its worker stopped".to_string()),
            Link::Remote(r) => r.recv(),
        }
    }
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

/// Whether a group stopped, without keeping it alive (see [`Model::group_health`]).
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

/// Builds a rank's model inside its worker thread.
pub type RankBuilder = Box<dyn FnOnce() -> Result<Model> + Send>;

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

fn stopped(r: usize) -> Error {
    Error::Device(format!("tensor-parallel rank {r} stopped"))
}

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
                Some(c) => model
                    .forward_device(c, &tokens, false)
                    .and_then(|l| rank_top(model, &l, 1)),
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

/// The best candidate of each of the first `n` rows of a rank's `logits` (`TopK` where the
/// logits are), over the rank's vocabulary slice only: a tied embedding's zero row adds a
/// column past the slice (logit 0) that is skipped (`TopK` of 2 then).
fn rank_top(model: &Model, logits: &Data, n: usize) -> Result<RankTop> {
    // a rank's local vocabulary is its slice plus the zero row
    let real = model.config().vocab_size.saturating_sub(1);
    top_candidates(model.executor(), logits, n, real)
}

/// The best of the first `real` columns of each of the first `n` rows of `logits` (`TopK`
/// on `exec`): (column, value), the lowest column among equal maxima.
fn top_candidates(exec: &Executor, logits: &Data, n: usize, real: usize) -> Result<RankTop> {
    let width = logits.dim(-1);
    let k = if width > real { 2.min(width) } else { 1 };
    let mut top = Data::empty(crate::data::DataType::F32);
    let mut d = DataDict::new()
        .with("input", logits)
        .with_mut("output", &mut top);
    exec.run(
        "TopK",
        &mut d,
        &FloatDict::new(),
        &IntDict::new().with("k", k as i32),
    )?;
    let top = top.to_owned_host()?;
    let v = top.as_f32()?;
    (0..n)
        .map(|row| {
            let cands = v.get(row * 2 * k..(row + 1) * 2 * k).unwrap_or(&[]);
            cands
                .chunks_exact(2)
                .map(|c| (c[0] as u32, c[1]))
                .find(|&(i, _)| (i as usize) < real)
                .ok_or_else(|| Error::invalid(format!("TopK gave no candidate for row {row}")))
        })
        .collect()
}

/// The token of each row: the best of the ranks' candidates (the lowest id among equal
/// maxima, as `ArgMax`). NaN or +Inf is an `Err`, as in the host sampler.
fn combine_top(plan: &ShardPlan, parts: &[RankTop]) -> Result<Vec<u32>> {
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

fn worker(model: Model, rx: Receiver<Cmd>, tx: Sender<Reply>) {
    let mut state = RankState::default();
    for cmd in rx {
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
        if builders.len() + remote.len() != plan.world {
            return Err(Error::invalid("one builder or remote rank per rank"));
        }
        let mut links = Vec::new();
        let mut threads = Vec::new();
        let mut ready = Vec::new();
        for (r, b) in builders.into_iter().enumerate() {
            let (ctx, crx) = channel::<Cmd>();
            let (rtx, rrx) = channel::<Reply>();
            let (ok_tx, ok_rx) = channel::<Result<BatchDecode>>();
            let h = std::thread::Builder::new()
                .name(format!("fastllm-tp{r}"))
                .spawn(move || match b() {
                    Ok(m) => {
                        if ok_tx.send(Ok(m.batch_decode())).is_ok() {
                            worker(m, crx, rtx);
                        }
                    }
                    Err(e) => {
                        let _ = ok_tx.send(Err(e));
                    }
                })
                .map_err(|e| Error::Device(format!("spawning rank {r}: {e}")))?;
            links.push(Link::Local { tx: ctx, rx: rrx });
            threads.push(h);
            ready.push(ok_rx);
        }
        let mut first_err = None;
        let mut modes = Vec::new();
        for (r, rx) in ready.into_iter().enumerate() {
            match rx.recv().unwrap_or_else(|_| Err(stopped(r))) {
                Ok(m) => modes.push(m),
                Err(e) => {
                    first_err.get_or_insert(prefixed(&format!("{label} rank {r}"), e));
                }
            }
        }
        links.extend(remote.into_iter().map(Link::Remote));
        if let Some(e) = first_err {
            drop(links);
            for t in threads {
                let _ = t.join();
            }
            return Err(e);
        }
        Ok(TpGroup {
            plan,
            // the ranks of other processes load the same way as this process's first
            batch_decode: modes.first().copied().unwrap_or(BatchDecode::Off),
            links: Mutex::new(links),
            failure: Mutex::new(None),
            threads: Mutex::new(threads),
            next_id: AtomicU64::new(1),
            label: label.to_string(),
        })
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

/// Concatenates the ranks' vocabulary slices of the logits (each rank's first
/// `vocab[r].len()` columns; a tied embedding's zero row adds one column that is dropped).
fn gather_logits(plan: &ShardPlan, parts: &[RankLogits]) -> Result<Data> {
    let rows = parts.first().map(|p| p.0).unwrap_or(0);
    let vocab = plan.config.vocab_size;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DataType;
    use crate::model::synthetic;

    fn cfg(nh: usize, nkv: usize) -> ModelConfig {
        ModelConfig {
            num_heads: nh,
            num_kv_heads: nkv,
            ..synthetic::config("llama-3-8b").unwrap()
        }
    }

    fn heads(p: &ShardPlan) -> Vec<(Range<usize>, Range<usize>)> {
        (0..p.world()).map(|r| p.heads(r)).collect()
    }

    #[test]
    fn attention_is_split_by_kv_groups() {
        // even
        let p = ShardPlan::new(&cfg(32, 8), 2).unwrap();
        assert_eq!(heads(&p), vec![(0..16, 0..4), (16..32, 4..8)]);
        // SmolLM2: 9 heads, 3 KV heads over 2 ranks: 1 and 2 groups
        let p = ShardPlan::new(&cfg(9, 3), 2).unwrap();
        assert_eq!(heads(&p), vec![(0..3, 0..1), (3..9, 1..3)]);
        assert_eq!(p.local_config(0).num_heads, 3);
        assert_eq!(p.local_config(1).num_kv_heads, 2);
        // one KV head shared by two ranks
        let p = ShardPlan::new(&cfg(4, 1), 2).unwrap();
        assert_eq!(heads(&p), vec![(0..2, 0..1), (2..4, 0..1)]);
        let p = ShardPlan::new(&cfg(8, 2), 4).unwrap();
        assert_eq!(
            heads(&p),
            vec![(0..2, 0..1), (2..4, 0..1), (4..6, 1..2), (6..8, 1..2)]
        );
        // cannot split: replicated
        let p = ShardPlan::new(&cfg(9, 1), 2).unwrap();
        assert_eq!(p.attention, AttentionSplit::Replicated);
        assert_eq!(heads(&p), vec![(0..9, 0..1), (0..9, 0..1)]);
    }

    #[test]
    fn mlp_and_vocab_ranges_cover_everything_once() {
        let p = ShardPlan::new(&cfg(32, 8), 3).unwrap();
        assert_eq!(p.ffn, vec![0..4768, 4768..9536, 9536..14336]);
        assert!(p.ffn.iter().all(|r| r.start % 32 == 0));
        assert_eq!(p.vocab[0].start, 0);
        assert_eq!(p.vocab[2].end, 128256);
        assert_eq!(p.vocab[0].end, p.vocab[1].start);
        assert_eq!(p.local_ids(1, &[0, 42752, 42753]), vec![42752, 0, 1]);
    }

    #[test]
    fn slices_rows_cols_and_blocks() {
        let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let t = Data::from_f32(&[4, 6], &v).unwrap();
        let r = slice_rows(&t, &[1..2, 3..4], true).unwrap();
        assert_eq!(r.dims(), &[3, 6]);
        assert_eq!(
            r.to_f32_vec().unwrap(),
            [6., 7., 8., 9., 10., 11., 18., 19., 20., 21., 22., 23., 0., 0., 0., 0., 0., 0.]
        );
        let c = slice_cols(&t, &(2..4)).unwrap();
        assert_eq!(
            c.to_f32_vec().unwrap(),
            [2., 3., 8., 9., 14., 15., 20., 21.]
        );
        let b = Data::from_f32(&[4], &[1., 2., 3., 4.]).unwrap();
        assert_eq!(
            slice_rows(&b, std::slice::from_ref(&(2..4)), false)
                .unwrap()
                .to_f32_vec()
                .unwrap(),
            [3., 4.]
        );
        // Q8_0: columns must fall on 32-element blocks
        let w: Vec<f32> = (0..128).map(|i| (i % 7) as f32 * 0.1).collect();
        let q = Data::from_bytes(
            DataType::Q8_0,
            &[2, 64],
            &crate::data::encode_from_f32(DataType::Q8_0, &w).unwrap(),
        )
        .unwrap();
        let qc = slice_cols(&q, &(32..64)).unwrap();
        let full = q.to_f32_vec().unwrap();
        let part = qc.to_f32_vec().unwrap();
        assert_eq!(&part[..32], &full[32..64]);
        assert_eq!(&part[32..], &full[96..128]);
        assert!(slice_cols(&q, &(16..48)).is_err());
    }

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
        let plan = ShardPlan::new(&cfg(32, 8), 2).unwrap();
        let second = plan.vocab[1].start as u32;
        // equal maxima on two ranks: the lower id (rank 0's) wins; a larger one on rank 1 wins
        let ids = combine_top(&plan, &[vec![(7, 1.), (7, 1.)], vec![(2, 1.), (3, 1.5)]]).unwrap();
        assert_eq!(ids, vec![7, second + 3]);
        assert!(combine_top(&plan, &[vec![(7, f32::NAN)], vec![(2, 1.)]]).is_err());
        assert!(combine_top(&plan, &[vec![(7, 1.)], vec![]]).is_err());
        assert!(combine_top(&plan, &[vec![(200000, 1.)], vec![(2, 1.)]]).is_err());
    }
}
