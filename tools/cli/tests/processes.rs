//! Tensor-parallel ranks as processes (`--tp 2 --nnodes 2 --node-rank R --rendezvous
//! HOST:PORT`), on the CPU and, where the machine has two GPUs and NCCL, with node R on
//! `cuda:R` (otherwise those tests say "SKIPPED: ..." and pass): two `fastllm` processes give
//! the logits and the served completions of one; a world size that differs, a node that never
//! arrives, and a node killed while the group serves each end every process with an error
//! naming it, never a hang.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn tmpdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-tp-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The tiny llama fixture as a `.flm` in its own dtypes (converted once per test binary).
fn tiny() -> PathBuf {
    tiny_as("keep")
}

/// The tiny llama fixture as a `.flm` of `dtype` weights (`convert --dtype`), converted once.
fn tiny_as(dtype: &str) -> PathBuf {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let out = tmpdir().join(format!("tiny-llama-{dtype}.flm"));
    if !out.exists() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/tiny/llama");
        let opts = fastllm::convert::ConvertOptions {
            dtype: fastllm::convert::TargetDtype::parse(dtype).unwrap(),
        };
        fastllm::convert::convert(&src, &out, &opts, &mut |_| {}).unwrap();
    }
    out
}

/// Where a test's processes run: one CPU thread each, or node R (a single process: node 0)
/// on `cuda:R`.
#[derive(Clone, Copy, PartialEq)]
enum On {
    Cpu,
    Gpus,
}

impl On {
    /// The flags that place node `node` there.
    fn flags(self, node: usize) -> Vec<String> {
        match self {
            On::Cpu => vec!["--threads".into(), "1".into()],
            On::Gpus => vec!["--device".into(), format!("cuda:{node}")],
        }
    }

    /// `args` followed by the flags of node `node`.
    fn place(self, args: &[&str], node: usize) -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.extend(self.flags(node));
        v
    }
}

/// Two GPUs that NCCL can group; otherwise `false` after saying why on stderr (past the test
/// harness's capture, so that a run without GPUs shows the skip).
fn two_gpus() -> bool {
    use fastllm::devices::cuda::{gpu, nccl};
    match gpu::probe(1).and_then(|_| nccl::probe()) {
        Ok(()) => true,
        Err(e) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: GPU ranks as processes need 2 GPUs and NCCL: {e}"
                );
            });
            false
        }
    }
}

