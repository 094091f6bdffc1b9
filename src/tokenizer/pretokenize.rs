//! Pre-tokenizers of the byte-level BPE family, written by hand as scanners that give exactly
//! the pieces HF's regexes give (GPT-2, Llama-3, Qwen2, and SmolLM's individual digits followed
//! by GPT-2). Owns splitting text into pieces; it knows nothing about vocabularies.

use super::spec::PreTokenizerKind;
use super::unicode_class::{classify, is_letter, is_number, is_space, CharClass};

/// The character starting at byte `i` of `s` and its length in bytes.
#[inline]
fn char_at(s: &str, i: usize) -> Option<(char, usize)> {
    let c = s.get(i..)?.chars().next()?;
    Some((c, c.len_utf8()))
}

/// The end of the run of characters from `i` on that satisfy `pred`.
#[inline]
fn run_while(s: &str, mut i: usize, pred: impl Fn(char) -> bool) -> usize {
    while let Some((c, n)) = char_at(s, i) {
        if !pred(c) {
            break;
        }
        i += n;
    }
    i
}

#[inline]
fn run_class(s: &str, i: usize, class: CharClass) -> usize {
    run_while(s, i, |c| classify(c) == class)
}

/// The length of a contraction (`'s|'t|'re|'ve|'m|'ll|'d`) starting at the apostrophe at `i`.
fn contraction(s: &str, i: usize, ignore_case: bool) -> Option<usize> {
    let lower = |c: char| {
        if ignore_case {
            match c {
                'ſ' => 's',
                _ => c.to_ascii_lowercase(),
            }
        } else {
            c
        }
    };
    let (c1, n1) = char_at(s, i + 1)?;
    match lower(c1) {
        's' | 't' | 'm' | 'd' => Some(1 + n1),
        first @ ('r' | 'v' | 'l') => {
            let (c2, n2) = char_at(s, i + 1 + n1)?;
            let want = if first == 'l' { 'l' } else { 'e' };
            (lower(c2) == want).then_some(1 + n1 + n2)
        }
        _ => None,
    }
}

/// The whitespace tail rules shared by all patterns: `\s+(?!\S)|\s+` for the run starting at
/// `i` (first char length `n`).
fn whitespace_piece(s: &str, i: usize, n: usize) -> usize {
    let mut j = i + n;
    let mut last = i;
    while let Some((c, m)) = char_at(s, j) {
        if !is_space(c) {
            break;
        }
        last = j;
        j += m;
    }
    if j >= s.len() || last == i {
        j
    } else {
        last
    }
}

/// End of the GPT-2 piece starting at `i`:
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn gpt2_piece(s: &str, i: usize) -> usize {
    let Some((c, n)) = char_at(s, i) else {
        return s.len();
    };
    if c == '\'' {
        if let Some(len) = contraction(s, i, false) {
            return i + len;
        }
    }
    if c == ' ' {
        if let Some((d, m)) = char_at(s, i + n) {
            let class = classify(d);
            if class != CharClass::Space {
                return run_class(s, i + n + m, class);
            }
        }
    }
    match classify(c) {
        CharClass::Space => whitespace_piece(s, i, n),
        class => run_class(s, i + n, class),
    }
}

/// End of the Llama-3 (`max_digits = 3`) or Qwen2 (`max_digits = 1`) piece starting at `i`:
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
fn llama3_piece(s: &str, i: usize, max_digits: usize) -> usize {
    let Some((c, n)) = char_at(s, i) else {
        return s.len();
    };
    if c == '\'' {
        if let Some(len) = contraction(s, i, true) {
            return i + len;
        }
    }
    let class = classify(c);
    if class == CharClass::Letter {
        return run_while(s, i + n, is_letter);
    }
    if class != CharClass::Number && c != '\r' && c != '\n' {
        if let Some((d, m)) = char_at(s, i + n) {
            if is_letter(d) {
                return run_while(s, i + n + m, is_letter);
            }
        }
    }
    if class == CharClass::Number {
        let mut j = i + n;
        let mut count = 1;
        while count < max_digits {
            match char_at(s, j) {
                Some((d, m)) if is_number(d) => {
                    j += m;
                    count += 1;
                }
                _ => break,
            }
        }
        return j;
    }
    let newlines = |j: usize| run_while(s, j, |d| d == '\r' || d == '\n');
    if c == ' ' {
        if let Some((d, m)) = char_at(s, i + n) {
            if classify(d) == CharClass::Other {
                return newlines(run_class(s, i + n + m, CharClass::Other));
            }
        }
    }
    if class == CharClass::Other {
        return newlines(run_class(s, i + n, CharClass::Other));
    }
    // whitespace: `\s*[\r\n]+` ends just after the run's last newline, if it has one
    let end = run_while(s, i, is_space);
    let last_newline = s
        .get(i..end)
        .and_then(|run| run.rfind(['\r', '\n']))
        .map(|k| i + k + 1);
    match last_newline {
        Some(j) => j,
        None => whitespace_piece(s, i, n),
    }
}

