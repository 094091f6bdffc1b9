//! Loading a `.flm` model into an `Llm`: opens the file (mmap or low-memory mode), builds the
//! executor for the requested device, the model graph and the tokenizer.

use crate::data::Data;
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::format::flm::{FlmFile, LoadMode};
use crate::generate::Llm;
use crate::model::{KvDtype, Model, Precision, WeightSource};
use crate::tokenizer::Tokenizer;
use std::path::Path;
use std::sync::Arc;

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
    /// KV cache dtype; `None` = the device's default (f16 on the CPU in `fast` precision, else
    /// f32). A dtype the device does not store is an error naming it.
    pub kv_dtype: Option<KvDtype>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: 0,
            device: "cpu".into(),
            low_memory: false,
            precision: Precision::Fast,
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
/// a machine without a usable GPU, gives an `Err` for `cuda`.
pub fn executor_for(device: &str, threads: usize) -> Result<Executor> {
    match device {
        "cpu" | "" => Executor::cpu(threads),
        d if d == "cuda" || d.starts_with("cuda:") => cuda_executor(d, threads),
        d => Err(Error::invalid(format!(
            "device '{d}' (expected cpu, cuda or cuda:N)"
        ))),
    }
}

#[cfg(feature = "cuda")]
fn cuda_executor(d: &str, threads: usize) -> Result<Executor> {
    let ordinal = match d.strip_prefix("cuda:") {
        Some(n) => n.parse::<u32>().map_err(|_| {
            Error::invalid(format!("device '{d}': expected cuda:N with N a GPU number"))
        })?,
        None => 0,
    };
    let mut e = Executor::new();
    e.add_device(Arc::new(crate::devices::cuda::CudaDevice::new(ordinal)?));
    e.add_device(Arc::new(crate::devices::cpu::CpuDevice::new(threads)?));
    Ok(e)
}

#[cfg(not(feature = "cuda"))]
fn cuda_executor(d: &str, _threads: usize) -> Result<Executor> {
    Err(Error::Unsupported(format!(
        "device '{d}': this build has no CUDA support (feature 'cuda')"
    )))
}

/// Builds a model of `config` over `source` on `device`: `cpu`, `cuda`, `cuda:N`, or a
/// tensor-parallel group of GPUs `cuda:0,1[,...]` (one rank per GPU, NCCL all-reduces; see
/// `model::tensor_parallel`).
pub fn model_for(
    config: crate::model::ModelConfig,
    source: Arc<dyn WeightSource>,
    device: &str,
    threads: usize,
    precision: Precision,
    low_memory: bool,
) -> Result<Model> {
    match crate::parallel::parse_gpu_group(device, 0)? {
        Some(gpus) => crate::model::tensor_parallel::cuda_group(
            config, source, &gpus, threads, precision, low_memory,
        ),
        None => Model::new(
            config,
            source,
            executor_for(device, threads)?,
            precision,
            low_memory,
        ),
    }
}

/// Loads a `.flm` file.
pub fn load(path: &Path, opts: &LoadOptions) -> Result<Llm> {
    let mode = if opts.low_memory {
        LoadMode::LowMemory
    } else {
        LoadMode::Mmap
    };
    let file = FlmFile::open(path, mode)?;
    let config = file.config().clone();
    let tokenizer = Tokenizer::new(file.tokenizer_spec().clone())?;
    let chat_template = file
        .chat_template()
        .map(|s| s.to_string())
        .unwrap_or_else(|| crate::generate::chat::CHATML.to_string());
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut model = model_for(
        config,
        Arc::new(file),
        &opts.device,
        opts.threads,
        opts.precision,
        opts.low_memory,
    )?;
    model.set_kv_dtype(opts.kv_dtype)?;
    Ok(Llm {
        model,
        tokenizer,
        chat_template,
        name,
    })
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
    let mut model = model_for(
        config,
        source,
        &opts.device,
        opts.threads,
        opts.precision,
        opts.low_memory,
    )?;
    model.set_kv_dtype(opts.kv_dtype)?;
    Ok(Llm {
        model,
        tokenizer,
        chat_template: crate::generate::chat::CHATML.to_string(),
        name: format!("{name}-{dtype}-synthetic"),
    })
}
