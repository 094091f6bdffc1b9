//! HTTP front end (axum): the router and the state shared by the endpoints — OpenAI
//! `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models` ([`openai`]); TGI
//! `POST /generate`, `POST /generate_stream`, `POST /` ([`tgi`]); the web chat page at `GET /`
//! ([`page`]); `GET /info`, `GET /health`,
//! `GET /metrics`, `POST /tokenize` (here) — and what they share: queueing sequences in the
//! engine, collecting them, and streaming them as Server-Sent Events. Every error is a JSON body
//! in the OpenAI error shape ([`guard`]); bad requests get a 4xx, and a request field this server
//! does not serve is refused by name ([`fields`]); grammars of constrained output are read and
//! compiled by [`constrain`]. A client that disconnects cancels its
//! request; on shutdown, running requests end after the drain timeout ([`crate::shutdown`]).

pub mod constrain;
pub mod fields;
pub mod guard;
pub mod logprobs;
pub mod openai;
pub mod page;
pub mod reasoning;
pub mod tgi;
pub mod tools;

use crate::engine::{Engine, EngineConfig, Event, FinishReason, GenRequest, SubmitError};
use crate::grammar::{Constraint, Grammars};
use crate::metrics::Metrics;
use crate::ServeOptions;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fastllm::generate::{Llm, SamplingParams};
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
    /// The grammar compiler, made on the first constrained request.
    grammars: OnceLock<Result<Arc<Grammars>, String>>,
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
            grammars: OnceLock::new(),
        })
    }
    /// The grammar compiler of the loaded model `llm`.
    pub fn grammars(&self, llm: &Arc<Llm>) -> Result<Arc<Grammars>, String> {
        self.grammars
            .get_or_init(|| Grammars::new(llm.clone()).map(Arc::new))
            .clone()
    }
    /// Installs the loaded model and starts the engine.
    pub fn set_ready(&self, llm: Arc<Llm>, cfg: EngineConfig) -> fastllm::Result<()> {
        let engine = Engine::start(llm.clone(), cfg, self.metrics.clone())?;
        let _ = self.ready.set((llm, engine));
        Ok(())
    }
    /// Stops the engine, if the model is loaded, and waits for its thread ([`Engine::stop`]).
    pub fn stop_engine(&self) {
        if let Some((_, e)) = self.ready.get() {
            e.stop();
        }
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
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/models", get(openai::models))
        .route("/", get(page::chat_page).post(tgi::compat))
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

/// One generation for the engine.
#[derive(Clone)]
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
    /// The grammar every sequence follows (each gets its own copy of the fresh state).
    pub grammar: Option<Constraint>,
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
    let mut rxs = submit_n(st, job, 1)?;
    rxs.pop().ok_or_else(|| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no request queued".into(),
        )
    })
}

/// Queues `n` sequences of `job`, sequence `i` with seed `seed + i`, all or none (429 when
/// they do not all fit); dropping the receivers cancels them.
pub fn submit_n(
    st: &AppState,
    job: Job,
    n: usize,
) -> Result<Vec<mpsc::UnboundedReceiver<Event>>, ApiError> {
    let (_, engine) = ready(st)?;
    if st.is_draining() {
        return Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down".into(),
        ));
    }
    let mut reqs = Vec::with_capacity(n);
    let mut rxs = Vec::with_capacity(n);
    for i in 0..n {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut sampling = job.sampling.clone();
        sampling.seed = job.sampling.seed.wrapping_add(i as u64);
        reqs.push(GenRequest {
            prompt: job.prompt.clone(),
            sampling,
            max_new_tokens: job.max_new,
            stop: job.stop.clone(),
            ignore_eos: job.ignore_eos,
            logprobs: job.logprobs,
            grammar: job.grammar.clone(),
            events: tx,
        });
        rxs.push(rx);
    }
    engine.submit_all(reqs).map_err(|e| match e {
        SubmitError::Overloaded => ApiError(
            StatusCode::TOO_MANY_REQUESTS,
            "too many concurrent requests; retry later".into(),
        ),
        SubmitError::Invalid(m) => ApiError(StatusCode::UNPROCESSABLE_ENTITY, m),
        SubmitError::Stopped => {
            ApiError(StatusCode::SERVICE_UNAVAILABLE, "the engine stopped".into())
        }
    })?;
    Ok(rxs)
}

