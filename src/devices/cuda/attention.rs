//! `Attention` on the GPU (f32): one block per (query, head) with an online softmax over key
//! chunks (kernels/attention.cu); causal mask, sliding window, GQA, ALiBi, soft-capping and
//! attention sinks (`sinks` [nh], in every kernel's softmax denominator but the flash kernel's).
//! `k`/`v` may be KV caches expanded on axis 0, both f32, f16 or q8_0 ([`super::kv`]; a q8_0
//! cache pads each head row to whole blocks of 32): every kernel here has `*_f16kv` and `*_q8kv`
//! instances that read f16 or q8_0 rows in place (dequantized in registers, f32 arithmetic);
//! the cuBLAS path converts them to f32 first (`kv_float_f16kv`, `kv_float_q8kv`).
//!
//! Prefill with `fast = 1` (the `fast` precision) and at least [`TC_MIN_QUERIES`] queries, causal,
//! head size 64 or 128 and no ALiBi / soft-capping / window / sinks runs the fused flash-attention
//! kernel `flash_attn{64,128}x1_f32`: f16 tensor-core `mma.sync` for q·kᵀ and p·v with f32
//! accumulation and an online softmax; f32 keys and values are first converted to f16
//! (`kv_half_f32`; an f16 cache is read as it is, a q8_0 one dequantized to f16 as each tile is
//! staged, `flash_attn{64,128}x1_q8kv`), then staged tile by tile in shared memory by `cp.async` overlapping the math
//! (one query head per block of four warps, two blocks per SM); the scores never reach memory.
//! Other fast prefill goes through cuBLAS: per chunk of queries, scores = q·kᵀ·scale (TF32 tensor cores,
//! strided-batched over the KV heads, once per query head of a GQA group) into a scratch
//! buffer, `attn_softmax_f32` turns them into probabilities in place (mask, window, ALiBi,
//! soft-capping), and out = p·v (TF32) is written straight into `[sq, nh, hdv]`. The scores are
//! materialised (at most [`SCORE_BYTES`] per chunk), so this is not a fused flash kernel.
//!
//! Decode (at most [`DECODE_MAX_QUERIES`] queries, head sizes ≤ 256) goes through the split-K
//! "flash-decoding" kernel `attn_decode_f32`: the keys are cut into ranges spread over the
//! multiprocessors, each block serves one GQA group and merges its range with an online softmax,
//! and the ranges are merged: in a small launch by the last block of a row to finish (a row uses
//! only the ranges its keys need, one for up to 64 keys, decided on the device), else by
//! `attn_decode_combine_f32`. For head sizes 64 and 128 (q/k and v alike) the same launch runs
//! `attn_decode_w{64,128}_f32`: each warp keeps an online softmax over its own runs of four
//! keys in registers (K and V rows loaded together) and the warps meet once at the end, where
//! `attn_decode_f32` synchronises the block three times per chunk of 64 keys. `DecodeAttention` is the same kernel for
//! a KV cache whose length is only known on the device (query positions read from a device
//! tensor, so one CUDA graph replays every decode step; it also stores and rotates the step's
//! own key and value).

use super::act_quant::{ActForm, ActQuant, QuantKey};
use super::blas::{gemm, Elem, Gemm, Operand};
use super::buffer::{dptr, ensure_out, scratch, CudaBuffer};
use super::gpu::{int, long, Gpu, KArg};
use super::kv::{elem_of, kv_elem, stored_head_dim, value_head_dim, KvElem};
use super::linear::TC_MIN_ROWS;
use super::{all_f32, grid_dim, op_err};
use crate::data::{Data, DataType};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex, MutexGuard};

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>, act: &Arc<ActQuant>) {
    let counters = Arc::new(DecodeCounters(Mutex::new(None)));
    ops.insert(
        "Attention",
        Box::new(Attention(
            gpu.clone(),
            Mutex::new(None),
            Mutex::new(None),
            act.clone(),
            counters.clone(),
            Mutex::new(None),
        )),
    );
    ops.insert(
        "DecodeAttention",
        Box::new(DecodeAttention(gpu.clone(), act.clone(), counters)),
    );
}

/// Up to this many queries, `Attention` uses the split-K decode kernel.
pub const DECODE_MAX_QUERIES: usize = 8;

/// Largest q/k and v head size of the decode kernel (`DA_DPL * 32`, `DA_VPT * DA_THREADS`).
pub const DECODE_MAX_HD: usize = 256;
/// Most key ranges per row (`DA_MAX_SPLITS` in the kernel's merge).
const DECODE_MAX_SPLITS: usize = 64;
/// Query heads per block of the decode kernel (`DA_GMAX`).
const DECODE_GMAX: usize = 4;

/// Key ranges per (row, GQA group chunk) for up to `keys` visible keys: ~64 keys per range, at
/// most `DECODE_MAX_SPLITS`, and no more than about four blocks per multiprocessor in all.
pub fn decode_splits(keys: usize, units: usize, sms: usize) -> usize {
    let by_keys = keys.div_ceil(64).max(1);
    let by_grid = (4 * sms / units.max(1)).max(1);
    by_keys.min(by_grid).clamp(1, DECODE_MAX_SPLITS)
}

/// Key groups of 128 threads per decode block (`DA_KQ_MAX` in kernels/attention.cu at most):
/// in `attn_decode_f32` they split each chunk's weighted-V pass and the score steps, in the
/// warp kernels `attn_decode_w*` each group adds four warps with keys of their own; either way
/// a block's serial chain gets shorter when the grid leaves multiprocessors idle (short
/// contexts). With more blocks than multiprocessors the bigger blocks only cost residency, so
/// those launches keep one group. On small grids the fastest counts on an H100 are 4 groups for
/// `attn_decode_f32` and for warp kernels serving several heads per block, and 2 for warp
/// kernels serving one head (short rows), whose last merge costs more with more warps.
const DECODE_KEY_GROUPS: u32 = 4;
/// [`DECODE_KEY_GROUPS`] for the warp kernels.
const DECODE_WARP_KEY_GROUPS: u32 = 2;

