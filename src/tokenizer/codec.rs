//! [`Tokenizer`]: a built, immutable tokenizer (text → ids → text). It owns the lookup tables
//! made from a [`TokenizerSpec`], added/special-token matching, normalization and the three
//! algorithms (byte-level BPE, SentencePiece BPE, greedy longest match). It must not parse files
//! (see `hf_json`, and `convert::gguf_tokenizer` for GGUF) nor do streaming bookkeeping (see
//! `stream`).

use super::bpe::{merge_word, push_symbol, FxHashMap, FxHashSet, MergeRule, Scratch, NO_ID};
use super::byte_level;
use super::pretokenize;
use super::spec::{NormalizerKind, PreTokenizerKind, TokenizerKind, TokenizerSpec};
use super::trie::Trie;
use crate::error::{Error, Result};
use unicode_normalization::UnicodeNormalization;

/// SentencePiece's space marker `▁` (U+2581).
const SP_SPACE: &str = "\u{2581}";

/// Words longer than this (in bytes) are not cached during one `encode` call.
const MAX_CACHED_WORD: usize = 256;
/// At most this many distinct words are cached during one `encode` call.
const MAX_CACHE_ENTRIES: usize = 1 << 17;

/// A tokenizer built from a [`TokenizerSpec`]. Immutable and `Send + Sync`: share it freely.
pub struct Tokenizer {
    kind: TokenizerKind,
    pre_tokenizer: PreTokenizerKind,
    normalizer: NormalizerKind,
    add_prefix_space: bool,
    byte_fallback: bool,
    /// Llama-3: a word that is itself a token is emitted without merging (HF `ignore_merges`).
    ignore_merges: bool,
    /// The decoder drops one leading space (SentencePiece with a prepended `▁`).
    strip_leading_space: bool,
    /// Fuse consecutive unknown symbols into one unk (SentencePiece, HF `fuse_unk`).
    fuse_unk: bool,
    /// SentencePiece BPE merges a whole segment as one word. It may instead be cut between two
    /// characters that are both tokens and that appear next to each other in no token: no merge
    /// can ever span such a boundary, so merging the pieces one by one (and caching them) gives
    /// exactly the result of merging the whole text. `sp_pairs` holds the adjacent character
    /// pairs found in the vocabulary; `sp_split_words` turns the cutting on.
    sp_split_words: bool,
    sp_pairs: FxHashSet<(char, char)>,
    /// Token strings as in the spec.
    vocab: Vec<Vec<u8>>,
    /// The bytes each token stands for when decoding.
    bytes: Vec<Vec<u8>>,
    /// `Some(b)` for SentencePiece byte tokens `<0xNN>`.
    byte_token: Vec<Option<u8>>,
    special: Vec<bool>,
    /// Token string (or added-token content) → id.
    string_ids: FxHashMap<Vec<u8>, u32>,
    /// Model tokens by the bytes the algorithm works on (raw bytes for byte-level BPE, `▁` text
    /// for SentencePiece); special tokens excluded.
    piece_ids: FxHashMap<Vec<u8>, u32>,
    /// Byte-level: the token of each single byte. SentencePiece: the `<0xNN>` token of each byte.
    byte_ids: [u32; 256],
    rule: MergeRule,
    added_all: Trie,
    added_plain: Trie,
    vocab_trie: Trie,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    unk_id: Option<u32>,
    pad_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
}

