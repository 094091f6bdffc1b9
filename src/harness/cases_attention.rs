//! Harness cases for `Attention`: decode (sq = 1) and prefill (sq > 1, also skv > sq), GQA ratios
//! 1/3/4, ALiBi on/off, soft-capping on/off, sliding window, non-causal, value head size ≠ key
//! head size, K/V caches expanded on axis 0 (reserved capacity), and attention sinks (with and
//! without a window, one sink far above the scores).

use super::{f32_data, CaseRng, OpCase};
use crate::data::{Data, DataType::F32};

/// K or V of `dims`, expanded to `cap` rows on axis 0 when `cap > dims[0]`.
fn kv(rng: &mut CaseRng, dims: &[usize], cap: usize) -> Data {
    let mut d = rng.data(F32, dims);
    if cap > dims[0] {
        d.reserve(0, cap).expect("harness: reserve");
    }
    d
}

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(13);
    // (sq, skv, nh, nkv, hd, hdv)
    let shapes = [
        (1usize, 1usize, 1usize, 1usize, 8usize, 8usize),
        (1, 37, 9, 3, 64, 64),
        (1, 100, 8, 2, 33, 33),
        (7, 7, 4, 4, 16, 16),
        (5, 23, 12, 4, 40, 24),
        (32, 96, 6, 2, 64, 64),
        // one KV head, many keys: on few threads the fast path splits the keys (flash-decoding)
        (1, 1500, 8, 1, 64, 64),
    ];
    for (sq, skv, nh, nkv, hd, hdv) in shapes {
        // options: (alibi, softcap, window, causal, expanded)
        let opts = [
            (false, 0.0, 0, 1, false),
            (true, 0.0, 0, 1, true),
            (false, 20.0, 0, 1, false),
            (false, 0.0, 5, 1, true),
            (true, 10.0, 3, 1, false),
            (false, 0.0, 0, 0, false),
        ];
        for (alibi, softcap, window, causal, expanded) in opts {
            let label = format!(
                "q[{sq},{nh},{hd}] kv[{skv},{nkv},{hd}/{hdv}] alibi={alibi} softcap={softcap} window={window} causal={causal} expanded={expanded}"
            );
            let cap = if expanded { skv + 13 } else { skv };
            let mut c = OpCase::new("Attention", label, 1e-7)
                .input("q", rng.data_range(F32, &[sq, nh, hd], -2.0, 2.0))
                .input("k", kv(&mut rng, &[skv, nkv, hd], cap))
                .input("v", kv(&mut rng, &[skv, nkv, hdv], cap))
                .output("output", F32)
                .float("softcap", softcap)
                .int("sliding_window", window)
                .int("causal", causal);
            if alibi {
                let slopes: Vec<f32> = (0..nh).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
                c = c.input("alibi_slopes", f32_data(&[nh], &slopes));
            }
            if hd == 33 {
                c = c.float("scale", 0.3);
            }
            v.push(c);
        }
    }
    sink_cases(v);
}

/// `Attention` with sinks: decode and prefill, GQA, with a window and soft-capping.
fn sink_cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(29);
    // (sq, skv, nh, nkv, hd, window, softcap)
    let shapes = [
        (1usize, 1usize, 2usize, 1usize, 8usize, 0usize, 0.0f32),
        (1, 37, 8, 2, 64, 8, 0.0),
        (1, 700, 4, 1, 64, 0, 0.0),
        (9, 9, 4, 2, 16, 0, 20.0),
        (33, 80, 6, 3, 64, 8, 0.0),
        (70, 70, 8, 2, 128, 0, 0.0),
    ];
    for (sq, skv, nh, nkv, hd, window, softcap) in shapes {
        let sinks: Vec<f32> = (0..nh).map(|h| [0.4, -1.5, 25.0, 2.0][h % 4]).collect();
        let label = format!(
            "sinks q[{sq},{nh},{hd}] kv[{skv},{nkv},{hd}] window={window} softcap={softcap}"
        );
        v.push(
            OpCase::new("Attention", label, 1e-7)
                .input("q", rng.data_range(F32, &[sq, nh, hd], -2.0, 2.0))
                .input("k", kv(&mut rng, &[skv, nkv, hd], skv + 5))
                .input("v", kv(&mut rng, &[skv, nkv, hd], skv))
                .input("sinks", f32_data(&[nh], &sinks))
                .output("output", F32)
                .float("softcap", softcap)
                .int("sliding_window", window as i32)
                .int("causal", 1),
        );
    }
}
