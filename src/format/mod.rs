//! Model file formats: the `.flm` reader/writer, and the GGUF and safetensors readers used by the
//! converter.

pub mod gguf;
