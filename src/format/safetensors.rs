//! Safetensors reader over one file or a sharded set (`model.safetensors.index.json`). The JSON
//! header is validated in full at open: dtypes (F32/F16/BF16, and U8 as raw bytes), dims × element size equal to
//! the byte span, spans inside the file's data area and not overlapping. Tensor bytes are
//! borrowed from a memory map. Knows nothing about models or name mapping.

use crate::data::DataType;
use crate::error::{Error, Result};
use crate::format::pread::read_vec;
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Largest JSON header accepted (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100 << 20;

/// One tensor of a safetensors file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafeTensorInfo {
    /// Tensor name.
    pub name: String,
    /// Element type (F32, F16 or BF16); `None` for U8, raw bytes the reader does not interpret
    /// (GPT-OSS's MXFP4 `*_blocks` / `*_scales`).
    pub dtype: Option<DataType>,
    /// Row-major dims.
    pub dims: Vec<usize>,
    /// Absolute byte range in the file.
    pub start: usize,
    /// End of the byte range (exclusive).
    pub end: usize,
}

/// One opened `.safetensors` file.
pub struct SafetensorsFile {
    path: String,
    file: File,
    map: Mmap,
    tensors: BTreeMap<String, SafeTensorInfo>,
}

fn parse_dtype(path: &str, name: &str, s: &str) -> Result<Option<DataType>> {
    match s {
        "F32" => Ok(Some(DataType::F32)),
        "F16" => Ok(Some(DataType::F16)),
        "BF16" => Ok(Some(DataType::BF16)),
        "U8" => Ok(None),
        other => Err(Error::format(
            path,
            format!("tensor {name}: dtype {other} not supported (F32, F16, BF16, U8 only)"),
        )),
    }
}

/// The header entry `t` of tensor `name`: a known dtype, a shape, and `data_offsets` inside
/// the data area (`data_len` bytes from `data_start`) spanning exactly the shape's bytes.
fn tensor_info(
    ps: &str,
    name: &str,
    t: &serde_json::Value,
    data_start: usize,
    data_len: usize,
) -> Result<SafeTensorInfo> {
    let bad = |what: &str| Error::format(ps, format!("tensor {name}: {what}"));
    let dtype_s = t
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or_else(|| bad("no dtype"))?;
    let dtype = parse_dtype(ps, name, dtype_s)?;
    // the array at `key` as sizes: `missing` when it is not an array of `len` (any length when
    // `None`), `entry` when an element is not a size
    let sizes = |key: &str, len: Option<usize>, missing: &str, entry: &str| {
        t.get(key)
            .and_then(|s| s.as_array())
            .filter(|a| len.is_none_or(|n| a.len() == n))
            .ok_or_else(|| bad(missing))?
            .iter()
            .map(|d| {
                d.as_u64()
                    .and_then(|d| usize::try_from(d).ok())
                    .ok_or_else(|| bad(entry))
            })
            .collect::<Result<Vec<usize>>>()
    };
    let dims = sizes("shape", None, "no shape", "bad shape entry")?;
    let offsets = sizes(
        "data_offsets",
        Some(2),
        "data_offsets must be [begin, end]",
        "bad data_offsets",
    )?;
    let (s, e) = match offsets.as_slice() {
        [s, e] => (*s, *e),
        _ => return Err(bad("data_offsets must be [begin, end]")),
    };
    if s > e || e > data_len {
        return Err(bad(&format!(
            "data_offsets [{s}, {e}] lie outside the data area ({data_len} bytes)"
        )));
    }
    let count = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(&format!("dims {dims:?} overflow")))?;
    let size = count
        .checked_mul(dtype.map_or(1, |d| d.block_bytes()))
        .ok_or_else(|| bad("size overflows"))?;
    if size != e - s {
        return Err(bad(&format!(
            "{dtype_s} {dims:?} needs {size} bytes but data_offsets span {}",
            e - s
        )));
    }
    Ok(SafeTensorInfo {
        name: name.to_string(),
        dtype,
        dims,
        start: data_start + s,
        end: data_start + e,
    })
}

/// Refuses two tensors whose bytes overlap.
fn check_overlaps(ps: &str, tensors: &BTreeMap<String, SafeTensorInfo>) -> Result<()> {
    let mut spans: Vec<&SafeTensorInfo> = tensors.values().filter(|t| t.end > t.start).collect();
    spans.sort_by_key(|t| t.start);
    for w in spans.windows(2) {
        if let [a, b] = w {
            if b.start < a.end {
                return Err(Error::format(
                    ps,
                    format!("tensors {} and {} overlap", a.name, b.name),
                ));
            }
        }
    }
    Ok(())
}

