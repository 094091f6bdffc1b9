//! `fastllm perplexity` end to end on the tiny llama fixture: the running values and the final
//! `PPL = x ± err`, `--json`, a KL-divergence base saved and compared (the same model: KL 0,
//! top-1 agreement 100 %), and every user error exiting 1 with one error line naming it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tmpdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-cli-ppl-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tiny() -> String {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let out = tmpdir().join("tiny-llama.flm");
    if !out.exists() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/tiny/llama");
        fastllm::convert::convert(&dir, &out, &Default::default(), &mut |_| {}).unwrap();
    }
    out.to_str().unwrap().to_string()
}

/// A text file of `repeats` varied sentences.
fn text(name: &str, repeats: usize) -> String {
    let p = tmpdir().join(name);
    let mut s = String::new();
    for i in 0..repeats {
        s.push_str(&format!(
            "Sentence {i} of {name}: the quick brown fox jumps over {} lazy dogs. ",
            i * 7 % 13
        ));
    }
    std::fs::write(&p, s).unwrap();
    p.to_str().unwrap().to_string()
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

/// Exit code 1, one error line on stderr (the last) containing `needle`, no panic.
fn fails(args: &[&str], needle: &str) {
    let o = fastllm(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{args:?}: expected one error line: {err}");
    assert_eq!(err.lines().last(), Some(errors[0]), "{args:?}: {err}");
    assert!(
        errors[0].contains(needle),
        "{args:?}: '{}' lacks '{needle}'",
        errors[0]
    );
}

fn ppl_cmd<'a>(m: &'a str, f: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["perplexity", "-m", m, "-f", f, "-c", "32", "--threads", "2"];
    v.extend_from_slice(extra);
    v
}

#[test]
fn prints_running_values_final_estimate_and_json() {
    let m = tiny();
    let f = text("a.txt", 12);
    let out = ok(&ppl_cmd(&m, &f, &[]));
    let mut lines = out.lines();
    let running: Vec<&str> = lines
        .next()
        .unwrap()
        .trim_end_matches(',')
        .split(',')
        .collect();
    assert!(running.len() >= 3, "{out}");
    for (i, r) in running.iter().enumerate() {
        let v = r
            .strip_prefix(&format!("[{}]", i + 1))
            .unwrap_or_else(|| panic!("{out}"));
        assert!(v.parse::<f64>().unwrap() > 1.0, "{out}");
    }
    let last = lines.next().unwrap();
    let (ppl, err) = last
        .strip_prefix("PPL = ")
        .and_then(|r| r.split_once(" ± "))
        .unwrap_or_else(|| panic!("{out}"));
    let ppl: f64 = ppl.parse().unwrap();
    assert!(err.parse::<f64>().unwrap() > 0.0);
    assert_eq!(
        running.last().unwrap(),
        &format!("[{}]{ppl:.4}", running.len())
    );

    let j: serde_json::Value =
        serde_json::from_str(&ok(&ppl_cmd(&m, &f, &["--json", "--batch", "7"]))).unwrap();
    assert!((j["ppl"].as_f64().unwrap() - ppl).abs() < 1e-3, "{j}");
    assert_eq!(j["chunks"].as_u64().unwrap() as usize, running.len());
    assert_eq!(j["n_ctx"], 32);
    assert_eq!(j["scored"].as_u64().unwrap() as usize, running.len() * 15);
    assert_eq!(j["running_ppl"].as_array().unwrap().len(), running.len());
    assert!(j["ppl_err"].as_f64().unwrap() > 0.0);

    let two: serde_json::Value =
        serde_json::from_str(&ok(&ppl_cmd(&m, &f, &["--json", "--chunks", "2"]))).unwrap();
    assert_eq!(two["chunks"], 2);
}

#[test]
fn kl_divergence_base_saved_and_compared() {
    let m = tiny();
    let f = text("kl.txt", 12);
    let base = tmpdir().join("base.bin");
    let base = base.to_str().unwrap();
    ok(&ppl_cmd(&m, &f, &["--kl-divergence-base", base, "--save"]));
    let out = ok(&ppl_cmd(&m, &f, &["--kl-divergence", base]));
    assert!(out.contains("Mean KLD = 0.000000"), "{out}");
    assert!(out.contains("Same top token = 100.000"), "{out}");
    let j: serde_json::Value =
        serde_json::from_str(&ok(&ppl_cmd(&m, &f, &["--kl-divergence", base, "--json"]))).unwrap();
    let k = &j["kl_divergence"];
    assert!(k["mean_kld"].as_f64().unwrap().abs() < 1e-5, "{j}");
    assert_eq!(k["same_top"], 1.0);
    assert!((k["ppl_base"].as_f64().unwrap() - j["ppl"].as_f64().unwrap()).abs() < 1e-3);

    // mismatches name what differs
    let mut other_c = ppl_cmd(&m, &f, &["--kl-divergence", base]);
    other_c[6] = "16";
    fails(&other_c, "context (-c) differs");
    let g = text("other.txt", 12);
    fails(&ppl_cmd(&m, &g, &["--kl-divergence", base]), "text differs");
    fails(
        &ppl_cmd(&m, &f, &["--kl-divergence", base, "--chunks", "1"]),
        "number of windows",
    );
    let junk = tmpdir().join("junk.bin");
    std::fs::write(&junk, b"not a base file at all, just some bytes").unwrap();
    fails(
        &ppl_cmd(&m, &f, &["--kl-divergence", junk.to_str().unwrap()]),
        "not a usable KL-divergence base file",
    );
}

#[test]
fn user_errors_are_one_clear_line() {
    let m = tiny();
    let f = text("e.txt", 12);
    let short = tmpdir().join("short.txt");
    std::fs::write(&short, "Hello there.").unwrap();
    let short = short.to_str().unwrap();
    let empty = tmpdir().join("empty.txt");
    std::fs::write(&empty, "  \n").unwrap();
    let empty = empty.to_str().unwrap();
    let missing = tmpdir().join("missing.txt");
    let missing = missing.to_str().unwrap();
    fails(&["perplexity", "-m", &m], "-f FILE");
    fails(&ppl_cmd(&m, missing, &[]), "missing.txt");
    fails(&ppl_cmd(&m, empty, &[]), "is empty");
    fails(&ppl_cmd(&m, short, &[]), "needs at least 64 (2 × c)");
    fails(
        &["perplexity", "-m", &m, "-f", &f, "-c", "2"],
        "-c must be at least 3",
    );
    fails(
        &["perplexity", "-m", &m, "-f", &f, "-c", "1024"],
        "context length of 256",
    );
    fails(
        &ppl_cmd(&m, &f, &["--chunks", "0"]),
        "--chunks must be at least 1",
    );
    fails(
        &ppl_cmd(&m, &f, &["--batch", "0"]),
        "--batch must be at least 1",
    );
    fails(
        &ppl_cmd("/nonexistent/model.flm", &f, &[]),
        "/nonexistent/model.flm",
    );
    let b = tmpdir().join("unsaved.bin");
    let b = b.to_str().unwrap();
    fails(&ppl_cmd(&m, &f, &["--kl-divergence-base", b]), "add --save");
    fails(
        &ppl_cmd(&m, &f, &["--save"]),
        "--save needs --kl-divergence-base",
    );
    fails(
        &ppl_cmd(
            &m,
            &f,
            &["--kl-divergence-base", b, "--save", "--kl-divergence", b],
        ),
        "not both",
    );
    fails(&ppl_cmd(&m, &f, &["--kl-divergence", b]), "does not exist");
}
