//! Harness cases for `Embedding`: every weight dtype, odd token counts, repeated ids, ids at both
//! ends of the vocabulary. The lookup is exact, so the threshold is 0.

use super::{i32_data, CaseRng, OpCase};
use crate::data::DataType;

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(17);
    use DataType::*;
    for dt in [F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4K, Q5K, Q6K] {
        let shapes = if dt.is_kquant() {
            [
                (1usize, 256usize, 1usize),
                (50, 512, 7),
                (1000, 768, 33),
                (300, 256, 200),
            ]
        } else {
            [(1, 32, 1), (50, 64, 7), (1000, 576, 33), (300, 96, 200)]
        };
        for (vocab, d, n) in shapes {
            let mut ids: Vec<i32> = (0..n).map(|_| rng.below(vocab as u64) as i32).collect();
            if let Some(first) = ids.first_mut() {
                *first = vocab as i32 - 1;
            }
            if n > 2 {
                ids[1] = 0;
                ids[2] = ids[0];
            }
            v.push(
                OpCase::new("Embedding", format!("{dt} [{vocab}, {d}] n={n}"), 0.0)
                    .input("input", i32_data(&[n], &ids))
                    .input("weight", rng.data(dt, &[vocab, d]))
                    .output("output", F32),
            );
        }
    }
}
