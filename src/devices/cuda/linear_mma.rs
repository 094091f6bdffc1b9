//! Block-weight (Q8_0 / Q4_0 / Q4_1) products with a few f16 activation rows on tensor cores:
//! the `linear_mma{nt}_*` kernels of kernels/linear_mma.cu read each weight block once for up
//! to [`MMA_SLICE_ROWS`] activation rows (staged with it in shared memory by 16-byte copies)
//! and dequantize it in registers, so a batched decode
//! step reads its weights once (where the dequantize-then-cuBLAS path writes and reads an f16
//! copy of every weight). Short weights are split along k over several blocks ([`MmaPlan`];
//! `mm_split` launches them and adds the splits in a fixed order; in a launch of several
//! weights each keeps the plan of its product alone).
//! F16 weights take `linear_mma{nt}_f16` (kernels/linear_hmma.cu) with the same grid, splits
//! and outputs: each lane loads its share of the weight rows straight into registers, and only
//! the activation rows are staged.
//! Knows nothing of ops: `Linear` decides when to call [`mma_product`].

use super::buffer::CudaBuffer;
use super::gpu::{Gpu, KArg};
use super::mm_split::{Product, SegPlan, SplitLaunch, Tiling};
use super::op_err;
use crate::error::Result;
use std::sync::{Arc, Mutex};

/// k values per staged activation chunk (`MMA_KC`); the kernels need `k % MMA_KC == 0`.
pub(super) const MMA_KC: usize = 256;
/// Weight rows per block of the narrow kernels (8 warps of one 16-row tile, two blocks per
/// multiprocessor).
pub(super) const NARROW_ROWS: usize = 128;
/// Weight rows per block of the wide kernels (`linear_mma{nt}w_*`: 16 warps, one block per
/// multiprocessor, half the activation copies per weight row).
pub(super) const WIDE_ROWS: usize = 256;
/// Activation rows one launch slice covers (8 · the largest `nt`); more rows take several
/// slices, each reading the weight again.
pub(super) const MMA_SLICE_ROWS: usize = 64;
/// Halves per staged activation row (`MMA_XS`).
const XS_HALVES: usize = MMA_KC + 8;
/// Bytes per 32 values of F16 weights: their kernels (`linear_mma{nt}_f16`, kernels/
/// linear_hmma.cu) load weights into registers and stage only activation rows.
const F16_BLOCK_BYTES: usize = 64;
/// Halves per staged activation row of the F16 kernels (`HMMA_XS`).
const F16_XS_HALVES: usize = MMA_KC + 32;
/// Most k splits of one product.
const MAX_SPLITS: usize = 8;
/// What a plan needs of the product: `m` activation rows, `ntot` weight rows of `k` values,
/// `block_bytes` bytes per 32 weights.
#[derive(Clone, Copy, Debug)]
pub struct MmaShape {
    pub m: usize,
    pub k: usize,
    pub ntot: usize,
    pub block_bytes: usize,
}

/// What a plan needs of the GPU: its multiprocessors and the most shared memory one block may
/// use.
#[derive(Clone, Copy, Debug)]
pub struct MmaGpu {
    pub sms: usize,
    pub smem_optin: usize,
}

/// How one product runs: `nt` 8-row activation tiles per slice, `slices` slices, `tiles` blocks
/// of weight rows, `splits` parts of k per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaPlan {
    /// 8-row activation tiles per block (1, 2, 4 or 8).
    pub nt: usize,
    /// Activation row slices (grid z).
    pub slices: usize,
    /// Weight rows per block: [`NARROW_ROWS`] or [`WIDE_ROWS`] (`nt` 4 or 8 only).
    pub rows: usize,
    /// Blocks of `rows` weight rows (grid x).
    pub tiles: usize,
    /// k splits (grid y); above 1 the partial sums go through the scratch buffer.
    pub splits: usize,
}

