//! Data movement on the GPU: `CatDirect` (append in place into reserved capacity, growing by
//! doubling), `Cat`, `Split`, `Permute`, `PermuteSelf`. Element types of 2 or 4 bytes.

use super::buffer::{alloc_data, dptr, ensure_out};
use super::gpu::{long, Gpu, KArg, PermuteArgs};
use super::op_err;
use crate::data::{bytes_for, Data, DataType};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>) {
    ops.insert("CatDirect", Box::new(CatDirect(gpu.clone())));
    ops.insert("Cat", Box::new(Cat(gpu.clone())));
    ops.insert("Split", Box::new(Split(gpu.clone())));
    ops.insert(
        "Permute",
        Box::new(Permute {
            gpu: gpu.clone(),
            in_place: false,
        }),
    );
    ops.insert(
        "PermuteSelf",
        Box::new(Permute {
            gpu: gpu.clone(),
            in_place: true,
        }),
    );
}

fn plain(dt: Option<DataType>) -> bool {
    dt.is_some_and(|t| !t.is_quantized())
}

fn axis_of(op: &str, i: &IntDict, rank: usize) -> Result<usize> {
    let a = i.get_or("axis", 0);
    usize::try_from(a)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| op_err(op, format!("axis {a} out of range for rank {rank}")))
}

/// For `o < outer`: copies `chunk` bytes from `src + o·sp` to `dst + o·dp` (enqueued).
pub fn copy2d(
    gpu: &Gpu,
    src: u64,
    dst: u64,
    outer: usize,
    chunk: usize,
    sp: usize,
    dp: usize,
) -> Result<()> {
    if outer == 0 || chunk == 0 {
        return Ok(());
    }
    if outer == 1 {
        return gpu.dtod(src, dst, chunk);
    }
    let aligned = [src as usize, dst as usize, chunk, sp, dp]
        .iter()
        .all(|v| v % 4 == 0);
    let (name, unit) = if aligned {
        ("copy2d_u32", 4)
    } else {
        ("copy2d_u8", 1)
    };
    gpu.launch(
        name,
        Gpu::grid_for(outer * chunk / unit, 256),
        256,
        &[
            KArg::Ptr(src),
            KArg::Ptr(dst),
            long(outer, "rows")?,
            long(chunk / unit, "chunk")?,
            long(sp / unit, "pitch")?,
            long(dp / unit, "pitch")?,
        ],
    )
}

/// Checks that `b` can be appended to / concatenated with `a` along `axis`.
fn check_cat(op: &str, a: &Data, b: &Data, axis: usize) -> Result<()> {
    if a.dtype() != b.dtype()
        || a.dims().len() != b.dims().len()
        || (0..a.dims().len()).any(|i| i != axis && a.dims()[i] != b.dims()[i])
    {
        return Err(op_err(
            op,
            format!(
                "cannot join {} {:?} and {} {:?} along axis {axis}",
                a.dtype(),
                a.dims(),
                b.dtype(),
                b.dims()
            ),
        ));
    }
    Ok(())
}

struct CatDirect(Arc<Gpu>);

