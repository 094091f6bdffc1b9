//! `Gpu`: one CUDA context and its stream, the run-time compiled kernel module, the optional
//! cuBLAS handle, and the raw primitives the operators use (copies, launches). Side streams,
//! each with a cuBLAS handle, take products that run beside the stream's work between a fork
//! and a join. It must not know any op's semantics.

use super::kernels;
use crate::error::{Error, Result};
use cudarc::driver::{
    result as dres, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream, LaunchConfig,
    PushKernelArg,
};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A GPU context with one in-order stream; every operator enqueues on it.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: u32,
    arch: (i32, i32),
    driver_version: i32,
    name: String,
    module: OnceLock<std::result::Result<Arc<CudaModule>, String>>,
    /// Kernels whose compiled code waits for the previous kernel's results
    /// (`griddepcontrol.wait`, see `pdl_wait` in kernels/common.cuh), found in the PTX when the
    /// module loads. Only these are launched with programmatic dependent launch.
    pdl_kernels: OnceLock<HashSet<String>>,
    /// Programmatic dependent launch is used (compute capability ≥ 9.0): a kernel's blocks may start, and read their weights, while the previous kernel
    /// finishes; they wait in `pdl_wait` before touching anything that kernel writes.
    pdl: bool,
    /// Where compiled kernels are cached (none: not cached).
    kernel_cache: Option<PathBuf>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    blas: Option<Mutex<cudarc::cublas::CudaBlas>>,
    /// Streams beside `stream` for products that run at the same time as its own, between a
    /// [`Gpu::fork`] and a [`Gpu::join`] (none without cuBLAS).
    side: Option<SideStreams>,
    /// Page-locked host buffer that large device-to-host copies go through (the copy engine
    /// writes it directly; into pageable memory the driver stages each copy again); grown on
    /// demand up to [`STAGING_MAX`].
    staging: Mutex<Option<cudarc::driver::PinnedHostSlice<u8>>>,
    /// Multiprocessors on the device (sizes the split-K decode attention grid).
    sms: usize,
    /// Shared memory limits: (most one block may ask for after opting in, per multiprocessor,
    /// reserved by the system per block), in bytes.
    smem: SharedMemory,
    /// Kernels whose dynamic shared-memory limit was raised to `smem.block_optin`.
    big_smem: Mutex<HashSet<String>>,
    /// True while the stream records a CUDA graph: allocations, host copies and waits are
    /// refused then (they cannot be recorded), so a capture that would need them fails cleanly.
    capturing: AtomicBool,
    /// Bumped whenever an operator frees or replaces a scratch buffer that kernels read: a
    /// graph recorded under an older generation may point at freed memory and must not replay.
    generation: AtomicU64,
}

/// Side streams a [`Gpu`] opens.
const SIDE_STREAMS: usize = 2;

/// A second in-order stream with its own cuBLAS handle (so its own workspace), and the event
/// its work is joined back by.
struct SideStream {
    stream: Arc<CudaStream>,
    blas: Mutex<cudarc::cublas::CudaBlas>,
    done: CudaEvent,
}

/// A [`Gpu`]'s side streams and the event they are forked from (events made once: recording
/// one again does not change what an earlier wait on it waits for).
struct SideStreams {
    streams: Vec<SideStream>,
    forked: CudaEvent,
}

/// A device's shared-memory limits, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct SharedMemory {
    /// The most one block may use once its kernel opts in (at least the default 48 KiB).
    pub block_optin: usize,
    /// Per multiprocessor, shared by its resident blocks.
    pub per_sm: usize,
    /// Taken by the system from the multiprocessor's memory for every resident block.
    pub reserved_per_block: usize,
}

/// A recorded CUDA graph of work on a [`Gpu`]'s stream, with the scratch generation it was
/// recorded under.
pub struct Graph {
    graph: cudarc::driver::CudaGraph,
    generation: u64,
}

// SAFETY: the graph handle is only launched through `&Graph` from the thread holding the model
// (the model serialises its use); the driver objects may move between threads.
unsafe impl Send for Graph {}
// SAFETY: as above; `launch` takes `&self` but every user holds the model's `&mut` cache.
unsafe impl Sync for Graph {}

/// Copies from the GPU at least this large go through the pinned staging buffer.
const STAGING_MIN: usize = 1 << 20;
/// Largest pinned staging buffer; larger copies go through it in chunks.
const STAGING_MAX: usize = 64 << 20;

