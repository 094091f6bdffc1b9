//! Shape operators on the CPU: `Permute`, `PermuteSelf`, `Cat`, `CatDirect` (in-place append into
//! reserved capacity via `Data::append`) and `Split`. Validates axes and shapes, sizes outputs,
//! and calls `fastllm_cpu::shape` (the per-element reference in reference mode, run copies
//! otherwise). Must not hold kernel arithmetic.

use super::args::{check_tensor, elem_size, non_neg, packed};
use super::CpuContext;
use crate::data::{Data, DataType};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::shape as k;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert(
        "Permute",
        Box::new(Permute {
            ctx: ctx.clone(),
            in_place: false,
        }),
    );
    ops.insert(
        "PermuteSelf",
        Box::new(Permute {
            ctx: ctx.clone(),
            in_place: true,
        }),
    );
    ops.insert("Cat", Box::new(Cat(ctx.clone())));
    ops.insert("CatDirect", Box::new(CatDirect(ctx.clone())));
    ops.insert("Split", Box::new(Split(ctx.clone())));
}

/// The plain dtypes the shape ops move.
const PLAIN: [DataType; 4] = [DataType::F32, DataType::I32, DataType::F16, DataType::BF16];

fn plain(d: &DataDict, names: &[&str]) -> bool {
    names.iter().all(|n| super::args::dtype_in(d, n, &PLAIN))
}

/// The axis order `axis0..axis{n-1}`, checked to be a permutation of `0..n`.
fn read_perm(op: &str, dims: &[usize], ints: &IntDict) -> Result<Vec<usize>> {
    let n = dims.len();
    let mut perm = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    for i in 0..n {
        let key = format!("axis{i}");
        let v = ints.get(&key).ok_or_else(|| {
            Error::op(op, format!("missing parameter '{key}' for input {dims:?}"))
        })?;
        let a = usize::try_from(v).ok().filter(|&a| a < n);
        match a {
            Some(a) if !seen[a] => {
                seen[a] = true;
                perm.push(a);
            }
            _ => {
                return Err(Error::op(
                    op,
                    format!("'{key}' = {v} is out of range or repeated for input {dims:?}"),
                ))
            }
        }
    }
    Ok(perm)
}

/// `Permute` (to `output`) and `PermuteSelf` (in place).
struct Permute {
    ctx: Arc<CpuContext>,
    in_place: bool,
}

impl Permute {
    fn op(&self) -> &'static str {
        if self.in_place {
            "PermuteSelf"
        } else {
            "Permute"
        }
    }
    fn permuted(&self, x: &Data, ints: &IntDict) -> Result<(Vec<u8>, Vec<usize>)> {
        let op = self.op();
        check_tensor(op, "input", x)?;
        let es = elem_size(op, "input", x)?;
        let perm = read_perm(op, x.dims(), ints)?;
        let out_dims: Vec<usize> = perm.iter().map(|&p| x.dims()[p]).collect();
        let src = packed(op, "input", x)?;
        let mut dst = vec![0u8; src.len()];
        if self.ctx.reference() {
            k::permute_ref(&src, x.dims(), &perm, es, &mut dst);
        } else {
            k::permute(&src, x.dims(), &perm, es, &mut dst);
        }
        Ok((dst, out_dims))
    }
}

impl Operator for Permute {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        plain(d, &["input"])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let op = self.op();
        let x = d.require(op, "input")?;
        check_tensor(op, "input", x)?;
        elem_size(op, "input", x)?;
        let perm = read_perm(op, x.dims(), i)?;
        if self.in_place {
            return Ok(());
        }
        let dims: Vec<usize> = perm.iter().map(|&p| x.dims()[p]).collect();
        let dt = x.dtype();
        d.require_mut(op, "output")?.resize(dt, &dims)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let op = self.op();
        if self.in_place {
            let x = d.require_mut(op, "input")?;
            let (bytes, dims) = self.permuted(x, i)?;
            let dt = x.dtype();
            x.resize(dt, &dims)?;
            x.bytes_mut()?.copy_from_slice(&bytes);
            return Ok(());
        }
        let ([x], out) = d.io(op, ["input"], "output")?;
        let (bytes, _) = self.permuted(super::args::need(op, "input", x)?, i)?;
        let o = out.bytes_mut()?;
        if o.len() != bytes.len() {
            return Err(Error::op(
                op,
                format!("'output' holds {} bytes, need {}", o.len(), bytes.len()),
            ));
        }
        o.copy_from_slice(&bytes);
        Ok(())
    }
}

