//! GGUF reader (llama.cpp's model format, versions 2 and 3): header, typed metadata, tensor
//! infos, and zero-copy access to tensor bytes through a memory map. Every offset and length is
//! checked against the file, so a corrupt or truncated file gives an `Err`, never a panic or an
//! out-of-bounds read.

use crate::error::{Error, Result};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// uint8
    U8(u8),
    /// int8
    I8(i8),
    /// uint16
    U16(u16),
    /// int16
    I16(i16),
    /// uint32
    U32(u32),
    /// int32
    I32(i32),
    /// float32
    F32(f32),
    /// bool
    Bool(bool),
    /// UTF-8 string (invalid UTF-8 is replaced).
    Str(String),
    /// Array of values.
    Array(Vec<GgufValue>),
    /// uint64
    U64(u64),
    /// int64
    I64(i64),
    /// float64
    F64(f64),
}

impl GgufValue {
    /// As an unsigned integer, if integral and non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        Some(match *self {
            GgufValue::U8(v) => v as u64,
            GgufValue::U16(v) => v as u64,
            GgufValue::U32(v) => v as u64,
            GgufValue::U64(v) => v,
            GgufValue::I8(v) if v >= 0 => v as u64,
            GgufValue::I16(v) if v >= 0 => v as u64,
            GgufValue::I32(v) if v >= 0 => v as u64,
            GgufValue::I64(v) if v >= 0 => v as u64,
            GgufValue::Bool(b) => b as u64,
            _ => return None,
        })
    }
    /// As a signed integer, if integral.
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            GgufValue::I8(v) => v as i64,
            GgufValue::I16(v) => v as i64,
            GgufValue::I32(v) => v as i64,
            GgufValue::I64(v) => v,
            _ => return self.as_u64().and_then(|v| i64::try_from(v).ok()),
        })
    }
    /// As a float, if numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
    /// As a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => self.as_u64().map(|v| v != 0),
        }
    }
    /// As a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }
    /// As an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// ggml tensor type codes this project knows by name.
pub mod ggml_type {
    /// F32
    pub const F32: u32 = 0;
    /// F16
    pub const F16: u32 = 1;
    /// Q4_0
    pub const Q4_0: u32 = 2;
    /// Q4_1
    pub const Q4_1: u32 = 3;
    /// Q5_0
    pub const Q5_0: u32 = 6;
    /// Q5_1
    pub const Q5_1: u32 = 7;
    /// Q8_0
    pub const Q8_0: u32 = 8;
    /// Q2_K
    pub const Q2_K: u32 = 10;
    /// Q3_K
    pub const Q3_K: u32 = 11;
    /// Q4_K
    pub const Q4_K: u32 = 12;
    /// Q5_K
    pub const Q5_K: u32 = 13;
    /// Q6_K
    pub const Q6_K: u32 = 14;
    /// Q8_K
    pub const Q8_K: u32 = 15;
    /// BF16
    pub const BF16: u32 = 30;
    /// MXFP4 (blocks of 32: an E8M0 exponent byte, 16 bytes of E2M1 nibbles)
    pub const MXFP4: u32 = 39;

    /// (name, elements per block, bytes per block) for a ggml type code.
    pub fn info(t: u32) -> Option<(&'static str, usize, usize)> {
        Some(match t {
            F32 => ("F32", 1, 4),
            F16 => ("F16", 1, 2),
            Q4_0 => ("Q4_0", 32, 18),
            Q4_1 => ("Q4_1", 32, 20),
            Q5_0 => ("Q5_0", 32, 22),
            Q5_1 => ("Q5_1", 32, 24),
            Q8_0 => ("Q8_0", 32, 34),
            Q2_K => ("Q2_K", 256, 84),
            Q3_K => ("Q3_K", 256, 110),
            Q4_K => ("Q4_K", 256, 144),
            Q5_K => ("Q5_K", 256, 176),
            Q6_K => ("Q6_K", 256, 210),
            Q8_K => ("Q8_K", 256, 292),
            BF16 => ("BF16", 1, 2),
            MXFP4 => ("MXFP4", 32, 17),
            _ => return None,
        })
    }
}

