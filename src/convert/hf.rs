//! Hugging Face directory (`config.json`, `tokenizer.json`, safetensors) → `.flm`, streaming
//! tensor by tensor in name order.

use super::dtype_policy::DtypePlan;
use super::hf_config::generation_metadata;
use super::hf_experts::{
    is_mxfp4_blocks, is_mxfp4_scales, scales_name, split_experts, split_mxfp4_experts,
    stacked_parts,
};
use super::names::{hf_name, Mapped};
use super::output::TensorOutput;
use super::quant_mix::MixTensor;
use super::tensor_transform::{stored_dims, SourceTensor};
use super::{general_metadata, naming_file, ConvertOptions, ConvertReport, Progress};
use crate::data::{decode_to_f32, DataType};
use crate::error::{Error, Result};
use crate::format::flm::{FlmWriter, MetaValue};
use crate::format::safetensors::SafetensorsSet;
use crate::model::ModelConfig;
use std::path::Path;

fn read_optional(p: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(p) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(p.display(), e)),
    }
}

fn chat_template(dir: &Path, tok_cfg: Option<&str>) -> Result<Option<String>> {
    if let Some(t) = read_optional(&dir.join("chat_template.jinja"))? {
        return Ok(Some(t));
    }
    let Some(cfg) = tok_cfg else { return Ok(None) };
    let v: serde_json::Value = serde_json::from_str(cfg).map_err(|e| {
        Error::format(
            dir.join("tokenizer_config.json").display(),
            format!("invalid JSON: {e}"),
        )
    })?;
    Ok(match v.get("chat_template") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(|t| t.as_str())
            .map(str::to_string),
        _ => None,
    })
}

/// Every tensor of `names` as the mix planner sees it (safetensors tensors are never
/// block-quantized); a stacked expert tensor (GPT-OSS) is refused by name: the mixes are not
/// planned for its per-expert parts.
fn mix_tensors(weights: &SafetensorsSet, arch: &str, names: &[String]) -> Result<Vec<MixTensor>> {
    names
        .iter()
        .map(|n| {
            let (info, _) = weights.tensor(n)?;
            if stacked_parts(arch, n, &info.dims)?.is_some() {
                return Err(Error::Unsupported(format!(
                    "tensor {n}: the llama.cpp mixes (q4_k_m, …) do not split stacked expert \
                     tensors; use --dtype int4, int8 or keep"
                )));
            }
            let m = hf_name(arch, n);
            Ok(MixTensor {
                dims: stored_dims(&m, &info.dims, n)?,
                name: m.name,
                quantized_source: None,
            })
        })
        .collect()
}

