//! `Data`, the tensor type: dims, strides, dtype (floats, int32 and quantized weight blocks),
//! storage on a device (owned, or a zero-copy view over borrowed bytes such as a memory map),
//! the `lock_in_cpu` flag, and *expansion* — capacity reserved along one axis so a KV cache
//! grows in place (`reserve` + the `CatDirect` op).
//!
//! This module owns the memory layout. It must not know about ops, devices' kernels or models.

use crate::error::{Error, Result};
use fastllm_cpu::linear::{interleaved, WeightType};
use half::{bf16, f16};
use std::fmt;
use std::sync::Arc;

pub use fastllm_cpu::kquant::{Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K};
pub use fastllm_cpu::kquant_low::{Q2_K_BYTES, Q3_K_BYTES};
pub use fastllm_cpu::mxfp4::MXFP4_BYTES;
pub use fastllm_cpu::quant::{Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q8_0_BYTES, QK};

/// Element types. The numeric codes follow fastllm's `DataType` (used by the C ABI and `.flm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DataType {
    /// 32-bit float.
    F32 = 0,
    /// bfloat16.
    BF16 = 1,
    /// int8 blocks of 32 with an f16 scale; bit-compatible with GGUF `Q8_0`.
    Q8_0 = 3,
    /// int4 blocks of 32 with an f16 scale (zero point 8); bit-compatible with GGUF `Q4_0`.
    Q4_0 = 4,
    /// IEEE half float.
    F16 = 7,
    /// int4 blocks of 32 with an f16 scale and f16 min; bit-compatible with GGUF `Q4_1`.
    Q4_1 = 8,
    /// 32-bit signed integer (token ids, positions, indices).
    I32 = 13,
    /// int5 blocks of 32 with an f16 scale (zero point 16); bit-compatible with GGUF `Q5_0`.
    Q5_0 = 33,
    /// K-quant super-blocks of 256 (f16 d and dmin, 6-bit scales and mins, 4-bit values);
    /// bit-compatible with GGUF `Q4_K` (layout in `fastllm_cpu::kquant`).
    Q4K = 30,
    /// K-quant super-blocks of 256 with 5-bit values; bit-compatible with GGUF `Q5_K`.
    Q5K = 31,
    /// K-quant super-blocks of 256 (6-bit values, i8 scales per 16, f16 d); bit-compatible
    /// with GGUF `Q6_K`.
    Q6K = 32,
    /// K-quant super-blocks of 256 (2-bit values, 4-bit scales and mins per 16, f16 d and dmin);
    /// bit-compatible with GGUF `Q2_K` (layout in `fastllm_cpu::kquant_low`).
    Q2K = 34,
    /// K-quant super-blocks of 256 (3-bit values, 6-bit signed scales per 16, f16 d);
    /// bit-compatible with GGUF `Q3_K`.
    Q3K = 35,
    /// MXFP4 blocks of 32 (an E8M0 exponent byte and 16 bytes of E2M1 nibbles); bit-compatible
    /// with GGUF `MXFP4` (ggml type 39, whose code it shares; layout in `fastllm_cpu::mxfp4`).
    Mxfp4 = 39,
    /// `Q8_0` blocks of 16 rows interleaved for the CPU's SIMD kernels (in memory only, never in a
    /// file; layout in `fastllm_cpu::linear::interleaved`). Same bytes per row as `Q8_0`.
    Q8_0Interleaved = 103,
    /// `Q4_0` blocks of 16 rows interleaved for the CPU's SIMD kernels (in memory only).
    Q4_0Interleaved = 104,
    /// `Q4_1` blocks of 16 rows interleaved for the CPU's SIMD kernels (in memory only).
    Q4_1Interleaved = 108,
    /// `F16` rows interleaved 16 at a time for the CPU's SIMD kernels (in memory only; layout in
    /// `fastllm_cpu::linear::interleaved_float`). Same bytes per row as `F16`.
    F16Interleaved = 107,
    /// `BF16` rows interleaved 16 at a time for the CPU's SIMD kernels (in memory only).
    BF16Interleaved = 101,
    /// `Q4_K` super-blocks of 16 rows interleaved for the CPU's SIMD kernels (in memory only;
    /// layout in `fastllm_cpu::linear::interleaved_kquant`). Same bytes per row as `Q4_K`.
    Q4KInterleaved = 130,
    /// `Q5_K` super-blocks of 16 rows interleaved for the CPU's SIMD kernels (in memory only).
    Q5KInterleaved = 131,
    /// `Q6_K` super-blocks of 16 rows interleaved for the CPU's SIMD kernels (in memory only).
    Q6KInterleaved = 132,
    /// `Q2_K` super-blocks of 16 rows interleaved for the CPU's SIMD kernels (in memory only).
    Q2KInterleaved = 133,
    /// `Q3_K` super-blocks of 16 rows interleaved for the CPU's SIMD kernels (in memory only).
    Q3KInterleaved = 134,
}

impl DataType {
    /// All dtypes a file can hold, in code order (the in-memory interleaved forms are not among them).
    pub const ALL: [DataType; 14] = [
        DataType::F32,
        DataType::BF16,
        DataType::Q8_0,
        DataType::Q4_0,
        DataType::F16,
        DataType::Q4_1,
        DataType::I32,
        DataType::Q5_0,
        DataType::Q4K,
        DataType::Q5K,
        DataType::Q6K,
        DataType::Q2K,
        DataType::Q3K,
        DataType::Mxfp4,
    ];

    /// The numeric code (fastllm numbering).
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The dtype with numeric code `code`, if any.
    pub fn from_code(code: u32) -> Option<DataType> {
        Self::ALL.iter().copied().find(|d| d.code() == code)
    }

