//! Attention on the CUDA device against the CPU reference: tensor-core and flash prefill, the
//! decode kernel over a KV cache (and storing the step's own key and value itself, with its
//! rotary step), f32, f16 and q8_0 caches (and `KvAppend` into them), rotary embedding of two inputs
//! in one call, and the quantized or copied attention outputs that feed the next `Linear`.
//!
//! Without a GPU every test passes without work and the binary says once, on stderr past the
//! test harness's capture, "SKIPPED: no CUDA device (...)" (CI has none).

#![cfg(feature = "cuda")]

mod common;

use common::cuda::{clone_arg, cuda_executor, gpu, reference, run_linear};
use fastllm::data::{encode_from_f32, Data, DataType, DeviceKind};
use fastllm::harness::{nmse, CaseRng};
use fastllm::{BaseDevice, DataDict, Executor, FloatDict, IntDict};

/// (sq, skv, nh, nkv, hd, hdv, alibi, softcap, window, causal)
type AttCase = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    bool,
    f32,
    i32,
    i32,
);

/// TF32 products (10-bit mantissa) for q·kᵀ and p·v.
const TC_ATTENTION_NMSE: f64 = 2e-5;

/// `vals` as a host tensor of `dt` (f32, or f16 rounded to nearest even).
fn tensor_of(dt: DataType, dims: &[usize], vals: &[f32]) -> Data {
    Data::from_bytes(dt, dims, &encode_from_f32(dt, vals).unwrap()).unwrap()
}

/// Values stored per head row of `hd` in a KV cache of `dt` (q8_0: whole blocks of 32).
fn stored(dt: DataType, hd: usize) -> usize {
    if dt == DataType::Q8_0 {
        hd.div_ceil(32) * 32
    } else {
        hd
    }
}

/// Head rows of `hd` values (`vals`, [rows, nkv, hd]) as a host KV cache of `dt`: q8_0 rows
/// are padded with zeros to whole blocks, as the caches store them.
fn kv_tensor(dt: DataType, [rows, nkv, hd]: [usize; 3], vals: &[f32]) -> Data {
    let hds = stored(dt, hd);
    let mut padded = vec![0f32; rows * nkv * hds];
    for (dst, src) in padded.chunks_exact_mut(hds).zip(vals.chunks_exact(hd)) {
        dst[..hd].copy_from_slice(src);
    }
    tensor_of(dt, &[rows, nkv, hds], &padded)
}

/// What a KV cache of `dt` holds of `vals` (head rows of `hd` values), as f32 rows of `hd`.
fn kv_rounded(dt: DataType, hd: usize, vals: &[f32]) -> Vec<f32> {
    let all = kv_tensor(dt, [vals.len() / hd, 1, hd], vals)
        .to_f32_vec()
        .unwrap();
    all.chunks_exact(stored(dt, hd))
        .flat_map(|r| r[..hd].to_vec())
        .collect()
}

#[test]
fn tensor_core_attention_matches_reference() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let reference = reference();
    let mut rng = CaseRng::new(22);
    // (sq, skv, nh, nkv, hd, hdv, alibi, softcap, window, causal); 64 heads × 1100 keys take
    // two chunks of queries; 4200 keys exceed the softmax's in-register row (4096).
    let cases: [AttCase; 7] = [
        (64, 64, 8, 2, 64, 64, false, 0.0, 0, 1),
        (100, 137, 6, 3, 40, 24, true, 0.0, 0, 1),
        (80, 80, 4, 4, 32, 32, false, 20.0, 0, 1),
        (70, 90, 4, 1, 64, 64, false, 0.0, 17, 1),
        (64, 50, 4, 2, 32, 32, true, 10.0, 0, 0),
        (1100, 1100, 64, 8, 16, 16, false, 0.0, 0, 1),
        (64, 4200, 2, 1, 16, 16, true, 0.0, 0, 1),
    ];
    for (sq, skv, nh, nkv, hd, hdv, alibi, softcap, window, causal) in cases {
        let q = rng.data_range(DataType::F32, &[sq, nh, hd], -2.0, 2.0);
        let mut k = rng.data(DataType::F32, &[skv, nkv, hd]);
        k.reserve(0, skv + 5).unwrap();
        let v = rng.data(DataType::F32, &[skv, nkv, hdv]);
        let slopes: Vec<f32> = (0..nh).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
        let slopes = Data::from_f32(&[nh], &slopes).unwrap();
        let run = |exec: &Executor, q: &Data, k: &Data, v: &Data, s: &Data| {
            let mut out = Data::empty(DataType::F32);
            let mut d = DataDict::new().with("q", q).with("k", k).with("v", v);
            if alibi {
                d.insert("alibi_slopes", s);
            }
            d.insert_mut("output", &mut out);
            exec.run(
                "Attention",
                &mut d,
                &FloatDict::new().with("softcap", softcap),
                &IntDict::new()
                    .with("causal", causal)
                    .with("sliding_window", window)
                    .with("fast", 1),
            )
            .unwrap();
            out.to_owned_host().unwrap()
        };
        let r = run(&reference, &q, &k, &v, &slopes);
        let t = run(
            &cuda,
            &dev.upload(&q).unwrap(),
            &dev.upload(&k).unwrap(),
            &dev.upload(&v).unwrap(),
            &dev.upload(&slopes).unwrap(),
        );
        let (e, bad) = nmse(&t.to_f32_vec().unwrap(), &r.to_f32_vec().unwrap());
        println!(
            "tensor-core Attention q[{sq},{nh},{hd}] kv[{skv},{nkv},{hd}/{hdv}] alibi={alibi} softcap={softcap} window={window} causal={causal}: nmse {e:.2e}"
        );
        assert!(
            !bad && e <= TC_ATTENTION_NMSE,
            "nmse {e:.3e} > {TC_ATTENTION_NMSE:.0e}"
        );
    }
}

