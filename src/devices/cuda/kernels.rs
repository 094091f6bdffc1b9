//! The CUDA kernel sources (`kernels/*.cu`, embedded at build time) and their compilation with
//! NVRTC for a device's compute capability. The PTX is cached in memory (per process, by the
//! caller) and on disk under the user cache dir, keyed by source hash + arch + driver version, so
//! a second start skips NVRTC. Knows nothing about ops.

use crate::error::{Error, Result};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Every kernel source, in order; `common.cuh` first (the others use its helpers).
const SOURCES: [(&str, &str); 16] = [
    ("common.cuh", include_str!("../../../kernels/common.cuh")),
    (
        "elementwise.cu",
        include_str!("../../../kernels/elementwise.cu"),
    ),
    ("norm.cu", include_str!("../../../kernels/norm.cu")),
    ("p2p.cu", include_str!("../../../kernels/p2p.cu")),
    (
        "embedding.cu",
        include_str!("../../../kernels/embedding.cu"),
    ),
    ("linear.cu", include_str!("../../../kernels/linear.cu")),
    (
        "linear_mma.cu",
        include_str!("../../../kernels/linear_mma.cu"),
    ),
    (
        "linear_hmma.cu",
        include_str!("../../../kernels/linear_hmma.cu"),
    ),
    (
        "linear_mmq.cu",
        include_str!("../../../kernels/linear_mmq.cu"),
    ),
    ("moe.cu", include_str!("../../../kernels/moe.cu")),
    (
        "attention.cu",
        include_str!("../../../kernels/attention.cu"),
    ),
    ("rope.cu", include_str!("../../../kernels/rope.cu")),
    ("shape.cu", include_str!("../../../kernels/shape.cu")),
    ("select.cu", include_str!("../../../kernels/select.cu")),
    ("sample.cu", include_str!("../../../kernels/sample.cu")),
    (
        "paged_decode.cu",
        include_str!("../../../kernels/paged_decode.cu"),
    ),
];

/// All kernel sources as one translation unit.
pub fn source() -> String {
    let mut s = String::new();
    for (name, text) in SOURCES {
        s.push_str(&format!("// ---- {name} ----\n"));
        s.push_str(text);
        s.push('\n');
    }
    s
}

/// FNV-1a 64-bit hash (stable across runs and builds, unlike `DefaultHasher`).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Where the PTX for this source, arch and driver is cached under the cache directory `dir`.
pub fn cache_path(dir: &Path, src: &str, arch: (i32, i32), driver: i32) -> PathBuf {
    dir.join("cuda").join(format!(
        "kernels-{:016x}-sm{}{}-drv{driver}.ptx",
        fnv1a(src.as_bytes()),
        arch.0,
        arch.1
    ))
}

/// The PTX of all kernels for compute capability `arch`: from the disk cache when present,
/// otherwise compiled with NVRTC (and written to the cache under `cache_dir` when given; a
/// failed write is not an error).
pub fn compiled_ptx(arch: (i32, i32), driver: i32, cache_dir: Option<&Path>) -> Result<String> {
    let src = source();
    let path = cache_dir.map(|d| cache_path(d, &src, arch, driver));
    if let Some(p) = &path {
        if let Ok(text) = std::fs::read_to_string(p) {
            if text.contains(".entry") {
                return Ok(text);
            }
        }
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![
            format!("--gpu-architecture=compute_{}{}", arch.0, arch.1),
            "--std=c++17".into(),
        ],
        name: Some("fastllm_kernels.cu".into()),
        ..Default::default()
    };
    let ptx = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(&src, opts))
        .map_err(|_| Error::Device("NVRTC panicked while compiling the kernels".into()))?
        .map_err(|e| Error::Device(format!("compiling kernels with NVRTC: {e}")))?
        .to_src();
    if let Some(p) = &path {
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &ptx).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok(ptx)
}

/// The names of the kernels (`.entry` functions) in `ptx` whose own body contains
/// `griddepcontrol.wait` (`pdl_wait` in kernels/common.cuh): the only ones that may be launched
/// with programmatic dependent launch, since they wait for the previous kernel themselves. A
/// kernel that reaches the wait only through a separate `.func` is left out (launched normally).
pub fn entries_waiting_on_predecessor(ptx: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    let starts: Vec<usize> = ptx.match_indices(".entry ").map(|(i, _)| i).collect();
    for (n, &at) in starts.iter().enumerate() {
        let end = starts.get(n + 1).copied().unwrap_or(ptx.len());
        let text = &ptx[at + ".entry ".len()..end];
        let name: String = text
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '$')
            .collect();
        // the body only (a later `.func` would start with its own header)
        let body = match text.find(".func") {
            Some(f) => &text[..f],
            None => text,
        };
        if !name.is_empty() && body.contains("griddepcontrol.wait") {
            out.insert(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_changes_with_arch_and_source() {
        let dir = Path::new("/cache");
        let a = cache_path(dir, "x", (9, 0), 13000);
        let b = cache_path(dir, "x", (8, 0), 13000);
        let c = cache_path(dir, "y", (9, 0), 13000);
        assert!(a.starts_with("/cache/cuda"));
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(fnv1a(b"a"), fnv1a(b"b"));
        let src = source();
        for (name, _) in SOURCES {
            assert!(
                src.contains(&format!("// ---- {name} ----")),
                "{name} missing"
            );
        }
        assert!(src.contains("LIN(q4_1, DT_Q4_1)"));
        // `common.cuh` comes first: every other file uses its helpers.
        assert!(src.starts_with("// ---- common.cuh ----"));
    }

    #[test]
    fn pdl_entries_are_those_whose_body_waits() {
        let ptx =
            "//\n.visible .entry a_f32(\n.param .u64 p\n)\n{\n\tgriddepcontrol.wait;\n\tret;\n}\n\
                   .visible .entry b_f32(\n)\n{\n\tret;\n}\n\
                   .func c()\n{\n\tgriddepcontrol.wait;\n}\n\
                   .visible .entry d$x(\n)\n{\n\tgriddepcontrol.wait;\n}\n";
        let e = entries_waiting_on_predecessor(ptx);
        assert!(e.contains("a_f32"));
        assert!(!e.contains("b_f32"), "b only precedes a .func that waits");
        assert!(e.contains("d$x"));
        assert_eq!(e.len(), 2);
    }
}
