//! A byte trie over token strings: finds the longest token that is a prefix of some bytes. Used
//! to match added/special tokens in text and by the greedy longest-match algorithm. Owns only
//! the lookup structure; what a match means is the caller's business.

/// One node: children sorted by byte, and the value of the key ending here.
#[derive(Clone, Debug, Default)]
struct Node {
    children: Vec<(u8, u32)>,
    value: Option<u32>,
}

/// A byte trie mapping byte strings to `u32` values (token ids).
#[derive(Clone, Debug)]
pub struct Trie {
    nodes: Vec<Node>,
    first_byte: [bool; 256],
}

impl Default for Trie {
    fn default() -> Self {
        Trie::new()
    }
}

impl Trie {
    /// An empty trie.
    pub fn new() -> Trie {
        Trie {
            nodes: vec![Node::default()],
            first_byte: [false; 256],
        }
    }

    /// Inserts `key` with `value`; an existing key keeps its first value. Empty keys are ignored.
    pub fn insert(&mut self, key: &[u8], value: u32) {
        let Some(&first) = key.first() else {
            return;
        };
        self.first_byte[first as usize] = true;
        let mut node = 0usize;
        for &b in key {
            let next = match self.nodes[node].children.binary_search_by_key(&b, |c| c.0) {
                Ok(k) => self.nodes[node].children[k].1 as usize,
                Err(k) => {
                    let id = self.nodes.len();
                    self.nodes.push(Node::default());
                    self.nodes[node].children.insert(k, (b, id as u32));
                    id
                }
            };
            node = next;
        }
        if self.nodes[node].value.is_none() {
            self.nodes[node].value = Some(value);
        }
    }

    /// True if some key starts with byte `b` (a cheap pre-check before [`Trie::longest_prefix`]).
    #[inline]
    pub fn may_start_with(&self, b: u8) -> bool {
        self.first_byte[b as usize]
    }

    /// The longest key that is a prefix of `bytes`: `(length, value)`.
    pub fn longest_prefix(&self, bytes: &[u8]) -> Option<(usize, u32)> {
        let mut node = self.nodes.first()?;
        let mut best = None;
        for (k, &b) in bytes.iter().enumerate() {
            let Ok(c) = node.children.binary_search_by_key(&b, |c| c.0) else {
                break;
            };
            node = self.nodes.get(node.children[c].1 as usize)?;
            if let Some(v) = node.value {
                best = Some((k + 1, v));
            }
        }
        best
    }

    /// The value stored for exactly `key`.
    pub fn get(&self, key: &[u8]) -> Option<u32> {
        match self.longest_prefix(key) {
            Some((len, v)) if len == key.len() => Some(v),
            _ => None,
        }
    }

    /// True if the trie holds no key.
    pub fn is_empty(&self) -> bool {
        self.nodes.len() == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_prefers_longer_keys() {
        let mut t = Trie::new();
        t.insert(b"<s>", 1);
        t.insert(b"<|im_start|>", 2);
        t.insert(b"<|im", 3);
        t.insert(b"<s>", 9);
        assert_eq!(t.longest_prefix(b"<|im_start|>x"), Some((12, 2)));
        assert_eq!(t.longest_prefix(b"<|im_end|>"), Some((4, 3)));
        assert_eq!(t.longest_prefix(b"<s>"), Some((3, 1)));
        assert_eq!(t.longest_prefix(b"<x"), None);
        assert_eq!(t.get(b"<|im"), Some(3));
        assert_eq!(t.get(b"<|i"), None);
        assert!(t.may_start_with(b'<') && !t.may_start_with(b'a'));
        assert!(Trie::new().is_empty() && !t.is_empty());
    }
}
