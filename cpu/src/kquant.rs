//! K-quant weight blocks, bit-compatible with GGUF's `Q4_K`, `Q5_K` and `Q6_K`: the byte layouts,
//! the scalar dequantization every fast kernel is tested against, and a plain round-to-nearest
//! quantizer (test data and `encode`; it does not search scales).
//!
//! A super-block covers 256 consecutive values of one row ([`QK_K`]):
//! - `Q4_K` (144 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]` (eight 6-bit scales and eight
//!   6-bit mins, packed, see [`scales_mins`]), `qs: [u8; 128]`. Sub-block `j` (values
//!   `32j..32j+32`) has scale `d·sc[j]` and min `dmin·m[j]`; value = `d·sc[j]·q − dmin·m[j]`. Its
//!   4-bit `q` are the low nibbles of `qs[32·(j/2)..][..32]` for even `j`, the high nibbles for odd `j`.
//! - `Q5_K` (176 bytes): as `Q4_K` with `qh: [u8; 32]` between `scales` and `qs`: bit `j` of
//!   `qh[l]` is the fifth bit (value 16) of element `l` of sub-block `j`.
//! - `Q6_K` (210 bytes): `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d: f16`. Value
//!   `e` has scale `d·scales[e/16]` and a 6-bit `q` stored with offset 32; value = `d·sc·(q − 32)`.
//!   In half `h` (values `128h..128h+128`, bytes `ql[64h..]`, `qh[32h..]`), for `l < 32`: value
//!   `l` is `ql[l] & 15 | (qh[l] & 3) << 4`, `l + 32` is `ql[l+32] & 15 | (qh[l] >> 2 & 3) << 4`,
//!   `l + 64` is `ql[l] >> 4 | (qh[l] >> 4 & 3) << 4`, `l + 96` is `ql[l+32] >> 4 | (qh[l] >> 6) << 4`.
//!
//! This module owns the byte layout only; it must not know about tensors or devices.

use crate::quant::{rd_f16, wr_f16};
use half::f16;

/// Values per super-block.
pub const QK_K: usize = 256;
/// Bytes of one Q4_K super-block.
pub const Q4_K_BYTES: usize = 144;
/// Bytes of one Q5_K super-block.
pub const Q5_K_BYTES: usize = 176;
/// Bytes of one Q6_K super-block.
pub const Q6_K_BYTES: usize = 210;

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K/Q5_K super-block from its 12 packed
/// bytes, each as 8 bytes of a little-endian `u64` (byte `j` = sub-block `j`). Packing: for
/// `j < 4` `sc[j]`, `m[j]` are the low 6 bits of bytes `j` and `4 + j`; for `j ≥ 4` their low 4
/// bits are the low/high nibble of byte `4 + j` and their high 2 bits the top bits of bytes
/// `j − 4` and `j`.
#[inline]
pub fn scales_mins(q: &[u8]) -> (u64, u64) {
    let w = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (a, b, c) = (w(0), w(1), w(2));
    let sc_lo = a & 0x3f3f_3f3f;
    let m_lo = b & 0x3f3f_3f3f;
    let sc_hi = (c & 0x0f0f_0f0f) | (((a >> 6) & 0x0303_0303) << 4);
    let m_hi = ((c >> 4) & 0x0f0f_0f0f) | (((b >> 6) & 0x0303_0303) << 4);
    (
        sc_lo as u64 | (sc_hi as u64) << 32,
        m_lo as u64 | (m_hi as u64) << 32,
    )
}

/// Packs eight 6-bit scales and mins (each `< 64`) into the 12 bytes [`scales_mins`] reads.
fn pack_scales_mins(sc: &[u8; 8], m: &[u8; 8], q: &mut [u8]) {
    for j in 0..4 {
        q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
}

/// Dequantizes `Q4_K` super-blocks: `dst.len()` must be `256 * src.len() / 144`.
pub fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        q45_k_block(b, None, &b[16..144], y);
    }
}

/// Dequantizes `Q5_K` super-blocks: `dst.len()` must be `256 * src.len() / 176`.
pub fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        q45_k_block(b, Some(&b[16..48]), &b[48..176], y);
    }
}

