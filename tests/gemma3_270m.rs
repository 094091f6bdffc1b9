//! Gemma 3 270M (the Q4_K_M GGUF named by `FASTLLM_GEMMA3_GGUF`, which `scripts/test-all.sh`
//! fetches with `fastllm fetch gemma3-270m`; skipped with a message when it is not set) against
//! the float64 reference of `../shared/fixtures/logits_gemma3/`:
//!
//! * converted `lossless` (Q8_0 and K-quant blocks kept, the Q5_0 ones dequantized to f32, so
//!   every weight has the reference's value), `exact` precision: the reference's 16 greedy
//!   tokens for every prompt, and max |Δlogit| ≤ 2e-3 on the last prompt position;
//! * converted `keep` (the blocks without a `.flm` form re-quantized to Q8_0), `fast` precision:
//!   at least llama.cpp's 63 of the 64 reference tokens (each predicted from the reference's
//!   own preceding tokens), and the mean KL over the last-position distributions printed;
//! * the GGUF's tokenizer gives the reference's prompt ids, and a chat prompt in Gemma's turn
//!   format (the file has no template of its own) has its markers as single tokens.

mod common;

use common::gemma3::{gguf, model, report, stats};
use fastllm::generate::Llm;
use fastllm::model::Precision;

#[test]
fn gemma3_270m_exact_matches_reference() {
    let Some(gguf) = gguf() else { return };
    let (llm, file) = model(&gguf, "lossless", "cpu", Precision::Exact);
    let s = stats(&llm);
    report("lossless exact", &llm, file, &s);
    assert!(s.worst <= 2e-3, "max |logit - ref| {} > 2e-3", s.worst);
    assert_eq!(
        s.greedy, s.total,
        "exact: greedy tokens differ from the reference"
    );
}

#[test]
fn gemma3_270m_fast_at_least_as_faithful_as_llama_cpp() {
    let Some(gguf) = gguf() else { return };
    let (llm, file) = model(&gguf, "keep", "cpu", Precision::Fast);
    let s = stats(&llm);
    report("keep fast", &llm, file, &s);
    // llama.cpp (CPU, same file) reproduces 63 of the 64 reference tokens
    assert!(
        s.forced >= 63,
        "fast: {} of {} reference tokens",
        s.forced,
        s.total
    );
    assert!(s.kl <= 8e-3, "fast: mean KL {} > 8e-3", s.kl);
    chat_prompt(&llm);
}

/// The file ships no chat template: Gemma's turn format is used, its markers are single tokens
/// and the prompt starts with one BOS.
fn chat_prompt(llm: &Llm) {
    use fastllm::generate::chat::{ChatMessage, GEMMA};
    assert_eq!(llm.chat_template, GEMMA);
    let text = llm
        .render_chat(&[ChatMessage::new("user", "Hi")], true)
        .unwrap();
    let ids = llm.tokenizer.encode(&text, false, true).unwrap();
    let start = llm.tokenizer.token_id("<start_of_turn>").unwrap();
    let end = llm.tokenizer.token_id("<end_of_turn>").unwrap();
    assert_eq!(ids.first(), Some(&2), "{text:?} → {ids:?}");
    assert_eq!(ids.iter().filter(|&&t| t == 2).count(), 1, "{ids:?}");
    assert_eq!(ids.iter().filter(|&&t| t == start).count(), 2, "{ids:?}");
    assert_eq!(ids.iter().filter(|&&t| t == end).count(), 1, "{ids:?}");
}
