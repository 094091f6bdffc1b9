//! The op test harness (llama.cpp `test-backend-ops` style): one table of cases (op × dtype ×
//! shape), each run on a device under test and on a reference device with identical random
//! inputs, compared by normalized mean squared error with a per-case threshold; NaN/Inf
//! mismatches fail; an output of the device under test is handed over in a buffer that runs
//! past its end into a guard region that must stay untouched. The same case list serves as a
//! performance suite ([`time_case`]).
//!
//! Case lists live in one file per op family (`cases_*.rs`), gathered by [`all_cases`]. The
//! module is built for the crate's own tests and, through the `harness` feature, for the
//! integration tests and benches; the library built by default does not contain it.

use crate::data::{bytes_for, Data, DataType};
use crate::device::{DataDict, FloatDict, IntDict};
use crate::error::{Error, Result};
use crate::executor::Executor;
use std::time::{Duration, Instant};

mod cases_activation;
mod cases_attention;
mod cases_elementwise;
mod cases_embedding;
mod cases_linear;
mod cases_moe;
mod cases_norm;
mod cases_paged;
mod cases_rope;
mod cases_sample;
mod cases_select;
mod cases_shape;

/// Byte value of guard regions.
pub const GUARD_FILL: u8 = 0xA5;
/// Guard size in bytes after an output.
pub const GUARD_BYTES: usize = 256;

/// A host output slot of `dtype` × `dims` whose allocation runs [`GUARD_BYTES`] past the
/// tensor's bytes, every byte set to [`GUARD_FILL`]. An op that sizes its output in place
/// ([`Data::resize`] keeps an allocation that is large enough) writes into the front of it;
/// [`guard_intact`] then tells whether it wrote past the end.
pub fn guarded_output(dtype: DataType, dims: &[usize]) -> Result<Data> {
    let need = bytes_for(dtype, dims)?;
    let mut d = Data::zeros(DataType::I32, &[(need + GUARD_BYTES).div_ceil(4)])?;
    d.raw_bytes_mut()?.fill(GUARD_FILL);
    d.resize(dtype, dims)?;
    Ok(d)
}

/// For an output made by [`guarded_output`] that still holds that allocation (its bytes start
/// at `start`): true when every byte past the tensor still equals [`GUARD_FILL`]. An output the
/// op replaced (another allocation, or device memory) has no guard to check and passes.
pub fn guard_intact(d: &Data, start: *const u8) -> Result<bool> {
    let raw = match d.raw_bytes() {
        Ok(raw) if raw.as_ptr() == start => raw,
        _ => return Ok(true),
    };
    let n = bytes_for(d.dtype(), d.capacity())?;
    Ok(raw
        .get(n..)
        .is_some_and(|g| g.iter().all(|&b| b == GUARD_FILL)))
}

/// How an argument of a case is passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// Read-only input.
    In,
    /// Mutated in place; compared after the run.
    InOut,
    /// Written by the op (allocated by `reshape`); compared after the run.
    Out,
}

/// One argument of a case.
pub struct CaseArg {
    /// Argument name (`input`, `weight`, `output`, ...).
    pub name: &'static str,
    /// How it is passed.
    pub kind: ArgKind,
    /// Initial value (ignored for `Out`, except its dtype).
    pub data: Data,
}

