//! KV caches on the GPU in f32, f16 or q8_0: the [`KV_DTYPES`] this device stores, the element
//! type of a key/value pair as the attention kernels take it ([`kv_elem`], [`KvElem`]), the head
//! sizes of a q8_0 cache ([`stored_head_dim`], [`value_head_dim`]: each head row is padded to
//! whole GGUF `Q8_0` blocks of 32, the CPU's layout, so the bytes agree), and the `KvAppend`
//! operator (f32 key/value rows encoded at the end of a cache, growing it in place when full).
//! The attention kernels over these caches live in `attention.rs`.

use super::buffer::{alloc_data, device_len, dptr};
use super::gpu::{long, Gpu, KArg};
use super::op_err;
use super::shape::copy2d;
use crate::data::{bytes_for, Data, DataType};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use std::sync::Arc;

/// The cache dtypes this device stores and its attention kernels read.
pub const KV_DTYPES: [DataType; 3] = [DataType::F32, DataType::F16, DataType::Q8_0];

/// Values per `Q8_0` block.
const Q8_BLOCK: usize = 32;

/// Values stored per head row of `hd` values in a cache of `dt` (`q8_0`: whole blocks of 32).
pub fn stored_head_dim(dt: DataType, hd: usize) -> usize {
    match dt {
        DataType::Q8_0 => hd.div_ceil(Q8_BLOCK) * Q8_BLOCK,
        _ => hd,
    }
}

/// The value head size of a cache `v` of `stored` values per head row: `stored`, except that a
/// q8_0 row padded from the keys' head size `hd` holds `hd` values.
pub fn value_head_dim(dt: DataType, stored: usize, hd: usize) -> usize {
    if dt == DataType::Q8_0 && stored_head_dim(dt, hd) == stored {
        hd
    } else {
        stored
    }
}

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    ops.insert("KvAppend", Box::new(KvAppend(gpu.clone())));
}

/// The element type of the keys and values an attention kernel reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvElem {
    /// 32-bit floats (the `*_f32` kernels).
    F32,
    /// IEEE half floats (the `*_f16kv` kernels, f32 arithmetic).
    F16,
    /// GGUF `Q8_0` blocks, each head row padded to whole blocks (the `*_q8kv` kernels, f32
    /// arithmetic).
    Q8,
}

impl KvElem {
    /// The kernel `base` (named for f32 keys and values, `…_f32`) for this element type:
    /// `base` itself, or with `_f32` replaced by `_f16kv` / `_q8kv`.
    pub fn kernel(self, base: &'static str) -> String {
        let stem = base.strip_suffix("_f32").unwrap_or(base);
        match self {
            KvElem::F32 => base.to_string(),
            KvElem::F16 => format!("{stem}_f16kv"),
            KvElem::Q8 => format!("{stem}_q8kv"),
        }
    }

    /// The cache dtype.
    pub fn dtype(self) -> DataType {
        match self {
            KvElem::F32 => DataType::F32,
            KvElem::F16 => DataType::F16,
            KvElem::Q8 => DataType::Q8_0,
        }
    }
}

/// The element type shared by the tensors named `k` and `v` of `d` (both f32, f16 or q8_0);
/// `None` when either is missing or of another dtype, or when they differ.
pub fn kv_elem(d: &DataDict, k: &str, v: &str) -> Option<KvElem> {
    elem_of(d.dtype(k)?, d.dtype(v)?)
}

/// The element type of keys `k` and values `v` of these dtypes (the same one of f32, f16,
/// q8_0), else `None`.
pub fn elem_of(k: DataType, v: DataType) -> Option<KvElem> {
    match (k, v) {
        (DataType::F32, DataType::F32) => Some(KvElem::F32),
        (DataType::F16, DataType::F16) => Some(KvElem::F16),
        (DataType::Q8_0, DataType::Q8_0) => Some(KvElem::Q8),
        _ => None,
    }
}

/// `KvAppend`: `cache [len, nkv, hds]` (f16 or q8_0 with `hds` = [`stored_head_dim`]; an f32
/// cache appends by `CatDirect`, which this op also accepts) gets the f32 rows of
/// `input [n, nkv, hd]` encoded at its end; its capacity doubles (at least) when full.
struct KvAppend(Arc<Gpu>);

/// Validates the arguments (a contiguous f32 input, a cache of the same row shape, its head
/// rows padded for q8_0, expanded on axis 0 only).
fn append_args(input: &Data, cache: &Data) -> Result<()> {
    const OP: &str = "KvAppend";
    let (x, c) = (input.dims(), cache.dims());
    let fits = input.dtype() == DataType::F32
        && input.is_contiguous()
        && KV_DTYPES.contains(&cache.dtype())
        && x.len() == 3
        && c.len() == 3
        && x[1] == c[1]
        && stored_head_dim(cache.dtype(), x[2]) == c[2]
        && cache.capacity()[1..] == c[1..];
    if fits {
        Ok(())
    } else {
        Err(op_err(
            OP,
            format!(
                "input {} {x:?} does not fit cache {} {c:?} (expected f32 [n, nkv, hd] and an \
                 f32, f16 or q8_0 cache [len, nkv, hd], q8_0 rows padded to whole blocks of 32)",
                input.dtype(),
                cache.dtype()
            ),
        ))
    }
}

