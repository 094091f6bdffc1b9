//! Service behaviour of `fastllm serve` through real HTTP on loopback over the tiny fixture
//! model: errors in the OpenAI shape for every status, request fields refused by name, TGI's
//! `POST /` route and `details`, fresh reported seeds, CORS, KV gauges before the first request,
//! `ignore_eos`, and the graceful drain (every running stream ends with `[DONE]`).

use fastllm::generate::Llm;
use fastllm::load::{load, LoadOptions};
use fastllm::model::Model;
use fastllm_serve::http::AppState;
use fastllm_serve::{engine_config, shutdown, ServeOptions};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

fn tiny_model() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/tiny/qwen2");
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let out = std::env::temp_dir().join(format!("fastllm-service-test-{}.flm", std::process::id()));
    if !out.exists() {
        fastllm::convert::convert(&dir, &out, &Default::default(), &mut |_| {}).unwrap();
    }
    out
}

/// A server over the tiny model; `stop` starts its shutdown, `done` resolves when it returned.
struct Server {
    base: String,
    state: Arc<AppState>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<std::io::Result<()>>>,
    rt: tokio::runtime::Runtime,
}

fn start(o: ServeOptions) -> Server {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let o = ServeOptions {
        model_name: "tiny-qwen2".into(),
        kv_cache_mb: 16,
        max_input_tokens: Some(100),
        max_total_tokens: Some(200),
        ..o
    };
    let state = AppState::configured(&o);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
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
    let cfg = engine_config(&llm, &o);
    state.set_ready(llm, cfg).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let (done_tx, done) = oneshot::channel();
    let st = state.clone();
    rt.spawn(async move {
        let signal = async move {
            let _ = stopped.await;
        };
        let r = shutdown::serve(listener, st, signal, o.drain_timeout).await;
        let _ = done_tx.send(r);
    });
    Server {
        base,
        state,
        stop: Some(stop),
        done: Some(done),
        rt,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
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

/// Reads an SSE stream to its end: the `data:` payloads in order.
async fn read_sse(mut r: reqwest::Response) -> Vec<String> {
    assert_eq!(r.status().as_u16(), 200);
    let mut buf = String::new();
    while let Some(chunk) = r.chunk().await.unwrap() {
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
    buf.lines()
        .filter_map(|l| l.strip_prefix("data: ").map(|s| s.to_string()))
        .collect()
}

async fn sse(base: &str, path: &str, body: Value) -> Vec<String> {
    let r = client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    read_sse(r).await
}

/// Asserts the OpenAI error shape with `status`, and that the message contains `needle`.
fn is_error(st: u16, v: &Value, status: u16, needle: &str) {
    assert_eq!(st, status, "{v}");
    let m = v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(m.contains(needle), "'{m}' lacks '{needle}'");
    assert!(v["error"]["type"].is_string(), "{v}");
    assert_eq!(v["error"]["code"], status, "{v}");
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

/// Waits until no sequence runs and no KV block is held.
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

/// Announces a 5 MiB body and waits for the answer before sending it (`Expect:
/// 100-continue`), as curl does for large bodies: the server refuses from the length alone.
async fn too_large(base: &str) -> (u16, Value) {
    let addr = base.trim_start_matches("http://").to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
            5 << 20
        );
        s.write_all(head.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        let text = String::from_utf8_lossy(&out).to_string();
        let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
        let v = serde_json::from_str(body).unwrap_or(Value::String(text.clone()));
        (status, v)
    })
    .await
    .unwrap()
}

#[test]
fn every_error_is_json_in_the_openai_shape() {
    let s = start(ServeOptions {
        max_concurrent_requests: Some(1),
        ..Default::default()
    });
    let b = s.base.clone();
    s.rt.block_on(async move {
        // 404, 405 (with Allow kept), 413
        let r = client().get(format!("{b}/nope")).send().await.unwrap();
        let (st, v) = (r.status().as_u16(), r.json::<Value>().await.unwrap());
        is_error(st, &v, 404, "no such endpoint");
        let r = client()
            .get(format!("{b}/v1/completions"))
            .send()
            .await
            .unwrap();
        assert!(r.headers().get("allow").is_some());
        let (st, v) = (r.status().as_u16(), r.json::<Value>().await.unwrap());
        is_error(st, &v, 405, "method GET is not allowed on /v1/completions");
        let r = client()
            .delete(format!("{b}/generate"))
            .send()
            .await
            .unwrap();
        let (st, v) = (r.status().as_u16(), r.json::<Value>().await.unwrap());
        is_error(st, &v, 405, "DELETE");
        let (st, v) = too_large(&b).await;
        is_error(st, &v, 413, "larger than the limit");
        // 400 (bad JSON, unknown and unsupported fields), 422 (over a limit)
        let r = client()
            .post(format!("{b}/generate"))
            .header("content-type", "application/json")
            .body("{\"inputs\": ")
            .send()
            .await
            .unwrap();
        let (st, v) = (r.status().as_u16(), r.json::<Value>().await.unwrap());
        is_error(st, &v, 400, "invalid request body");
        let (st, v) = post(&b, "/v1/completions", json!({"prompt": "x", "bogus": 1})).await;
        is_error(st, &v, 400, "unknown field 'bogus'");
        let (st, v) = post(
            &b,
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 999}),
        )
        .await;
        is_error(st, &v, 422, "exceeds the maximum");
        // 429: one slot, held by a stream. The tiny model can finish the stream before the second
        // request lands on a loaded machine, so the scenario is retried.
        let mut refused = None;
        for _ in 0..5 {
            let mut r1 = client()
                .post(format!("{b}/v1/completions"))
                .json(&json!({"prompt": "Once", "max_tokens": 150, "stream": true,
                              "temperature": 0, "ignore_eos": true}))
                .send()
                .await
                .unwrap();
            let _ = r1.chunk().await.unwrap();
            let (st, v) = post(
                &b,
                "/v1/completions",
                json!({"prompt": "x", "max_tokens": 2}),
            )
            .await;
            drop(r1);
            if st != 200 {
                refused = Some((st, v));
                break;
            }
            wait_idle(&b).await;
        }
        let (st, v) = refused.expect("a request while a stream holds the only slot was refused");
        is_error(st, &v, 429, "too many concurrent requests");
    });
}

