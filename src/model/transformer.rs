//! `Model`: a decoder-only transformer according to its `ArchSpec`: loading and placing its
//! weights, a KV cache that grows in place (`Data` expansion + `CatDirect`), forward steps over
//! it or over the paged pool (each described once as a `Step`, see `layers`), recorded one-token
//! decode steps, and token selection. Never calls a kernel directly.

use super::arch::{self, ArchSpec, NormKind, Positions, Qkv};
use super::config::{ModelConfig, RopeScaling};
use super::kv_dtype::{self, KvDtype};
use super::paged_batch::BatchDecode;
use super::precision::Precision;
use super::replay::{replay_or_record, Recorded, Recording, StepBufs, MAX_FAILURES};
use super::rope::RopePlan;
use super::sampler::{pick_error, sample_logits, SampleRow};
use super::step_kv::{CacheKv, GraphKv, KvStore, Layers, PagedIndex, PagedKv, StepKv};
use super::tp_group::{GroupHealth, RankTp, RemoteCache, TpGroup};
use super::weights::{WeightSource, Weights};
use crate::data::{Data, DataType, DeviceKind};
use crate::device::{DataDict, FloatDict, IntDict};
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::ops::{self, AttentionParams, OutputCopy, RotaryParams};
use crate::options::RuntimeOptions;
use std::sync::Arc;

/// One sequence's KV cache plus reusable scratch tensors. A latent-attention model keeps one
/// cache per layer (its cached row is both key and value: [`KvStore::attend_shared`]).
pub struct KvCache {
    k: Vec<Data>,
    v: Vec<Data>,
    len: usize,
    cap: usize,
    scratch: Scratch,
    /// Set when the cache lives on the ranks of a tensor-parallel group.
    remote: Option<RemoteCache>,
    /// Buffers and the recorded graph of replayed one-token decode steps (see
    /// [`Model::decode_graph_step`]); `None` until the first such step.
    graph: Option<Box<DecodeGraph>>,
}

/// The state of graph-replayed decode steps of one cache: every tensor the recorded work reads
/// or writes (besides the weights and the KV cache) lives here at a fixed address, and the
/// per-step values (the token id and its position, which is also the KV write slot and the
/// attention length) are written into `ids` / `pos` before each replay.
struct DecodeGraph {
    /// [`Model::id`] of the model that recorded it (its weights are in the recording).
    model: u64,
    step: StepBufs,
    next: Data,
    recording: Option<Recording>,
    /// Steps run without recording (the first one sizes every buffer).
    eager_steps: usize,
    /// Failed recordings; after [`MAX_FAILURES`] this cache stops trying.
    failures: usize,
}

impl KvCache {
    /// Tokens cached so far.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Maximum tokens.
    pub fn capacity(&self) -> usize {
        self.cap
    }
    /// True when this cache's one-token decode steps replay a recorded graph (CUDA graphs),
    /// false while none is recorded (before the second step, after a failed recording, or on a
    /// device without graphs).
    pub fn replays_decode_graph(&self) -> bool {
        self.graph.as_ref().is_some_and(|g| g.recording.is_some())
    }
    /// Bytes reserved for the cached rows of every layer at full capacity (keys and values; a
    /// latent-attention cache's one row per token and layer).
    pub fn reserved_bytes(&self) -> usize {
        self.k
            .iter()
            .chain(&self.v)
            .map(|d| crate::data::bytes_for(d.dtype(), d.capacity()).unwrap_or(0))
            .sum()
    }
    /// Forgets every cached token (keeps the allocations).
    pub fn clear(&mut self) -> Result<()> {
        if let Some(r) = &self.remote {
            r.truncate(0)?;
        }
        for d in self.k.iter_mut().chain(self.v.iter_mut()) {
            d.set_len(0, 0)?;
        }
        self.len = 0;
        Ok(())
    }
    /// Drops cached tokens beyond `len` (e.g. to rewind to a shared prefix).
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len < self.len {
            if let Some(r) = &self.remote {
                r.truncate(len)?;
            }
            for d in self.k.iter_mut().chain(self.v.iter_mut()) {
                d.set_len(0, len)?;
            }
            self.len = len;
        }
        Ok(())
    }
}

/// Working tensors a step takes and gives back.
#[derive(Default)]
pub(super) struct Scratch {
    bufs: Vec<Data>,
}

/// Working tensors of one step through the layer stack ([`Model::layers`]): the step buffers,
/// the MoE stage's ([`super::moe::MOE_BUFS`]), then the rope tables.
pub(super) const SCRATCH_BUFS: usize = 14 + super::moe::MOE_BUFS;

impl Scratch {
    fn take(&mut self, n: usize) -> Vec<Data> {
        while self.bufs.len() < n {
            self.bufs.push(Data::empty(DataType::F32));
        }
        self.bufs.drain(..n).collect()
    }
    fn give(&mut self, v: Vec<Data>) {
        self.bufs.extend(v);
    }
}

/// A loaded model ready to run.
pub struct Model {
    pub(super) config: ModelConfig,
    pub(super) spec: &'static ArchSpec,
    pub(super) weights: Weights,
    pub(super) exec: Executor,
    pub(super) precision: Precision,
    /// The rotations of the layers (one base, or Gemma-3's two).
    pub(super) rope: RopePlan,
    pub(super) alibi: Option<Data>,
    /// Set on a rank of a tensor-parallel group: its all-reduces.
    pub(super) tp: Option<RankTp>,
    /// Set on the driver of a tensor-parallel group: the ranks that run it.
    group: Option<Arc<TpGroup>>,
    /// Which fused and recorded paths it takes.
    paths: Paths,
    /// Unique per model in this process: a cache's recorded decode step is only replayed by
    /// the model that recorded it (the recording holds that model's weight addresses).
    id: u64,
    /// How new KV caches and pools store keys and values.
    kv_dtype: KvDtype,
}

