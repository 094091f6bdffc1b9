//! Harness cases for `RotaryEmbedding`: both styles, full and partial rotary dims, all three
//! frequency sources (theta, `inv_freq`, explicit cos/sin), one row and many.

use super::{i32_data, CaseRng, OpCase};
use crate::data::DataType::F32;

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(14);
    // (s, heads, hd, rot)
    for (s, heads, hd, rot) in [
        (1usize, 1usize, 2usize, 2usize),
        (1, 9, 64, 64),
        (5, 3, 10, 6),
        (17, 4, 64, 32),
        (200, 9, 64, 64),
    ] {
        let half = rot / 2;
        let pos: Vec<i32> = (0..s)
            .map(|t| (rng.below(4096) as i32) + t as i32)
            .collect();
        for style in [0, 1] {
            for source in ["theta", "inv_freq", "cos_sin"] {
                let mut c = OpCase::new(
                    "RotaryEmbedding",
                    format!("[{s},{heads},{hd}] rot={rot} style={style} {source}"),
                    1e-7,
                )
                .inout("input", rng.data(F32, &[s, heads, hd]))
                .int("rotary_dim", rot as i32)
                .int("style", style);
                match source {
                    "theta" => {
                        c = c
                            .input("positions", i32_data(&[s], &pos))
                            .float("theta", 500000.0)
                    }
                    "inv_freq" => {
                        c = c
                            .input("positions", i32_data(&[s], &pos))
                            .input("inv_freq", rng.data_range(F32, &[half], 1e-4, 1.0))
                    }
                    _ => {
                        c = c
                            .input("cos", rng.data(F32, &[s, half]))
                            .input("sin", rng.data(F32, &[s, half]));
                    }
                }
                v.push(c);
            }
        }
    }
}