#[test]
fn unsupported_fields_are_refused_by_name() {
    let s = start(ServeOptions::default());
    let b = s.base.clone();
    s.rt.block_on(async move {
        openai_fields_refused(&b).await;
        tgi_fields_refused(&b).await;
    });
}

/// OpenAI fields this server does not implement, in the request, a message and
/// stream_options, are refused by name; their neutral values are accepted.
async fn openai_fields_refused(b: &str) {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let chat = |extra: Value| {
        let mut v = json!({"messages": msgs, "max_tokens": 2});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    for (field, value) in [
        ("logit_bias", json!({"5": 1})),
        ("prediction", json!({"type": "content", "content": "x"})),
    ] {
        let (st, v) = post(b, "/v1/chat/completions", chat(json!({field: value}))).await;
        is_error(st, &v, 400, &format!("'{field}' is not supported"));
    }
    for (field, value) in [
        ("echo", json!(true)),
        ("best_of", json!(3)),
        ("suffix", json!("x")),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "f"}}]),
        ),
    ] {
        let mut body = json!({"prompt": "x", "max_tokens": 2});
        body[field] = value;
        let (st, v) = post(b, "/v1/completions", body).await;
        is_error(st, &v, 400, &format!("'{field}' is not supported"));
    }
    // in a message, and in stream_options
    let (st, v) = post(
        b,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x", "audio": {"id": "a"}}]}),
    )
    .await;
    is_error(st, &v, 400, "message field 'audio' is not supported");
    let (st, v) = post(
        b,
        "/v1/chat/completions",
        chat(json!({"stream_options": {"include_obfuscation": true}})),
    )
    .await;
    is_error(
        st,
        &v,
        400,
        "unknown stream_options field 'include_obfuscation'",
    );
    // neutral values of those fields are accepted
    let (st, v) = post(
        b,
        "/v1/chat/completions",
        chat(
            json!({"tools": [], "logprobs": false, "response_format": {"type": "text"},
                    "tool_choice": "none", "user": "u1", "model": "anything",
                    "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    assert_eq!(st, 200, "{v}");
}

/// TGI parameters this server does not implement are refused by name.
async fn tgi_fields_refused(b: &str) {
    for (field, value) in [
        ("watermark", json!(true)),
        ("decoder_input_details", json!(true)),
        ("typical_p", json!(0.5)),
    ] {
        let (st, v) = post(
            b,
            "/generate",
            json!({"inputs": "x", "parameters": {field: value}}),
        )
        .await;
        is_error(
            st,
            &v,
            400,
            &format!("parameters field '{field}' is not supported"),
        );
    }
    let (st, v) = post(b, "/generate", json!({"inputs": "x", "stream": true})).await;
    is_error(st, &v, 400, "unknown field 'stream'");
    let (st, v) = post(
        b,
        "/generate",
        json!({"inputs": "x", "parameters": {"truncate": 0}}),
    )
    .await;
    is_error(st, &v, 400, "truncate");
}

/// What text-generation 0.7 sends for `generate` (every parameter, unset ones as null).
fn tgi_client_body(inputs: &str, stream: bool, max_new: u32) -> Value {
    json!({"inputs": inputs, "stream": stream, "parameters": {
        "do_sample": false, "max_new_tokens": max_new, "repetition_penalty": null,
        "frequency_penalty": null, "return_full_text": false, "stop": [], "seed": null,
        "temperature": null, "top_k": null, "top_p": null, "truncate": null, "typical_p": null,
        "best_of": null, "watermark": false, "details": true, "decoder_input_details": false,
        "top_n_tokens": null, "grammar": null}})
}

#[test]
fn tgi_root_route_and_details() {
    let s = start(ServeOptions::default());
    let b = s.base.clone();
    s.rt.block_on(async move {
        let (st, plain) = post(
            &b,
            "/generate",
            json!({"inputs": "Hello world", "parameters": {"max_new_tokens": 6}}),
        )
        .await;
        assert_eq!(st, 200, "{plain}");
        assert!(
            plain.get("details").is_none(),
            "details only when asked: {plain}"
        );
        let info: Value = client()
            .get(format!("{b}/info"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(info["model_device_type"], "cpu");
        let text = plain["generated_text"].as_str().unwrap().to_string();
        // POST / answers like /generate, in a one-element list, with details
        let (st, v) = post(&b, "/", tgi_client_body("Hello world", false, 6)).await;
        assert_eq!(st, 200, "{v}");
        let list = v.as_array().unwrap_or_else(|| panic!("not a list: {v}"));
        assert_eq!(list.len(), 1);
        assert_eq!(list[0]["generated_text"], text.as_str());
        let d = &list[0]["details"];
        let n = d["generated_tokens"].as_u64().unwrap();
        assert!(n >= 1);
        assert!(["length", "eos_token"].contains(&d["finish_reason"].as_str().unwrap()));
        assert_eq!(d["prefill"], json!([]));
        assert_eq!(d["seed"], Value::Null, "greedy: no seed");
        let toks = d["tokens"].as_array().unwrap();
        assert_eq!(toks.len() as u64, n);
        for t in toks {
            assert!(t["id"].is_u64() && t["text"].is_string() && t["special"].is_boolean());
            let lp = t["logprob"].as_f64().unwrap_or_else(|| panic!("{t}"));
            assert!(lp <= 0.0 && lp > -50.0, "{t}");
        }
        let joined: String = toks.iter().map(|t| t["text"].as_str().unwrap()).collect();
        assert_eq!(joined, text);
        // POST / with stream: like /generate_stream
        let ev = sse(&b, "/", tgi_client_body("Hello world", true, 6)).await;
        let ev2 = sse(
            &b,
            "/generate_stream",
            json!({"inputs": "Hello world", "parameters": {"max_new_tokens": 6}}),
        )
        .await;
        assert_eq!(ev.len(), ev2.len());
        let last: Value = serde_json::from_str(ev.last().unwrap()).unwrap();
        assert_eq!(last["generated_text"], text.as_str());
        assert_eq!(last["details"]["generated_tokens"], n);
        assert_eq!(last["token"]["logprob"], toks.last().unwrap()["logprob"]);
        tgi_full_text_truncate_and_stop(&b, &text).await;
    });
}

/// `return_full_text`, `truncate` and `stop` of TGI's `/generate`, whose greedy answer to
/// "Hello world" is `text`.
async fn tgi_full_text_truncate_and_stop(b: &str, text: &str) {
    let (_, v) = post(
        b,
        "/generate",
        json!({"inputs": "Hello world", "parameters": {"max_new_tokens": 6,
               "return_full_text": true}}),
    )
    .await;
    assert_eq!(v["generated_text"], format!("Hello world{text}"));
    let (_, v) = post(
        b,
        "/generate",
        json!({"inputs": "a b c d e f g h Hello world",
               "parameters": {"max_new_tokens": 6, "truncate": 2}}),
    )
    .await;
    let (_, w) = post(
        b,
        "/generate",
        json!({"inputs": "x y z Hello world", "parameters": {"max_new_tokens": 6,
               "truncate": 2}}),
    )
    .await;
    assert_eq!(
        v["generated_text"], w["generated_text"],
        "same last 2 tokens"
    );
    // a stop string is TGI's stop_sequence
    let stop: String = text.chars().take(2).collect();
    if !stop.trim().is_empty() {
        let (_, v) = post(
            b,
            "/generate",
            json!({"inputs": "Hello world", "parameters": {"max_new_tokens": 6,
                   "stop": [stop], "details": true}}),
        )
        .await;
        assert_eq!(v["details"]["finish_reason"], "stop_sequence", "{v}");
    }
}

#[test]
fn requests_without_a_seed_get_a_fresh_one_reported() {
    let s = start(ServeOptions::default());
    let b = s.base.clone();
    s.rt.block_on(async move {
        let body = json!({"prompt": "Hello", "max_tokens": 24, "temperature": 1.5});
        let mut seeds = std::collections::HashSet::new();
        let mut texts = std::collections::HashSet::new();
        let mut first = None;
        for _ in 0..4 {
            let (st, v) = post(&b, "/v1/completions", body.clone()).await;
            assert_eq!(st, 200, "{v}");
            seeds.insert(v["seed"].as_u64().unwrap());
            texts.insert(v["choices"][0]["text"].as_str().unwrap().to_string());
            first.get_or_insert(v);
        }
        assert_eq!(seeds.len(), 4, "every request its own seed");
        assert!(texts.len() > 1, "sampling without a seed varies: {texts:?}");
        // the reported seed reproduces the text
        let first = first.unwrap();
        let mut again = body.clone();
        again["seed"] = first["seed"].clone();
        let (_, v) = post(&b, "/v1/completions", again).await;
        assert_eq!(v["choices"][0]["text"], first["choices"][0]["text"]);
        assert_eq!(v["seed"], first["seed"]);
        // greedy: no seed reported; streams report it in the final chunk; TGI in details
        let (_, v) = post(
            &b,
            "/v1/completions",
            json!({"prompt": "x", "temperature": 0}),
        )
        .await;
        assert_eq!(v["seed"], Value::Null);
        let ev = sse(
            &b,
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                   "temperature": 0.7, "seed": 11, "stream": true}),
        )
        .await;
        let fin: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
        assert_eq!(fin["seed"], 11);
        let (_, v) = post(
            &b,
            "/generate",
            json!({"inputs": "x", "parameters": {"do_sample": true, "details": true}}),
        )
        .await;
        assert!(v["details"]["seed"].is_u64(), "{v}");
    });
}

#[test]
fn kv_gauges_ignore_eos_and_cors() {
    let s = start(ServeOptions {
        cors_origin: Some("http://localhost:3000".into()),
        ..Default::default()
    });
    let b = s.base.clone();
    let total = s.state.ready.get().unwrap().1.config().kv_blocks as f64;
    s.rt.block_on(async move {
        // before any request: every block free
        assert_eq!(metric(&b, "fastllm_kv_blocks_free").await, total);
        assert!(total > 0.0);
        // ignore_eos: exactly max_tokens
        let (_, v) = post(
            &b,
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 40, "temperature": 0, "ignore_eos": true}),
        )
        .await;
        assert_eq!(v["usage"]["completion_tokens"], 40, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        // CORS preflight and the header on answers, for the allowed origin only
        let pre = |origin: &'static str| {
            client()
                .request(reqwest::Method::OPTIONS, format!("{b}/v1/chat/completions"))
                .header("origin", origin)
                .header("access-control-request-method", "POST")
                .header(
                    "access-control-request-headers",
                    "content-type, authorization",
                )
                .send()
        };
        let r = pre("http://localhost:3000").await.unwrap();
        assert_eq!(r.status().as_u16(), 204);
        let h = r.headers();
        assert_eq!(h["access-control-allow-origin"], "http://localhost:3000");
        assert!(h["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("POST"));
        assert!(h["access-control-allow-headers"]
            .to_str()
            .unwrap()
            .contains("authorization"));
        let r = pre("http://evil.example").await.unwrap();
        assert_eq!(r.status().as_u16(), 403);
        assert!(r.headers().get("access-control-allow-origin").is_none());
        let r = client()
            .get(format!("{b}/v1/models"))
            .header("origin", "http://localhost:3000")
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.headers()["access-control-allow-origin"],
            "http://localhost:3000"
        );
        let r = client().get(format!("{b}/v1/models")).send().await.unwrap();
        assert!(r.headers().get("access-control-allow-origin").is_none());
    });
    // without --cors-origin: no CORS headers, OPTIONS is a JSON 405
    let s = start(ServeOptions::default());
    let b = s.base.clone();
    s.rt.block_on(async move {
        let r = client()
            .request(reqwest::Method::OPTIONS, format!("{b}/v1/models"))
            .header("origin", "http://localhost:3000")
            .header("access-control-request-method", "GET")
            .send()
            .await
            .unwrap();
        assert!(r.headers().get("access-control-allow-origin").is_none());
        let (st, v) = (r.status().as_u16(), r.json::<Value>().await.unwrap());
        is_error(st, &v, 405, "OPTIONS");
    });
}

/// Starts `n` streams (each has sent its first chunk when this returns).
async fn open_streams(b: &str, n: usize, max_tokens: usize) -> Vec<reqwest::Response> {
    let mut out = Vec::new();
    for k in 0..n {
        let body = if k % 2 == 0 {
            json!({"prompt": format!("Stream {k}"), "max_tokens": max_tokens, "stream": true,
                   "temperature": 0, "ignore_eos": true})
        } else {
            json!({"messages": [{"role": "user", "content": format!("Stream {k}")}],
                   "max_tokens": max_tokens, "stream": true, "temperature": 0,
                   "ignore_eos": true})
        };
        let path = if k % 2 == 0 {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let r = client()
            .post(format!("{b}{path}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        out.push(r);
    }
    out
}

#[test]
fn shutdown_drains_running_streams_to_done() {
    let mut s = start(ServeOptions {
        drain_timeout: Duration::from_secs(60),
        ..Default::default()
    });
    let b = s.base.clone();
    let stop = s.stop.take().unwrap();
    let done = s.done.take().unwrap();
    let state = s.state.clone();
    s.rt.block_on(async move {
        let streams = open_streams(&b, 8, 150).await;
        stop.send(()).unwrap();
        // new requests are refused: the listener is closed (or, on a connection still open,
        // a 503), and /health says so
        for _ in 0..100 {
            if state.is_draining() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(state.is_draining());
        let fresh = reqwest::Client::new()
            .post(format!("{b}/v1/completions"))
            .json(&json!({"prompt": "late", "max_tokens": 2}))
            .send()
            .await;
        if let Ok(r) = fresh {
            assert_eq!(r.status().as_u16(), 503);
        }
        // the 8 running streams finish normally and end with [DONE]
        let mut handles = Vec::new();
        for r in streams {
            handles.push(tokio::spawn(read_sse(r)));
        }
        for h in handles {
            let ev = h.await.unwrap();
            assert_eq!(ev.last().map(|s| s.as_str()), Some("[DONE]"), "{ev:?}");
            let fin: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
            assert_eq!(fin["choices"][0]["finish_reason"], "length", "{fin}");
            assert_eq!(fin["usage"]["completion_tokens"], 150);
        }
        let r = tokio::time::timeout(Duration::from_secs(30), done)
            .await
            .expect("the server returns once drained");
        assert!(r.unwrap().is_ok());
    });
}

#[test]
fn drain_timeout_ends_streams_with_an_error_and_done() {
    let mut s = start(ServeOptions {
        drain_timeout: Duration::ZERO,
        ..Default::default()
    });
    let b = s.base.clone();
    let stop = s.stop.take().unwrap();
    let done = s.done.take().unwrap();
    s.rt.block_on(async move {
        let streams = open_streams(&b, 8, 150).await;
        stop.send(()).unwrap();
        let mut handles = Vec::new();
        for r in streams {
            handles.push(tokio::spawn(read_sse(r)));
        }
        let mut n_cut = 0;
        for h in handles {
            let ev = h.await.unwrap();
            assert_eq!(ev.last().map(|s| s.as_str()), Some("[DONE]"), "{ev:?}");
            // either finished before the cut, or ended by it with a named error
            let fin: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
            let finished = fin["choices"][0]["finish_reason"] == "length";
            let cut = fin["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("shut down"));
            assert!(finished || cut, "{fin}");
            n_cut += usize::from(cut);
        }
        eprintln!("{n_cut} of 8 streams were ended by the drain timeout");
        let r = tokio::time::timeout(Duration::from_secs(30), done)
            .await
            .expect("the server returns once drained");
        assert!(r.unwrap().is_ok());
    });
}

/// Log-softmax of the model's logits after each of `generated` (following `prompt`), in f64
/// on the host: the reference for the server's log-probabilities.
fn reference_logprobs(model: &Model, prompt: &[u32], generated: &[u32]) -> Vec<Vec<f64>> {
    let all: Vec<u32> = prompt.iter().chain(generated).copied().collect();
    let mut cache = model.new_cache(all.len() + 1).unwrap();
    let logits = model
        .forward(&mut cache, &all, true)
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let vocab = model.config().vocab_size;
    (0..generated.len())
        .map(|i| {
            let row = &logits[(prompt.len() - 1 + i) * vocab..(prompt.len() + i) * vocab];
            let m = row.iter().fold(f64::MIN, |a, &b| a.max(b as f64));
            let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            row.iter().map(|&x| x as f64 - lse).collect()
        })
        .collect()
}

#[test]
fn logprobs_match_a_host_log_softmax() {
    let s = start(ServeOptions::default());
    let b = s.base.clone();
    let llm = s.state.ready.get().unwrap().0.clone();
    s.rt.block_on(async move {
        sampled_logprobs_match(&b, &llm).await;
        greedy_chat_logprobs_are_the_best(&b).await;
        logprob_requests_checked(&b).await;
    });
}

/// Completions, sampled: every token's logprob and top 5 against the reference, the generated
/// ids taken from TGI with the same seed and sampling.
async fn sampled_logprobs_match(b: &str, llm: &Llm) {
    let prompt = "Hello world";
    let prompt_ids = llm.tokenizer.encode(prompt, true, false).unwrap();
    let (st, v) = post(
        b,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 12, "temperature": 1.3, "seed": 5,
               "logprobs": 5, "ignore_eos": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let n = lp["tokens"].as_array().unwrap().len();
    assert_eq!(n, 12, "{lp}");
    for k in ["token_logprobs", "top_logprobs", "text_offset"] {
        assert_eq!(lp[k].as_array().unwrap().len(), n, "{k}: {lp}");
    }
    // the generated ids, from TGI with the same seed and sampling (it stops at an
    // end-of-sequence token, the completion went on)
    let (_, t) = post(
        b,
        "/generate",
        json!({"inputs": prompt, "parameters": {"max_new_tokens": 12, "temperature": 1.3,
               "seed": 5, "details": true, "top_n_tokens": 5}}),
    )
    .await;
    let toks = t["details"]["tokens"].as_array().unwrap();
    let ids: Vec<u32> = toks
        .iter()
        .map(|x| x["id"].as_u64().unwrap() as u32)
        .collect();
    let want = reference_logprobs(&llm.model, &prompt_ids, &ids);
    let top_tokens = t["details"]["top_tokens"].as_array().unwrap();
    for (i, &id) in ids.iter().enumerate() {
        let w = want[i][id as usize];
        let tgi = toks[i]["logprob"].as_f64().unwrap();
        assert!((tgi - w).abs() < 1e-3, "token {i}: {tgi} vs {w}");
        // the same seed and sampling pick the same tokens (TGI's stop at an end token)
        let oa = lp["token_logprobs"][i].as_f64().unwrap();
        assert!((oa - w).abs() < 1e-3, "token {i}: {oa} vs {w}");
        // the top 5: the 5 best of the reference, best first
        let mut best: Vec<f64> = want[i].clone();
        best.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let top = top_tokens[i].as_array().unwrap();
        assert_eq!(top.len(), 5);
        for (j, e) in top.iter().enumerate() {
            let got = e["logprob"].as_f64().unwrap();
            assert!(
                (got - best[j]).abs() < 1e-3,
                "top {j} of {i}: {got} vs {}",
                best[j]
            );
            let tid = e["id"].as_u64().unwrap() as usize;
            assert!((want[i][tid] - got).abs() < 1e-3);
        }
        // keyed by token text: tokens with the same text share a key
        let keys = lp["top_logprobs"][i].as_object().unwrap().len();
        assert!((1..=5).contains(&keys), "{keys}");
    }
}

/// Chat, greedy: the pick is the best token; streamed entries equal the answer's.
async fn greedy_chat_logprobs_are_the_best(b: &str) {
    let body = json!({"messages": [{"role": "user", "content": "Hi there"}],
        "max_tokens": 8, "temperature": 0, "logprobs": true, "top_logprobs": 3,
        "ignore_eos": true});
    let (st, v) = post(b, "/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content.len(), 8);
    for e in &content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], e["token"], "{e}");
        assert_eq!(top[0]["logprob"], e["logprob"], "{e}");
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        assert!(e["bytes"].is_array());
    }
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let ev = sse(b, "/v1/chat/completions", streamed_body).await;
    let streamed: Vec<Value> = ev
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed.len(), content.len());
    for (a, c) in streamed.iter().zip(&content) {
        assert_eq!(a["token"], c["token"]);
        let (x, y) = (
            a["logprob"].as_f64().unwrap(),
            c["logprob"].as_f64().unwrap(),
        );
        assert!((x - y).abs() < 1e-4, "{x} vs {y}");
    }
}

/// Logprobs off give null; out-of-range or malformed logprob requests are refused by name.
async fn logprob_requests_checked(b: &str) {
    // logprobs off: null, and no cost asked of the engine
    let (_, v) = post(
        b,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    )
    .await;
    assert_eq!(v["choices"][0]["logprobs"], Value::Null);
    // bad inputs
    let msgs = json!([{"role": "user", "content": "x"}]);
    for (body, needle) in [
        (
            json!({"messages": msgs, "logprobs": true, "top_logprobs": 21}),
            "at most 20",
        ),
        (
            json!({"messages": msgs, "top_logprobs": 2}),
            "requires logprobs",
        ),
        (
            json!({"messages": msgs, "logprobs": true, "top_logprobs": -1}),
            "invalid",
        ),
        (json!({"messages": msgs, "logprobs": 3}), "invalid"),
    ] {
        let (st, v) = post(b, "/v1/chat/completions", body.clone()).await;
        is_error(st, &v, 400, needle);
    }
    let (st, v) = post(b, "/v1/completions", json!({"prompt": "x", "logprobs": 21})).await;
    is_error(st, &v, 400, "logprobs must be at most 20");
    let (st, v) = post(
        b,
        "/v1/completions",
        json!({"prompt": "x", "logprobs": true}),
    )
    .await;
    is_error(st, &v, 400, "invalid");
    let (st, v) = post(
        b,
        "/generate",
        json!({"inputs": "x", "parameters": {"top_n_tokens": 21}}),
    )
    .await;
    is_error(st, &v, 400, "top_n_tokens must be at most 20");
}

/// The text of each choice of an OpenAI stream, by index.
fn choice_texts(events: &[String], n: usize) -> Vec<String> {
    let mut out = vec![String::new(); n];
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        let c = &v["choices"][0];
        let i = c["index"].as_u64().unwrap() as usize;
        let t = c["text"].as_str().or(c["delta"]["content"].as_str());
        out[i].push_str(t.unwrap_or(""));
    }
    out
}

#[test]
fn n_choices_each_with_its_own_seed() {
    let s = start(ServeOptions {
        max_concurrent_requests: Some(4),
        ..Default::default()
    });
    let b = s.base.clone();
    let state = s.state.clone();
    s.rt.block_on(async move {
        let body = |n: u32, seed: u64, stream: bool| {
            json!({"prompt": "Hello", "max_tokens": 10, "temperature": 1.2, "seed": seed,
                   "n": n, "stream": stream, "ignore_eos": true})
        };
        let (st, v) = post(&b, "/v1/completions", body(3, 40, false)).await;
        assert_eq!(st, 200, "{v}");
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3);
        let mut gen = 0;
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"], i);
            // choice i is the single request with seed + i
            let (_, one) = post(&b, "/v1/completions", body(1, 40 + i as u64, false)).await;
            assert_eq!(c["text"], one["choices"][0]["text"], "choice {i}");
            assert_eq!(v["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
            gen += one["usage"]["completion_tokens"].as_u64().unwrap();
        }
        assert_eq!(v["usage"]["completion_tokens"], gen);
        assert_eq!(v["seed"], 40);
        let texts: std::collections::HashSet<&str> = choices
            .iter()
            .map(|c| c["text"].as_str().unwrap())
            .collect();
        assert!(texts.len() > 1, "the choices differ: {texts:?}");
        // streamed: the same choices, one usage (on the last finish), then [DONE]
        let ev = sse(&b, "/v1/completions", body(3, 40, true)).await;
        assert_eq!(ev.last().map(|s| s.as_str()), Some("[DONE]"));
        let streamed = choice_texts(&ev, 3);
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(streamed[i], c["text"].as_str().unwrap());
        }
        let usages: Vec<Value> = ev
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter(|v| !v["usage"].is_null())
            .collect();
        assert_eq!(usages.len(), 1);
        assert_eq!(usages[0]["usage"], v["usage"]);
        chat_choices_stream_with_their_roles(&b).await;
        bad_n_is_refused(&b, &state).await;
    });
}

/// Chat, streamed, with logprobs: the streamed choices equal the answer's, each opening with
/// its role.
async fn chat_choices_stream_with_their_roles(b: &str) {
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    let chat = json!({"messages": msgs, "max_tokens": 6, "temperature": 0.9, "seed": 3,
                      "n": 2, "logprobs": true, "ignore_eos": true});
    let (st, v) = post(b, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(st, 200, "{v}");
    for c in v["choices"].as_array().unwrap() {
        assert_eq!(c["logprobs"]["content"].as_array().unwrap().len(), 6);
    }
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let ev = sse(b, "/v1/chat/completions", streamed).await;
    let texts = choice_texts(&ev, 2);
    for (i, c) in v["choices"].as_array().unwrap().iter().enumerate() {
        assert_eq!(texts[i], c["message"]["content"].as_str().unwrap());
    }
    let roles = ev
        .iter()
        .filter(|e| e.contains("\"role\":\"assistant\""))
        .count();
    assert_eq!(roles, 2);
}

/// A bad `n` is a 400; more choices than free slots is a 429 that leaves nothing running.
async fn bad_n_is_refused(b: &str, state: &AppState) {
    for (n, needle) in [
        (json!(0), "at least 1"),
        (json!(17), "at most 16"),
        (json!(-1), "invalid"),
    ] {
        let (st, v) = post(b, "/v1/completions", json!({"prompt": "x", "n": n})).await;
        is_error(st, &v, 400, needle);
    }
    let (st, v) = post(b, "/v1/completions", json!({"prompt": "x", "n": 5})).await;
    is_error(st, &v, 429, "too many");
    let engine = &state.ready.get().unwrap().1;
    for _ in 0..200 {
        if engine.in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(engine.in_flight(), 0);
}

#[test]
fn tgi_best_of_answers_the_likeliest_sequence() {
    let s = start(ServeOptions::default());
    let b = s.base.clone();
    s.rt.block_on(async move {
        let params = |seed: u64, best_of: u32| {
            json!({"max_new_tokens": 8, "do_sample": true, "temperature": 1.3, "seed": seed,
                   "details": true, "best_of": best_of})
        };
        let (st, v) = post(
            &b,
            "/generate",
            json!({"inputs": "Hello", "parameters": params(7, 3)}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        // the three sequences, each run alone with its seed
        let mut singles = Vec::new();
        for i in 0..3u64 {
            let (_, one) = post(
                &b,
                "/generate",
                json!({"inputs": "Hello", "parameters": params(7 + i, 1)}),
            )
            .await;
            let sum: f64 = one["details"]["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["logprob"].as_f64().unwrap())
                .sum();
            singles.push((
                one["generated_text"].as_str().unwrap().to_string(),
                sum,
                7 + i,
            ));
        }
        let best = singles
            .iter()
            .max_by(|a, b| a.1.partial_cmp(&b.1).unwrap())
            .unwrap();
        assert_eq!(v["generated_text"], best.0.as_str(), "{singles:?}");
        assert_eq!(v["details"]["seed"], best.2);
        let others = v["details"]["best_of_sequences"].as_array().unwrap();
        assert_eq!(others.len(), 2);
        for o in others {
            let seed = o["seed"].as_u64().unwrap();
            let single = singles.iter().find(|x| x.2 == seed).unwrap();
            assert_eq!(o["generated_text"], single.0.as_str());
            assert!(o["tokens"].is_array() && o["finish_reason"].is_string());
        }
        // bad best_of
        for (p, needle) in [
            (json!({"best_of": 2}), "needs sampling"),
            (json!({"best_of": 0, "do_sample": true}), "at least 1"),
            (json!({"best_of": 17, "do_sample": true}), "at most 16"),
        ] {
            let (st, v) = post(&b, "/generate", json!({"inputs": "x", "parameters": p})).await;
            is_error(st, &v, 400, needle);
        }
        let (st, v) = post(
            &b,
            "/generate_stream",
            json!({"inputs": "x", "parameters": {"best_of": 2, "do_sample": true}}),
        )
        .await;
        is_error(st, &v, 400, "cannot be streamed");
        let (st, v) = post(
            &b,
            "/",
            json!({"inputs": "x", "stream": true, "parameters": {"best_of": 2, "do_sample": true}}),
        )
        .await;
        is_error(st, &v, 400, "cannot be streamed");
    });
}
