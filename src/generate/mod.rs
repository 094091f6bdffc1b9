//! Generation: sampling, chat templates, sessions (one sequence + its KV cache), and perplexity
//! over a text.

pub mod chat;
pub mod perplexity;
pub mod sampler;
pub mod session;

pub use chat::ChatMessage;
pub use sampler::{sample_logits, Penalties, SampleRow, Sampler, SamplingParams, TokenMask};
pub use session::{GenerateParams, Generation, Llm, Session, StopReason};
