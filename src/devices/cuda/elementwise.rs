//! Elementwise operators on the GPU (f32): `Silu`, `Gelu`, `SoftCap`, `Swiglu`, `GeluGated`,
//! `Add`, `AddTo` (f32 += f32, f16 or bf16), `Mul`, `MulTo`, and `SiluMul` (`output = silu(input0) · input1`, the gated
//! MLP's activation and product in one pass; GPU only, the model uses it when the device has it).
//! `SiluMul` also takes f16 or bf16 inputs (the half outputs a tensor-core `Linear` writes
//! with `half_output`, see `linear`) and then writes its output in the same dtype.

use super::act_quant::{ActForm, ActQuant};
use super::buffer::{dptr, ensure_out};
use super::gpu::{long, Gpu, KArg};
use super::linear::TC_MIN_ROWS;
use super::{all_f32, op_err};
use crate::data::DataType;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::Result;
use std::sync::Arc;

/// Registers this family's operators.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>, act: &Arc<ActQuant>) {
    for kind in [
        Act::Silu,
        Act::Gelu,
        Act::SoftCap,
        Act::Swiglu,
        Act::GeluGated,
    ] {
        ops.insert(
            kind.op(),
            Box::new(Activation {
                gpu: gpu.clone(),
                kind,
            }),
        );
    }
    ops.insert("Add", Box::new(Add(gpu.clone())));
    ops.insert(
        "AddTo",
        Box::new(InPlace {
            gpu: gpu.clone(),
            mul: false,
        }),
    );
    ops.insert(
        "MulTo",
        Box::new(InPlace {
            gpu: gpu.clone(),
            mul: true,
        }),
    );
    ops.insert("Mul", Box::new(Mul(gpu.clone())));
    ops.insert("SiluMul", Box::new(SiluMul(gpu.clone(), act.clone())));
}

/// Whether `input0` and `input1` are both f32, or both f16 or both bf16, and contiguous.
fn f32_or_half_pair(d: &DataDict) -> bool {
    let half_pair = matches!(d.dtype("input0"), Some(DataType::F16 | DataType::BF16))
        && d.dtype("input0") == d.dtype("input1");
    (all_f32(d, &["input0", "input1"]) || half_pair)
        && d.get("input0").is_some_and(|x| x.is_contiguous())
        && d.get("input1").is_some_and(|x| x.is_contiguous())
}

/// `output = silu(input0) · input1` (same shapes); with `quantize_output = 1` (and a row length that is a
/// multiple of 32) the output is also left as Q8_0 rows for the next `Linear` (quant_act), with
/// 2 / 3 (and at least `TC_MIN_ROWS` rows) as f16 / bf16 rows for its tensor-core path.
struct SiluMul(Arc<Gpu>, Arc<ActQuant>);

