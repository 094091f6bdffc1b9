//! Block-weight (Q8_0 / Q4_0 / Q4_1) products with a few Q8_0 activation rows on int8 tensor
//! cores: the `linear_mmq_w{wr}u{nu}m{wm}n{wn}k{wk}_*` kernels of kernels/linear_mmq.cu read
//! each weight block once for up to [`MMQ_SLICE_ROWS`] activation rows (staged with them in
//! shared memory), take one `mma` (s8 × s8 → s32) per 32-value block of 16 weight rows and 8
//! activation rows, and scale its integer sums by the two blocks' scales in f32. Each kernel is
//! one tile shape ([`MmqShape`]: how many weight and activation tiles a warp holds, how the
//! warps of a block divide rows and k); [`MmqPlan`] picks one per row count, and for
//! batch-invariant products one that adds the blocks of k in order. Short weights are split along k over
//! several blocks ([`MmqPlan`]; `mm_split` launches them and adds the splits in a fixed
//! order; in a launch of several weights each keeps the plan of its product alone). Knows
//! nothing of ops: `Linear` decides when to call
//! [`mmq_product`] and provides the quantized activation rows.

use super::buffer::CudaBuffer;
use super::gpu::{Gpu, KArg};
use super::mm_split::{Product, SegPlan, SplitLaunch, Tiling};
use super::op_err;
use crate::error::Result;
use std::sync::{Arc, Mutex};

/// k values per staged chunk (`MMQ_KC`); the kernels need `k % MMQ_KC == 0`.
pub(super) const MMQ_KC: usize = 128;
/// Activation rows one launch slice covers (the largest tile, 8 · 16); more rows take several
/// slices, each reading the weight again.
pub(super) const MMQ_SLICE_ROWS: usize = 128;
/// Chunks in flight per block (`MMQ_STAGES`).
const STAGES: usize = 3;
/// Bytes per staged activation row (`MMQ_XROW`).
const XROW: usize = MMQ_KC + 16;
/// Most k splits of one product.
const MAX_SPLITS: usize = 8;
/// Fewest chunks of k per split.
const MIN_SPLIT_CHUNKS: usize = 4;

/// The tile shape of one `linear_mmq` kernel: each warp holds `wr` 16-row weight tiles × `nu`
/// 8-row activation tiles; a block has `wm` × `wn` × `wk` warps (`wk` > 1: the warps split each
/// chunk's blocks and add their sums at the end); `bps` blocks fit a multiprocessor (by their
/// registers), which the automatic k split aims to fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmqShape {
    /// 16-row weight tiles per warp.
    pub wr: usize,
    /// 8-row activation tiles per warp.
    pub nu: usize,
    /// Warps along the weight rows.
    pub wm: usize,
    /// Warps along the activation rows.
    pub wn: usize,
    /// Warps along k (each takes every `wk`-th block of a chunk).
    pub wk: usize,
    /// Blocks per multiprocessor the automatic k split aims at.
    pub bps: usize,
}

const fn shape(wr: usize, nu: usize, wm: usize, wn: usize, wk: usize, bps: usize) -> MmqShape {
    MmqShape {
        wr,
        nu,
        wm,
        wn,
        wk,
        bps,
    }
}

/// The compiled shapes for 1, 2, 4, 8 and 16 activation tiles per slice (the kernels of
/// kernels/linear_mmq.cu), the device's choice (the fastest on an H100) first, then, where
/// that one splits k among warps, the fastest that adds the blocks in order.
const SHAPES: [&[MmqShape]; 5] = [
    &[shape(2, 1, 4, 1, 2, 2), shape(1, 1, 8, 1, 1, 3)],
    &[shape(2, 2, 4, 1, 2, 2), shape(1, 2, 8, 1, 1, 3)],
    &[shape(1, 4, 8, 1, 1, 3)],
    &[shape(2, 4, 4, 2, 1, 2)],
    &[shape(1, 16, 8, 1, 1, 2)],
];

impl MmqShape {
    /// Weight rows per block.
    pub fn block_rows(&self) -> usize {
        self.wm * self.wr * 16
    }

    /// Threads per block.
    pub fn threads(&self) -> usize {
        32 * self.wm * self.wn * self.wk
    }