/// Source of [`Model::id`].
static NEXT_MODEL_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_model_id() -> u64 {
    NEXT_MODEL_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

pub(super) fn bad(msg: impl std::fmt::Display) -> Error {
    Error::Unsupported(msg.to_string())
}

/// Refuses a config the architecture's graph cannot run: heads that do not group into the KV
/// heads, zero sizes, a rotary dimension that does not fit the head, experts on an
/// architecture without mixture-of-experts layers.
fn validate_config(spec: &ArchSpec, c: &ModelConfig) -> Result<()> {
    if c.num_heads == 0 || c.num_kv_heads == 0 || !c.num_heads.is_multiple_of(c.num_kv_heads) {
        return Err(bad(format!(
            "{}: {} heads not divisible into {} KV heads",
            c.architecture, c.num_heads, c.num_kv_heads
        )));
    }
    if c.head_dim == 0 || c.hidden_size == 0 || c.num_layers == 0 || c.vocab_size == 0 {
        return Err(bad(format!("{}: config has zero sizes", c.architecture)));
    }
    if spec.positions == Positions::Rope
        && (c.rope_dim == 0 || c.rope_dim > c.head_dim || !c.rope_dim.is_multiple_of(2))
    {
        return Err(bad(format!(
            "{}: rotary dim {} invalid for head dim {}",
            c.architecture, c.rope_dim, c.head_dim
        )));
    }
    if let Some(m) = &c.moe {
        m.validate(&c.architecture, c.num_layers)?;
        if spec.moe.is_none() {
            return Err(bad(format!(
                "{}: has no mixture-of-experts layers",
                c.architecture
            )));
        }
    }
    Ok(())
}

/// Gemma norms scale by (1 + w): every norm weight is replaced by `1 + w` once, kept resident.
fn derive_plus_one_norms(weights: &mut Weights, spec: &ArchSpec, c: &ModelConfig) -> Result<()> {
    let mut names = vec![format!("{}.weight", spec.final_norm)];
    for i in 0..c.num_layers {
        let p = format!("{}{i}.", spec.layer_prefix);
        names.push(format!("{p}{}.weight", spec.attn_norm));
        names.push(format!("{p}{}.weight", spec.ffn_norm));
        let (qn, kn) = spec.qk_norm.unzip();
        for n in [spec.post_attn_norm, spec.post_ffn_norm, qn, kn]
            .into_iter()
            .flatten()
        {
            names.push(format!("{p}{n}.weight"));
        }
    }
    for n in names {
        let w = weights.get(&n)?;
        let v: Vec<f32> = w.to_f32_vec()?.iter().map(|x| x + 1.0).collect();
        let d = Data::from_f32(w.dims(), &v)?;
        drop(w);
        weights.set_resident(&n, d);
    }
    Ok(())
}

/// Puts the weights where the first device runs them: a GPU (or other non-CPU) first device
/// gets the weights, rope tables and ALiBi slopes once, now (after the memory cap of `opts`
/// is checked); a CPU first device in the `fast` precision may hold the weight matrices in
/// the layout its kernels stream (experts stay mapped from the file: only the routed ones are
/// ever read). `on_tensor` gets the bytes of each weight once it is placed.
fn place_weights(
    exec: &Executor,
    (spec, precision): (&ArchSpec, Precision),
    opts: &RuntimeOptions,
    weights: &mut Weights,
    (rope, alibi): (&mut RopePlan, &mut Option<Data>),
    on_tensor: &mut dyn FnMut(u64),
) -> Result<()> {
    let Some(dev) = exec.devices().first() else {
        return Ok(());
    };
    if dev.kind() != DeviceKind::Cpu {
        check_memory_cap(weights, dev.name(), opts.gpu_memory_cap)?;
        // latent attention's per-head matrices stay on the host where the device has no
        // `MatMulTransB` (that op falls back to the CPU device, which reads them in place)
        let host_only = match (spec.qkv, dev.ops().contains_key("MatMulTransB")) {
            (Qkv::Latent(n), false) => Some(n),
            _ => None,
        };
        weights.upload_to_where(
            dev.as_ref(),
            |name| host_only.is_none_or(|n| !super::mla::is_absorbed(&n, name)),
            on_tensor,
        )?;
        rope.upload(dev.as_ref())?;
        if let Some(t) = alibi {
            *t = dev.upload(t)?;
        }
    } else if precision == Precision::Fast {
        let experts = spec.moe.map(|m| m.experts);
        weights.reform_for_where(
            dev.as_ref(),
            |n| experts.is_none_or(|x| !super::moe::is_expert_tensor(x, n)),
            on_tensor,
        )?;
    }
    Ok(())
}

/// How a model's steps are run, chosen at load from its first device's operators, the
/// architecture and the switches of [`RuntimeOptions`]. (Which ops a step fuses is the device's
/// choice: see [`crate::step`].)
struct Paths {
    /// One-token decode steps are recorded once per cache and replayed (CUDA graphs).
    decode_graphs: bool,
    /// The first device has `RotaryTables`: a step forms its RoPE cos/sin once for all layers.
    rope_tables: bool,
    /// How paged steps of one token per sequence run ([`BatchDecode`]).
    batch_decode: BatchDecode,
    /// Most rows of one [`Model::forward`] step (0: any); see [`super::ubatch`].
    prefill_chunk: usize,
}

/// The per-tensor callback of a load: adds each tensor's bytes (`u64::MAX`: the rest) and
/// reports the bytes so far of `total` to `progress` when they changed, from a first report
/// of 0; nothing when no weights are resident.
fn load_reporter<'a>(
    total: u64,
    progress: crate::progress::OnProgress<'a>,
) -> impl FnMut(u64) + 'a {
    use crate::progress::{Progress, Stage};
    let mut done = 0u64;
    let mut report = move |done: u64| {
        if total > 0 {
            progress(&Progress {
                stage: Stage::Load,
                done,
                total,
                item: "",
            })
        }
    };
    report(0);
    move |bytes: u64| {
        let now = done.saturating_add(bytes).min(total);
        if now != done {
            done = now;
            report(done);
        }
    }
}

impl Paths {
    /// No recorded path (a tensor-parallel group's driver: its ranks run the ops).
    const OFF: Paths = Paths {
        decode_graphs: false,
        rope_tables: false,
        batch_decode: BatchDecode::Off,
        prefill_chunk: 0,
    };

    fn choose(
        exec: &Executor,
        spec: &ArchSpec,
        c: &ModelConfig,
        opts: &RuntimeOptions,
        weights: &Weights,
        rope: &RopePlan,
    ) -> Paths {
        let first_has = |op: &str| {
            exec.devices()
                .first()
                .is_some_and(|d| d.kind() != DeviceKind::Cpu && d.ops().contains_key(op))
        };
        let decode_graphs = first_has("DecodeAttention")
            && moe_stays_on_device(weights, spec, c) // no routing read back mid-step
            && c.mla.is_none() // its per-head products run on the CPU
            && !weights.low_memory()
            && !rope.length_dependent()
            && !matches!(spec.positions, Positions::Learned(_))
            && opts.cuda_graphs;
        let batch_decode = if decode_graphs && first_has("PagedDecodeAttention") {
            BatchDecode::Graphs
        } else {
            BatchDecode::Off
        };
        Paths {
            decode_graphs,
            // formed once per step on any device that forms them
            rope_tables: exec
                .devices()
                .first()
                .is_some_and(|d| d.ops().contains_key("RotaryTables")),
            batch_decode,
            prefill_chunk: super::step_rows::default_chunk(exec, rope),
        }
    }
}