/// Converts the Hugging Face model directory `dir` into `out`.
pub fn convert_hf_dir(
    dir: &Path,
    out: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<ConvertReport> {
    let cfg_path = dir.join("config.json");
    let cfg_text = read_optional(&cfg_path)?.ok_or_else(|| {
        Error::format(
            dir.display(),
            "no config.json: not a Hugging Face model directory",
        )
    })?;
    let gen_path = dir.join("generation_config.json");
    let gen_text = read_optional(&gen_path)?;
    let mut config = ModelConfig::from_hf_json(
        &cfg_text,
        gen_text.as_deref(),
        &cfg_path.display().to_string(),
    )?;
    let tok_path = dir.join("tokenizer.json");
    let tok_text = read_optional(&tok_path)?
        .ok_or_else(|| Error::format(dir.display(), "no tokenizer.json"))?;
    let tok_cfg = read_optional(&dir.join("tokenizer_config.json"))?;
    let spec = crate::tokenizer::TokenizerSpec::from_hf_json(&tok_text, tok_cfg.as_deref())
        .map_err(|e| naming_file(&tok_path.display().to_string(), e))?;
    let weights = SafetensorsSet::open_dir(dir)?;
    if !weights.names().any(|n| n == "lm_head.weight") {
        config.tie_embeddings = true;
    }
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut meta = general_metadata(&config.architecture, &name, dir, "hf", opts);
    if let Some(t) = chat_template(dir, tok_cfg.as_deref())? {
        meta.insert("chat_template".into(), MetaValue::Str(t));
    }
    if let Some(g) = &gen_text {
        meta.extend(generation_metadata(g, &gen_path.display().to_string())?);
    }
    let names: Vec<String> = weights.names().map(str::to_string).collect();
    let dtypes = DtypePlan::new(opts.dtype, &config, || {
        mix_tensors(&weights, &config.architecture, &names)
    })?;
    let writer = FlmWriter::create(out, &config, &meta, &spec)?;
    let arch = config.architecture.clone();
    // a stacked expert tensor is written as several (one or two per expert)
    let mut total = 0;
    for n in &names {
        total += stacked_parts(&arch, n, &weights.tensor(n)?.0.dims)?.unwrap_or(1);
    }
    let mut output = TensorOutput::new(writer, dtypes, &config.architecture, total, progress);
    for n in &names {
        let (info, bytes) = weights.read_tensor(n)?;
        let file = weights.file_of(n).unwrap_or("safetensors");
        let Some(dt) = info.dtype else {
            let dims = info.dims.clone();
            store_mxfp4(&weights, &arch, (n, &dims, bytes), &mut output, file)?;
            continue;
        };
        let decode = move |b: &[u8], o: &mut [f32]| decode_to_f32(dt, b, o);
        let src = SourceTensor {
            source_name: n,
            dims: info.dims.clone(),
            bytes,
            same_as: Some(dt),
            decode: &decode,
        };
        if stacked_parts(&arch, n, &src.dims)?.is_some() {
            split_stacked(&arch, src, &mut output, file)?;
        } else {
            output.store(&hf_name(&arch, n), src, file)?;
        }
    }
    output.finish()
}

/// Writes the per-expert tensors of the stacked expert tensor `src` (see `hf_experts`).
fn split_stacked(
    arch: &str,
    src: SourceTensor<'_>,
    output: &mut TensorOutput,
    file: &str,
) -> Result<()> {
    let name = src.source_name;
    let mut values = vec![0f32; src.dims.iter().product()];
    (src.decode)(&src.bytes, &mut values)?;
    let decode = |b: &[u8], o: &mut [f32]| decode_to_f32(DataType::F32, b, o);
    let parts = split_experts(arch, name, &src.dims, &values)
        .map_err(|e| Error::format(file, format!("tensor {name}: {e}")))?;
    for part in parts {
        let m = Mapped {
            name: part.name,
            transpose: false,
            unpermute_heads: None,
        };
        let one = SourceTensor {
            source_name: name,
            dims: part.dims,
            bytes: part.values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            same_as: Some(DataType::F32),
            decode: &decode,
        };
        output.store(&m, one, file)?;
    }
    Ok(())
}

/// Writes the per-expert MXFP4 tensors of the U8 tensor `(name, dims, bytes)`: a GPT-OSS
/// `_blocks` tensor is read with its `_scales` (see `hf_experts`); a `_scales` tensor is written
/// with its blocks (an error when they are missing); any other U8 tensor is refused by name.
fn store_mxfp4(
    weights: &SafetensorsSet,
    arch: &str,
    (name, dims, bytes): (&str, &[usize], Vec<u8>),
    output: &mut TensorOutput,
    file: &str,
) -> Result<()> {
    let pair = |other: &str| {
        if weights.names().any(|n| n == other) {
            Ok(())
        } else {
            Err(Error::format(
                file,
                format!("tensor {name}: MXFP4 expert tensor without its pair {other}"),
            ))
        }
    };
    if is_mxfp4_scales(arch, name)? {
        return pair(&name.replace("_scales", "_blocks"));
    }
    let sname = match scales_name(name) {
        Some(s) if is_mxfp4_blocks(arch, name)? => s,
        _ => {
            return Err(Error::format(
                file,
                format!(
                    "tensor {name}: dtype U8 (only GPT-OSS's MXFP4 expert _blocks/_scales are \
                     read as bytes)"
                ),
            ))
        }
    };
    pair(&sname)?;
    let (sinfo, scales) = weights.read_tensor(&sname)?;
    let parts = split_mxfp4_experts(arch, name, dims, &bytes, &sinfo.dims, &scales)
        .map_err(|e| naming_file(file, e))?;
    let decode = |b: &[u8], o: &mut [f32]| decode_to_f32(DataType::Mxfp4, b, o);
    for part in parts {
        let m = Mapped {
            name: part.name,
            transpose: false,
            unpermute_heads: None,
        };
        let one = SourceTensor {
            source_name: name,
            dims: part.dims,
            bytes: part.bytes,
            same_as: Some(DataType::Mxfp4),
            decode: &decode,
        };
        output.store(&m, one, file)?;
    }
    Ok(())
}
