//! Fuzzes the GGUF reader and what the converter derives from it: open, `ModelConfig::from_gguf`,
//! and dequantization of every (small) tensor. Any panic or out-of-bounds access is a bug.
#![no_main]

use fastllm::convert::ggml_dequant::{dequantize, supported};
use fastllm::format::gguf::GgufFile;
use fastllm::model::ModelConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("fuzz-gguf-{}.gguf", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let Ok(g) = GgufFile::open(&path) else { return };
    let _ = ModelConfig::from_gguf(&g);
    for t in &g.tensors {
        let Ok(bytes) = g.tensor_bytes(t) else {
            continue;
        };
        let _ = g.read_tensor_bytes(t);
        if supported(t.ggml_type) && t.count() <= 1 << 16 {
            let mut out = vec![0f32; t.count() as usize];
            let _ = dequantize(t.ggml_type, bytes, &mut out);
        }
    }
});
