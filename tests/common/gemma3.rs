//! Gemma 3 270M for the tests that check it against its float64 reference
//! (`../shared/fixtures/logits_gemma3/`): the GGUF named by `FASTLLM_GEMMA3_GGUF`, converted
//! and loaded on a device, and the statistics the tests assert on.

#![allow(dead_code)]

use super::skipped;
use fastllm::convert::{convert, ConvertOptions, TargetDtype};
use fastllm::generate::Llm;
use fastllm::load::{load, LoadOptions};
use fastllm::model::Precision;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The reference fixture's directory (under `FASTLLM_FIXTURES` when set, for runs on another
/// machine).
pub fn fixtures() -> PathBuf {
    super::fixtures().join("logits_gemma3")
}

/// The GGUF named by `FASTLLM_GEMMA3_GGUF`, or `None` after reporting the skip.
pub fn gguf() -> Option<PathBuf> {
    match std::env::var_os("FASTLLM_GEMMA3_GGUF") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            skipped("FASTLLM_GEMMA3_GGUF is not set (scripts/test-all.sh sets it)");
            None
        }
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn log_softmax(v: &[f32]) -> Vec<f64> {
    let m = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = v.iter().map(|&x| (x as f64 - m).exp()).sum();
    v.iter().map(|&x| x as f64 - m - s.ln()).collect()
}

/// `gguf` converted with `dtype` and loaded in `precision`, with the file's size (the file is
/// removed once mapped: the model keeps reading it through the mapping).
pub fn model(gguf: &Path, dtype: &str, device: &str, precision: Precision) -> (Llm, u64) {
    let dir = std::env::temp_dir().join(format!("fastllm-gemma3-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("gemma3-{dtype}-{device}-{precision:?}.flm"));
    let opts = ConvertOptions {
        dtype: TargetDtype::parse(dtype).unwrap(),
    };
    convert(gguf, &out, &opts, &mut |_| {}).unwrap();
    let opts = LoadOptions {
        threads: 2,
        device: device.into(),
        precision,
        ..Default::default()
    };
    let size = std::fs::metadata(&out).unwrap().len();
    let llm = load(&out, &opts).unwrap();
    let _ = std::fs::remove_file(&out);
    (llm, size)
}

/// How close a model comes to the reference.
pub struct Stats {
    /// Max |Δlogit| over the last prompt position's vectors.
    pub worst: f32,
    /// Reference tokens predicted from the reference's preceding tokens.
    pub forced: usize,
    /// Reference tokens reproduced by free-running greedy decoding (up to the first miss).
    pub greedy: usize,
    /// Mean KL(ref ‖ ours) over the last-position distributions.
    pub kl: f64,
    pub total: usize,
}

/// The statistics of `llm` over the reference's 4 prompts (asserting its tokenizer gives their ids).
pub fn stats(llm: &Llm) -> Stats {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("reference.json")).unwrap())
            .unwrap();
    let vocab = llm.model.config().vocab_size;
    let mut s = Stats {
        worst: 0.0,
        forced: 0,
        greedy: 0,
        kl: 0.0,
        total: 0,
    };
    let cases = reference["cases"].as_array().unwrap();
    for (ci, case) in cases.iter().enumerate() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy16"]);
        let text = case["prompt"].as_str().unwrap();
        assert_eq!(
            llm.tokenizer.encode(text, true, true).unwrap(),
            prompt,
            "tokenizer on {text:?}"
        );
        // teacher-forced: the whole reference sequence in one forward
        let seq: Vec<u32> = prompt.iter().chain(&want).copied().collect();
        let mut cache = llm.model.new_cache(seq.len()).unwrap();
        let logits = llm
            .model
            .forward(&mut cache, &seq, true)
            .unwrap()
            .to_f32_vec()
            .unwrap();
        let n = prompt.len();
        for (k, &t) in want.iter().enumerate() {
            let row = &logits[(n - 1 + k) * vocab..(n + k) * vocab];
            s.forced += usize::from(argmax(row) == t);
        }
        let bytes = std::fs::read(fixtures().join(format!("case{ci}_last_logits.f32"))).unwrap();
        let refl: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let row = &logits[(n - 1) * vocab..n * vocab];
        for (a, b) in row.iter().zip(&refl) {
            s.worst = s.worst.max((a - b).abs());
        }
        let (lp, lq) = (log_softmax(&refl), log_softmax(row));
        s.kl += lp
            .iter()
            .zip(&lq)
            .map(|(p, q)| p.exp() * (p - q))
            .sum::<f64>()
            / cases.len() as f64;
        // free-running greedy decoding, one token per step through the KV cache
        let mut cache = llm.model.new_cache(n + want.len()).unwrap();
        let mut next = argmax(
            &llm.model
                .forward(&mut cache, &prompt, false)
                .unwrap()
                .to_f32_vec()
                .unwrap(),
        );
        for (k, &t) in want.iter().enumerate() {
            if next != t {
                break;
            }
            s.greedy += 1;
            if k + 1 < want.len() {
                let l = llm.model.forward(&mut cache, &[next], false).unwrap();
                next = argmax(&l.to_f32_vec().unwrap());
            }
        }
        s.total += want.len();
    }
    s
}

/// The process's resident set (Linux `VmRSS`), in MiB.
fn rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Prints `s` with the model's memory.
pub fn report(tag: &str, llm: &Llm, file: u64, s: &Stats) {
    println!(
        "gemma3 270m {tag}: max|Δ| {:.2e}, forced top-1 {}/{}, greedy {}/{}, mean KL {:.2e}; \
         .flm {:.1} MiB, weights mapped or held {:.1} MiB, process RSS {:.1} MiB",
        s.worst,
        s.forced,
        s.total,
        s.greedy,
        s.total,
        s.kl,
        file as f64 / (1 << 20) as f64,
        llm.model.resident_weight_bytes() as f64 / (1 << 20) as f64,
        rss_mib().unwrap_or(f64::NAN)
    );
}
