//! The tensor index section: one [`TensorInfo`] per tensor (name, dtype, dims, absolute offset,
//! length, crc32), encoded and decoded with every entry validated against the tensor-data
//! section (alignment, bounds, overlap, size implied by dtype and dims). No tensor bytes here.

use super::bytes::{put_bytes, put_u32, put_u64, put_varint, ByteReader};
use super::layout::{Section, ALIGN};
use crate::data::{bytes_for, DataType};
use crate::error::Result;
use std::collections::HashSet;

/// Most dims a tensor may have.
pub const MAX_DIMS: usize = 8;

/// One tensor's index entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Hugging Face name.
    pub name: String,
    /// Element type.
    pub dtype: DataType,
    /// Row-major dims, outermost first.
    pub dims: Vec<usize>,
    /// Absolute byte offset in the file (a multiple of 64).
    pub offset: u64,
    /// Byte length.
    pub length: u64,
    /// crc32 of the bytes.
    pub crc32: u32,
}

/// Encodes the index.
pub(crate) fn encode(tensors: &[TensorInfo]) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, tensors.len() as u64);
    for t in tensors {
        put_bytes(&mut out, t.name.as_bytes());
        put_u32(&mut out, t.dtype.code());
        out.push(t.dims.len() as u8);
        for &d in &t.dims {
            put_u64(&mut out, d as u64);
        }
        put_u64(&mut out, t.offset);
        put_u64(&mut out, t.length);
        put_u32(&mut out, t.crc32);
    }
    out
}

/// Decodes and validates the index against the tensor-data section `data`.
pub(crate) fn decode(bytes: &[u8], path: &str, data: Section) -> Result<Vec<TensorInfo>> {
    let mut r = ByteReader::new(bytes, path, "tensor index");
    let n = r.count("tensor", 30)?;
    let mut out: Vec<TensorInfo> = Vec::with_capacity(n);
    let mut names = HashSet::with_capacity(n);
    for _ in 0..n {
        let name = r.str()?;
        let code = r.u32()?;
        let dtype = DataType::from_code(code)
            .ok_or_else(|| r.err(format!("tensor {name}: unknown dtype code {code}")))?;
        let nd = r.u8()? as usize;
        if nd == 0 || nd > MAX_DIMS {
            return Err(r.err(format!("tensor {name}: {nd} dims (1..={MAX_DIMS} allowed)")));
        }
        let mut dims = Vec::with_capacity(nd);
        for _ in 0..nd {
            let d = r.u64()?;
            dims.push(
                usize::try_from(d)
                    .map_err(|_| r.err(format!("tensor {name}: dim {d} too large")))?,
            );
        }
        let offset = r.u64()?;
        let length = r.u64()?;
        let crc32 = r.u32()?;
        let need = bytes_for(dtype, &dims).map_err(|e| {
            r.err(format!(
                "tensor {name}: dims {dims:?} invalid for {dtype}: {e}"
            ))
        })?;
        if need as u64 != length {
            return Err(r.err(format!(
                "tensor {name}: length {length} but {dtype} {dims:?} needs {need} bytes"
            )));
        }
        let end = offset.checked_add(length);
        let data_end = data.offset.saturating_add(data.length);
        if offset < data.offset || end.is_none_or(|e| e > data_end) {
            return Err(r.err(format!(
                "tensor {name}: bytes {offset}+{length} lie outside the tensor data ({}..{data_end})",
                data.offset
            )));
        }
        if offset % ALIGN != 0 {
            return Err(r.err(format!(
                "tensor {name}: offset {offset} not aligned to {ALIGN}"
            )));
        }
        if !names.insert(name.clone()) {
            return Err(r.err(format!("tensor {name} appears twice")));
        }
        out.push(TensorInfo {
            name,
            dtype,
            dims,
            offset,
            length,
            crc32,
        });
    }
    let mut spans: Vec<(u64, u64, &str)> = out
        .iter()
        .map(|t| (t.offset, t.offset + t.length, t.name.as_str()))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        if let [a, b] = w {
            if b.0 < a.1 {
                return Err(r.err(format!("tensors {} and {} overlap", a.2, b.2)));
            }
        }
    }
    Ok(out)
}
