//! Log-probabilities in each API's shape: OpenAI chat (`logprobs.content` entries with
//! `top_logprobs`), OpenAI completions (`tokens`, `token_logprobs`, `top_logprobs`,
//! `text_offset`) and TGI tokens (`logprob`, `top_tokens`). The numbers come from the engine
//! ([`fastllm::model::PickLogprobs`]: the model's distribution, before temperature and
//! penalties).

use super::{bad, ApiError};
use fastllm::generate::Llm;
use fastllm::model::PickLogprobs;
use serde_json::{json, Map, Value};

/// Most likely tokens a request may ask for per position.
pub const MAX_TOP: usize = 20;

/// Checks a requested number of most likely tokens (`what` names the field).
pub fn check_top(n: u32, what: &str) -> Result<usize, ApiError> {
    if n as usize > MAX_TOP {
        return Err(bad(format!("{what} must be at most {MAX_TOP}, got {n}")));
    }
    Ok(n as usize)
}

/// The text of one token (special tokens spelled out).
pub fn token_text(llm: &Llm, id: u32) -> String {
    llm.tokenizer.decode(&[id], false).unwrap_or_default()
}

fn token_bytes(llm: &Llm, id: u32) -> Vec<u8> {
    match llm.tokenizer.token_bytes(id) {
        Some(b) => b.to_vec(),
        None => token_text(llm, id).into_bytes(),
    }
}

/// One OpenAI chat `logprobs.content` entry.
pub fn chat_entry(llm: &Llm, id: u32, lp: &PickLogprobs) -> Value {
    let one = |id: u32, logprob: f32| json!({"token": token_text(llm, id), "logprob": logprob, "bytes": token_bytes(llm, id)});
    let mut e = one(id, lp.logprob);
    e["top_logprobs"] = lp.top.iter().map(|&(t, l)| one(t, l)).collect();
    e
}

/// OpenAI chat `logprobs` of `tokens`.
pub fn chat(llm: &Llm, tokens: &[(u32, &PickLogprobs)]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|&(id, lp)| chat_entry(llm, id, lp))
        .collect();
    json!({"content": content, "refusal": null})
}

/// OpenAI completions `logprobs` of `tokens`, whose text starts at character `offset` of the
/// completion.
pub fn completion(llm: &Llm, tokens: &[(u32, &PickLogprobs)], mut offset: usize) -> Value {
    let (mut toks, mut lps, mut tops, mut offs) = (vec![], vec![], vec![], vec![]);
    for &(id, lp) in tokens {
        let t = token_text(llm, id);
        offs.push(offset);
        offset += t.chars().count();
        toks.push(t);
        lps.push(lp.logprob);
        let top: Map<String, Value> = lp
            .top
            .iter()
            .map(|&(i, l)| (token_text(llm, i), json!(l)))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs})
}

/// A TGI token: id, text, log-probability (null when not computed), special.
pub fn tgi_token(llm: &Llm, id: u32, text: &str, logprob: Option<f32>) -> Value {
    json!({"id": id, "text": text, "logprob": logprob, "special": llm.tokenizer.is_special(id)})
}

/// TGI's `top_tokens` of one position.
pub fn tgi_top(llm: &Llm, lp: &PickLogprobs) -> Value {
    lp.top
        .iter()
        .map(|&(i, l)| tgi_token(llm, i, &token_text(llm, i), Some(l)))
        .collect()
}