    /// The shape for `nt` activation tiles per slice (a power of two up to 16): `variant`
    /// indexes the compiled ones (0: the device's choice; past the last: the last); with
    /// `same_order`, the first whose warps add every block of k in order (`wk` = 1: the same
    /// arithmetic for every row count).
    pub fn pick(nt: usize, variant: usize, same_order: bool) -> Option<MmqShape> {
        let all = SHAPES.get(nt.checked_ilog2()? as usize)?;
        if same_order {
            return all.iter().copied().find(|s| s.wk == 1);
        }
        all.get(variant.min(all.len() - 1)).copied()
    }
}

/// How one product runs: the tile `shape` (`nt` 8-row activation tiles per slice), `slices`
/// slices, `tiles` blocks of weight rows, `splits` parts of k per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmqPlan {
    /// The kernel's tile shape.
    pub shape: MmqShape,
    /// 8-row activation tiles per block (1, 2, 4, 8 or 16).
    pub nt: usize,
    /// Activation row slices (grid z).
    pub slices: usize,
    /// Blocks of weight rows (grid x).
    pub tiles: usize,
    /// k splits (grid y); above 1 the partial sums go through the scratch buffer.
    pub splits: usize,
}

impl MmqPlan {
    /// The plan for `m` activation rows, `ntot` weight rows of `k` values on a GPU of `sms`
    /// multiprocessors; `splits` > 0 forces the number of k splits (clamped to the chunks of
    /// k), `variant` picks the tile shape ([`MmqShape::pick`]; `same_order`: one that adds the
    /// blocks of k in order). `None` when the kernels do not take the shape
    /// (`k % MMQ_KC != 0`, no rows).
    pub fn new(
        m: usize,
        k: usize,
        ntot: usize,
        sms: usize,
        splits: usize,
        variant: usize,
        same_order: bool,
    ) -> Option<MmqPlan> {
        let nt = Tiling::new(m, k, ntot, MMQ_SLICE_ROWS, 16, MMQ_KC)?.nt;
        let shape = MmqShape::pick(nt, variant, same_order)?;
        let t = Tiling::new(m, k, ntot, MMQ_SLICE_ROWS, shape.block_rows(), MMQ_KC)?;
        // (partial sums cost more than a part-empty last wave: round down)
        let auto = (shape.bps * sms / (t.tiles * t.slices))
            .clamp(1, MAX_SPLITS)
            .min((t.chunks / MIN_SPLIT_CHUNKS).max(1));
        let splits = if splits > 0 { splits } else { auto };
        Some(MmqPlan {
            shape,
            nt: t.nt,
            slices: t.slices,
            tiles: t.tiles,
            splits: splits.clamp(1, t.chunks),
        })
    }

    /// Dynamic shared memory per block for weights of `block_bytes` per 32 values: the stages
    /// of one chunk of the block's weight rows, activation rows and their scales.
    pub fn smem(&self, block_bytes: usize) -> usize {
        let wrow = if block_bytes == 34 {
            144
        } else {
            MMQ_KC / 32 * block_bytes
        };
        let stage = self.shape.block_rows() * wrow + 8 * self.nt * (XROW + MMQ_KC / 32 * 8);
        STAGES * stage
    }

    /// The kernel of this plan for weights of kernel suffix `suffix`.
    fn kernel(&self, suffix: &str) -> String {
        let s = self.shape;
        format!(
            "linear_mmq_w{}u{}m{}n{}k{}_{suffix}",
            s.wr, s.nu, s.wm, s.wn, s.wk
        )
    }
}

/// The Q8_0 activation rows of a product: `rows · k` int8 values at `values`, the `rows · k / 32`
/// (d, d·Σq) float pairs at `scales` (both 16-byte aligned).
#[derive(Clone, Copy, Debug)]
pub struct Q8Rows {
    /// Address of the int8 values.
    pub values: u64,
    /// Address of the block scales.
    pub scales: u64,
}

