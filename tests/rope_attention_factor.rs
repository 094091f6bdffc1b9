//! YaRN's / LongRoPE's attention factor with partial rotary: it scales only the rotated dims of
//! q and k (as transformers scales cos and sin). A model whose config carries the factor gives
//! the same logits as the same model without it whose q projection rows of the rotated dims
//! are multiplied by factor² instead (the tiny qwen2-yarn fixture, half of each head rotating).

mod common;

use fastllm::convert::{convert, ConvertOptions, TargetDtype};
use fastllm::data::Data;
use fastllm::format::flm::{FlmFile, FlmWriter, LoadMode};
use fastllm::model::{Model, Precision, RopeScaling};
use fastllm::Executor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-rope-factor-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// `src` with half of each head rotating, YaRN's attention factor `m`, and the q projection
/// rows of the rotated dims multiplied by `q_rows`.
fn rewrite(src: &Path, out: &Path, m: f32, q_rows: f32) {
    let f = FlmFile::open(src, LoadMode::Mmap).unwrap();
    let mut c = f.config().clone();
    c.rope_dim = c.head_dim / 2;
    let RopeScaling::Yarn {
        attention_factor, ..
    } = &mut c.rope_scaling
    else {
        panic!("not yarn: {:?}", c.rope_scaling)
    };
    *attention_factor = m;
    let (hd, rot) = (c.head_dim, c.rope_dim);
    let mut w = FlmWriter::create(out, &c, f.metadata(), f.tokenizer_spec()).unwrap();
    for name in f.tensor_names() {
        let t = f.tensor(name).unwrap();
        if name.contains("q_proj") {
            let mut v = t.to_f32_vec().unwrap();
            let cols = if t.dims().len() == 2 { t.dim(1) } else { 1 };
            for (r, row) in v.chunks_mut(cols).enumerate() {
                if r % hd < rot {
                    row.iter_mut().for_each(|x| *x *= q_rows);
                }
            }
            w.add_data(name, &Data::from_f32(t.dims(), &v).unwrap())
                .unwrap();
        } else {
            w.add_data(name, &t).unwrap();
        }
    }
    w.finish().unwrap();
}

fn logits(flm: &Path, ids: &[u32]) -> Vec<f32> {
    let file = FlmFile::open(flm, LoadMode::Mmap).unwrap();
    let config = file.config().clone();
    let exec = Executor::cpu(2).unwrap();
    let m = Model::new(config, Arc::new(file), exec, Precision::Exact, false).unwrap();
    let mut cache = m.new_cache(ids.len()).unwrap();
    m.forward(&mut cache, ids, true)
        .unwrap()
        .to_f32_vec()
        .unwrap()
}

#[test]
fn partial_rotary_attention_factor_scales_the_rotated_dims_only() {
    let fixture = common::tiny_fixture("qwen2-yarn");
    let hf = tmp("hf.flm");
    let opts = ConvertOptions {
        dtype: TargetDtype::F32,
    };
    convert(&fixture, &hf, &opts, &mut |_| {}).unwrap();
    let m = 2.0f32;
    let (with_factor, in_weights, neither) = (tmp("a.flm"), tmp("b.flm"), tmp("c.flm"));
    rewrite(&hf, &with_factor, m, 1.0);
    rewrite(&hf, &in_weights, 1.0, m * m);
    rewrite(&hf, &neither, 1.0, 1.0);
    let ids: Vec<u32> = (0..40).map(|i| (i * 13 + 7) % 500).collect();
    let (a, b, n) = (
        logits(&with_factor, &ids),
        logits(&in_weights, &ids),
        logits(&neither, &ids),
    );
    let diff = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max)
    };
    assert!(diff(&a, &b) <= 1e-4, "factor vs weights: {}", diff(&a, &b));
    assert!(
        diff(&a, &n) > 1e-2,
        "the factor changes nothing: {}",
        diff(&a, &n)
    );
}
