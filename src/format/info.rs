//! A human-readable description of a `.flm` or GGUF file: metadata, tokenizer summary, tensor
//! table and the memory a model needs (used by `convert-weights --info` and `fastllm info`).

use super::{detect_input, InputKind};
use crate::error::{Error, Result};
use crate::format::flm::{FlmFile, LoadMode, MetaValue};
use crate::format::gguf::{ggml_type, GgufFile, GgufValue};
use std::fmt::Write;
use std::path::Path;

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
    if flat.chars().count() > max {
        format!(
            "{}… ({} chars)",
            flat.chars().take(max).collect::<String>(),
            s.chars().count()
        )
    } else {
        flat
    }
}

fn meta_str(v: &MetaValue) -> String {
    match v {
        MetaValue::U32(x) => x.to_string(),
        MetaValue::I64(x) => x.to_string(),
        MetaValue::F32(x) => x.to_string(),
        MetaValue::F64(x) => x.to_string(),
        MetaValue::Bool(x) => x.to_string(),
        MetaValue::Str(s) => format!("{:?}", one_line(s, 80)),
        MetaValue::Array(a) if a.len() <= 16 => {
            format!(
                "[{}]",
                a.iter().map(meta_str).collect::<Vec<_>>().join(", ")
            )
        }
        MetaValue::Array(a) => format!("[{} items]", a.len()),
    }
}

fn gguf_str(v: &GgufValue) -> String {
    match v {
        GgufValue::Str(s) => format!("{:?}", one_line(s, 80)),
        GgufValue::Array(a) if a.len() <= 16 => {
            format!(
                "[{}]",
                a.iter().map(gguf_str).collect::<Vec<_>>().join(", ")
            )
        }
        GgufValue::Array(a) => format!("[{} items]", a.len()),
        GgufValue::Bool(b) => b.to_string(),
        other => match (other.as_i64(), other.as_f64(), other.as_bool()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(f), _) => f.to_string(),
            (_, _, Some(b)) => b.to_string(),
            _ => format!("{other:?}"),
        },
    }
}

fn describe_flm(path: &Path, o: &mut String) -> Result<()> {
    let f = FlmFile::open(path, LoadMode::LowMemory)?;
    let (major, minor) = f.version();
    let _ = writeln!(o, "{}: .flm version {major}.{minor}", f.path());
    let _ = writeln!(o, "metadata:");
    for (k, v) in f.metadata() {
        let _ = writeln!(o, "  {k} = {}", meta_str(v));
    }
    let t = f.tokenizer_spec();
    let _ = writeln!(o, "tokenizer:");
    let _ = writeln!(
        o,
        "  kind {:?}, pre-tokenizer {:?}, normalizer {:?}",
        t.kind, t.pre_tokenizer, t.normalizer
    );
    let _ = writeln!(
        o,
        "  vocab {}, merges {}, scores {}, added {} ({} special)",
        t.vocab.len(),
        t.merges.len(),
        if t.scores.is_empty() { "no" } else { "yes" },
        t.added.len(),
        t.added.iter().filter(|a| a.special).count()
    );
    let _ = writeln!(
        o,
        "  bos {:?}, eos {:?}, unk {:?}, pad {:?}, add_bos {}, add_eos {}",
        t.bos_id, t.eos_ids, t.unk_id, t.pad_id, t.add_bos, t.add_eos
    );
    let c = f.config();
    let weights: u64 = f.tensor_infos().iter().map(|t| t.length).sum();
    use crate::model::KvDtype;
    let kv_per_token = KvDtype::F16.bytes_per_token(c);
    let others: Vec<String> = [KvDtype::Q8_0, KvDtype::F32]
        .iter()
        .map(|k| format!("{k} {:.1} KiB", k.bytes_per_token(c) as f64 / 1024.0))
        .collect();
    let _ = writeln!(
        o,
        "memory: weights {:.1} MiB (mapped, shared between processes); KV cache (f16, the CPU's default) {:.1} KiB per token, {:.1} MiB at the full context of {} (--kv-dtype {})",
        weights as f64 / 1048576.0,
        kv_per_token as f64 / 1024.0,
        (kv_per_token * c.context_length) as f64 / 1048576.0,
        c.context_length,
        others.join(", ")
    );
    let _ = writeln!(o, "tensors ({}):", f.tensor_infos().len());
    for ti in f.tensor_infos() {
        let _ = writeln!(
            o,
            "  {:<56} {:<5} {:<16} {:>12} bytes @ {} crc {:08x}",
            ti.name,
            ti.dtype.name(),
            format!("{:?}", ti.dims),
            ti.length,
            ti.offset,
            ti.crc32
        );
    }
    Ok(())
}

fn describe_gguf(path: &Path, o: &mut String) -> Result<()> {
    let g = GgufFile::open(path)?;
    let _ = writeln!(o, "{}: GGUF version {}", g.path, g.version);
    let _ = writeln!(o, "metadata:");
    for (k, v) in &g.metadata {
        if k == "tokenizer.ggml.tokens" || k == "tokenizer.ggml.merges" {
            continue;
        }
        let _ = writeln!(o, "  {k} = {}", gguf_str(v));
    }
    let _ = writeln!(o, "tokenizer:");
    let _ = writeln!(
        o,
        "  model {:?}, pre {:?}, tokens {}, merges {}, bos {:?}, eos {:?}",
        g.get_str("tokenizer.ggml.model").unwrap_or("-"),
        g.get_str("tokenizer.ggml.pre").unwrap_or("-"),
        g.get_array("tokenizer.ggml.tokens").map_or(0, |a| a.len()),
        g.get_array("tokenizer.ggml.merges").map_or(0, |a| a.len()),
        g.get_u64("tokenizer.ggml.bos_token_id"),
        g.get_u64("tokenizer.ggml.eos_token_id"),
    );
    let _ = writeln!(o, "tensors ({}):", g.tensors.len());
    for t in &g.tensors {
        let ty = ggml_type::info(t.ggml_type).map_or("?", |i| i.0);
        let _ = writeln!(
            o,
            "  {:<40} {:<5} {:<16} {:>12} bytes @ {}",
            t.name,
            ty,
            format!("{:?}", t.shape()),
            t.size,
            g.data_offset + t.offset
        );
    }
    Ok(())
}

/// Describes `path` (a `.flm` or GGUF file).
pub fn describe(path: &Path) -> Result<String> {
    let mut o = String::new();
    match detect_input(path)? {
        InputKind::Flm => describe_flm(path, &mut o)?,
        InputKind::Gguf => describe_gguf(path, &mut o)?,
        InputKind::HfDir => Err(Error::invalid(format!(
            "{}: --info takes a .flm or GGUF file, not a directory",
            path.display()
        )))?,
    }
    Ok(o)
}
