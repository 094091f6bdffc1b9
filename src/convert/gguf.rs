//! GGUF → `.flm`: maps names to Hugging Face names, undoes llama.cpp's q/k row permutation
//! (llama) and its `1 + w` of Gemma-3's norms, keeps representable blocks (K-quants included)
//! bit-exact and dequantizes the rest, streaming tensor by tensor. Every tensor's type and name
//! is checked before the output file is created.

use super::dtype_policy::DtypePlan;
use super::ggml_dequant::{dequantize, shared_dtype, supported};
use super::gguf_config::gguf_architecture;
use super::gguf_rope::ROPE_FACTOR_TENSORS;
use super::names::{
    gguf_arch_name, gguf_moe_part, gguf_name, moe_hf_name, GgufMoePart, Mapped, ROPE_FREQS,
};
use super::output::TensorOutput;
use super::quant_mix::MixTensor;
use super::tensor_transform::{stored_dims, SourceTensor};
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
    check_tensor_types(&g)?;
    let config = ModelConfig::from_gguf(&g)?;
    let plan = plan_tensors(&g, &arch, &config)?;
    let dtypes = DtypePlan::new(opts.dtype, &config, || mix_tensors(&g, &plan))
        .map_err(|e| naming_file(&g.path, e))?;
    let spec =
        crate::tokenizer::TokenizerSpec::from_gguf(&g).map_err(|e| naming_file(&g.path, e))?;
    let name = g.get_str("general.name").unwrap_or_default().to_string();
    let mut meta = general_metadata(&config.architecture, &name, path, "gguf", opts);
    if let Some(t) = g.get_str("tokenizer.chat_template") {
        meta.insert("chat_template".into(), MetaValue::Str(t.to_string()));
    }
    let writer = FlmWriter::create(out, &config, &meta, &spec)?;
    let total = plan.iter().map(|(_, ms)| ms.len()).sum();
    let mut output = TensorOutput::new(writer, dtypes, &config.architecture, total, progress);
    for (i, ms) in &plan {
        let t = g
            .tensors
            .get(*i)
            .ok_or_else(|| Error::format(&g.path, "tensor index changed"))?;
        let bytes = g.read_tensor_bytes(t)?;
        let ty = t.ggml_type;
        if ty == ggml_type::MXFP4 {
            fastllm_cpu::mxfp4::check_blocks(&bytes)
                .map_err(|e| Error::format(&g.path, format!("tensor {}: {e}", t.name)))?;
        }
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
        // a stacked expert tensor [experts, out, in] becomes one [out, in] tensor per expert
        let mut dims = t.shape();
        if ms.len() > 1 {
            dims.remove(0);
        }
        let part = bytes.len() / ms.len();
        for (m, b) in ms.iter().zip(bytes.chunks_exact(part.max(1))) {
            let src = SourceTensor {
                source_name: &t.name,
                dims: dims.clone(),
                bytes: b.to_vec(),
                same_as: shared_dtype(ty).filter(|_| shift == 0.0),
                decode: &decode,
            };
            output.store(m, src, &g.path)?;
        }
    }
    output.finish()
}

/// Refuses a file with a tensor type the converter cannot read, naming the tensor.
fn check_tensor_types(g: &GgufFile) -> Result<()> {
    for t in &g.tensors {
        if !supported(t.ggml_type) {
            let tname = ggml_type::info(t.ggml_type)
                .map(|i| i.0)
                .unwrap_or("unknown");
            return Err(Error::format(
                &g.path,
                format!(
                    "tensor {}: unsupported GGUF tensor type {tname} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4)",
                    t.name
                ),
            ));
        }
    }
    Ok(())
}