/// One Q4_K (`qh = None`) or Q5_K super-block.
fn q45_k_block(b: &[u8], qh: Option<&[u8]>, qs: &[u8], y: &mut [f32]) {
    let (d, dmin) = (rd_f16(b, 0), rd_f16(b, 2));
    let (sc, m) = scales_mins(&b[4..16]);
    for (j, out) in y.chunks_exact_mut(32).enumerate() {
        let s = d * ((sc >> (8 * j)) & 0xff) as f32;
        let mn = dmin * ((m >> (8 * j)) & 0xff) as f32;
        let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
        for (l, o) in out.iter_mut().enumerate() {
            let lo = if j % 2 == 0 { q[l] & 0xF } else { q[l] >> 4 };
            let hi = qh.map_or(0, |h| ((h[l] >> j) & 1) << 4);
            *o = s * (lo | hi) as f32 - mn;
        }
    }
}

/// The 6-bit value (0..=63, offset 32) of element `e` of a Q6_K super-block.
#[inline]
pub fn q6_k_value(b: &[u8], e: usize) -> u8 {
    let (h, i) = (e / 128, e % 128);
    let (ql, qh) = (&b[64 * h..64 * h + 64], &b[128 + 32 * h..128 + 32 * h + 32]);
    let l = i % 32;
    let low = match i / 32 {
        0 => ql[l] & 0xF,
        1 => ql[l + 32] & 0xF,
        2 => ql[l] >> 4,
        _ => ql[l + 32] >> 4,
    };
    low | (((qh[l] >> (2 * (i / 32))) & 3) << 4)
}

/// Dequantizes `Q6_K` super-blocks: `dst.len()` must be `256 * src.len() / 210`.
pub fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q6_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 208);
        for (e, o) in y.iter_mut().enumerate() {
            let sc = b[192 + e / 16] as i8 as f32;
            *o = d * sc * (q6_k_value(b, e) as i32 - 32) as f32;
        }
    }
}

/// Round-to-nearest `Q4_K`: per sub-block of 32 the range `[min(0, lo), hi]` is split in 15
/// steps; scales and mins are rounded to 6 bits of the super-block's `d`/`dmin`.
/// `src.len()` must be a multiple of 256; `dst.len()` must be `src.len() / 256 * 144`.
pub fn quantize_q4_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q4_K_BYTES)) {
        let q = quantize_q45_block(x, 15, b);
        b[16..144].fill(0);
        for (e, &v) in q.iter().enumerate() {
            let (j, l) = (e / 32, e % 32);
            b[16 + 32 * (j / 2) + l] |= (v & 0xF) << (4 * (j % 2));
        }
    }
}

/// Round-to-nearest `Q5_K` (as [`quantize_q4_k`] with 31 steps).
pub fn quantize_q5_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q5_K_BYTES)) {
        let q = quantize_q45_block(x, 31, b);
        b[16..176].fill(0);
        for (e, &v) in q.iter().enumerate() {
            let (j, l) = (e / 32, e % 32);
            b[48 + 32 * (j / 2) + l] |= (v & 0xF) << (4 * (j % 2));
            b[16 + l] |= (v >> 4) << j;
        }
    }
}

/// Writes `d`, `dmin` and the packed scales of one Q4_K/Q5_K super-block; returns its values
/// (`0..=levels`).
fn quantize_q45_block(x: &[f32], levels: u8, b: &mut [u8]) -> [u8; QK_K] {
    let mut scale = [0f32; 8];
    let mut min = [0f32; 8];
    for (j, xs) in x.chunks_exact(32).enumerate() {
        let lo = xs.iter().cloned().fold(0f32, f32::min);
        let hi = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        scale[j] = (hi - lo).max(0.0) / levels as f32;
        min[j] = -lo;
    }
    let smax = scale.iter().cloned().fold(0f32, f32::max);
    let mmax = min.iter().cloned().fold(0f32, f32::max);
    let d = f16::from_f32(smax / 63.0).to_f32();
    let dmin = f16::from_f32(mmax / 63.0).to_f32();
    let q6 = |v: f32, u: f32| {
        if u > 0.0 {
            (v / u).round().clamp(0.0, 63.0) as u8
        } else {
            0
        }
    };
    let sc: [u8; 8] = std::array::from_fn(|j| q6(scale[j], d));
    let m: [u8; 8] = std::array::from_fn(|j| q6(min[j], dmin));
    wr_f16(b, 0, d);
    wr_f16(b, 2, dmin);
    pack_scales_mins(&sc, &m, &mut b[4..16]);
    let mut out = [0u8; QK_K];
    for (e, o) in out.iter_mut().enumerate() {
        let j = e / 32;
        let s = d * sc[j] as f32;
        let v = x[e] + dmin * m[j] as f32;
        *o = if s > 0.0 {
            (v / s).round().clamp(0.0, levels as f32) as u8
        } else {
            0
        };
    }
    out
}

