//! Models through the C ABI: parameters, load/free, sizes, metadata, tokenize/detokenize.

use super::status::*;
use crate::generate::Llm;
use crate::load::{load, LoadOptions};
use crate::model::{KvDtype, Precision};
use crate::options::{RuntimeOptions, SimdLevel};
use std::ffi::c_char;
use std::sync::Arc;

/// Opaque model handle. Thread-safe: many threads may tokenize and create sessions at once.
pub struct FastllmModel {
    pub(crate) llm: Arc<Llm>,
}

/// Load parameters. Get defaults from `fastllm_model_params_default()`; `struct_size` must be
/// `sizeof(FastllmModelParams)` (or the size of an earlier version: the first ended at
/// `precision`, the second at `cache_dir`; the later fields then keep their defaults). The run-time switches (`cuda_graphs` onwards)
/// default to "unset": the environment's `FASTLLM_*` value, else the built-in default.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FastllmModelParams {
    /// `sizeof(FastllmModelParams)`.
    pub struct_size: u32,
    /// "cpu", "cuda", "cuda:1", or "cuda:0,1" (tensor parallelism over those GPUs, needs NCCL);
    /// NULL = the best available (the CPU in this build).
    pub device: *const c_char,
    /// CPU threads; 0 = all cores.
    pub threads: u32,
    /// Read weights from disk right before use instead of keeping them mapped.
    pub low_memory: bool,
    /// 0 = fast (int8 activations in quantized matmuls), 1 = exact (f32 activations).
    pub precision: u32,
    /// -1 = unset; 0 = one-token decode steps run op by op; 1 = they are recorded once and
    /// replayed as CUDA graphs (the default).
    pub cuda_graphs: i32,
    /// -1 = unset; 0 = every op in its plain form; 1 = fused forms (the default).
    pub fused_ops: i32,
    /// -1 = unset; 0 = no cap; N > 0 = refuse weights over N MiB on any one GPU.
    pub gpu_memory_cap_mb: i64,
    /// -1 = unset; highest SIMD level of the CPU kernels: 0 = portable, 1 = AVX2, 2 = AVX-512.
    pub simd: i32,
    /// NULL = unset; where the default model, converted models and compiled GPU kernels are
    /// cached.
    pub cache_dir: *const c_char,
    /// KV cache dtype: "f16", "q8_0" or "f32"; NULL = the device's default (f16 in
    /// fast precision, else f32). A dtype the device does not store is an error naming it.
    pub kv_dtype: *const c_char,
    /// -1 = unset; 1 = on a GPU, every sequence's results independent of the batch it runs in
    /// (the same bits alone and batched; slower); 0 = off (the default).
    pub batch_invariant: i32,
    /// -1 = unset; 1 = a tensor-parallel group whose GPUs reach each other's memory sums with
    /// its own peer-to-peer kernels (the default); 0 = NCCL sums.
    pub peer_all_reduce: i32,
}

/// `struct_size` of the second version of [`FastllmModelParams`] (up to `cache_dir`).
const PARAMS_V2_SIZE: usize = std::mem::offset_of!(FastllmModelParams, kv_dtype);
/// `struct_size` of the third version of [`FastllmModelParams`] (up to `kv_dtype`).
const PARAMS_V3_SIZE: usize = std::mem::offset_of!(FastllmModelParams, batch_invariant);
/// `struct_size` of the fourth version of [`FastllmModelParams`] (up to `batch_invariant`).
const PARAMS_V4_SIZE: usize = std::mem::offset_of!(FastllmModelParams, peer_all_reduce);

/// The first version of [`FastllmModelParams`] (its size is accepted as `struct_size`).
#[repr(C)]
struct ModelParamsV1 {
    struct_size: u32,
    device: *const c_char,
    threads: u32,
    low_memory: bool,
    precision: u32,
}

