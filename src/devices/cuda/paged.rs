//! The paged KV cache on the GPU (f16, f32 or q8_0 slots; a q8_0 head row is padded to whole
//! blocks of 32, [`super::kv::stored_head_dim`]): `PagedCacheWrite` (`cache[slots[i]] = input[i]`) and
//! `PagedAttention` (each sequence's new query rows over its cached keys, through block tables;
//! causal, sliding window, GQA, ALiBi, soft-capping). The small index arrays are read on the host
//! first so that every slot and block id is checked before a kernel touches memory. Both ops
//! take them in host memory ([`Operator::host_inputs`]) and copy them to the GPU themselves
//! ([`HostIndex`]): a step's layers pass the same arrays, which are copied once, and nothing
//! waits for the GPU to read an array back.

use super::buffer::{dptr, ensure_out, scratch, CudaBuffer};
use super::gpu::{int, long, Gpu, KArg};
use super::kv::stored_head_dim;
use super::{all_f32, grid_dim, op_err};
use crate::data::{Data, DataType, Storage};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::devices::paged_tables::{check_block_tables, BlockTables};
use crate::error::Result;
use std::sync::{Arc, Mutex};

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    ops.insert(
        "PagedCacheWrite",
        Box::new(PagedCacheWrite {
            gpu: gpu.clone(),
            slots: HostIndex::default(),
        }),
    );
    ops.insert(
        "PagedAttention",
        Box::new(PagedAttention {
            gpu: gpu.clone(),
            index: Default::default(),
        }),
    );
}

/// The GPU copy of a host index array, kept while calls pass the same values: a call with other
/// values copies them into the same buffer (in stream order, after the kernels that read the
/// previous values), growing it when they do not fit.
#[derive(Default)]
pub(super) struct HostIndex(Mutex<Option<(Vec<u8>, Option<CudaBuffer>)>>);

impl HostIndex {
    /// The device address of `d`'s values: its own where it lives on the GPU, else the copy.
    pub(super) fn ptr(&self, gpu: &Arc<Gpu>, d: &Data, name: &str) -> Result<u64> {
        if let Storage::Device(_) = d.storage() {
            return dptr(d, name);
        }
        let bytes = d.bytes()?;
        let mut guard = self
            .0
            .lock()
            .map_err(|_| crate::error::Error::Device(format!("{name} copy poisoned")))?;
        let (held, buf) = guard.get_or_insert_with(|| (Vec::new(), None));
        let p = scratch(gpu, buf, bytes.len().max(4), true)?;
        if held.as_slice() != bytes {
            gpu.htod(bytes, p)?;
            held.clear();
            held.extend_from_slice(bytes);
        }
        Ok(p)
    }
}

/// Largest head size of the kernel (`qs[1024]`, and `ATT_THREADS * ATT_DPT` for values).
const MAX_HD: usize = 512;

/// The I32 values of `d`, wherever it lives.
fn host_i32(d: &Data) -> Result<Vec<i32>> {
    match d.storage() {
        Storage::Device(b) => Ok(b
            .to_host()?
            .chunks_exact(4)
            .take(d.count())
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()),
        _ => Ok(d.as_i32()?.to_vec()),
    }
}

fn need<'a>(
    x: Option<&'a Data>,
    op: &str,
    name: &str,
    dt: DataType,
    nd: usize,
) -> Result<&'a Data> {
    let x = x.ok_or_else(|| op_err(op, format!("missing input '{name}'")))?;
    if x.dtype() != dt || x.dims().len() != nd || !x.is_contiguous() {
        return Err(op_err(
            op,
            format!(
                "'{name}' must be a packed {dt} tensor with {nd} dims, got {} {:?}",
                x.dtype(),
                x.dims()
            ),
        ));
    }
    Ok(x)
}

struct PagedCacheWrite {
    gpu: Arc<Gpu>,
    slots: HostIndex,
}

