//! Loading a `.flm` model into an `Llm`: opens the file (mmap or low-memory mode), builds the
//! executor for the requested device, the model graph and the tokenizer.

use crate::data::Data;
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::format::flm::{FlmFile, LoadMode};
use crate::generate::Llm;
use crate::model::tensor_parallel::{rank_model, RankBuilder, ShardPlan, TpGroup};
use crate::model::tp_process::Follower;
use crate::model::{KvDtype, Model, Precision, WeightSource};
use crate::options::RuntimeOptions;
use crate::parallel::rendezvous::GroupSpec;
use crate::parallel::HostCollective;
use crate::tokenizer::Tokenizer;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How to load a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// CPU threads (0 = all cores).
    pub threads: usize,
    /// `cpu`, `cuda`, `cuda:N`, or `cuda:0,1[,...]` (tensor parallelism over those GPUs).
    pub device: String,
    /// Low-memory mode: weights read from disk right before use.
    pub low_memory: bool,
    /// Activation precision.
    pub precision: Precision,
    /// The run-time switches (CUDA graphs, fused ops, GPU memory cap, SIMD cap, cache dir).
    pub runtime: RuntimeOptions,
    /// KV cache dtype; `None` = the device's default (f16 in `fast` precision, else f32). A
    /// dtype the device does not store (q8_0 on a GPU) is an error naming it.
    pub kv_dtype: Option<KvDtype>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: 0,
            device: "cpu".into(),
            low_memory: false,
            precision: Precision::Fast,
            runtime: RuntimeOptions::default(),
            kv_dtype: None,
        }
    }
}

impl WeightSource for FlmFile {
    fn tensor(&self, name: &str) -> Result<Data> {
        FlmFile::tensor(self, name)
    }
    fn has(&self, name: &str) -> bool {
        self.has_tensor(name)
    }
    fn names(&self) -> Vec<String> {
        self.tensor_names().map(|s| s.to_string()).collect()
    }
}

/// Builds the executor for a device string: `cpu`, or `cuda` / `cuda:N` (the GPU first, the CPU
/// after it as the fallback for ops the GPU does not run). A build without the `cuda` feature, or
/// a machine without a usable GPU, gives an `Err` for `cuda`. Applies `opts.simd` (the CPU
/// kernels' SIMD cap) and gives the GPU `opts`'s kernel cache.
pub fn executor_for(device: &str, threads: usize, opts: &RuntimeOptions) -> Result<Executor> {
    crate::options::apply_simd_cap(opts.simd)?;
    match device {
        "cpu" | "" => Executor::cpu_with(threads, opts.fused_ops),
        d if d == "cuda" || d.starts_with("cuda:") => cuda_executor(d, threads, opts),
        d => Err(Error::invalid(format!(
            "device '{d}' (expected cpu, cuda or cuda:N)"
        ))),
    }
}

#[cfg(feature = "cuda")]
fn cuda_executor(d: &str, threads: usize, opts: &RuntimeOptions) -> Result<Executor> {
    let ordinal = match d.strip_prefix("cuda:") {
        Some(n) => n.parse::<u32>().map_err(|_| {
            Error::invalid(format!("device '{d}': expected cuda:N with N a GPU number"))
        })?,
        None => 0,
    };
    let mut e = Executor::new();
    e.add_device(Arc::new(crate::devices::cuda::CudaDevice::with_options(
        ordinal, opts,
    )?));
    e.add_device(Arc::new(crate::devices::cpu::CpuDevice::new(threads)?));
    Ok(e)
}

#[cfg(not(feature = "cuda"))]
fn cuda_executor(d: &str, _threads: usize, _opts: &RuntimeOptions) -> Result<Executor> {
    Err(Error::Unsupported(format!(
        "device '{d}': this build has no CUDA support (feature 'cuda')"
    )))
}

/// Builds a model of `config` over `source` on `device`: `cpu`, `cuda`, `cuda:N`, or a
/// tensor-parallel group of GPUs `cuda:0,1[,...]` (one rank per GPU, NCCL all-reduces; see
/// `model::tensor_parallel`), with the switches of `opts`.
pub fn model_for(
    config: crate::model::ModelConfig,
    source: Arc<dyn WeightSource>,
    device: &str,
    threads: usize,
    precision: Precision,
    low_memory: bool,
    opts: &RuntimeOptions,
) -> Result<Model> {
    match crate::parallel::parse_gpu_group(device, 0)? {
        Some(gpus) => {
            crate::options::apply_simd_cap(opts.simd)?;
            cuda_group(config, source, &gpus, threads, precision, low_memory, opts)
        }
        None => Model::with_options(
            config,
            source,
            executor_for(device, threads, opts)?,
            precision,
            low_memory,
            opts,
        ),
    }
}

