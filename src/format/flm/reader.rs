//! `FlmFile`: opens a `.flm` file in one of two [`LoadMode`]s and hands out tensors as [`Data`].
//! `Mmap` maps the file and returns zero-copy views (tensor crcs checked lazily on first access
//! of each tensor, or all at once by [`FlmFile::verify`]); `LowMemory` keeps no weight bytes
//! resident and reads each requested tensor with positioned reads into a fresh buffer, checking
//! its crc every time. Header, metadata, tokenizer and index are validated at open.

use super::index::{self, TensorInfo};
use super::layout::{Header, Section, SectionKind, FIXED};
use super::meta::{self, MetaValue, Metadata};
use super::tokenizer_codec;
use crate::data::{Data, SharedBytes};
use crate::error::{Error, Result};
use crate::format::pread::{read_exact_at, read_vec};
use crate::model::ModelConfig;
use crate::tokenizer::TokenizerSpec;
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How tensor bytes are accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadMode {
    /// Memory-map the file; tensors are zero-copy views.
    Mmap,
    /// Keep nothing resident; each `tensor()` call reads that tensor from disk.
    LowMemory,
}

enum Backing {
    Map(Arc<Mmap>),
    File(File),
}

/// An opened `.flm` file.
pub struct FlmFile {
    path: String,
    mode: LoadMode,
    header: Header,
    metadata: Metadata,
    config: ModelConfig,
    tokenizer: TokenizerSpec,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    checked: Vec<AtomicBool>,
    backing: Backing,
}

