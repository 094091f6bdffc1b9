//! What newcomers and clients hit first, through the real `fastllm` binary: negative numbers
//! reach the validators, every flag has help, `logits` prints token text, sampling without a
//! seed varies and reports its seed, and `fastllm serve` logs its address, model, device and KV
//! budget, takes its key from a file, and on SIGTERM/SIGINT lets a running stream end with
//! `[DONE]` before exiting; `bench-serve` measures real tokens and fails when nothing ran.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn tmpdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-clients-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tiny() -> PathBuf {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let out = tmpdir().join("tiny-qwen2.flm");
    if !out.exists() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/tiny/qwen2");
        fastllm::convert::convert(&src, &out, &Default::default(), &mut |_| {}).unwrap();
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

fn ok(args: &[&str]) -> Output {
    let o = fastllm(args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Exit code 1, no panic, and the last stderr line is the one error line, containing `needle`.
fn fails(args: &[&str], needle: &str) {
    let o = fastllm(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    let last = err.lines().last().unwrap_or("");
    assert!(last.starts_with("fastllm: error: "), "{args:?}: {err}");
    assert!(last.contains(needle), "{args:?}: '{last}' lacks '{needle}'");
}

#[test]
fn negative_numbers_reach_the_validators() {
    let m = tiny();
    let m = m.to_str().unwrap();
    fails(
        &["run", "-m", m, "-p", "x", "--temperature", "-1"],
        "temperature",
    );
    fails(&["run", "-m", m, "-p", "x", "--top-p", "-0.5"], "top_p");
    fails(&["run", "-m", m, "-p", "x", "--min-p", "-0.1"], "min_p");
    fails(
        &["run", "-m", m, "-p", "x", "--repeat-penalty", "-2"],
        "repetition",
    );
    fails(
        &["serve", "-m", m, "--port", "0", "--drain-timeout", "-1"],
        "--drain-timeout",
    );
    fails(
        &[
            "serve",
            "-m",
            m,
            "--port",
            "0",
            "--waiting-served-ratio",
            "-1",
        ],
        "--waiting-served-ratio",
    );
    fails(
        &[
            "serve",
            "-m",
            m,
            "--port",
            "0",
            "--cors-origin",
            "localhost",
        ],
        "--cors-origin",
    );
    let missing = tmpdir().join("no-such-key");
    fails(
        &[
            "serve",
            "-m",
            m,
            "--port",
            "0",
            "--api-key-file",
            missing.to_str().unwrap(),
        ],
        "cannot read --api-key-file",
    );
    // a negative count is clap's own message about that flag, not "unexpected argument"
    let o = fastllm(&["run", "-m", m, "-p", "x", "--top-k", "-3"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("--top-k") && !err.contains("unexpected argument"),
        "{err}"
    );
}

/// True when `s` says more than clap's bracketed notes (`[default: ...]` and the like).
fn has_text(s: &str) -> bool {
    let mut rest = s.trim();
    for note in ["[default: ", "[possible values: ", "[aliases: "] {
        if let Some(i) = rest.find(note) {
            rest = rest[..i].trim();
        }
    }
    !rest.is_empty()
}

/// Every option of every subcommand has a help text in `--help`.
#[test]
fn every_flag_has_help() {
    let top = String::from_utf8(ok(&["--help"]).stdout).unwrap();
    let subs: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|s| s != "help")
        .collect();
    assert!(subs.len() >= 9, "{subs:?}");
    for sub in &subs {
        let help = String::from_utf8(ok(&[sub.as_str(), "--help"]).stdout).unwrap();
        let lines: Vec<&str> = help.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            let is_flag = t.starts_with('-') && l.starts_with("  ");
            let is_positional = t.starts_with('[') || (t.starts_with('<') && l.starts_with("  "));
            if !(is_flag || is_positional) {
                continue;
            }
            // the text follows on the same line after two spaces, or on the next line; a
            // bare "[default: ...]" is no help
            let indent = l.len() - t.len();
            let same_line = t.split("  ").skip(1).any(has_text);
            let next_line = lines.get(i + 1).is_some_and(|n| {
                let nt = n.trim_start();
                n.len() - nt.len() > indent && !nt.starts_with('-') && has_text(nt)
            });
            assert!(
                same_line || next_line,
                "`fastllm {sub}`: no help for '{}'",
                t
            );
        }
    }
}

#[test]
fn logits_print_token_text() {
    let m = tiny();
    let o = ok(&[
        "logits",
        "-m",
        m.to_str().unwrap(),
        "--prompt",
        "Hello world",
        "--top",
        "3",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ids = v["ids"].as_array().unwrap();
    let texts = v["tokens"].as_array().unwrap();
    assert_eq!(ids.len(), texts.len());
    let joined: String = texts.iter().map(|t| t.as_str().unwrap()).collect();
    assert!(joined.ends_with("Hello world"), "{joined}");
    for p in v["positions"].as_array().unwrap() {
        for e in p["top"].as_array().unwrap() {
            assert!(e[0].is_u64() && e[1].is_f64() && e[2].is_string(), "{e}");
        }
    }
}

#[test]
fn sampling_without_a_seed_varies_and_prints_it() {
    let m = tiny();
    let m = m.to_str().unwrap();
    let args = [
        "run",
        "-m",
        m,
        "-p",
        "Hello",
        "-n",
        "24",
        "--temperature",
        "1.5",
        "--threads",
        "1",
    ];
    let mut seeds = Vec::new();
    let mut outs = std::collections::HashSet::new();
    for _ in 0..3 {
        let o = ok(&args);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        let seed = err
            .lines()
            .find_map(|l| l.strip_prefix("fastllm: sampling with --seed "))
            .unwrap_or_else(|| panic!("no seed line: {err}"))
            .trim()
            .to_string();
        seeds.push(seed);
        outs.insert(o.stdout);
    }
    assert!(seeds[0] != seeds[1] && seeds[1] != seeds[2], "{seeds:?}");
    assert!(
        outs.len() > 1,
        "three runs without a seed gave the same text"
    );
    // the printed seed repeats a run; a given seed is not printed
    let mut with_seed = args.to_vec();
    with_seed.extend(["--seed", seeds[0].as_str()]);
    let a = ok(&with_seed);
    let b = ok(&with_seed);
    assert_eq!(a.stdout, b.stdout);
    assert!(!String::from_utf8_lossy(&a.stderr).contains("sampling with --seed"));
    // greedy runs print no seed
    let o = ok(&["run", "-m", m, "-p", "Hello", "-n", "4", "--threads", "1"]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("--seed"));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `fastllm serve` child and its stderr lines.
struct ServeProc {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    port: u16,
}

impl ServeProc {
    fn start(extra: &[&str]) -> ServeProc {
        let port = free_port();
        let m = tiny();
        let p = port.to_string();
        let mut args = vec![
            "serve",
            "-m",
            m.to_str().unwrap(),
            "--port",
            &p,
            "--threads",
            "1",
        ];
        args.extend(["--kv-cache-mb", "16", "--max-total-tokens", "256"]);
        args.extend(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_fastllm"))
            .args(&args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        ServeProc { child, lines, port }
    }

    /// Waits for a stderr line containing `needle`.
    fn wait_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Ok(l) = self.lines.recv_timeout(deadline - Instant::now()) {
            if l.contains(needle) {
                return l;
            }
        }
        panic!("fastllm serve never printed '{needle}'");
    }

    fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// Waits for the process to exit; its exit code.
    fn wait_exit(&mut self) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("fastllm serve did not exit");
    }
}

impl Drop for ServeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends one HTTP/1.1 request; the open connection, read up to the end of the headers.
fn request(
    port: u16,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &str,
) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let auth = auth
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    BufReader::new(s)
}

/// The status code and the rest of the answer.
fn answer(mut r: BufReader<TcpStream>) -> (u16, String) {
    let mut all = String::new();
    r.read_to_string(&mut all).unwrap();
    let code = all
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, all)
}

#[test]
fn serve_logs_drains_on_sigterm_and_bench_serve_measures() {
    let mut s = ServeProc::start(&["--drain-timeout", "30"]);
    let ready = s.wait_line("ready on");
    for want in [
        format!("http://127.0.0.1:{}", s.port),
        "model tiny-qwen2".into(),
        "on cpu".into(),
        "KV cache 16 MiB".into(),
    ] {
        assert!(ready.contains(&want), "'{ready}' lacks '{want}'");
    }
    // bench-serve's default workload generates tokens; a dead address fails clearly
    let addr = format!("127.0.0.1:{}", s.port);
    let o = ok(&[
        "bench-serve",
        "--addr",
        &addr,
        "-c",
        "2",
        "--requests",
        "4",
        "-n",
        "16",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("requests 4 ok / 0 failed"), "{out}");
    let tok_s: f64 = out
        .split(" output tok/s")
        .next()
        .and_then(|h| h.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(tok_s > 0.0, "{out}");
    let dead = format!("127.0.0.1:{}", free_port());
    fails(
        &["bench-serve", "--addr", &dead, "--requests", "2"],
        "every request failed",
    );
    // a stream running at SIGTERM ends with [DONE]; the server then exits cleanly
    let body = r#"{"prompt": "Once upon a time", "max_tokens": 200, "stream": true, "temperature": 0, "ignore_eos": true}"#;
    let mut r = request(s.port, "POST", "/v1/completions", None, body);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "stream closed early");
    }
    s.signal("-TERM");
    s.wait_line("shutting down");
    let (_, rest) = answer(r);
    let data: Vec<&str> = rest
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{rest}");
    let fin: serde_json::Value = serde_json::from_str(data[data.len() - 2]).unwrap();
    assert_eq!(fin["usage"]["completion_tokens"], 200, "{fin}");
    assert_eq!(s.wait_exit(), Some(0));
}

#[test]
fn serve_takes_its_key_from_a_file_and_stops_on_sigint() {
    let key = tmpdir().join("key");
    std::fs::write(&key, "file-secret\n").unwrap();
    let mut s = ServeProc::start(&["--api-key-file", key.to_str().unwrap()]);
    s.wait_line("ready on");
    let body = r#"{"prompt": "x", "max_tokens": 2}"#;
    let (code, text) = answer(request(s.port, "POST", "/v1/completions", None, body));
    assert_eq!(code, 401, "{text}");
    let (code, text) = answer(request(
        s.port,
        "POST",
        "/v1/completions",
        Some("wrong"),
        body,
    ));
    assert_eq!(code, 401, "{text}");
    let (code, text) = answer(request(
        s.port,
        "POST",
        "/v1/completions",
        Some("file-secret"),
        body,
    ));
    assert_eq!(code, 200, "{text}");
    // the key is not on the command line
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", s.child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("file-secret"));
    s.signal("-INT");
    assert_eq!(s.wait_exit(), Some(0));
}
