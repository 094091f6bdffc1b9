//! `CpuDevice`: adapts `Data` arguments to the kernels of the `fastllm-cpu` crate and registers
//! them by op name. One file per op family; each has a `register` function adding its operators.
//!
//! A device runs in one of two kernel modes: `Fast` (SIMD, threads) or `Reference` (the plain
//! scalar kernels, single-threaded) — the op test harness compares the two.
//!
//! [`Executor::cpu`], the executor with just a CPU device, is defined here so that the executor
//! itself names no device.

use crate::data::{Data, DataType, DeviceKind};
use crate::device::{BaseDevice, OpRegistry};
use crate::error::{Error, Result};
use crate::executor::Executor;
use fastllm_cpu::threads::Threads;
use std::sync::Arc;

mod activation;
mod args;
mod attention;
mod elementwise;
mod embedding;
mod kv;
mod linear;
pub(crate) mod moe;
mod norm;
mod paged;
mod rope;
mod sample;
mod select;
mod shape;

/// Which kernels a CPU device runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelMode {
    /// SIMD fast paths, multithreaded.
    Fast,
    /// Plain scalar reference kernels, one thread.
    Reference,
}

/// What every CPU operator shares: the thread pool and the kernel mode.
pub struct CpuContext {
    /// The worker pool.
    pub threads: Threads,
    /// Fast or reference kernels.
    pub mode: KernelMode,
}

impl CpuContext {
    /// True in reference mode.
    pub fn reference(&self) -> bool {
        self.mode == KernelMode::Reference
    }
}

/// The CPU device.
pub struct CpuDevice {
    ctx: Arc<CpuContext>,
    ops: OpRegistry,
    /// Whether resident block, F16 and BF16 weights are interleaved at load
    /// ([`BaseDevice::weight_form`]).
    interleave_weights: bool,
    /// Steps are rewritten by the shared passes ([`crate::step_passes`]: q/k/v and gate/up as
    /// one multi-weight `Linear`, `SiluMul`); [`crate::options::RuntimeOptions::fused_ops`].
    fuse: bool,
}

impl CpuDevice {
    /// A CPU device with fast kernels on `threads` threads (0 = all cores).
    pub fn new(threads: usize) -> Result<CpuDevice> {
        Self::with_mode(threads, KernelMode::Fast)
    }

    /// A CPU device with the given kernel mode (reference mode always uses one thread).
    pub fn with_mode(threads: usize, mode: KernelMode) -> Result<CpuDevice> {
        let threads = if mode == KernelMode::Reference {
            1
        } else {
            threads
        };
        let threads = Threads::new(threads).map_err(Error::Device)?;
        let ctx = Arc::new(CpuContext { threads, mode });
        let mut ops = OpRegistry::new();
        elementwise::register(&mut ops, &ctx);
        paged::register(&mut ops, &ctx);
        kv::register(&mut ops, &ctx);
        activation::register(&mut ops, &ctx);
        attention::register(&mut ops, &ctx);
        embedding::register(&mut ops, &ctx);
        norm::register(&mut ops, &ctx);
        rope::register(&mut ops, &ctx);
        select::register(&mut ops, &ctx);
        sample::register(&mut ops, &ctx);
        shape::register(&mut ops, &ctx);
        linear::register(&mut ops, &ctx);
        moe::register(&mut ops, &ctx);
        Ok(CpuDevice {
            ctx,
            ops,
            interleave_weights: true,
            fuse: true,
        })
    }

    /// This device, rewriting each step it runs with the shared passes (`true`, the default) or
    /// running every op in its plain form (`false`): the same results either way.
    pub fn with_fused_ops(mut self, on: bool) -> CpuDevice {
        self.fuse = on;
        self
    }

    /// This device, holding block, F16 and BF16 weights as the file has them (`false`) or interleaved 16 rows
    /// at a time where its SIMD kernels read them faster (`true`, the default).
    pub fn with_interleaved_weights(mut self, on: bool) -> CpuDevice {
        self.interleave_weights = on;
        self
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.ctx.threads.n()
    }

    /// The kernel mode.
    pub fn mode(&self) -> KernelMode {
        self.ctx.mode
    }
}

impl Executor {
    /// An executor with one fast CPU device using `threads` threads (0 = all cores).
    pub fn cpu(threads: usize) -> Result<Executor> {
        let mut e = Executor::new();
        e.add_device(Arc::new(CpuDevice::new(threads)?));
        Ok(e)
    }

    /// [`Executor::cpu`] with the fused step forms on or off (`fused_ops`).
    pub fn cpu_with(threads: usize, fused_ops: bool) -> Result<Executor> {
        let mut e = Executor::new();
        e.add_device(Arc::new(CpuDevice::new(threads)?.with_fused_ops(fused_ops)));
        Ok(e)
    }
}

impl BaseDevice for CpuDevice {
    fn name(&self) -> &str {
        "cpu"
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }
    fn ops(&self) -> &OpRegistry {
        &self.ops
    }
    fn upload(&self, data: &Data) -> Result<Data> {
        data.to_owned_host()
    }
    fn weight_form(&self, data: &Data) -> Result<Option<Data>> {
        let kernels = data
            .dtype()
            .kernel_type()
            .is_some_and(fastllm_cpu::linear::interleaved::available_for);
        if !self.interleave_weights || self.ctx.mode == KernelMode::Reference || !kernels {
            return Ok(None);
        }
        crate::interleave::interleave(data)
    }
    fn kv_dtypes(&self) -> &[DataType] {
        &kv::KV_DTYPES
    }
    fn download(&self, _data: &mut Data) -> Result<()> {
        Ok(())
    }
    fn plan_step(&self, step: &mut crate::step::Step) -> Result<()> {
        if self.fuse && self.ctx.mode == KernelMode::Fast {
            crate::step_passes::silu_mul(step);
            crate::step_passes::multi_linear(step, false);
        }
        Ok(())
    }
}
