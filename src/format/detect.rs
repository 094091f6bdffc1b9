//! What kind of model input a path is: a Hugging Face directory, a GGUF file or a `.flm` file,
//! told from the file type and the first bytes.

use crate::error::{Error, Result};
use std::io::Read;
use std::path::Path;

/// The kinds of model input a path can be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// A Hugging Face model directory.
    HfDir,
    /// A GGUF file.
    Gguf,
    /// A `.flm` file.
    Flm,
}

/// Tells what `input` is from its type and first bytes; `Err` naming it otherwise.
pub fn detect_input(input: &Path) -> Result<InputKind> {
    let ps = input.display().to_string();
    let md = std::fs::metadata(input).map_err(|e| Error::io(&ps, e))?;
    if md.is_dir() {
        return Ok(InputKind::HfDir);
    }
    let mut head = [0u8; 8];
    let mut f = std::fs::File::open(input).map_err(|e| Error::io(&ps, e))?;
    let n = f.read(&mut head).map_err(|e| Error::io(&ps, e))?;
    match head.get(..n) {
        Some(h) if h.starts_with(b"GGUF") => Ok(InputKind::Gguf),
        Some(h) if h.starts_with(&super::flm::MAGIC) => Ok(InputKind::Flm),
        _ => Err(Error::format(
            &ps,
            "not a GGUF file, .flm file or Hugging Face model directory",
        )),
    }
}
