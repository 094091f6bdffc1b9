//! Harness cases for the paged KV-cache ops (`PagedAttention` also with attention sinks).

use super::{CaseRng, OpCase};
use crate::data::{Data, DataType::F32};

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(77);
    // (heads, kv heads, head dim, block size, [(new rows, cached len)], alibi, softcap, window)
    type Shape = (
        usize,
        usize,
        usize,
        usize,
        &'static [(usize, usize)],
        bool,
        f32,
        usize,
    );
    let shapes: [Shape; 10] = [
        (4, 4, 16, 16, &[(1, 1)], false, 0.0, 0),
        (6, 2, 24, 4, &[(1, 9), (3, 3), (1, 33)], false, 0.0, 0),
        (8, 2, 32, 16, &[(5, 20), (1, 47), (2, 2)], true, 0.0, 0),
        (3, 1, 20, 8, &[(7, 7)], false, 30.0, 0),
        (4, 4, 17, 4, &[(2, 13), (1, 5)], false, 0.0, 5),
        (
            12,
            3,
            64,
            16,
            &[(1, 70), (1, 16), (1, 1), (4, 40)],
            false,
            0.0,
            0,
        ),
        // SmolLM2's heads (GQA groups of 3) in a decode batch
        (9, 3, 64, 16, &[(1, 50), (1, 18), (2, 33)], false, 0.0, 0),
        // groups of 7 (more than one block of query heads per key load), soft-capping and a
        // window on the grouped SIMD path
        (14, 2, 32, 8, &[(3, 21), (1, 9)], false, 20.0, 6),
        // with sinks (the shapes below): a window, then GQA decode rows of several blocks
        (4, 2, 64, 16, &[(3, 40), (1, 9)], false, 0.0, 8),
        (8, 2, 64, 16, &[(1, 70), (1, 1), (2, 33)], false, 0.0, 0),
    ];
    for (si, (nh, nkv, hd, bs, seqs, alibi, softcap, window)) in shapes.into_iter().enumerate() {
        let sinks = si >= 8;
        let max_blocks = seqs.iter().map(|s| s.1.div_ceil(bs)).max().unwrap_or(1) + 1;
        let n_blocks = seqs.len() * max_blocks + 3;
        // a random permutation of block ids shared out to the sequences
        let mut ids: Vec<i32> = (0..n_blocks as i32).collect();
        for i in (1..ids.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            ids.swap(i, j);
        }
        let mut table = vec![-1i32; seqs.len() * max_blocks];
        let mut next = 0;
        let mut q_starts = vec![0i32];
        let mut kv_lens = Vec::new();
        for (s, &(nq, len)) in seqs.iter().enumerate() {
            for b in 0..len.div_ceil(bs) {
                table[s * max_blocks + b] = ids[next];
                next += 1;
            }
            q_starts.push(q_starts[s] + nq as i32);
            kv_lens.push(len as i32);
        }
        let rows = *q_starts.last().unwrap_or(&0) as usize;
        let slots = n_blocks * bs;
        let label = format!(
            "nh={nh} nkv={nkv} hd={hd} bs={bs} seqs={seqs:?} alibi={alibi} softcap={softcap} window={window} sinks={sinks}"
        );
        let mut c = OpCase::new("PagedAttention", label, 1e-9)
            .input("q", rng.data(F32, &[rows, nh, hd]))
            .input("k_cache", rng.data(F32, &[slots, nkv, hd]))
            .input("v_cache", rng.data(F32, &[slots, nkv, hd]))
            .input(
                "q_starts",
                Data::from_i32(&[q_starts.len()], &q_starts).unwrap_or_else(|_| Data::empty(F32)),
            )
            .input(
                "kv_lens",
                Data::from_i32(&[kv_lens.len()], &kv_lens).unwrap_or_else(|_| Data::empty(F32)),
            )
            .input(
                "block_tables",
                Data::from_i32(&[seqs.len(), max_blocks], &table)
                    .unwrap_or_else(|_| Data::empty(F32)),
            )
            .output("output", F32)
            .float("scale", 1.0 / (hd as f32).sqrt())
            .int("block_size", bs as i32);
        if alibi {
            c = c.input("alibi_slopes", rng.data_range(F32, &[nh], 0.01, 0.5));
        }
        if softcap > 0.0 {
            c = c.float("softcap", softcap);
        }
        if sinks {
            let s: Vec<f32> = (0..nh).map(|h| [0.4, -1.5, 25.0, 2.0][h % 4]).collect();
            c = c.input(
                "sinks",
                Data::from_f32(&[nh], &s).unwrap_or_else(|_| Data::empty(F32)),
            );
        }
        if window > 0 {
            c = c.int("sliding_window", window as i32);
        }
        v.push(c);
        // the matching cache write
        let slots_of_new: Vec<i32> = (0..rows as i32)
            .map(|i| (i * 7 + 3) % slots as i32)
            .collect();
        v.push(
            OpCase::new(
                "PagedCacheWrite",
                format!("rows={rows} slots={slots} nkv={nkv} hd={hd}"),
                0.0,
            )
            .input("input", rng.data(F32, &[rows, nkv, hd]))
            .input(
                "slots",
                Data::from_i32(&[rows], &slots_of_new).unwrap_or_else(|_| Data::empty(F32)),
            )
            .inout("cache", rng.data(F32, &[slots, nkv, hd])),
        );
    }
}
