//! Quantized weight block formats, bit-compatible with GGUF's Q8_0, Q4_0, Q4_1 and Q5_0, and their
//! plain scalar quantize/dequantize routines (the reference every fast kernel is tested against).
//!
//! A block covers 32 consecutive values of one row:
//! - `Q8_0` (34 bytes): `d: f16`, `qs: [i8; 32]`; value = `d * q`.
//! - `Q4_0` (18 bytes): `d: f16`, `qs: [u8; 16]`; element `j < 16` is the low nibble of `qs[j]`,
//!   element `j + 16` the high nibble; value = `d * (q - 8)`.
//! - `Q4_1` (20 bytes): `d: f16`, `m: f16`, `qs: [u8; 16]` (same nibble order); value = `d * q + m`.
//! - `Q5_0` (22 bytes): `d: f16`, `qh: u32` (bit `j` is the fifth bit, value 16, of element `j`),
//!   `qs: [u8; 16]` (same nibble order); value = `d * (q - 16)`.
//!
//! This module owns the byte layout only; it must not know about tensors or devices.

use half::f16;

/// Values per quantization block.
pub const QK: usize = 32;
/// Bytes of one Q8_0 block.
pub const Q8_0_BYTES: usize = 34;
/// Bytes of one Q4_0 block.
pub const Q4_0_BYTES: usize = 18;
/// Bytes of one Q4_1 block.
pub const Q4_1_BYTES: usize = 20;
/// Bytes of one Q5_0 block.
pub const Q5_0_BYTES: usize = 22;

/// The little-endian f16 at byte `at` of `b`, widened (the scales of every block format).
#[inline]
pub(crate) fn rd_f16(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Writes `v` rounded to f16, little-endian, at byte `at` of `b`.
#[inline]
pub(crate) fn wr_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// Dequantizes `Q8_0` blocks: `dst.len()` must be `32 * src.len() / 34`.
pub fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    for (blk, out) in src.chunks_exact(Q8_0_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = rd_f16(blk, 0);
        for (o, &q) in out.iter_mut().zip(&blk[2..34]) {
            *o = d * (q as i8) as f32;
        }
    }
}

/// Dequantizes `Q4_0` blocks: `dst.len()` must be `32 * src.len() / 18`.
pub fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (blk, out) in src.chunks_exact(Q4_0_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = rd_f16(blk, 0);
        for j in 0..16 {
            let b = blk[2 + j];
            out[j] = d * ((b & 15) as i32 - 8) as f32;
            out[j + 16] = d * ((b >> 4) as i32 - 8) as f32;
        }
    }
}

/// Dequantizes `Q4_1` blocks: `dst.len()` must be `32 * src.len() / 20`.
pub fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (blk, out) in src.chunks_exact(Q4_1_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = rd_f16(blk, 0);
        let m = rd_f16(blk, 2);
        for j in 0..16 {
            let b = blk[4 + j];
            out[j] = d * (b & 15) as f32 + m;
            out[j + 16] = d * (b >> 4) as f32 + m;
        }
    }
}

/// The 5-bit value (0..=31, offset 16) of element `j` of a Q5_0 block.
#[inline]
pub fn q5_0_value(blk: &[u8], j: usize) -> u8 {
    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
    let q = blk[6 + j % 16];
    let low = if j < 16 { q & 15 } else { q >> 4 };
    low | ((((qh >> j) & 1) as u8) << 4)
}

/// Dequantizes `Q5_0` blocks: `dst.len()` must be `32 * src.len() / 22`.
pub fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (blk, out) in src.chunks_exact(Q5_0_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = rd_f16(blk, 0);
        for (j, o) in out.iter_mut().enumerate() {
            *o = d * (q5_0_value(blk, j) as i32 - 16) as f32;
        }
    }
}