    /// Lower-case name: `f32`, `bf16`, `q8_0`, `q4_0`, `f16`, `q4_1`, `i32`, `q5_0`, `q4_k`,
    /// `q5_k`, `q6_k`, `q2_k`, `q3_k`, `mxfp4`.
    pub fn name(self) -> &'static str {
        match self {
            DataType::F32 => "f32",
            DataType::BF16 => "bf16",
            DataType::Q8_0 => "q8_0",
            DataType::Q4_0 => "q4_0",
            DataType::F16 => "f16",
            DataType::Q4_1 => "q4_1",
            DataType::I32 => "i32",
            DataType::Q5_0 => "q5_0",
            DataType::Q4K => "q4_k",
            DataType::Q5K => "q5_k",
            DataType::Q6K => "q6_k",
            DataType::Q2K => "q2_k",
            DataType::Q3K => "q3_k",
            DataType::Mxfp4 => "mxfp4",
            DataType::Q8_0Interleaved => "q8_0/interleaved",
            DataType::Q4_0Interleaved => "q4_0/interleaved",
            DataType::Q4_1Interleaved => "q4_1/interleaved",
            DataType::F16Interleaved => "f16/interleaved",
            DataType::BF16Interleaved => "bf16/interleaved",
            DataType::Q4KInterleaved => "q4_k/interleaved",
            DataType::Q5KInterleaved => "q5_k/interleaved",
            DataType::Q6KInterleaved => "q6_k/interleaved",
            DataType::Q2KInterleaved => "q2_k/interleaved",
            DataType::Q3KInterleaved => "q3_k/interleaved",
        }
    }

    /// The 16-row interleaved form of a block, K-quant, F16 or BF16 type (`None` for other types).
    pub fn interleaved(self) -> Option<DataType> {
        match self {
            DataType::Q8_0 => Some(DataType::Q8_0Interleaved),
            DataType::Q4_0 => Some(DataType::Q4_0Interleaved),
            DataType::Q4_1 => Some(DataType::Q4_1Interleaved),
            DataType::F16 => Some(DataType::F16Interleaved),
            DataType::BF16 => Some(DataType::BF16Interleaved),
            DataType::Q4K => Some(DataType::Q4KInterleaved),
            DataType::Q5K => Some(DataType::Q5KInterleaved),
            DataType::Q6K => Some(DataType::Q6KInterleaved),
            DataType::Q2K => Some(DataType::Q2KInterleaved),
            DataType::Q3K => Some(DataType::Q3KInterleaved),
            _ => None,
        }
    }

    /// The plain block type of an interleaved type (`self` for every other type).
    pub fn plain(self) -> DataType {
        match self {
            DataType::Q8_0Interleaved => DataType::Q8_0,
            DataType::Q4_0Interleaved => DataType::Q4_0,
            DataType::Q4_1Interleaved => DataType::Q4_1,
            DataType::F16Interleaved => DataType::F16,
            DataType::BF16Interleaved => DataType::BF16,
            DataType::Q4KInterleaved => DataType::Q4K,
            DataType::Q5KInterleaved => DataType::Q5K,
            DataType::Q6KInterleaved => DataType::Q6K,
            DataType::Q2KInterleaved => DataType::Q2K,
            DataType::Q3KInterleaved => DataType::Q3K,
            t => t,
        }
    }

    /// True for the in-memory interleaved forms (block types, K-quants, F16, BF16).
    pub fn is_interleaved(self) -> bool {
        self.plain() != self
    }

    /// Parses [`DataType::name`] (also accepts `int8` for q8_0, `int4` for q4_0, `int4-min` for q4_1).
    pub fn from_name(s: &str) -> Option<DataType> {
        let s = s.to_ascii_lowercase();
        Some(match s.as_str() {
            "f32" | "float32" => DataType::F32,
            "bf16" | "bfloat16" => DataType::BF16,
            "f16" | "float16" => DataType::F16,
            "q8_0" | "int8" => DataType::Q8_0,
            "q4_0" | "int4" => DataType::Q4_0,
            "q4_1" | "int4-min" | "int4_min" => DataType::Q4_1,
            "i32" | "int32" => DataType::I32,
            "q5_0" => DataType::Q5_0,
            "q4_k" => DataType::Q4K,
            "q5_k" => DataType::Q5K,
            "q6_k" => DataType::Q6K,
            "q2_k" => DataType::Q2K,
            "q3_k" => DataType::Q3K,
            "mxfp4" => DataType::Mxfp4,
            _ => return None,
        })
    }

    /// Elements per storage block: 256 for K-quants, 32 for the other quantized types, 1
    /// otherwise.
    pub fn block_elems(self) -> usize {
        if self.plain().is_kquant() {
            QK_K
        } else if self.plain().is_quantized() {
            QK
        } else {
            1
        }
    }

    /// Bytes per storage block.
    pub fn block_bytes(self) -> usize {
        match self.plain() {
            DataType::F32 | DataType::I32 => 4,
            DataType::F16 | DataType::BF16 => 2,
            DataType::Q8_0 => Q8_0_BYTES,
            DataType::Q4_0 => Q4_0_BYTES,
            DataType::Q5_0 => Q5_0_BYTES,
            DataType::Q4K => Q4_K_BYTES,
            DataType::Q5K => Q5_K_BYTES,
            DataType::Q6K => Q6_K_BYTES,
            DataType::Q2K => Q2_K_BYTES,
            DataType::Q3K => Q3_K_BYTES,
            DataType::Mxfp4 => MXFP4_BYTES,
            _ => Q4_1_BYTES,
        }
    }

    /// True for the block-quantized weight types (32-value blocks and K-quant super-blocks).
    pub fn is_quantized(self) -> bool {
        matches!(
            self,
            DataType::Q8_0
                | DataType::Q4_0
                | DataType::Q4_1
                | DataType::Q5_0
                | DataType::Q4K
                | DataType::Q5K
                | DataType::Q6K
                | DataType::Q2K
                | DataType::Q3K
                | DataType::Mxfp4
        )
    }

    /// True for the K-quant super-block types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K).
    pub fn is_kquant(self) -> bool {
        matches!(
            self,
            DataType::Q2K | DataType::Q3K | DataType::Q4K | DataType::Q5K | DataType::Q6K
        )
    }

    /// True for F32, F16 and BF16.
    pub fn is_float(self) -> bool {
        matches!(self, DataType::F32 | DataType::F16 | DataType::BF16)
    }

    /// The CPU kernels' weight type of a dtype that has an interleaved form, plain or
    /// interleaved (`None` for other dtypes).
    pub fn kernel_type(self) -> Option<WeightType> {
        match self.plain() {
            DataType::Q8_0 => Some(WeightType::Q8_0),
            DataType::Q4_0 => Some(WeightType::Q4_0),
            DataType::Q4_1 => Some(WeightType::Q4_1),
            DataType::F16 => Some(WeightType::F16),
            DataType::BF16 => Some(WeightType::BF16),
            DataType::Q4K => Some(WeightType::Q4K),
            DataType::Q5K => Some(WeightType::Q5K),
            DataType::Q6K => Some(WeightType::Q6K),
            DataType::Q2K => Some(WeightType::Q2K),
            DataType::Q3K => Some(WeightType::Q3K),
            _ => None,
        }
    }

    /// Bytes needed for one row of `row_elems` elements; errors when a quantized row is not a
    /// multiple of the block size.
    pub fn row_bytes(self, row_elems: usize) -> Result<usize> {
        let be = self.block_elems();
        if !row_elems.is_multiple_of(be) {
            return Err(Error::invalid(format!(
                "dtype {} needs rows that are a multiple of {be} elements, got {row_elems}",
                self.name()
            )));
        }
        (row_elems / be)
            .checked_mul(self.block_bytes())
            .ok_or_else(|| Error::invalid("row size overflows"))
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a tensor's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// Host memory.
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(u32),
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceKind::Cpu => f.write_str("cpu"),
            DeviceKind::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A heap buffer aligned to 64 bytes (cache line / AVX-512 width), zero-initialized through the
/// allocator's zeroed path so large untouched capacity (e.g. a reserved KV cache) costs no
/// resident memory until written.
pub struct AlignedBuf {
    /// Start of the allocation (what is freed).
    base: std::ptr::NonNull<u8>,
    /// Start of the 64-byte aligned bytes inside it.
    offset: usize,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access is read-only.
unsafe impl Sync for AlignedBuf {}

const BUF_ALIGN: usize = 64;

/// Buffers of at least this many bytes ask for transparent huge pages.
const HUGE_PAGES_FROM: usize = 4 << 20;

/// Asks the kernel to back the whole 2 MiB pages inside the fresh allocation `[p, p + size)`
/// with transparent huge pages (where the system leaves that to `madvise`): a GEMV streaming a
/// weight matrix then misses the TLB once per 2 MiB instead of once per 4 KiB. Small buffers
/// and other systems are left alone; a refusal changes nothing but speed.
fn advise_huge_pages(p: *mut u8, size: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (p as usize).div_ceil(HUGE) * HUGE;
        let end = (p as usize + size) / HUGE * HUGE;
        if size >= HUGE_PAGES_FROM && end > start {
            // SAFETY: [start, end) lies inside the allocation just made; the advice changes no
            // contents and its result (an error on kernels without huge pages) is not needed.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, size, HUGE_PAGES_FROM);
}

impl AlignedBuf {
    /// The allocation's layout: `len` plus slack for aligning, at the allocator's natural
    /// alignment. Asking the allocator for 64-byte alignment directly would make it zero the
    /// memory by hand (touching every page); at natural alignment `alloc_zeroed` is `calloc`,
    /// whose large blocks come straight from the OS, already zero and not yet resident.
    fn layout(len: usize) -> Result<std::alloc::Layout> {
        let size = len
            .checked_add(BUF_ALIGN)
            .ok_or_else(|| Error::OutOfMemory(format!("cannot allocate {len} bytes")))?;
        std::alloc::Layout::from_size_align(size, 16)
            .map_err(|_| Error::OutOfMemory(format!("cannot allocate {len} bytes")))
    }

    /// A zero-filled buffer of `len` bytes; `Err` if the allocation fails.
    pub fn zeroed(len: usize) -> Result<AlignedBuf> {
        let layout = Self::layout(len)?;
        // SAFETY: layout has non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let base = std::ptr::NonNull::new(p)
            .ok_or_else(|| Error::OutOfMemory(format!("cannot allocate {len} bytes")))?;
        advise_huge_pages(p, layout.size());
        let offset = (BUF_ALIGN - (p as usize) % BUF_ALIGN) % BUF_ALIGN;
        Ok(AlignedBuf { base, offset, len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: base + offset + len lies inside the zeroed allocation.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(self.offset), self.len) }
    }

    /// The bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(self.offset), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Ok(layout) = Self::layout(self.len) {
            // SAFETY: allocated in `zeroed` with this same layout.
            unsafe { std::alloc::dealloc(self.base.as_ptr(), layout) };
        }
    }
}

/// Bytes owned by someone else that a `Data` may view without copying (a memory map, a shared
/// buffer). Read-only.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Device-side storage implemented by a device backend (e.g. CUDA memory).
pub trait DeviceBuffer: Send + Sync + fmt::Debug {
    /// Size in bytes.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies the whole buffer to host memory.
    fn to_host(&self) -> Result<Vec<u8>>;
    /// Downcasting hook for the backend that made it.
    fn as_any(&self) -> &dyn std::any::Any;
    /// Mutable downcasting hook.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

/// The bytes behind a [`Data`].
pub enum Storage {
    /// Nothing allocated yet.
    None,
    /// Owned host memory; the tensor starts at its first byte.
    Owned(AlignedBuf),
    /// A read-only zero-copy view of `len` bytes at `offset` of shared bytes (e.g. an mmap).
    Shared {
        /// The owner of the bytes.
        bytes: SharedBytes,
        /// Start of the view.
        offset: usize,
        /// Length of the view.
        len: usize,
    },
    /// Memory on a device.
    Device(Box<dyn DeviceBuffer>),
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Storage::None => f.write_str("None"),
            Storage::Owned(buf) => write!(f, "Owned({} bytes)", buf.len()),
            Storage::Shared { offset, len, .. } => write!(f, "Shared({len} bytes @{offset})"),
            Storage::Device(d) => write!(f, "Device({:?})", d),
        }
    }
}