#[test]
fn decode_attention_matches_reference() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let reference = reference();
    let mut rng = CaseRng::new(61);
    // (sq, len, cap, nh, nkv, hd, hdv, alibi, softcap, window): GQA groups 1/3/4/7/16 (16 is
    // more than the kernel's 8 heads per block), odd head sizes, one to many splits.
    let cases = [
        (
            1usize, 1usize, 5usize, 1usize, 1usize, 8usize, 8usize, false, 0.0f32, 0usize,
        ),
        (1, 37, 64, 9, 3, 64, 64, true, 0.0, 0),
        (1, 100, 130, 8, 2, 33, 33, false, 20.0, 0),
        (1, 1500, 1600, 8, 1, 64, 64, false, 0.0, 0),
        (3, 200, 256, 12, 4, 40, 24, true, 10.0, 17),
        (1, 777, 1000, 32, 8, 128, 128, false, 0.0, 0),
        (1, 300, 300, 14, 2, 64, 64, false, 0.0, 100),
        (1, 50, 64, 32, 2, 128, 128, false, 0.0, 0),
        (2, 5, 8, 4, 4, 256, 256, true, 0.0, 0),
        (1, 4097, 8192, 32, 8, 128, 128, false, 0.0, 0),
    ];
    // f32 caches, and f16 and q8_0 caches against the reference over the values they hold (a
    // q8_0 value head size other than the key's must be whole blocks: the padded width is all
    // a cache tells)
    for (dt, (sq, len, cap, nh, nkv, hd, hdv, alibi, softcap, window)) in
        [DataType::F32, DataType::F16, DataType::Q8_0]
            .into_iter()
            .flat_map(|dt| cases.map(|c| (dt, c)))
            .filter(|(dt, c)| *dt != DataType::Q8_0 || c.5 == c.6 || c.6 % 32 == 0)
    {
        let q = rng.data_range(DataType::F32, &[sq, nh, hd], -2.0, 2.0);
        let (k0, v0) = (
            rng.data(DataType::F32, &[len, nkv, hd])
                .to_f32_vec()
                .unwrap(),
            rng.data(DataType::F32, &[len, nkv, hdv])
                .to_f32_vec()
                .unwrap(),
        );
        let (kv, vv) = (kv_rounded(dt, hd, &k0), kv_rounded(dt, hdv, &v0));
        let k = Data::from_f32(&[len, nkv, hd], &kv).unwrap();
        let v = Data::from_f32(&[len, nkv, hdv], &vv).unwrap();
        let slopes: Vec<f32> = (0..nh).map(|h| 0.5f32.powi(h as i32 % 8 + 1)).collect();
        let slopes = Data::from_f32(&[nh], &slopes).unwrap();
        let scale = 1.0 / (hd as f32).sqrt();
        // reference: Attention over the full K/V, queries at len - sq + i
        let mut r = Data::empty(DataType::F32);
        {
            let mut d = DataDict::new().with("q", &q).with("k", &k).with("v", &v);
            if alibi {
                d.insert("alibi_slopes", &slopes);
            }
            d.insert_mut("output", &mut r);
            reference
                .run(
                    "Attention",
                    &mut d,
                    &FloatDict::new()
                        .with("scale", scale)
                        .with("softcap", softcap),
                    &IntDict::new()
                        .with("causal", 1)
                        .with("sliding_window", window as i32),
                )
                .unwrap();
        }
        // GPU: caches of `cap` rows holding the `len` rows; DecodeAttention reads rows
        // 0..=position of each query (its host length plays no part)
        let cache = |all: &[f32], row: usize| {
            let mut c = kv_tensor(dt, [len, nkv, row], all);
            c.reserve(0, cap).unwrap();
            dev.upload(&c).unwrap()
        };
        let (kc, vc) = (cache(&k0, hd), cache(&v0, hdv));
        let pos: Vec<i32> = (len - sq..len).map(|p| p as i32).collect();
        let pos = dev.upload(&Data::from_i32(&[sq], &pos).unwrap()).unwrap();
        // the output starts as NaN: every element must be written
        let nan = vec![f32::NAN; sq * nh * hdv];
        let mut out = dev
            .upload(&Data::from_f32(&[sq, nh, hdv], &nan).unwrap())
            .unwrap();
        let mut ws = Data::empty(DataType::F32);
        let dq = dev.upload(&q).unwrap();
        let ds = dev.upload(&slopes).unwrap();
        {
            let mut d = DataDict::new()
                .with("q", &dq)
                .with("k_cache", &kc)
                .with("v_cache", &vc)
                .with("positions", &pos);
            if alibi {
                d.insert("alibi_slopes", &ds);
            }
            d.insert_mut("workspace", &mut ws);
            d.insert_mut("output", &mut out);
            cuda.run(
                "DecodeAttention",
                &mut d,
                &FloatDict::new()
                    .with("scale", scale)
                    .with("softcap", softcap),
                &IntDict::new().with("sliding_window", window as i32),
            )
            .unwrap();
        }
        assert!(
            matches!(out.device(), DeviceKind::Cuda(_)),
            "ran on the GPU"
        );
        let t = out.to_owned_host().unwrap().to_f32_vec().unwrap();
        let (e, bad) = nmse(&t, &r.to_f32_vec().unwrap());
        println!(
            "DecodeAttention q[{sq},{nh},{hd}] {dt} cache[{len}/{cap},{nkv},{hd}/{hdv}] alibi={alibi} softcap={softcap} window={window}: nmse {e:.2e}"
        );
        assert!(!bad && e <= 1e-9, "nmse {e:.3e}");
    }
}