impl MmaPlan {
    /// The plan for the product `p` on `gpu`; `splits` > 0 forces the number of k splits
    /// (clamped to the chunks of k), `rows` > 0 the weight rows per block ([`NARROW_ROWS`] or
    /// [`WIDE_ROWS`]; wide blocks run where their kernel exists, see [`wide_kernel`], and their
    /// shared memory fits, else narrow ones). By default wide blocks run wherever they may.
    /// `None` when the kernels do not take the shape (`k % MMA_KC != 0`, no rows).
    pub fn new(p: MmaShape, gpu: MmaGpu, splits: usize, rows: usize) -> Option<MmaPlan> {
        let narrow = Tiling::new(p.m, p.k, p.ntot, MMA_SLICE_ROWS, NARROW_ROWS, MMA_KC)?;
        let wide = Tiling::new(p.m, p.k, p.ntot, MMA_SLICE_ROWS, WIDE_ROWS, MMA_KC)?;
        let fits = wide_kernel(narrow.nt, p.block_bytes)
            && smem(WIDE_ROWS, narrow.nt, p.block_bytes) <= gpu.smem_optin;
        let (t, rows) = if fits && rows != NARROW_ROWS {
            (wide, WIDE_ROWS)
        } else {
            (narrow, NARROW_ROWS)
        };
        // the blocks resident at once: two narrow or one wide block per multiprocessor. A
        // weight with blocks for a quarter of them is not split (a launch of several such
        // weights, gate/up, fills them, and splits only add partial sums to write and add
        // up); a smaller one is split to fill them alone, each block with at least two chunks
        // of k
        let resident = blocks_per_sm(rows, t.nt, p.block_bytes) * gpu.sms;
        let blocks = t.tiles * t.slices;
        let auto = if 4 * blocks >= resident {
            1
        } else {
            (resident / blocks)
                .min(MAX_SPLITS)
                .min((t.chunks / 2).max(1))
                .max(1)
        };
        let splits = if splits > 0 { splits } else { auto };
        Some(MmaPlan {
            nt: t.nt,
            slices: t.slices,
            rows,
            tiles: t.tiles,
            splits: splits.clamp(1, t.chunks),
        })
    }

    /// Dynamic shared memory per block for weights of `block_bytes` per 32 values: two stages
    /// of one chunk of the block's weight rows (`mma_wrow` in the kernels) and activation rows,
    /// then the table of the weight rows' addresses.
    pub fn smem(&self, block_bytes: usize) -> usize {
        smem(self.rows, self.nt, block_bytes)
    }

    /// The kernel's name for weights of kernel suffix `suffix`.
    pub fn kernel(&self, suffix: &str) -> String {
        let wide = if self.rows == WIDE_ROWS { "w" } else { "" };
        format!("linear_mma{}{wide}_{suffix}", self.nt)
    }

    /// Threads per block (one warp per 16 weight rows).
    fn threads(&self) -> u32 {
        (self.rows * 2) as u32
    }
}

/// Whether a wide kernel (`linear_mma{nt}w_*`) exists for `nt` activation tiles and weights
/// of `block_bytes` bytes per 32 values: Q8_0 with 8 tiles (where it reads more weight bytes
/// per activation copy than a narrow block; 4-bit weights run faster in narrow blocks).
fn wide_kernel(nt: usize, block_bytes: usize) -> bool {
    block_bytes == 34 && nt == 8
}

/// Blocks of `rows` weight rows and `nt` activation tiles resident per multiprocessor: one
/// wide block, two narrow ones, three F16 blocks of one tile (80 registers a thread).
fn blocks_per_sm(rows: usize, nt: usize, block_bytes: usize) -> usize {
    if rows == WIDE_ROWS {
        1
    } else if block_bytes == F16_BLOCK_BYTES && nt == 1 {
        3
    } else {
        2
    }
}

/// Dynamic shared memory of a block of `rows` weight rows and `nt` activation tiles (see
/// [`MmaPlan::smem`]).
fn smem(rows: usize, nt: usize, block_bytes: usize) -> usize {
    if block_bytes == F16_BLOCK_BYTES {
        // only the activation rows are staged
        return 2 * 8 * nt * F16_XS_HALVES * 2;
    }
    let pad = if block_bytes == 20 { 16 } else { 0 };
    let wrow = MMA_KC / 32 * block_bytes + pad;
    2 * (rows * wrow + 8 * nt * XS_HALVES * 2) + rows * 8
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
        .any(|q| (q.nt, q.slices, q.rows) != (plan.nt, plan.slices, plan.rows))
    {
        return Err(op_err(
            "Linear",
            "segment plans for different row counts or blocks",
        ));
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
        threads: plan.threads(),
        smem: plan.smem(p.row_bytes / (p.k / 32)),
        product: p,
        out_half: Some(out_half),
    };
    launch.run(gpu, vec![KArg::Ptr(x)], part)
}

#[cfg(test)]
mod tests {
    use super::{MmaGpu, MmaPlan, MmaShape, NARROW_ROWS, WIDE_ROWS};

    /// The plan for Q4_0 weights (18 bytes a block) on an H100 (132 SMs, 227 KiB a block).
    fn plan(m: usize, k: usize, ntot: usize, splits: usize, rows: usize) -> Option<MmaPlan> {
        let shape = MmaShape {
            m,
            k,
            ntot,
            block_bytes: 18,
        };
        let gpu = MmaGpu {
            sms: 132,
            smem_optin: 227 * 1024,
        };
        MmaPlan::new(shape, gpu, splits, rows)
    }

