//! The `Linear` driver: splits output columns (weight rows) across threads, tiles columns so a
//! tile of weight rows stays in cache while every block of [`MAX_ROWS`] activation rows passes
//! over it, calls one dot kernel per (weight row, row block) and adds the bias.
//!
//! For GEMMs with non-f32 weights the caller may pass a row converter: each column tile is then
//! converted to f32 once (into a per-thread scratch) and the f32 kernel runs on it.
//!
//! Callers validate sizes first (`LinearArgs::validate`). This module must not pick kernels.

use super::act_quant::Q8Rows;
use super::int_wide::{IntWideFn, WIDE_COLS, WIDE_ROWS};
use super::interleaved::{InterleavedFn, GROUP_ROWS};
use super::interleaved_float::FloatGroupFn;
use super::{FloatRowsFn, IntRowsFn, IntTileFn, LinearArgs, RowToF32Fn, TileF32Fn, MAX_ROWS};
use crate::threads::Threads;
use std::cell::RefCell;

thread_local! {
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The dot kernel of one call.
#[derive(Clone, Copy)]
pub(super) enum Kernel<'a> {
    /// Float activations; optionally the f32 GEMM plan for many rows.
    Float(FloatRowsFn, Option<F32Gemm>),
    /// Quantized activations (already quantized); optionally a tiled kernel for many rows.
    Int(IntRowsFn, &'a Q8Rows, Option<IntTileFn>),
    /// Quantized activations with the wide (8 rows × 2 columns) tiled kernel.
    IntWide(IntRowsFn, &'a Q8Rows, IntWideFn),
}

/// How a GEMM runs on f32 weight rows: `convert` (for non-f32 weights) fills a per-thread tile,
/// then `tile` (register-tiled, if the CPU has one) or `rows` computes on it. Without `convert`
/// the kernels read the weight rows in place (f32 rows, or F16/BF16 rows for a tile kernel that
/// widens them itself).
#[derive(Clone, Copy)]
pub(super) struct F32Gemm {
    /// Weight row → f32 converter; `None` when the weights already are f32.
    pub convert: Option<RowToF32Fn>,
    /// The f32 row kernel.
    pub rows: FloatRowsFn,
    /// The f32 tile kernel, if any.
    pub tile: Option<TileF32Fn>,
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
/// Bytes of f32 weight rows per column tile (half the 1 MiB L2 of the dev machine: the tile
/// stays cached while every block of activation rows passes over it).
const F32_TILE_BYTES: usize = 512 << 10;

/// One call of a batch run by [`run_many`]: validated arguments, weight row bytes, kernel and
/// output.
pub(super) struct Part<'a> {
    /// The call's arguments (sizes validated).
    pub a: LinearArgs<'a>,
    /// Weight row bytes.
    pub rb: usize,
    /// The call's kernel.
    pub kern: Kernel<'a>,
    /// Its output, `a.rows * a.n` values.
    pub out: &'a mut [f32],
}

/// Columns per tile of a call with kernel `kern`.
fn tile_cols(a: &LinearArgs, rb: usize, kern: Kernel) -> usize {
    match kern {
        Kernel::Float(_, Some(_)) => (F32_TILE_BYTES / (4 * a.k.max(1))).clamp(4, 256),
        _ => (TILE_BYTES / rb.max(1)).clamp(1, 64),
    }
}

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
    let body = |cols| run_cols(a, rb, kern, op, cols);
    match threads {
        Some(t) => {
            let min_cols = MIN_TASK_WORK.div_ceil(k.max(1) * rows).max(1);
            t.for_rows(n, min_cols, body);
        }
        None => body(0..n),
    }
}

/// Runs several calls as one job: every call's columns are cut into chunks in proportion to
/// its share of the work (about four chunks per thread in all, each of at least
/// `MIN_TASK_WORK` multiply-adds where the call has that much) and the chunks of all calls are
/// handed out together, so small products (a step's routed experts) share one pass over the
/// pool. Each column is computed exactly as [`run`] computes it.
pub(super) fn run_many(threads: Option<&Threads>, parts: &mut [Part]) {
    let work = |p: &Part| p.a.rows * p.a.n * p.a.k.max(1);
    let total: usize = parts.iter().map(work).sum();
    if total == 0 {
        return;
    }
    let nt = threads.map_or(1, |t| t.n());
    let budget = (total / MIN_TASK_WORK).clamp(1, 4 * nt);
    let mut chunks: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        if work(p) == 0 {
            continue;
        }
        let c = (budget * work(p)).div_ceil(total).clamp(1, p.a.n);
        let len = p.a.n.div_ceil(c);
        chunks.extend(
            (0..p.a.n)
                .step_by(len)
                .map(|j| (i, j..(j + len).min(p.a.n))),
        );
    }
    let ptrs: Vec<OutPtr> = parts
        .iter_mut()
        .map(|p| OutPtr(p.out.as_mut_ptr()))
        .collect();
    let parts = &*parts;
    let body = |c: usize| {
        let (i, cols) = chunks[c].clone();
        let p = &parts[i];
        run_cols(&p.a, p.rb, p.kern, ptrs[i], cols);
    };
    match threads {
        Some(t) => t.run_tasks(chunks.len(), body),
        None => (0..chunks.len()).for_each(body),
    }
}