/// The `.flm` tensors of each GGUF tensor, by index (several for a stacked expert tensor; none
/// for LongRoPE's factors, which are in the config), or an error naming a tensor with no
/// Hugging Face name.
fn plan_tensors(
    g: &GgufFile,
    arch: &str,
    config: &ModelConfig,
) -> Result<Vec<(usize, Vec<Mapped>)>> {
    let permute = arch == "llama";
    let moe_names = crate::model::arch::lookup(&config.architecture)?.moe;
    let mut plan: Vec<(usize, Vec<Mapped>)> = Vec::new();
    for (i, t) in g.tensors.iter().enumerate() {
        if t.name == "rope_freqs.weight" {
            let m = Mapped {
                name: ROPE_FREQS.to_string(),
                transpose: false,
                unpermute_heads: None,
            };
            plan.push((i, vec![m]));
            continue;
        }
        if let Some(ms) = moe_plan(g, t, config, moe_names.as_ref())? {
            plan.push((i, ms));
            continue;
        }
        if ROPE_FACTOR_TENSORS.contains(&t.name.as_str()) {
            continue; // LongRoPE's factors, already in the config
        }
        let m = gguf_arch_name(arch, &t.name)
            .or_else(|| gguf_name(&t.name, config.num_heads, config.num_kv_heads, permute))
            .ok_or_else(|| {
                Error::format(
                    &g.path,
                    format!("tensor {}: no Hugging Face name for {arch}", t.name),
                )
            })?;
        plan.push((i, vec![m]));
    }
    Ok(plan)
}

/// Every `.flm` tensor the conversion of `g` writes, in order, as the mix planner sees it.
fn mix_tensors(g: &GgufFile, plan: &[(usize, Vec<Mapped>)]) -> Result<Vec<MixTensor>> {
    let mut out = Vec::new();
    for (i, ms) in plan {
        let t = g
            .tensors
            .get(*i)
            .ok_or_else(|| Error::format(&g.path, "tensor index changed"))?;
        let mut dims = t.shape();
        if ms.len() > 1 {
            dims.remove(0);
        }
        let quantized_source = match shared_dtype(t.ggml_type) {
            Some(d) if d.is_float() => None,
            _ => Some(
                ggml_type::info(t.ggml_type)
                    .map_or("unknown", |i| i.0)
                    .to_string(),
            ),
        };
        for m in ms {
            out.push(MixTensor {
                name: m.name.clone(),
                dims: stored_dims(m, &dims, &t.name)?,
                quantized_source: quantized_source.clone(),
            });
        }
    }
    Ok(out)
}

/// The `.flm` tensors of a GGUF MoE tensor (one per expert for a stacked one), `None` when `t`
/// is not a MoE tensor; an error when the model has no MoE layers for it or the stack does not
/// hold `expert_count` experts.
fn moe_plan(
    g: &GgufFile,
    t: &crate::format::gguf::GgufTensorInfo,
    config: &ModelConfig,
    names: Option<&crate::model::MoeNames>,
) -> Result<Option<Vec<Mapped>>> {
    // a router's or stacked experts' bias (GPT-OSS) is named like its weight, `.bias` for `.weight`
    let bias_of = t
        .name
        .strip_suffix(".bias")
        .and_then(|n| gguf_moe_part(&format!("{n}.weight")))
        .filter(|(_, p)| matches!(p, GgufMoePart::Router | GgufMoePart::Stacked(_)));
    let is_bias = gguf_moe_part(&t.name).is_none() && bias_of.is_some();
    let Some((layer, part)) = gguf_moe_part(&t.name).or(bias_of) else {
        return Ok(None);
    };
    let suffixed = |n: String| match n.strip_suffix(".weight") {
        Some(stem) if is_bias => format!("{stem}.bias"),
        _ => n,
    };
    let (Some(names), Some(moe)) = (names, config.moe.as_ref()) else {
        return Err(Error::format(
            &g.path,
            format!(
                "tensor {}: an expert tensor in a model without experts",
                t.name
            ),
        ));
    };
    let plain = |name: String| Mapped {
        name: suffixed(name),
        transpose: false,
        unpermute_heads: None,
    };
    let missing = || {
        Error::format(
            &g.path,
            format!(
                "tensor {}: no Hugging Face name for {}",
                t.name, config.architecture
            ),
        )
    };
    if let GgufMoePart::Stacked(_) = part {
        let shape = t.shape();
        let rank = if is_bias { 2 } else { 3 };
        if shape.len() != rank || shape[0] != moe.experts {
            let want = if is_bias { "out" } else { "out, in" };
            return Err(Error::format(
                &g.path,
                format!(
                    "tensor {}: shape {shape:?} is not [{} experts, {want}]",
                    t.name, moe.experts
                ),
            ));
        }
        return (0..moe.experts)
            .map(|e| {
                moe_hf_name(names, layer, part, e)
                    .map(plain)
                    .ok_or_else(missing)
            })
            .collect::<Result<Vec<_>>>()
            .map(Some);
    }
    let name = moe_hf_name(names, layer, part, 0).ok_or_else(missing)?;
    Ok(Some(vec![plain(name)]))
}