impl Operator for SiluMul {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        f32_or_half_pair(d)
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let g = d.require("SiluMul", "input0")?;
        let u = d.require("SiluMul", "input1")?;
        if g.dims() != u.dims() {
            return Err(op_err(
                "SiluMul",
                format!("input0 {:?} and input1 {:?} differ", g.dims(), u.dims()),
            ));
        }
        if g.dtype() != u.dtype() {
            return Err(op_err(
                "SiluMul",
                format!("input0 is {:?} but input1 is {:?}", g.dtype(), u.dtype()),
            ));
        }
        // half inputs give a half output of the same kind; everything else is f32
        let dt = match g.dtype() {
            t @ (DataType::F16 | DataType::BF16) => t,
            _ => DataType::F32,
        };
        let dims = g.dims().to_vec();
        ensure_out(&self.0, d.require_mut("SiluMul", "output")?, dt, &dims)
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, ints: &IntDict) -> Result<()> {
        let ([g, u], y) = d.io("SiluMul", ["input0", "input1"], "output")?;
        let g = g.ok_or_else(|| op_err("SiluMul", "missing input 'input0'"))?;
        let u = u.ok_or_else(|| op_err("SiluMul", "missing input 'input1'"))?;
        let n = y.count();
        if let t @ (DataType::F16 | DataType::BF16) = g.dtype() {
            if n == 0 {
                return Ok(());
            }
            let (gp, up, yp) = (dptr(g, "input0")?, dptr(u, "input1")?, dptr(y, "output")?);
            let aligned = [gp, up, yp].iter().all(|p| p % 16 == 0);
            let n8 = if aligned { n / 8 } else { 0 };
            return self.0.launch(
                "silu_mul_hh",
                Gpu::grid_for(n8.max(n - 8 * n8), 256),
                256,
                &[
                    KArg::Ptr(gp),
                    KArg::Ptr(up),
                    KArg::Ptr(yp),
                    long(n, "n")?,
                    long(n8, "n / 8")?,
                    KArg::I32((t == DataType::BF16) as i32),
                ],
            );
        }
        let row = y.dims().last().copied().unwrap_or(0);
        let args = [
            KArg::Ptr(dptr(g, "input0")?),
            KArg::Ptr(dptr(u, "input1")?),
            KArg::Ptr(dptr(y, "output")?),
            long(n, "n")?,
        ];
        let copy = ActForm::from_param(ints.get_or("quantize_output", 0));
        let rows = n.checked_div(row).unwrap_or(0);
        if let Some(form @ (ActForm::F16 | ActForm::Bf16)) = copy {
            let (gp, up, yp) = (dptr(g, "input0")?, dptr(u, "input1")?, dptr(y, "output")?);
            let aligned = [gp, up, yp].iter().all(|p| p % 16 == 0);
            if rows >= TC_MIN_ROWS && n.is_multiple_of(4) && aligned {
                let (hp, key) = self.1.half_slot(yp, rows, row, form)?;
                self.0.launch(
                    "silu_mul_h_f32",
                    Gpu::grid_for(n / 4, 256),
                    256,
                    &[
                        KArg::Ptr(gp),
                        KArg::Ptr(up),
                        KArg::Ptr(yp),
                        long(n / 4, "n / 4")?,
                        KArg::Ptr(hp),
                        KArg::I32((form == ActForm::Bf16) as i32),
                    ],
                )?;
                return self.1.set(key, true);
            }
        }
        if copy == Some(ActForm::Q8) && row > 0 && row.is_multiple_of(32) {
            let out = dptr(y, "output")?;
            let (qs, ds, key) = self.1.slots(out, n / row, row)?;
            let mut a = args.to_vec();
            a.extend([KArg::Ptr(qs), KArg::Ptr(ds)]);
            self.0
                .launch("silu_mul_q8_f32", Gpu::grid_for(n, 256), 256, &a)?;
            return self.1.set(key, true);
        }
        self.0
            .launch("silu_mul_f32", Gpu::grid_for(n, 256), 256, &args)
    }
}

#[derive(Clone, Copy)]
enum Act {
    Silu,
    Gelu,
    SoftCap,
    Swiglu,
    GeluGated,
}

impl Act {
    fn op(self) -> &'static str {
        match self {
            Act::Silu => "Silu",
            Act::Gelu => "Gelu",
            Act::SoftCap => "SoftCap",
            Act::Swiglu => "Swiglu",
            Act::GeluGated => "GeluGated",
        }
    }
    fn gated(self) -> bool {
        matches!(self, Act::Swiglu | Act::GeluGated)
    }
}

/// `input` → `output` through an activation; the gated ones halve the last dim.
struct Activation {
    gpu: Arc<Gpu>,
    kind: Act,
}