/// Key groups for a launch of `kernel` with `blocks` blocks on `sms` multiprocessors, each
/// block serving `gchunk` query heads.
fn decode_key_groups(kernel: &str, blocks: usize, sms: usize, gchunk: usize) -> u32 {
    if blocks > sms {
        1
    } else if kernel == "attn_decode_f32" || gchunk > 1 {
        DECODE_KEY_GROUPS
    } else {
        DECODE_WARP_KEY_GROUPS
    }
}

/// Pointers, sizes and scalars of one attention call (any path).
#[derive(Clone, Copy)]
struct AttnArgs {
    q: u64,
    k: u64,
    v: u64,
    slopes: u64,
    /// Attention sinks [nh], or 0.
    sinks: u64,
    out: u64,
    sq: usize,
    skv: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    hdv: usize,
    scale: f32,
    softcap: f32,
    causal: bool,
    window: i32,
    /// The element type of the keys and values.
    elem: KvElem,
}

/// The floats `scale` (default 1/√hd), `softcap` and the int `sliding_window` (negative: off)
/// of an attention call.
fn attn_scalars(f: &FloatDict, i: &IntDict, hd: usize) -> (f32, f32, i32) {
    (
        f.get_or("scale", 1.0 / (hd.max(1) as f32).sqrt()),
        f.get_or("softcap", 0.0),
        i.get_or("sliding_window", 0).max(0),
    )
}

/// One launch of the decode kernel.
struct DecodeArgs {
    attn: AttnArgs,
    /// Query positions (I32 [sq] on the device), or 0: query i sits at skv − sq + i.
    positions: u64,
    /// Readable rows of the caches.
    kcap: usize,
    /// Q8_0 rows of the output for the next `Linear` (values, scale pairs), or none.
    q8: Option<(u64, u64)>,
    /// The step's own key and value to store (and rotate) in the kernel, or none.
    step: Option<StepKv>,
}

/// The raw key and value of a one-row decode step that `DecodeAttention` stores in the caches
/// itself, rotating the key (and the queries) when the tables are given.
#[derive(Clone, Copy)]
struct StepKv {
    /// Keys [1, nkv, hd].
    k: u64,
    /// Values [1, nkv, hdv].
    v: u64,
    /// cos / sin tables [1, rot/2], or 0 when q and k arrive rotated.
    cos: u64,
    sin: u64,
    /// Rotated dims per head.
    rot: usize,
    /// 0 = pairs (i, i + rot/2), 1 = pairs (2i, 2i + 1).
    style: i32,
}

/// Query heads per block of a decode launch over at most `keys` keys: one for short ranges
/// (more, shorter blocks: the kernel is latency-bound there), else up to [`DECODE_GMAX`] heads of
/// a GQA group sharing each K/V row loaded.
fn decode_gchunk(keys: usize, nh: usize, nkv: usize) -> usize {
    let group = (nh / nkv.max(1)).max(1);
    if keys <= DECODE_SHORT_KEYS {
        1
    } else {
        group.min(DECODE_GMAX)
    }
}

/// Up to this many keys, a decode block serves one query head.
const DECODE_SHORT_KEYS: usize = 256;

/// Grid units (KV head × head chunk × row) of a decode launch.
fn decode_units(nh: usize, nkv: usize, sq: usize, gchunk: usize) -> usize {
    let group = (nh / nkv.max(1)).max(1);
    nkv * group.div_ceil(gchunk.max(1)) * sq
}

/// Workspace floats the decode kernel needs for `nsplit` ranges (0 with one range).
fn decode_workspace(sq: usize, nh: usize, hdv: usize, nsplit: usize) -> usize {
    if nsplit <= 1 {
        0
    } else {
        sq * nh * nsplit * (hdv + 2)
    }
}

/// The decode kernel for these head sizes: `attn_decode_w{64,128}_f32` (each warp its own keys,
/// one barrier) where q/k and v heads are both 64 or both 128, else `attn_decode_f32`. Both
/// take the same launch and arguments.
fn decode_kernel(hd: usize, hdv: usize) -> &'static str {
    match (hd, hdv) {
        (64, 64) => "attn_decode_w64_f32",
        (128, 128) => "attn_decode_w128_f32",
        _ => "attn_decode_f32",
    }
}

/// Enqueues the split-K decode attention: `nsplit` ranges; `part` holds [`decode_workspace`]
/// floats when `nsplit > 1`. A launch of no more blocks than multiprocessors with several
/// ranges merges them in the kernel (a row takes only the ranges its keys need, so a short one
/// needs no merge), with `counters` (zero: one int per query row and block row of the grid);
/// a bigger one uses every range and merges them in `attn_decode_combine_f32`.
fn decode_launch(
    gpu: &Gpu,
    a: &DecodeArgs,
    nsplit: usize,
    gchunk: usize,
    part: u64,
    counters: u64,
) -> Result<()> {
    let grid = decode_grid(&a.attn, nsplit, gchunk)?;
    let part = if nsplit > 1 { part } else { 0 };
    let blocks = grid.0 as usize * grid.1 as usize * grid.2 as usize;
    let merge_in_kernel = nsplit > 1 && blocks <= gpu.sms();
    let counters = if merge_in_kernel { counters } else { 0 };
    let kernel = decode_kernel(a.attn.hd, a.attn.hdv);
    let threads = 128 * decode_key_groups(kernel, blocks, gpu.sms(), gchunk);
    // the warp kernels' per-warp outputs: threads / 32 warps × gchunk heads × hd floats
    let smem = if kernel == "attn_decode_f32" {
        0
    } else {
        (threads as usize / 32 * gchunk * a.attn.hd * 4) as u32
    };
    let args = decode_kernel_args(a, (nsplit, gchunk), part, counters)?;
    gpu.launch_smem(&a.attn.elem.kernel(kernel), grid, threads, smem, &args)?;
    if nsplit > 1 && !merge_in_kernel {
        decode_combine(gpu, a, nsplit, part, grid.2)?;
    }
    Ok(())
}

