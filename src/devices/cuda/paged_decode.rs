//! `PagedDecodeAttention`: one decode query row per sequence over the paged KV pool (f16, f32
//! or q8_0 slots, a q8_0 head row padded to whole blocks of 32), flash-decoding through block tables with split-K for long rows, the step's own keys
//! and values stored into their slots in the same launch (`kernels/paged_decode.cu`). With the
//! step's rotary tables it rotates the query and the key itself (the `fuse` pass moves a
//! `RotaryEmbedding` into it), and with `quantize_output` it also leaves its output in the form
//! the o-projection reads (Q8_0 or f16/bf16 rows in [`ActQuant`]). f16 pools of head size 64
//! or 128 take the tensor-core form (`paged_decode_t*`: scores and sums by `mma.sync`, key and
//! value rows staged by `cp.async`; 64 rows of 2048 keys, 32/8 heads of 128, H200: 205 µs
//! against 356 for the scalar kernels), other pools and batch-invariant launches the scalar
//! online-softmax kernels.
//!
//! Unlike `PagedAttention` (`paged.rs`), the index arrays (`slots`, `kv_lens`, `block_tables`) may
//! live on the GPU, where they are not read back: a recorded batched decode step (CUDA graph)
//! replays this op with new lengths and tables written into the same buffers. Device arrays are
//! trusted for their values; the kernel still never touches memory outside the pool (a slot or
//! block id outside it is skipped, a length beyond the table reads only the table's blocks).
//! Host arrays are checked like `PagedAttention`'s and copied once per change.

use super::act_quant::{ActForm, ActQuant, QuantKey};
use super::buffer::{device_len, dptr, ensure_out};
use super::gpu::{int, long, Gpu, KArg};
use super::kv::stored_head_dim;
use super::linear::TC_MIN_ROWS;
use super::paged::HostIndex;
use super::{grid_dim, op_err};
use crate::data::{Data, DataType, Storage};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use std::sync::Arc;

/// Registers the operator; `invariant`: split every row into [`MAX_SPLITS`]
/// pieces whatever the batch (a row's split depends only on its own length: batch-invariant
/// results).
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>, act: &Arc<ActQuant>, invariant: bool) {
    ops.insert(
        "PagedDecodeAttention",
        Box::new(PagedDecodeAttention {
            gpu: gpu.clone(),
            act: act.clone(),
            invariant,
            index: Default::default(),
        }),
    );
}

const OP: &str = "PagedDecodeAttention";

/// Keys per split at least (`PD_MIN_CHUNK` of the kernel).
const MIN_CHUNK: usize = 256;
/// Most splits of one row.
const MAX_SPLITS: usize = 32;
/// Warps per block of the kernels.
const WARPS: u32 = 4;
/// Warps per block of the f16-cache kernels with the `_w8` suffix, which launches of at most
/// [`WIDE_BLOCKS_PER_SM`] blocks per multiprocessor take: more warps per row where the rows do
/// not fill the GPU (H100, 32 rows of 8 kv heads and up to 48 keys: 9.6 µs against 12.0; 64
/// rows: 18.0 against 13.4).
const WIDE_WARPS: u32 = 8;
/// Most blocks per multiprocessor of a launch that takes [`WIDE_WARPS`].
const WIDE_BLOCKS_PER_SM: usize = 2;
/// Query heads of one kv head per block (`PD_GMAX`).
const GROUP_CHUNK: usize = 8;
/// Largest head size (32 lanes × 8 values).
const MAX_HD: usize = 256;

/// Splits of each row for `rows` sequences of at most `max_keys` keys on a GPU of `sms`
/// multiprocessors: enough blocks to fill it, none shorter than `MIN_CHUNK` keys.
pub fn paged_decode_splits(max_keys: usize, rows: usize, nkv: usize, sms: usize) -> usize {
    let by_len = max_keys.div_ceil(MIN_CHUNK).max(1);
    let by_fill = (2 * sms).div_ceil((rows * nkv).max(1)).max(1);
    by_len.min(by_fill).clamp(1, MAX_SPLITS)
}

/// Validated sizes of one call.
struct Sizes {
    rows: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    slots: usize,
    maxb: usize,
    bs: usize,
    /// The pool's dtype (f16, f32 or q8_0).
    cache: DataType,
    nsplit: usize,
    /// Rotated dims and style of the step's rotary tables (0 dims: q and k arrive rotated).
    rot: usize,
    style: i32,
}

