//! The op harness as a performance suite: every case of `fastllm::harness::all_cases` timed on
//! the fast CPU device and on the scalar reference device (median of repeated runs), one line per
//! case, plus a per-op summary.
//!
//!   cargo bench --bench ops -- [--threads N] [--reps R] [--filter OP]

use fastllm::devices::cpu::{CpuDevice, KernelMode};
use fastllm::harness::{all_cases, time_case};
use fastllm::Executor;
use std::collections::BTreeMap;
use std::sync::Arc;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = arg(&args, "--threads")
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let reps: usize = arg(&args, "--reps")
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let filter = arg(&args, "--filter");
    let mk = |mode, t| -> Executor {
        let mut e = Executor::new();
        match CpuDevice::with_mode(t, mode) {
            Ok(d) => e.add_device(Arc::new(d)),
            Err(err) => {
                eprintln!("cannot start the CPU device: {err}");
                std::process::exit(1);
            }
        }
        e
    };
    let fast = mk(KernelMode::Fast, threads);
    let reference = mk(KernelMode::Reference, 1);
    println!("threads {threads}, median of {reps}; µs per call");
    println!(
        "{:<16} {:>10} {:>10} {:>8}  case",
        "op", "fast", "reference", "speedup"
    );
    let mut per_op: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for case in all_cases() {
        if filter.as_deref().is_some_and(|f| f != case.op) {
            continue;
        }
        let (Ok(tf), Ok(tr)) = (
            time_case(&case, &fast, reps),
            time_case(&case, &reference, reps),
        ) else {
            println!("{:<16} failed: {}", case.op, case.label);
            continue;
        };
        let (f, r) = (tf.as_secs_f64() * 1e6, tr.as_secs_f64() * 1e6);
        println!(
            "{:<16} {:>10.2} {:>10.2} {:>7.1}x  {}",
            case.op,
            f,
            r,
            r / f.max(1e-9),
            case.label
        );
        let e = per_op.entry(case.op).or_default();
        e.0 += f;
        e.1 += r;
    }
    println!("\nper op (sum over cases)");
    for (op, (f, r)) in per_op {
        println!("{op:<16} {f:>10.1} {r:>10.1} {:>7.1}x", r / f.max(1e-9));
    }
}
