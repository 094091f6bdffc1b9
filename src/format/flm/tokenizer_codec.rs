//! The tokenizer section: encodes a [`TokenizerSpec`] compactly (varint-length token bytes,
//! scores kept, merges as byte pairs) and decodes it back with every id checked against the
//! vocabulary. Plain data only: building a working tokenizer is `crate::tokenizer`'s job.

use super::bytes::{put_bytes, put_u32, put_varint, ByteReader};
use crate::error::Result;
use crate::tokenizer::{
    AddedToken, NormalizerKind, PreTokenizerKind, TokenizerKind, TokenizerSpec,
};

const NONE_ID: u32 = u32::MAX;

fn opt_id(v: Option<u32>) -> u32 {
    v.unwrap_or(NONE_ID)
}

/// Encodes a tokenizer spec.
pub(crate) fn encode(t: &TokenizerSpec) -> Vec<u8> {
    let mut out = Vec::new();
    out.push(t.kind as u8);
    out.push(t.pre_tokenizer as u8);
    out.push(t.normalizer as u8);
    let flags = (t.add_prefix_space as u8)
        | ((t.byte_fallback as u8) << 1)
        | ((t.add_bos as u8) << 2)
        | ((t.add_eos as u8) << 3);
    out.push(flags);
    put_u32(&mut out, opt_id(t.bos_id));
    put_u32(&mut out, opt_id(t.unk_id));
    put_u32(&mut out, opt_id(t.pad_id));
    put_varint(&mut out, t.eos_ids.len() as u64);
    for &e in &t.eos_ids {
        put_u32(&mut out, e);
    }
    put_varint(&mut out, t.vocab.len() as u64);
    for v in &t.vocab {
        put_bytes(&mut out, v);
    }
    // Scores only make sense one per token; a mismatched list is not stored.
    if !t.scores.is_empty() && t.scores.len() == t.vocab.len() {
        out.push(1);
        for s in &t.scores {
            out.extend_from_slice(&s.to_le_bytes());
        }
    } else {
        out.push(0);
    }
    put_varint(&mut out, t.merges.len() as u64);
    for (a, b) in &t.merges {
        put_bytes(&mut out, a);
        put_bytes(&mut out, b);
    }
    put_varint(&mut out, t.added.len() as u64);
    for a in &t.added {
        put_u32(&mut out, a.id);
        out.push(a.special as u8);
        put_bytes(&mut out, a.content.as_bytes());
    }
    out
}

fn kind(r: &ByteReader<'_>, v: u8) -> Result<TokenizerKind> {
    Ok(match v {
        0 => TokenizerKind::ByteLevelBpe,
        1 => TokenizerKind::SentencePieceBpe,
        2 => TokenizerKind::GreedyTrie,
        _ => return Err(r.err(format!("unknown tokenizer kind {v}"))),
    })
}

fn pre(r: &ByteReader<'_>, v: u8) -> Result<PreTokenizerKind> {
    Ok(match v {
        0 => PreTokenizerKind::None,
        1 => PreTokenizerKind::Gpt2,
        2 => PreTokenizerKind::Llama3,
        3 => PreTokenizerKind::Qwen2,
        4 => PreTokenizerKind::SmolLm,
        _ => return Err(r.err(format!("unknown pre-tokenizer {v}"))),
    })
}

fn normalizer(r: &ByteReader<'_>, v: u8) -> Result<NormalizerKind> {
    Ok(match v {
        0 => NormalizerKind::None,
        1 => NormalizerKind::SentencePiece,
        2 => NormalizerKind::Nfc,
        _ => return Err(r.err(format!("unknown normalizer {v}"))),
    })
}

/// Merge pairs, as a spec holds them.
type Merges = Vec<(Vec<u8>, Vec<u8>)>;

/// The merge pairs and the added tokens of a tokenizer section, in that order.
fn merges_and_added(r: &mut ByteReader<'_>) -> Result<(Merges, Vec<AddedToken>)> {
    let n_merges = r.count("merges", 2)?;
    let mut merges = Vec::with_capacity(n_merges);
    for _ in 0..n_merges {
        let a = r.bytes()?.to_vec();
        let b = r.bytes()?.to_vec();
        merges.push((a, b));
    }
    let n_added = r.count("added tokens", 6)?;
    let mut added = Vec::with_capacity(n_added);
    for _ in 0..n_added {
        let id = r.u32()?;
        let special = r.u8()? & 1 == 1;
        let content = r.str()?;
        added.push(AddedToken {
            id,
            content,
            special,
        });
    }
    Ok((merges, added))
}

/// Decodes a tokenizer section.
pub(crate) fn decode(bytes: &[u8], path: &str) -> Result<TokenizerSpec> {
    let mut r = ByteReader::new(bytes, path, "tokenizer");
    let k = r.u8()?;
    let kind = kind(&r, k)?;
    let p = r.u8()?;
    let pre_tokenizer = pre(&r, p)?;
    let n = r.u8()?;
    let normalizer = normalizer(&r, n)?;
    let flags = r.u8()?;
    let ids = [r.u32()?, r.u32()?, r.u32()?];
    let [bos, unk, pad] = ids.map(|v| (v != NONE_ID).then_some(v));
    let n_eos = r.count("eos", 4)?;
    let mut eos_ids = Vec::with_capacity(n_eos);
    for _ in 0..n_eos {
        eos_ids.push(r.u32()?);
    }
    let n_vocab = r.count("vocab", 1)?;
    let mut vocab = Vec::with_capacity(n_vocab);
    for _ in 0..n_vocab {
        vocab.push(r.bytes()?.to_vec());
    }
    let scores = match r.u8()? {
        0 => Vec::new(),
        1 => {
            if r.remaining() / 4 < n_vocab {
                return Err(r.err("scores truncated"));
            }
            let mut s = Vec::with_capacity(n_vocab);
            for _ in 0..n_vocab {
                s.push(r.f32()?);
            }
            s
        }
        v => return Err(r.err(format!("bad has_scores flag {v}"))),
    };
    let (merges, added) = merges_and_added(&mut r)?;
    let all_ids = bos
        .iter()
        .chain(unk.iter())
        .chain(pad.iter())
        .chain(eos_ids.iter())
        .chain(added.iter().map(|a| &a.id));
    for &id in all_ids {
        if id as usize >= n_vocab {
            return Err(r.err(format!("token id {id} outside the vocabulary of {n_vocab}")));
        }
    }
    Ok(TokenizerSpec {
        kind,
        vocab,
        scores,
        merges,
        added,
        pre_tokenizer,
        normalizer,
        add_prefix_space: flags & 1 != 0,
        byte_fallback: flags & 2 != 0,
        bos_id: bos,
        eos_ids,
        unk_id: unk,
        pad_id: pad,
        add_bos: flags & 4 != 0,
        add_eos: flags & 8 != 0,
    })
}
