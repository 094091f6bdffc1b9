//! Dequantizes GGUF tensor bytes of any type the converter accepts into f32: the types `Data`
//! shares with GGUF (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4)
//! through `crate::data::decode_to_f32`, and Q5_1 here (ggml's reference algorithm). Other GGUF types
//! are refused by name.

use crate::data::{decode_to_f32, DataType};
use crate::error::{Error, Result};
use crate::format::gguf::ggml_type;
use half::f16;

/// The `Data` dtype whose blocks are bit-identical to ggml type `t`, if any.
pub fn shared_dtype(t: u32) -> Option<DataType> {
    Some(match t {
        ggml_type::F32 => DataType::F32,
        ggml_type::F16 => DataType::F16,
        ggml_type::BF16 => DataType::BF16,
        ggml_type::Q8_0 => DataType::Q8_0,
        ggml_type::Q4_0 => DataType::Q4_0,
        ggml_type::Q4_1 => DataType::Q4_1,
        ggml_type::Q5_0 => DataType::Q5_0,
        ggml_type::Q4_K => DataType::Q4K,
        ggml_type::Q5_K => DataType::Q5K,
        ggml_type::Q6_K => DataType::Q6K,
        ggml_type::Q2_K => DataType::Q2K,
        ggml_type::Q3_K => DataType::Q3K,
        ggml_type::MXFP4 => DataType::Mxfp4,
        _ => return None,
    })
}

/// True for ggml types this module can dequantize.
pub fn supported(t: u32) -> bool {
    shared_dtype(t).is_some() || t == ggml_type::Q5_1
}

fn h(b: &[u8], at: usize) -> f32 {
    match b.get(at..at + 2) {
        Some(s) => f16::from_le_bytes([s[0], s[1]]).to_f32(),
        None => 0.0,
    }
}

/// Dequantizes `src` (ggml type `t`) into `dst` (whose length is the element count).
pub fn dequantize(t: u32, src: &[u8], dst: &mut [f32]) -> Result<()> {
    if let Some(dt) = shared_dtype(t) {
        return decode_to_f32(dt, src, dst);
    }
    let (name, block_elems, block_bytes) =
        ggml_type::info(t).ok_or_else(|| Error::Unsupported(format!("ggml tensor type {t}")))?;
    if !dst.len().is_multiple_of(block_elems) || src.len() != dst.len() / block_elems * block_bytes
    {
        return Err(Error::invalid(format!(
            "{name}: {} bytes cannot hold {} elements",
            src.len(),
            dst.len()
        )));
    }
    let blocks = src
        .chunks_exact(block_bytes)
        .zip(dst.chunks_exact_mut(block_elems));
    match t {
        ggml_type::Q5_1 => blocks.for_each(|(b, y)| q5_1_block(b, y)),
        _ => {
            return Err(Error::Unsupported(format!(
                "ggml tensor type {name} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4)"
            )))
        }
    }
    Ok(())
}