/// `DecodeAttention` given the step's raw key and value (and the step's cos/sin tables) stores
/// and rotates them itself: the output and the cache rows are bit for bit those of
/// `RotaryEmbedding`, the rows stored at their position, then `DecodeAttention`, and `q`, `k`
/// are left unchanged. Wrong
/// step inputs are errors, not launches.
#[test]
fn decode_attention_with_the_step_kv_equals_rotary_store_and_attention() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(67);
    // (len, cap, nh, nkv, hd, rot, style, rotate, alibi, window): one and many splits, GQA
    // groups 1/4/16 (16 spans several blocks per KV head), partial rotation, both styles.
    let cases = [
        (
            1usize, 4usize, 4usize, 4usize, 64usize, 64usize, 0i32, true, false, 0i32,
        ),
        (37, 66, 32, 8, 128, 128, 0, true, false, 0),
        (1500, 1600, 16, 1, 64, 32, 1, true, true, 0),
        (300, 300, 14, 2, 64, 64, 1, true, false, 100),
        (4097, 8192, 32, 8, 128, 128, 0, true, false, 0),
        (20, 32, 9, 3, 40, 40, 0, false, true, 0),
    ];
    for (dt, (len, cap, nh, nkv, hd, rot, style, rotate, alibi, window)) in
        [DataType::F32, DataType::F16, DataType::Q8_0]
            .into_iter()
            .flat_map(|dt| cases.map(|c| (dt, c)))
    {
        let ctx = format!(
            "{dt} len={len} cap={cap} nh={nh} nkv={nkv} hd={hd} rot={rot} style={style} rotate={rotate}"
        );
        let old = len - 1;
        let q = dev.upload(&rng.data(DataType::F32, &[1, nh, hd])).unwrap();
        let k = dev.upload(&rng.data(DataType::F32, &[1, nkv, hd])).unwrap();
        let v = dev.upload(&rng.data(DataType::F32, &[1, nkv, hd])).unwrap();
        let cache = |rng: &mut CaseRng| {
            let vals = rng
                .data(DataType::F32, &[old, nkv, hd])
                .to_f32_vec()
                .unwrap();
            let mut c = kv_tensor(dt, [old, nkv, hd], &vals);
            c.reserve(0, cap).unwrap();
            dev.upload(&c).unwrap()
        };
        let (kc0, vc0) = (cache(&mut rng), cache(&mut rng));
        let pos = dev
            .upload(&Data::from_i32(&[1], &[old as i32]).unwrap())
            .unwrap();
        let slopes: Vec<f32> = (0..nh).map(|h| 0.5f32.powi(h as i32 % 8 + 1)).collect();
        let slopes = dev
            .upload(&Data::from_f32(&[nh], &slopes).unwrap())
            .unwrap();
        let ints = IntDict::new()
            .with("rotary_dim", rot as i32)
            .with("style", style);
        let fl = FloatDict::new().with("theta", 10000.0);
        let (mut cs, mut sn) = (Data::empty(DataType::F32), Data::empty(DataType::F32));
        {
            let mut d = DataDict::new().with("positions", &pos);
            d.insert_mut("cos", &mut cs);
            d.insert_mut("sin", &mut sn);
            cuda.run("RotaryTables", &mut d, &fl, &ints).unwrap();
        }
        let scale = FloatDict::new().with("scale", 1.0 / (hd as f32).sqrt());
        let attend = |q: &Data, kc: &mut Data, vc: &mut Data, step: bool| -> Data {
            let mut out = Data::empty(DataType::F32);
            let mut ws = Data::empty(DataType::F32);
            let mut d = DataDict::new().with("q", q).with("positions", &pos);
            let mut ints = IntDict::new().with("sliding_window", window);
            if step {
                // written by the kernel: inout
                d.insert_mut("k_cache", kc);
                d.insert_mut("v_cache", vc);
                d.insert("k", &k);
                d.insert("v", &v);
                if rotate {
                    d.insert("cos", &cs);
                    d.insert("sin", &sn);
                    ints = ints.with("rotary_dim", rot as i32).with("style", style);
                }
            } else {
                d.insert("k_cache", &*kc);
                d.insert("v_cache", &*vc);
            }
            if alibi {
                d.insert("alibi_slopes", &slopes);
            }
            d.insert_mut("workspace", &mut ws);
            d.insert_mut("output", &mut out);
            cuda.run("DecodeAttention", &mut d, &scale, &ints).unwrap();
            out
        };
        let host = |d: &Data| d.to_owned_host().unwrap().to_f32_vec().unwrap();
        let full = |mut c: Data| {
            c.set_len(0, len).unwrap();
            host(&c)
        };
        // a device copy (with its capacity)
        let copy = |c: &Data| dev.upload(&clone_arg(c)).unwrap();
        // apart: rotate copies of q and k, the step's rows after the old ones (rounded to the
        // cache's type on the host), then attend
        let (mut qa, mut ka) = (copy(&q), copy(&k));
        if rotate {
            let mut d = DataDict::new().with("cos", &cs).with("sin", &sn);
            d.insert_mut("input", &mut qa);
            d.insert_mut("input1", &mut ka);
            cuda.run("RotaryEmbedding", &mut d, &fl, &ints).unwrap();
        }
        let with_row = |c: &Data, row: &Data| {
            let mut bytes = c.to_owned_host().unwrap().packed_bytes().unwrap();
            bytes.extend(kv_tensor(dt, [1, nkv, hd], &host(row)).bytes().unwrap());
            let mut t = Data::from_bytes(dt, &[len, nkv, stored(dt, hd)], &bytes).unwrap();
            t.reserve(0, cap).unwrap();
            dev.upload(&t).unwrap()
        };
        let (mut kca, mut vca) = (with_row(&kc0, &ka), with_row(&vc0, &v));
        let (mut kcb, mut vcb) = (kc0, vc0);
        let want = host(&attend(&qa, &mut kca, &mut vca, false));
        // fused: one launch
        let (q0, k0) = (host(&q), host(&k));
        let got = host(&attend(&q, &mut kcb, &mut vcb, true));
        assert_eq!(got, want, "{ctx}: output");
        assert_eq!(full(kcb), full(kca), "{ctx}: key cache");
        assert_eq!(full(vcb), full(vca), "{ctx}: value cache");
        assert_eq!((host(&q), host(&k)), (q0, k0), "{ctx}: q and k unchanged");
        println!("DecodeAttention with the step's k/v, {ctx}: equal bits");
    }
    // wrong step inputs are refused before any launch
    let (nh, nkv, hd) = (4usize, 2usize, 8usize);
    let up = |dims: &[usize]| {
        dev.upload(&Data::zeros(DataType::F32, dims).unwrap())
            .unwrap()
    };
    let q = up(&[1, nh, hd]);
    let q2 = up(&[2, nh, hd]);
    let (k, v, kbad) = (up(&[1, nkv, hd]), up(&[1, nkv, hd]), up(&[1, nkv, hd + 1]));
    let (cs, sn, cbad) = (up(&[1, hd / 2]), up(&[1, hd / 2]), up(&[1, 3]));
    let mut cache = Data::zeros(DataType::F32, &[0, nkv, hd]).unwrap();
    cache.reserve(0, 8).unwrap();
    let (kc, vc) = (dev.upload(&cache).unwrap(), dev.upload(&cache).unwrap());
    let p1 = dev.upload(&Data::from_i32(&[1], &[0]).unwrap()).unwrap();
    let p2 = dev.upload(&Data::from_i32(&[2], &[0, 1]).unwrap()).unwrap();
    let (mut kc, mut vc) = (kc, vc);
    type Step<'a> = [Option<&'a Data>; 4];
    // (what, q, positions, k/v/cos/sin, rotary_dim, caches inout, words of the message)
    let bad: [(&str, &Data, &Data, Step, i32, bool, &str); 8] = [
        (
            "k without v",
            &q,
            &p1,
            [Some(&k), None, None, None],
            8,
            true,
            "'v'",
        ),
        (
            "v without k",
            &q,
            &p1,
            [None, Some(&v), None, None],
            8,
            true,
            "'k'",
        ),
        (
            "two query rows",
            &q2,
            &p2,
            [Some(&k), Some(&v), None, None],
            8,
            true,
            "one query row",
        ),
        (
            "k of the wrong head size",
            &q,
            &p1,
            [Some(&kbad), Some(&v), None, None],
            8,
            true,
            "must be",
        ),
        (
            "cos without sin",
            &q,
            &p1,
            [Some(&k), Some(&v), Some(&cs), None],
            8,
            true,
            "together",
        ),
        (
            "tables of the wrong size",
            &q,
            &p1,
            [Some(&k), Some(&v), Some(&cbad), Some(&sn)],
            8,
            true,
            "angles",
        ),
        (
            "an odd rotary_dim",
            &q,
            &p1,
            [Some(&k), Some(&v), Some(&cs), Some(&sn)],
            7,
            true,
            "rotary_dim 7",
        ),
        (
            "read-only caches",
            &q,
            &p1,
            [Some(&k), Some(&v), Some(&cs), Some(&sn)],
            8,
            false,
            "inout",
        ),
    ];
    for (what, q, pos, step, rot, inout, words) in bad {
        let mut out = Data::empty(DataType::F32);
        let mut ws = Data::empty(DataType::F32);
        let mut d = DataDict::new().with("q", q).with("positions", pos);
        if inout {
            d.insert_mut("k_cache", &mut kc);
            d.insert_mut("v_cache", &mut vc);
        } else {
            d.insert("k_cache", &kc);
            d.insert("v_cache", &vc);
        }
        for (n, t) in ["k", "v", "cos", "sin"].into_iter().zip(step) {
            if let Some(t) = t {
                d.insert(n, t);
            }
        }
        d.insert_mut("workspace", &mut ws);
        d.insert_mut("output", &mut out);
        let r = cuda.run(
            "DecodeAttention",
            &mut d,
            &FloatDict::new().with("scale", 0.5),
            &IntDict::new().with("rotary_dim", rot),
        );
        match r {
            Err(e) => {
                println!("{what}: refused ({e})");
                assert!(e.to_string().contains(words), "{what}: {e}");
            }
            Ok(()) => panic!("{what}: accepted"),
        }
    }
}