/// [`model_for`] with the settings of `opts`; a model on one device reports its load to
/// `progress`.
fn model_with(
    config: crate::model::ModelConfig,
    source: Arc<dyn WeightSource>,
    opts: &LoadOptions,
    progress: crate::progress::OnProgress,
) -> Result<Model> {
    let (device, rt) = (&opts.device, &opts.runtime);
    let mut model = match crate::parallel::parse_gpu_group(device, 0)? {
        Some(_) => model_for(
            config,
            source,
            device,
            opts.threads,
            opts.precision,
            opts.low_memory,
            rt,
        )?,
        None => Model::with_progress(
            config,
            source,
            executor_for(device, opts.threads, rt)?,
            opts.precision,
            opts.low_memory,
            rt,
            progress,
        )?,
    };
    model.set_kv_dtype(opts.kv_dtype)?;
    Ok(model)
}

/// An opened `.flm` file with what an `Llm` needs besides its model.
struct Opened {
    file: FlmFile,
    tokenizer: Tokenizer,
    chat_template: String,
    name: String,
}

fn open(path: &Path, opts: &LoadOptions) -> Result<Opened> {
    let mode = if opts.low_memory {
        LoadMode::LowMemory
    } else {
        LoadMode::Mmap
    };
    let file = FlmFile::open(path, mode)?;
    let tokenizer = Tokenizer::new(file.tokenizer_spec().clone())?;
    let chat_template = file
        .chat_template()
        .map(|s| s.to_string())
        .unwrap_or_else(|| {
            let has = |t: &str| tokenizer.token_id(t).is_some();
            crate::generate::chat::default_template(&file.config().architecture, has).to_string()
        });
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Opened {
        file,
        tokenizer,
        chat_template,
        name,
    })
}

/// Loads a `.flm` file.
pub fn load(path: &Path, opts: &LoadOptions) -> Result<Llm> {
    load_with(path, opts, &mut crate::progress::ignore)
}

/// [`load`], reporting the weights prepared ([`Stage::Load`](crate::progress::Stage)) to
/// `progress` (a model on one device; a tensor-parallel group reports nothing).
pub fn load_with(
    path: &Path,
    opts: &LoadOptions,
    progress: crate::progress::OnProgress,
) -> Result<Llm> {
    let o = open(path, opts)?;
    let config = o.file.config().clone();
    let model = model_with(config, Arc::new(o.file), opts, progress)?;
    Ok(Llm {
        model,
        tokenizer: o.tokenizer,
        chat_template: o.chat_template,
        name: o.name,
    })
}

/// What [`load_in_group`] made of this process.
pub enum GroupMember {
    /// Node 0: the model of the whole group, used like any other.
    Driver(Box<Llm>),
    /// Another node: [`Follower::run`] serves node 0's steps until it ends the group.
    Follower(Follower),
}

/// Loads a `.flm` file as one process of a tensor-parallel group of processes (see
/// `parallel::rendezvous`): every process loads the same file and keeps only its ranks'
/// shards; `opts.device` is `cpu` (one rank per process) or this process's GPUs (`cuda`,
/// `cuda:N` or `cuda:0,1`, as many as `spec.per_node()`; `cuda` alone means GPUs from 0).
pub fn load_in_group(path: &Path, opts: &LoadOptions, spec: &GroupSpec) -> Result<GroupMember> {
    use crate::model::tp_process::GroupRole;
    let o = open(path, opts)?;
    let config = o.file.config().clone();
    Ok(
        match model_in_group(spec, config, Arc::new(o.file), opts)? {
            GroupRole::Driver(model) => GroupMember::Driver(Box::new(Llm {
                model: *model,
                tokenizer: o.tokenizer,
                chat_template: o.chat_template,
                name: o.name,
            })),
            GroupRole::Follower(f) => GroupMember::Follower(f),
        },
    )
}

/// The model of `config` over `source` as one process of a group (see [`load_in_group`]):
/// node 0's driver, or a follower. Every process must pass the same weights (the same file,
/// or the same synthetic shape, whose weights are deterministic). An explicit `kv_dtype` is
/// refused: every rank keeps its device's default.
pub fn model_in_group(
    spec: &GroupSpec,
    config: crate::model::ModelConfig,
    source: Arc<dyn WeightSource>,
    opts: &LoadOptions,
) -> Result<crate::model::tp_process::GroupRole> {
    use crate::model::tp_process::{self, RankSetup};
    if let Some(k) = opts.kv_dtype {
        return Err(Error::Unsupported(format!(
            "KV cache dtype {k}: a group of processes keeps each rank's device default (f16 in \
             fast precision, else f32); drop --kv-dtype"
        )));
    }
    let setup = RankSetup {
        threads: opts.threads,
        precision: opts.precision,
        low_memory: opts.low_memory,
        runtime: opts.runtime.clone(),
    };
    if opts.device == "cpu" {
        crate::options::apply_simd_cap(opts.runtime.simd)?;
        let threads = opts.threads.max(1);
        tp_process::cpu_process_group(spec, config, source, &setup, &|| Executor::cpu(threads))
    } else {
        group_on_gpus(spec, config, source, &opts.device, &setup)
    }
}

