//! Token sampling over logits rows, defined so that a GPU kernel (`kernels/sample.cu`) computes
//! bit-identical results: same logits + same parameters + same random word → same token.
//!
//! The definition (per row of `n` logits `l`, parameters `T`, `top_k`, `top_p`, `min_p` and a
//! random 64-bit word `R`):
//! 1. A row with NaN or +Inf, or whose every logit is -Inf, gives `-1` (an error for the caller).
//! 2. `T == 0`: the argmax in the order below (largest logit, lowest index on ties).
//! 3. Order: every element gets the 64-bit key `K = (fkey(l) << 32) | !index`, where [`fkey`]
//!    maps the f32 total order onto u32; larger `K` first. Keys are distinct.
//! 4. Weights: `m` = the largest logit, `x = (l - m) · (1 / T)` (IEEE f32; 0 where `l = m`),
//!    `w = exp_det(x)` with
//!    [`exp_det`] (only IEEE f32 add/mul, so the GPU reproduces it bit for bit) and the integer
//!    weight `q = floor(w · 2^40)` (0 when `x < -28`). Integer sums are exact in any order. The
//!    largest logit has `w = 1`, `q = 2^40`. Elements with `q = 0` (probability below about
//!    1e-12 of the best token's) are never picked.
//! 5. Candidates: elements with `q > 0`. Top-k: the `top_k` first candidates in key order (all
//!    when `top_k` is 0 or at least their number). `Qk` = the sum of their weights.
//! 6. Min-p: of those, keep the ones with `w >= min_p` (a set filter).
//! 7. Top-p (`top_p < 1`): `P = ceil(Qk · floor(top_p · 2^32) / 2^32)`; the nucleus is the
//!    shortest key-order prefix of the kept elements whose weights sum to at least `P` (all kept
//!    elements when they sum to less).
//! 8. Pick: `t = floor(R · Qn / 2^64)` with `Qn` the nucleus' weight sum; the token is the first
//!    nucleus element in key order at which the running weight sum exceeds `t`.
//!
//! So the probability of a token is its weight over the nucleus' total, as with floating-point
//! probabilities, up to the 2^-40 weight resolution and the polynomial exp (relative error
//! below 1e-6).
//!
//! Penalties ([`apply_penalties_ref`]): for each (token, count) of a row's history, CTRL-style
//! repetition penalty (`l / r` when `l > 0`, else `l · r`), then `l -= presence + frequency ·
//! count`, in f32 with the same rounding as the GPU kernel.
//!
//! The references sort every candidate; the fast paths use weighted quickselect and split rows
//! over the thread pool. Must not know about tensors.

use crate::threads::Threads;
use std::cmp::Ordering;

/// Parameters of one row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowParams {
    /// Temperature (0 = argmax).
    pub temperature: f32,
    /// Keep the k first candidates (0 = off).
    pub top_k: u32,
    /// Nucleus mass in (0, 1] (1 = off).
    pub top_p: f32,
    /// Drop tokens with weight below `min_p` × the best token's (0 = off).
    pub min_p: f32,
    /// The random word of this pick.
    pub random: u64,
}

/// Weights are `floor(w · 2^WEIGHT_BITS)`.
pub const WEIGHT_BITS: u32 = 40;
/// Scaled logits below this have weight 0 (`e^-28 < 2^-40`).
pub const MIN_X: f32 = -28.0;

/// The f32 total order as u32 (ascending): negative values bit-flipped, positive ones with the
/// sign bit set.
#[inline]
pub fn fkey(v: f32) -> u32 {
    let u = v.to_bits();
    if u >> 31 != 0 {
        !u
    } else {
        u | 0x8000_0000
    }
}

/// The order key of element `i` with logit `v` (larger first).
#[inline]
pub fn order_key(v: f32, i: usize) -> u64 {
    ((fkey(v) as u64) << 32) | (!(i as u32)) as u64
}

