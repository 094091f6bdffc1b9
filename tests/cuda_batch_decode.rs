//! Batched decode over the paged KV pool on the CUDA device (`src/model/paged_graph.rs`):
//! - steps padded to a bucket and replayed from recorded graphs equal the same padded steps run
//!   eagerly, launch by launch, bit for bit (both with the device's fused forms;
//!   `tests/cuda_step.rs` compares them with the unfused steps), for B = 1, 3, 8 and 64 on random
//!   two-layer models of several shapes, with sequences of different lengths, a sequence leaving
//!   and a new one joining through a prefill chunk mixed into a decode step, a batch shrinking
//!   into a smaller bucket, and rows long enough for split-K attention;
//! - the padded steps agree with the unpadded op-by-op path (`PagedAttention`) to rounding;
//! - with `batch_invariant`, rows decoding alone give the same logits bits as in a batch of 64;
//! - `PagedAttention` over prompt chunks against the scalar CPU reference;
//! - `PagedDecodeAttention` alone against `PagedCacheWrite` + `PagedAttention` on awkward sizes
//!   (head sizes 16 / 64 / 80 / 128 / 256, 1 to 12 query heads per kv head, empty and long rows,
//!   windows, soft-capping, ALiBi), f32, f16 and q8_0 caches (f16 through the tensor-core kernels
//!   and the online-softmax ones; q8_0 also against f32 `PagedAttention` over the dequantized pool);
//!   rotary tables that do not fit the call are an `Err`.
//!
//! Without a GPU every test passes without work and the binary says once, on stderr past the
//! test harness's capture, "SKIPPED: no CUDA device (...)" (CI has none).

#![cfg(feature = "cuda")]

mod common;

use common::cuda::{gpu, max_abs_diff};
use fastllm::data::{Data, DataType};
use fastllm::devices::cuda::CudaDevice;
use fastllm::harness::{nmse, CaseRng};
use fastllm::model::SyntheticSource;
use fastllm::model::{
    synthetic, BatchDecode, KvDtype, Model, PagedKvPool, PagedSeqState, Precision,
};
use fastllm::{BaseDevice, DataDict, Executor, FloatDict, IntDict};
use std::sync::Arc;

fn model(shape: &str, dtype: &str, precision: Precision, mode: BatchDecode) -> Model {
    model_kv(shape, dtype, precision, mode, None)
}

/// [`model`] with the KV dtype `kv` (`None`: the default of `precision`).
fn model_kv(
    shape: &str,
    dtype: &str,
    precision: Precision,
    mode: BatchDecode,
    kv: Option<KvDtype>,
) -> Model {
    let mut cfg = synthetic::config(shape).unwrap();
    cfg.num_layers = 2;
    let dt = synthetic::weight_dtype(dtype).unwrap();
    let src = Arc::new(SyntheticSource::new(&cfg, dt).unwrap());
    let exec = fastllm::load::executor_for("cuda", 0, &Default::default()).unwrap();
    let mut m = Model::new(cfg, src, exec, precision, false).unwrap();
    m.set_kv_dtype(kv).unwrap();
    m.set_batch_decode(mode).unwrap();
    m
}

/// Token of row `r` at step `i` (fixed, so runs that differ by rounding see the same inputs).
fn tok(model: &Model, i: usize, r: usize) -> u32 {
    ((i * 7919 + r * 104_729 + 13) % model.config().vocab_size) as u32
}

