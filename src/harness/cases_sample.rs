//! Harness cases for `Sample` and `ApplyPenalties`. The sampling definition is exact (integer
//! weights, explicitly rounded f32 arithmetic), so every device must return the very same ids:
//! the threshold is 0. Rows mix greedy and sampled parameters, top-k / top-p / min-p, narrow
//! logits (every token a candidate) and wide ones (few candidates), ties (equal logits, so the
//! index decides the order), -Inf entries, and rows that must give -1 (NaN, +Inf, only -Inf).

use super::{f32_data, i32_data, CaseRng, OpCase};
use crate::data::Data;
use crate::data::DataType::{F32, I32};

/// Parameter sets (temperature, top_k, top_p, min_p) cycled over the rows.
const SETS: [(f32, f32, f32, f32); 9] = [
    (1.0, 0.0, 1.0, 0.0),
    (0.7, 0.0, 0.9, 0.0),
    (0.0, 0.0, 1.0, 0.0),
    (1.0, 1.0, 1.0, 0.0),
    (0.8, 40.0, 0.95, 0.0),
    (1.2, 0.0, 1.0, 0.05),
    (0.5, 5.0, 0.5, 0.1),
    (2.0, 1000.0, 0.3, 0.0),
    (1e-40, 0.0, 0.9, 0.0),
];

/// The `params` and `random` tables of a `Sample` case of `rows` rows, parameter sets cycled
/// from `first_set`.
fn tables(rng: &mut CaseRng, rows: usize, first_set: usize) -> (Data, Data) {
    let mut p = Vec::with_capacity(rows * 4);
    let mut r = Vec::with_capacity(rows * 2);
    for i in 0..rows {
        let (t, k, tp, mp) = SETS[(first_set + i) % SETS.len()];
        p.extend([t, k, tp, mp]);
        r.extend([rng.next_u64() as i32, rng.next_u64() as i32]);
    }
    (f32_data(&[rows, 4], &p), i32_data(&[rows, 2], &r))
}

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(61);
    sample_cases(&mut rng, v);
    penalty_cases(&mut rng, v);
}

/// `Sample` over logits of several widths and ranges, each with two cycles of parameter sets.
fn sample_cases(rng: &mut CaseRng, v: &mut Vec<OpCase>) {
    // (rows, n, logit range, special rows)
    for (rows, n, range, special) in [
        (1usize, 1usize, 1.0f32, false),
        (3, 7, 1.0, false),
        (8, 1000, 2.0, true),
        (8, 1000, 40.0, true),
        (16, 4099, 8.0, false),
        (2, 49152, 4.0, false),
        (4, 128256, 1.0, false),
        (9, 128256, 12.0, false),
        (64, 2048, 6.0, false),
    ] {
        let mut x = rng.vec(rows * n, -range, range);
        if special {
            special_rows(&mut x, n);
        }
        for first in [0usize, 3] {
            let (p, r) = tables(rng, rows, first);
            v.push(
                OpCase::new(
                    "Sample",
                    format!("f32 [{rows}, {n}] range {range} sets from {first}"),
                    0.0,
                )
                .input("input", f32_data(&[rows, n], &x))
                .input("params", p)
                .input("random", r)
                .output("output", I32),
            );
        }
    }
}

/// Rows 1 to 6 of logits `x` (rows of `n`) made special: row 1 ties (a few distinct values),
/// row 2 -Inf entries, row 3 a NaN, row 4 a +Inf, row 5 only -Inf, row 6 all equal.
fn special_rows(x: &mut [f32], n: usize) {
    for (j, e) in x[n..2 * n].iter_mut().enumerate() {
        *e = (j % 3) as f32 * 0.25;
    }
    for j in (0..n).step_by(3) {
        x[2 * n + j] = f32::NEG_INFINITY;
    }
    x[3 * n + n / 2] = f32::NAN;
    x[4 * n + 1] = f32::INFINITY;
    x[5 * n..6 * n].fill(f32::NEG_INFINITY);
    x[6 * n..7 * n].fill(0.5);
}

/// `ApplyPenalties`: m distinct tokens per row (padding -1 and an out-of-range id included).
fn penalty_cases(rng: &mut CaseRng, v: &mut Vec<OpCase>) {
    for (rows, n, m) in [(1usize, 10usize, 3usize), (4, 1000, 17), (8, 128256, 200)] {
        let x = rng.data(F32, &[rows, n]);
        let mut toks = Vec::new();
        let mut counts = Vec::new();
        let mut params = Vec::new();
        for r in 0..rows {
            let stride = (n / m).max(1);
            let off = rng.below(stride as u64) as usize;
            for j in 0..m {
                toks.push(match j {
                    0 => -1,
                    1 => n as i32 + 5,
                    _ => ((off + j * stride) % n) as i32,
                });
                counts.push(1 + rng.below(4) as i32);
            }
            params.extend([
                [1.3, 1.0, 0.7][r % 3],
                [0.0, 0.5, 0.25][r % 3],
                [0.1, 0.0, 0.3][r % 3],
            ]);
        }
        v.push(
            OpCase::new("ApplyPenalties", format!("f32 [{rows}, {n}] m={m}"), 0.0)
                .inout("input", x)
                .input("tokens", i32_data(&[rows, m], &toks))
                .input("counts", i32_data(&[rows, m], &counts))
                .input("params", f32_data(&[rows, 3], &params)),
        );
    }
}
