//! The scalar reference shared by block-quantized × f32 kernels: dequantize a weight block, dot
//! it with every activation row.

use super::MAX_ROWS;

/// A block decoder and the bytes of one block.
pub(super) type BlockDeq = (fn(&[u8], &mut [f32]), usize);

/// Dequantizes each `QB`-value block of weight row `w` (`bytes` bytes per block, decoded by
/// `deq`) and dots it with each of `rows` activation rows of length `k` ([`super::FloatRowsFn`]
/// contract).
pub(super) fn block_rows_ref<const QB: usize>(
    (deq, bytes): BlockDeq,
    w: &[u8],
    x: &[f32],
    k: usize,
    rows: usize,
    out: &mut [f32; MAX_ROWS],
) {
    let rows = rows.min(MAX_ROWS);
    let mut acc = [0f32; MAX_ROWS];
    let mut wf = [0f32; QB];
    for (b, blk) in w.chunks_exact(bytes).take(k / QB).enumerate() {
        deq(blk, &mut wf);
        for (r, a) in acc.iter_mut().enumerate().take(rows) {
            let xb = &x[r * k + b * QB..r * k + (b + 1) * QB];
            for (wv, xv) in wf.iter().zip(xb) {
                *a += wv * xv;
            }
        }
    }
    out[..rows].copy_from_slice(&acc[..rows]);
}
