//! Embedding lookup: gathers rows of a weight matrix `[vocab, d]` stored as F32, F16, BF16 or one
//! of the block-quantized formats (Q8_0, Q4_0, Q4_1, Q5_0 and the K-quants Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K; layouts in [`crate::quant`], [`crate::kquant`] and [`crate::kquant_low`]) and writes them
//! as f32. The reference decodes element by element from the packed bytes; the fast path decodes
//! whole rows with the block routines, rows split over the thread pool.
//!
//! Token ids are checked by the caller; an id whose row lies outside `weight` leaves its output
//! row untouched (never a panic). Must not know about tensors.

use crate::kquant::{q6_k_value, scales_mins, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K};
use crate::kquant_low::{q2_k_value, q3_k_scales, q3_k_value, Q2_K_BYTES, Q3_K_BYTES};
use crate::quant::{q5_0_value, Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q8_0_BYTES, QK};
use crate::threads::Threads;
use half::{bf16, f16};

/// Storage format of the weight rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// GGUF Q8_0 blocks.
    Q8_0,
    /// GGUF Q4_0 blocks.
    Q4_0,
    /// GGUF Q4_1 blocks.
    Q4_1,
    /// GGUF Q5_0 blocks.
    Q5_0,
    /// GGUF Q4_K super-blocks (layouts in [`crate::kquant`]).
    Q4K,
    /// GGUF Q5_K super-blocks.
    Q5K,
    /// GGUF Q6_K super-blocks.
    Q6K,
    /// GGUF Q2_K super-blocks (layouts in [`crate::kquant_low`]).
    Q2K,
    /// GGUF Q3_K super-blocks.
    Q3K,
}

impl WeightFormat {
    /// Bytes of one row of `d` elements (`None` when a quantized row is not whole blocks).
    pub fn row_bytes(self, d: usize) -> Option<usize> {
        match self {
            WeightFormat::F32 => d.checked_mul(4),
            WeightFormat::F16 | WeightFormat::BF16 => d.checked_mul(2),
            WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q4_1 | WeightFormat::Q5_0 => {
                if !d.is_multiple_of(QK) {
                    return None;
                }
                let bb = match self {
                    WeightFormat::Q8_0 => Q8_0_BYTES,
                    WeightFormat::Q4_0 => Q4_0_BYTES,
                    WeightFormat::Q5_0 => Q5_0_BYTES,
                    _ => Q4_1_BYTES,
                };
                (d / QK).checked_mul(bb)
            }
            WeightFormat::Q2K
            | WeightFormat::Q3K
            | WeightFormat::Q4K
            | WeightFormat::Q5K
            | WeightFormat::Q6K => {
                if !d.is_multiple_of(QK_K) {
                    return None;
                }
                (d / QK_K).checked_mul(kquant_bytes(self))
            }
        }
    }
}

fn kquant_bytes(fmt: WeightFormat) -> usize {
    match fmt {
        WeightFormat::Q4K => Q4_K_BYTES,
        WeightFormat::Q5K => Q5_K_BYTES,
        WeightFormat::Q2K => Q2_K_BYTES,
        WeightFormat::Q3K => Q3_K_BYTES,
        _ => Q6_K_BYTES,
    }
}

