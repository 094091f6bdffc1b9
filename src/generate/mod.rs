//! Generation: sampling, chat templates, and sessions (one sequence + its KV cache).

pub mod chat;
pub mod sampler;
pub mod session;

pub use chat::ChatMessage;
pub use sampler::{sample_logits, Penalties, SampleRow, Sampler, SamplingParams};
pub use session::{GenerateParams, Generation, Llm, Session, StopReason};