/// The grid of a decode launch: (key ranges, KV heads × head chunks, query rows).
fn decode_grid(a: &AttnArgs, nsplit: usize, gchunk: usize) -> Result<(u32, u32, u32)> {
    const OP: &str = "Attention";
    let group = (a.nh / a.nkv.max(1)).max(1);
    let gy = a.nkv * group.div_ceil(gchunk.max(1));
    Ok((
        u32::try_from(nsplit).map_err(|_| op_err(OP, "too many splits"))?,
        grid_dim(OP, gy, "too many heads")?,
        grid_dim(OP, a.sq, "too many queries")?,
    ))
}

/// The arguments of `attn_decode_f32` / `attn_decode_w*_f32` for `(splits, heads per block)`.
fn decode_kernel_args(
    d: &DecodeArgs,
    (nsplit, gchunk): (usize, usize),
    part: u64,
    counters: u64,
) -> Result<Vec<KArg>> {
    let a = &d.attn;
    let (q8v, q8d) = d.q8.unwrap_or((0, 0));
    let step = |f: fn(&StepKv) -> u64| d.step.as_ref().map_or(0, f);
    let mut args = vec![
        KArg::Ptr(a.q),
        KArg::Ptr(a.k),
        KArg::Ptr(a.v),
        KArg::Ptr(a.slopes),
        KArg::Ptr(d.positions),
        KArg::Ptr(a.out),
        KArg::Ptr(part),
        int(a.sq, "sq")?,
        int(a.skv, "skv")?,
        int(d.kcap, "cache rows")?,
    ];
    args.extend(head_and_score_args(a)?);
    args.extend([
        int(nsplit, "splits")?,
        int(gchunk, "heads per block")?,
        KArg::Ptr(q8v),
        KArg::Ptr(q8d),
        KArg::Ptr(step(|t| t.k)),
        KArg::Ptr(step(|t| t.v)),
        KArg::Ptr(step(|t| t.cos)),
        KArg::Ptr(step(|t| t.sin)),
        int(d.step.map_or(0, |t| t.rot), "rotary dim")?,
        KArg::I32(d.step.map_or(0, |t| t.style)),
        KArg::Ptr(counters),
        KArg::Ptr(a.sinks),
    ]);
    Ok(args)
}

/// The kernel arguments the decode and general kernels share, in their order: heads, KV heads,
/// q/k and v head sizes, k and v row lengths (stored values: q8_0 head rows are padded),
/// scale, soft-cap, causal, window.
fn head_and_score_args(a: &AttnArgs) -> Result<[KArg; 10]> {
    let dt = a.elem.dtype();
    Ok([
        int(a.nh, "heads")?,
        int(a.nkv, "kv heads")?,
        int(a.hd, "head dim")?,
        int(a.hdv, "v head dim")?,
        long(a.nkv * stored_head_dim(dt, a.hd), "k row")?,
        long(a.nkv * stored_head_dim(dt, a.hdv), "v row")?,
        KArg::F32(a.scale),
        KArg::F32(a.softcap),
        KArg::I32(a.causal as i32),
        KArg::I32(a.window),
    ])
}

/// Merges the `nsplit` key ranges in `part` of a decode launch over `rows` query rows
/// (`attn_decode_combine_f32`), for launches too big to merge in the kernel.
fn decode_combine(gpu: &Gpu, d: &DecodeArgs, nsplit: usize, part: u64, rows: u32) -> Result<()> {
    let a = &d.attn;
    let (q8v, q8d) = d.q8.unwrap_or((0, 0));
    let heads = u32::try_from(a.nh).map_err(|_| op_err("Attention", "too many heads"))?;
    gpu.launch(
        "attn_decode_combine_f32",
        (heads, rows, 1),
        128,
        &[
            KArg::Ptr(part),
            KArg::Ptr(a.out),
            int(a.nh, "heads")?,
            int(a.hdv, "v head dim")?,
            int(nsplit, "splits")?,
            KArg::Ptr(q8v),
            KArg::Ptr(q8d),
            KArg::Ptr(a.sinks),
        ],
    )
}

/// The Q8_0 output rows asked for by `quantize_output = 1` (for the o-projection): slots in
/// `act` for `sq` rows of `nh · hdv` values when `hdv % 32 == 0` (a warp's 32 values form one
/// block), with the key to record once the launch is queued.
fn decode_q8(
    act: &ActQuant,
    ints: &IntDict,
    out: u64,
    sq: usize,
    nh: usize,
    hdv: usize,
) -> Result<Option<((u64, u64), QuantKey)>> {
    if ActForm::from_param(ints.get_or("quantize_output", 0)) != Some(ActForm::Q8)
        || !hdv.is_multiple_of(32)
    {
        return Ok(None);
    }
    let (qs, ds, key) = act.slots(out, sq, nh * hdv)?;
    Ok(Some(((qs, ds), key)))
}

/// Largest q/k head size (`qs[1024]` in the kernel).
const MAX_HD: usize = 1024;
/// Largest v head size (`ATT_THREADS * ATT_DPT`).
const MAX_HDV: usize = 512;

/// From this many queries on, `fast = 1` attention uses the cuBLAS path.
pub const TC_MIN_QUERIES: usize = 64;

/// Most bytes of scores materialised at once (the query chunk is sized to fit).
const SCORE_BYTES: usize = 256 << 20;

/// The device, the score scratch of the cuBLAS path (the f16 K/V of the flash path), the
/// split-K decode partials, the buffer for the output's f16/bf16 copy (`quantize_output`), the
/// split decode launches' counters, and the f32 K/V of the cuBLAS path over an f16 cache.
struct Attention(
    Arc<Gpu>,
    Mutex<Option<CudaBuffer>>,
    Mutex<Option<CudaBuffer>>,
    Arc<ActQuant>,
    Arc<DecodeCounters>,
    Mutex<Option<CudaBuffer>>,
);

/// The counters of split decode launches (one int per query row and block row of the grid:
/// how many of its splits have finished, so the last one merges them; see `attn_decode_f32`).
/// One zeroed buffer per device shared by `Attention` and `DecodeAttention`, grown outside
/// recordings (a regrowth marks recorded graphs stale); every launch leaves its counters zero.
struct DecodeCounters(Mutex<Option<CudaBuffer>>);

impl DecodeCounters {
    /// The address of at least `units` zeroed counters.
    fn get(&self, gpu: &Arc<Gpu>, units: usize) -> Result<u64> {
        let mut guard = self
            .0
            .lock()
            .map_err(|_| Error::Device("decode counters poisoned".into()))?;
        scratch(gpu, &mut guard, 4 * units.max(1), true)
    }
}

