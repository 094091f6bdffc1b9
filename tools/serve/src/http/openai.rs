//! OpenAI's API: `POST /v1/completions`, `POST /v1/chat/completions` (both streamed as SSE
//! ending in `data: [DONE]`) and `GET /v1/models`. `n` choices run as `n` sequences, choice `i`
//! with seed `seed + i`; `logprobs` / `top_logprobs` come from the engine ([`super::logprobs`]);
//! the seed used is reported as `seed` (null when greedy); usage counts the prompt once.
//! `response_format` constrains the output ([`super::constrain`]); `tools` and `tool_choice`
//! offer functions whose calls come back as `tool_calls` ([`super::tools`]).

use super::reasoning::{self, Split, ThinkSplitter};
use super::tools::{self, ToolChoice, ToolFormat, ToolStream};
use super::{
    auth, bad, collect_all, constrain, fields, logprobs, parse, ready, sse, submit_n, ApiError,
    AppState, Collected, Job, SHUTDOWN_MSG,
};
use crate::engine::{Event, FinishReason};
use crate::grammar::GrammarSpec;
use crate::seed::seed_or_fresh;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use fastllm::generate::{Llm, SamplingParams};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

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

/// Most choices one request may ask for.
pub const MAX_N: usize = 16;

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
    /// Constrained output (`json_object`, `json_schema`).
    response_format: Option<Value>,
}

impl OaSampling {
    /// How many choices the request asks for.
    fn choices(&self) -> Result<usize, ApiError> {
        match self.n.unwrap_or(1) {
            0 => Err(bad("n must be at least 1")),
            n if n as usize > MAX_N => Err(bad(format!("n must be at most {MAX_N}, got {n}"))),
            n => Ok(n as usize),
        }
    }

    /// The engine job for `prompt`; a request without a seed gets a fresh one.
    fn job(&mut self, prompt: Vec<u32>, default_max: u32) -> Result<Job, ApiError> {
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
            grammar: None,
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
    messages: Vec<Value>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<u32>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    /// False: at most one tool call per answer.
    parallel_tool_calls: Option<bool>,
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

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens})
}

/// An error event of an OpenAI stream.
pub fn error_chunk(m: &str) -> Value {
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

/// Usage of finished choices: the prompt counted once.
fn usage_of(cs: &[Collected]) -> Value {
    let prompt = cs.first().map_or(0, |c| c.prompt_tokens);
    usage(prompt, cs.iter().map(|c| c.completion_tokens).sum())
}

/// Streams' bookkeeping of finished choices: the last one carries usage and seed.
struct Finished {
    n: usize,
    done: usize,
    generated: usize,
    seed: Value,
}

impl Finished {
    /// Records a finished choice; adds usage and seed to `chunk` when it was the last.
    fn finish(&mut self, chunk: &mut Value, prompt_tokens: usize, completion_tokens: usize) {
        self.done += 1;
        self.generated += completion_tokens;
        if self.done == self.n {
            chunk["usage"] = usage(prompt_tokens, self.generated);
            chunk["seed"] = self.seed.clone();
        }
    }
}

/// Renders a completions stream's events: one chunk per token (with its log-probabilities),
/// a finishing chunk per choice, usage and seed on the last.
fn completion_chunks(
    llm: Arc<Llm>,
    head: Value,
    n: usize,
    seed: Value,
) -> impl FnMut(usize, &Event) -> Vec<Value> + Send + 'static {
    let mut offsets = vec![0; n];
    let mut fin = Finished {
        n,
        done: 0,
        generated: 0,
        seed,
    };
    move |i: usize, ev: &Event| -> Vec<Value> {
        let chunk = |text: &str, reason: Value, lp: Value| {
            let mut c = head.clone();
            c["choices"] =
                json!([{"index": i, "text": text, "finish_reason": reason, "logprobs": lp}]);
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
                        let v = logprobs::completion(&llm, &[(*id, l)], offsets[i]);
                        offsets[i] += logprobs::token_text(&llm, *id).chars().count();
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
                fin.finish(&mut c, *prompt_tokens, *completion_tokens);
                vec![c]
            }
            Event::Error(m) => vec![error_chunk(m)],
        }
    }
}

