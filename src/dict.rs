//! The op argument containers, fastllm's names and shapes of arguments: `DataDict` (named
//! tensors, each borrowed read-only or mutably) and `FloatDict` / `IntDict` (named scalar
//! parameters). Both a device's `Operator`s and a `Step`'s stages take them.

use crate::data::{Data, DataType};
use crate::error::{Error, Result};

/// One named tensor argument: borrowed read-only or mutably (outputs, in-place inputs).
pub enum Slot<'a> {
    /// A read-only argument.
    Ref(&'a Data),
    /// A mutable argument.
    Mut(&'a mut Data),
}

impl Slot<'_> {
    fn get(&self) -> &Data {
        match self {
            Slot::Ref(d) => d,
            Slot::Mut(d) => d,
        }
    }
}

/// The inputs and the outputs [`DataDict::io_many`] borrows.
pub type IoMany<'d, const N: usize, const M: usize> =
    ([Option<&'d Data>; N], [Option<&'d mut Data>; M]);

/// Named tensor arguments of one op call (`input`, `weight`, `bias`, `output`, `input0`, ...).
#[derive(Default)]
pub struct DataDict<'a> {
    items: Vec<(&'a str, Slot<'a>)>,
}

impl<'a> DataDict<'a> {
    /// An empty dict.
    pub fn new() -> Self {
        DataDict { items: Vec::new() }
    }

    /// Adds a read-only argument (builder style).
    pub fn with(mut self, name: &'a str, d: &'a Data) -> Self {
        self.items.push((name, Slot::Ref(d)));
        self
    }

    /// Adds a mutable argument (builder style).
    pub fn with_mut(mut self, name: &'a str, d: &'a mut Data) -> Self {
        self.items.push((name, Slot::Mut(d)));
        self
    }

    /// Adds a read-only argument.
    pub fn insert(&mut self, name: &'a str, d: &'a Data) {
        self.items.push((name, Slot::Ref(d)));
    }

    /// Adds a mutable argument.
    pub fn insert_mut(&mut self, name: &'a str, d: &'a mut Data) {
        self.items.push((name, Slot::Mut(d)));
    }

    /// True when an argument of that name is present.
    pub fn contains(&self, name: &str) -> bool {
        self.items.iter().any(|(n, _)| *n == name)
    }

    /// True when `name` is present as an inout argument (one the op may write, and that the
    /// `Executor` moves to the op's device for good instead of copying it for the call).
    pub fn is_mut(&self, name: &str) -> bool {
        self.items
            .iter()
            .any(|(n, s)| *n == name && matches!(s, Slot::Mut(_)))
    }

