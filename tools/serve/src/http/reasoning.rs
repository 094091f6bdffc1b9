//! Splits a chat answer into its reasoning and its content for models that think in
//! `<think>…</think>`, as the text streams: text inside the tags is reasoning (OpenAI-style
//! `reasoning_content`), text after the closing tag is content. An answer that does not open
//! with `<think>` (leading whitespace aside) is all content, unless the prompt already opened
//! the tag. Tags split across pieces are held back until they can be told apart from text.

use fastllm::generate::Llm;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing decided yet: waiting to see whether the answer opens with `<think>`.
    Start,
    /// Inside the tags.
    Thinking,
    /// After the closing tag, or an answer without reasoning.
    Content,
}

/// New text of each kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Reasoning text.
    pub reasoning: String,
    /// Answer text.
    pub content: String,
}

/// The streaming splitter of one answer.
pub struct ThinkSplitter {
    state: State,
    pending: String,
    /// Whitespace right after a tag is dropped.
    trim_next: bool,
}

/// The length of the longest suffix of `s` that is a proper prefix of `tag`.
fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

impl ThinkSplitter {
    /// A splitter for an answer whose prompt already opened `<think>` (`opened`) or not.
    pub fn new(opened: bool) -> ThinkSplitter {
        ThinkSplitter {
            state: if opened {
                State::Thinking
            } else {
                State::Start
            },
            pending: String::new(),
            trim_next: opened,
        }
    }

    /// Takes the next piece of the answer; returns what can be told apart so far.
    pub fn push(&mut self, text: &str) -> Split {
        self.pending.push_str(text);
        let mut out = Split::default();
        loop {
            if self.trim_next {
                let t = self.pending.trim_start();
                if t.is_empty() {
                    self.pending.clear();
                    return out;
                }
                self.pending = t.to_string();
                self.trim_next = false;
            }
            match self.state {
                State::Start => {
                    let t = self.pending.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.pending = rest.to_string();
                        self.state = State::Thinking;
                        self.trim_next = true;
                    } else if OPEN.starts_with(t) {
                        return out; // maybe the start of the tag
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Thinking => match self.pending.find(CLOSE) {
                    Some(i) => {
                        out.reasoning.push_str(&self.pending[..i]);
                        self.pending = self.pending[i + CLOSE.len()..].to_string();
                        self.state = State::Content;
                        self.trim_next = true;
                    }
                    None => {
                        let keep = partial_tag(&self.pending, CLOSE);
                        let cut = self.pending.len() - keep;
                        out.reasoning.push_str(&self.pending[..cut]);
                        self.pending.drain(..cut);
                        return out;
                    }
                },
                State::Content => {
                    out.content.push_str(&self.pending);
                    self.pending.clear();
                    return out;
                }
            }
        }
    }

    /// The end of the answer: whatever was held back.
    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Thinking => Split {
                reasoning: rest,
                content: String::new(),
            },
            _ => Split {
                reasoning: String::new(),
                content: rest,
            },
        }
    }
}

/// True for a model that thinks in tags: its tokenizer has a `</think>` token.
pub fn model_thinks(llm: &Llm) -> bool {
    llm.tokenizer.token_id(CLOSE).is_some()
}

/// True when a rendered chat prompt ends by opening the tag (the answer starts thinking).
pub fn opens_thinking(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

/// Splits a whole answer; the reasoning is trimmed.
pub fn split_all(text: &str, opened: bool) -> Split {
    let mut s = ThinkSplitter::new(opened);
    let mut out = s.push(text);
    let end = s.finish();
    out.reasoning.push_str(&end.reasoning);
    out.content.push_str(&end.content);
    out.reasoning = out.reasoning.trim().to_string();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `n` characters; the joined output.
    fn streamed(text: &str, n: usize, opened: bool) -> Split {
        let mut s = ThinkSplitter::new(opened);
        let chars: Vec<char> = text.chars().collect();
        let mut out = Split::default();
        for piece in chars.chunks(n) {
            let p: String = piece.iter().collect();
            let o = s.push(&p);
            out.reasoning.push_str(&o.reasoning);
            out.content.push_str(&o.content);
        }
        let o = s.finish();
        out.reasoning.push_str(&o.reasoning);
        out.content.push_str(&o.content);
        out
    }

    #[test]
    fn splits_reasoning_from_content_in_any_pieces() {
        let cases = [
            (
                "<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.",
                false,
                "Let me see: 2+2.\n",
                "It is 4.",
            ),
            ("  <think>a < b, so</think>Yes.", false, "a < b, so", "Yes."),
            (
                "No tags here, <think> later is text.",
                false,
                "",
                "No tags here, <think> later is text.",
            ),
            ("<thin", false, "", "<thin"),
            (
                "<think>cut off by max_tokens </thi",
                false,
                "cut off by max_tokens </thi",
                "",
            ),
            (
                "the prompt opened it</think> done",
                true,
                "the prompt opened it",
                "done",
            ),
            ("ü€<think>x</think>y", false, "", "ü€<think>x</think>y"),
            ("<think>é</think>ü", false, "é", "ü"),
            ("", false, "", ""),
        ];
        for (text, opened, reasoning, content) in cases {
            for n in [1, 2, 3, 7, 1000] {
                let got = streamed(text, n, opened);
                assert_eq!(got.reasoning, reasoning, "{text:?} in pieces of {n}");
                assert_eq!(got.content, content, "{text:?} in pieces of {n}");
            }
            let all = split_all(text, opened);
            assert_eq!(all.reasoning, reasoning.trim());
            assert_eq!(all.content, content);
        }
    }
}