/// The weight columns `cols` of one call (sizes validated) into its output `op`, tile by tile.
fn run_cols(a: &LinearArgs, rb: usize, kern: Kernel, op: OutPtr, cols: std::ops::Range<usize>) {
    let plan = match kern {
        Kernel::Float(_, p) => p,
        Kernel::Int(..) | Kernel::IntWide(..) => None,
    };
    let tile = tile_cols(a, rb, kern);
    let k = a.k;
    let op = op.get();
    let mut j0 = cols.start;
    while j0 < cols.end {
        let j1 = (j0 + tile).min(cols.end);
        match plan {
            Some(
                p @ F32Gemm {
                    convert: Some(cvt), ..
                },
            ) => TILE.with(|t| {
                let mut fresh = Vec::new();
                let mut held = t.try_borrow_mut();
                let buf: &mut Vec<f32> = match held.as_mut() {
                    Ok(b) => b,
                    Err(_) => &mut fresh,
                };
                buf.resize((j1 - j0) * k, 0.0);
                for (j, dst) in (j0..j1).zip(buf.chunks_exact_mut(k.max(1))) {
                    // SAFETY: sizes validated by the caller; converter picked for this CPU.
                    unsafe { cvt(&a.w[j * rb..(j + 1) * rb], k, dst) };
                }
                f32_tile(a, j0..j1, (as_bytes(buf), 4 * k), p, op);
            }),
            Some(p) => f32_tile(a, j0..j1, (&a.w[j0 * rb..j1 * rb], rb), p, op),
            None if matches!(kern, Kernel::Int(_, _, Some(_))) => int_tile(a, j0..j1, rb, kern, op),
            None if matches!(kern, Kernel::IntWide(..)) => int_wide(a, j0..j1, rb, kern, op),
            None => tile_rows(a, j0..j1, |j| &a.w[j * rb..(j + 1) * rb], kern, op),
        }
        j0 = j1;
    }
}

