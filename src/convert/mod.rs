//! Model conversion into `.flm`: Hugging Face directories (safetensors) and GGUF files, streamed
//! tensor by tensor (peak memory ≈ one tensor). Owns name mapping, layout fixes, the dtype
//! policy, `ModelConfig` extraction and the tokenizer spec of a GGUF file
//! ([`TokenizerSpec::from_gguf`](crate::tokenizer::TokenizerSpec::from_gguf)); the file formats
//! themselves live in `crate::format`.

pub mod dtype_policy;
pub mod ggml_dequant;
mod gguf;
pub mod gguf_config;
mod gguf_keys;
mod gguf_mla;
pub mod gguf_rope;
mod gguf_tokenizer;
mod hf;
pub mod hf_config;
mod hf_experts;
mod hf_mla;
pub mod hf_rope;
pub mod names;
mod options;
mod output;
pub mod quant_mix;
pub mod tensor_transform;

pub use gguf::convert_gguf;
pub use hf::convert_hf_dir;
pub use options::{ConvertOptions, Progress, TargetDtype};
pub use quant_mix::QuantMix;

use crate::error::{Error, Result};
use crate::format::flm::{MetaValue, Metadata};
use crate::format::{detect_input, InputKind};
use std::path::Path;

/// Version recorded in `general.converter`.
pub const CONVERTER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What a conversion produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertReport {
    /// Model architecture.
    pub architecture: String,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub tensor_bytes: u64,
}

/// The `general.*` metadata of a conversion.
pub(crate) fn general_metadata(
    arch: &str,
    name: &str,
    source: &Path,
    format: &str,
    opts: &ConvertOptions,
) -> Metadata {
    let s = |v: &str| MetaValue::Str(v.to_string());
    let mut m = Metadata::new();
    m.insert("general.architecture".into(), s(arch));
    m.insert("general.name".into(), s(name));
    m.insert(
        "general.source_file".into(),
        s(&source.display().to_string()),
    );
    m.insert("general.source_format".into(), s(format));
    m.insert(
        "general.converter".into(),
        s(&format!("fastllm convert-weights {CONVERTER_VERSION}")),
    );
    m.insert("general.dtype".into(), s(opts.dtype.name()));
    m
}

/// `e`, prefixed with `path` unless its message already names it (importer errors come from code
/// that does not know the file).
pub(crate) fn naming_file(path: &str, e: Error) -> Error {
    if e.to_string().contains(path) {
        e
    } else {
        Error::format(path, e)
    }
}

/// Converts `input` (HF directory or GGUF file) into the `.flm` file `out`, calling `progress`
/// after every tensor.
pub fn convert(
    input: &Path,
    out: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<ConvertReport> {
    match detect_input(input)? {
        InputKind::HfDir => convert_hf_dir(input, out, opts, progress),
        InputKind::Gguf => convert_gguf(input, out, opts, progress),
        InputKind::Flm => Err(Error::invalid(format!(
            "{}: already a .flm file",
            input.display()
        ))),
    }
}