/// A locked scratch buffer of `Attention`.
type ScratchGuard<'a> = MutexGuard<'a, Option<CudaBuffer>>;

/// Locks one of the scratch buffers of `Attention`.
fn lock_scratch(m: &Mutex<Option<CudaBuffer>>) -> Result<ScratchGuard<'_>> {
    m.lock()
        .map_err(|_| Error::Device("Attention scratch poisoned".into()))
}

/// An f32 cuBLAS operand at `ptr` with leading dimension `ld` and batch stride `stride`.
fn f32_operand(ptr: u64, ld: usize, stride: usize) -> Operand {
    Operand {
        ptr,
        elem: Elem::F32,
        ld,
        stride,
    }
}

/// One chunk of queries of the cuBLAS path: `n` queries from `i0`, seeing keys `..kend`, their
/// scores at `scores`.
#[derive(Clone, Copy)]
struct ScoreChunk {
    scores: u64,
    i0: usize,
    n: usize,
    kend: usize,
}

/// Runs [`decode_launch`] with the Q8_0 output rows that `quantize_output` asks for, recorded
/// in `act` once the launch is queued.
fn decode_launch_q8(
    gpu: &Gpu,
    act: &ActQuant,
    ints: &IntDict,
    mut d: DecodeArgs,
    (nsplit, gchunk): (usize, usize),
    part: u64,
    counters: u64,
) -> Result<()> {
    let a = d.attn;
    let q8 = decode_q8(act, ints, a.out, a.sq, a.nh, a.hdv)?;
    d.q8 = q8.map(|q| q.0);
    decode_launch(gpu, &d, nsplit, gchunk, part, counters)?;
    if let Some((_, key)) = q8 {
        act.set(key, true)?;
    }
    Ok(())
}

impl Attention {
    /// The fused flash-attention kernel (`flash_attn{64,128}x1_f32`, module doc): causal, head
    /// sizes 64 or 128 (q, k and v alike), no ALiBi, soft-capping, window or sinks. `Ok(false)`
    /// when the call is not of that kind. With `copy` f16/bf16 (`quantize_output` 2 / 3) it also
    /// writes the output's copy for the next tensor-core `Linear`.
    fn flash(&self, a: &AttnArgs, copy: Option<ActForm>) -> Result<bool> {
        let fits = a.causal
            && a.hd == a.hdv
            && (a.hd == 64 || a.hd == 128)
            && a.slopes == 0
            && a.sinks == 0
            && a.softcap == 0.0
            && a.window == 0
            && a.skv >= a.sq
            && a.nkv > 0
            && a.nh.is_multiple_of(a.nkv);
        let aligned = [a.k, a.v].iter().all(|p| p % 16 == 0);
        if !fits || !aligned {
            return Ok(false);
        }
        const OP: &str = "Attention";
        let mut guard = lock_scratch(&self.1)?;
        // a q8_0 cache is dequantized tile by tile in the kernel
        let (kh, vh, suffix) = match a.elem {
            KvElem::Q8 => (a.k, a.v, "q8kv"),
            _ => {
                let (kh, vh) = self.half_kv(a, &mut guard)?;
                (kh, vh, "f32")
            }
        };
        // the output's f16/bf16 copy for the next tensor-core Linear (o-projection)
        let copy = match copy {
            Some(form @ (ActForm::F16 | ActForm::Bf16)) if a.sq >= TC_MIN_ROWS => {
                let (hp, key) = self.3.half_slot(a.out, a.sq, a.nh * a.hd, form)?;
                Some((hp, key, form == ActForm::Bf16))
            }
            _ => None,
        };
        // one query head per block of four warps (two blocks fit an SM, so one block's softmax
        // overlaps the other's products); (heads, query tiles): the kernel's dispatch order is
        // longest tiles first
        let grid = (
            u32::try_from(a.nh).map_err(|_| op_err(OP, "too many heads"))?,
            grid_dim(OP, a.sq.div_ceil(64), "too many queries")?,
            1,
        );
        self.0.launch(
            &format!("flash_attn{}x1_{suffix}", a.hd),
            grid,
            128,
            &[
                KArg::Ptr(a.q),
                KArg::Ptr(kh),
                KArg::Ptr(vh),
                KArg::Ptr(a.out),
                int(a.sq, "queries")?,
                int(a.skv, "keys")?,
                int(a.nh, "heads")?,
                int(a.nkv, "kv heads")?,
                KArg::F32(a.scale),
                KArg::Ptr(copy.map_or(0, |c| c.0)),
                KArg::I32(copy.is_some_and(|c| c.2) as i32),
            ],
        )?;
        if let Some((_, key, _)) = copy {
            self.3.set(key, true)?;
        }
        Ok(true)
    }

    /// The keys and values of `a` as f16 for the flash kernel (which stages them by 16-byte
    /// `cp.async`): an f16 cache in place, f32 ones converted (`kv_half_f32`) into `guard`, the
    /// scratch the cuBLAS path uses for its scores.
    fn half_kv(&self, a: &AttnArgs, guard: &mut Option<CudaBuffer>) -> Result<(u64, u64)> {
        if a.elem == KvElem::F16 {
            return Ok((a.k, a.v));
        }
        let values = a.skv * a.nkv * a.hd;
        let kh = scratch(&self.0, guard, 4 * values, false)?;
        let vh = kh + 2 * values as u64;
        self.0.launch(
            "kv_half_f32",
            Gpu::grid_for(values / 4, 256),
            256,
            &[
                KArg::Ptr(a.k),
                KArg::Ptr(a.v),
                KArg::Ptr(kh),
                KArg::Ptr(vh),
                long(values / 4, "values")?,
            ],
        )?;
        Ok((kh, vh))
    }