/// A tensor: dims, dtype, strides and storage.
///
/// Layout is row-major over the *capacity* dims; only one axis may have capacity beyond its
/// logical size (expansion). For quantized dtypes the last dim counts elements and must be a
/// multiple of the block size (32, or 256 for K-quants); strides are in elements for every axis but the last, which is always packed.
pub struct Data {
    dtype: DataType,
    dims: Vec<usize>,
    capacity: Vec<usize>,
    storage: Storage,
    device: DeviceKind,
    /// Keep this tensor in host memory even when a faster device runs the op.
    pub lock_in_cpu: bool,
    /// Optional name (weights carry theirs, for error messages and profiling).
    pub name: String,
}

impl fmt::Debug for Data {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Data({}{:?} {} {:?}",
            if self.name.is_empty() { "" } else { &self.name },
            self.dims,
            self.dtype,
            self.storage
        )?;
        if self.capacity != self.dims {
            write!(f, " capacity {:?}", self.capacity)?;
        }
        f.write_str(")")
    }
}

fn checked_count(dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| Error::invalid(format!("dims {dims:?}: element count overflows")))
}

/// Bytes needed by a row-major tensor of `dims` in `dtype`.
pub fn bytes_for(dtype: DataType, dims: &[usize]) -> Result<usize> {
    if dims.is_empty() {
        return Ok(dtype.block_bytes());
    }
    let last = dims[dims.len() - 1];
    let rows = checked_count(&dims[..dims.len() - 1])?;
    let rb = dtype.row_bytes(last)?;
    rows.checked_mul(rb)
        .ok_or_else(|| Error::invalid(format!("dims {dims:?}: byte size overflows")))
}