/// The logits of every row of every step of the scenario in the module doc, for `b` sequences
/// (`long`: prompts of a few hundred tokens).
fn scenario(model: &Model, b: usize, long: bool) -> Vec<Vec<Vec<f32>>> {
    let bs = 16;
    let mut pool = PagedKvPool::new(
        model,
        4 * b * (40 + if long { 700 } else { 0 }) / bs + 8,
        bs,
    )
    .unwrap();
    let mut st: Vec<PagedSeqState> = (0..b).map(|_| PagedSeqState::new()).collect();
    let plen = |r: usize| if long { 300 + 37 * r } else { 1 + (7 * r) % 29 };
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|r| (0..plen(r)).map(|i| tok(model, i + 100, r)).collect())
        .collect();
    let mut items: Vec<(&mut PagedSeqState, &[u32])> = st
        .iter_mut()
        .zip(&prompts)
        .map(|(s, p)| (s, p.as_slice()))
        .collect();
    let mut out = vec![model.forward_paged(&mut pool, &mut items).unwrap()];
    let mut live: Vec<usize> = (0..b).collect();
    for step in 0..14 {
        if step == 6 {
            // sequence 0 leaves; a new one joins with a 5-token chunk in this decode step
            pool.release(&mut st[0]);
        }
        if step == 10 && live.len() > 1 {
            pool.release(&mut st[1]);
            live.retain(|&r| r != 1);
        }
        let new_prompt: Vec<u32> = (0..5).map(|i| tok(model, i + 500, 0)).collect();
        let toks: Vec<[u32; 1]> = live.iter().map(|&r| [tok(model, step, r)]).collect();
        let mut items: Vec<(&mut PagedSeqState, &[u32])> = Vec::new();
        for (s, (r, st)) in st
            .iter_mut()
            .enumerate()
            .filter(|(r, _)| live.contains(r))
            .enumerate()
        {
            let t: &[u32] = if step == 6 && r == 0 {
                &new_prompt
            } else {
                &toks[s]
            };
            items.push((st, t));
        }
        out.push(model.forward_paged(&mut pool, &mut items).unwrap());
    }
    for s in st.iter_mut() {
        pool.release(s);
    }
    assert_eq!(pool.free_blocks(), pool.total_blocks(), "every block back");
    out
}

#[test]
fn graph_replayed_batched_decode_equals_op_by_op() {
    let Some(_dev) = gpu() else { return };
    for (shape, dtype, kv) in [
        ("tiny", "f16", None),
        ("llama-3.2-1b", "int4", None),
        ("llama-3.2-1b", "int4", Some(KvDtype::Q8_0)),
        ("qwen2-0.5b", "int8", None),
    ] {
        let eager = model_kv(shape, dtype, Precision::Fast, BatchDecode::Eager, kv);
        let graphs = model_kv(shape, dtype, Precision::Fast, BatchDecode::Graphs, kv);
        let kv = eager.kv_dtype();
        for (b, long) in [
            (1, false),
            (3, false),
            (8, false),
            (64, false),
            (1, true),
            (3, true),
        ] {
            let a = scenario(&eager, b, long);
            let g = scenario(&graphs, b, long);
            let bits = |v: &Vec<Vec<Vec<f32>>>| -> Vec<u32> {
                v.iter().flatten().flatten().map(|x| x.to_bits()).collect()
            };
            assert!(
                bits(&a) == bits(&g),
                "{shape} {dtype} kv {kv} B={b} long={long}: graph-replayed logits differ from op by op"
            );
            println!(
                "{shape} {dtype} kv {kv} B={b} long={long}: graph replay bit-equal to op by op"
            );
        }
    }
}

#[test]
fn padded_batched_decode_matches_the_plain_paged_path() {
    let Some(_dev) = gpu() else { return };
    for (shape, dtype, kv) in [
        ("tiny", "f16", None),
        ("llama-3.2-1b", "f16", None),
        ("llama-3.2-1b", "f16", Some(KvDtype::Q8_0)),
        ("qwen2-0.5b", "int8", None),
    ] {
        let off = model_kv(shape, dtype, Precision::Exact, BatchDecode::Off, kv);
        let padded = model_kv(shape, dtype, Precision::Exact, BatchDecode::Graphs, kv);
        let kv = off.kv_dtype();
        for (b, long) in [(3, false), (64, false), (3, true)] {
            let a = scenario(&off, b, long);
            let p = scenario(&padded, b, long);
            let (mut worst, mut scale) = (0f32, 0f32);
            for (sa, sp) in a.iter().zip(&p) {
                assert_eq!(sa.len(), sp.len());
                for (ra, rp) in sa.iter().zip(sp) {
                    worst = worst.max(max_abs_diff(ra, rp));
                    scale = scale.max(ra.iter().fold(0f32, |m, x| m.max(x.abs())));
                }
            }
            println!("{shape} {dtype} kv {kv} B={b} long={long}: max |padded - plain| {worst:.2e} (max |logit| {scale:.2})");
            // the paths' keys differ by f32 rounding, which can move a q8_0 value a whole step
            let rel = if kv == KvDtype::Q8_0 { 1e-2 } else { 1e-4 };
            assert!(
                worst <= rel * scale.max(1.0),
                "{shape} {dtype} kv {kv} B={b}: {worst}"
            );
        }
    }
}

