//! The peer-to-peer all-reduce of two GPUs of one process (`devices::cuda::p2p`): the plain
//! all-reduce equals the rank-ordered sum rounded to the tensor's dtype on both ranks, for
//! f32 / f16 / bf16, awkward counts and a tensor larger than one slot; `AllReduceAdd` adds that
//! sum into f32 rows; `RMSNorm` with `all_reduce` (the fused form) gives the bits of
//! `AllReduceAdd` followed by `RMSNorm`, with and without the copies for the next `Linear`, also
//! when a one-row `Linear` pushed its outputs to the peer as it wrote them; reductions recorded
//! in a step replay with fresh epochs between reductions launched op by op; a rank whose peer
//! never comes stops waiting after the group's timeout and reports it; a GPU
//! without a group refuses `AllReduceAdd`, and `RMSNorm` refuses `all_reduce` without `input1`.
//!
//! Needs 2 GPUs that reach each other's memory and NCCL; otherwise every test passes without
//! work and says why on stderr ("SKIPPED: ...").

#![cfg(feature = "cuda")]

mod common;

use fastllm::data::{Data, DataType};
use fastllm::devices::cuda::{gpu, nccl, CudaDevice};
use fastllm::harness::CaseRng;
use fastllm::ops::OutputCopy;
use fastllm::parallel::Collective;
use fastllm::{BaseDevice, DataDict, Executor, FloatDict, IntDict};
use std::sync::Arc;
use std::time::Duration;

/// One rank: its device, an executor over it and its communicator (peer-to-peer enabled).
struct Rank {
    dev: Arc<CudaDevice>,
    exec: Executor,
    comm: nccl::NcclComm,
}

