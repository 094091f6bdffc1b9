//! Decode attention on AVX-512 (few query rows over a long KV cache): the keys are split into
//! chunks, and one task handles one query and one chunk for every head, so it reads its part of
//! the cache as one contiguous stream (all KV heads of a key row are adjacent): first the keys
//! (scores of every head), then the values in blocks of [`VB`] keys, with the outputs of a head
//! group held in registers over a block. Each task leaves a partial softmax (max, sum,
//! unnormalised output per head); [`super::merge_partials`] combines them. The cache is read in
//! place in any [`KvFormat`], converted 16 values at a time in registers. The caller checks the
//! CPU features and cache sizes.

use super::kv::avx512::{by_kv_formats, Load16, F32};
use super::{merge_partials, Inputs};
use crate::threads::Threads;
use crate::vecmath::avx512;
use std::arch::x86_64::*;

/// Fewest multiply-adds per task (below that, a task costs more to schedule than to run).
const MIN_TASK_WORK: usize = 64 * 1024;
/// Fewest keys per chunk, whatever the head sizes.
const MIN_CHUNK: usize = 8;
/// Most keys per chunk (bounds the per-task score buffer).
const MAX_CHUNK: usize = 1024;
/// Keys per block of the value pass (the outputs stay in registers over a block).
const VB: usize = 32;

/// Keys per chunk for `sq` queries over `skv` keys on `threads` threads, a key costing
/// `per_key` multiply-adds: at least four tasks per thread when the work allows it.
fn chunk_keys(sq: usize, skv: usize, threads: usize, per_key: usize) -> usize {
    let want = (4 * threads).div_ceil(sq.max(1)).max(1);
    let fewest = (MIN_TASK_WORK / per_key.max(1)).clamp(MIN_CHUNK, MAX_CHUNK);
    skv.div_ceil(want).clamp(fewest, MAX_CHUNK)
}

/// Decode attention over all rows (same contract as `attention_ref`); requires AVX-512 F/BW/VL
/// and caches of at least the rows `inp.p` implies.
pub(super) fn run(th: &Threads, inp: &Inputs, out: &mut [f32]) {
    by_kv_formats!(inp.k.format(), inp.v.format(), run_as(th, inp, out))
}

/// [`run`] with keys stored as `K` and values as `V`.
fn run_as<K: Load16, V: Load16>(th: &Threads, inp: &Inputs, out: &mut [f32]) {
    let p = inp.p;
    let kc = chunk_keys(p.sq, p.skv, th.n(), p.nh * (p.hd + p.hdv));
    let splits = p.skv.div_ceil(kc).max(1);
    // one partial = nh outputs of hdv, then nh maxima, then nh sums
    let part = p.nh * (p.hdv + 2);
    let mut partials = vec![0f32; p.sq * splits * part];
    th.for_row_chunks(&mut partials, part, 1, |r0, pc| {
        let mut scores = Vec::new();
        // a key row in f32, when a kv head serves several query heads
        let mut krow = vec![0f32; if inp.g > 1 { p.nkv * p.hd } else { 0 }];
        for (ri, pr) in pc.chunks_exact_mut(part).enumerate() {
            let (i, c) = ((r0 + ri) / splits, (r0 + ri) % splits);
            let vis = p.visible(i);
            let keys = vis.start.max(c * kc)..vis.end.min((c + 1) * kc);
            let keys = keys.start..keys.end.max(keys.start);
            let (ob, rest) = pr.split_at_mut(p.nh * p.hdv);
            let (ms, ls) = rest.split_at_mut(p.nh);
            // SAFETY: AVX-512 and the slice sizes are checked by the caller.
            unsafe { chunk::<K, V>(inp, i, keys, (&mut scores, &mut krow), ob, ms, ls) };
        }
    });
    merge_partials(out, &partials, (p.nh, p.hdv, splits), inp.heads.sinks);
}

/// Partial softmax of query `i` over `keys` for every head: unnormalised outputs `ob [nh][hdv]`,
/// maxima `ms [nh]`, sums `ls [nh]`. `krow` (`nkv · hd` values, or empty when each kv head
/// serves one query head) holds a key row converted once for the heads of its group.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn chunk<K: Load16, V: Load16>(
    inp: &Inputs,
    i: usize,
    keys: std::ops::Range<usize>,
    (scores, krow): (&mut Vec<f32>, &mut [f32]),
    ob: &mut [f32],
    ms: &mut [f32],
    ls: &mut [f32],
) {
    let (p, g) = (inp.p, inp.g);
    let (hd, nh) = (p.hd, p.nh);
    ob.fill(0.0);
    ms.fill(f32::NEG_INFINITY);
    ls.fill(0.0);
    let n = keys.len();
    if n == 0 {
        return;
    }
    scores.resize(nh * n, 0.0);
    let qi = inp.q.as_ptr().add(i * nh * hd);
    let rb = K::row_bytes(hd);
    for (jj, j) in keys.clone().enumerate() {
        let kr = inp.k.base().add(j * p.nkv * rb);
        // heads by kv head: no division in the loop (a 64-bit divide costs tens of cycles)
        if krow.len() == p.nkv * hd && !krow.is_empty() {
            to_f32::<K>(kr, p.nkv, hd, krow.as_mut_ptr());
            for kh in 0..p.nkv {
                let kf = krow.as_ptr().add(kh * hd).cast::<u8>();
                for h in kh * g..((kh + 1) * g).min(nh) {
                    let s = dot::<F32>(qi.add(h * hd), kf, hd);
                    *scores.get_unchecked_mut(h * n + jj) = s * p.scale;
                }
            }
        } else {
            for kh in 0..p.nkv {
                for h in kh * g..((kh + 1) * g).min(nh) {
                    let s = dot::<K>(qi.add(h * hd), kr.add(kh * rb), hd);
                    *scores.get_unchecked_mut(h * n + jj) = s * p.scale;
                }
            }
        }
    }
    for (h, (m, l)) in ms.iter_mut().zip(ls.iter_mut()).enumerate() {
        let sc = &mut scores[h * n..(h + 1) * n];
        let slope = inp.slope(h);
        if p.softcap > 0.0 || slope != 0.0 {
            for (j, s) in keys.clone().zip(sc.iter_mut()) {
                *s = p.adjust(*s, slope, i, j);
            }
        }
        *m = avx512::max(sc);
        *l = avx512::exp_sub_sum(sc, *m);
    }
    let vs = VScores {
        scores: &scores[..],
        n,
        first: keys.start,
    };
    for b in (0..n).step_by(VB) {
        add_values::<V>(inp, &vs, b..(b + VB).min(n), ob.as_mut_ptr());
    }
}