    /// `a` with f32 keys and values for cuBLAS: as it is, or with an f16 or q8_0 cache
    /// converted (`kv_float_f16kv`, `kv_float_q8kv`) into the scratch `self.5`, held by the
    /// returned guard.
    fn float_kv(&self, a: &AttnArgs) -> Result<(AttnArgs, Option<ScratchGuard<'_>>)> {
        if a.elem == KvElem::F32 {
            return Ok((*a, None));
        }
        let mut guard = lock_scratch(&self.5)?;
        let (nk, nv) = (a.skv * a.nkv * a.hd, a.skv * a.nkv * a.hdv);
        let kf = scratch(&self.0, &mut guard, 4 * (nk + nv), false)?;
        let vf = kf + 4 * nk as u64;
        let f = AttnArgs {
            k: kf,
            v: vf,
            elem: KvElem::F32,
            ..*a
        };
        if a.elem == KvElem::Q8 {
            let rows = a.skv * a.nkv;
            self.0.launch(
                "kv_float_q8kv",
                Gpu::grid_for(nk.max(nv), 256),
                256,
                &[
                    KArg::Ptr(a.k),
                    KArg::Ptr(a.v),
                    KArg::Ptr(kf),
                    KArg::Ptr(vf),
                    long(rows, "head rows")?,
                    int(a.hd, "head dim")?,
                    int(a.hdv, "v head dim")?,
                ],
            )?;
            return Ok((f, Some(guard)));
        }
        self.0.launch(
            "kv_float_f16kv",
            Gpu::grid_for(nk.max(nv), 256),
            256,
            &[
                KArg::Ptr(a.k),
                KArg::Ptr(a.v),
                KArg::Ptr(kf),
                KArg::Ptr(vf),
                long(nk, "key values")?,
                long(nv, "value values")?,
            ],
        )?;
        Ok((f, Some(guard)))
    }

    /// The cuBLAS path (module doc). `Ok(false)` when cuBLAS is not loaded.
    fn tensor_core(&self, a: &AttnArgs) -> Result<bool> {
        if self.0.blas().is_none() {
            return Ok(false);
        }
        let (a, _held) = self.float_kv(a)?;
        let a = &a;
        let row_bytes = a.nh * a.skv * 4;
        let qc = (SCORE_BYTES / row_bytes.max(1)).clamp(1, a.sq);
        let mut guard = lock_scratch(&self.1)?;
        let scores = scratch(&self.0, &mut guard, qc * row_bytes, false)?;
        let mut i0 = 0;
        while i0 < a.sq {
            let n = qc.min(a.sq - i0);
            // keys any query of this chunk can see
            let kend = if a.causal {
                (a.skv + i0 + n).saturating_sub(a.sq).min(a.skv)
            } else {
                a.skv
            };
            let c = ScoreChunk {
                scores,
                i0,
                n,
                kend,
            };
            if !self.tc_scores(a, c)? {
                return Ok(false);
            }
            if kend > 0 {
                self.tc_softmax(a, c)?;
            }
            if !self.tc_values(a, c)? {
                return Ok(false);
            }
            i0 += n;
        }
        Ok(true)
    }

    /// Scores of a chunk: scoresᵀ (column-major [kend, n], ld skv) = K_h · Q_hᵀ · scale for the
    /// heads h = kh·group + g, one strided-batched GEMM over the KV heads per g. `Ok(false)` when
    /// cuBLAS refuses.
    fn tc_scores(&self, a: &AttnArgs, c: ScoreChunk) -> Result<bool> {
        let group = a.nh / a.nkv;
        self.gemm_per_group(group, |g| Gemm {
            ta: true,
            tb: false,
            m: c.kend,
            n: c.n,
            k: a.hd,
            a: f32_operand(a.k, a.nkv * a.hd, a.hd),
            b: f32_operand(
                a.q + 4 * ((c.i0 * a.nh + g) * a.hd) as u64,
                a.nh * a.hd,
                group * a.hd,
            ),
            c: f32_operand(
                c.scores + 4 * (g * c.n * a.skv) as u64,
                a.skv,
                group * c.n * a.skv,
            ),
            batch: a.nkv,
            alpha: a.scale,
            beta: 0.0,
            tf32: true,
        })
    }

