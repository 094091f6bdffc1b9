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
