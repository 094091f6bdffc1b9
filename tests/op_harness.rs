//! Runs every harness case on the fast CPU device against the scalar reference CPU device.

use fastllm::devices::cpu::{CpuDevice, KernelMode};
use fastllm::harness::{all_cases, check_case};
use fastllm::Executor;
use std::sync::Arc;

fn executor(mode: KernelMode, threads: usize) -> Executor {
    let mut e = Executor::new();
    e.add_device(Arc::new(CpuDevice::with_mode(threads, mode).unwrap()));
    e
}

#[test]
fn cpu_fast_matches_reference() {
    let reference = executor(KernelMode::Reference, 1);
    let fast = executor(KernelMode::Fast, 2);
    let mut failures = Vec::new();
    let cases = all_cases();
    assert!(!cases.is_empty());
    for case in &cases {
        let r = check_case(case, &fast, &reference).unwrap();
        if let Some(f) = &r.failure {
            failures.push(format!("{}: {f}", r.name));
        }
    }
    println!("{} cases checked", cases.len());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
