//! Tensors and ops through the C ABI, for custom models built from other languages: create,
//! inspect and read `Data`, run any op by name on a process-wide CPU executor, and read its
//! profiler table.

use super::status::*;
use crate::data::{Data, DataType};
use crate::device::{DataDict, FloatDict, IntDict};
use crate::executor::Executor;
use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

/// Dtype codes (numbered like fastllm's `DataType`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastllmDtype {
    /// float32
    FASTLLM_DTYPE_F32 = 0,
    /// bfloat16
    FASTLLM_DTYPE_BF16 = 1,
    /// int8 blocks of 32 with an f16 scale (GGUF Q8_0)
    FASTLLM_DTYPE_INT8 = 3,
    /// int4 blocks of 32 with an f16 scale (GGUF Q4_0)
    FASTLLM_DTYPE_INT4 = 4,
    /// float16
    FASTLLM_DTYPE_F16 = 7,
    /// int4 blocks of 32 with f16 scale and min (GGUF Q4_1)
    FASTLLM_DTYPE_INT4_MIN = 8,
    /// int32
    FASTLLM_DTYPE_INT32 = 13,
}

/// Opaque tensor handle.
pub struct FastllmData {
    pub(crate) data: Data,
}

fn executor() -> Result<&'static Executor, Fail> {
    static E: OnceLock<Option<Executor>> = OnceLock::new();
    E.get_or_init(|| {
        let e = Executor::cpu(0).ok()?;
        e.profiler().set_enabled(true);
        Some(e)
    })
    .as_ref()
    .ok_or_else(|| Fail(FASTLLM_ERR_DEVICE, "cannot start the CPU device".into()))
}

/// Creates a host tensor of `dtype` (a `FastllmDtype` code) and `ndims` dims, copying `nbytes`
/// bytes from `bytes` (which must be exactly the tensor's size), or zero-filled when `bytes` is
/// NULL and `nbytes` is 0.
///
/// # Safety
/// `dims` valid for `ndims` values; `bytes` NULL or valid for `nbytes`; `out` valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_data_new(
    dtype: u32,
    dims: *const i64,
    ndims: usize,
    bytes: *const c_void,
    nbytes: usize,
    out: *mut *mut FastllmData,
) -> FastllmStatus {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let dt = DataType::from_code(dtype)
            .ok_or_else(|| invalid(format!("unknown dtype code {dtype}")))?;
        if ndims > 8 {
            return Err(invalid(format!("{ndims} dims (at most 8)")));
        }
        if ndims > 0 && dims.is_null() {
            return Err(null("dims"));
        }
        let mut d = Vec::with_capacity(ndims);
        for i in 0..ndims {
            let v = *dims.add(i);
            d.push(usize::try_from(v).map_err(|_| invalid(format!("dim {i} is {v}")))?);
        }
        let data = if bytes.is_null() {
            if nbytes != 0 {
                return Err(null("bytes"));
            }
            Data::zeros(dt, &d)?
        } else {
            Data::from_bytes(
                dt,
                &d,
                std::slice::from_raw_parts(bytes as *const u8, nbytes),
            )?
        };
        *out = Box::into_raw(Box::new(FastllmData { data }));
        Ok(())
    })
}

/// Frees a tensor. NULL is a no-op.
///
/// # Safety
/// `d` NULL or a handle from this library not yet freed.
#[no_mangle]
pub unsafe extern "C" fn fastllm_data_free(d: *mut FastllmData) {
    if !d.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(Box::from_raw(d))));
    }
}

/// Writes the dims to `dims` (capacity `cap`) and their count to `*ndims`; size protocol as
/// elsewhere (`FASTLLM_ERR_BUFFER_TOO_SMALL` with `*ndims` set).
///
/// # Safety
/// Pointers NULL or valid; `dims` valid for `cap` values.
#[no_mangle]
pub unsafe extern "C" fn fastllm_data_shape(
    d: *const FastllmData,
    dims: *mut i64,
    cap: usize,
    ndims: *mut usize,
) -> FastllmStatus {
    guard(|| {
        let d = d.as_ref().ok_or_else(|| null("data"))?;
        if ndims.is_null() {
            return Err(null("ndims"));
        }
        let ds = d.data.dims();
        *ndims = ds.len();
        if dims.is_null() || cap < ds.len() {
            return Err(Fail(
                FASTLLM_ERR_BUFFER_TOO_SMALL,
                format!("room for {cap} dims; {} needed", ds.len()),
            ));
        }
        for (i, &v) in ds.iter().enumerate() {
            *dims.add(i) = v as i64;
        }
        Ok(())
    })
}

