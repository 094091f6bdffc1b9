use fastllm_cpu::linear::*;
use fastllm_cpu::threads::Threads;
use std::time::Instant;
fn main() {
    let t = Threads::new(1).unwrap();
    let (n, k) = (512usize, 1024usize);
    let v: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let x: Vec<f32> = (0..4 * k)
        .map(|i| ((i * 31 % 100) as f32 / 50.0) - 1.0)
        .collect();
    for wt in WeightType::ALL {
        let w: Vec<u8> = match wt {
            WeightType::F32 => v.iter().flat_map(|a| a.to_le_bytes()).collect(),
            WeightType::F16 | WeightType::BF16 => vec![0x3c; n * k * 2],
            WeightType::Q8_0 => {
                let mut b = vec![0u8; n * k / 32 * 34];
                fastllm_cpu::quant::quantize_q8_0(&v, &mut b);
                b
            }
            WeightType::Q4_0 => {
                let mut b = vec![0u8; n * k / 32 * 18];
                fastllm_cpu::quant::quantize_q4_0(&v, &mut b);
                b
            }
            WeightType::Q4_1 => {
                let mut b = vec![0u8; n * k / 32 * 20];
                fastllm_cpu::quant::quantize_q4_1(&v, &mut b);
                b
            }
        };
        for qa in [false, true] {
            if qa && !wt.is_block() {
                continue;
            }
            for rows in [1usize, 4] {
                let a = LinearArgs {
                    x: &x,
                    rows,
                    k,
                    w: &w,
                    wtype: wt,
                    n,
                    bias: None,
                    quant_act: qa,
                };
                let mut out = vec![0f32; rows * n];
                let mut best = f64::MAX;
                for _ in 0..200 {
                    let t0 = Instant::now();
                    linear(&t, &a, &mut out).unwrap();
                    best = best.min(t0.elapsed().as_secs_f64());
                }
                let blocks = (n * k / 32) as f64;
                println!("{:5} qa={} rows={} {:8.1}us  {:6.2} ns/block/row  {:6.1} GB/s(weights, 1 thread)", wt.name(), qa as u8, rows, best*1e6, best*1e9/blocks/rows as f64, w.len() as f64/best/1e9);
            }
        }
    }
}