/// Every choice, finished.
pub async fn collect_all(
    st: &AppState,
    rxs: Vec<mpsc::UnboundedReceiver<Event>>,
) -> Result<Vec<Collected>, ApiError> {
    futures_util::future::try_join_all(rxs.into_iter().map(|rx| collect(st, rx))).await
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
    // once the server ends requests, nothing more of them is passed on
    tokio::select! {
        biased;
        _ = ended => Some(Event::Error(SHUTDOWN_MSG.into())),
        ev = rx.recv() => ev,
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

/// SSE stream over the events of one or more requests (the choices of one answer);
/// `render(i, event)` turns an event of request `i` into zero or more JSON payloads. The stream
/// ends after every request's last event, or with an error event (rendered as request 0's) when
/// the server ends running requests; `done_marker` appends OpenAI's `[DONE]` after either.
/// Dropping the stream cancels the requests still running.
pub fn sse<F>(
    st: &AppState,
    rxs: Vec<mpsc::UnboundedReceiver<Event>>,
    mut render: F,
    done_marker: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>>
where
    F: FnMut(usize, &Event) -> Vec<Value> + Send + 'static,
{
    let n = rxs.len();
    let merged = stream::select_all(rxs.into_iter().enumerate().map(|(i, rx)| {
        Box::pin(stream::unfold(rx, move |mut rx| async move {
            rx.recv().await.map(|ev| ((i, ev), rx))
        }))
    }));
    let cut = st.cut.subscribe();
    let s = stream::unfold(
        (merged, cut, 0usize, false),
        move |(mut merged, mut cut, mut ended, finished)| async move {
            if finished {
                return None;
            }
            let stop = async {
                if cut.wait_for(|c| *c).await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            let (item, last) = tokio::select! {
                biased;
                _ = stop => ((0, Event::Error(SHUTDOWN_MSG.into())), true),
                x = futures_util::StreamExt::next(&mut merged) => {
                    let (i, ev) = x?;
                    ended += usize::from(matches!(ev, Event::Done { .. } | Event::Error(_)));
                    ((i, ev), ended >= n)
                }
            };
            Some(((item, last), (merged, cut, ended, last)))
        },
    );
    let s = futures_util::StreamExt::flat_map(s, move |((i, ev), last)| {
        let mut items: Vec<Result<SseEvent, Infallible>> = render(i, &ev)
            .into_iter()
            .map(|v| Ok(SseEvent::default().data(v.to_string())))
            .collect();
        if done_marker && last {
            items.push(Ok(SseEvent::default().data("[DONE]")));
        }
        stream::iter(items)
    });
    Sse::new(s)
}

async fn info(State(st): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let (llm, engine) = ready(&st)?;
    let c: &EngineConfig = engine.config();
    Ok(Json(json!({
        "model_id": st.model_name, "model_dtype": "mixed", "model_device_type": device_type(&st.device),
        "architecture": llm.model.config().architecture,
        "max_concurrent_requests": c.max_concurrent_requests, "max_input_tokens": c.max_input_tokens,
        "max_total_tokens": c.max_total_tokens, "max_batch_total_tokens": c.max_batch_total_tokens,
        "max_batch_prefill_tokens": c.max_batch_prefill_tokens, "kv_cache_blocks": c.kv_blocks, "kv_block_size": c.block_size, "kv_cache_dtype": c.kv_dtype.name(), "kv_bytes_per_token": c.kv_bytes_per_token,
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
            let render = |_: usize, ev: &Event| match ev {
                Event::Token { text, .. } => vec![json!({ "text": text })],
                Event::Error(m) => vec![openai::error_chunk(m)],
                Event::Done { .. } => vec![json!("done")],
            };
            let resp = sse(&st, vec![rx], render, true).into_response();
            let mut body = resp.into_body().into_data_stream();
            let first = futures_util::StreamExt::next(&mut body)
                .await
                .unwrap()
                .unwrap();
            assert!(String::from_utf8_lossy(&first).contains("\"text\":\"Hi\""));
            // a token generated after the end is not passed on
            tx.send(Event::Token {
                id: 6,
                text: "late".into(),
                logprobs: None,
            })
            .unwrap();
            st.end_running();
            let mut rest = String::new();
            while let Some(b) = futures_util::StreamExt::next(&mut body).await {
                rest.push_str(&String::from_utf8_lossy(&b.unwrap()));
            }
            let mut data = vec![String::from_utf8_lossy(&first).to_string()];
            data.extend(
                rest.lines()
                    .filter_map(|l| l.strip_prefix("data: ").map(str::to_string)),
            );
            assert_eq!(data.len(), 3, "{data:?}");
            let err: Value = serde_json::from_str(&data[1]).unwrap();
            assert_eq!(err["error"]["message"], SHUTDOWN_MSG);
            assert_eq!(err["error"]["type"], "service_unavailable");
            assert_eq!(data[2], "[DONE]");
            assert!(tx.is_closed(), "the request is cancelled");
        });
    }
}