/// One tensor's entry in the GGUF index.
#[derive(Clone, Debug)]
pub struct GgufTensorInfo {
    /// Tensor name (e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// ggml dims: `dims[0]` is the fastest-varying (row length); reversed from PyTorch order.
    pub dims: Vec<u64>,
    /// ggml type code (see [`ggml_type`]).
    pub ggml_type: u32,
    /// Byte offset from the start of the data section.
    pub offset: u64,
    /// Byte size, computed from dims and type.
    pub size: u64,
}

impl GgufTensorInfo {
    /// Dims in row-major (PyTorch) order: outermost first.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
    /// Number of elements.
    pub fn count(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// An opened GGUF file.
pub struct GgufFile {
    /// Path, for messages.
    pub path: String,
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata by key.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensor index, in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    map: Arc<Mmap>,
    file: std::fs::File,
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                Error::format(
                    self.path,
                    format!("truncated: needed {n} bytes at offset {}", self.pos),
                )
            })?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn len(&mut self, what: &str) -> Result<usize> {
        let n = self.u64()?;
        // every element takes at least one byte: a count beyond the remaining bytes is corrupt
        if n > (self.b.len() - self.pos) as u64 {
            return Err(Error::format(
                self.path,
                format!(
                    "{what} length {n} at offset {} exceeds the file",
                    self.pos - 8
                ),
            ));
        }
        Ok(n as usize)
    }
    fn string(&mut self) -> Result<String> {
        let n = self.len("string")?;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    fn value(&mut self, t: u32, depth: usize) -> Result<GgufValue> {
        Ok(match t {
            0 => GgufValue::U8(self.u8()?),
            1 => GgufValue::I8(self.u8()? as i8),
            2 => GgufValue::U16(self.u16()?),
            3 => GgufValue::I16(self.u16()? as i16),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(self.u32()? as i32),
            6 => GgufValue::F32(f32::from_bits(self.u32()?)),
            7 => GgufValue::Bool(self.u8()? != 0),
            8 => GgufValue::Str(self.string()?),
            9 => {
                if depth > 4 {
                    return Err(Error::format(
                        self.path,
                        "metadata arrays nested too deeply",
                    ));
                }
                let et = self.u32()?;
                let n = self.len("array")?;
                let mut v = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    v.push(self.value(et, depth + 1)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(self.u64()? as i64),
            12 => GgufValue::F64(f64::from_bits(self.u64()?)),
            _ => {
                return Err(Error::format(
                    self.path,
                    format!("unknown metadata value type {t} at offset {}", self.pos - 4),
                ))
            }
        })
    }
}

impl Cursor<'_> {
    /// One entry of the tensor index: name, 1 to 4 dims, a known ggml type whose block divides
    /// the rows, the offset in the data section, and the size in bytes (checked for overflow).
    fn tensor_info(&mut self) -> Result<GgufTensorInfo> {
        let path = self.path;
        let name = self.string()?;
        let nd = self.u32()?;
        if nd == 0 || nd > 4 {
            return Err(Error::format(path, format!("tensor {name}: {nd} dims")));
        }
        let mut dims = Vec::with_capacity(nd as usize);
        for _ in 0..nd {
            dims.push(self.u64()?);
        }
        let ggml_type = self.u32()?;
        let offset = self.u64()?;
        let (tname, be, bb) = ggml_type::info(ggml_type).ok_or_else(|| {
            Error::format(
                path,
                format!("tensor {name}: unknown ggml type {ggml_type}"),
            )
        })?;
        let count = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::format(path, format!("tensor {name}: dims {dims:?} overflow")))?;
        if dims[0] % be as u64 != 0 {
            return Err(Error::format(
                path,
                format!(
                    "tensor {name}: row of {} not a multiple of {tname}'s block {be}",
                    dims[0]
                ),
            ));
        }
        let size = (count / be as u64)
            .checked_mul(bb as u64)
            .ok_or_else(|| Error::format(path, format!("tensor {name}: size overflows")))?;
        Ok(GgufTensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            size,
        })
    }
}

