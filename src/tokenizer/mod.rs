//! Tokenizers: a vocabulary trie under three algorithms (byte-level BPE, SentencePiece-style BPE
//! with byte fallback, greedy longest match), special tokens, and streaming-safe decoding.
//!
//! [`TokenizerSpec`] is the plain-data description stored in `.flm` files and built from
//! Hugging Face `tokenizer.json` or GGUF metadata.

pub mod spec;

pub use spec::{AddedToken, NormalizerKind, PreTokenizerKind, TokenizerKind, TokenizerSpec};