impl Operator for PagedCacheWrite {
    fn host_inputs(&self) -> &'static [&'static str] {
        &["slots"]
    }
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input") == Some(DataType::F32)
            && matches!(
                d.dtype("cache"),
                Some(DataType::F32 | DataType::F16 | DataType::Q8_0)
            )
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "PagedCacheWrite";
        let x = need(d.get("input"), OP, "input", DataType::F32, 3)?;
        let s = need(d.get("slots"), OP, "slots", DataType::I32, 1)?;
        let c = d.get("cache").filter(|c| c.dtype() != DataType::F32);
        let c = match c {
            Some(c) if c.dtype() == DataType::Q8_0 => {
                need(Some(c), OP, "cache", DataType::Q8_0, 3)?
            }
            Some(c) => need(Some(c), OP, "cache", DataType::F16, 3)?,
            None => need(d.get("cache"), OP, "cache", DataType::F32, 3)?,
        };
        let row_fits = x.dim(1) == c.dim(1) && stored_head_dim(c.dtype(), x.dim(2)) == c.dim(2);
        if !row_fits || s.dim(0) != x.dim(0) {
            return Err(op_err(
                OP,
                format!(
                    "input {:?}, slots {:?} and cache {:?} do not fit",
                    x.dims(),
                    s.dims(),
                    c.dims()
                ),
            ));
        }
        let n = c.dim(0) as i64;
        if let Some(bad) = host_i32(s)?.iter().find(|&&v| v < 0 || v as i64 >= n) {
            return Err(op_err(
                OP,
                format!("slot {bad} outside the cache of {n} slots"),
            ));
        }
        d.require_mut(OP, "cache").map(|_| ())
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "PagedCacheWrite";
        let ([x, s], c) = d.io(OP, ["input", "slots"], "cache")?;
        let x = x.ok_or_else(|| op_err(OP, "missing input 'input'"))?;
        let s = s.ok_or_else(|| op_err(OP, "missing input 'slots'"))?;
        let row = x.dim(1) * x.dim(2);
        let n = x.dim(0);
        if c.dtype() == DataType::Q8_0 {
            // a warp per block of 32 values
            let blocks = n * x.dim(1) * x.dim(2).div_ceil(32);
            return self.gpu.launch(
                "paged_cache_write_q8",
                Gpu::grid_for(blocks * 32, 256),
                256,
                &[
                    KArg::Ptr(dptr(x, "input")?),
                    KArg::Ptr(self.slots.ptr(&self.gpu, s, "slots")?),
                    KArg::Ptr(dptr(c, "cache")?),
                    long(n, "rows")?,
                    int(x.dim(1), "kv heads")?,
                    int(x.dim(2), "head dim")?,
                ],
            );
        }
        let kernel = match c.dtype() {
            DataType::F16 => "paged_cache_write_f16",
            _ => "paged_cache_write_f32",
        };
        self.gpu.launch(
            kernel,
            Gpu::grid_for(n * row, 256),
            256,
            &[
                KArg::Ptr(dptr(x, "input")?),
                KArg::Ptr(self.slots.ptr(&self.gpu, s, "slots")?),
                KArg::Ptr(dptr(c, "cache")?),
                long(n, "rows")?,
                long(row, "row")?,
            ],
        )
    }
}

struct PagedAttention {
    gpu: Arc<Gpu>,
    /// Copies of q_starts, kv_lens and block_tables.
    index: [HostIndex; 3],
}

const NAMES: [&str; 8] = [
    "q",
    "k_cache",
    "v_cache",
    "q_starts",
    "kv_lens",
    "block_tables",
    "alibi_slopes",
    "sinks",
];

/// Validated sizes: (rows, heads, kv heads, head dim, sequences, blocks per table, block size).
struct Sizes {
    rows: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    nseq: usize,
    maxb: usize,
    bs: usize,
}

