//! Turns one source tensor into its stored form: layout fixes (GPT-2 Conv1D transpose, llama.cpp
//! q/k row un-permutation) and dtype conversion. Rows are moved as bytes when the stored dtype
//! equals the source's, so quantized blocks stay bit-exact; otherwise values go through f32.

use super::dtype_policy;
use super::names::{unpermuted_source_row, Mapped};
use crate::data::DataType;
use crate::error::{Error, Result};

/// A source tensor as the converter sees it.
pub struct SourceTensor<'a> {
    /// Source name (for messages).
    pub source_name: &'a str,
    /// Row-major dims, outermost first.
    pub dims: Vec<usize>,
    /// Raw bytes (moved into the output when no conversion is needed).
    pub bytes: Vec<u8>,
    /// The `.flm` dtype with identical bytes, if any.
    pub same_as: Option<DataType>,
    /// Decodes `bytes` into f32 (all elements).
    pub decode: &'a dyn Fn(&[u8], &mut [f32]) -> Result<()>,
}

/// The stored form of one tensor.
pub struct StoredTensor {
    /// Stored dtype.
    pub dtype: DataType,
    /// Stored dims.
    pub dims: Vec<usize>,
    /// Packed bytes.
    pub bytes: Vec<u8>,
}

fn row_order(m: &Mapped, rows: usize, src: &SourceTensor<'_>) -> Result<Option<Vec<usize>>> {
    let Some(heads) = m.unpermute_heads else { return Ok(None) };
    if heads == 0 || rows % heads != 0 || (rows / heads) % 2 != 0 {
        return Err(Error::invalid(format!(
            "tensor {}: {rows} rows cannot be split into {heads} heads of even size",
            src.source_name
        )));
    }
    Ok(Some((0..rows).map(|r| unpermuted_source_row(r, rows, heads)).collect()))
}

/// Converts `src` (mapped by `m`) to the dtype the policy picks for `target`.
pub fn transform(m: &Mapped, src: SourceTensor<'_>, target: super::TargetDtype) -> Result<StoredTensor> {
    let dims = src.dims.clone();
    let count = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| Error::invalid(format!("tensor {}: dims {dims:?} overflow", src.source_name)))?;
    let cols = dims.last().copied().unwrap_or(1);
    let rows = if cols == 0 { 0 } else { count / cols };
    if m.transpose && dims.len() != 2 {
        return Err(Error::invalid(format!(
            "tensor {}: Conv1D weight must be 2-D, got {dims:?}",
            src.source_name
        )));
    }
    let out_dims = if m.transpose { vec![cols, rows] } else { dims.clone() };
    let dtype = dtype_policy::stored_dtype(target, &m.name, &out_dims, src.same_as);
    let order = row_order(m, rows, &src)?;
    if Some(dtype) == src.same_as && !m.transpose {
        let rb = dtype.row_bytes(cols)?;
        let bytes = match order {
            None => src.bytes,
            Some(order) => {
                let mut out = Vec::with_capacity(src.bytes.len());
                for r in order {
                    let row = src
                        .bytes
                        .get(r * rb..(r + 1) * rb)
                        .ok_or_else(|| Error::invalid(format!("tensor {}: row {r} out of range", src.source_name)))?;
                    out.extend_from_slice(row);
                }
                out
            }
        };
        return Ok(StoredTensor { dtype, dims: out_dims, bytes });
    }
    let mut values = vec![0f32; count];
    (src.decode)(&src.bytes, &mut values)?;
    drop(src);
    if m.transpose {
        let mut t = vec![0f32; count];
        for r in 0..rows {
            for c in 0..cols {
                t[c * rows + r] = values[r * cols + c];
            }
        }
        values = t;
    } else if let Some(order) = order {
        let mut t = Vec::with_capacity(count);
        for r in order {
            t.extend_from_slice(&values[r * cols..(r + 1) * cols]);
        }
        values = t;
    }
    let bytes = dtype_policy::encode(dtype, &values)?;
    Ok(StoredTensor { dtype, dims: out_dims, bytes })
}
