//! `FlmWriter`: writes a `.flm` file in one streaming pass. Metadata and tokenizer go first,
//! tensors are appended one at a time (each 64-byte aligned, crc computed on the way), and the
//! index plus the header are written by [`FlmWriter::finish`]. The file is built under
//! `<path>.partial` and renamed at the end, so a failed conversion never leaves a file that looks
//! complete (and an unfinished writer removes it when dropped). Never holds more than the
//! tensor being written.

use super::index::{self, TensorInfo, MAX_DIMS};
use super::layout::{align_up, Header, Section, SectionKind, VERSION_MAJOR, VERSION_MINOR};
use super::meta::{self, Metadata};
use super::tokenizer_codec;
use crate::data::{bytes_for, Data, DataType};
use crate::error::{Error, Result};
use crate::model::ModelConfig;
use crate::tokenizer::TokenizerSpec;
use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const N_SECTIONS: usize = 4;

/// Streaming `.flm` writer.
pub struct FlmWriter {
    out: BufWriter<File>,
    path: String,
    final_path: PathBuf,
    partial_path: PathBuf,
    pos: u64,
    sections: Vec<Section>,
    data_start: u64,
    tensors: Vec<TensorInfo>,
    names: HashSet<String>,
    finished: bool,
}

impl FlmWriter {
    /// Starts `path`: writes the metadata (`config`'s `model.*` keys merged over `metadata`) and
    /// the tokenizer section, and positions for tensor data.
    pub fn create(
        path: impl AsRef<Path>,
        config: &ModelConfig,
        metadata: &Metadata,
        tokenizer: &TokenizerSpec,
    ) -> Result<FlmWriter> {
        let final_path = path.as_ref().to_path_buf();
        let ps = final_path.display().to_string();
        let mut partial = final_path.clone().into_os_string();
        partial.push(".partial");
        let partial_path = PathBuf::from(partial);
        let file = File::create(&partial_path).map_err(|e| Error::io(&ps, e))?;
        let mut w = FlmWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            path: ps,
            final_path,
            partial_path,
            pos: 0,
            sections: Vec::new(),
            data_start: 0,
            tensors: Vec::new(),
            names: HashSet::new(),
            finished: false,
        };
        let mut all = metadata.clone();
        all.extend(config.to_metadata()?);
        let header_len = Header::size_for(N_SECTIONS) as u64;
        w.write(&vec![0u8; header_len as usize])?;
        let meta_bytes = meta::encode(&all)?;
        w.section(SectionKind::Metadata, &meta_bytes)?;
        w.section(SectionKind::Tokenizer, &tokenizer_codec::encode(tokenizer))?;
        w.pad_to(align_up(w.pos))?;
        w.data_start = w.pos;
        Ok(w)
    }

    fn write(&mut self, b: &[u8]) -> Result<()> {
        self.out
            .write_all(b)
            .map_err(|e| Error::io(&self.path, e))?;
        self.pos += b.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, to: u64) -> Result<()> {
        let n = to.saturating_sub(self.pos) as usize;
        self.write(&vec![0u8; n])
    }

    fn section(&mut self, kind: SectionKind, b: &[u8]) -> Result<()> {
        self.sections.push(Section {
            kind: kind as u32,
            offset: self.pos,
            length: b.len() as u64,
            crc32: crc32fast::hash(b),
        });
        self.write(b)
    }

    /// Appends one tensor's packed bytes (`bytes.len()` must match `dtype` and `dims`).
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: DataType,
        dims: &[usize],
        bytes: &[u8],
    ) -> Result<()> {
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return Err(Error::invalid(format!(
                "{}: tensor {name} has {} dims (1..={MAX_DIMS} allowed)",
                self.path,
                dims.len()
            )));
        }
        let need = bytes_for(dtype, dims)?;
        if need != bytes.len() {
            return Err(Error::invalid(format!(
                "{}: tensor {name}: {dtype} {dims:?} needs {need} bytes, got {}",
                self.path,
                bytes.len()
            )));
        }
        if !self.names.insert(name.to_string()) {
            return Err(Error::invalid(format!(
                "{}: tensor {name} written twice",
                self.path
            )));
        }
        self.pad_to(align_up(self.pos))?;
        self.tensors.push(TensorInfo {
            name: name.to_string(),
            dtype,
            dims: dims.to_vec(),
            offset: self.pos,
            length: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        });
        self.write(bytes)
    }

    /// Appends a host tensor under `name`.
    pub fn add_data(&mut self, name: &str, data: &Data) -> Result<()> {
        let bytes = data.packed_bytes()?;
        self.add_tensor(name, data.dtype(), data.dims(), &bytes)
    }

    /// Tensors written so far.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Writes the index and the header, flushes, and renames the file into place.
    pub fn finish(mut self) -> Result<()> {
        self.pad_to(align_up(self.pos))?;
        let data_end = self.pos;
        self.sections.push(Section {
            kind: SectionKind::TensorData as u32,
            offset: self.data_start,
            length: data_end - self.data_start,
            crc32: 0,
        });
        let idx = index::encode(&self.tensors);
        self.section(SectionKind::TensorIndex, &idx)?;
        let header = Header {
            major: VERSION_MAJOR,
            minor: VERSION_MINOR,
            file_size: self.pos,
            sections: self.sections.clone(),
        };
        let hb = header.encode();
        let path = self.path.clone();
        let io = |e| Error::io(&path, e);
        self.out.seek(SeekFrom::Start(0)).map_err(io)?;
        self.out.write_all(&hb).map_err(io)?;
        self.out.flush().map_err(io)?;
        self.out.get_ref().sync_all().map_err(io)?;
        std::fs::rename(&self.partial_path, &self.final_path).map_err(io)?;
        self.finished = true;
        Ok(())
    }
}

impl Drop for FlmWriter {
    /// An unfinished file (error or early return while streaming) is removed.
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.partial_path);
        }
    }
}