/// Runs an interleaved-group kernel over all of `a` (sizes validated, `a.n` a multiple of
/// [`GROUP_ROWS`]; `rb` = weight row bytes) into `out`. `kern(group, r0, nr, o)` computes the
/// group's 16 columns for activation rows `r0..r0 + nr` (`nr <= MAX_ROWS`) into `o`. Each task
/// takes consecutive groups, so every thread reads one sequential stream of weights; within a
/// group every block of [`MAX_ROWS`] activation rows passes over the group while it is cached.
pub(super) fn run_groups(
    threads: Option<&Threads>,
    a: &LinearArgs,
    rb: usize,
    kern: impl Fn(&[u8], usize, usize, &mut [[f32; GROUP_ROWS]; MAX_ROWS]) + Sync,
    out: &mut [f32],
) {
    if a.rows == 0 || a.n == 0 {
        return;
    }
    let op = OutPtr(out.as_mut_ptr());
    let body = |groups: std::ops::Range<usize>| {
        for g in groups {
            group_into(a, rb, &kern, op.get(), g);
        }
    };
    match threads {
        Some(t) => t.for_rows(a.n / GROUP_ROWS, min_groups(a), body),
        None => body(0..a.n / GROUP_ROWS),
    }
}

/// Fewest interleaved groups per task of a call like `a`.
fn min_groups(a: &LinearArgs) -> usize {
    MIN_TASK_WORK
        .div_ceil(a.k.max(1) * a.rows * GROUP_ROWS)
        .max(1)
}

/// Group `g` of `a` (16 weight rows) against every activation row, plus the bias, into `op`.
fn group_into(
    a: &LinearArgs,
    rb: usize,
    kern: &impl Fn(&[u8], usize, usize, &mut [[f32; GROUP_ROWS]; MAX_ROWS]),
    op: *mut f32,
    g: usize,
) {
    let (rows, n) = (a.rows, a.n);
    let gbytes = GROUP_ROWS * rb;
    let w = &a.w[g * gbytes..(g + 1) * gbytes];
    let mut r0 = 0;
    while r0 < rows {
        let nr = (rows - r0).min(MAX_ROWS);
        let mut o = [[0f32; GROUP_ROWS]; MAX_ROWS];
        kern(w, r0, nr, &mut o);
        for (t, ot) in o.iter().enumerate().take(nr) {
            for (c, v) in ot.iter().enumerate() {
                let j = g * GROUP_ROWS + c;
                let b = a.bias.map_or(0.0, |b| b[j]);
                // SAFETY: inside the validated output; no other task writes column j.
                unsafe { *op.add((r0 + t) * n + j) = v + b };
            }
        }
        r0 += nr;
    }
}

/// One weight of [`run_interleaved_many`]: its arguments (sizes validated, `a.n` a multiple of
/// [`GROUP_ROWS`]), weight row bytes and output.
pub(super) struct GroupPart<'a> {
    /// The weight's arguments.
    pub a: LinearArgs<'a>,
    /// Weight row bytes.
    pub rb: usize,
    /// Its output, `a.rows * a.n` values.
    pub out: &'a mut [f32],
}

/// [`run_interleaved`] over several weights of one input, as one job: the groups of all
/// weights are handed out together, each computed as the weight's own call would.
pub(super) fn run_interleaved_many(
    threads: Option<&Threads>,
    parts: &mut [GroupPart],
    f: InterleavedFn,
    q: &Q8Rows,
) {
    // SAFETY: sizes validated by the caller; kernel picked for this CPU.
    let kern = |w: &[u8], r0, nr, o: &mut _| unsafe { f(w, q, r0, nr, o) };
    let mut starts = Vec::with_capacity(parts.len() + 1);
    starts.push(0);
    for p in parts.iter() {
        let last = starts.last().copied().unwrap_or(0);
        starts.push(last + if p.a.rows == 0 { 0 } else { p.a.n / GROUP_ROWS });
    }
    let total = starts.last().copied().unwrap_or(0);
    let outs: Vec<OutPtr> = parts
        .iter_mut()
        .map(|p| OutPtr(p.out.as_mut_ptr()))
        .collect();
    let body = |groups: std::ops::Range<usize>| {
        let mut w = 0;
        for g in groups {
            while starts[w + 1] <= g {
                w += 1;
            }
            let p = &parts[w];
            group_into(&p.a, p.rb, &kern, outs[w].get(), g - starts[w]);
        }
    };
    match (threads, parts.first()) {
        (Some(t), Some(p)) => t.for_rows(total, min_groups(&p.a), body),
        _ => body(0..total),
    }
}

