//! Paged KV-cache kernels (vLLM style): a pool of fixed-size blocks of token slots shared by many
//! sequences, a block table per sequence, `paged_cache_write` (store new keys/values into their
//! slots) and `paged_attention` (causal attention of each sequence's new queries over its cached
//! keys, read through its block table). A scalar reference and a fast path (online softmax,
//! parallel over sequence × head).

use crate::threads::Threads;
use crate::vecmath;

/// Shapes and options shared by the attention kernels.
#[derive(Clone, Copy, Debug)]
pub struct PagedAttnParams {
    /// Query heads.
    pub n_heads: usize,
    /// KV heads (divides `n_heads`).
    pub n_kv_heads: usize,
    /// Head dim.
    pub head_dim: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Score scale.
    pub scale: f32,
    /// Soft-capping (0 = off).
    pub softcap: f32,
    /// Sliding window (0 = off).
    pub window: usize,
}

/// One sequence of a batch: its query rows `q_start..q_end` (the newest tokens, already written
/// to the cache), its total cached length `kv_len`, and its block table.
#[derive(Clone, Copy, Debug)]
pub struct PagedSeq<'a> {
    /// First query row.
    pub q_start: usize,
    /// One past the last query row.
    pub q_end: usize,
    /// Keys cached for this sequence (including the new ones).
    pub kv_len: usize,
    /// Block ids, in order.
    pub blocks: &'a [i32],
}

/// Copies row `i` of `src` (`row` floats each) into slot `slots[i]` of `cache`.
pub fn paged_cache_write(cache: &mut [f32], src: &[f32], slots: &[i32], row: usize) {
    for (i, &s) in slots.iter().enumerate() {
        let s = s as usize;
        cache[s * row..(s + 1) * row].copy_from_slice(&src[i * row..(i + 1) * row]);
    }
}

#[inline]
fn slot_of(seq: &PagedSeq, j: usize, bs: usize) -> usize {
    seq.blocks[j / bs] as usize * bs + j % bs
}

#[inline]
fn cap(score: f32, p: &PagedAttnParams) -> f32 {
    if p.softcap > 0.0 {
        p.softcap * (score / p.softcap).tanh()
    } else {
        score
    }
}

/// The visible key range `lo..=hi` of query row `i` (absolute position `pos`).
#[inline]
fn visible(pos: usize, p: &PagedAttnParams) -> (usize, usize) {
    let lo = if p.window > 0 {
        (pos + 1).saturating_sub(p.window)
    } else {
        0
    };
    (lo, pos)
}

/// Reference: for every sequence, query row and head, gathers the visible keys through the block
/// table and computes a plain max-subtracted softmax in f64.
pub fn paged_attention_ref(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: &[PagedSeq],
    alibi: Option<&[f32]>,
    p: &PagedAttnParams,
    out: &mut [f32],
) {
    let (nh, nkv, hd) = (p.n_heads, p.n_kv_heads, p.head_dim);
    let group = nh / nkv;
    for seq in seqs {
        let nq = seq.q_end - seq.q_start;
        for r in 0..nq {
            let row = seq.q_start + r;
            let pos = seq.kv_len - nq + r;
            let (lo, hi) = visible(pos, p);
            for h in 0..nh {
                let kh = h / group;
                let qv = &q[(row * nh + h) * hd..(row * nh + h + 1) * hd];
                let mut scores = Vec::with_capacity(hi + 1 - lo);
                for j in lo..=hi {
                    let s = slot_of(seq, j, p.block_size);
                    let kv = &k_cache[(s * nkv + kh) * hd..(s * nkv + kh + 1) * hd];
                    let dot: f64 = qv.iter().zip(kv).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let mut sc = cap(dot as f32 * p.scale, p) as f64;
                    if let Some(a) = alibi {
                        sc += a[h] as f64 * (j as f64 - pos as f64);
                    }
                    scores.push(sc);
                }
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = w.iter().sum();
                let o = &mut out[(row * nh + h) * hd..(row * nh + h + 1) * hd];
                for d in 0..hd {
                    let mut acc = 0f64;
                    for (t, j) in (lo..=hi).enumerate() {
                        let s = slot_of(seq, j, p.block_size);
                        acc += w[t] * v_cache[(s * nkv + kh) * hd + d] as f64;
                    }
                    o[d] = (acc / z) as f32;
                }
            }
        }
    }
}

