//! The `.flm` model format (spec: `docs/flm-format.md`): a streaming writer ([`FlmWriter`]) and a
//! validating reader ([`FlmFile`]) with memory-mapped or low-memory tensor access. Submodules own
//! one part of the file each: header/section table, metadata, tokenizer, tensor index.

mod bytes;
mod config_meta;
pub mod index;
pub mod layout;
pub mod meta;
mod reader;
mod tokenizer_codec;
mod writer;

pub use index::TensorInfo;
pub use layout::{ALIGN, MAGIC, VERSION_MAJOR, VERSION_MINOR};
pub use meta::{MetaValue, Metadata};
pub use reader::{FlmFile, LoadMode};
pub use writer::FlmWriter;

/// True when the file at `path` starts with the `.flm` magic (an I/O error if it cannot be read).
pub fn is_flm(path: &std::path::Path) -> crate::error::Result<bool> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| crate::error::Error::io(path.display(), e))?;
    let mut m = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        match f.read(&mut m[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(crate::error::Error::io(path.display(), e)),
        }
    }
    Ok(got == 8 && m == MAGIC)
}