impl Operator for CatDirect {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        plain(d.dtype("input1")) && d.get("input1").is_some_and(|b| b.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let ([b], a) = d.io("CatDirect", ["input1"], "input0")?;
        let b = b.ok_or_else(|| op_err("CatDirect", "missing input 'input1'"))?;
        let axis = axis_of("CatDirect", i, b.dims().len())?;
        if a.is_allocated() || !a.dims().is_empty() {
            check_cat("CatDirect", a, b, axis)?;
            let other_expanded =
                (0..a.dims().len()).any(|x| x != axis && a.dims()[x] != a.capacity()[x]);
            if other_expanded {
                return Err(op_err(
                    "CatDirect",
                    format!("input0 {:?} is expanded on another axis than {axis}", a),
                ));
            }
        }
        Ok(())
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let ([b], a) = d.io("CatDirect", ["input1"], "input0")?;
        let b = b.ok_or_else(|| op_err("CatDirect", "missing input 'input1'"))?;
        let axis = axis_of("CatDirect", i, b.dims().len())?;
        let gpu = &self.0;
        if !a.is_allocated() && a.dims().is_empty() {
            // First append into an empty tensor: a copy of input1.
            let name = std::mem::take(&mut a.name);
            let fresh = alloc_data(gpu, b.dtype(), b.dims(), b.dims())?;
            gpu.dtod(
                dptr(b, "input1")?,
                dptr(&fresh, "input0")?,
                bytes_for(b.dtype(), b.dims())?,
            )?;
            *a = fresh;
            a.name = name;
            return Ok(());
        }
        let dt = a.dtype();
        let need = a.dims()[axis] + b.dims()[axis];
        let outer: usize = a.dims()[..axis].iter().product();
        if need > a.capacity()[axis] {
            let mut cap = a.capacity().to_vec();
            cap[axis] = need.max(2 * cap[axis]).max(1);
            let grown = alloc_data(gpu, dt, a.dims(), &cap)?;
            copy2d(
                gpu,
                dptr(a, "input0")?,
                dptr(&grown, "input0")?,
                outer,
                bytes_for(dt, &a.dims()[axis..])?,
                bytes_for(dt, &a.capacity()[axis..])?,
                bytes_for(dt, &cap[axis..])?,
            )?;
            let name = std::mem::take(&mut a.name);
            *a = grown;
            a.name = name;
        }
        let chunk = bytes_for(dt, &b.dims()[axis..])?;
        let at = bytes_for(dt, &a.dims()[axis..])?;
        let pitch = bytes_for(dt, &a.capacity()[axis..])?;
        copy2d(
            gpu,
            dptr(b, "input1")?,
            dptr(a, "input0")? + at as u64,
            outer,
            chunk,
            chunk,
            pitch,
        )?;
        a.set_len(axis, need)
    }
}

struct Cat(Arc<Gpu>);

impl Operator for Cat {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        plain(d.dtype("input0"))
            && d.get("input0").is_some_and(|x| x.is_contiguous())
            && d.get("input1").is_some_and(|x| x.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let a = d.require("Cat", "input0")?;
        let b = d.require("Cat", "input1")?;
        let axis = axis_of("Cat", i, a.dims().len())?;
        check_cat("Cat", a, b, axis)?;
        let mut od = a.dims().to_vec();
        od[axis] += b.dims()[axis];
        let dt = a.dtype();
        ensure_out(&self.0, d.require_mut("Cat", "output")?, dt, &od)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let ([a, b], y) = d.io("Cat", ["input0", "input1"], "output")?;
        let a = a.ok_or_else(|| op_err("Cat", "missing input 'input0'"))?;
        let b = b.ok_or_else(|| op_err("Cat", "missing input 'input1'"))?;
        let axis = axis_of("Cat", i, a.dims().len())?;
        let dt = a.dtype();
        let outer: usize = a.dims()[..axis].iter().product();
        let (ca, cb) = (
            bytes_for(dt, &a.dims()[axis..])?,
            bytes_for(dt, &b.dims()[axis..])?,
        );
        let yp = dptr(y, "output")?;
        copy2d(&self.0, dptr(a, "input0")?, yp, outer, ca, ca, ca + cb)?;
        copy2d(
            &self.0,
            dptr(b, "input1")?,
            yp + ca as u64,
            outer,
            cb,
            cb,
            ca + cb,
        )
    }
}

struct Split(Arc<Gpu>);

impl Split {
    fn args(x: &Data, i: &IntDict) -> Result<(usize, usize, usize)> {
        let axis = axis_of("Split", i, x.dims().len())?;
        let (s, e) = (i.get_or("start", 0), i.get_or("end", 0));
        let len = x.dims()[axis];
        match (usize::try_from(s), usize::try_from(e)) {
            (Ok(s), Ok(e)) if s <= e && e <= len => Ok((axis, s, e)),
            _ => Err(op_err(
                "Split",
                format!("range {s}..{e} is outside axis {axis} of {:?}", x.dims()),
            )),
        }
    }
}

