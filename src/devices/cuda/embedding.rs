//! `Embedding` on the GPU: gathers rows of a weight of any dtype into f32. Token ids are checked
//! against the vocabulary on the host first (they are few), so a bad id is an `Err`; with the
//! int `checked = 1` ids that live on the GPU are not read back (the caller validated them before
//! uploading; a decode step recorded as a CUDA graph cannot wait for the device), and the kernel
//! clamps any id to the vocabulary so memory outside the weight is never read.

use super::buffer::{dptr, ensure_out};
use super::gpu::{int, long, Gpu, KArg};
use super::op_err;
use crate::data::{Data, DataType, Storage};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    ops.insert("Embedding", Box::new(Embedding(gpu.clone())));
}

/// Kernel name suffix of a weight dtype (`f32`, `q4_1`, ...); `None` for I32 and MXFP4.
pub fn weight_suffix(dt: DataType) -> Option<&'static str> {
    // (MXFP4 has no kernels: such weights are widened to BF16 at upload)
    (!matches!(dt, DataType::I32 | DataType::Mxfp4)).then(|| dt.name())
}

fn host_ids(ids: &Data) -> Result<Vec<i32>> {
    match ids.storage() {
        Storage::Device(b) => {
            let bytes = b.to_host()?;
            Ok(bytes
                .chunks_exact(4)
                .take(ids.count())
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        }
        _ => Ok(ids.as_i32()?.to_vec()),
    }
}

struct Embedding(Arc<Gpu>);

impl Operator for Embedding {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input") == Some(DataType::I32)
            && d.dtype("weight").and_then(weight_suffix).is_some()
            && d.get("weight").is_some_and(|w| w.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let ids = d.require("Embedding", "input")?;
        let w = d.require("Embedding", "weight")?;
        if w.dims().len() != 2 {
            return Err(op_err(
                "Embedding",
                format!("weight {:?} must be [vocab, d]", w.dims()),
            ));
        }
        let vocab = w.dim(0);
        let trusted = i.get_or("checked", 0) != 0 && matches!(ids.storage(), Storage::Device(_));
        let host = if trusted { Vec::new() } else { host_ids(ids)? };
        for (i, &t) in host.iter().enumerate() {
            if t < 0 || t as usize >= vocab {
                return Err(op_err(
                    "Embedding",
                    format!("input[{i}] = {t} is outside the vocabulary 0..{vocab}"),
                ));
            }
        }
        let dims = [ids.count(), w.dim(1)];
        ensure_out(
            &self.0,
            d.require_mut("Embedding", "output")?,
            DataType::F32,
            &dims,
        )
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let ([ids, w], y) = d.io("Embedding", ["input", "weight"], "output")?;
        let ids = ids.ok_or_else(|| op_err("Embedding", "missing input 'input'"))?;
        let w = w.ok_or_else(|| op_err("Embedding", "missing input 'weight'"))?;
        let suffix = weight_suffix(w.dtype()).ok_or_else(|| op_err("Embedding", "weight dtype"))?;
        let dd = w.dim(1);
        let n = u32::try_from(ids.count()).map_err(|_| op_err("Embedding", "too many ids"))?;
        self.0.launch(
            &format!("embedding_{suffix}"),
            (n, 1, 1),
            128,
            &[
                KArg::Ptr(dptr(ids, "input")?),
                KArg::Ptr(dptr(w, "weight")?),
                KArg::Ptr(dptr(y, "output")?),
                int(dd, "d")?,
                long(w.dtype().row_bytes(dd)?, "row bytes")?,
                int(w.dim(0), "vocabulary")?,
            ],
        )
    }
}