#[test]
fn warm_up_records_every_bucket_and_returns_the_blocks() {
    let Some(_dev) = gpu() else { return };
    let m = model("tiny", "f16", Precision::Fast, BatchDecode::Graphs);
    let mut pool = PagedKvPool::new(&m, 64, 16).unwrap();
    pool.set_prefix_caching(true);
    assert_eq!(
        fastllm::model::warm_batch_decode(&m, &mut pool, 8).unwrap(),
        4
    );
    assert_eq!(pool.free_blocks(), 64);
    assert_eq!(pool.cached_blocks(), 0);
    assert!(pool.prefix_caching());
    // more buckets than free blocks: only those that fit
    let mut small = PagedKvPool::new(&m, 5, 16).unwrap();
    assert_eq!(
        fastllm::model::warm_batch_decode(&m, &mut small, 128).unwrap(),
        3
    );
    assert_eq!(small.free_blocks(), 5);
    // the warmed pool decodes as a fresh one
    let mut fresh = PagedKvPool::new(&m, 64, 16).unwrap();
    let run = |pool: &mut PagedKvPool| {
        let mut st: Vec<PagedSeqState> = (0..3).map(|_| PagedSeqState::new()).collect();
        let mut out = Vec::new();
        for step in 0..4 {
            let toks: Vec<[u32; 1]> = (0..3).map(|r| [tok(&m, step, r)]).collect();
            let mut items: Vec<(&mut PagedSeqState, &[u32])> = st
                .iter_mut()
                .zip(&toks)
                .map(|(s, t)| (s, t.as_slice()))
                .collect();
            out.push(m.forward_paged(pool, &mut items).unwrap());
        }
        out
    };
    assert!(run(&mut pool) == run(&mut fresh));
}

/// Random f32 values in ±1.
fn rand_f32(rng: &mut CaseRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
}

/// One attention case: sizes, scoring options and each row's key count (0: a padding row).
struct AttnCase {
    hd: usize,
    nh: usize,
    nkv: usize,
    window: i32,
    softcap: f32,
    alibi: bool,
    lens: &'static [usize],
}

/// Host inputs of a case: pool contents, step rows, block tables and slots.
struct AttnInputs {
    k_pool: Vec<f32>,
    v_pool: Vec<f32>,
    q: Data,
    k: Data,
    v: Data,
    slopes: Data,
    table: Vec<i32>,
    maxb: usize,
    slots: Vec<i32>,
    n_slots: usize,
}

const BS: usize = 16;

fn attn_inputs(c: &AttnCase, rng: &mut CaseRng) -> AttnInputs {
    let rows = c.lens.len();
    let maxb = c
        .lens
        .iter()
        .map(|l| l.div_ceil(BS))
        .max()
        .unwrap_or(1)
        .max(1);
    let n_blocks = rows * maxb + 3;
    let mut ids: Vec<i32> = (0..n_blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        let j = (rng.uniform(0.0, 1.0) * (i + 1) as f32) as usize % (i + 1);
        ids.swap(i, j);
    }
    let mut table = vec![0i32; rows * maxb];
    for r in 0..rows {
        for b in 0..c.lens[r].div_ceil(BS) {
            table[r * maxb + b] = ids[r * maxb + b];
        }
    }
    let slot = |r: usize, j: usize| table[r * maxb + j / BS] * BS as i32 + (j % BS) as i32;
    let slots = (0..rows)
        .map(|r| match c.lens[r] {
            0 => -1,
            l => slot(r, l - 1),
        })
        .collect();
    let (nh, nkv, hd) = (c.nh, c.nkv, c.hd);
    let n_slots = n_blocks * BS;
    let slopes: Vec<f32> = (0..nh).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
    AttnInputs {
        k_pool: rand_f32(rng, n_slots * nkv * hd),
        v_pool: rand_f32(rng, n_slots * nkv * hd),
        q: Data::from_f32(&[rows, nh, hd], &rand_f32(rng, rows * nh * hd)).unwrap(),
        k: Data::from_f32(&[rows, nkv, hd], &rand_f32(rng, rows * nkv * hd)).unwrap(),
        v: Data::from_f32(&[rows, nkv, hd], &rand_f32(rng, rows * nkv * hd)).unwrap(),
        slopes: Data::from_f32(&[nh], &slopes).unwrap(),
        table,
        maxb,
        slots,
        n_slots,
    }
}

/// Values stored per head row of `hd` in a pool of `dt` (q8_0: whole blocks of 32).
fn stored(dt: DataType, hd: usize) -> usize {
    if dt == DataType::Q8_0 {
        hd.div_ceil(32) * 32
    } else {
        hd
    }
}

