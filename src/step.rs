//! `Step`: one forward step as an ordered list of op calls over named tensors, built by a model
//! and handed whole to the [`Executor`](crate::executor::Executor) (`run_step`), the way ggml hands
//! a backend its graph. The first device may rewrite the list before it runs
//! ([`BaseDevice::plan_step`](crate::device::BaseDevice::plan_step): its fusion passes); the
//! calls are then run in order, each through `Executor::run`.
//!
//! A step's tensors are borrowed read-only (weights, index arrays), borrowed mutably (scratch
//! buffers, KV caches, the logits) or owned by the step (small host tensors made for it). Items
//! are op calls ([`Call`]), reshapes of a tensor between calls, and stages: work the step does
//! not describe op by op (a collective, a mixture-of-experts layer that reads its routing back),
//! which passes treat as opaque.
//!
//! This module knows no model and no device.

use crate::data::Data;
use crate::dict::DataDict;
use crate::error::{Error, Result};

/// A tensor of a [`Step`], by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorId(usize);

/// How a step holds one of its tensors.
enum Held<'a> {
    Ref(&'a Data),
    Mut(&'a mut Data),
    Own(Data),
    /// Released (see [`Step::release`]).
    Gone,
}

/// One named tensor argument of a call or stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arg {
    /// The argument name the op reads (`input`, `weight`, `output`, ...).
    pub name: &'static str,
    /// The tensor passed.
    pub tensor: TensorId,
    /// True when the op writes it (an output or in-place input).
    pub written: bool,
}

/// One op call of a step: the op name, its tensor arguments and its scalar parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The op name, as registered by the devices.
    pub op: &'static str,
    /// Tensor arguments, in the order given.
    pub args: Vec<Arg>,
    /// Float parameters.
    pub floats: Vec<(&'static str, f32)>,
    /// Integer parameters.
    pub ints: Vec<(&'static str, i32)>,
    /// Activation rows the call works on (0 when unknown): what passes that depend on the
    /// row count read, since shapes are only known when the step runs.
    pub rows: usize,
}

impl Call {
    /// A call of `op` with no arguments yet.
    pub fn new(op: &'static str) -> Call {
        Call {
            op,
            args: Vec::new(),
            floats: Vec::new(),
            ints: Vec::new(),
            rows: 0,
        }
    }
    /// Adds a read-only argument.
    pub fn input(mut self, name: &'static str, t: TensorId) -> Call {
        self.args.push(Arg {
            name,
            tensor: t,
            written: false,
        });
        self
    }
    /// Adds a read-only argument when `t` is given.
    pub fn input_opt(self, name: &'static str, t: Option<TensorId>) -> Call {
        match t {
            Some(t) => self.input(name, t),
            None => self,
        }
    }
    /// Adds a written argument.
    pub fn output(mut self, name: &'static str, t: TensorId) -> Call {
        self.args.push(Arg {
            name,
            tensor: t,
            written: true,
        });
        self
    }
    /// Adds a float parameter.
    pub fn float(mut self, name: &'static str, v: f32) -> Call {
        self.floats.push((name, v));
        self
    }
    /// Adds (or replaces) an integer parameter.
    pub fn int(mut self, name: &'static str, v: i32) -> Call {
        self.set_int(name, v);
        self
    }
    /// Sets the activation row count ([`Call::rows`]).
    pub fn rows(mut self, rows: usize) -> Call {
        self.rows = rows;
        self
    }
    /// The tensor passed as `name`.
    pub fn arg(&self, name: &str) -> Option<TensorId> {
        self.args.iter().find(|a| a.name == name).map(|a| a.tensor)
    }
    /// The integer parameter `name`, or 0.
    pub fn int_of(&self, name: &str) -> i32 {
        self.ints
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    }
    /// The float parameter `name`, or `default`.
    pub fn float_or(&self, name: &str, default: f32) -> f32 {
        self.floats
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(default, |(_, v)| *v)
    }
    /// Sets the integer parameter `name`.
    pub fn set_int(&mut self, name: &'static str, v: i32) {
        match self.ints.iter_mut().find(|(n, _)| *n == name) {
            Some(e) => e.1 = v,
            None => self.ints.push((name, v)),
        }
    }
    /// True when the call reads `t` (as an argument it does not write).
    pub fn reads(&self, t: TensorId) -> bool {
        self.args.iter().any(|a| a.tensor == t && !a.written)
    }
    /// True when the call writes `t`.
    pub fn writes(&self, t: TensorId) -> bool {
        self.args.iter().any(|a| a.tensor == t && a.written)
    }
}

/// The work of a stage: runs with its arguments in a [`DataDict`].
pub type StageFn<'a> = Box<dyn FnMut(&mut DataDict) -> Result<()> + 'a>;

/// Work a step does not describe op by op (see the module doc).
pub struct Stage<'a> {
    /// What it is, for errors and the profiler.
    pub name: &'static str,
    /// The step tensors it reads and writes.
    pub args: Vec<Arg>,
    run: StageFn<'a>,
}