impl Data {
    /// An empty tensor of `dtype` with no storage (an output slot waiting for `reshape`).
    pub fn empty(dtype: DataType) -> Data {
        Data {
            dtype,
            dims: Vec::new(),
            capacity: Vec::new(),
            storage: Storage::None,
            device: DeviceKind::Cpu,
            lock_in_cpu: false,
            name: String::new(),
        }
    }

    /// A zero-filled host tensor.
    pub fn zeros(dtype: DataType, dims: &[usize]) -> Result<Data> {
        let n = bytes_for(dtype, dims)?;
        let mut d = Data::empty(dtype);
        d.dims = dims.to_vec();
        d.capacity = dims.to_vec();
        d.storage = Storage::Owned(AlignedBuf::zeroed(n)?);
        Ok(d)
    }

    /// A host tensor copied from raw bytes; `bytes.len()` must match dims and dtype.
    pub fn from_bytes(dtype: DataType, dims: &[usize], bytes: &[u8]) -> Result<Data> {
        let n = bytes_for(dtype, dims)?;
        if n != bytes.len() {
            return Err(Error::invalid(format!(
                "{} tensor of dims {dims:?} needs {n} bytes, got {}",
                dtype,
                bytes.len()
            )));
        }
        let mut d = Data::zeros(dtype, dims)?;
        d.bytes_mut()?.copy_from_slice(bytes);
        Ok(d)
    }

    /// An F32 host tensor from values.
    pub fn from_f32(dims: &[usize], values: &[f32]) -> Result<Data> {
        Data::from_values(DataType::F32, dims, values)
    }

    /// An I32 host tensor from values.
    pub fn from_i32(dims: &[usize], values: &[i32]) -> Result<Data> {
        Data::from_values(DataType::I32, dims, values)
    }

    /// A host tensor of a plain element type `T` (`dtype`'s elements) from values.
    fn from_values<T: Copy>(dtype: DataType, dims: &[usize], values: &[T]) -> Result<Data> {
        let mut d = Data::zeros(dtype, dims)?;
        let dst = cast_slice_mut::<T>(d.bytes_mut()?)?;
        if dst.len() != values.len() {
            return Err(Error::invalid(format!(
                "dims {dims:?} hold {} values, got {}",
                dst.len(),
                values.len()
            )));
        }
        dst.copy_from_slice(values);
        Ok(d)
    }

