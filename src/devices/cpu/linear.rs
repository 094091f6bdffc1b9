//! Matrix operators on the CPU: `Linear` (F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q2_K/Q3_K/Q4_K/Q5_K/
//! Q6_K weights, plain or (all but F32 and Q5_0) interleaved 16 rows at a time
//! (`crate::interleave`), optional bias, `quant_act`; up to three weights of one input with
//! `weight1`/`bias1`/`output1` and `weight2`/…, interleaved ones run as one pool job), `MatMul`
//! and `MatMulTransB` (f32, batched). `reshape` validates shapes and dtypes and sizes the
//! outputs; `run` adapts `Data` to the kernels of `fastllm_cpu::linear` (scalar references in
//! `KernelMode::Reference`, SIMD + threads in `Fast`).
//!
//! This module must not contain arithmetic beyond batching; the kernels live in the `cpu` crate.

use super::CpuContext;
use crate::data::{Data, DataType};
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use fastllm_cpu::linear::matmul::{self as mm, MatMulShape};
use fastllm_cpu::linear::{self as k, LinearArgs, WeightType};
use fastllm_cpu::threads::Threads;
use std::borrow::Cow;
use std::sync::Arc;

/// Registers `Linear`, `MatMul` and `MatMulTransB`.
pub fn register(ops: &mut OpRegistry, ctx: &Arc<CpuContext>) {
    ops.insert("Linear", Box::new(Linear(ctx.clone())));
    ops.insert(
        "MatMul",
        Box::new(MatMul {
            ctx: ctx.clone(),
            trans_b: false,
        }),
    );
    ops.insert(
        "MatMulTransB",
        Box::new(MatMul {
            ctx: ctx.clone(),
            trans_b: true,
        }),
    );
}

/// The kernel weight type of a dtype, if `Linear` accepts it.
pub(super) fn weight_type(t: DataType) -> Option<WeightType> {
    Some(match t {
        DataType::F32 => WeightType::F32,
        DataType::F16 => WeightType::F16,
        DataType::BF16 => WeightType::BF16,
        DataType::Q8_0 => WeightType::Q8_0,
        DataType::Q4_0 => WeightType::Q4_0,
        DataType::Q4_1 => WeightType::Q4_1,
        DataType::Q5_0 => WeightType::Q5_0,
        DataType::Q4K => WeightType::Q4K,
        DataType::Q5K => WeightType::Q5K,
        DataType::Q6K => WeightType::Q6K,
        DataType::Q2K => WeightType::Q2K,
        DataType::Q3K => WeightType::Q3K,
        DataType::Mxfp4 => WeightType::Mxfp4,
        DataType::Q8_0Interleaved
        | DataType::Q4_0Interleaved
        | DataType::Q4_1Interleaved
        | DataType::F16Interleaved
        | DataType::BF16Interleaved
        | DataType::Q4KInterleaved
        | DataType::Q5KInterleaved
        | DataType::Q6KInterleaved
        | DataType::Q2KInterleaved
        | DataType::Q3KInterleaved => return t.kernel_type(),
        DataType::I32 => return None,
    })
}

/// The f32 values of `d` in logical row-major order (borrowed when contiguous).
fn f32_values<'a>(op: &str, name: &str, d: &'a Data) -> Result<Cow<'a, [f32]>> {
    let err = |e: Error| Error::op(op, format!("{name}: {e}"));
    if d.is_contiguous() {
        let v = d.as_f32().map_err(err)?;
        Ok(Cow::Borrowed(v.get(..d.count()).unwrap_or(v)))
    } else {
        Ok(Cow::Owned(d.to_f32_vec().map_err(err)?))
    }
}

/// `Linear`: `output[.., n] = input[.., k] · weight[n, k]ᵀ + bias[n]`.
struct Linear(Arc<CpuContext>);

/// The (weight, bias, output) names of a `Linear` call's weights: one, or up to three over
/// one input (the fused q/k/v or gate/up form a device's pass makes).
const PARTS: [(&str, &str, &str); 3] = [
    ("weight", "bias", "output"),
    ("weight1", "bias1", "output1"),
    ("weight2", "bias2", "output2"),
];