/// Copies the tensor's bytes (packed, row-major) into `bytes` (capacity `cap`); `*nbytes` gets the
/// size; size protocol as elsewhere.
///
/// # Safety
/// Pointers NULL or valid; `bytes` valid for `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn fastllm_data_read(
    d: *const FastllmData,
    bytes: *mut c_void,
    cap: usize,
    nbytes: *mut usize,
) -> FastllmStatus {
    guard(|| {
        let d = d.as_ref().ok_or_else(|| null("data"))?;
        if nbytes.is_null() {
            return Err(null("nbytes"));
        }
        let b = d.data.packed_bytes()?;
        *nbytes = b.len();
        if bytes.is_null() || cap < b.len() {
            return Err(Fail(
                FASTLLM_ERR_BUFFER_TOO_SMALL,
                format!("room for {cap} bytes; {} needed", b.len()),
            ));
        }
        std::ptr::copy_nonoverlapping(b.as_ptr(), bytes as *mut u8, b.len());
        Ok(())
    })
}

/// Runs op `op` (see docs/ops.md) with `n` named tensors (each may be read or written; the same
/// tensor may not appear twice), `n_floats` named floats and `n_ints` named ints, on the
/// process-wide CPU executor. Output tensors are resized by the op.
///
/// # Safety
/// Arrays valid for their counts; names NUL-terminated; handles valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_op_run(
    op: *const c_char,
    names: *const *const c_char,
    datas: *const *mut FastllmData,
    n: usize,
    float_names: *const *const c_char,
    floats: *const f32,
    n_floats: usize,
    int_names: *const *const c_char,
    ints: *const i32,
    n_ints: usize,
) -> FastllmStatus {
    guard(|| {
        let op = c_str(op, "op")?;
        if n > 0 && (names.is_null() || datas.is_null()) {
            return Err(null("names/datas"));
        }
        if n_floats > 0 && (float_names.is_null() || floats.is_null()) {
            return Err(null("float_names/floats"));
        }
        if n_ints > 0 && (int_names.is_null() || ints.is_null()) {
            return Err(null("int_names/ints"));
        }
        let mut ptrs: Vec<*mut FastllmData> = Vec::with_capacity(n);
        let mut dict = DataDict::new();
        for i in 0..n {
            let name = c_str(*names.add(i), "a tensor name")?;
            let p = *datas.add(i);
            if p.is_null() {
                return Err(null(&format!("tensor '{name}'")));
            }
            if ptrs.contains(&p) {
                return Err(invalid(format!("tensor '{name}' is passed twice")));
            }
            ptrs.push(p);
            dict.insert_mut(name, &mut (*p).data);
        }
        let mut fl = FloatDict::new();
        for i in 0..n_floats {
            fl.insert(c_str(*float_names.add(i), "a float name")?, *floats.add(i));
        }
        let mut il = IntDict::new();
        for i in 0..n_ints {
            il.insert(c_str(*int_names.add(i), "an int name")?, *ints.add(i));
        }
        executor()?.run(op, &mut dict, &fl, &il)?;
        Ok(())
    })
}

/// The op profiler table of `fastllm_op_run` calls (op, calls, total ms, µs/call) as text;
/// size protocol as elsewhere.
///
/// # Safety
/// `buf` valid for `cap` bytes; `len` valid.
#[no_mangle]
pub unsafe extern "C" fn fastllm_profiler_report(
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> FastllmStatus {
    guard(|| {
        let r = executor()?.profiler().report();
        write_string(r.as_bytes(), buf, cap, len)
    })
}