/// `fastllm logits` of two tokens on one thread: a group run that ends fast.
fn short_logits(model: &str) -> [&str; 7] {
    ["logits", "-m", model, "--ids", "1,2", "--threads", "1"]
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `fastllm args`, its output piped, with a cache of its own unless the test run names one
/// (`FASTLLM_CACHE_DIR`: where GPU runs keep the compiled kernels between processes).
fn cmd<S: AsRef<str>>(args: &[S]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fastllm"));
    c.args(args.iter().map(|a| a.as_ref()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if std::env::var_os("FASTLLM_CACHE_DIR").is_none() {
        c.env("FASTLLM_CACHE_DIR", tmpdir().join("cache"));
    }
    c
}

/// `args` followed by the group flags of node `node`.
fn node_args<S: AsRef<str>>(
    args: &[S],
    tp: usize,
    node: usize,
    port: u16,
    timeout: u64,
) -> Vec<String> {
    let mut v: Vec<String> = args.iter().map(|s| s.as_ref().to_string()).collect();
    v.extend([
        "--tp".to_string(),
        tp.to_string(),
        "--nnodes".into(),
        "2".into(),
        "--node-rank".into(),
        node.to_string(),
        "--rendezvous".into(),
        format!("127.0.0.1:{port}"),
        "--rendezvous-timeout".into(),
        timeout.to_string(),
    ]);
    v
}

fn spawn(args: &[String]) -> Child {
    cmd(args).spawn().unwrap()
}

/// Waits for `c` at most `limit`; a process still running then is a hang (killed, test fails).
fn finish(mut c: Child, limit: Duration, what: &str) -> Output {
    let t0 = Instant::now();
    while c.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = c.kill();
            panic!("{what} still running after {limit:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    c.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The top-5 (id, logit) of every position of `fastllm logits` JSON.
fn tops(json: &[u8]) -> Vec<Vec<(u64, f64)>> {
    let v: serde_json::Value = serde_json::from_slice(json).unwrap();
    v["positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p["top"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| (t[0].as_u64().unwrap(), t[1].as_f64().unwrap()))
                .collect()
        })
        .collect()
}

/// `fastllm logits` of `ids` with model `m` in `precision`: one process, then two processes
/// as a group of two ranks, both `on` the same kind of device; the top-5 of every position
/// agree (same best token, shared ids within `tol`).
fn group_logits_match(on: On, m: &Path, ids: &str, precision: &str, tol: f64) {
    let base = [
        "logits",
        "-m",
        m.to_str().unwrap(),
        "--ids",
        ids,
        "--top",
        "5",
        "--precision",
        precision,
    ];
    let solo = cmd(&on.place(&base, 0)).output().unwrap();
    assert!(solo.status.success(), "{}", stderr(&solo));
    let port = free_port();
    let node = |n: usize| spawn(&node_args(&on.place(&base, n), 2, n, port, 60));
    let follower = node(1);
    let driver = node(0);
    let d = finish(driver, Duration::from_secs(120), "node 0");
    let f = finish(follower, Duration::from_secs(120), "node 1");
    assert!(d.status.success(), "node 0: {}", stderr(&d));
    assert!(f.status.success(), "node 1: {}", stderr(&f));
    assert!(
        stderr(&f).contains("node 0 ended the group"),
        "{}",
        stderr(&f)
    );
    let (a, b) = (tops(&solo.stdout), tops(&d.stdout));
    assert_eq!(a.len(), b.len());
    let mut worst = 0.0f64;
    for (pa, pb) in a.iter().zip(&b) {
        assert_eq!(pa[0].0, pb[0].0, "top-1 differs: {pa:?} vs {pb:?}");
        for ((ia, la), (ib, lb)) in pa.iter().zip(pb) {
            if ia == ib {
                worst = worst.max((la - lb).abs());
                assert!((la - lb).abs() < tol, "{pa:?} vs {pb:?}");
            }
        }
    }
    eprintln!(
        "{precision}: two processes vs one, max |dlogit| {worst:e} over {} positions",
        a.len()
    );
}

#[test]
fn two_processes_give_the_logits_of_one() {
    group_logits_match(On::Cpu, &tiny(), "1,5,9,200,3,77", "exact", 1e-4);
}

/// 40 ids: in `fast` precision a prompt of that many rows takes the GPU's tensor-core
/// products, whose row-parallel outputs the ranks all-reduce in f16.
const FORTY_IDS: &str = "1,5,9,200,3,77,12,40,8,300,2,6,91,14,150,33,7,60,21,4,\
                         1,5,9,200,3,77,12,40,8,300,2,6,91,14,150,33,7,60,21,4";

#[test]
fn two_gpu_processes_give_the_logits_of_one_gpu() {
    if !two_gpus() {
        return;
    }
    group_logits_match(On::Gpus, &tiny(), "1,5,9,200,3,77", "exact", 1e-4);
    group_logits_match(On::Gpus, &tiny_as("f16"), FORTY_IDS, "fast", 2e-2);
}

#[test]
fn a_different_world_size_ends_both_processes() {
    let m = tiny();
    let base = short_logits(m.to_str().unwrap());
    let port = free_port();
    let follower = spawn(&node_args(&base, 4, 1, port, 20));
    let driver = spawn(&node_args(&base, 2, 0, port, 20));
    let d = finish(driver, Duration::from_secs(40), "node 0");
    let f = finish(follower, Duration::from_secs(40), "node 1");
    // node 1 with --tp 4 over 2 nodes runs 2 CPU ranks in one process: refused before the
    // rendezvous; node 0 then waits for it in vain and names it
    assert_eq!(f.status.code(), Some(1), "{}", stderr(&f));
    assert!(
        stderr(&f).contains("one rank per process"),
        "{}",
        stderr(&f)
    );
    assert_eq!(d.status.code(), Some(1), "{}", stderr(&d));
    assert!(
        stderr(&d).contains("node(s) 1 never arrived"),
        "{}",
        stderr(&d)
    );
}

#[test]
fn a_different_group_size_is_named_on_both_sides() {
    let m = tiny();
    let base = short_logits(m.to_str().unwrap());
    let port = free_port();
    // --tp 2 over 2 nodes against a node 0 that expects 3 nodes
    let mut a = node_args(&base, 3, 0, port, 20);
    let i = a.iter().position(|s| s == "--nnodes").unwrap();
    a[i + 1] = "3".into();
    let driver = spawn(&a);
    let follower = spawn(&node_args(&base, 2, 1, port, 20));
    let d = finish(driver, Duration::from_secs(40), "node 0");
    let f = finish(follower, Duration::from_secs(40), "node 1");
    assert_eq!(d.status.code(), Some(1), "{}", stderr(&d));
    assert!(stderr(&d).contains("--nnodes 2"), "{}", stderr(&d));
    assert_eq!(f.status.code(), Some(1), "{}", stderr(&f));
    assert!(stderr(&f).contains("refused node 1"), "{}", stderr(&f));
}

#[test]
fn a_node_that_never_arrives_times_out() {
    let m = tiny();
    let base = short_logits(m.to_str().unwrap());
    let port = free_port();
    let d = finish(
        spawn(&node_args(&base, 2, 0, port, 2)),
        Duration::from_secs(30),
        "node 0",
    );
    assert_eq!(d.status.code(), Some(1), "{}", stderr(&d));
    assert!(
        stderr(&d).contains("node(s) 1 never arrived within 2s"),
        "{}",
        stderr(&d)
    );
    let f = finish(
        spawn(&node_args(&base, 2, 1, free_port(), 2)),
        Duration::from_secs(30),
        "node 1",
    );
    assert_eq!(f.status.code(), Some(1), "{}", stderr(&f));
    assert!(
        stderr(&f).contains("node 0 did not answer"),
        "{}",
        stderr(&f)
    );
}

/// `serve` of the tiny model on HTTP port `http`, placed as node `node` `on` its devices.
fn serve_args(on: On, node: usize, m: &Path, http: u16) -> Vec<String> {
    let http = http.to_string();
    on.place(&["serve", "-m", m.to_str().unwrap(), "--port", &http], node)
}

/// Starts `serve` on node 0 and its follower; returns both once node 0 is ready, and its port.
fn serving_group(on: On) -> (Child, Child, u16) {
    let m = tiny();
    let http = free_port();
    let port = free_port();
    let node = |n: usize| spawn(&node_args(&serve_args(on, n, &m, http), 2, n, port, 60));
    let follower = node(1);
    let driver = ready(node(0));
    (driver, follower, http)
}

/// One process serving the tiny model: (process, HTTP port).
fn single_server(on: On) -> (Child, u16) {
    let http = free_port();
    (ready(spawn(&serve_args(on, 0, &tiny(), http))), http)
}

/// `driver` (a server) once it says it is ready, its stderr drained from then on (see
/// `driver_stderr`).
fn ready(mut driver: Child) -> Child {
    let mut err = BufReader::new(driver.stderr.take().unwrap());
    let t0 = Instant::now();
    let mut line = String::new();
    while !line.contains("ready on") {
        line.clear();
        if err.read_line(&mut line).unwrap() == 0 || t0.elapsed() > Duration::from_secs(120) {
            panic!("the server did not become ready: {line}");
        }
    }
    // keep draining its stderr so that it never blocks on a full pipe
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
        let _ = tx.send(rest);
    });
    DRIVER_ERR.with(|c| *c.borrow_mut() = Some(rx));
    driver
}

thread_local! {
    static DRIVER_ERR: std::cell::RefCell<Option<std::sync::mpsc::Receiver<String>>> =
        const { std::cell::RefCell::new(None) };
}

fn driver_stderr() -> String {
    DRIVER_ERR.with(|c| {
        c.borrow_mut()
            .take()
            .and_then(|rx| rx.recv_timeout(Duration::from_secs(10)).ok())
            .unwrap_or_default()
    })
}

/// A completion request; the response text, or "" when the connection failed.
fn complete(port: u16) -> String {
    let body = r#"{"prompt":"hello","max_tokens":8,"temperature":0}"#;
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(req.as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The text of a completion response.
fn completion_text(response: &str) -> String {
    let body = response.split_once("\r\n\r\n").map_or("", |b| b.1);
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {response}"));
    v["choices"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A greedy completion of a group of two processes `on` their devices equals one process's.
fn group_completes_like_one(on: On) {
    // greedy steps of the group pick from each rank's best candidate (no logits on the channel)
    let (mut driver, mut follower, http) = serving_group(on);
    let group = complete(http);
    let _ = driver.kill();
    let _ = follower.kill();
    let _ = (driver.wait(), follower.wait());
    let (mut single, port) = single_server(on);
    let one = complete(port);
    let _ = single.kill();
    let _ = single.wait();
    assert!(group.contains("200 OK"), "{group}");
    assert!(one.contains("200 OK"), "{one}");
    let text = completion_text(&one);
    assert!(!text.is_empty(), "{one}");
    assert_eq!(completion_text(&group), text);
}

/// The follower of a serving group `on` its devices, killed: node 0 ends with an error naming
/// its rank at the next request.
fn killed_follower_ends_node_0(on: On) {
    let (driver, mut follower, http) = serving_group(on);
    assert!(complete(http).contains("200 OK"), "the group serves");
    follower.kill().unwrap();
    let _ = follower.wait();
    let _ = complete(http);
    let d = finish(driver, Duration::from_secs(90), "node 0");
    let err = driver_stderr();
    assert_eq!(d.status.code(), Some(1), "{err}");
    assert!(
        err.contains("tensor-parallel group stopped") && err.contains("rank 1"),
        "{err}"
    );
}

/// Node 0 of a serving group `on` its devices, killed: the follower ends with an error naming
/// node 0.
fn killed_node_0_ends_the_follower(on: On) {
    let (mut driver, follower, http) = serving_group(on);
    assert!(complete(http).contains("200 OK"), "the group serves");
    driver.kill().unwrap();
    let _ = driver.wait();
    let f = finish(follower, Duration::from_secs(90), "node 1");
    assert_eq!(f.status.code(), Some(1), "{}", stderr(&f));
    assert!(stderr(&f).contains("node 0"), "{}", stderr(&f));
    assert!(stderr(&f).contains("disconnected"), "{}", stderr(&f));
}

#[test]
fn a_group_of_processes_completes_like_one_process() {
    group_completes_like_one(On::Cpu);
}

#[test]
fn a_killed_follower_ends_node_0_with_its_rank() {
    killed_follower_ends_node_0(On::Cpu);
}

#[test]
fn a_killed_node_0_ends_the_follower() {
    killed_node_0_ends_the_follower(On::Cpu);
}

#[test]
fn a_gpu_group_of_processes_completes_like_one_gpu() {
    if two_gpus() {
        group_completes_like_one(On::Gpus);
    }
}

#[test]
fn a_killed_gpu_follower_ends_node_0_with_its_rank() {
    if two_gpus() {
        killed_follower_ends_node_0(On::Gpus);
    }
}

#[test]
fn a_killed_gpu_node_0_ends_the_follower() {
    if two_gpus() {
        killed_node_0_ends_the_follower(On::Gpus);
    }
}
