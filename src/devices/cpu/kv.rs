//! KV caches on the CPU in f32, f16 or q8_0: the [`KV_DTYPES`] this device stores, the view of a
//! cache tensor as the kernels' `KvRows` ([`kv_rows`]), the stored head size of a dtype
//! ([`stored_head_dim`]: `q8_0` pads each head row to whole blocks of 32), and the `KvAppend`
//! operator (encode f32 key/value rows at the end of a cache, growing it in place). Must not hold
//! kernel arithmetic.

use super::args::{check_tensor, f32s, need};
use super::CpuContext;
use crate::data::{Data, DataType};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::attention::{store_rows, KvFormat, KvRows};
use std::sync::Arc;

/// The cache dtypes this device stores and its attention kernels read.
pub const KV_DTYPES: [DataType; 3] = [DataType::F32, DataType::F16, DataType::Q8_0];

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, _ctx: &Arc<CpuContext>) {
    ops.insert("KvAppend", Box::new(KvAppend));
}

/// The kernels' format of a cache dtype; `Err` naming `op` and `name` for any other dtype.
pub fn kv_format(op: &str, name: &str, dt: DataType) -> Result<KvFormat> {
    match dt {
        DataType::F32 => Ok(KvFormat::F32),
        DataType::F16 => Ok(KvFormat::F16),
        DataType::Q8_0 => Ok(KvFormat::Q8_0),
        _ => Err(Error::op(
            op,
            format!("'{name}' is {dt}; a KV cache must be f32, f16 or q8_0"),
        )),
    }
}

/// Values stored per head row of `hd` values in a cache of `dt` (`q8_0`: whole blocks of 32).
pub fn stored_head_dim(dt: DataType, hd: usize) -> usize {
    match dt {
        DataType::Q8_0 => KvFormat::Q8_0.stored_len(hd),
        _ => hd,
    }
}

/// The cache tensor `x` (head rows of `hd` values) as the kernels read it.
pub fn kv_rows<'a>(op: &str, name: &str, x: &'a Data) -> Result<KvRows<'a>> {
    let bad = |e: Error| Error::op(op, format!("'{name}': {e}"));
    Ok(match kv_format(op, name, x.dtype())? {
        KvFormat::F32 => KvRows::F32(f32s(op, name, x)?),
        KvFormat::F16 => KvRows::F16(x.as_f16().map_err(bad)?),
        KvFormat::Q8_0 => KvRows::Q8_0(x.bytes().map_err(bad)?),
    })
}

/// `KvAppend`: `cache [len, nkv, hds]` (f32, f16 or q8_0, `hds` = [`stored_head_dim`]) gets the
/// rows of `input [n, nkv, hd]` (f32) encoded at its end; its capacity doubles when full.
struct KvAppend;

/// Validates the arguments; returns (format, kv heads, head size).
fn append_args(input: &Data, cache: &Data) -> Result<(KvFormat, usize, usize)> {
    const OP: &str = "KvAppend";
    check_tensor(OP, "input", input)?;
    f32s(OP, "input", input)?;
    let fmt = kv_format(OP, "cache", cache.dtype())?;
    let (x, c) = (input.dims(), cache.dims());
    if x.len() != 3 || c.len() != 3 || x[1] != c[1] || stored_head_dim(cache.dtype(), x[2]) != c[2]
    {
        return Err(Error::op(
            OP,
            format!(
                "input {x:?} does not fit cache {} {c:?} (expected [n, nkv, hd] and [len, nkv, hd \
                 stored as {}])",
                cache.dtype(),
                cache.dtype()
            ),
        ));
    }
    Ok((fmt, x[1], x[2]))
}

impl Operator for KvAppend {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input") == Some(DataType::F32)
            && d.dtype("cache").is_some_and(|t| KV_DTYPES.contains(&t))
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let input = d.require("KvAppend", "input")?;
        let cache = d.require("KvAppend", "cache")?;
        append_args(input, cache).map(|_| ())
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        const OP: &str = "KvAppend";
        let ([x], cache) = d.io(OP, ["input"], "cache")?;
        let x = need(OP, "input", x)?;
        let (fmt, nkv, hd) = append_args(x, cache)?;
        let (len, n) = (cache.dim(0), x.dim(0));
        let need_len = len + n;
        if need_len > cache.capacity()[0] {
            let cap = need_len.max(cache.capacity()[0] * 2).max(1);
            cache.reserve(0, cap).map_err(|e| Error::op(OP, e))?;
        }
        let rb = nkv * fmt.row_bytes(hd);
        let src = f32s(OP, "input", x)?;
        let dst = cache
            .raw_bytes_mut()
            .map_err(|e| Error::op(OP, e))?
            .get_mut(len * rb..need_len * rb)
            .ok_or_else(|| Error::op(OP, "the cache's storage is smaller than its capacity"))?;
        store_rows(fmt, src, hd, dst);
        cache.set_len(0, need_len).map_err(|e| Error::op(OP, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::cpu::CpuDevice;
    use crate::executor::Executor;
    use std::sync::Arc;

    #[test]
    fn append_encodes_rows_and_grows_the_cache() {
        let mut e = Executor::new();
        e.add_device(Arc::new(CpuDevice::new(1).unwrap()));
        let (nkv, hd) = (2usize, 40usize);
        let x: Vec<f32> = (0..5 * nkv * hd).map(|i| (i as f32 * 0.37).sin()).collect();
        for dt in KV_DTYPES {
            let hds = stored_head_dim(dt, hd);
            let mut cache = Data::zeros(dt, &[0, nkv, hds]).unwrap();
            cache.reserve(0, 2).unwrap();
            for (a, b) in [(0usize, 2usize), (2, 5)] {
                let rows = Data::from_f32(&[b - a, nkv, hd], &x[a * nkv * hd..b * nkv * hd]);
                let mut d = DataDict::new()
                    .with("input", rows.as_ref().unwrap())
                    .with_mut("cache", &mut cache);
                e.run("KvAppend", &mut d, &FloatDict::new(), &IntDict::new())
                    .unwrap();
            }
            assert_eq!(cache.dims(), [5, nkv, hds]);
            let got = kv_rows("t", "cache", &cache).unwrap().to_f32(hd);
            let tol = if dt == DataType::F32 { 0.0 } else { 1e-2 };
            for (g, w) in got.iter().zip(&x) {
                assert!((g - w).abs() <= tol, "{dt}: {g} vs {w}");
            }
        }
        let mut bad = Data::zeros(DataType::F16, &[0, 3, 40]).unwrap();
        let rows = Data::from_f32(&[1, 2, 40], &x[..80]).unwrap();
        let mut d = DataDict::new()
            .with("input", &rows)
            .with_mut("cache", &mut bad);
        let err = e
            .run("KvAppend", &mut d, &FloatDict::new(), &IntDict::new())
            .unwrap_err();
        assert!(err.to_string().contains("does not fit"), "{err}");
    }
}