    #[test]
    fn plans_cover_rows_and_split_short_weights() {
        // llama-3-8b o-projection at 64 rows: one slice of 32 narrow tiles, k split to fill the
        // GPU (Q4_0 has no wide kernel: asking for one gives narrow blocks)
        for rows in [0, WIDE_ROWS] {
            let p = plan(64, 4096, 4096, 0, rows).unwrap();
            assert_eq!((p.nt, p.slices, p.rows, p.tiles), (8, 1, NARROW_ROWS, 32));
            assert_eq!(p.splits, 8);
            assert_eq!(p.kernel("q4_0"), "linear_mma8_q4_0");
        }
        // gate (or up) and the lm head: blocks for a quarter of the resident ones, no split
        let p = plan(64, 4096, 14336, 0, 0).unwrap();
        assert_eq!((p.nt, p.slices, p.tiles, p.splits), (8, 1, 112, 1));
        // k and v: as many splits as fit the resident blocks, at most MAX_SPLITS
        assert_eq!(plan(64, 4096, 1024, 0, 0).unwrap().splits, 8);
        assert_eq!(plan(64, 4096, 6144, 0, 0).unwrap().splits, 5);
        assert_eq!(plan(64, 4096, 128256, 0, 0).unwrap().splits, 1);
        // odd row counts round up to a power-of-two number of 8-row tiles
        assert_eq!(plan(3, 512, 100, 0, 0).unwrap().nt, 1);
        assert_eq!(plan(17, 512, 100, 0, 0).unwrap().nt, 4);
        // more rows than a slice: several slices
        let p = plan(130, 512, 100, 0, 0).unwrap();
        assert_eq!((p.nt, p.slices), (8, 3));
        // splits never exceed the chunks of k, forced or not
        assert_eq!(plan(8, 512, 100, 0, 0).unwrap().splits, 1);
        assert_eq!(plan(8, 512, 100, 5, 0).unwrap().splits, 2);
        assert!(plan(8, 4000, 100, 0, 0).is_none());
        assert!(plan(0, 512, 100, 0, 0).is_none());
        // Q8_0 at 64 rows: wide blocks (one per multiprocessor: half the tiles, the k split
        // of one block per SM) where their shared memory fits, narrow ones when asked for, on
        // 163 KiB GPUs or for fewer tiles
        for (m, optin, rows, want) in [
            (64, 227, 0, (WIDE_ROWS, 16, 8)),
            (64, 227, NARROW_ROWS, (NARROW_ROWS, 32, 8)),
            (64, 163, 0, (NARROW_ROWS, 32, 6)),
            (32, 227, WIDE_ROWS, (NARROW_ROWS, 32, 8)),
        ] {
            let shape = MmaShape {
                m,
                k: 4096,
                ntot: 4096,
                block_bytes: 34,
            };
            let gpu = MmaGpu {
                sms: if optin == 163 { 108 } else { 132 },
                smem_optin: optin * 1024,
            };
            let p = MmaPlan::new(shape, gpu, 0, rows).unwrap();
            assert_eq!(
                (p.rows, p.tiles, p.splits),
                want,
                "m {m}, {optin} KiB, rows {rows}"
            );
        }
        let shape = MmaShape {
            m: 64,
            k: 4096,
            ntot: 4096,
            block_bytes: 34,
        };
        let gpu = MmaGpu {
            sms: 132,
            smem_optin: 227 * 1024,
        };
        assert_eq!(
            MmaPlan::new(shape, gpu, 0, 0).unwrap().kernel("q8_0"),
            "linear_mma8w_q8_0"
        );
    }

    #[test]
    fn f16_plans_stage_only_activations() {
        let gpu = MmaGpu {
            sms: 132,
            smem_optin: 227 * 1024,
        };
        // F16 weights: narrow blocks only, activations alone in shared memory; one tile of 8
        // rows keeps three blocks per multiprocessor (k and v split to fill them)
        let f16 = |m: usize, ntot: usize, rows: usize| {
            let shape = MmaShape {
                m,
                k: 4096,
                ntot,
                block_bytes: 64,
            };
            MmaPlan::new(shape, gpu, 0, rows).unwrap()
        };
        let p = f16(8, 1024, WIDE_ROWS);
        assert_eq!((p.nt, p.rows, p.tiles, p.splits), (1, NARROW_ROWS, 8, 8));
        assert_eq!(p.smem(64), 2 * 8 * (256 + 32) * 2);
        assert_eq!(p.kernel("f16"), "linear_mma1_f16");
        assert_eq!(f16(16, 28672, 0).splits, 1);
    }
}
