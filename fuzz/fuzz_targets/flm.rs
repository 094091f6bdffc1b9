//! Fuzzes the `.flm` reader: arbitrary bytes are written to a file and opened in both load
//! modes, every tensor fetched and verified. Each input is tried twice: as is, and with its
//! section and header crc32s recomputed, so mutations reach the section decoders instead of
//! stopping at the checksums. Any panic or out-of-bounds access is a bug.
#![no_main]

use fastllm::format::flm::{FlmFile, LoadMode};
use libfuzzer_sys::fuzz_target;

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Recomputes section crcs (except tensor data) and the header crc, where they lie in bounds.
fn fix_crcs(b: &mut [u8]) -> Option<()> {
    let n = u32::from_le_bytes(b.get(24..28)?.try_into().ok()?) as usize;
    if n == 0 || n > 64 {
        return None;
    }
    for i in 0..n {
        let e = 32 + 32 * i;
        let kind = u32::from_le_bytes(b.get(e..e + 4)?.try_into().ok()?);
        let off = usize::try_from(u64_at(b, e + 8)?).ok()?;
        let len = usize::try_from(u64_at(b, e + 16)?).ok()?;
        if kind != 4 {
            if let Some(sec) = b.get(off..off.checked_add(len)?) {
                let crc = crc32fast::hash(sec);
                b.get_mut(e + 24..e + 28)?
                    .copy_from_slice(&crc.to_le_bytes());
            }
        }
    }
    let h = 32 + 32 * n;
    let crc = crc32fast::hash(b.get(..h)?);
    b.get_mut(h..h + 4)?.copy_from_slice(&crc.to_le_bytes());
    Some(())
}

fn exercise(path: &std::path::Path, data: &[u8]) {
    if std::fs::write(path, data).is_err() {
        return;
    }
    for mode in [LoadMode::Mmap, LoadMode::LowMemory] {
        if let Ok(f) = FlmFile::open(path, mode) {
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
}

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("fuzz-flm-{}.flm", std::process::id()));
    exercise(&path, data);
    let mut fixed = data.to_vec();
    if let Some(size) = fixed.get_mut(16..24) {
        // keep the declared size consistent too, so truncation checks do not stop everything
        size.copy_from_slice(&(data.len() as u64).to_le_bytes());
    }
    if fix_crcs(&mut fixed).is_some() {
        exercise(&path, &fixed);
    }
});
