//! Translation of GGUF tokenizer metadata (`tokenizer.ggml.*`, as written by llama.cpp's
//! converters) into a [`TokenizerSpec`]. It only reads metadata; unknown or inconsistent keys
//! are errors naming the key. It lives with the converter, above both the GGUF reader and the
//! tokenizer, so the tokenizer layer knows no file format but its own spec.

use crate::error::{Error, Result};
use crate::format::gguf::{GgufFile, GgufValue};
use crate::tokenizer::{
    AddedToken, NormalizerKind, PreTokenizerKind, TokenizerKind, TokenizerSpec,
};

/// llama.cpp token types.
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;
const TOKEN_TYPE_BYTE: i64 = 6;

fn bad(file: &GgufFile, msg: impl std::fmt::Display) -> Error {
    Error::format(&file.path, format!("tokenizer metadata: {msg}"))
}

fn array<'a>(file: &'a GgufFile, key: &str) -> Result<Option<&'a [GgufValue]>> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_array()
            .map(Some)
            .ok_or_else(|| bad(file, format!("{key} is not an array"))),
    }
}

fn optional_id(file: &GgufFile, key: &str, n: usize) -> Result<Option<u32>> {
    let Some(v) = file.get(key) else {
        return Ok(None);
    };
    // llama.cpp writes -1 (as a u32 0xFFFFFFFF) for "none"
    if v.as_i64() == Some(-1) || v.as_u64() == Some(u32::MAX as u64) {
        return Ok(None);
    }
    match v.as_u64() {
        Some(id) if (id as usize) < n => Ok(Some(id as u32)),
        _ => Err(bad(
            file,
            format!("{key} = {v:?} is not a token id below {n}"),
        )),
    }
}

fn optional_bool(file: &GgufFile, key: &str) -> Result<Option<bool>> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| bad(file, format!("{key} is not a bool"))),
    }
}

/// The token strings (`tokenizer.ggml.tokens`, at least one).
fn gguf_vocab(file: &GgufFile) -> Result<Vec<Vec<u8>>> {
    let tokens = array(file, "tokenizer.ggml.tokens")?
        .ok_or_else(|| bad(file, "no tokenizer.ggml.tokens"))?;
    if tokens.is_empty() {
        return Err(bad(file, "tokenizer.ggml.tokens is empty"));
    }
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_str()
                .map(|s| s.as_bytes().to_vec())
                .ok_or_else(|| bad(file, format!("tokenizer.ggml.tokens[{i}] is not a string")))
        })
        .collect()
}

/// The token scores (`tokenizer.ggml.scores`, one per token), empty when absent.
fn gguf_scores(file: &GgufFile, n: usize) -> Result<Vec<f32>> {
    match array(file, "tokenizer.ggml.scores")? {
        None => Ok(Vec::new()),
        Some(a) if a.len() == n => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| bad(file, format!("tokenizer.ggml.scores[{i}] is not a number")))
            })
            .collect(),
        Some(a) => Err(bad(file, format!("{} scores for {n} tokens", a.len()))),
    }
}

/// The added tokens by `tokenizer.ggml.token_type` (control tokens special, user-defined ones
/// not), and whether any token is a byte token.
fn gguf_added(file: &GgufFile, vocab: &[Vec<u8>]) -> Result<(Vec<AddedToken>, bool)> {
    let n = vocab.len();
    let mut added = Vec::new();
    let mut has_byte_tokens = false;
    let Some(types) = array(file, "tokenizer.ggml.token_type")? else {
        return Ok((added, has_byte_tokens));
    };
    if types.len() != n {
        return Err(bad(
            file,
            format!("{} token types for {n} tokens", types.len()),
        ));
    }
    for (i, t) in types.iter().enumerate() {
        let t = t.as_i64().ok_or_else(|| {
            bad(
                file,
                format!("tokenizer.ggml.token_type[{i}] is not an integer"),
            )
        })?;
        match t {
            TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED => {
                let content = String::from_utf8_lossy(&vocab[i]).into_owned();
                if !content.is_empty() {
                    added.push(AddedToken {
                        id: i as u32,
                        content,
                        special: t == TOKEN_TYPE_CONTROL,
                    });
                }
            }
            TOKEN_TYPE_BYTE => has_byte_tokens = true,
            _ => {}
        }
    }
    Ok((added, has_byte_tokens))
}

