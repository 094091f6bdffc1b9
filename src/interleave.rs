//! Weights interleaved 16 rows at a time for the CPU's SIMD kernels, at the tensor level: which
//! tensors can be interleaved (Q4_0/Q4_1/Q8_0 blocks, K-quant super-blocks, F16, BF16), the
//! interleaving of a whole `Data`, and handing a replaced source's pages back to the OS. The
//! way back to the plain layout is `Data::plain_row`'s (`DataType::kernel_type` names the
//! kernels' type). The byte layouts and the kernels are `fastllm_cpu::linear::interleaved`'s,
//! `interleaved_kquant`'s and `interleaved_float`'s.

use crate::data::{Data, DeviceKind, Storage};
use crate::error::{Error, Result};
use fastllm_cpu::linear::interleaved;

/// The interleaved copy of a host matrix `[n, k]` (block, K-quant, F16 or BF16) with `n` a multiple of
/// 16; `None` for every tensor that cannot be interleaved (other dtypes or ranks, another row
/// count, a device tensor, a non-contiguous view).
pub fn interleave(d: &Data) -> Result<Option<Data>> {
    let (Some(t), Some(it), &[n, k]) = (d.dtype().kernel_type(), d.dtype().interleaved(), d.dims())
    else {
        return Ok(None);
    };
    if d.device() != DeviceKind::Cpu
        || !d.is_contiguous()
        || !n.is_multiple_of(interleaved::GROUP_ROWS)
        || n == 0
    {
        return Ok(None);
    }
    let mut out = Data::zeros(it, &[n, k])?;
    let rb = d.dtype().row_bytes(k)?;
    // a slice of whole groups at a time, each slice's file pages handed back as it is done, so
    // a large matrix never holds both copies at once
    let rows =
        (CHUNK_BYTES / (rb * interleaved::GROUP_ROWS).max(1)).max(1) * interleaved::GROUP_ROWS;
    let (src, dst) = (d.bytes()?, out.bytes_mut()?);
    let mut r0 = 0;
    while r0 < n {
        let r1 = (r0 + rows).min(n);
        let part = r0 * rb..r1 * rb;
        interleaved::interleave(t, &src[part.clone()], r1 - r0, k, &mut dst[part.clone()])
            .map_err(|e| Error::invalid(format!("{}: {e}", d.name)))?;
        release_part(d, part);
        r0 = r1;
    }
    out.name = d.name.clone();
    Ok(Some(out))
}

/// Bytes of a matrix interleaved between two hand-backs of its source pages.
const CHUNK_BYTES: usize = 8 << 20;

/// Hands the pages of a shared view (a memory-mapped weight that was replaced by its interleaved
/// copy) back to the OS: `MADV_PAGEOUT` over the whole pages inside the view. Contents are kept
/// (file pages are read again if touched; anonymous pages would be swapped, never dropped), so this
/// is only a hint and cannot change what any other view reads. No-op for other storage and on
/// systems without the call.
pub fn release_view(d: &Data) {
    if let Storage::Shared { len, .. } = d.storage() {
        release_part(d, 0..*len);
    }
}

/// [`release_view`] for the bytes `part` of the view only.
fn release_part(d: &Data, part: std::ops::Range<usize>) {
    let Storage::Shared { bytes, offset, len } = d.storage() else {
        return;
    };
    let all: &[u8] = (**bytes).as_ref();
    let view = all.get(*offset..offset.saturating_add(*len));
    if let Some(p) = view.and_then(|v| v.get(part)) {
        page_out(p);
    }
}

#[cfg(target_os = "linux")]
fn page_out(view: &[u8]) {
    const PAGE: usize = 4096;
    let start = (view.as_ptr() as usize).next_multiple_of(PAGE);
    let end = (view.as_ptr() as usize + view.len()) / PAGE * PAGE;
    if end > start {
        // SAFETY: the range lies inside `view`, a live mapping; MADV_PAGEOUT never changes the
        // contents a later read sees. Failure (old kernels) is ignored: it is a hint.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn page_out(_view: &[u8]) {}