/// `e^x` for `x <= 0`, with f32 multiplies and adds only (each rounded on its own, no fused
/// multiply-add), so that the GPU kernel computes the same bits. Relative error below 1e-6.
#[inline]
pub fn exp_det(x: f32) -> f32 {
    let log2e = f32::from_bits(0x3fb8_aa3b);
    let ln2_hi = f32::from_bits(0x3f31_8000);
    let ln2_lo = f32::from_bits(0xb95e_8083);
    let n = (x * log2e + 0.5).floor();
    let r = (x - n * ln2_hi) - n * ln2_lo;
    let mut p = f32::from_bits(0x3ab6_0b61); // 1/720
    p = p * r + f32::from_bits(0x3c08_8889); // 1/120
    p = p * r + f32::from_bits(0x3d2a_aaab); // 1/24
    p = p * r + f32::from_bits(0x3e2a_aaab); // 1/6
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    p * f32::from_bits((((n as i32) + 127) as u32) << 23)
}

/// `(w, q)` of a logit `v` given the row maximum `m` and `inv_t = 1 / temperature` (f32).
#[inline]
pub fn weight(v: f32, m: f32, inv_t: f32) -> (f32, u64) {
    let d = v - m;
    let x = if d == 0.0 { 0.0 } else { d * inv_t };
    if x.is_nan() || x < MIN_X {
        return (0.0, 0);
    }
    let w = exp_det(x);
    (w, (w * (1u64 << WEIGHT_BITS) as f32) as u64)
}

/// `ceil(a · b / 2^32)`.
#[inline]
pub fn mul_shr32_ceil(a: u64, b: u64) -> u64 {
    ((a as u128 * b as u128 + 0xffff_ffff) >> 32) as u64
}

/// `floor(a · b / 2^64)`.
#[inline]
pub fn mul_hi(a: u64, b: u64) -> u64 {
    ((a as u128 * b as u128) >> 64) as u64
}

/// The nucleus threshold `P` of step 7 for a top-k mass `qk`.
#[inline]
pub fn top_p_threshold(qk: u64, top_p: f32) -> u64 {
    let pq = (top_p as f64 * 4294967296.0) as u64;
    mul_shr32_ceil(qk, pq)
}

/// NaN/+Inf check and the maximum; `None` for a row that gives `-1`.
fn row_max(x: &[f32]) -> Option<f32> {
    let mut mk = 0u32;
    for &v in x {
        if v.is_nan() || v == f32::INFINITY {
            return None;
        }
        mk = mk.max(fkey(v));
    }
    let m = if mk >> 31 != 0 {
        f32::from_bits(mk & 0x7fff_ffff)
    } else {
        f32::from_bits(!mk)
    };
    if x.is_empty() || m == f32::NEG_INFINITY {
        None
    } else {
        Some(m)
    }
}

/// The argmax in key order (largest logit by the total order, lowest index on ties).
fn argmax_key(x: &[f32]) -> i32 {
    let mut best = 0usize;
    for (i, &v) in x.iter().enumerate() {
        if fkey(v) > fkey(x[best]) {
            best = i;
        }
    }
    best as i32
}

#[derive(Clone, Copy)]
struct Cand {
    k: u64,
    q: u64,
    w: f32,
}

fn desc(a: &Cand, b: &Cand) -> Ordering {
    b.k.cmp(&a.k)
}

/// Reference: one row, every candidate sorted.
pub fn sample_row_ref(x: &[f32], p: &RowParams) -> i32 {
    let Some(m) = row_max(x) else {
        return -1;
    };
    if !(p.temperature >= 0.0 && p.temperature.is_finite()) {
        return -1;
    }
    if p.temperature == 0.0 {
        return argmax_key(x);
    }
    let inv_t = 1.0 / p.temperature;
    let mut c: Vec<Cand> = Vec::new();
    for (i, &v) in x.iter().enumerate() {
        let (w, q) = weight(v, m, inv_t);
        if q > 0 {
            c.push(Cand {
                k: order_key(v, i),
                q,
                w,
            });
        }
    }
    c.sort_by(desc);
    if p.top_k > 0 && (p.top_k as usize) < c.len() {
        c.truncate(p.top_k as usize);
    }
    let qk: u64 = c.iter().map(|e| e.q).sum();
    c.retain(|e| e.w >= p.min_p);
    if p.top_p < 1.0 {
        let pt = top_p_threshold(qk, p.top_p);
        let mut cum = 0u64;
        let mut cut = c.len();
        for (j, e) in c.iter().enumerate() {
            cum += e.q;
            if cum >= pt {
                cut = j + 1;
                break;
            }
        }
        c.truncate(cut);
    }
    let qn: u64 = c.iter().map(|e| e.q).sum();
    let t = mul_hi(p.random, qn);
    let mut cum = 0u64;
    for e in &c {
        cum += e.q;
        if cum > t {
            return !(e.k as u32) as i32;
        }
    }
    // unreachable with qn > 0 (the best token always stays); the last one otherwise
    c.last().map(|e| !(e.k as u32) as i32).unwrap_or(-1)
}