#[cfg(feature = "cuda")]
fn group_on_gpus(
    spec: &GroupSpec,
    config: crate::model::ModelConfig,
    source: Arc<dyn WeightSource>,
    device: &str,
    setup: &crate::model::tp_process::RankSetup,
) -> Result<crate::model::tp_process::GroupRole> {
    let gpus = match crate::parallel::parse_gpu_group(device, spec.per_node())? {
        Some(g) => g,
        None if device == "cuda" => vec![0],
        None => match device.strip_prefix("cuda:").map(str::parse::<u32>) {
            Some(Ok(g)) => vec![g],
            _ => {
                return Err(Error::invalid(format!(
                    "device '{device}' for a group of processes: use cpu or cuda[:N[,M...]]"
                )))
            }
        },
    };
    cuda_process_group(spec, config, source, &gpus, setup)
}

/// [`crate::model::tp_process::device_process_group`] over the local GPUs `ordinals`: one
/// CUDA device (with the CPU as its fallback) and one NCCL communicator per rank.
#[cfg(feature = "cuda")]
fn cuda_process_group(
    spec: &GroupSpec,
    config: crate::model::ModelConfig,
    source: Arc<dyn WeightSource>,
    ordinals: &[u32],
    setup: &crate::model::tp_process::RankSetup,
) -> Result<crate::model::tp_process::GroupRole> {
    use crate::devices::cuda::{gpu, nccl, CudaDevice};
    use crate::model::tp_process::{device_process_group, DeviceRanks, RankParts};
    for &o in ordinals {
        gpu::probe(o)?;
    }
    nccl::probe()?;
    let (ords, world, s) = (ordinals.to_vec(), spec.tp, setup.clone());
    let timeout = spec.timeout;
    let rank: RankParts = Arc::new(move |id: &[u8], rank: usize, i: usize| {
        let ord = *ords
            .get(i)
            .ok_or_else(|| Error::invalid(format!("no local GPU for rank {rank}")))?;
        let dev = CudaDevice::with_options(ord, &s.runtime)?;
        // the kernels load (a first load JITs them: up to a minute) before any peer waits
        dev.warm_up()?;
        let comm = nccl::NcclComm::new(dev.gpu(), &nccl::NcclId::from_bytes(id)?, rank, world)?;
        if let Some(g) = comm.enable_p2p(s.runtime.peer_all_reduce, timeout)? {
            dev.attach_group(g)?;
        }
        let mut exec = Executor::new();
        exec.add_device(Arc::new(dev));
        exec.add_device(Arc::new(crate::devices::cpu::CpuDevice::new(
            if s.threads == 0 { 2 } else { s.threads },
        )?));
        Ok((exec, Arc::new(comm) as Arc<dyn crate::parallel::Collective>))
    });
    let dev = DeviceRanks {
        kind: "cuda",
        local: ordinals.len(),
        new_id: &|| Ok(nccl::NcclId::new()?.to_bytes()),
        rank,
    };
    device_process_group(spec, config, source, setup, &dev)
}

#[cfg(not(feature = "cuda"))]
fn group_on_gpus(
    _spec: &GroupSpec,
    _config: crate::model::ModelConfig,
    _source: Arc<dyn WeightSource>,
    device: &str,
    _setup: &crate::model::tp_process::RankSetup,
) -> Result<crate::model::tp_process::GroupRole> {
    Err(Error::Unsupported(format!(
        "device '{device}' for a group of processes: this build has no CUDA support (feature 'cuda')"
    )))
}

/// A random-weight model of the shape `name` (one of `model::synthetic::KNOWN`) with matrix
/// weights in `dtype` (`f16`, `int8`, `int4`), built directly for `opts.device`, with the
/// byte-level stand-in tokenizer of `model::synthetic::tokenizer_spec` (ids 0..255 are bytes;
/// other ids decode to a fixed piece) and the ChatML template. For measuring speed end to end
/// (`fastllm serve --synthetic`); its text is meaningless. Unknown names or dtypes are an
/// `Err` listing the known ones.
pub fn load_synthetic(name: &str, dtype: &str, opts: &LoadOptions) -> Result<Llm> {
    use crate::model::synthetic;
    let config = synthetic::config(name)?;
    let dt = synthetic::weight_dtype(dtype)?;
    let tokenizer = Tokenizer::new(synthetic::tokenizer_spec(&config)?)?;
    let source = Arc::new(crate::model::SyntheticSource::new(&config, dt)?);
    let model = model_with(config, source, opts, &mut crate::progress::ignore)?;
    Ok(Llm {
        model,
        tokenizer,
        chat_template: crate::generate::chat::CHATML.to_string(),
        name: format!("{name}-{dtype}-synthetic"),
    })
}