/// The value of largest magnitude in `x`, with its sign (the first of equal magnitudes; 0 when
/// all are 0).
fn signed_amax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// Quantizes to `Q5_0` (ggml's reference rounding: the signed value of largest magnitude maps
/// to -16).
pub fn quantize_q5_0(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q5_0_BYTES)) {
        let max = signed_amax(x);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(blk, 0, d);
        let mut qh = 0u32;
        for j in 0..16 {
            let q0 = ((x[j] * id + 16.5) as i32).clamp(0, 31) as u32;
            let q1 = ((x[j + 16] * id + 16.5) as i32).clamp(0, 31) as u32;
            blk[6 + j] = ((q0 & 15) | ((q1 & 15) << 4)) as u8;
            qh |= ((q0 >> 4) << j) | ((q1 >> 4) << (j + 16));
        }
        blk[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Quantizes to `Q8_0` (same rounding as ggml's reference: `d = amax / 127`, round to nearest).
/// `src.len()` must be a multiple of 32; `dst.len()` must be `src.len() / 32 * 34`.
pub fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(blk, 0, d);
        for (o, &v) in blk[2..34].iter_mut().zip(x) {
            *o = ((v * id).round() as i32).clamp(-128, 127) as i8 as u8;
        }
    }
}

/// Quantizes to `Q4_0` (ggml's reference rounding: the signed value of largest magnitude maps to -8).
pub fn quantize_q4_0(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q4_0_BYTES)) {
        let max = signed_amax(x);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(blk, 0, d);
        for j in 0..16 {
            let q0 = ((x[j] * id + 8.5) as i32).clamp(0, 15) as u8;
            let q1 = ((x[j + 16] * id + 8.5) as i32).clamp(0, 15) as u8;
            blk[2 + j] = q0 | (q1 << 4);
        }
    }
}

/// Quantizes to `Q4_1` (ggml's reference: `d = (max - min) / 15`, `m = min`).
pub fn quantize_q4_1(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q4_1_BYTES)) {
        let min = x.iter().cloned().fold(f32::INFINITY, f32::min);
        let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(blk, 0, d);
        wr_f16(blk, 2, min);
        for j in 0..16 {
            let q0 = (((x[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            let q1 = (((x[j + 16] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            blk[4 + j] = q0 | (q1 << 4);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Quantizes a fixed `n`-value ramp with `q` into `bytes` bytes, dequantizes with `dq`, and
    /// checks every value comes back within `tol`.
    pub(crate) fn roundtrip_n(
        q: fn(&[f32], &mut [u8]),
        dq: fn(&[u8], &mut [f32]),
        n: usize,
        bytes: usize,
        tol: f32,
    ) {
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0 + (i / 64) as f32 * 0.3)
            .collect();
        let mut b = vec![0u8; bytes];
        q(&x, &mut b);
        let mut y = vec![0f32; n];
        dq(&b, &mut y);
        for (i, (a, b)) in x.iter().zip(&y).enumerate() {
            assert!((a - b).abs() <= tol, "{i}: {a} vs {b}");
        }
    }

    /// [`roundtrip_n`] over 96 values (three blocks of `bytes` bytes).
    fn roundtrip(q: fn(&[f32], &mut [u8]), dq: fn(&[u8], &mut [f32]), bytes: usize, tol: f32) {
        roundtrip_n(q, dq, 96, 3 * bytes, tol);
    }

    #[test]
    fn q8_0_roundtrip() {
        roundtrip(quantize_q8_0, dequantize_q8_0, Q8_0_BYTES, 0.02);
    }
    #[test]
    fn q4_0_roundtrip() {
        roundtrip(quantize_q4_0, dequantize_q4_0, Q4_0_BYTES, 0.5);
    }
    #[test]
    fn q5_0_roundtrip() {
        roundtrip(quantize_q5_0, dequantize_q5_0, Q5_0_BYTES, 0.25);
    }
    #[test]
    fn q4_1_roundtrip() {
        roundtrip(quantize_q4_1, dequantize_q4_1, Q4_1_BYTES, 0.3);
    }
}