/// Default load parameters.
#[no_mangle]
pub extern "C" fn fastllm_model_params_default() -> FastllmModelParams {
    FastllmModelParams {
        struct_size: std::mem::size_of::<FastllmModelParams>() as u32,
        device: std::ptr::null(),
        threads: 0,
        low_memory: false,
        precision: 0,
        cuda_graphs: -1,
        fused_ops: -1,
        gpu_memory_cap_mb: -1,
        simd: -1,
        cache_dir: std::ptr::null(),
        kv_dtype: std::ptr::null(),
        batch_invariant: -1,
        peer_all_reduce: -1,
    }
}

/// `params` read as the version its `struct_size` names.
///
/// # Safety
/// `params` valid for at least `struct_size` bytes (checked to be a known size first).
unsafe fn read_params(params: *const FastllmModelParams) -> Result<FastllmModelParams, Fail> {
    if params.is_null() {
        return Ok(fastllm_model_params_default());
    }
    // SAFETY: every version starts with the u32 `struct_size`.
    let size = unsafe { (*params).struct_size } as usize;
    if size == std::mem::size_of::<FastllmModelParams>() {
        // SAFETY: the caller's struct is the current version.
        return Ok(unsafe { *params });
    }
    if size == PARAMS_V2_SIZE || size == PARAMS_V3_SIZE || size == PARAMS_V4_SIZE {
        let mut p = fastllm_model_params_default();
        // SAFETY: the caller's struct is the second, third or fourth version, a prefix of the current one
        // (`size` bytes of the same layout); the copy covers exactly those bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                params.cast::<u8>(),
                (&mut p as *mut FastllmModelParams).cast::<u8>(),
                size,
            )
        };
        p.struct_size = std::mem::size_of::<FastllmModelParams>() as u32;
        return Ok(p);
    }
    if size == std::mem::size_of::<ModelParamsV1>() {
        // SAFETY: the caller's struct is the first version, a prefix of the current one.
        let v1 = unsafe { &*(params as *const ModelParamsV1) };
        return Ok(FastllmModelParams {
            device: v1.device,
            threads: v1.threads,
            low_memory: v1.low_memory,
            precision: v1.precision,
            ..fastllm_model_params_default()
        });
    }
    Err(invalid(format!(
        "params.struct_size is {size}, expected {} (use fastllm_model_params_default())",
        std::mem::size_of::<FastllmModelParams>()
    )))
}

/// The environment's run-time switches (`RuntimeOptions::from_env`) with the fields `p` sets.
///
/// # Safety
/// `p.cache_dir` NULL or a NUL-terminated string.
unsafe fn runtime_options(p: &FastllmModelParams) -> Result<RuntimeOptions, Fail> {
    let mut o = RuntimeOptions::from_env()?;
    let flag = |v: i32, name: &str| match v {
        -1 => Ok(None),
        0 => Ok(Some(false)),
        1 => Ok(Some(true)),
        v => Err(invalid(format!(
            "params.{name} is {v} (-1 unset, 0 off, 1 on)"
        ))),
    };
    if let Some(on) = flag(p.cuda_graphs, "cuda_graphs")? {
        o.cuda_graphs = on;
    }
    if let Some(on) = flag(p.fused_ops, "fused_ops")? {
        o.fused_ops = on;
    }
    if let Some(on) = flag(p.batch_invariant, "batch_invariant")? {
        o.batch_invariant = on;
    }
    if let Some(on) = flag(p.peer_all_reduce, "peer_all_reduce")? {
        o.peer_all_reduce = on;
    }
    match p.gpu_memory_cap_mb {
        -1 => {}
        mb if mb >= 0 => o.gpu_memory_cap = crate::options::cap_from_mib(mb as usize)?,
        mb => {
            return Err(invalid(format!(
                "params.gpu_memory_cap_mb is {mb} (-1 unset, 0 no cap, N MiB)"
            )))
        }
    }
    o.simd = match p.simd {
        -1 => o.simd,
        0 => Some(SimdLevel::Portable),
        1 => Some(SimdLevel::Avx2),
        2 => Some(SimdLevel::Avx512),
        v => {
            return Err(invalid(format!(
                "params.simd is {v} (-1 unset, 0 portable, 1 AVX2, 2 AVX-512)"
            )))
        }
    };
    if !p.cache_dir.is_null() {
        // SAFETY: the caller passes a NUL-terminated string.
        o.cache_dir = Some(unsafe { c_str(p.cache_dir, "params.cache_dir") }?.into());
    }
    Ok(o)
}