/// Round-to-nearest `Q6_K`: per group of 16 the value of largest magnitude maps to −32; the
/// group scales are rounded to i8 of the super-block's `d`.
/// `src.len()` must be a multiple of 256; `dst.len()` must be `src.len() / 256 * 210`.
pub fn quantize_q6_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q6_K_BYTES)) {
        let (d, sc) = signed_group_scales(x, 32.0, 127.0, -128.0..=127.0);
        b.fill(0);
        wr_f16(b, 208, d);
        for (g, &c) in sc.iter().enumerate() {
            b[192 + g] = c as u8;
        }
        for (e, &v) in x.iter().enumerate() {
            let q = round_signed(v, d * sc[e / 16] as f32, 32);
            let q = (q + 32) as u8;
            let (h, i) = (e / 128, e % 128);
            let l = i % 32;
            let (lo_at, shift) = match i / 32 {
                0 => (l, 0),
                1 => (l + 32, 0),
                2 => (l, 4),
                _ => (l + 32, 4),
            };
            b[64 * h + lo_at] |= (q & 0xF) << shift;
            b[128 + 32 * h + l] |= (q >> 4) << (2 * (i / 32));
        }
    }
}

/// The signed group scales of one super-block `x` (groups of 16): in each group the value of
/// largest magnitude maps to `-half`; the super-block's `d` (f16-rounded) is the largest group
/// scale over `d_levels`, and each group scale is rounded to an integer of `range` times `d`.
pub(crate) fn signed_group_scales(
    x: &[f32],
    half: f32,
    d_levels: f32,
    range: std::ops::RangeInclusive<f32>,
) -> (f32, [i8; 16]) {
    let mut scale = [0f32; 16];
    for (g, xs) in x.chunks_exact(16).enumerate() {
        let big = xs
            .iter()
            .cloned()
            .fold(0f32, |a, v| if v.abs() > a.abs() { v } else { a });
        scale[g] = big / -half;
    }
    let amax = scale.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = f16::from_f32(amax / d_levels).to_f32();
    let sc = std::array::from_fn(|g| {
        if d > 0.0 {
            (scale[g] / d).round().clamp(*range.start(), *range.end()) as i8
        } else {
            0
        }
    });
    (d, sc)
}

/// `v / s` rounded to an integer of `-half..half` (0 when the scale `s` is 0).
pub(crate) fn round_signed(v: f32, s: f32, half: i32) -> i32 {
    if s != 0.0 {
        (v / s).round().clamp(-half as f32, (half - 1) as f32) as i32
    } else {
        0
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `crate::quant`'s round trip over 512 values (two super-blocks of `bytes` bytes).
    pub(crate) fn roundtrip(
        q: fn(&[f32], &mut [u8]),
        dq: fn(&[u8], &mut [f32]),
        bytes: usize,
        tol: f32,
    ) {
        crate::quant::tests::roundtrip_n(q, dq, 512, 2 * bytes, tol);
    }

    #[test]
    fn q4_k_roundtrip() {
        roundtrip(quantize_q4_k, dequantize_q4_k, Q4_K_BYTES, 0.4);
    }
    #[test]
    fn q5_k_roundtrip() {
        roundtrip(quantize_q5_k, dequantize_q5_k, Q5_K_BYTES, 0.2);
    }
    #[test]
    fn q6_k_roundtrip() {
        roundtrip(quantize_q6_k, dequantize_q6_k, Q6_K_BYTES, 0.1);
    }

    #[test]
    fn packed_scales_read_back() {
        let sc = [1, 63, 17, 32, 48, 5, 60, 33];
        let m = [0, 62, 16, 31, 49, 6, 61, 34];
        let mut q = [0u8; 12];
        pack_scales_mins(&sc, &m, &mut q);
        let (s, n) = scales_mins(&q);
        assert_eq!(s.to_le_bytes(), sc);
        assert_eq!(n.to_le_bytes(), m);
    }
}
