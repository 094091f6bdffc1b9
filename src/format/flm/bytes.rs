//! Little-endian byte encoding helpers shared by the `.flm` reader and writer: a bounds-checked
//! cursor whose every failure is an `Err` naming the file and the section being read, and the
//! matching append functions. Knows nothing about sections or tensors.

use crate::error::{Error, Result};

/// A bounds-checked little-endian reader over one section's bytes.
pub(crate) struct ByteReader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a str,
    what: &'static str,
}

impl<'a> ByteReader<'a> {
    /// A reader over `bytes` of the section `what` in file `path` (both used in messages).
    pub(crate) fn new(bytes: &'a [u8], path: &'a str, what: &'static str) -> Self {
        ByteReader {
            bytes,
            pos: 0,
            path,
            what,
        }
    }

    /// An error naming the file, the section and the offset.
    pub(crate) fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::format(
            self.path,
            format!("{} section at byte {}: {msg}", self.what, self.pos),
        )
    }

    /// Bytes not consumed yet.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = self
                    .bytes
                    .get(self.pos..end)
                    .ok_or_else(|| self.err("truncated"))?;
                self.pos = end;
                Ok(s)
            }
            None => Err(self.err(format!(
                "truncated: {n} more bytes needed, {} left",
                self.remaining()
            ))),
        }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    /// A byte.
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    /// A little-endian u16.
    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// A little-endian u32.
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A little-endian u64.
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A little-endian i64.
    pub(crate) fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A little-endian f32.
    pub(crate) fn f32(&mut self) -> Result<f32> {
        Ok(f32::from_le_bytes(self.array()?))
    }

    /// A little-endian f64.
    pub(crate) fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.array()?))
    }

    /// An unsigned LEB128 value (at most 10 bytes).
    pub(crate) fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            let part = (b & 0x7f) as u64;
            if i == 9 && part > 1 {
                return Err(self.err("varint overflows 64 bits"));
            }
            v |= part << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }

    /// A count of items that each take at least `min_item_bytes`: refused when the rest of the
    /// section cannot hold that many (so a corrupt count cannot trigger a huge allocation).
    pub(crate) fn count(&mut self, what: &str, min_item_bytes: usize) -> Result<usize> {
        let n = self.varint()?;
        let max = (self.remaining() / min_item_bytes.max(1)) as u64;
        if n > max {
            return Err(self.err(format!("{what} count {n} exceeds the section")));
        }
        Ok(n as usize)
    }

    /// `varint length` + raw bytes.
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.varint()?;
        let n = usize::try_from(n).map_err(|_| self.err("length overflows"))?;
        self.take(n)
    }

    /// `varint length` + UTF-8.
    pub(crate) fn str(&mut self) -> Result<String> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err("string is not valid UTF-8"))
    }
}

/// Appends a little-endian u32.
pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a little-endian u64.
pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends an unsigned LEB128 value.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// Appends `varint length` + bytes.
pub(crate) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}
