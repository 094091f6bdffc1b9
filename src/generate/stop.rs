//! Stop strings over a growing text: where the first one ends the text, and how much of the
//! text can be passed on while the rest is held back because it could still become the start
//! of one. Used by `Session::generate` and by the server's scheduler, so both cut and stream the
//! same way.

/// The stop strings of one generation (empty ones never match).
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Bytes of the longest stop string.
    longest: usize,
}

impl StopStrings {
    /// The non-empty strings of `stops`.
    pub fn new(stops: &[String]) -> StopStrings {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let longest = stops.iter().map(|s| s.len()).max().unwrap_or(0);
        StopStrings { stops, longest }
    }

    /// True when there is no stop string.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// After `text` grew from its first `old_len` bytes (which held no stop string): the byte
    /// offset where the earliest stop string starts, where one now ends in the new bytes.
    pub fn find(&self, text: &str, old_len: usize) -> Option<usize> {
        if self.stops.is_empty() {
            return None;
        }
        // a match ending past old_len starts at or after old_len - (longest - 1)
        let from = floor_char_boundary(text, old_len.saturating_sub(self.longest - 1));
        let tail = text.get(from..)?;
        self.stops
            .iter()
            .filter_map(|s| tail.find(s.as_str()))
            .min()
            .map(|at| at + from)
    }

    /// Length of the prefix of `text` that can no longer become part of a stop string: all of
    /// it but the last `longest - 1` bytes (rounded down to a char boundary).
    pub fn safe_len(&self, text: &str) -> usize {
        if self.longest == 0 {
            return text.len();
        }
        floor_char_boundary(text, text.len().saturating_sub(self.longest - 1))
    }
}

/// The largest char boundary of `text` at or before `at`.
fn floor_char_boundary(text: &str, at: usize) -> usize {
    let mut cut = at.min(text.len());
    while cut > 0 && !text.is_char_boundary(cut) {
        cut -= 1;
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> StopStrings {
        StopStrings::new(&s.iter().map(|x| x.to_string()).collect::<Vec<_>>())
    }

    /// Feeds `pieces` one by one as a generator would; returns (text passed on, stopped).
    fn stream(st: &StopStrings, pieces: &[&str]) -> (String, bool) {
        let (mut text, mut sent) = (String::new(), 0usize);
        let mut out = String::new();
        for p in pieces {
            let old = text.len();
            text.push_str(p);
            if let Some(cut) = st.find(&text, old) {
                out.push_str(&text[sent..cut.max(sent)]);
                return (out, true);
            }
            let safe = st.safe_len(&text);
            out.push_str(&text[sent..safe.max(sent)]);
            sent = sent.max(safe);
        }
        out.push_str(&text[sent..]);
        (out, false)
    }

    #[test]
    fn a_stop_string_split_over_tokens_is_held_back_and_cut() {
        let st = stops(&["</end>"]);
        assert_eq!(
            stream(&st, &["Hello", " wor", "ld</", "en", "d> more"]),
            ("Hello world".into(), true)
        );
        // a partial match that does not complete is passed on in the end
        assert_eq!(stream(&st, &["a</", "en", "x"]), ("a</enx".into(), false));
    }

    #[test]
    fn held_back_text_is_at_most_the_longest_stop_less_one() {
        let st = stops(&["ab", "wxyz"]);
        assert_eq!(st.safe_len("0123456"), 4);
        assert_eq!(st.safe_len("01"), 0);
        assert_eq!(stops(&[]).safe_len("0123"), 4);
        assert_eq!(stops(&["x"]).safe_len("0123"), 4);
        // never inside a character: "é" is two bytes
        assert_eq!(stops(&["abc"]).safe_len("xé"), 1);
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        let st = stops(&["world", "lo w", "zzz"]);
        assert_eq!(st.find("hello world", 0), Some(3));
        assert_eq!(
            stream(&st, &["hel", "lo", " wo", "rld"]),
            ("hel".into(), true)
        );
        // the same start: the match is where both start
        assert_eq!(stops(&["ab", "abc"]).find("xabc", 2), Some(1));
    }

    #[test]
    fn a_stop_at_the_very_start_gives_no_text() {
        let st = stops(&["<|im_end|>"]);
        assert_eq!(stream(&st, &["<|im_end|>", "later"]), (String::new(), true));
        assert_eq!(stream(&st, &["<|im", "_end|>"]), (String::new(), true));
    }

    #[test]
    fn only_matches_ending_in_the_new_bytes_are_found_and_empty_stops_never_match() {
        let st = stops(&["ab", ""]);
        assert!(!st.is_empty());
        // "ab" wholly inside the old 4 bytes is not looked for again
        assert_eq!(st.find("xab-yy", 4), None);
        assert_eq!(st.find("xab-ya", 4), None);
        assert_eq!(st.find("xab-yab", 5), Some(5));
        assert!(stops(&[""]).is_empty());
        assert_eq!(stops(&[""]).find("anything", 0), None);
    }

    #[test]
    fn multibyte_text_around_a_stop_string() {
        let st = stops(&["ß!"]);
        assert_eq!(stream(&st, &["grüß", "!", "x"]), ("grü".into(), true));
        assert_eq!(stream(&st, &["ü", "ß", "?"]), ("üß?".into(), false));
    }
}
