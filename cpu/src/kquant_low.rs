//! The low-bit K-quant weight blocks, bit-compatible with GGUF's `Q2_K` and `Q3_K`: the byte
//! layouts, the scalar dequantization every fast kernel is tested against, and a plain
//! round-to-nearest quantizer (test data and `encode`; it does not search scales).
//!
//! A super-block covers 256 consecutive values of one row (`crate::kquant::QK_K`), in 16 groups
//! of 16 (group `g` = values `16g..16g+16`). Both types store 2 low bits per value in a 64-byte
//! `qs`: value `e` (half `h = e / 128`, `i = e % 128`) is `qs[32h + i % 32] >> (2·(i / 32)) & 3`,
//! so each 32-value activation block `a = e / 32` reads one 2-bit plane of 32 consecutive bytes.
//! - `Q2_K` (84 bytes): `scales: [u8; 16]`, `qs: [u8; 64]`, `d: f16`, `dmin: f16`. Group `g` has
//!   scale `d·(scales[g] & 15)` and min `dmin·(scales[g] >> 4)`; value = `d·sc·q − dmin·m`.
//! - `Q3_K` (110 bytes): `hmask: [u8; 32]`, `qs: [u8; 64]`, `scales: [u8; 12]`, `d: f16`. The
//!   third bit of value `e` is bit `e / 32` of `hmask[e % 32]`; with it the 3-bit `q` (0..=7) is
//!   stored with offset 4. Group `g` has a 6-bit scale (offset 32): its low 4 bits are nibble
//!   `g / 8` of `scales[g % 8]`, its high 2 bits bits `2·(g / 4)..` of `scales[8 + g % 4]`;
//!   value = `d·(sc − 32)·(q − 4)`.
//!
//! This module owns the byte layout only; it must not know about tensors or devices.

use crate::kquant::{round_signed, signed_group_scales, QK_K};
use crate::quant::{rd_f16, wr_f16};
use half::f16;

/// Bytes of one Q2_K super-block.
pub const Q2_K_BYTES: usize = 84;
/// Bytes of one Q3_K super-block.
pub const Q3_K_BYTES: usize = 110;

/// The 2 low bits (0..=3) of element `e` from a 64-byte `qs` plane set.
#[inline]
pub fn low2(qs: &[u8], e: usize) -> u8 {
    let (h, i) = (e / 128, e % 128);
    (qs[32 * h + i % 32] >> (2 * (i / 32))) & 3
}

/// Sets the 2 low bits of element `e` (on a zeroed `qs`).
fn set_low2(qs: &mut [u8], e: usize, q: u8) {
    let (h, i) = (e / 128, e % 128);
    qs[32 * h + i % 32] |= (q & 3) << (2 * (i / 32));
}

/// The 2-bit value (0..=3) of element `e` of a Q2_K super-block.
#[inline]
pub fn q2_k_value(b: &[u8], e: usize) -> u8 {
    low2(&b[16..80], e)
}

/// The 3-bit value (0..=7, offset 4) of element `e` of a Q3_K super-block.
#[inline]
pub fn q3_k_value(b: &[u8], e: usize) -> u8 {
    low2(&b[32..96], e) | (((b[e % 32] >> (e / 32)) & 1) << 2)
}

/// The 16 signed group scales (`sc − 32`, in −32..=31) of a Q3_K super-block from its 12 packed
/// bytes (unpacked four groups per 32-bit word).
#[inline]
pub fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, t) = (w(0), w(1), w(2));
    let (m4, m2) = (0x0f0f_0f0f, 0x0303_0303);
    let words = [
        (a0 & m4) | ((t & m2) << 4),
        (a1 & m4) | (((t >> 2) & m2) << 4),
        ((a0 >> 4) & m4) | (((t >> 4) & m2) << 4),
        ((a1 >> 4) & m4) | (((t >> 6) & m2) << 4),
    ];
    std::array::from_fn(|g| (words[g / 4] >> (8 * (g % 4))) as u8 as i8 - 32)
}

/// Packs 16 signed group scales (each in −32..=31) into the 12 bytes [`q3_k_scales`] reads.
fn pack_q3_k_scales(sc: &[i8; 16], s: &mut [u8]) {
    s[..12].fill(0);
    for (g, &v) in sc.iter().enumerate() {
        let u = (v as i32 + 32) as u8;
        s[g % 8] |= (u & 15) << (4 * (g / 8));
        s[8 + g % 4] |= (u >> 4) << (2 * (g / 4));
    }
}

/// Dequantizes `Q2_K` super-blocks: `dst.len()` must be `256 * src.len() / 84`.
pub fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q2_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (rd_f16(b, 80), rd_f16(b, 82));
        for (g, out) in y.chunks_exact_mut(16).enumerate() {
            let s = d * (b[g] & 15) as f32;
            let m = dmin * (b[g] >> 4) as f32;
            for (l, o) in out.iter_mut().enumerate() {
                *o = s * q2_k_value(b, 16 * g + l) as f32 - m;
            }
        }
    }
}