/// Parses a SentencePiece byte token `<0xNN>`.
fn parse_byte_token(s: &[u8]) -> Option<u8> {
    let hex = s.strip_prefix(b"<0x")?.strip_suffix(b">")?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

fn check_id(what: &str, id: Option<u32>, n: usize) -> Result<()> {
    match id {
        Some(i) if i as usize >= n => Err(Error::invalid(format!(
            "tokenizer spec: {what} id {i} is outside the vocabulary of {n} tokens"
        ))),
        _ => Ok(()),
    }
}

/// Refuses a spec whose sizes or special ids do not fit its vocabulary.
fn check_spec(spec: &TokenizerSpec) -> Result<()> {
    let n = spec.vocab.len();
    if n == 0 {
        return Err(Error::invalid("tokenizer spec: empty vocabulary"));
    }
    if u32::try_from(n).is_err() {
        return Err(Error::invalid("tokenizer spec: vocabulary too large"));
    }
    if !spec.scores.is_empty() && spec.scores.len() != n {
        return Err(Error::invalid(format!(
            "tokenizer spec: {} scores for {n} tokens",
            spec.scores.len()
        )));
    }
    check_id("bos", spec.bos_id, n)?;
    check_id("unk", spec.unk_id, n)?;
    check_id("pad", spec.pad_id, n)?;
    for &e in &spec.eos_ids {
        check_id("eos", Some(e), n)?;
    }
    if spec.add_bos && spec.bos_id.is_none() {
        return Err(Error::invalid(
            "tokenizer spec: add_bos is set but there is no bos id",
        ));
    }
    if spec.add_eos && spec.eos_ids.is_empty() {
        return Err(Error::invalid(
            "tokenizer spec: add_eos is set but there is no eos id",
        ));
    }
    Ok(())
}

/// The added tokens by id (special or not, their content) and as tries to find them in text
/// (all of them, and the non-special ones).
struct AddedIndex<'a> {
    special: Vec<bool>,
    content: Vec<Option<&'a [u8]>>,
    all: Trie,
    plain: Trie,
}

impl<'a> AddedIndex<'a> {
    fn new(spec: &'a TokenizerSpec) -> Result<AddedIndex<'a>> {
        let n = spec.vocab.len();
        let mut ix = AddedIndex {
            special: vec![false; n],
            content: vec![None; n],
            all: Trie::new(),
            plain: Trie::new(),
        };
        for a in &spec.added {
            check_id(&format!("added token '{}'", a.content), Some(a.id), n)?;
            if a.content.is_empty() {
                return Err(Error::invalid(format!(
                    "tokenizer spec: added token {} is empty",
                    a.id
                )));
            }
            ix.special[a.id as usize] = a.special;
            ix.content[a.id as usize] = Some(a.content.as_bytes());
            ix.all.insert(a.content.as_bytes(), a.id);
            if !a.special {
                ix.plain.insert(a.content.as_bytes(), a.id);
            }
        }
        Ok(ix)
    }
}

/// The vocabulary indexed for encoding and decoding (see the [`Tokenizer`] fields of the same
/// names).
struct VocabIndex {
    string_ids: FxHashMap<Vec<u8>, u32>,
    piece_ids: FxHashMap<Vec<u8>, u32>,
    bytes: Vec<Vec<u8>>,
    byte_token: Vec<Option<u8>>,
    vocab_trie: Trie,
}

impl VocabIndex {
    fn new(spec: &TokenizerSpec, added: &AddedIndex<'_>, sp_text: bool) -> VocabIndex {
        let n = spec.vocab.len();
        let mut ix = VocabIndex {
            string_ids: FxHashMap::default(),
            piece_ids: FxHashMap::default(),
            bytes: Vec::with_capacity(n),
            byte_token: vec![None; n],
            vocab_trie: Trie::new(),
        };
        for (id, s) in spec.vocab.iter().enumerate() {
            let id32 = id as u32;
            ix.string_ids.entry(s.clone()).or_insert(id32);
            let shown: &[u8] = added.content[id].unwrap_or(s);
            let decoded = match spec.kind {
                TokenizerKind::ByteLevelBpe => byte_level::decode_token(shown),
                _ if sp_text => match parse_byte_token(shown) {
                    Some(b) => {
                        ix.byte_token[id] = Some(b);
                        vec![b]
                    }
                    None => String::from_utf8_lossy(shown)
                        .replace(SP_SPACE, " ")
                        .into_bytes(),
                },
                _ => shown.to_vec(),
            };
            if !added.special[id] {
                let key = match spec.kind {
                    TokenizerKind::ByteLevelBpe => decoded.clone(),
                    _ => s.clone(),
                };
                if !key.is_empty() {
                    ix.piece_ids.entry(key).or_insert(id32);
                }
                if spec.kind == TokenizerKind::GreedyTrie {
                    ix.vocab_trie.insert(s, id32);
                }
            }
            ix.bytes.push(decoded);
        }
        for a in &spec.added {
            ix.string_ids
                .entry(a.content.as_bytes().to_vec())
                .or_insert(a.id);
        }
        ix
    }

