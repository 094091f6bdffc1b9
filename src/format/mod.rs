//! Model file formats: the `.flm` reader/writer, and the GGUF and safetensors readers used by the
//! converter. Parsing and validation only; name mapping and dtype conversion live in
//! `crate::convert`.

// `x % n != 0` instead of `is_multiple_of`: the workspace MSRV (1.80) predates it.
#![allow(clippy::manual_is_multiple_of)]

pub mod flm;
pub mod gguf;
pub mod info;
pub mod pread;
pub mod safetensors;
