//! `Llm` (a loaded model + tokenizer + chat template) and `Session` (one sequence and its KV
//! cache): `eval` appends tokens and returns the last logits, `sample` picks the next token,
//! `generate` runs a whole completion (plain or chat, multi-turn) with streaming, stop tokens,
//! stop strings and cancellation; a long prompt can be prefilled in chunks that report their
//! progress ([`Prefill`]).

use super::chat::{self, ChatMessage};
use super::sampler::{Sampler, SamplingParams};
use super::stop::StopStrings;
use crate::data::Data;
use crate::error::{Error, Result};
use crate::model::{KvCache, Model};
use crate::progress::{OnProgress, Progress, Stage};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::sync::{Arc, OnceLock};

/// A model ready for generation.
pub struct Llm {
    /// The network.
    pub model: Model,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Its chat template (ChatML when the model ships none).
    pub chat_template: String,
    /// Display name.
    pub name: String,
}

impl Llm {
    /// End-of-sequence ids: the config's and the tokenizer's.
    pub fn eos_ids(&self) -> Vec<u32> {
        let mut v = self.model.config().eos_ids.clone();
        for &e in self.tokenizer.eos_ids() {
            if !v.contains(&e) {
                v.push(e);
            }
        }
        v
    }

    /// The text of the BOS token and of the first EOS token ("" where the model has none), as
    /// chat templates write them.
    fn bos_eos_text(&self) -> (String, String) {
        let tok = |id: Option<u32>| {
            id.and_then(|i| self.tokenizer.decode(&[i], false).ok())
                .unwrap_or_default()
        };
        (
            tok(self.tokenizer.bos_id()),
            tok(self.eos_ids().first().copied()),
        )
    }

    /// Renders messages with the model's chat template.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let (bos, eos) = self.bos_eos_text();
        chat::render(
            &self.chat_template,
            messages,
            add_generation_prompt,
            &bos,
            &eos,
        )
    }

    /// Renders messages given as JSON objects (with fields such as `tool_calls`), and the tools
    /// offered, with the model's chat template.
    pub fn render_chat_json(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let (bos, eos) = self.bos_eos_text();
        chat::render_json(
            &self.chat_template,
            &chat::ChatContext {
                messages,
                tools,
                add_generation_prompt,
                bos_token: &bos,
                eos_token: &eos,
            },
        )
    }
}

/// Parameters of [`Session::generate`].
#[derive(Clone, Debug)]
pub struct GenerateParams {
    /// Maximum tokens to generate.
    pub max_new_tokens: usize,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Stop strings (not included in the output).
    pub stop: Vec<String>,
    /// Treat the prompt as a user chat message (multi-turn: the session keeps the history).
    pub chat: bool,
    /// System message for chat (used when the history is empty).
    pub system: Option<String>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_new_tokens: 128,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            chat: false,
            system: None,
        }
    }
}

/// How [`Session::generate_with`] prefills the prompt.
pub struct Prefill<'a> {
    /// Prompt tokens per step (0: the whole prompt in one step).
    pub chunk: usize,
    /// Receives the prompt tokens done ([`Stage::Prefill`]), from 0 to all.
    pub progress: OnProgress<'a>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-sequence token.
    Eos,
    /// A stop string.
    StopString,
    /// `max_new_tokens` reached.
    MaxTokens,
    /// The context is full.
    ContextFull,
    /// The callback asked to stop.
    Cancelled,
}

/// The result of [`Session::generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated text (stop string excluded).
    pub text: String,
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Prompt tokens evaluated for this call (after prefix reuse).
    pub prompt_tokens: usize,
    /// Why it ended.
    pub stop_reason: StopReason,
}

/// One sequence over a shared model.
pub struct Session {
    llm: Arc<Llm>,
    cache: KvCache,
    tokens: Vec<u32>,
    logits: Vec<f32>,
    /// Logits of the last generation step where the model left them (the GPU), and their host
    /// copy, made only when asked for.
    dev_logits: Option<Data>,
    dev_host: OnceLock<Vec<f32>>,
    history: Vec<ChatMessage>,
}

