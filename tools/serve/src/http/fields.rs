//! Which request fields each endpoint serves. A field outside that list is refused by name
//! (400): known API fields this server does not implement say so, unknown ones are named as
//! unknown. A field left at its "off" value (null, false, an empty list or object, or a value
//! listed as neutral) changes nothing and is accepted.

use super::{bad, ApiError};
use serde_json::{Map, Value};

/// Fields of `POST /v1/completions`.
pub const COMPLETION: &[&str] = &[
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "stream",
    "stream_options",
    "n",
    "user",
    "ignore_eos",
    "logprobs",
    "response_format",
];

/// Fields of `POST /v1/chat/completions`.
pub const CHAT: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "stream",
    "stream_options",
    "n",
    "user",
    "ignore_eos",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];

/// Fields of a chat message.
pub const MESSAGE: &[&str] = &["role", "content", "tool_calls", "tool_call_id", "name"];

/// Fields of `stream_options`.
pub const STREAM_OPTIONS: &[&str] = &["include_usage"];

/// Top-level fields of TGI's `/generate` and `/generate_stream` (`/` adds `stream`).
pub const TGI: &[&str] = &["inputs", "parameters"];

/// Fields of TGI's `parameters`.
pub const TGI_PARAMS: &[&str] = &[
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "repetition_penalty",
    "frequency_penalty",
    "do_sample",
    "stop",
    "details",
    "return_full_text",
    "truncate",
    "top_n_tokens",
    "best_of",
    "grammar",
];

/// API fields this server knows and does not implement, with what they would do.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("logit_bias", "logit bias"),
    ("best_of", "best-of sampling"),
    ("echo", "echoing the prompt"),
    ("suffix", "insertion"),
    ("tools", "tool calls"),
    ("tool_choice", "tool calls"),
    ("parallel_tool_calls", "tool calls"),
    ("functions", "function calls"),
    ("function_call", "function calls"),
    ("tool_calls", "tool calls"),
    ("tool_call_id", "tool calls"),
    ("name", "named participants"),
    ("audio", "audio"),
    ("modalities", "audio"),
    ("prediction", "predicted outputs"),
    ("reasoning_effort", "reasoning settings"),
    ("service_tier", "service tiers"),
    ("store", "stored completions"),
    ("metadata", "stored completions"),
    ("web_search_options", "web search"),
    ("typical_p", "typical sampling"),
    ("watermark", "watermarking"),
    ("decoder_input_details", "prompt log probabilities"),
    ("adapter_id", "adapters"),
];

/// Values of a field that ask for nothing beyond the default.
fn neutral(key: &str, v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) if o.is_empty() => true,
        Value::Object(o) => {
            key == "response_format" && o.len() == 1 && o.get("type") == Some(&"text".into())
        }
        Value::String(s) => matches!((key, s.as_str()), ("tool_choice", "none") | ("suffix", "")),
        Value::Number(n) => match key {
            "best_of" => n.as_f64() == Some(1.0),
            "typical_p" => n.as_f64() == Some(1.0),
            _ => false,
        },
        _ => false,
    }
}

/// Checks the fields of `obj` (named `what` in messages) against `served`.
pub fn check(obj: &Map<String, Value>, served: &[&str], what: &str) -> Result<(), ApiError> {
    for (k, v) in obj {
        if served.contains(&k.as_str()) || neutral(k, v) {
            continue;
        }
        return Err(match UNSUPPORTED.iter().find(|(name, _)| name == k) {
            Some((_, feature)) => bad(format!(
                "{what}field '{k}' is not supported by this server ({feature})"
            )),
            None => bad(format!("unknown {what}field '{k}'")),
        });
    }
    Ok(())
}

/// Parses `body` as a JSON object and checks its fields against `served`.
pub fn object(body: &[u8], served: &[&str]) -> Result<Map<String, Value>, ApiError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid request body: {e}")))?;
    let Value::Object(obj) = v else {
        return Err(bad("invalid request body: expected a JSON object"));
    };
    check(&obj, served, "")?;
    Ok(obj)
}

/// Checks the fields of an optional nested object `key` of `obj`.
pub fn nested(obj: &Map<String, Value>, key: &str, served: &[&str]) -> Result<(), ApiError> {
    match obj.get(key) {
        Some(Value::Object(o)) => check(o, served, &format!("{key} ")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(body: Value, served: &[&str]) -> Option<String> {
        object(body.to_string().as_bytes(), served)
            .err()
            .map(|e| e.1)
    }

    #[test]
    fn fields_are_served_neutral_or_refused_by_name() {
        assert_eq!(msg(json!({"prompt": "x", "seed": 3}), COMPLETION), None);
        for neutral in [
            json!({"prompt": "x", "logprobs": null}),
            json!({"prompt": "x", "logprobs": false}),
            json!({"prompt": "x", "tools": []}),
            json!({"prompt": "x", "tool_choice": "none"}),
            json!({"prompt": "x", "response_format": {"type": "text"}}),
            json!({"prompt": "x", "best_of": 1}),
        ] {
            assert_eq!(msg(neutral.clone(), COMPLETION), None, "{neutral}");
        }
        let m = msg(
            json!({"prompt": "x", "tools": [{"type": "function"}]}),
            COMPLETION,
        )
        .unwrap();
        assert!(m.contains("'tools'") && m.contains("not supported"), "{m}");
        let m = msg(json!({"prompt": "x", "echo": true}), COMPLETION).unwrap();
        assert!(m.contains("'echo'"), "{m}");
        let m = msg(json!({"grammar": {"type": "json"}}), COMPLETION).unwrap();
        assert_eq!(m, "unknown field 'grammar'");
        let m = msg(json!({"prompt": "x", "frobnicate": 1}), COMPLETION).unwrap();
        assert_eq!(m, "unknown field 'frobnicate'");
        assert!(msg(json!([1, 2]), COMPLETION)
            .unwrap()
            .contains("JSON object"));
        let obj = object(
            json!({"stream_options": {"include_usage": true, "x": 1}})
                .to_string()
                .as_bytes(),
            CHAT,
        )
        .unwrap();
        let e = nested(&obj, "stream_options", STREAM_OPTIONS).unwrap_err();
        assert_eq!(e.1, "unknown stream_options field 'x'");
    }
}
