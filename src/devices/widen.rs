//! Host-side widening of weights a device has no kernels for, done once when the weight is
//! copied onto that device: MXFP4 blocks become BF16, exactly (every MXFP4 value is a bf16
//! number; the widened weight takes 2 bytes per value instead of 17 per 32, 3.76× the bytes).
//!
//! Owns only the conversion of host tensors; devices decide when to call it.

use crate::data::{Data, DataType};
use crate::error::{Error, Result};

/// `d` (an MXFP4 host tensor) as a BF16 host tensor of the same dims and values. `Err` names
/// the tensor when it is not an MXFP4 tensor on the host or a block's exponent is beyond bf16's
/// range.
pub fn mxfp4_to_bf16(d: &Data) -> Result<Data> {
    if d.dtype() != DataType::Mxfp4 {
        return Err(Error::invalid(format!(
            "tensor {}: widening MXFP4 to BF16 needs an MXFP4 tensor, got {}",
            d.name,
            d.dtype()
        )));
    }
    let src = if d.is_contiguous() {
        std::borrow::Cow::Borrowed(d.bytes()?)
    } else {
        std::borrow::Cow::Owned(d.packed_bytes()?)
    };
    let mut half = vec![0u16; d.count()];
    fastllm_cpu::mxfp4::mxfp4_to_bf16(&src, &mut half)
        .map_err(|e| Error::invalid(format!("tensor {}: {e}", d.name)))?;
    let bytes: Vec<u8> = half.iter().flat_map(|h| h.to_le_bytes()).collect();
    let mut out = Data::from_bytes(DataType::BF16, d.dims(), &bytes)?;
    out.name = d.name.clone();
    out.lock_in_cpu = d.lock_in_cpu;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widened_values_equal_the_decoded_ones() {
        let v: Vec<f32> = (0..3 * 64)
            .map(|i| ((i * 29 % 53) as f32 - 26.0) / 7.0)
            .collect();
        let q = crate::data::encode_from_f32(DataType::Mxfp4, &v).unwrap();
        let mut d = Data::from_bytes(DataType::Mxfp4, &[3, 64], &q).unwrap();
        d.name = "experts.w".into();
        let w = mxfp4_to_bf16(&d).unwrap();
        assert_eq!((w.dtype(), w.dims()), (DataType::BF16, &[3usize, 64][..]));
        assert_eq!(w.to_f32_vec().unwrap(), d.to_f32_vec().unwrap());
        let e = mxfp4_to_bf16(&w).unwrap_err().to_string();
        assert!(e.contains("experts.w") && e.contains("bf16"), "{e}");
        // an exponent byte past bf16's range is refused, naming the tensor
        let mut bad = q.clone();
        bad[17] = 255;
        let mut d = Data::from_bytes(DataType::Mxfp4, &[3, 64], &bad).unwrap();
        d.name = "experts.w".into();
        let e = mxfp4_to_bf16(&d).unwrap_err().to_string();
        assert!(e.contains("experts.w") && e.contains("block 1"), "{e}");
    }
}