/// One Q5_1 block (f16 d, f16 m, u32 high bits, 16 bytes of nibbles; value·d + m).
fn q5_1_block(b: &[u8], y: &mut [f32]) {
    let (d, m) = (h(b, 0), h(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    let bias = 0;
    for j in 0..16 {
        let xh0 = (((qh >> j) << 4) & 0x10) as i32;
        let xh1 = ((qh >> (j + 12)) & 0x10) as i32;
        let x0 = ((qs[j] & 0x0F) as i32 | xh0) - bias;
        let x1 = ((qs[j] >> 4) as i32 | xh1) - bias;
        y[j] = x0 as f32 * d + m;
        y[j + 16] = x1 as f32 * d + m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16b(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    #[test]
    fn q5_0_hand_block() {
        // d = 0.5; element 0: low nibble 3, high bit 1 → (3 | 16) - 16 = 3 → 1.5
        // element 16: high nibble 15, high bit (bit 16) 0 → 15 - 16 = -1 → -0.5
        let mut b = vec![0u8; 22];
        b[..2].copy_from_slice(&f16b(0.5));
        b[2..6].copy_from_slice(&1u32.to_le_bytes());
        b[6] = 0xF3;
        let mut y = [0f32; 32];
        dequantize(ggml_type::Q5_0, &b, &mut y).unwrap();
        assert_eq!(y[0], 1.5);
        assert_eq!(y[16], -0.5);
        assert_eq!(y[1], -8.0); // 0 - 16 = -16 → -8
    }

    #[test]
    fn q5_1_hand_block() {
        // d = 2, m = -1; element 17: high nibble 4, high bit (bit 17 → qh>>(1+12) & 0x10) set → 20
        let mut b = vec![0u8; 24];
        b[..2].copy_from_slice(&f16b(2.0));
        b[2..4].copy_from_slice(&f16b(-1.0));
        b[4..8].copy_from_slice(&(1u32 << 17).to_le_bytes());
        b[8 + 1] = 0x40;
        let mut y = [0f32; 32];
        dequantize(ggml_type::Q5_1, &b, &mut y).unwrap();
        assert_eq!(y[17], 20.0 * 2.0 - 1.0);
        assert_eq!(y[1], -1.0);
        assert_eq!(y[0], -1.0);
    }

    #[test]
    fn q4_k_hand_block() {
        // d = 1, dmin = 0.5. Sub-block 0: scale 3, min 2 (scales[0] = 3, scales[4] = 2).
        // Sub-block 5 (j = 5 ≥ 4): scale = (scales[9] & 0xF) | (scales[1] >> 6) << 4,
        //                         min = (scales[9] >> 4) | (scales[5] >> 6) << 4.
        let mut b = vec![0u8; 144];
        b[..2].copy_from_slice(&f16b(1.0));
        b[2..4].copy_from_slice(&f16b(0.5));
        b[4] = 3;
        b[4 + 4] = 2;
        b[4 + 9] = 0x21; // scale low 1, min low 2
        b[4 + 1] = 0x40; // scale high bits 1 → scale 1 | 16 = 17
        b[4 + 5] = 0x80; // min high bits 2 → min 2 | 32 = 34
        b[16] = 0x07; // sub-block 0 element 0 = 7; sub-block 1 element 0 = 0
        b[16 + 64] = 0x50; // chunk 2 (sub-blocks 4,5) element 0: low 0, high 5
        let mut y = [0f32; 256];
        dequantize(ggml_type::Q4_K, &b, &mut y).unwrap();
        assert_eq!(y[0], 1.0 * 3.0 * 7.0 - 0.5 * 2.0);
        assert_eq!(y[1], -1.0);
        // element 160 = sub-block 5, l = 0: 17 * 5 - 0.5 * 34
        assert_eq!(y[160], 17.0 * 5.0 - 17.0);
    }

    #[test]
    fn q6_k_hand_block() {
        // d = 0.25; scales[0] = 2, scales[2] = -3, scales[8+6] = 1.
        let mut b = vec![0u8; 210];
        b[208..210].copy_from_slice(&f16b(0.25));
        b[192] = 2;
        b[192 + 2] = (-3i8) as u8;
        b[192 + 8 + 6] = 1;
        b[0] = 0x05; // y[0] low 5
        b[128] = 0b0000_1110; // qh[0]: bits0-1 = 2 → y[0] = 5 | 32 = 37 - 32 = 5; bits2-3 = 3 → y[32] high 3
        b[32] = 0x01; // y[32] low 1 → 1 | 48 = 49 - 32 = 17
                      // second half, y[128 + 96 + 0]: ql[64 + 32] >> 4, qh[128 + 32] >> 6, scale sc[8 + 6]
        b[64 + 32] = 0xA0; // 10
        b[128 + 32] = 0xC0; // high 3 → 10 | 48 = 58 - 32 = 26
        let mut y = [0f32; 256];
        dequantize(ggml_type::Q6_K, &b, &mut y).unwrap();
        assert_eq!(y[0], 0.25 * 2.0 * 5.0);
        assert_eq!(y[32], 0.25 * -3.0 * 17.0);
        assert_eq!(y[224], 0.25 * 1.0 * 26.0);
        assert_eq!(y[1], 0.25 * 2.0 * -32.0);
    }
}
