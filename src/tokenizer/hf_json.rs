//! Translation of Hugging Face `tokenizer.json` (+ optional `tokenizer_config.json`) into a
//! [`TokenizerSpec`]. Recognizes the BPE families this runtime implements (byte-level with the
//! GPT-2 / Llama-3 / Qwen2 / SmolLM pre-tokenizers, SentencePiece-style with `▁` and byte
//! fallback); anything else is an error naming what was not understood. It only reads JSON.

use super::spec::{AddedToken, NormalizerKind, PreTokenizerKind, TokenizerKind, TokenizerSpec};
use crate::error::{Error, Result};
use serde_json::Value;
use std::collections::HashMap;

const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const SP_SPACE: &str = "\u{2581}";

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::invalid(format!("tokenizer.json: {msg}"))
}

fn unsupported(msg: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("tokenizer.json: {msg}"))
}

fn type_of(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

fn bool_field(v: &Value, key: &str, default: bool) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(default)
}

/// What the pre-tokenizer section says.
#[derive(Default)]
struct PreTokenizerInfo {
    kind: Option<PreTokenizerKind>,
    byte_level: bool,
    add_prefix_space: bool,
    /// A Metaspace pre-tokenizer: SentencePiece text handling, with prepend on or off.
    metaspace_prepend: Option<bool>,
}

fn pattern_kind(pattern: &str) -> Result<PreTokenizerKind> {
    match pattern {
        GPT2_PATTERN => Ok(PreTokenizerKind::Gpt2),
        LLAMA3_PATTERN => Ok(PreTokenizerKind::Llama3),
        QWEN2_PATTERN => Ok(PreTokenizerKind::Qwen2),
        _ => Err(unsupported(format!(
            "unknown pre-tokenizer Split regex {pattern:?} (known: GPT-2, Llama-3, Qwen2)"
        ))),
    }
}

/// The regex of a `Split` pre-tokenizer step (isolated matches, not inverted).
fn split_pattern(step: &Value) -> Result<&str> {
    let pattern = step
        .get("pattern")
        .and_then(|p| p.get("Regex"))
        .and_then(Value::as_str)
        .ok_or_else(|| unsupported("pre_tokenizer Split without a Regex pattern"))?;
    let behavior = step.get("behavior").and_then(Value::as_str).unwrap_or("");
    if behavior != "Isolated" || bool_field(step, "invert", false) {
        return Err(unsupported(format!(
            "pre_tokenizer Split with behavior '{behavior}' (only Isolated, not inverted)"
        )));
    }
    Ok(pattern)
}

/// Whether a `Metaspace` pre-tokenizer step (no split, `▁` as the replacement) puts `▁` in
/// front of the text.
fn metaspace_prepends(step: &Value) -> Result<bool> {
    if bool_field(step, "split", true) {
        return Err(unsupported("pre_tokenizer Metaspace with split = true"));
    }
    let replacement = step
        .get("replacement")
        .and_then(Value::as_str)
        .unwrap_or(SP_SPACE);
    if replacement != SP_SPACE {
        return Err(unsupported(format!(
            "Metaspace replacement {replacement:?}"
        )));
    }
    let scheme = step.get("prepend_scheme").and_then(Value::as_str);
    Ok(match scheme {
        Some("never") => false,
        Some(_) => true,
        None => bool_field(step, "add_prefix_space", true),
    })
}

fn parse_pre_tokenizer(v: &Value) -> Result<PreTokenizerInfo> {
    let mut info = PreTokenizerInfo::default();
    if v.is_null() {
        return Ok(info);
    }
    let steps: Vec<&Value> = match type_of(v) {
        "Sequence" => v
            .get("pretokenizers")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("pre_tokenizer Sequence without 'pretokenizers'"))?
            .iter()
            .collect(),
        _ => vec![v],
    };
    let mut digits = false;
    for step in steps {
        match type_of(step) {
            "ByteLevel" => {
                info.byte_level = true;
                info.add_prefix_space = bool_field(step, "add_prefix_space", false);
                if bool_field(step, "use_regex", true) {
                    if info.kind.is_some() {
                        return Err(unsupported(
                            "pre_tokenizer splits twice (Split and ByteLevel regex)",
                        ));
                    }
                    info.kind = Some(if digits {
                        PreTokenizerKind::SmolLm
                    } else {
                        PreTokenizerKind::Gpt2
                    });
                }
            }
            "Split" => {
                let pattern = split_pattern(step)?;
                if info.kind.is_some() || digits {
                    return Err(unsupported("pre_tokenizer with several splitting steps"));
                }
                info.kind = Some(pattern_kind(pattern)?);
            }
            "Digits" => {
                if !bool_field(step, "individual_digits", false) || info.kind.is_some() {
                    return Err(unsupported(
                        "pre_tokenizer Digits (only individual_digits before ByteLevel)",
                    ));
                }
                digits = true;
            }
            "Metaspace" => info.metaspace_prepend = Some(metaspace_prepends(step)?),
            other => return Err(unsupported(format!("pre_tokenizer type '{other}'"))),
        }
    }
    if digits && info.kind != Some(PreTokenizerKind::SmolLm) {
        return Err(unsupported(
            "pre_tokenizer Digits not followed by ByteLevel with its regex",
        ));
    }
    Ok(info)
}