/// The merges (`tokenizer.ggml.merges`, `"a b"` strings), empty when absent.
fn gguf_merges(file: &GgufFile) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let Some(m) = array(file, "tokenizer.ggml.merges")? else {
        return Ok(Vec::new());
    };
    m.iter()
        .enumerate()
        .map(|(i, v)| {
            let (a, b) = v
                .as_str()
                .and_then(|s| s.split_once(' '))
                .ok_or_else(|| bad(file, format!("tokenizer.ggml.merges[{i}] is not \"a b\"")))?;
            Ok((a.as_bytes().to_vec(), b.as_bytes().to_vec()))
        })
        .collect()
}

/// The pre-tokenizer of a byte-level BPE, by llama.cpp's `tokenizer.ggml.pre` name.
fn gguf_pre_tokenizer(file: &GgufFile) -> Result<PreTokenizerKind> {
    match file.get_str("tokenizer.ggml.pre").unwrap_or("default") {
        "smollm" => Ok(PreTokenizerKind::SmolLm),
        "llama-bpe" | "llama3" => Ok(PreTokenizerKind::Llama3),
        "qwen2" => Ok(PreTokenizerKind::Qwen2),
        "gpt-2" | "default" => Ok(PreTokenizerKind::Gpt2),
        other => Err(Error::Unsupported(format!(
            "{}: tokenizer.ggml.pre '{other}' (known: smollm, llama-bpe, qwen2, gpt-2, default)",
            file.path
        ))),
    }
}

impl TokenizerSpec {
    /// Builds a spec from the `tokenizer.ggml.*` metadata of a GGUF file.
    pub fn from_gguf(file: &GgufFile) -> Result<TokenizerSpec> {
        let model = file
            .get_str("tokenizer.ggml.model")
            .ok_or_else(|| bad(file, "no tokenizer.ggml.model"))?;
        let (kind, normalizer) = match model {
            "gpt2" => (TokenizerKind::ByteLevelBpe, NormalizerKind::None),
            "llama" => (
                TokenizerKind::SentencePieceBpe,
                NormalizerKind::SentencePiece,
            ),
            other => {
                return Err(Error::Unsupported(format!(
                    "{}: tokenizer.ggml.model '{other}' (known: gpt2, llama)",
                    file.path
                )))
            }
        };
        let vocab = gguf_vocab(file)?;
        let n = vocab.len();
        let scores = gguf_scores(file, n)?;
        let (added, has_byte_tokens) = gguf_added(file, &vocab)?;
        let merges = gguf_merges(file)?;
        let pre_tokenizer = match kind {
            TokenizerKind::ByteLevelBpe => gguf_pre_tokenizer(file)?,
            _ => PreTokenizerKind::None,
        };
        if kind == TokenizerKind::ByteLevelBpe && merges.is_empty() {
            return Err(bad(file, "gpt2 tokenizer without tokenizer.ggml.merges"));
        }
        let add_prefix_space = match kind {
            TokenizerKind::SentencePieceBpe => {
                optional_bool(file, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true)
            }
            _ => false,
        };
        let bos_id = optional_id(file, "tokenizer.ggml.bos_token_id", n)?;
        let mut eos_ids: Vec<u32> = Vec::new();
        for key in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            eos_ids.extend(optional_id(file, key, n)?.filter(|id| !eos_ids.contains(id)));
        }
        let add_bos = optional_bool(file, "tokenizer.ggml.add_bos_token")?
            .unwrap_or(kind == TokenizerKind::SentencePieceBpe)
            && bos_id.is_some();
        let add_eos = optional_bool(file, "tokenizer.ggml.add_eos_token")?.unwrap_or(false)
            && !eos_ids.is_empty();
        Ok(TokenizerSpec {
            kind,
            vocab,
            scores,
            merges,
            added,
            pre_tokenizer,
            normalizer,
            add_prefix_space,
            byte_fallback: kind == TokenizerKind::SentencePieceBpe && has_byte_tokens,
            bos_id,
            eos_ids,
            unk_id: optional_id(file, "tokenizer.ggml.unknown_token_id", n)?,
            pad_id: optional_id(file, "tokenizer.ggml.padding_token_id", n)?,
            add_bos,
            add_eos,
        })
    }
}