/// Element `e` (< 256) of one K-quant super-block `b`, decoded on its own.
fn kquant_element(fmt: WeightFormat, b: &[u8], e: usize) -> f32 {
    if fmt == WeightFormat::Q2K {
        let sc = b[e / 16];
        let s = le_f16(b, 80) * (sc & 15) as f32;
        return s * q2_k_value(b, e) as f32 - le_f16(b, 82) * (sc >> 4) as f32;
    }
    if fmt == WeightFormat::Q3K {
        let s = le_f16(b, 108) * q3_k_scales(&b[96..108])[e / 16] as f32;
        return s * (q3_k_value(b, e) as i32 - 4) as f32;
    }
    if fmt == WeightFormat::Q6K {
        let sc = b[192 + e / 16] as i8 as f32;
        return le_f16(b, 208) * sc * (q6_k_value(b, e) as i32 - 32) as f32;
    }
    let (j, l) = (e / 32, e % 32);
    let (sc, m) = scales_mins(&b[4..16]);
    let qs_at = if fmt == WeightFormat::Q5K { 48 } else { 16 };
    let mut q = (b[qs_at + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
    if fmt == WeightFormat::Q5K {
        q |= ((b[16 + l] >> j) & 1) << 4;
    }
    let s = le_f16(b, 0) * ((sc >> (8 * j)) & 0xff) as f32;
    s * q as f32 - le_f16(b, 2) * ((m >> (8 * j)) & 0xff) as f32
}

fn le_f16(b: &[u8], at: usize) -> f32 {
    match b.get(at..at + 2) {
        Some(s) => f16::from_le_bytes([s[0], s[1]]).to_f32(),
        None => 0.0,
    }
}

/// Element `j` of a packed row, decoded on its own.
fn element(fmt: WeightFormat, row: &[u8], j: usize) -> f32 {
    let byte = |at: usize| row.get(at).copied().unwrap_or(0);
    match fmt {
        WeightFormat::F32 => f32::from_le_bytes([
            byte(4 * j),
            byte(4 * j + 1),
            byte(4 * j + 2),
            byte(4 * j + 3),
        ]),
        WeightFormat::F16 => le_f16(row, 2 * j),
        WeightFormat::BF16 => bf16::from_le_bytes([byte(2 * j), byte(2 * j + 1)]).to_f32(),
        WeightFormat::Q8_0 => {
            let b = (j / QK) * Q8_0_BYTES;
            le_f16(row, b) * (byte(b + 2 + j % QK) as i8) as f32
        }
        WeightFormat::Q5_0 => {
            let b = (j / QK) * Q5_0_BYTES;
            match row.get(b..b + Q5_0_BYTES) {
                Some(blk) => le_f16(blk, 0) * (q5_0_value(blk, j % QK) as i32 - 16) as f32,
                None => 0.0,
            }
        }
        WeightFormat::Q2K
        | WeightFormat::Q3K
        | WeightFormat::Q4K
        | WeightFormat::Q5K
        | WeightFormat::Q6K => {
            let bb = kquant_bytes(fmt);
            let at = (j / QK_K) * bb;
            match row.get(at..at + bb) {
                Some(b) => kquant_element(fmt, b, j % QK_K),
                None => 0.0,
            }
        }
        WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
            let (bb, qs) = if fmt == WeightFormat::Q4_0 {
                (Q4_0_BYTES, 2)
            } else {
                (Q4_1_BYTES, 4)
            };
            let b = (j / QK) * bb;
            let i = j % QK;
            let q = byte(b + qs + i % 16);
            let nib = if i < 16 { q & 15 } else { q >> 4 };
            let d = le_f16(row, b);
            if fmt == WeightFormat::Q4_0 {
                d * (nib as i32 - 8) as f32
            } else {
                d * nib as f32 + le_f16(row, b + 2)
            }
        }
    }
}

/// Reference: `out[t] = weight[ids[t]]` decoded per element.
pub fn embedding_ref(fmt: WeightFormat, weight: &[u8], d: usize, ids: &[i32], out: &mut [f32]) {
    let Some(rb) = fmt.row_bytes(d) else { return };
    if d == 0 {
        return;
    }
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(d)) {
        let Some(row) = usize::try_from(id)
            .ok()
            .and_then(|i| weight.get(i * rb..(i + 1) * rb))
        else {
            continue;
        };
        for (j, v) in o.iter_mut().enumerate() {
            *v = element(fmt, row, j);
        }
    }
}

