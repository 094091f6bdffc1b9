//! Typed reads of the `{arch}.*` metadata of a GGUF file for the config readers: a required key
//! that is missing or of another type is an error naming the key and the file.

use crate::error::{Error, Result};
use crate::format::gguf::GgufFile;

/// The `{arch}.*` keys of one GGUF file.
pub(super) struct GgufKeys<'a> {
    /// The file.
    pub g: &'a GgufFile,
    arch: &'a str,
}

impl<'a> GgufKeys<'a> {
    /// The keys of architecture `arch` in `g`.
    pub fn new(g: &'a GgufFile, arch: &'a str) -> Self {
        GgufKeys { g, arch }
    }

    /// The architecture.
    pub fn arch(&self) -> &str {
        self.arch
    }

    /// The full name of key `s`: `{arch}.{s}`.
    pub fn key(&self, s: &str) -> String {
        format!("{}.{s}", self.arch)
    }

    /// The integer at `{arch}.{s}`, when present and an integer.
    pub fn u64(&self, s: &str) -> Option<u64> {
        self.g.get_u64(&self.key(s))
    }

    /// The number at `{arch}.{s}`, when present and a number.
    pub fn f64(&self, s: &str) -> Option<f64> {
        self.g.get_f64(&self.key(s))
    }

    /// The size at `{arch}.{s}`, `default` when absent.
    pub fn size_or(&self, s: &str, default: usize) -> usize {
        self.u64(s).map_or(default, |v| v as usize)
    }

    /// The required size at `{arch}.{s}`.
    pub fn size(&self, s: &str) -> Result<usize> {
        self.u64(s)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| self.error(format!("missing or invalid metadata {}", self.key(s))))
    }

    /// The required size at `{arch}.{s}`, which must not be 0.
    pub fn positive(&self, s: &str) -> Result<usize> {
        self.u64(s)
            .and_then(|v| usize::try_from(v).ok())
            .filter(|&v| v > 0)
            .ok_or_else(|| self.error(format!("metadata {} is missing, invalid or 0", self.key(s))))
    }

    /// A format error about this file saying `msg`.
    pub fn error(&self, msg: impl std::fmt::Display) -> Error {
        Error::format(&self.g.path, msg)
    }
}
