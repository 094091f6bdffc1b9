//! HTTP front end (axum): OpenAI `POST /v1/completions`, `POST /v1/chat/completions`,
//! `GET /v1/models`; TGI `POST /generate`, `POST /generate_stream`, `POST /` ([`tgi`]),
//! `GET /info`, `GET /health`; `GET /metrics`, `POST /tokenize`. Streams are Server-Sent Events.
//! Every error is a JSON body in the OpenAI error shape ([`guard`]); bad requests get a 4xx,
//! and a request field this server does not serve is refused by name ([`fields`]). A client
//! that disconnects cancels its request.

pub mod fields;
pub mod guard;
pub mod logprobs;
pub mod tgi;

use crate::engine::{Engine, EngineConfig, Event, FinishReason, GenRequest, SubmitError};
use crate::metrics::Metrics;
use crate::seed::seed_or_fresh;
use crate::ServeOptions;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fastllm::generate::{ChatMessage, Llm, SamplingParams};
use fastllm::model::PickLogprobs;
use futures_util::stream::{self, Stream};
use guard::auth;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::{mpsc, watch};

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
    /// Device the model runs on.
    pub device: String,
    /// Origin allowed by CORS (`*` = any), if any.
    pub cors_origin: Option<String>,
    /// Set on shutdown: new requests are refused.
    draining: AtomicBool,
    /// Set when the drain timeout has passed: running requests end.
    cut: watch::Sender<bool>,
}

impl AppState {
    /// State with no model yet (health answers 503 until [`AppState::set_ready`]), on the CPU,
    /// without CORS.
    pub fn new(model_name: &str, api_key: Option<String>) -> Arc<AppState> {
        AppState::configured(&ServeOptions {
            model_name: model_name.to_string(),
            api_key,
            ..Default::default()
        })
    }
    /// State with no model yet, for the options `o`.
    pub fn configured(o: &ServeOptions) -> Arc<AppState> {
        Arc::new(AppState {
            ready: OnceLock::new(),
            metrics: Arc::new(Metrics::default()),
            api_key: o.api_key.clone(),
            model_name: o.model_name.clone(),
            device: o.device.clone(),
            cors_origin: o.cors_origin.clone(),
            draining: AtomicBool::new(false),
            cut: watch::channel(false).0,
        })
    }
    /// Installs the loaded model and starts the engine.
    pub fn set_ready(&self, llm: Arc<Llm>, cfg: EngineConfig) -> fastllm::Result<()> {
        let engine = Engine::start(llm.clone(), cfg, self.metrics.clone())?;
        let _ = self.ready.set((llm, engine));
        Ok(())
    }
    /// Refuses new requests from now on; returns how many are in flight.
    pub fn start_draining(&self) -> usize {
        self.draining.store(true, Ordering::SeqCst);
        self.ready.get().map(|(_, e)| e.in_flight()).unwrap_or(0)
    }
    /// Ends every running request (streams get an error event, then their end marker).
    pub fn end_running(&self) {
        self.cut.send_replace(true);
    }
    /// True once shutdown began.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

/// The router with every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/", post(tgi::compat))
        .route("/generate", post(tgi::generate))
        .route("/generate_stream", post(tgi::generate_stream))
        .route("/info", get(info))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(guard::MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(guard::length_limit))
        .layer(axum::middleware::from_fn(guard::json_errors))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::cors,
        ))
        .with_state(state)
}

/// An API error: status and message.
#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub String);

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

/// A 400 with `msg`.
pub fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

async fn not_found() -> ApiError {
    ApiError(StatusCode::NOT_FOUND, "no such endpoint".into())
}

/// The model and engine, or 503 while loading.
pub fn ready(st: &AppState) -> Result<&(Arc<Llm>, Engine), ApiError> {
    st.ready.get().ok_or_else(|| {
        ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "the model is still loading".into(),
        )
    })
}

/// Deserializes a checked request object.
pub fn parse<T: for<'de> Deserialize<'de>>(obj: Map<String, Value>) -> Result<T, ApiError> {
    serde_json::from_value(Value::Object(obj))
        .map_err(|e| bad(format!("invalid request body: {e}")))
}

/// `stop` as a string or a list of strings.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings of an optional `stop` field.
    pub fn list(s: Option<Stop>) -> Vec<String> {
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
    /// vLLM's extension: keep generating past end-of-sequence tokens (load tests).
    #[serde(default)]
    ignore_eos: bool,
}

