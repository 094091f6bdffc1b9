//! The web chat page of `fastllm serve` at `GET /`: served as HTML through real HTTP, and
//! driven in headless Chromium (`tests/clients/browser_chat.py` over the DevTools protocol:
//! the Markdown renderer, a typed question, the streamed answer) with a screenshot kept at
//! `target/test-artifacts/chat-page.png`. The browser is `FASTLLM_CHROMIUM` (default
//! `chromium`) and the Python interpreter `FASTLLM_CLIENTS_PYTHON` (scripts/test-all.sh
//! installs both); without them the browser part says "SKIPPED" on stderr.

use fastllm::load::{load, LoadOptions};
use fastllm_serve::http::{router, AppState};
use fastllm_serve::{engine_config, ServeOptions};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

fn found(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn chat_page_streams_an_answer_in_a_browser() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/tiny/qwen2");
    let flm = std::env::temp_dir().join(format!("fastllm-page-{}.flm", std::process::id()));
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

    let (status, ctype, body) = rt.block_on(async {
        let r = reqwest::get(format!("{base}/")).await.unwrap();
        let ctype = r.headers()["content-type"].to_str().unwrap().to_string();
        (r.status().as_u16(), ctype, r.text().await.unwrap())
    });
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/html"), "{ctype}");
    assert!(body.contains("/v1/chat/completions") && body.contains("function renderMarkdown"));
    assert!(
        !body.contains("http://") && !body.contains("https://cdn"),
        "no outside resources"
    );

    let py = std::env::var("FASTLLM_CLIENTS_PYTHON").unwrap_or_else(|_| "python3".into());
    let chromium = std::env::var("FASTLLM_CHROMIUM").unwrap_or_else(|_| "chromium".into());
    if !found(&py, &["-c", "import websocket"]) || !found(&chromium, &["--version"]) {
        eprintln!("SKIPPED: the browser test needs {chromium} and {py} with websocket-client");
        return;
    }
    let shot =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts/chat-page.png");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/browser_chat.py");
    let out = Command::new(&py)
        .arg(&script)
        .arg(&base)
        .arg(&chromium)
        .arg(&shot)
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("all checks passed"),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(shot.metadata().unwrap().len() > 1000, "screenshot written");
}