/// [`run_groups`] with an integer interleaved-group kernel over the quantized activations `q`.
pub(super) fn run_interleaved(
    threads: Option<&Threads>,
    a: &LinearArgs,
    rb: usize,
    f: InterleavedFn,
    q: &Q8Rows,
    out: &mut [f32],
) {
    // SAFETY: sizes validated by the caller; kernel picked for this CPU.
    let kern = |w: &[u8], r0, nr, o: &mut _| unsafe { f(w, q, r0, nr, o) };
    run_groups(threads, a, rb, kern, out);
}

/// [`run_groups`] with a float interleaved-group kernel over the f32 activations `a.x`.
pub(super) fn run_interleaved_float(
    threads: Option<&Threads>,
    a: &LinearArgs,
    rb: usize,
    f: FloatGroupFn,
    out: &mut [f32],
) {
    let k = a.k;
    // SAFETY: sizes validated by the caller; kernel picked for this CPU.
    let kern = |w: &[u8], r0: usize, nr: usize, o: &mut _| unsafe {
        f(w, &a.x[r0 * k..(r0 + nr) * k], k, nr, o)
    };
    run_groups(threads, a, rb, kern, out);
}

/// Writes a kernel's output tile `o[column][row]` (`nr` rows from `r0`, `nc` columns from `c0`)
/// plus the bias into the row-major output `op` of row length `n`.
fn store_tile<const R: usize, const C: usize>(
    bias: Option<&[f32]>,
    n: usize,
    o: &[[f32; R]; C],
    (r0, nr): (usize, usize),
    (c0, nc): (usize, usize),
    op: *mut f32,
) {
    for (c, oc) in o.iter().enumerate().take(nc) {
        let j = c0 + c;
        let b = bias.map_or(0.0, |b| b[j]);
        for (t, v) in oc.iter().enumerate().take(nr) {
            // SAFETY: inside the validated output; no other task writes column j.
            unsafe { *op.add((r0 + t) * n + j) = v + b };
        }
    }
}

/// All activation rows against the block weight rows `cols` with the tiled integer kernel.
fn int_tile(a: &LinearArgs, cols: std::ops::Range<usize>, rb: usize, kern: Kernel, op: *mut f32) {
    let Kernel::Int(_, q, Some(tile)) = kern else {
        return tile_rows(a, cols, |j| &a.w[j * rb..(j + 1) * rb], kern, op);
    };
    let (rows, n) = (a.rows, a.n);
    let mut r0 = 0;
    while r0 < rows {
        let nr = (rows - r0).min(MAX_ROWS);
        let mut c0 = cols.start;
        while c0 < cols.end {
            let nc = (cols.end - c0).min(MAX_ROWS);
            let mut o = [[0f32; MAX_ROWS]; MAX_ROWS];
            // SAFETY: sizes validated by the caller; kernel picked for this CPU.
            unsafe { tile(&a.w[c0 * rb..(c0 + nc) * rb], rb, q, r0, nr, nc, &mut o) };
            store_tile(a.bias, n, &o, (r0, nr), (c0, nc), op);
            c0 += nc;
        }
        r0 += nr;
    }
}