/// Loads a model: a `.flm` file, a GGUF file or a Hugging Face directory (converted once into
/// the cache), or the default model when `path` is NULL (fetched once). `params` may be NULL
/// (defaults). On success `*out` receives a handle to free with `fastllm_model_free`.
///
/// # Safety
/// `path` NULL or a NUL-terminated string; `params` NULL or valid; `out` valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_model_load(
    path: *const c_char,
    params: *const FastllmModelParams,
    out: *mut *mut FastllmModel,
) -> FastllmStatus {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: the caller passes NULL or valid parameters.
        let p = unsafe { read_params(params) }?;
        // SAFETY: as above, `cache_dir` NULL or a string.
        let runtime = unsafe { runtime_options(&p) }?;
        let device = if p.device.is_null() {
            "cpu".to_string()
        } else {
            c_str(p.device, "params.device")?.to_string()
        };
        let precision = match p.precision {
            0 => Precision::Fast,
            1 => Precision::Exact,
            v => {
                return Err(invalid(format!(
                    "params.precision is {v} (0 fast, 1 exact)"
                )))
            }
        };
        let model = if path.is_null() {
            None
        } else {
            Some(c_str(path, "path")?)
        };
        let kv_dtype = if p.kv_dtype.is_null() {
            None
        } else {
            Some(KvDtype::parse(c_str(p.kv_dtype, "params.kv_dtype")?)?)
        };
        let resolved = crate::default_model::resolve(model, &runtime)?;
        let opts = LoadOptions {
            threads: p.threads as usize,
            device,
            low_memory: p.low_memory,
            precision,
            runtime,
            kv_dtype,
        };
        let llm = load(&resolved, &opts)?;
        *out = Box::into_raw(Box::new(FastllmModel { llm: Arc::new(llm) }));
        Ok(())
    })
}

/// Frees a model. Sessions created from it stay valid. NULL is a no-op.
///
/// # Safety
/// `model` NULL or a handle from `fastllm_model_load` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn fastllm_model_free(model: *mut FastllmModel) {
    if !model.is_null() {
        let _ =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(Box::from_raw(model))));
    }
}

/// Vocabulary size, or -1 when `model` is NULL.
///
/// # Safety
/// `model` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_model_vocab_size(model: *const FastllmModel) -> i32 {
    match model.as_ref() {
        Some(m) => m.llm.model.config().vocab_size.min(i32::MAX as usize) as i32,
        None => -1,
    }
}

/// Context length in tokens, or -1 when `model` is NULL.
///
/// # Safety
/// `model` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_model_context_length(model: *const FastllmModel) -> i32 {
    match model.as_ref() {
        Some(m) => m.llm.model.config().context_length.min(i32::MAX as usize) as i32,
        None => -1,
    }
}

pub(crate) fn model_meta(llm: &Llm, key: &str) -> Option<String> {
    let c = llm.model.config();
    Some(match key {
        "name" => llm.name.clone(),
        "architecture" | "general.architecture" => c.architecture.clone(),
        "vocab_size" => c.vocab_size.to_string(),
        "hidden_size" => c.hidden_size.to_string(),
        "intermediate_size" => c.intermediate_size.to_string(),
        "num_layers" => c.num_layers.to_string(),
        "num_heads" => c.num_heads.to_string(),
        "num_kv_heads" => c.num_kv_heads.to_string(),
        "head_dim" => c.head_dim.to_string(),
        "context_length" => c.context_length.to_string(),
        "rope_theta" => c.rope_theta.to_string(),
        "chat_template" => llm.chat_template.clone(),
        "bos_id" => llm.tokenizer.bos_id()?.to_string(),
        "eos_ids" => llm
            .eos_ids()
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(","),
        _ => return None,
    })
}