/// Reference over rows of `n`: `params[r]` for row `r`, ids (or -1) into `out`.
pub fn sample_ref(x: &[f32], n: usize, params: &[RowParams], out: &mut [i32]) {
    if n == 0 {
        return;
    }
    for ((xr, p), o) in x.chunks_exact(n).zip(params).zip(out.iter_mut()) {
        *o = sample_row_ref(xr, p);
    }
}

/// Position in key order (within `v`, which it partly reorders) of the element at which the
/// running weight sum first exceeds `t`; `v[..pos]` then holds the elements before it. `None`
/// when the total is at most `t`. Weighted quickselect: expected linear time.
fn first_exceeding(v: &mut [Cand], t: u64) -> Option<usize> {
    let (mut lo, mut hi, mut acc) = (0usize, v.len(), 0u64);
    while hi - lo > 32 {
        let mid = lo + (hi - lo) / 2;
        v[lo..hi].select_nth_unstable_by(mid - lo, desc);
        let s: u64 = v[lo..mid].iter().map(|e| e.q).sum();
        if acc + s > t {
            hi = mid;
        } else {
            acc += s;
            lo = mid;
        }
    }
    v[lo..hi].sort_unstable_by(desc);
    for (j, e) in v[lo..hi].iter().enumerate() {
        acc += e.q;
        if acc > t {
            return Some(lo + j);
        }
    }
    None
}

/// Fast path of one row (same result as [`sample_row_ref`]).
pub fn sample_row(x: &[f32], p: &RowParams) -> i32 {
    let Some(m) = row_max(x) else {
        return -1;
    };
    if !(p.temperature >= 0.0 && p.temperature.is_finite()) {
        return -1;
    }
    if p.temperature == 0.0 {
        return argmax_key(x);
    }
    let inv_t = 1.0 / p.temperature;
    let mut c: Vec<Cand> = Vec::with_capacity(x.len().min(4096));
    for (i, &v) in x.iter().enumerate() {
        let (w, q) = weight(v, m, inv_t);
        if q > 0 {
            c.push(Cand {
                k: order_key(v, i),
                q,
                w,
            });
        }
    }
    let mut set: &mut [Cand] = &mut c;
    if p.top_k > 0 && (p.top_k as usize) < set.len() {
        let k = p.top_k as usize;
        set.select_nth_unstable_by(k - 1, desc);
        set = &mut set[..k];
    }
    let qk: u64 = set.iter().map(|e| e.q).sum();
    // min-p: move the kept ones to the front (a NaN min_p keeps none, as in the reference)
    let mut kept = 0;
    for i in 0..set.len() {
        if set[i].w >= p.min_p {
            set.swap(i, kept);
            kept += 1;
        }
    }
    let mut nucleus = &mut set[..kept];
    if p.top_p < 1.0 {
        let pt = top_p_threshold(qk, p.top_p);
        if let Some(pos) = first_exceeding(nucleus, pt.saturating_sub(1)) {
            nucleus = &mut nucleus[..=pos];
        }
    }
    let qn: u64 = nucleus.iter().map(|e| e.q).sum();
    let t = mul_hi(p.random, qn);
    match first_exceeding(nucleus, t) {
        Some(pos) => !(nucleus[pos].k as u32) as i32,
        None => -1,
    }
}

/// Fast path over rows (same contract as [`sample_ref`]): rows split over the thread pool.
pub fn sample(th: &Threads, x: &[f32], n: usize, params: &[RowParams], out: &mut [i32]) {
    if n == 0 {
        return;
    }
    th.for_row_chunks(out, 1, 1, |r0, oc| {
        for (j, o) in oc.iter_mut().enumerate() {
            let r = r0 + j;
            if let (Some(xr), Some(p)) = (x.get(r * n..(r + 1) * n), params.get(r)) {
                *o = sample_row(xr, p);
            }
        }
    });
}

/// One penalized logit (the arithmetic the GPU kernel repeats).
#[inline]
pub fn penalize(v: f32, count: u32, repetition: f32, presence: f32, frequency: f32) -> f32 {
    let mut v = v;
    if repetition != 1.0 {
        v = if v > 0.0 {
            v / repetition
        } else {
            v * repetition
        };
    }
    v - (presence + frequency * count as f32)
}

