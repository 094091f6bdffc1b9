//! `CudaDevice`: NVIDIA GPUs through `cudarc` (driver, NVRTC and cuBLAS loaded at run time, so
//! the same binary runs where CUDA is absent: [`CudaDevice::new`] then returns `Err`). Operators
//! are registered by op name, one file per op family, and run on one in-order stream (a few
//! products beside it on side streams, forked from it and joined back into it). Kernels come
//! from `kernels/*.cu` (see [`kernels`]). An op this device does not accept falls back to the
//! next device of the `Executor` (the CPU), with a one-time log line per op.
//!
//! This module owns device memory and data movement; it must not know about models.

use crate::data::{bytes_for, Data, DataType, DeviceKind, Storage};
use crate::device::{BaseDevice, DataDict, FloatDict, IntDict, OpRegistry};
use crate::error::{Error, Result};
use crate::options::RuntimeOptions;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

mod act_quant;
mod attention;
pub mod blas;
pub mod buffer;
mod elementwise;
mod embedding;
mod fuse;
mod glu;
pub mod gpu;
pub mod kernels;
mod kv;
mod linear;
mod linear_mma;
mod linear_mmq;
mod matmul;
mod mm_split;
mod moe;
pub mod nccl;
mod norm;
pub mod p2p;
mod paged;
mod paged_decode;
mod rope;
mod sample;
mod select;
mod shape;

pub use attention::{decode_splits, DECODE_MAX_HD, DECODE_MAX_QUERIES, TC_MIN_QUERIES};
pub use linear::{tensor_core_rows, TC_MIN_ROWS};
pub use paged_decode::paged_decode_splits;

use buffer::{alloc_data, dptr};
use gpu::Gpu;

/// A CUDA GPU as a fastllm device.
pub struct CudaDevice {
    gpu: Arc<Gpu>,
    ops: OpRegistry,
    name: String,
    fallback_logged: Mutex<HashSet<String>>,
    /// Steps are rewritten by this device's passes ([`RuntimeOptions::fused_ops`]).
    fuse: bool,
    /// The peer-to-peer group of a tensor-parallel rank, which its operators sum over.
    group: p2p::GroupSlot,
}

/// A recorded step: its graph and the group reductions in it (their epochs count from the base
/// written before each replay, see `p2p::P2pGroup::replay`).
struct RecordedStep {
    graph: gpu::Graph,
    reductions: u32,
}

impl CudaDevice {
    /// Opens GPU `ordinal` with the default [`RuntimeOptions`]. `Err` (never a panic) when the
    /// driver library, the device or NVRTC is missing; the message starts with "no CUDA device"
    /// in the first two cases.
    pub fn new(ordinal: u32) -> Result<CudaDevice> {
        CudaDevice::with_options(ordinal, &RuntimeOptions::default())
    }

    /// [`CudaDevice::new`] keeping its compiled kernels under `opts`'s cache directory, and
    /// fusing the calls of the steps it runs unless `opts` turns [`RuntimeOptions::fused_ops`]
    /// off (see `fuse`).
    pub fn with_options(ordinal: u32, opts: &RuntimeOptions) -> Result<CudaDevice> {
        let gpu = Gpu::open(ordinal, opts.cache_dir().ok())?;
        let mut ops = OpRegistry::new();
        let act = Arc::new(act_quant::ActQuant::new(&gpu));
        let group = p2p::GroupSlot::default();
        elementwise::register(&mut ops, &gpu, &act);
        glu::register(&mut ops, &gpu);
        norm::register(&mut ops, &gpu, &act, &group);
        paged::register(&mut ops, &gpu);
        paged_decode::register(&mut ops, &gpu, &act, opts.batch_invariant);
        embedding::register(&mut ops, &gpu);
        linear::register(&mut ops, &gpu, &act, opts.batch_invariant, &group);
        attention::register(&mut ops, &gpu, &act);
        kv::register(&mut ops, &gpu);
        rope::register(&mut ops, &gpu);
        shape::register(&mut ops, &gpu);
        select::register(&mut ops, &gpu);
        sample::register(&mut ops, &gpu);
        moe::register(&mut ops, &gpu);
        matmul::register(&mut ops, &gpu);
        p2p::register(&mut ops, &gpu, &group);
        Ok(CudaDevice {
            name: format!("cuda:{ordinal}"),
            gpu,
            ops,
            fallback_logged: Mutex::new(HashSet::new()),
            fuse: opts.fused_ops,
            group,
        })
    }

