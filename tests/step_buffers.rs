//! Every tensor a one-token decode step writes keeps one size within the step, for every tiny
//! architecture of `../shared/fixtures/tiny/`. A GPU records the decode step as a CUDA graph only
//! where no buffer has to grow while the step is recorded; a buffer that holds tensors of two
//! sizes in one step is regrown every step, so its model would run op by op
//! (`tests/cuda_models.rs` checks the replay itself on a GPU). Here the CPU runs the steps,
//! through a device that passes every op to the CPU's and notes the size of each tensor it
//! writes.

mod common;

use common::smollm2::fixtures;
use fastllm::convert::{convert, ConvertOptions};
use fastllm::data::{Data, DataType, DeviceKind};
use fastllm::device::{BaseDevice, DataDict, FloatDict, IntDict, OpRegistry, Operator};
use fastllm::devices::cpu::CpuDevice;
use fastllm::error::Result;
use fastllm::executor::Executor;
use fastllm::format::flm::{FlmFile, LoadMode};
use fastllm::model::{Model, Precision};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One write: the tensor (its address, stable while a step runs), the op and argument, and
/// the tensor's dtype and dims after the op.
type Write = (usize, &'static str, String, DataType, Vec<usize>);

/// The writes of each step run so far (a step starts at `plan_step`).
#[derive(Default)]
struct Log {
    steps: Vec<Vec<Write>>,
}

/// An op of the CPU device that notes what it wrote.
struct NotedOp {
    cpu: Arc<CpuDevice>,
    name: &'static str,
    log: Arc<Mutex<Log>>,
}

impl NotedOp {
    fn inner(&self) -> &dyn Operator {
        self.cpu.ops()[self.name].as_ref()
    }
}

impl Operator for NotedOp {
    fn can_run(&self, d: &DataDict, f: &FloatDict, i: &IntDict) -> bool {
        self.inner().can_run(d, f, i)
    }
    fn reshape(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        self.inner().reshape(d, f, i)
    }
    fn run(&self, d: &mut DataDict, f: &FloatDict, i: &IntDict) -> Result<()> {
        self.inner().run(d, f, i)?;
        let mut log = self.log.lock().unwrap();
        if let Some(step) = log.steps.last_mut() {
            for (arg, t) in d.iter_mut() {
                let at = &*t as *const Data as usize;
                step.push((at, self.name, arg.to_string(), t.dtype(), t.dims().to_vec()));
            }
        }
        Ok(())
    }
    fn host_inputs(&self) -> &'static [&'static str] {
        self.inner().host_inputs()
    }
}

/// The CPU device with every op noted.
struct NotingCpu {
    cpu: Arc<CpuDevice>,
    ops: OpRegistry,
    log: Arc<Mutex<Log>>,
}

impl NotingCpu {
    fn new(log: Arc<Mutex<Log>>) -> NotingCpu {
        let cpu = Arc::new(CpuDevice::new(2).unwrap());
        let mut ops = OpRegistry::new();
        for &name in cpu.ops().keys() {
            let op = NotedOp {
                cpu: cpu.clone(),
                name,
                log: log.clone(),
            };
            ops.insert(name, Box::new(op));
        }
        NotingCpu { cpu, ops, log }
    }
}

impl BaseDevice for NotingCpu {
    fn name(&self) -> &str {
        self.cpu.name()
    }
    fn kind(&self) -> DeviceKind {
        self.cpu.kind()
    }
    fn ops(&self) -> &OpRegistry {
        &self.ops
    }
    fn upload(&self, data: &Data) -> Result<Data> {
        self.cpu.upload(data)
    }
    fn weight_form(&self, data: &Data) -> Result<Option<Data>> {
        self.cpu.weight_form(data)
    }
    fn download(&self, data: &mut Data) -> Result<()> {
        self.cpu.download(data)
    }
    fn kv_dtypes(&self) -> &[DataType] {
        self.cpu.kv_dtypes()
    }
    fn synchronize(&self) -> Result<()> {
        self.cpu.synchronize()
    }
    fn write(&self, src: &Data, dst: &mut Data) -> Result<()> {
        self.cpu.write(src, dst)
    }
    fn plan_step(&self, step: &mut fastllm::step::Step) -> Result<()> {
        self.log.lock().unwrap().steps.push(Vec::new());
        self.cpu.plan_step(step)
    }
}

