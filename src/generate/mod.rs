//! Generation: sampling, chat templates, sessions (one sequence + its KV cache), and perplexity
//! over a text.

pub mod chat;
pub mod perplexity;
pub use crate::model::sampler;
pub mod session;
pub mod stop;

pub use chat::ChatMessage;
pub use sampler::{sample_logits, Penalties, SampleRow, Sampler, SamplingParams, TokenMask};
pub use session::{GenerateParams, Generation, Llm, Prefill, Session, StopReason};
