//! `ActQuant`: the GPU buffer of Q8_0-quantized activation rows that `Linear` reads with
//! `quant_act = 1` and a block weight, and the record of which input it holds. `Linear`
//! quantizes its input into it (the `quantize_q8_f32` kernel) unless the record says the rows
//! are already there: left by the previous `Linear` of the same input (`reuse_act = 1`), or
//! written by the op that produced the input (`RMSNorm` / `SiluMul` with
//! `quantize_output = 1`), which saves a kernel launch per projection in a decode step.

use super::buffer::CudaBuffer;
use super::gpu::Gpu;
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex};

/// The form in which the buffer holds a copy of the activation rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActForm {
    /// Q8_0 blocks: `rows · k` int8 values, then `rows · k / 32` (d, d·Σq) float pairs.
    Q8,
    /// IEEE half, row-major `rows × k`.
    F16,
    /// bfloat16, row-major `rows × k`.
    Bf16,
}

impl ActForm {
    /// The copy the producer op is asked for by its `quantize_output` parameter: 1 = Q8_0 rows,
    /// 2 = f16 rows, 3 = bf16 rows, anything else none.
    pub fn from_param(v: i32) -> Option<ActForm> {
        match v {
            1 => Some(ActForm::Q8),
            2 => Some(ActForm::F16),
            3 => Some(ActForm::Bf16),
            _ => None,
        }
    }
}

/// Which rows the buffer holds: the quantization (or f16/bf16 copy) of `rows` × `k` floats at
/// `input`, written into the buffer at `scratch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantKey {
    /// Device address of the f32 rows that were quantized.
    pub input: u64,
    /// Rows.
    pub rows: usize,
    /// Values per row (a multiple of 32).
    pub k: usize,
    /// Address of the buffer they were written to (a regrown buffer invalidates the key).
    pub scratch: u64,
    /// The form of the copy.
    pub form: ActForm,
}

/// What the last writer left: the key and whether a producing op (not a `Linear`) wrote it.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    /// The rows held.
    pub key: QuantKey,
    /// Written by `RMSNorm`/`SiluMul` with `quantize_output = 1` for the next `Linear`.
    pub produced: bool,
    /// Left by a row-split norm: the producer's f32 output holds only this rank's rows, so the
    /// next `Linear` must read these rows.
    pub split: bool,
}

/// The shared buffer and its record (one per GPU; the stream is in order, so one buffer serves
/// every op).
pub struct ActQuant {
    gpu: Arc<Gpu>,
    buffer: Mutex<Option<CudaBuffer>>,
    held: Mutex<Option<Held>>,
}

fn poisoned() -> Error {
    Error::Device("activation quantization buffer poisoned".into())
}

impl ActQuant {
    /// An empty buffer on `gpu`.
    pub fn new(gpu: &Arc<Gpu>) -> ActQuant {
        ActQuant {
            gpu: gpu.clone(),
            buffer: Mutex::new(None),
            held: Mutex::new(None),
        }
    }

    /// Addresses of the quantized values (`rows · k` int8) and of the block scales
    /// (`rows · k / 32` float pairs) for `rows` × `k` (k % 32 == 0), growing the buffer when
    /// needed (which marks recorded graphs stale and forgets what it held). Returns
    /// `(values, scales, key for input)`.
    pub fn slots(&self, input: u64, rows: usize, k: usize) -> Result<(u64, u64, QuantKey)> {
        if !k.is_multiple_of(32) {
            return Err(Error::invalid(format!(
                "Q8_0 activations need k % 32 == 0, got {k}"
            )));
        }
        let values = rows
            .checked_mul(k)
            .ok_or_else(|| Error::invalid("activation rows too large"))?;
        let need = values + values / 32 * 8;
        let sp = self.reserve(need)?;
        let key = QuantKey {
            input,
            rows,
            k,
            scratch: sp,
            form: ActForm::Q8,
        };
        Ok((sp, sp + values as u64, key))
    }

    /// Address of an f16 / bf16 copy (`form`) of `rows` × `k` floats at `input`, growing the
    /// buffer when needed, and the key that records it. `Err` for [`ActForm::Q8`] (see
    /// [`ActQuant::slots`]).
    pub fn half_slot(
        &self,
        input: u64,
        rows: usize,
        k: usize,
        form: ActForm,
    ) -> Result<(u64, QuantKey)> {
        if form == ActForm::Q8 {
            return Err(Error::invalid("half_slot takes the f16/bf16 forms"));
        }
        let need = rows
            .checked_mul(k)
            .and_then(|v| v.checked_mul(2))
            .ok_or_else(|| Error::invalid("activation rows too large"))?;
        let sp = self.reserve(need)?;
        let key = QuantKey {
            input,
            rows,
            k,
            scratch: sp,
            form,
        };
        Ok((sp, key))
    }

    /// The buffer's address, grown to at least `need` bytes first.
    fn reserve(&self, need: usize) -> Result<u64> {
        let mut guard = self.buffer.lock().map_err(|_| poisoned())?;
        if guard.as_ref().is_none_or(|b| b.len_bytes() < need) {
            let fresh = CudaBuffer::zeroed(&self.gpu, need.next_power_of_two())?;
            // the old buffer may be recorded in a CUDA graph
            self.gpu.bump_generation();
            *guard = Some(fresh);
            *self.held.lock().map_err(|_| poisoned())? = None;
        }
        Ok(guard.as_ref().map(|b| b.ptr()).unwrap_or(0))
    }

    /// Takes what the buffer holds (the record is cleared: only the next call may use it).
    pub fn take(&self) -> Result<Option<Held>> {
        Ok(self.held.lock().map_err(|_| poisoned())?.take())
    }

    /// Records that the buffer now holds `key`'s rows.
    pub fn set(&self, key: QuantKey, produced: bool) -> Result<()> {
        self.hold(Held {
            key,
            produced,
            split: false,
        })
    }

    /// Records that the buffer now holds `key`'s rows, written by a row-split norm whose f32
    /// output is not whole (see [`Held::split`]).
    pub fn set_split(&self, key: QuantKey) -> Result<()> {
        self.hold(Held {
            key,
            produced: true,
            split: true,
        })
    }

    fn hold(&self, held: Held) -> Result<()> {
        *self.held.lock().map_err(|_| poisoned())? = Some(held);
        Ok(())
    }
}