/// One harness case.
pub struct OpCase {
    /// Op name.
    pub op: &'static str,
    /// Short description: dtypes and shapes.
    pub label: String,
    /// Arguments.
    pub args: Vec<CaseArg>,
    /// Float parameters.
    pub floats: Vec<(&'static str, f32)>,
    /// Int parameters.
    pub ints: Vec<(&'static str, i32)>,
    /// Maximum normalized MSE between the two devices' results.
    pub max_nmse: f64,
}

impl OpCase {
    /// A case with no arguments yet.
    pub fn new(op: &'static str, label: impl Into<String>, max_nmse: f64) -> OpCase {
        OpCase {
            op,
            label: label.into(),
            args: Vec::new(),
            floats: Vec::new(),
            ints: Vec::new(),
            max_nmse,
        }
    }
    /// Adds a read-only input.
    pub fn input(mut self, name: &'static str, data: Data) -> Self {
        self.args.push(CaseArg {
            name,
            kind: ArgKind::In,
            data,
        });
        self
    }
    /// Adds an in-place argument.
    pub fn inout(mut self, name: &'static str, data: Data) -> Self {
        self.args.push(CaseArg {
            name,
            kind: ArgKind::InOut,
            data,
        });
        self
    }
    /// Adds an output of `dtype`.
    pub fn output(mut self, name: &'static str, dtype: DataType) -> Self {
        self.args.push(CaseArg {
            name,
            kind: ArgKind::Out,
            data: Data::empty(dtype),
        });
        self
    }
    /// Adds a float parameter.
    pub fn float(mut self, name: &'static str, v: f32) -> Self {
        self.floats.push((name, v));
        self
    }
    /// Adds an int parameter.
    pub fn int(mut self, name: &'static str, v: i32) -> Self {
        self.ints.push((name, v));
        self
    }
    /// Full name for reports: `op label`.
    pub fn name(&self) -> String {
        format!("{} {}", self.op, self.label)
    }
}

/// An I32 tensor of `dims` holding `v` (a case built with mismatched sizes panics: a bug in
/// the case list).
pub fn i32_data(dims: &[usize], v: &[i32]) -> Data {
    Data::from_i32(dims, v).expect("harness: i32 values fill their dims")
}

/// An F32 tensor of `dims` holding `v` (a case built with mismatched sizes panics: a bug in
/// the case list).
pub fn f32_data(dims: &[usize], v: &[f32]) -> Data {
    Data::from_f32(dims, v).expect("harness: f32 values fill their dims")
}

/// A small deterministic RNG (xorshift64*) so cases are reproducible without extra crates.
pub struct CaseRng(u64);

impl CaseRng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        CaseRng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    /// Next u64.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// `n` values uniform in [lo, hi), never exactly zero.
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let v = self.uniform(lo, hi);
                if v == 0.0 {
                    1e-3
                } else {
                    v
                }
            })
            .collect()
    }
    /// A random tensor of `dtype` (floats in [-1, 1) quantized/converted as needed).
    pub fn data(&mut self, dtype: DataType, dims: &[usize]) -> Data {
        self.data_range(dtype, dims, -1.0, 1.0)
    }
    /// A random tensor of `dtype` with values in [lo, hi).
    pub fn data_range(&mut self, dtype: DataType, dims: &[usize], lo: f32, hi: f32) -> Data {
        let n: usize = dims.iter().product();
        let v = self.vec(n, lo, hi);
        let bytes = crate::data::encode_from_f32(dtype, &v).expect("harness: encodable dims");
        Data::from_bytes(dtype, dims, &bytes).expect("harness: valid dims")
    }
}

/// The outcome of one case.
#[derive(Debug)]
pub struct CaseReport {
    /// Case name.
    pub name: String,
    /// Worst NMSE over the compared arguments.
    pub nmse: f64,
    /// Threshold.
    pub max_nmse: f64,
    /// Failure description, if any.
    pub failure: Option<String>,
}

fn clone_data(d: &Data) -> Result<Data> {
    if !d.is_allocated() {
        return Ok(Data::empty(d.dtype()));
    }
    let mut c = d.to_owned_host()?;
    // keep expansion capacity so in-place appends behave the same on both sides
    if d.capacity() != d.dims() {
        if let Some(axis) = (0..d.dims().len()).find(|&i| d.dims()[i] != d.capacity()[i]) {
            c.reserve(axis, d.capacity()[axis])?;
        }
    }
    Ok(c)
}