    /// True when the CUDA driver library loads and reports at least one device.
    pub fn available() -> bool {
        gpu::probe(0).is_ok()
    }

    /// The GPU's name and compute capability, e.g. "NVIDIA H100 80GB HBM3 (sm_90)".
    pub fn description(&self) -> String {
        let (a, b) = self.gpu.arch();
        format!("{} (sm_{a}{b})", self.gpu.name())
    }

    /// Compiles (or loads from the disk cache) every kernel now rather than at first use.
    pub fn warm_up(&self) -> Result<()> {
        self.gpu.function("silu_f32").map(|_| ())
    }

    /// Waits until all queued GPU work is done (for timing).
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.sync()
    }

    /// Makes `g` (from `NcclComm::enable_p2p`) the group this device's operators sum over
    /// (`AllReduceAdd`, `RMSNorm` with `all_reduce`); `Err` when it already has one.
    pub fn attach_group(&self, g: Arc<p2p::P2pGroup>) -> Result<()> {
        self.group
            .set(g)
            .map_err(|_| Error::invalid(format!("{}: already in a group", self.name)))
    }

    /// How many one-row products of this rank pushed their outputs into the peers'
    /// low-latency slots as they wrote them (`push_peers`); 0 outside a group.
    pub fn peer_pushes(&self) -> u64 {
        self.group.get().map_or(0, |g| g.ll_pushes())
    }

    /// How many fused norms of this rank split their rows over the group (`row_split`); 0
    /// outside a group.
    pub fn split_norms(&self) -> u64 {
        self.group.get().map_or(0, |g| g.split_norms())
    }

    /// The underlying context (for tests and benchmarks in this crate).
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    fn log_fallback(&self, op: &str, datas: &DataDict) {
        if let Ok(mut seen) = self.fallback_logged.lock() {
            if seen.insert(op.to_string()) {
                let args: Vec<String> = datas
                    .iter()
                    .map(|(n, d)| format!("{n}: {} {:?}", d.dtype(), d.dims()))
                    .collect();
                eprintln!(
                    "fastllm: {}: op {op} is not run on the GPU for these arguments ({}); falling back to the next device",
                    self.name,
                    args.join(", ")
                );
            }
        }
    }
}