/// One item of a step.
pub enum Item<'a> {
    /// An op call.
    Call(Call),
    /// Gives the tensor new dims (same element count, no data moved) before the next item.
    Reshape(TensorId, Vec<usize>),
    /// Opaque work.
    Stage(Stage<'a>),
}

impl Item<'_> {
    /// The call, when this item is one.
    pub fn call(&self) -> Option<&Call> {
        match self {
            Item::Call(c) => Some(c),
            _ => None,
        }
    }
    /// True when the item reads `t` (a reshape counts as neither reading nor writing).
    pub fn reads(&self, t: TensorId) -> bool {
        match self {
            Item::Call(c) => c.reads(t),
            Item::Reshape(..) => false,
            Item::Stage(s) => s.args.iter().any(|a| a.tensor == t),
        }
    }
    /// True when the item writes `t` (a stage is taken to read what it writes).
    pub fn writes(&self, t: TensorId) -> bool {
        match self {
            Item::Call(c) => c.writes(t),
            Item::Reshape(..) => false,
            Item::Stage(s) => s.args.iter().any(|a| a.tensor == t && a.written),
        }
    }
}

/// One forward step (see the module doc).
#[derive(Default)]
pub struct Step<'a> {
    tensors: Vec<Held<'a>>,
    items: Vec<Item<'a>>,
}