impl Session {
    /// A session of up to `max_tokens` tokens (0 = the model's context length).
    pub fn new(llm: Arc<Llm>, max_tokens: usize) -> Result<Session> {
        let cache = llm.model.new_cache(max_tokens)?;
        Ok(Session {
            llm,
            cache,
            tokens: Vec::new(),
            logits: Vec::new(),
            dev_logits: None,
            dev_host: OnceLock::new(),
            history: Vec::new(),
        })
    }

    /// The model.
    pub fn llm(&self) -> &Arc<Llm> {
        &self.llm
    }

    /// Tokens in the sequence.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Maximum tokens.
    pub fn capacity(&self) -> usize {
        self.cache.capacity()
    }

    /// The tokens so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Logits after the last evaluated token (empty before the first `eval`). After
    /// [`Session::generate`], whose steps leave the logits on the model's device, they are
    /// copied to the host on the first call.
    pub fn logits(&self) -> &[f32] {
        match &self.dev_logits {
            Some(d) => self.dev_host.get_or_init(|| {
                d.to_owned_host()
                    .and_then(|h| h.to_f32_vec())
                    .unwrap_or_default()
            }),
            None => &self.logits,
        }
    }

    fn clear_device_logits(&mut self) {
        self.dev_logits = None;
        self.dev_host = OnceLock::new();
    }

    /// Forgets everything (tokens, cache, chat history).
    pub fn reset(&mut self) -> Result<()> {
        self.cache.clear()?;
        self.tokens.clear();
        self.logits.clear();
        self.clear_device_logits();
        self.history.clear();
        Ok(())
    }

    /// Appends `tokens` and returns the logits after the last one. Invalid ids, an empty list,
    /// context overflow or non-finite logits are errors (the session is unchanged on error,
    /// except for context overflow which is detected before anything runs).
    pub fn eval(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        if tokens.is_empty() {
            return Err(Error::invalid("eval: no tokens"));
        }
        self.check_fits(tokens)?;
        let before = self.cache.len();
        let logits = match self.llm.model.forward(&mut self.cache, tokens, false) {
            Ok(l) => l,
            Err(e) => {
                self.cache.truncate(before)?;
                return Err(e);
            }
        };
        let v = logits.to_f32_vec()?;
        if v.iter().any(|x| !x.is_finite() && *x != f32::NEG_INFINITY) {
            self.cache.truncate(before)?;
            return Err(Error::invalid("model produced NaN/Inf logits"));
        }
        self.tokens.extend_from_slice(tokens);
        self.logits = v;
        self.clear_device_logits();
        Ok(&self.logits)
    }

