//! Fuzz target `tokenizer_sentencepiece`: arbitrary bytes (as lossy UTF-8) through the tiny
//! Llama SentencePiece BPE tokenizer (`▁`, prepended `▁`, byte fallback). Texts without `▁` must
//! decode back exactly, and the streaming decoder must agree with `decode`.

#![no_main]

use fastllm::tokenizer::{Tokenizer, TokenizerSpec};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const TOKENIZER_JSON: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/fixtures/tiny/llama/tokenizer.json"
));

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let spec = TokenizerSpec::from_hf_json(TOKENIZER_JSON, None).expect("fixture spec");
        Tokenizer::new(spec).expect("fixture tokenizer")
    })
}

fuzz_target!(|data: &[u8]| {
    let tok = tokenizer();
    let text = String::from_utf8_lossy(data);
    // its special tokens include the <0xNN> byte tokens, so special parsing stays off
    let ids = tok.encode(&text, true, false).expect("encode");
    assert_eq!(ids.first().copied(), tok.bos_id(), "bos");
    let plain = tok.decode(&ids[1..], false).expect("decode");
    if !text.contains('\u{2581}') {
        assert_eq!(plain, text, "round trip");
    }
    let mut stream = tok.stream_decoder(false);
    let mut streamed = String::new();
    for &id in &ids[1..] {
        streamed.push_str(&stream.push(id).expect("stream push"));
    }
    streamed.push_str(&stream.finish());
    assert_eq!(streamed, plain, "stream decode");
});