/// `y_i (+)= x·W_iᵀ + b_i` for the segments of the product `p` (one launch; `acc` in its table
/// adds to the outputs), `x` the Q8_0 rows [m, k] on the GPU, block weights of kernel suffix
/// `suffix`, `plans[i]` the plan of segment i's product alone (all of one tile shape). `part`
/// is the scratch for split partial sums.
pub fn mmq_product(
    gpu: &Arc<Gpu>,
    plans: &[MmqPlan],
    suffix: &str,
    x: Q8Rows,
    p: Product,
    part: &Mutex<Option<CudaBuffer>>,
) -> Result<()> {
    let Some(plan) = plans.first() else {
        return Ok(());
    };
    if plans
        .iter()
        .any(|q| (q.shape, q.slices) != (plan.shape, plan.slices))
    {
        return Err(op_err("Linear", "segment plans of different tile shapes"));
    }
    let seg_plans: Vec<SegPlan> = plans
        .iter()
        .map(|q| SegPlan {
            tiles: q.tiles,
            splits: q.splits,
        })
        .collect();
    let launch = SplitLaunch {
        kernel: &plan.kernel(suffix),
        slices: plan.slices,
        seg_plans: &seg_plans,
        threads: plan.shape.threads() as u32,
        smem: plan.smem(p.row_bytes / (p.k / 32)),
        product: p,
        out_half: None,
    };
    launch.run(gpu, vec![KArg::Ptr(x.values), KArg::Ptr(x.scales)], part)
}

#[cfg(test)]
mod tests {
    use super::{MmqPlan, MmqShape, SHAPES};

    fn plan(m: usize, k: usize, ntot: usize, splits: usize) -> MmqPlan {
        MmqPlan::new(m, k, ntot, 132, splits, 0, false).unwrap()
    }

    #[test]
    fn shapes_cover_their_tiles_and_fit_the_join() {
        for (i, shapes) in SHAPES.iter().enumerate() {
            assert!(
                shapes.iter().any(|s| s.wk == 1),
                "a same-order shape for {} tiles",
                1 << i
            );
            for s in shapes.iter() {
                assert_eq!(s.wn * s.nu, 1 << i, "{s:?}");
                assert!(s.threads() == 128 || s.threads() == 256, "{s:?}");
                assert_eq!(4 % (2 * s.wk), 0, "{s:?}: blocks in pairs");
            }
        }
        assert_eq!(MmqShape::pick(8, 0, true).unwrap().wk, 1);
        assert_eq!(MmqShape::pick(8, 99, false), SHAPES[3].last().copied());
        assert!(MmqShape::pick(32, 0, false).is_none());
    }

    #[test]
    fn plans_cover_rows_and_split_short_weights() {
        // llama-3-8b o-projection at 64 rows: one slice, 32 blocks of 128 rows, k split
        let p = plan(64, 4096, 4096, 0);
        assert_eq!((p.nt, p.slices, p.tiles), (8, 1, 32));
        assert_eq!(p.splits, 8);
        // 128 rows in one slice of 16 tiles; gate/up: enough blocks, no split
        let p = plan(128, 4096, 28672, 0);
        assert_eq!((p.nt, p.slices, p.tiles, p.splits), (16, 1, 224, 1));
        // the q/k/v projections: 48 tiles, 5 splits (two blocks per multiprocessor)
        assert_eq!(plan(8, 4096, 6144, 0).splits, 5);
        // the lm head: enough tiles, no split
        assert_eq!(plan(64, 4096, 128256, 0).splits, 1);
        // odd row counts round up to a power-of-two number of 8-row tiles
        assert_eq!(plan(3, 512, 100, 0).nt, 1);
        assert_eq!(plan(17, 512, 100, 0).nt, 4);
        // more rows than a slice: several slices
        let p = plan(130, 512, 100, 0);
        assert_eq!((p.nt, p.slices), (16, 2));
        // splits never exceed the chunks of k, forced or not; each has 4 chunks when automatic
        assert_eq!(plan(8, 512, 100, 0).splits, 1);
        assert_eq!(plan(8, 512, 100, 5).splits, 4);
        assert!(MmqPlan::new(8, 4000, 100, 132, 0, 0, false).is_none());
        assert!(MmqPlan::new(0, 512, 100, 132, 0, 0, false).is_none());
        // an H100 (227 KiB per block, 228 KiB per multiprocessor, 1 KiB reserved per block):
        // every shape fits a block at Q8_0, and as many blocks as it aims at per
        // multiprocessor at Q4_0
        for nt in [1usize, 2, 4, 8, 16] {
            for v in 0..SHAPES[nt.ilog2() as usize].len() {
                let p = MmqPlan::new(8 * nt, 4096, 4096, 132, 0, v, false).unwrap();
                assert!(p.smem(34) <= 232_448, "{p:?}");
                assert!(p.shape.bps * (p.smem(18) + 1024) <= 233_472, "{p:?}");
            }
        }
    }
}