/// The ranks of a test and its turn on the GPUs (see [`common::gpus_turn`]), released after the
/// ranks are dropped.
struct Ranks {
    ranks: Vec<Rank>,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for Ranks {
    type Target = Vec<Rank>;
    fn deref(&self) -> &Vec<Rank> {
        &self.ranks
    }
}

/// Two ranks on cuda:0 and cuda:1 whose peer waits give up after `timeout`, or `None` after
/// saying why not.
fn two_ranks(timeout: Duration) -> Option<Ranks> {
    if let Err(e) = gpu::probe(1).and_then(|_| nccl::probe()) {
        common::skipped(&format!(
            "the peer-to-peer all-reduce needs 2 GPUs and NCCL: {e}"
        ));
        return None;
    }
    let turn = common::gpus_turn();
    let id = nccl::NcclId::new().unwrap();
    let joins: Vec<_> = (0..2)
        .map(|r| {
            std::thread::spawn(move || {
                let dev = Arc::new(CudaDevice::new(r as u32).unwrap());
                // the kernels load (a first load JITs them) before a peer waits on this rank
                dev.warm_up().unwrap();
                let comm = nccl::NcclComm::new(dev.gpu(), &id, r, 2).unwrap();
                let g = comm.enable_p2p(true, timeout).unwrap();
                let on = g.is_some();
                if let Some(g) = g {
                    dev.attach_group(g).unwrap();
                }
                let mut exec = Executor::new();
                exec.add_device(dev.clone());
                (on, Rank { dev, exec, comm })
            })
        })
        .collect();
    let ranks: Vec<(bool, Rank)> = joins.into_iter().map(|j| j.join().unwrap()).collect();
    if !ranks.iter().all(|r| r.0) {
        common::skipped("cuda:0 and cuda:1 cannot reach each other's memory");
        return None;
    }
    Some(Ranks {
        ranks: ranks.into_iter().map(|r| r.1).collect(),
        _turn: turn,
    })
}

fn host(d: &Data) -> Vec<f32> {
    d.to_owned_host().unwrap().to_f32_vec().unwrap()
}

/// `v` rounded to `dt` and back (what a reduction in that dtype leaves).
fn round_to(v: f32, dt: DataType) -> f32 {
    match dt {
        DataType::F16 => half::f16::from_f32(v).to_f32(),
        DataType::BF16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

#[test]
fn all_reduce_is_the_rank_ordered_sum_on_both_ranks() {
    let Some(ranks) = two_ranks(Duration::from_secs(60)) else {
        return;
    };
    let mut rng = CaseRng::new(7);
    // awkward counts, a decode row, and one f32 tensor larger than a slot (two launches)
    for (dt, n) in [
        (DataType::F32, 1usize),
        (DataType::F32, 4099),
        (DataType::F16, 3),
        (DataType::F16, 1 << 20),
        (DataType::BF16, 4096),
        (DataType::BF16, 100_003),
        (DataType::F32, 13_000_001),
    ] {
        let parts: Vec<Data> = (0..2).map(|_| rng.data(dt, &[n])).collect();
        let mut on: Vec<Data> = ranks
            .iter()
            .zip(&parts)
            .map(|(r, p)| r.dev.upload(p).unwrap())
            .collect();
        for (r, x) in ranks.iter().zip(on.iter_mut()) {
            r.comm.all_reduce_sum(x).unwrap(); // both launched before either is read
        }
        let (a, b) = (
            parts[0].to_f32_vec().unwrap(),
            parts[1].to_f32_vec().unwrap(),
        );
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| round_to(x + y, dt)).collect();
        for (r, x) in on.iter().enumerate() {
            assert_eq!(x.dtype(), dt);
            let got = host(x);
            let bad = got
                .iter()
                .zip(&want)
                .position(|(g, w)| g.to_bits() != w.to_bits());
            assert!(
                bad.is_none(),
                "{dt} n={n} rank {r}: element {bad:?} differs"
            );
        }
        for r in ranks.iter() {
            r.comm.health().unwrap();
        }
    }
}

/// `AllReduceAdd(x += Σ b)` on `exec`.
fn all_reduce_add(exec: &Executor, x: &mut Data, b: &Data) {
    let mut d = DataDict::new().with_mut("input0", x).with("input1", b);
    exec.run("AllReduceAdd", &mut d, &FloatDict::new(), &IntDict::new())
        .unwrap();
}

/// `RMSNorm` of `x` into a new tensor; with `b`, first `x += Σ b` (`all_reduce`).
fn rms(exec: &Executor, x: &mut Data, b: Option<&Data>, w: &Data, copy: OutputCopy) -> Data {
    let mut h = Data::empty(DataType::F32);
    common::cuda::rms_norm_into(exec, x, b, w, copy, &mut h);
    h
}

#[test]
fn fused_norm_equals_all_reduce_add_then_norm() {
    let Some(ranks) = two_ranks(Duration::from_secs(60)) else {
        return;
    };
    let mut rng = CaseRng::new(11);
    let mut checked = 0;
    // a decode row and a few rows (the low-latency kernels, rows split over blocks unevenly
    // too), batched rows (in f16 / bf16 the half low-latency kernels, in f32 the slot kernel, a
    // block per row), a prefill of more rows than blocks (in f16 / bf16 the slot kernel whose
    // blocks loop over rows; larger than a slot in f32: the plain all-reduce then the norm),
    // rows the float4 kernels do not take
    let shapes = [
        (1usize, 4096usize),
        (4, 4096),
        (3, 1000),
        (1, 4000),
        (2, 5120),
        (64, 4096),
        (300, 576),
        (3100, 4096),
        (5, 70),
    ];
    for dt in [DataType::F32, DataType::F16, DataType::BF16] {
        for (m, k) in shapes {
            let x0 = rng.data_range(DataType::F32, &[m, k], -4.0, 4.0);
            let parts: Vec<Data> = (0..2).map(|_| rng.data(dt, &[m, k])).collect();
            let w = rng.data(DataType::F32, &[k]);
            let (a, b) = (
                parts[0].to_f32_vec().unwrap(),
                parts[1].to_f32_vec().unwrap(),
            );
            let want_x: Vec<f32> = x0
                .to_f32_vec()
                .unwrap()
                .iter()
                .zip(a.iter().zip(&b))
                .map(|(x, (p, q))| x + round_to(p + q, dt))
                .collect();
            let copies: &[OutputCopy] = match (k % 32, m) {
                (0, 1) => &[OutputCopy::None, OutputCopy::Q8],
                (0, 16..) => &[OutputCopy::None, OutputCopy::F16],
                _ => &[OutputCopy::None],
            };
            for &copy in copies {
                let up = |r: &Rank, d: &Data| r.dev.upload(d).unwrap();
                let mut plain: Vec<(Data, Data)> = Vec::new();
                let mut fused: Vec<(Data, Data)> = Vec::new();
                let (bs, ws): (Vec<Data>, Vec<Data>) = ranks
                    .iter()
                    .zip(&parts)
                    .map(|(r, p)| (up(r, p), up(r, &w)))
                    .unzip();
                let mut x1: Vec<Data> = ranks.iter().map(|r| up(r, &x0)).collect();
                for (i, r) in ranks.iter().enumerate() {
                    all_reduce_add(&r.exec, &mut x1[i], &bs[i]);
                }
                for (i, r) in ranks.iter().enumerate() {
                    let h = rms(&r.exec, &mut x1[i], None, &ws[i], copy);
                    plain.push((x1[i].to_owned_host().unwrap(), h));
                }
                let mut x2: Vec<Data> = ranks.iter().map(|r| up(r, &x0)).collect();
                // both ranks launched before either is read
                let hs: Vec<Data> = (0..2)
                    .map(|i| rms(&ranks[i].exec, &mut x2[i], Some(&bs[i]), &ws[i], copy))
                    .collect();
                for (x, h) in x2.iter().zip(hs) {
                    fused.push((x.to_owned_host().unwrap(), h));
                }
                for r in 0..2 {
                    let what = format!("{dt} {m}x{k} {copy:?} rank {r}");
                    assert_eq!(host(&plain[r].0), want_x, "AllReduceAdd, {what}");
                    assert_eq!(host(&fused[r].0), want_x, "fused sum, {what}");
                    // a row split over blocks sums its squares in another order: ranks agree
                    // bit for bit, the plain norm within f32 rounding
                    assert_eq!(host(&fused[r].1), host(&fused[0].1), "ranks differ, {what}");
                    let worst = host(&fused[r].1)
                        .iter()
                        .zip(host(&plain[r].1))
                        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
                        .fold(0.0f32, f32::max);
                    assert!(worst < 1e-5, "fused norm off by {worst:e}, {what}");
                    ranks[r].comm.health().unwrap();
                }
                checked += 1;
            }
        }
    }
    eprintln!("{checked} fused all-reduce norm cases: sums equal the plain calls, norms agree across ranks");
}

/// `RMSNorm(x += Σ b → h)` on rank `r` with the half copy for a `dt` weight, `row_split` as
/// given (0: whole rows); launched, nothing read.
fn reduce_norm(r: &Rank, x: &mut Data, b: &Data, wn: &Data, dt: DataType, split: i32) -> Data {
    let mut h = Data::empty(DataType::F32);
    let copy = match dt {
        DataType::BF16 => OutputCopy::Bf16,
        _ => OutputCopy::F16,
    };
    common::cuda::rms_norm_split_into(&r.exec, (x, Some(b), wn), copy, &mut h, split);
    h
}

/// `y = Linear(h)` with `quant_act` on rank `r`.
fn product(r: &Rank, h: &Data, wl: &Data) -> fastllm::error::Result<Data> {
    let mut y = Data::empty(DataType::F32);
    let mut d = DataDict::new()
        .with("input", h)
        .with("weight", wl)
        .with_mut("output", &mut y);
    let ints = IntDict::new().with("quant_act", 1);
    r.exec.run("Linear", &mut d, &FloatDict::new(), &ints)?;
    drop(d);
    Ok(y)
}

/// Row-split fused norms (each rank adds and normalizes a share of the rows and sends the
/// peers its half rows): a chain of two, the first leaving the residual split, the second
/// gathering it, gives the products of the whole-row norms' copies and the residual bit for
/// bit, on both ranks, for f16 and bf16, rows split evenly and not. A split norm without the
/// half copy, and a product that cannot read a split norm's copy, are errors.
#[test]
fn row_split_norms_give_the_whole_row_norms_bits() {
    let Some(ranks) = two_ranks(Duration::from_secs(60)) else {
        return;
    };
    let mut rng = CaseRng::new(12);
    let up = |r: &Rank, d: &Data| r.dev.upload(d).unwrap();
    for dt in [DataType::F16, DataType::BF16] {
        for (m, k, n) in [
            (600usize, 576usize, 64usize),
            (2048, 4096, 48),
            (513, 1000, 40),
        ] {
            let x0 = rng.data_range(DataType::F32, &[m, k], -4.0, 4.0);
            let parts: Vec<Vec<Data>> = (0..2)
                .map(|_| (0..2).map(|_| rng.data(dt, &[m, k])).collect())
                .collect();
            let wn = rng.data(DataType::F32, &[k]);
            let wl = rng.data(dt, &[n, k]);
            // each op launched on both ranks before the next (a product may wait for its GPU)
            let run = |split: bool| -> Vec<[Vec<f32>; 3]> {
                let mut xs: Vec<Data> = ranks.iter().map(|r| up(r, &x0)).collect();
                let on = |j: usize, i: usize| up(&ranks[i], &parts[j][i]);
                let bs: Vec<[Data; 2]> = (0..2).map(|i| [on(0, i), on(1, i)]).collect();
                let ws: Vec<(Data, Data)> =
                    ranks.iter().map(|r| (up(r, &wn), up(r, &wl))).collect();
                let mut ys: Vec<Vec<Data>> = vec![Vec::new(), Vec::new()];
                for (j, mode) in [(0, 1), (1, 2)] {
                    let hs: Vec<Data> = (0..2)
                        .map(|i| {
                            let s = if split { mode } else { 0 };
                            reduce_norm(&ranks[i], &mut xs[i], &bs[i][j], &ws[i].0, dt, s)
                        })
                        .collect();
                    for i in 0..2 {
                        ys[i].push(product(&ranks[i], &hs[i], &ws[i].1).unwrap());
                    }
                }
                ys.iter()
                    .zip(&xs)
                    .map(|(y, x)| [host(x), host(&y[0]), host(&y[1])])
                    .collect()
            };
            let sum = |j: usize| {
                let (a, b) = (host(&parts[j][0]), host(&parts[j][1]));
                a.iter()
                    .zip(b)
                    .map(|(p, q)| round_to(p + q, dt))
                    .collect::<Vec<f32>>()
            };
            let (s1, s2) = (sum(0), sum(1));
            let want: Vec<f32> = host(&x0)
                .iter()
                .enumerate()
                .map(|(i, x)| x + s1[i] + s2[i])
                .collect();
            let before: Vec<u64> = ranks.iter().map(|r| r.dev.split_norms()).collect();
            let (whole, split) = (run(false), run(true));
            for (r, b) in ranks.iter().zip(before) {
                assert_eq!(
                    r.dev.split_norms(),
                    b + 2,
                    "{dt} {m}x{k}: the rows were not split"
                );
            }
            for r in 0..2 {
                let what = format!("{dt} {m}x{k} rank {r}");
                for (name, got) in [("whole-row", &whole[r][0]), ("row-split", &split[r][0])] {
                    let bad = got.iter().zip(&want).position(|(a, b)| a != b);
                    assert!(
                        bad.is_none(),
                        "{name} residual, {what}: first wrong value at row {:?}",
                        bad.map(|i| (i / k, i % k))
                    );
                }
                for j in 1..3 {
                    let bad = split[r][j]
                        .iter()
                        .zip(&whole[r][j])
                        .position(|(a, b)| a != b);
                    assert!(
                        bad.is_none(),
                        "product {j}, {what}: first difference at {bad:?}"
                    );
                }
                assert!(split[r] == split[0], "ranks differ, {what}");
                ranks[r].comm.health().unwrap();
            }
        }
    }
    // without the half copy the split cannot run (no kernel launched, so no peer waits)
    let (m, k) = (600, 576);
    for r in ranks.iter() {
        let mut x = up(r, &rng.data(DataType::F32, &[m, k]));
        let b = up(r, &rng.data(DataType::F16, &[m, k]));
        let wn = up(r, &rng.data(DataType::F32, &[k]));
        let mut h = Data::empty(DataType::F32);
        let mut d = DataDict::new()
            .with_mut("input", &mut x)
            .with("input1", &b)
            .with("weight", &wn)
            .with_mut("output", &mut h);
        let ints = IntDict::new().with("all_reduce", 1).with("row_split", 1);
        let e = r.exec.run("RMSNorm", &mut d, &FloatDict::new(), &ints);
        let e = e.unwrap_err().to_string();
        assert!(e.contains("row_split") && e.contains("half copy"), "{e}");
    }
    // a product of f32 weights cannot read the half copy a split norm left
    let x0 = rng.data(DataType::F32, &[m, k]);
    let mut xs: Vec<Data> = ranks.iter().map(|r| up(r, &x0)).collect();
    let mut keep = Vec::new();
    for (i, r) in ranks.iter().enumerate() {
        let b = up(r, &rng.data(DataType::F16, &[m, k]));
        let wn = up(r, &rng.data(DataType::F32, &[k]));
        let h = reduce_norm(r, &mut xs[i], &b, &wn, DataType::F16, 2);
        keep.push((b, wn, h));
    }
    for (r, (_, _, h)) in ranks.iter().zip(&keep) {
        let wl = up(r, &rng.data(DataType::F32, &[8, k]));
        let e = product(r, h, &wl).unwrap_err().to_string();
        assert!(e.contains("row-split norm"), "{e}");
        r.comm.health().unwrap();
    }
    assert_eq!(host(&xs[0]), host(&xs[1]), "gathered residuals differ");
    eprintln!("row-split norms: chains of two equal the whole-row norms; misuse refused");
}

/// On every rank: b = a·Wᵀ (one row, `push_peers` or not), then x += Σ b and RMSNorm(x) fused;
/// both ranks launched before either is read. Returns each rank's (b, x, norm).
fn row_product_then_fused_norm(
    ranks: &[Rank],
    (a, x0, w, wn): (&Data, &Data, &[Data], &Data),
    push: bool,
) -> Vec<[Vec<f32>; 3]> {
    let up = |r: &Rank, d: &Data| r.dev.upload(d).unwrap();
    let mut xs: Vec<Data> = ranks.iter().map(|r| up(r, x0)).collect();
    let mut out = Vec::new();
    for (i, r) in ranks.iter().enumerate() {
        let (ga, gw, gn) = (up(r, a), up(r, &w[i]), up(r, wn));
        let mut b = Data::empty(DataType::F32);
        let mut d = DataDict::new()
            .with("input", &ga)
            .with("weight", &gw)
            .with_mut("output", &mut b);
        let ints = IntDict::new()
            .with("quant_act", 1)
            .with("push_peers", push as i32);
        r.exec
            .run("Linear", &mut d, &FloatDict::new(), &ints)
            .unwrap();
        drop(d);
        let h = rms(&r.exec, &mut xs[i], Some(&b), &gn, OutputCopy::None);
        out.push((b, h));
    }
    out.into_iter()
        .zip(&xs)
        .map(|((b, h), x)| [host(&b), host(x), host(&h)])
        .collect()
}

/// A one-row product that pushes its outputs into the peer's low-latency slots as it writes
/// them (`push_peers`, f16 and bf16 weights, rows split over blocks evenly and not) gives the
/// bits of the same product whose fused norm pushes them.
#[test]
fn one_row_product_pushing_its_outputs_sums_as_the_norm_does() {
    let Some(ranks) = two_ranks(Duration::from_secs(60)) else {
        return;
    };
    let mut rng = CaseRng::new(29);
    for (wt, k, n) in [
        (DataType::F16, 2048usize, 4096usize),
        (DataType::BF16, 512, 1000),
        (DataType::F16, 1024, 5120),
    ] {
        let a = rng.data_range(DataType::F32, &[1, k], -2.0, 2.0);
        let x0 = rng.data_range(DataType::F32, &[1, n], -4.0, 4.0);
        let w: Vec<Data> = (0..2).map(|_| rng.data(wt, &[n, k])).collect();
        let wn = rng.data(DataType::F32, &[n]);
        let before: Vec<u64> = ranks.iter().map(|r| r.dev.peer_pushes()).collect();
        let plain = row_product_then_fused_norm(&ranks, (&a, &x0, &w, &wn), false);
        let pushed = row_product_then_fused_norm(&ranks, (&a, &x0, &w, &wn), true);
        for (r, rank) in ranks.iter().enumerate() {
            let what = format!("{wt} 1x{k}x{n} rank {r}");
            assert_eq!(rank.dev.peer_pushes(), before[r] + 1, "not pushed, {what}");
            assert_eq!(
                pushed[r], plain[r],
                "pushed outputs sum differently, {what}"
            );
            assert_eq!(pushed[r][1..], pushed[0][1..], "ranks differ, {what}");
            rank.comm.health().unwrap();
        }
    }
}

/// Reductions recorded in a step (an `AllReduceAdd` and a fused low-latency norm) replay with
/// fresh epochs, also after reductions launched op by op between replays and after a
/// recording that ran nothing: every one adds the ranks' sum once, and no wait times out.
#[test]
fn recorded_reductions_replay_between_launched_ones() {
    let Some(ranks) = two_ranks(Duration::from_secs(20)) else {
        return;
    };
    let n = 4096;
    let up = |r: &Rank, v: f32| {
        r.dev
            .upload(&Data::from_f32(&[1, n], &vec![v; n]).unwrap())
            .unwrap()
    };
    let mut xs: Vec<Data> = ranks.iter().map(|r| up(r, 0.0)).collect();
    // rank r adds r + 1: every reduction adds 3
    let bs: Vec<Data> = ranks
        .iter()
        .enumerate()
        .map(|(i, r)| up(r, i as f32 + 1.0))
        .collect();
    let ws: Vec<Data> = ranks.iter().map(|r| up(r, 1.0)).collect();
    let mut hs: Vec<Data> = (0..2).map(|_| Data::empty(DataType::F32)).collect();
    let step = |i: usize, x: &mut Data, h: &mut Data| {
        all_reduce_add(&ranks[i].exec, x, &bs[i]);
        let mut d = DataDict::new()
            .with_mut("input", x)
            .with("weight", &ws[i])
            .with("input1", &bs[i])
            .with_mut("output", h);
        let ints = IntDict::new().with("all_reduce", 1);
        let eps = FloatDict::new().with("eps", 1e-5);
        ranks[i].exec.run("RMSNorm", &mut d, &eps, &ints).unwrap();
    };
    let mut sums = 0;
    for i in 0..2 {
        step(i, &mut xs[i], &mut hs[i]); // sizes the output
    }
    sums += 2;
    let mut recs = Vec::new();
    for i in 0..2 {
        ranks[i].dev.begin_recording().unwrap();
        step(i, &mut xs[i], &mut hs[i]);
        recs.push(ranks[i].dev.end_recording().unwrap());
    }
    for round in 0..3 {
        for i in 0..2 {
            assert!(
                ranks[i].dev.replay(recs[i].as_ref()).unwrap(),
                "replay {round}"
            );
        }
        sums += 2;
        if round == 1 {
            for i in 0..2 {
                all_reduce_add(&ranks[i].exec, &mut xs[i], &bs[i]);
            }
            sums += 1;
        }
    }
    for (i, r) in ranks.iter().enumerate() {
        let got = host(&xs[i]);
        let want = 3.0 * sums as f32;
        assert!(
            got.iter().all(|&v| v == want),
            "rank {i}: {:?}, want {want}",
            &got[..4]
        );
        r.comm.health().unwrap();
    }
}

/// Rank 0 reduces alone (the flag handshake of the plain all-reduce, or the low-latency norm of
/// one row): it stops waiting after the timeout and reports rank 1.
#[test]
fn a_peer_that_never_comes_fails_the_step_after_the_timeout() {
    for low_latency in [false, true] {
        let Some(ranks) = two_ranks(Duration::from_secs(1)) else {
            return;
        };
        alone_times_out(&ranks, low_latency);
    }
}

fn alone_times_out(ranks: &[Rank], low_latency: bool) {
    let up = |v: &[f32]| {
        ranks[0]
            .dev
            .upload(&Data::from_f32(&[v.len()], v).unwrap())
            .unwrap()
    };
    let mut x = up(&[1.0; 4096]);
    let (b, w) = (up(&[1.0; 4096]), up(&[1.0; 4096]));
    let reduce = |x: &mut Data| {
        if low_latency {
            rms(&ranks[0].exec, x, Some(&b), &w, OutputCopy::None);
        } else {
            ranks[0].comm.all_reduce_sum(x).unwrap();
        }
    };
    let t = std::time::Instant::now();
    reduce(&mut x); // rank 1 never joins
    x.to_owned_host().unwrap();
    let waited = t.elapsed();
    let e = ranks[0].comm.health().unwrap_err().to_string();
    eprintln!("low latency {low_latency}, after {waited:?}: {e}");
    assert!(e.contains("rank 1 did not reach"), "{e}");
    assert!(waited < Duration::from_secs(30), "waited {waited:?}");
    // the broken group no longer waits
    reduce(&mut x);
    x.to_owned_host().unwrap();
    assert!(t.elapsed() < waited + Duration::from_secs(1));
    assert!(ranks[1].comm.health().is_ok());
}

#[test]
fn reductions_without_a_group_or_partial_are_errors() {
    let Some(dev) = common::cuda::gpu() else {
        return;
    };
    let exec = common::cuda::cuda_executor(&dev);
    let mut x = dev
        .upload(&Data::from_f32(&[4], &[1.0; 4]).unwrap())
        .unwrap();
    let b = dev
        .upload(&Data::from_f32(&[4], &[1.0; 4]).unwrap())
        .unwrap();
    let mut d = DataDict::new()
        .with_mut("input0", &mut x)
        .with("input1", &b);
    let e = exec
        .run("AllReduceAdd", &mut d, &FloatDict::new(), &IntDict::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a rank of a peer-to-peer group"), "{e}");
    drop(d);
    // the norm's reduction without the partial it would sum
    let w = dev
        .upload(&Data::from_f32(&[4], &[1.0; 4]).unwrap())
        .unwrap();
    let mut h = Data::empty(DataType::F32);
    let mut d = DataDict::new()
        .with_mut("input", &mut x)
        .with("weight", &w)
        .with_mut("output", &mut h);
    let e = exec
        .run(
            "RMSNorm",
            &mut d,
            &FloatDict::new(),
            &IntDict::new().with("all_reduce", 1),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("RMSNorm"), "{e}");
}
