//! Positioned reads (`pread`): read `buf.len()` bytes at an absolute file offset without moving
//! a cursor and without mapping the file, so a reader can fetch one tensor and keep nothing else
//! resident. Used by the low-memory `.flm` mode and by the converter's source readers.

use crate::error::{Error, Result};
use std::fs::File;

/// Fills `buf` from `f` at `offset`.
#[cfg(unix)]
pub fn read_exact_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.read_exact_at(buf, offset)
}

/// Fills `buf` from `f` at `offset`.
#[cfg(windows)]
pub fn read_exact_at(f: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match f.seek_read(buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

/// Reads `len` bytes at `offset` of `f` into a new vector; errors name `path` and `what`.
pub fn read_vec(f: &File, path: &str, offset: u64, len: u64, what: &str) -> Result<Vec<u8>> {
    let n = usize::try_from(len).map_err(|_| Error::format(path, format!("{what} too large")))?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(n)
        .map_err(|_| Error::OutOfMemory(format!("{path}: {what} of {n} bytes")))?;
    buf.resize(n, 0);
    read_exact_at(f, &mut buf, offset).map_err(|e| {
        Error::format(
            path,
            format!("cannot read {what} ({n} bytes at {offset}): {e}"),
        )
    })?;
    Ok(buf)
}