impl Linear {
    /// Validates the arguments of every weight given; returns (rows, k, n) of each.
    fn all_shapes(d: &DataDict) -> Result<Vec<(usize, usize, usize)>> {
        if d.contains("weight2") && !d.contains("weight1") {
            return Err(Error::op("Linear", "'weight2' given without 'weight1'"));
        }
        let mut v = Vec::with_capacity(PARTS.len());
        for p in PARTS {
            if p.0 == "weight" || d.contains(p.0) {
                v.push(Self::shapes(d, p)?);
            }
        }
        Ok(v)
    }

    /// Validates the input and the weight and bias named in `part`; returns (rows, k, n).
    fn shapes(d: &DataDict, (wn, bn, _): (&str, &str, &str)) -> Result<(usize, usize, usize)> {
        const OP: &str = "Linear";
        let x = d.require(OP, "input")?;
        let w = d.require(OP, wn)?;
        if x.dtype() != DataType::F32 {
            return Err(Error::op(
                OP,
                format!("input must be f32, got {} {:?}", x.dtype(), x.dims()),
            ));
        }
        if weight_type(w.dtype()).is_none() {
            return Err(Error::op(
                OP,
                format!("{wn} dtype {} is not supported", w.dtype()),
            ));
        }
        let (xd, wd) = (x.dims(), w.dims());
        let (Some(&kx), [n, kw]) = (xd.last(), wd) else {
            return Err(Error::op(
                OP,
                format!(
                    "input {xd:?} must have at least 1 dim and weight {wd:?} exactly 2 ([n, k])"
                ),
            ));
        };
        if kx != *kw {
            return Err(Error::op(
                OP,
                format!("input {xd:?} and {wn} {wd:?} differ in k ({kx} vs {kw})"),
            ));
        }
        if let Some(b) = d.get(bn) {
            if b.dtype() != DataType::F32 || b.dims() != [*n] {
                return Err(Error::op(
                    OP,
                    format!(
                        "{bn} must be f32 [{n}] for {wn} {wd:?}, got {} {:?}",
                        b.dtype(),
                        b.dims()
                    ),
                ));
            }
        }
        Ok((x.count() / kx.max(1), kx, *n))
    }
}