/// `POST /v1/completions`.
pub async fn completions(
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
    let n = req.s.choices()?;
    let spec = constrain::response_format(req.s.response_format.as_ref())?;
    let mut job = req.s.job(ids, 16)?;
    job.grammar = constrain::compile_opt(&st, llm, spec, "response_format")?;
    job.logprobs = req
        .logprobs
        .map(|k| logprobs::check_top(k, "logprobs"))
        .transpose()?;
    let seed = job.reported_seed();
    let rxs = submit_n(&st, job, n)?;
    let (id, created, model) = (request_id("cmpl"), now(), st.model_name.clone());
    let head = json!({"id": id, "object": "text_completion", "created": created, "model": model});
    if req.s.stream {
        let render = completion_chunks(llm.clone(), head, n, seed);
        return Ok(sse(&st, rxs, render, true).into_response());
    }
    let cs = collect_all(&st, rxs).await?;
    let choices: Vec<Value> = cs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lp = match req.logprobs {
                Some(_) => logprobs::completion(llm, &c.with_logprobs(), 0),
                None => Value::Null,
            };
            json!({"index": i, "text": c.text, "finish_reason": reason_str(c.reason),
                   "logprobs": lp})
        })
        .collect();
    let mut out = head;
    out["choices"] = json!(choices);
    out["usage"] = usage_of(&cs);
    out["seed"] = seed;
    Ok(Json(out).into_response())
}

/// The tool calling of a chat request: the offered tools (None: off), how calls are written.
struct ToolUse {
    format: ToolFormat,
    /// At most one call per answer.
    single: bool,
}

/// A chat message as the template gets it: a known role (`developer` as `system`), the
/// content as text, and the tool fields passed through.
fn template_message(m: &Value) -> Result<Value, ApiError> {
    let role = m
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("every message needs a string 'role'"))?;
    if !matches!(role, "system" | "user" | "assistant" | "tool" | "developer") {
        return Err(bad(format!("unknown role '{role}'")));
    }
    let role = if role == "developer" { "system" } else { role };
    let content = content_text(m.get("content").unwrap_or(&Value::Null))?;
    let mut out = json!({"role": role, "content": content});
    for k in ["tool_calls", "tool_call_id", "name"] {
        if let Some(v) = m.get(k).filter(|v| !v.is_null()) {
            out[k] = v.clone();
        }
    }
    Ok(out)
}

/// The chat prompt's token ids, and whether it ends by opening `<think>`. With `tools`, they
/// go through the template (or, for a template that knows none, a system message).
fn chat_prompt(
    llm: &Llm,
    messages: &[Value],
    tools: Option<&Value>,
) -> Result<(Vec<u32>, bool), ApiError> {
    if messages.is_empty() {
        return Err(bad("messages must not be empty"));
    }
    let msgs: Vec<Value> = messages
        .iter()
        .map(template_message)
        .collect::<Result<_, _>>()?;
    let (format, knows_tools) = ToolFormat::of_template(&llm.chat_template);
    let (mut msgs, tools) = match tools {
        Some(t) if !knows_tools => {
            tools::parse_tools(Some(t))?;
            let desc = tools::describe_tools(t);
            (tools::template_messages(&msgs, Some(desc)), None)
        }
        t => (tools::template_messages(&msgs, None), t),
    };
    if format == ToolFormat::Mistral {
        tools::mistral_ids(&mut msgs);
    }
    let text = llm
        .render_chat_json(&msgs, tools, true)
        .map_err(|e| bad(e.to_string()))?;
    let ids = llm
        .tokenizer
        .encode(&text, false, true)
        .map_err(|e| bad(e.to_string()))?;
    Ok((ids, reasoning::opens_thinking(&text)))
}

