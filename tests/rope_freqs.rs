//! A GGUF's `rope_freqs.weight` (llama.cpp's per-frequency divisors, how a Llama-3.1/3.2 GGUF
//! carries its llama3 rope scaling) gives the same logits as the Hugging Face config's
//! `rope_scaling`: the tiny llama3-rope-scaling fixture, once as converted from HF and once with
//! the scaling removed from its config and carried by the divisors tensor instead.

mod common;

use common::rope::llama3_divisors;
use fastllm::convert::{convert, ConvertOptions};
use fastllm::data::Data;
use fastllm::format::flm::{FlmFile, FlmWriter, LoadMode};
use fastllm::model::{Model, Precision, RopeScaling, ROPE_FREQS_TENSOR};
use fastllm::Executor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join("fastllm-rope-freqs-tests");
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// `src` with its config's rope scaling removed and `divisors` (if any) as the rope_freqs tensor.
fn rewrite(src: &Path, out: &Path, divisors: &[f32]) {
    let f = FlmFile::open(src, LoadMode::Mmap).unwrap();
    let mut config = f.config().clone();
    config.rope_scaling = RopeScaling::None;
    let mut w = FlmWriter::create(out, &config, f.metadata(), f.tokenizer_spec()).unwrap();
    for name in f.tensor_names() {
        w.add_data(name, &f.tensor(name).unwrap()).unwrap();
    }
    let d = Data::from_f32(&[divisors.len()], divisors).unwrap();
    w.add_data(ROPE_FREQS_TENSOR, &d).unwrap();
    w.finish().unwrap();
}

fn logits(flm: &Path, ids: &[u32]) -> fastllm::Result<Vec<f32>> {
    let file = FlmFile::open(flm, LoadMode::Mmap)?;
    let config = file.config().clone();
    let m = Model::new(
        config,
        Arc::new(file),
        Executor::cpu(2)?,
        Precision::Exact,
        false,
    )?;
    let mut cache = m.new_cache(ids.len())?;
    m.forward(&mut cache, ids, true)?.to_f32_vec()
}

#[test]
fn rope_freqs_tensor_equals_the_llama3_config() {
    let fixture = common::tiny_fixture("llama3-rope-scaling");
    let hf = tmp("hf.flm");
    convert(&fixture, &hf, &ConvertOptions::default(), &mut |_| {}).unwrap();
    let c = FlmFile::open(&hf, LoadMode::Mmap).unwrap().config().clone();
    let RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_context_length,
    } = c.rope_scaling
    else {
        panic!("the fixture has no llama3 scaling: {:?}", c.rope_scaling);
    };
    let div = llama3_divisors(
        c.rope_theta as f64,
        c.rope_dim,
        factor as f64,
        low_freq_factor as f64,
        high_freq_factor as f64,
        original_context_length as f64,
    );
    assert!(
        div.iter().any(|d| *d > 1.5),
        "the scaling changes no frequency: {div:?}"
    );
    let gguf_like = tmp("divisors.flm");
    rewrite(&hf, &gguf_like, &div);
    // positions past the original context, where the scaling matters
    let ids: Vec<u32> = (0..120).map(|i| (i * 37 + 5) % 500).collect();
    let (a, b) = (
        logits(&hf, &ids).unwrap(),
        logits(&gguf_like, &ids).unwrap(),
    );
    let worst = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(worst < 1e-4, "max |Δlogit| {worst:.2e}");
    // without the divisors (what a GGUF gave before) the logits differ: the check has teeth
    let plain = tmp("plain.flm");
    rewrite(&hf, &plain, &vec![1.0; div.len()]);
    let p = logits(&plain, &ids).unwrap();
    let off = a
        .iter()
        .zip(&p)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        off > 1e-3,
        "dropping the scaling changed nothing ({off:.2e})"
    );
}

#[test]
fn bad_rope_freqs_tensor_is_refused_by_name() {
    let fixture = common::tiny_fixture("llama3-rope-scaling");
    let hf = tmp("hf-bad.flm");
    convert(&fixture, &hf, &ConvertOptions::default(), &mut |_| {}).unwrap();
    let half = FlmFile::open(&hf, LoadMode::Mmap)
        .unwrap()
        .config()
        .rope_dim
        / 2;
    for (what, div) in [
        ("short", vec![1.0f32; half - 1]),
        ("zero", vec![0.0f32; half]),
    ] {
        let out = tmp(&format!("bad-{what}.flm"));
        rewrite(&hf, &out, &div);
        let e = logits(&out, &[1, 2, 3]).unwrap_err().to_string();
        assert!(e.contains(ROPE_FREQS_TENSOR), "{what}: {e}");
    }
}