/// A pool layer on the GPU holding `vals` (head rows of `c.hd`) in `dt` (f32, f16, or q8_0
/// with each head row padded with zeros to whole blocks).
fn pool_layer(dev: &CudaDevice, c: &AttnCase, n_slots: usize, vals: &[f32], dt: DataType) -> Data {
    let hds = stored(dt, c.hd);
    let mut padded = vec![0f32; vals.len() / c.hd * hds];
    for (d, s) in padded.chunks_exact_mut(hds).zip(vals.chunks_exact(c.hd)) {
        d[..c.hd].copy_from_slice(s);
    }
    let bytes = fastllm::data::encode_from_f32(dt, &padded).unwrap();
    let d = Data::from_bytes(dt, &[n_slots, c.nkv, hds], &bytes).unwrap();
    dev.upload(&d).unwrap()
}

/// The head rows of `c.hd` values of a pool layer read back as f32 (padding dropped).
fn unpadded(c: &AttnCase, dt: DataType, vals: &[f32]) -> Vec<f32> {
    vals.chunks_exact(stored(dt, c.hd))
        .flat_map(|r| r[..c.hd].to_vec())
        .collect()
}

/// Rows `live` of `x` (rows of `w` values), as [live, w / hd, hd].
fn rows_of(x: &Data, live: &[usize], w: usize, hd: usize) -> Data {
    let all = x.to_f32_vec().unwrap();
    let v: Vec<f32> = live
        .iter()
        .flat_map(|&r| all[r * w..(r + 1) * w].to_vec())
        .collect();
    Data::from_f32(&[live.len(), w / hd, hd], &v).unwrap()
}

/// `PagedDecodeAttention` with the index arrays on the device: output and the two pool layers.
fn run_decode(
    exec: &Executor,
    dev: &CudaDevice,
    c: &AttnCase,
    x: &AttnInputs,
    (dt, max_keys): (DataType, i32),
) -> [Vec<f32>; 3] {
    let ints = IntDict::new()
        .with("block_size", BS as i32)
        .with("sliding_window", c.window)
        .with("max_keys", max_keys);
    let floats = FloatDict::new()
        .with("scale", 0.11)
        .with("softcap", c.softcap);
    let slopes = c.alibi.then_some(("alibi_slopes", &x.slopes));
    let extra: Vec<(&str, &Data)> = slopes.into_iter().collect();
    try_decode(exec, dev, c, x, dt, &extra, &floats, &ints).unwrap()
}

/// [`run_decode`] with the optional inputs `extra` and the call's `floats` and `ints`; the op's
/// error as it is.
#[allow(clippy::too_many_arguments)]
fn try_decode(
    exec: &Executor,
    dev: &CudaDevice,
    c: &AttnCase,
    x: &AttnInputs,
    dt: DataType,
    extra: &[(&str, &Data)],
    floats: &FloatDict,
    ints: &IntDict,
) -> fastllm::Result<[Vec<f32>; 3]> {
    let rows = c.lens.len();
    let mut kc = pool_layer(dev, c, x.n_slots, &x.k_pool, dt);
    let mut vc = pool_layer(dev, c, x.n_slots, &x.v_pool, dt);
    let lens: Vec<i32> = c.lens.iter().map(|&l| l as i32).collect();
    let up = |d: Data| dev.upload(&d).unwrap();
    let slots = up(Data::from_i32(&[rows], &x.slots).unwrap());
    let lens = up(Data::from_i32(&[rows], &lens).unwrap());
    let tables = up(Data::from_i32(&[rows, x.maxb], &x.table).unwrap());
    let (mut ws, mut out) = (Data::empty(DataType::F32), Data::empty(DataType::F32));
    let mut d = DataDict::new()
        .with("q", &x.q)
        .with("k", &x.k)
        .with("v", &x.v)
        .with_mut("k_cache", &mut kc)
        .with_mut("v_cache", &mut vc)
        .with("slots", &slots)
        .with("kv_lens", &lens)
        .with("block_tables", &tables)
        .with_mut("workspace", &mut ws)
        .with_mut("output", &mut out);
    for &(name, t) in extra {
        d.insert(name, t);
    }
    exec.run("PagedDecodeAttention", &mut d, floats, ints)?;
    let host = |d: &Data| d.to_owned_host().unwrap().to_f32_vec().unwrap();
    Ok([host(&out), host(&kc), host(&vc)])
}

