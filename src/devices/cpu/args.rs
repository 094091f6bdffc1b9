//! Argument checks shared by the CPU operators: fetching a named tensor with the right dtype as a
//! packed slice, reading non-negative int parameters, row/last-dim splits. Every failure is an
//! `Error::Op` naming the op and the argument.
//!
//! This module only inspects arguments; it must not compute anything.

use crate::data::{Data, DataType};
use crate::device::DataDict;
use crate::error::{Error, Result};
use std::borrow::Cow;

/// True when `name` is absent or has one of `allowed` dtypes (absent arguments are reported by
/// `reshape`, which names them).
pub fn dtype_in(d: &DataDict, name: &str, allowed: &[DataType]) -> bool {
    d.dtype(name).is_none_or(|t| allowed.contains(&t))
}

/// `o`, or an error saying the input `name` of `op` is missing.
pub fn need<'a>(op: &str, name: &str, o: Option<&'a Data>) -> Result<&'a Data> {
    o.ok_or_else(|| Error::op(op, format!("missing input '{name}'")))
}

/// Errors unless `x` has dtype `want`.
pub fn check_dtype(op: &str, name: &str, x: &Data, want: DataType) -> Result<()> {
    if x.dtype() != want {
        return Err(Error::op(
            op,
            format!(
                "'{name}' must be {want}, found {} {:?}",
                x.dtype(),
                x.dims()
            ),
        ));
    }
    Ok(())
}

/// Errors unless `x` is allocated, on the host, and non-empty in rank.
pub fn check_tensor(op: &str, name: &str, x: &Data) -> Result<()> {
    if !x.is_allocated() {
        return Err(Error::op(op, format!("'{name}' has no data")));
    }
    if x.dims().is_empty() {
        return Err(Error::op(op, format!("'{name}' has no dims")));
    }
    Ok(())
}

/// The elements of an F32 tensor (contiguous; expansion on axis 0 is fine).
pub fn f32s<'a>(op: &str, name: &str, x: &'a Data) -> Result<&'a [f32]> {
    check_dtype(op, name, x, DataType::F32)?;
    if !x.is_contiguous() {
        return Err(Error::op(
            op,
            format!(
                "'{name}' {:?} is expanded on an inner axis (capacity {:?})",
                x.dims(),
                x.capacity()
            ),
        ));
    }
    let v = x
        .as_f32()
        .map_err(|e| Error::op(op, format!("'{name}': {e}")))?;
    v.get(..x.count()).ok_or_else(|| {
        Error::op(
            op,
            format!("'{name}' storage is smaller than {:?}", x.dims()),
        )
    })
}

/// The elements of an F32 tensor, mutable.
pub fn f32s_mut<'a>(op: &str, name: &str, x: &'a mut Data) -> Result<&'a mut [f32]> {
    check_dtype(op, name, x, DataType::F32)?;
    if !x.is_contiguous() {
        return Err(Error::op(
            op,
            format!("'{name}' {:?} is expanded on an inner axis", x.dims()),
        ));
    }
    let n = x.count();
    let dims = format!("{:?}", x.dims());
    let v = x
        .as_f32_mut()
        .map_err(|e| Error::op(op, format!("'{name}': {e}")))?;
    v.get_mut(..n)
        .ok_or_else(|| Error::op(op, format!("'{name}' storage is smaller than {dims}")))
}

/// The elements of an I32 tensor.
pub fn i32s<'a>(op: &str, name: &str, x: &'a Data) -> Result<&'a [i32]> {
    check_dtype(op, name, x, DataType::I32)?;
    if !x.is_contiguous() {
        return Err(Error::op(
            op,
            format!("'{name}' {:?} is expanded on an inner axis", x.dims()),
        ));
    }
    let v = x
        .as_i32()
        .map_err(|e| Error::op(op, format!("'{name}': {e}")))?;
    v.get(..x.count()).ok_or_else(|| {
        Error::op(
            op,
            format!("'{name}' storage is smaller than {:?}", x.dims()),
        )
    })
}

/// The packed logical bytes of `x` (borrowed when contiguous).
pub fn packed<'a>(op: &str, name: &str, x: &'a Data) -> Result<Cow<'a, [u8]>> {
    let r = if x.is_contiguous() {
        x.bytes().map(Cow::Borrowed)
    } else {
        x.packed_bytes().map(Cow::Owned)
    };
    r.map_err(|e| Error::op(op, format!("'{name}': {e}")))
}

/// (rows, last dim) of dims: all leading dims flattened.
pub fn rows_last(dims: &[usize]) -> (usize, usize) {
    match dims.split_last() {
        Some((&last, lead)) => (lead.iter().product(), last),
        None => (0, 0),
    }
}

/// The int parameter `v` as a non-negative size, or an error naming `op` and `name`.
pub fn non_neg(op: &str, name: &str, v: i32) -> Result<usize> {
    usize::try_from(v)
        .map_err(|_| Error::op(op, format!("parameter '{name}' must be ≥ 0, got {v}")))
}

/// Bytes per element for the plain (non-block) dtypes the shape ops move.
pub fn elem_size(op: &str, name: &str, x: &Data) -> Result<usize> {
    match x.dtype() {
        DataType::F32 | DataType::I32 => Ok(4),
        DataType::F16 | DataType::BF16 => Ok(2),
        t => Err(Error::op(
            op,
            format!("'{name}' has dtype {t}; only 4- and 2-byte element types are supported"),
        )),
    }
}

/// Errors unless the optional `x` is absent or a 1-D F32 tensor of `n` values.
pub fn check_vec(op: &str, name: &str, x: Option<&Data>, n: usize) -> Result<()> {
    if let Some(x) = x {
        check_dtype(op, name, x, DataType::F32)?;
        if x.dims() != [n] {
            return Err(Error::op(
                op,
                format!("'{name}' must be [{n}], got {:?}", x.dims()),
            ));
        }
    }
    Ok(())
}