/// The deltas of one piece of a chat answer: reasoning and content (split when `splitter`),
/// the token's log-probabilities on the first, an empty content delta when only they are new.
fn chat_deltas(
    splitter: Option<&mut ThinkSplitter>,
    calls: Option<&mut ToolStream>,
    text: &str,
    lp: Option<Value>,
) -> Vec<Value> {
    let mut split = match splitter {
        Some(s) => s.push(text),
        None => Split {
            reasoning: String::new(),
            content: text.to_string(),
        },
    };
    if let Some(c) = calls {
        split.content = c.push(&split.content);
    }
    delta_values(split, lp)
}

fn delta_values(split: Split, lp: Option<Value>) -> Vec<Value> {
    let mut out = Vec::new();
    if !split.reasoning.is_empty() {
        out.push(json!({"reasoning_content": split.reasoning}));
    }
    if !split.content.is_empty() || (out.is_empty() && lp.is_some()) {
        out.push(json!({"content": split.content}));
    }
    match lp {
        Some(lp) => out
            .into_iter()
            .enumerate()
            .map(|(k, d)| json!({"delta": d, "logprobs": if k == 0 { lp.clone() } else { Value::Null }}))
            .collect(),
        None => out.into_iter().map(|d| json!({"delta": d})).collect(),
    }
}

/// The deltas that end a choice's stream of tool calls: the content left over, then the calls
/// (one at most for a single-call `tool_choice`), ids starting with `prefix`; `true` when it
/// made calls.
fn final_tool_deltas(c: &mut ToolStream, t: &ToolUse, prefix: &str) -> (Vec<Value>, bool) {
    let (rest, mut calls) = c.finish();
    if t.single {
        calls.truncate(1);
    }
    let mut out = Vec::new();
    if !rest.is_empty() {
        out.push(json!({ "content": rest }));
    }
    out.extend(tools::call_deltas(&calls, prefix));
    (out, !calls.is_empty())
}

/// Renders a chat stream's events: each choice opens with its role, then its reasoning and
/// content deltas (`think`: split `<think>` reasoning, the prompt having opened the tag or not)
/// with the tokens' log-probabilities, a finishing chunk per choice, usage and seed on the last.
fn chat_chunks(
    llm: Arc<Llm>,
    head: Value,
    n: usize,
    seed: Value,
    think: Option<bool>,
    tool_use: Option<ToolUse>,
) -> impl FnMut(usize, &Event) -> Vec<Value> + Send + 'static {
    let mut splitters: Vec<Option<ThinkSplitter>> =
        (0..n).map(|_| think.map(ThinkSplitter::new)).collect();
    let mut callers: Vec<Option<ToolStream>> = (0..n)
        .map(|_| tool_use.as_ref().map(|t| ToolStream::new(t.format)))
        .collect();
    let id = head["id"].as_str().unwrap_or("").to_string();
    let mut first = vec![true; n];
    let mut fin = Finished {
        n,
        done: 0,
        generated: 0,
        seed,
    };
    move |i: usize, ev: &Event| -> Vec<Value> {
        let chunk = |delta: Value, reason: Value| {
            let mut c = head.clone();
            c["choices"] = json!([{"index": i, "delta": delta, "finish_reason": reason}]);
            c
        };
        let mut out = Vec::new();
        if std::mem::take(&mut first[i]) {
            out.push(chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            ));
        }
        let with = |d: Value| {
            let mut c = chunk(d["delta"].clone(), Value::Null);
            if let Some(lp) = d.get("logprobs") {
                c["choices"][0]["logprobs"] = lp.clone();
            }
            c
        };
        match ev {
            Event::Token { id, text, logprobs } => {
                let lp = logprobs.as_ref().map(|l| logprobs::chat(&llm, &[(*id, l)]));
                let deltas = chat_deltas(splitters[i].as_mut(), callers[i].as_mut(), text, lp);
                out.extend(deltas.into_iter().map(with));
            }
            Event::Done {
                reason,
                prompt_tokens,
                completion_tokens,
            } => {
                if let Some(s) = splitters[i].as_mut() {
                    let mut split = s.finish();
                    if let Some(c) = callers[i].as_mut() {
                        split.content = c.push(&split.content);
                    }
                    out.extend(delta_values(split, None).into_iter().map(with));
                }
                let mut reason = json!(reason_str(*reason));
                if let (Some(c), Some(t)) = (callers[i].as_mut(), tool_use.as_ref()) {
                    let (deltas, called) = final_tool_deltas(c, t, &format!("{id}_{i}"));
                    out.extend(deltas.into_iter().map(|d| chunk(d, Value::Null)));
                    if called {
                        reason = json!("tool_calls");
                    }
                }
                let mut c = chunk(json!({}), reason);
                fin.finish(&mut c, *prompt_tokens, *completion_tokens);
                out.push(c);
            }
            Event::Error(m) => out.push(error_chunk(m)),
        }
        out
    }
}