fn dev_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Device(format!("{what}: {e}"))
}

/// Checks that the CUDA driver library can be loaded and that a device `ordinal` exists; the
/// message of the `Err` says which part is missing.
pub fn probe(ordinal: u32) -> Result<()> {
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::Device(
            "no CUDA device: the CUDA driver library (libcuda) is not installed".into(),
        ));
    }
    let n = std::panic::catch_unwind(CudaContext::device_count)
        .map_err(|_| Error::Device("no CUDA device: the CUDA driver library is unusable".into()))?
        .map_err(|e| Error::Device(format!("no CUDA device: {e}")))?;
    if n <= 0 {
        return Err(Error::Device(
            "no CUDA device: the driver reports 0 devices".into(),
        ));
    }
    if ordinal as i64 >= n as i64 {
        return Err(Error::Device(format!(
            "no CUDA device cuda:{ordinal}: only {n} device(s)"
        )));
    }
    // SAFETY: only tries to dlopen the NVRTC library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Device(
            "CUDA device found but NVRTC (libnvrtc) is missing, so kernels cannot be compiled"
                .into(),
        ));
    }
    Ok(())
}

impl Gpu {
    /// Opens device `ordinal` (after [`probe`]); compiled kernels are cached under
    /// `kernel_cache` (none: compiled again by every process).
    pub fn open(ordinal: u32, kernel_cache: Option<PathBuf>) -> Result<Arc<Gpu>> {
        probe(ordinal)?;
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal as usize))
            .map_err(|_| Error::Device(format!("cuda:{ordinal}: context creation panicked")))?
            .map_err(|e| dev_err(&format!("cuda:{ordinal}: context"), e))?;
        // One stream, in order: no per-buffer event tracking needed.
        // SAFETY: called before any allocation on this context.
        unsafe { ctx.disable_event_tracking() };
        // A created stream rather than the legacy default stream, which cannot be captured
        // into a CUDA graph.
        let stream = ctx
            .new_stream()
            .map_err(|e| dev_err(&format!("cuda:{ordinal}: stream"), e))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map(|v| v.max(1) as usize)
            .unwrap_or(1);
        let attr = |a| ctx.attribute(a).map(|v| v.max(0) as usize).unwrap_or(0);
        use cudarc::driver::sys::CUdevice_attribute as A;
        let smem = SharedMemory {
            block_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
                .max(48 * 1024),
            per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
            reserved_per_block: attr(A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK),
        };
        let arch = ctx
            .compute_capability()
            .map_err(|e| dev_err("compute capability", e))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let mut driver_version = 0i32;
        // SAFETY: writes one int.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) };
        // SAFETY: only tries to dlopen cuBLAS.
        let blas = if unsafe { cudarc::cublas::sys::is_culib_present() } {
            std::panic::catch_unwind(|| cudarc::cublas::CudaBlas::new(stream.clone()))
                .ok()
                .and_then(|r| r.ok())
                .map(Mutex::new)
        } else {
            None
        };
        let side = blas.as_ref().and_then(|_| side_streams(&ctx));
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            ordinal,
            arch,
            driver_version,
            name,
            module: OnceLock::new(),
            pdl_kernels: OnceLock::new(),
            pdl: arch.0 >= 9,
            kernel_cache,
            functions: Mutex::new(HashMap::new()),
            blas,
            side,
            staging: Mutex::new(None),
            sms,
            smem,
            big_smem: Mutex::new(HashSet::new()),
            capturing: AtomicBool::new(false),
            generation: AtomicU64::new(0),
        }))
    }

    /// The driver context (shared with what must outlive nothing but it).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Number of multiprocessors.
    pub fn sms(&self) -> usize {
        self.sms
    }

    /// The device's shared-memory limits.
    pub fn shared_memory(&self) -> SharedMemory {
        self.smem
    }

    /// True while a graph is being recorded on the stream.
    pub fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    /// `Err` naming `what` while a graph is being recorded (for calls that cannot be recorded).
    pub fn not_capturing(&self, what: &str) -> Result<()> {
        if self.capturing() {
            return Err(Error::Device(format!(
                "{what} while recording a CUDA graph (the step is not graph-safe)"
            )));
        }
        Ok(())
    }

    /// Marks every recorded graph stale (an operator is about to free a scratch buffer).
    pub fn bump_generation(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Starts recording the stream's work into a graph (nothing runs until it is launched).
    pub fn begin_capture(&self) -> Result<()> {
        self.not_capturing("begin_capture")?;
        self.stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(|e| dev_err("begin graph capture", e))?;
        self.capturing.store(true, Ordering::Release);
        Ok(())
    }

    /// Ends recording and instantiates the graph (`Err` if the capture was invalidated).
    pub fn end_capture(&self) -> Result<Graph> {
        let generation = self.generation.load(Ordering::Acquire);
        let r = self
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        self.capturing.store(false, Ordering::Release);
        let graph = r
            .map_err(|e| dev_err("end graph capture", e))?
            .ok_or_else(|| Error::Device("graph capture recorded nothing".into()))?;
        Ok(Graph { graph, generation })
    }

    /// Enqueues a recorded graph. `Ok(false)` (nothing enqueued) when a scratch buffer it
    /// uses was replaced since it was recorded.
    pub fn replay(&self, g: &Graph) -> Result<bool> {
        self.not_capturing("graph launch")?;
        if g.generation != self.generation.load(Ordering::Acquire) {
            return Ok(false);
        }
        g.graph.launch().map_err(|e| dev_err("graph launch", e))?;
        Ok(true)
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Marketing name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (major, minor).
    pub fn arch(&self) -> (i32, i32) {
        self.arch
    }

    /// The stream every operation is enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The cuBLAS handle, when cuBLAS could be loaded.
    pub fn blas(&self) -> Option<&Mutex<cudarc::cublas::CudaBlas>> {
        self.blas.as_ref()
    }

    /// The cuBLAS handle of side stream `i` (see [`Gpu::fork`]), when it exists.
    pub fn side_blas(&self, i: usize) -> Option<&Mutex<cudarc::cublas::CudaBlas>> {
        self.side.as_ref()?.streams.get(i).map(|s| &s.blas)
    }

    /// How many side streams there are (0 without cuBLAS, else 2).
    pub fn side_streams(&self) -> usize {
        self.side.as_ref().map_or(0, |s| s.streams.len())
    }

    /// Makes the first `n` side streams wait for the work queued on the stream so far: what is
    /// then queued on them runs beside the stream's own work until [`Gpu::join`]. A recorded
    /// graph gets the same fork.
    pub fn fork(&self, n: usize) -> Result<()> {
        let Some(side) = self.side.as_ref().filter(|_| n > 0) else {
            return Ok(());
        };
        side.forked
            .record(&self.stream)
            .map_err(|e| dev_err("fork: event", e))?;
        for s in side.streams.iter().take(n) {
            s.stream
                .wait(&side.forked)
                .map_err(|e| dev_err("fork: wait", e))?;
        }
        Ok(())
    }

    /// Makes the stream wait for everything queued on the first `n` side streams (the end of
    /// a [`Gpu::fork`]; a graph being recorded must be joined before it ends).
    pub fn join(&self, n: usize) -> Result<()> {
        let streams = self.side.as_ref().map_or(&[][..], |s| &s.streams[..]);
        for s in streams.iter().take(n) {
            s.done
                .record(&s.stream)
                .map_err(|e| dev_err("join: event", e))?;
            self.stream
                .wait(&s.done)
                .map_err(|e| dev_err("join: wait", e))?;
        }
        Ok(())
    }

    /// Makes this context current on the calling thread (before raw driver or cuBLAS calls).
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| dev_err("bind context", e))
    }

    /// Waits for all queued work.
    pub fn sync(&self) -> Result<()> {
        self.not_capturing("stream synchronize")?;
        self.stream
            .synchronize()
            .map_err(|e| dev_err("synchronize", e))
    }

    /// GPU time of the work `f` enqueues, in milliseconds (CUDA events around it).
    pub fn timed(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        use cudarc::driver::sys::CUevent_flags;
        let start = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| dev_err("event", e))?;
        f()?;
        let end = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| dev_err("event", e))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| dev_err("event time", e))?;
        Ok(ms as f64)
    }

    /// Enqueues a copy of `src` to device address `dst`. `src` is pageable host memory, which
    /// the driver stages before returning, so the caller may drop it at once; the stream is not
    /// synchronised (small per-step uploads such as token ids must not stall the queue).
    pub fn htod(&self, src: &[u8], dst: u64) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.not_capturing("copy to GPU")?;
        self.bind()?;
        // SAFETY: dst is a device allocation of at least src.len() bytes (callers check sizes).
        // For pageable memory cuMemcpyHtoDAsync copies `src` to a staging buffer before it
        // returns, so `src` is no longer read after this call.
        unsafe { dres::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| dev_err("copy to GPU", e))
    }

    /// Copies `dst.len()` bytes from device address `src` into `dst` (blocking).
    pub fn dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.not_capturing("copy from GPU")?;
        self.bind()?;
        if dst.len() >= STAGING_MIN && self.dtoh_staged(src, dst)? {
            return Ok(());
        }
        // SAFETY: src holds at least dst.len() bytes (callers check sizes); we synchronize
        // before returning so dst is written.
        unsafe { dres::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| dev_err("copy from GPU", e))?;
        self.sync()
    }

    /// [`Gpu::dtoh`] through the pinned staging buffer, in chunks of at most [`STAGING_MAX`].
    /// `Ok(false)` when no pinned buffer can be had (the caller copies directly).
    fn dtoh_staged(&self, src: u64, dst: &mut [u8]) -> Result<bool> {
        let mut guard = self
            .staging
            .lock()
            .map_err(|_| Error::Device("GPU staging buffer lock poisoned".into()))?;
        let want = dst.len().min(STAGING_MAX);
        if guard.as_ref().is_none_or(|b| b.len() < want) {
            *guard = None; // free the old one first
            let size = want.next_power_of_two().min(STAGING_MAX);
            // SAFETY: plain page-locked memory (flags 0: readable by the CPU at full speed,
            // unlike write-combined memory); only used while `guard` is held.
            match unsafe { self.ctx.alloc_pinned_with_flags::<u8>(size, 0) } {
                Ok(b) => *guard = Some(b),
                Err(_) => return Ok(false),
            }
        }
        let Some(buf) = guard.as_mut() else {
            return Ok(false);
        };
        let pinned = buf
            .as_mut_slice()
            .map_err(|e| dev_err("staging buffer", e))?;
        let mut done = 0usize;
        for chunk in dst.chunks_mut(want) {
            let stage = &mut pinned[..chunk.len()];
            // SAFETY: src + done .. + chunk.len() lies inside the source allocation (dst.len()
            // bytes were requested from it); stage is page-locked and we synchronize before
            // reading it.
            unsafe { dres::memcpy_dtoh_async(stage, src + done as u64, self.stream.cu_stream()) }
                .map_err(|e| dev_err("copy from GPU", e))?;
            self.sync()?;
            chunk.copy_from_slice(stage);
            done += chunk.len();
        }
        Ok(true)
    }

    /// Enqueues a device-to-device copy of `n` bytes.
    pub fn dtod(&self, src: u64, dst: u64, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges are inside live device allocations (callers check sizes).
        unsafe { dres::memcpy_dtod_async(dst, src, n, self.stream.cu_stream()) }
            .map_err(|e| dev_err("copy on GPU", e))
    }

    fn module(&self) -> Result<Arc<CudaModule>> {
        let m = self.module.get_or_init(|| {
            let k = kernels::compiled(self.arch, self.driver_version, self.kernel_cache.as_deref())
                .map_err(|e| e.to_string())?;
            let _ = self
                .pdl_kernels
                .set(kernels::entries_waiting_on_predecessor(&k.ptx));
            // the machine code where NVRTC made it (no JIT), else (or where the driver refuses
            // it) the PTX, which the driver compiles
            let binary = k.cubin.and_then(|bin| {
                self.ctx
                    .load_module(cudarc::nvrtc::Ptx::from_binary(bin))
                    .ok()
            });
            match binary {
                Some(m) => Ok(m),
                None => self
                    .ctx
                    .load_module(cudarc::nvrtc::Ptx::from_src(k.ptx))
                    .map_err(|e| format!("loading kernels: {e}")),
            }
        });
        m.clone().map_err(Error::Device)
    }

    /// The kernel `name` (compiling the kernel sources on first use).
    pub fn function(&self, name: &str) -> Result<CudaFunction> {
        if let Ok(map) = self.functions.lock() {
            if let Some(f) = map.get(name) {
                return Ok(f.clone());
            }
        }
        let f = self
            .module()?
            .load_function(name)
            .map_err(|e| dev_err(&format!("kernel {name}"), e))?;
        if let Ok(mut map) = self.functions.lock() {
            map.insert(name.to_string(), f.clone());
        }
        Ok(f)
    }

    /// Launches kernel `name` with `grid` × `block` threads and arguments `args` (in the order
    /// of the kernel's parameters).
    pub fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        args: &[KArg],
    ) -> Result<()> {
        self.launch_smem(name, grid, block, 0, args)
    }

    /// [`Gpu::launch`] with `smem` bytes of dynamic shared memory per block (more than 48 KiB
    /// raises the kernel's limit to the device's opt-in maximum first).
    pub fn launch_smem(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[KArg],
    ) -> Result<()> {
        if smem as usize > self.smem.block_optin {
            return Err(Error::invalid(format!(
                "launch {name}: {smem} bytes of shared memory exceed this GPU's {} per block",
                self.smem.block_optin
            )));
        }
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let f = self.function(name)?;
        if smem > 48 * 1024 {
            self.raise_smem_limit(name, &f)?;
        }
        if self.pdl && self.pdl_kernels.get().is_some_and(|k| k.contains(name)) {
            return self.launch_pdl(name, &f, grid, block, smem, args);
        }
        let mut b = self.stream.launch_builder(&f);
        for a in args {
            match a {
                KArg::Ptr(v) | KArg::U64(v) => b.arg(v),
                KArg::I32(v) => b.arg(v),
                KArg::I64(v) => b.arg(v),
                KArg::F32(v) => b.arg(v),
                KArg::Permute(v) => b.arg(v),
                KArg::Segs(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: each operator validates sizes before launching and passes arguments that
        // match the kernel's signature in kernels/*.cu.
        unsafe { b.launch(cfg) }.map_err(|e| dev_err(&format!("launch {name}"), e))?;
        Ok(())
    }

    /// Lets kernel `name` ask for up to the opt-in maximum of dynamic shared memory less its
    /// static shared memory (once).
    fn raise_smem_limit(&self, name: &str, f: &CudaFunction) -> Result<()> {
        let mut done = self
            .big_smem
            .lock()
            .map_err(|_| Error::Device("shared-memory limit table poisoned".into()))?;
        if done.contains(name) {
            return Ok(());
        }
        // the opt-in maximum covers the kernel's static shared memory too
        let fixed = f
            .shared_size_bytes()
            .map_err(|e| dev_err(&format!("static shared memory of {name}"), e))?;
        let most = i32::try_from(self.smem.block_optin)
            .unwrap_or(i32::MAX)
            .saturating_sub(fixed.max(0));
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            most,
        )
        .map_err(|e| dev_err(&format!("shared-memory limit of {name}"), e))?;
        done.insert(name.to_string());
        Ok(())
    }

    /// Whether kernels that wait for their predecessor are launched with programmatic
    /// dependent launch on this GPU (see the `pdl` field).
    pub fn uses_pdl(&self) -> bool {
        self.pdl
    }

    /// Whether kernel `name` is launched with programmatic dependent launch (compiling the
    /// kernels first if needed).
    pub fn launches_with_pdl(&self, name: &str) -> Result<bool> {
        self.module()?;
        Ok(self.pdl && self.pdl_kernels.get().is_some_and(|k| k.contains(name)))
    }

    /// Launch with the programmatic-stream-serialization attribute (`cuLaunchKernelEx`): the
    /// kernel may begin before the previous one on the stream has finished; its code (checked
    /// in the PTX: `pdl_kernels`) waits for that kernel before reading or writing shared data.
    fn launch_pdl(
        &self,
        name: &str,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[KArg],
    ) -> Result<()> {
        use cudarc::driver::sys;
        self.bind()?;
        let mut store: Vec<KArg> = args.to_vec();
        let mut params: Vec<*mut std::ffi::c_void> = store
            .iter_mut()
            .map(|a| match a {
                KArg::Ptr(v) | KArg::U64(v) => v as *mut u64 as *mut std::ffi::c_void,
                KArg::I32(v) => v as *mut i32 as *mut std::ffi::c_void,
                KArg::I64(v) => v as *mut i64 as *mut std::ffi::c_void,
                KArg::F32(v) => v as *mut f32 as *mut std::ffi::c_void,
                KArg::Permute(v) => v as *mut PermuteArgs as *mut std::ffi::c_void,
                KArg::Segs(v) => v as *mut LinSegs as *mut std::ffi::c_void,
            })
            .collect();
        // SAFETY: an all-zero attribute value is valid (a union of plain integers).
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.programmaticStreamSerializationAllowed = 1;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `params` points at one live value per kernel parameter, in the kernel's
        // order and with its C layout (`store` outlives the call); sizes were validated by the
        // operator, as for `launch_smem`.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| dev_err(&format!("launch {name}"), e))
    }

    /// A 1-D grid covering `n` items with `block` threads each (capped; kernels loop).
    pub fn grid_for(n: usize, block: u32) -> (u32, u32, u32) {
        let blocks = n.div_ceil(block as usize).clamp(1, 65535 * 8) as u32;
        (if n == 0 { 0 } else { blocks }, 1, 1)
    }
}

/// [`SIDE_STREAMS`] streams of `ctx`, each with a cuBLAS handle; none when one fails.
fn side_streams(ctx: &Arc<CudaContext>) -> Option<SideStreams> {
    let one = || {
        let stream = ctx.new_stream().ok()?;
        let blas = std::panic::catch_unwind(|| cudarc::cublas::CudaBlas::new(stream.clone()))
            .ok()?
            .ok()?;
        Some(SideStream {
            stream,
            blas: Mutex::new(blas),
            done: ctx.new_event(None).ok()?,
        })
    };
    Some(SideStreams {
        streams: (0..SIDE_STREAMS)
            .map(|_| one())
            .collect::<Option<Vec<_>>>()?,
        forked: ctx.new_event(None).ok()?,
    })
}

/// One kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum KArg {
    /// A device address (0 = null).
    Ptr(u64),
    /// A 64-bit unsigned integer.
    U64(u64),
    /// `int`.
    I32(i32),
    /// `long` (64-bit on the device).
    I64(i64),
    /// `float`.
    F32(f32),
    /// The `PermuteArgs` struct of kernels/shape.cu.
    Permute(PermuteArgs),
    /// The `LinSegs` struct of kernels/linear.cu, passed by value.
    Segs(LinSegs),
}

