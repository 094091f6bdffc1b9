//! Scaled dot-product attention over packed `q [sq, nh, hd]`, `k [skv, nkv, hd]`,
//! `v [skv, nkv, hdv]` → `out [sq, nh, hdv]`: causal masking, sliding window, grouped-query heads
//! (head `h` reads KV head `h / (nh / nkv)`), ALiBi slopes and tanh soft-capping of the scores.
//! Query `i` sits at position `p = skv - sq + i`. A query that sees no key gets zeros.
//!
//! The reference computes scores in f32, softmax and the weighted sum in f64, one (query, head)
//! at a time. The fast path computes a row of scores with SIMD dot products, a vectorised
//! max-subtracted softmax, then accumulates `v` rows with FMA; (query, head) rows are split over
//! the thread pool. Sizes are validated by the caller; this module never reads out of bounds
//! (short slices produce fewer rows) and must not know about tensors.

use crate::threads::Threads;
use crate::vecmath as vm;

/// Shapes and options of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    /// Query positions.
    pub sq: usize,
    /// Key/value positions.
    pub skv: usize,
    /// Query heads.
    pub nh: usize,
    /// Key/value heads (divides `nh`).
    pub nkv: usize,
    /// Query/key head size.
    pub hd: usize,
    /// Value head size.
    pub hdv: usize,
    /// Score scale.
    pub scale: f32,
    /// Soft-cap of the scores (0 = off).
    pub softcap: f32,
    /// Causal masking.
    pub causal: bool,
    /// Sliding window (0 = off).
    pub window: usize,
}

impl AttnParams {
    /// Range of keys query `i` may see (empty when none).
    pub fn visible(&self, i: usize) -> std::ops::Range<usize> {
        let p = self.skv as isize - self.sq as isize + i as isize;
        let end = if self.causal {
            (p + 1).clamp(0, self.skv as isize) as usize
        } else {
            self.skv
        };
        let start = if self.window > 0 {
            (p - self.window as isize + 1).clamp(0, end as isize) as usize
        } else {
            0
        };
        start..end
    }

    fn kv_head(&self, h: usize) -> usize {
        h / (self.nh / self.nkv.max(1)).max(1)
    }

    fn pos(&self, i: usize) -> f32 {
        (self.skv as isize - self.sq as isize + i as isize) as f32
    }

    /// Applies soft-capping and the ALiBi bias to a scaled score of key `j` for query `i`.
    fn adjust(&self, s: f32, slope: f32, i: usize, j: usize) -> f32 {
        let s = if self.softcap > 0.0 {
            self.softcap * (s / self.softcap).tanh()
        } else {
            s
        };
        s + slope * (j as f32 - self.pos(i))
    }
}

/// Reference attention.
pub fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    slopes: Option<&[f32]>,
    out: &mut [f32],
    p: &AttnParams,
) {
    let (hd, hdv) = (p.hd, p.hdv);
    if hdv == 0 || p.nh == 0 {
        return;
    }
    let mut scores = vec![0f32; p.skv];
    for (r, o) in out.chunks_exact_mut(hdv).enumerate().take(p.sq * p.nh) {
        let (i, h) = (r / p.nh, r % p.nh);
        let kh = p.kv_head(h);
        let slope = slopes.and_then(|s| s.get(h).copied()).unwrap_or(0.0);
        let Some(qr) = q.get(r * hd..(r + 1) * hd) else {
            return;
        };
        let vis = p.visible(i);
        let mut m = f32::NEG_INFINITY;
        for j in vis.clone() {
            let Some(kr) = k.get((j * p.nkv + kh) * hd..(j * p.nkv + kh + 1) * hd) else {
                return;
            };
            let mut s = 0f32;
            for (a, b) in qr.iter().zip(kr) {
                s += a * b;
            }
            let s = p.adjust(s * p.scale, slope, i, j);
            scores[j] = s;
            m = m.max(s);
        }
        let mut acc = vec![0f64; hdv];
        let mut sum = 0f64;
        for j in vis {
            let e = ((scores[j] - m) as f64).exp();
            sum += e;
            let Some(vr) = v.get((j * p.nkv + kh) * hdv..(j * p.nkv + kh + 1) * hdv) else {
                return;
            };
            for (a, &b) in acc.iter_mut().zip(vr) {
                *a += e * b as f64;
            }
        }
        for (x, a) in o.iter_mut().zip(&acc) {
            *x = if sum > 0.0 { (a / sum) as f32 } else { 0.0 };
        }
    }
}