    /// The argument `name`, read-only.
    pub fn get(&self, name: &str) -> Option<&Data> {
        self.items
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s.get())
    }

    /// The argument `name`, or an `Err` naming `op` and the missing input.
    pub fn require(&self, op: &str, name: &str) -> Result<&Data> {
        self.get(name)
            .ok_or_else(|| Error::op(op, format!("missing input '{name}'")))
    }

    /// The argument `name`, mutable; `Err` if missing or passed read-only.
    pub fn require_mut(&mut self, op: &str, name: &str) -> Result<&mut Data> {
        match self.items.iter_mut().find(|(n, _)| *n == name) {
            Some((_, Slot::Mut(d))) => Ok(&mut **d),
            Some((_, Slot::Ref(_))) => Err(Error::op(
                op,
                format!("'{name}' must be passed mutably (it is written)"),
            )),
            None => Err(Error::op(op, format!("missing output '{name}'"))),
        }
    }

    /// Read-only inputs `ins` (each `None` when absent) together with the mutable argument `out`,
    /// borrowed at once. `Err` when `out` is missing or read-only.
    pub fn io<const N: usize>(
        &mut self,
        op: &str,
        ins: [&str; N],
        out: &str,
    ) -> Result<([Option<&Data>; N], &mut Data)> {
        let mut got: [Option<&Data>; N] = [None; N];
        let mut o: Option<&mut Data> = None;
        for (name, slot) in self.items.iter_mut() {
            if *name == out {
                match slot {
                    Slot::Mut(d) => o = Some(&mut **d),
                    Slot::Ref(_) => {
                        return Err(Error::op(op, format!("'{out}' must be passed mutably")))
                    }
                }
            } else if let Some(i) = ins.iter().position(|n| n == name) {
                got[i] = Some(slot.get());
            }
        }
        let o = o.ok_or_else(|| Error::op(op, format!("missing output '{out}'")))?;
        Ok((got, o))
    }

    /// Read-only inputs `ins` and mutable arguments `outs` (each `None` when absent), borrowed
    /// at once: for ops with several outputs. `Err` when one of `outs` is passed read-only.
    pub fn io_many<const N: usize, const M: usize>(
        &mut self,
        op: &str,
        ins: [&str; N],
        outs: [&str; M],
    ) -> Result<IoMany<'_, N, M>> {
        let mut got: [Option<&Data>; N] = [None; N];
        let mut o: [Option<&mut Data>; M] = std::array::from_fn(|_| None);
        for (name, slot) in self.items.iter_mut() {
            if let Some(i) = outs.iter().position(|n| n == name) {
                match slot {
                    Slot::Mut(d) => o[i] = Some(&mut **d),
                    Slot::Ref(_) => {
                        return Err(Error::op(op, format!("'{name}' must be passed mutably")))
                    }
                }
            } else if let Some(i) = ins.iter().position(|n| n == name) {
                got[i] = Some(slot.get());
            }
        }
        Ok((got, o))
    }

    /// Every argument but `out` as (name, tensor), and `out` mutably (an `Err` naming `op` when
    /// `out` is missing or passed read-only): for ops whose inputs are not a fixed list.
    pub fn io_rest(&mut self, op: &str, out: &str) -> Result<(Vec<(&str, &Data)>, &mut Data)> {
        let mut ins = Vec::with_capacity(self.items.len());
        let mut o: Option<&mut Data> = None;
        for (name, slot) in self.items.iter_mut() {
            if *name != out {
                ins.push((*name, slot.get()));
                continue;
            }
            match slot {
                Slot::Mut(d) => o = Some(&mut **d),
                Slot::Ref(_) => {
                    return Err(Error::op(op, format!("'{out}' must be passed mutably")))
                }
            }
        }
        let o = o.ok_or_else(|| Error::op(op, format!("missing output '{out}'")))?;
        Ok((ins, o))
    }

    /// Iterates over (name, tensor).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Data)> {
        self.items.iter().map(|(n, s)| (*n, s.get()))
    }

    /// Iterates mutably over the mutable arguments.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut Data)> + use<'_, 'a> {
        self.items.iter_mut().filter_map(|(n, s)| match s {
            Slot::Mut(d) => Some((*n, &mut **d)),
            Slot::Ref(_) => None,
        })
    }

    /// A dict borrowing the same arguments, except that read-only arguments named in
    /// `replacements` point at the replacement tensors (used to run on copies).
    pub fn reborrow_with<'b>(&'b mut self, replacements: &'b [(String, Data)]) -> DataDict<'b> {
        let mut out = DataDict::new();
        for (name, slot) in self.items.iter_mut() {
            match slot {
                Slot::Mut(d) => out.insert_mut(name, d),
                Slot::Ref(d) => match replacements.iter().find(|(n, _)| n == name) {
                    Some((_, r)) => out.insert(name, r),
                    None => out.insert(name, d),
                },
            }
        }
        out
    }

    /// The dtype of argument `name`, if present.
    pub fn dtype(&self, name: &str) -> Option<DataType> {
        self.get(name).map(|d| d.dtype())
    }
}

/// Named scalar parameters of one op call, of one type: [`FloatDict`] (`eps`, `alpha`,
/// `scale`, ...) and [`IntDict`] (`axis`, `k`, `causal`, ...).
#[derive(Clone, Debug)]
pub struct ScalarDict<'a, T> {
    items: Vec<(&'a str, T)>,
}

/// Named float parameters of one op call (`eps`, `alpha`, `scale`, ...).
pub type FloatDict<'a> = ScalarDict<'a, f32>;

/// Named integer parameters of one op call (`axis`, `k`, `causal`, ...).
pub type IntDict<'a> = ScalarDict<'a, i32>;

impl<T> Default for ScalarDict<'_, T> {
    fn default() -> Self {
        ScalarDict { items: Vec::new() }
    }
}

impl<'a, T: Copy> ScalarDict<'a, T> {
    /// An empty dict.
    pub fn new() -> Self {
        ScalarDict { items: Vec::new() }
    }
    /// Adds a value (builder style).
    pub fn with(mut self, name: &'a str, v: T) -> Self {
        self.items.push((name, v));
        self
    }
    /// Adds a value.
    pub fn insert(&mut self, name: &'a str, v: T) {
        self.items.push((name, v));
    }
    /// The value of `name`, if given.
    pub fn get(&self, name: &str) -> Option<T> {
        self.items.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
    /// The value of `name`, or `default`.
    pub fn get_or(&self, name: &str, default: T) -> T {
        self.get(name).unwrap_or(default)
    }
    /// Iterates over (name, value).
    pub fn iter(&self) -> impl Iterator<Item = (&str, T)> {
        self.items.iter().map(|(n, v)| (*n, *v))
    }
}
