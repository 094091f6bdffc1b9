//! What the batched block products (`linear_mma`, `linear_mmq`) share on the host: the shape
//! of a plan (8-row activation tiles per slice, slices, blocks of weight rows, chunks of k),
//! the grid of a launch, and running a k-split product: each split's partial sums in a
//! scratch buffer, then `mma_reduce_f32` adding them in split order (deterministic).
//!
//! A launch of several weights (q/k/v, gate/up) gives each weight its own blocks of rows and
//! the k split of its product alone ([`SegPlan`]), so its sums are those of the separate
//! launches, bit for bit.

use super::buffer::{scratch, CudaBuffer};
use super::gpu::{int, long, Gpu, KArg, LinSegs};
use super::op_err;
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex};

/// The split-independent part of a plan for `m` activation rows of `k` values and `ntot`
/// weight rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Tiling {
    /// 8-row activation tiles per block (a power of two).
    pub nt: usize,
    /// Activation row slices (grid z).
    pub slices: usize,
    /// Blocks of weight rows (grid x).
    pub tiles: usize,
    /// Chunks of k.
    pub chunks: usize,
}

impl Tiling {
    /// The tiling with at most `slice_rows` activation rows per slice, `block_rows` weight rows
    /// per block and `kc` values per chunk; `None` when the kernels do not take the shape
    /// (`k % kc != 0`, no rows).
    pub fn new(
        m: usize,
        k: usize,
        ntot: usize,
        slice_rows: usize,
        block_rows: usize,
        kc: usize,
    ) -> Option<Tiling> {
        if m == 0 || ntot == 0 || k == 0 || !k.is_multiple_of(kc) {
            return None;
        }
        let nt = m.min(slice_rows).div_ceil(8).next_power_of_two();
        Some(Tiling {
            nt,
            slices: m.div_ceil(8 * nt),
            tiles: ntot.div_ceil(block_rows),
            chunks: k / kc,
        })
    }
}

/// One batched product: `m` activation rows of `k` values against the weights of the output
/// segments `segs`, `ntot` weight rows in all of `row_bytes` bytes each.
#[derive(Clone, Copy, Debug)]
pub(super) struct Product {
    pub segs: LinSegs,
    pub m: usize,
    pub ntot: usize,
    pub k: usize,
    pub row_bytes: usize,
}

/// How one weight of a launch runs: `tiles` blocks of its rows, `splits` parts of k (those of
/// its product alone).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct SegPlan {
    /// Blocks of the weight's rows (grid x).
    pub tiles: usize,
    /// Parts of k.
    pub splits: usize,
}

/// One launch of a k-split product kernel: `kernel` on the grid (the weights' blocks, their
/// most splits, `slices`) with `threads` threads and `smem` bytes of shared memory per block,
/// its arguments: the activation arguments, the product's segments (with each weight's blocks
/// and splits from `seg_plans`, one per segment) and sizes (`m`, `ntot`, `k`, row bytes), the
/// most splits, the partial-sum buffer and, for a kernel with the flag (`out_half` `Some`),
/// whether it writes f16 outputs; where a weight has several splits, `mma_reduce_f32` then adds
/// its partial sums into its outputs.
pub(super) struct SplitLaunch<'a> {
    pub kernel: &'a str,
    pub slices: usize,
    pub seg_plans: &'a [SegPlan],
    pub threads: u32,
    pub smem: usize,
    pub product: Product,
    pub out_half: Option<bool>,
}

impl SplitLaunch<'_> {
    /// Runs the product (see the type's doc) with the activation arguments `args`; `part` is
    /// the scratch for the partial sums.
    pub fn run(
        &self,
        gpu: &Arc<Gpu>,
        mut args: Vec<KArg>,
        part: &Mutex<Option<CudaBuffer>>,
    ) -> Result<()> {
        let Product {
            mut segs,
            m,
            ntot,
            k,
            row_bytes,
        } = self.product;
        if self.seg_plans.len() != segs.n.iter().filter(|&&n| n > 0).count() {
            return Err(op_err(
                "Linear",
                "a batched product needs one plan per weight",
            ));
        }
        let count = |v: usize, what: &str| i32::try_from(v).map_err(|_| op_err("Linear", what));
        for (i, sp) in self.seg_plans.iter().enumerate().take(3) {
            segs.tiles[i] = count(sp.tiles, "too many outputs")?;
            segs.splits[i] = count(sp.splits.max(1), "too many splits")?;
        }
        let tiles: usize = self.seg_plans.iter().map(|sp| sp.tiles).sum();
        let splits = self
            .seg_plans
            .iter()
            .map(|sp| sp.splits)
            .max()
            .unwrap_or(1)
            .max(1);
        let grid = (
            u32::try_from(tiles).map_err(|_| op_err("Linear", "too many outputs"))?,
            u32::try_from(splits).map_err(|_| op_err("Linear", "too many splits"))?,
            u32::try_from(self.slices)
                .ok()
                .filter(|&z| z <= 65535)
                .ok_or_else(|| op_err("Linear", format!("{m} rows exceed this kernel's grid")))?,
        );
        let mut guard = part
            .lock()
            .map_err(|_| Error::Device("Linear partial sums poisoned".into()))?;
        let pp = if splits > 1 {
            scratch(gpu, &mut guard, splits * m * ntot * 4, true)?
        } else {
            0
        };
        args.extend([
            KArg::Segs(segs),
            int(m, "rows")?,
            int(ntot, "outputs")?,
            int(k, "k")?,
            long(row_bytes, "row bytes")?,
            int(splits, "splits")?,
        ]);
        args.push(KArg::Ptr(pp));
        if let Some(h) = self.out_half {
            args.push(KArg::I32(h as i32));
        }
        let smem = u32::try_from(self.smem).map_err(|_| op_err("Linear", "shared memory"))?;
        gpu.launch_smem(self.kernel, grid, self.threads, smem, &args)?;
        if splits > 1 {
            gpu.launch(
                "mma_reduce_f32",
                Gpu::grid_for(m * ntot, 256),
                256,
                &[
                    KArg::Ptr(pp),
                    KArg::Segs(segs),
                    int(m, "rows")?,
                    int(ntot, "outputs")?,
                    int(splits, "splits")?,
                    KArg::I32(self.out_half.unwrap_or(false) as i32),
                ],
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Tiling;

    #[test]
    fn tilings_round_rows_up_to_power_of_two_tiles_and_slice_the_rest() {
        let t = Tiling::new(17, 512, 100, 64, 128, 128).unwrap();
        assert_eq!((t.nt, t.slices, t.tiles, t.chunks), (4, 1, 1, 4));
        let t = Tiling::new(130, 512, 300, 64, 128, 256).unwrap();
        assert_eq!((t.nt, t.slices, t.tiles, t.chunks), (8, 3, 3, 2));
        assert!(Tiling::new(8, 4000, 100, 64, 128, 128).is_none());
        assert!(Tiling::new(0, 512, 100, 64, 128, 128).is_none());
        assert!(Tiling::new(8, 512, 0, 64, 128, 128).is_none());
    }
}