impl OaSampling {
    /// The engine job for `prompt`; a request without a seed gets a fresh one.
    fn job(&mut self, prompt: Vec<u32>, default_max: u32) -> Result<Job, ApiError> {
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
            seed: seed_or_fresh(self.seed),
        };
        p.validate().map_err(|e| bad(e.to_string()))?;
        let max = self
            .max_completion_tokens
            .or(self.max_tokens)
            .unwrap_or(default_max);
        if max == 0 {
            return Err(bad("max_tokens must be at least 1"));
        }
        Ok(Job {
            prompt,
            sampling: p,
            max_new: max as usize,
            stop: Stop::list(self.stop.take()),
            ignore_eos: self.ignore_eos,
            logprobs: None,
        })
    }
}

#[derive(Deserialize)]
struct CompletionRequest {
    prompt: Value,
    /// Log-probabilities of each token with this many most likely tokens.
    logprobs: Option<u32>,
    #[serde(flatten)]
    s: OaSampling,
}

#[derive(Deserialize)]
struct ChatRequest {
    messages: Vec<ChatMsgIn>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<u32>,
    #[serde(flatten)]
    s: OaSampling,
}

impl ChatRequest {
    /// The most likely tokens to list per position, when log-probabilities are asked for.
    fn top_logprobs(&self) -> Result<Option<usize>, ApiError> {
        match (self.logprobs, self.top_logprobs) {
            (false, Some(_)) => Err(bad("top_logprobs requires logprobs: true")),
            (false, None) => Ok(None),
            (true, n) => logprobs::check_top(n.unwrap_or(0), "top_logprobs").map(Some),
        }
    }
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

/// One generation for the engine.
pub struct Job {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling, with the seed it runs with.
    pub sampling: SamplingParams,
    /// Maximum new tokens.
    pub max_new: usize,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Generate past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Report log-probabilities with this many most likely tokens (None = off).
    pub logprobs: Option<usize>,
}

impl Job {
    /// The seed to report: the one used when sampling, none when greedy.
    pub fn reported_seed(&self) -> Value {
        if self.sampling.temperature > 0.0 {
            json!(self.sampling.seed)
        } else {
            Value::Null
        }
    }
}

/// Queues `job`; the receiver gets its events.
pub fn submit(st: &AppState, job: Job) -> Result<mpsc::UnboundedReceiver<Event>, ApiError> {
    let (_, engine) = ready(st)?;
    if st.is_draining() {
        return Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down".into(),
        ));
    }
    let (tx, rx) = mpsc::unbounded_channel();
    engine
        .submit(GenRequest {
            prompt: job.prompt,
            sampling: job.sampling,
            max_new_tokens: job.max_new,
            stop: job.stop,
            ignore_eos: job.ignore_eos,
            logprobs: job.logprobs,
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

/// The message of requests ended by the drain timeout.
pub const SHUTDOWN_MSG: &str = "the server shut down before this request finished";

/// The next event of a request, or an error once the server ends running requests.
async fn next_event(
    rx: &mut mpsc::UnboundedReceiver<Event>,
    cut: &mut watch::Receiver<bool>,
) -> Option<Event> {
    let ended = async {
        if cut.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        ev = rx.recv() => ev,
        _ = ended => Some(Event::Error(SHUTDOWN_MSG.into())),
    }
}

/// A finished request.
pub struct Collected {
    /// Generated text.
    pub text: String,
    /// Generated token ids.
    pub ids: Vec<u32>,
    /// Their log-probabilities, when asked for.
    pub logprobs: Vec<Option<PickLogprobs>>,
    /// Why it finished.
    pub reason: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
}

impl Collected {
    /// The tokens that carry log-probabilities, with them.
    pub fn with_logprobs(&self) -> Vec<(u32, &PickLogprobs)> {
        self.ids
            .iter()
            .zip(&self.logprobs)
            .filter_map(|(&i, l)| l.as_ref().map(|l| (i, l)))
            .collect()
    }
}

/// Waits for a request to finish.
pub async fn collect(
    st: &AppState,
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> Result<Collected, ApiError> {
    let mut cut = st.cut.subscribe();
    let (mut text, mut ids, mut lps) = (String::new(), Vec::new(), Vec::new());
    while let Some(ev) = next_event(&mut rx, &mut cut).await {
        match ev {
            Event::Token {
                id,
                text: t,
                logprobs,
            } => {
                text.push_str(&t);
                ids.push(id);
                lps.push(logprobs);
            }
            Event::Done {
                reason,
                prompt_tokens,
                completion_tokens,
            } => {
                return Ok(Collected {
                    text,
                    ids,
                    logprobs: lps,
                    reason,
                    prompt_tokens,
                    completion_tokens,
                })
            }
            Event::Error(m) if m == SHUTDOWN_MSG => {
                return Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, m))
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
        FinishReason::Stop | FinishReason::StopString => "stop",
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
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(1);
    format!(
        "{prefix}-{:x}{:06x}",
        now(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// SSE stream over engine events; `render` turns each event into zero or more JSON payloads.
/// The stream ends after the request's last event, or with an error event when the server
/// ends running requests; `done_marker` appends OpenAI's `[DONE]` after either.
pub fn sse<F>(
    st: &AppState,
    rx: mpsc::UnboundedReceiver<Event>,
    mut render: F,
    done_marker: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>>
where
    F: FnMut(&Event) -> Vec<Value> + Send + 'static,
{
    let cut = st.cut.subscribe();
    let s = stream::unfold((rx, cut, false), |(mut rx, mut cut, finished)| async move {
        if finished {
            return None;
        }
        let ev = next_event(&mut rx, &mut cut).await?;
        let last = matches!(ev, Event::Done { .. } | Event::Error(_));
        Some((ev, (rx, cut, last)))
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

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens})
}

fn error_chunk(m: &str) -> Value {
    let kind = if m == SHUTDOWN_MSG {
        "service_unavailable"
    } else {
        "server_error"
    };
    json!({"error": {"message": m, "type": kind}})
}

/// Checks and parses an OpenAI request body: top-level fields, `stream_options`, and the
/// fields of each chat message.
fn openai_request<T: for<'de> Deserialize<'de>>(
    body: &Bytes,
    served: &[&str],
) -> Result<T, ApiError> {
    let obj = fields::object(body, served)?;
    fields::nested(&obj, "stream_options", fields::STREAM_OPTIONS)?;
    if let Some(Value::Array(msgs)) = obj.get("messages") {
        for m in msgs {
            if let Value::Object(m) = m {
                fields::check(m, fields::MESSAGE, "message ")?;
            }
        }
    }
    parse(obj)
}

async fn completions(
    State(st): State<Arc<AppState>>,
    h: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    auth(&st, &h)?;
    let mut req: CompletionRequest = openai_request(&body, fields::COMPLETION)?;
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
    let mut job = req.s.job(ids, 16)?;
    job.logprobs = req
        .logprobs
        .map(|n| logprobs::check_top(n, "logprobs"))
        .transpose()?;
    let seed = job.reported_seed();
    let rx = submit(&st, job)?;
    let (id, created, model) = (request_id("cmpl"), now(), st.model_name.clone());
    let head = json!({"id": id, "object": "text_completion", "created": created, "model": model});
    if req.s.stream {
        let llm = llm.clone();
        let mut offset = 0;
        let render = move |ev: &Event| -> Vec<Value> {
            let chunk = |text: &str, fin: Value, lp: Value| {
                let mut c = head.clone();
                c["choices"] =
                    json!([{"index": 0, "text": text, "finish_reason": fin, "logprobs": lp}]);
                c
            };
            match ev {
                Event::Token {
                    text,
                    logprobs: None,
                    ..
                } if text.is_empty() => vec![],
                Event::Token { id, text, logprobs } => {
                    let lp = match logprobs {
                        Some(l) => {
                            let v = logprobs::completion(&llm, &[(*id, l)], offset);
                            offset += logprobs::token_text(&llm, *id).chars().count();
                            v
                        }
                        None => Value::Null,
                    };
                    vec![chunk(text, Value::Null, lp)]
                }
                Event::Done {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                } => {
                    let mut c = chunk("", json!(reason_str(*reason)), Value::Null);
                    c["usage"] = usage(*prompt_tokens, *completion_tokens);
                    c["seed"] = seed.clone();
                    vec![c]
                }
                Event::Error(m) => vec![error_chunk(m)],
            }
        };
        return Ok(sse(&st, rx, render, true).into_response());
    }
    let c = collect(&st, rx).await?;
    let lp = match req.logprobs {
        Some(_) => logprobs::completion(llm, &c.with_logprobs(), 0),
        None => Value::Null,
    };
    let mut out = head;
    out["choices"] = json!([{"index": 0, "text": c.text,
        "finish_reason": reason_str(c.reason), "logprobs": lp}]);
    out["usage"] = usage(c.prompt_tokens, c.completion_tokens);
    out["seed"] = seed;
    Ok(Json(out).into_response())
}

/// The chat prompt's token ids.
fn chat_prompt(llm: &Llm, messages: &[ChatMsgIn]) -> Result<Vec<u32>, ApiError> {
    if messages.is_empty() {
        return Err(bad("messages must not be empty"));
    }
    let mut msgs = Vec::with_capacity(messages.len());
    for m in messages {
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
    llm.tokenizer
        .encode(&text, false, true)
        .map_err(|e| bad(e.to_string()))
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    h: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    auth(&st, &h)?;
    let mut req: ChatRequest = openai_request(&body, fields::CHAT)?;
    let (llm, _) = ready(&st)?;
    let ids = chat_prompt(llm, &req.messages)?;
    let ctx = llm.model.config().context_length as u32;
    let default_max = ctx.saturating_sub(ids.len() as u32).clamp(1, 512);
    let mut job = req.s.job(ids, default_max)?;
    job.logprobs = req.top_logprobs()?;
    let seed = job.reported_seed();
    let rx = submit(&st, job)?;
    let (id, created, model) = (request_id("chatcmpl"), now(), st.model_name.clone());
    let head =
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model});
    if req.s.stream {
        let mut first = true;
        let llm = llm.clone();
        let render = move |ev: &Event| -> Vec<Value> {
            let chunk = |delta: Value, fin: Value| {
                let mut c = head.clone();
                c["choices"] = json!([{"index": 0, "delta": delta, "finish_reason": fin}]);
                c
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
                Event::Token {
                    id,
                    text,
                    logprobs: Some(l),
                } => {
                    let mut c = chunk(json!({"content": text}), Value::Null);
                    c["choices"][0]["logprobs"] = logprobs::chat(&llm, &[(*id, l)]);
                    out.push(c)
                }
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
                    c["usage"] = usage(*prompt_tokens, *completion_tokens);
                    c["seed"] = seed.clone();
                    out.push(c);
                }
                Event::Error(m) => out.push(error_chunk(m)),
            }
            out
        };
        return Ok(sse(&st, rx, render, true).into_response());
    }
    let c = collect(&st, rx).await?;
    let mut out = head;
    out["object"] = json!("chat.completion");
    let lp = match req.logprobs {
        true => logprobs::chat(llm, &c.with_logprobs()),
        false => Value::Null,
    };
    out["choices"] = json!([{"index": 0, "message": {"role": "assistant", "content": c.text},
        "finish_reason": reason_str(c.reason), "logprobs": lp}]);
    out["usage"] = usage(c.prompt_tokens, c.completion_tokens);
    out["seed"] = seed;
    Ok(Json(out).into_response())
}

async fn models(State(st): State<Arc<AppState>>, h: HeaderMap) -> Result<Json<Value>, ApiError> {
    auth(&st, &h)?;
    Ok(Json(
        json!({"object": "list", "data": [{"id": st.model_name, "object": "model", "created": 0, "owned_by": "fastllm"}]}),
    ))
}

async fn info(State(st): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let (llm, engine) = ready(&st)?;
    let c: &EngineConfig = engine.config();
    Ok(Json(json!({
        "model_id": st.model_name, "model_dtype": "mixed", "model_device_type": device_type(&st.device),
        "architecture": llm.model.config().architecture,
        "max_concurrent_requests": c.max_concurrent_requests, "max_input_tokens": c.max_input_tokens,
        "max_total_tokens": c.max_total_tokens, "max_batch_total_tokens": c.max_batch_total_tokens,
        "max_batch_prefill_tokens": c.max_batch_prefill_tokens, "kv_cache_blocks": c.kv_blocks, "kv_block_size": c.block_size,
        "waiting_served_ratio": c.waiting_served_ratio, "max_waiting_tokens": c.max_waiting_tokens,
        "prefix_caching": c.prefix_caching,
        "router": "fastllm", "version": env!("CARGO_PKG_VERSION"),
    })))
}

/// TGI's device type: `cpu` or `cuda`.
fn device_type(device: &str) -> &str {
    device.split(':').next().unwrap_or(device)
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.is_draining() {
        ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down".into(),
        )
        .into_response()
    } else if st.ready.get().is_some() {
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
    let req: TokenizeRequest = parse(fields::object(&body, &["inputs", "add_special_tokens"])?)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Once the server ends running requests, a stream whose request is still running gets
    /// the shutdown error and `[DONE]`, and its receiver is dropped (cancelling the request).
    #[test]
    fn ended_streams_get_an_error_and_done() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let st = AppState::new("m", None);
            let (tx, rx) = mpsc::unbounded_channel();
            tx.send(Event::Token {
                id: 5,
                text: "Hi".into(),
                logprobs: None,
            })
            .unwrap();
            let render = |ev: &Event| match ev {
                Event::Token { text, .. } => vec![json!({ "text": text })],
                Event::Error(m) => vec![error_chunk(m)],
                Event::Done { .. } => vec![json!("done")],
            };
            let resp = sse(&st, rx, render, true).into_response();
            st.end_running();
            let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
                .await
                .unwrap();
            let data: Vec<String> = String::from_utf8_lossy(&body)
                .lines()
                .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
                .collect();
            assert_eq!(data.len(), 3, "{data:?}");
            let err: Value = serde_json::from_str(&data[1]).unwrap();
            assert_eq!(err["error"]["message"], SHUTDOWN_MSG);
            assert_eq!(err["error"]["type"], "service_unavailable");
            assert_eq!(data[2], "[DONE]");
            assert!(tx.is_closed(), "the request is cancelled");
        });
    }
}
