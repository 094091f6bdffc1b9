//! [`KvDtype`]: how a model's KV cache stores keys and values (f32, f16 or q8_0), its bytes per
//! token, and the choice of a dtype for a device ([`resolve`]): the requested one when the device
//! stores it (else an error naming the dtype and the device), by default f16 where the device
//! stores f16 and the precision is `fast`, else f32.

use super::config::ModelConfig;
use super::precision::Precision;
use crate::data::DataType;
use crate::device::BaseDevice;
use crate::error::{Error, Result};

/// Values per `q8_0` block (a head row is padded to whole blocks).
const Q8_BLOCK: usize = 32;

/// The dtype of a KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    /// 32-bit floats.
    F32,
    /// IEEE half floats (half the bytes of f32).
    F16,
    /// int8 blocks of 32 values with an f16 scale, GGUF `Q8_0` (about a quarter of f32); each
    /// head row is padded to whole blocks.
    Q8_0,
}

impl KvDtype {
    /// Parses `f32` / `f16` / `q8_0`; anything else is an error naming the value.
    pub fn parse(s: &str) -> Result<KvDtype> {
        match s {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            "q8_0" => Ok(KvDtype::Q8_0),
            _ => Err(Error::invalid(format!(
                "KV cache dtype '{s}' (expected f16, q8_0 or f32)"
            ))),
        }
    }

    /// `f32`, `f16` or `q8_0`.
    pub fn name(self) -> &'static str {
        self.data_type().name()
    }

    /// The tensor dtype of the cache.
    pub fn data_type(self) -> DataType {
        match self {
            KvDtype::F32 => DataType::F32,
            KvDtype::F16 => DataType::F16,
            KvDtype::Q8_0 => DataType::Q8_0,
        }
    }

    /// The dtype of a cache tensor, if it is one of these.
    pub fn of(dt: DataType) -> Option<KvDtype> {
        match dt {
            DataType::F32 => Some(KvDtype::F32),
            DataType::F16 => Some(KvDtype::F16),
            DataType::Q8_0 => Some(KvDtype::Q8_0),
            _ => None,
        }
    }

    /// Values stored per head row of `hd` values (`q8_0` pads to whole blocks of 32).
    pub fn stored_head_dim(self, hd: usize) -> usize {
        match self {
            KvDtype::Q8_0 => hd.div_ceil(Q8_BLOCK) * Q8_BLOCK,
            _ => hd,
        }
    }

    /// Bytes of one head row of `hd` values.
    pub fn row_bytes(self, hd: usize) -> usize {
        match self {
            KvDtype::F32 => 4 * hd,
            KvDtype::F16 => 2 * hd,
            KvDtype::Q8_0 => hd.div_ceil(Q8_BLOCK) * 34,
        }
    }

    /// Bytes of keys and values of one token over every layer of `c`.
    pub fn bytes_per_token(self, c: &ModelConfig) -> usize {
        2 * c.num_layers * c.num_kv_heads * self.row_bytes(c.head_dim)
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The KV dtype of a model on `device` (`None`: a tensor-parallel group, whose ranks keep f32):
/// `requested` when the device stores it, else an `Err` naming both; by default (`None`) f16
/// where the device stores it and `precision` is `fast`, else f32.
pub fn resolve(
    requested: Option<KvDtype>,
    device: Option<&dyn BaseDevice>,
    precision: Precision,
) -> Result<KvDtype> {
    let stores = |k: KvDtype| match device {
        Some(d) => d.kv_dtypes().contains(&k.data_type()),
        None => k == KvDtype::F32,
    };
    match requested {
        Some(k) if stores(k) => Ok(k),
        Some(k) => {
            let name = device.map_or("a tensor-parallel group", |d| d.name());
            let have: Vec<&str> = match device {
                Some(d) => d.kv_dtypes().iter().map(|t| t.name()).collect(),
                None => vec!["f32"],
            };
            Err(Error::Unsupported(format!(
                "KV cache dtype {k} is not supported on {name} (it stores {}); choose another \
                 with --kv-dtype",
                have.join(", ")
            )))
        }
        None if precision == Precision::Fast && stores(KvDtype::F16) => Ok(KvDtype::F16),
        None => Ok(KvDtype::F32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names_and_sizes() {
        for k in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0] {
            assert_eq!(KvDtype::parse(k.name()).unwrap(), k);
        }
        let e = KvDtype::parse("int4").unwrap_err().to_string();
        assert!(e.contains("'int4'") && e.contains("q8_0"), "{e}");
        assert_eq!(KvDtype::F16.row_bytes(64), 128);
        assert_eq!(KvDtype::Q8_0.row_bytes(64), 68);
        assert_eq!(KvDtype::Q8_0.row_bytes(80), 102);
        assert_eq!(KvDtype::Q8_0.stored_head_dim(80), 96);
    }

    #[test]
    fn a_device_without_the_dtype_refuses_it_by_name() {
        let cpu = crate::devices::cpu::CpuDevice::new(1).unwrap();
        let fast = Precision::Fast;
        assert_eq!(resolve(None, Some(&cpu), fast).unwrap(), KvDtype::F16);
        assert_eq!(
            resolve(None, Some(&cpu), Precision::Exact).unwrap(),
            KvDtype::F32
        );
        assert_eq!(
            resolve(Some(KvDtype::Q8_0), Some(&cpu), fast).unwrap(),
            KvDtype::Q8_0
        );
        assert_eq!(resolve(None, None, fast).unwrap(), KvDtype::F32);
        let e = resolve(Some(KvDtype::F16), None, fast)
            .unwrap_err()
            .to_string();
        assert!(e.contains("f16") && e.contains("tensor-parallel"), "{e}");
    }
}