/// The tensors that one step wrote in more than one size: (op and argument of each size).
fn regrown(step: &[Write]) -> Vec<String> {
    let bytes = |d: DataType, s: &[usize]| fastllm::data::bytes_for(d, s).unwrap_or(0);
    let mut sizes: HashMap<usize, Vec<(String, DataType, Vec<usize>)>> = HashMap::new();
    for (at, op, arg, dt, dims) in step {
        let seen = sizes.entry(*at).or_default();
        if seen
            .iter()
            .all(|(_, d, s)| bytes(*d, s) != bytes(*dt, dims))
        {
            seen.push((format!("{op}.{arg}"), *dt, dims.clone()));
        }
    }
    let mut out: Vec<String> = sizes
        .into_values()
        .filter(|s| s.len() > 1)
        .map(|s| format!("{s:?}"))
        .collect();
    out.sort();
    out
}

/// The tiny fixture `arch` converted to a .flm file (once per test run).
fn converted(arch: &str) -> PathBuf {
    let dir = fixtures().join("tiny").join(arch);
    let tmp = std::env::temp_dir().join(format!("fastllm-step-buffers-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let out = tmp.join(format!("{arch}.flm"));
    convert(&dir, &out, &ConvertOptions::default(), &mut |_| {})
        .unwrap_or_else(|e| panic!("convert {arch}: {e}"));
    out
}

/// Decodes two tokens one at a time after a 4-token prompt of the model at `out` and returns,
/// per decode step, the tensors it regrew.
fn decode_regrowth(arch: &str, out: &Path, precision: Precision) -> Vec<Vec<String>> {
    let file = FlmFile::open(out, LoadMode::Mmap).unwrap();
    let config = file.config().clone();
    if config.mla.is_some() {
        // latent attention runs its per-head products on the host: never recorded
        eprintln!("{arch}: skipped, latent attention steps are not recorded");
        return Vec::new();
    }
    let log = Arc::new(Mutex::new(Log::default()));
    let mut exec = Executor::new();
    exec.add_device(Arc::new(NotingCpu::new(log.clone())));
    let model = Model::new(config, Arc::new(file), exec, precision, false)
        .unwrap_or_else(|e| panic!("load {arch}: {e}"));
    let mut cache = model.new_cache(8).unwrap();
    model.forward(&mut cache, &[1, 5, 9, 3], false).unwrap();
    let mut steps = Vec::new();
    for t in [7u32, 11] {
        let before = log.lock().unwrap().steps.len();
        model.forward(&mut cache, &[t], false).unwrap();
        let log = log.lock().unwrap();
        assert!(
            log.steps.len() > before,
            "{arch}: the decode step ran no step"
        );
        steps.push(
            log.steps[before..]
                .iter()
                .flat_map(|s| regrown(s))
                .collect(),
        );
    }
    steps
}

#[test]
fn decode_steps_write_each_tensor_in_one_size() {
    let mut archs: Vec<String> = std::fs::read_dir(fixtures().join("tiny"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    archs.sort();
    assert!(archs.len() >= 10, "tiny fixtures: {archs:?}");
    let mut bad = Vec::new();
    for arch in &archs {
        let out = converted(arch);
        for precision in [Precision::Exact, Precision::Fast] {
            for (i, regrown) in decode_regrowth(arch, &out, precision).iter().enumerate() {
                if !regrown.is_empty() {
                    bad.push(format!("{arch} {precision:?} step {i}: {regrown:?}"));
                }
            }
        }
    }
    eprintln!("{} tiny architectures: decode steps checked", archs.len());
    assert!(
        bad.is_empty(),
        "tensors written in two sizes within a step:\n{}",
        bad.join("\n")
    );
}