/// The assistant message of a whole answer, its `<think>` reasoning split off when `think`;
/// with `tool_use`, its tool calls parsed out (then the finish reason is `tool_calls`).
fn chat_message(
    text: &str,
    think: Option<bool>,
    tool_use: Option<&ToolUse>,
    id: &str,
) -> (Value, Option<&'static str>) {
    let s = match think {
        Some(opened) => reasoning::split_all(text, opened),
        None => Split {
            reasoning: String::new(),
            content: text.to_string(),
        },
    };
    let mut m = json!({"role": "assistant", "content": s.content});
    if !s.reasoning.is_empty() {
        m["reasoning_content"] = json!(s.reasoning);
    }
    let Some(t) = tool_use else {
        return (m, None);
    };
    let (content, mut calls) = tools::parse_calls(t.format, &s.content);
    if t.single {
        calls.truncate(1);
    }
    if calls.is_empty() {
        return (m, None);
    }
    m["content"] = if content.is_empty() {
        Value::Null
    } else {
        json!(content)
    };
    m["tool_calls"] = tools::openai_calls(&calls, id);
    (m, Some("tool_calls"))
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(st): State<Arc<AppState>>,
    h: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    auth(&st, &h)?;
    let mut req: ChatRequest = openai_request(&body, fields::CHAT)?;
    let (llm, _) = ready(&st)?;
    let offered = tools::parse_tools(req.tools.as_ref())?;
    let choice = tools::parse_choice(req.tool_choice.as_ref(), &offered)?;
    let (format, _) = ToolFormat::of_template(&llm.chat_template);
    let tool_use = (choice != ToolChoice::None).then_some(ToolUse {
        format,
        single: req.parallel_tool_calls == Some(false),
    });
    let tools_value = req.tools.as_ref().filter(|_| tool_use.is_some());
    let (ids, opened) = chat_prompt(llm, &req.messages, tools_value)?;
    let think = reasoning::model_thinks(llm).then_some(opened);
    let ctx = llm.model.config().context_length as u32;
    let default_max = ctx.saturating_sub(ids.len() as u32).clamp(1, 512);
    let n = req.s.choices()?;
    let mut spec = constrain::response_format(req.s.response_format.as_ref())?;
    let single = tool_use.as_ref().is_some_and(|t| t.single);
    if let Some(g) = tools::grammar(format, &offered, &choice, single) {
        if spec.is_some() {
            return Err(bad(
                "response_format cannot be combined with a tool_choice that forces a call",
            ));
        }
        spec = Some(g);
    }
    let field = match spec {
        Some(GrammarSpec::Lark(_)) => "tool_choice",
        _ => "response_format",
    };
    let mut job = req.s.job(ids, default_max)?;
    job.logprobs = req.top_logprobs()?;
    job.grammar = constrain::compile_opt(&st, llm, spec, field)?;
    let seed = job.reported_seed();
    let rxs = submit_n(&st, job, n)?;
    let (id, created, model) = (request_id("chatcmpl"), now(), st.model_name.clone());
    let head =
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model});
    if req.s.stream {
        let render = chat_chunks(llm.clone(), head, n, seed, think, tool_use);
        return Ok(sse(&st, rxs, render, true).into_response());
    }
    let cs = collect_all(&st, rxs).await?;
    let choices: Vec<Value> = cs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lp = match req.logprobs {
                true => logprobs::chat(llm, &c.with_logprobs()),
                false => Value::Null,
            };
            let (message, tool_reason) =
                chat_message(&c.text, think, tool_use.as_ref(), &format!("{id}_{i}"));
            json!({"index": i, "message": message,
                   "finish_reason": tool_reason.unwrap_or(reason_str(c.reason)), "logprobs": lp})
        })
        .collect();
    let mut out = head;
    out["object"] = json!("chat.completion");
    out["choices"] = json!(choices);
    out["usage"] = usage_of(&cs);
    out["seed"] = seed;
    Ok(Json(out).into_response())
}

