//! Paged KV-cache kernels (vLLM style): a pool of fixed-size blocks of token slots shared by many
//! sequences, a block table per sequence, `paged_cache_write` (store new keys/values into their
//! slots) and `paged_attention` (causal attention of each sequence's new queries over its cached
//! keys, read through its block table). A scalar reference and a fast path (online softmax,
//! parallel over sequence × head), with the per-head terms of [`HeadTerms`] (ALiBi slopes,
//! attention sinks). The pool stores its values in any
//! [`KvFormat`] (f32, f16, q8_0; see `attention::kv`), read in place.

use crate::attention::kv::{store_rows, KvFormat, KvRows};
use crate::attention::{inv_denominator, HeadTerms};
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

/// Encodes row `i` of `src` (`nkv` head rows of `hd` floats each) into slot `slots[i]` of
/// `cache`, a pool of slots of `nkv` head rows in `fmt` (bytes).
pub fn paged_cache_write_kv(
    fmt: KvFormat,
    cache: &mut [u8],
    src: &[f32],
    slots: &[i32],
    (nkv, hd): (usize, usize),
) {
    let (row, rb) = (nkv * hd, nkv * fmt.row_bytes(hd));
    for (i, &s) in slots.iter().enumerate() {
        let s = s as usize;
        let (Some(x), Some(dst)) = (
            src.get(i * row..(i + 1) * row),
            cache.get_mut(s * rb..(s + 1) * rb),
        ) else {
            continue;
        };
        store_rows(fmt, x, hd, dst);
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
/// table and computes a plain max-subtracted softmax in f64 (over the cache converted to f32).
pub fn paged_attention_ref(
    q: &[f32],
    k_cache: KvRows,
    v_cache: KvRows,
    seqs: &[PagedSeq],
    heads: HeadTerms,
    p: &PagedAttnParams,
    out: &mut [f32],
) {
    let (nh, nkv, hd) = (p.n_heads, p.n_kv_heads, p.head_dim);
    let (k_cache, v_cache) = (&k_cache.to_f32(hd)[..], &v_cache.to_f32(hd)[..]);
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
                    sc += heads.slope(h) as f64 * (j as f64 - pos as f64);
                    scores.push(sc);
                }
                let sink = heads.sink(h).map(|s| s as f64);
                let m = scores
                    .iter()
                    .cloned()
                    .fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = w.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
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
    k_cache: KvRows,
    v_cache: KvRows,
    seqs: &[PagedSeq],
    heads: HeadTerms,
    p: &PagedAttnParams,
    out: &mut [f32],
    threads: &Threads,
) {
    let rows = query_rows(seqs);
    let call = Call {
        q,
        kv: (k_cache, v_cache),
        seqs,
        rows: &rows,
        heads,
        p,
    };
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() && p.head_dim.is_multiple_of(16) {
            return by_group_avx512(&call, out, threads);
        }
    }
    by_head(&call, out, threads)
}

/// The arguments of one [`paged_attention`] call, with its query rows laid out by
/// [`query_rows`].
struct Call<'a> {
    q: &'a [f32],
    kv: (KvRows<'a>, KvRows<'a>),
    seqs: &'a [PagedSeq<'a>],
    rows: &'a [(usize, usize, usize)],
    heads: HeadTerms<'a>,
    p: &'a PagedAttnParams,
}

/// (sequence, query row, absolute position) of every query row of `seqs`, in order.
fn query_rows(seqs: &[PagedSeq]) -> Vec<(usize, usize, usize)> {
    let mut rows = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        let nq = s.q_end - s.q_start;
        for r in 0..nq {
            rows.push((si, s.q_start + r, s.kv_len - nq + r));
        }
    }
    rows
}

/// Task items of at least this much work (multiply-adds) each.
const MIN_ITEM_WORK: usize = 65536;

/// The fewest task items of `work_per_item` each worth a task of its own.
fn min_items(work_per_item: usize) -> usize {
    (MIN_ITEM_WORK / work_per_item.max(1)).max(1)
}

