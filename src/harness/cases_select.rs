//! Harness cases for `TopK` and `ArgMax`: k of 1, a few, and all; rows not multiples of 8; a
//! vocabulary-sized row; batch 1 and > 1; rows full of ties. Results are exact, so the threshold
//! is 0.

use super::{CaseRng, OpCase};
use crate::data::Data;
use crate::data::DataType::{F32, I32};

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(16);
    for (rows, n) in [
        (1usize, 1usize),
        (1, 7),
        (3, 33),
        (1, 49152),
        (4, 1000),
        (64, 257),
    ] {
        v.push(
            OpCase::new("ArgMax", format!("f32 [{rows}, {n}]"), 0.0)
                .input("input", rng.data(F32, &[rows, n]))
                .output("output", I32),
        );
        for k in [1usize, 5, 40, n] {
            if k > n {
                continue;
            }
            v.push(
                OpCase::new("TopK", format!("f32 [{rows}, {n}] k={k}"), 0.0)
                    .input("input", rng.data(F32, &[rows, n]))
                    .output("output", F32)
                    .int("k", k as i32),
            );
        }
    }
    // many ties (13 distinct values): the lowest index must win whichever thread sees it; rows
    // of 4099 values start unaligned after the first, a vocabulary-sized row of 128256 stays
    // aligned (the GPU's float4 scan) with a tail-free length
    for (rows, n) in [(3usize, 4099usize), (1, 128256)] {
        let vals: Vec<f32> = (0..rows * n).map(|i| ((i * 7919) % 13) as f32).collect();
        let x = || Data::from_f32(&[rows, n], &vals).expect("tie rows");
        v.push(
            OpCase::new("ArgMax", format!("f32 [{rows}, {n}] ties"), 0.0)
                .input("input", x())
                .output("output", I32),
        );
        v.push(
            OpCase::new("TopK", format!("f32 [{rows}, {n}] k=3 ties"), 0.0)
                .input("input", x())
                .output("output", F32)
                .int("k", 3),
        );
    }
}