/// Dequantizes `Q3_K` super-blocks: `dst.len()` must be `256 * src.len() / 110`.
pub fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q3_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 108);
        let sc = q3_k_scales(&b[96..108]);
        for (g, out) in y.chunks_exact_mut(16).enumerate() {
            let s = d * sc[g] as f32;
            for (l, o) in out.iter_mut().enumerate() {
                *o = s * (q3_k_value(b, 16 * g + l) as i32 - 4) as f32;
            }
        }
    }
}

/// Round-to-nearest `Q2_K`: per group of 16 the range `[min(0, lo), hi]` is split in 3 steps;
/// scales and mins are rounded to 4 bits of the super-block's `d`/`dmin`.
/// `src.len()` must be a multiple of 256; `dst.len()` must be `src.len() / 256 * 84`.
pub fn quantize_q2_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q2_K_BYTES)) {
        let mut scale = [0f32; 16];
        let mut min = [0f32; 16];
        for (g, xs) in x.chunks_exact(16).enumerate() {
            let lo = xs.iter().cloned().fold(0f32, f32::min);
            let hi = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            scale[g] = (hi - lo).max(0.0) / 3.0;
            min[g] = -lo;
        }
        let d = f16::from_f32(scale.iter().cloned().fold(0f32, f32::max) / 15.0).to_f32();
        let dmin = f16::from_f32(min.iter().cloned().fold(0f32, f32::max) / 15.0).to_f32();
        let q4 = |v: f32, u: f32| {
            if u > 0.0 {
                (v / u).round().clamp(0.0, 15.0) as u8
            } else {
                0
            }
        };
        b.fill(0);
        for g in 0..16 {
            b[g] = q4(scale[g], d) | (q4(min[g], dmin) << 4);
        }
        wr_f16(b, 80, d);
        wr_f16(b, 82, dmin);
        for (e, &v) in x.iter().enumerate() {
            let g = e / 16;
            let s = d * (b[g] & 15) as f32;
            let m = dmin * (b[g] >> 4) as f32;
            let q = if s > 0.0 {
                ((v + m) / s).round().clamp(0.0, 3.0) as u8
            } else {
                0
            };
            set_low2(&mut b[16..80], e, q);
        }
    }
}

/// Round-to-nearest `Q3_K`: per group of 16 the value of largest magnitude maps to −4; the
/// group scales are rounded to 6 signed bits of the super-block's `d`.
/// `src.len()` must be a multiple of 256; `dst.len()` must be `src.len() / 256 * 110`.
pub fn quantize_q3_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q3_K_BYTES)) {
        let (d, sc) = signed_group_scales(x, 4.0, 32.0, -32.0..=31.0);
        b.fill(0);
        pack_q3_k_scales(&sc, &mut b[96..108]);
        wr_f16(b, 108, d);
        for (e, &v) in x.iter().enumerate() {
            let q = round_signed(v, d * sc[e / 16] as f32, 4);
            let q = (q + 4) as u8;
            set_low2(&mut b[32..96], e, q);
            b[e % 32] |= (q >> 2) << (e / 32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kquant::tests::roundtrip;

    #[test]
    fn q2_k_roundtrip() {
        roundtrip(quantize_q2_k, dequantize_q2_k, Q2_K_BYTES, 1.7);
    }

    #[test]
    fn q3_k_roundtrip() {
        roundtrip(quantize_q3_k, dequantize_q3_k, Q3_K_BYTES, 1.6);
    }

    #[test]
    fn q3_k_scales_read_back() {
        let sc: [i8; 16] = std::array::from_fn(|g| (g as i8 * 5 % 64) - 32);
        let mut s = [0u8; 12];
        pack_q3_k_scales(&sc, &mut s);
        assert_eq!(q3_k_scales(&s), sc);
    }

    /// Single bits placed by hand land on the elements the GGUF layout says.
    #[test]
    fn bit_positions_follow_the_gguf_layout() {
        // Q2_K: element 128 + 64 + 5 (half 1, plane 2, byte 5) is in qs[32 + 5] bits 4..6
        let mut b = [0u8; Q2_K_BYTES];
        b[16 + 32 + 5] = 0b11 << 4;
        b[12] = 0x21; // group 12 (values 192..208): scale 1, min 2
        b[80..82].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[82..84].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        let mut y = [0f32; QK_K];
        dequantize_q2_k(&b, &mut y);
        assert_eq!(y[197], 0.5 * 3.0 - 0.5);
        assert_eq!(y[196], -0.5);
        assert_eq!(y[0], 0.0);
        // Q3_K: element 100 (plane 3 of half 0, byte 4) with its high bit (bit 3 of hmask[4])
        let mut b = [0u8; Q3_K_BYTES];
        b[32 + 4] = 0b10 << 6;
        b[4] = 1 << 3;
        let mut sc = [0i8; 16];
        sc[6] = -3; // group 6 = values 96..112
        pack_q3_k_scales(&sc, &mut b[96..108]);
        b[108..110].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        let mut y = [0f32; QK_K];
        dequantize_q3_k(&b, &mut y);
        assert_eq!(y[100], 2.0 * -3.0 * (6 - 4) as f32);
        assert_eq!(y[101], 2.0 * -3.0 * -4.0);
    }
}