    /// Runs `gemm_of(g)` for every g of a GQA group (one strided-batched GEMM over the KV heads
    /// each). `Ok(false)` when cuBLAS refuses one.
    fn gemm_per_group(&self, group: usize, gemm_of: impl Fn(usize) -> Gemm) -> Result<bool> {
        for g in 0..group {
            if !gemm(&self.0, &gemm_of(g))? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Turns a chunk's scores into probabilities in place (`attn_softmax_f32`: mask, window,
    /// ALiBi, soft-capping, sinks).
    fn tc_softmax(&self, a: &AttnArgs, c: ScoreChunk) -> Result<()> {
        self.0.launch(
            "attn_softmax_f32",
            (
                u32::try_from(c.n).map_err(|_| op_err("Attention", "too many queries"))?,
                u32::try_from(a.nh).map_err(|_| op_err("Attention", "too many heads"))?,
                1,
            ),
            256,
            &[
                KArg::Ptr(c.scores),
                KArg::Ptr(a.slopes),
                KArg::Ptr(a.sinks),
                int(c.n, "chunk")?,
                int(c.i0, "chunk start")?,
                int(a.sq, "sq")?,
                int(a.skv, "skv")?,
                long(a.skv, "score row")?,
                int(c.kend, "keys")?,
                KArg::F32(a.softcap),
                KArg::I32(a.causal as i32),
                KArg::I32(a.window),
            ],
        )
    }

    /// A chunk's output: outᵀ (column-major [hdv, n], ld nh·hdv) = V_hᵀ · P_hᵀ, written straight
    /// into `[sq, nh, hdv]`. `Ok(false)` when cuBLAS refuses.
    fn tc_values(&self, a: &AttnArgs, c: ScoreChunk) -> Result<bool> {
        let group = a.nh / a.nkv;
        self.gemm_per_group(group, |g| Gemm {
            ta: false,
            tb: false,
            m: a.hdv,
            n: c.n,
            k: c.kend,
            a: f32_operand(a.v, a.nkv * a.hdv, a.hdv),
            b: f32_operand(
                c.scores + 4 * (g * c.n * a.skv) as u64,
                a.skv,
                group * c.n * a.skv,
            ),
            c: f32_operand(
                a.out + 4 * ((c.i0 * a.nh + g) * a.hdv) as u64,
                a.nh * a.hdv,
                group * a.hdv,
            ),
            batch: a.nkv,
            alpha: 1.0,
            beta: 0.0,
            tf32: true,
        })
    }

    /// The split-K decode kernel (module doc) over `a`.
    fn decode(&self, a: &AttnArgs, i: &IntDict) -> Result<()> {
        let gchunk = decode_gchunk(a.skv, a.nh, a.nkv);
        let units = decode_units(a.nh, a.nkv, a.sq, gchunk);
        let nsplit = decode_splits(a.skv, units, self.0.sms());
        let need = 4 * decode_workspace(a.sq, a.nh, a.hdv, nsplit);
        let mut guard = lock_scratch(&self.2)?;
        let part = scratch(&self.0, &mut guard, need, true)?;
        let counters = self.4.get(&self.0, units)?;
        let args = DecodeArgs {
            attn: *a,
            positions: 0,
            kcap: a.skv,
            q8: None,
            step: None,
        };
        decode_launch_q8(&self.0, &self.3, i, args, (nsplit, gchunk), part, counters)
    }

    /// The general kernel `attention_f32` (`attention_f16kv` over f16 keys and values): one
    /// block per (query, head), any sizes the op takes.
    fn general(&self, a: &AttnArgs) -> Result<()> {
        let gx = u32::try_from(a.sq).map_err(|_| op_err("Attention", "too many queries"))?;
        let gy = grid_dim("Attention", a.nh, "too many heads")?;
        let mut args = vec![
            KArg::Ptr(a.q),
            KArg::Ptr(a.k),
            KArg::Ptr(a.v),
            KArg::Ptr(a.slopes),
            KArg::Ptr(a.sinks),
            KArg::Ptr(a.out),
            int(a.sq, "sq")?,
            int(a.skv, "skv")?,
        ];
        args.extend(head_and_score_args(a)?);
        let kernel = a.elem.kernel("attention_f32");
        self.0.launch(&kernel, (gx, gy, 1), 128, &args)
    }
}

fn dims3(d: &Data, name: &str) -> Result<[usize; 3]> {
    match d.dims() {
        [a, b, c] => Ok([*a, *b, *c]),
        other => Err(op_err("Attention", format!("{name} {other:?} must be 3-D"))),
    }
}

/// The device address of an optional input, 0 when it is absent.
fn opt_ptr(t: Option<&Data>, name: &str) -> Result<u64> {
    t.map(|t| dptr(t, name)).transpose().map(|p| p.unwrap_or(0))
}

/// A required input of `Attention`.
fn need<'a>(t: Option<&'a Data>, name: &str) -> Result<&'a Data> {
    t.ok_or_else(|| op_err("Attention", format!("missing input '{name}'")))
}

/// The pointers, sizes and scalars of an `Attention` call.
fn attention_args(d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<AttnArgs> {
    let names = ["q", "k", "v", "alibi_slopes", "sinks"];
    let ([q, k, v, s, sk], out) = d.io("Attention", names, "output")?;
    let (q, k, v) = (need(q, "q")?, need(k, "k")?, need(v, "v")?);
    let [sq, nh, hd] = dims3(q, "q")?;
    let [skv, nkv, _] = dims3(k, "k")?;
    let (slopes, sinks) = (opt_ptr(s, "alibi_slopes")?, opt_ptr(sk, "sinks")?);
    let (scale, softcap, window) = attn_scalars(f, i, hd);
    let elem = elem_of(k.dtype(), v.dtype()).ok_or_else(|| {
        op_err(
            "Attention",
            format!(
                "k {} / v {}: keys and values must both be f32, f16 or q8_0",
                k.dtype(),
                v.dtype()
            ),
        )
    })?;
    Ok(AttnArgs {
        q: dptr(q, "q")?,
        k: dptr(k, "k")?,
        v: dptr(v, "v")?,
        slopes,
        sinks,
        out: dptr(out, "output")?,
        sq,
        skv,
        nh,
        nkv,
        hd,
        hdv: value_head_dim(v.dtype(), v.dim(-1), hd),
        scale,
        softcap,
        causal: i.get_or("causal", 1) != 0,
        window,
        elem,
    })
}

impl Operator for Attention {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        let shapes_ok = match (d.get("q"), d.get("k"), d.get("v")) {
            (Some(q), Some(k), Some(v)) => {
                q.is_contiguous()
                    && k.is_contiguous()
                    && v.is_contiguous()
                    && q.dim(-1) <= MAX_HD
                    && v.dim(-1) <= MAX_HDV
            }
            _ => false,
        };
        shapes_ok && all_f32(d, &["q", "alibi_slopes", "sinks"]) && kv_elem(d, "k", "v").is_some()
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let [sq, nh, hd] = dims3(d.require("Attention", "q")?, "q")?;
        let k = d.require("Attention", "k")?;
        let [skv, nkv, hdk] = dims3(k, "k")?;
        let v = d.require("Attention", "v")?;
        let [skv2, nkv2, hds] = dims3(v, "v")?;
        let hdv = value_head_dim(v.dtype(), hds, hd);
        if hdk != stored_head_dim(k.dtype(), hd)
            || skv2 != skv
            || nkv2 != nkv
            || nkv == 0
            || nh % nkv != 0
        {
            return Err(op_err(
                "Attention",
                format!("q [{sq}, {nh}, {hd}], k [{skv}, {nkv}, {hdk}], v [{skv2}, {nkv2}, {hds}] do not match (a q8_0 cache pads head rows to whole blocks of 32)"),
            ));
        }
        for n in ["alibi_slopes", "sinks"] {
            if let Some(s) = d.get(n).filter(|s| s.count() != nh) {
                return Err(op_err(
                    "Attention",
                    format!("{n} {:?} must have {nh} entries", s.dims()),
                ));
            }
        }
        ensure_out(
            &self.0,
            d.require_mut("Attention", "output")?,
            DataType::F32,
            &[sq, nh, hdv],
        )
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let a = attention_args(d, f, i)?;
        // Causal with fewer keys than queries leaves early queries without keys: the kernels
        // below handle that (zeros), the cuBLAS path needs every chunk to see a key.
        let fast = i.get_or("fast", 0) != 0;
        if fast && a.sq >= TC_MIN_QUERIES && a.skv > 0 && (!a.causal || a.skv >= a.sq) {
            let copy = ActForm::from_param(i.get_or("quantize_output", 0));
            if self.flash(&a, copy)? || self.tensor_core(&a)? {
                return Ok(());
            }
        }
        if a.sq <= DECODE_MAX_QUERIES && a.hd <= DECODE_MAX_HD && a.hdv <= DECODE_MAX_HD {
            return self.decode(&a, i);
        }
        self.general(&a)
    }
}