impl Operator for Activation {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input") == Some(DataType::F32) && d.get("input").is_some_and(|x| x.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        let op = self.kind.op();
        let x = d.require(op, "input")?;
        let mut dims = x.dims().to_vec();
        if self.kind.gated() {
            let last = dims.last().copied().unwrap_or(0);
            if dims.is_empty() || last % 2 != 0 {
                return Err(op_err(op, format!("input {dims:?} needs an even last dim")));
            }
            if let Some(l) = dims.last_mut() {
                *l = last / 2;
            }
        }
        if matches!(self.kind, Act::SoftCap) && f.get("cap").is_none_or(|c| c == 0.0) {
            return Err(op_err(op, "needs a non-zero 'cap'"));
        }
        let out = d.require_mut(op, "output")?;
        ensure_out(&self.gpu, out, DataType::F32, &dims)
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        let op = self.kind.op();
        let ([x], y) = d.io(op, ["input"], "output")?;
        let x = x.ok_or_else(|| op_err(op, "missing input 'input'"))?;
        let (xp, yp) = (dptr(x, "input")?, dptr(y, "output")?);
        let n = y.count();
        let approx = i.get_or("approx", 1);
        let g = Gpu::grid_for(n, 256);
        match self.kind {
            Act::Silu => self.gpu.launch(
                "silu_f32",
                g,
                256,
                &[KArg::Ptr(xp), KArg::Ptr(yp), long(n, "n")?],
            ),
            Act::Gelu => self.gpu.launch(
                "gelu_f32",
                g,
                256,
                &[
                    KArg::Ptr(xp),
                    KArg::Ptr(yp),
                    long(n, "n")?,
                    KArg::I32(approx),
                ],
            ),
            Act::SoftCap => self.gpu.launch(
                "softcap_f32",
                g,
                256,
                &[
                    KArg::Ptr(xp),
                    KArg::Ptr(yp),
                    long(n, "n")?,
                    KArg::F32(f.get_or("cap", 1.0)),
                ],
            ),
            Act::Swiglu | Act::GeluGated => {
                let dd = y.dim(-1);
                let rows = n.checked_div(dd).unwrap_or(0);
                let mut args = vec![
                    KArg::Ptr(xp),
                    KArg::Ptr(yp),
                    long(rows, "rows")?,
                    long(dd, "d")?,
                ];
                let name = if matches!(self.kind, Act::Swiglu) {
                    "swiglu_f32"
                } else {
                    args.push(KArg::I32(approx));
                    "gelugated_f32"
                };
                self.gpu.launch(name, g, 256, &args)
            }
        }
    }
}

/// `Add`: `output = input0 + alpha·input1` (same shape).
struct Add(Arc<Gpu>);

impl Operator for Add {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        f32_or_half_pair(d)
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let a = d.require("Add", "input0")?;
        let b = d.require("Add", "input1")?;
        if a.dims() != b.dims() {
            return Err(op_err(
                "Add",
                format!(
                    "input0 {:?} and input1 {:?} differ in shape",
                    a.dims(),
                    b.dims()
                ),
            ));
        }
        let dims = a.dims().to_vec();
        ensure_out(
            &self.0,
            d.require_mut("Add", "output")?,
            DataType::F32,
            &dims,
        )
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        let ([a, b], y) = d.io("Add", ["input0", "input1"], "output")?;
        let a = a.ok_or_else(|| op_err("Add", "missing input 'input0'"))?;
        let b = b.ok_or_else(|| op_err("Add", "missing input 'input1'"))?;
        let n = y.count();
        self.0.launch(
            "add_f32",
            Gpu::grid_for(n, 256),
            256,
            &[
                KArg::Ptr(dptr(a, "input0")?),
                KArg::Ptr(dptr(b, "input1")?),
                KArg::Ptr(dptr(y, "output")?),
                long(n, "n")?,
                KArg::F32(f.get_or("alpha", 1.0)),
            ],
        )
    }
}

/// `AddTo` (`input0 += alpha·input1`) and `MulTo` (`input0 *= input1`); `input1` same shape
/// or one row broadcast.
struct InPlace {
    gpu: Arc<Gpu>,
    mul: bool,
}