/// `(normalizer, prepend ▁)`.
fn parse_normalizer(v: &Value) -> Result<(NormalizerKind, bool)> {
    if v.is_null() {
        return Ok((NormalizerKind::None, false));
    }
    let steps: Vec<&Value> = match type_of(v) {
        "Sequence" => v
            .get("normalizers")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("normalizer Sequence without 'normalizers'"))?
            .iter()
            .collect(),
        _ => vec![v],
    };
    let (mut prepend, mut replace, mut nfc) = (false, false, false);
    for step in steps {
        match type_of(step) {
            "Prepend" if step.get("prepend").and_then(Value::as_str) == Some(SP_SPACE) => {
                prepend = true
            }
            "Replace"
                if step
                    .get("pattern")
                    .and_then(|p| p.get("String"))
                    .and_then(Value::as_str)
                    == Some(" ")
                    && step.get("content").and_then(Value::as_str) == Some(SP_SPACE) =>
            {
                replace = true
            }
            "NFC" => nfc = true,
            other => {
                return Err(unsupported(format!(
                    "normalizer '{other}' ({})",
                    serde_json::to_string(step).unwrap_or_default()
                )))
            }
        }
    }
    match (prepend, replace, nfc) {
        (false, false, false) => Ok((NormalizerKind::None, false)),
        (_, true, false) => Ok((NormalizerKind::SentencePiece, prepend)),
        (false, false, true) => Ok((NormalizerKind::Nfc, false)),
        _ => Err(unsupported(
            "normalizer combination (Prepend ▁ without Replace, or NFC with ▁)",
        )),
    }
}

/// True if the decoder is byte-level (ByteLevel anywhere in it).
fn decoder_has(v: &Value, kind: &str) -> bool {
    if type_of(v) == kind {
        return true;
    }
    v.get("decoders")
        .and_then(Value::as_array)
        .is_some_and(|d| d.iter().any(|x| decoder_has(x, kind)))
}

/// `(bos token, eos token)` from the post-processor: special tokens before/after `$A`.
fn parse_post_processor(v: &Value) -> Result<(Option<u32>, Option<u32>)> {
    match type_of(v) {
        "" if v.is_null() => Ok((None, None)),
        "ByteLevel" => Ok((None, None)),
        "Sequence" => {
            let mut out = (None, None);
            for p in v
                .get("processors")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let (b, e) = parse_post_processor(p)?;
                out = (out.0.or(b), out.1.or(e));
            }
            Ok(out)
        }
        "TemplateProcessing" => {
            let single = v
                .get("single")
                .and_then(Value::as_array)
                .ok_or_else(|| bad("TemplateProcessing without 'single'"))?;
            let specials = v.get("special_tokens");
            let id_of = |item: &Value| -> Result<Option<u32>> {
                let Some(name) = item
                    .get("SpecialToken")
                    .and_then(|s| s.get("id"))
                    .and_then(Value::as_str)
                else {
                    return Ok(None);
                };
                let ids = specials
                    .and_then(|s| s.get(name))
                    .and_then(|s| s.get("ids"))
                    .and_then(Value::as_array)
                    .ok_or_else(|| {
                        bad(format!(
                            "TemplateProcessing special token '{name}' has no ids"
                        ))
                    })?;
                match ids.as_slice() {
                    [id] => Ok(id.as_u64().and_then(|i| u32::try_from(i).ok())),
                    _ => Err(unsupported(format!(
                        "template special token '{name}' with {} ids",
                        ids.len()
                    ))),
                }
            };
            let seq = single
                .iter()
                .position(|i| i.get("Sequence").is_some())
                .ok_or_else(|| bad("TemplateProcessing 'single' has no $A"))?;
            if seq > 1 || single.len() > seq + 2 {
                return Err(unsupported(
                    "TemplateProcessing with more than one token around $A",
                ));
            }
            let bos = match seq {
                1 => single.first().map(id_of).transpose()?.flatten(),
                _ => None,
            };
            let eos = single.get(seq + 1).map(id_of).transpose()?.flatten();
            Ok((bos, eos))
        }
        other => Err(unsupported(format!("post_processor type '{other}'"))),
    }
}