impl Model {
    /// Builds a model over `source` running on `exec` with the default [`RuntimeOptions`].
    /// Validates the config against the architecture table and the tensors present.
    pub fn new(
        config: ModelConfig,
        source: Arc<dyn WeightSource>,
        exec: Executor,
        precision: Precision,
        low_memory: bool,
    ) -> Result<Model> {
        Model::with_options(
            config,
            source,
            exec,
            precision,
            low_memory,
            &RuntimeOptions::default(),
        )
    }

    /// [`Model::new`] with the switches of `opts` (CUDA graphs, fused ops, the GPU memory cap).
    pub fn with_options(
        config: ModelConfig,
        source: Arc<dyn WeightSource>,
        exec: Executor,
        precision: Precision,
        low_memory: bool,
        opts: &RuntimeOptions,
    ) -> Result<Model> {
        let ignore = &mut crate::progress::ignore;
        Model::with_progress(config, source, exec, precision, low_memory, opts, ignore)
    }

    /// [`Model::with_options`], reporting the bytes of resident weights laid out for the CPU
    /// kernels or copied to the GPU to `progress` ([`Stage::Load`](crate::progress::Stage)).
    pub fn with_progress(
        config: ModelConfig,
        source: Arc<dyn WeightSource>,
        exec: Executor,
        precision: Precision,
        low_memory: bool,
        opts: &RuntimeOptions,
        progress: crate::progress::OnProgress,
    ) -> Result<Model> {
        let spec = arch::lookup(&config.architecture)?;
        validate_config(spec, &config)?;
        let c = &config;
        let mut weights = Weights::new(source, low_memory)?;
        prepare_latent(&mut weights, spec, c)?;
        if let (Some(m), Some(names), Some(dev)) = (&c.moe, &spec.moe, exec.devices().first()) {
            let prefix = |i: usize| format!("{}{i}.", spec.layer_prefix);
            super::moe::stack_experts(
                &mut weights,
                (m, names),
                c.num_layers,
                &prefix,
                dev.as_ref(),
            )?;
        }
        let embed = format!("{}.weight", spec.embed);
        if !weights.has(&embed) {
            return Err(bad(format!("model file lacks the embedding '{embed}'")));
        }
        if spec.norm == NormKind::RmsPlusOne {
            derive_plus_one_norms(&mut weights, spec, c)?;
        }
        let mut rope = RopePlan::new(c, rope_freq_divisors(&weights, c)?)?;
        let mut alibi = match spec.positions {
            Positions::Alibi => Some(Data::from_f32(&[c.num_heads], &alibi_slopes(c.num_heads))?),
            _ => None,
        };
        let mut loaded = load_reporter(weights.resident_bytes() as u64, progress);
        place_weights(
            &exec,
            (spec, precision),
            opts,
            &mut weights,
            (&mut rope, &mut alibi),
            &mut loaded,
        )?;
        loaded(u64::MAX);
        let paths = Paths::choose(&exec, spec, c, opts, &weights, &rope);
        let kv_dtype =
            kv_dtype::resolve(None, exec.devices().first().map(|d| d.as_ref()), precision)?;
        Ok(Model {
            config,
            spec,
            weights,
            exec,
            precision,
            rope,
            alibi,
            tp: None,
            group: None,
            paths,
            id: next_model_id(),
            kv_dtype,
        })
    }

    /// Turns graph-replayed one-token decode steps on or off (on by default where the device
    /// can record work unless [`RuntimeOptions::cuda_graphs`] turned them off at load). Off, or on a device
    /// without recording, every step runs its ops one by one.
    pub fn set_decode_graphs(&mut self, on: bool) {
        self.paths.decode_graphs = on
            && self.tp.is_none()
            && self.group.is_none()
            && self.exec.devices().first().is_some_and(|d| {
                d.kind() != DeviceKind::Cpu && d.ops().contains_key("DecodeAttention")
            })
            && !self.weights.low_memory()
            && moe_stays_on_device(&self.weights, self.spec, &self.config)
            && self.config.mla.is_none()
            && !self.rope.length_dependent()
            && !matches!(self.spec.positions, Positions::Learned(_));
    }

    /// True when the first device forms a step's rotation tables once for all layers
    /// (`RotaryTables`).
    pub(super) fn rope_tables(&self) -> bool {
        self.paths.rope_tables
    }

    /// True when one-token decode steps are recorded and replayed.
    pub fn decode_graphs(&self) -> bool {
        self.paths.decode_graphs
    }

    /// Sets the most prompt rows one step of [`Model::forward`] runs (0: the whole call in one
    /// step); longer calls run in steps of that many rows, so their working tensors stay
    /// bounded while the KV cache alone grows with the prompt. Default: [`super::CPU_PREFILL_CHUNK`] on the CPU, else
    /// 0. `Err` for a model whose rotation depends on how far a step reaches (long-RoPE,
    /// dynamic NTK), which must see a prompt in one step, and for a tensor-parallel group's
    /// driver (its ranks run each step).
    pub fn set_prefill_chunk(&mut self, rows: usize) -> Result<()> {
        if rows > 0 && self.group.is_some() {
            return Err(Error::invalid(format!(
                "prefill chunk of {rows} rows: a tensor-parallel group runs each step whole"
            )));
        }
        if rows > 0 && !super::step_rows::chunk_allowed(&self.rope) {
            return Err(Error::invalid(format!(
                "prefill chunk of {rows} rows: this model's rotation ({:?}) depends on the length a step reaches, so a prompt runs in one step",
                self.config.rope_scaling
            )));
        }
        self.paths.prefill_chunk = rows;
        Ok(())
    }

    /// The most prompt rows one step of [`Model::forward`] runs (0: any).
    pub fn prefill_chunk(&self) -> usize {
        self.paths.prefill_chunk
    }

    /// Sets how new KV caches and pools store keys and values: `Some` dtype when the model's
    /// device stores it (else an `Err` naming the dtype and the device), `None` for the device's
    /// default (f16 in `fast` precision where the device stores it, else f32). Existing caches
    /// keep theirs.
    pub fn set_kv_dtype(&mut self, requested: Option<KvDtype>) -> Result<()> {
        let dev = match self.group {
            Some(_) => None,
            None => self.exec.devices().first().map(|d| d.as_ref()),
        };
        self.kv_dtype = kv_dtype::resolve(requested, dev, self.precision)?;
        Ok(())
    }

    /// How new KV caches store keys and values.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// KV cache bytes per token (keys and values of every layer) in [`Model::kv_dtype`].
    pub fn kv_bytes_per_token(&self) -> usize {
        self.kv_dtype.bytes_per_token(&self.config)
    }

