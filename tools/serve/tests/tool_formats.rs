//! Tool calls in the Llama 3.x and Mistral forms, end to end: the synthetic `tiny` model (random
//! weights, byte-level stand-in tokenizer) served with a chat template of each family's form.
//! A forced call (`tool_choice: required`) is generated in that form and comes back through
//! real HTTP as OpenAI `tool_calls`, streamed too; the call and its result render in the next
//! request; and what the template writes for an assistant's call parses back as that call.
//! The templates here are written for the test; with `FASTLLM_CHAT_TEMPLATES` naming a
//! directory of the models' own `.jinja` templates, the test also runs over the files named in
//! [`REAL`] found there.

use fastllm::generate::Llm;
use fastllm::load::LoadOptions;
use fastllm_serve::http::tools::{parse_calls, ToolFormat};
use fastllm_serve::http::{router, AppState};
use fastllm_serve::{engine_config, ServeOptions};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// Llama 3.x's form: tools in the first user turn, a call as a bare
/// `{"name": …, "parameters": …}` object, results in an `ipython` turn.
const LLAMA3: &str = r#"{{ bos_token }}{% for m in messages %}<|start_header_id|>{% if m.role == 'tool' %}ipython{% else %}{{ m.role }}{% endif %}<|end_header_id|>

{% if loop.first and tools is defined and tools %}Call a function by replying with JSON {"name": function name, "parameters": its arguments}.
{% for t in tools %}{{ t | tojson }}
{% endfor %}{% endif %}{% if m.tool_calls %}{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}{% endfor %}{% else %}{{ m.content }}{% endif %}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"#;

/// Mistral's form: tools before the last user turn, calls as `[TOOL_CALLS]` and a JSON list,
/// results in `[TOOL_RESULTS]`.
const MISTRAL: &str = r#"{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}{% if loop.last or loop.revindex == 2 %}{% if tools is defined and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}{% endif %}[INST]{{ m.content }}[/INST]{% elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}{% elif m.role == 'tool' %}[TOOL_RESULTS]{"content": {{ m.content | tojson }}}[/TOOL_RESULTS]{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"#;

/// The models' own templates tried from `FASTLLM_CHAT_TEMPLATES`, with the form each uses.
const REAL: [(&str, ToolFormat); 4] = [
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::Llama3),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", ToolFormat::Llama3),
    (
        "meta-llama-Llama-3.3-70B-Instruct.jinja",
        ToolFormat::Llama3,
    ),
    (
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        ToolFormat::Mistral,
    ),
];

struct Server {
    base: String,
    llm: Arc<Llm>,
    _rt: tokio::runtime::Runtime,
}

/// A server over the synthetic `tiny` model with `template` as its chat template.
fn start(template: &str) -> Server {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let state = AppState::new("tiny", None);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = router(state.clone());
    rt.spawn(async move { axum::serve(listener, app).await });
    let opts = LoadOptions {
        threads: 2,
        ..Default::default()
    };
    let mut llm = fastllm::load::load_synthetic("tiny", "f16", &opts).unwrap();
    llm.chat_template = template.to_string();
    let llm = Arc::new(llm);
    let o = ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        model_name: "tiny".into(),
        kv_cache_mb: 16,
        ..Default::default()
    };
    let cfg = engine_config(&llm, &o);
    state.set_ready(llm.clone(), cfg).unwrap();
    Server { base, llm, _rt: rt }
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// POSTs `body` to the chat endpoint: the status and the body (the SSE `data:` payloads as a
/// list when streamed).
async fn chat(base: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    let text = r.text().await.unwrap();
    if body["stream"] == true && st == 200 {
        let events: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap_or(json!(d)))
            .collect();
        return (st, Value::Array(events));
    }
    (st, serde_json::from_str(&text).unwrap_or(json!(text)))
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city now",
        "parameters": {"type": "object",
            "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["unit"], "additionalProperties": false}}}])
}

/// A returned call of `get_weather` with arguments its schema allows.
fn check_call(call: &Value) {
    assert_eq!(call["function"]["name"], "get_weather", "{call}");
    let args = call["function"]["arguments"].as_str().unwrap();
    let args: Value = serde_json::from_str(args).unwrap();
    let unit = args["unit"].as_str().unwrap_or("");
    assert!(["celsius", "fahrenheit"].contains(&unit), "{args}");
}