/// A tensor-parallel model over `world` CPU ranks (threads) whose all-reduce is done on the
/// host: the same sharding and math as on GPUs, for tests and CI. `threads` per rank.
pub fn cpu_group(
    config: crate::model::ModelConfig,
    source: Arc<dyn WeightSource>,
    world: usize,
    threads: usize,
    precision: Precision,
) -> Result<Model> {
    let plan = ShardPlan::new(&config, world)?;
    let comms = HostCollective::group(world, Duration::from_secs(600))?;
    let builders: Vec<RankBuilder> = comms
        .into_iter()
        .enumerate()
        .map(|(r, comm)| {
            let (plan, source) = (plan.clone(), source.clone());
            Box::new(move || {
                let exec = Executor::cpu(threads.max(1))?;
                let opts = RuntimeOptions::default();
                rank_model(
                    &plan,
                    r,
                    source,
                    exec,
                    Arc::new(comm),
                    precision,
                    false,
                    &opts,
                )
            }) as RankBuilder
        })
        .collect();
    let group = TpGroup::start(plan, builders, &format!("cpu x{world}"))?;
    Model::driver(config, Arc::new(group), precision)
}

/// How long a rank of a group in this process waits for a peer inside a peer-to-peer
/// all-reduce before the step fails (the default of `--rendezvous-timeout` for processes).
#[cfg(feature = "cuda")]
const PEER_WAIT: Duration = Duration::from_secs(300);

/// A tensor-parallel model over the GPUs `ordinals` (one rank each; peer-to-peer all-reduces
/// where every GPU reaches the others' memory, else NCCL's).
/// Checks every GPU and NCCL before starting any rank, so a missing one gives a clear `Err`.
#[cfg(feature = "cuda")]
fn cuda_group(
    config: crate::model::ModelConfig,
    source: Arc<dyn WeightSource>,
    ordinals: &[u32],
    threads: usize,
    precision: Precision,
    low_memory: bool,
    opts: &RuntimeOptions,
) -> Result<Model> {
    use crate::devices::cuda::{gpu, nccl, CudaDevice};
    use crate::model::tensor_parallel::prefixed;
    let label = format!(
        "cuda:{}",
        ordinals
            .iter()
            .map(|o| o.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    for &o in ordinals {
        gpu::probe(o).map_err(|e| prefixed(&label, e))?;
    }
    nccl::probe()?;
    let world = ordinals.len();
    let plan = ShardPlan::new(&config, world)?;
    let id = nccl::NcclId::new()?;
    let builders: Vec<RankBuilder> = ordinals
        .iter()
        .enumerate()
        .map(|(r, &ord)| {
            let (plan, source, opts) = (plan.clone(), source.clone(), opts.clone());
            Box::new(move || {
                let dev = CudaDevice::with_options(ord, &opts)?;
                // the kernels load (a first load JITs them: up to a minute) before any peer
                // waits, on all ranks at once
                dev.warm_up()?;
                let comm = nccl::NcclComm::new(dev.gpu(), &id, r, world)?;
                if let Some(g) = comm.enable_p2p(opts.peer_all_reduce, PEER_WAIT)? {
                    dev.attach_group(g)?;
                }
                let mut exec = Executor::new();
                exec.add_device(Arc::new(dev));
                exec.add_device(Arc::new(crate::devices::cpu::CpuDevice::new(
                    if threads == 0 { 2 } else { threads },
                )?));
                rank_model(
                    &plan,
                    r,
                    source,
                    exec,
                    Arc::new(comm),
                    precision,
                    low_memory,
                    &opts,
                )
            }) as RankBuilder
        })
        .collect();
    let group = TpGroup::start(plan, builders, &label)?;
    Model::driver(config, Arc::new(group), precision)
}

/// Without the `cuda` feature a GPU group is an error.
#[cfg(not(feature = "cuda"))]
fn cuda_group(
    _config: crate::model::ModelConfig,
    _source: Arc<dyn WeightSource>,
    ordinals: &[u32],
    _threads: usize,
    _precision: Precision,
    _low_memory: bool,
    _opts: &RuntimeOptions,
) -> Result<Model> {
    Err(Error::Unsupported(format!(
        "tensor parallelism over {} GPUs: this build has no CUDA support (feature 'cuda')",
        ordinals.len()
    )))
}