impl SafetensorsFile {
    /// Opens and validates one file.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let ps = path.as_ref().display().to_string();
        let f = File::open(path.as_ref()).map_err(|e| Error::io(&ps, e))?;
        // SAFETY: read-only mapping; we rely on the file not being truncated while mapped.
        let map = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(&ps, e))?;
        let tensors = Self::parse_header(&ps, &map)?;
        Ok(SafetensorsFile {
            path: ps,
            file: f,
            map,
            tensors,
        })
    }

    fn parse_header(ps: &str, b: &[u8]) -> Result<BTreeMap<String, SafeTensorInfo>> {
        let head = b
            .get(..8)
            .ok_or_else(|| Error::format(ps, "truncated: no safetensors header length"))?;
        let mut a = [0u8; 8];
        a.copy_from_slice(head);
        let n = u64::from_le_bytes(a);
        if n > MAX_HEADER || n > (b.len() as u64).saturating_sub(8) {
            return Err(Error::format(
                ps,
                format!("header length {n} exceeds the file ({} bytes)", b.len()),
            ));
        }
        let data_start = 8 + n as usize;
        let json = b
            .get(8..data_start)
            .ok_or_else(|| Error::format(ps, "truncated header"))?;
        let v: serde_json::Value = serde_json::from_slice(json)
            .map_err(|e| Error::format(ps, format!("header is not valid JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| Error::format(ps, "header is not a JSON object"))?;
        let data_len = b.len() - data_start;
        let mut tensors = BTreeMap::new();
        for (name, t) in obj {
            if name == "__metadata__" {
                continue;
            }
            tensors.insert(
                name.clone(),
                tensor_info(ps, name, t, data_start, data_len)?,
            );
        }
        check_overlaps(ps, &tensors)?;
        Ok(tensors)
    }

    /// The file's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Tensors by name.
    pub fn tensors(&self) -> &BTreeMap<String, SafeTensorInfo> {
        &self.tensors
    }

    /// A tensor's info and a fresh copy of its bytes, read with a positioned read (nothing of
    /// the file stays resident).
    pub fn read_tensor(&self, name: &str) -> Result<(&SafeTensorInfo, Vec<u8>)> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::format(&self.path, format!("no tensor named {name}")))?;
        let b = read_vec(
            &self.file,
            &self.path,
            t.start as u64,
            (t.end - t.start) as u64,
            name,
        )?;
        Ok((t, b))
    }

    /// A tensor's info and bytes (borrowed from the memory map).
    pub fn tensor(&self, name: &str) -> Result<(&SafeTensorInfo, &[u8])> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::format(&self.path, format!("no tensor named {name}")))?;
        let b = self
            .map
            .get(t.start..t.end)
            .ok_or_else(|| Error::format(&self.path, format!("tensor {name} outside the file")))?;
        Ok((t, b))
    }
}

/// The safetensors weights of a Hugging Face directory: one `model.safetensors`, or the shards
/// listed by `model.safetensors.index.json`.
pub struct SafetensorsSet {
    files: Vec<SafetensorsFile>,
    /// Tensor name → index in `files`, sorted by name.
    by_name: BTreeMap<String, usize>,
}

impl SafetensorsSet {
    /// Opens the weights of directory `dir`.
    pub fn open_dir(dir: impl AsRef<Path>) -> Result<SafetensorsSet> {
        let dir = dir.as_ref();
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            return Self::open_index(&index);
        }
        let single = dir.join("model.safetensors");
        if single.exists() {
            return Self::from_files(vec![SafetensorsFile::open(&single)?]);
        }
        Err(Error::format(
            dir.display(),
            "no model.safetensors or model.safetensors.index.json",
        ))
    }

    /// Opens the shards named by an index file.
    pub fn open_index(index: &Path) -> Result<SafetensorsSet> {
        let ps = index.display().to_string();
        let text = std::fs::read_to_string(index).map_err(|e| Error::io(&ps, e))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::format(&ps, format!("invalid JSON: {e}")))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::format(&ps, "no weight_map object"))?;
        let dir = index
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let mut shards: Vec<String> = Vec::new();
        for (name, f) in map {
            let f = f.as_str().ok_or_else(|| {
                Error::format(&ps, format!("weight_map[{name}] is not a file name"))
            })?;
            if f.contains('/') || f.contains('\\') || f == ".." {
                return Err(Error::format(
                    &ps,
                    format!("weight_map[{name}]: shard {f:?} must be a plain file name"),
                ));
            }
            if !shards.iter().any(|s| s == f) {
                shards.push(f.to_string());
            }
        }
        shards.sort();
        let files = shards
            .iter()
            .map(|s| SafetensorsFile::open(dir.join(s)))
            .collect::<Result<Vec<_>>>()?;
        let set = Self::from_files(files)?;
        for name in map.keys() {
            if !set.by_name.contains_key(name) {
                return Err(Error::format(
                    &ps,
                    format!("tensor {name} is not in its shard"),
                ));
            }
        }
        Ok(set)
    }

    fn from_files(files: Vec<SafetensorsFile>) -> Result<SafetensorsSet> {
        let mut by_name = BTreeMap::new();
        for (i, f) in files.iter().enumerate() {
            for name in f.tensors().keys() {
                if by_name.insert(name.clone(), i).is_some() {
                    return Err(Error::format(
                        f.path(),
                        format!("tensor {name} appears in two shards"),
                    ));
                }
            }
        }
        Ok(SafetensorsSet { files, by_name })
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// A tensor's info and bytes.
    pub fn tensor(&self, name: &str) -> Result<(&SafeTensorInfo, &[u8])> {
        match self.by_name.get(name).and_then(|&i| self.files.get(i)) {
            Some(f) => f.tensor(name),
            None => Err(Error::invalid(format!(
                "no tensor named {name} in the safetensors set"
            ))),
        }
    }

    /// A tensor's info and a fresh copy of its bytes (positioned read).
    pub fn read_tensor(&self, name: &str) -> Result<(&SafeTensorInfo, Vec<u8>)> {
        match self.by_name.get(name).and_then(|&i| self.files.get(i)) {
            Some(f) => f.read_tensor(name),
            None => Err(Error::invalid(format!(
                "no tensor named {name} in the safetensors set"
            ))),
        }
    }

    /// The file holding `name` (for messages).
    pub fn file_of(&self, name: &str) -> Option<&str> {
        self.by_name
            .get(name)
            .and_then(|&i| self.files.get(i))
            .map(|f| f.path())
    }
}
