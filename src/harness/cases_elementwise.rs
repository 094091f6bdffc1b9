//! Harness cases for the elementwise ops.

use super::{CaseRng, OpCase};
use crate::data::DataType::F32;

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(1);
    for n in [1usize, 7, 33, 1000, 4099] {
        v.push(
            OpCase::new("AddTo", format!("f32 n={n}"), 1e-7)
                .inout("input0", rng.data(F32, &[n]))
                .input("input1", rng.data(F32, &[n]))
                .float("alpha", 0.75),
        );
    }
}
