//! Constrained decoding: a request's grammar (a JSON schema, any JSON object, a regular
//! expression, a Lark grammar) compiled by llguidance against the model's token table, and the
//! allowed-token mask of each pick ([`Constraint::mask`]) that the sampler applies where the
//! logits are.

use fastllm::generate::{Llm, TokenMask};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::Arc;

/// What a request constrains its output to.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid under this schema (OpenAI's `json_schema`, TGI's `json`).
    JsonSchema(Value),
    /// Text matching this regular expression (TGI's `regex`).
    Regex(String),
    /// A Lark grammar (llguidance's dialect), e.g. built for tool calls.
    Lark(String),
}

impl GrammarSpec {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(json_options(json!({"type": "object"})))
            }
            GrammarSpec::JsonSchema(s) => {
                TopLevelGrammar::from_json_schema(json_options(s.clone()))
            }
            GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// The JSON layout of constrained output: `", "` and `": "` between items, no other
/// whitespace (a model free to add whitespace can loop on it forever). A schema that sets its
/// own `x-guidance` options keeps them.
pub fn json_options(mut schema: Value) -> Value {
    if let Value::Object(o) = &mut schema {
        o.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// The model's tokenizer as llguidance sees it: each token id's bytes (special tokens marked
/// as such), and the tokenizer for forced text.
struct LlmTokEnv {
    llm: Arc<Llm>,
    trie: TokTrie,
}

impl TokenizerEnv for LlmTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s) {
            Ok(t) => self
                .llm
                .tokenizer
                .encode(t, false, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// The byte-level token table of `llm`, one entry per logits column: a token's decoded bytes,
/// special tokens prefixed with llguidance's marker byte, and nothing for ids past the
/// tokenizer's vocabulary (the model's padding columns, never allowed).
pub fn token_table(llm: &Llm) -> Vec<Vec<u8>> {
    let t = &llm.tokenizer;
    (0..llm.model.config().vocab_size as u32)
        .map(|id| match t.token_bytes(id) {
            Some(b) if t.is_special(id) => {
                let mut w = Vec::with_capacity(b.len() + 1);
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(b);
                w
            }
            Some(b) => b.to_vec(),
            None => Vec::new(),
        })
        .collect()
}

/// Compiles request grammars for one model.
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// The compiler for `llm`'s tokenizer; the grammar's end is its first end-of-sequence id.
    pub fn new(llm: Arc<Llm>) -> Result<Grammars, String> {
        let words = token_table(&llm);
        let eos = llm
            .eos_ids()
            .first()
            .copied()
            .ok_or("the model has no end-of-sequence token, so a grammar cannot end")?;
        let mut info = TokRxInfo::new(words.len() as u32, eos);
        info.tok_bos = llm.tokenizer.bos_id();
        info.tok_pad = llm.tokenizer.pad_id();
        info.tok_unk = llm.tokenizer.unk_id();
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(LlmTokEnv { llm, trie });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| format!("cannot set up constrained decoding: {e}"))?;
        factory.set_stderr_log_level(0);
        Ok(Grammars { factory })
    }

    /// A fresh constraint for `spec`; an invalid grammar is an error saying why.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, String> {
        let m = Matcher::new(self.factory.create_parser(spec.top_level()));
        match m.get_error() {
            Some(e) => Err(e),
            None => Ok(Constraint(m)),
        }
    }
}

/// One sequence's grammar state.
#[derive(Clone)]
pub struct Constraint(Matcher);

impl Constraint {
    /// The tokens allowed next (only end-of-sequence once the grammar is complete).
    pub fn mask(&mut self) -> Result<TokenMask, String> {
        let v = self
            .0
            .compute_mask_or_eos()
            .map_err(|e| format!("constrained decoding failed: {e}"))?;
        Ok(TokenMask::from_words(v.as_slice()))
    }

    /// Advances past the picked token.
    pub fn commit(&mut self, token: u32) -> Result<(), String> {
        self.0
            .consume_token(token)
            .map_err(|e| format!("constrained decoding failed: {e}"))
    }

    /// True when the grammar allows nothing more.
    pub fn is_finished(&self) -> bool {
        self.0.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastllm::generate::{sample_logits, SampleRow};
    use fastllm::load::{load, LoadOptions};
    use std::path::Path;

    fn tiny() -> Arc<Llm> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/tiny/qwen2");
        let out =
            std::env::temp_dir().join(format!("fastllm-grammar-test-{}.flm", std::process::id()));
        fastllm::convert::convert(&dir, &out, &Default::default(), &mut |_| {}).unwrap();
        let llm = load(&out, &LoadOptions::default()).unwrap();
        let _ = std::fs::remove_file(&out);
        Arc::new(llm)
    }

    /// Walks a constraint with random logits (sampled, so many paths are taken) until the
    /// grammar is complete; returns the decoded text.
    fn walk(llm: &Llm, c: &mut Constraint, seed: u64) -> String {
        let vocab = llm.model.config().vocab_size;
        let eos = llm.eos_ids();
        let mut x = seed;
        let mut ids = Vec::new();
        for _ in 0..200 {
            let logits: Vec<f32> = (0..vocab)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
                })
                .collect();
            let mut row = SampleRow {
                temperature: 1.0,
                random: x,
                ..SampleRow::greedy()
            };
            let mask = c.mask().unwrap();
            row.mask = Some(mask.clone());
            let t = sample_logits(&logits, &row).unwrap();
            assert!(mask.allows(t as usize));
            if eos.contains(&t) {
                break;
            }
            c.commit(t).unwrap();
            ids.push(t);
            if c.is_finished() {
                break;
            }
        }
        llm.tokenizer.decode(&ids, false).unwrap()
    }

    #[test]
    fn masks_keep_random_picks_inside_the_grammar() {
        let llm = tiny();
        let g = Grammars::new(llm.clone()).unwrap();
        let words = token_table(&llm);
        assert_eq!(words.len(), llm.model.config().vocab_size);
        let re = regex::Regex::new(r"^(ab|[0-9]{2,4})-(yes|no)$").unwrap();
        let spec = GrammarSpec::Regex("(ab|[0-9]{2,4})-(yes|no)".into());
        let mut seen = std::collections::HashSet::new();
        for seed in 1..=12 {
            let text = walk(&llm, &mut g.compile(&spec).unwrap(), seed);
            assert!(re.is_match(&text), "{text:?}");
            seen.insert(text);
        }
        assert!(seen.len() > 3, "random walks gave too few texts: {seen:?}");
        let schema = json!({"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "k": {"enum": ["x", "y"]}, "b": {"type": "boolean"}},
            "required": ["n", "k", "b"], "additionalProperties": false});
        let spec = GrammarSpec::JsonSchema(schema);
        for seed in 1..=6 {
            let text = walk(&llm, &mut g.compile(&spec).unwrap(), seed);
            let v: Value = serde_json::from_str(&text).unwrap();
            let n = v["n"].as_i64().unwrap();
            assert!((0..=99).contains(&n), "{text}");
            assert!(["x", "y"].contains(&v["k"].as_str().unwrap()), "{text}");
            assert!(
                v["b"].is_boolean() && v.as_object().unwrap().len() == 3,
                "{text}"
            );
        }
        let e = g
            .compile(&GrammarSpec::JsonSchema(json!({"type": "objekt"})))
            .err()
            .unwrap();
        assert!(e.contains("objekt"), "{e}");
        assert!(g.compile(&GrammarSpec::Regex("(a".into())).is_err());
    }
}
