//! The BPE merge engine: turns one word (a pre-tokenized piece) into token ids by repeatedly
//! merging the best adjacent pair, leftmost first — by merge rank (HF BPE) or by the score of the
//! merged token (SentencePiece / llama.cpp SPM). A linked list of symbols and a binary heap keep
//! it O(n log n) with no allocation in the loop (scratch buffers are reused). It owns merging
//! only: unknown-symbol fallback and splitting are the caller's.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A small, fast, non-cryptographic hasher (FxHash) for the hot maps.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` with [`FxHasher`].
pub(crate) type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// A `HashSet` with [`FxHasher`].
pub(crate) type FxHashSet<K> = HashSet<K, BuildHasherDefault<FxHasher>>;

/// No token id.
pub(crate) const NO_ID: u32 = u32::MAX;

/// How pairs are ranked.
pub(crate) enum MergeRule {
    /// HF BPE: `(left id, right id) → (rank, merged id)`; lower rank merges first.
    Ranks(FxHashMap<(u32, u32), (u32, u32)>),
    /// SentencePiece scores: a pair merges if its concatenated text is a token; higher score
    /// first. `scores[id]` is the token's score.
    Scores(Vec<f32>),
}

/// One symbol of the word being merged: a byte span, its id, and its list neighbours.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Symbol {
    /// Start byte in the word.
    pub start: u32,
    /// End byte in the word (exclusive); `start == end` marks a symbol merged away.
    pub end: u32,
    /// Token id, or [`NO_ID`] when the span is not a token.
    pub id: u32,
    prev: u32,
    next: u32,
}

/// Reusable buffers for [`merge_word`].
#[derive(Default)]
pub(crate) struct Scratch {
    /// The symbols after merging (dead ones have `start == end`).
    pub symbols: Vec<Symbol>,
    heap: BinaryHeap<Reverse<(u64, u32, u32, u32)>>,
}

/// Maps an f32 score to a key where a higher score gives a smaller key.
#[inline]
fn score_key(score: f32) -> u64 {
    let bits = score.to_bits();
    let ordered = if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    (u32::MAX - ordered) as u64
}

/// Merges the symbols of `word` (initial spans and ids in `scratch.symbols`, in order) until no
/// pair can merge. `lookup` finds a token id by its bytes (used for score-based merging).
pub(crate) fn merge_word(
    word: &[u8],
    rule: &MergeRule,
    lookup: &dyn Fn(&[u8]) -> Option<u32>,
    scratch: &mut Scratch,
) {
    let n = scratch.symbols.len();
    for (k, s) in scratch.symbols.iter_mut().enumerate() {
        s.prev = if k == 0 { NO_ID } else { k as u32 - 1 };
        s.next = if k + 1 == n { NO_ID } else { k as u32 + 1 };
    }
    if n < 2 {
        return;
    }
    let Scratch { symbols, heap } = scratch;
    heap.clear();
    let pair = |symbols: &[Symbol], l: usize, r: usize| -> Option<(u64, u32)> {
        let (a, b) = (symbols.get(l)?, symbols.get(r)?);
        match rule {
            MergeRule::Ranks(map) => {
                if a.id == NO_ID || b.id == NO_ID {
                    return None;
                }
                map.get(&(a.id, b.id)).map(|&(rank, id)| (rank as u64, id))
            }
            MergeRule::Scores(scores) => {
                let id = lookup(word.get(a.start as usize..b.end as usize)?)?;
                Some((
                    score_key(scores.get(id as usize).copied().unwrap_or(0.0)),
                    id,
                ))
            }
        }
    };
    for l in 0..n - 1 {
        if let Some((key, _)) = pair(symbols, l, l + 1) {
            heap.push(Reverse((key, l as u32, l as u32 + 1, symbols[l + 1].end)));
        }
    }
    while let Some(Reverse((_, l, r, r_end))) = heap.pop() {
        let (lu, ru) = (l as usize, r as usize);
        let valid = match (symbols.get(lu), symbols.get(ru)) {
            (Some(a), Some(b)) => {
                a.start != a.end && a.next == r && b.start != b.end && b.end == r_end
            }
            _ => false,
        };
        if !valid {
            continue;
        }
        // the pair is still current: recompute its merged id (the key cannot have changed)
        let Some((_, id)) = pair(symbols, lu, ru) else {
            continue;
        };
        let right = symbols[ru];
        symbols[lu].end = right.end;
        symbols[lu].id = id;
        symbols[lu].next = right.next;
        symbols[ru].end = symbols[ru].start;
        if let Some(after) = symbols.get_mut(right.next as usize) {
            after.prev = l;
        }
        let prev = symbols[lu].prev;
        if prev != NO_ID {
            if let Some((key, _)) = pair(symbols, prev as usize, lu) {
                heap.push(Reverse((key, prev, l, symbols[lu].end)));
            }
        }
        let next = symbols[lu].next;
        if next != NO_ID {
            if let Some((key, _)) = pair(symbols, lu, next as usize) {
                heap.push(Reverse((key, l, next, symbols[next as usize].end)));
            }
        }
    }
}

