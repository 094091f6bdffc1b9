//! Tokenizers: a vocabulary trie under three algorithms (byte-level BPE, SentencePiece-style BPE
//! with byte fallback, greedy longest match), special tokens, and streaming-safe decoding.
//!
//! [`TokenizerSpec`] is the plain-data description stored in `.flm` files and built from
//! Hugging Face `tokenizer.json` ([`TokenizerSpec::from_hf_json`]) or GGUF metadata
//! ([`TokenizerSpec::from_gguf`], defined by the converter, which reads GGUF files);
//! [`Tokenizer::new`] builds the working tokenizer from it.
//!
//! Where this differs from HF `tokenizers` (none of it shows in the fixtures):
//! - added tokens are matched verbatim in the raw text; their `lstrip`/`rstrip`/`single_word`/
//!   `normalized` flags are not part of the spec;
//! - a Metaspace pre-tokenizer with `prepend_scheme: "first"` is treated like `"always"`
//!   (`▁` is prepended to every text segment between added tokens);
//! - HF's `ignore_merges` is implied by the Llama-3 pre-tokenizer (it is what Llama-3 sets).

mod bpe;
mod byte_level;
mod codec;
mod hf_json;
mod pretokenize;
pub mod spec;
mod stream;
pub mod trie;
mod unicode_class;

pub use codec::Tokenizer;
pub use spec::{AddedToken, NormalizerKind, PreTokenizerKind, TokenizerKind, TokenizerSpec};
pub use stream::{StreamDecoder, StreamState};
pub use trie::Trie;

/// The byte-level BPE vocabulary string (GPT-2's byte-to-unicode alphabet, `Ġ` for a space) of
/// raw `bytes`, e.g. to build a [`TokenizerSpec`] by hand.
pub fn byte_level_piece(bytes: &[u8]) -> String {
    let table = byte_level::byte_to_char();
    bytes.iter().map(|&b| table[b as usize]).collect()
}
