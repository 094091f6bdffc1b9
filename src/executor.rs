//! The `Executor`: runs a named op on the first registered device whose `can_run` accepts it,
//! moving inputs that live elsewhere, calling `reshape` (shape inference) then `run`, and
//! recording per-op call counts and time (the profiler, fastllm's `PrintProfiler`).
//!
//! Devices are added at run time (`add_device`), so a new backend needs no change here; the
//! executor names no concrete device (`Executor::cpu` is defined by the CPU device's module).

use crate::data::{Data, DeviceKind};
use crate::device::{BaseDevice, DataDict, FloatDict, IntDict, Operator};
use crate::error::{Error, Result};
use crate::step::{Item, Step};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Per-op call counts and total time.
#[derive(Default)]
pub struct Profiler {
    enabled: AtomicBool,
    sync: AtomicBool,
    table: Mutex<HashMap<String, (u64, Duration)>>,
}

impl Profiler {
    /// Turns recording on or off.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }
    /// True when recording.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }
    /// While recording, waits for the device after every op ([`BaseDevice::synchronize`]), so
    /// an asynchronous device's (GPU's) time is charged to the op that queued the work instead
    /// of to the next op that waits. Slower; for finding which kernel is slow.
    pub fn set_sync(&self, on: bool) {
        self.sync.store(on, Ordering::Relaxed);
    }
    /// True when the profiler waits for the device after every op.
    pub fn syncs(&self) -> bool {
        self.sync.load(Ordering::Relaxed)
    }
    /// Adds one call of `op` taking `t`.
    pub fn record(&self, op: &str, t: Duration) {
        if let Ok(mut m) = self.table.lock() {
            let e = m.entry(op.to_string()).or_default();
            e.0 += 1;
            e.1 += t;
        }
    }
    /// Clears the table.
    pub fn reset(&self) {
        if let Ok(mut m) = self.table.lock() {
            m.clear();
        }
    }
    /// (op, calls, total) rows, slowest first.
    pub fn rows(&self) -> Vec<(String, u64, Duration)> {
        let mut rows: Vec<_> = match self.table.lock() {
            Ok(m) => m.iter().map(|(k, v)| (k.clone(), v.0, v.1)).collect(),
            Err(_) => Vec::new(),
        };
        rows.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        rows
    }
    /// The table as text: op, calls, total ms, µs per call, share of the total.
    pub fn report(&self) -> String {
        let rows = self.rows();
        let total: Duration = rows.iter().map(|r| r.2).sum();
        let mut s = format!(
            "{:<20} {:>9} {:>12} {:>10} {:>7}\n",
            "op", "calls", "total ms", "us/call", "share"
        );
        for (op, n, t) in &rows {
            s += &format!(
                "{:<20} {:>9} {:>12.3} {:>10.2} {:>6.1}%\n",
                op,
                n,
                t.as_secs_f64() * 1e3,
                t.as_secs_f64() * 1e6 / (*n).max(1) as f64,
                100.0 * t.as_secs_f64() / total.as_secs_f64().max(1e-12)
            );
        }
        s += &format!(
            "{:<20} {:>9} {:>12.3}\n",
            "total",
            "",
            total.as_secs_f64() * 1e3
        );
        s
    }
}

/// Runs named ops on registered devices.
#[derive(Default)]
pub struct Executor {
    devices: Vec<Arc<dyn BaseDevice>>,
    profiler: Profiler,
}

impl Executor {
    /// An executor with no devices.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a device; earlier devices are preferred.
    pub fn add_device(&mut self, device: Arc<dyn BaseDevice>) {
        self.devices.push(device);
    }

    /// The registered devices, in preference order.
    pub fn devices(&self) -> &[Arc<dyn BaseDevice>] {
        &self.devices
    }

    /// The profiler.
    pub fn profiler(&self) -> &Profiler {
        &self.profiler
    }

