//! The fixed part of a `.flm` file: magic, version, endianness marker, section table and header
//! checksum (see `docs/flm-format.md`). Encodes and validates the header only; section contents
//! belong to the other `flm` modules.

use super::bytes::{put_u32, put_u64, ByteReader};
use crate::error::{Error, Result};

/// The 8-byte magic at offset 0.
pub const MAGIC: [u8; 8] = *b"FLM\0\r\n\x1a\n";
/// Format major version written; readers refuse any other major.
pub const VERSION_MAJOR: u16 = 1;
/// Format minor version written; readers accept newer minors.
pub const VERSION_MINOR: u16 = 0;
/// Endianness marker, stored little-endian.
pub const ENDIAN_MARKER: u32 = 0x0102_0304;
/// Alignment of the tensor-data section and of every tensor.
pub const ALIGN: u64 = 64;
/// Bytes of the fixed header before the section table.
pub(crate) const FIXED: usize = 32;
/// Bytes per section-table entry.
pub(crate) const ENTRY: usize = 32;
/// Most sections a header may declare.
pub(crate) const MAX_SECTIONS: u32 = 64;

/// Section kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum SectionKind {
    /// Typed key/values.
    Metadata = 1,
    /// The tokenizer spec.
    Tokenizer = 2,
    /// The tensor index.
    TensorIndex = 3,
    /// Tensor bytes.
    TensorData = 4,
}

/// One section-table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section {
    /// Kind code (unknown kinds are kept and ignored).
    pub kind: u32,
    /// Absolute offset.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
    /// crc32 of the bytes (0 for tensor data).
    pub crc32: u32,
}

/// The decoded header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Major version.
    pub major: u16,
    /// Minor version.
    pub minor: u16,
    /// Declared file size.
    pub file_size: u64,
    /// Section table.
    pub sections: Vec<Section>,
}

impl Header {
    /// Total header bytes for `n` sections (including the trailing crc).
    pub(crate) fn size_for(n: usize) -> usize {
        FIXED + ENTRY * n + 4
    }

    /// Encodes the header (with its crc).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::size_for(self.sections.len()));
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.major.to_le_bytes());
        out.extend_from_slice(&self.minor.to_le_bytes());
        put_u32(&mut out, ENDIAN_MARKER);
        put_u64(&mut out, self.file_size);
        put_u32(&mut out, self.sections.len() as u32);
        put_u32(&mut out, 0);
        for s in &self.sections {
            put_u32(&mut out, s.kind);
            put_u32(&mut out, 0);
            put_u64(&mut out, s.offset);
            put_u64(&mut out, s.length);
            put_u32(&mut out, s.crc32);
            put_u32(&mut out, 0);
        }
        let crc = crc32fast::hash(&out);
        put_u32(&mut out, crc);
        out
    }

    /// Decodes the first 32 bytes; returns the section count to read next.
    pub(crate) fn decode_fixed(path: &str, b: &[u8], actual_size: u64) -> Result<u32> {
        let truncated = || {
            Error::format(
                path,
                format!("truncated: {} bytes, not a .flm file", b.len()),
            )
        };
        match b.get(..8) {
            None => return Err(truncated()),
            Some(m) if m != MAGIC => {
                return Err(Error::format(path, "not a .flm file (wrong magic)"))
            }
            Some(_) => {}
        }
        let mut r = ByteReader::new(b.get(8..).unwrap_or(&[]), path, "header");
        let (major, minor) = match (r.u16(), r.u16()) {
            (Ok(a), Ok(b)) => (a, b),
            _ => return Err(truncated()),
        };
        if major != VERSION_MAJOR {
            return Err(Error::format(
                path,
                format!(
                    "unsupported .flm version {major}.{minor}: this reader understands {VERSION_MAJOR}.x (convert the model again or update fastllm)"
                ),
            ));
        }
        if b.len() < FIXED {
            return Err(truncated());
        }
        let marker = r.u32()?;
        if marker != ENDIAN_MARKER {
            return Err(Error::format(
                path,
                format!("bad endianness marker {marker:#010x}"),
            ));
        }
        let size = r.u64()?;
        if size != actual_size {
            return Err(Error::format(
                path,
                format!("truncated or padded: header says {size} bytes, file has {actual_size}"),
            ));
        }
        let n = r.u32()?;
        if n == 0 || n > MAX_SECTIONS {
            return Err(Error::format(path, format!("bad section count {n}")));
        }
        Ok(n)
    }

    /// Decodes the whole header from `b` (which must hold at least `size_for(n)` bytes).
    pub(crate) fn decode(path: &str, b: &[u8], actual_size: u64) -> Result<Header> {
        let n = Self::decode_fixed(path, b, actual_size)? as usize;
        let total = Self::size_for(n);
        let body = b
            .get(..total - 4)
            .ok_or_else(|| Error::format(path, "truncated in the section table"))?;
        let mut r = ByteReader::new(b.get(total - 4..total).unwrap_or(&[]), path, "header");
        let crc = r.u32()?;
        if crc32fast::hash(body) != crc {
            return Err(Error::format(
                path,
                "header checksum mismatch (file corrupt)",
            ));
        }
        let mut r = ByteReader::new(body, path, "header");
        r.take(8)?;
        let major = r.u16()?;
        let minor = r.u16()?;
        r.u32()?;
        let file_size = r.u64()?;
        r.u32()?;
        r.u32()?;
        let mut sections = Vec::with_capacity(n);
        for _ in 0..n {
            let kind = r.u32()?;
            r.u32()?;
            let offset = r.u64()?;
            let length = r.u64()?;
            let crc32 = r.u32()?;
            r.u32()?;
            let end = offset.checked_add(length);
            if offset < total as u64 || end.is_none_or(|e| e > file_size) {
                return Err(Error::format(
                    path,
                    format!("section kind {kind}: bytes {offset}+{length} lie outside the file ({file_size} bytes)"),
                ));
            }
            sections.push(Section {
                kind,
                offset,
                length,
                crc32,
            });
        }
        Ok(Header {
            major,
            minor,
            file_size,
            sections,
        })
    }

    /// The single section of `kind`; `Err` when missing or repeated.
    pub(crate) fn section(&self, path: &str, kind: SectionKind) -> Result<Section> {
        let mut it = self.sections.iter().filter(|s| s.kind == kind as u32);
        match (it.next(), it.next()) {
            (Some(s), None) => Ok(*s),
            (None, _) => Err(Error::format(path, format!("missing {kind:?} section"))),
            _ => Err(Error::format(
                path,
                format!("{kind:?} section appears more than once"),
            )),
        }
    }
}

/// Rounds `v` up to a multiple of [`ALIGN`].
pub(crate) fn align_up(v: u64) -> u64 {
    v.div_ceil(ALIGN) * ALIGN
}
