//! The CUDA kernel sources (`kernels/*.cu`, embedded at build time) and their compilation with
//! NVRTC for a device's compute capability. NVRTC compiles them for the GPU's own architecture
//! (`sm_XY`), which gives the machine code (CUBIN, loaded as it is) and the PTX (read for the
//! kernels' launch attributes) in one pass; where it cannot, for the virtual architecture
//! (`compute_XY`), and the driver compiles that PTX when it loads it, which takes about a minute
//! for these sources. Both are cached on disk under the user cache dir, keyed by source hash +
//! arch + driver version, so a second start skips NVRTC. Knows nothing about ops.

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

/// The kernels compiled for one GPU: the PTX (always) and, where NVRTC could compile for the
/// GPU's own architecture, its machine code.
pub struct Compiled {
    /// The PTX text (the `.entry` functions and their bodies).
    pub ptx: String,
    /// The CUBIN for the GPU's architecture, when NVRTC made one.
    pub cubin: Option<Vec<u8>>,
}

/// Where the CUBIN next to the PTX at `ptx_path` is cached.
pub fn cubin_path(ptx_path: &Path) -> PathBuf {
    ptx_path.with_extension("cubin")
}

/// The kernels for compute capability `arch`: from the disk cache when the PTX and the CUBIN are
/// there, otherwise compiled with NVRTC (and written to the cache under `cache_dir` when given; a
/// failed write is not an error).
pub fn compiled(arch: (i32, i32), driver: i32, cache_dir: Option<&Path>) -> Result<Compiled> {
    let src = source();
    let path = cache_dir.map(|d| cache_path(d, &src, arch, driver));
    if let Some(p) = &path {
        let ptx = std::fs::read_to_string(p)
            .ok()
            .filter(|t| t.contains(".entry"));
        // an empty CUBIN file: NVRTC could not build machine code here before (PTX only)
        let cubin = std::fs::read(cubin_path(p))
            .ok()
            .filter(|b| b.is_empty() || b.starts_with(b"\x7fELF"));
        if let (Some(ptx), Some(cubin)) = (ptx, cubin) {
            let cubin = (!cubin.is_empty()).then_some(cubin);
            return Ok(Compiled { ptx, cubin });
        }
    }
    let real = format!("--gpu-architecture=sm_{}{}", arch.0, arch.1);
    let compiled = match nvrtc(&src, &real, true) {
        Ok(c) => c,
        Err(e) => {
            let first = e.to_string();
            eprintln!(
                "fastllm: no machine code for sm_{}{} ({}); the driver compiles the PTX instead",
                arch.0,
                arch.1,
                first.lines().next().unwrap_or("")
            );
            nvrtc(
                &src,
                &format!("--gpu-architecture=compute_{}{}", arch.0, arch.1),
                false,
            )?
        }
    };
    if let Some(p) = &path {
        store(p, compiled.ptx.as_bytes());
        store(&cubin_path(p), compiled.cubin.as_deref().unwrap_or(&[]));
    }
    Ok(compiled)
}

/// Writes `bytes` to `path` through a temporary file (a failed write is ignored: the cache is
/// only a cache).
fn store(path: &Path, bytes: &[u8]) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// One NVRTC compilation of `src` for the architecture option `arch`: the PTX, and the CUBIN
/// when `cubin` (a real architecture).
fn nvrtc(src: &str, arch: &str, cubin: bool) -> Result<Compiled> {
    use cudarc::nvrtc::result as nv;
    let run = || -> Result<Compiled> {
        let code = std::ffi::CString::new(src)
            .map_err(|_| Error::Device("kernel sources contain a NUL byte".into()))?;
        let prog = nv::create_program(&code, Some(c"fastllm_kernels.cu"))
            .map_err(|e| nvrtc_err(arch, "create", e))?;
        // SAFETY: `prog` was created above; it is destroyed only after this call.
        let out = unsafe { program_output(prog, arch, cubin) };
        // SAFETY: created above, not used after this.
        let _ = unsafe { nv::destroy_program(prog) };
        out
    };
    // cudarc panics when it cannot load the NVRTC library
    std::panic::catch_unwind(run).map_err(|_| {
        Error::Device("NVRTC panicked while compiling the kernels (is libnvrtc installed?)".into())
    })?
}

fn nvrtc_err(arch: &str, what: &str, e: cudarc::nvrtc::result::NvrtcError) -> Error {
    Error::Device(format!(
        "compiling kernels with NVRTC ({arch}): {what}: {e:?}"
    ))
}

/// The bytes of a NUL-terminated C string buffer, without the terminator.
fn c_bytes(v: &[std::ffi::c_char]) -> Vec<u8> {
    v.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect()
}

/// Compiles `prog` for `arch` and reads its PTX (and its CUBIN when `cubin`).
///
/// # Safety
/// `prog` must be a live NVRTC program.
unsafe fn program_output(
    prog: cudarc::nvrtc::sys::nvrtcProgram,
    arch: &str,
    cubin: bool,
) -> Result<Compiled> {
    use cudarc::nvrtc::result as nv;
    let opts = [arch.to_string(), "--std=c++17".to_string()];
    if let Err(e) = nv::compile_program(prog, &opts) {
        let log = nv::get_program_log(prog)
            .map(|l| c_bytes(&l))
            .unwrap_or_default();
        return Err(Error::Device(format!(
            "compiling kernels with NVRTC ({arch}): {e:?}\n{}",
            String::from_utf8_lossy(&log)
        )));
    }
    let ptx = nv::get_ptx(prog).map_err(|e| nvrtc_err(arch, "PTX", e))?;
    let cubin = match cubin {
        true => Some(program_cubin(prog).map_err(|e| nvrtc_err(arch, "CUBIN", e))?),
        false => None,
    };
    Ok(Compiled {
        ptx: String::from_utf8_lossy(&c_bytes(&ptx)).into_owned(),
        cubin,
    })
}

/// The CUBIN of a program compiled for a real architecture.
///
/// # Safety
/// `prog` must be a live, compiled NVRTC program.
unsafe fn program_cubin(
    prog: cudarc::nvrtc::sys::nvrtcProgram,
) -> std::result::Result<Vec<u8>, cudarc::nvrtc::result::NvrtcError> {
    let mut size = 0usize;
    cudarc::nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
    let mut bin = vec![0u8; size];
    cudarc::nvrtc::sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast()).result()?;
    Ok(bin)
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
    fn cached_ptx_and_cubin_load_without_nvrtc() {
        let dir = std::env::temp_dir().join(format!("fastllm-kernel-cache-{}", std::process::id()));
        let p = cache_path(&dir, &source(), (9, 0), 13000);
        assert_eq!(
            cubin_path(&p).extension().and_then(|e| e.to_str()),
            Some("cubin")
        );
        store(&p, b"//\n.visible .entry k_f32(\n)\n{\n\tret;\n}\n");
        store(&cubin_path(&p), b"\x7fELF machine code");
        let c = compiled((9, 0), 13000, Some(&dir)).unwrap();
        assert!(c.ptx.contains(".entry k_f32"));
        assert_eq!(c.cubin.as_deref(), Some(&b"\x7fELF machine code"[..]));
        // an empty CUBIN records that NVRTC made none: the PTX alone, not compiled again
        store(&cubin_path(&p), b"");
        let c = compiled((9, 0), 13000, Some(&dir)).unwrap();
        assert!(c.ptx.contains(".entry k_f32") && c.cubin.is_none());
        let _ = std::fs::remove_dir_all(&dir);
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
