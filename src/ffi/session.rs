//! Sessions through the C ABI: create/free, eval, logits, sample, reset, and streaming generation.

use super::model::{token_slice, FastllmModel};
use super::status::*;
use crate::generate::{GenerateParams, Sampler, SamplingParams, Session, StopReason};
use std::ffi::{c_char, c_void, CString};

/// Opaque session handle: one sequence and its KV cache. Use from one thread at a time.
pub struct FastllmSession {
    session: Session,
    sampler: Option<(SamplingParams, Sampler)>,
}

/// Sampling parameters; defaults from `fastllm_sampling_default()` (greedy).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FastllmSampling {
    /// `sizeof(FastllmSampling)`.
    pub struct_size: u32,
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: i32,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off.
    pub repetition_penalty: f32,
    /// 0 = off.
    pub presence_penalty: f32,
    /// 0 = off.
    pub frequency_penalty: f32,
    /// RNG seed: the same seed gives the same tokens.
    pub seed: u64,
}

/// Greedy sampling defaults.
#[no_mangle]
pub extern "C" fn fastllm_sampling_default() -> FastllmSampling {
    FastllmSampling {
        struct_size: std::mem::size_of::<FastllmSampling>() as u32,
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: 0,
    }
}

fn sampling_params(p: &FastllmSampling) -> Result<SamplingParams, Fail> {
    if p.struct_size as usize != std::mem::size_of::<FastllmSampling>() {
        return Err(invalid(format!(
            "sampling.struct_size is {}, expected {} (use fastllm_sampling_default())",
            p.struct_size,
            std::mem::size_of::<FastllmSampling>()
        )));
    }
    if p.top_k < 0 {
        return Err(invalid(format!("top_k is {} (must be ≥ 0)", p.top_k)));
    }
    let s = SamplingParams {
        temperature: p.temperature,
        top_k: p.top_k as usize,
        top_p: p.top_p,
        min_p: p.min_p,
        repetition_penalty: p.repetition_penalty,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        seed: p.seed,
    };
    s.validate()?;
    Ok(s)
}

/// Creates a session of up to `max_tokens` tokens (0 = the model's context length).
///
/// # Safety
/// `model` NULL or valid; `out` valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_session_new(
    model: *mut FastllmModel,
    max_tokens: u32,
    out: *mut *mut FastllmSession,
) -> FastllmStatus {
    guard(|| {
        let m = model.as_ref().ok_or_else(|| null("model"))?;
        if out.is_null() {
            return Err(null("out"));
        }
        let session = Session::new(m.llm.clone(), max_tokens as usize)?;
        *out = Box::into_raw(Box::new(FastllmSession {
            session,
            sampler: None,
        }));
        Ok(())
    })
}

/// Frees a session. NULL is a no-op.
///
/// # Safety
/// `s` NULL or a handle from `fastllm_session_new` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn fastllm_session_free(s: *mut FastllmSession) {
    if !s.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(Box::from_raw(s))));
    }
}

/// Appends `n` tokens and computes the logits after the last one. Invalid ids give
/// `FASTLLM_ERR_INVALID_ARGUMENT`; too many tokens `FASTLLM_ERR_CONTEXT_FULL` (the session is
/// unchanged on error).
///
/// # Safety
/// `s` NULL or valid; `tokens` valid for `n` ids.
#[no_mangle]
pub unsafe extern "C" fn fastllm_session_eval(
    s: *mut FastllmSession,
    tokens: *const i32,
    n: usize,
) -> FastllmStatus {
    guard(|| {
        let s = s.as_mut().ok_or_else(|| null("session"))?;
        let ids = token_slice(tokens, n)?;
        s.session.eval(&ids)?;
        Ok(())
    })
}

/// The logits after the last evaluated token: `*logits` points at `*n_vocab` floats owned by the
/// session, valid until the next eval, generate, reset or free. Before any eval:
/// `FASTLLM_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// Pointers NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_session_logits(
    s: *const FastllmSession,
    logits: *mut *const f32,
    n_vocab: *mut usize,
) -> FastllmStatus {
    guard(|| {
        let s = s.as_ref().ok_or_else(|| null("session"))?;
        if logits.is_null() {
            return Err(null("logits"));
        }
        if n_vocab.is_null() {
            return Err(null("n_vocab"));
        }
        let l = s.session.logits();
        if l.is_empty() {
            return Err(invalid("no logits yet: evaluate tokens first"));
        }
        *logits = l.as_ptr();
        *n_vocab = l.len();
        Ok(())
    })
}

/// Tokens in the session (0 for NULL).
///
/// # Safety
/// `s` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_session_length(s: *const FastllmSession) -> usize {
    s.as_ref().map(|s| s.session.len()).unwrap_or(0)
}

/// Forgets every token and the chat history.
///
/// # Safety
/// `s` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_session_reset(s: *mut FastllmSession) -> FastllmStatus {
    guard(|| {
        let s = s.as_mut().ok_or_else(|| null("session"))?;
        s.session.reset()?;
        s.sampler = None;
        Ok(())
    })
}

/// Appends a chat message (`role`: system, user, assistant or tool) to the session's history
/// without generating, to replay a conversation before a chat-mode `fastllm_generate`.
///
/// # Safety
/// Pointers NULL or valid NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn fastllm_session_add_message(
    s: *mut FastllmSession,
    role: *const c_char,
    content: *const c_char,
) -> FastllmStatus {
    guard(|| {
        let s = s.as_mut().ok_or_else(|| null("session"))?;
        let role = c_str(role, "role")?;
        let content = c_str(content, "content")?;
        s.session.add_message(role, content)?;
        Ok(())
    })
}