/// Fast attention (same contract as [`attention_ref`]).
pub fn attention(
    th: &Threads,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    slopes: Option<&[f32]>,
    out: &mut [f32],
    p: &AttnParams,
) {
    let (hd, hdv) = (p.hd, p.hdv);
    if hdv == 0 || p.nh == 0 {
        return;
    }
    let rows = (p.sq * p.nh).min(out.len() / hdv);
    let out = &mut out[..rows * hdv];
    // one (query, head) row costs about skv·(hd + hdv) flops
    let per_row = (p.skv * (hd + hdv)).max(1);
    let min_rows = (32 * 1024 / per_row).max(1);
    th.for_row_chunks(out, hdv, min_rows, |r0, oc| {
        let mut scores = vec![0f32; p.skv];
        for (ri, o) in oc.chunks_exact_mut(hdv).enumerate() {
            let r = r0 + ri;
            let (i, h) = (r / p.nh, r % p.nh);
            let kh = p.kv_head(h);
            let slope = slopes.and_then(|s| s.get(h).copied()).unwrap_or(0.0);
            o.fill(0.0);
            let Some(qr) = q.get(r * hd..(r + 1) * hd) else {
                return;
            };
            let vis = p.visible(i);
            let sc = &mut scores[vis.clone()];
            for (j, s) in vis.clone().zip(sc.iter_mut()) {
                let kr = k
                    .get((j * p.nkv + kh) * hd..(j * p.nkv + kh + 1) * hd)
                    .unwrap_or(&[]);
                *s = vm::dot(qr, kr) * p.scale;
            }
            if p.softcap > 0.0 || slope != 0.0 {
                for (j, s) in vis.clone().zip(sc.iter_mut()) {
                    *s = p.adjust(*s, slope, i, j);
                }
            }
            if sc.is_empty() {
                continue;
            }
            let m = vm::max(sc);
            let sum = vm::exp_sub_sum(sc, m);
            for (j, &e) in vis.zip(sc.iter()) {
                let vr = v
                    .get((j * p.nkv + kh) * hdv..(j * p.nkv + kh + 1) * hdv)
                    .unwrap_or(&[]);
                vm::axpy(o, e, vr);
            }
            if sum > 0.0 {
                vm::scale(o, 1.0 / sum);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{nmse, vals};

    fn params(sq: usize, skv: usize, nh: usize, nkv: usize, hd: usize) -> AttnParams {
        AttnParams {
            sq,
            skv,
            nh,
            nkv,
            hd,
            hdv: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            softcap: 0.0,
            causal: true,
            window: 0,
        }
    }

    #[test]
    fn fast_matches_reference_on_awkward_sizes() {
        let th = Threads::new(2).unwrap();
        let shapes = [
            (1usize, 1usize, 1usize, 1usize, 1usize),
            (1, 17, 6, 2, 33),
            (5, 9, 4, 4, 7),
            (13, 40, 9, 3, 64),
            (64, 64, 8, 2, 64),
        ];
        for (sq, skv, nh, nkv, hd) in shapes {
            for variant in 0..4 {
                let mut p = params(sq, skv, nh, nkv, hd);
                let slopes: Vec<f32> = (0..nh).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
                match variant {
                    1 => p.softcap = 5.0,
                    2 => p.window = 4,
                    3 => p.causal = false,
                    _ => {}
                }
                let q = vals(sq * nh * hd, 1, -2.0, 2.0);
                let k = vals(skv * nkv * hd, 2, -2.0, 2.0);
                let v = vals(skv * nkv * hd, 3, -1.0, 1.0);
                let s = if variant == 0 {
                    Some(&slopes[..])
                } else {
                    None
                };
                let (mut r, mut f) = (vec![0.0; sq * nh * hd], vec![1.0; sq * nh * hd]);
                attention_ref(&q, &k, &v, s, &mut r, &p);
                attention(&th, &q, &k, &v, s, &mut f, &p);
                let e = nmse(&f, &r);
                assert!(e < 1e-11, "{sq} {skv} {nh} {nkv} {hd} v{variant}: {e:e}");
            }
        }
    }

    #[test]
    fn single_key_returns_its_value_and_mask_hides_future() {
        // two keys, causal, sq = 2: query 0 sees key 0 only, so it returns v[0] exactly
        let p = params(2, 2, 1, 1, 2);
        let q = [1.0, 0.0, 0.0, 1.0];
        let k = [1.0, 0.0, 0.0, 1.0];
        let v = [3.0, 4.0, 5.0, 6.0];
        let mut o = [0.0; 4];
        attention_ref(&q, &k, &v, None, &mut o, &p);
        assert_eq!(&o[..2], &[3.0, 4.0]);
        // query 1 sees both with scores 0 and 1/sqrt(2)
        let w1 = (1.0f64 / 2f64.sqrt()).exp();
        let e0 = (3.0 + 5.0 * w1) / (1.0 + w1);
        assert!((o[2] as f64 - e0).abs() < 1e-6);
    }
}
