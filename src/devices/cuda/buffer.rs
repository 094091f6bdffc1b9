//! `CudaBuffer`: device memory behind a `Data` (`Storage::Device`), and the helpers that read a
//! tensor's device pointer or build a device tensor. Owns no kernels and no op logic.

use super::gpu::Gpu;
use crate::data::{bytes_for, Data, DataType, DeviceBuffer, DeviceKind, Storage};
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, DevicePtr};
use std::fmt;
use std::sync::Arc;

/// A block of device memory on one GPU.
pub struct CudaBuffer {
    slice: CudaSlice<u8>,
    ptr: u64,
    gpu: Arc<Gpu>,
}

impl fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cuda:{} {} bytes", self.gpu.ordinal(), self.slice.len())
    }
}

impl CudaBuffer {
    /// `len` zeroed bytes on `gpu` (at least 1, so every buffer has a valid address).
    pub fn zeroed(gpu: &Arc<Gpu>, len: usize) -> Result<CudaBuffer> {
        gpu.not_capturing("allocation")?;
        let slice = gpu
            .stream()
            .alloc_zeros::<u8>(len.max(1))
            .map_err(|e| Error::OutOfMemory(format!("cuda:{}: {len} bytes: {e}", gpu.ordinal())))?;
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(gpu.stream());
            ptr
        };
        Ok(CudaBuffer {
            slice,
            ptr,
            gpu: gpu.clone(),
        })
    }

    /// Size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.slice.len()
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

/// The address of the scratch buffer held in `slot`, first regrown to at least `need` bytes when
/// it is smaller (the old one freed first, as the new one may be large; recorded graphs that hold
/// the old address are marked stale). `pow2` rounds a new size up to a power of two. 0 when
/// `need` is 0 and nothing is held.
pub fn scratch(
    gpu: &Arc<Gpu>,
    slot: &mut Option<CudaBuffer>,
    need: usize,
    pow2: bool,
) -> Result<u64> {
    if need > 0 && slot.as_ref().is_none_or(|b| b.len_bytes() < need) {
        gpu.not_capturing("allocation")?;
        gpu.bump_generation();
        *slot = None;
        let len = if pow2 { need.next_power_of_two() } else { need };
        *slot = Some(CudaBuffer::zeroed(gpu, len)?);
    }
    Ok(slot.as_ref().map(|b| b.ptr()).unwrap_or(0))
}

impl DeviceBuffer for CudaBuffer {
    fn len(&self) -> usize {
        self.slice.len()
    }
    fn to_host(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.slice.len()];
        self.gpu.dtoh(self.ptr, &mut v)?;
        Ok(v)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// The device address of `d`'s first element; `Err` naming `what` when `d` is not CUDA memory.
pub fn dptr(d: &Data, what: &str) -> Result<u64> {
    match d.storage() {
        Storage::Device(b) => b
            .as_any()
            .downcast_ref::<CudaBuffer>()
            .map(|c| c.ptr())
            .ok_or_else(|| Error::invalid(format!("{what}: {d:?} is not CUDA memory"))),
        _ => Err(Error::invalid(format!("{what}: {d:?} is not on the GPU"))),
    }
}

/// Bytes of the allocation behind `d` when it is CUDA memory.
pub fn device_len(d: &Data) -> Option<usize> {
    match d.storage() {
        Storage::Device(b) => b.as_any().downcast_ref::<CudaBuffer>().map(|c| c.len()),
        _ => None,
    }
}

/// A zeroed device tensor of `dtype` × `dims` with `capacity` (same rank, ≥ dims).
pub fn alloc_data(
    gpu: &Arc<Gpu>,
    dtype: DataType,
    dims: &[usize],
    capacity: &[usize],
) -> Result<Data> {
    let n = bytes_for(dtype, capacity)?;
    let buf = CudaBuffer::zeroed(gpu, n)?;
    Data::from_device(
        dtype,
        dims,
        capacity,
        DeviceKind::Cuda(gpu.ordinal()),
        Box::new(buf),
    )
}

/// Makes `out` a device tensor of `dtype` × `dims`, reusing its allocation when it already is
/// one of this size; the contents are unspecified. Keeps the name.
pub fn ensure_out(gpu: &Arc<Gpu>, out: &mut Data, dtype: DataType, dims: &[usize]) -> Result<()> {
    let kind = DeviceKind::Cuda(gpu.ordinal());
    let need = bytes_for(dtype, dims)?;
    let reusable = out.device() == kind
        && out.dtype() == dtype
        && out.is_contiguous()
        && out.capacity() == out.dims()
        && device_len(out) == Some(need.max(1))
        && out.count() == dims.iter().product::<usize>();
    if reusable {
        return out.reshape(dims);
    }
    let name = std::mem::take(&mut out.name);
    *out = alloc_data(gpu, dtype, dims, dims)?;
    out.name = name;
    Ok(())
}