/// Samples the next token from the current logits (does not append it: call
/// `fastllm_session_eval` with it to continue). The RNG state persists across calls while the
/// parameters stay the same. `p` NULL = greedy.
///
/// # Safety
/// Pointers NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_session_sample(
    s: *mut FastllmSession,
    p: *const FastllmSampling,
    token: *mut i32,
) -> FastllmStatus {
    guard(|| {
        let s = s.as_mut().ok_or_else(|| null("session"))?;
        if token.is_null() {
            return Err(null("token"));
        }
        let params = if p.is_null() {
            sampling_params(&fastllm_sampling_default())?
        } else {
            sampling_params(&*p)?
        };
        let reuse = matches!(&s.sampler, Some((old, _)) if *old == params);
        if !reuse {
            s.sampler = Some((params.clone(), Sampler::new(params)?));
        }
        let sampler = match s.sampler.as_mut() {
            Some((_, smp)) => smp,
            None => return Err(invalid("sampler unavailable")),
        };
        let t = s.session.sample(sampler)?;
        *token = t as i32;
        Ok(())
    })
}

/// Called with each generated token and its text (`piece`, `piece_len` bytes of complete UTF-8,
/// not NUL-terminated, possibly empty while a character or stop string is incomplete). Return
/// false to stop.
pub type FastllmTokenCallback = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        token: i32,
        piece: *const c_char,
        piece_len: usize,
    ) -> bool,
>;

/// Generation parameters; defaults from `fastllm_generate_params_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FastllmGenerateParams {
    /// `sizeof(FastllmGenerateParams)`.
    pub struct_size: u32,
    /// Maximum tokens to generate.
    pub max_new_tokens: u32,
    /// Sampling.
    pub sampling: FastllmSampling,
    /// `n_stop` NUL-terminated stop strings (may be NULL when `n_stop` is 0).
    pub stop: *const *const c_char,
    /// Number of stop strings.
    pub n_stop: usize,
    /// Treat the prompt as a user chat turn (the session keeps the conversation).
    pub chat: bool,
    /// System message for chat (NULL = none).
    pub system: *const c_char,
}

/// Default generation parameters: 128 tokens, greedy, plain completion.
#[no_mangle]
pub extern "C" fn fastllm_generate_params_default() -> FastllmGenerateParams {
    FastllmGenerateParams {
        struct_size: std::mem::size_of::<FastllmGenerateParams>() as u32,
        max_new_tokens: 128,
        sampling: fastllm_sampling_default(),
        stop: std::ptr::null(),
        n_stop: 0,
        chat: false,
        system: std::ptr::null(),
    }
}

/// Generates a completion of `prompt` (plain: continues the session's text; chat: adds a user
/// turn), calling `cb` (may be NULL) with each piece. On success, when `out_text` is not NULL,
/// `*out_text` receives the whole generated text, to free with `fastllm_string_free`. When the
/// callback returns false: `FASTLLM_ERR_CANCELLED` (pieces already delivered stay delivered;
/// `out_text` is not written).
///
/// # Safety
/// Pointers NULL or valid; `cb` safe to call with `user_data`.
#[no_mangle]
pub unsafe extern "C" fn fastllm_generate(
    s: *mut FastllmSession,
    prompt: *const c_char,
    p: *const FastllmGenerateParams,
    cb: FastllmTokenCallback,
    user_data: *mut c_void,
    out_text: *mut *mut c_char,
) -> FastllmStatus {
    guard(|| {
        let s = s.as_mut().ok_or_else(|| null("session"))?;
        let prompt = c_str(prompt, "prompt")?;
        let gp = if p.is_null() {
            fastllm_generate_params_default()
        } else {
            *p
        };
        if gp.struct_size as usize != std::mem::size_of::<FastllmGenerateParams>() {
            return Err(invalid(format!(
                "params.struct_size is {}, expected {} (use fastllm_generate_params_default())",
                gp.struct_size,
                std::mem::size_of::<FastllmGenerateParams>()
            )));
        }
        let mut stop = Vec::with_capacity(gp.n_stop);
        if gp.n_stop > 0 {
            if gp.stop.is_null() {
                return Err(null("params.stop"));
            }
            for i in 0..gp.n_stop {
                stop.push(c_str(*gp.stop.add(i), "a stop string")?.to_string());
            }
        }
        let system = if gp.system.is_null() {
            None
        } else {
            Some(c_str(gp.system, "params.system")?.to_string())
        };
        let params = GenerateParams {
            max_new_tokens: gp.max_new_tokens as usize,
            sampling: sampling_params(&gp.sampling)?,
            stop,
            chat: gp.chat,
            system,
        };
        let mut on_piece = |tok: u32, piece: &str| -> bool {
            match cb {
                Some(f) => f(
                    user_data,
                    tok as i32,
                    piece.as_ptr() as *const c_char,
                    piece.len(),
                ),
                None => true,
            }
        };
        let g = s.session.generate(prompt, &params, &mut on_piece)?;
        if g.stop_reason == StopReason::Cancelled {
            return Err(Fail(
                FASTLLM_ERR_CANCELLED,
                "generation stopped by the callback".into(),
            ));
        }
        if !out_text.is_null() {
            let c = CString::new(g.text.replace('\0', "")).map_err(|_| invalid("text with NUL"))?;
            *out_text = c.into_raw();
        }
        Ok(())
    })
}