/// The AVX-512 fast path: one task item per (row, KV head), so the query heads of a GQA group
/// share every key and value load. Needs AVX-512 and `head_dim % 16 == 0`.
#[cfg(target_arch = "x86_64")]
fn by_group_avx512(c: &Call, out: &mut [f32], threads: &Threads) {
    let p = c.p;
    let (nh, nkv, hd) = (p.n_heads, p.n_kv_heads, p.head_dim);
    let group = nh / nkv;
    let items = c.rows.len() * nkv;
    let max_len = c.seqs.iter().map(|s| s.kv_len).max().unwrap_or(1);
    let min_items = min_items(max_len * hd * 2 * group);
    let out_ptr = out.as_mut_ptr() as usize;
    threads.for_rows(items, min_items, |range| {
        let mut scratch = GroupScratch::default();
        for it in range {
            let (si, row, pos) = c.rows[it / nkv];
            let kh = it % nkv;
            let heads = (row * nh + kh * group) * hd..(row * nh + (kh + 1) * group) * hd;
            // SAFETY: the group's output heads are written by this item alone.
            let o = unsafe {
                std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(heads.start), group * hd)
            };
            let job = GroupJob {
                seq: &c.seqs[si],
                pos,
                kh,
                first_head: kh * group,
                group,
            };
            // SAFETY: the caller checked AVX-512 and hd % 16 == 0; slices sized above.
            unsafe { avx512::attend_group(&c.q[heads], c.kv, &job, c.heads, p, &mut scratch, o) };
        }
    });
}

/// The portable fast path: one task item per (row, head), so a single decode row still uses
/// every thread.
fn by_head(c: &Call, out: &mut [f32], threads: &Threads) {
    let (nh, hd) = (c.p.n_heads, c.p.head_dim);
    let items = c.rows.len() * nh;
    let max_len = c.seqs.iter().map(|s| s.kv_len).max().unwrap_or(1);
    let min_items = min_items(max_len * hd * 2);
    let out_ptr = out.as_mut_ptr() as usize;
    threads.for_rows(items, min_items, |range| {
        let mut s = HeadScratch {
            acc: vec![0f32; hd],
            scores: Vec::new(),
            buf: vec![0f32; hd],
        };
        for it in range {
            let (si, row, pos) = c.rows[it / nh];
            let h = it % nh;
            // SAFETY: each (row, head) output slice is written by exactly one task.
            let o = unsafe {
                std::slice::from_raw_parts_mut((out_ptr as *mut f32).add((row * nh + h) * hd), hd)
            };
            attend_head(c, (si, row, pos), h, &mut s, o);
        }
    });
}

/// Per-task buffers of [`by_head`].
struct HeadScratch {
    /// The weighted sum of values.
    acc: Vec<f32>,
    /// Scores, then weights, of the visible keys.
    scores: Vec<f32>,
    /// A cache row converted to f32.
    buf: Vec<f32>,
}

/// Attention of query head `h` of query row `row` (sequence `si`, absolute position `pos`)
/// into `o`: pass 1 the scores (SIMD dots), pass 2 one SIMD exp over all, pass 3 Σ w·v.
fn attend_head(
    c: &Call,
    (si, row, pos): (usize, usize, usize),
    h: usize,
    s: &mut HeadScratch,
    o: &mut [f32],
) {
    let p = c.p;
    let (nh, nkv, hd) = (p.n_heads, p.n_kv_heads, p.head_dim);
    let (k_cache, v_cache) = &c.kv;
    let seq = &c.seqs[si];
    let (lo, hi) = visible(pos, p);
    let kh = h / (nh / nkv);
    let qv = &c.q[(row * nh + h) * hd..(row * nh + h + 1) * hd];
    s.scores.clear();
    for j in lo..=hi {
        let r = slot_of(seq, j, p.block_size) * nkv + kh;
        let mut sc = cap(
            vecmath::dot(qv, row_of(k_cache, r, hd, &mut s.buf)) * p.scale,
            p,
        );
        sc += c.heads.slope(h) * (j as f32 - pos as f32);
        s.scores.push(sc);
    }
    let m = vecmath::max(&s.scores);
    let z = if m == f32::NEG_INFINITY {
        0.0
    } else {
        vecmath::exp_sub_sum(&mut s.scores, m)
    };
    s.acc.iter_mut().for_each(|a| *a = 0.0);
    if z > 0.0 {
        for (j, &w) in (lo..=hi).zip(&s.scores) {
            let r = slot_of(seq, j, p.block_size) * nkv + kh;
            vecmath::axpy(&mut s.acc, w, row_of(v_cache, r, hd, &mut s.buf));
        }
    }
    let inv = inv_denominator(z, m, c.heads.sink(h));
    for (o, a) in o.iter_mut().zip(&s.acc) {
        *o = a * inv;
    }
}