/// Rows of a KV cache (its capacity on axis 0), after checking that its allocation holds them.
fn cache_rows(op: &str, c: &Data, name: &str) -> Result<usize> {
    let [_, nkv, hd] = dims3(c, name)?;
    let cap = c.capacity().first().copied().unwrap_or(0);
    let need = crate::data::bytes_for(c.dtype(), &[cap, nkv, hd])?;
    match super::buffer::device_len(c) {
        Some(len) if len >= need => Ok(cap),
        Some(len) => Err(op_err(
            op,
            format!("{name}: {len} bytes hold fewer than its {cap} rows"),
        )),
        None => Err(op_err(op, format!("{name} is not on the GPU"))),
    }
}

/// `DecodeAttention`: attention of `q` [sq, nh, hd] at positions `positions` (I32 [sq], read on
/// the device) over KV caches `k_cache` [len, nkv, hd] / `v_cache` [len, nkv, hdv] whose rows
/// up to the capacity are readable: query i sees keys max(0, p − window + 1) ..= p of its
/// position p (causal). The cache length on the host is ignored, so a recorded graph replays
/// this op as the cache grows. Optional `alibi_slopes` and attention `sinks` [nh]. Floats
/// `scale`, `softcap`; ints `sliding_window`. The inout
/// `workspace` (F32) is sized by the op (fixed for a given cache capacity and shapes).
/// With the step's own keys and values `k` [1, nkv, hd] / `v` [1, nkv, hdv] (one query row) the
/// kernel also stores them at cache row `positions[0]`, and with `cos` / `sin` (that position's
/// [`crate::ops::rotary_tables`], ints `rotary_dim`, `style`) it rotates `q` and `k` first: one
/// launch for what `RotaryEmbedding`, storing the rows and this op do apart (`q` and `k` are
/// read, not changed). The caches are then inout arguments (an `Err` otherwise).
struct DecodeAttention(Arc<Gpu>, Arc<ActQuant>, Arc<DecodeCounters>);

const DA_NAMES: [&str; 6] = [
    "q",
    "k_cache",
    "v_cache",
    "positions",
    "alibi_slopes",
    "sinks",
];

/// The optional step inputs of `DecodeAttention`: raw key and value, cos and sin tables.
const STEP_NAMES: [&str; 4] = ["k", "v", "cos", "sin"];

/// The validated [`StepKv`] of a `DecodeAttention` call from its optional inputs `k`, `v`,
/// `cos`, `sin` and ints `rotary_dim`, `style`: none without `k`.
fn step_kv(
    t: &[Option<&Data>; 4],
    ints: &IntDict,
    sq: usize,
    nkv: usize,
    hd: usize,
    hdv: usize,
) -> Result<Option<StepKv>> {
    const OP: &str = "DecodeAttention";
    let [k, v, cos, sin] = *t;
    let Some(k) = k else {
        return if v.is_some() || cos.is_some() {
            Err(op_err(OP, "'v' and 'cos'/'sin' need the step's keys 'k'"))
        } else {
            Ok(None)
        };
    };
    let Some(v) = v else {
        return Err(op_err(OP, "'k' needs the step's values 'v'"));
    };
    if sq != 1 {
        return Err(op_err(
            OP,
            format!("the step's own keys ('k') need one query row, got {sq}"),
        ));
    }
    let (kd, vd) = (k.dims(), v.dims());
    if kd != [1, nkv, hd] || vd != [1, nkv, hdv] {
        return Err(op_err(
            OP,
            format!("k {kd:?} / v {vd:?} must be [1, {nkv}, {hd}] / [1, {nkv}, {hdv}]"),
        ));
    }
    let (cos, sin, rot) = match (cos, sin) {
        (None, None) => (0, 0, 0),
        (Some(c), Some(sn)) => {
            let (cd, sd) = (c.dims(), sn.dims());
            let rot = usize::try_from(ints.get_or("rotary_dim", hd as i32)).unwrap_or(usize::MAX);
            if rot == 0 || rot > hd || rot % 2 != 0 {
                return Err(op_err(
                    OP,
                    format!("rotary_dim {rot} must be even, positive and ≤ head dim {hd}"),
                ));
            }
            if cd.iter().product::<usize>() != rot / 2 || sd.iter().product::<usize>() != rot / 2 {
                return Err(op_err(
                    OP,
                    format!("cos {cd:?} / sin {sd:?} must hold {} angles", rot / 2),
                ));
            }
            (dptr(c, "cos")?, dptr(sn, "sin")?, rot)
        }
        _ => return Err(op_err(OP, "'cos' and 'sin' come together")),
    };
    let style = ints.get_or("style", 0);
    if !(0..=1).contains(&style) {
        return Err(op_err(OP, format!("rotary style {style} must be 0 or 1")));
    }
    Ok(Some(StepKv {
        k: dptr(k, "k")?,
        v: dptr(v, "v")?,
        cos,
        sin,
        rot,
        style,
    }))
}

