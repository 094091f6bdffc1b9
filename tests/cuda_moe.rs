//! Mixture-of-experts models on the CUDA device: the tiny Mixtral, Qwen3-MoE and DeepSeek-V3
//! fixtures against their float64 reference logits (exact and fast precision), with the CUDA
//! device first and the CPU device as the fallback for the ops it lacks (`MoeRoute`,
//! `MoeDispatch`, `MoeCombine`, and the per-head `MatMulTransB` of latent attention).
//!
//! Without a GPU the test passes without work and the binary says once, on stderr past the test
//! harness's capture, "SKIPPED: no CUDA device (...)".

#![cfg(feature = "cuda")]

mod common;

use common::cuda::gpu;
use fastllm::convert::{convert, ConvertOptions, TargetDtype};
use fastllm::load::{load, LoadOptions};
use fastllm::model::Precision;
use serde_json::Value;
use std::path::Path;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// Max |logit − reference| over every case's top-5 and last-position logits.
fn worst_on(arch: &str, device: &str, precision: Precision) -> f32 {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures/tiny")
        .join(arch);
    let out = std::env::temp_dir().join(format!(
        "fastllm-cuda-moe-{}-{arch}-{precision:?}.flm",
        std::process::id()
    ));
    let keep = ConvertOptions {
        dtype: TargetDtype::parse("keep").unwrap(),
    };
    convert(&dir, &out, &keep, &mut |_| {}).unwrap();
    let llm = load(
        &out,
        &LoadOptions {
            threads: 2,
            device: device.into(),
            precision,
            ..Default::default()
        },
    )
    .unwrap();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let vocab = llm.model.config().vocab_size;
    let mut worst = 0f32;
    for case in reference["cases"].as_array().unwrap() {
        let ids: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let mut cache = llm.model.new_cache(ids.len()).unwrap();
        let logits = llm
            .model
            .forward(&mut cache, &ids, true)
            .unwrap()
            .to_f32_vec()
            .unwrap();
        let tops = case["top5_ids"].as_array().unwrap();
        let vals = case["top5_logits"].as_array().unwrap();
        for (p, (ti, tl)) in tops.iter().zip(vals).enumerate() {
            for (id, l) in ti.as_array().unwrap().iter().zip(floats(tl)) {
                let id = id.as_u64().unwrap() as usize;
                worst = worst.max((logits[p * vocab + id] - l).abs());
            }
        }
        let last = floats(&case["last_logits"]);
        let row = &logits[(ids.len() - 1) * vocab..];
        for (a, b) in row.iter().zip(&last) {
            worst = worst.max((a - b).abs());
        }
    }
    worst
}

#[test]
fn tiny_moe_models_on_the_gpu_match_reference() {
    let Some(_dev) = gpu() else { return };
    for arch in ["mixtral", "qwen3_moe", "deepseek_v3"] {
        for precision in [Precision::Exact, Precision::Fast] {
            let worst = worst_on(arch, "cuda", precision);
            println!("{arch} cuda {precision:?}: max |logit - ref| {worst:.2e}");
            assert!(
                worst <= 1e-3,
                "{arch} {precision:?} on cuda: {worst} > 1e-3"
            );
        }
    }
}