impl BaseDevice for CudaDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn synchronize(&self) -> Result<()> {
        self.gpu.sync()
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda(self.gpu.ordinal())
    }
    fn ops(&self) -> &OpRegistry {
        &self.ops
    }
    fn can_run(&self, op: &str, datas: &DataDict, floats: &FloatDict, ints: &IntDict) -> bool {
        let ok = self
            .ops
            .get(op)
            .is_some_and(|o| o.can_run(datas, floats, ints));
        if !ok {
            self.log_fallback(op, datas);
        }
        ok
    }
    fn upload(&self, data: &Data) -> Result<Data> {
        let kind = self.kind();
        if data.device() == kind {
            // Same device: a device-side copy.
            let mut out = alloc_data(&self.gpu, data.dtype(), data.dims(), data.capacity())?;
            let n = bytes_for(data.dtype(), data.capacity())?;
            self.gpu
                .dtod(dptr(data, "upload")?, dptr(&out, "upload")?, n)?;
            out.name = data.name.clone();
            return Ok(out);
        }
        if let Storage::Device(_) = data.storage() {
            // Another device: through the host.
            return self.upload(&data.to_owned_host()?);
        }
        if !data.is_allocated() {
            return Ok(Data::empty(data.dtype()));
        }
        if data.dtype() == DataType::Mxfp4 {
            // no MXFP4 kernels here: widened on the host to BF16 (exact, 3.76x the bytes)
            return self.upload(&crate::devices::widen::mxfp4_to_bf16(data)?);
        }
        let mut out = alloc_data(&self.gpu, data.dtype(), data.dims(), data.capacity())?;
        // Contiguous (or expanded on axis 0): the used prefix; otherwise the whole allocation.
        let bytes = if data.is_contiguous() {
            data.bytes()?
        } else {
            data.raw_bytes()?
        };
        let cap = bytes_for(data.dtype(), data.capacity())?;
        let n = bytes.len().min(cap);
        self.gpu
            .htod(bytes.get(..n).unwrap_or(&[]), dptr(&out, "upload")?)?;
        out.name = data.name.clone();
        out.lock_in_cpu = data.lock_in_cpu;
        Ok(out)
    }
    fn write(&self, src: &Data, dst: &mut Data) -> Result<()> {
        if dst.device() != self.kind() || src.device() != DeviceKind::Cpu {
            return Err(Error::invalid(format!(
                "{}: write needs a host source and a destination on this device",
                self.name
            )));
        }
        if src.dtype() != dst.dtype() || src.count() > dst.count() || !src.is_contiguous() {
            return Err(Error::invalid(format!(
                "{}: cannot write {} {:?} into {} {:?}",
                self.name,
                src.dtype(),
                src.dims(),
                dst.dtype(),
                dst.dims()
            )));
        }
        let bytes = src.bytes()?;
        let room = buffer::device_len(dst).unwrap_or(0);
        if bytes.len() > room {
            return Err(Error::invalid(format!(
                "{}: {} bytes do not fit a buffer of {room}",
                self.name,
                bytes.len()
            )));
        }
        self.gpu.htod(bytes, dptr(dst, "write")?)
    }
    fn plan_step(&self, step: &mut crate::step::Step) -> Result<()> {
        if self.fuse {
            fuse::plan(step)?;
        }
        Ok(())
    }
    fn begin_recording(&self) -> Result<()> {
        let group = self.group.get();
        if let Some(g) = group {
            g.begin_recording()?;
        }
        let started = self.gpu.begin_capture();
        if let (Err(_), Some(g)) = (&started, group) {
            g.end_recording()?;
        }
        started
    }
    fn end_recording(&self) -> Result<Box<dyn std::any::Any + Send + Sync>> {
        // both end, whichever fails
        let reductions = self.group.get().map(|g| g.end_recording()).transpose();
        let graph = self.gpu.end_capture();
        Ok(Box::new(RecordedStep {
            reductions: reductions?.unwrap_or(0),
            graph: graph?,
        }))
    }
    fn replay(&self, recording: &(dyn std::any::Any + Send + Sync)) -> Result<bool> {
        let Some(r) = recording.downcast_ref::<RecordedStep>() else {
            return Err(Error::invalid(format!(
                "{}: replay of work recorded elsewhere",
                self.name
            )));
        };
        match self.group.get() {
            Some(g) if r.reductions > 0 => {
                g.replay(&self.gpu, r.reductions, || self.gpu.replay(&r.graph))
            }
            _ => self.gpu.replay(&r.graph),
        }
    }
    fn kv_dtypes(&self) -> &[DataType] {
        &kv::KV_DTYPES
    }
    fn download(&self, data: &mut Data) -> Result<()> {
        if data.device() != self.kind() {
            return Ok(());
        }
        let name = std::mem::take(&mut data.name);
        let mut host = data.to_owned_host()?;
        if data.capacity() != data.dims() {
            if let Some(axis) =
                (0..data.dims().len()).find(|&i| data.dims()[i] != data.capacity()[i])
            {
                host.reserve(axis, data.capacity()[axis])?;
            }
        }
        host.name = name;
        *data = host;
        Ok(())
    }
}

/// True when every named argument that is present is F32.
fn all_f32(d: &DataDict, names: &[&str]) -> bool {
    names.iter().all(|n| {
        d.get(n)
            .is_none_or(|t| t.dtype() == crate::data::DataType::F32)
    })
}

/// An `Err` for `op` saying `msg`.
fn op_err(op: &str, msg: impl std::fmt::Display) -> Error {
    Error::op(op, msg)
}

/// `v` as a y or z grid dimension (at most 65535), else an `Err` for `op` saying `msg`.
fn grid_dim(op: &str, v: usize, msg: &str) -> Result<u32> {
    u32::try_from(v)
        .ok()
        .filter(|&d| d <= 65535)
        .ok_or_else(|| op_err(op, msg))
}
