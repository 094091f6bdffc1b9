//! fastllm: a portable LLM inference runtime.
//!
//! The core is fastllm's design: a tensor type ([`data::Data`]), an [`executor::Executor`] that
//! runs named ops (`"Linear"`, `"Attention"`, ...) on the first registered device
//! ([`device::BaseDevice`]) that accepts them, and devices holding registries of operators.

pub mod convert;
pub mod data;
pub mod default_model;
pub mod device;
pub mod devices;
pub mod dict;
pub mod error;
pub mod executor;
pub mod ffi;
pub mod format;
pub mod generate;
// The op test harness: built for this crate's unit tests and, through the `harness` feature,
// for its integration tests and benches; the library built by default does not contain it.
#[cfg(any(test, feature = "harness"))]
pub mod harness;
pub mod interleave;
pub mod load;
pub mod model;
pub mod ops;
pub mod options;
pub mod parallel;
pub mod progress;
pub mod step;
pub mod step_passes;
pub mod tokenizer;

pub use data::{Data, DataType, DeviceKind};
pub use device::{BaseDevice, Operator};
pub use dict::{DataDict, FloatDict, IntDict};
pub use error::{Error, Result};
pub use executor::Executor;