const NAMES: [&str; 13] = [
    "q",
    "k",
    "v",
    "k_cache",
    "v_cache",
    "slots",
    "kv_lens",
    "block_tables",
    "alibi_slopes",
    "workspace",
    "sinks",
    "cos",
    "sin",
];

/// The arrays of one call, in the order of [`NAMES`].
type Args<'a> = [Option<&'a Data>; 13];

fn packed<'a>(x: Option<&'a Data>, name: &str, dts: &[DataType], nd: usize) -> Result<&'a Data> {
    let x = x.ok_or_else(|| op_err(OP, format!("missing input '{name}'")))?;
    if !dts.contains(&x.dtype()) || x.dims().len() != nd || !x.is_contiguous() {
        return Err(op_err(
            OP,
            format!(
                "'{name}' must be a packed {:?} tensor with {nd} dims, got {} {:?}",
                dts,
                x.dtype(),
                x.dims()
            ),
        ));
    }
    Ok(x)
}

impl Sizes {
    /// Workspace floats of a launch: the partial outputs and softmax terms of every split (one
    /// float when there is a single split).
    fn workspace(&self) -> usize {
        if self.nsplit > 1 {
            self.rows * self.nh * self.nsplit * (self.hd + 2)
        } else {
            1
        }
    }
}

/// The I32 values of a host array (`None` for a device one, which is not read back).
fn host_values(d: &Data) -> Result<Option<Vec<i32>>> {
    match d.storage() {
        Storage::Device(_) => Ok(None),
        _ => Ok(Some(d.as_i32()?.to_vec())),
    }
}

/// Checks the host-side index arrays of a launch (device arrays are not read back): every stored
/// slot inside the cache, every `kv_len` within a table's blocks, every used block id in the pool.
fn check_indices(slots_d: &Data, lens_d: &Data, bt: &Data, slots: usize, bs: usize) -> Result<()> {
    let maxb = bt.dim(1);
    let (sv, lv, tv) = (
        host_values(slots_d)?,
        host_values(lens_d)?,
        host_values(bt)?,
    );
    if let Some(bad) = sv
        .iter()
        .flatten()
        .find(|&&s| s >= 0 && s as usize >= slots)
    {
        return Err(op_err(OP, format!("slot {bad} outside the {slots} slots")));
    }
    if let Some(bad) = lv
        .iter()
        .flatten()
        .find(|&&l| l < 0 || l as usize > maxb * bs)
    {
        return Err(op_err(
            OP,
            format!("kv_len {bad} beyond the {maxb} blocks of a table"),
        ));
    }
    let n_blocks = (slots / bs) as i64;
    if let (Some(t), Some(l)) = (&tv, &lv) {
        for (s, &len) in l.iter().enumerate() {
            let used = t
                .get(s * maxb..s * maxb + (len as usize).div_ceil(bs))
                .unwrap_or(&[]);
            if let Some(bad) = used.iter().find(|&&b| b < 0 || b as i64 >= n_blocks) {
                return Err(op_err(
                    OP,
                    format!("sequence {s}: block id {bad} outside the pool of {n_blocks}"),
                ));
            }
        }
    }
    Ok(())
}