/// Probabilities `scores [nh][n]` of keys `first..first + n`.
struct VScores<'a> {
    scores: &'a [f32],
    n: usize,
    first: usize,
}

/// `ob[h] += Σ_jj s[h][jj] · v[key jj][h / g]` over the key block `jjs` (offsets from
/// `vs.first`), for every head: the outputs of up to four heads of one group stay in registers
/// over the block, so each value row segment is loaded once per group.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn add_values<V: Load16>(
    inp: &Inputs,
    vs: &VScores,
    jjs: std::ops::Range<usize>,
    ob: *mut f32,
) {
    let (p, g) = (inp.p, inp.g);
    let (hdv, rb) = (p.hdv, V::row_bytes(p.hdv));
    let vrow = p.nkv * rb;
    let v0 = inp.v.base().add(vs.first * vrow);
    for kh in 0..p.nkv {
        for t0 in (0..g).step_by(4) {
            let gn = (g - t0).min(4);
            let h0 = kh * g + t0;
            for c0 in (0..hdv).step_by(64) {
                let mut mk = [0 as __mmask16; 4];
                for (z, m) in mk.iter_mut().enumerate() {
                    *m = lanes(hdv.saturating_sub(c0 + 16 * z).min(16));
                }
                let mut a = [[_mm512_setzero_ps(); 4]; 4];
                for t in 0..gn {
                    for z in 0..4 {
                        a[t][z] =
                            _mm512_maskz_loadu_ps(mk[z], ob.add((h0 + t) * hdv + c0 + 16 * z));
                    }
                }
                for jj in jjs.clone() {
                    let vr = v0.add(jj * vrow + kh * rb);
                    let mut vz = [_mm512_setzero_ps(); 4];
                    for z in 0..4 {
                        vz[z] = V::load(vr, c0 + 16 * z, mk[z]);
                    }
                    for t in 0..4 {
                        if t < gn {
                            let pb = _mm512_set1_ps(*vs.scores.get_unchecked((h0 + t) * vs.n + jj));
                            for z in 0..4 {
                                a[t][z] = _mm512_fmadd_ps(pb, vz[z], a[t][z]);
                            }
                        }
                    }
                }
                for t in 0..gn {
                    for z in 0..4 {
                        _mm512_mask_storeu_ps(ob.add((h0 + t) * hdv + c0 + 16 * z), mk[z], a[t][z]);
                    }
                }
            }
        }
    }
}

/// Mask of the first `n` (≤ 16) lanes.
#[inline]
fn lanes(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// The `nkv` head rows of `hd` values at `row` (stored as `K`) into `out` as f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
#[inline]
unsafe fn to_f32<K: Load16>(row: *const u8, nkv: usize, hd: usize, out: *mut f32) {
    let rb = K::row_bytes(hd);
    for kh in 0..nkv {
        for d in (0..hd).step_by(16) {
            let m = lanes((hd - d).min(16));
            _mm512_mask_storeu_ps(out.add(kh * hd + d), m, K::load(row.add(kh * rb), d, m));
        }
    }
}

/// `a · b` over `n` values, `b` a head row stored as `K`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
#[inline]
unsafe fn dot<K: Load16>(a: *const f32, b: *const u8, n: usize) -> f32 {
    let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut d = 0;
    while d + 32 <= n {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(d)), K::load(b, d, 0xFFFF), s0);
        s1 = _mm512_fmadd_ps(
            _mm512_loadu_ps(a.add(d + 16)),
            K::load(b, d + 16, 0xFFFF),
            s1,
        );
        d += 32;
    }
    while d < n {
        let m = lanes((n - d).min(16));
        let x = _mm512_maskz_loadu_ps(m, a.add(d));
        s0 = _mm512_fmadd_ps(x, K::load(b, d, m), s0);
        d += 16;
    }
    _mm512_reduce_add_ps(_mm512_add_ps(s0, s1))
}
