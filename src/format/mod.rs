//! Model file formats: the `.flm` reader/writer, and the GGUF and safetensors readers used by the
//! converter. Parsing and validation only; name mapping and dtype conversion live in
//! `crate::convert`.

mod detect;
pub mod flm;
pub mod gguf;
pub mod info;
pub mod pread;
pub mod safetensors;

pub use detect::{detect_input, InputKind};