    /// The token of each byte: byte-level BPE's single-byte pieces, else the `<0xNN>` tokens.
    fn byte_ids(&self, kind: TokenizerKind) -> [u32; 256] {
        let mut byte_ids = [NO_ID; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let found = match kind {
                TokenizerKind::ByteLevelBpe => self.piece_ids.get(&[b as u8][..]),
                _ => self.string_ids.get(format!("<0x{b:02X}>").as_bytes()),
            };
            if let Some(&id) = found {
                *slot = id;
            }
        }
        byte_ids
    }
}

/// The adjacent character pairs found in the tokens of a SentencePiece BPE (empty for other
/// kinds; see [`Tokenizer`]'s `sp_pairs`).
fn sp_pairs(spec: &TokenizerSpec) -> FxHashSet<(char, char)> {
    let mut pairs = FxHashSet::default();
    if spec.kind == TokenizerKind::SentencePieceBpe {
        for t in spec
            .vocab
            .iter()
            .map(|v| v.as_slice())
            .chain(spec.added.iter().map(|a| a.content.as_bytes()))
        {
            let t = String::from_utf8_lossy(t);
            pairs.extend(t.chars().zip(t.chars().skip(1)));
        }
    }
    pairs
}

/// Merges by score when the spec has scores and no merges, else by rank, each merge's tokens
/// looked up in `string_ids`.
fn merge_rule(spec: &TokenizerSpec, string_ids: &FxHashMap<Vec<u8>, u32>) -> Result<MergeRule> {
    if spec.merges.is_empty() && !spec.scores.is_empty() {
        return Ok(MergeRule::Scores(spec.scores.clone()));
    }
    let mut ranks = FxHashMap::default();
    for (rank, (a, b)) in spec.merges.iter().enumerate() {
        let find = |t: &[u8]| {
            string_ids.get(t).copied().ok_or_else(|| {
                Error::invalid(format!(
                    "tokenizer spec: merge {rank} ('{}' '{}') uses '{}', which is not in the vocabulary",
                    String::from_utf8_lossy(a),
                    String::from_utf8_lossy(b),
                    String::from_utf8_lossy(t)
                ))
            })
        };
        let joined = [a.as_slice(), b.as_slice()].concat();
        let (ia, ib, ij) = (find(a)?, find(b)?, find(&joined)?);
        ranks.insert((ia, ib), (rank as u32, ij));
    }
    Ok(MergeRule::Ranks(ranks))
}

impl Tokenizer {
    /// Builds the tokenizer, checking the spec (ids in range, merges made of known tokens,
    /// score/vocabulary lengths).
    pub fn new(spec: TokenizerSpec) -> Result<Tokenizer> {
        check_spec(&spec)?;
        let sp_text = spec.normalizer == NormalizerKind::SentencePiece
            || spec.kind == TokenizerKind::SentencePieceBpe;
        let added = AddedIndex::new(&spec)?;
        let ix = VocabIndex::new(&spec, &added, sp_text);
        let byte_ids = ix.byte_ids(spec.kind);
        let sp_pairs = sp_pairs(&spec);
        let rule = merge_rule(&spec, &ix.string_ids)?;
        let AddedIndex {
            special,
            content,
            all: added_all,
            plain: added_plain,
        } = added;
        drop(content); // it borrows `spec`, whose vocabulary moves into the tokenizer
        Ok(Tokenizer {
            kind: spec.kind,
            pre_tokenizer: spec.pre_tokenizer,
            normalizer: spec.normalizer,
            add_prefix_space: spec.add_prefix_space,
            byte_fallback: spec.byte_fallback,
            ignore_merges: spec.pre_tokenizer == PreTokenizerKind::Llama3,
            strip_leading_space: sp_text && spec.add_prefix_space,
            fuse_unk: spec.kind == TokenizerKind::SentencePieceBpe,
            sp_split_words: spec.kind == TokenizerKind::SentencePieceBpe,
            sp_pairs,
            vocab: spec.vocab,
            bytes: ix.bytes,
            byte_token: ix.byte_token,
            special,
            string_ids: ix.string_ids,
            piece_ids: ix.piece_ids,
            byte_ids,
            rule,
            added_all,
            added_plain,
            vocab_trie: ix.vocab_trie,
            bos_id: spec.bos_id,
            eos_ids: spec.eos_ids,
            unk_id: spec.unk_id,
            pad_id: spec.pad_id,
            add_bos: spec.add_bos,
            add_eos: spec.add_eos,
        })
    }