/// Validates a launch's arrays against each other and returns its sizes.
fn check(a: &Args, i: &IntDict, sms: usize, invariant: bool) -> Result<Sizes> {
    use DataType::{F16, F32, I32, Q8_0};
    let q = packed(a[0], "q", &[F32], 3)?;
    let k = packed(a[1], "k", &[F32], 3)?;
    let v = packed(a[2], "v", &[F32], 3)?;
    let kc = packed(a[3], "k_cache", &[F16, F32, Q8_0], 3)?;
    let vc = packed(a[4], "v_cache", &[F16, F32, Q8_0], 3)?;
    let slots_d = packed(a[5], "slots", &[I32], 1)?;
    let lens_d = packed(a[6], "kv_lens", &[I32], 1)?;
    let bt = packed(a[7], "block_tables", &[I32], 2)?;
    let (rows, nh, hd) = (q.dim(0), q.dim(1), q.dim(2));
    let (slots, nkv) = (kc.dim(0), kc.dim(1));
    let fits = kc.dims() == vc.dims()
        && kc.dtype() == vc.dtype()
        && kc.dim(2) == stored_head_dim(kc.dtype(), hd)
        && k.dims() == [rows, nkv, hd]
        && v.dims() == [rows, nkv, hd]
        && nkv > 0
        && nh % nkv == 0
        && (1..=MAX_HD).contains(&hd);
    if !fits {
        return Err(op_err(
            OP,
            format!(
                "q {:?}, k {:?}, v {:?}, k_cache {:?} {}, v_cache {:?} {} do not fit (head size at most {MAX_HD})",
                q.dims(), k.dims(), v.dims(), kc.dims(), kc.dtype(), vc.dims(), vc.dtype()
            ),
        ));
    }
    let bs = usize::try_from(i.get_or("block_size", 16)).unwrap_or(0);
    if bs == 0 || slots % bs != 0 {
        return Err(op_err(
            OP,
            format!("block_size {bs} does not divide the {slots} cache slots"),
        ));
    }
    if slots_d.dim(0) != rows || lens_d.dim(0) != rows || bt.dim(0) != rows || bt.dim(1) == 0 {
        return Err(op_err(
            OP,
            format!(
                "{} slots, {} kv_lens and {:?} block tables for {rows} query rows",
                slots_d.dim(0),
                lens_d.dim(0),
                bt.dims()
            ),
        ));
    }
    let maxb = bt.dim(1);
    check_indices(slots_d, lens_d, bt, slots, bs)?;
    for k in [8, 10] {
        if a[k].is_some_and(|x| x.dtype() != F32 || x.count() != nh) {
            return Err(op_err(OP, format!("{} must be f32 [{nh}]", NAMES[k])));
        }
    }
    let max_keys = usize::try_from(i.get_or("max_keys", (maxb * bs) as i32)).unwrap_or(1);
    let (rot, style) = rotary(a, i, rows, hd)?;
    Ok(Sizes {
        rows,
        nh,
        nkv,
        hd,
        slots,
        maxb,
        bs,
        cache: kc.dtype(),
        nsplit: if invariant {
            MAX_SPLITS
        } else {
            paged_decode_splits(max_keys.min(maxb * bs), rows, nkv, sms)
        },
        rot,
        style,
    })
}

/// The rotated dims and style of the optional `cos` / `sin` tables ([rows, rotary_dim / 2] f32,
/// ints `rotary_dim` (default the head size) and `style` 0 or 1); 0 dims without them.
fn rotary(a: &Args, i: &IntDict, rows: usize, hd: usize) -> Result<(usize, i32)> {
    let (cos, sin) = match (a[11], a[12]) {
        (None, None) => return Ok((0, 0)),
        (Some(c), Some(s)) => (c, s),
        _ => return Err(op_err(OP, "'cos' and 'sin' come together")),
    };
    let rot = usize::try_from(i.get_or("rotary_dim", hd as i32)).unwrap_or(usize::MAX);
    if rot == 0 || rot % 2 != 0 || rot > hd {
        return Err(op_err(
            OP,
            format!("rotary_dim {rot} must be even, positive and at most the head size {hd}"),
        ));
    }
    for (t, name) in [(cos, "cos"), (sin, "sin")] {
        if t.dtype() != DataType::F32 || !t.is_contiguous() || t.count() != rows * rot / 2 {
            return Err(op_err(
                OP,
                format!(
                    "'{name}' {} {:?} must be packed f32 of {rows} rows × {} angles",
                    t.dtype(),
                    t.dims(),
                    rot / 2
                ),
            ));
        }
    }
    let style = i.get_or("style", 0);
    if !(0..=1).contains(&style) {
        return Err(op_err(OP, format!("rotary style {style} must be 0 or 1")));
    }
    Ok((rot, style))
}