/// Head row `r` of `hd` values: borrowed from an f32 cache, else converted into `buf`.
fn row_of<'a>(rows: &KvRows<'a>, r: usize, hd: usize, buf: &'a mut [f32]) -> &'a [f32] {
    if let Some(x) = rows.f32_row(r, hd) {
        return x;
    }
    rows.load_row(r, buf);
    buf
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
    /// Head row index (slot · nkv + KV head) of each visible key (and value) in the cache.
    bases: Vec<usize>,
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The grouped AVX-512 attention of one (query row, KV head) item; only called after
    //! `simd::has_avx512()` with `head_dim % 16 == 0`.
    use super::{cap, slot_of, visible, GroupJob, GroupScratch, PagedAttnParams};
    use crate::attention::kv::avx512::{by_kv_formats, Load16};
    use crate::attention::kv::KvRows;
    use crate::attention::{inv_denominator, HeadTerms};
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
    pub(super) unsafe fn attend_group(
        qs: &[f32],
        (k, v): (KvRows, KvRows),
        job: &GroupJob,
        heads: HeadTerms,
        p: &PagedAttnParams,
        s: &mut GroupScratch,
        out: &mut [f32],
    ) {
        let kv = (k.base(), v.base());
        by_kv_formats!(
            k.format(),
            v.format(),
            group_as(qs, kv, job, heads, p, s, out)
        )
    }

    /// [`attend_group`] with keys stored as `K` and values as `V` (caches at `kb`, `vb`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group_as<K: Load16, V: Load16>(
        qs: &[f32],
        (kb, vb): (*const u8, *const u8),
        job: &GroupJob,
        heads: HeadTerms,
        p: &PagedAttnParams,
        s: &mut GroupScratch,
        out: &mut [f32],
    ) {
        let (nkv, g) = (p.n_kv_heads, job.group);
        let (lo, hi) = visible(job.pos, p);
        let len = hi + 1 - lo;
        s.bases.clear();
        s.bases
            .extend((lo..=hi).map(|j| slot_of(job.seq, j, p.block_size) * nkv + job.kh));
        s.scores.clear();
        s.scores.resize(g * len, 0.0);
        group_scores::<K>(qs, kb, s, g, p);
        if p.softcap > 0.0 || heads.alibi.is_some() {
            for (b, row) in s.scores.chunks_exact_mut(len).enumerate() {
                let slope = heads.slope(job.first_head + b);
                for (j, v) in (lo..=hi).zip(row.iter_mut()) {
                    *v = cap(*v, p) + slope * (j as f32 - job.pos as f32);
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
        softmax_rows(&mut s.scores, len, job, heads, inv);
        group_values::<V>(vb, s, (g, len), p.head_dim, inv, out);
    }

    /// The scores of the `g` query heads in `qs` over the keys `s.bases` of the cache at `kb`
    /// into `s.scores` (`g` rows), each key loaded once for up to [`QB`] heads.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group_scores<K: Load16>(
        qs: &[f32],
        kb: *const u8,
        s: &mut GroupScratch,
        g: usize,
        p: &PagedAttnParams,
    ) {
        let (hd, len) = (p.head_dim, s.bases.len());
        let mut h0 = 0;
        while h0 < g {
            let nb = (g - h0).min(QB);
            let (q, sc) = (qs.as_ptr().add(h0 * hd), &mut s.scores[h0 * len..]);
            match nb {
                1 => scores_block::<K, 1>(q, kb, &s.bases, hd, p.scale, sc),
                2 => scores_block::<K, 2>(q, kb, &s.bases, hd, p.scale, sc),
                3 => scores_block::<K, 3>(q, kb, &s.bases, hd, p.scale, sc),
                _ => scores_block::<K, 4>(q, kb, &s.bases, hd, p.scale, sc),
            }
            h0 += nb;
        }
    }

    /// Turns each row of `len` scores into weights `e^(s − max)` in place, with the inverse of
    /// its softmax denominator (sink included) in `inv`; a row with no visible key becomes zeros.
    fn softmax_rows(
        scores: &mut [f32],
        len: usize,
        job: &GroupJob,
        heads: HeadTerms,
        inv: &mut [f32],
    ) {
        for (b, iv) in inv.iter_mut().enumerate() {
            let row = &mut scores[b * len..(b + 1) * len];
            let m = vecmath::max(row);
            let z = if m == f32::NEG_INFINITY {
                0.0
            } else {
                vecmath::exp_sub_sum(row, m)
            };
            if z > 0.0 {
                *iv = inv_denominator(z, m, heads.sink(job.first_head + b));
            } else {
                row.iter_mut().for_each(|w| *w = 0.0);
            }
        }
    }

    /// `out` (`g` heads of `hd`) = `inv` · Σ weights · values of the cache at `vb`, each value
    /// row loaded once per block of up to [`QB`] heads and [`VB`] chunks of 16 values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group_values<V: Load16>(
        vb: *const u8,
        s: &GroupScratch,
        (g, len): (usize, usize),
        hd: usize,
        inv: &[f32],
        out: &mut [f32],
    ) {
        let chunks = hd / 16;
        let mut h0 = 0;
        while h0 < g {
            let nb = (g - h0).min(QB);
            let mut c0 = 0;
            while c0 < chunks {
                let nc = (chunks - c0).min(VB);
                let w = &s.scores[h0 * len..];
                let v = (vb, 16 * c0);
                let o = out.as_mut_ptr().add(h0 * hd + 16 * c0);
                let iv = &inv[h0..];
                macro_rules! by_chunks {
                    ($nb:literal) => {
                        match nc {
                            1 => values_block::<V, $nb, 1>(w, len, v, &s.bases, iv, hd, o),
                            2 => values_block::<V, $nb, 2>(w, len, v, &s.bases, iv, hd, o),
                            3 => values_block::<V, $nb, 3>(w, len, v, &s.bases, iv, hd, o),
                            _ => values_block::<V, $nb, 4>(w, len, v, &s.bases, iv, hd, o),
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
    /// key head rows `bases[t]` of the cache at `k` (stored as `K`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn scores_block<K: Load16, const NB: usize>(
        q: *const f32,
        k: *const u8,
        bases: &[usize],
        hd: usize,
        scale: f32,
        scores: &mut [f32],
    ) {
        let (len, rb) = (bases.len(), K::row_bytes(hd));
        for (t, &b) in bases.iter().enumerate() {
            let kp = k.add(b * rb);
            let mut acc = [_mm512_setzero_ps(); NB];
            for c in 0..hd / 16 {
                let kv = K::load(kp, 16 * c, 0xFFFF);
                for (i, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(i * hd + 16 * c)), kv, *a);
                }
            }
            for (i, a) in acc.iter().enumerate() {
                *scores.get_unchecked_mut(i * len + t) = _mm512_reduce_add_ps(*a) * scale;
            }
        }
    }

    /// `out[b·hd + 16c ..] = inv[b] · Σ_t w[b·len + t] · v(t)[c0 + 16c ..]` for `NB` heads and
    /// `NC` chunks of 16 values from value `c0`, `v(t)` the head row `bases[t]` of the cache at
    /// `v.0` (stored as `V`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn values_block<V: Load16, const NB: usize, const NC: usize>(
        w: &[f32],
        len: usize,
        (v, c0): (*const u8, usize),
        bases: &[usize],
        inv: &[f32],
        hd: usize,
        out: *mut f32,
    ) {
        let rb = V::row_bytes(hd);
        let mut acc = [[_mm512_setzero_ps(); NC]; NB];
        for (t, &b) in bases.iter().enumerate() {
            let vp = v.add(b * rb);
            let mut vv = [_mm512_setzero_ps(); NC];
            for (c, x) in vv.iter_mut().enumerate() {
                *x = V::load(vp, c0 + 16 * c, 0xFFFF);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{nmse, vals};

    /// A pool of `slots` slots written through `paged_cache_write_kv` in `fmt`.
    fn pool(fmt: KvFormat, x: &[f32], slots: usize, (nkv, hd): (usize, usize)) -> Vec<u8> {
        let mut b = vec![0u8; slots * nkv * fmt.row_bytes(hd)];
        let ids: Vec<i32> = (0..slots as i32).rev().collect();
        paged_cache_write_kv(fmt, &mut b, x, &ids, (nkv, hd));
        b
    }

    fn rows_of(fmt: KvFormat, b: &[u8]) -> (Vec<f32>, Vec<half::f16>) {
        match fmt {
            KvFormat::F32 => (
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                vec![],
            ),
            _ => (
                vec![],
                b.chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
        }
    }

    fn kv<'a>(fmt: KvFormat, b: &'a [u8], f: &'a [f32], h: &'a [half::f16]) -> KvRows<'a> {
        match fmt {
            KvFormat::F32 => KvRows::F32(f),
            KvFormat::F16 => KvRows::F16(h),
            KvFormat::Q8_0 => KvRows::Q8_0(b),
        }
    }

    /// One shape of the test: two sequences (a prefill of 9 rows and a decode row) over a pool
    /// of 16 blocks, random keys, values and queries.
    struct Case {
        p: PagedAttnParams,
        slots: usize,
        kx: Vec<f32>,
        vx: Vec<f32>,
        q: Vec<f32>,
        tables: [Vec<i32>; 2],
    }

    impl Case {
        fn new(nh: usize, nkv: usize, hd: usize, bs: usize) -> Case {
            let slots = 16 * bs;
            Case {
                p: PagedAttnParams {
                    n_heads: nh,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    block_size: bs,
                    scale: 1.0 / (hd as f32).sqrt(),
                    softcap: 0.0,
                    window: 0,
                },
                slots,
                kx: vals(slots * nkv * hd, 2, -2.0, 2.0),
                vx: vals(slots * nkv * hd, 3, -1.0, 1.0),
                q: vals(10 * nh * hd, 1, -2.0, 2.0),
                tables: [(0..8).collect(), (8..16).rev().collect()],
            }
        }

        fn seqs(&self) -> [PagedSeq<'_>; 2] {
            let bs = self.p.block_size;
            [
                PagedSeq {
                    q_start: 0,
                    q_end: 9,
                    kv_len: 5 * bs + 3,
                    blocks: &self.tables[0],
                },
                PagedSeq {
                    q_start: 9,
                    q_end: 10,
                    kv_len: 7 * bs + 1,
                    blocks: &self.tables[1],
                },
            ]
        }

        /// The reference over the pool in f32 and the fast path over the pool in `fmt`, with
        /// `heads` and the parameters `p`.
        fn run(
            &self,
            fmt: KvFormat,
            heads: HeadTerms,
            p: &PagedAttnParams,
            th: &Threads,
        ) -> (Vec<f32>, Vec<f32>) {
            let (nkv, hd) = (p.n_kv_heads, p.head_dim);
            let seqs = self.seqs();
            let (kb, vb) = (
                pool(fmt, &self.kx, self.slots, (nkv, hd)),
                pool(fmt, &self.vx, self.slots, (nkv, hd)),
            );
            let ((kf, kh), (vf, vh)) = (rows_of(fmt, &kb), rows_of(fmt, &vb));
            let (k, v) = (kv(fmt, &kb, &kf, &kh), kv(fmt, &vb, &vf, &vh));
            let (mut r, mut f) = (vec![0f32; self.q.len()], vec![1f32; self.q.len()]);
            paged_attention_ref(&self.q, k, v, &seqs, heads, p, &mut r);
            paged_attention(&self.q, k, v, &seqs, heads, p, &mut f, th);
            (r, f)
        }
    }

    #[test]
    fn fast_path_reads_every_format_like_the_reference() {
        let th = Threads::new(2).unwrap();
        // (heads, kv heads, head dim, block size)
        for (nh, nkv, hd, bs) in [
            (9, 3, 64, 16),
            (4, 1, 80, 7),
            (8, 8, 128, 16),
            (6, 2, 40, 5),
        ] {
            let c = Case::new(nh, nkv, hd, bs);
            let h0 = HeadTerms::default();
            // attention sinks (with a window and soft-capping)
            let sinks: Vec<f32> = (0..nh).map(|h| [0.5, -2.0, 30.0][h % 3]).collect();
            let hs = HeadTerms {
                alibi: None,
                sinks: Some(&sinks),
            };
            let pw = PagedAttnParams {
                window: 2 * bs + 1,
                softcap: 4.0,
                ..c.p
            };
            let (exact, _) = c.run(KvFormat::F32, h0, &c.p, &th);
            for fmt in [KvFormat::F32, KvFormat::F16, KvFormat::Q8_0] {
                let (r, f) = c.run(fmt, h0, &c.p, &th);
                let e = nmse(&f, &r);
                assert!(e < 1e-11, "{fmt:?} {nh} {nkv} {hd} {bs}: {e:e}");
                let (r, f) = c.run(fmt, hs, &pw, &th);
                let e = nmse(&f, &r);
                assert!(e < 1e-11, "sinks {fmt:?} {nh} {nkv} {hd} {bs}: {e:e}");
                // the cache holds the values to the format's precision
                let (_, x) = c.run(fmt, h0, &c.p, &th);
                let e = nmse(&x, &exact);
                assert!(e < 1e-3, "{fmt:?} vs f32 {nh} {nkv} {hd} {bs}: {e:e}");
            }
        }
    }
}