    /// Sets how paged steps of one token per sequence run (default: [`BatchDecode::Graphs`]
    /// where the first device has `PagedDecodeAttention` and records one-token decode steps,
    /// else [`BatchDecode::Off`]). `Err` when the device or model cannot take `mode`.
    pub fn set_batch_decode(&mut self, mode: BatchDecode) -> Result<()> {
        if self.group.is_some() && mode != self.paths.batch_decode {
            return Err(Error::invalid(format!(
                "batched decode mode {mode:?}: a tensor-parallel group's ranks run {:?}, chosen at load (CUDA graphs on or off)",
                self.paths.batch_decode
            )));
        }
        let padded = self.tp.is_none()
            && self.group.is_none()
            && !self.rope.length_dependent()
            && !matches!(self.spec.positions, Positions::Learned(_))
            && self.exec.devices().first().is_some_and(|d| {
                d.kind() != DeviceKind::Cpu && d.ops().contains_key("PagedDecodeAttention")
            });
        let ok = match mode {
            BatchDecode::Off => true,
            BatchDecode::Eager => padded,
            // MoE routing read back mid-step (experts not stacked on the device) and latent
            // attention are not recordable
            BatchDecode::Graphs => {
                padded
                    && !self.weights.low_memory()
                    && moe_stays_on_device(&self.weights, self.spec, &self.config)
                    && self.config.mla.is_none()
            }
        };
        if !ok {
            return Err(Error::invalid(format!(
                "batched decode mode {mode:?} needs a single device with PagedDecodeAttention (and recording, for graphs)"
            )));
        }
        self.paths.batch_decode = mode;
        Ok(())
    }

    /// How paged steps of one token per sequence run (on a tensor-parallel group, how its
    /// ranks run them).
    pub fn batch_decode(&self) -> BatchDecode {
        self.paths.batch_decode
    }

    /// Unique per model in this process (recordings hold its weight addresses).
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// Makes this model (built over a rank's shard) a rank of a tensor-parallel group.
    pub(crate) fn into_rank(mut self, tp: RankTp) -> Result<Model> {
        if let Some(a) = &self.alibi {
            let (n, first) = tp.alibi_heads;
            let all = alibi_slopes(n);
            let mine = all
                .get(first..first + self.config.num_heads)
                .ok_or_else(|| Error::invalid("ALiBi heads out of range"))?;
            let mut d = Data::from_f32(&[mine.len()], mine)?;
            if a.device() != DeviceKind::Cpu {
                if let Some(dev) = self.exec.devices().first() {
                    d = dev.upload(&d)?;
                }
            }
            self.alibi = Some(d);
        }
        // the all-reduces run on the rank's stream, so its steps record and replay as on one
        // device (the collective is recorded with them)
        self.tp = Some(tp);
        Ok(self)
    }

    /// The driver of a tensor-parallel group: a model of `config` whose `forward` and
    /// `new_cache` run on the group's ranks.
    pub(crate) fn driver(
        config: ModelConfig,
        group: Arc<TpGroup>,
        precision: Precision,
    ) -> Result<Model> {
        let spec = arch::lookup(&config.architecture)?;
        // the ranks' batched decode mode, so that callers (the server's warm-up) see it
        let paths = Paths {
            batch_decode: group.batch_decode(),
            ..Paths::OFF
        };
        Ok(Model {
            rope: RopePlan::new(&config, None)?,
            config,
            spec,
            weights: Weights::new(Arc::new(super::weights::MapSource::new()), false)?,
            exec: Executor::new(),
            precision,
            alibi: None,
            tp: None,
            group: Some(group),
            paths,
            id: next_model_id(),
            kv_dtype: KvDtype::F32,
        })
    }

    /// The tensor-parallel group this model drives, if any.
    pub(crate) fn group(&self) -> Option<&Arc<TpGroup>> {
        self.group.as_ref()
    }

    /// The number of tensor-parallel ranks running this model (1 for a single device).
    pub fn tensor_parallel(&self) -> usize {
        self.group.as_ref().map_or(1, |g| g.plan().world())
    }

    /// A handle that tells whether this model's tensor-parallel group stopped (a rank in
    /// another process that disconnected or failed alone); `None` for a single device.
    pub fn group_health(&self) -> Option<GroupHealth> {
        self.group.as_ref().map(GroupHealth::of)
    }

