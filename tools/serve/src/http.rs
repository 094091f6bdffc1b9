//! HTTP front end (axum): OpenAI `POST /v1/completions`, `POST /v1/chat/completions`,
//! `GET /v1/models`; TGI `POST /generate`, `POST /generate_stream`, `GET /info`, `GET /health`;
//! `GET /metrics`, `POST /tokenize`. Streams are Server-Sent Events. Bad requests get a 4xx with
//! an error body, never a 500; a client that disconnects cancels its request.

use crate::engine::{Engine, EngineConfig, Event, FinishReason, GenRequest, SubmitError};
use crate::metrics::Metrics;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fastllm::generate::{ChatMessage, Llm, SamplingParams};
use futures_util::stream::{self, Stream};
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use tokio::sync::mpsc;

/// Shared server state.
pub struct AppState {
    /// Set once the model is loaded.
    pub ready: OnceLock<(Arc<Llm>, Engine)>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Required bearer token, if any.
    pub api_key: Option<String>,
    /// Model name reported by the API.
    pub model_name: String,
}

impl AppState {
    /// State with no model yet (health answers 503 until [`AppState::set_ready`]).
    pub fn new(model_name: &str, api_key: Option<String>) -> Arc<AppState> {
        Arc::new(AppState {
            ready: OnceLock::new(),
            metrics: Arc::new(Metrics::default()),
            api_key,
            model_name: model_name.to_string(),
        })
    }
    /// Installs the loaded model and starts the engine.
    pub fn set_ready(&self, llm: Arc<Llm>, cfg: EngineConfig) -> fastllm::Result<()> {
        let engine = Engine::start(llm.clone(), cfg, self.metrics.clone())?;
        let _ = self.ready.set((llm, engine));
        Ok(())
    }
}

/// The router with every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/generate", post(tgi_generate))
        .route("/generate_stream", post(tgi_generate_stream))
        .route("/info", get(info))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .fallback(not_found)
        .with_state(state)
}

/// An API error: status and message.
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.0 {
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
            StatusCode::NOT_FOUND => "not_found_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        (
            self.0,
            Json(json!({ "error": { "message": self.1, "type": kind, "code": self.0.as_u16() } })),
        )
            .into_response()
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

async fn not_found() -> ApiError {
    ApiError(StatusCode::NOT_FOUND, "no such endpoint".into())
}

fn auth(st: &AppState, h: &HeaderMap) -> Result<(), ApiError> {
    if let Some(key) = &st.api_key {
        let ok = h
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|v| v == key);
        if !ok {
            return Err(ApiError(
                StatusCode::UNAUTHORIZED,
                "missing or wrong API key (Authorization: Bearer ...)".into(),
            ));
        }
    }
    Ok(())
}

fn ready(st: &AppState) -> Result<&(Arc<Llm>, Engine), ApiError> {
    st.ready.get().ok_or_else(|| {
        ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "the model is still loading".into(),
        )
    })
}

fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad(format!("invalid request body: {e}")))
}

/// `stop` as a string or a list of strings.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    fn list(s: Option<Stop>) -> Vec<String> {
        match s {
            None => Vec::new(),
            Some(Stop::One(x)) => vec![x],
            Some(Stop::Many(v)) => v,
        }
    }
}

/// Common OpenAI sampling fields.
#[derive(Deserialize)]
struct OaSampling {
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    min_p: Option<f32>,
    seed: Option<u64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    stop: Option<Stop>,
    #[serde(default)]
    stream: bool,
    n: Option<u32>,
}

impl OaSampling {
    fn params(&self, default_max: u32) -> Result<(SamplingParams, usize), ApiError> {
        if self.n.unwrap_or(1) != 1 {
            return Err(bad("only n = 1 is supported"));
        }
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k: self.top_k.unwrap_or(0) as usize,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            seed: self.seed.unwrap_or(0),
        };
        p.validate().map_err(|e| bad(e.to_string()))?;
        let max = self
            .max_completion_tokens
            .or(self.max_tokens)
            .unwrap_or(default_max);
        if max == 0 {
            return Err(bad("max_tokens must be at least 1"));
        }
        Ok((p, max as usize))
    }
}

#[derive(Deserialize)]
struct CompletionRequest {
    prompt: Value,
    #[serde(flatten)]
    s: OaSampling,
}

#[derive(Deserialize)]
struct ChatRequest {
    messages: Vec<ChatMsgIn>,
    #[serde(flatten)]
    s: OaSampling,
}