/// `GET /v1/models`.
pub async fn models(
    State(st): State<Arc<AppState>>,
    h: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    auth(&st, &h)?;
    Ok(Json(
        json!({"object": "list", "data": [{"id": st.model_name, "object": "model", "created": 0, "owned_by": "fastllm"}]}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastllm::load::{load, LoadOptions};
    use std::path::Path;

    fn tiny() -> Arc<Llm> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/tiny/qwen2");
        let out =
            std::env::temp_dir().join(format!("fastllm-openai-test-{}.flm", std::process::id()));
        fastllm::convert::convert(&dir, &out, &Default::default(), &mut |_| {}).unwrap();
        let llm = load(&out, &LoadOptions::default()).unwrap();
        let _ = std::fs::remove_file(&out);
        Arc::new(llm)
    }

    fn token(text: &str) -> Event {
        Event::Token {
            id: 5,
            text: text.into(),
            logprobs: None,
        }
    }

    /// A thinking model's stream: reasoning deltas, then content deltas, tags split across
    /// tokens removed; without `think` the text passes as content.
    #[test]
    fn chat_streams_split_reasoning_from_content() {
        let llm = tiny();
        let events = [
            token("<thi"),
            token("nk>\nFirst, "),
            token("add.</th"),
            token("ink>\n\nIt is"),
            token(" 4."),
            Event::Done {
                reason: FinishReason::Stop,
                prompt_tokens: 3,
                completion_tokens: 5,
            },
        ];
        let run = |think: Option<bool>| {
            let mut render = chat_chunks(llm.clone(), json!({}), 1, Value::Null, think, None);
            let chunks: Vec<Value> = events.iter().flat_map(|e| render(0, e)).collect();
            let field = |k: &str| -> String {
                chunks
                    .iter()
                    .filter_map(|c| c["choices"][0]["delta"][k].as_str())
                    .collect()
            };
            (field("reasoning_content"), field("content"))
        };
        assert_eq!(run(Some(false)), ("First, add.".into(), "It is 4.".into()));
        let plain = "<think>\nFirst, add.</think>\n\nIt is 4.";
        assert_eq!(run(None), (String::new(), plain.into()));
        // whole answers
        let m = chat_message(plain, Some(false), None, "x").0;
        assert_eq!(m["reasoning_content"], "First, add.");
        assert_eq!(m["content"], "It is 4.");
        let m = chat_message("the prompt opened it</think>ok", Some(true), None, "x").0;
        assert_eq!(
            (m["reasoning_content"].as_str(), m["content"].as_str()),
            (Some("the prompt opened it"), Some("ok"))
        );
        let m = chat_message(plain, None, None, "x").0;
        assert!(m.get("reasoning_content").is_none());
        assert_eq!(m["content"], plain);
        // the tiny model has no </think> token: its answers are never split
        assert!(!reasoning::model_thinks(&llm));
    }
}