/// Flash-decoding over the paged pool; see the module doc. Inputs: `q` [rows, nh, hd], the
/// step's `k`, `v` [rows, nkv, hd] (f32, rotated), inout `k_cache`, `v_cache` [slots, nkv, hd]
/// (f16, f32 or q8_0 with head rows padded to whole blocks), `slots` [rows] (the step's slot per row; < 0: not stored), `kv_lens` [rows]
/// (keys of each row, the step's included; 0: a padding row, output zeros), `block_tables`
/// [rows, maxb], optional `alibi_slopes` and attention `sinks` [nh]; inout `workspace`; optional
/// rotary tables `cos`, `sin` [rows, rotary_dim / 2] (then `q` and `k` arrive unrotated). Floats
/// `scale`, `softcap`; ints `block_size`, `sliding_window`, `max_keys` (a bound on `kv_lens` that
/// picks the split count; any value is correct), `rotary_dim`, `style` (as `RotaryEmbedding`'s),
/// `quantize_output` (the copy for the next `Linear`: 1 Q8_0 rows when the head size is a
/// multiple of 32, 2 / 3 f16 / bf16 rows from [`TC_MIN_ROWS`] rows). Output [rows, nh, hd].
struct PagedDecodeAttention {
    gpu: Arc<Gpu>,
    /// Where the output's copy for the o-projection goes (`quantize_output`).
    act: Arc<ActQuant>,
    /// [`MAX_SPLITS`] splits for every call (see [`register`]).
    invariant: bool,
    /// Copies of host `slots`, `kv_lens` and `block_tables`.
    index: [HostIndex; 3],
}

impl Operator for PagedDecodeAttention {
    fn host_inputs(&self) -> &'static [&'static str] {
        &["slots", "kv_lens", "block_tables"]
    }
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        let cache = |n: &str| {
            matches!(
                d.dtype(n),
                Some(DataType::F16 | DataType::F32 | DataType::Q8_0)
            )
        };
        cache("k_cache")
            && cache("v_cache")
            && d.get("q")
                .is_some_and(|q| q.dtype() == DataType::F32 && (1..=MAX_HD).contains(&q.dim(-1)))
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let z = check(&NAMES.map(|n| d.get(n)), i, self.gpu.sms(), self.invariant)?;
        if !(d.is_mut("k_cache") && d.is_mut("v_cache")) {
            return Err(op_err(
                OP,
                "'k_cache' and 'v_cache' are written: pass them as inout",
            ));
        }
        let ws = z.workspace();
        let w = d.require_mut(OP, "workspace")?;
        if device_len(w).is_none_or(|n| n < 4 * ws) {
            ensure_out(&self.gpu, w, DataType::F32, &[ws])?;
        }
        ensure_out(
            &self.gpu,
            d.require_mut(OP, "output")?,
            DataType::F32,
            &[z.rows, z.nh, z.hd],
        )
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let a = NAMES.map(|n| d.get(n));
        let z = check(&a, i, self.gpu.sms(), self.invariant)?;
        let ws = a[9].ok_or_else(|| op_err(OP, "missing inout 'workspace'"))?;
        if z.nsplit > 1 && device_len(ws).unwrap_or(0) < 4 * z.workspace() {
            return Err(op_err(OP, "workspace is smaller than this call needs"));
        }
        let out = dptr(d.require(OP, "output")?, "output")?;
        let (copy, key) = self.copy(i, out, &z)?;
        let call = Call {
            part: dptr(ws, "workspace")?,
            lens: self.index(&a, 6)?,
            out,
            window: i.get_or("sliding_window", 0).max(0),
            sinks: ptr(&a, 10)?,
            copy,
        };
        let rows = grid_dim(OP, z.rows, "more than 65535 query rows")?;
        self.decode(&a, &z, &call, f, rows)?;
        if z.nsplit > 1 {
            combine(&self.gpu, &z, &call, rows)?;
        }
        match key {
            Some(key) => self.act.set(key, true),
            None => Ok(()),
        }
    }
}

/// The kernels' output copy arguments (`PdCopy`): f16/bf16 rows, whether bf16, Q8_0 values and
/// scales; zeros for none.
#[derive(Clone, Copy, Default)]
struct CopyArgs {
    half: u64,
    bf: bool,
    q8: u64,
    scales: u64,
}

impl CopyArgs {
    fn args(&self) -> [KArg; 4] {
        [
            KArg::Ptr(self.half),
            KArg::I32(self.bf as i32),
            KArg::Ptr(self.q8),
            KArg::Ptr(self.scales),
        ]
    }
}

/// The device address of input `k` of [`NAMES`], 0 when it is absent.
fn ptr(a: &Args, k: usize) -> Result<u64> {
    a[k].map(|t| dptr(t, NAMES[k]))
        .transpose()
        .map(|p| p.unwrap_or(0))
}

