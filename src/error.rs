//! The crate's error type: one enum for every failure a user can cause or meet, each variant
//! carrying enough context (op, input, file, shapes) to be read on its own. Converted once into a
//! status code at the C ABI edge (`src/ffi/`).

use std::fmt;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error the runtime reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An op was asked to run with inputs it cannot accept (shape, dtype, missing input).
    #[error("op {op}: {msg}")]
    Op {
        /// The op name, e.g. `"Linear"`.
        op: String,
        /// What was wrong, naming the input and the shapes.
        msg: String,
    },
    /// No registered device knows an op of that name.
    #[error("unknown op '{0}'")]
    UnknownOp(String),
    /// An argument (outside an op) was invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A file is malformed (wrong magic, truncated, bad offsets, checksum mismatch, ...).
    #[error("{path}: {msg}")]
    Format {
        /// The file that was being read.
        path: String,
        /// What is wrong with it.
        msg: String,
    },
    /// An I/O error on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A valid request for something this build does not support (architecture, dtype, device).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A device failed (driver error, missing library, kernel compile error).
    #[error("device error: {0}")]
    Device(String),
    /// An allocation could not be made.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// A sequence would exceed its context length.
    #[error("context full: {0}")]
    ContextFull(String),
    /// The caller stopped the operation.
    #[error("cancelled")]
    Cancelled,
}

impl Error {
    /// An [`Error::Op`] for `op` with a formatted message.
    pub fn op(op: &str, msg: impl fmt::Display) -> Self {
        Error::Op {
            op: op.to_string(),
            msg: msg.to_string(),
        }
    }

    /// An [`Error::Format`] for the file `path`.
    pub fn format(path: impl fmt::Display, msg: impl fmt::Display) -> Self {
        Error::Format {
            path: path.to_string(),
            msg: msg.to_string(),
        }
    }

    /// An [`Error::Io`] for the file `path`.
    pub fn io(path: impl fmt::Display, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_string(),
            source,
        }
    }

    /// An [`Error::InvalidArgument`].
    pub fn invalid(msg: impl fmt::Display) -> Self {
        Error::InvalidArgument(msg.to_string())
    }
}
