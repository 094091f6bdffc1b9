//! TGI's API: `POST /generate` (one JSON answer), `POST /generate_stream` (SSE, one event per
//! token, the last with the full text and details), and `POST /`, TGI's compatibility route,
//! which answers like `/generate` (wrapped in a one-element list) or, when `stream` is true,
//! like `/generate_stream`. Every token carries its log-probability (computed on the logits'
//! device, see [`super::logprobs`]); `details` lists the generated tokens, and `top_n_tokens`
//! adds the most likely tokens of each position. `best_of` (sampled, not streamed) runs that
//! many sequences (sequence `i` with seed `seed + i`) and answers with the one of the highest
//! log-probability sum, the others in `details.best_of_sequences`.

use super::logprobs::{check_top, tgi_token as token, tgi_top, token_text};
use super::openai::MAX_N;
use super::{
    auth, bad, collect_all, constrain, fields, parse, ready, sse, submit_n, ApiError, AppState,
    Collected, Job,
};
use crate::engine::{Event, FinishReason};
use crate::seed::seed_or_fresh;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use fastllm::generate::SamplingParams;
use fastllm::model::PickLogprobs;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

#[derive(Deserialize)]
struct TgiRequest {
    inputs: String,
    #[serde(default)]
    parameters: Option<TgiParams>,
    #[serde(default)]
    stream: bool,
}

#[derive(Deserialize, Default)]
struct TgiParams {
    max_new_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    seed: Option<u64>,
    repetition_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    do_sample: Option<bool>,
    stop: Option<Vec<String>>,
    details: Option<bool>,
    return_full_text: Option<bool>,
    truncate: Option<usize>,
    top_n_tokens: Option<u32>,
    best_of: Option<u32>,
    grammar: Option<Value>,
}

/// A checked TGI request, queued.
struct Queued {
    /// One receiver per sequence (`best_of` of them).
    rxs: Vec<mpsc::UnboundedReceiver<Event>>,
    /// The first sequence's seed (null when greedy).
    seed: Value,
    details: bool,
    /// Most likely tokens listed per position.
    top_n: usize,
    /// Text put before the generated text (the inputs with `return_full_text`).
    prefix: String,
}

/// Parses and checks a TGI body; `stream_field` allows the top-level `stream` of `POST /`.
fn request(body: &Bytes, stream_field: bool) -> Result<TgiRequest, ApiError> {
    let top: &[&str] = if stream_field {
        &["inputs", "parameters", "stream"]
    } else {
        fields::TGI
    };
    let obj = fields::object(body, top)?;
    fields::nested(&obj, "parameters", fields::TGI_PARAMS)?;
    parse(obj)
}

/// The sampling of TGI parameters: greedy unless `do_sample` or a sampling knob is set.
fn sampling(p: &TgiParams) -> Result<SamplingParams, ApiError> {
    let sampled = p.do_sample == Some(true)
        || p.temperature.is_some_and(|t| t > 0.0)
        || p.top_k.is_some()
        || p.top_p.is_some();
    let s = SamplingParams {
        temperature: if sampled {
            p.temperature.unwrap_or(1.0)
        } else {
            0.0
        },
        top_k: p.top_k.unwrap_or(0) as usize,
        top_p: p.top_p.unwrap_or(1.0),
        repetition_penalty: p.repetition_penalty.unwrap_or(1.0),
        frequency_penalty: p.frequency_penalty.unwrap_or(0.0),
        seed: seed_or_fresh(p.seed),
        ..Default::default()
    };
    s.validate().map_err(|e| bad(e.to_string()))?;
    Ok(s)
}

/// The number of sequences of `best_of`, checked.
fn best_of(p: &TgiParams, sampled: bool, streamed: bool) -> Result<usize, ApiError> {
    match p.best_of.unwrap_or(1) {
        0 => Err(bad("best_of must be at least 1")),
        1 => Ok(1),
        n if n as usize > MAX_N => Err(bad(format!("best_of must be at most {MAX_N}, got {n}"))),
        _ if !sampled => Err(bad(
            "best_of > 1 needs sampling (do_sample, or temperature, top_k or top_p)",
        )),
        _ if streamed => Err(bad("best_of > 1 cannot be streamed")),
        n => Ok(n as usize),
    }
}

fn queue(st: &AppState, req: TgiRequest, streamed: bool) -> Result<Queued, ApiError> {
    let (llm, _) = ready(st)?;
    let p = req.parameters.unwrap_or_default();
    let mut ids = llm
        .tokenizer
        .encode(&req.inputs, true, false)
        .map_err(|e| bad(e.to_string()))?;
    match p.truncate {
        Some(0) => return Err(bad("truncate must be at least 1")),
        Some(t) if ids.len() > t => {
            ids.drain(..ids.len() - t);
        }
        _ => {}
    }
    let max_new = p.max_new_tokens.unwrap_or(20);
    if max_new == 0 {
        return Err(bad("max_new_tokens must be at least 1"));
    }
    let top_n = check_top(p.top_n_tokens.unwrap_or(0), "top_n_tokens")?;
    let sampling = sampling(&p)?;
    let n = best_of(&p, sampling.temperature > 0.0, streamed)?;
    let spec = constrain::tgi_grammar(p.grammar.as_ref())?;
    let job = Job {
        prompt: ids,
        sampling,
        max_new: max_new as usize,
        stop: p.stop.clone().unwrap_or_default(),
        ignore_eos: false,
        logprobs: Some(top_n),
        grammar: constrain::compile_opt(st, llm, spec, "grammar")?,
    };
    let seed = job.reported_seed();
    let prefix = if p.return_full_text == Some(true) {
        req.inputs
    } else {
        String::new()
    };
    Ok(Queued {
        rxs: submit_n(st, job, n)?,
        seed,
        details: p.details == Some(true),
        top_n,
        prefix,
    })
}

fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "eos_token",
        FinishReason::StopString => "stop_sequence",
        FinishReason::Length => "length",
    }
}

/// The log-probability sum of a sequence's tokens.
fn logprob_sum(c: &Collected) -> f64 {
    c.with_logprobs()
        .iter()
        .map(|(_, l)| l.logprob as f64)
        .sum()
}

/// A sequence's details: finish reason, token count, seed, tokens (and top tokens).
fn sequence_details(st: &AppState, c: &Collected, seed: Value, top_n: usize) -> Value {
    let Some((llm, _)) = st.ready.get() else {
        return Value::Null;
    };
    let lps = c.with_logprobs();
    let tokens: Vec<Value> = lps
        .iter()
        .map(|&(i, l)| token(llm, i, &token_text(llm, i), Some(l.logprob)))
        .collect();
    let mut d = json!({"finish_reason": finish_reason(c.reason),
        "generated_tokens": c.completion_tokens, "seed": seed, "prefill": [], "tokens": tokens});
    if top_n > 0 {
        d["top_tokens"] = lps.iter().map(|&(_, l)| tgi_top(llm, l)).collect();
    }
    d
}

/// `/generate`'s answer: the sequence of the highest log-probability sum (the only one
/// without `best_of`).
async fn answer(st: &AppState, q: Queued) -> Result<Value, ApiError> {
    let cs = collect_all(st, q.rxs).await?;
    let best = (0..cs.len())
        .max_by(|&a, &b| {
            logprob_sum(&cs[a])
                .total_cmp(&logprob_sum(&cs[b]))
                .then(b.cmp(&a))
        })
        .unwrap_or(0);
    let seed_of = |i: usize| match q.seed.as_u64() {
        Some(s) => json!(s.wrapping_add(i as u64)),
        None => Value::Null,
    };
    let c = &cs[best];
    let mut out = json!({"generated_text": format!("{}{}", q.prefix, c.text)});
    if q.details {
        out["details"] = sequence_details(st, c, seed_of(best), q.top_n);
        if cs.len() > 1 {
            let others: Vec<Value> = (0..cs.len())
                .filter(|&i| i != best)
                .map(|i| {
                    let mut d = sequence_details(st, &cs[i], seed_of(i), q.top_n);
                    d["generated_text"] = json!(format!("{}{}", q.prefix, cs[i].text));
                    d
                })
                .collect();
            out["details"]["best_of_sequences"] = json!(others);
        }
    }
    Ok(out)
}

/// A streamed token: id, the text it completes, its log-probabilities.
type Streamed = (u32, String, Option<PickLogprobs>);

/// `/generate_stream`'s answer: each token is sent when the next one arrives, so that the last
/// one can carry the full text and the details.
fn stream(st: &AppState, q: Queued) -> Result<Response, ApiError> {
    let (llm, _) = ready(st)?;
    let llm = llm.clone();
    let mut text = q.prefix;
    let (seed, top_n) = (q.seed, q.top_n);
    let mut last: Option<Streamed> = None;
    let render = move |_: usize, ev: &Event| -> Vec<Value> {
        let tok = |(id, t, lp): Streamed, gen: Value, details: Value| {
            let logprob = lp.as_ref().map(|l| l.logprob);
            let mut v = json!({"token": token(&llm, id, &t, logprob),
                "generated_text": gen, "details": details});
            if let (Some(l), true) = (&lp, top_n > 0) {
                v["top_tokens"] = tgi_top(&llm, l);
            }
            v
        };
        match ev {
            Event::Token {
                id,
                text: t,
                logprobs,
            } => {
                text.push_str(t);
                let out = last
                    .take()
                    .map(|l| vec![tok(l, Value::Null, Value::Null)])
                    .unwrap_or_default();
                last = Some((*id, t.clone(), logprobs.clone()));
                out
            }
            Event::Done {
                reason,
                completion_tokens,
                ..
            } => {
                let details = json!({"finish_reason": finish_reason(*reason),
                    "generated_tokens": completion_tokens, "seed": seed});
                match last.take() {
                    Some(l) => vec![tok(l, json!(text), details)],
                    // finished before any token (end-of-sequence first): no token to carry
                    // the details, so they come alone
                    None => vec![json!({"token": null, "generated_text": text,
                        "details": details})],
                }
            }
            Event::Error(m) => vec![json!({"error": m, "error_type": "generation"})],
        }
    };
    Ok(sse(st, q.rxs, render, false).into_response())
}

/// `POST /generate`.
pub async fn generate(
    State(st): State<Arc<AppState>>,
    h: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    auth(&st, &h)?;
    let q = queue(&st, request(&body, false)?, false)?;
    Ok(Json(answer(&st, q).await?))
}

/// `POST /generate_stream`.
pub async fn generate_stream(
    State(st): State<Arc<AppState>>,
    h: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    auth(&st, &h)?;
    let q = queue(&st, request(&body, false)?, true)?;
    stream(&st, q)
}

/// `POST /`: like `/generate_stream` when `stream` is true, else like `/generate` with the
/// answer in a one-element list.
pub async fn compat(
    State(st): State<Arc<AppState>>,
    h: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    auth(&st, &h)?;
    let req = request(&body, true)?;
    let streamed = req.stream;
    let q = queue(&st, req, streamed)?;
    if streamed {
        return stream(&st, q);
    }
    Ok(Json(json!([answer(&st, q).await?])).into_response())
}
