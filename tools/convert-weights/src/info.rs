//! `--info`: prints a `.flm` or GGUF file's metadata, tokenizer summary and tensor table.

use fastllm::convert::{detect_input, InputKind};
use fastllm::format::flm::{FlmFile, LoadMode, MetaValue};
use fastllm::format::gguf::{ggml_type, GgufFile, GgufValue};
use fastllm::{Error, Result};
use std::path::Path;

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
    if flat.chars().count() > max {
        format!("{}… ({} chars)", flat.chars().take(max).collect::<String>(), s.chars().count())
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
            format!("[{}]", a.iter().map(meta_str).collect::<Vec<_>>().join(", "))
        }
        MetaValue::Array(a) => format!("[{} items]", a.len()),
    }
}

fn gguf_str(v: &GgufValue) -> String {
    match v {
        GgufValue::Str(s) => format!("{:?}", one_line(s, 80)),
        GgufValue::Array(a) if a.len() <= 16 => {
            format!("[{}]", a.iter().map(gguf_str).collect::<Vec<_>>().join(", "))
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

fn print_flm(path: &Path) -> Result<()> {
    let f = FlmFile::open(path, LoadMode::LowMemory)?;
    let (major, minor) = f.version();
    println!("{}: .flm version {major}.{minor}", f.path());
    println!("metadata:");
    for (k, v) in f.metadata() {
        println!("  {k} = {}", meta_str(v));
    }
    let t = f.tokenizer_spec();
    println!("tokenizer:");
    println!(
        "  kind {:?}, pre-tokenizer {:?}, normalizer {:?}",
        t.kind, t.pre_tokenizer, t.normalizer
    );
    println!(
        "  vocab {}, merges {}, scores {}, added {} ({} special)",
        t.vocab.len(),
        t.merges.len(),
        if t.scores.is_empty() { "no" } else { "yes" },
        t.added.len(),
        t.added.iter().filter(|a| a.special).count()
    );
    println!(
        "  bos {:?}, eos {:?}, unk {:?}, pad {:?}, add_bos {}, add_eos {}",
        t.bos_id, t.eos_ids, t.unk_id, t.pad_id, t.add_bos, t.add_eos
    );
    println!("tensors ({}):", f.tensor_infos().len());
    for ti in f.tensor_infos() {
        println!(
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

fn print_gguf(path: &Path) -> Result<()> {
    let g = GgufFile::open(path)?;
    println!("{}: GGUF version {}", g.path, g.version);
    println!("metadata:");
    for (k, v) in &g.metadata {
        if k == "tokenizer.ggml.tokens" || k == "tokenizer.ggml.merges" {
            continue;
        }
        println!("  {k} = {}", gguf_str(v));
    }
    println!("tokenizer:");
    println!(
        "  model {:?}, pre {:?}, tokens {}, merges {}, bos {:?}, eos {:?}",
        g.get_str("tokenizer.ggml.model").unwrap_or("-"),
        g.get_str("tokenizer.ggml.pre").unwrap_or("-"),
        g.get_array("tokenizer.ggml.tokens").map_or(0, |a| a.len()),
        g.get_array("tokenizer.ggml.merges").map_or(0, |a| a.len()),
        g.get_u64("tokenizer.ggml.bos_token_id"),
        g.get_u64("tokenizer.ggml.eos_token_id"),
    );
    println!("tensors ({}):", g.tensors.len());
    for t in &g.tensors {
        let ty = ggml_type::info(t.ggml_type).map_or("?", |i| i.0);
        println!(
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

/// Prints `path` (a `.flm` or GGUF file).
pub fn print_info(path: &Path) -> Result<()> {
    match detect_input(path)? {
        InputKind::Flm => print_flm(path),
        InputKind::Gguf => print_gguf(path),
        InputKind::HfDir => Err(Error::invalid(format!(
            "{}: --info takes a .flm or GGUF file, not a directory",
            path.display()
        ))),
    }
}