    /// Number of token ids.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// Beginning-of-sequence id.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// End-of-sequence ids (the first is the main one).
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Unknown-token id.
    pub fn unk_id(&self) -> Option<u32> {
        self.unk_id
    }

    /// Padding id.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    /// True for special (control) tokens; false for other and for out-of-range ids.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// The id of a token given by its vocabulary string (or added-token content).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.string_ids.get(token.as_bytes()).copied()
    }

    /// The raw bytes token `id` stands for when decoding (`None` for an out-of-range id).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize).map(|b| b.as_slice())
    }

    /// The vocabulary string of token `id`, as stored in the spec.
    pub fn token_string(&self, id: u32) -> Option<&[u8]> {
        self.vocab.get(id as usize).map(|b| b.as_slice())
    }

    /// True if the decoder drops one leading space from the decoded text.
    pub(crate) fn strips_leading_space(&self) -> bool {
        self.strip_leading_space
    }

    /// Encodes `text`. `add_special` adds bos/eos as the spec's post-processor says;
    /// `parse_special` matches special tokens written in the text as single tokens (added
    /// non-special tokens are always matched).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos_id);
        }
        let mut state = EncodeState::default();
        let trie = if parse_special {
            &self.added_all
        } else {
            &self.added_plain
        };
        let b = text.as_bytes();
        let (mut seg_start, mut i) = (0usize, 0usize);
        if !trie.is_empty() {
            while i < b.len() {
                if trie.may_start_with(b[i]) {
                    if let Some((len, id)) = b.get(i..).and_then(|rest| trie.longest_prefix(rest)) {
                        self.encode_segment(
                            text.get(seg_start..i).unwrap_or(""),
                            &mut state,
                            &mut out,
                        );
                        out.push(id);
                        i += len;
                        seg_start = i;
                        continue;
                    }
                }
                i += 1;
            }
        }
        self.encode_segment(text.get(seg_start..).unwrap_or(""), &mut state, &mut out);
        if add_special && self.add_eos {
            out.extend(self.eos_ids.first());
        }
        Ok(out)
    }

    /// Encodes text that holds no added token.
    fn encode_segment(&self, seg: &str, st: &mut EncodeState, out: &mut Vec<u32>) {
        if seg.is_empty() {
            return;
        }
        let nfc;
        let seg = if self.normalizer == NormalizerKind::Nfc {
            nfc = seg.nfc().collect::<String>();
            nfc.as_str()
        } else {
            seg
        };
        match self.kind {
            TokenizerKind::ByteLevelBpe => {
                let prefixed;
                let seg = if self.add_prefix_space && !seg.starts_with(' ') {
                    prefixed = format!(" {seg}");
                    prefixed.as_str()
                } else {
                    seg
                };
                st.pieces.clear();
                pretokenize::split(self.pre_tokenizer, seg, &mut st.pieces);
                for k in 0..st.pieces.len() {
                    let (a, z) = st.pieces[k];
                    if let Some(word) = seg.get(a..z) {
                        self.encode_cached(word, st, out);
                    }
                }
            }
            TokenizerKind::SentencePieceBpe | TokenizerKind::GreedyTrie => {
                let normalized;
                let text = if self.normalizer == NormalizerKind::SentencePiece {
                    let mut s = String::with_capacity(seg.len() + 3);
                    if self.add_prefix_space {
                        s.push_str(SP_SPACE);
                    }
                    for c in seg.chars() {
                        if c == ' ' {
                            s.push_str(SP_SPACE);
                        } else {
                            s.push(c);
                        }
                    }
                    normalized = s;
                    normalized.as_str()
                } else {
                    seg
                };
                if self.kind == TokenizerKind::GreedyTrie {
                    self.encode_greedy(text, out);
                } else if self.sp_split_words {
                    let mut start = 0;
                    let mut prev: Option<(char, bool)> = None;
                    for (k, c) in text.char_indices() {
                        let known = self.is_known_char(c);
                        if let Some((p, p_known)) = prev {
                            if p_known && known && !self.sp_pairs.contains(&(p, c)) {
                                self.encode_cached(text.get(start..k).unwrap_or(""), st, out);
                                start = k;
                            }
                        }
                        prev = Some((c, known));
                    }
                    self.encode_cached(text.get(start..).unwrap_or(""), st, out);
                } else {
                    self.encode_sentencepiece_word(text, &mut st.scratch, out);
                }
            }
        }
    }

    /// True if the character on its own is a model token.
    fn is_known_char(&self, c: char) -> bool {
        let mut buf = [0u8; 4];
        self.piece_ids
            .contains_key(c.encode_utf8(&mut buf).as_bytes())
    }

    fn lookup(&self, piece: &[u8]) -> Option<u32> {
        self.piece_ids.get(piece).copied()
    }

    /// Encodes one word (a pre-tokenized byte-level piece, or a SentencePiece piece) through
    /// the per-call cache.
    fn encode_cached(&self, word: &str, st: &mut EncodeState, out: &mut Vec<u32>) {
        let key = word.as_bytes();
        if key.is_empty() {
            return;
        }
        let cacheable = key.len() <= MAX_CACHED_WORD;
        if cacheable {
            if let Some(&(start, len)) = st.cache.get(key) {
                if let Some(ids) = st.cached_ids.get(start as usize..(start + len) as usize) {
                    out.extend_from_slice(ids);
                    return;
                }
            }
        }
        let first = out.len();
        match self.kind {
            TokenizerKind::ByteLevelBpe => self.encode_byte_level_word(key, &mut st.scratch, out),
            _ => self.encode_sentencepiece_word(word, &mut st.scratch, out),
        }
        if cacheable {
            if st.cache.len() >= MAX_CACHE_ENTRIES {
                st.cache.clear();
                st.cached_ids.clear();
            }
            let start = st.cached_ids.len() as u32;
            st.cached_ids
                .extend_from_slice(out.get(first..).unwrap_or(&[]));
            st.cache
                .insert(key.to_vec(), (start, (out.len() - first) as u32));
        }
    }

    /// Byte-level BPE of one pre-tokenized word (raw bytes).
    fn encode_byte_level_word(&self, word: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        if let [b] = word {
            let id = self.byte_ids[*b as usize];
            if id != NO_ID {
                out.push(id);
            } else {
                out.extend(self.unk_id);
            }
            return;
        }
        if self.ignore_merges {
            if let Some(id) = self.lookup(word) {
                out.push(id);
                return;
            }
        }
        scratch.symbols.clear();
        for (k, &b) in word.iter().enumerate() {
            push_symbol(scratch, k, k + 1, self.byte_ids[b as usize]);
        }
        merge_word(word, &self.rule, &|p| self.lookup(p), scratch);
        for s in scratch.symbols.iter().filter(|s| s.start != s.end) {
            if s.id != NO_ID {
                out.push(s.id);
            } else {
                out.extend(self.unk_id);
            }
        }
    }

    /// SentencePiece BPE over a whole normalized segment (symbols start as characters).
    fn encode_sentencepiece_word(&self, text: &str, scratch: &mut Scratch, out: &mut Vec<u32>) {
        scratch.symbols.clear();
        for (k, c) in text.char_indices() {
            let end = k + c.len_utf8();
            let id = text
                .as_bytes()
                .get(k..end)
                .and_then(|p| self.lookup(p))
                .unwrap_or(NO_ID);
            push_symbol(scratch, k, end, id);
        }
        let word = text.as_bytes();
        merge_word(word, &self.rule, &|p| self.lookup(p), scratch);
        let mut last_was_unk = false;
        for k in 0..scratch.symbols.len() {
            let s = scratch.symbols[k];
            if s.start == s.end {
                continue;
            }
            if s.id != NO_ID {
                out.push(s.id);
                last_was_unk = false;
                continue;
            }
            let span = word.get(s.start as usize..s.end as usize).unwrap_or(&[]);
            last_was_unk = self.push_unknown(span, last_was_unk, out);
        }
    }

    /// Byte fallback (`<0xNN>` for every byte, if all exist) or unk for an unknown span.
    /// Returns whether an unk was (or remains) the last token pushed.
    fn push_unknown(&self, span: &[u8], last_was_unk: bool, out: &mut Vec<u32>) -> bool {
        if self.byte_fallback && span.iter().all(|&b| self.byte_ids[b as usize] != NO_ID) {
            out.extend(span.iter().map(|&b| self.byte_ids[b as usize]));
            return false;
        }
        match self.unk_id {
            Some(_) if self.fuse_unk && last_was_unk => true,
            Some(unk) => {
                out.push(unk);
                true
            }
            None => last_was_unk,
        }
    }

    /// Greedy longest match over the vocabulary trie, with byte fallback / unk.
    fn encode_greedy(&self, text: &str, out: &mut Vec<u32>) {
        let b = text.as_bytes();
        let mut i = 0;
        let mut last_was_unk = false;
        while i < b.len() {
            if let Some((len, id)) = b.get(i..).and_then(|r| self.vocab_trie.longest_prefix(r)) {
                out.push(id);
                i += len;
                last_was_unk = false;
                continue;
            }
            let n = text
                .get(i..)
                .and_then(|r| r.chars().next())
                .map_or(1, char::len_utf8);
            let span = b.get(i..i + n).unwrap_or(&[]);
            last_was_unk = self.push_unknown(span, last_was_unk, out);
            i += n;
        }
    }

    /// Decodes ids to text. `skip_special` leaves out special tokens. An out-of-range id is an
    /// error; invalid UTF-8 is replaced by U+FFFD (a run of SentencePiece byte tokens that is not
    /// valid UTF-8 gives one U+FFFD per byte, like HF's ByteFallback decoder).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut out: Vec<u8> = Vec::with_capacity(ids.len() * 4);
        let mut byte_run: Vec<u8> = Vec::new();
        for &id in ids {
            let Some(bytes) = self.bytes.get(id as usize) else {
                return Err(Error::invalid(format!(
                    "decode: token id {id} is outside the vocabulary of {} tokens",
                    self.vocab.len()
                )));
            };
            if skip_special && self.special[id as usize] {
                continue;
            }
            match self.byte_token[id as usize] {
                Some(b) => byte_run.push(b),
                None => {
                    flush_byte_run(&mut byte_run, &mut out);
                    out.extend_from_slice(bytes);
                }
            }
        }
        flush_byte_run(&mut byte_run, &mut out);
        let mut text = String::from_utf8_lossy(&out).into_owned();
        if self.strip_leading_space && text.starts_with(' ') {
            text.remove(0);
        }
        Ok(text)
    }
}