impl Operator for Split {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        plain(d.dtype("input")) && d.get("input").is_some_and(|x| x.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let x = d.require("Split", "input")?;
        let (axis, s, e) = Self::args(x, i)?;
        let mut od = x.dims().to_vec();
        od[axis] = e - s;
        let dt = x.dtype();
        ensure_out(&self.0, d.require_mut("Split", "output")?, dt, &od)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let ([x], y) = d.io("Split", ["input"], "output")?;
        let x = x.ok_or_else(|| op_err("Split", "missing input 'input'"))?;
        let (axis, s, _) = Self::args(x, i)?;
        let dt = x.dtype();
        let outer: usize = x.dims()[..axis].iter().product();
        let inner: usize = x.dims()[axis + 1..].iter().product();
        let sp = bytes_for(dt, &x.dims()[axis..])?;
        let chunk = bytes_for(dt, &y.dims()[axis..])?;
        let off = bytes_for(dt, &[s * inner])?;
        copy2d(
            &self.0,
            dptr(x, "input")? + off as u64,
            dptr(y, "output")?,
            outer,
            chunk,
            sp,
            chunk,
        )
    }
}

struct Permute {
    gpu: Arc<Gpu>,
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
    /// The kernel arguments and output dims.
    fn plan(&self, x: &Data, i: &IntDict) -> Result<(PermuteArgs, Vec<usize>)> {
        let op = self.op();
        let n = x.dims().len();
        if n == 0 || n > 8 {
            return Err(op_err(
                op,
                format!("input {:?}: rank must be 1..=8", x.dims()),
            ));
        }
        const NAMES: [&str; 8] = [
            "axis0", "axis1", "axis2", "axis3", "axis4", "axis5", "axis6", "axis7",
        ];
        let strides = x.strides();
        let mut a = PermuteArgs {
            ndim: n as i32,
            ..Default::default()
        };
        let mut seen = [false; 8];
        let mut od = Vec::with_capacity(n);
        for (o, name) in NAMES.iter().take(n).enumerate() {
            let ax = i
                .get(name)
                .and_then(|v| usize::try_from(v).ok())
                .filter(|&v| v < n);
            let ax = match ax {
                Some(ax) if !seen[ax] => ax,
                _ => {
                    return Err(op_err(
                        op,
                        format!("{name} missing, out of range or repeated for rank {n}"),
                    ))
                }
            };
            seen[ax] = true;
            od.push(x.dims()[ax]);
            a.dims[o] = x.dims()[ax] as i64;
            a.strides[o] = strides[ax] as i64;
        }
        Ok((a, od))
    }
    fn launch(&self, x: &Data, y: &Data, a: PermuteArgs) -> Result<()> {
        let name = if x.dtype().block_bytes() == 4 {
            "permute_b32"
        } else {
            "permute_b16"
        };
        let n = y.count();
        self.gpu.launch(
            name,
            Gpu::grid_for(n, 256),
            256,
            &[
                KArg::Ptr(dptr(x, "input")?),
                KArg::Ptr(dptr(y, "output")?),
                long(n, "n")?,
                KArg::Permute(a),
            ],
        )
    }
}

impl Operator for Permute {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        plain(d.dtype("input"))
            && d.get("input")
                .is_some_and(|x| x.is_contiguous() && x.capacity() == x.dims())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let op = self.op();
        let x = d.require(op, "input")?;
        let (_, od) = self.plan(x, i)?;
        let dt = x.dtype();
        if self.in_place {
            d.require_mut(op, "input").map(|_| ())
        } else {
            ensure_out(&self.gpu, d.require_mut(op, "output")?, dt, &od)
        }
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, i: &IntDict) -> Result<()> {
        let op = self.op();
        if self.in_place {
            let x = d.require_mut(op, "input")?;
            let (a, od) = self.plan(x, i)?;
            let mut y = alloc_data(&self.gpu, x.dtype(), &od, &od)?;
            self.launch(x, &y, a)?;
            y.name = std::mem::take(&mut x.name);
            *x = y;
            return Ok(());
        }
        let ([x], y) = d.io(op, ["input"], "output")?;
        let x = x.ok_or_else(|| op_err(op, "missing input 'input'"))?;
        let (a, _) = self.plan(x, i)?;
        self.launch(x, y, a)
    }
}
