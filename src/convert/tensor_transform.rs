//! Turns one source tensor into its stored form: layout fixes (GPT-2 Conv1D transpose, llama.cpp
//! q/k row un-permutation) and dtype conversion. Rows are moved as bytes when the stored dtype
//! equals the source's, so quantized blocks stay bit-exact; otherwise values go through f32.

use super::dtype_policy;
use super::names::{unpermuted_source_row, Mapped};
use crate::data::DataType;
use crate::error::{Error, Result};

/// Decodes a source tensor's raw bytes into f32 (all elements).
pub type DecodeFn = dyn Fn(&[u8], &mut [f32]) -> Result<()>;

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
    pub decode: &'a DecodeFn,
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
    let Some(heads) = m.unpermute_heads else {
        return Ok(None);
    };
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(Error::invalid(format!(
            "tensor {}: {rows} rows cannot be split into {heads} heads of even size",
            src.source_name
        )));
    }
    Ok(Some(
        (0..rows)
            .map(|r| unpermuted_source_row(r, rows, heads))
            .collect(),
    ))
}

/// The stored rows of `src` (`rb` bytes each, kept as they are) in the order `order` names.
fn stored_rows_in_order(src: &SourceTensor<'_>, rb: usize, order: &[usize]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(src.bytes.len());
    for &r in order {
        let row = src.bytes.get(r * rb..(r + 1) * rb).ok_or_else(|| {
            Error::invalid(format!("tensor {}: row {r} out of range", src.source_name))
        })?;
        out.extend_from_slice(row);
    }
    Ok(out)
}

/// Rows and columns of `src`'s values as `transform` sees them: a 1-D q/k bias is permuted
/// element by element (rows of one value).
fn rows_cols(m: &Mapped, dims: &[usize], source_name: &str) -> Result<(usize, usize)> {
    let count = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| Error::invalid(format!("tensor {source_name}: dims {dims:?} overflow")))?;
    let cols = if dims.len() == 1 && m.unpermute_heads.is_some() {
        1
    } else {
        dims.last().copied().unwrap_or(1)
    };
    Ok((count.checked_div(cols).unwrap_or(0), cols))
}

/// The stored dims of a source tensor of `dims` mapped by `m` (a Conv1D weight is transposed).
pub fn stored_dims(m: &Mapped, dims: &[usize], source_name: &str) -> Result<Vec<usize>> {
    if m.transpose && dims.len() != 2 {
        return Err(Error::invalid(format!(
            "tensor {source_name}: Conv1D weight must be 2-D, got {dims:?}"
        )));
    }
    let (rows, cols) = rows_cols(m, dims, source_name)?;
    Ok(if m.transpose {
        vec![cols, rows]
    } else {
        dims.to_vec()
    })
}

/// Converts `src` (mapped by `m`) to `dtype` (see [`super::dtype_policy::DtypePlan`]).
pub fn transform(m: &Mapped, src: SourceTensor<'_>, dtype: DataType) -> Result<StoredTensor> {
    let out_dims = stored_dims(m, &src.dims, src.source_name)?;
    let (rows, cols) = rows_cols(m, &src.dims, src.source_name)?;
    let count = rows * cols;
    let order = row_order(m, rows, &src)?;
    if Some(dtype) == src.same_as && !m.transpose {
        let bytes = match order {
            None => src.bytes,
            Some(order) => stored_rows_in_order(&src, dtype.row_bytes(cols)?, &order)?,
        };
        return Ok(StoredTensor {
            dtype,
            dims: out_dims,
            bytes,
        });
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
    Ok(StoredTensor {
        dtype,
        dims: out_dims,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::decode_to_f32;

    fn decode_f32(b: &[u8], o: &mut [f32]) -> Result<()> {
        decode_to_f32(DataType::F32, b, o)
    }

    fn f32_src(dims: Vec<usize>, values: &[f32]) -> SourceTensor<'static> {
        SourceTensor {
            source_name: "t",
            dims,
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            same_as: Some(DataType::F32),
            decode: &decode_f32,
        }
    }

    fn values(s: &StoredTensor) -> Vec<f32> {
        s.bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn unpermutes_rows_and_bias_elements() {
        // 2 heads of head_dim 4: HF rows of each head are GGUF rows [0, 2, 1, 3].
        let m = Mapped {
            name: "q.weight".into(),
            transpose: false,
            unpermute_heads: Some(2),
        };
        let w: Vec<f32> = (0..8).flat_map(|r| [r as f32; 32]).collect();
        let out = transform(&m, f32_src(vec![8, 32], &w), DataType::F32).unwrap();
        let rows: Vec<f32> = values(&out).chunks(32).map(|r| r[0]).collect();
        assert_eq!(rows, [0., 2., 1., 3., 4., 6., 5., 7.]);
        let b = Mapped {
            name: "q.bias".into(),
            transpose: false,
            unpermute_heads: Some(2),
        };
        let out = transform(
            &b,
            f32_src(vec![8], &[0., 1., 2., 3., 4., 5., 6., 7.]),
            DataType::F32,
        )
        .unwrap();
        assert_eq!(values(&out), [0., 2., 1., 3., 4., 6., 5., 7.]);
        let odd = Mapped {
            name: "q.weight".into(),
            transpose: false,
            unpermute_heads: Some(3),
        };
        assert!(transform(&odd, f32_src(vec![8, 32], &w), DataType::F32).is_err());
    }

    #[test]
    fn transposes_conv1d() {
        let m = Mapped {
            name: "c_attn.weight".into(),
            transpose: true,
            unpermute_heads: None,
        };
        // [in 2, out 3] → [out 3, in 2]
        let out = transform(
            &m,
            f32_src(vec![2, 3], &[1., 2., 3., 4., 5., 6.]),
            DataType::F32,
        )
        .unwrap();
        assert_eq!(out.dims, [3, 2]);
        assert_eq!(values(&out), [1., 4., 2., 5., 3., 6.]);
    }
}