/// A token named in tokenizer_config.json (`"<s>"` or `{"content": "<s>", ...}`).
fn config_token<'a>(config: Option<&'a Value>, key: &str) -> Option<&'a str> {
    let v = config?.get(key)?;
    v.as_str()
        .or_else(|| v.get("content").and_then(Value::as_str))
}

impl TokenizerSpec {
    /// Builds a spec from HF `tokenizer.json` and, optionally, `tokenizer_config.json` (which
    /// names bos/eos/unk/pad and may set `add_bos_token`/`add_eos_token`).
    pub fn from_hf_json(
        tokenizer_json: &str,
        tokenizer_config_json: Option<&str>,
    ) -> Result<TokenizerSpec> {
        let root: Value = serde_json::from_str(tokenizer_json)
            .map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let config: Option<Value> = tokenizer_config_json
            .map(|c| {
                serde_json::from_str(c).map_err(|e| {
                    Error::invalid(format!("tokenizer_config.json: not valid JSON: {e}"))
                })
            })
            .transpose()?;
        let model = bpe_model(&root)?;
        let vocab_map = model
            .get("vocab")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("model has no 'vocab' object"))?;
        let (vocab, added) = read_vocab(vocab_map, &root)?;
        let string_to_id = |s: &str| -> Option<u32> {
            added
                .iter()
                .find(|a| a.content == s)
                .map(|a| a.id)
                .or_else(|| vocab_map.get(s).and_then(Value::as_u64).map(|i| i as u32))
        };
        let merges = read_merges(model)?;
        let pre = parse_pre_tokenizer(root.get("pre_tokenizer").unwrap_or(&Value::Null))?;
        let (kind, normalizer, add_prefix_space) = text_handling(&root, &pre)?;
        let specials = SpecialIds::read(&root, model, config.as_ref(), &string_to_id)?;
        Ok(TokenizerSpec {
            kind,
            vocab,
            scores: Vec::new(),
            merges,
            added,
            pre_tokenizer: pre.kind.unwrap_or(PreTokenizerKind::None),
            normalizer,
            add_prefix_space,
            byte_fallback: bool_field(model, "byte_fallback", false),
            bos_id: specials.bos_id,
            eos_ids: specials.eos_ids,
            unk_id: specials.unk_id,
            pad_id: specials.pad_id,
            add_bos: specials.add_bos,
            add_eos: specials.add_eos,
        })
    }
}

/// The `model` object of `tokenizer.json`, which must be BPE.
fn bpe_model(root: &Value) -> Result<&Value> {
    let model = root
        .get("model")
        .filter(|m| m.is_object())
        .ok_or_else(|| bad("no 'model' object"))?;
    let model_type = model.get("type").and_then(Value::as_str).unwrap_or("BPE");
    match model_type {
        "BPE" => Ok(model),
        "Unigram" | "WordPiece" | "WordLevel" => Err(unsupported(format!(
            "model type '{model_type}' (only BPE is implemented)"
        ))),
        other => Err(bad(format!("unknown model type '{other}'"))),
    }
}

/// The vocabulary by id (the model's `vocab` and the `added_tokens`, contiguous from 0) and the
/// added tokens.
fn read_vocab(
    vocab_map: &serde_json::Map<String, Value>,
    root: &Value,
) -> Result<(Vec<Vec<u8>>, Vec<AddedToken>)> {
    let mut by_id: HashMap<u32, Vec<u8>> = HashMap::with_capacity(vocab_map.len());
    for (tok, id) in vocab_map {
        let id = id
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| bad(format!("vocab entry '{tok}' has id {id}, not a u32")))?;
        if by_id.insert(id, tok.as_bytes().to_vec()).is_some() {
            return Err(bad(format!("vocab id {id} is used twice")));
        }
    }
    let mut added = Vec::new();
    for a in root
        .get("added_tokens")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let id = a
            .get("id")
            .and_then(Value::as_u64)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| bad(format!("added token without a valid id: {a}")))?;
        let content = a
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("added token {id} without content")))?;
        by_id
            .entry(id)
            .or_insert_with(|| content.as_bytes().to_vec());
        added.push(AddedToken {
            id,
            content: content.to_string(),
            special: bool_field(a, "special", false),
        });
    }
    let size = by_id.keys().max().map_or(0, |&m| m as usize + 1);
    if size == 0 {
        return Err(bad("empty vocabulary"));
    }
    let mut vocab = Vec::with_capacity(size);
    for id in 0..size as u32 {
        vocab.push(
            by_id
                .remove(&id)
                .ok_or_else(|| bad(format!("no token has id {id} (ids must be contiguous)")))?,
        );
    }
    Ok((vocab, added))
}