#[test]
fn rotary_of_two_inputs_in_one_call_matches_two_calls() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let reference = reference();
    let mut rng = CaseRng::new(23);
    // (rows, q heads, k heads, hd, rot, style, inv_freq)
    for (s, hq, hk, hd, rot, style, inv) in [
        (1usize, 32usize, 8usize, 128usize, 128usize, 0i32, true),
        (3, 9, 3, 64, 64, 0, false),
        (5, 4, 4, 40, 20, 1, false),
        (2, 14, 2, 64, 32, 1, true),
    ] {
        let q = rng.data(DataType::F32, &[s, hq, hd]);
        let k = rng.data(DataType::F32, &[s, hk, hd]);
        let pos: Vec<i32> = (0..s as i32).map(|i| 7 + 13 * i).collect();
        let pos = Data::from_i32(&[s], &pos).unwrap();
        let freqs: Vec<f32> = (0..rot / 2).map(|i| 0.9f32.powi(i as i32)).collect();
        let freqs = Data::from_f32(&[rot / 2], &freqs).unwrap();
        let ints = IntDict::new()
            .with("rotary_dim", rot as i32)
            .with("style", style);
        let fl = FloatDict::new().with("theta", 500000.0);
        let mut want = Vec::new();
        for x in [&q, &k] {
            let mut x = x.to_owned_host().unwrap();
            let mut d = DataDict::new().with("positions", &pos);
            if inv {
                d.insert("inv_freq", &freqs);
            }
            d.insert_mut("input", &mut x);
            reference
                .run("RotaryEmbedding", &mut d, &fl, &ints)
                .unwrap();
            want.push(x.to_f32_vec().unwrap());
        }
        let (mut dq, mut dk) = (dev.upload(&q).unwrap(), dev.upload(&k).unwrap());
        let (dpos, dfreqs) = (dev.upload(&pos).unwrap(), dev.upload(&freqs).unwrap());
        {
            let mut d = DataDict::new().with("positions", &dpos);
            if inv {
                d.insert("inv_freq", &dfreqs);
            }
            d.insert_mut("input", &mut dq);
            d.insert_mut("input1", &mut dk);
            cuda.run("RotaryEmbedding", &mut d, &fl, &ints).unwrap();
        }
        for (t, r) in [&dq, &dk].iter().zip(&want) {
            let (e, bad) = nmse(&t.to_owned_host().unwrap().to_f32_vec().unwrap(), r);
            assert!(
                !bad && e < 1e-12,
                "s={s} hq={hq} hk={hk} hd={hd} rot={rot}: nmse {e:.3e}"
            );
        }
        // the step's cos/sin tables (`RotaryTables`) give the same bits as the angles formed
        // in the kernel
        let (mut cs, mut sn) = (Data::empty(DataType::F32), Data::empty(DataType::F32));
        {
            let mut d = DataDict::new().with("positions", &dpos);
            if inv {
                d.insert("inv_freq", &dfreqs);
            }
            d.insert_mut("cos", &mut cs);
            d.insert_mut("sin", &mut sn);
            cuda.run("RotaryTables", &mut d, &fl, &ints).unwrap();
        }
        assert_eq!(cs.dims(), &[s, rot / 2]);
        let (mut tq, mut tk) = (dev.upload(&q).unwrap(), dev.upload(&k).unwrap());
        {
            let mut d = DataDict::new().with("cos", &cs).with("sin", &sn);
            d.insert_mut("input", &mut tq);
            d.insert_mut("input1", &mut tk);
            cuda.run("RotaryEmbedding", &mut d, &fl, &ints).unwrap();
        }
        for (a, b) in [(&tq, &dq), (&tk, &dk)] {
            assert_eq!(
                a.to_owned_host().unwrap().to_f32_vec().unwrap(),
                b.to_owned_host().unwrap().to_f32_vec().unwrap(),
                "s={s} rot={rot} inv={inv}: tables differ from the kernel's own angles"
            );
        }
        // an odd rotary_dim is an error, not a launch
        let mut d = DataDict::new().with("positions", &dpos);
        d.insert_mut("cos", &mut cs);
        d.insert_mut("sin", &mut sn);
        let bad_rot = cuda.run(
            "RotaryTables",
            &mut d,
            &fl,
            &IntDict::new().with("rotary_dim", 7),
        );
        assert!(bad_rot.is_err(), "rotary_dim 7 must be refused");
    }
}