impl DecodeAttention {
    /// (sq, nh, nkv, hd, hdv, cache rows, splits, heads per block) after validation.
    fn sizes(&self, a: &[Option<&Data>; 6]) -> Result<[usize; 8]> {
        const OP: &str = "DecodeAttention";
        let need =
            |i: usize| a[i].ok_or_else(|| op_err(OP, format!("missing input '{}'", DA_NAMES[i])));
        let [sq, nh, hd] = dims3(need(0)?, "q")?;
        let [_, nkv, hdk] = dims3(need(1)?, "k_cache")?;
        let [_, nkv2, hds] = dims3(need(2)?, "v_cache")?;
        let hdv = value_head_dim(need(2)?.dtype(), hds, hd);
        if hdk != stored_head_dim(need(1)?.dtype(), hd)
            || nkv2 != nkv
            || nkv == 0
            || nh % nkv != 0
            || hd > DECODE_MAX_HD
            || hdv > DECODE_MAX_HD
        {
            return Err(op_err(
                OP,
                format!("q [{sq}, {nh}, {hd}], k_cache [_, {nkv}, {hdk}], v_cache [_, {nkv2}, {hdv}] do not fit (head sizes ≤ {DECODE_MAX_HD})"),
            ));
        }
        let pos = need(3)?;
        if pos.dtype() != DataType::I32 || pos.count() != sq {
            return Err(op_err(
                OP,
                format!(
                    "positions must be I32 [{sq}], got {} {:?}",
                    pos.dtype(),
                    pos.dims()
                ),
            ));
        }
        for k in [4, 5] {
            if let Some(s) = a[k].filter(|s| s.count() != nh) {
                return Err(op_err(
                    OP,
                    format!("{} {:?} must have {nh} entries", DA_NAMES[k], s.dims()),
                ));
            }
        }
        let kcap = cache_rows(OP, need(1)?, "k_cache")?.min(cache_rows(OP, need(2)?, "v_cache")?);
        let gchunk = decode_gchunk(kcap, nh, nkv);
        let nsplit = decode_splits(kcap, decode_units(nh, nkv, sq, gchunk), self.0.sms());
        Ok([sq, nh, nkv, hd, hdv, kcap, nsplit, gchunk])
    }
}

impl Operator for DecodeAttention {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        all_f32(d, &["q", "alibi_slopes", "sinks", "k", "v", "cos", "sin"])
            && kv_elem(d, "k_cache", "v_cache").is_some()
            && d.dtype("positions") == Some(DataType::I32)
            && d.get("q").is_some_and(|q| q.is_contiguous())
            && d.get("k_cache").is_some_and(|k| k.is_contiguous())
            && d.get("v_cache").is_some_and(|v| v.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let [sq, nh, _, _, hdv, _, nsplit, _] = self.sizes(&DA_NAMES.map(|n| d.get(n)))?;
        let ws = decode_workspace(sq, nh, hdv, nsplit).max(1);
        ensure_out(
            &self.0,
            d.require_mut("DecodeAttention", "workspace")?,
            DataType::F32,
            &[ws],
        )?;
        ensure_out(
            &self.0,
            d.require_mut("DecodeAttention", "output")?,
            DataType::F32,
            &[sq, nh, hdv],
        )
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "DecodeAttention";
        let (part, part_bytes) = {
            let w = d.require(OP, "workspace")?;
            (
                dptr(w, "workspace")?,
                super::buffer::device_len(w).unwrap_or(0),
            )
        };
        let [sq, nh, nkv, hd, hdv, kcap, nsplit, gchunk] =
            self.sizes(&DA_NAMES.map(|n| d.get(n)))?;
        let elem = kv_elem(d, "k_cache", "v_cache")
            .ok_or_else(|| op_err(OP, "k_cache and v_cache must both be f32, f16 or q8_0"))?;
        let step = step_kv(&STEP_NAMES.map(|n| d.get(n)), i, sq, nkv, hd, hdv)?;
        if step.is_some() && !(d.is_mut("k_cache") && d.is_mut("v_cache")) {
            // a read-only cache on another device would be a copy, and the step's row lost
            return Err(op_err(
                OP,
                "with the step's keys 'k' the kernel writes 'k_cache' and 'v_cache': pass them as inout",
            ));
        }
        let (a, out) = d.io(OP, DA_NAMES, "output")?;
        if part_bytes < 4 * decode_workspace(sq, nh, hdv, nsplit) {
            return Err(op_err(OP, "workspace is smaller than this call needs"));
        }
        let ptr = |k: usize| opt_ptr(a[k], DA_NAMES[k]);
        let counters = self.2.get(&self.0, decode_units(nh, nkv, sq, gchunk))?;
        let (scale, softcap, window) = attn_scalars(f, i, hd);
        let attn = AttnArgs {
            q: ptr(0)?,
            k: ptr(1)?,
            v: ptr(2)?,
            slopes: ptr(4)?,
            sinks: ptr(5)?,
            out: dptr(out, "output")?,
            sq,
            skv: kcap,
            nh,
            nkv,
            hd,
            hdv,
            scale,
            softcap,
            causal: true,
            window,
            elem,
        };
        let args = DecodeArgs {
            attn,
            positions: ptr(3)?,
            kcap,
            q8: None,
            step,
        };
        decode_launch_q8(&self.0, &self.1, i, args, (nsplit, gchunk), part, counters)
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_kernel, decode_key_groups, decode_splits};

    #[test]
    fn decode_blocks_widen_only_on_small_grids() {
        // llama-3-8b, one query, 64 keys: 32 blocks on 132 multiprocessors
        for (kernel, gchunk, default) in [
            ("attn_decode_f32", 1, 4),
            ("attn_decode_w128_f32", 1, 2),
            ("attn_decode_w128_f32", 4, 4),
        ] {
            assert_eq!(
                decode_key_groups(kernel, 32, 132, gchunk),
                default,
                "{kernel}"
            );
            // 4096 keys: 64 splits × 8 KV heads = 512 blocks keep one group of 128 threads
            let blocks = decode_splits(4096, 8, 132) * 8;
            assert_eq!(blocks, 512);
            assert_eq!(decode_key_groups(kernel, blocks, 132, gchunk), 1);
            assert_eq!(decode_key_groups(kernel, 133, 132, gchunk), 1);
        }
    }

    #[test]
    fn warp_decode_kernels_take_head_sizes_64_and_128_only() {
        assert_eq!(decode_kernel(64, 64), "attn_decode_w64_f32");
        assert_eq!(decode_kernel(128, 128), "attn_decode_w128_f32");
        for (hd, hdv) in [(128, 64), (64, 128), (96, 96), (256, 256), (33, 33)] {
            assert_eq!(decode_kernel(hd, hdv), "attn_decode_f32", "{hd}/{hdv}");
        }
    }
}