/// The reference: `PagedCacheWrite` of the step's rows, then `PagedAttention` over the rows
/// with keys; output (those rows) and the two pool layers.
fn run_reference(
    exec: &Executor,
    dev: &CudaDevice,
    c: &AttnCase,
    x: &AttnInputs,
    dt: DataType,
) -> [Vec<f32>; 3] {
    let (nkv, hd) = (c.nkv, c.hd);
    let mut kc = pool_layer(dev, c, x.n_slots, &x.k_pool, dt);
    let mut vc = pool_layer(dev, c, x.n_slots, &x.v_pool, dt);
    let live: Vec<usize> = (0..c.lens.len()).filter(|&r| c.lens[r] > 0).collect();
    let n = live.len();
    let slots: Vec<i32> = live.iter().map(|&r| x.slots[r]).collect();
    let slots = Data::from_i32(&[n], &slots).unwrap();
    for (src, cache) in [(&x.k, &mut kc), (&x.v, &mut vc)] {
        let rows = rows_of(src, &live, nkv * hd, hd);
        let mut d = DataDict::new()
            .with("input", &rows)
            .with("slots", &slots)
            .with_mut("cache", cache);
        exec.run(
            "PagedCacheWrite",
            &mut d,
            &FloatDict::new(),
            &IntDict::new(),
        )
        .unwrap();
    }
    let host = |d: &Data| d.to_owned_host().unwrap().to_f32_vec().unwrap();
    [paged_attention(exec, c, x, &kc, &vc), host(&kc), host(&vc)]
}

/// `PagedAttention` of the rows with keys over the pool layers `kc`, `vc`: their output.
fn paged_attention(
    exec: &Executor,
    c: &AttnCase,
    x: &AttnInputs,
    kc: &Data,
    vc: &Data,
) -> Vec<f32> {
    let (nh, hd) = (c.nh, c.hd);
    let live: Vec<usize> = (0..c.lens.len()).filter(|&r| c.lens[r] > 0).collect();
    let n = live.len();
    let qs: Vec<i32> = (0..=n as i32).collect();
    let kl: Vec<i32> = live.iter().map(|&r| c.lens[r] as i32).collect();
    let lt: Vec<i32> = live
        .iter()
        .flat_map(|&r| x.table[r * x.maxb..(r + 1) * x.maxb].to_vec())
        .collect();
    let qs = Data::from_i32(&[n + 1], &qs).unwrap();
    let kl = Data::from_i32(&[n], &kl).unwrap();
    let lt = Data::from_i32(&[n, x.maxb], &lt).unwrap();
    let q = rows_of(&x.q, &live, nh * hd, hd);
    let slopes = c.alibi.then_some(&x.slopes);
    let index = [&qs, &kl, &lt];
    paged_attention_call(exec, [&q, kc, vc], index, slopes, c.window, c.softcap)
}

/// One `PagedAttention` call: `[q, k_cache, v_cache]`, `[q_starts, kv_lens, block_tables]`,
/// optional ALiBi slopes, the window and soft-cap (block size [`BS`], scale 0.11); its output.
fn paged_attention_call(
    exec: &Executor,
    [q, kc, vc]: [&Data; 3],
    [qs, kl, bt]: [&Data; 3],
    slopes: Option<&Data>,
    window: i32,
    softcap: f32,
) -> Vec<f32> {
    let mut out = Data::empty(DataType::F32);
    let mut d = DataDict::new()
        .with("q", q)
        .with("k_cache", kc)
        .with("v_cache", vc)
        .with("q_starts", qs)
        .with("kv_lens", kl)
        .with("block_tables", bt)
        .with_mut("output", &mut out);
    if let Some(s) = slopes {
        d.insert("alibi_slopes", s);
    }
    let ints = IntDict::new()
        .with("block_size", BS as i32)
        .with("sliding_window", window);
    let floats = FloatDict::new()
        .with("scale", 0.11)
        .with("softcap", softcap);
    exec.run("PagedAttention", &mut d, &floats, &ints).unwrap();
    out.to_owned_host().unwrap().to_f32_vec().unwrap()
}