/// `struct LinSegs` of kernels/linear.cu, passed by value: up to three weights (address, bias
/// address or 0, output address, rows) that one GEMV launch streams.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LinSegs {
    /// Weight addresses.
    pub w: [u64; 3],
    /// Bias addresses (0 = none).
    pub b: [u64; 3],
    /// Output addresses.
    pub y: [u64; 3],
    /// Rows (output features) of each weight; 0 for unused entries.
    pub n: [i32; 3],
    /// Non-zero: add the products to the outputs.
    pub acc: i32,
    /// Blocks of weight rows of each weight (the batched block products; each weight starts a
    /// new block).
    pub tiles: [i32; 3],
    /// k splits of each weight (the batched block products: the split of its product alone).
    pub splits: [i32; 3],
    /// One-row kernels: the context of the peer-to-peer group whose peers' low-latency slots
    /// each output is also pushed into (0: none).
    pub p2p: u64,
    /// The epoch offset of the reduction those pushes are for (`P2pGroup::ll_push_ctx`).
    pub p2p_ek: i32,
}

// SAFETY: plain-old-data with the C layout of the kernel's struct (10 pointers, 11 ints).
unsafe impl cudarc::driver::DeviceRepr for LinSegs {}

/// `struct PermuteArgs` of kernels/shape.cu, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PermuteArgs {
    /// Number of dims (≤ 8).
    pub ndim: i32,
    /// Output dims.
    pub dims: [i64; 8],
    /// Input stride (elements) of each output axis.
    pub strides: [i64; 8],
}

// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl cudarc::driver::DeviceRepr for PermuteArgs {}

/// usize → kernel `long`, an `Err` naming `what` when it does not fit.
pub fn long(v: usize, what: &str) -> Result<KArg> {
    i64::try_from(v)
        .map(KArg::I64)
        .map_err(|_| Error::invalid(format!("{what} = {v} is too large")))
}

/// usize → kernel `int`, an `Err` naming `what` when it does not fit.
pub fn int(v: usize, what: &str) -> Result<KArg> {
    i32::try_from(v)
        .map(KArg::I32)
        .map_err(|_| Error::invalid(format!("{what} = {v} is too large for this kernel")))
}