    /// What the ranks of a tensor-parallel model run on (e.g. `cuda:0,1`), `None` otherwise.
    pub fn tensor_parallel_devices(&self) -> Option<&str> {
        self.group.as_ref().map(|g| g.label())
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The dtype in which the resident tensor `name` is held (the file's, or the device's form of
    /// it, e.g. interleaved blocks on the CPU); `None` when it is not resident.
    pub fn weight_dtype(&self, name: &str) -> Option<DataType> {
        self.weights.resident_dtype(name)
    }

    /// True when the resident tensor `name` is a zero-copy view of the model file's bytes (its
    /// mapping), false when it is held in memory of its own (read, re-formed, on a device);
    /// `None` when it is not resident.
    pub fn weight_is_mapped(&self, name: &str) -> Option<bool> {
        let d = self.weights.resident(name)?;
        Some(matches!(d.storage(), crate::data::Storage::Shared { .. }))
    }

    /// Bytes of the weights held in memory (read, derived or re-formed), besides those the
    /// model reads from the file's mapping.
    pub fn resident_weight_bytes(&self) -> usize {
        self.weights.resident_bytes()
    }

    /// The executor (for profiling).
    pub fn executor(&self) -> &Executor {
        &self.exec
    }

    /// The precision mode.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// A KV cache for up to `max_tokens` tokens (0 = the model's context length). Capacity is
    /// reserved up front but only touched as tokens arrive.
    pub fn new_cache(&self, max_tokens: usize) -> Result<KvCache> {
        let c = &self.config;
        let cap = if max_tokens == 0 {
            c.context_length
        } else {
            max_tokens.min(c.context_length.max(1))
        };
        if let Some(g) = &self.group {
            return Ok(KvCache {
                k: Vec::new(),
                v: Vec::new(),
                len: 0,
                cap,
                scratch: Scratch::default(),
                remote: Some(g.new_cache(cap)?),
                graph: None,
            });
        }
        let mut k = Vec::with_capacity(c.num_layers);
        let mut v = Vec::with_capacity(c.num_layers);
        let (dt, hds) = (
            self.kv_dtype.data_type(),
            self.kv_dtype.stored_head_dim(c.head_dim),
        );
        for _ in 0..c.num_layers {
            let mut kd = Data::zeros(dt, &[0, c.num_kv_heads, hds])?;
            kd.reserve(0, cap)?;
            k.push(kd);
            if c.mla.is_none() {
                let mut vd = Data::zeros(dt, &[0, c.num_kv_heads, hds])?;
                vd.reserve(0, cap)?;
                v.push(vd);
            }
        }
        Ok(KvCache {
            k,
            v,
            len: 0,
            cap,
            scratch: Scratch::default(),
            remote: None,
            graph: None,
        })
    }

    /// The MoE config and expert names when layer `i` routes to experts.
    pub(super) fn moe_layer(
        &self,
        i: usize,
    ) -> Option<(&super::moe::MoeConfig, super::moe::MoeNames)> {
        let m = self.config.moe.as_ref().filter(|m| m.is_moe(i))?;
        Some((m, self.spec.moe?))
    }

    /// What the MoE stage reads from this model.
    pub(super) fn moe_step(&self) -> super::moe::MoeStep<'_> {
        super::moe::MoeStep {
            exec: &self.exec,
            weights: &self.weights,
            quant_act: self.precision == Precision::Fast,
            act: &self.config.hidden_act,
        }
    }

    /// Runs `tokens` through the model after the cached ones, appending to `cache`. Returns
    /// logits [n, vocab] on the host: for every new position when `all_logits`, else only the
    /// last one.
    pub fn forward(&self, cache: &mut KvCache, tokens: &[u32], all_logits: bool) -> Result<Data> {
        if self.decode_graph_step(cache, tokens)? {
            if let Some(g) = &cache.graph {
                return g.step.logits.to_owned_host();
            }
        }
        to_host(self.forward_ops(cache, tokens, all_logits)?)
    }

    /// [`Model::forward`] followed by greedy selection on the model's device: only the chosen
    /// token id (the lowest index among equal maxima) crosses to the host, not the logits.
    pub fn forward_greedy(&self, cache: &mut KvCache, tokens: &[u32]) -> Result<u32> {
        if let Some(g) = &self.group {
            self.check_step(cache, tokens)?;
            return Self::on_group(g, cache, tokens.len(), |r, before| {
                g.forward_greedy(r, before, tokens)
            });
        }
        if let Some(id) = self.decode_recorded(cache, tokens)? {
            return match id.as_i32()?.first() {
                Some(&t) => u32::try_from(t).map_err(|_| bad("ArgMax returned a negative id")),
                None => Err(Error::invalid("ArgMax returned no token")),
            };
        }
        let logits = self.forward_ops(cache, tokens, false)?;
        match self.argmax_rows(logits)?.first() {
            Some(&t) => Ok(t),
            None => Err(Error::invalid("ArgMax returned no token")),
        }
    }

    /// A one-token step of `tokens` through the recorded decode step, when it can take that
    /// path: the pick the recording ends with, copied to the host (the argmax id, or a
    /// tensor-parallel rank's `TopK` pairs, see `rank_top::topk_into`). `None`: nothing
    /// ran, the step takes the op-by-op path.
    pub(super) fn decode_recorded(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
    ) -> Result<Option<Data>> {
        if !self.decode_graph_step(cache, tokens)? {
            return Ok(None);
        }
        match &cache.graph {
            Some(g) => g.next.to_owned_host().map(Some),
            None => Err(Error::invalid(
                "decode step ran without its recording state",
            )),
        }
    }

    /// The argmax of each logits row (lowest id on ties). Host logits (a CPU model, or a
    /// tensor-parallel driver, which runs no ops) are checked for NaN/+Inf as in the sampler;
    /// on a GPU the `ArgMax` op runs there and only the ids come back.
    pub(super) fn argmax_rows(&self, logits: Data) -> Result<Vec<u32>> {
        if logits.device() == DeviceKind::Cpu {
            return host_argmax_rows(&logits, self.config.vocab_size);
        }
        let mut ids = Data::empty(DataType::I32);
        ops::argmax(&self.exec, &logits, &mut ids)?;
        to_host(ids)?
            .as_i32()?
            .iter()
            .map(|&t| u32::try_from(t).map_err(|_| bad("ArgMax returned a negative id")))
            .collect()
    }

    /// One-token decode step through recorded work (CUDA graphs). `Ok(false)` when this step
    /// cannot take that path (several tokens, graphs off or unsupported, profiling, a full
    /// cache, a tensor-parallel model): the caller then runs it op by op. On `Ok(true)` the
    /// token is appended to `cache` and its logits and argmax are in `cache.graph`.
    ///
    /// The first such step of a cache runs its ops directly (every buffer gets its size), the
    /// next is recorded once and replayed from then on; the token id and the position (which is
    /// also the KV write slot and the attention length) are written into device tensors before
    /// each replay. A recording made stale by a freed scratch buffer is recorded again; one
    /// that cannot be recorded (an op that allocates, copies to the host or falls back to the
    /// CPU) runs op by op, and after [`MAX_FAILURES`] failures the cache stops trying.
    fn decode_graph_step(&self, cache: &mut KvCache, tokens: &[u32]) -> Result<bool> {
        if !self.paths.decode_graphs
            || tokens.len() != 1
            || cache.remote.is_some()
            || self.exec.profiler().enabled()
            || cache.len + 1 > cache.cap
            || cache.k.len() != self.config.num_layers
            || cache
                .graph
                .as_ref()
                .is_some_and(|g| g.failures >= MAX_FAILURES)
        {
            return Ok(false);
        }
        self.check_tokens(tokens)?;
        let Some(dev) = self.exec.devices().first().cloned() else {
            return Ok(false);
        };
        let mut g = match cache.graph.take() {
            Some(g) if g.model == self.id => g,
            // none yet, or recorded by another model: start over (dropping a recording of
            // another model's weights)
            _ => Box::new(DecodeGraph {
                model: self.id,
                step: StepBufs::new(dev.as_ref(), 1, SCRATCH_BUFS)?,
                next: Data::empty(DataType::I32),
                recording: None,
                eager_steps: 0,
                failures: 0,
            }),
        };
        let r = self.graph_step_on(dev.as_ref(), &mut g, cache, tokens[0]);
        cache.graph = Some(g);
        r?;
        let len = cache.len + 1;
        for d in cache.k.iter_mut().chain(cache.v.iter_mut()) {
            d.set_len(0, len)?;
        }
        cache.len = len;
        Ok(true)
    }

    fn graph_step_on(
        &self,
        dev: &dyn crate::device::BaseDevice,
        g: &mut DecodeGraph,
        cache: &mut KvCache,
        token: u32,
    ) -> Result<()> {
        let pos = i32::try_from(cache.len).map_err(|_| bad("position too large"))?;
        dev.write(&Data::from_i32(&[1], &[token as i32])?, &mut g.step.ids)?;
        dev.write(&Data::from_i32(&[1], &[pos])?, &mut g.step.pos)?;
        let mut rec = g.recording.take();
        let sized = g.eager_steps > 0;
        let r = replay_or_record(dev, &mut rec, sized, || self.graph_ops(g, cache));
        g.recording = rec;
        match r? {
            Recorded::Replayed => return Ok(()),
            Recorded::Failed(why) => {
                g.failures += 1;
                if g.failures == 1 {
                    eprintln!(
                        "fastllm: decode step not recorded as a graph ({why}); running it op by op"
                    );
                }
            }
            Recorded::NotTried | Recorded::NotReplayed => {}
        }
        self.graph_ops(g, cache)?;
        g.eager_steps += 1;
        Ok(())
    }

    /// The ops of one graph-mode decode step (recorded or run directly).
    fn graph_ops(&self, g: &mut DecodeGraph, cache: &mut KvCache) -> Result<()> {
        let DecodeGraph { step, next, .. } = g;
        let StepBufs {
            ids,
            pos,
            bufs,
            workspace,
            logits,
        } = step;
        {
            let mut kv = GraphKv::new(Layers::new(&mut cache.k, &mut cache.v), pos, workspace);
            self.layers(ids, pos, &[0], &mut kv, bufs, logits, true)?;
        }
        match self.tp {
            // a rank's local vocabulary is its slice plus the zero row
            Some(_) => super::rank_top::topk_into(
                &self.exec,
                logits,
                self.config.vocab_size.saturating_sub(1),
                next,
            ),
            None => ops::argmax(&self.exec, logits, next),
        }
    }

    /// One token per logits row (`logits` [rows, vocab], as [`Model::forward_device`] leaves
    /// them), picked with each row's choices of `rows`. Host logits (a CPU model, a
    /// tensor-parallel driver) are sampled on the host; elsewhere the `ApplyPenalties` (on a
    /// copy, when a row has penalties) and `Sample` ops run where the logits are and only the
    /// ids come back. Both give the same ids for the same logits (see
    /// `crate::model::sampler`). A row with NaN or +Inf logits (or only -Inf) is an `Err`.
    /// A step where a row has a grammar mask is picked on the host (the logits are copied
    /// back), so the mask holds on every device.
    pub fn sample_rows(&self, logits: &Data, rows: &[SampleRow]) -> Result<Vec<u32>> {
        let vocab = self.config.vocab_size;
        if vocab == 0 || logits.dims() != [rows.len(), vocab] {
            return Err(bad(format!(
                "sample_rows: logits {:?} are not {} rows of {vocab}",
                logits.dims(),
                rows.len()
            )));
        }
        if logits.device() == DeviceKind::Cpu || rows.iter().any(|r| r.mask.is_some()) {
            let v = match logits.device() {
                DeviceKind::Cpu => logits.to_f32_vec()?,
                _ => logits.to_owned_host()?.to_f32_vec()?,
            };
            return v
                .chunks(vocab)
                .zip(rows)
                .map(|(l, r)| sample_logits(l, r))
                .collect();
        }
        let penalized = self.penalize_on_device(logits, rows)?;
        self.sample_on_device(penalized.as_ref().unwrap_or(logits), rows)
    }

    /// The rows' repetition / presence / frequency penalties applied to a copy of `logits` on
    /// their device (`ApplyPenalties`; the caller's logits stay unchanged); `None` when no row
    /// has a penalized token.
    fn penalize_on_device(&self, logits: &Data, rows: &[SampleRow]) -> Result<Option<Data>> {
        let n = rows.len();
        let m = rows
            .iter()
            .map(|r| r.penalties.as_ref().map_or(0, |p| p.tokens.len()))
            .max()
            .unwrap_or(0);
        if m == 0 {
            return Ok(None);
        }
        let mut toks = vec![-1i32; n * m];
        let mut counts = vec![0i32; n * m];
        let mut params = vec![0f32; n * 3];
        for (i, r) in rows.iter().enumerate() {
            params[3 * i] = 1.0;
            if let Some(p) = &r.penalties {
                params[3 * i..3 * i + 3].copy_from_slice(&[p.repetition, p.presence, p.frequency]);
                for (j, &(t, c)) in p.tokens.iter().enumerate() {
                    toks[i * m + j] = i32::try_from(t).unwrap_or(-1);
                    counts[i * m + j] = i32::try_from(c).unwrap_or(i32::MAX);
                }
            }
        }
        let e = &self.exec;
        let mut copy = Data::empty(DataType::F32);
        ops::mul(e, logits, 1.0, &mut copy)?;
        let toks = Data::from_i32(&[n, m], &toks)?;
        let counts = Data::from_i32(&[n, m], &counts)?;
        let params = Data::from_f32(&[n, 3], &params)?;
        let mut d = DataDict::new()
            .with_mut("input", &mut copy)
            .with("tokens", &toks)
            .with("counts", &counts)
            .with("params", &params);
        e.run("ApplyPenalties", &mut d, &FloatDict::new(), &IntDict::new())?;
        Ok(Some(copy))
    }

    /// One pick per row of `x` with the `Sample` op on the logits' device; only the ids come
    /// back (and, when a row has no valid pick, that row to say why).
    fn sample_on_device(&self, x: &Data, rows: &[SampleRow]) -> Result<Vec<u32>> {
        let (n, vocab) = (rows.len(), self.config.vocab_size);
        let mut params = Vec::with_capacity(n * 4);
        let mut random = Vec::with_capacity(n * 2);
        for r in rows {
            let k = r.kernel_params();
            params.extend([k.temperature, k.top_k.min(1 << 24) as f32, k.top_p, k.min_p]);
            random.extend([k.random as u32 as i32, (k.random >> 32) as u32 as i32]);
        }
        let params = Data::from_f32(&[n, 4], &params)?;
        let random = Data::from_i32(&[n, 2], &random)?;
        let mut ids = Data::empty(DataType::I32);
        let mut d = DataDict::new()
            .with("input", x)
            .with("params", &params)
            .with("random", &random)
            .with_mut("output", &mut ids);
        self.exec
            .run("Sample", &mut d, &FloatDict::new(), &IntDict::new())?;
        let ids = to_host(ids)?;
        let ids = ids.as_i32()?;
        let mut out = Vec::with_capacity(n);
        for (i, &t) in ids.iter().take(n).enumerate() {
            match u32::try_from(t) {
                Ok(t) => out.push(t),
                Err(_) => {
                    // only on failure: bring this row back to say why
                    let row = x.to_owned_host()?.to_f32_vec()?;
                    let r = row.get(i * vocab..(i + 1) * vocab).unwrap_or(&[]);
                    return Err(pick_error(r));
                }
            }
        }
        Ok(out)
    }

    /// [`Model::forward`] with the logits left where the last op wrote them (the GPU, when the
    /// model runs there); pass them to [`Model::sample_rows`] to pick tokens there. One-token
    /// steps take the recorded decode step (CUDA graphs) where [`Model::forward`] would; the
    /// logits returned are then a device copy of that step's logits (the recording's own buffer
    /// is overwritten by the next step).
    pub fn forward_device(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Data> {
        if self.decode_graph_step(cache, tokens)? {
            if let Some(g) = &cache.graph {
                let mut out = Data::empty(DataType::F32);
                ops::mul(&self.exec, &g.step.logits, 1.0, &mut out)?;
                return Ok(out);
            }
        }
        self.forward_ops(cache, tokens, all_logits)
    }

    /// [`Model::forward_device`] op by op (no recorded step).
    fn forward_ops(&self, cache: &mut KvCache, tokens: &[u32], all_logits: bool) -> Result<Data> {
        let c = &self.config;
        let s = tokens.len();
        self.check_step(cache, tokens)?;
        if let Some(g) = &self.group {
            return Self::on_group(g, cache, s, |r, before| {
                g.forward(r, before, tokens, all_logits)
            });
        }
        if cache.k.len() != c.num_layers {
            return Err(Error::invalid("KV cache belongs to another model"));
        }
        let chunk = self.paths.prefill_chunk;
        if chunk > 0 && s > chunk {
            return self.forward_chunks(cache, tokens, all_logits, chunk);
        }
        self.forward_step(cache, tokens, all_logits)
    }

    /// One step of [`Model::forward_ops`] over all of `tokens` (checked by the caller).
    pub(super) fn forward_step(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Data> {
        let s = tokens.len();
        let pos: Vec<i32> = (cache.len..cache.len + s).map(|p| p as i32).collect();
        let rows: Vec<i32> = if all_logits {
            (0..s as i32).collect()
        } else {
            vec![s as i32 - 1]
        };
        let mut scratch = std::mem::take(&mut cache.scratch);
        let before = cache.len;
        let kv = KvSource::Cache(&mut cache.k, &mut cache.v);
        let r = self.forward_rows(tokens, &pos, &rows, &[0, s], kv, &mut scratch);
        cache.scratch = scratch;
        match r {
            Ok(l) => {
                cache.len += s;
                Ok(l)
            }
            Err(e) => {
                cache.truncate(before)?;
                Err(e)
            }
        }
    }

    /// `Err` unless `tokens` (at least one, each in the vocabulary) fit after `cache`'s.
    fn check_step(&self, cache: &KvCache, tokens: &[u32]) -> Result<()> {
        let s = tokens.len();
        if s == 0 {
            return Err(Error::invalid("forward: no tokens"));
        }
        if cache.len + s > cache.cap {
            return Err(Error::ContextFull(format!(
                "{} cached + {s} new tokens exceed the context of {}",
                cache.len, cache.cap
            )));
        }
        self.check_tokens(tokens)
    }

    /// Runs `step` (given the ranks' cache and its length) for `s` new tokens on group `g`
    /// and counts them into `cache`.
    fn on_group<T>(
        g: &Arc<TpGroup>,
        cache: &mut KvCache,
        s: usize,
        step: impl FnOnce(&RemoteCache, usize) -> Result<T>,
    ) -> Result<T> {
        let r = match &cache.remote {
            Some(r) if Arc::ptr_eq(r.group(), g) => r,
            _ => return Err(Error::invalid("KV cache belongs to another model")),
        };
        let out = step(r, cache.len)?;
        cache.len += s;
        Ok(out)
    }

    /// `Err` unless every id of `tokens` is in the vocabulary.
    pub(super) fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.config.vocab_size;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(t) => Err(Error::invalid(format!(
                "token id {t} out of range (vocabulary {vocab})"
            ))),
            None => Ok(()),
        }
    }

    /// The layer stack over rows `tokens` at positions `pos`, keys/values kept by `kv`;
    /// returns logits for the rows listed in `logit_rows`. `runs` gives where each sequence's
    /// rows start (as `q_starts`), for rotations that depend on how far a sequence reaches.
    pub(super) fn forward_rows(
        &self,
        tokens: &[u32],
        pos: &[i32],
        logit_rows: &[i32],
        runs: &[usize],
        kv: KvSource,
        scratch: &mut Scratch,
    ) -> Result<Data> {
        let s = tokens.len();
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let ids = Data::from_i32(&[s], &ids)?;
        let pos_host = pos;
        let pos = Data::from_i32(&[s], pos)?;

        // Positions are read by every RoPE call: put them on the first device once per step
        // rather than letting the executor copy them for each call.
        let pos = match self.exec.devices().first() {
            Some(d) if d.kind() != DeviceKind::Cpu && self.spec.positions == Positions::Rope => {
                d.upload(&pos)?
            }
            _ => pos,
        };
        let mut sc = scratch.take(SCRATCH_BUFS);
        if self.rope.length_dependent() && self.spec.positions == Positions::Rope {
            // this step's cos/sin tables, where `layers` reads them (the last two buffers)
            let (cos, sin) = self
                .rope
                .global
                .step_tables(self.config.rope_dim, pos_host, runs)?;
            let dev = self
                .exec
                .devices()
                .first()
                .filter(|d| d.kind() != DeviceKind::Cpu);
            let n = sc.len();
            let place = |t: Data| match dev {
                Some(d) => d.upload(&t),
                None => Ok(t),
            };
            sc[n - 2] = place(cos)?;
            sc[n - 1] = place(sin)?;
        }
        let mut logits = Data::empty(DataType::F32);
        let r = {
            let mut store: Box<dyn StepKv> = match kv {
                KvSource::Cache(k, v) => Box::new(CacheKv {
                    layers: Layers::new(k, v),
                }),
                KvSource::Paged(k, v, index) => Box::new(PagedKv::new(k, v, index)),
            };
            self.layers(
                &ids,
                &pos,
                logit_rows,
                store.as_mut(),
                &mut sc,
                &mut logits,
                false,
            )
        };
        scratch.give(sc);
        r.map(|()| logits)
    }

    /// Layer `i`'s latent attention ([`super::mla`]) of the normed input `h` into `a`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn latent_attention(
        &self,
        i: usize,
        names: &super::mla::MlaNames,
        m: &super::mla::MlaConfig,
        rope: &RotaryParams,
        kv: &mut dyn KvStore,
        h: &Data,
        a: &mut Data,
    ) -> Result<()> {
        let c = &self.config;
        let af = super::rope::attention_factor(&self.rope.layer(c, i).scaling);
        let st = super::mla::MlaStep {
            exec: &self.exec,
            weights: &self.weights,
            quant_act: self.precision == Precision::Fast,
            heads: c.num_heads,
            rope_dim: c.rope_dim,
            rope_q_scale: af * af,
        };
        let ap = AttentionParams {
            scale: m.attention_scale(c.rope_dim),
            softcap: 0.0,
            sliding_window: 0,
            alibi: None,
            fast: self.precision == Precision::Fast,
            output_copy: OutputCopy::None,
            sinks: None,
        };
        let p = format!("{}{i}.", self.spec.layer_prefix);
        super::mla::mla_attention(&st, m, names, &p, i, h, rope, kv, &ap, a)
    }
}

