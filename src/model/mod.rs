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
mod paged_batch;
mod paged_buckets;
mod paged_forward;
pub mod paged_graph;
pub mod precision;
mod rank_top;
mod replay;
pub mod rope;
pub mod sampler;
pub mod shard;
mod step_kv;
mod step_rows;
pub mod synthetic;
pub mod tensor_parallel;
pub mod tp_group;
mod tp_link;
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
pub use paged_batch::{BatchDecode, BATCH_BUCKETS};
pub use paged_graph::warm_batch_decode;
pub use precision::Precision;
pub use step_kv::KvStore;
pub use step_rows::CPU_PREFILL_CHUNK;
pub use synthetic::SyntheticSource;
pub use transformer::{KvCache, Model};
pub use weights::{MapSource, WeightSource, Weights};
