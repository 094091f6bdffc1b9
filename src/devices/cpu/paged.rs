//! Paged KV-cache operators on the CPU: `PagedCacheWrite` and `PagedAttention` (see docs/ops.md).
//! The pool is f32, f16 or q8_0 (`[slots, nkv, hd]`, q8_0 rows padded to whole blocks of 32, see
//! `super::kv`).

use super::kv::{kv_format, kv_rows, stored_head_dim, KV_DTYPES};
use super::CpuContext;
use crate::data::{Data, DataType};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::devices::paged_tables::{check_block_tables, BlockTables};
use crate::error::{Error, Result};
use fastllm_cpu::attention::HeadTerms;
use fastllm_cpu::paged::{self as k, PagedAttnParams, PagedSeq};
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert("PagedCacheWrite", Box::new(PagedCacheWrite));
    ops.insert("PagedAttention", Box::new(PagedAttention(ctx.clone())));
}

fn need<'a>(d: &'a DataDict, op: &str, name: &str, dt: DataType, nd: usize) -> Result<&'a Data> {
    let x = d.require(op, name)?;
    if x.dtype() != dt || x.dims().len() != nd {
        return Err(Error::op(
            op,
            format!(
                "'{name}' must be {dt} with {nd} dims, got {} {:?}",
                x.dtype(),
                x.dims()
            ),
        ));
    }
    Ok(x)
}

/// `PagedCacheWrite`: `cache[slots[i]] = input[i]`.
struct PagedCacheWrite;

impl Operator for PagedCacheWrite {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input") == Some(DataType::F32)
            && d.dtype("cache").is_some_and(|t| KV_DTYPES.contains(&t))
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "PagedCacheWrite";
        let x = need(d, OP, "input", DataType::F32, 3)?;
        let s = need(d, OP, "slots", DataType::I32, 1)?;
        let c = d.require(OP, "cache")?;
        kv_format(OP, "cache", c.dtype())?;
        if c.dims().len() != 3
            || x.dim(1) != c.dim(1)
            || stored_head_dim(c.dtype(), x.dim(2)) != c.dim(2)
            || s.dim(0) != x.dim(0)
        {
            return Err(Error::op(
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
        if let Some(bad) = s.as_i32()?.iter().find(|&&v| v < 0 || v as i64 >= n) {
            return Err(Error::op(
                OP,
                format!("slot {bad} outside the cache of {n} slots"),
            ));
        }
        Ok(())
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let ([x, s], c) = d.io("PagedCacheWrite", ["input", "slots"], "cache")?;
        let (x, s) = (
            x.ok_or_else(|| Error::op("PagedCacheWrite", "missing input"))?,
            s.ok_or_else(|| Error::op("PagedCacheWrite", "missing slots"))?,
        );
        let fmt = kv_format("PagedCacheWrite", "cache", c.dtype())?;
        let heads = (x.dim(1), x.dim(2));
        k::paged_cache_write_kv(fmt, c.bytes_mut()?, x.as_f32()?, s.as_i32()?, heads);
        Ok(())
    }
}

/// `PagedAttention`: attention of each sequence's new query rows over its cached keys.
struct PagedAttention(Arc<CpuContext>);

struct Checked<'a> {
    p: PagedAttnParams,
    seqs: Vec<PagedSeq<'a>>,
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

fn req<'a>(x: Option<&'a Data>, name: &str, dt: DataType, nd: usize) -> Result<&'a Data> {
    const OP: &str = "PagedAttention";
    let x = x.ok_or_else(|| Error::op(OP, format!("missing input '{name}'")))?;
    if x.dtype() != dt || x.dims().len() != nd {
        return Err(Error::op(
            OP,
            format!(
                "'{name}' must be {dt} with {nd} dims, got {} {:?}",
                x.dtype(),
                x.dims()
            ),
        ));
    }
    Ok(x)
}

/// A pool argument: f32, f16 or q8_0 with 3 dims.
fn cache_arg<'a>(x: Option<&'a Data>, name: &str) -> Result<&'a Data> {
    const OP: &str = "PagedAttention";
    let x = x.ok_or_else(|| Error::op(OP, format!("missing input '{name}'")))?;
    kv_format(OP, name, x.dtype())?;
    if x.dims().len() != 3 {
        return Err(Error::op(
            OP,
            format!("'{name}' must have 3 dims, got {:?}", x.dims()),
        ));
    }
    Ok(x)
}