/// Applies penalties in place to rows of `n`: row `r` has `m` (token, count) slots at
/// `tokens[r·m..]` / `counts[r·m..]` (tokens < 0 or ≥ n are padding and skipped; a token must
/// appear at most once per row) and parameters `params[3r..3r+3]` = (repetition, presence,
/// frequency).
pub fn apply_penalties_ref(
    x: &mut [f32],
    n: usize,
    tokens: &[i32],
    counts: &[i32],
    m: usize,
    params: &[f32],
) {
    if n == 0 {
        return;
    }
    for (r, xr) in x.chunks_exact_mut(n).enumerate() {
        let (Some(p), Some(toks), Some(cnts)) = (
            params.get(3 * r..3 * r + 3),
            tokens.get(r * m..(r + 1) * m),
            counts.get(r * m..(r + 1) * m),
        ) else {
            return;
        };
        for (&t, &c) in toks.iter().zip(cnts) {
            if t < 0 || t as usize >= n {
                continue;
            }
            let v = &mut xr[t as usize];
            *v = penalize(*v, c.max(0) as u32, p[0], p[1], p[2]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::vals;

    fn params(t: f32, k: u32, tp: f32, mp: f32, r: u64) -> RowParams {
        RowParams {
            temperature: t,
            top_k: k,
            top_p: tp,
            min_p: mp,
            random: r,
        }
    }

    fn rnd(i: u64) -> u64 {
        let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[test]
    fn exp_det_is_close_to_exp() {
        let mut x = 0.0f32;
        while x > -28.0 {
            let (a, b) = (exp_det(x) as f64, (x as f64).exp());
            assert!(((a - b) / b).abs() < 1e-6, "{x}: {a} vs {b}");
            x -= 0.0137;
        }
        assert_eq!(exp_det(0.0), 1.0);
        assert_eq!(weight(3.0, 3.0, 1.0 / 0.7), (1.0, 1u64 << 40));
        // a subnormal temperature: only the maximum keeps a weight
        let it = 1.0 / 1e-40f32;
        assert_eq!(weight(3.0, 3.0, it), (1.0, 1u64 << 40));
        assert_eq!(weight(2.0, 3.0, it).1, 0);
    }

    #[test]
    fn fast_matches_reference() {
        let th = Threads::new(2).unwrap();
        for (rows, n, lo, hi) in [
            (3usize, 7usize, -1.0f32, 1.0f32),
            (4, 1000, -4.0, 4.0),
            (2, 49153, -10.0, 10.0),
            (5, 300, -60.0, 60.0),
        ] {
            let mut x = vals(rows * n, n as u64, lo, hi);
            if n > 10 {
                // ties and -Inf
                x[3] = x[5];
                x[7] = f32::NEG_INFINITY;
            }
            for (t, k, tp, mp) in [
                (1.0, 0, 1.0, 0.0),
                (0.7, 0, 0.9, 0.0),
                (1.3, 40, 1.0, 0.0),
                (0.5, 5, 0.5, 0.05),
                (2.0, 0, 0.3, 0.2),
                (0.0, 0, 1.0, 0.0),
                (1.0, 1, 1.0, 0.0),
                (1.0, 0, 1.0, f32::NAN),
                (1e-40, 0, 0.9, 0.0),
                (1.0, 3, f32::NAN, 0.0),
            ] {
                for s in 0..6u64 {
                    let ps: Vec<RowParams> = (0..rows as u64)
                        .map(|r| params(t, k, tp, mp, rnd(s * 100 + r)))
                        .collect();
                    let (mut a, mut b) = (vec![0; rows], vec![0; rows]);
                    sample_ref(&x, n, &ps, &mut a);
                    sample(&th, &x, n, &ps, &mut b);
                    assert_eq!(a, b, "{rows}x{n} t={t} k={k} p={tp} min_p={mp} s={s}");
                    if !mp.is_nan() {
                        assert!(a.iter().all(|&v| v >= 0 && (v as usize) < n));
                    }
                }
            }
        }
    }

    #[test]
    fn filters_and_bad_rows() {
        let x = [0.0f32, 5.0, 4.9, 1.0, 5.0];
        // temperature 0 and top-k 1: the first maximum
        for r in 0..20 {
            assert_eq!(sample_row_ref(&x, &params(0.0, 0, 1.0, 0.0, rnd(r))), 1);
            assert_eq!(sample_row_ref(&x, &params(1.0, 1, 1.0, 0.0, rnd(r))), 1);
        }
        // min_p 0.5: only 1, 2, 4 are within e^-0.69 of the best
        let mut seen = [0usize; 5];
        for r in 0..400 {
            let t = sample_row_ref(&x, &params(1.0, 0, 1.0, 0.5, rnd(r)));
            seen[t as usize] += 1;
        }
        assert_eq!(seen[0] + seen[3], 0);
        assert!(seen[1] > 50 && seen[2] > 50 && seen[4] > 50, "{seen:?}");
        // top-p 0.3 keeps only the best (its probability alone is above 0.3)
        for r in 0..50 {
            assert_eq!(
                sample_row_ref(&x, &params(1.0, 0, 0.3, 0.0, rnd(r))),
                1,
                "r={r}"
            );
        }
        assert_eq!(
            sample_row_ref(&[1.0, f32::NAN], &params(1.0, 0, 1.0, 0.0, 1)),
            -1
        );
        assert_eq!(
            sample_row_ref(&[1.0, f32::INFINITY], &params(0.0, 0, 1.0, 0.0, 1)),
            -1
        );
        assert_eq!(
            sample_row_ref(&[f32::NEG_INFINITY; 3], &params(1.0, 0, 1.0, 0.0, 1)),
            -1
        );
        assert_eq!(
            sample_row(&[f32::NEG_INFINITY; 3], &params(1.0, 0, 1.0, 0.0, 1)),
            -1
        );
        assert_eq!(sample_row(&x, &params(-1.0, 0, 1.0, 0.0, 1)), -1);
    }

    #[test]
    fn frequencies_follow_softmax() {
        let x = [1.0f32, 0.0, -1.0, 0.5];
        let t = 0.8f32;
        let z: f64 = x.iter().map(|&v| ((v / t) as f64).exp()).sum();
        let mut seen = [0usize; 4];
        let n = 20000;
        for r in 0..n {
            seen[sample_row_ref(&x, &params(t, 0, 1.0, 0.0, rnd(r))) as usize] += 1;
        }
        for i in 0..4 {
            let p = ((x[i] / t) as f64).exp() / z;
            let f = seen[i] as f64 / n as f64;
            assert!((f - p).abs() < 0.015, "token {i}: {f} vs {p}");
        }
    }

    /// A sequential model of the GPU kernel's selection (kernels/sample.cu: coarse buckets of
    /// the scaled logit, then 8-bit radix passes over the key inside the chosen bucket, early
    /// exit on a single element): it must pick what the definition picks.
    mod gpu_model {
        use super::super::*;
        use super::{params, rnd};
        use crate::testutil::vals;

        fn bucket(x: f32) -> usize {
            ((-x * 73.142_86_f32).floor() as usize).min(2047)
        }

        #[allow(clippy::too_many_arguments)]
        fn select(
            x: &[f32],
            m: f32,
            t: f32,
            kmin: u64,
            minp: f32,
            count: bool,
            thr: u64,
        ) -> Option<u64> {
            let elems: Vec<(u64, f32, f32, u64)> = x
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let d = v - m;
                    let xx = if d == 0.0 { 0.0 } else { d * t };
                    let (w, q) = weight(v, m, t);
                    (order_key(v, i), xx, w, q)
                })
                .filter(|&(k, _, w, q)| k >= kmin && q != 0 && w >= minp)
                .collect();
            let wt = |q: u64| if count { 1 } else { q };
            let mut hist = vec![(0u64, 0u32); 2048];
            for &(_, xx, _, q) in &elems {
                let b = bucket(xx);
                hist[b].0 += wt(q);
                hist[b].1 += 1;
            }
            let mut above = 0u64;
            let b = (0..2048).find(|&b| {
                if above + hist[b].0 > thr {
                    true
                } else {
                    above += hist[b].0;
                    false
                }
            })?;
            let mut single = hist[b].1 == 1;
            let mut prefix = 0u64;
            let mut shift = 64;
            while !single && shift > 0 {
                shift -= 8;
                let hmask = if shift == 56 { 0 } else { !0u64 << (shift + 8) };
                let mut h = vec![(0u64, 0u32); 256];
                for &(k, xx, _, q) in &elems {
                    if k & hmask == prefix && bucket(xx) == b {
                        let d = 255 - ((k >> shift) & 255) as usize;
                        h[d].0 += wt(q);
                        h[d].1 += 1;
                    }
                }
                let d = (0..256).find(|&d| {
                    if above + h[d].0 > thr {
                        true
                    } else {
                        above += h[d].0;
                        false
                    }
                })?;
                single = h[d].1 == 1;
                prefix |= ((255 - d) as u64) << shift;
            }
            if shift == 0 {
                return Some(prefix);
            }
            let pmask = if shift == 64 { 0 } else { !0u64 << shift };
            elems
                .iter()
                .find(|&&(k, xx, _, _)| k & pmask == prefix && bucket(xx) == b)
                .map(|e| e.0)
        }

        fn sample_row_gpu(x: &[f32], p: &RowParams) -> i32 {
            let Some(m) = row_max(x) else {
                return -1;
            };
            if !(p.temperature >= 0.0 && p.temperature.is_finite()) {
                return -1;
            }
            if p.temperature == 0.0 {
                return argmax_key(x);
            }
            let t = 1.0 / p.temperature; // `select` and `sum` take 1 / temperature
            let sum = |kmin: u64, minp: f32| -> u64 {
                x.iter()
                    .enumerate()
                    .filter(|&(i, &v)| order_key(v, i) >= kmin)
                    .map(|(_, &v)| weight(v, m, t))
                    .filter(|&(w, q)| q != 0 && w >= minp)
                    .map(|(_, q)| q)
                    .sum()
            };
            let mut kk = 0;
            if p.top_k >= 1 {
                if let Some(k) = select(x, m, t, 0, 0.0, true, p.top_k as u64 - 1) {
                    kk = k;
                }
            }
            let mut kp = kk;
            if p.top_p < 1.0 {
                let pt = top_p_threshold(sum(kk, 0.0), p.top_p);
                if let Some(k) = select(x, m, t, kk, p.min_p, false, pt.saturating_sub(1)) {
                    kp = k;
                }
            }
            let target = mul_hi(p.random, sum(kp, p.min_p));
            match select(x, m, t, kp, p.min_p, false, target) {
                Some(k) => !(k as u32) as i32,
                None => -1,
            }
        }

        #[test]
        fn gpu_algorithm_matches_reference() {
            for (rows, n, lo, hi) in [
                (6usize, 7usize, -1.0f32, 1.0f32),
                (6, 1000, -4.0, 4.0),
                (3, 20000, -1.0, 1.0),
                (6, 300, -60.0, 60.0),
            ] {
                let mut x = vals(rows * n, n as u64 + 3, lo, hi);
                if n > 10 {
                    for (j, e) in x[n..2 * n].iter_mut().enumerate() {
                        *e = (j % 3) as f32 * 0.25; // ties
                    }
                    x[2 * n..3 * n].fill(0.5); // all equal
                    x[7] = f32::NEG_INFINITY;
                }
                for (t, k, tp, mp) in [
                    (1.0, 0, 1.0, 0.0),
                    (0.7, 0, 0.9, 0.0),
                    (1.3, 40, 1.0, 0.0),
                    (0.5, 5, 0.5, 0.05),
                    (2.0, 0, 0.3, 0.2),
                    (1.0, 1, 1.0, 0.0),
                    (0.8, 1000, 0.95, 0.01),
                ] {
                    for s in 0..4u64 {
                        for r in 0..rows {
                            let p = params(t, k, tp, mp, rnd(s * 977 + r as u64));
                            let row = &x[r * n..(r + 1) * n];
                            assert_eq!(
                                sample_row_gpu(row, &p),
                                sample_row_ref(row, &p),
                                "{rows}x{n} row {r} t={t} k={k} p={tp} min_p={mp} s={s}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn penalties() {
        let mut x = vec![2.0f32, -2.0, 1.0, 3.0, 0.5, 0.5];
        apply_penalties_ref(
            &mut x,
            3,
            &[0, 1, -1, 2, 7, 0],
            &[1, 2, 0, 3, 1, 1],
            3,
            &[2.0, 0.5, 0.25, 1.0, 0.0, 1.0],
        );
        assert_eq!(x, vec![0.25, -5.0, 1.0, 2.0, 0.5, -2.5]);
    }
}