    /// A zero-copy read-only view of `len` bytes at `offset` in `bytes` (e.g. an mmapped weight).
    pub fn from_shared(
        dtype: DataType,
        dims: &[usize],
        bytes: SharedBytes,
        offset: usize,
        len: usize,
    ) -> Result<Data> {
        let n = bytes_for(dtype, dims)?;
        let total = (*bytes).as_ref().len();
        if n != len || offset.checked_add(len).is_none_or(|e| e > total) {
            return Err(Error::invalid(format!(
                "view of {len} bytes at {offset} (buffer {total}) cannot hold {dtype} dims {dims:?} ({n} bytes)"
            )));
        }
        let mut d = Data::empty(dtype);
        d.dims = dims.to_vec();
        d.capacity = dims.to_vec();
        d.storage = Storage::Shared { bytes, offset, len };
        Ok(d)
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Logical dims.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Dims of the allocation (equal to [`Data::dims`] unless expanded).
    pub fn capacity(&self) -> &[usize] {
        &self.capacity
    }

    /// Number of logical elements.
    pub fn count(&self) -> usize {
        self.dims.iter().product()
    }

    /// Size of axis `i` (negative counts from the end); 0 when out of range.
    pub fn dim(&self, i: isize) -> usize {
        let n = self.dims.len() as isize;
        let i = if i < 0 { n + i } else { i };
        if i < 0 || i >= n {
            0
        } else {
            self.dims[i as usize]
        }
    }

    /// Strides in elements, row-major over the capacity dims.
    pub fn strides(&self) -> Vec<usize> {
        let mut s = vec![1usize; self.capacity.len()];
        for i in (0..self.capacity.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * self.capacity[i + 1];
        }
        s
    }

    /// True when the logical elements are one packed run at the start of storage (no
    /// expansion, or expansion only on axis 0).
    pub fn is_contiguous(&self) -> bool {
        self.dims.len() <= 1 || self.dims[1..] == self.capacity[1..]
    }

    /// Where the bytes live.
    pub fn device(&self) -> DeviceKind {
        self.device
    }

    /// The storage (for device backends).
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Replaces the storage with device memory (for device backends).
    pub fn set_device_storage(&mut self, device: DeviceKind, buf: Box<dyn DeviceBuffer>) {
        self.storage = Storage::Device(buf);
        self.device = device;
    }

    /// A tensor of `dtype` with logical `dims` and allocation `capacity` whose bytes are the
    /// device buffer `buf` on `device` (for device backends). `capacity` must have the rank of
    /// `dims`, be ≥ it on every axis, differ on at most one axis, and fit in `buf`.
    pub fn from_device(
        dtype: DataType,
        dims: &[usize],
        capacity: &[usize],
        device: DeviceKind,
        buf: Box<dyn DeviceBuffer>,
    ) -> Result<Data> {
        let need = bytes_for(dtype, capacity)?;
        let differing = dims.iter().zip(capacity).filter(|(d, c)| d != c).count();
        if capacity.len() != dims.len()
            || dims.iter().zip(capacity).any(|(d, c)| d > c)
            || differing > 1
            || buf.len() < need
        {
            return Err(Error::invalid(format!(
                "device tensor {dtype} dims {dims:?} capacity {capacity:?} does not fit a buffer of {} bytes",
                buf.len()
            )));
        }
        let mut d = Data::empty(dtype);
        d.dims = dims.to_vec();
        d.capacity = capacity.to_vec();
        d.storage = Storage::Device(buf);
        d.device = device;
        Ok(d)
    }

    /// The device buffer, mutable (for device backends writing in place).
    pub fn device_buffer_mut(&mut self) -> Option<&mut dyn DeviceBuffer> {
        match &mut self.storage {
            Storage::Device(b) => Some(b.as_mut()),
            _ => None,
        }
    }

    /// True when storage is allocated.
    pub fn is_allocated(&self) -> bool {
        !matches!(self.storage, Storage::None)
    }

    /// Bytes of the logical tensor when contiguous (for expanded data on axis 0, the prefix in
    /// use); the whole allocation otherwise.
    pub fn bytes(&self) -> Result<&[u8]> {
        let n = if self.is_contiguous() {
            bytes_for(self.dtype, &self.dims)?
        } else {
            bytes_for(self.dtype, &self.capacity)?
        };
        let all = self.raw_bytes()?;
        all.get(..n)
            .ok_or_else(|| Error::invalid(format!("{:?}: storage smaller than its dims", self)))
    }

    /// Mutable bytes (see [`Data::bytes`]); `Err` for read-only shared views.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        let n = if self.is_contiguous() {
            bytes_for(self.dtype, &self.dims)?
        } else {
            bytes_for(self.dtype, &self.capacity)?
        };
        let all = self.raw_bytes_mut()?;
        let len = all.len();
        all.get_mut(..n)
            .ok_or_else(|| Error::invalid(format!("storage of {len} bytes smaller than its dims")))
    }

    /// The whole allocation, capacity included.
    pub fn raw_bytes(&self) -> Result<&[u8]> {
        match &self.storage {
            Storage::Owned(buf) => Ok(buf.as_slice()),
            Storage::Shared { bytes, offset, len } => {
                Ok(&(**bytes).as_ref()[*offset..*offset + *len])
            }
            Storage::None => Err(Error::invalid(format!("{:?} has no storage", self))),
            Storage::Device(_) => Err(Error::invalid(format!(
                "{:?} lives on {}; copy it to the host first",
                self, self.device
            ))),
        }
    }

    /// The whole allocation, mutable; `Err` for shared or device storage.
    pub fn raw_bytes_mut(&mut self) -> Result<&mut [u8]> {
        let why = match &self.storage {
            Storage::Owned(_) => "",
            Storage::Shared { .. } => "is a read-only view",
            Storage::None => "has no storage",
            Storage::Device(_) => "lives on a device",
        };
        if !why.is_empty() {
            return Err(Error::invalid(format!("{self:?} {why}")));
        }
        match &mut self.storage {
            Storage::Owned(buf) => Ok(buf.as_mut_slice()),
            _ => Err(Error::invalid(format!("tensor storage {why}"))),
        }
    }

    fn expect_dtype(&self, want: DataType) -> Result<()> {
        if self.dtype != want {
            return Err(Error::invalid(format!(
                "{:?}: expected dtype {want}, found {}",
                self, self.dtype
            )));
        }
        Ok(())
    }

    /// The F32 elements (contiguous prefix; see [`Data::bytes`]).
    pub fn as_f32(&self) -> Result<&[f32]> {
        self.expect_dtype(DataType::F32)?;
        cast_slice(self.bytes()?)
    }

    /// The F32 elements, mutable.
    pub fn as_f32_mut(&mut self) -> Result<&mut [f32]> {
        self.expect_dtype(DataType::F32)?;
        cast_slice_mut(self.bytes_mut()?)
    }

    /// The I32 elements.
    pub fn as_i32(&self) -> Result<&[i32]> {
        self.expect_dtype(DataType::I32)?;
        cast_slice(self.bytes()?)
    }

    /// The I32 elements, mutable.
    pub fn as_i32_mut(&mut self) -> Result<&mut [i32]> {
        self.expect_dtype(DataType::I32)?;
        cast_slice_mut(self.bytes_mut()?)
    }

    /// The F16 elements.
    pub fn as_f16(&self) -> Result<&[f16]> {
        self.expect_dtype(DataType::F16)?;
        cast_slice(self.bytes()?)
    }

    /// The BF16 elements.
    pub fn as_bf16(&self) -> Result<&[bf16]> {
        self.expect_dtype(DataType::BF16)?;
        cast_slice(self.bytes()?)
    }

    /// All logical elements converted to f32 (dequantizing block types), in row-major order of
    /// the logical dims (gathering across expansion gaps). Meant for tests and debugging.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        if self.device != DeviceKind::Cpu {
            return Err(Error::invalid(format!("{:?}: copy to host first", self)));
        }
        let n = self.count();
        let mut out = vec![0f32; n];
        if self.dtype.is_interleaved() {
            let plain = self.plain_bytes()?;
            decode_to_f32(self.dtype.plain(), &plain, &mut out)?;
        } else {
            decode_to_f32(self.dtype, &self.packed_bytes()?, &mut out)?;
        }
        Ok(out)
    }

    /// Row `r` of an interleaved matrix (16 rows at a time for the CPU kernels) in the plain
    /// layout, into `out` (one plain row).
    pub fn plain_row(&self, r: usize, out: &mut [u8]) -> Result<()> {
        let (Some(t), &[n, k]) = (self.dtype.kernel_type(), self.dims()) else {
            return Err(Error::invalid(format!(
                "{self:?} is not an interleaved matrix"
            )));
        };
        interleaved::plain_row(t, self.bytes()?, n, k, r, out)
            .map_err(|e| Error::invalid(format!("{}: {e}", self.name)))
    }

    /// The whole interleaved matrix in the plain block layout.
    fn plain_bytes(&self) -> Result<Vec<u8>> {
        let &[n, k] = self.dims() else {
            return Err(Error::invalid(format!(
                "{self:?} is not an interleaved matrix"
            )));
        };
        let rb = self.dtype.row_bytes(k)?;
        let mut out = vec![0u8; n * rb];
        for (r, row) in out.chunks_exact_mut(rb.max(1)).enumerate() {
            self.plain_row(r, row)?;
        }
        Ok(out)
    }

    /// The logical tensor's bytes packed row-major (copying across expansion gaps if needed).
    pub fn packed_bytes(&self) -> Result<Vec<u8>> {
        if self.is_contiguous() {
            return Ok(self.bytes()?.to_vec());
        }
        self.gather_rows(self.raw_bytes()?)
    }

    /// The logical rows of an allocation `raw` laid out over the capacity dims (expansion on an
    /// inner axis), packed row-major.
    fn gather_rows(&self, raw: &[u8]) -> Result<Vec<u8>> {
        let axis = (0..self.dims.len())
            .find(|&i| self.dims[i] != self.capacity[i])
            .unwrap_or(0);
        let outer: usize = self.dims[..axis].iter().product();
        let inner_cap = bytes_for(self.dtype, &self.capacity[axis..])?;
        let inner_used = bytes_for(self.dtype, &self.dims[axis..])?;
        let mut out = Vec::with_capacity(outer * inner_used);
        for o in 0..outer {
            let row = raw
                .get(o * inner_cap..o * inner_cap + inner_used)
                .ok_or_else(|| {
                    Error::invalid(format!("{:?}: storage smaller than its capacity", self))
                })?;
            out.extend_from_slice(row);
        }
        Ok(out)
    }

    /// Makes this tensor `dtype` × `dims`, keeping the allocation when it is large enough and
    /// owned (outputs are reused across calls; bytes past the new size stay as they were).
    /// Expansion is dropped.
    pub fn resize(&mut self, dtype: DataType, dims: &[usize]) -> Result<()> {
        let need = bytes_for(dtype, dims)?;
        let fits = match &self.storage {
            Storage::Owned(buf) => buf.len() >= need,
            _ => false,
        };
        if !fits || self.device != DeviceKind::Cpu {
            self.storage = Storage::Owned(AlignedBuf::zeroed(need)?);
            self.device = DeviceKind::Cpu;
        }
        self.dtype = dtype;
        self.dims = dims.to_vec();
        self.capacity = dims.to_vec();
        Ok(())
    }

    /// Changes the dims without touching bytes (a view with the same element count);
    /// requires a contiguous tensor.
    pub fn reshape(&mut self, dims: &[usize]) -> Result<()> {
        if checked_count(dims)? != self.count() {
            return Err(Error::invalid(format!(
                "cannot reshape {:?} to {dims:?}: element counts differ",
                self.dims
            )));
        }
        if !self.is_contiguous() {
            return Err(Error::invalid(format!(
                "cannot reshape expanded tensor {:?} (capacity {:?})",
                self.dims, self.capacity
            )));
        }
        let be = self.dtype.block_elems();
        if be > 1 && dims.last().copied().unwrap_or(0) % be != 0 {
            return Err(Error::invalid(format!(
                "cannot reshape {} tensor to {dims:?}: last dim must be a multiple of {be}",
                self.dtype
            )));
        }
        // Keep capacity on axis 0 (still a prefix of storage).
        let extra = if self.capacity.is_empty() || self.dims.is_empty() || self.dims[0] == 0 {
            1
        } else {
            (self.capacity[0] / self.dims[0]).max(1)
        };
        self.dims = dims.to_vec();
        self.capacity = dims.to_vec();
        if extra > 1 && !dims.is_empty() && self.capacity.len() == self.dims.len() {
            // Capacity would not map cleanly onto the new shape; only keep it when exact.
            self.capacity[0] = dims[0];
        }
        Ok(())
    }

    /// Reserves room for `cap` entries along `axis` (expansion), keeping the current contents, so
    /// that appends along that axis ([`Data::append`], the `CatDirect` op) need no reallocation.
    pub fn reserve(&mut self, axis: usize, cap: usize) -> Result<()> {
        if axis >= self.dims.len() {
            return Err(Error::invalid(format!(
                "reserve: axis {axis} out of range for dims {:?}",
                self.dims
            )));
        }
        if self.dtype.is_quantized() && axis + 1 == self.dims.len() {
            return Err(Error::invalid(
                "reserve: cannot expand the packed last axis of a quantized tensor",
            ));
        }
        if let Some(a) = (0..self.dims.len()).find(|&i| self.dims[i] != self.capacity[i]) {
            if a != axis {
                return Err(Error::invalid(format!(
                    "reserve: tensor already expanded on axis {a}, cannot expand axis {axis}"
                )));
            }
        }
        if cap <= self.capacity[axis] {
            return Ok(());
        }
        let mut new_cap = self.capacity.clone();
        new_cap[axis] = cap;
        let n = bytes_for(self.dtype, &new_cap)?;
        let mut buf = AlignedBuf::zeroed(n)?;
        if self.is_allocated() && self.count() > 0 {
            let old_raw = self.raw_bytes()?;
            let outer: usize = self.dims[..axis].iter().product();
            let old_inner = bytes_for(self.dtype, &self.capacity[axis..])?;
            let used = bytes_for(self.dtype, &self.dims[axis..])?;
            let new_inner = bytes_for(self.dtype, &new_cap[axis..])?;
            let dst = buf.as_mut_slice();
            for o in 0..outer {
                dst[o * new_inner..o * new_inner + used]
                    .copy_from_slice(&old_raw[o * old_inner..o * old_inner + used]);
            }
        }
        self.capacity = new_cap;
        self.storage = Storage::Owned(buf);
        self.device = DeviceKind::Cpu;
        Ok(())
    }

    /// Appends `other` along `axis` in place (growing capacity by doubling when it runs out).
    /// All other dims and the dtype must match. This is the body of the `CatDirect` op.
    pub fn append(&mut self, other: &Data, axis: usize) -> Result<()> {
        if self.dims.is_empty() && !self.is_allocated() {
            // First append into an empty tensor: become a copy of `other`.
            self.dtype = other.dtype;
            self.dims = other.dims.clone();
            self.capacity = other.dims.clone();
            self.storage = Storage::Owned(AlignedBuf::zeroed(0)?);
            let mut fresh = Data::zeros(other.dtype, &other.dims)?;
            fresh.bytes_mut()?.copy_from_slice(&other.packed_bytes()?);
            *self = fresh;
            return Ok(());
        }
        if other.dtype != self.dtype
            || other.dims.len() != self.dims.len()
            || axis >= self.dims.len()
            || (0..self.dims.len()).any(|i| i != axis && self.dims[i] != other.dims[i])
        {
            return Err(Error::invalid(format!(
                "cannot append {} {:?} to {} {:?} along axis {axis}",
                other.dtype, other.dims, self.dtype, self.dims
            )));
        }
        let need = self.dims[axis] + other.dims[axis];
        if need > self.capacity[axis] {
            let cap = need.max(self.capacity[axis] * 2).max(1);
            self.reserve(axis, cap)?;
        }
        let outer: usize = self.dims[..axis].iter().product();
        let inner_cap = bytes_for(self.dtype, &self.capacity[axis..])?;
        let at = bytes_for(self.dtype, &self.dims[axis..])?;
        let src = other.packed_bytes()?;
        let chunk = bytes_for(other.dtype, &other.dims[axis..])?;
        let dst = self.raw_bytes_mut()?;
        for o in 0..outer {
            let d0 = o * inner_cap + at;
            dst[d0..d0 + chunk].copy_from_slice(&src[o * chunk..(o + 1) * chunk]);
        }
        self.dims[axis] = need;
        Ok(())
    }

    /// Sets the logical length of `axis` to `len` (≤ capacity) without touching bytes; used to
    /// truncate a KV cache.
    pub fn set_len(&mut self, axis: usize, len: usize) -> Result<()> {
        if axis >= self.dims.len() || len > self.capacity[axis] {
            return Err(Error::invalid(format!(
                "set_len: axis {axis} len {len} beyond capacity {:?}",
                self.capacity
            )));
        }
        self.dims[axis] = len;
        Ok(())
    }

    /// A host copy of this tensor (deep copy of the logical elements).
    pub fn to_owned_host(&self) -> Result<Data> {
        let bytes = match &self.storage {
            Storage::Device(d) if self.is_contiguous() => d.to_host()?,
            Storage::Device(d) => self.gather_rows(&d.to_host()?)?,
            _ => self.packed_bytes()?,
        };
        let n = bytes_for(self.dtype, &self.dims)?;
        let bytes = bytes
            .get(..n)
            .ok_or_else(|| Error::invalid(format!("{:?}: storage smaller than its dims", self)))?;
        let mut d = Data::from_bytes(self.dtype, &self.dims, bytes)?;
        d.name = self.name.clone();
        Ok(d)
    }
}