/// Argmax of each `vocab`-long row of host `logits` (lowest id on ties); NaN or +Inf is an
/// `Err`, as in the sampler.
fn host_argmax_rows(logits: &Data, vocab: usize) -> Result<Vec<u32>> {
    let copy;
    let v: &[f32] = match logits.as_f32() {
        Ok(v) if v.len() == logits.count() => v,
        _ => {
            copy = logits.to_f32_vec()?;
            &copy
        }
    };
    if vocab == 0 || !v.len().is_multiple_of(vocab) {
        return Err(bad(format!(
            "logits of {} values are not rows of {vocab}",
            v.len()
        )));
    }
    v.chunks(vocab)
        .map(|row| {
            super::sampler::checked_argmax(row)
                .ok_or_else(|| Error::invalid("logits contain NaN or +Inf"))
        })
        .collect()
}

/// The caches a step over the contiguous cache or the paged pool keeps keys and values in.
pub(super) enum KvSource<'c> {
    /// A sequence's layers (keys, values).
    Cache(&'c mut [Data], &'c mut [Data]),
    /// A paged pool's layers and the step's index arrays.
    Paged(&'c mut [Data], &'c mut [Data], &'c PagedIndex),
}

/// `d` on the host (a copy when it lives on a device).
pub(super) fn to_host(d: Data) -> Result<Data> {
    if d.device() != DeviceKind::Cpu {
        d.to_owned_host()
    } else {
        Ok(d)
    }
}