/// Refuses a tensor whose bytes lie outside a file of `file_len` bytes.
fn check_tensor_bounds(
    path: &str,
    tensors: &[GgufTensorInfo],
    data_offset: u64,
    file_len: usize,
) -> Result<()> {
    for t in tensors {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.size));
        if end.is_none_or(|e| e > file_len as u64) {
            return Err(Error::format(
                path,
                format!(
                    "tensor {}: bytes {}+{} lie outside the file ({} bytes)",
                    t.name, t.offset, t.size, file_len
                ),
            ));
        }
    }
    Ok(())
}

impl GgufFile {
    /// Opens and indexes a GGUF file (memory-mapped).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let p = path.as_ref();
        let ps = p.display().to_string();
        let f = std::fs::File::open(p).map_err(|e| Error::io(&ps, e))?;
        // SAFETY: the file is opened read-only; like every mmap reader we rely on it not being
        // truncated while mapped.
        let map = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(&ps, e))?;
        Self::parse(ps, Arc::new(map), f)
    }

    fn parse(path: String, map: Arc<Mmap>, file: std::fs::File) -> Result<GgufFile> {
        let b: &[u8] = &map;
        let mut c = Cursor {
            b,
            pos: 0,
            path: &path,
        };
        if c.take(4)
            .map_err(|_| Error::format(&path, "not a GGUF file (too short)"))?
            != b"GGUF"
        {
            return Err(Error::format(&path, "not a GGUF file (bad magic)"));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(Error::format(
                &path,
                format!("unsupported GGUF version {version}"),
            ));
        }
        let n_tensors = c.u64()?;
        let n_kv = c.u64()?;
        if n_tensors > b.len() as u64 || n_kv > b.len() as u64 {
            return Err(Error::format(
                &path,
                "tensor or metadata count exceeds the file",
            ));
        }
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let k = c.string()?;
            let t = c.u32()?;
            let v = c.value(t, 0)?;
            metadata.insert(k, v);
        }
        let mut tensors = Vec::with_capacity((n_tensors as usize).min(4096));
        for _ in 0..n_tensors {
            tensors.push(c.tensor_info()?);
        }
        let align = metadata
            .get("general.alignment")
            .and_then(|v| v.as_u64())
            .unwrap_or(32)
            .max(1);
        let data_offset = (c.pos as u64).div_ceil(align) * align;
        check_tensor_bounds(&path, &tensors, data_offset, b.len())?;
        Ok(GgufFile {
            path,
            version,
            metadata,
            tensors,
            data_offset,
            map,
            file,
        })
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }
    /// A string metadata value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(|v| v.as_str())
    }
    /// An unsigned integer metadata value.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(|v| v.as_u64())
    }
    /// A float metadata value.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(|v| v.as_f64())
    }
    /// An array metadata value.
    pub fn get_array(&self, key: &str) -> Option<&[GgufValue]> {
        self.get(key).and_then(|v| v.as_array())
    }
    /// The architecture (`general.architecture`).
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }
    /// The tensor info for `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
    /// The bytes of a tensor (checked at open time to lie inside the file).
    pub fn tensor_bytes(&self, t: &GgufTensorInfo) -> Result<&[u8]> {
        let s = (self.data_offset + t.offset) as usize;
        self.map
            .get(s..s + t.size as usize)
            .ok_or_else(|| Error::format(&self.path, format!("tensor {} outside the file", t.name)))
    }
    /// A fresh copy of a tensor's bytes, read with a positioned read (nothing of the file stays
    /// resident; the converter uses this to keep its memory at one tensor).
    pub fn read_tensor_bytes(&self, t: &GgufTensorInfo) -> Result<Vec<u8>> {
        let start = self.data_offset.checked_add(t.offset).ok_or_else(|| {
            Error::format(&self.path, format!("tensor {} outside the file", t.name))
        })?;
        crate::format::pread::read_vec(&self.file, &self.path, start, t.size, &t.name)
    }

    /// The whole mapping (for zero-copy views).
    pub fn mapping(&self) -> Arc<Mmap> {
        self.map.clone()
    }
}