#[derive(Deserialize)]
struct ChatMsgIn {
    role: String,
    content: Value,
}

fn content_text(v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(|t| t.as_str()),
                    p.get("text").and_then(|t| t.as_str()),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => return Err(bad("only text content parts are supported")),
                }
            }
            Ok(out)
        }
        _ => Err(bad(
            "message content must be a string or a list of text parts",
        )),
    }
}

fn submit(
    st: &AppState,
    prompt: Vec<u32>,
    sampling: SamplingParams,
    max_new: usize,
    stop: Vec<String>,
) -> Result<mpsc::UnboundedReceiver<Event>, ApiError> {
    let (_, engine) = ready(st)?;
    let (tx, rx) = mpsc::unbounded_channel();
    engine
        .submit(GenRequest {
            prompt,
            sampling,
            max_new_tokens: max_new,
            stop,
            events: tx,
        })
        .map_err(|e| match e {
            SubmitError::Overloaded => ApiError(
                StatusCode::TOO_MANY_REQUESTS,
                "too many concurrent requests; retry later".into(),
            ),
            SubmitError::Invalid(m) => ApiError(StatusCode::UNPROCESSABLE_ENTITY, m),
            SubmitError::Stopped => {
                ApiError(StatusCode::SERVICE_UNAVAILABLE, "the engine stopped".into())
            }
        })?;
    Ok(rx)
}

struct Collected {
    text: String,
    reason: FinishReason,
    prompt_tokens: usize,
    completion_tokens: usize,
}

async fn collect(mut rx: mpsc::UnboundedReceiver<Event>) -> Result<Collected, ApiError> {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token { text: t, .. } => text.push_str(&t),
            Event::Done {
                reason,
                prompt_tokens,
                completion_tokens,
            } => {
                return Ok(Collected {
                    text,
                    reason,
                    prompt_tokens,
                    completion_tokens,
                })
            }
            Event::Error(m) => return Err(ApiError(StatusCode::UNPROCESSABLE_ENTITY, m)),
        }
    }
    Err(ApiError(
        StatusCode::SERVICE_UNAVAILABLE,
        "the engine stopped".into(),
    ))
}