/// Copies the metadata value `key` (`name`, `architecture`, `vocab_size`, `hidden_size`,
/// `num_layers`, `num_heads`, `num_kv_heads`, `head_dim`, `context_length`, `rope_theta`,
/// `chat_template`, `bos_id`, `eos_ids`) as a NUL-terminated string into `buf`; `*len` gets its
/// length without the NUL. Too small a buffer: `FASTLLM_ERR_BUFFER_TOO_SMALL` and `*len` set.
/// Unknown key: `FASTLLM_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// Pointers NULL or valid; `buf` valid for `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn fastllm_model_meta(
    model: *const FastllmModel,
    key: *const c_char,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> FastllmStatus {
    guard(|| {
        let m = model.as_ref().ok_or_else(|| null("model"))?;
        let key = c_str(key, "key")?;
        let v = model_meta(&m.llm, key)
            .ok_or_else(|| invalid(format!("unknown metadata key '{key}'")))?;
        write_string(v.as_bytes(), buf, cap, len)
    })
}

/// Tokenizes `text_len` bytes of UTF-8 `text`. `add_special`: add bos/eos as the model does;
/// `parse_special`: special tokens written in the text become single tokens. Writes up to `cap`
/// ids to `tokens` and the count to `*n`; when `cap` is too small returns
/// `FASTLLM_ERR_BUFFER_TOO_SMALL` with `*n` = the required count (`tokens` may then be NULL).
///
/// # Safety
/// `text` valid for `text_len` bytes (may be NULL when 0); `tokens` valid for `cap` ids; `n` valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_tokenize(
    model: *const FastllmModel,
    text: *const c_char,
    text_len: usize,
    add_special: bool,
    parse_special: bool,
    tokens: *mut i32,
    cap: usize,
    n: *mut usize,
) -> FastllmStatus {
    guard(|| {
        let m = model.as_ref().ok_or_else(|| null("model"))?;
        if n.is_null() {
            return Err(null("n"));
        }
        let bytes: &[u8] = if text_len == 0 {
            &[]
        } else if text.is_null() {
            return Err(null("text"));
        } else {
            std::slice::from_raw_parts(text as *const u8, text_len)
        };
        let s = std::str::from_utf8(bytes)
            .map_err(|e| invalid(format!("text is not valid UTF-8: {e}")))?;
        let ids = m.llm.tokenizer.encode(s, add_special, parse_special)?;
        if tokens.is_null() || cap < ids.len() {
            *n = ids.len();
            return Err(Fail(
                FASTLLM_ERR_BUFFER_TOO_SMALL,
                format!("room for {cap} tokens; {} needed", ids.len()),
            ));
        }
        for (i, &t) in ids.iter().enumerate() {
            *tokens.add(i) = t as i32;
        }
        *n = ids.len();
        Ok(())
    })
}

/// Decodes `n` token ids to UTF-8 into `buf` (NUL-terminated; `*len` excludes the NUL), with the
/// same size protocol as `fastllm_model_meta`. An invalid id gives `FASTLLM_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `tokens` valid for `n` ids (may be NULL when 0); `buf` valid for `cap` bytes; `len` valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_detokenize(
    model: *const FastllmModel,
    tokens: *const i32,
    n: usize,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> FastllmStatus {
    guard(|| {
        let m = model.as_ref().ok_or_else(|| null("model"))?;
        let ids = token_slice(tokens, n)?;
        let text = m.llm.tokenizer.decode(&ids, false)?;
        write_string(text.as_bytes(), buf, cap, len)
    })
}

/// Token ids from C, each checked to be ≥ 0.
///
/// # Safety
/// `tokens` valid for `n` ids or NULL when `n` is 0.
pub(crate) unsafe fn token_slice(tokens: *const i32, n: usize) -> Result<Vec<u32>, Fail> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if tokens.is_null() {
        return Err(null("tokens"));
    }
    std::slice::from_raw_parts(tokens, n)
        .iter()
        .map(|&t| u32::try_from(t).map_err(|_| invalid(format!("token id {t} is negative"))))
        .collect()
}