/// True when a step of this model keeps the MoE stage on its device: a dense model, or one
/// whose every MoE layer has its experts stacked ([`super::moe::stack_experts`]).
fn moe_stays_on_device(weights: &Weights, spec: &ArchSpec, c: &ModelConfig) -> bool {
    let (Some(m), Some(names)) = (&c.moe, &spec.moe) else {
        return c.moe.is_none();
    };
    (0..c.num_layers).filter(|&i| m.is_moe(i)).all(|i| {
        let layer = format!("{}{i}.", spec.layer_prefix);
        weights
            .resident(&format!(
                "{}.weight",
                super::moe::stacked_name(&layer, names, names.proj.0)
            ))
            .is_some()
    })
}

/// Checks a latent-attention model's config against its architecture and derives each layer's
/// per-head key/value matrices ([`super::mla::prepare`]); nothing for other models.
fn prepare_latent(weights: &mut Weights, spec: &ArchSpec, c: &ModelConfig) -> Result<()> {
    let names = match (spec.qkv, &c.mla) {
        (Qkv::Latent(names), Some(m)) => {
            m.validate(&c.architecture, c.head_dim, c.num_kv_heads, c.rope_dim)?;
            names
        }
        (Qkv::Latent(_), None) => {
            return Err(bad(format!(
                "{}: the config lacks the latent attention sizes",
                c.architecture
            )))
        }
        (_, Some(_)) => return Err(bad(format!("{}: has no latent attention", c.architecture))),
        _ => return Ok(()),
    };
    if let Some(m) = &c.mla {
        for i in 0..c.num_layers {
            let p = format!("{}{i}.", spec.layer_prefix);
            super::mla::prepare(weights, &names, m, c.num_heads, &p)?;
        }
    }
    Ok(())
}