/// Decodes one whole row with the block routines.
fn decode_row(fmt: WeightFormat, row: &[u8], o: &mut [f32]) {
    match fmt {
        WeightFormat::F32 => {
            for (v, c) in o.iter_mut().zip(row.chunks_exact(4)) {
                *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        WeightFormat::F16 => {
            for (v, c) in o.iter_mut().zip(row.chunks_exact(2)) {
                *v = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightFormat::BF16 => {
            for (v, c) in o.iter_mut().zip(row.chunks_exact(2)) {
                *v = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        WeightFormat::Q8_0 => crate::quant::dequantize_q8_0(row, o),
        WeightFormat::Q4_0 => crate::quant::dequantize_q4_0(row, o),
        WeightFormat::Q4_1 => crate::quant::dequantize_q4_1(row, o),
        WeightFormat::Q5_0 => crate::quant::dequantize_q5_0(row, o),
        WeightFormat::Q4K => crate::kquant::dequantize_q4_k(row, o),
        WeightFormat::Q5K => crate::kquant::dequantize_q5_k(row, o),
        WeightFormat::Q6K => crate::kquant::dequantize_q6_k(row, o),
        WeightFormat::Q2K => crate::kquant_low::dequantize_q2_k(row, o),
        WeightFormat::Q3K => crate::kquant_low::dequantize_q3_k(row, o),
    }
}

/// Fast embedding (same contract as [`embedding_ref`]).
pub fn embedding(
    th: &Threads,
    fmt: WeightFormat,
    weight: &[u8],
    d: usize,
    ids: &[i32],
    out: &mut [f32],
) {
    let Some(rb) = fmt.row_bytes(d) else { return };
    if d == 0 {
        return;
    }
    th.for_row_chunks(out, d, crate::vecmath::min_rows_for(d), |r0, oc| {
        for (&id, o) in ids.iter().skip(r0).zip(oc.chunks_exact_mut(d)) {
            if let Some(row) = usize::try_from(id)
                .ok()
                .and_then(|i| weight.get(i * rb..(i + 1) * rb))
            {
                decode_row(fmt, row, o);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::vals;

    fn encode(fmt: WeightFormat, v: &[f32]) -> Vec<u8> {
        match fmt {
            WeightFormat::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            WeightFormat::F16 => v
                .iter()
                .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                .collect(),
            WeightFormat::BF16 => v
                .iter()
                .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                .collect(),
            WeightFormat::Q8_0 => {
                let mut o = vec![0; v.len() / QK * Q8_0_BYTES];
                crate::quant::quantize_q8_0(v, &mut o);
                o
            }
            WeightFormat::Q4_0 => {
                let mut o = vec![0; v.len() / QK * Q4_0_BYTES];
                crate::quant::quantize_q4_0(v, &mut o);
                o
            }
            WeightFormat::Q4_1 => {
                let mut o = vec![0; v.len() / QK * Q4_1_BYTES];
                crate::quant::quantize_q4_1(v, &mut o);
                o
            }
            WeightFormat::Q5_0 => {
                let mut o = vec![0; v.len() / QK * Q5_0_BYTES];
                crate::quant::quantize_q5_0(v, &mut o);
                o
            }
            WeightFormat::Q2K
            | WeightFormat::Q3K
            | WeightFormat::Q4K
            | WeightFormat::Q5K
            | WeightFormat::Q6K => {
                let mut o = vec![0; v.len() / QK_K * kquant_bytes(fmt)];
                match fmt {
                    WeightFormat::Q4K => crate::kquant::quantize_q4_k(v, &mut o),
                    WeightFormat::Q5K => crate::kquant::quantize_q5_k(v, &mut o),
                    WeightFormat::Q2K => crate::kquant_low::quantize_q2_k(v, &mut o),
                    WeightFormat::Q3K => crate::kquant_low::quantize_q3_k(v, &mut o),
                    _ => crate::kquant::quantize_q6_k(v, &mut o),
                }
                o
            }
        }
    }

    #[test]
    fn fast_matches_reference_for_every_format() {
        let th = Threads::new(2).unwrap();
        use WeightFormat::*;
        for fmt in [
            F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q2K, Q3K, Q4K, Q5K, Q6K,
        ] {
            let shapes = if matches!(fmt, Q2K | Q3K | Q4K | Q5K | Q6K) {
                [(5usize, 256usize), (17, 768), (300, 1280)]
            } else {
                [(5, 32), (17, 96), (300, 576)]
            };
            for (vocab, d) in shapes {
                let w = vals(vocab * d, 3, -1.0, 1.0);
                let bytes = encode(fmt, &w);
                let ids: Vec<i32> = (0..40).map(|t| ((t * 7 + 3) % vocab) as i32).collect();
                let (mut r, mut f) = (vec![0.0; 40 * d], vec![0.0; 40 * d]);
                embedding_ref(fmt, &bytes, d, &ids, &mut r);
                embedding(&th, fmt, &bytes, d, &ids, &mut f);
                assert_eq!(f, r, "{fmt:?} {vocab}x{d}");
                if fmt == F32 {
                    assert_eq!(&r[..d], &w[3 * d..4 * d]);
                }
            }
        }
    }
}