    /// Runs a [`Step`]: the first device's passes rewrite it ([`BaseDevice::plan_step`]), then
    /// its items run in order, each call through [`Executor::run`]. The items are consumed
    /// (the step keeps its tensors, so more items may be added and run after).
    pub fn run_step(&self, step: &mut Step) -> Result<()> {
        if let Some(d) = self.devices.first() {
            d.plan_step(step)?;
        }
        for item in step.take_items() {
            match item {
                Item::Call(c) => {
                    let mut floats = FloatDict::new();
                    for (n, v) in &c.floats {
                        floats.insert(n, *v);
                    }
                    let mut ints = IntDict::new();
                    for (n, v) in &c.ints {
                        ints.insert(n, *v);
                    }
                    let mut d = step.dict(c.op, &c.args)?;
                    self.run(c.op, &mut d, &floats, &ints)?;
                }
                Item::Reshape(t, dims) => step.apply_reshape(t, &dims)?,
                Item::Stage(mut s) => step.run_stage(&mut s)?,
            }
        }
        Ok(())
    }

    /// Runs `op` on the first device that accepts it.
    pub fn run(
        &self,
        op: &str,
        datas: &mut DataDict,
        floats: &FloatDict,
        ints: &IntDict,
    ) -> Result<()> {
        let t0 = if self.profiler.enabled() {
            Some(Instant::now())
        } else {
            None
        };
        let device = self
            .devices
            .iter()
            .find(|d| d.can_run(op, datas, floats, ints))
            .ok_or_else(|| self.why_not(op, datas))?;
        let kind = device.kind();
        let ops = device.ops();
        let o = ops
            .get(op)
            .ok_or_else(|| Error::UnknownOp(op.to_string()))?;
        let host = o.host_inputs();
        let misplaced = datas
            .iter()
            .any(|(n, d)| Self::misplaced(d, kind, host.contains(&n)));
        if misplaced {
            Self::run_moved(device.as_ref(), o.as_ref(), datas, floats, ints)?;
        } else {
            o.reshape(datas, floats, ints)?;
            o.run(datas, floats, ints)?;
        }
        if let Some(t0) = t0 {
            if self.profiler.syncs() {
                device.synchronize()?;
            }
            self.profiler.record(op, t0.elapsed());
        }
        Ok(())
    }

    /// Whether `d` must be moved or copied to a `kind` device before an op reads it: it lives
    /// elsewhere, unless it is in host memory and the op takes it there (`host_ok`, see
    /// [`crate::device::Operator::host_inputs`]).
    fn misplaced(d: &Data, kind: DeviceKind, host_ok: bool) -> bool {
        d.is_allocated() && d.device() != kind && !(host_ok && d.device() == DeviceKind::Cpu)
    }

    /// Slow path: some argument lives on another device. Mutable arguments are moved to the
    /// chosen device (and stay there); read-only inputs are copied for this call. Inputs the op takes in host
    /// memory stay there.
    fn run_moved(
        device: &dyn BaseDevice,
        o: &dyn Operator,
        datas: &mut DataDict,
        floats: &FloatDict,
        ints: &IntDict,
    ) -> Result<()> {
        let kind = device.kind();
        let host = o.host_inputs();
        for (_, d) in datas.iter_mut() {
            if d.is_allocated() && d.device() != kind {
                let name = std::mem::take(&mut d.name);
                *d = device.upload(d)?;
                d.name = name;
            }
        }
        let mut copies: Vec<(String, Data)> = Vec::new();
        for (n, d) in datas.iter() {
            if Self::misplaced(d, kind, host.contains(&n)) {
                copies.push((n.to_string(), device.upload(d)?));
            }
        }
        let mut moved = datas.reborrow_with(&copies);
        o.reshape(&mut moved, floats, ints)?;
        o.run(&mut moved, floats, ints)
    }

    fn why_not(&self, op: &str, datas: &DataDict) -> Error {
        if !self.devices.iter().any(|d| d.ops().contains_key(op)) {
            return Error::UnknownOp(op.to_string());
        }
        let args: Vec<String> = datas
            .iter()
            .map(|(n, d)| format!("{n}: {} {:?}", d.dtype(), d.dims()))
            .collect();
        Error::op(
            op,
            format!(
                "no registered device accepts these arguments ({})",
                args.join(", ")
            ),
        )
    }
}

/// True when `d` lives on the host.
pub fn on_host(d: &Data) -> bool {
    d.device() == DeviceKind::Cpu
}
