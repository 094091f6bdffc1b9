//! [`StreamDecoder`]: incremental decoding for generation. It turns ids into text as they come,
//! returning only complete UTF-8 characters and holding back a partial multi-byte character
//! until its last byte arrives. Owns that buffering only; token bytes come from [`Tokenizer`].

use super::codec::Tokenizer;
use crate::error::{Error, Result};

/// Streaming decoder over a [`Tokenizer`]: `push` ids one at a time, then `finish`.
///
/// The concatenation of everything returned equals [`Tokenizer::decode`] of all the ids, for any
/// ids whose bytes form valid UTF-8 (invalid bytes become U+FFFD here as in `decode`, except that
/// `decode` gives one U+FFFD per byte for invalid runs of SentencePiece byte tokens).
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    state: StreamState,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder with nothing pushed yet; `skip_special` leaves out special tokens.
    pub fn new(tokenizer: &'a Tokenizer, skip_special: bool) -> StreamDecoder<'a> {
        StreamDecoder {
            tokenizer,
            state: StreamState::new(skip_special),
        }
    }

    /// Adds one id and returns the text that is now complete (possibly empty). An out-of-range
    /// id is an error and leaves the decoder unchanged.
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.state.push(self.tokenizer, id)
    }

    /// Returns the pending bytes as text (an unfinished character becomes U+FFFD) and resets.
    pub fn finish(&mut self) -> String {
        self.state.finish()
    }
}

/// The state of a [`StreamDecoder`] without the borrow of its tokenizer, for owners that keep
/// the tokenizer elsewhere (e.g. a server's per-request state): pass the same tokenizer to
/// every `push`.
#[derive(Clone, Debug)]
pub struct StreamState {
    skip_special: bool,
    pending: Vec<u8>,
    /// Nothing has been produced yet (the decoder may still drop one leading space).
    at_start: bool,
}

impl StreamState {
    /// Nothing pushed yet; `skip_special` leaves out special tokens.
    pub fn new(skip_special: bool) -> StreamState {
        StreamState {
            skip_special,
            pending: Vec::new(),
            at_start: true,
        }
    }

    /// As [`StreamDecoder::push`].
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        let Some(bytes) = tokenizer.token_bytes(id) else {
            return Err(Error::invalid(format!(
                "decode: token id {id} is outside the vocabulary of {} tokens",
                tokenizer.vocab_size()
            )));
        };
        if self.skip_special && tokenizer.is_special(id) {
            return Ok(String::new());
        }
        let mut bytes = bytes;
        if self.at_start && !bytes.is_empty() {
            self.at_start = false;
            if tokenizer.strips_leading_space() {
                if let Some(rest) = bytes.strip_prefix(b" ") {
                    bytes = rest;
                }
            }
        }
        self.pending.extend_from_slice(bytes);
        Ok(self.take_complete())
    }

    /// As [`StreamDecoder::finish`].
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.at_start = true;
        s
    }

    /// Takes every complete character from `pending`, replacing invalid sequences by U+FFFD.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            let rest = self.pending.get(start..).unwrap_or(&[]);
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(rest.get(..valid).unwrap_or(&[])));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            start += valid + bad;
                        }
                        None => {
                            // an incomplete character at the end: keep it for the next push
                            start += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start.min(self.pending.len()));
        out
    }
}

impl Tokenizer {
    /// A [`StreamDecoder`] over this tokenizer.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }
}