/// Checks that `a` and `b` can be joined along `axis`; returns the output dims.
fn cat_dims(op: &str, a: &Data, b: &Data, axis: i32) -> Result<Vec<usize>> {
    if a.dtype() != b.dtype() {
        return Err(Error::op(
            op,
            format!("input0 is {} but input1 is {}", a.dtype(), b.dtype()),
        ));
    }
    let axis = non_neg(op, "axis", axis)?;
    let (da, db) = (a.dims(), b.dims());
    if axis >= da.len()
        || da.len() != db.len()
        || (0..da.len()).any(|i| i != axis && da[i] != db[i])
    {
        return Err(Error::op(
            op,
            format!("cannot join input0 {da:?} and input1 {db:?} along axis {axis}"),
        ));
    }
    let mut od = da.to_vec();
    od[axis] += db[axis];
    Ok(od)
}

/// `Cat`: `output` = `input0` and `input1` joined along `axis`.
struct Cat(Arc<CpuContext>);

impl Operator for Cat {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        plain(d, &["input0", "input1"])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let a = d.require("Cat", "input0")?;
        let b = d.require("Cat", "input1")?;
        check_tensor("Cat", "input0", a)?;
        check_tensor("Cat", "input1", b)?;
        elem_size("Cat", "input0", a)?;
        let od = cat_dims("Cat", a, b, i.get_or("axis", 0))?;
        let dt = a.dtype();
        d.require_mut("Cat", "output")?.resize(dt, &od)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "Cat";
        let ([a, b], out) = d.io(OP, ["input0", "input1"], "output")?;
        let (a, b) = (
            super::args::need(OP, "input0", a)?,
            super::args::need(OP, "input1", b)?,
        );
        let od = cat_dims(OP, a, b, i.get_or("axis", 0))?;
        let axis = non_neg(OP, "axis", i.get_or("axis", 0))?;
        let es = elem_size(OP, "input0", a)?;
        let (sa, sb) = (packed(OP, "input0", a)?, packed(OP, "input1", b)?);
        if out.dims() != od.as_slice() {
            return Err(Error::op(
                OP,
                format!("'output' is {:?}, need {od:?}", out.dims()),
            ));
        }
        let o = out.bytes_mut()?;
        if self.0.reference() {
            k::cat_ref(&sa, a.dims(), &sb, b.dims(), axis, es, o);
        } else {
            k::cat(&sa, a.dims(), &sb, b.dims(), axis, es, o);
        }
        Ok(())
    }
}

/// `CatDirect`: appends `input1` to `input0` along `axis`, in place (reserved capacity first).
/// Fast mode is `Data::append`; reference mode writes each element at its strided address.
struct CatDirect(Arc<CpuContext>);