/// Rotary tables that do not fit the call are an `Err` naming what was wrong, never a launch:
/// `cos` without `sin`, tables of the wrong size, an odd or oversized `rotary_dim`, a style
/// other than 0 or 1.
#[test]
fn paged_decode_attention_refuses_bad_rotary_tables() {
    let Some(dev) = gpu() else { return };
    let exec = common::cuda::cuda_executor(&dev);
    let mut rng = CaseRng::new(8);
    let c = AttnCase {
        hd: 64,
        nh: 4,
        nkv: 2,
        window: 0,
        softcap: 0.0,
        alibi: false,
        lens: &[5, 9],
    };
    let x = attn_inputs(&c, &mut rng);
    let angles = |n: usize| {
        dev.upload(&Data::from_f32(&[n], &vec![0.5; n]).unwrap())
            .unwrap()
    };
    let (good, short) = (angles(2 * 32), angles(2 * 31));
    // (cos, sin, rotary_dim, style, what the error names)
    type Case<'a> = (Option<&'a Data>, Option<&'a Data>, i32, i32, &'static str);
    let cases: [Case; 5] = [
        (Some(&good), None, 64, 0, "'cos' and 'sin' come together"),
        (
            Some(&short),
            Some(&short),
            64,
            0,
            "must be packed f32 of 2 rows",
        ),
        (Some(&good), Some(&good), 7, 0, "rotary_dim 7"),
        (Some(&good), Some(&good), 128, 0, "rotary_dim 128"),
        (Some(&good), Some(&good), 64, 2, "rotary style 2"),
    ];
    for (cos, sin, rot, style, want) in cases {
        let extra: Vec<(&str, &Data)> = [("cos", cos), ("sin", sin)]
            .into_iter()
            .filter_map(|(n, t)| t.map(|t| (n, t)))
            .collect();
        let ints = IntDict::new()
            .with("block_size", BS as i32)
            .with("rotary_dim", rot)
            .with("style", style);
        let err = try_decode(
            &exec,
            &dev,
            &c,
            &x,
            DataType::F16,
            &extra,
            &FloatDict::new(),
            &ints,
        )
        .expect_err(want)
        .to_string();
        assert!(err.contains(want), "{want}: got {err}");
    }
}

/// Key counts of 48 rows: with 8 kv heads more blocks than 2 per multiprocessor on a GPU of
/// fewer than 192 (an H100 has 132).
const MANY_ROWS: [usize; 48] = [
    17, 40, 3, 90, 1, 33, 64, 0, 18, 19, 77, 5, 120, 48, 2, 31, 16, 15, 260, 44, 9, 63, 65, 24, 17,
    81, 7, 36, 50, 11, 29, 70, 17, 40, 3, 90, 1, 33, 64, 0, 18, 19, 77, 5, 120, 48, 2, 31,
];

#[test]
fn paged_decode_attention_matches_paged_attention() {
    let Some(dev) = gpu() else { return };
    let exec = common::cuda::cuda_executor(&dev);
    let mut rng = CaseRng::new(7);
    let case = |hd, nh, nkv, window, softcap, alibi, lens| AttnCase {
        hd,
        nh,
        nkv,
        window,
        softcap,
        alibi,
        lens,
    };
    let cases = [
        case(128, 32, 8, 0, 0.0, false, &[1, 80, 17, 0, 300][..]),
        case(16, 4, 2, 0, 0.0, false, &[5, 0, 33]),
        case(80, 12, 1, 40, 0.0, false, &[100, 3, 1000]),
        case(64, 14, 2, 0, 30.0, true, &[64, 65, 2]),
        case(128, 8, 8, 0, 0.0, false, &[2000, 1]),
        // enough rows that the f16 cache takes the 4-warp kernels (fewer take 8 warps)
        case(128, 32, 8, 0, 0.0, false, &MANY_ROWS),
        // head size 256: 4 heads per block (8 warps for few rows), and 8 heads per block, which
        // has no 8-warp kernel (its shared memory would not fit)
        case(256, 8, 2, 0, 0.0, false, &[1, 300, 40]),
        case(256, 16, 2, 0, 0.0, false, &[7, 0, 520]),
        // the tensor-core form with 8 heads per kv head, and with 12 (a block of 8, one of 4)
        // over a window and split rows
        case(64, 16, 2, 0, 0.0, false, &[33, 0, 1500]),
        case(128, 24, 2, 100, 0.0, false, &[700, 5, 129]),
    ];
    // an f16 pool of head size 64 or 128 takes the tensor-core kernels, other f16 pools with few
    // blocks the 8-warp online-softmax ones; a long `max_keys` splits long rows, a short one not
    let runs = [
        (DataType::F32, 2048),
        (DataType::F16, 2048),
        (DataType::F16, 256),
        (DataType::Q8_0, 2048),
    ];
    for c in &cases {
        for (dt, max_keys) in runs {
            let x = attn_inputs(c, &mut rng);
            let [got, kc, vc] = run_decode(&exec, &dev, c, &x, (dt, max_keys));
            let [want, kr, vr] = run_reference(&exec, &dev, c, &x, dt);
            let w = c.nh * c.hd;
            let live: Vec<usize> = (0..c.lens.len()).filter(|&r| c.lens[r] > 0).collect();
            let got_live: Vec<f32> = live
                .iter()
                .flat_map(|&r| got[r * w..(r + 1) * w].to_vec())
                .collect();
            let (e, bad) = nmse(&got_live, &want);
            println!(
                "hd {} heads {}/{} window {} softcap {} alibi {} {dt} max_keys {max_keys}: nmse {e:.2e}",
                c.hd, c.nh, c.nkv, c.window, c.softcap, c.alibi
            );
            assert!(!bad && e < 1e-10, "hd {} {dt}: nmse {e}", c.hd);
            if dt == DataType::Q8_0 {
                // the q8_0 kernels against f32 PagedAttention over the values the pool holds
                let f32_pool = |vals: &[f32]| {
                    let d = Data::from_f32(&[x.n_slots, c.nkv, c.hd], &unpadded(c, dt, vals));
                    dev.upload(&d.unwrap()).unwrap()
                };
                let f = paged_attention(&exec, c, &x, &f32_pool(&kr), &f32_pool(&vr));
                let (e, bad) = nmse(&want, &f);
                println!("  q8_0 PagedAttention vs f32 over the dequantized pool: nmse {e:.2e}");
                assert!(
                    !bad && e < 1e-10,
                    "hd {} q8_0 vs dequantized: nmse {e}",
                    c.hd
                );
            }
            for r in (0..c.lens.len()).filter(|&r| c.lens[r] == 0) {
                let row = &got[r * w..(r + 1) * w];
                assert!(row.iter().all(|&x| x == 0.0), "padding row {r} not zero");
            }
            assert!(kc == kr && vc == vr, "the pool after the step differs");
        }
    }
}