/// The form's round trip on `template`: forced call (plain and streamed), the next request
/// with the call and its result, and the template's own rendering of a call parsed back.
fn round_trip(what: &str, template: &str, format: ToolFormat) {
    assert_eq!(ToolFormat::of_template(template), (format, true), "{what}");
    let s = start(template);
    let b = s.base.clone();
    let msgs = json!([{"role": "user", "content": "Weather in Paris?"}]);
    // one call: the random model would not end a list of calls (Mistral's form) by itself
    let forced = json!({"messages": msgs, "tools": tools(), "tool_choice": "required",
                        "parallel_tool_calls": false, "max_tokens": 120, "temperature": 0.8});
    block(async {
        let (st, v) = chat(&b, forced.clone()).await;
        assert_eq!(st, 200, "{what}: {v}");
        assert_eq!(
            v["choices"][0]["finish_reason"], "tool_calls",
            "{what}: {v}"
        );
        assert_eq!(
            v["choices"][0]["message"]["content"],
            Value::Null,
            "{what}: {v}"
        );
        check_call(&v["choices"][0]["message"]["tool_calls"][0]);
        let mut streamed = forced.clone();
        streamed["stream"] = json!(true);
        let (st, events) = chat(&b, streamed).await;
        assert_eq!(st, 200, "{what}");
        let calls: Vec<&Value> = events
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array())
            .flatten()
            .collect();
        assert_eq!(calls.len(), 1, "{what}: {events}");
        check_call(calls[0]);
        let (st, v) = chat(
            &b,
            json!({"messages": with_result(), "tools": tools(),
                                      "max_tokens": 4}),
        )
        .await;
        assert_eq!(st, 200, "{what}: the call and its result: {v}");
    });
    // what the template writes for the assistant's call is what the parser reads back
    let conv = with_result();
    let turns = conv.as_array().unwrap();
    let upto = |n: usize, gen: bool| {
        let mut m = fastllm_serve::http::tools::template_messages(&turns[..n], None);
        if format == ToolFormat::Mistral {
            fastllm_serve::http::tools::mistral_ids(&mut m);
        }
        s.llm.render_chat_json(&m, Some(&tools()), gen).unwrap()
    };
    let (before, after) = (upto(1, true), upto(2, false));
    let written = after
        .strip_prefix(&before)
        .unwrap_or_else(|| panic!("{what}: the call's turn is not a suffix: {after:?}"));
    let eos = s
        .llm
        .eos_ids()
        .first()
        .map(|&e| s.llm.tokenizer.decode(&[e], false));
    let eos = eos.unwrap().unwrap();
    let written = ["<|eot_id|>", "<|eom_id|>", eos.as_str()]
        .iter()
        .fold(written.trim_end(), |w, end| {
            w.strip_suffix(end).unwrap_or(w)
        });
    let (content, calls) = parse_calls(format, written);
    assert_eq!(content, "", "{what}: {written:?}");
    assert_eq!(calls.len(), 1, "{what}: {written:?}");
    assert_eq!(calls[0].name, "get_weather");
    let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
    assert_eq!(args, json!({"unit": "celsius"}), "{what}: {written:?}");
}

/// A user question, the assistant's call (with an id as this server writes them, which
/// Mistral's own templates refuse unless it is rewritten) and the tool's result.
fn with_result() -> Value {
    json!([{"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_chatcmpl-1_0_0",
         "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_chatcmpl-1_0_0", "content": "21 degrees, sunny"}])
}

#[test]
fn llama3_tool_calls_round_trip() {
    round_trip("Llama 3.x form", LLAMA3, ToolFormat::Llama3);
}

#[test]
fn mistral_tool_calls_round_trip() {
    round_trip("Mistral form", MISTRAL, ToolFormat::Mistral);
}

#[test]
fn models_own_templates_round_trip() {
    let Ok(dir) = std::env::var("FASTLLM_CHAT_TEMPLATES") else {
        println!("skipped: set FASTLLM_CHAT_TEMPLATES to a directory of the models' templates");
        return;
    };
    for (file, format) in REAL {
        let path = std::path::Path::new(&dir).join(file);
        match std::fs::read_to_string(&path) {
            Ok(t) => round_trip(file, &t, format),
            Err(_) => println!("{file}: not in {dir}"),
        }
    }
}