impl FlmFile {
    /// Opens and validates `path`.
    pub fn open(path: impl AsRef<Path>, mode: LoadMode) -> Result<FlmFile> {
        let p = path.as_ref();
        let ps = p.display().to_string();
        let file = File::open(p).map_err(|e| Error::io(&ps, e))?;
        let size = file.metadata().map_err(|e| Error::io(&ps, e))?.len();
        let fixed = read_vec(&file, &ps, 0, size.min(FIXED as u64), "header")?;
        let n = Header::decode_fixed(&ps, &fixed, size)?;
        let hlen = Header::size_for(n as usize) as u64;
        if hlen > size {
            return Err(Error::format(&ps, "truncated in the section table"));
        }
        let hbytes = read_vec(&file, &ps, 0, hlen, "header")?;
        let header = Header::decode(&ps, &hbytes, size)?;
        let checked_section = |kind: SectionKind| -> Result<(Section, Vec<u8>)> {
            let s = header.section(&ps, kind)?;
            let b = read_vec(&file, &ps, s.offset, s.length, "section")?;
            if crc32fast::hash(&b) != s.crc32 {
                return Err(Error::format(
                    &ps,
                    format!("{kind:?} section checksum mismatch (file corrupt)"),
                ));
            }
            Ok((s, b))
        };
        let (_, mb) = checked_section(SectionKind::Metadata)?;
        let metadata = meta::decode(&mb, &ps)?;
        let (_, tb) = checked_section(SectionKind::Tokenizer)?;
        let tokenizer = tokenizer_codec::decode(&tb, &ps)?;
        let data = header.section(&ps, SectionKind::TensorData)?;
        let (_, ib) = checked_section(SectionKind::TensorIndex)?;
        let tensors = index::decode(&ib, &ps, data)?;
        let config = ModelConfig::from_metadata(&metadata, &ps)?;
        let by_name = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let checked = tensors.iter().map(|_| AtomicBool::new(false)).collect();
        let backing = match mode {
            LoadMode::Mmap => {
                // SAFETY: read-only mapping; like every mmap reader we rely on the file not being
                // truncated while mapped.
                let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&ps, e))?;
                if map.len() as u64 != size {
                    return Err(Error::format(&ps, "file changed size while opening"));
                }
                Backing::Map(Arc::new(map))
            }
            LoadMode::LowMemory => Backing::File(file),
        };
        Ok(FlmFile {
            path: ps,
            mode,
            header,
            metadata,
            config,
            tokenizer,
            tensors,
            by_name,
            checked,
            backing,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The load mode.
    pub fn mode(&self) -> LoadMode {
        self.mode
    }

    /// Format version (major, minor).
    pub fn version(&self) -> (u16, u16) {
        (self.header.major, self.header.minor)
    }

    /// The model configuration (`model.*` keys).
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The tokenizer.
    pub fn tokenizer_spec(&self) -> &TokenizerSpec {
        &self.tokenizer
    }

    /// All typed metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The chat template, when the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.metadata
            .get("chat_template")
            .and_then(MetaValue::as_str)
    }

    /// Tensor names in file order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    /// All index entries in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The index entry of `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// True when the file holds `name`.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    fn lookup(&self, name: &str) -> Result<(usize, &TensorInfo)> {
        self.by_name
            .get(name)
            .and_then(|&i| self.tensors.get(i).map(|t| (i, t)))
            .ok_or_else(|| Error::format(&self.path, format!("no tensor named {name}")))
    }

    fn crc_check(&self, t: &TensorInfo, bytes: &[u8]) -> Result<()> {
        if crc32fast::hash(bytes) != t.crc32 {
            return Err(Error::format(
                &self.path,
                format!("tensor {}: checksum mismatch (file corrupt)", t.name),
            ));
        }
        Ok(())
    }

    /// The tensor `name`: a zero-copy view in `Mmap` mode (crc checked on first access), a fresh
    /// host copy read from disk in `LowMemory` mode (crc checked every time).
    pub fn tensor(&self, name: &str) -> Result<Data> {
        let (i, t) = self.lookup(name)?;
        let offset = usize::try_from(t.offset)
            .map_err(|_| Error::format(&self.path, format!("tensor {name}: offset too large")))?;
        let len = usize::try_from(t.length)
            .map_err(|_| Error::format(&self.path, format!("tensor {name}: too large")))?;
        let mut d = match &self.backing {
            Backing::Map(map) => {
                let checked = self
                    .checked
                    .get(i)
                    .is_some_and(|c| c.load(Ordering::Acquire));
                if !checked {
                    let bytes = map.get(offset..offset.saturating_add(len)).ok_or_else(|| {
                        Error::format(&self.path, format!("tensor {name} outside the file"))
                    })?;
                    self.crc_check(t, bytes)?;
                    if let Some(c) = self.checked.get(i) {
                        c.store(true, Ordering::Release);
                    }
                }
                let shared: SharedBytes = map.clone();
                Data::from_shared(t.dtype, &t.dims, shared, offset, len)?
            }
            Backing::File(f) => {
                let mut d = Data::zeros(t.dtype, &t.dims)?;
                let buf = d.bytes_mut()?;
                read_exact_at(f, buf, t.offset).map_err(|e| {
                    Error::format(
                        &self.path,
                        format!(
                            "tensor {name}: cannot read {len} bytes at {}: {e}",
                            t.offset
                        ),
                    )
                })?;
                self.crc_check(t, d.bytes()?)?;
                d
            }
        };
        d.name = name.to_string();
        Ok(d)
    }

    /// The whole mapped file (`Mmap` mode only); tensor views point into it.
    pub fn mapped_bytes(&self) -> Option<&[u8]> {
        match &self.backing {
            Backing::Map(m) => Some(&m[..]),
            Backing::File(_) => None,
        }
    }

    /// Checks every tensor's crc now (reads the whole file once).
    pub fn verify(&self) -> Result<()> {
        for (i, t) in self.tensors.iter().enumerate() {
            match &self.backing {
                Backing::Map(map) => {
                    let s = t.offset as usize;
                    let bytes =
                        map.get(s..s.saturating_add(t.length as usize))
                            .ok_or_else(|| {
                                Error::format(
                                    &self.path,
                                    format!("tensor {} outside the file", t.name),
                                )
                            })?;
                    self.crc_check(t, bytes)?;
                    if let Some(c) = self.checked.get(i) {
                        c.store(true, Ordering::Release);
                    }
                }
                Backing::File(_) => {
                    self.tensor(&t.name)?;
                }
            }
        }
        Ok(())
    }
}
