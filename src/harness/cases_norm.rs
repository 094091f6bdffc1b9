//! Harness cases for the normalisation ops (`RMSNorm`, `LayerNorm`): odd and SIMD-sized rows,
//! one row and many, 3-D inputs.

use super::{CaseRng, OpCase};
use crate::data::DataType::F32;

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(11);
    let shapes: [&[usize]; 6] = [
        &[1, 1],
        &[1, 7],
        &[3, 33],
        &[1, 576],
        &[2, 5, 100],
        &[64, 576],
    ];
    for dims in shapes {
        let d = dims[dims.len() - 1];
        v.push(
            OpCase::new("RMSNorm", format!("f32 {dims:?}"), 1e-7)
                .input("input", rng.data_range(F32, dims, -3.0, 3.0))
                .input("weight", rng.data_range(F32, &[d], 0.5, 1.5))
                .output("output", F32)
                .float("eps", 1e-6),
        );
        v.push(
            OpCase::new("LayerNorm", format!("f32 {dims:?}"), 1e-7)
                .input("input", rng.data_range(F32, dims, -3.0, 3.0))
                .input("gamma", rng.data_range(F32, &[d], 0.5, 1.5))
                .input("beta", rng.data(F32, &[d]))
                .output("output", F32)
                .float("eps", 1e-5),
        );
    }
}