/// Device addresses and ints shared by the decode launch and the merge of its splits.
struct Call {
    /// The workspace.
    part: u64,
    /// `kv_lens` on the device.
    lens: u64,
    out: u64,
    window: i32,
    /// Attention sinks [nh], or 0.
    sinks: u64,
    /// The output's copy for the o-projection.
    copy: CopyArgs,
}

impl PagedDecodeAttention {
    /// The output copy `quantize_output` asks for of the `out` rows, where the kernels write it
    /// (see the type's doc), and the key to record once the launches are queued.
    fn copy(&self, i: &IntDict, out: u64, z: &Sizes) -> Result<(CopyArgs, Option<QuantKey>)> {
        let k = z.nh * z.hd;
        match ActForm::from_param(i.get_or("quantize_output", 0)) {
            Some(ActForm::Q8) if z.hd.is_multiple_of(32) => {
                let (q8, scales, key) = self.act.slots(out, z.rows, k)?;
                let c = CopyArgs {
                    q8,
                    scales,
                    ..Default::default()
                };
                Ok((c, Some(key)))
            }
            Some(form @ (ActForm::F16 | ActForm::Bf16)) if z.rows >= TC_MIN_ROWS => {
                let (half, key) = self.act.half_slot(out, z.rows, k, form)?;
                let c = CopyArgs {
                    half,
                    bf: form == ActForm::Bf16,
                    ..Default::default()
                };
                Ok((c, Some(key)))
            }
            _ => Ok((CopyArgs::default(), None)),
        }
    }

    /// The device address of index array `k` of [`NAMES`] (`slots`, `kv_lens`,
    /// `block_tables`): a device input as it is, a host one through its copy.
    fn index(&self, a: &Args, k: usize) -> Result<u64> {
        match a[k] {
            Some(t) => self.index[k - 5].ptr(&self.gpu, t, NAMES[k]),
            None => Err(op_err(OP, format!("missing input '{}'", NAMES[k]))),
        }
    }

    /// The flash-decoding launch ([`Self::kernel`]): grid (KV heads × head chunks, rows,
    /// splits).
    fn decode(&self, a: &Args, z: &Sizes, c: &Call, f: &FloatDict, rows: u32) -> Result<()> {
        let mut args = (0..5)
            .map(|k| ptr(a, k).map(KArg::Ptr))
            .collect::<Result<Vec<_>>>()?;
        for k in 5..8 {
            args.push(KArg::Ptr(self.index(a, k)?));
        }
        args.extend([
            KArg::Ptr(ptr(a, 8)?),
            KArg::Ptr(c.out),
            KArg::Ptr(c.part),
            int(z.maxb, "blocks per table")?,
            int(z.bs, "block_size")?,
            long(z.slots, "slots")?,
            int(z.nh, "heads")?,
            int(z.nkv, "kv heads")?,
            int(z.hd, "head dim")?,
            KArg::F32(f.get_or("scale", 1.0 / (z.hd as f32).sqrt())),
            KArg::F32(f.get_or("softcap", 0.0)),
            KArg::I32(c.window),
            KArg::Ptr(c.sinks),
            KArg::Ptr(ptr(a, 11)?),
            KArg::Ptr(ptr(a, 12)?),
            int(z.rot, "rotary dim")?,
            KArg::I32(z.style),
        ]);
        args.extend(c.copy.args());
        let blocks_x = z.nkv * (z.nh / z.nkv).div_ceil(GROUP_CHUNK);
        let grid = (
            u32::try_from(blocks_x).map_err(|_| op_err(OP, "too many heads"))?,
            rows,
            z.nsplit as u32,
        );
        if tensor_core_form(z.cache, z.hd, self.invariant) {
            let smem = (TC_WARPS * TC_STAGES * 2 * TC_KEYS * z.hd * 2) as u32;
            let name = format!("paged_decode_t{}", z.hd);
            return self
                .gpu
                .launch_smem(&name, grid, 32 * TC_WARPS as u32, smem, &args);
        }
        let (kernel, warps) = self.kernel(z, blocks_x * rows as usize * z.nsplit);
        self.gpu.launch(&kernel, grid, 32 * warps, &args)
    }

