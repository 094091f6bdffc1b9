//! Harness cases for the activations and softmax: `Softmax`, `Silu`, `Gelu` (tanh and erf),
//! `SoftCap`, `Swiglu`, `GeluGated`, `ClampedSwiglu` (inputs past its limit), over sizes that are not multiples of 8/32/64 and larger
//! ones that run in parallel.

use super::{CaseRng, OpCase};
use crate::data::DataType::F32;

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(12);
    let shapes: [&[usize]; 5] = [&[1, 1], &[1, 7], &[3, 33], &[5, 100], &[2, 4, 8193]];
    for dims in shapes {
        v.push(
            OpCase::new("Softmax", format!("f32 {dims:?}"), 1e-7)
                .input("input", rng.data_range(F32, dims, -10.0, 10.0))
                .output("output", F32),
        );
        v.push(
            OpCase::new("Silu", format!("f32 {dims:?}"), 1e-7)
                .input("input", rng.data_range(F32, dims, -6.0, 6.0))
                .output("output", F32),
        );
        for approx in [1, 0] {
            v.push(
                OpCase::new("Gelu", format!("f32 {dims:?} approx={approx}"), 1e-7)
                    .input("input", rng.data_range(F32, dims, -6.0, 6.0))
                    .output("output", F32)
                    .int("approx", approx),
            );
        }
        v.push(
            OpCase::new("SoftCap", format!("f32 {dims:?} cap=30"), 1e-7)
                .input("input", rng.data_range(F32, dims, -60.0, 60.0))
                .output("output", F32)
                .float("cap", 30.0),
        );
        let mut gated = dims.to_vec();
        if let Some(l) = gated.last_mut() {
            *l *= 2;
        }
        v.push(
            OpCase::new("Swiglu", format!("f32 {gated:?}"), 1e-7)
                .input("input", rng.data_range(F32, &gated, -4.0, 4.0))
                .output("output", F32),
        );
        for approx in [1, 0] {
            v.push(
                OpCase::new("GeluGated", format!("f32 {gated:?} approx={approx}"), 1e-7)
                    .input("input", rng.data_range(F32, &gated, -4.0, 4.0))
                    .output("output", F32)
                    .int("approx", approx),
            );
        }
    }
    let mut rng = CaseRng::new(31);
    for dims in [&[1usize, 1][..], &[3, 33], &[5, 100], &[2, 4100]] {
        v.push(
            OpCase::new("ClampedSwiglu", format!("f32 {dims:?}"), 1e-7)
                .input("input0", rng.data_range(F32, dims, -10.0, 10.0))
                .input("input1", rng.data_range(F32, dims, -10.0, 10.0))
                .output("output", F32)
                .float("alpha", 1.702)
                .float("limit", 7.0),
        );
    }
}