fn run_on(exec: &Executor, case: &OpCase, args: &mut [Data]) -> Result<()> {
    let mut dict = DataDict::new();
    for (a, d) in case.args.iter().zip(args.iter_mut()) {
        match a.kind {
            ArgKind::In => dict.insert(a.name, d),
            ArgKind::InOut | ArgKind::Out => dict.insert_mut(a.name, d),
        }
    }
    let mut fl = FloatDict::new();
    for (n, v) in &case.floats {
        fl.insert(n, *v);
    }
    let mut il = IntDict::new();
    for (n, v) in &case.ints {
        il.insert(n, *v);
    }
    exec.run(case.op, &mut dict, &fl, &il)
}

/// Normalized MSE `sum((a-b)^2) / sum(b^2)`, and whether NaN/Inf positions differ.
pub fn nmse(a: &[f32], b: &[f32]) -> (f64, bool) {
    let mut num = 0f64;
    let mut den = 0f64;
    let mut bad = false;
    for (&x, &y) in a.iter().zip(b) {
        if x.is_finite() != y.is_finite() {
            bad = true;
            continue;
        }
        if !x.is_finite() {
            if x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan()) {
                bad = true;
            }
            continue;
        }
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    (if den > 0.0 { num / den } else { num }, bad)
}

/// The arguments for the device under test: inputs cloned from the case, outputs in
/// [`guarded_output`]s sized like the reference's results; with where each one's bytes start
/// (null when it has none).
fn guarded_args(case: &OpCase, ref_args: &[Data]) -> Result<(Vec<Data>, Vec<*const u8>)> {
    let mut args = Vec::with_capacity(case.args.len());
    for (a, r) in case.args.iter().zip(ref_args) {
        args.push(match a.kind {
            ArgKind::Out => guarded_output(r.dtype(), r.dims())?,
            _ => clone_data(&a.data)?,
        });
    }
    let starts = args
        .iter()
        .map(|d| d.raw_bytes().map_or(std::ptr::null(), |b| b.as_ptr()))
        .collect();
    Ok((args, starts))
}

/// Runs `case` on `test` and on `reference` and compares every written argument.
pub fn check_case(case: &OpCase, test: &Executor, reference: &Executor) -> Result<CaseReport> {
    let mut ref_args: Vec<Data> = case
        .args
        .iter()
        .map(|a| clone_data(&a.data))
        .collect::<Result<_>>()?;
    run_on(reference, case, &mut ref_args)
        .map_err(|e| Error::op(case.op, format!("{}: reference failed: {e}", case.label)))?;
    let (mut test_args, starts) = guarded_args(case, &ref_args)?;
    let mut report = CaseReport {
        name: case.name(),
        nmse: 0.0,
        max_nmse: case.max_nmse,
        failure: None,
    };
    if let Err(e) = run_on(test, case, &mut test_args) {
        report.failure = Some(format!("device under test failed: {e}"));
        return Ok(report);
    }
    for (((a, r), t), &start) in case.args.iter().zip(&ref_args).zip(&test_args).zip(&starts) {
        if a.kind == ArgKind::In {
            continue;
        }
        if r.dims() != t.dims() {
            report.failure = Some(format!(
                "{}: dims {:?} vs reference {:?}",
                a.name,
                t.dims(),
                r.dims()
            ));
            return Ok(report);
        }
        if a.kind == ArgKind::Out && !guard_intact(t, start)? {
            report.failure = Some(format!(
                "{}: write past the end of the output (guard overwritten)",
                a.name
            ));
            return Ok(report);
        }
        let (e, bad) = nmse(&t.to_f32_vec()?, &r.to_f32_vec()?);
        if bad {
            report.failure = Some(format!("{}: NaN/Inf mismatch", a.name));
            return Ok(report);
        }
        report.nmse = report.nmse.max(e);
    }
    if report.nmse.is_nan() || report.nmse > case.max_nmse {
        report.failure = Some(format!("nmse {:.3e} > {:.1e}", report.nmse, case.max_nmse));
    }
    Ok(report)
}