    /// The scalar kernel of a launch of `blocks` blocks and its warps per block:
    /// `paged_decode_{h,f,q}{1,2,4,8}_g{1,2,4,8}` (lane width, query heads per block), f16 ones
    /// with 8 warps (`_w8`) for few blocks.
    fn kernel(&self, z: &Sizes, blocks: usize) -> (String, u32) {
        let (dpl, gm) = (
            z.hd.div_ceil(32).next_power_of_two(),
            (z.nh / z.nkv).clamp(1, GROUP_CHUNK).next_power_of_two(),
        );
        // a batch-invariant launch keeps one warp count: the warps' merge order is part of a
        // row's arithmetic
        let wide = z.cache == DataType::F16
            && !self.invariant
            && wide_fits(dpl, gm)
            && blocks <= WIDE_BLOCKS_PER_SM * self.gpu.sms();
        let cache = match z.cache {
            DataType::F16 => "h",
            DataType::Q8_0 => "q",
            _ => "f",
        };
        let kernel = format!(
            "paged_decode_{cache}{dpl}_g{gm}{}",
            if wide { "_w8" } else { "" }
        );
        (kernel, if wide { WIDE_WARPS } else { WARPS })
    }
}

/// Warps, key stages per warp and keys per stage of `paged_decode_t*` (`PT_NW`, `PT_ST`,
/// `PT_KEYS` in kernels/paged_decode.cu).
const TC_WARPS: usize = 2;
const TC_STAGES: usize = 2;
const TC_KEYS: usize = 16;

/// Whether a launch takes the tensor-core form `paged_decode_t{64,128}`: an f16 cache of head
/// size 64 or 128, outside batch-invariant launches (whose warp count fixes a row's arithmetic).
fn tensor_core_form(cache: DataType, hd: usize, invariant: bool) -> bool {
    cache == DataType::F16 && matches!(hd, 64 | 128) && !invariant
}

/// Bytes of static shared memory a block of `paged_decode_impl` with `warps` warps, `dpl` values
/// per lane and `gm` heads takes (`qs`, `wm`, `wl`, `wacc`, `tbs`; kernels/paged_decode.cu).
fn shared_bytes(warps: usize, dpl: usize, gm: usize) -> usize {
    4 * (gm * dpl * 32 + 2 * warps * gm + warps * gm * dpl * 32 + PD_TBS)
}

/// Whether the 8-warp form exists for `dpl` values per lane and `gm` heads per block: its
/// static shared memory fits the 48 KiB a kernel may declare (head size 256 with 8 heads per
/// block does not; those launches take 4 warps).
fn wide_fits(dpl: usize, gm: usize) -> bool {
    shared_bytes(WIDE_WARPS as usize, dpl, gm) <= STATIC_SHARED_MAX
}

/// Block-table entries staged in shared memory (`PD_TBS` of the kernel).
const PD_TBS: usize = 1024;
/// The static shared memory a kernel may declare.
const STATIC_SHARED_MAX: usize = 48 << 10;

/// Merges the splits of a decode launch (`paged_decode_combine`).
fn combine(gpu: &Gpu, z: &Sizes, c: &Call, rows: u32) -> Result<()> {
    let mut args = vec![
        KArg::Ptr(c.part),
        KArg::Ptr(c.lens),
        KArg::Ptr(c.out),
        int(z.nh, "heads")?,
        int(z.hd, "head dim")?,
        int(z.nsplit, "splits")?,
        KArg::I32(c.window),
        KArg::Ptr(c.sinks),
    ];
    args.extend(c.copy.args());
    gpu.launch(
        "paged_decode_combine",
        (rows, z.nh as u32, 1),
        z.hd as u32,
        &args,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_kernels_exist_exactly_where_their_shared_memory_fits() {
        for dpl in [1, 2, 4, 8] {
            for gm in [1, 2, 4, 8] {
                assert_eq!(wide_fits(dpl, gm), !(dpl == 8 && gm == 8), "{dpl} {gm}");
                assert!(shared_bytes(WARPS as usize, dpl, gm) <= STATIC_SHARED_MAX);
            }
        }
        // (the figure ptxas reports for the 8-warp block of 8 values per lane and 8 heads)
        assert_eq!(shared_bytes(8, 8, 8), 0x13200);
        let src = include_str!("../../../kernels/paged_decode.cu");
        assert!(src.contains("PAGED_DECODE_W8_TO4(paged_decode_h8, unsigned short, 8)"));
    }
}
