//! MXFP4 weight blocks (the OCP microscaling FP4 format), bit-compatible with GGUF's `MXFP4`
//! (ggml type 39), and their scalar routines: dequantize, quantize, the repacking of Hugging Face
//! GPT-OSS `*_blocks` / `*_scales` pairs into blocks, and the exact widening to bf16.
//!
//! A block covers 32 consecutive values of one row in 17 bytes: `e: u8` (an E8M0 exponent),
//! then `qs: [u8; 16]`; element `j < 16` is the low nibble of `qs[j]`, element `j + 16` the high
//! nibble. A nibble is an E2M1 number (sign, 2-bit exponent, 1-bit mantissa: ±{0, 0.5, 1, 1.5,
//! 2, 3, 4, 6}); value = `E2M1_X2[q] · 2^(e − 128)` with [`E2M1_X2`] the doubled E2M1 values
//! (small integers), i.e. `e2m1(q) · 2^(e − 127)`. Exponents 0 and 1 give the subnormal f32
//! scales `2^-128` and `2^-127` (as ggml does); exponent 255 is NaN in the OCP format
//! ([`check_blocks`] finds it; the decoders read it as `2^127`, as ggml does).
//!
//! This module owns the byte layout only; it must not know about tensors or devices.

use crate::quant::QK;

/// Bytes of one MXFP4 block.
pub const MXFP4_BYTES: usize = 17;

/// The E2M1 values of the 16 nibbles, doubled (exact small integers; the int8 kernels' table).
pub const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Largest exponent byte whose values all fit bf16 (`12 · 2^(e − 128)` ≤ bf16's maximum).
pub const BF16_MAX_EXPONENT: u8 = 252;

/// `2^(e − 128)`: the scale of the doubled values [`E2M1_X2`] for exponent byte `e`.
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e as u32 - 1) << 23
    })
}

/// The E8M0 exponent byte that encodes NaN (OCP MX); a block with it has no values.
pub const NAN_EXPONENT: u8 = 0xFF;

/// Checks that no block of `src` has the NaN exponent; `Err` names the first that has.
pub fn check_blocks(src: &[u8]) -> Result<(), String> {
    match src
        .chunks_exact(MXFP4_BYTES)
        .position(|b| b[0] == NAN_EXPONENT)
    {
        Some(i) => Err(format!(
            "MXFP4 block {i} has the NaN exponent byte 0xFF (a corrupt tensor)"
        )),
        None => Ok(()),
    }
}

/// The nibble (E2M1 code) of element `j` of a block.
#[inline]
pub fn mxfp4_nibble(blk: &[u8], j: usize) -> u8 {
    let q = blk[1 + j % 16];
    if j < 16 {
        q & 15
    } else {
        q >> 4
    }
}

/// Dequantizes MXFP4 blocks: `dst.len()` must be `32 * src.len() / 17`.
pub fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    for (blk, out) in src.chunks_exact(MXFP4_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = e8m0_half(blk[0]);
        for (j, o) in out.iter_mut().enumerate() {
            *o = E2M1_X2[mxfp4_nibble(blk, j) as usize] as f32 * d;
        }
    }
}

/// The nibble whose value (`E2M1_X2 · d`) is nearest to `x` (ties to the smaller magnitude).
fn nearest(x: f32, inv_d: f32) -> u8 {
    let t = x * inv_d;
    let mut best = (0u8, f32::INFINITY);
    for (q, &v) in E2M1_X2.iter().enumerate() {
        let err = (t - v as f32).abs();
        if err < best.1 {
            best = (q as u8, err);
        }
    }
    best.0
}

/// Quantizes to MXFP4: the shared scale is the smallest power of two `X` with `amax ≤ 6·X`
/// (`⌈log₂(amax / 6)⌉`, clamped to the E8M0 range), so no value is clipped (the OCP rule
/// `⌊log₂ amax⌋ − 2` clips values between `6·X` and `8·X` to `6·X`); each value rounds to the
/// nearest E2M1 number. `src.len()` must be a multiple of 32; `dst.len()` must be
/// `src.len() / 32 * 17`. Non-finite inputs quantize as zero.
pub fn quantize_mxfp4(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(MXFP4_BYTES)) {
        let amax = x
            .iter()
            .filter(|v| v.is_finite())
            .fold(0f32, |m, v| m.max(v.abs()));
        // value = e2m1 · 2^(e − 127), so e − 127 = ⌈log₂(amax / 6)⌉
        let e = if amax > 0.0 {
            ((amax / 6.0).log2().ceil() as i32 + 127).clamp(0, 254) as u8
        } else {
            0
        };
        let inv_d = 1.0 / e8m0_half(e);
        blk[0] = e;
        for j in 0..16 {
            let q = |v: f32| if v.is_finite() { nearest(v, inv_d) } else { 0 };
            blk[1 + j] = q(x[j]) | (q(x[j + 16]) << 4);
        }
    }
}