fn check<'a>(a: &[Option<&'a Data>; 8], f: &FloatDict, i: &IntDict) -> Result<Checked<'a>> {
    const OP: &str = "PagedAttention";
    let q = req(a[0], "q", DataType::F32, 3)?;
    let kc = cache_arg(a[1], "k_cache")?;
    let vc = cache_arg(a[2], "v_cache")?;
    let qs = req(a[3], "q_starts", DataType::I32, 1)?.as_i32()?;
    let kl = req(a[4], "kv_lens", DataType::I32, 1)?.as_i32()?;
    let bt = req(a[5], "block_tables", DataType::I32, 2)?;
    let (rows, nh, hd) = (q.dim(0), q.dim(1), q.dim(2));
    let (slots, nkv) = (kc.dim(0), kc.dim(1));
    if kc.dims() != vc.dims()
        || kc.dtype() != vc.dtype()
        || kc.dim(2) != stored_head_dim(kc.dtype(), hd)
        || nkv == 0
        || nh % nkv != 0
    {
        return Err(Error::op(
            OP,
            format!(
                "q {:?}, k_cache {:?}, v_cache {:?}: head dims or head counts do not fit",
                q.dims(),
                kc.dims(),
                vc.dims()
            ),
        ));
    }
    let tables = BlockTables {
        q_starts: qs,
        kv_lens: kl,
        table: bt.as_i32()?,
        tables: bt.dim(0),
        max_blocks: bt.dim(1),
    };
    let (bs, seqs) = check_block_tables(OP, rows, slots, i.get_or("block_size", 16), &tables)?;
    let seqs: Vec<PagedSeq> = seqs
        .into_iter()
        .map(|s| PagedSeq {
            q_start: s.q_start,
            q_end: s.q_end,
            kv_len: s.kv_len,
            blocks: s.blocks,
        })
        .collect();
    for (x, name) in [(a[6], "alibi_slopes"), (a[7], "sinks")] {
        if let Some(x) = x.filter(|x| x.dtype() != DataType::F32 || x.count() != nh) {
            return Err(Error::op(
                OP,
                format!(
                    "{name} must be f32 [{nh}], got {} {:?}",
                    x.dtype(),
                    x.dims()
                ),
            ));
        }
    }
    let p = PagedAttnParams {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        block_size: bs,
        scale: f.get_or("scale", 1.0 / (hd as f32).sqrt()),
        softcap: f.get_or("softcap", 0.0),
        window: i.get_or("sliding_window", 0).max(0) as usize,
    };
    Ok(Checked { p, seqs })
}

impl Operator for PagedAttention {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("q") == Some(DataType::F32)
            && ["k_cache", "v_cache"]
                .iter()
                .all(|n| d.dtype(n).is_some_and(|t| KV_DTYPES.contains(&t)))
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let dims = {
            let a = NAMES.map(|n| d.get(n));
            check(&a, f, i)?;
            d.require("PagedAttention", "q")?.dims().to_vec()
        };
        d.require_mut("PagedAttention", "output")?
            .resize(DataType::F32, &dims)
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let (a, out) = d.io("PagedAttention", NAMES, "output")?;
        let c = check(&a, f, i)?;
        let q = req(a[0], "q", DataType::F32, 3)?.as_f32()?;
        let kc = kv_rows("PagedAttention", "k_cache", cache_arg(a[1], "k_cache")?)?;
        let vc = kv_rows("PagedAttention", "v_cache", cache_arg(a[2], "v_cache")?)?;
        let heads = HeadTerms {
            alibi: a[6].map(|x| x.as_f32()).transpose()?,
            sinks: a[7].map(|x| x.as_f32()).transpose()?,
        };
        let out = out.as_f32_mut()?;
        if self.0.reference() {
            k::paged_attention_ref(q, kc, vc, &c.seqs, heads, &c.p, out);
        } else {
            k::paged_attention(q, kc, vc, &c.seqs, heads, &c.p, out, &self.0.threads);
        }
        Ok(())
    }
}