#[test]
fn flash_attention_prefill_matches_reference() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let reference = reference();
    let mut rng = CaseRng::new(41);
    // (sq, skv, nh, nkv, hd): GQA 4 and 1, query counts not a multiple of 64, a chunk of
    // queries after cached keys (skv > sq), head sizes 128 and 64
    for (sq, skv, nh, nkv, hd) in [
        (300usize, 300usize, 8usize, 2usize, 128usize),
        (130, 400, 4, 4, 64),
        (64, 64, 2, 1, 128),
        (513, 513, 8, 2, 64),
    ] {
        let q = rng.data_range(DataType::F32, &[sq, nh, hd], -2.0, 2.0);
        let k = rng.data(DataType::F32, &[skv, nkv, hd]);
        let v = rng.data(DataType::F32, &[skv, nkv, hd]);
        let run = |exec: &Executor, q: &Data, k: &Data, v: &Data| {
            let mut out = Data::empty(DataType::F32);
            let mut d = DataDict::new()
                .with("q", q)
                .with("k", k)
                .with("v", v)
                .with_mut("output", &mut out);
            exec.run(
                "Attention",
                &mut d,
                &FloatDict::new(),
                &IntDict::new().with("causal", 1).with("fast", 1),
            )
            .unwrap();
            out.to_owned_host().unwrap().to_f32_vec().unwrap()
        };
        let r = run(&reference, &q, &k, &v);
        let t = run(
            &cuda,
            &dev.upload(&q).unwrap(),
            &dev.upload(&k).unwrap(),
            &dev.upload(&v).unwrap(),
        );
        let (e, bad) = nmse(&t, &r);
        println!("flash Attention q[{sq},{nh},{hd}] kv[{skv},{nkv}]: nmse {e:.2e}");
        assert!(!bad && e <= TC_ATTENTION_NMSE, "nmse {e:.3e}");
    }
}