/// Decodes `n = dst.len()` elements of `dtype` from packed bytes into f32.
pub fn decode_to_f32(dtype: DataType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    use fastllm_cpu::quant::*;
    let need = bytes_for(dtype, &[dst.len()]).or_else(|_| {
        // quantized tensors whose total is a multiple of 32
        bytes_for(
            dtype,
            &[dst.len() / dtype.block_elems(), dtype.block_elems()],
        )
    })?;
    if src.len() < need {
        return Err(Error::invalid(format!(
            "decode {dtype}: {} bytes for {} elements",
            src.len(),
            dst.len()
        )));
    }
    match dtype {
        DataType::F32 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DataType::I32 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32;
            }
        }
        DataType::F16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DataType::BF16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DataType::Q8_0 => dequantize_q8_0(&src[..need], dst),
        DataType::Q4_0 => dequantize_q4_0(&src[..need], dst),
        DataType::Q4_1 => dequantize_q4_1(&src[..need], dst),
        DataType::Q5_0 => dequantize_q5_0(&src[..need], dst),
        DataType::Q4K => fastllm_cpu::kquant::dequantize_q4_k(&src[..need], dst),
        DataType::Q5K => fastllm_cpu::kquant::dequantize_q5_k(&src[..need], dst),
        DataType::Q6K => fastllm_cpu::kquant::dequantize_q6_k(&src[..need], dst),
        DataType::Q2K => fastllm_cpu::kquant_low::dequantize_q2_k(&src[..need], dst),
        DataType::Q3K => fastllm_cpu::kquant_low::dequantize_q3_k(&src[..need], dst),
        DataType::Mxfp4 => fastllm_cpu::mxfp4::dequantize_mxfp4(&src[..need], dst),
        DataType::Q8_0Interleaved
        | DataType::Q4_0Interleaved
        | DataType::Q4_1Interleaved
        | DataType::F16Interleaved
        | DataType::BF16Interleaved
        | DataType::Q4KInterleaved
        | DataType::Q5KInterleaved
        | DataType::Q6KInterleaved
        | DataType::Q2KInterleaved
        | DataType::Q3KInterleaved => {
            return Err(Error::invalid(format!(
            "decode {dtype}: interleaved rows are decoded through their tensor (Data::to_f32_vec)"
        )))
        }
    }
    Ok(())
}

