//! Block-weight (Q8_0 / Q4_0 / Q4_1) products with a few f16 activation rows on tensor cores:
//! the `linear_mma{nt}_*` kernels of kernels/linear_mma.cu read each weight block once for up
//! to [`MMA_SLICE_ROWS`] activation rows (staged with it in shared memory by 16-byte copies)
//! and dequantize it in registers, so a batched decode
//! step reads its weights once (where the dequantize-then-cuBLAS path writes and reads an f16
//! copy of every weight). Short weights are split along k over several blocks ([`MmaPlan`];
//! `mm_split` launches them and adds the splits in a fixed order; in a launch of several
//! weights each keeps the plan of its product alone).
//! Knows nothing of ops: `Linear` decides when to call [`mma_product`].

use super::buffer::CudaBuffer;
use super::gpu::{Gpu, KArg};
use super::mm_split::{Product, SegPlan, SplitLaunch, Tiling};
use super::op_err;
use crate::error::Result;
use std::sync::{Arc, Mutex};

/// k values per staged activation chunk (`MMA_KC`); the kernels need `k % MMA_KC == 0`.
pub(super) const MMA_KC: usize = 256;
/// Weight rows per block (`MMA_WARPS` · `MMA_WROWS` · 16: 8 warps of one 16-row tile).
const ROWS_PER_BLOCK: usize = 128;
/// Threads per block (`MMA_WARPS` warps).
const THREADS: u32 = 256;
/// Activation rows one launch slice covers (8 · the largest `nt`); more rows take several
/// slices, each reading the weight again.
pub(super) const MMA_SLICE_ROWS: usize = 64;
/// Halves per staged activation row (`MMA_XS`).
const XS_HALVES: usize = MMA_KC + 8;
/// Most k splits of one product.
const MAX_SPLITS: usize = 8;
/// Blocks per multiprocessor the automatic k split aims at.
const BLOCKS_PER_SM: usize = 6;

/// How one product runs: `nt` 8-row activation tiles per slice, `slices` slices, `tiles` blocks
/// of weight rows, `splits` parts of k per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaPlan {
    /// 8-row activation tiles per block (1, 2, 4 or 8).
    pub nt: usize,
    /// Activation row slices (grid z).
    pub slices: usize,
    /// Blocks of [`ROWS_PER_BLOCK`] weight rows (grid x).
    pub tiles: usize,
    /// k splits (grid y); above 1 the partial sums go through the scratch buffer.
    pub splits: usize,
}

impl MmaPlan {
    /// The plan for `m` activation rows, `ntot` weight rows of `k` values on a GPU of `sms`
    /// multiprocessors; `splits` > 0 forces the number of k splits (clamped to the chunks of
    /// k). `None` when the kernels do not take the shape (`k % MMA_KC != 0`, no rows).
    pub fn new(m: usize, k: usize, ntot: usize, sms: usize, splits: usize) -> Option<MmaPlan> {
        let t = Tiling::new(m, k, ntot, MMA_SLICE_ROWS, ROWS_PER_BLOCK, MMA_KC)?;
        // k split for about BLOCKS_PER_SM blocks per multiprocessor (each warp has only a few
        // weight blocks in flight), each block with at least two chunks of k
        let auto = (BLOCKS_PER_SM * sms)
            .div_ceil(t.tiles * t.slices)
            .min(MAX_SPLITS)
            .min((t.chunks / 2).max(1));
        let splits = if splits > 0 { splits } else { auto };
        Some(MmaPlan {
            nt: t.nt,
            slices: t.slices,
            tiles: t.tiles,
            splits: splits.clamp(1, t.chunks),
        })
    }

    /// Dynamic shared memory per block for weights of `block_bytes` per 32 values: two stages
    /// of one chunk of the block's weight rows (`mma_wrow` in the kernels) and activation rows.
    pub fn smem(&self, block_bytes: usize) -> usize {
        let pad = if block_bytes == 20 { 16 } else { 0 };
        let wrow = MMA_KC / 32 * block_bytes + pad;
        2 * (ROWS_PER_BLOCK * wrow + 8 * self.nt * XS_HALVES * 2)
    }
}

/// `y_i (+)= x·W_iᵀ + b_i` for the segments of the product `p` (one launch; `acc` in its table
/// adds to the outputs), `x` f16 [m, k] on the GPU, block weights of kernel suffix `suffix`,
/// `plans[i]` the plan of segment i's product alone (all for `m` rows); `out_half`: f16
/// outputs (no `acc`). `part` is the scratch for split partial sums.
pub fn mma_product(
    gpu: &Arc<Gpu>,
    plans: &[MmaPlan],
    suffix: &str,
    x: u64,
    p: Product,
    out_half: bool,
    part: &Mutex<Option<CudaBuffer>>,
) -> Result<()> {
    let Some(plan) = plans.first() else {
        return Ok(());
    };
    if plans
        .iter()
        .any(|q| (q.nt, q.slices) != (plan.nt, plan.slices))
    {
        return Err(op_err("Linear", "segment plans for different row counts"));
    }
    let seg_plans: Vec<SegPlan> = plans
        .iter()
        .map(|q| SegPlan {
            tiles: q.tiles,
            splits: q.splits,
        })
        .collect();
    let launch = SplitLaunch {
        kernel: &format!("linear_mma{}_{suffix}", plan.nt),
        slices: plan.slices,
        seg_plans: &seg_plans,
        threads: THREADS,
        smem: plan.smem(p.row_bytes / (p.k / 32)),
        product: p,
        out_half: Some(out_half),
    };
    launch.run(gpu, vec![KArg::Ptr(x)], part)
}

#[cfg(test)]
mod tests {
    use super::MmaPlan;

    #[test]
    fn plans_cover_rows_and_split_short_weights() {
        // llama-3-8b o-projection at 64 rows: one slice of 8 tiles, k split to fill the GPU
        let p = MmaPlan::new(64, 4096, 4096, 132, 0).unwrap();
        assert_eq!((p.nt, p.slices, p.tiles), (8, 1, 32));
        assert_eq!(p.splits, 8);
        // gate/up: many tiles, a few splits; the lm head: enough tiles, no split
        let p = MmaPlan::new(8, 4096, 28672, 132, 0).unwrap();
        assert_eq!((p.nt, p.slices, p.tiles, p.splits), (1, 1, 224, 4));
        assert_eq!(MmaPlan::new(64, 4096, 128256, 132, 0).unwrap().splits, 1);
        // odd row counts round up to a power-of-two number of 8-row tiles
        assert_eq!(MmaPlan::new(3, 512, 100, 132, 0).unwrap().nt, 1);
        assert_eq!(MmaPlan::new(17, 512, 100, 132, 0).unwrap().nt, 4);
        // more rows than a slice: several slices
        let p = MmaPlan::new(130, 512, 100, 132, 0).unwrap();
        assert_eq!((p.nt, p.slices), (8, 3));
        // splits never exceed the chunks of k, forced or not
        assert_eq!(MmaPlan::new(8, 512, 100, 132, 0).unwrap().splits, 1);
        assert_eq!(MmaPlan::new(8, 512, 100, 132, 5).unwrap().splits, 2);
        assert!(MmaPlan::new(8, 4000, 100, 132, 0).is_none());
        assert!(MmaPlan::new(0, 512, 100, 132, 0).is_none());
    }
}