/// Reference append: the same growth policy as `Data::append`, then every element of `b` is
/// copied to the address its coordinates give in `a`'s capacity layout.
fn append_per_element(a: &mut Data, b: &Data, axis: usize) -> Result<()> {
    const OP: &str = "CatDirect";
    let es = elem_size(OP, "input0", a)?;
    let old = a.dims()[axis];
    let need = old + b.dims()[axis];
    if need > a.capacity()[axis] {
        let cap = need.max(a.capacity()[axis] * 2).max(1);
        a.reserve(axis, cap).map_err(|e| Error::op(OP, e))?;
    }
    let strides = a.strides();
    let bd = b.dims().to_vec();
    let src = packed(OP, "input1", b)?;
    let dst = a.raw_bytes_mut().map_err(|e| Error::op(OP, e))?;
    let n: usize = bd.iter().product();
    for e in 0..n {
        let (mut rem, mut at) = (e, 0usize);
        for ax in (0..bd.len()).rev() {
            let c = rem % bd[ax];
            rem /= bd[ax];
            at += (if ax == axis { c + old } else { c }) * strides[ax];
        }
        match (
            src.get(e * es..(e + 1) * es),
            dst.get_mut(at * es..(at + 1) * es),
        ) {
            (Some(s), Some(d)) => d.copy_from_slice(s),
            _ => {
                return Err(Error::op(
                    OP,
                    format!("element {e} of input1 {bd:?} falls outside input0's storage"),
                ))
            }
        }
    }
    a.set_len(axis, need).map_err(|e| Error::op(OP, e))
}

impl Operator for CatDirect {
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let a = d.require("CatDirect", "input0")?;
        let b = d.require("CatDirect", "input1")?;
        check_tensor("CatDirect", "input1", b)?;
        if a.is_allocated() && !a.dims().is_empty() {
            cat_dims("CatDirect", a, b, i.get_or("axis", 0))?;
        } else {
            non_neg("CatDirect", "axis", i.get_or("axis", 0))?;
        }
        Ok(())
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "CatDirect";
        let axis = non_neg(OP, "axis", i.get_or("axis", 0))?;
        let ([b], a) = d.io(OP, ["input1"], "input0")?;
        let b = super::args::need(OP, "input1", b)?;
        let fresh = !a.is_allocated() || a.dims().is_empty();
        if self.0.reference() && !fresh && !a.dtype().is_quantized() {
            cat_dims(OP, a, b, axis as i32)?;
            return append_per_element(a, b, axis);
        }
        a.append(b, axis).map_err(|e| Error::op(OP, e))
    }
}

/// `Split`: `output` = the slice `start..end` of `input` along `axis`.
struct Split(Arc<CpuContext>);

/// Validated (axis, start, end) and output dims.
fn split_args(x: &Data, i: &IntDict) -> Result<(usize, usize, usize, Vec<usize>)> {
    const OP: &str = "Split";
    let axis = non_neg(OP, "axis", i.get_or("axis", 0))?;
    let start = non_neg(OP, "start", i.get_or("start", 0))?;
    let len = x.dims().get(axis).copied().ok_or_else(|| {
        Error::op(
            OP,
            format!("axis {axis} out of range for input {:?}", x.dims()),
        )
    })?;
    let end = match i.get("end") {
        Some(v) => non_neg(OP, "end", v)?,
        None => len,
    };
    if start > end || end > len {
        return Err(Error::op(
            OP,
            format!(
                "slice {start}..{end} out of range for axis {axis} of input {:?}",
                x.dims()
            ),
        ));
    }
    let mut od = x.dims().to_vec();
    od[axis] = end - start;
    Ok((axis, start, end, od))
}

impl Operator for Split {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        plain(d, &["input"])
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let x = d.require("Split", "input")?;
        check_tensor("Split", "input", x)?;
        elem_size("Split", "input", x)?;
        let (.., od) = split_args(x, i)?;
        let dt = x.dtype();
        d.require_mut("Split", "output")?.resize(dt, &od)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        const OP: &str = "Split";
        let ([x], out) = d.io(OP, ["input"], "output")?;
        let x = super::args::need(OP, "input", x)?;
        let (axis, start, end, od) = split_args(x, i)?;
        let es = elem_size(OP, "input", x)?;
        let src = packed(OP, "input", x)?;
        if out.dims() != od.as_slice() {
            return Err(Error::op(
                OP,
                format!("'output' is {:?}, need {od:?}", out.dims()),
            ));
        }
        let o = out.bytes_mut()?;
        if self.0.reference() {
            k::split_ref(&src, x.dims(), axis, start, end, es, o);
        } else {
            k::split(&src, x.dims(), axis, start, end, es, o);
        }
        Ok(())
    }
}