    /// `Err` naming the first id of `tokens` outside the vocabulary, or ([`Error::ContextFull`])
    /// saying that they do not fit the cache.
    fn check_fits(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.llm.model.config().vocab_size;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::invalid(format!(
                "token id {t} out of range (vocabulary {vocab})"
            )));
        }
        let n = tokens.len();
        if self.cache.len() + n > self.cache.capacity() {
            return Err(Error::ContextFull(format!(
                "{} tokens + {n} new exceed the session's {} tokens",
                self.cache.len(),
                self.cache.capacity()
            )));
        }
        Ok(())
    }

    /// [`Session::eval`] in steps of at most `chunk` tokens (0: one step), reporting the tokens
    /// done to `progress` ([`Stage::Prefill`]) from 0 to all. On error the tokens and the cache
    /// are as before and the last logits are dropped.
    pub fn eval_chunked(
        &mut self,
        tokens: &[u32],
        chunk: usize,
        progress: OnProgress,
    ) -> Result<&[f32]> {
        if tokens.is_empty() {
            return Err(Error::invalid("eval: no tokens"));
        }
        self.check_fits(tokens)?;
        let step = if chunk == 0 { tokens.len() } else { chunk };
        let before = self.tokens.len();
        let total = tokens.len() as u64;
        let mut report = |done: usize| {
            progress(&Progress {
                stage: Stage::Prefill,
                done: done as u64,
                total,
                item: "",
            })
        };
        report(0);
        for (i, part) in tokens.chunks(step).enumerate() {
            if let Err(e) = self.eval(part) {
                self.cache.truncate(before)?;
                self.tokens.truncate(before);
                self.logits.clear();
                self.clear_device_logits();
                return Err(e);
            }
            report((i * step + part.len()).min(tokens.len()));
        }
        Ok(&self.logits)
    }

    /// Appends `tok`, runs it, and picks the next token with `sampler` where the logits are:
    /// on a GPU only the chosen id crosses to the host (the same id the host would pick from
    /// the same logits). NaN/+Inf logits are an error; on error the session is unchanged.
    fn eval_and_pick(&mut self, tok: u32, sampler: &mut Sampler) -> Result<u32> {
        self.check_fits(&[tok])?;
        let before = self.cache.len();
        self.tokens.push(tok);
        let row = sampler.next_row(&self.tokens);
        let model = &self.llm.model;
        let r = model
            .forward_device(&mut self.cache, &[tok], false)
            .and_then(|l| {
                let ids = model.sample_rows(&l, std::slice::from_ref(&row))?;
                match ids.first() {
                    Some(&id) => Ok((l, id)),
                    None => Err(Error::invalid("sample: no token returned")),
                }
            });
        match r {
            Ok((l, id)) => {
                self.logits.clear();
                self.clear_device_logits();
                self.dev_logits = Some(l);
                Ok(id)
            }
            Err(e) => {
                self.tokens.pop();
                self.cache.truncate(before)?;
                Err(e)
            }
        }
    }

    /// Makes the sequence equal `target`, reusing the longest cached common prefix; the rest is
    /// prefilled as `prefill` says.
    fn eval_reusing_prefix(&mut self, target: &[u32], prefill: Prefill) -> Result<usize> {
        if target.is_empty() {
            return Err(Error::invalid("empty prompt"));
        }
        let mut p = self
            .tokens
            .iter()
            .zip(target)
            .take_while(|(a, b)| a == b)
            .count();
        if p == target.len() {
            p -= 1; // re-evaluate the last token to get its logits
        }
        if target.len() > self.cache.capacity() {
            return Err(Error::ContextFull(format!(
                "prompt of {} tokens exceeds the context of {}",
                target.len(),
                self.cache.capacity()
            )));
        }
        self.cache.truncate(p)?;
        self.tokens.truncate(p);
        self.eval_chunked(&target[p..], prefill.chunk, prefill.progress)?;
        Ok(target.len() - p)
    }

    /// Appends a message to the chat history without generating (to replay a conversation);
    /// the next chat-mode `generate` renders it with the template.
    pub fn add_message(&mut self, role: &str, content: &str) -> Result<()> {
        if !matches!(role, "system" | "user" | "assistant" | "tool") {
            return Err(Error::invalid(format!(
                "chat role '{role}' (expected system, user, assistant or tool)"
            )));
        }
        self.history.push(ChatMessage::new(role, content));
        Ok(())
    }

    /// Samples the next token from the current logits.
    pub fn sample(&mut self, sampler: &mut Sampler) -> Result<u32> {
        let l = self.logits();
        if l.is_empty() {
            return Err(Error::invalid("sample: evaluate tokens first"));
        }
        sampler.sample(l, &self.tokens)
    }

    /// The whole sequence `generate` needs cached for `prompt`: the chat history with the new
    /// user turn rendered by the template (the history then holds that turn), or the cached
    /// tokens followed by the prompt's.
    fn prompt_ids(&mut self, prompt: &str, params: &GenerateParams) -> Result<Vec<u32>> {
        let llm = self.llm.clone();
        let target: Vec<u32> = if params.chat {
            let mut msgs = self.history.clone();
            if msgs.is_empty() {
                if let Some(s) = &params.system {
                    msgs.push(ChatMessage::new("system", s));
                }
            }
            msgs.push(ChatMessage::new("user", prompt));
            let text = llm.render_chat(&msgs, true)?;
            let ids = llm.tokenizer.encode(&text, false, true)?;
            self.history = msgs;
            ids
        } else {
            if prompt.is_empty() && self.tokens.is_empty() {
                return Err(Error::invalid("empty prompt"));
            }
            let mut ids = self.tokens.clone();
            ids.extend(
                llm.tokenizer
                    .encode(prompt, self.tokens.is_empty(), false)?,
            );
            ids
        };
        if target.is_empty() {
            return Err(Error::invalid("prompt produced no tokens"));
        }
        Ok(target)
    }

    /// Generates a completion of `prompt`. Plain mode continues the session's text; chat mode
    /// adds a user turn to the session's history and renders the chat template. `on_piece`
    /// receives each token and its text (complete UTF-8 only; may be empty); returning false
    /// stops generation.
    pub fn generate(
        &mut self,
        prompt: &str,
        params: &GenerateParams,
        on_piece: &mut dyn FnMut(u32, &str) -> bool,
    ) -> Result<Generation> {
        let prefill = Prefill {
            chunk: 0,
            progress: &mut crate::progress::ignore,
        };
        self.generate_with(prompt, params, prefill, on_piece)
    }

    /// [`Session::generate`], prefilling the prompt as `prefill` says.
    pub fn generate_with(
        &mut self,
        prompt: &str,
        params: &GenerateParams,
        prefill: Prefill,
        on_piece: &mut dyn FnMut(u32, &str) -> bool,
    ) -> Result<Generation> {
        let mut sampler = Sampler::new(params.sampling.clone())?;
        let llm = self.llm.clone();
        let target = self.prompt_ids(prompt, params)?;
        let prompt_tokens = self.eval_reusing_prefix(&target, prefill)?;
        let eos = llm.eos_ids();
        let mut stream = StreamDecoder::new(&llm.tokenizer, true);
        let mut out = Generation {
            text: String::new(),
            tokens: Vec::new(),
            prompt_tokens,
            stop_reason: StopReason::MaxTokens,
        };
        let stops = StopStrings::new(&params.stop);
        let mut emitted = 0usize; // bytes of out.text already passed to on_piece
        let mut last_tok = 0u32;
        // the first token comes from the prompt's host logits; every later step runs the model
        // and the pick together where the logits are (see `eval_and_pick`)
        let mut next: Option<u32> = None;
        for step in 0..params.max_new_tokens {
            let tok = match next.take() {
                Some(t) => t,
                None => self.sample(&mut sampler)?,
            };
            if eos.contains(&tok) {
                out.stop_reason = StopReason::Eos;
                break;
            }
            out.tokens.push(tok);
            last_tok = tok;
            let old_len = out.text.len();
            out.text.push_str(&stream.push(tok)?);
            // stop strings: cut at the first match
            if let Some(cut) = stops.find(&out.text, old_len) {
                out.text.truncate(cut);
                out.stop_reason = StopReason::StopString;
                break;
            }
            // emit what can no longer become part of a stop string
            let safe = stops.safe_len(&out.text);
            if safe > emitted {
                if !on_piece(tok, &out.text[emitted..safe]) {
                    emitted = safe;
                    out.stop_reason = StopReason::Cancelled;
                    break;
                }
                emitted = safe;
            } else if !on_piece(tok, "") {
                out.stop_reason = StopReason::Cancelled;
                break;
            }
            if step + 1 == params.max_new_tokens {
                break;
            }
            if self.len() + 1 > self.capacity() {
                out.stop_reason = StopReason::ContextFull;
                break;
            }
            next = Some(self.eval_and_pick(tok, &mut sampler)?);
        }
        if out.stop_reason != StopReason::StopString && out.stop_reason != StopReason::Cancelled {
            out.text.push_str(&stream.finish());
        }
        if emitted < out.text.len() && out.stop_reason != StopReason::Cancelled {
            on_piece(last_tok, &out.text[emitted..]);
        }
        if params.chat {
            self.history.push(ChatMessage::new("assistant", &out.text));
        }
        Ok(out)
    }
}