/// Splits `text` into pieces with the pre-tokenizer `kind`, appending `(start, end)` byte ranges
/// to `out`. The pieces cover the text exactly, in order.
pub(crate) fn split(kind: PreTokenizerKind, text: &str, out: &mut Vec<(usize, usize)>) {
    match kind {
        PreTokenizerKind::None => {
            if !text.is_empty() {
                out.push((0, text.len()));
            }
        }
        PreTokenizerKind::Gpt2 => split_with(text, 0, text.len(), out, gpt2_piece),
        PreTokenizerKind::Llama3 => {
            split_with(text, 0, text.len(), out, |s, i| llama3_piece(s, i, 3))
        }
        PreTokenizerKind::Qwen2 => {
            split_with(text, 0, text.len(), out, |s, i| llama3_piece(s, i, 1))
        }
        PreTokenizerKind::SmolLm => {
            // HF `Digits(individual_digits=True)`: every ASCII digit is a piece of its own; the
            // text between digits goes through the GPT-2 regex.
            let mut start = 0;
            for (k, b) in text.bytes().enumerate() {
                if b.is_ascii_digit() {
                    split_with(text, start, k, out, gpt2_piece);
                    out.push((k, k + 1));
                    start = k + 1;
                }
            }
            split_with(text, start, text.len(), out, gpt2_piece);
        }
    }
}

/// Applies a piece scanner to `text[start..end]`.
fn split_with(
    text: &str,
    start: usize,
    end: usize,
    out: &mut Vec<(usize, usize)>,
    piece: impl Fn(&str, usize) -> usize,
) {
    let Some(s) = text.get(start..end) else {
        return;
    };
    let mut i = 0;
    while i < s.len() {
        let j = piece(s, i).clamp(i + 1, s.len());
        out.push((start + i, start + j));
        i = j;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const GPT2: &str =
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    fn reference(re: &fancy_regex::Regex, text: &str) -> Vec<String> {
        re.find_iter(text)
            .map(|m| m.unwrap().as_str().to_string())
            .collect()
    }

    fn ours(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        split(kind, text, &mut out);
        out.iter().map(|&(a, b)| text[a..b].to_string()).collect()
    }

    const ALPHABET: &[char] = &[
        'a', 'b', 'Z', 'é', 'ß', 'ſ', 'S', 's', 'R', 'e', 'l', 'L', 'v', 'd', 'm', 't', '\'', ' ',
        ' ', ' ', '\t', '\n', '\r', '\u{3000}', '\u{A0}', '0', '7', '٣', '²', '½', '.', ',', '!',
        '(', '你', '界', '🙂', '\u{200D}', '\u{301}', '-', '_', '#', 'к', 'ب', '\u{85}',
    ];

    #[test]
    fn hand_written_scanners_match_the_regexes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let gpt2 = fancy_regex::Regex::new(GPT2).unwrap();
        let llama3 = fancy_regex::Regex::new(LLAMA3).unwrap();
        let qwen2 = fancy_regex::Regex::new(QWEN2).unwrap();
        let fixed = [
            "Hello, world! I'm here, they'RE  not\n\n  ok 12345 x",
            "  leading   trailing   ",
            "tabs\tand\nnewlines\n\n\n",
            "numbers 1234567890 and 3.14159",
            "don't won't I'll we've they're",
            "(hello) [x]\r\n\r\n  y",
        ];
        for round in 0..20000 {
            let text: String = if round < fixed.len() {
                fixed[round].to_string()
            } else {
                let len = rng.gen_range(0..24);
                (0..len)
                    .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())])
                    .collect()
            };
            assert_eq!(
                ours(PreTokenizerKind::Gpt2, &text),
                reference(&gpt2, &text),
                "{text:?}"
            );
            assert_eq!(
                ours(PreTokenizerKind::Llama3, &text),
                reference(&llama3, &text),
                "{text:?}"
            );
            assert_eq!(
                ours(PreTokenizerKind::Qwen2, &text),
                reference(&qwen2, &text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn smollm_splits_digits_first() {
        assert_eq!(
            ours(PreTokenizerKind::SmolLm, "ab 123x"),
            vec!["ab", " ", "1", "2", "3", "x"]
        );
        assert_eq!(ours(PreTokenizerKind::None, "a b"), vec!["a b"]);
        assert!(ours(PreTokenizerKind::Gpt2, "").is_empty());
    }
}
