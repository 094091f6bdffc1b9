//! Harness cases for the elementwise ops: `AddTo` and `MulTo` (same shape and row broadcast),
//! `Add`, `Mul`, from one element to sizes that run in parallel.

use super::{CaseRng, OpCase};
use crate::data::DataType::F32;

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(1);
    for n in [1usize, 7, 33, 1000, 4099, 70001] {
        v.push(
            OpCase::new("AddTo", format!("f32 n={n}"), 1e-7)
                .inout("input0", rng.data(F32, &[n]))
                .input("input1", rng.data(F32, &[n]))
                .float("alpha", 0.75),
        );
        v.push(
            OpCase::new("MulTo", format!("f32 n={n}"), 1e-7)
                .inout("input0", rng.data(F32, &[n]))
                .input("input1", rng.data(F32, &[n])),
        );
        v.push(
            OpCase::new("Add", format!("f32 n={n}"), 1e-7)
                .input("input0", rng.data(F32, &[n]))
                .input("input1", rng.data(F32, &[n]))
                .output("output", F32)
                .float("alpha", -1.5),
        );
        v.push(
            OpCase::new("Mul", format!("f32 n={n}"), 1e-7)
                .input("input", rng.data(F32, &[n]))
                .output("output", F32)
                .float("v", 0.125),
        );
    }
    for (rows, d) in [(1usize, 1usize), (3, 7), (5, 33), (64, 576), (300, 100)] {
        v.push(
            OpCase::new(
                "AddTo",
                format!("f32 [{rows}, {d}] + [{d}] broadcast"),
                1e-7,
            )
            .inout("input0", rng.data(F32, &[rows, d]))
            .input("input1", rng.data(F32, &[d]))
            .float("alpha", 2.0),
        );
        v.push(
            OpCase::new(
                "MulTo",
                format!("f32 [{rows}, {d}] * [{d}] broadcast"),
                1e-7,
            )
            .inout("input0", rng.data(F32, &[rows, d]))
            .input("input1", rng.data(F32, &[d])),
        );
    }
}