impl<'a> Step<'a> {
    /// An empty step.
    pub fn new() -> Step<'a> {
        Step::default()
    }

    fn add(&mut self, h: Held<'a>) -> TensorId {
        self.tensors.push(h);
        TensorId(self.tensors.len() - 1)
    }

    /// A tensor the step reads only.
    pub fn input(&mut self, d: &'a Data) -> TensorId {
        self.add(Held::Ref(d))
    }

    /// A tensor the step may write (it stays the caller's).
    pub fn mutable(&mut self, d: &'a mut Data) -> TensorId {
        self.add(Held::Mut(d))
    }

    /// A tensor the step owns (dropped with it, or at [`Step::release`]).
    pub fn own(&mut self, d: Data) -> TensorId {
        self.add(Held::Own(d))
    }

    /// Drops an owned tensor once the items that read it have run (a weight fetched for a
    /// part of the step); borrowed ones are only forgotten.
    pub fn release(&mut self, t: TensorId) {
        if let Some(h) = self.tensors.get_mut(t.0) {
            *h = Held::Gone;
        }
    }

    /// Drops every tensor the step owns (see [`Step::release`]).
    pub fn release_owned(&mut self) {
        for h in self.tensors.iter_mut() {
            if matches!(h, Held::Own(_)) {
                *h = Held::Gone;
            }
        }
    }

    /// The tensor `t` as it is now (shapes of written tensors are set when the step runs).
    pub fn tensor(&self, t: TensorId) -> Option<&Data> {
        match self.tensors.get(t.0)? {
            Held::Ref(d) => Some(d),
            Held::Mut(d) => Some(d),
            Held::Own(d) => Some(d),
            Held::Gone => None,
        }
    }

    /// Appends an op call.
    pub fn push(&mut self, c: Call) {
        self.items.push(Item::Call(c));
    }

    /// Appends a reshape of `t` to `dims`.
    pub fn reshape(&mut self, t: TensorId, dims: &[usize]) {
        self.items.push(Item::Reshape(t, dims.to_vec()));
    }

    /// Appends a stage over `args` (see [`Stage`]).
    pub fn stage(&mut self, name: &'static str, args: Vec<Arg>, run: StageFn<'a>) {
        self.items.push(Item::Stage(Stage { name, args, run }));
    }

    /// The items in order.
    pub fn items(&self) -> &[Item<'a>] {
        &self.items
    }

    /// The items, for a device's passes to rewrite.
    pub fn items_mut(&mut self) -> &mut Vec<Item<'a>> {
        &mut self.items
    }

    /// Removes and returns the items (the tensors stay): what `Executor::run_step` runs.
    pub fn take_items(&mut self) -> Vec<Item<'a>> {
        std::mem::take(&mut self.items)
    }

    /// The arguments `args` as a [`DataDict`] over this step's tensors. `Err` when a tensor is
    /// missing, written while held read-only, or written and passed twice.
    pub fn dict<'s>(&'s mut self, what: &str, args: &[Arg]) -> Result<DataDict<'s>> {
        if let Some(a) = args.iter().find(|a| a.tensor.0 >= self.tensors.len()) {
            return Err(Error::op(what, format!("'{}': no such tensor", a.name)));
        }
        // the distinct tensors passed, in index order: each is borrowed once
        let mut ids: Vec<usize> = args.iter().map(|a| a.tensor.0).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut d = DataDict::new();
        let mut rest: &'s mut [Held<'a>] = &mut self.tensors;
        let mut base = 0;
        for i in ids {
            let tail = std::mem::take(&mut rest).split_at_mut(i - base).1;
            let Some((held, tail)) = tail.split_first_mut() else {
                return Err(Error::op(what, "argument tensors out of order"));
            };
            rest = tail;
            base = i + 1;
            Self::pass(what, held, args, i, &mut d)?;
        }
        Ok(d)
    }

    /// Adds the arguments of `args` that pass tensor `i` (held as `held`) to `d`.
    fn pass<'s>(
        what: &str,
        held: &'s mut Held<'a>,
        args: &[Arg],
        i: usize,
        d: &mut DataDict<'s>,
    ) -> Result<()> {
        let mut uses = args.iter().filter(|a| a.tensor.0 == i);
        let Some(first) = uses.clone().next() else {
            return Ok(());
        };
        if args.iter().any(|a| a.tensor.0 == i && a.written) {
            if uses.count() > 1 {
                return Err(Error::op(
                    what,
                    format!("'{}' is written and passed twice", first.name),
                ));
            }
            match held {
                Held::Mut(x) => d.insert_mut(first.name, x),
                Held::Own(x) => d.insert_mut(first.name, x),
                Held::Ref(_) => {
                    return Err(Error::op(
                        what,
                        format!("'{}' is written but held read-only", first.name),
                    ))
                }
                Held::Gone => return Err(released(what, first.name)),
            }
        } else {
            let r: &Data = match held {
                Held::Ref(x) => x,
                Held::Mut(x) => x,
                Held::Own(x) => x,
                Held::Gone => return Err(released(what, first.name)),
            };
            for a in uses.by_ref() {
                d.insert(a.name, r);
            }
        }
        Ok(())
    }

    /// Gives `t` the dims `dims`.
    pub fn apply_reshape(&mut self, t: TensorId, dims: &[usize]) -> Result<()> {
        match self.tensors.get_mut(t.0) {
            Some(Held::Mut(d)) => d.reshape(dims),
            Some(Held::Own(d)) => d.reshape(dims),
            _ => Err(Error::invalid(
                "step: reshape of a read-only or missing tensor",
            )),
        }
    }

    /// Runs the stage `s` over this step's tensors.
    pub fn run_stage(&mut self, s: &mut Stage<'a>) -> Result<()> {
        let mut d = self.dict(s.name, &s.args)?;
        (s.run)(&mut d)
    }
}

