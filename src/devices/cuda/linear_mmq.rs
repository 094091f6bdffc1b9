//! Block-weight (Q8_0 / Q4_0 / Q4_1) products with a few Q8_0 activation rows on int8 tensor
//! cores: the `linear_mmq1x{nt}_*` kernels of kernels/linear_mmq.cu read each weight block
//! once for up to [`MMQ_SLICE_ROWS`] activation rows (staged with them in shared memory), take
//! one `mma` (s8 × s8 → s32) per 32-value block of 16 weight rows and 8 activation rows, and
//! scale its integer sums by the two blocks' scales in f32. Short weights are split along k over
//! several blocks ([`MmqPlan`]; `mm_split` launches them and adds the splits in a fixed
//! order). Knows nothing of ops: `Linear` decides when to call
//! [`mmq_product`] and provides the quantized activation rows.

use super::buffer::CudaBuffer;
use super::gpu::{Gpu, KArg};
use super::mm_split::{Product, SplitLaunch, Tiling};
use crate::error::Result;
use std::sync::{Arc, Mutex};

/// k values per staged chunk (`MMQ_KC`); the kernels need `k % MMQ_KC == 0`.
pub(super) const MMQ_KC: usize = 128;
/// Activation rows one launch slice covers (the largest tile, 8 · 16); more rows take several
/// slices, each reading the weight again.
pub(super) const MMQ_SLICE_ROWS: usize = 128;
/// Warps per block (`MMQ_WARPS`), each with one 16-row weight tile.
const WARPS: usize = 8;
/// Chunks in flight per block (`MMQ_STAGES`).
const STAGES: usize = 3;
/// Bytes per staged activation row (`MMQ_XROW`) and per staged row of its scales (`MMQ_SROW`).
const XROW: usize = MMQ_KC + 16;
const SROW: usize = 48;
/// Most k splits of one product.
const MAX_SPLITS: usize = 8;
/// Blocks per multiprocessor the automatic k split aims at (at most: a product with fewer
/// blocks is split only while the split blocks stay within this many).
const BLOCKS_PER_SM: usize = 3;
/// Fewest chunks of k per split.
const MIN_SPLIT_CHUNKS: usize = 4;

/// How one product runs: `nt` 8-row activation tiles per slice, `slices` slices, `tiles`
/// blocks of weight rows, `splits` parts of k per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmqPlan {
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
    /// k). `None` when the kernels do not take the shape (`k % MMQ_KC != 0`, no rows).
    pub fn new(m: usize, k: usize, ntot: usize, sms: usize, splits: usize) -> Option<MmqPlan> {
        let t = Tiling::new(m, k, ntot, MMQ_SLICE_ROWS, WARPS * 16, MMQ_KC)?;
        // (partial sums cost more than a part-empty last wave: round down)
        let auto = (BLOCKS_PER_SM * sms / (t.tiles * t.slices))
            .clamp(1, MAX_SPLITS)
            .min((t.chunks / MIN_SPLIT_CHUNKS).max(1));
        let splits = if splits > 0 { splits } else { auto };
        Some(MmqPlan {
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
        let stage = WARPS * 16 * wrow + 8 * self.nt * (XROW + SROW);
        STAGES * stage
    }

    /// The kernel of this plan for weights of kernel suffix `suffix`.
    fn kernel(&self, suffix: &str) -> String {
        format!("linear_mmq1x{}_{suffix}", self.nt)
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
/// `suffix`. `part` is the scratch for split partial sums.
pub fn mmq_product(
    gpu: &Arc<Gpu>,
    plan: MmqPlan,
    suffix: &str,
    x: Q8Rows,
    p: Product,
    part: &Mutex<Option<CudaBuffer>>,
) -> Result<()> {
    let launch = SplitLaunch {
        kernel: &plan.kernel(suffix),
        tiling: Tiling {
            nt: plan.nt,
            slices: plan.slices,
            tiles: plan.tiles,
            chunks: p.k / MMQ_KC,
        },
        splits: plan.splits,
        threads: (32 * WARPS) as u32,
        smem: plan.smem(p.row_bytes / (p.k / 32)),
        product: p,
        out_half: None,
    };
    launch.run(gpu, vec![KArg::Ptr(x.values), KArg::Ptr(x.scales)], part)
}

#[cfg(test)]
mod tests {
    use super::MmqPlan;

    #[test]
    fn plans_cover_rows_and_split_short_weights() {
        // llama-3-8b o-projection at 64 rows: one slice, 32 blocks of 128 rows, k split
        let p = MmqPlan::new(64, 4096, 4096, 132, 0).unwrap();
        assert_eq!((p.nt, p.slices, p.tiles), (8, 1, 32));
        assert_eq!(p.splits, 8);
        // 128 rows in one slice of 16 tiles; gate/up: enough blocks, no split
        let p = MmqPlan::new(128, 4096, 28672, 132, 0).unwrap();
        assert_eq!((p.nt, p.slices, p.tiles, p.splits), (16, 1, 224, 1));
        // the q/k/v projections: 48 tiles, 8 splits
        assert_eq!(MmqPlan::new(8, 4096, 6144, 132, 0).unwrap().splits, 8);
        // the lm head: enough tiles, no split
        assert_eq!(MmqPlan::new(64, 4096, 128256, 132, 0).unwrap().splits, 1);
        // odd row counts round up to a power-of-two number of 8-row tiles
        assert_eq!(MmqPlan::new(3, 512, 100, 132, 0).unwrap().nt, 1);
        assert_eq!(MmqPlan::new(17, 512, 100, 132, 0).unwrap().nt, 4);
        // more rows than a slice: several slices
        let p = MmqPlan::new(130, 512, 100, 132, 0).unwrap();
        assert_eq!((p.nt, p.slices), (16, 2));
        // splits never exceed the chunks of k, forced or not; each has 4 chunks when automatic
        assert_eq!(MmqPlan::new(8, 512, 100, 132, 0).unwrap().splits, 1);
        assert_eq!(MmqPlan::new(8, 512, 100, 132, 5).unwrap().splits, 4);
        assert!(MmqPlan::new(8, 4000, 100, 132, 0).is_none());
        assert!(MmqPlan::new(0, 512, 100, 132, 0).is_none());
        // an H100 (227 KiB per block, 228 KiB per multiprocessor, 1 KiB reserved per block):
        // Q8_0 at 128 rows fits a block, Q4_0 at 64 rows three blocks per multiprocessor
        assert!(MmqPlan::new(128, 4096, 4096, 132, 0).unwrap().smem(34) <= 232_448);
        assert!(3 * (MmqPlan::new(64, 4096, 4096, 132, 0).unwrap().smem(18) + 1024) <= 233_472);
    }
}
