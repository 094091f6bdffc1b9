//! What the integration tests share: reporting a skipped test where CI's log shows it; for the
//! CUDA tests, the device and the executors they compare ([`cuda`]) and the SmolLM2 model they
//! load ([`smollm2`]); Gemma 3 270M against its reference ([`gemma3`]); GGUF files written from
//! fixtures ([`gguf`]); rope definitions computed in f64 ([`rope`]).

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod gemma3;
pub mod gguf;
pub mod rope;
#[cfg(feature = "cuda")]
pub mod smollm2;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

/// The shared fixtures (`FASTLLM_FIXTURES` overrides their location, for runs on another
/// machine).
#[allow(dead_code)] // not every test binary reads fixtures
pub fn fixtures() -> PathBuf {
    std::env::var_os("FASTLLM_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures"))
        })
}

/// The tiny random model `arch` of the shared fixtures (`tiny/{arch}`).
#[allow(dead_code)] // not every test binary reads fixtures
pub fn tiny_fixture(arch: &str) -> PathBuf {
    fixtures().join("tiny").join(arch)
}

/// Held by a test that runs a group over the machine's GPUs while it does: the kernels of two
/// groups on the same GPUs spin waiting for their peers and can starve each other until the
/// group's timeout, so the tests of one binary take turns (libtest runs them on threads).
#[allow(dead_code)] // used by the binaries that run groups on GPUs
pub fn gpus_turn() -> std::sync::MutexGuard<'static, ()> {
    static GPUS: Mutex<()> = Mutex::new(());
    GPUS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Reports that a test skips its work (no GPU, no model file, …): `SKIPPED: {why}` on the
/// process's stderr, written past libtest's output capture (which hides `println!` and
/// `eprintln!` of passing tests), once per distinct message and test binary, so a run without a
/// GPU says so in the log instead of passing silently.
pub fn skipped(why: &str) {
    static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let first = SEEN
        .lock()
        .map_or(true, |mut seen| seen.insert(why.to_string()));
    if first {
        // a handle's write is not captured by the test harness, unlike the print macros
        let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
    }
}