/// `Err` when the weights to upload to `device` exceed `cap` bytes
/// ([`RuntimeOptions::gpu_memory_cap`]).
fn check_memory_cap(w: &Weights, device: &str, cap: Option<usize>) -> Result<()> {
    if let Some(cap) = cap {
        let need = w.resident_bytes();
        if need > cap {
            return Err(Error::OutOfMemory(format!(
                "{device}: the weights need {:.2} GiB, over the per-GPU cap of {:.2} GiB \
                 (the GPU memory cap option); split the model over more GPUs (--tp N)",
                need as f64 / (1u64 << 30) as f64,
                cap as f64 / (1u64 << 30) as f64
            )));
        }
    }
    Ok(())
}

/// Rotary inverse frequencies of `c`'s base with `scaling` applied, at the start of a
/// sequence ([`super::rope::inv_freq_f64`]).
pub fn inv_freq(c: &ModelConfig, scaling: &RopeScaling) -> Vec<f32> {
    super::rope::inv_freq_f64(c.rope_dim, c.rope_theta, scaling, 0)
        .iter()
        .map(|&f| f as f32)
        .collect()
}

/// The per-frequency divisors a GGUF carries as `rope_freqs.weight` (llama.cpp's form of the
/// llama3 rope scaling; kept in `.flm` as [`ROPE_FREQS_TENSOR`]), checked: `rope_dim / 2` finite
/// positive values. `None` when the model has none.
///
/// [`ROPE_FREQS_TENSOR`]: super::ROPE_FREQS_TENSOR
fn rope_freq_divisors(weights: &Weights, c: &ModelConfig) -> Result<Option<Vec<f32>>> {
    let name = super::ROPE_FREQS_TENSOR;
    let Some(w) = weights.opt(name)? else {
        return Ok(None);
    };
    let v = w.to_f32_vec()?;
    if v.len() != c.rope_dim / 2 || v.iter().any(|d| !d.is_finite() || *d <= 0.0) {
        return Err(bad(format!(
            "{name}: expected {} positive rope frequency divisors (rope dim {}), got {} values{}",
            c.rope_dim / 2,
            c.rope_dim,
            v.len(),
            if v.len() == c.rope_dim / 2 {
                " with a zero, negative or non-finite one"
            } else {
                ""
            }
        )));
    }
    Ok(Some(v))
}

/// ALiBi slopes for `n` heads (Press et al.; Bloom's `build_alibi_tensor`).
pub fn alibi_slopes(n: usize) -> Vec<f32> {
    let cp = 1usize << (usize::BITS - 1 - n.max(1).leading_zeros());
    let base = 2f64.powf(-(2f64.powf(-((cp as f64).log2() - 3.0))));
    let mut s: Vec<f64> = (1..=cp).map(|i| base.powi(i as i32)).collect();
    if cp != n {
        let extra = 2f64.powf(-(2f64.powf(-((2.0 * cp as f64).log2() - 3.0))));
        let k = (n - cp).min(cp);
        s.extend((0..k).map(|i| extra.powi((1 + 2 * i) as i32)));
    }
    s.iter().map(|&v| v as f32).collect()
}
