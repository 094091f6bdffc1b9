//! Fuzz target `tokenizer`: arbitrary bytes (as lossy UTF-8) through the tiny Qwen2 byte-level
//! BPE tokenizer with special-token parsing on; decoding must give the text back, and the
//! streaming decoder must agree with `decode`.

#![no_main]

use fastllm::tokenizer::{Tokenizer, TokenizerSpec};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const TOKENIZER_JSON: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/fixtures/tiny/qwen2/tokenizer.json"
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
    let ids = tok.encode(&text, false, true).expect("encode");
    let back = tok.decode(&ids, false).expect("decode");
    assert_eq!(back, text, "round trip");
    let mut stream = tok.stream_decoder(false);
    let mut streamed = String::new();
    for &id in &ids {
        streamed.push_str(&stream.push(id).expect("stream push"));
    }
    streamed.push_str(&stream.finish());
    assert_eq!(streamed, back, "stream decode");
});