/// Causal `fast` attention of q [sq, nh, hd] over k, v with `quantize_output` = `copy`, then
/// `Linear` (quant_act) of its output rows [sq, nh · hd] by `w`: (attention output, product).
fn attend_then_project(
    cuda: &Executor,
    [q, k, v]: [&Data; 3],
    w: &Data,
    copy: fastllm::ops::OutputCopy,
) -> (Vec<f32>, Vec<f32>) {
    let mut out = Data::empty(DataType::F32);
    let mut d = DataDict::new()
        .with("q", q)
        .with("k", k)
        .with("v", v)
        .with_mut("output", &mut out);
    cuda.run(
        "Attention",
        &mut d,
        &FloatDict::new(),
        &IntDict::new()
            .with("causal", 1)
            .with("fast", 1)
            .with("quantize_output", copy.param()),
    )
    .unwrap();
    drop(d);
    let rows = q.dim(0);
    out.reshape(&[rows, q.count() / rows]).unwrap();
    let o = out.to_owned_host().unwrap().to_f32_vec().unwrap();
    (o, run_linear(cuda, &out, w, None, 1).to_f32_vec().unwrap())
}

#[test]
fn flash_attention_output_copy_gives_the_same_projection() {
    use fastllm::ops::OutputCopy;
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(43);
    let (sq, nh, nkv, hd) = (200usize, 8usize, 2usize, 128usize);
    let q = dev.upload(&rng.data(DataType::F32, &[sq, nh, hd])).unwrap();
    let k = dev
        .upload(&rng.data(DataType::F32, &[sq, nkv, hd]))
        .unwrap();
    let v = dev
        .upload(&rng.data(DataType::F32, &[sq, nkv, hd]))
        .unwrap();
    for (wt, copy) in [
        (DataType::F16, OutputCopy::F16),
        (DataType::Q4_0, OutputCopy::F16),
        (DataType::BF16, OutputCopy::Bf16),
    ] {
        let w = dev.upload(&rng.data(wt, &[96, nh * hd])).unwrap();
        // attention (the flash kernel), then the projection of its output
        let attend_project = |c| attend_then_project(&cuda, [&q, &k, &v], &w, c);
        let (o0, p0) = attend_project(OutputCopy::None);
        let (o1, p1) = attend_project(copy);
        assert_eq!(o0, o1, "{wt}: the output itself changed");
        assert_eq!(p0, p1, "{wt}: projection of the copy differs from the cast");
    }
    println!("flash attention f16/bf16 output copies: projections bit-equal to casting");
}