/// The logits of rows `rows` (of a 64-sequence scenario) over a prompt and 6 decode steps, all
/// of `rows` decoding together: row r's prompt has 1 + 37 r mod 400 tokens (long rows take
/// split attention), its tokens depend only on r.
fn rows_decoding(model: &Model, rows: &[usize]) -> Vec<Vec<Vec<f32>>> {
    let bs = 16;
    let mut pool = PagedKvPool::new(model, rows.len() * (420 / bs + 2) + 8, bs).unwrap();
    let mut st: Vec<PagedSeqState> = rows.iter().map(|_| PagedSeqState::new()).collect();
    let prompts: Vec<Vec<u32>> = rows
        .iter()
        .map(|&r| {
            (0..1 + (37 * r) % 400)
                .map(|i| tok(model, i + 100, r))
                .collect()
        })
        .collect();
    let mut items: Vec<(&mut PagedSeqState, &[u32])> = st
        .iter_mut()
        .zip(&prompts)
        .map(|(s, p)| (s, p.as_slice()))
        .collect();
    let mut out = vec![model.forward_paged(&mut pool, &mut items).unwrap()];
    for step in 0..6 {
        let toks: Vec<[u32; 1]> = rows.iter().map(|&r| [tok(model, step, r)]).collect();
        let mut items: Vec<(&mut PagedSeqState, &[u32])> = st
            .iter_mut()
            .zip(&toks)
            .map(|(s, t)| (s, t.as_slice()))
            .collect();
        out.push(model.forward_paged(&mut pool, &mut items).unwrap());
    }
    for s in st.iter_mut() {
        pool.release(s);
    }
    out
}

#[test]
fn batch_invariant_rows_equal_alone_and_in_64() {
    let Some(_dev) = gpu() else { return };
    let opts = fastllm::options::RuntimeOptions {
        batch_invariant: true,
        ..Default::default()
    };
    for (shape, dtype) in [
        ("llama-3.2-1b", "int4"),
        ("tiny", "f16"),
        ("qwen2-0.5b", "int8"),
    ] {
        let mut cfg = synthetic::config(shape).unwrap();
        cfg.num_layers = 2;
        let dt = synthetic::weight_dtype(dtype).unwrap();
        let src = Arc::new(SyntheticSource::new(&cfg, dt).unwrap());
        let exec = fastllm::load::executor_for("cuda", 0, &opts).unwrap();
        let model = Model::new(cfg, src, exec, Precision::Fast, false).unwrap();
        let all: Vec<usize> = (0..64).collect();
        let batched = rows_decoding(&model, &all);
        for r in [0usize, 11, 63] {
            let alone = rows_decoding(&model, &[r]);
            for (step, (b, a)) in batched.iter().zip(&alone).enumerate() {
                let (b, a) = (&b[r], &a[0]);
                let same =
                    b.len() == a.len() && b.iter().zip(a).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{shape} {dtype} row {r} step {step}: logits alone differ from in a batch of 64 (max |diff| {:.3e})",
                    max_abs_diff(b, a)
                );
            }
        }
        println!("{shape} {dtype}: rows 0, 11, 63 bit-equal alone and in a batch of 64 (prompt + 6 steps)");
    }
}

