//! Where a model's tensors come from: the `WeightSource` trait (a `.flm` file in mmap or
//! low-memory mode, or an in-memory map), and `Weights`, which either keeps every tensor resident
//! (zero-copy views) or fetches a layer's tensors right before it runs (low-memory mode).

use crate::data::Data;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;

/// A provider of named tensors.
pub trait WeightSource: Send + Sync {
    /// The tensor `name`: a zero-copy view where possible, else a fresh copy.
    fn tensor(&self, name: &str) -> Result<Data>;
    /// True when a tensor of that name exists.
    fn has(&self, name: &str) -> bool;
    /// All tensor names.
    fn names(&self) -> Vec<String>;
}

/// Tensors held in memory (tests, synthetic models, converted-on-the-fly models).
#[derive(Default)]
pub struct MapSource {
    map: HashMap<String, Data>,
}

impl MapSource {
    /// An empty source.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds a tensor.
    pub fn insert(&mut self, name: impl Into<String>, d: Data) {
        self.map.insert(name.into(), d);
    }
}

impl WeightSource for MapSource {
    fn tensor(&self, name: &str) -> Result<Data> {
        self.map
            .get(name)
            .ok_or_else(|| Error::Unsupported(format!("model has no tensor '{name}'")))?
            .to_owned_host()
    }
    fn has(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }
    fn names(&self) -> Vec<String> {
        self.map.keys().cloned().collect()
    }
}

/// A tensor borrowed from the resident set or fetched for one use.
pub enum W<'a> {
    /// Resident.
    Borrowed(&'a Data),
    /// Fetched (low-memory mode); dropped after use.
    Owned(Data),
}

impl Deref for W<'_> {
    type Target = Data;
    fn deref(&self) -> &Data {
        match self {
            W::Borrowed(d) => d,
            W::Owned(d) => d,
        }
    }
}

/// The model's tensors: resident, or fetched on demand in low-memory mode. Tensors derived at
/// load time (e.g. Gemma's `1 + w` norms) are always resident.
pub struct Weights {
    source: Arc<dyn WeightSource>,
    resident: HashMap<String, Data>,
    low_memory: bool,
}

impl Weights {
    /// Wraps a source. Unless `low_memory`, every tensor is loaded now (views for mmapped files).
    pub fn new(source: Arc<dyn WeightSource>, low_memory: bool) -> Result<Weights> {
        let mut resident = HashMap::new();
        if !low_memory {
            for n in source.names() {
                let mut d = source.tensor(&n)?;
                d.name = n.clone();
                resident.insert(n, d);
            }
        }
        Ok(Weights {
            source,
            resident,
            low_memory,
        })
    }

    /// True in low-memory mode.
    pub fn low_memory(&self) -> bool {
        self.low_memory
    }

    /// True when the tensor exists.
    pub fn has(&self, name: &str) -> bool {
        self.resident.contains_key(name) || self.source.has(name)
    }

    /// The tensor `name` (an error naming it when absent).
    pub fn get(&self, name: &str) -> Result<W<'_>> {
        if let Some(d) = self.resident.get(name) {
            return Ok(W::Borrowed(d));
        }
        if !self.source.has(name) {
            return Err(Error::Unsupported(format!(
                "model file lacks tensor '{name}'"
            )));
        }
        let mut d = self.source.tensor(name)?;
        d.name = name.to_string();
        Ok(W::Owned(d))
    }

    /// The tensor `name` if present.
    pub fn opt(&self, name: &str) -> Result<Option<W<'_>>> {
        if self.has(name) {
            self.get(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The dtype of the resident tensor `name`, if resident.
    pub fn resident_dtype(&self, name: &str) -> Option<crate::data::DataType> {
        self.resident.get(name).map(|d| d.dtype())
    }

    /// Bytes of every resident tensor (what an upload to a device copies).
    pub fn resident_bytes(&self) -> usize {
        self.resident
            .values()
            .map(|d| tensor_bytes(d) as usize)
            .sum()
    }

    /// The resident tensor `name`, if resident.
    pub fn resident(&self, name: &str) -> Option<&Data> {
        self.resident.get(name)
    }

    /// Removes the resident tensor `name` and returns it (`None` when it is not resident).
    pub fn take_resident(&mut self, name: &str) -> Option<Data> {
        self.resident.remove(name)
    }

    /// Stores a derived tensor (kept resident in every mode).
    pub fn set_resident(&mut self, name: &str, d: Data) {
        self.resident.insert(name.to_string(), d);
    }

    /// Replaces every resident matrix with the form `device` reads fastest
    /// ([`BaseDevice::weight_form`]), one tensor at a time; the file pages a replaced tensor viewed
    /// are handed back to the OS at once, so resident memory stays about one copy of the weights.
    /// Returns how many tensors changed.
    ///
    /// [`BaseDevice::weight_form`]: crate::device::BaseDevice::weight_form
    pub fn reform_for(&mut self, device: &dyn crate::device::BaseDevice) -> Result<usize> {
        self.reform_for_where(device, |_| true, &mut |_| {})
    }

    /// [`Weights::reform_for`] of the tensors whose name passes `pick`; the others stay as
    /// loaded (e.g. mapped from the file). `on_tensor` gets the bytes of each resident tensor
    /// once it is passed, replaced or not.
    pub fn reform_for_where(
        &mut self,
        device: &dyn crate::device::BaseDevice,
        pick: impl Fn(&str) -> bool,
        on_tensor: &mut dyn FnMut(u64),
    ) -> Result<usize> {
        let mut changed = 0;
        for (name, d) in self.resident.iter_mut() {
            let bytes = tensor_bytes(d);
            if d.dims().len() == 2 && d.device() == device.kind() && pick(name) {
                if let Some(new) = device.weight_form(d)? {
                    let old = std::mem::replace(d, new);
                    crate::interleave::release_view(&old);
                    changed += 1;
                }
            }
            on_tensor(bytes);
        }
        Ok(changed)
    }

    /// Copies every resident tensor onto `device` once (e.g. a GPU at load time), so ops running
    /// there find their weights in place; dtypes are kept. Tensors fetched on demand in
    /// low-memory mode are not resident and are not moved.
    pub fn upload_to(&mut self, device: &dyn crate::device::BaseDevice) -> Result<()> {
        self.upload_to_where(device, |_| true, &mut |_| {})
    }

    /// [`Weights::upload_to`] of the tensors whose name passes `pick`; the others stay where
    /// they are (e.g. on the host, for ops the device lacks). `on_tensor` gets the bytes of
    /// each resident tensor once it is passed.
    pub fn upload_to_where(
        &mut self,
        device: &dyn crate::device::BaseDevice,
        pick: impl Fn(&str) -> bool,
        on_tensor: &mut dyn FnMut(u64),
    ) -> Result<()> {
        for (name, d) in self.resident.iter_mut() {
            let bytes = tensor_bytes(d);
            if d.device() != device.kind() && pick(name) {
                let mut up = device.upload(d)?;
                up.name = name.clone();
                *d = up;
            }
            on_tensor(bytes);
        }
        Ok(())
    }
}

/// The bytes of `d`'s elements in its dtype (0 for a shape its dtype cannot hold).
fn tensor_bytes(d: &Data) -> u64 {
    crate::data::bytes_for(d.dtype(), d.dims()).unwrap_or(0) as u64
}
