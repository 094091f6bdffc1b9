//! Harness cases for the paged KV-cache ops (`PagedAttention` also with attention sinks).

use super::{f32_data, i32_data, CaseRng, OpCase};
use crate::data::DataType::F32;

/// One `PagedAttention` shape.
struct Shape {
    nh: usize,
    nkv: usize,
    hd: usize,
    /// Tokens per block.
    bs: usize,
    /// (new rows, cached length) of each sequence.
    seqs: &'static [(usize, usize)],
    alibi: bool,
    softcap: f32,
    window: usize,
    sinks: bool,
}

/// A shape with no per-head terms, soft-capping or window.
const fn plain(
    nh: usize,
    nkv: usize,
    hd: usize,
    bs: usize,
    seqs: &'static [(usize, usize)],
) -> Shape {
    Shape {
        nh,
        nkv,
        hd,
        bs,
        seqs,
        alibi: false,
        softcap: 0.0,
        window: 0,
        sinks: false,
    }
}

const SHAPES: [Shape; 10] = [
    plain(4, 4, 16, 16, &[(1, 1)]),
    plain(6, 2, 24, 4, &[(1, 9), (3, 3), (1, 33)]),
    Shape {
        alibi: true,
        ..plain(8, 2, 32, 16, &[(5, 20), (1, 47), (2, 2)])
    },
    Shape {
        softcap: 30.0,
        ..plain(3, 1, 20, 8, &[(7, 7)])
    },
    Shape {
        window: 5,
        ..plain(4, 4, 17, 4, &[(2, 13), (1, 5)])
    },
    plain(12, 3, 64, 16, &[(1, 70), (1, 16), (1, 1), (4, 40)]),
    // SmolLM2's heads (GQA groups of 3) in a decode batch
    plain(9, 3, 64, 16, &[(1, 50), (1, 18), (2, 33)]),
    // groups of 7 (more than one block of query heads per key load), soft-capping and a
    // window on the grouped SIMD path
    Shape {
        softcap: 20.0,
        window: 6,
        ..plain(14, 2, 32, 8, &[(3, 21), (1, 9)])
    },
    // with sinks: a window, then GQA decode rows of several blocks
    Shape {
        window: 8,
        sinks: true,
        ..plain(4, 2, 64, 16, &[(3, 40), (1, 9)])
    },
    Shape {
        sinks: true,
        ..plain(8, 2, 64, 16, &[(1, 70), (1, 1), (2, 33)])
    },
];

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(77);
    for z in &SHAPES {
        let layout = Layout::new(&mut rng, z);
        v.push(attention_case(&mut rng, z, &layout));
        v.push(cache_write_case(&mut rng, z, &layout));
    }
}

/// The block pool of one case: every sequence's blocks taken from a random permutation of the
/// pool's block ids.
struct Layout {
    /// Blocks in the pool.
    n_blocks: usize,
    /// Entries of each block table.
    max_blocks: usize,
    /// [sequences, max_blocks] block ids, -1 past a sequence's length.
    table: Vec<i32>,
    /// First query row of each sequence, and the total.
    q_starts: Vec<i32>,
    kv_lens: Vec<i32>,
}

impl Layout {
    fn new(rng: &mut CaseRng, z: &Shape) -> Layout {
        let (seqs, bs) = (z.seqs, z.bs);
        let max_blocks = seqs.iter().map(|s| s.1.div_ceil(bs)).max().unwrap_or(1) + 1;
        let n_blocks = seqs.len() * max_blocks + 3;
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
        Layout {
            n_blocks,
            max_blocks,
            table,
            q_starts,
            kv_lens,
        }
    }

    /// Query rows of all sequences.
    fn rows(&self) -> usize {
        *self.q_starts.last().unwrap_or(&0) as usize
    }
}

/// The `PagedAttention` case of shape `z` over the pool `l`.
fn attention_case(rng: &mut CaseRng, z: &Shape, l: &Layout) -> OpCase {
    let (nh, nkv, hd, bs) = (z.nh, z.nkv, z.hd, z.bs);
    let (rows, slots) = (l.rows(), l.n_blocks * bs);
    let label = format!(
        "nh={nh} nkv={nkv} hd={hd} bs={bs} seqs={:?} alibi={} softcap={} window={} sinks={}",
        z.seqs, z.alibi, z.softcap, z.window, z.sinks
    );
    let mut c = OpCase::new("PagedAttention", label, 1e-9)
        .input("q", rng.data(F32, &[rows, nh, hd]))
        .input("k_cache", rng.data(F32, &[slots, nkv, hd]))
        .input("v_cache", rng.data(F32, &[slots, nkv, hd]))
        .input("q_starts", i32_data(&[l.q_starts.len()], &l.q_starts))
        .input("kv_lens", i32_data(&[l.kv_lens.len()], &l.kv_lens))
        .input(
            "block_tables",
            i32_data(&[z.seqs.len(), l.max_blocks], &l.table),
        )
        .output("output", F32)
        .float("scale", 1.0 / (hd as f32).sqrt())
        .int("block_size", bs as i32);
    if z.alibi {
        c = c.input("alibi_slopes", rng.data_range(F32, &[nh], 0.01, 0.5));
    }
    if z.softcap > 0.0 {
        c = c.float("softcap", z.softcap);
    }
    if z.sinks {
        let s: Vec<f32> = (0..nh).map(|h| [0.4, -1.5, 25.0, 2.0][h % 4]).collect();
        c = c.input("sinks", f32_data(&[nh], &s));
    }
    if z.window > 0 {
        c = c.int("sliding_window", z.window as i32);
    }
    c
}

/// The `PagedCacheWrite` case matching the attention case of shape `z`: every new row stored
/// into a slot of the pool `l`.
fn cache_write_case(rng: &mut CaseRng, z: &Shape, l: &Layout) -> OpCase {
    let (nkv, hd) = (z.nkv, z.hd);
    let (rows, slots) = (l.rows(), l.n_blocks * z.bs);
    let slots_of_new: Vec<i32> = (0..rows as i32)
        .map(|i| (i * 7 + 3) % slots as i32)
        .collect();
    OpCase::new(
        "PagedCacheWrite",
        format!("rows={rows} slots={slots} nkv={nkv} hd={hd}"),
        0.0,
    )
    .input("input", rng.data(F32, &[rows, nkv, hd]))
    .input("slots", i32_data(&[rows], &slots_of_new))
    .inout("cache", rng.data(F32, &[slots, nkv, hd]))
}