/// `PagedAttention` over prompt chunks (several query rows per sequence, after cached keys) on
/// the GPU against the scalar reference CPU device, f32, f16 and q8_0 pools: sequences of 1 to 64
/// query rows over 2 to 700 keys (past one chunk of keys), windows, soft-capping, ALiBi; 1, 4, 7
/// and 12 query heads per kv head.
#[test]
fn paged_attention_prompt_chunks_match_the_cpu_reference() {
    let Some(dev) = gpu() else { return };
    let exec = common::cuda::cuda_executor(&dev);
    let reference = common::cuda::reference();
    let mut rng = CaseRng::new(11);
    // (head dim, heads, kv heads, window, softcap, alibi), and (query rows, keys) per sequence
    let shapes = [
        (128, 32, 8, 0, 0.0, false),
        (64, 14, 2, 0, 30.0, true),
        (80, 12, 1, 40, 0.0, false),
        (64, 4, 4, 0, 0.0, true),
    ];
    let seqs: [(usize, usize); 6] = [(5, 53), (1, 17), (64, 64), (3, 300), (20, 700), (2, 2)];
    for (hd, nh, nkv, window, softcap, alibi) in shapes {
        for dt in [DataType::F32, DataType::F16, DataType::Q8_0] {
            if dt == DataType::Q8_0 && hd % 32 != 0 {
                continue; // whole q8_0 blocks per head row
            }
            let maxb = seqs.iter().map(|s| s.1.div_ceil(BS)).max().unwrap();
            let n_blocks = seqs.len() * maxb + 2;
            let mut ids: Vec<i32> = (0..n_blocks as i32).collect();
            for i in (1..ids.len()).rev() {
                ids.swap(
                    i,
                    (rng.uniform(0.0, 1.0) * (i + 1) as f32) as usize % (i + 1),
                );
            }
            let table = &ids[..seqs.len() * maxb];
            let rows: usize = seqs.iter().map(|s| s.0).sum();
            let mut starts = vec![0i32];
            for s in &seqs {
                starts.push(starts.last().unwrap() + s.0 as i32);
            }
            let lens: Vec<i32> = seqs.iter().map(|s| s.1 as i32).collect();
            let n_slots = n_blocks * BS;
            let pool = |rng: &mut CaseRng| {
                let v = rand_f32(rng, n_slots * nkv * hd);
                let bytes = fastllm::data::encode_from_f32(dt, &v).unwrap();
                Data::from_bytes(dt, &[n_slots, nkv, hd], &bytes).unwrap()
            };
            let (kc, vc) = (pool(&mut rng), pool(&mut rng));
            let q = Data::from_f32(&[rows, nh, hd], &rand_f32(&mut rng, rows * nh * hd)).unwrap();
            let slopes: Vec<f32> = (0..nh).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
            let slopes = Data::from_f32(&[nh], &slopes).unwrap();
            let qs = Data::from_i32(&[seqs.len() + 1], &starts).unwrap();
            let kl = Data::from_i32(&[seqs.len()], &lens).unwrap();
            let bt = Data::from_i32(&[seqs.len(), maxb], table).unwrap();
            let slopes = alibi.then_some(&slopes);
            let run = |e: &Executor, kc: &Data, vc: &Data| {
                paged_attention_call(e, [&q, kc, vc], [&qs, &kl, &bt], slopes, window, softcap)
            };
            let got = run(&exec, &dev.upload(&kc).unwrap(), &dev.upload(&vc).unwrap());
            let want = run(&reference, &kc, &vc);
            let (e, bad) = nmse(&got, &want);
            println!("prompt chunks hd {hd} heads {nh}/{nkv} window {window} {dt}: nmse {e:.2e}");
            assert!(!bad && e < 1e-10, "hd {hd} {dt}: nmse {e}");
        }
    }
}
