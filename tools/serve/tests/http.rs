//! Integration tests of `fastllm serve`: a real server on a loopback port over a tiny fixture
//! model, driven by a real HTTP client — endpoints, SSE streams, batching equivalence,
//! cancellation, overload, bad requests, and KV blocks returned at idle.

use fastllm::load::{load, LoadOptions};
use fastllm_serve::http::{router, AppState};
use fastllm_serve::{engine_config, ServeOptions};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

fn tiny_model() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/tiny/qwen2");
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let out = std::env::temp_dir().join(format!("fastllm-serve-test-{}.flm", std::process::id()));
    if !out.exists() {
        fastllm::convert::convert(&dir, &out, &Default::default(), &mut |_| {}).unwrap();
    }
    out
}

struct Server {
    base: String,
    state: Arc<AppState>,
    _rt: tokio::runtime::Runtime,
}

fn start(max_concurrent: usize, api_key: Option<&str>, load_model: bool) -> Server {
    start_limits(max_concurrent, api_key, load_model, 100, 200)
}

/// [`start`] with the limits of prompt and total tokens per request.
fn start_limits(
    max_concurrent: usize,
    api_key: Option<&str>,
    load_model: bool,
    max_input: usize,
    max_total: usize,
) -> Server {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let state = AppState::new("tiny-qwen2", api_key.map(|s| s.to_string()));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = router(state.clone());
    rt.spawn(async move { axum::serve(listener, app).await });
    if load_model {
        let llm = Arc::new(
            load(
                &tiny_model(),
                &LoadOptions {
                    threads: 2,
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        let o = ServeOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            model_name: "tiny-qwen2".into(),
            kv_cache_mb: 16,
            max_concurrent_requests: Some(max_concurrent),

            max_input_tokens: Some(max_input),
            max_total_tokens: Some(max_total),

            ..Default::default()
        };
        let cfg = engine_config(&llm, &o);
        state.set_ready(llm, cfg).unwrap();
    }
    Server {
        base,
        state,
        _rt: rt,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let r = client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        st,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Reads an SSE stream: the `data:` payloads in order.
async fn sse(base: &str, path: &str, body: Value) -> Vec<String> {
    let mut r = client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut buf = String::new();
    while let Some(chunk) = r.chunk().await.unwrap() {
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
    buf.lines()
        .filter_map(|l| l.strip_prefix("data: ").map(|s| s.to_string()))
        .collect()
}

fn stream_text(events: &[String]) -> String {
    events
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .map(|v| {
            v["choices"][0]["text"]
                .as_str()
                .or(v["choices"][0]["delta"]["content"].as_str())
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

async fn metric(base: &str, name: &str) -> f64 {
    let t = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    t.lines()
        .find(|l| l.starts_with(name) && l.as_bytes().get(name.len()) == Some(&b' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

async fn wait_idle(base: &str) {
    for _ in 0..200 {
        if metric(base, "fastllm_kv_blocks_used").await == 0.0
            && metric(base, "fastllm_batch_size").await == 0.0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("server did not return to idle (blocks still used)");
}

#[test]
fn health_is_503_until_loaded() {
    let s = start(4, None, false);
    block(async {
        let r = client()
            .get(format!("{}/health", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 503);
        let (st, body) = post(&s.base, "/v1/completions", json!({"prompt": "hi"})).await;
        assert_eq!(st, 503);
        assert!(body["error"]["message"].is_string());
    });
    let _ = &s.state;
}

#[test]
fn endpoints_streams_and_bad_requests() {
    let s = start(8, None, true);
    let b = s.base.clone();
    block(async move {
        assert_eq!(
            client()
                .get(format!("{b}/health"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
            200
        );
        greedy_answers_agree(&b).await;
        info_models_tokenize_and_metrics(&b).await;
        bad_requests_are_4xx(&b).await;
        wait_idle(&b).await;
    });
}

/// A greedy completion equals its stream and TGI's answers (`/generate`, `/generate_stream`);
/// a greedy chat answer equals its stream.
async fn greedy_answers_agree(b: &str) {
    // non-stream completion
    let (st, v) = post(
        b,
        "/v1/completions",
        json!({"prompt": "Hello world", "max_tokens": 6, "temperature": 0}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 6);
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(["stop", "length"].contains(&v["choices"][0]["finish_reason"].as_str().unwrap()));
    // the same, streamed
    let ev = sse(
        b,
        "/v1/completions",
        json!({"prompt": "Hello world", "max_tokens": 6, "temperature": 0, "stream": true}),
    )
    .await;
    assert_eq!(ev.last().map(|s| s.as_str()), Some("[DONE]"));
    assert_eq!(stream_text(&ev), text);
    // chat, both ways
    let msgs = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]);
    let (st, v) = post(
        b,
        "/v1/chat/completions",
        json!({"messages": msgs, "max_tokens": 5, "temperature": 0}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let chat_text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let ev = sse(
        b,
        "/v1/chat/completions",
        json!({"messages": msgs, "max_tokens": 5, "temperature": 0, "stream": true}),
    )
    .await;
    assert_eq!(stream_text(&ev), chat_text);
    // TGI
    let (st, v) = post(
        b,
        "/generate",
        json!({"inputs": "Hello world", "parameters": {"max_new_tokens": 6}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["generated_text"].as_str().unwrap(), text);
    let ev = sse(
        b,
        "/generate_stream",
        json!({"inputs": "Hello world", "parameters": {"max_new_tokens": 6}}),
    )
    .await;
    let last: Value = serde_json::from_str(ev.last().unwrap()).unwrap();
    assert_eq!(last["generated_text"].as_str().unwrap(), text);
}

/// `/info`, `/v1/models`, `/tokenize` and the metrics.
async fn info_models_tokenize_and_metrics(b: &str) {
    let info: Value = client()
        .get(format!("{b}/info"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["max_input_tokens"], 100);
    assert_eq!(info["waiting_served_ratio"], 0.0);
    assert_eq!(info["max_waiting_tokens"], 20);
    assert_eq!(info["prefix_caching"], true);
    let models: Value = client()
        .get(format!("{b}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "tiny-qwen2");
    let (st, v) = post(b, "/tokenize", json!({"inputs": "Hello"})).await;
    assert_eq!(st, 200);
    assert!(v.as_array().is_some_and(|a| !a.is_empty()));
    assert!(metric(b, "fastllm_generated_tokens_total").await > 0.0);
}

/// Bad requests: 4xx with an error body, never 500.
async fn bad_requests_are_4xx(b: &str) {
    let r = client()
        .post(format!("{b}/v1/completions"))
        .body("{not json")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let e: Value = r.json().await.unwrap();
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("invalid request body"));
    for (body, code) in [
        (json!({"prompt": "x", "max_tokens": "many"}), 400),
        (json!({"prompt": 12}), 400),
        (json!({"max_tokens": 3}), 400),
        (json!({"prompt": "x", "n": 0}), 400),
        (json!({"prompt": "x", "temperature": -1}), 400),
        (json!({"prompt": "x", "max_tokens": 0}), 400),
        (json!({"prompt": "x", "max_tokens": 100000}), 422),
        (json!({"prompt": "word ".repeat(500)}), 422),
    ] {
        let (st, v) = post(b, "/v1/completions", body.clone()).await;
        assert_eq!(st, code, "{body} -> {v}");
        assert!(v["error"]["message"].is_string(), "{v}");
    }
    let (st, _) = post(b, "/v1/chat/completions", json!({"messages": []})).await;
    assert_eq!(st, 400);
    let (st, _) = post(
        b,
        "/v1/chat/completions",
        json!({"messages": [{"role": "wizard", "content": "x"}]}),
    )
    .await;
    assert_eq!(st, 400);
    assert_eq!(
        client()
            .get(format!("{b}/nope"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        404
    );
}

#[test]
fn batching_is_equivalent_and_64_streams_complete() {
    let s = start(128, None, true);
    let b = s.base.clone();
    block(async move {
        let prompts: Vec<String> = (0..8)
            .map(|i| format!("Prompt number {i} about cats"))
            .collect();
        let mut solo = Vec::new();
        for p in &prompts {
            let (st, v) = post(
                &b,
                "/v1/completions",
                json!({"prompt": p, "max_tokens": 8, "temperature": 0}),
            )
            .await;
            assert_eq!(st, 200);
            solo.push(v["choices"][0]["text"].as_str().unwrap().to_string());
        }
        // 64 concurrent streams: every prompt 8 times, all at once
        let mut handles = Vec::new();
        for k in 0..64 {
            let (b, p) = (b.clone(), prompts[k % 8].clone());
            handles.push(tokio::spawn(async move {
                let ev = sse(
                    &b,
                    "/v1/completions",
                    json!({"prompt": p, "max_tokens": 8, "temperature": 0, "stream": true}),
                )
                .await;
                assert_eq!(ev.last().map(|s| s.as_str()), Some("[DONE]"));
                stream_text(&ev)
            }));
        }
        for (k, h) in handles.into_iter().enumerate() {
            assert_eq!(
                h.await.unwrap(),
                solo[k % 8],
                "stream {k} differs from its solo run"
            );
        }
        let steps = metric(&b, "fastllm_steps_total").await;
        assert!(steps > 0.0);
        // every step fed decode rows or a prompt chunk, and the 64 streams shared steps
        let rows = metric(&b, "fastllm_one_token_rows_total").await;
        let prefill = metric(&b, "fastllm_prefill_steps_total").await;
        assert!(prefill > 0.0 && prefill <= steps, "{prefill} of {steps}");
        assert!(
            rows > steps - prefill,
            "{rows} one-token rows in {steps} steps"
        );
        // the engine's time splits into forward steps and the work around them
        assert!(metric(&b, "fastllm_model_seconds_total").await > 0.0);
        assert!(metric(&b, "fastllm_scheduler_seconds_total").await > 0.0);
        wait_idle(&b).await;
        // prefix cache (on by default): a repeated long prompt skips its cached full blocks
        // and answers the same; cached blocks count as free at idle
        let long = "the cat sat on the mat and ".repeat(6);
        let body = json!({"prompt": long, "max_tokens": 8, "temperature": 0});
        let hits0 = metric(&b, "fastllm_prefix_cache_hit_tokens_total").await;
        let (_, first) = post(&b, "/v1/completions", body.clone()).await;
        let (_, second) = post(&b, "/v1/completions", body).await;
        assert_eq!(first["choices"][0]["text"], second["choices"][0]["text"]);
        assert!(metric(&b, "fastllm_prefix_cache_hit_tokens_total").await >= hits0 + 16.0);
        wait_idle(&b).await;
        assert!(metric(&b, "fastllm_kv_blocks_cached").await > 0.0);
    });
}

#[test]
fn cancellation_and_overload() {
    let s = start(2, None, true);
    let b = s.base.clone();
    block(async move {
        // Two long streams hold both slots while a third request arrives. The tiny model can
        // finish a stream before the third request lands on a loaded machine, so the scenario
        // is retried; overload must show within a few tries.
        let hold = |prompt: &str| {
            client()
                .post(format!("{b}/v1/completions"))
                .json(&json!({"prompt": prompt, "max_tokens": 180, "stream": true,
                    "temperature": 0, "ignore_eos": true}))
                .send()
        };
        let mut rejected = None;
        for _ in 0..5 {
            let mut r1 = hold("Once upon a time").await.unwrap();
            let r2 = hold("Long ago").await.unwrap();
            assert_eq!(r1.status().as_u16(), 200);
            assert_eq!(r2.status().as_u16(), 200);
            let _ = r1.chunk().await.unwrap();
            let (st, v) = post(
                &b,
                "/v1/completions",
                json!({"prompt": "third", "max_tokens": 4}),
            )
            .await;
            // disconnect both mid-stream: their blocks come back
            drop(r1);
            drop(r2);
            wait_idle(&b).await;
            if st == 429 {
                rejected = Some(v);
                break;
            }
            assert_eq!(st, 200, "{v}");
        }
        let v = rejected.expect("a third request while two streams hold both slots got 429");
        assert!(v["error"]["message"].is_string());
        assert!(metric(&b, "fastllm_requests_rejected_total").await >= 1.0);
        let (st, _) = post(
            &b,
            "/v1/completions",
            json!({"prompt": "after", "max_tokens": 2}),
        )
        .await;
        assert_eq!(st, 200);
        wait_idle(&b).await;
    });
}

#[test]
fn api_key_is_enforced() {
    let s = start(4, Some("sekret"), true);
    let b = s.base.clone();
    block(async move {
        let (st, v) = post(
            &b,
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 1}),
        )
        .await;
        assert_eq!(st, 401, "{v}");
        let r = client()
            .post(format!("{b}/v1/completions"))
            .bearer_auth("sekret")
            .json(&json!({"prompt": "x", "max_tokens": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(
            client()
                .get(format!("{b}/health"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
            200
        );
    });
}

/// A server over the `tiny` synthetic model (random weights, byte-level stand-in tokenizer), as
/// `fastllm serve --synthetic tiny --dtype f16` runs it.
fn start_synthetic() -> Server {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let state = AppState::new("tiny-f16-synthetic", None);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = router(state.clone());
    rt.spawn(async move { axum::serve(listener, app).await });
    let llm = Arc::new(
        fastllm::load::load_synthetic(
            "tiny",
            "f16",
            &LoadOptions {
                threads: 2,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let o = ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        model_name: "tiny-f16-synthetic".into(),
        kv_cache_mb: 16,
        max_concurrent_requests: Some(64),

        ..Default::default()
    };
    let cfg = engine_config(&llm, &o);
    state.set_ready(llm, cfg).unwrap();
    Server {
        base,
        state,
        _rt: rt,
    }
}

#[test]
fn synthetic_model_serves_text_and_seeded_sampling() {
    let s = start_synthetic();
    let b = s.base.clone();
    block(async move {
        // byte-level stand-in tokenizer: bos + one token per byte
        let (st, v) = post(
            &b,
            "/v1/completions",
            json!({"prompt": "Hello", "max_tokens": 6, "temperature": 0}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["usage"]["prompt_tokens"], 6, "{v}");
        let greedy = v["choices"][0]["text"].as_str().unwrap().to_string();
        assert!(
            v["usage"]["completion_tokens"].as_u64().unwrap() >= 1,
            "{v}"
        );
        // seeded sampling (temperature, top-p, top-k, min-p, penalties): the same seed gives
        // the same text, streamed or not; another seed gives other text
        let body = |seed: u64, stream: bool| {
            json!({"prompt": "Hello", "max_tokens": 24, "temperature": 1.5, "top_p": 0.95,
                   "top_k": 200, "min_p": 0.01, "frequency_penalty": 0.3, "seed": seed,
                   "stream": stream})
        };
        let (_, a) = post(&b, "/v1/completions", body(7, false)).await;
        let (_, a2) = post(&b, "/v1/completions", body(7, false)).await;
        let (_, c) = post(&b, "/v1/completions", body(8, false)).await;
        let ta = a["choices"][0]["text"].as_str().unwrap().to_string();
        assert_eq!(ta, a2["choices"][0]["text"].as_str().unwrap());
        assert_ne!(ta, c["choices"][0]["text"].as_str().unwrap());
        assert_ne!(ta, greedy);
        let ev = sse(&b, "/v1/completions", body(7, true)).await;
        assert_eq!(ev.last().map(|s| s.as_str()), Some("[DONE]"));
        assert_eq!(stream_text(&ev), ta);
        // greedy results do not depend on the batch: 16 concurrent streams equal the solo run
        let mut handles = Vec::new();
        for _ in 0..16 {
            let b = b.clone();
            handles.push(tokio::spawn(async move {
                let ev = sse(
                    &b,
                    "/v1/completions",
                    json!({"prompt": "Hello", "max_tokens": 6, "temperature": 0, "stream": true}),
                )
                .await;
                stream_text(&ev)
            }));
        }
        for h in handles {
            assert_eq!(h.await.unwrap(), greedy);
        }
        // bad sampling parameters are a 400 with a message, not a crash
        for bad in [
            json!({"prompt": "x", "top_p": 0.0}),
            json!({"prompt": "x", "temperature": -1.0}),
            json!({"prompt": "x", "min_p": 2.0}),
            json!({"prompt": "x", "repetition_penalty": 0.0}),
        ] {
            let (st, v) = post(&b, "/v1/completions", bad.clone()).await;
            assert_eq!(st, 400, "{bad}: {v}");
            assert!(v["error"]["message"].is_string(), "{v}");
        }
        // /tokenize: one id per byte after bos
        let (st, v) = post(&b, "/tokenize", json!({"inputs": "Hi"})).await;
        assert_eq!(st, 200, "{v}");
        wait_idle(&b).await;
    });
}

/// Constrained output through HTTP on the tiny model (whose unconstrained text is noise):
/// `response_format` `json_schema` and `json_object` (chat, streamed and not, sampled with
/// n = 3), completions, and TGI's `grammar` (JSON and regex) give text that follows the
/// grammar; bad formats and grammars are a 400 naming the field.
#[test]
fn constrained_output_follows_the_grammar() {
    let s = start(16, None, true);
    let b = s.base.clone();
    block(async move {
        openai_json_answers_follow_the_schema(&b).await;
        tgi_grammars_are_followed(&b).await;
        bad_grammars_are_refused(&b).await;
        wait_idle(&b).await;
    });
}

/// The schema of the constrained answers: a pet's name, age and kind.
fn pet_schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "kind": {"enum": ["cat", "dog"]}},
        "required": ["name", "age", "kind"], "additionalProperties": false})
}

/// Asserts that `text` is a JSON object valid under [`pet_schema`].
fn valid_pet(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let o = v.as_object().unwrap();
    assert_eq!(o.len(), 3, "{text}");
    assert!(v["name"].as_str().unwrap().chars().count() <= 12, "{text}");
    assert!((0..=150).contains(&v["age"].as_i64().unwrap()), "{text}");
    assert!(
        ["cat", "dog"].contains(&v["kind"].as_str().unwrap()),
        "{text}"
    );
}

/// OpenAI `response_format`: a JSON schema on chat (sampled choices and a greedy stream), any
/// JSON object on completions.
async fn openai_json_answers_follow_the_schema(b: &str) {
    let schema = pet_schema();
    let rf = json!({"type": "json_schema", "json_schema": {"name": "pet", "schema": schema}});
    let msgs = json!([{"role": "user", "content": "A pet, please."}]);
    let (st, v) = post(
        b,
        "/v1/chat/completions",
        json!({"messages": msgs, "max_tokens": 60, "temperature": 0.9, "n": 3,
               "response_format": rf}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    for c in v["choices"].as_array().unwrap() {
        assert_eq!(c["finish_reason"], "stop", "{v}");
        valid_pet(c["message"]["content"].as_str().unwrap());
    }
    let ev = sse(
        b,
        "/v1/chat/completions",
        json!({"messages": msgs, "max_tokens": 60, "temperature": 0, "stream": true,
               "response_format": rf}),
    )
    .await;
    assert_eq!(ev.last().map(|s| s.as_str()), Some("[DONE]"));
    let text: String = ev
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    valid_pet(&text);
    // any JSON object, on completions
    let (st, v) = post(
        b,
        "/v1/completions",
        json!({"prompt": "Data:", "max_tokens": 80, "temperature": 0.7, "seed": 4,
               "response_format": {"type": "json_object"}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    if v["choices"][0]["finish_reason"] == "stop" {
        let o: Value = serde_json::from_str(v["choices"][0]["text"].as_str().unwrap()).unwrap();
        assert!(o.is_object(), "{v}");
    } else {
        assert!(
            v["choices"][0]["text"].as_str().unwrap().starts_with('{'),
            "{v}"
        );
    }
}

/// TGI: a JSON grammar (schema given as an object) and a regex.
async fn tgi_grammars_are_followed(b: &str) {
    let schema = pet_schema();
    let (st, v) = post(
        b,
        "/generate",
        json!({"inputs": "Pet:", "parameters": {"max_new_tokens": 60,
               "grammar": {"type": "json", "value": schema}}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    valid_pet(v["generated_text"].as_str().unwrap());
    let (st, v) = post(
        b,
        "/generate",
        json!({"inputs": "Call", "parameters": {"max_new_tokens": 20, "do_sample": true,
               "grammar": {"type": "regex", "value": "[0-9]{3}-[0-9]{4}"}}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let t = v["generated_text"].as_str().unwrap();
    assert!(
        t.len() == 8
            && t.chars().enumerate().all(|(i, c)| if i == 3 {
                c == '-'
            } else {
                c.is_ascii_digit()
            }),
        "{t:?}"
    );
}

/// Invalid schemas, regular expressions and grammar types are refused by name.
async fn bad_grammars_are_refused(b: &str) {
    let msgs = json!([{"role": "user", "content": "A pet, please."}]);
    for (path, body, want) in [
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "objekt"}}}}),
            "response_format: invalid JSON schema",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "needs a 'schema'",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "response_format": {"type": "yaml"}}),
            "response_format type 'yaml'",
        ),
        (
            "/generate",
            json!({"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "(a"}}}),
            "grammar: invalid regular expression",
        ),
        (
            "/generate",
            json!({"inputs": "x", "parameters": {"grammar": {"type": "json", "value": "{not json"}}}),
            "grammar value is not a JSON schema",
        ),
        (
            "/generate",
            json!({"inputs": "x", "parameters": {"grammar": {"type": "ebnf", "value": "x"}}}),
            "grammar type 'ebnf'",
        ),
    ] {
        let (st, v) = post(b, path, body).await;
        assert_eq!(st, 400, "{v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(want), "{m}");
    }
}

/// Tool calls through HTTP on the tiny model: a forced call (`required`, named) comes back as
/// OpenAI `tool_calls` whose arguments follow the tool's schema, streamed too; a round trip
/// with the call and its result in the messages renders; bad tools and choices are a 400
/// naming what is wrong.
#[test]
fn forced_tool_calls_come_back_as_tool_calls() {
    // the tools are described in the prompt: too long for the tiny fixture's context of 256
    let s = start_synthetic();
    let b = s.base.clone();
    block(async move {
        let (tools, msgs) = (
            calculator_tools(),
            json!([{"role": "user", "content": "2+3?"}]),
        );
        forced_calls_follow_the_schema(&b, &tools, &msgs).await;
        streamed_call_and_round_trip(&b, &tools, &msgs).await;
        bad_tools_are_refused(&b, &tools, &msgs).await;
        wait_idle(&b).await;
    });
}

/// Two tools: `add` (two integers of 0..=99) and `now` (no parameters).
fn calculator_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
          "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                         "b": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["a", "b"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "now"}}])
}

/// A forced call (`required`, or the named `add`) comes back as OpenAI `tool_calls` whose
/// arguments follow the tool's schema.
async fn forced_calls_follow_the_schema(b: &str, tools: &Value, msgs: &Value) {
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "add"}}),
    ] {
        let (st, v) = post(
            b,
            "/v1/chat/completions",
            json!({"messages": msgs, "tools": tools, "tool_choice": choice, "max_tokens": 120,
                   "temperature": 0.8, "parallel_tool_calls": false}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        let call = &c["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        let name = call["function"]["name"].as_str().unwrap();
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        match name {
            "add" => assert!(args["a"].is_i64() && args["b"].is_i64(), "{args}"),
            "now" => assert!(args.is_object(), "{args}"),
            _ => panic!("{name}"),
        }
    }
}

/// A forced call streamed as one `tool_calls` delta, and the round trip's second request (the
/// call and its result in the messages) answered.
async fn streamed_call_and_round_trip(b: &str, tools: &Value, msgs: &Value) {
    let ev = sse(
        b,
        "/v1/chat/completions",
        json!({"messages": msgs, "tools": tools, "stream": true, "max_tokens": 120,
               "tool_choice": {"type": "function", "function": {"name": "add"}}}),
    )
    .await;
    assert_eq!(ev.last().map(|s| s.as_str()), Some("[DONE]"));
    let chunks: Vec<Value> = ev
        .iter()
        .filter_map(|e| serde_json::from_str(e).ok())
        .collect();
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 1, "{ev:?}");
    assert_eq!(calls[0]["function"]["name"], "add");
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "tool_calls"));
    // the round trip's second request: the call and its result in the messages
    let back = json!([{"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"}]);
    let (st, v) = post(
        b,
        "/v1/chat/completions",
        json!({"messages": back, "tools": tools, "max_tokens": 5, "temperature": 0}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
}

/// Unknown tools, a choice without tools, nameless tools, tools with a response format and
/// tools on completions are a 400 naming what is wrong.
async fn bad_tools_are_refused(b: &str, tools: &Value, msgs: &Value) {
    for (body, want) in [
        (
            json!({"messages": msgs, "tools": tools,
                "tool_choice": {"type": "function", "function": {"name": "mul"}}}),
            "unknown tool 'mul'",
        ),
        (
            json!({"messages": msgs, "tool_choice": "required"}),
            "no tools are given",
        ),
        (
            json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": ""}}]}),
            "tools[0].function needs a non-empty 'name'",
        ),
        (
            json!({"messages": msgs, "tools": tools, "tool_choice": "required",
                "response_format": {"type": "json_object"}}),
            "cannot be combined",
        ),
    ] {
        let (st, v) = post(b, "/v1/chat/completions", body).await;
        assert_eq!(st, 400, "{v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(want), "{m}");
    }
    let (st, v) = post(b, "/v1/completions", json!({"prompt": "x", "tools": tools})).await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("'tools'"));
}