impl Operator for Linear {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input") == Some(DataType::F32)
            && d.dtype("weight").and_then(weight_type).is_some()
            && PARTS.iter().all(|(w, b, _)| {
                d.dtype(w).is_none_or(|t| weight_type(t).is_some())
                    && d.dtype(b).is_none_or(|t| t == DataType::F32)
            })
    }

    fn reshape(&self, d: &mut DataDict, _: &FloatDict, ints: &IntDict) -> Result<()> {
        let shapes = Self::all_shapes(d)?;
        let accumulate = ints.get_or("accumulate", 0) != 0;
        if accumulate && shapes.len() > 1 {
            return Err(Error::op("Linear", "accumulate takes a single weight"));
        }
        let lead = d.require("Linear", "input")?.dims().to_vec();
        for (&(_, _, n), (_, _, on)) in shapes.iter().zip(PARTS) {
            let mut dims = lead.clone();
            if let Some(last) = dims.last_mut() {
                *last = n;
            }
            let out = d.require_mut("Linear", on)?;
            if !accumulate {
                out.resize(DataType::F32, &dims)?;
            } else if out.dims() != dims.as_slice() || out.dtype() != DataType::F32 {
                // the output holds the rows the product is added to
                return Err(Error::op(
                    "Linear",
                    format!(
                        "accumulate needs output to be F32 {dims:?}, got {} {:?}",
                        out.dtype(),
                        out.dims()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn run(&self, d: &mut DataDict, _: &FloatDict, ints: &IntDict) -> Result<()> {
        const OP: &str = "Linear";
        let shapes = Self::all_shapes(d)?;
        let names = [
            "input", "weight", "bias", "weight1", "bias1", "weight2", "bias2",
        ];
        let (ins, outs) = d.io_many(OP, names, ["output", "output1", "output2"])?;
        let x = ins[0].ok_or_else(|| Error::op(OP, "missing input 'input'"))?;
        let xv = f32_values(OP, "input", x)?;
        let quant_act = ints.get_or("quant_act", 0) != 0;
        let mut parts = Vec::with_capacity(shapes.len());
        let mut kinds = Vec::with_capacity(shapes.len());
        for (((rows, kk, n), o), p) in shapes.into_iter().zip(outs).zip(0..) {
            let (w, bias) = (ins[1 + 2 * p], ins[2 + 2 * p]);
            let (wn, bn, on) = PARTS[p];
            let w = w.ok_or_else(|| Error::op(OP, format!("missing input '{wn}'")))?;
            let o = o.ok_or_else(|| Error::op(OP, format!("missing output '{on}'")))?;
            kinds.push(w.dtype().is_interleaved());
            let args = LinearArgs {
                x: &xv,
                rows,
                k: kk,
                w: w.bytes().map_err(|e| Error::op(OP, format!("{wn}: {e}")))?,
                wtype: weight_type(w.dtype())
                    .ok_or_else(|| Error::op(OP, format!("unsupported {wn} dtype")))?,
                n,
                bias: match bias {
                    Some(b) => Some(
                        b.as_f32()
                            .map_err(|e| Error::op(OP, format!("{bn}: {e}")))?,
                    ),
                    None => None,
                },
                quant_act,
            };
            let o = o
                .as_f32_mut()
                .map_err(|e| Error::op(OP, format!("{on}: {e}")))?
                .get_mut(..rows * n)
                .ok_or_else(|| Error::op(OP, format!("{on} smaller than its dims")))?;
            parts.push(k::LinearCall { args, out: o });
        }
        let threads = (!self.0.reference()).then_some(&self.0.threads);
        if parts.len() > 1 && kinds.iter().all(|&i| i) {
            return k::linear_interleaved_many(threads, &mut parts).map_err(|e| Error::op(OP, e));
        }
        let accumulate = ints.get_or("accumulate", 0) != 0;
        for (c, interleaved) in parts.iter_mut().zip(kinds) {
            Self::one(threads, c, interleaved, accumulate)?;
        }
        Ok(())
    }
}

impl Linear {
    /// One weight's product into its output (added to what the output holds with `accumulate`);
    /// `interleaved` when the weight is stored interleaved.
    fn one(
        threads: Option<&Threads>,
        c: &mut k::LinearCall,
        interleaved: bool,
        accumulate: bool,
    ) -> Result<()> {
        let (a, o) = (&c.args, &mut *c.out);
        // accumulate: y += x·Wᵀ + b (the product computed apart, then added)
        let held = accumulate.then(|| o.to_vec());
        let r = match threads {
            _ if interleaved => k::linear_interleaved(threads, a, o),
            Some(t) => k::linear(t, a, o),
            None => k::linear_ref(a, o),
        };
        r.map_err(|e| Error::op("Linear", e))?;
        if let Some(h) = held {
            o.iter_mut().zip(h).for_each(|(y, v)| *y += v);
        }
        Ok(())
    }
}

/// `MatMul` (`trans_b = false`: `input1` is [.., k, n]) and `MatMulTransB` (`input1` is
/// [.., n, k]): batched `alpha · A · B(ᵀ)`. Leading dims must be equal, or `input1` 2-D
/// (broadcast over every batch of `input0`).
struct MatMul {
    ctx: Arc<CpuContext>,
    trans_b: bool,
}

/// Validated sizes of one batched product.
struct Batched {
    batch: usize,
    shape: MatMulShape,
    broadcast_b: bool,
    out_dims: Vec<usize>,
}

impl MatMul {
    fn name(&self) -> &'static str {
        if self.trans_b {
            "MatMulTransB"
        } else {
            "MatMul"
        }
    }

    fn shapes(&self, d: &DataDict) -> Result<Batched> {
        let op = self.name();
        let a = d.require(op, "input0")?;
        let b = d.require(op, "input1")?;
        if a.dtype() != DataType::F32 || b.dtype() != DataType::F32 {
            return Err(Error::op(
                op,
                format!(
                    "input0 and input1 must be f32, got {} {:?} and {} {:?}",
                    a.dtype(),
                    a.dims(),
                    b.dtype(),
                    b.dims()
                ),
            ));
        }
        let (ad, bd) = (a.dims(), b.dims());
        if ad.len() < 2 || bd.len() < 2 {
            return Err(Error::op(
                op,
                format!("input0 {ad:?} and input1 {bd:?} need at least 2 dims"),
            ));
        }
        let (m, ka) = (ad[ad.len() - 2], ad[ad.len() - 1]);
        let (kb, n) = if self.trans_b {
            (bd[bd.len() - 1], bd[bd.len() - 2])
        } else {
            (bd[bd.len() - 2], bd[bd.len() - 1])
        };
        if ka != kb {
            return Err(Error::op(
                op,
                format!("input0 {ad:?} and input1 {bd:?} differ in k ({ka} vs {kb})"),
            ));
        }
        let lead = &ad[..ad.len() - 2];
        let broadcast_b = bd.len() == 2 && ad.len() > 2;
        if !broadcast_b && lead != &bd[..bd.len() - 2] {
            return Err(Error::op(
                op,
                format!(
                    "input0 {ad:?} and input1 {bd:?}: leading dims must be equal or input1 2-D"
                ),
            ));
        }
        let mut out_dims = lead.to_vec();
        out_dims.extend([m, n]);
        Ok(Batched {
            batch: lead.iter().product(),
            shape: MatMulShape { m, k: ka, n },
            broadcast_b,
            out_dims,
        })
    }
}

impl Operator for MatMul {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input0") == Some(DataType::F32) && d.dtype("input1") == Some(DataType::F32)
    }

    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let b = self.shapes(d)?;
        d.require_mut(self.name(), "output")?
            .resize(DataType::F32, &b.out_dims)
    }

    fn run(&self, d: &mut DataDict, f: &FloatDict, _: &IntDict) -> Result<()> {
        let op = self.name();
        let Batched {
            batch,
            shape: s,
            broadcast_b,
            ..
        } = self.shapes(d)?;
        let alpha = f.get_or("alpha", 1.0);
        let ([a, b], out) = d.io(op, ["input0", "input1"], "output")?;
        let (Some(a), Some(b)) = (a, b) else {
            return Err(Error::op(op, "missing input 'input0' or 'input1'"));
        };
        let av = f32_values(op, "input0", a)?;
        let bv = f32_values(op, "input1", b)?;
        let o = out
            .as_f32_mut()
            .map_err(|e| Error::op(op, format!("output: {e}")))?;
        let (sa, sb, so) = (s.m * s.k, s.k * s.n, s.m * s.n);
        if so == 0 {
            return Ok(());
        }
        let o = o
            .get_mut(..batch * so)
            .ok_or_else(|| Error::op(op, format!("output too small for {batch} batches")))?;
        let threads = &self.ctx.threads;
        // one batch entry; nested inside a parallel batch loop, the kernels' own thread split
        // runs inline
        let one = |i: usize, oi: &mut [f32]| -> Result<()> {
            let short = |what: &str| Error::op(op, format!("{what} too small for batch {i}"));
            let bo = if broadcast_b { 0 } else { i * sb };
            let ai = av
                .get(i * sa..(i + 1) * sa)
                .ok_or_else(|| short("input0"))?;
            let bi = bv.get(bo..bo + sb).ok_or_else(|| short("input1"))?;
            let r = match (self.trans_b, self.ctx.reference()) {
                (false, true) => mm::matmul_ref(s, ai, bi, alpha, oi),
                (false, false) => mm::matmul(threads, s, ai, bi, alpha, oi),
                (true, true) => mm::matmul_trans_b_ref(s, ai, bi, alpha, oi),
                (true, false) => mm::matmul_trans_b(threads, s, ai, bi, alpha, oi),
            };
            r.map_err(|e| Error::op(op, format!("batch {i}: {e}")))
        };
        if batch == 1 || self.ctx.reference() {
            for (i, oi) in o.chunks_exact_mut(so).enumerate() {
                one(i, oi)?;
            }
            return Ok(());
        }
        // many (typically small: attention heads) products: split the batch over the threads
        let min_batches = (1usize << 16).div_ceil((so * s.k).max(1)).max(1);
        let first_err = std::sync::Mutex::new(None);
        threads.for_row_chunks(o, so, min_batches, |i0, chunk| {
            for (t, oi) in chunk.chunks_exact_mut(so).enumerate() {
                if let Err(e) = one(i0 + t, oi) {
                    if let Ok(mut g) = first_err.lock() {
                        g.get_or_insert(e);
                    }
                    return;
                }
            }
        });
        match first_err.into_inner() {
            Ok(Some(e)) => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::data::{Data, DataType};
    use crate::device::{DataDict, FloatDict, IntDict};
    use crate::harness::{nmse, CaseRng};
    use crate::Executor;

    fn linear(e: &Executor, x: &Data, w: &Data, quant_act: i32) -> Vec<f32> {
        let mut out = Data::empty(DataType::F32);
        let mut d = DataDict::new()
            .with("input", x)
            .with("weight", w)
            .with_mut("output", &mut out);
        e.run(
            "Linear",
            &mut d,
            &FloatDict::new(),
            &IntDict::new().with("quant_act", quant_act),
        )
        .unwrap();
        out.to_f32_vec().unwrap()
    }

    /// The fast precision (Q8_0 activations, integer dots) stays within NMSE 5e-4 of the exact
    /// result (the same weight blocks with f32 activations), on the fast and the reference device.
    #[test]
    fn quant_act_is_close_to_exact() {
        let fast = Executor::cpu(2).unwrap();
        let mut reference = Executor::new();
        reference.add_device(std::sync::Arc::new(
            super::super::CpuDevice::with_mode(1, super::super::KernelMode::Reference).unwrap(),
        ));
        let mut rng = CaseRng::new(11);
        for wt in [DataType::Q8_0, DataType::Q4_0, DataType::Q4_1] {
            for (rows, k, n) in [(1usize, 576usize, 129usize), (64, 160, 67), (3, 1536, 33)] {
                // activations with a few outliers, as in real models
                let mut xv = rng.vec(rows * k, -1.0, 1.0);
                for i in (0..xv.len()).step_by(97) {
                    xv[i] *= 8.0;
                }
                let x = Data::from_f32(&[rows, k], &xv).unwrap();
                let w = rng.data(wt, &[n, k]);
                for e in [&fast, &reference] {
                    let exact = linear(e, &x, &w, 0);
                    let approx = linear(e, &x, &w, 1);
                    let (err, bad) = nmse(&approx, &exact);
                    assert!(!bad && err <= 5e-4, "{wt} {rows}x{k}x{n}: nmse {err:.2e}");
                    assert!(err > 0.0, "{wt}: quant_act had no effect");
                }
            }
        }
    }

    /// `accumulate = 1` adds the product to what the output holds (any row count); an output of
    /// the wrong shape is an error; two weights of one input give each weight's own product.
    #[test]
    fn accumulate_adds_the_product_and_checks_the_output() {
        let e = Executor::cpu(2).unwrap();
        let mut rng = CaseRng::new(5);
        for (rows, k, n) in [(1usize, 64usize, 33usize), (20, 96, 17)] {
            let x = rng.data(DataType::F32, &[rows, k]);
            let w = rng.data(DataType::Q4_0, &[n, k]);
            let b = rng.data(DataType::F32, &[n]);
            let y0 = rng.data(DataType::F32, &[rows, n]);
            let mut plain = Data::empty(DataType::F32);
            let mut d = DataDict::new()
                .with("input", &x)
                .with("weight", &w)
                .with("bias", &b)
                .with_mut("output", &mut plain);
            e.run("Linear", &mut d, &FloatDict::new(), &IntDict::new())
                .unwrap();
            let want: Vec<f32> = plain
                .to_f32_vec()
                .unwrap()
                .iter()
                .zip(y0.to_f32_vec().unwrap())
                .map(|(p, y)| p + y)
                .collect();
            let mut y = Data::from_f32(&[rows, n], &y0.to_f32_vec().unwrap()).unwrap();
            let acc = IntDict::new().with("accumulate", 1);
            let mut d = DataDict::new()
                .with("input", &x)
                .with("weight", &w)
                .with("bias", &b)
                .with_mut("output", &mut y);
            e.run("Linear", &mut d, &FloatDict::new(), &acc).unwrap();
            assert_eq!(y.to_f32_vec().unwrap(), want, "{rows}x{k}x{n}");
            // an output that does not hold [rows, n] is an error naming it
            let mut bad = Data::zeros(DataType::F32, &[rows, n + 1]).unwrap();
            let mut d = DataDict::new()
                .with("input", &x)
                .with("weight", &w)
                .with_mut("output", &mut bad);
            let msg = e
                .run("Linear", &mut d, &FloatDict::new(), &acc)
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains("accumulate") && msg.contains("output"),
                "{msg}"
            );
        }
        // two weights of one input: each output is the weight's own product
        let x = rng.data(DataType::F32, &[1, 64]);
        let (w0, w1) = (
            rng.data(DataType::F32, &[8, 64]),
            rng.data(DataType::F32, &[5, 64]),
        );
        let mut o0 = Data::empty(DataType::F32);
        let mut o1 = Data::empty(DataType::F32);
        let mut d = DataDict::new()
            .with("input", &x)
            .with("weight", &w0)
            .with("weight1", &w1)
            .with_mut("output", &mut o0)
            .with_mut("output1", &mut o1);
        e.run("Linear", &mut d, &FloatDict::new(), &IntDict::new())
            .unwrap();
        for (w, o) in [(&w0, &o0), (&w1, &o1)] {
            let mut alone = Data::empty(DataType::F32);
            let mut d = DataDict::new()
                .with("input", &x)
                .with("weight", w)
                .with_mut("output", &mut alone);
            e.run("Linear", &mut d, &FloatDict::new(), &IntDict::new())
                .unwrap();
            assert_eq!(o.to_f32_vec().unwrap(), alone.to_f32_vec().unwrap());
        }
    }

    #[test]
    fn shape_errors_name_op_argument_and_shapes() {
        let e = Executor::cpu(1).unwrap();
        let x = Data::zeros(DataType::F32, &[2, 64]).unwrap();
        let w = Data::zeros(DataType::Q4_0, &[3, 96]).unwrap();
        let mut out = Data::empty(DataType::F32);
        let mut d = DataDict::new()
            .with("input", &x)
            .with("weight", &w)
            .with_mut("output", &mut out);
        let msg = e
            .run("Linear", &mut d, &FloatDict::new(), &IntDict::new())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("Linear") && msg.contains("[2, 64]") && msg.contains("[3, 96]"),
            "{msg}"
        );

        let w = Data::zeros(DataType::F32, &[3, 64]).unwrap();
        let b = Data::zeros(DataType::F32, &[4]).unwrap();
        let mut d = DataDict::new()
            .with("input", &x)
            .with("weight", &w)
            .with("bias", &b)
            .with_mut("output", &mut out);
        let msg = e
            .run("Linear", &mut d, &FloatDict::new(), &IntDict::new())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("bias") && msg.contains("[4]"), "{msg}");

        let a = Data::zeros(DataType::F32, &[2, 3, 5]).unwrap();
        let bm = Data::zeros(DataType::F32, &[3, 5, 4]).unwrap();
        let mut d = DataDict::new()
            .with("input0", &a)
            .with("input1", &bm)
            .with_mut("output", &mut out);
        let msg = e
            .run("MatMul", &mut d, &FloatDict::new(), &IntDict::new())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("MatMul") && msg.contains("[2, 3, 5]") && msg.contains("[3, 5, 4]"),
            "{msg}"
        );
        let mut d = DataDict::new()
            .with("input0", &a)
            .with("input1", &bm)
            .with_mut("output", &mut out);
        let msg = e
            .run("MatMulTransB", &mut d, &FloatDict::new(), &IntDict::new())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("MatMulTransB") && msg.contains("differ in k"),
            "{msg}"
        );
    }

    #[test]
    fn linear_matches_hand_computed_values() {
        let e = Executor::cpu(2).unwrap();
        let x = Data::from_f32(&[2, 3], &[1.0, 2.0, 3.0, -1.0, 0.5, 0.0]).unwrap();
        let w = Data::from_f32(&[2, 3], &[1.0, 0.0, -1.0, 2.0, 2.0, 2.0]).unwrap();
        let b = Data::from_f32(&[2], &[0.5, -0.5]).unwrap();
        let mut out = Data::empty(DataType::F32);
        let mut d = DataDict::new()
            .with("input", &x)
            .with("weight", &w)
            .with("bias", &b)
            .with_mut("output", &mut out);
        e.run("Linear", &mut d, &FloatDict::new(), &IntDict::new())
            .unwrap();
        assert_eq!(out.dims(), &[2, 2]);
        assert_eq!(out.to_f32_vec().unwrap(), vec![-1.5, 11.5, -0.5, -1.5]);
    }
}
