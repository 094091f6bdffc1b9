//! Character classes used by the pre-tokenizer regexes: `\p{L}` (letter), `\p{N}` (number) and
//! `\s` (Unicode `White_Space`), with the exact Unicode tables of `regex-syntax` (the same tables
//! the `regex`/`fancy-regex` crates use). Owns classification only; it does no splitting.

use regex_syntax::hir::{Class, HirKind};
use std::sync::OnceLock;

/// The class of one character as seen by the GPT-2 family of regexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CharClass {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\s`.
    Space,
    /// Anything else (`[^\s\p{L}\p{N}]`).
    Other,
}

/// A set of code points: a bitmap for the Basic Multilingual Plane and sorted ranges above it.
struct CodePointSet {
    bmp: Vec<u64>,
    astral: Vec<(u32, u32)>,
}

impl CodePointSet {
    fn from_ranges(ranges: &[(u32, u32)]) -> CodePointSet {
        let mut bmp = vec![0u64; 0x10000 / 64];
        let mut astral = Vec::new();
        for &(lo, hi) in ranges {
            for cp in lo..=hi.min(0xFFFF) {
                if let Some(w) = bmp.get_mut((cp / 64) as usize) {
                    *w |= 1u64 << (cp % 64);
                }
            }
            if hi > 0xFFFF {
                astral.push((lo.max(0x10000), hi));
            }
        }
        CodePointSet { bmp, astral }
    }

    fn contains(&self, c: char) -> bool {
        let cp = c as u32;
        if cp < 0x10000 {
            return self
                .bmp
                .get((cp / 64) as usize)
                .is_some_and(|w| w & (1u64 << (cp % 64)) != 0);
        }
        let i = self.astral.partition_point(|&(_, hi)| hi < cp);
        self.astral.get(i).is_some_and(|&(lo, _)| lo <= cp)
    }
}

/// Ranges of a `\p{..}` class from regex-syntax; `None` if the pattern is not a Unicode class.
fn class_ranges(pattern: &str) -> Option<Vec<(u32, u32)>> {
    let hir = regex_syntax::Parser::new().parse(pattern).ok()?;
    match hir.kind() {
        HirKind::Class(Class::Unicode(cls)) => Some(
            cls.ranges()
                .iter()
                .map(|r| (r.start() as u32, r.end() as u32))
                .collect(),
        ),
        _ => None,
    }
}

struct Tables {
    letter: CodePointSet,
    number: CodePointSet,
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        // The patterns are constants that regex-syntax always accepts; should that ever change,
        // fall back to the standard library's close approximations instead of failing.
        let letter = class_ranges(r"\p{L}").map(|r| CodePointSet::from_ranges(&r));
        let number = class_ranges(r"\p{N}").map(|r| CodePointSet::from_ranges(&r));
        Tables {
            letter: letter.unwrap_or_else(|| std_set(char::is_alphabetic)),
            number: number.unwrap_or_else(|| std_set(char::is_numeric)),
        }
    })
}

fn std_set(f: fn(char) -> bool) -> CodePointSet {
    let mut ranges = Vec::new();
    for cp in 0..=0x10FFFFu32 {
        if char::from_u32(cp).is_some_and(f) {
            ranges.push((cp, cp));
        }
    }
    CodePointSet::from_ranges(&ranges)
}

/// Unicode `White_Space` (what `\s` matches in the regex engines HF tokenizers use).
pub(crate) fn is_space(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | ' '
            | '\u{85}'
            | '\u{A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
    )
}

/// `\p{L}`.
pub(crate) fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    tables().letter.contains(c)
}

/// `\p{N}`.
pub(crate) fn is_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    tables().number.contains(c)
}

/// The class of `c`.
pub(crate) fn classify(c: char) -> CharClass {
    if c.is_ascii() {
        return if c.is_ascii_alphabetic() {
            CharClass::Letter
        } else if c.is_ascii_digit() {
            CharClass::Number
        } else if is_space(c) {
            CharClass::Space
        } else {
            CharClass::Other
        };
    }
    if is_letter(c) {
        CharClass::Letter
    } else if is_number(c) {
        CharClass::Number
    } else if is_space(c) {
        CharClass::Space
    } else {
        CharClass::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_agree_with_the_regex_crate() {
        let l = regex::Regex::new(r"^\p{L}$").unwrap();
        let n = regex::Regex::new(r"^\p{N}$").unwrap();
        let s = regex::Regex::new(r"^\s$").unwrap();
        for cp in (0..0x11000u32)
            .chain((0x1F000..0x1F700).step_by(3))
            .chain(0x20000..0x20010)
        {
            let Some(c) = char::from_u32(cp) else {
                continue;
            };
            let mut buf = [0u8; 4];
            let t = c.encode_utf8(&mut buf);
            assert_eq!(is_letter(c), l.is_match(t), "letter {cp:#x}");
            assert_eq!(is_number(c), n.is_match(t), "number {cp:#x}");
            assert_eq!(is_space(c), s.is_match(t), "space {cp:#x}");
        }
    }
}