/// The model's merges, written as `"a b"` strings or `[a, b]` pairs.
fn read_merges(model: &Value) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut merges = Vec::new();
    for (k, m) in model
        .get("merges")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let pair = match m {
            Value::String(s) => s.split_once(' ').filter(|(_, b)| !b.contains(' ')),
            Value::Array(p) => match p.as_slice() {
                [Value::String(a), Value::String(b)] => Some((a.as_str(), b.as_str())),
                _ => None,
            },
            _ => None,
        };
        let (a, b) = pair.ok_or_else(|| bad(format!("merge {k} is not \"a b\" or [a, b]: {m}")))?;
        merges.push((a.as_bytes().to_vec(), b.as_bytes().to_vec()));
    }
    Ok(merges)
}

/// How the text is handled around the BPE, from the normalizer, the pre-tokenizer and the
/// decoder: byte-level or SentencePiece-style (`▁` for spaces), the normalizer, and whether a
/// space (or `▁`) goes in front of the text.
fn text_handling(
    root: &Value,
    pre: &PreTokenizerInfo,
) -> Result<(TokenizerKind, NormalizerKind, bool)> {
    let (mut normalizer, mut prepend) =
        parse_normalizer(root.get("normalizer").unwrap_or(&Value::Null))?;
    if let Some(p) = pre.metaspace_prepend {
        if normalizer != NormalizerKind::None {
            return Err(unsupported(
                "Metaspace pre-tokenizer together with a normalizer",
            ));
        }
        normalizer = NormalizerKind::SentencePiece;
        prepend = p;
    }
    let decoder = root.get("decoder").unwrap_or(&Value::Null);
    let byte_level = pre.byte_level || decoder_has(decoder, "ByteLevel");
    let kind = if byte_level {
        if normalizer == NormalizerKind::SentencePiece {
            return Err(unsupported(
                "both byte-level and SentencePiece (▁) text handling",
            ));
        }
        TokenizerKind::ByteLevelBpe
    } else if normalizer == NormalizerKind::SentencePiece
        || decoder_has(decoder, "Metaspace")
        || decoder_has(decoder, "ByteFallback")
    {
        normalizer = NormalizerKind::SentencePiece;
        TokenizerKind::SentencePieceBpe
    } else {
        return Err(unsupported(
            "BPE that is neither byte-level nor SentencePiece-style (no ByteLevel, no ▁ normalizer)",
        ));
    };
    let add_prefix_space = match kind {
        TokenizerKind::ByteLevelBpe => pre.add_prefix_space,
        _ => prepend,
    };
    Ok((kind, normalizer, add_prefix_space))
}

/// The special token ids and whether BOS / EOS are added: named in `tokenizer_config.json`
/// where it names them, else from the post-processor's template (and the model's
/// `unk_token`).
struct SpecialIds {
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    unk_id: Option<u32>,
    pad_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
}

impl SpecialIds {
    fn read(
        root: &Value,
        model: &Value,
        cfg: Option<&Value>,
        string_to_id: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<SpecialIds> {
        let (template_bos, template_eos) =
            parse_post_processor(root.get("post_processor").unwrap_or(&Value::Null))?;
        let named = |key: &str| -> Result<Option<u32>> {
            match config_token(cfg, key) {
                None => Ok(None),
                Some(t) => string_to_id(t).map(Some).ok_or_else(|| {
                    Error::invalid(format!(
                        "tokenizer_config.json: {key} '{t}' is not in the vocabulary"
                    ))
                }),
            }
        };
        let bos_id = named("bos_token")?.or(template_bos);
        let mut eos_ids: Vec<u32> = named("eos_token")?.into_iter().collect();
        if let Some(e) = template_eos {
            if !eos_ids.contains(&e) {
                eos_ids.push(e);
            }
        }
        let unk_id = match named("unk_token")? {
            Some(u) => Some(u),
            None => match model.get("unk_token").and_then(Value::as_str) {
                Some(t) => Some(string_to_id(t).ok_or_else(|| {
                    bad(format!("model unk_token '{t}' is not in the vocabulary"))
                })?),
                None => None,
            },
        };
        let pad_id = named("pad_token")?;
        let add_bos = cfg
            .and_then(|c| c.get("add_bos_token"))
            .and_then(Value::as_bool)
            .unwrap_or(template_bos.is_some());
        let add_eos = cfg
            .and_then(|c| c.get("add_eos_token"))
            .and_then(Value::as_bool)
            .unwrap_or(template_eos.is_some());
        Ok(SpecialIds {
            bos_id,
            eos_ids,
            unk_id,
            pad_id,
            add_bos,
            add_eos,
        })
    }
}