/// Encodes f32 values into `dtype` (quantizing block types; K-quants by plain round-to-nearest,
/// without a scale search); `src.len()` must be a multiple of the block size.
pub fn encode_from_f32(dtype: DataType, src: &[f32]) -> Result<Vec<u8>> {
    use fastllm_cpu::quant::*;
    let n = bytes_for(dtype, &[src.len()])?;
    let mut out = vec![0u8; n];
    match dtype {
        DataType::F32 => {
            for (c, v) in out.chunks_exact_mut(4).zip(src) {
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        DataType::I32 => {
            for (c, v) in out.chunks_exact_mut(4).zip(src) {
                c.copy_from_slice(&(*v as i32).to_le_bytes());
            }
        }
        DataType::F16 => {
            for (c, v) in out.chunks_exact_mut(2).zip(src) {
                c.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
            }
        }
        DataType::BF16 => {
            for (c, v) in out.chunks_exact_mut(2).zip(src) {
                c.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
            }
        }
        DataType::Q8_0 => quantize_q8_0(src, &mut out),
        DataType::Q4_0 => quantize_q4_0(src, &mut out),
        DataType::Q4_1 => quantize_q4_1(src, &mut out),
        DataType::Q5_0 => quantize_q5_0(src, &mut out),
        DataType::Q4K => fastllm_cpu::kquant::quantize_q4_k(src, &mut out),
        DataType::Q5K => fastllm_cpu::kquant::quantize_q5_k(src, &mut out),
        DataType::Q6K => fastllm_cpu::kquant::quantize_q6_k(src, &mut out),
        DataType::Q2K => fastllm_cpu::kquant_low::quantize_q2_k(src, &mut out),
        DataType::Q3K => fastllm_cpu::kquant_low::quantize_q3_k(src, &mut out),
        DataType::Mxfp4 => fastllm_cpu::mxfp4::quantize_mxfp4(src, &mut out),
        DataType::Q8_0Interleaved
        | DataType::Q4_0Interleaved
        | DataType::Q4_1Interleaved
        | DataType::F16Interleaved
        | DataType::BF16Interleaved
        | DataType::Q4KInterleaved
        | DataType::Q5KInterleaved
        | DataType::Q6KInterleaved
        | DataType::Q2KInterleaved
        | DataType::Q3KInterleaved => {
            return Err(Error::invalid(format!(
                "encode {dtype}: encode the plain type, then interleave the tensor"
            )))
        }
    }
    Ok(out)
}

/// The number of `T` in `len` bytes at `ptr`; `Err` when they are misaligned for `T`.
fn cast_len<T>(ptr: *const u8, len: usize) -> Result<usize> {
    let sz = std::mem::size_of::<T>();
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) || !len.is_multiple_of(sz) {
        return Err(Error::invalid("misaligned tensor storage"));
    }
    Ok(len / sz)
}
fn cast_slice<T: Copy>(b: &[u8]) -> Result<&[T]> {
    let n = cast_len::<T>(b.as_ptr(), b.len())?;
    // SAFETY: alignment and length checked; T is a plain number type.
    Ok(unsafe { std::slice::from_raw_parts(b.as_ptr() as *const T, n) })
}
fn cast_slice_mut<T: Copy>(b: &mut [u8]) -> Result<&mut [T]> {
    let n = cast_len::<T>(b.as_ptr(), b.len())?;
    // SAFETY: alignment and length checked; T is a plain number type.
    Ok(unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut T, n) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_grows_in_place() {
        let mut kv = Data::zeros(DataType::F32, &[2, 0, 3]).unwrap();
        kv.reserve(1, 4).unwrap();
        let before = kv.raw_bytes().unwrap().as_ptr();
        for step in 0..4 {
            let x = Data::from_f32(&[2, 1, 3], &[step as f32; 6]).unwrap();
            kv.append(&x, 1).unwrap();
        }
        assert_eq!(kv.raw_bytes().unwrap().as_ptr(), before, "reallocated");
        assert_eq!(kv.dims(), &[2, 4, 3]);
        let v = kv.to_f32_vec().unwrap();
        assert_eq!(&v[..12], &[0., 0., 0., 1., 1., 1., 2., 2., 2., 3., 3., 3.]);
        // grows past capacity by reallocating, contents kept
        let x = Data::from_f32(&[2, 1, 3], &[9.0; 6]).unwrap();
        kv.append(&x, 1).unwrap();
        assert_eq!(kv.dims(), &[2, 5, 3]);
        assert_eq!(kv.to_f32_vec().unwrap()[12..15], [9.0; 3]);
    }

    #[test]
    fn shape_errors_are_errors() {
        assert!(Data::zeros(DataType::Q4_0, &[3, 33]).is_err());
        assert!(Data::zeros(DataType::F32, &[usize::MAX, 3]).is_err());
        assert!(Data::from_f32(&[2, 2], &[1.0; 3]).is_err());
    }
}
