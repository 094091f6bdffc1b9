//! The `Linear` driver: splits output columns (weight rows) across threads, tiles columns so a
//! tile of weight rows stays in cache while every block of [`MAX_ROWS`] activation rows passes
//! over it, calls one dot kernel per (weight row, row block) and adds the bias.
//!
//! Callers validate sizes first (`LinearArgs::validate`). This module must not pick kernels.

use super::act_quant::Q8Rows;
use super::{FloatRowsFn, IntRowsFn, LinearArgs, MAX_ROWS};
use crate::threads::Threads;

/// The dot kernel of one call.
#[derive(Clone, Copy)]
pub(super) enum Kernel<'a> {
    /// Float activations.
    Float(FloatRowsFn),
    /// Quantized activations (already quantized).
    Int(IntRowsFn, &'a Q8Rows),
}

/// Output pointer shared by the column tasks (each writes disjoint columns).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements; the pointer outlives the parallel section.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}
impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Multiply-adds each task should at least get.
const MIN_TASK_WORK: usize = 1 << 16;
/// Bytes of weight rows per column tile.
const TILE_BYTES: usize = 32 << 10;

/// Runs the kernel over all of `a` (sizes validated; `rb` = weight row bytes) into `out`.
pub(super) fn run(
    threads: Option<&Threads>,
    a: &LinearArgs,
    rb: usize,
    kern: Kernel,
    out: &mut [f32],
) {
    let (rows, n, k) = (a.rows, a.n, a.k);
    if rows == 0 || n == 0 {
        return;
    }
    let op = OutPtr(out.as_mut_ptr());
    let tile = (TILE_BYTES / rb.max(1)).clamp(1, 64);
    let body = |cols: std::ops::Range<usize>| {
        let op = op.get();
        let mut j0 = cols.start;
        while j0 < cols.end {
            let j1 = (j0 + tile).min(cols.end);
            let mut r0 = 0;
            while r0 < rows {
                let nr = (rows - r0).min(MAX_ROWS);
                for j in j0..j1 {
                    let wr = &a.w[j * rb..(j + 1) * rb];
                    let mut acc = [0f32; MAX_ROWS];
                    // SAFETY: sizes validated by the caller; kernels were picked for this CPU.
                    unsafe {
                        match kern {
                            Kernel::Float(f) => f(wr, &a.x[r0 * k..(r0 + nr) * k], k, nr, &mut acc),
                            Kernel::Int(f, q) => f(wr, q, r0, nr, &mut acc),
                        }
                    }
                    let b = a.bias.map_or(0.0, |b| b[j]);
                    for (t, v) in acc.iter().enumerate().take(nr) {
                        // SAFETY: (r0 + t) < rows and j < n, inside the validated output; no
                        // other task writes column j.
                        unsafe { *op.add((r0 + t) * n + j) = v + b };
                    }
                }
                r0 += nr;
            }
            j0 = j1;
        }
    };
    match threads {
        Some(t) => {
            let min_cols = MIN_TASK_WORK.div_ceil(k.max(1) * rows).max(1);
            t.for_rows(n, min_cols, body);
        }
        None => body(0..n),
    }
}