impl InPlace {
    fn op(&self) -> &'static str {
        if self.mul {
            "MulTo"
        } else {
            "AddTo"
        }
    }
}

impl Operator for InPlace {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        // `AddTo` also adds f16 / bf16 rows (a half all-reduce) into f32 ones
        let b_ok = match d.dtype("input1") {
            Some(DataType::F32) => true,
            Some(DataType::F16 | DataType::BF16) => !self.mul,
            _ => false,
        };
        d.dtype("input0") == Some(DataType::F32)
            && b_ok
            && d.get("input0").is_some_and(|x| x.is_contiguous())
            && d.get("input1").is_some_and(|x| x.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let op = self.op();
        let a = d.require(op, "input0")?;
        let b = d.require(op, "input1")?;
        let row = a.dims().last().copied().unwrap_or(1);
        let same = a.dims() == b.dims();
        let bcast = b.dims().len() == 1 && b.dims()[0] == row && row > 0;
        if !same && !bcast {
            return Err(op_err(
                op,
                format!(
                    "input1 {:?} must equal input0 {:?} or be one row of {row}",
                    b.dims(),
                    a.dims()
                ),
            ));
        }
        d.require_mut(op, "input0").map(|_| ())
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        let op = self.op();
        let ([b], a) = d.io(op, ["input1"], "input0")?;
        let b = b.ok_or_else(|| op_err(op, "missing input 'input1'"))?;
        let n = a.count();
        let bn = b.count().max(1);
        let (ap, bp) = (dptr(a, "input0")?, dptr(b, "input1")?);
        let g = Gpu::grid_for(n, 256);
        if self.mul {
            self.gpu.launch(
                "multo_f32",
                g,
                256,
                &[KArg::Ptr(ap), KArg::Ptr(bp), long(n, "n")?, long(bn, "n")?],
            )
        } else {
            let alpha = f.get_or("alpha", 1.0);
            add_to_kernel(&self.gpu, (ap, n), (bp, bn, b.dtype()), alpha)
        }
    }
}

/// `a[i] += alpha · b[i % bn]` over `n` f32 values at `a`, `b` f32, f16 or bf16.
pub fn add_to_kernel(
    gpu: &Gpu,
    (ap, n): (u64, usize),
    (bp, bn, bt): (u64, usize, DataType),
    alpha: f32,
) -> Result<()> {
    let mut args = vec![
        KArg::Ptr(ap),
        KArg::Ptr(bp),
        long(n, "n")?,
        long(bn, "n")?,
        KArg::F32(alpha),
    ];
    let name = match bt {
        DataType::F32 => "addto_f32",
        DataType::F16 | DataType::BF16 => {
            args.push(KArg::I32((bt == DataType::BF16) as i32));
            "addto_f32_h"
        }
        t => return Err(op_err("AddTo", format!("input1 of {t:?}"))),
    };
    gpu.launch(name, Gpu::grid_for(n, 256), 256, &args)
}

/// `Mul`: `output = input · v`.
struct Mul(Arc<Gpu>);

impl Operator for Mul {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input") == Some(DataType::F32) && d.get("input").is_some_and(|x| x.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let dims = d.require("Mul", "input")?.dims().to_vec();
        ensure_out(
            &self.0,
            d.require_mut("Mul", "output")?,
            DataType::F32,
            &dims,
        )
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        let ([x], y) = d.io("Mul", ["input"], "output")?;
        let x = x.ok_or_else(|| op_err("Mul", "missing input 'input'"))?;
        let n = y.count();
        self.0.launch(
            "mul_f32",
            Gpu::grid_for(n, 256),
            256,
            &[
                KArg::Ptr(dptr(x, "input")?),
                KArg::Ptr(dptr(y, "output")?),
                long(n, "n")?,
                KArg::F32(f.get_or("v", 1.0)),
            ],
        )
    }
}