#[test]
fn decode_attention_q8_output_gives_the_same_projection() {
    use fastllm::ops::OutputCopy;
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let mut rng = CaseRng::new(47);
    let (nh, nkv, hd) = (8usize, 2usize, 128usize);
    let mut checked = 0;
    // 40 keys: one key range (the kernel writes the output); 3000: split ranges (the merge does)
    for skv in [40usize, 3000] {
        for sq in [1usize, 2] {
            let q = dev.upload(&rng.data(DataType::F32, &[sq, nh, hd])).unwrap();
            let k = dev
                .upload(&rng.data(DataType::F32, &[skv, nkv, hd]))
                .unwrap();
            let v = dev
                .upload(&rng.data(DataType::F32, &[skv, nkv, hd]))
                .unwrap();
            for wt in [DataType::Q4_0, DataType::Q8_0] {
                let w = dev.upload(&rng.data(wt, &[64, nh * hd])).unwrap();
                let attend_project = |c| attend_then_project(&cuda, [&q, &k, &v], &w, c);
                let (o0, p0) = attend_project(OutputCopy::None);
                let (o1, p1) = attend_project(OutputCopy::Q8);
                assert_eq!(o0, o1, "skv={skv} sq={sq} {wt}: the output itself changed");
                assert_eq!(p0, p1, "skv={skv} sq={sq} {wt}: projection differs");
                checked += 1;
            }
        }
    }
    println!("decode attention Q8_0 output rows: {checked} cases, projections bit-equal");
}

/// `Attention` over f16 or q8_0 keys and values (a KV cache read in place: the split-K decode
/// kernels, the general kernel, and in `fast` flash and cuBLAS prefill) against the CPU
/// reference over the values the cache holds (the kernels' tolerance) and over the f32
/// originals (the rounding's cost); head sizes 40 (q8_0: padded to 64), 64, 80 (padded to 96)
/// and 128, GQA, ALiBi, soft-capping, windows, sinks.
#[test]
fn f16_and_q8_cache_attention_matches_reference() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let reference = reference();
    let mut rng = CaseRng::new(83);
    // (sq, skv, nh, nkv, hd, alibi, softcap, window, sinks, fast)
    type Case = (usize, usize, usize, usize, usize, bool, f32, i32, bool, i32);
    let cases: [Case; 13] = [
        (1, 500, 10, 5, 40, false, 0.0, 0, false, 0),
        (5, 61, 4, 2, 40, true, 0.0, 0, true, 0),
        (90, 90, 6, 3, 40, false, 0.0, 0, false, 1),
        (1, 300, 8, 2, 64, false, 0.0, 0, false, 0),
        (1, 777, 32, 8, 128, false, 0.0, 0, true, 0),
        (3, 200, 12, 4, 80, true, 10.0, 17, true, 0),
        (1, 4097, 32, 8, 128, false, 0.0, 0, false, 0),
        (2, 70, 9, 3, 80, false, 0.0, 0, false, 1),
        (20, 90, 6, 3, 80, true, 0.0, 33, true, 0),
        (128, 128, 8, 2, 128, false, 0.0, 0, false, 1),
        (100, 130, 4, 4, 64, false, 0.0, 0, false, 1),
        (96, 96, 6, 2, 80, false, 20.0, 0, true, 1),
        (70, 90, 4, 1, 64, false, 0.0, 17, false, 1),
    ];
    for (dt, (sq, skv, nh, nkv, hd, alibi, softcap, window, sinks, fast)) in
        [DataType::F16, DataType::Q8_0]
            .into_iter()
            .flat_map(|dt| cases.map(|c| (dt, c)))
    {
        let q = rng.data_range(DataType::F32, &[sq, nh, hd], -2.0, 2.0);
        let k0 = rng
            .data(DataType::F32, &[skv, nkv, hd])
            .to_f32_vec()
            .unwrap();
        let v0 = rng
            .data(DataType::F32, &[skv, nkv, hd])
            .to_f32_vec()
            .unwrap();
        // caches with room for more rows, as a model's are
        let cache = |dt: DataType, vals: &[f32]| {
            let mut c = kv_tensor(dt, [skv, nkv, hd], vals);
            c.reserve(0, skv + 5).unwrap();
            c
        };
        let slopes: Vec<f32> = (0..nh).map(|h| 0.5f32.powi(h as i32 % 8 + 1)).collect();
        let slopes = Data::from_f32(&[nh], &slopes).unwrap();
        let sink = rng.data_range(DataType::F32, &[nh], -1.0, 1.0);
        let run = |exec: &Executor, [q, k, v, s, sk]: [&Data; 5]| {
            let mut out = Data::empty(DataType::F32);
            let mut d = DataDict::new().with("q", q).with("k", k).with("v", v);
            if alibi {
                d.insert("alibi_slopes", s);
            }
            if sinks {
                d.insert("sinks", sk);
            }
            d.insert_mut("output", &mut out);
            exec.run(
                "Attention",
                &mut d,
                &FloatDict::new().with("softcap", softcap),
                &IntDict::new()
                    .with("causal", 1)
                    .with("sliding_window", window)
                    .with("fast", fast),
            )
            .unwrap();
            out
        };
        let host = |d: Data| d.to_owned_host().unwrap().to_f32_vec().unwrap();
        let f32_cache = |vals: &[f32]| cache(DataType::F32, vals);
        let (k16, v16) = (kv_rounded(dt, hd, &k0), kv_rounded(dt, hd, &v0));
        let r16 = host(run(
            &reference,
            [&q, &f32_cache(&k16), &f32_cache(&v16), &slopes, &sink],
        ));
        let r32 = host(run(
            &reference,
            [&q, &f32_cache(&k0), &f32_cache(&v0), &slopes, &sink],
        ));
        let up = |d: &Data| dev.upload(d).unwrap();
        let (kc, vc) = (up(&cache(dt, &k0)), up(&cache(dt, &v0)));
        let out = run(&cuda, [&up(&q), &kc, &vc, &up(&slopes), &up(&sink)]);
        assert!(
            matches!(out.device(), DeviceKind::Cuda(_)),
            "ran on the GPU"
        );
        let t = host(out);
        let (e16, bad) = nmse(&t, &r16);
        let (e32, _) = nmse(&t, &r32);
        let tol = if fast != 0 && sq >= 64 {
            TC_ATTENTION_NMSE
        } else {
            1e-9
        };
        println!(
            "{dt}-cache Attention q[{sq},{nh},{hd}] kv[{skv},{nkv}] alibi={alibi} softcap={softcap} window={window} sinks={sinks} fast={fast}: nmse {e16:.2e} vs the cached values, {e32:.2e} vs f32"
        );
        assert!(!bad && e16 <= tol, "{dt}: nmse {e16:.3e} > {tol:.0e}");
        // the rounding's cost: f16 ~1e-7, q8_0 ~1e-5
        let cost = if dt == DataType::Q8_0 { 1e-3 } else { 1e-5 };
        assert!(e32 <= tol + cost, "{dt}: nmse vs f32 {e32:.3e}");
    }
}