/// Fast path: online softmax in one pass over the visible keys, parallel over (query row, head).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: &[PagedSeq],
    alibi: Option<&[f32]>,
    p: &PagedAttnParams,
    out: &mut [f32],
    threads: &Threads,
) {
    let (nh, nkv, hd) = (p.n_heads, p.n_kv_heads, p.head_dim);
    let group = nh / nkv;
    // row -> (sequence, position)
    let rows: usize = seqs.iter().map(|s| s.q_end - s.q_start).sum();
    let mut row_seq = Vec::with_capacity(rows);
    for (si, s) in seqs.iter().enumerate() {
        let nq = s.q_end - s.q_start;
        for r in 0..nq {
            row_seq.push((si, s.q_start + r, s.kv_len - nq + r));
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() && hd % 16 == 0 {
            // one task item per (row, KV head): the query heads of a GQA group share every key
            // and value load
            let items = row_seq.len() * nkv;
            let work_per_item: usize =
                seqs.iter().map(|s| s.kv_len).max().unwrap_or(1) * hd * 2 * group;
            let min_items = (65536 / work_per_item.max(1)).max(1);
            let out_ptr = out.as_mut_ptr() as usize;
            threads.for_rows(items, min_items, |range| {
                let mut scratch = GroupScratch::default();
                for it in range {
                    let (si, row, pos) = row_seq[it / nkv];
                    let kh = it % nkv;
                    let qs = &q[(row * nh + kh * group) * hd..(row * nh + (kh + 1) * group) * hd];
                    // SAFETY: the group's output heads are written by this item alone.
                    let o = unsafe {
                        std::slice::from_raw_parts_mut(
                            (out_ptr as *mut f32).add((row * nh + kh * group) * hd),
                            group * hd,
                        )
                    };
                    let job = GroupJob {
                        seq: &seqs[si],
                        pos,
                        kh,
                        first_head: kh * group,
                        group,
                    };
                    // SAFETY: AVX-512 checked above; hd % 16 == 0; slices sized above.
                    unsafe {
                        avx512::attend_group(qs, k_cache, v_cache, &job, alibi, p, &mut scratch, o)
                    };
                }
            });
            return;
        }
    }
    // one task item per (row, head): a single decode row still uses every thread
    let items = row_seq.len() * nh;
    let work_per_item: usize = seqs.iter().map(|s| s.kv_len).max().unwrap_or(1) * hd * 2;
    let min_items = (65536 / work_per_item.max(1)).max(1);
    let out_ptr = out.as_mut_ptr() as usize;
    threads.for_rows(items, min_items, |range| {
        let mut acc = vec![0f32; hd];
        let mut scores: Vec<f32> = Vec::new();
        for it in range {
            let (si, row, pos) = row_seq[it / nh];
            let h = it % nh;
            let seq = &seqs[si];
            let (lo, hi) = visible(pos, p);
            let kh = h / group;
            let qv = &q[(row * nh + h) * hd..(row * nh + h + 1) * hd];
            // pass 1: scores (SIMD dots), pass 2: one SIMD exp over all, pass 3: Σ w·v
            scores.clear();
            for j in lo..=hi {
                let base = (slot_of(seq, j, p.block_size) * nkv + kh) * hd;
                let mut sc = cap(vecmath::dot(qv, &k_cache[base..base + hd]) * p.scale, p);
                if let Some(a) = alibi {
                    sc += a[h] * (j as f32 - pos as f32);
                }
                scores.push(sc);
            }
            let m = vecmath::max(&scores);
            let z = if m == f32::NEG_INFINITY {
                0.0
            } else {
                vecmath::exp_sub_sum(&mut scores, m)
            };
            acc.iter_mut().for_each(|a| *a = 0.0);
            if z > 0.0 {
                for (j, &w) in (lo..=hi).zip(&scores) {
                    let base = (slot_of(seq, j, p.block_size) * nkv + kh) * hd;
                    vecmath::axpy(&mut acc, w, &v_cache[base..base + hd]);
                }
            }
            let inv = if z > 0.0 { 1.0 / z } else { 0.0 };
            // SAFETY: each (row, head) output slice is written by exactly one task.
            let o = unsafe {
                std::slice::from_raw_parts_mut((out_ptr as *mut f32).add((row * nh + h) * hd), hd)
            };
            for (o, a) in o.iter_mut().zip(&acc) {
                *o = a * inv;
            }
        }
    });
}

/// One (query row, KV head) item of the grouped fast path.
#[cfg(target_arch = "x86_64")]
struct GroupJob<'a> {
    /// The row's sequence.
    seq: &'a PagedSeq<'a>,
    /// Absolute position of the query row.
    pos: usize,
    /// KV head.
    kh: usize,
    /// First query head of the group.
    first_head: usize,
    /// Query heads per KV head.
    group: usize,
}

