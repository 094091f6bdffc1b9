//! Fuzzes the `.flm` reader: arbitrary bytes are written to a file and opened in both load
//! modes; every tensor is fetched. Any panic or out-of-bounds access is a bug.
#![no_main]

use fastllm::format::flm::{FlmFile, LoadMode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("fuzz-flm-{}.flm", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    for mode in [LoadMode::Mmap, LoadMode::LowMemory] {
        if let Ok(f) = FlmFile::open(&path, mode) {
            let names: Vec<String> = f.tensor_names().map(str::to_string).collect();
            for n in &names {
                if let Ok(t) = f.tensor(n) {
                    let _ = t.to_f32_vec();
                }
            }
            let _ = f.verify();
            let _ = f.chat_template();
        }
    }
});