/// Pushes a fresh symbol for `word[start..end]` with `id`.
#[inline]
pub(crate) fn push_symbol(scratch: &mut Scratch, start: usize, end: usize, id: u32) {
    scratch.symbols.push(Symbol {
        start: start as u32,
        end: end as u32,
        id,
        prev: NO_ID,
        next: NO_ID,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference: the textbook quadratic BPE (lowest rank, leftmost first).
    fn naive(word: &[u32], merges: &FxHashMap<(u32, u32), (u32, u32)>) -> Vec<u32> {
        let mut w = word.to_vec();
        loop {
            let best = (0..w.len().saturating_sub(1))
                .filter_map(|k| merges.get(&(w[k], w[k + 1])).map(|&(r, id)| (r, k, id)))
                .min();
            let Some((_, k, id)) = best else { return w };
            w[k] = id;
            w.remove(k + 1);
        }
    }

    #[test]
    fn heap_merge_equals_naive_merge() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        // alphabet 0..4; random merges creating ids 4..40
        let mut merges = FxHashMap::default();
        for rank in 0..36u32 {
            let next = rank + 4;
            let a = rng.gen_range(0..next);
            let b = rng.gen_range(0..next);
            merges.entry((a, b)).or_insert((rank, next));
        }
        let rule = MergeRule::Ranks(merges.clone());
        let mut scratch = Scratch::default();
        for _ in 0..2000 {
            let len = rng.gen_range(0..30);
            let word: Vec<u32> = (0..len).map(|_| rng.gen_range(0..4)).collect();
            scratch.symbols.clear();
            for (k, &id) in word.iter().enumerate() {
                push_symbol(&mut scratch, k, k + 1, id);
            }
            let bytes = vec![0u8; len];
            merge_word(&bytes, &rule, &|_| None, &mut scratch);
            let got: Vec<u32> = scratch
                .symbols
                .iter()
                .filter(|s| s.start != s.end)
                .map(|s| s.id)
                .collect();
            assert_eq!(got, naive(&word, &merges), "{word:?}");
        }
    }

    #[test]
    fn score_merge_takes_the_best_scoring_token() {
        let vocab: FxHashMap<&[u8], u32> = [
            (&b"a"[..], 0),
            (b"b", 1),
            (b"c", 2),
            (b"ab", 3),
            (b"bc", 4),
            (b"abc", 5),
        ]
        .into_iter()
        .collect();
        let scores = vec![0.0, 0.0, 0.0, -2.0, -1.0, -0.5];
        let rule = MergeRule::Scores(scores);
        let mut scratch = Scratch::default();
        for (k, id) in [0u32, 1, 2].into_iter().enumerate() {
            push_symbol(&mut scratch, k, k + 1, id);
        }
        let lookup = |b: &[u8]| vocab.get(b).copied();
        merge_word(b"abc", &rule, &lookup, &mut scratch);
        let live: Vec<u32> = scratch
            .symbols
            .iter()
            .filter(|s| s.start != s.end)
            .map(|s| s.id)
            .collect();
        assert_eq!(live, vec![5]);
        assert!(score_key(-1.0) < score_key(-2.0) && score_key(3.0) < score_key(-0.0));
    }
}
