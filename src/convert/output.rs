//! The writing side of a conversion, shared by the GGUF and Hugging Face importers: each mapped
//! source tensor is converted to its stored form, added to the `.flm` writer and reported to
//! the caller's progress callback; the totals become the [`ConvertReport`].

use super::dtype_policy::DtypePlan;
use super::names::Mapped;
use super::tensor_transform::{stored_dims, transform, SourceTensor};
use super::{ConvertReport, Progress};
use crate::error::{Error, Result};
use crate::format::flm::FlmWriter;

/// A `.flm` file being filled with `total` converted tensors.
pub(crate) struct TensorOutput<'p, 'c> {
    writer: FlmWriter,
    dtypes: DtypePlan,
    progress: &'p mut dyn FnMut(&Progress<'_>),
    architecture: &'c str,
    total: usize,
    done: usize,
    bytes: u64,
}

impl<'p, 'c> TensorOutput<'p, 'c> {
    /// Writes through `writer`, storing each tensor in the dtype `dtypes` picks.
    pub(crate) fn new(
        writer: FlmWriter,
        dtypes: DtypePlan,
        architecture: &'c str,
        total: usize,
        progress: &'p mut dyn FnMut(&Progress<'_>),
    ) -> TensorOutput<'p, 'c> {
        TensorOutput {
            writer,
            dtypes,
            progress,
            architecture,
            total,
            done: 0,
            bytes: 0,
        }
    }

    /// Converts `src` as `m` maps it, writes it and reports it; an error names `file` and the
    /// source tensor.
    pub(crate) fn store(&mut self, m: &Mapped, src: SourceTensor<'_>, file: &str) -> Result<()> {
        let source = src.source_name;
        let same_as = src.same_as;
        let stored = stored_dims(m, &src.dims, source)
            .and_then(|dims| self.dtypes.dtype(self.done, &m.name, &dims, same_as))
            .and_then(|dtype| transform(m, src, dtype))
            .map_err(|e| Error::format(file, format!("tensor {source}: {e}")))?;
        self.writer
            .add_tensor(&m.name, stored.dtype, &stored.dims, &stored.bytes)?;
        self.bytes += stored.bytes.len() as u64;
        self.done += 1;
        (self.progress)(&Progress {
            done: self.done,
            total: self.total,
            name: &m.name,
            dtype: stored.dtype,
            bytes: stored.bytes.len(),
        });
        Ok(())
    }

    /// Finishes the file (see [`FlmWriter::finish`]).
    pub(crate) fn finish(self) -> Result<ConvertReport> {
        self.writer.finish()?;
        Ok(ConvertReport {
            architecture: self.architecture.to_string(),
            tensors: self.total,
            tensor_bytes: self.bytes,
        })
    }
}