/// Per-task buffers of the grouped fast path.
#[cfg(target_arch = "x86_64")]
#[derive(Default)]
struct GroupScratch {
    /// Scores, `group` rows of the visible length.
    scores: Vec<f32>,
    /// Offset of each visible key (and value) row in the cache.
    bases: Vec<usize>,
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The grouped AVX-512 attention of one (query row, KV head) item; only called after
    //! `simd::has_avx512()` with `head_dim % 16 == 0`.
    use super::{cap, slot_of, visible, GroupJob, GroupScratch, PagedAttnParams};
    use crate::vecmath;
    use std::arch::x86_64::*;

    /// Query heads dotted with one key load at a time.
    const QB: usize = 4;
    /// 16-value chunks of a value row accumulated in registers at a time.
    const VB: usize = 4;

    /// Attention of the `job.group` query heads in `qs` (`group × hd`) over the sequence's
    /// visible keys of KV head `job.kh`, written to `out` (`group × hd`): scores with each key
    /// loaded once for up to [`QB`] heads, one exp pass per head, values accumulated with each
    /// value row loaded once per block of heads.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn attend_group(
        qs: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        job: &GroupJob,
        alibi: Option<&[f32]>,
        p: &PagedAttnParams,
        s: &mut GroupScratch,
        out: &mut [f32],
    ) {
        let (nkv, hd, g) = (p.n_kv_heads, p.head_dim, job.group);
        let (lo, hi) = visible(job.pos, p);
        let len = hi + 1 - lo;
        s.bases.clear();
        s.bases
            .extend((lo..=hi).map(|j| (slot_of(job.seq, j, p.block_size) * nkv + job.kh) * hd));
        s.scores.clear();
        s.scores.resize(g * len, 0.0);
        let mut h0 = 0;
        while h0 < g {
            let nb = (g - h0).min(QB);
            let (q, k, sc) = (
                qs.as_ptr().add(h0 * hd),
                k_cache.as_ptr(),
                &mut s.scores[h0 * len..],
            );
            match nb {
                1 => scores_block::<1>(q, k, &s.bases, hd, p.scale, sc),
                2 => scores_block::<2>(q, k, &s.bases, hd, p.scale, sc),
                3 => scores_block::<3>(q, k, &s.bases, hd, p.scale, sc),
                _ => scores_block::<4>(q, k, &s.bases, hd, p.scale, sc),
            }
            h0 += nb;
        }
        if p.softcap > 0.0 || alibi.is_some() {
            for (b, row) in s.scores.chunks_exact_mut(len).enumerate() {
                let h = job.first_head + b;
                for (j, v) in (lo..=hi).zip(row.iter_mut()) {
                    *v = cap(*v, p);
                    if let Some(al) = alibi {
                        *v += al[h] * (j as f32 - job.pos as f32);
                    }
                }
            }
        }
        let mut inv = [0f32; 64];
        let mut invs = Vec::new();
        let inv: &mut [f32] = if g <= inv.len() {
            &mut inv[..g]
        } else {
            invs.resize(g, 0.0);
            &mut invs
        };
        for (b, iv) in inv.iter_mut().enumerate() {
            let row = &mut s.scores[b * len..(b + 1) * len];
            let m = vecmath::max(row);
            let z = if m == f32::NEG_INFINITY {
                0.0
            } else {
                vecmath::exp_sub_sum(row, m)
            };
            if z > 0.0 {
                *iv = 1.0 / z;
            } else {
                row.iter_mut().for_each(|w| *w = 0.0);
            }
        }
        let chunks = hd / 16;
        let mut h0 = 0;
        while h0 < g {
            let nb = (g - h0).min(QB);
            let mut c0 = 0;
            while c0 < chunks {
                let nc = (chunks - c0).min(VB);
                let w = &s.scores[h0 * len..];
                let v = v_cache.as_ptr().add(16 * c0);
                let o = out.as_mut_ptr().add(h0 * hd + 16 * c0);
                let iv = &inv[h0..];
                macro_rules! by_chunks {
                    ($nb:literal) => {
                        match nc {
                            1 => values_block::<$nb, 1>(w, len, v, &s.bases, iv, hd, o),
                            2 => values_block::<$nb, 2>(w, len, v, &s.bases, iv, hd, o),
                            3 => values_block::<$nb, 3>(w, len, v, &s.bases, iv, hd, o),
                            _ => values_block::<$nb, 4>(w, len, v, &s.bases, iv, hd, o),
                        }
                    };
                }
                match nb {
                    1 => by_chunks!(1),
                    2 => by_chunks!(2),
                    3 => by_chunks!(3),
                    _ => by_chunks!(4),
                }
                c0 += nc;
            }
            h0 += nb;
        }
    }

    /// `scores[b·len + t] = scale · q_b · k(t)` for `NB` query rows `hd` apart at `q` and the
    /// keys at `k + bases[t]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn scores_block<const NB: usize>(
        q: *const f32,
        k: *const f32,
        bases: &[usize],
        hd: usize,
        scale: f32,
        scores: &mut [f32],
    ) {
        let len = bases.len();
        for (t, &b) in bases.iter().enumerate() {
            let kp = k.add(b);
            let mut acc = [_mm512_setzero_ps(); NB];
            for c in 0..hd / 16 {
                let kv = _mm512_loadu_ps(kp.add(16 * c));
                for (i, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(i * hd + 16 * c)), kv, *a);
                }
            }
            for (i, a) in acc.iter().enumerate() {
                *scores.get_unchecked_mut(i * len + t) = _mm512_reduce_add_ps(*a) * scale;
            }
        }
    }

    /// `out[b·hd + 16c ..] = inv[b] · Σ_t w[b·len + t] · v(t)[16c ..]` for `NB` heads and `NC`
    /// chunks of 16 values, the value rows at `v + bases[t]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn values_block<const NB: usize, const NC: usize>(
        w: &[f32],
        len: usize,
        v: *const f32,
        bases: &[usize],
        inv: &[f32],
        hd: usize,
        out: *mut f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NC]; NB];
        for (t, &b) in bases.iter().enumerate() {
            let vp = v.add(b);
            let mut vv = [_mm512_setzero_ps(); NC];
            for (c, x) in vv.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(vp.add(16 * c));
            }
            for (i, ai) in acc.iter_mut().enumerate() {
                let wt = _mm512_set1_ps(*w.get_unchecked(i * len + t));
                for (a, x) in ai.iter_mut().zip(vv.iter()) {
                    *a = _mm512_fmadd_ps(wt, *x, *a);
                }
            }
        }
        for (i, ai) in acc.iter().enumerate() {
            let s = _mm512_set1_ps(inv[i]);
            for (c, a) in ai.iter().enumerate() {
                _mm512_storeu_ps(out.add(i * hd + 16 * c), _mm512_mul_ps(*a, s));
            }
        }
    }
}
