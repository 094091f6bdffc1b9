//! The real clients (`openai` and TGI's `text-generation`, from PyPI) against a server on
//! loopback over the tiny fixture model, through `tests/clients/real_clients.py`. The Python
//! interpreter is `FASTLLM_CLIENTS_PYTHON` (default `python3`); where it cannot import both
//! packages the test says "SKIPPED" on stderr and passes without work.

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
        .args(["-c", "import openai, text_generation"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn openai_and_tgi_clients_work() {
    let py = python();
    if !clients_installed(&py) {
        eprintln!(
            "SKIPPED: {py} cannot import openai and text_generation (set FASTLLM_CLIENTS_PYTHON)"
        );
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/tiny/qwen2");
    let flm = std::env::temp_dir().join(format!("fastllm-clients-{}.flm", std::process::id()));
    fastllm::convert::convert(&dir, &flm, &Default::default(), &mut |_| {}).unwrap();
    let llm = Arc::new(
        load(
            &flm,
            &LoadOptions {
                threads: 2,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let _ = std::fs::remove_file(&flm);
    let o = ServeOptions {
        model_name: "tiny".into(),
        kv_cache_mb: 16,
        max_total_tokens: Some(200),
        ..Default::default()
    };
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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/real_clients.py");
    let out = Command::new(&py).arg(&script).arg(&base).output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("all checks passed"),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