fn released(what: &str, name: &str) -> Error {
    Error::op(what, format!("'{name}' was released before this call"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dict_borrows_each_tensor_once_and_refuses_bad_writes() {
        let w = Data::from_f32(&[2], &[1.0, 2.0]).unwrap();
        let mut out = Data::from_f32(&[2], &[0.0, 0.0]).unwrap();
        let mut s = Step::new();
        let wi = s.input(&w);
        let oi = s.mutable(&mut out);
        let c = Call::new("X").input("a", wi).input("b", wi).output("y", oi);
        let d = s.dict("X", &c.args).unwrap();
        assert!(d.get("a").is_some() && d.get("b").is_some() && d.is_mut("y"));
        drop(d);
        let bad = Call::new("X").output("y", wi);
        assert!(
            s.dict("X", &bad.args).is_err(),
            "a read-only tensor written"
        );
        let twice = Call::new("X").output("y", oi).input("a", oi);
        assert!(
            s.dict("X", &twice.args).is_err(),
            "a written tensor passed twice"
        );
        s.release(wi);
        assert!(s.dict("X", &c.args).is_err(), "a released tensor");
    }

    /// A step of calls, a reshape and a stage run on the CPU gives what the same ops called one
    /// by one give, bit for bit.
    #[test]
    fn run_step_equals_the_calls_one_by_one() {
        let e = crate::executor::Executor::cpu(1).unwrap();
        let x = Data::from_f32(&[2, 3], &[0.5, -1.0, 2.0, 1.5, 0.25, -0.75]).unwrap();
        let w = Data::from_f32(
            &[4, 3],
            &[
                0.1, 0.2, -0.3, 0.4, 0.5, 0.6, -0.7, 0.8, 0.9, 1.0, -1.1, 1.2,
            ],
        )
        .unwrap();
        let mut y = Data::empty(crate::data::DataType::F32);
        let mut z = Data::from_f32(&[2, 4], &[1.0; 8]).unwrap();
        {
            let mut st = Step::new();
            let (xi, wi) = (st.input(&x), st.input(&w));
            let (yi, zi) = (st.mutable(&mut y), st.mutable(&mut z));
            st.push(
                Call::new("Linear")
                    .input("input", xi)
                    .input("weight", wi)
                    .output("output", yi),
            );
            st.push(
                Call::new("AddTo")
                    .output("input0", zi)
                    .input("input1", yi)
                    .float("alpha", 1.0),
            );
            st.reshape(zi, &[8]);
            let twice = |d: &mut DataDict| {
                let z = d.require_mut("double", "input")?;
                let v: Vec<f32> = z.to_f32_vec()?.iter().map(|v| 2.0 * v).collect();
                *z = Data::from_f32(&[8], &v)?;
                Ok(())
            };
            let args = vec![Arg {
                name: "input",
                tensor: zi,
                written: true,
            }];
            st.stage("double", args, Box::new(twice));
            e.run_step(&mut st).unwrap();
            assert!(st.items().is_empty(), "the items were consumed");
        }
        let mut y2 = Data::empty(crate::data::DataType::F32);
        crate::ops::linear(&e, &x, &w, None, &mut y2, false).unwrap();
        let mut z2 = Data::from_f32(&[2, 4], &[1.0; 8]).unwrap();
        crate::ops::add_to(&e, &mut z2, &y2, 1.0).unwrap();
        let want: Vec<u32> = z2
            .to_f32_vec()
            .unwrap()
            .iter()
            .map(|v| (2.0 * v).to_bits())
            .collect();
        let got: Vec<u32> = z
            .to_f32_vec()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(z.dims(), [8]);
        assert_eq!(got, want);
        assert_eq!(y.to_f32_vec().unwrap(), y2.to_f32_vec().unwrap());
    }
}
