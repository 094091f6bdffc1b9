//! The metadata section: typed key/values (`MetaValue`) and their encoding. Owns the value
//! types only; which keys exist is decided by the converter and `ModelConfig`'s mapping.

use super::bytes::{put_bytes, put_u32, put_varint, ByteReader};
use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// A typed metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// Unsigned 32-bit integer.
    U32(u32),
    /// Signed 64-bit integer.
    I64(i64),
    /// 32-bit float.
    F32(f32),
    /// 64-bit float.
    F64(f64),
    /// Boolean.
    Bool(bool),
    /// UTF-8 string.
    Str(String),
    /// Homogeneous array of scalars (no nested arrays).
    Array(Vec<MetaValue>),
}

/// Metadata by key.
pub type Metadata = BTreeMap<String, MetaValue>;

impl MetaValue {
    fn type_code(&self) -> u8 {
        match self {
            MetaValue::U32(_) => 0,
            MetaValue::I64(_) => 1,
            MetaValue::F32(_) => 2,
            MetaValue::F64(_) => 3,
            MetaValue::Bool(_) => 4,
            MetaValue::Str(_) => 5,
            MetaValue::Array(_) => 6,
        }
    }

    /// As an unsigned integer (from U32 or non-negative I64).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// As a float (from any numeric value).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::U32(v) => Some(v as f64),
            MetaValue::I64(v) => Some(v as f64),
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// As a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// As a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// As an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    fn encode_scalar(&self, out: &mut Vec<u8>) {
        match self {
            MetaValue::U32(v) => put_u32(out, *v),
            MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::Bool(v) => out.push(*v as u8),
            MetaValue::Str(s) => put_bytes(out, s.as_bytes()),
            MetaValue::Array(_) => {}
        }
    }

    fn decode_scalar(r: &mut ByteReader<'_>, t: u8) -> Result<MetaValue> {
        Ok(match t {
            0 => MetaValue::U32(r.u32()?),
            1 => MetaValue::I64(r.i64()?),
            2 => MetaValue::F32(r.f32()?),
            3 => MetaValue::F64(r.f64()?),
            4 => match r.u8()? {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(r.err(format!("bool value {b}"))),
            },
            5 => MetaValue::Str(r.str()?),
            _ => return Err(r.err(format!("unknown value type {t}"))),
        })
    }
}

/// Encodes a metadata map; `Err` for nested or mixed-type arrays.
pub(crate) fn encode(meta: &Metadata) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    put_u32(&mut out, meta.len() as u32);
    for (k, v) in meta {
        put_bytes(&mut out, k.as_bytes());
        out.push(v.type_code());
        match v {
            MetaValue::Array(items) => {
                let et = items.first().map(|i| i.type_code()).unwrap_or(0);
                if items.iter().any(|i| i.type_code() != et || et == 6) {
                    return Err(Error::invalid(format!(
                        "metadata {k}: arrays must hold scalars of one type"
                    )));
                }
                out.push(et);
                put_varint(&mut out, items.len() as u64);
                for i in items {
                    i.encode_scalar(&mut out);
                }
            }
            _ => v.encode_scalar(&mut out),
        }
    }
    Ok(out)
}

/// Decodes a metadata section.
pub(crate) fn decode(bytes: &[u8], path: &str) -> Result<Metadata> {
    let mut r = ByteReader::new(bytes, path, "metadata");
    let n = r.u32()?;
    let mut meta = Metadata::new();
    for _ in 0..n {
        let key = r.str()?;
        let t = r.u8()?;
        let v = if t == 6 {
            let et = r.u8()?;
            if et > 5 {
                return Err(r.err(format!("{key}: bad array element type {et}")));
            }
            let count = r.count("array", 1)?;
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                items.push(MetaValue::decode_scalar(&mut r, et)?);
            }
            MetaValue::Array(items)
        } else {
            MetaValue::decode_scalar(&mut r, t)?
        };
        if meta.insert(key.clone(), v).is_some() {
            return Err(r.err(format!("duplicate key {key}")));
        }
    }
    Ok(meta)
}