/// Runs `case` on `exec` `reps` times (after one warm-up) and returns the median time.
pub fn time_case(case: &OpCase, exec: &Executor, reps: usize) -> Result<Duration> {
    let mut args: Vec<Data> = case
        .args
        .iter()
        .map(|a| clone_data(&a.data))
        .collect::<Result<_>>()?;
    run_on(exec, case, &mut args)?;
    let mut ts = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let mut a: Vec<Data> = args.iter().map(clone_data).collect::<Result<_>>()?;
        let t0 = Instant::now();
        run_on(exec, case, &mut a)?;
        ts.push(t0.elapsed());
    }
    ts.sort();
    Ok(ts[ts.len() / 2])
}

/// Every case of every op family.
pub fn all_cases() -> Vec<OpCase> {
    let mut v = Vec::new();
    cases_elementwise::cases(&mut v);
    cases_paged::cases(&mut v);
    cases_activation::cases(&mut v);
    cases_attention::cases(&mut v);
    cases_embedding::cases(&mut v);
    cases_norm::cases(&mut v);
    cases_rope::cases(&mut v);
    cases_select::cases(&mut v);
    cases_sample::cases(&mut v);
    cases_shape::cases(&mut v);
    cases_linear::cases(&mut v);
    cases_moe::cases(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guard catches a write one byte past the output, on every dtype's byte size.
    #[test]
    fn guard_detects_a_write_past_the_output() {
        for (dtype, dims) in [
            (DataType::F32, vec![5usize]),
            (DataType::F16, vec![3, 7]),
            (DataType::Q8_0, vec![2, 64]),
        ] {
            let mut d = guarded_output(dtype, &dims).unwrap();
            let start = d.raw_bytes().unwrap().as_ptr();
            let n = bytes_for(dtype, &dims).unwrap();
            d.bytes_mut().unwrap().fill(0);
            assert!(guard_intact(&d, start).unwrap(), "{dtype} {dims:?}");
            d.raw_bytes_mut().unwrap()[n] = 0;
            assert!(!guard_intact(&d, start).unwrap(), "{dtype} {dims:?}");
        }
    }

    /// The CPU operators size their outputs in place, so the harness really checks the guard
    /// after every output of theirs: each keeps the guarded allocation.
    #[test]
    fn cpu_outputs_stay_in_the_guarded_allocation() {
        let exec = Executor::cpu(1).unwrap();
        let (mut outputs, mut kept) = (0, 0);
        for case in all_cases() {
            let mut ref_args: Vec<Data> = case
                .args
                .iter()
                .map(|a| clone_data(&a.data).unwrap())
                .collect();
            run_on(&exec, &case, &mut ref_args).unwrap();
            let (mut args, starts) = guarded_args(&case, &ref_args).unwrap();
            run_on(&exec, &case, &mut args).unwrap();
            for ((a, d), &start) in case.args.iter().zip(&args).zip(&starts) {
                if a.kind == ArgKind::Out {
                    outputs += 1;
                    kept += usize::from(d.raw_bytes().unwrap().as_ptr() == start);
                }
            }
        }
        eprintln!("{kept} of {outputs} outputs kept their guarded allocation");
        assert!(
            outputs > 0 && kept * 10 >= outputs * 9,
            "{kept} of {outputs}"
        );
    }

    /// A same-sized `resize` (what an op's `reshape` does) keeps the guarded allocation.
    #[test]
    fn resize_keeps_the_guarded_allocation() {
        let mut d = guarded_output(DataType::F32, &[4, 9]).unwrap();
        let start = d.raw_bytes().unwrap().as_ptr();
        d.resize(DataType::F32, &[4, 9]).unwrap();
        assert_eq!(d.raw_bytes().unwrap().as_ptr(), start);
        d.raw_bytes_mut().unwrap()[4 * 9 * 4 + GUARD_BYTES - 1] = 0;
        assert!(!guard_intact(&d, start).unwrap());
    }
}
