//! `TokenizerSpec`: everything needed to rebuild a tokenizer, as plain data (no behaviour). The
//! `.flm` writer stores it; HF `tokenizer.json` and GGUF metadata are translated into it.

/// The tokenization algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// GPT-2 style byte-level BPE (GPT-2, Llama-3, Qwen2, SmolLM2): vocabulary entries are in the
    /// byte-to-unicode alphabet (`Ġ` for space), merges ranked by order.
    ByteLevelBpe = 0,
    /// SentencePiece-style BPE (Llama-2, Mistral): `▁` for spaces, optional prepended `▁`,
    /// `<0xNN>` byte fallback; merges (or scores when no merges are given).
    SentencePieceBpe = 1,
    /// Greedy longest match over the vocabulary trie (vocabularies without merges).
    GreedyTrie = 2,
}

/// How text is split before BPE runs (byte-level BPE only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// No splitting.
    None = 0,
    /// The GPT-2 regex.
    Gpt2 = 1,
    /// The Llama-3 regex.
    Llama3 = 2,
    /// The Qwen2 regex.
    Qwen2 = 3,
    /// Every digit on its own, then the GPT-2 regex (SmolLM2; GGUF `tokenizer.ggml.pre = smollm`).
    SmolLm = 4,
}

/// Text normalization before tokenization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormalizerKind {
    /// None.
    None = 0,
    /// SentencePiece: replace spaces with `▁` (and prepend `▁` when `add_prefix_space`).
    SentencePiece = 1,
    /// Unicode NFC.
    Nfc = 2,
}

/// A token that is matched as a whole in the text before the algorithm runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddedToken {
    /// Token id.
    pub id: u32,
    /// Its text.
    pub content: String,
    /// True for control tokens (`<|im_start|>`, `<s>`): skipped when decoding with
    /// `skip_special`, matched only when parsing special tokens is on.
    pub special: bool,
}

/// The plain-data description of a tokenizer.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenizerSpec {
    /// Algorithm.
    pub kind: TokenizerKind,
    /// Token strings as in the source vocabulary (UTF-8 bytes; byte-level alphabet for
    /// byte-level BPE, `▁`/`<0xNN>` pieces for SentencePiece), indexed by id.
    pub vocab: Vec<Vec<u8>>,
    /// Per-token scores (SentencePiece); empty when unused.
    pub scores: Vec<f32>,
    /// Merges as (left, right) token-string pairs, highest priority first; empty when unused.
    pub merges: Vec<(Vec<u8>, Vec<u8>)>,
    /// Added/special tokens.
    pub added: Vec<AddedToken>,
    /// Pre-tokenizer (byte-level BPE).
    pub pre_tokenizer: PreTokenizerKind,
    /// Normalizer.
    pub normalizer: NormalizerKind,
    /// SentencePiece: prepend `▁` to the text. Byte-level: add a leading space.
    pub add_prefix_space: bool,
    /// SentencePiece: fall back to `<0xNN>` byte tokens for unknown characters.
    pub byte_fallback: bool,
    /// Beginning-of-sequence id.
    pub bos_id: Option<u32>,
    /// End-of-sequence ids (the first is the main one).
    pub eos_ids: Vec<u32>,
    /// Unknown-token id.
    pub unk_id: Option<u32>,
    /// Padding id.
    pub pad_id: Option<u32>,
    /// Prepend bos when encoding with special tokens.
    pub add_bos: bool,
    /// Append eos when encoding with special tokens.
    pub add_eos: bool,
}