impl KvAppend {
    /// Makes room for `need` rows in `cache` (a device tensor afterwards): a new allocation
    /// holding the old rows when it is not yet on the GPU (of its capacity) or full (of at
    /// least twice the capacity).
    fn room(&self, cache: &mut Data, need: usize) -> Result<()> {
        const OP: &str = "KvAppend";
        let on_gpu = device_len(cache).is_some();
        let fits = need <= cache.capacity()[0];
        if on_gpu && fits {
            return Ok(());
        }
        let dt = cache.dtype();
        let mut cap = cache.capacity().to_vec();
        if !fits {
            cap[0] = need.max(2 * cap[0]).max(1);
        }
        let grown = alloc_data(&self.0, dt, cache.dims(), &cap)?;
        let used = bytes_for(dt, cache.dims()).map_err(|e| op_err(OP, e))?;
        if used > 0 {
            if !on_gpu {
                return Err(op_err(OP, "the cache holds rows but is not on the GPU"));
            }
            copy2d(
                &self.0,
                dptr(cache, "cache")?,
                dptr(&grown, "cache")?,
                1,
                used,
                used,
                used,
            )?;
        }
        let name = std::mem::take(&mut cache.name);
        *cache = grown;
        cache.name = name;
        Ok(())
    }
}

impl Operator for KvAppend {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input") == Some(DataType::F32)
            && d.dtype("cache").is_some_and(|t| KV_DTYPES.contains(&t))
            && d.get("input").is_some_and(|x| x.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "KvAppend";
        append_args(d.require(OP, "input")?, d.require(OP, "cache")?)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "KvAppend";
        let ([x], cache) = d.io(OP, ["input"], "cache")?;
        let x = x.ok_or_else(|| op_err(OP, "missing input 'input'"))?;
        append_args(x, cache)?;
        let (len, n) = (cache.dim(0), x.dim(0));
        self.room(cache, len + n)?;
        let row: usize = cache.dims()[1..].iter().product();
        let values = n * row;
        let src = dptr(x, "input")?;
        let at = dptr(cache, "cache")?
            + bytes_for(cache.dtype(), &[len, row]).map_err(|e| op_err(OP, e))? as u64;
        if cache.dtype() == DataType::F32 {
            copy2d(&self.0, src, at, 1, 4 * values, 4 * values, 4 * values)?;
        } else if cache.dtype() == DataType::Q8_0 {
            let (rows, hd) = (n * x.dim(1), x.dim(2));
            let blocks = rows * hd.div_ceil(Q8_BLOCK);
            if blocks > 0 {
                // a warp per block
                self.0.launch(
                    "kv_append_q8kv",
                    Gpu::grid_for(blocks * 32, 256),
                    256,
                    &[
                        KArg::Ptr(src),
                        KArg::Ptr(at),
                        long(rows, "rows")?,
                        super::gpu::int(hd, "head dim")?,
                    ],
                )?;
            }
        } else if values > 0 {
            self.0.launch(
                "kv_append_f16kv",
                Gpu::grid_for(values, 256),
                256,
                &[KArg::Ptr(src), KArg::Ptr(at), long(values, "values")?],
            )?;
        }
        cache.set_len(0, len + n).map_err(|e| op_err(OP, e))
    }
}

#[cfg(test)]
mod tests {
    use super::{stored_head_dim, value_head_dim, KvElem};
    use crate::data::DataType;

    #[test]
    fn q8_0_head_rows_pad_to_whole_blocks() {
        assert_eq!(stored_head_dim(DataType::Q8_0, 80), 96);
        assert_eq!(stored_head_dim(DataType::Q8_0, 128), 128);
        assert_eq!(stored_head_dim(DataType::F16, 80), 80);
        // a value row padded from the key's head size holds that many values
        assert_eq!(value_head_dim(DataType::Q8_0, 96, 80), 80);
        assert_eq!(value_head_dim(DataType::Q8_0, 32, 40), 32);
        assert_eq!(value_head_dim(DataType::F16, 24, 40), 24);
    }

    #[test]
    fn kernel_names_follow_the_element_type() {
        assert_eq!(KvElem::F32.kernel("attn_decode_f32"), "attn_decode_f32");
        assert_eq!(KvElem::F16.kernel("attn_decode_f32"), "attn_decode_f16kv");
        assert_eq!(
            KvElem::F16.kernel("attn_decode_w64_f32"),
            "attn_decode_w64_f16kv"
        );
        assert_eq!(KvElem::F16.kernel("attention_f32"), "attention_f16kv");
        assert_eq!(
            KvElem::Q8.kernel("attn_decode_w64_f32"),
            "attn_decode_w64_q8kv"
        );
        assert_eq!(
            KvElem::Q8.kernel("flash_attn128x1_f32"),
            "flash_attn128x1_q8kv"
        );
    }
}