/// `KvAppend` on the GPU stores f32 rows in an f16, q8_0 (head rows of 40 padded to 64) or f32
/// cache with the CPU's bits, moving a cache that is still on the host to the device and
/// growing a full one.
#[test]
fn kv_append_on_the_gpu_matches_the_cpu() {
    let Some(dev) = gpu() else { return };
    let cuda = cuda_executor(&dev);
    let cpu = reference();
    let mut rng = CaseRng::new(89);
    let (nkv, hd) = (3usize, 40usize);
    let rows = rng
        .data_range(DataType::F32, &[7, nkv, hd], -3.0, 3.0)
        .to_f32_vec()
        .unwrap();
    for dt in [DataType::F16, DataType::Q8_0, DataType::F32] {
        let empty = || {
            let mut c = Data::zeros(dt, &[0, nkv, stored(dt, hd)]).unwrap();
            c.reserve(0, 2).unwrap();
            c
        };
        let (mut on_cpu, mut on_gpu) = (empty(), empty());
        for (a, b) in [(0usize, 2usize), (2, 3), (3, 7)] {
            let part =
                || Data::from_f32(&[b - a, nkv, hd], &rows[a * nkv * hd..b * nkv * hd]).unwrap();
            for (exec, c, x) in [
                (&cpu, &mut on_cpu, part()),
                (&cuda, &mut on_gpu, dev.upload(&part()).unwrap()),
            ] {
                let mut d = DataDict::new().with("input", &x).with_mut("cache", c);
                exec.run("KvAppend", &mut d, &FloatDict::new(), &IntDict::new())
                    .unwrap();
            }
            assert!(
                matches!(on_gpu.device(), DeviceKind::Cuda(_)),
                "{dt}: the cache moved to the GPU"
            );
            assert_eq!(
                on_gpu.dims(),
                &[b, nkv, stored(dt, hd)],
                "{dt}: rows after {b}"
            );
            assert!(on_gpu.capacity()[0] >= b, "{dt}: capacity");
            assert_eq!(
                on_gpu.to_owned_host().unwrap().bytes().unwrap(),
                on_cpu.bytes().unwrap(),
                "{dt}: bits after {b} rows"
            );
        }
        println!("KvAppend {dt} on the GPU: the CPU's bits over 3 appends (grown twice)");
    }
}
