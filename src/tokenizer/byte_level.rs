//! GPT-2's byte-to-unicode alphabet: every byte is written as one printable character (`Ġ` for
//! a space), so byte-level BPE vocabularies are plain strings. Owns the two lookup tables and the
//! conversions between a vocabulary string and the bytes it stands for.

use std::sync::OnceLock;

/// The byte → character table (GPT-2's `bytes_to_unicode`).
pub(crate) fn byte_to_char() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut extra = 0u32;
        for (b, slot) in table.iter_mut().enumerate() {
            let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
            let cp = if printable {
                b as u32
            } else {
                extra += 1;
                255 + extra
            };
            *slot = char::from_u32(cp).unwrap_or('\u{FFFD}');
        }
        table
    })
}

/// The character → byte inverse of [`byte_to_char`]; `None` for characters outside the alphabet.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    static INVERSE: OnceLock<[Option<u8>; 0x144]> = OnceLock::new();
    let inverse = INVERSE.get_or_init(|| {
        let mut inv = [None; 0x144];
        for (b, &ch) in byte_to_char().iter().enumerate() {
            if let Some(slot) = inv.get_mut(ch as usize) {
                *slot = Some(b as u8);
            }
        }
        inv
    });
    inverse.get(c as usize).copied().flatten()
}

/// The bytes a byte-level vocabulary string stands for, as HF's ByteLevel decoder computes them:
/// each character mapped back through the alphabet, or the string's own UTF-8 bytes when any
/// character lies outside the alphabet.
pub(crate) fn decode_token(token: &[u8]) -> Vec<u8> {
    let Ok(s) = std::str::from_utf8(token) else {
        return token.to_vec();
    };
    let mut out = Vec::with_capacity(token.len());
    for c in s.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => return token.to_vec(),
        }
    }
    out
}

/// The byte-level vocabulary string for raw bytes.
#[cfg(test)]
pub(crate) fn encode_bytes(bytes: &[u8]) -> String {
    let table = byte_to_char();
    bytes.iter().map(|&b| table[b as usize]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_round_trips_and_matches_gpt2() {
        let t = byte_to_char();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'A' as usize], 'A');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(t[b as usize]), Some(b));
        }
        assert_eq!(decode_token("ĠhelloĊ".as_bytes()), b" hello\n");
        assert_eq!(decode_token("<|x y|>".as_bytes()), b"<|x y|>");
        assert_eq!(encode_bytes(b" a\n"), "ĠaĊ");
    }
}
