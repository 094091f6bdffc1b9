//! Length-prefixed frames over a byte stream, and the little-endian encoder/decoder that the
//! messages between the processes of a group (rendezvous, steps, all-reduces) are written with.
//!
//! A frame is a `u64` byte count followed by that many bytes. Integers are little-endian;
//! vectors and strings carry a `u64` element count first.

use crate::error::{Error, Result};
use std::io::{self, Read, Write};

/// The largest frame accepted (a longer length prefix means a corrupt or foreign stream).
pub const MAX_FRAME: u64 = 16 << 30;

/// Writes `body` as one frame.
pub fn write_frame(w: &mut impl Write, body: &[u8]) -> io::Result<()> {
    w.write_all(&(body.len() as u64).to_le_bytes())?;
    w.write_all(body)?;
    w.flush()
}

/// Reads one frame. A clean end of stream before the frame starts is `UnexpectedEof`.
pub fn read_frame(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes (not a fastllm group stream?)"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    Ok(body)
}

/// Builds a message body.
#[derive(Default)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    /// An empty body.
    pub fn new() -> Self {
        Self::default()
    }
    /// The bytes written so far.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    /// A `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `usize`, as a `u64`.
    pub fn usize(&mut self, v: usize) -> &mut Self {
        self.u64(v as u64)
    }
    /// Raw bytes with their count.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.usize(v.len());
        self.buf.extend_from_slice(v);
        self
    }
    /// A UTF-8 string.
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
    /// A vector of `u32`.
    pub fn u32s(&mut self, v: &[u32]) -> &mut Self {
        self.usize(v.len());
        v.iter()
            .for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
        self
    }
    /// A vector of `i32`.
    pub fn i32s(&mut self, v: &[i32]) -> &mut Self {
        self.usize(v.len());
        v.iter()
            .for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
        self
    }
    /// A vector of `f32`.
    pub fn f32s(&mut self, v: &[f32]) -> &mut Self {
        self.usize(v.len());
        self.buf.reserve(v.len() * 4);
        v.iter()
            .for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
        self
    }
}

/// Reads a message body written by [`Encoder`]; running past its end is an error.
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn truncated() -> Error {
    Error::Device("group message: truncated or malformed".into())
}

impl<'a> Decoder<'a> {
    /// Reads `buf` from its start.
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or_else(truncated)?;
        let s = self.buf.get(self.pos..end).ok_or_else(truncated)?;
        self.pos = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        self.take(N)?.try_into().map_err(|_| truncated())
    }
    /// One byte.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    /// A `u64`.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A `usize` (written as a `u64`).
    pub fn usize(&mut self) -> Result<usize> {
        usize::try_from(self.u64()?).map_err(|_| truncated())
    }
    /// An element count whose elements take `size` bytes each, checked against what is left.
    fn count(&mut self, size: usize) -> Result<usize> {
        let n = self.usize()?;
        if n.saturating_mul(size) > self.buf.len() - self.pos {
            return Err(truncated());
        }
        Ok(n)
    }
    /// Raw bytes.
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.count(1)?;
        self.take(n)
    }
    /// A UTF-8 string.
    pub fn str(&mut self) -> Result<String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| truncated())
    }
    /// A vector of `u32`.
    pub fn u32s(&mut self) -> Result<Vec<u32>> {
        let n = self.count(4)?;
        (0..n)
            .map(|_| Ok(u32::from_le_bytes(self.array()?)))
            .collect()
    }
    /// A vector of `i32`.
    pub fn i32s(&mut self) -> Result<Vec<i32>> {
        let n = self.count(4)?;
        (0..n)
            .map(|_| Ok(i32::from_le_bytes(self.array()?)))
            .collect()
    }
    /// A vector of `f32`.
    pub fn f32s(&mut self) -> Result<Vec<f32>> {
        let n = self.count(4)?;
        let raw = self.take(n * 4)?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    /// Whether every byte was read.
    pub fn at_end(&self) -> bool {
        self.pos == self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_field_kind() {
        let mut e = Encoder::new();
        e.u8(7)
            .u64(1 << 40)
            .str("rank één")
            .u32s(&[1, 2, u32::MAX])
            .i32s(&[-1, 0, 5])
            .f32s(&[1.5, -0.0, f32::MAX])
            .bytes(&[9, 8]);
        let body = e.finish();
        let mut frame = Vec::new();
        write_frame(&mut frame, &body).unwrap();
        let got = read_frame(&mut frame.as_slice()).unwrap();
        let mut d = Decoder::new(&got);
        assert_eq!(d.u8().unwrap(), 7);
        assert_eq!(d.u64().unwrap(), 1 << 40);
        assert_eq!(d.str().unwrap(), "rank één");
        assert_eq!(d.u32s().unwrap(), vec![1, 2, u32::MAX]);
        assert_eq!(d.i32s().unwrap(), vec![-1, 0, 5]);
        let f = d.f32s().unwrap();
        assert_eq!(f[0], 1.5);
        assert!(f[1].is_sign_negative());
        assert_eq!(d.bytes().unwrap(), &[9, 8]);
        assert!(d.at_end());
    }

    #[test]
    fn refuses_truncated_and_oversized_input() {
        let mut e = Encoder::new();
        e.u32s(&[1, 2, 3]);
        let body = e.finish();
        assert!(Decoder::new(&body[..body.len() - 1]).u32s().is_err());
        // a count far larger than the bytes that follow
        let mut bad = Encoder::new();
        bad.u64(u64::MAX / 2);
        assert!(Decoder::new(&bad.finish()).f32s().is_err());
        let huge = (MAX_FRAME + 1).to_le_bytes();
        assert!(read_frame(&mut huge.as_slice()).is_err());
        assert!(read_frame(&mut [1u8, 0, 0].as_slice()).is_err());
    }
}