/// All activation rows against the block weight rows `cols` with the wide integer kernel.
fn int_wide(a: &LinearArgs, cols: std::ops::Range<usize>, rb: usize, kern: Kernel, op: *mut f32) {
    let Kernel::IntWide(_, q, wide) = kern else {
        return tile_rows(a, cols, |j| &a.w[j * rb..(j + 1) * rb], kern, op);
    };
    let (rows, n) = (a.rows, a.n);
    let mut r0 = 0;
    while r0 < rows {
        let nr = (rows - r0).min(WIDE_ROWS);
        let mut c0 = cols.start;
        while c0 < cols.end {
            let nc = (cols.end - c0).min(WIDE_COLS);
            let mut o = [[0f32; WIDE_ROWS]; WIDE_COLS];
            // SAFETY: sizes validated by the caller; kernel picked for this CPU.
            unsafe { wide(&a.w[c0 * rb..(c0 + nc) * rb], rb, q, r0, nr, nc, &mut o) };
            store_tile(a.bias, n, &o, (r0, nr), (c0, nc), op);
            c0 += nc;
        }
        r0 += nr;
    }
}

/// All activation rows against the weight rows `cols` (stored consecutively in `w`, `rb` bytes
/// each: f32 rows, or rows of the dtype `p.tile` reads in place).
fn f32_tile(
    a: &LinearArgs,
    cols: std::ops::Range<usize>,
    (w, rb): (&[u8], usize),
    p: F32Gemm,
    op: *mut f32,
) {
    let (rows, n, k) = (a.rows, a.n, a.k);
    let j0 = cols.start;
    let Some(tile) = p.tile else {
        return tile_rows(
            a,
            cols,
            |j| &w[(j - j0) * rb..(j - j0 + 1) * rb],
            Kernel::Float(p.rows, None),
            op,
        );
    };
    let mut r0 = 0;
    while r0 < rows {
        let nr = (rows - r0).min(MAX_ROWS);
        let mut c0 = j0;
        while c0 < cols.end {
            let nc = (cols.end - c0).min(MAX_ROWS);
            let mut o = [[0f32; MAX_ROWS]; MAX_ROWS];
            // SAFETY: `w` holds the tile's rows, sizes validated by the caller; kernel picked
            // for this CPU.
            unsafe {
                tile(
                    &w[(c0 - j0) * rb..(c0 - j0 + nc) * rb],
                    &a.x[r0 * k..(r0 + nr) * k],
                    k,
                    nr,
                    nc,
                    &mut o,
                )
            };
            for (c, oc) in o.iter().enumerate().take(nc) {
                let j = c0 + c;
                let b = a.bias.map_or(0.0, |b| b[j]);
                for (t, v) in oc.iter().enumerate().take(nr) {
                    // SAFETY: inside the validated output; no other task writes column j.
                    unsafe { *op.add((r0 + t) * n + j) = v + b };
                }
            }
            c0 += nc;
        }
        r0 += nr;
    }
}

/// All row blocks of the activations against the weight rows `cols` (`row(j)` gives row `j`).
fn tile_rows<'w>(
    a: &LinearArgs,
    cols: std::ops::Range<usize>,
    row: impl Fn(usize) -> &'w [u8],
    kern: Kernel,
    op: *mut f32,
) {
    let (rows, n, k) = (a.rows, a.n, a.k);
    let mut r0 = 0;
    while r0 < rows {
        let nr = (rows - r0).min(MAX_ROWS);
        for j in cols.clone() {
            let wr = row(j);
            let mut acc = [0f32; MAX_ROWS];
            // SAFETY: sizes validated by the caller; kernels were picked for this CPU.
            unsafe {
                match kern {
                    Kernel::Float(f, _) => f(wr, &a.x[r0 * k..(r0 + nr) * k], k, nr, &mut acc),
                    Kernel::Int(f, q, _) | Kernel::IntWide(f, q, _) => f(wr, q, r0, nr, &mut acc),
                }
            }
            let b = a.bias.map_or(0.0, |b| b[j]);
            for (t, v) in acc.iter().enumerate().take(nr) {
                // SAFETY: (r0 + t) < rows and j < n, inside the validated output; no other task
                // writes column j.
                unsafe { *op.add((r0 + t) * n + j) = v + b };
            }
        }
        r0 += nr;
    }
}

fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 slice is a valid byte slice of 4x the length (u8 has alignment 1).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
