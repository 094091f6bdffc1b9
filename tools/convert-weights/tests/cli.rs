//! Runs the `convert-weights` binary: bad inputs give exit code ≠ 0 and exactly one stderr line
//! naming the file; `--info` prints a `.flm` file written by the library.

use std::path::PathBuf;
use std::process::Command;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/fixtures");

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_convert-weights"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn one_line_error(args: &[&str], must_name: &str) -> String {
    let out = bin().args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_ne!(out.status.code(), Some(101), "{args:?} panicked");
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err:?}");
    assert!(err.contains(must_name), "{err:?} does not name {must_name}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn bad_files_give_one_line_and_failure() {
    let junk = tmp("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let j = junk.to_str().unwrap();
    let out = tmp("out.flm");
    let e = one_line_error(&[j, "-o", out.to_str().unwrap()], j);
    assert!(e.contains("truncated"), "{e}");
    one_line_error(&["--info", j], j);

    let flm = tmp("bad.flm");
    std::fs::write(&flm, b"FLM\0\r\n\x1a\n\x09\x00\x00\x00").unwrap();
    let f = flm.to_str().unwrap();
    let e = one_line_error(&["--info", f], f);
    assert!(e.contains("version 9"), "{e}");

    let missing = tmp("missing.gguf");
    one_line_error(
        &["--info", missing.to_str().unwrap()],
        missing.to_str().unwrap(),
    );

    let dir = format!("{FIXTURES}/tiny/llama");
    one_line_error(
        &[&dir, "-o", out.to_str().unwrap(), "--dtype", "int3"],
        "int3",
    );
    assert!(!out.exists());
}

#[test]
fn info_prints_a_gguf_tensor_table() {
    // A minimal GGUF: one F32 tensor of 4 values.
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    let key = "general.architecture";
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&5u64.to_le_bytes());
    b.extend_from_slice(b"llama");
    let name = "output_norm.weight";
    b.extend_from_slice(&(name.len() as u64).to_le_bytes());
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&4u64.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    b.extend_from_slice(&[0u8; 16]);
    let p = tmp("tiny.gguf");
    std::fs::write(&p, b).unwrap();
    let out = bin()
        .args(["--info", p.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("general.architecture = \"llama\""), "{text}");
    assert!(
        text.contains("output_norm.weight") && text.contains("F32") && text.contains("[4]"),
        "{text}"
    );
}