/// Appends a run of byte-token bytes: as is if valid UTF-8, else one U+FFFD per byte.
fn flush_byte_run(run: &mut Vec<u8>, out: &mut Vec<u8>) {
    if run.is_empty() {
        return;
    }
    if std::str::from_utf8(run).is_ok() {
        out.extend_from_slice(run);
    } else {
        for _ in 0..run.len() {
            out.extend_from_slice("\u{FFFD}".as_bytes());
        }
    }
    run.clear();
}

/// Per-call buffers of `encode`: pieces, merge scratch and the word cache.
#[derive(Default)]
struct EncodeState {
    pieces: Vec<(usize, usize)>,
    scratch: Scratch,
    cache: FxHashMap<Vec<u8>, (u32, u32)>,
    cached_ids: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn sentencepiece_word_split_equals_whole_text_merging() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/fixtures/tiny/llama/tokenizer.json"
        );
        let json = std::fs::read_to_string(path).unwrap();
        let split = Tokenizer::new(TokenizerSpec::from_hf_json(&json, None).unwrap()).unwrap();
        assert!(split.sp_split_words);
        // the cut rule does cut ordinary text with this vocabulary
        let sample: Vec<char> = "▁the▁cat▁sat,▁then▁(x)".chars().collect();
        let cuts = sample
            .windows(2)
            .filter(|w| {
                split.is_known_char(w[0])
                    && split.is_known_char(w[1])
                    && !split.sp_pairs.contains(&(w[0], w[1]))
            })
            .count();
        assert!(cuts >= 2, "{cuts} cuts");
        let mut whole = Tokenizer::new(TokenizerSpec::from_hf_json(&json, None).unwrap()).unwrap();
        whole.sp_split_words = false;
        let alphabet = [
            'a', 'b', 'e', 't', 'h', ' ', ' ', '\n', 'é', '你', 'x', '1', '.',
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..5000 {
            let len = rng.gen_range(0..60);
            let text: String = (0..len)
                .map(|_| alphabet[rng.gen_range(0..alphabet.len())])
                .collect();
            assert_eq!(
                split.encode(&text, true, true).unwrap(),
                whole.encode(&text, true, true).unwrap(),
                "{text:?}"
            );
        }
    }
}
