//! GGUF → `.flm`: maps names to Hugging Face names, undoes llama.cpp's q/k row permutation
//! (llama) and its `1 + w` of Gemma-3's norms, keeps representable blocks bit-exact and
//! dequantizes the rest, streaming tensor by tensor. Every tensor's type and name is checked
//! before the output file is created.

use super::ggml_dequant::{dequantize, shared_dtype, supported};
use super::gguf_config::gguf_architecture;
use super::gguf_rope::ROPE_FACTOR_TENSORS;
use super::names::{gguf_arch_name, gguf_name, Mapped, ROPE_FREQS};
use super::tensor_transform::{transform, SourceTensor};
use super::{general_metadata, naming_file, ConvertOptions, ConvertReport, Progress};
use crate::error::{Error, Result};
use crate::format::flm::{FlmWriter, MetaValue};
use crate::format::gguf::{ggml_type, GgufFile};
use crate::model::ModelConfig;
use std::path::Path;

/// Converts the GGUF file `path` into `out`.
pub fn convert_gguf(
    path: &Path,
    out: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<ConvertReport> {
    let g = GgufFile::open(path)?;
    let arch = gguf_architecture(&g)?;
    for t in &g.tensors {
        if !supported(t.ggml_type) {
            let tname = ggml_type::info(t.ggml_type)
                .map(|i| i.0)
                .unwrap_or("unknown");
            return Err(Error::format(
                &g.path,
                format!(
                    "tensor {}: unsupported GGUF tensor type {tname} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K)",
                    t.name
                ),
            ));
        }
    }
    let config = ModelConfig::from_gguf(&g)?;
    let permute = arch == "llama";
    let mut plan: Vec<(usize, Mapped)> = Vec::new();
    for (i, t) in g.tensors.iter().enumerate() {
        if t.name == "rope_freqs.weight" {
            let m = Mapped {
                name: ROPE_FREQS.to_string(),
                transpose: false,
                unpermute_heads: None,
            };
            plan.push((i, m));
            continue;
        }
        if ROPE_FACTOR_TENSORS.contains(&t.name.as_str()) {
            continue; // LongRoPE's factors, already in the config
        }
        let m = gguf_arch_name(&arch, &t.name)
            .or_else(|| gguf_name(&t.name, config.num_heads, config.num_kv_heads, permute))
            .ok_or_else(|| {
                Error::format(
                    &g.path,
                    format!("tensor {}: no Hugging Face name for {arch}", t.name),
                )
            })?;
        plan.push((i, m));
    }
    let spec =
        crate::tokenizer::TokenizerSpec::from_gguf(&g).map_err(|e| naming_file(&g.path, e))?;
    let name = g.get_str("general.name").unwrap_or_default().to_string();
    let mut meta = general_metadata(&config.architecture, &name, path, "gguf", opts);
    if let Some(t) = g.get_str("tokenizer.chat_template") {
        meta.insert("chat_template".into(), MetaValue::Str(t.to_string()));
    }
    let mut writer = FlmWriter::create(out, &config, &meta, &spec)?;
    let total = plan.len();
    let mut bytes_total = 0u64;
    for (done, (i, m)) in plan.iter().enumerate() {
        let t = g
            .tensors
            .get(*i)
            .ok_or_else(|| Error::format(&g.path, "tensor index changed"))?;
        let bytes = g.read_tensor_bytes(t)?;
        let ty = t.ggml_type;
        // llama.cpp stores Gemma-3's norm weights as (1 + w); `.flm` keeps HF's w
        let shift = if arch == "gemma3" && t.name.ends_with("norm.weight") {
            1.0
        } else {
            0.0
        };
        let decode = move |b: &[u8], o: &mut [f32]| {
            dequantize(ty, b, o)?;
            o.iter_mut().for_each(|v| *v -= shift);
            Ok(())
        };
        let src = SourceTensor {
            source_name: &t.name,
            dims: t.shape(),
            bytes,
            same_as: shared_dtype(ty).filter(|_| shift == 0.0),
            decode: &decode,
        };
        let stored = transform(m, src, opts.dtype)
            .map_err(|e| Error::format(&g.path, format!("tensor {}: {e}", t.name)))?;
        writer.add_tensor(&m.name, stored.dtype, &stored.dims, &stored.bytes)?;
        bytes_total += stored.bytes.len() as u64;
        progress(&Progress {
            done: done + 1,
            total,
            name: &m.name,
            dtype: stored.dtype,
            bytes: stored.bytes.len(),
        });
    }
    writer.finish()?;
    Ok(ConvertReport {
        architecture: config.architecture,
        tensors: total,
        tensor_bytes: bytes_total,
    })
}
