//! Status codes, the per-thread last error, the panic boundary and small pointer helpers shared by
//! every exported function.

use crate::error::Error;
use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};

/// Library version, major part (matches Cargo.toml).
pub const FASTLLM_VERSION_MAJOR: u32 = 0;
/// Library version, minor part.
pub const FASTLLM_VERSION_MINOR: u32 = 1;
/// Library version, patch part.
pub const FASTLLM_VERSION_PATCH: u32 = 0;

/// Result of every fallible call.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastllmStatus {
    /// Success.
    FASTLLM_OK = 0,
    /// A required pointer was NULL.
    FASTLLM_ERR_NULL_ARGUMENT,
    /// An argument was invalid (bad id, bad size, bad UTF-8, bad op arguments, ...).
    FASTLLM_ERR_INVALID_ARGUMENT,
    /// A file could not be read or written.
    FASTLLM_ERR_IO,
    /// A file is malformed.
    FASTLLM_ERR_FORMAT,
    /// Valid but not supported by this build (architecture, dtype, device).
    FASTLLM_ERR_UNSUPPORTED,
    /// An allocation failed.
    FASTLLM_ERR_OUT_OF_MEMORY,
    /// A device failed.
    FASTLLM_ERR_DEVICE,
    /// The session's context is full.
    FASTLLM_ERR_CONTEXT_FULL,
    /// The output buffer is too small; the required size was written to the size output.
    FASTLLM_ERR_BUFFER_TOO_SMALL,
    /// The callback stopped the operation.
    FASTLLM_ERR_CANCELLED,
    /// An internal error (a bug): the library caught a panic.
    FASTLLM_ERR_PANIC,
}

pub use FastllmStatus::*;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// The status for a Rust error.
pub(crate) fn status_of(e: &Error) -> FastllmStatus {
    match e {
        Error::Op { .. } | Error::UnknownOp(_) | Error::InvalidArgument(_) => {
            FASTLLM_ERR_INVALID_ARGUMENT
        }
        Error::Format { .. } => FASTLLM_ERR_FORMAT,
        Error::Io { .. } => FASTLLM_ERR_IO,
        Error::Unsupported(_) => FASTLLM_ERR_UNSUPPORTED,
        Error::Device(_) => FASTLLM_ERR_DEVICE,
        Error::OutOfMemory(_) => FASTLLM_ERR_OUT_OF_MEMORY,
        Error::ContextFull(_) => FASTLLM_ERR_CONTEXT_FULL,
        Error::Cancelled => FASTLLM_ERR_CANCELLED,
    }
}

/// A failure inside an exported function: a status and its message.
pub(crate) struct Fail(pub FastllmStatus, pub String);

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail(status_of(&e), e.to_string())
    }
}

pub(crate) type FfiResult = Result<(), Fail>;

/// Runs `f` inside the panic boundary and turns its outcome into a status (recording the
/// message of a failure as this thread's last error).
pub(crate) fn guard(f: impl FnOnce() -> FfiResult) -> FastllmStatus {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_last_error("");
            FASTLLM_OK
        }
        Ok(Err(Fail(s, m))) => {
            set_last_error(&m);
            s
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("internal error (panic): {msg}"));
            FASTLLM_ERR_PANIC
        }
    }
}

pub(crate) fn null(what: &str) -> Fail {
    Fail(FASTLLM_ERR_NULL_ARGUMENT, format!("{what} is NULL"))
}

pub(crate) fn invalid(msg: impl Into<String>) -> Fail {
    Fail(FASTLLM_ERR_INVALID_ARGUMENT, msg.into())
}

/// A NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(null(what));
    }
    CStr::from_ptr(p)
        .to_str()
        .map_err(|_| invalid(format!("{what} is not valid UTF-8")))
}

/// Copies `bytes` plus a NUL into `buf` (capacity `cap`) with the size protocol: `*len` gets
/// `bytes.len()`; `FASTLLM_ERR_BUFFER_TOO_SMALL` when `cap < len + 1`.
///
/// # Safety
/// `buf` must be NULL or valid for `cap` bytes; `len` must be NULL or valid.
pub(crate) unsafe fn write_string(
    bytes: &[u8],
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> FfiResult {
    if len.is_null() {
        return Err(null("len"));
    }
    if buf.is_null() || cap < bytes.len() + 1 {
        *len = bytes.len();
        return Err(Fail(
            FASTLLM_ERR_BUFFER_TOO_SMALL,
            format!(
                "buffer of {cap} bytes; {} needed (with the NUL)",
                bytes.len() + 1
            ),
        ));
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len());
    *buf.add(bytes.len()) = 0;
    *len = bytes.len();
    Ok(())
}

/// The library version, e.g. "0.1.0". Static; never free it.
#[no_mangle]
pub extern "C" fn fastllm_version() -> *const c_char {
    static V: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    V.as_ptr() as *const c_char
}

/// A static English name for a status code (any integer; unknown codes give "unknown status").
/// Never free it.
#[no_mangle]
pub extern "C" fn fastllm_status_string(s: i32) -> *const c_char {
    const NAMES: [&str; 12] = [
        "ok\0",
        "null argument\0",
        "invalid argument\0",
        "i/o error\0",
        "malformed file\0",
        "unsupported\0",
        "out of memory\0",
        "device error\0",
        "context full\0",
        "buffer too small\0",
        "cancelled\0",
        "internal error\0",
    ];
    let t = usize::try_from(s)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("unknown status\0");
    t.as_ptr() as *const c_char
}

/// This thread's last failure detail ("" after a success). Valid until this thread's next call
/// into the library; never free it.
#[no_mangle]
pub extern "C" fn fastllm_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Frees a string returned by the library (e.g. `fastllm_generate`'s `out_text`). NULL is a no-op.
///
/// # Safety
/// `s` must be NULL or a string returned by this library and not yet freed.
#[no_mangle]
pub unsafe extern "C" fn fastllm_string_free(s: *mut c_char) {
    if !s.is_null() {
        drop(CString::from_raw(s));
    }
}
