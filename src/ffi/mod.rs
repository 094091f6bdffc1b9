//! The C ABI (`include/fastllm.h` is generated from this module by cbindgen).
//!
//! Rules every exported function follows:
//! - its body runs inside `guard`, one `catch_unwind` boundary: a Rust panic becomes
//!   `FASTLLM_ERR_PANIC`, never an unwind into C;
//! - NULL pointers where a value is required give `FASTLLM_ERR_NULL_ARGUMENT`;
//! - outputs are written only on success; the failure detail is kept per thread and read with
//!   `fastllm_last_error()`;
//! - `*_free(NULL)` is a no-op.
//!
//! Ownership: `FastllmModel` is reference-counted internally; sessions keep their model alive, so
//! freeing a model while sessions exist is safe (the memory goes with the last session). A model
//! may be used from many threads at once (tokenize, detokenize, new sessions); a session from one
//! thread at a time.

mod data;
mod model;
mod session;
mod status;

pub use data::*;
pub use model::*;
pub use session::*;
pub use status::*;
