//! GGUF files for the tests: a fixture's safetensors as f32 tensors, and a GGUF v3 writer of f32
//! tensors with metadata and a small BPE vocabulary (the logits are compared by id).

#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// f32 tensors of a fixture's `model.safetensors`.
pub fn safetensors_f32(path: &Path) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let b = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let data = &b[8 + n..];
    let mut out = BTreeMap::new();
    for (k, v) in h.as_object().unwrap() {
        if k == "__metadata__" {
            continue;
        }
        assert_eq!(v["dtype"], "F32", "{k}");
        let dims: Vec<usize> = v["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let o = v["data_offsets"].as_array().unwrap();
        let (a, z) = (
            o[0].as_u64().unwrap() as usize,
            o[1].as_u64().unwrap() as usize,
        );
        let vals = data[a..z]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        out.insert(k.clone(), (dims, vals));
    }
    out
}

/// GGUF metadata value bytes.
pub enum Kv {
    U32(u32),
    F32(f32),
    Str(String),
    Strs(Vec<String>),
}

/// A GGUF v3 file of f32 tensors (dims given outermost first, written in ggml order).
pub fn gguf_bytes(kv: &[(String, Kv)], tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
    let s = |b: &mut Vec<u8>, v: &str| {
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        b.extend_from_slice(v.as_bytes());
    };
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        s(&mut b, k);
        match v {
            Kv::U32(x) => {
                b.extend_from_slice(&4u32.to_le_bytes());
                b.extend_from_slice(&x.to_le_bytes());
            }
            Kv::F32(x) => {
                b.extend_from_slice(&6u32.to_le_bytes());
                b.extend_from_slice(&x.to_le_bytes());
            }
            Kv::Str(x) => {
                b.extend_from_slice(&8u32.to_le_bytes());
                s(&mut b, x);
            }
            Kv::Strs(xs) => {
                b.extend_from_slice(&9u32.to_le_bytes());
                b.extend_from_slice(&8u32.to_le_bytes());
                b.extend_from_slice(&(xs.len() as u64).to_le_bytes());
                xs.iter().for_each(|x| s(&mut b, x));
            }
        }
    }
    let mut off = 0u64;
    for (name, dims, data) in tensors {
        s(&mut b, name);
        b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims.iter().rev() {
            b.extend_from_slice(&(*d as u64).to_le_bytes());
        }
        b.extend_from_slice(&0u32.to_le_bytes()); // F32
        b.extend_from_slice(&off.to_le_bytes());
        off += (data.len() as u64 * 4).div_ceil(32) * 32;
    }
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    for (_, _, data) in tensors {
        data.iter()
            .for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
    }
    b
}

/// A small BPE vocabulary as GGUF metadata (the logits are compared by id).
pub fn tokenizer_kv() -> Vec<(String, Kv)> {
    vec![
        ("tokenizer.ggml.model".into(), Kv::Str("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Kv::Str("gpt-2".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Kv::Strs(
                ["a", "b", "ab"]
                    .iter()
                    .map(|t| t.to_string())
                    .chain((3..256).map(|i| format!("<t{i}>")))
                    .collect(),
            ),
        ),
        ("tokenizer.ggml.merges".into(), Kv::Strs(vec!["a b".into()])),
    ]
}

/// Writes a GGUF of `tensors` with `kv` plus a small vocabulary.
pub fn gguf_file(
    path: &Path,
    mut kv: Vec<(String, Kv)>,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
) {
    kv.extend(tokenizer_kv());
    std::fs::write(path, gguf_bytes(&kv, tensors)).unwrap();
}