/// Repacks Hugging Face MXFP4 groups into blocks: `blocks` holds 16 bytes per group of 32
/// values (element `2i` in the low nibble of byte `i`, element `2i + 1` in its high nibble),
/// `scales` one E8M0 byte per group (value = `e2m1 · 2^(scale − 127)`, the same exponent as a
/// block's). `dst.len()` must be `scales.len() * 17` and `blocks.len()` `scales.len() * 16`.
pub fn mxfp4_from_hf(blocks: &[u8], scales: &[u8], dst: &mut [u8]) {
    for ((b, &s), blk) in blocks
        .chunks_exact(16)
        .zip(scales)
        .zip(dst.chunks_exact_mut(MXFP4_BYTES))
    {
        blk.fill(0);
        blk[0] = s;
        for m in 0..QK {
            let nib = if m % 2 == 0 {
                b[m / 2] & 15
            } else {
                b[m / 2] >> 4
            };
            blk[1 + m % 16] |= nib << (4 * (m / 16));
        }
    }
}

/// Widens MXFP4 blocks to bf16 bit patterns, exactly (every MXFP4 value of an exponent up to
/// [`BF16_MAX_EXPONENT`] is a bf16 number). `dst.len()` must be `32 * src.len() / 17`. `Err`
/// names the first block whose exponent is larger.
pub fn mxfp4_to_bf16(src: &[u8], dst: &mut [u16]) -> Result<(), String> {
    for (i, (blk, out)) in src
        .chunks_exact(MXFP4_BYTES)
        .zip(dst.chunks_exact_mut(QK))
        .enumerate()
    {
        if blk[0] > BF16_MAX_EXPONENT {
            return Err(format!(
                "MXFP4 block {i} has exponent byte {} (values up to 2^{}), beyond bf16's range",
                blk[0],
                blk[0] as i32 - 125
            ));
        }
        let d = e8m0_half(blk[0]);
        for (j, o) in out.iter_mut().enumerate() {
            // exact in f32, and exactly representable in bf16: the top 16 bits are the value
            let v = E2M1_X2[mxfp4_nibble(blk, j) as usize] as f32 * d;
            *o = (v.to_bits() >> 16) as u16;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_are_powers_of_two() {
        for e in 0..=255u8 {
            let want = 2f64.powi(e as i32 - 128);
            assert_eq!(e8m0_half(e) as f64, want, "e = {e}");
        }
    }

    #[test]
    fn roundtrip_within_half_a_step() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0)
            .collect();
        let mut b = vec![0u8; 3 * MXFP4_BYTES];
        quantize_mxfp4(&x, &mut b);
        let mut y = vec![0f32; 96];
        dequantize_mxfp4(&b, &mut y);
        for (blk, (xs, ys)) in b
            .chunks_exact(MXFP4_BYTES)
            .zip(x.chunks_exact(32).zip(y.chunks_exact(32)))
        {
            // the coarsest E2M1 step is 2 (between 4 and 6) in units of 2^(e − 127)
            let step = 2.0 * 2f32.powi(blk[0] as i32 - 127);
            for (a, b) in xs.iter().zip(ys) {
                assert!((a - b).abs() <= step / 2.0 + 1e-6, "{a} vs {b}");
            }
        }
        // values already on the grid come back exactly
        let mut again = vec![0u8; b.len()];
        quantize_mxfp4(&y, &mut again);
        assert_eq!(again, b);
    }

    #[test]
    fn hf_groups_repack_to_the_same_values() {
        let scales = [120u8, 127, 131];
        let blocks: Vec<u8> = (0..48).map(|i| (i * 73 + 11) as u8).collect();
        let mut blk = vec![0u8; 3 * MXFP4_BYTES];
        mxfp4_from_hf(&blocks, &scales, &mut blk);
        let mut got = vec![0f32; 96];
        dequantize_mxfp4(&blk, &mut got);
        let lut = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        for (g, &s) in scales.iter().enumerate() {
            for m in 0..32 {
                let byte = blocks[g * 16 + m / 2];
                let nib = if m % 2 == 0 { byte & 15 } else { byte >> 4 };
                let want = lut[nib as usize] * 2f32.powi(s as i32 - 127);
                assert_eq!(got[g * 32 + m], want, "group {g} element {m}");
            }
        }
    }

    #[test]
    fn bf16_widening_is_exact_and_refuses_huge_exponents() {
        let mut blk = vec![0u8; 2 * MXFP4_BYTES];
        for (i, b) in blk.iter_mut().enumerate() {
            *b = (i * 151 + 7) as u8;
        }
        blk[0] = 0;
        blk[MXFP4_BYTES] = BF16_MAX_EXPONENT;
        let mut f = vec![0f32; 64];
        dequantize_mxfp4(&blk, &mut f);
        let mut h = vec![0u16; 64];
        mxfp4_to_bf16(&blk, &mut h).unwrap();
        for (a, b) in f.iter().zip(&h) {
            assert_eq!(f32::from_bits((*b as u32) << 16), *a);
        }
        blk[MXFP4_BYTES] = BF16_MAX_EXPONENT + 1;
        let e = mxfp4_to_bf16(&blk, &mut h).unwrap_err();
        assert!(e.contains("block 1") && e.contains("bf16"), "{e}");
    }
}
