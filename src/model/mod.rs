//! Model architectures: configuration, the architecture table, weight access, the transformer
//! forward pass built from Executor ops, and token sampling from its logits.

pub mod arch;
pub mod config;
pub mod kv_dtype;
mod layers;
pub mod logprobs;
pub mod mla;
pub mod moe;
pub mod paged;
pub mod paged_graph;
pub mod precision;
pub mod rope;
pub mod sampler;
mod step_kv;
mod step_rows;
pub mod synthetic;
pub mod tensor_parallel;
pub mod tp_process;
pub mod transformer;
mod ubatch;
pub mod weights;

pub use config::{ModelConfig, RopeScaling, RopeStyle, ROPE_FREQS_TENSOR};
pub use kv_dtype::KvDtype;
pub use logprobs::PickLogprobs;
pub use mla::{MlaConfig, MlaNames};
pub use moe::{MoeConfig, MoeNames, MoeScoring, SwigluClamp};
pub use paged::{PagedKvPool, PagedSeqState};
pub use paged_graph::{warm_batch_decode, BatchDecode, BATCH_BUCKETS};
pub use precision::Precision;
pub use step_kv::KvStore;
pub use step_rows::CPU_PREFILL_CHUNK;
pub use synthetic::SyntheticSource;
pub use transformer::{KvCache, Model};
pub use weights::{MapSource, WeightSource, Weights};