fn reason_str(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn request_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    format!(
        "{prefix}-{:x}{:06x}",
        now(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// SSE stream over engine events; `render` turns each event into zero or more JSON payloads.
fn sse<F>(
    rx: mpsc::UnboundedReceiver<Event>,
    mut render: F,
    done_marker: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>>
where
    F: FnMut(&Event) -> Vec<Value> + Send + 'static,
{
    let s = stream::unfold((rx, false), |(mut rx, finished)| async move {
        if finished {
            return None;
        }
        let ev = rx.recv().await?;
        let last = matches!(ev, Event::Done { .. } | Event::Error(_));
        Some((ev, (rx, last)))
    });
    let s = futures_util::StreamExt::flat_map(s, move |ev| {
        let mut items: Vec<Result<SseEvent, Infallible>> = render(&ev)
            .into_iter()
            .map(|v| Ok(SseEvent::default().data(v.to_string())))
            .collect();
        if done_marker && matches!(ev, Event::Done { .. } | Event::Error(_)) {
            items.push(Ok(SseEvent::default().data("[DONE]")));
        }
        stream::iter(items)
    });
    Sse::new(s)
}

async fn completions(
    State(st): State<Arc<AppState>>,
    h: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    auth(&st, &h)?;
    let req: CompletionRequest = parse(&body)?;
    let (llm, _) = ready(&st)?;
    let prompt = match &req.prompt {
        Value::String(s) => s.clone(),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or_default().to_string()
        }
        _ => return Err(bad("prompt must be a string (or a list of one string)")),
    };
    let ids = llm
        .tokenizer
        .encode(&prompt, true, false)
        .map_err(|e| bad(e.to_string()))?;
    let (sampling, max_new) = req.s.params(16)?;
    let rx = submit(&st, ids, sampling, max_new, Stop::list(req.s.stop))?;
    let (id, created, model) = (request_id("cmpl"), now(), st.model_name.clone());
    if req.s.stream {
        let render = move |ev: &Event| -> Vec<Value> {
            match ev {
                Event::Token { text, .. } if text.is_empty() => vec![],
                Event::Token { text, .. } => vec![
                    json!({"id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": text, "finish_reason": null, "logprobs": null}]}),
                ],
                Event::Done {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                } => vec![
                    json!({"id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": "", "finish_reason": reason_str(*reason), "logprobs": null}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}}),
                ],
                Event::Error(m) => vec![json!({"error": {"message": m, "type": "server_error"}})],
            }
        };
        return Ok(sse(rx, render, true).into_response());
    }
    let c = collect(rx).await?;
    Ok(Json(json!({"id": id, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": c.text, "finish_reason": reason_str(c.reason), "logprobs": null}],
        "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens, "total_tokens": c.prompt_tokens + c.completion_tokens}}))
    .into_response())
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    h: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    auth(&st, &h)?;
    let req: ChatRequest = parse(&body)?;
    let (llm, _) = ready(&st)?;
    if req.messages.is_empty() {
        return Err(bad("messages must not be empty"));
    }
    let mut msgs = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        if !matches!(
            m.role.as_str(),
            "system" | "user" | "assistant" | "tool" | "developer"
        ) {
            return Err(bad(format!("unknown role '{}'", m.role)));
        }
        let role = if m.role == "developer" {
            "system"
        } else {
            m.role.as_str()
        };
        msgs.push(ChatMessage::new(role, &content_text(&m.content)?));
    }
    let text = llm
        .render_chat(&msgs, true)
        .map_err(|e| bad(e.to_string()))?;
    let ids = llm
        .tokenizer
        .encode(&text, false, true)
        .map_err(|e| bad(e.to_string()))?;
    let ctx = llm.model.config().context_length as u32;
    let (sampling, max_new) = req
        .s
        .params(ctx.saturating_sub(ids.len() as u32).clamp(1, 512))?;
    let rx = submit(&st, ids, sampling, max_new, Stop::list(req.s.stop))?;
    let (id, created, model) = (request_id("chatcmpl"), now(), st.model_name.clone());
    if req.s.stream {
        let mut first = true;
        let render = move |ev: &Event| -> Vec<Value> {
            let chunk = |delta: Value, fin: Value| {
                json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": fin}]})
            };
            let mut out = Vec::new();
            if first {
                first = false;
                out.push(chunk(
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                ));
            }
            match ev {
                Event::Token { text, .. } if !text.is_empty() => {
                    out.push(chunk(json!({"content": text}), Value::Null))
                }
                Event::Token { .. } => {}
                Event::Done {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                } => {
                    let mut c = chunk(json!({}), json!(reason_str(*reason)));
                    c["usage"] = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens});
                    out.push(c);
                }
                Event::Error(m) => {
                    out.push(json!({"error": {"message": m, "type": "server_error"}}))
                }
            }
            out
        };
        return Ok(sse(rx, render, true).into_response());
    }
    let c = collect(rx).await?;
    Ok(Json(json!({"id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text}, "finish_reason": reason_str(c.reason)}],
        "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens, "total_tokens": c.prompt_tokens + c.completion_tokens}}))
    .into_response())
}

async fn models(State(st): State<Arc<AppState>>, h: HeaderMap) -> Result<Json<Value>, ApiError> {
    auth(&st, &h)?;
    Ok(Json(
        json!({"object": "list", "data": [{"id": st.model_name, "object": "model", "created": 0, "owned_by": "fastllm"}]}),
    ))
}

#[derive(Deserialize)]
struct TgiRequest {
    inputs: String,
    #[serde(default)]
    parameters: TgiParams,
}

#[derive(Deserialize, Default)]
struct TgiParams {
    max_new_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    seed: Option<u64>,
    repetition_penalty: Option<f32>,
    #[serde(default)]
    do_sample: bool,
    #[serde(default)]
    stop: Vec<String>,
}

fn tgi_submit(
    st: &AppState,
    body: &Bytes,
) -> Result<(mpsc::UnboundedReceiver<Event>, usize), ApiError> {
    let req: TgiRequest = parse(body)?;
    let (llm, _) = ready(st)?;
    let ids = llm
        .tokenizer
        .encode(&req.inputs, true, false)
        .map_err(|e| bad(e.to_string()))?;
    let p = &req.parameters;
    let sampled = p.do_sample
        || p.temperature.is_some_and(|t| t > 0.0)
        || p.top_k.is_some()
        || p.top_p.is_some();
    let sampling = SamplingParams {
        temperature: if sampled {
            p.temperature.unwrap_or(1.0)
        } else {
            0.0
        },
        top_k: p.top_k.unwrap_or(0) as usize,
        top_p: p.top_p.unwrap_or(1.0),
        repetition_penalty: p.repetition_penalty.unwrap_or(1.0),
        seed: p.seed.unwrap_or(0),
        ..Default::default()
    };
    sampling.validate().map_err(|e| bad(e.to_string()))?;
    let max_new = p.max_new_tokens.unwrap_or(20);
    if max_new == 0 {
        return Err(bad("max_new_tokens must be at least 1"));
    }
    let n = ids.len();
    Ok((
        submit(st, ids, sampling, max_new as usize, p.stop.clone())?,
        n,
    ))
}

async fn tgi_generate(
    State(st): State<Arc<AppState>>,
    h: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    auth(&st, &h)?;
    let (rx, _) = tgi_submit(&st, &body)?;
    let c = collect(rx).await?;
    Ok(Json(
        json!({"generated_text": c.text, "details": {"finish_reason": match c.reason { FinishReason::Stop => "eos_token", FinishReason::Length => "length" },
        "generated_tokens": c.completion_tokens, "prompt_tokens": c.prompt_tokens}}),
    ))
}

async fn tgi_generate_stream(
    State(st): State<Arc<AppState>>,
    h: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    auth(&st, &h)?;
    let (rx, _) = tgi_submit(&st, &body)?;
    let mut text = String::new();
    let mut last: Option<(u32, String)> = None;
    let render = move |ev: &Event| -> Vec<Value> {
        let tok = |id: u32, t: &str, gen: Value, details: Value| json!({"token": {"id": id, "text": t, "logprob": 0.0, "special": false}, "generated_text": gen, "details": details});
        match ev {
            Event::Token { id, text: t } => {
                text.push_str(t);
                // emit the previous token; the final one is sent with the full text
                let out = last
                    .take()
                    .map(|(i, s)| vec![tok(i, &s, Value::Null, Value::Null)])
                    .unwrap_or_default();
                last = Some((*id, t.clone()));
                out
            }
            Event::Done {
                reason,
                completion_tokens,
                ..
            } => {
                let details = json!({"finish_reason": match reason { FinishReason::Stop => "eos_token", FinishReason::Length => "length" }, "generated_tokens": completion_tokens});
                let (i, s) = last.take().unwrap_or((0, String::new()));
                vec![tok(i, &s, json!(text), details)]
            }
            Event::Error(m) => vec![json!({"error": m, "error_type": "generation"})],
        }
    };
    Ok(sse(rx, render, false).into_response())
}

async fn info(State(st): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let (llm, engine) = ready(&st)?;
    let c: &EngineConfig = engine.config();
    Ok(Json(json!({
        "model_id": st.model_name, "model_dtype": "mixed", "model_device_type": "cpu",
        "architecture": llm.model.config().architecture,
        "max_concurrent_requests": c.max_concurrent_requests, "max_input_tokens": c.max_input_tokens,
        "max_total_tokens": c.max_total_tokens, "max_batch_total_tokens": c.max_batch_total_tokens,
        "max_batch_prefill_tokens": c.max_batch_prefill_tokens, "kv_cache_blocks": c.kv_blocks, "kv_block_size": c.block_size,
        "waiting_served_ratio": c.waiting_served_ratio, "max_waiting_tokens": c.max_waiting_tokens,
        "prefix_caching": c.prefix_caching,
        "router": "fastllm", "version": env!("CARGO_PKG_VERSION"),
    })))
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.ready.get().is_some() {
        StatusCode::OK.into_response()
    } else {
        ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "the model is still loading".into(),
        )
        .into_response()
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

#[derive(Deserialize)]
struct TokenizeRequest {
    inputs: String,
    #[serde(default)]
    add_special_tokens: bool,
}

async fn tokenize(
    State(st): State<Arc<AppState>>,
    h: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    auth(&st, &h)?;
    let req: TokenizeRequest = parse(&body)?;
    let (llm, _) = ready(&st)?;
    let ids = llm
        .tokenizer
        .encode(&req.inputs, req.add_special_tokens, true)
        .map_err(|e| bad(e.to_string()))?;
    let toks: Vec<Value> = ids
        .iter()
        .map(|&i| json!({"id": i, "text": llm.tokenizer.decode(&[i], false).unwrap_or_default()}))
        .collect();
    Ok(Json(Value::Array(toks)))
}