fn check(a: &[Option<&Data>; 8], i: &IntDict) -> Result<Sizes> {
    const OP: &str = "PagedAttention";
    let q = need(a[0], OP, "q", DataType::F32, 3)?;
    let cdt = match a[1].map(|c| c.dtype()) {
        Some(dt @ (DataType::F16 | DataType::Q8_0)) => dt,
        _ => DataType::F32,
    };
    let kc = need(a[1], OP, "k_cache", cdt, 3)?;
    let vc = need(a[2], OP, "v_cache", cdt, 3)?;
    let qs = host_i32(need(a[3], OP, "q_starts", DataType::I32, 1)?)?;
    let kl = host_i32(need(a[4], OP, "kv_lens", DataType::I32, 1)?)?;
    let bt = need(a[5], OP, "block_tables", DataType::I32, 2)?;
    let (rows, nh, hd) = (q.dim(0), q.dim(1), q.dim(2));
    let (slots, nkv) = (kc.dim(0), kc.dim(1));
    if kc.dims() != vc.dims()
        || kc.dim(2) != stored_head_dim(cdt, hd)
        || nkv == 0
        || nh % nkv != 0
        || hd > MAX_HD
    {
        return Err(op_err(
            OP,
            format!(
                "q {:?}, k_cache {:?}, v_cache {:?}: head dims or head counts do not fit",
                q.dims(),
                kc.dims(),
                vc.dims()
            ),
        ));
    }
    let nseq = kl.len();
    if nseq == 0 {
        return Err(op_err(
            OP,
            format!(
                "{} q_starts, {nseq} kv_lens and {} block tables disagree",
                qs.len(),
                bt.dim(0)
            ),
        ));
    }
    let maxb = bt.dim(1);
    let table = host_i32(bt)?;
    let tables = BlockTables {
        q_starts: &qs,
        kv_lens: &kl,
        table: &table,
        tables: bt.dim(0),
        max_blocks: maxb,
    };
    let (bs, _) = check_block_tables(OP, rows, slots, i.get_or("block_size", 16), &tables)?;
    for k in [6, 7] {
        if let Some(x) = a[k].filter(|x| x.dtype() != DataType::F32 || x.count() != nh) {
            return Err(op_err(
                OP,
                format!(
                    "{} must be f32 [{nh}], got {} {:?}",
                    NAMES[k],
                    x.dtype(),
                    x.dims()
                ),
            ));
        }
    }
    Ok(Sizes {
        rows,
        nh,
        nkv,
        hd,
        nseq,
        maxb,
        bs,
    })
}

impl Operator for PagedAttention {
    fn host_inputs(&self) -> &'static [&'static str] {
        &["q_starts", "kv_lens", "block_tables"]
    }
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        let cache = d.dtype("k_cache");
        all_f32(d, &["q", "alibi_slopes", "sinks"])
            && matches!(cache, Some(DataType::F32 | DataType::F16 | DataType::Q8_0))
            && d.dtype("v_cache") == cache
            && d.dtype("q").is_some()
            && d.get("q").is_some_and(|q| q.dim(-1) <= MAX_HD)
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let dims = {
            let a = NAMES.map(|n| d.get(n));
            check(&a, i)?;
            d.require("PagedAttention", "q")?.dims().to_vec()
        };
        ensure_out(
            &self.gpu,
            d.require_mut("PagedAttention", "output")?,
            DataType::F32,
            &dims,
        )
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "PagedAttention";
        let (a, out) = d.io(OP, NAMES, "output")?;
        let z = check(&a, i)?;
        let ptr = |k: usize, n: &str| a[k].map(|t| dptr(t, n)).transpose().map(|p| p.unwrap_or(0));
        let index = |k: usize, n: &str| match a[k] {
            Some(t) => self.index[k - 3].ptr(&self.gpu, t, n),
            None => Err(op_err(OP, format!("missing input '{n}'"))),
        };
        let gx = u32::try_from(z.rows).map_err(|_| op_err(OP, "too many query rows"))?;
        let gy = grid_dim(OP, z.nh, "too many heads")?;
        let kernel = match a[1].map(|c| c.dtype()) {
            Some(DataType::F16) => "paged_attention_f16",
            Some(DataType::Q8_0) => "paged_attention_q8",
            _ => "paged_attention_f32",
        };
        self.gpu.launch(
            kernel,
            (gx, gy, 1),
            128,
            &[
                KArg::Ptr(ptr(0, "q")?),
                KArg::Ptr(ptr(1, "k_cache")?),
                KArg::Ptr(ptr(2, "v_cache")?),
                KArg::Ptr(index(3, "q_starts")?),
                KArg::Ptr(index(4, "kv_lens")?),
                KArg::Ptr(index(5, "block_tables")?),
                KArg::Ptr(ptr(6, "alibi_slopes")?),
                KArg::Ptr(ptr(7, "sinks")?),
                KArg::Ptr(dptr(out, "output")?),
                int(z.nseq, "sequences")?,
                int(z.maxb, "blocks per table")?,
                int(z.bs, "block_size")?,
                int(z.nh, "heads")?,
                int(z.nkv, "kv heads")?,
                int(z.hd, "head dim")?,
                KArg::F32(f.get_or("scale", 1.0 / (z.hd.max(1) as f32).sqrt())),
                KArg::F32(f.get_or("softcap", 0.0)),
                KArg::I32(i.get_or("sliding_window", 0).max(0)),
            ],
        )
    }
}
