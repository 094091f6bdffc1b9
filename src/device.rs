//! The device seam: the `Operator` trait (one op on one device: `can_run`, `reshape`, `run`), the
//! `BaseDevice` trait (a named op registry plus data movement), and `OutputCopy`, the form in
//! which a producer op may leave a copy of its output for the next op (the `quantize_output`
//! parameter both sides read). The op argument containers (`DataDict`, `FloatDict`, `IntDict`)
//! are [`crate::dict`]'s, re-exported here.
//!
//! This module must not know any concrete op or device.

use crate::data::{Data, DataType, DeviceKind};
use crate::error::{Error, Result};
use std::collections::HashMap;

pub use crate::dict::{DataDict, FloatDict, IntDict, ScalarDict, Slot};

/// One op as implemented by one device (fastllm's `BaseOperator`).
pub trait Operator: Send + Sync {
    /// Whether this implementation accepts these arguments (dtypes, sizes). Cheap; no errors.
    fn can_run(&self, _datas: &DataDict, _floats: &FloatDict, _ints: &IntDict) -> bool {
        true
    }
    /// Shape inference: validates inputs and sizes/allocates the outputs. Errors name the op,
    /// the argument and the shapes.
    fn reshape(&self, datas: &mut DataDict, floats: &FloatDict, ints: &IntDict) -> Result<()>;
    /// Computes the outputs.
    fn run(&self, datas: &mut DataDict, floats: &FloatDict, ints: &IntDict) -> Result<()>;
    /// Read-only inputs this implementation takes where they are when they live in host memory
    /// (small index arrays it checks on the host before a kernel touches memory, then copies
    /// itself): the executor does not copy them onto the device first. Default: none.
    fn host_inputs(&self) -> &'static [&'static str] {
        &[]
    }
}

/// Op name → operator.
pub type OpRegistry = HashMap<&'static str, Box<dyn Operator>>;

/// A compute device: a registry of operators plus data movement (fastllm's `BaseDevice`).
pub trait BaseDevice: Send + Sync {
    /// Human-readable name, e.g. `"cpu"`.
    fn name(&self) -> &str;
    /// Where this device keeps tensors.
    fn kind(&self) -> DeviceKind;
    /// The operators this device implements.
    fn ops(&self) -> &OpRegistry;
    /// Whether this device runs `op` with these arguments.
    fn can_run(&self, op: &str, datas: &DataDict, floats: &FloatDict, ints: &IntDict) -> bool {
        self.ops()
            .get(op)
            .is_some_and(|o| o.can_run(datas, floats, ints))
    }
    /// Copies a tensor onto this device (host tensors for the CPU device).
    fn upload(&self, data: &Data) -> Result<Data>;
    /// The form in which this device reads a resident weight matrix fastest, when it differs from
    /// the file's (the CPU's block weights interleaved 16 rows at a time); `None` keeps `data` as
    /// it is. Only for matrices that `Linear` and `Embedding` read, in `fast` precision.
    fn weight_form(&self, _data: &Data) -> Result<Option<Data>> {
        Ok(None)
    }
    /// Moves a tensor that this device wrote back to host memory, in place.
    fn download(&self, data: &mut Data) -> Result<()>;
    /// The dtypes in which this device stores a KV cache (and its attention reads it).
    fn kv_dtypes(&self) -> &[DataType] {
        &[DataType::F32]
    }
    /// Waits until the work this device has queued is done (a no-op for synchronous devices
    /// such as the CPU).
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    /// Copies host tensor `src` into the existing allocation of `dst`, a tensor on this device
    /// of the same dtype and at least as many elements (`dst` keeps its address, so work
    /// recorded with [`BaseDevice::begin_recording`] reads the new values). Enqueued in order
    /// with the device's other work. Devices without recording: `Unsupported`.
    fn write(&self, _src: &Data, _dst: &mut Data) -> Result<()> {
        Err(Error::Unsupported(format!(
            "{}: write into a device tensor",
            self.name()
        )))
    }
    /// Starts recording the work that ops enqueue on this device instead of running it (a CUDA
    /// graph). While recording, ops must not allocate, copy to or from the host or wait.
    /// Devices without recording: `Unsupported`.
    fn begin_recording(&self) -> Result<()> {
        Err(Error::Unsupported(format!("{}: recording", self.name())))
    }
    /// Ends recording; the recorded work, to pass to [`BaseDevice::replay`]. Must follow every
    /// successful [`BaseDevice::begin_recording`], also when an op failed in between.
    fn end_recording(&self) -> Result<Box<dyn std::any::Any + Send + Sync>> {
        Err(Error::Unsupported(format!("{}: recording", self.name())))
    }
    /// Enqueues recorded work again. `Ok(false)` (nothing enqueued) when the recording is stale:
    /// a buffer it used was freed since, so it must be recorded again.
    fn replay(&self, _recording: &(dyn std::any::Any + Send + Sync)) -> Result<bool> {
        Err(Error::Unsupported(format!("{}: replay", self.name())))
    }
    /// Rewrites a step before the executor runs it on this device: this device's passes
    /// (fusions of consecutive calls into the forms its kernels take; see [`crate::step`]).
    /// The result must compute what the calls given compute. Default: none.
    fn plan_step(&self, _step: &mut crate::step::Step) -> Result<()> {
        Ok(())
    }
}

/// A copy of a producer op's output (`RMSNorm`, `SiluMul`) in the form the next `Linear`
/// reads, so that `Linear` skips converting its input. Only valid when that `Linear` is the next
/// op on the device and its input is this output, unchanged. Devices that cannot keep such a
/// copy (the CPU) ignore it; the CUDA device keeps it (the `quantize_output` parameter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputCopy {
    /// No copy.
    None,
    /// Q8_0 rows, for a one-row `Linear` with `quant_act` and a block weight.
    Q8,
    /// f16 rows, for the tensor-core path of a `quant_act` `Linear` of many rows with f16 or
    /// block weights.
    F16,
    /// bf16 rows, the same for bf16 weights.
    Bf16,
}

/// Up to this many rows, a `fast` `Linear` with Q8_0/Q4_0/Q4_1 weights reads its input as Q8_0
/// rows (the CUDA device's int8 tensor-core products): the copy its producer leaves. More rows
/// take the f16 tensor-core products (the f16 copy).
pub const Q8_COPY_MAX_ROWS: usize = 16;

impl OutputCopy {
    /// The half form a tensor-core `Linear` (CUDA, `fast` precision) reads and writes with a
    /// weight of dtype `w` and `k` inputs: bf16 for BF16 weights, f16 for F16 weights and for
    /// block weights of whole 32-value blocks, [`OutputCopy::None`] for anything else (no
    /// tensor-core path).
    pub fn tensor_core_form(w: DataType, k: usize) -> OutputCopy {
        match w {
            DataType::BF16 => OutputCopy::Bf16,
            DataType::F16 => OutputCopy::F16,
            t if t.is_quantized() && k.is_multiple_of(32) => OutputCopy::F16,
            _ => OutputCopy::None,
        }
    }

    /// The `quantize_output` parameter value (0 … 3).
    pub fn param(self) -> i32 {
        match self {
            OutputCopy::None => 0,
            OutputCopy::Q8 => 1,
            OutputCopy::F16 => 2,
            OutputCopy::Bf16 => 3,
        }
    }
}
