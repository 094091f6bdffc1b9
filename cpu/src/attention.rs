//! Scaled dot-product attention over packed `q [sq, nh, hd]`, `k [skv, nkv, hd]`,
//! `v [skv, nkv, hdv]` → `out [sq, nh, hdv]`: causal masking, sliding window, grouped-query heads
//! (head `h` reads KV head `h / (nh / nkv)`), ALiBi slopes, tanh soft-capping of the scores and
//! attention sinks (a learned logit per head that joins each softmax's denominator as a key
//! without a value, GPT-OSS); the per-head terms come as [`HeadTerms`]. Query `i` sits at
//! position `p = skv - sq + i`. A query that sees no key gets zeros.
//!
//! The reference computes scores in f32, softmax and the weighted sum in f64, one (query, head)
//! at a time. With AVX-512, prompts take the tiled online-softmax kernel of `flash` (no score
//! matrix) and a few query rows take the key-split streaming kernel of `decode`. Elsewhere the
//! portable fast path works on one query and one KV head at a time (all the query heads of that
//! GQA group, so each K/V row is loaded once per group): SIMD dot products for the scores, a
//! vectorised max-subtracted softmax, then FMA accumulation of `v` rows; such units are split
//! over the thread pool, and for decode on many threads each unit's keys are split too (partial
//! softmax results merged flash-decoding style). Sizes are validated by the caller; this module
//! never reads out of bounds (short slices produce fewer rows, or take the bounds-checked path)
//! and must not know about tensors.

#[cfg(target_arch = "x86_64")]
mod decode;
#[cfg(target_arch = "x86_64")]
mod flash;
pub mod kv;

pub use kv::{store_rows, KvFormat, KvRows};

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

/// The per-head terms of one call, each `[nh]` when given.
#[derive(Clone, Copy, Debug, Default)]
pub struct HeadTerms<'a> {
    /// ALiBi slopes: key `j` of the query at position `p` adds `slope·(j − p)` to its score.
    pub alibi: Option<&'a [f32]>,
    /// Attention sinks: one logit per head added to the softmax denominator (`e^(sink − m)`),
    /// taking part of the weight away from the keys.
    pub sinks: Option<&'a [f32]>,
}

impl HeadTerms<'_> {
    /// The ALiBi slope of head `h` (0 without slopes).
    pub fn slope(&self, h: usize) -> f32 {
        self.alibi.and_then(|s| s.get(h).copied()).unwrap_or(0.0)
    }

    /// The sink logit of head `h`, if the call has sinks.
    pub fn sink(&self, h: usize) -> Option<f32> {
        self.sinks.and_then(|s| s.get(h).copied())
    }
}

/// `1 / (l + e^(sink − m))`: the factor that normalises an unnormalised softmax output whose
/// scores have the maximum `m` and the sum `l = Σ e^(s − m)`, the sink (when given) counted in
/// the denominator. 0 when there is nothing to normalise (no visible key) or the sink outweighs
/// the keys beyond f32 range (their weights are 0 then).
pub fn inv_denominator(l: f32, m: f32, sink: Option<f32>) -> f32 {
    let d = match sink {
        Some(s) if m > f32::NEG_INFINITY => l + (s - m).exp(),
        _ => l,
    };
    if d > 0.0 && d.is_finite() {
        1.0 / d
    } else {
        0.0
    }
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

/// Reference attention over a cache in any [`KvFormat`]: converts it to f32 (scalar) and runs
/// [`attention_ref`].
pub fn attention_ref_kv(
    q: &[f32],
    k: KvRows,
    v: KvRows,
    heads: HeadTerms,
    out: &mut [f32],
    p: &AttnParams,
) {
    let (kf, vf) = (k.to_f32(p.hd), v.to_f32(p.hdv));
    attention_ref(q, &kf, &vf, heads, out, p);
}

/// Reference attention (a sink enters the softmax as one more score, in f64).
pub fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: HeadTerms,
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
        let slope = heads.slope(h);
        let Some(qr) = q.get(r * hd..(r + 1) * hd) else {
            return;
        };
        let vis = p.visible(i);
        let sink = heads.sink(h).filter(|_| !vis.is_empty());
        let mut m = sink.unwrap_or(f32::NEG_INFINITY);
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
        let mut sum = sink.map_or(0.0, |s| ((s - m) as f64).exp());
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

/// The inputs of one fast attention call, shared by its work units.
struct Inputs<'a> {
    q: &'a [f32],
    k: KvRows<'a>,
    v: KvRows<'a>,
    heads: HeadTerms<'a>,
    p: &'a AttnParams,
    /// Query heads per KV head.
    g: usize,
}

impl Inputs<'_> {
    /// ALiBi slope of query head `h` (0 without slopes).
    fn slope(&self, h: usize) -> f32 {
        self.heads.slope(h)
    }

    /// True when every slice holds the values the parameters imply (the SIMD kernels index
    /// through raw pointers and need this) and the heads group evenly.
    fn sizes_ok(&self, out: &[f32]) -> bool {
        let p = self.p;
        self.g * p.nkv == p.nh
            && p.hd > 0
            && self.q.len() >= p.sq * p.nh * p.hd
            && self.k.rows(p.hd) >= p.skv * p.nkv
            && self.v.rows(p.hdv) >= p.skv * p.nkv
            && out.len() >= p.sq * p.nh * p.hdv
    }

    /// One query `i` and KV head `kh` (the first argument) over the keys `keys` (a sub-range of what `i` sees):
    /// writes, for each of the `g` heads `t`, the unnormalised `acc[t] = Σ e^(s - m_t) v` into
    /// `ob[t]`, the running max into `ms[t]` and `Σ e^(s - m_t)` into `ls[t]`.
    fn partial(
        &self,
        (i, kh): (usize, usize),
        keys: std::ops::Range<usize>,
        sc: &mut Scratch,
        ob: &mut [f32],
        ms: &mut [f32],
        ls: &mut [f32],
    ) {
        let (p, g) = (self.p, self.g);
        let Scratch { scores, row } = sc;
        let (hd, hdv) = (p.hd, p.hdv);
        ob.fill(0.0);
        ms.fill(f32::NEG_INFINITY);
        ls.fill(0.0);
        let n = keys.len();
        let h0 = kh * g;
        let Some(qb) = self.q.get((i * p.nh + h0) * hd..(i * p.nh + h0 + g) * hd) else {
            return;
        };
        if n == 0 {
            return;
        }
        scores.resize(n * g, 0.0);
        // scores[t * n + jj] for head h0 + t and key keys.start + jj
        for (jj, j) in keys.clone().enumerate() {
            let kr = row_of(&self.k, j * p.nkv + kh, hd, row);
            for (t, qr) in qb.chunks_exact(hd).enumerate() {
                scores[t * n + jj] = vm::dot(qr, kr) * p.scale;
            }
        }
        for (t, ((sc, m), l)) in scores
            .chunks_exact_mut(n)
            .take(g)
            .zip(ms.iter_mut())
            .zip(ls.iter_mut())
            .enumerate()
        {
            let slope = self.slope(h0 + t);
            if p.softcap > 0.0 || slope != 0.0 {
                for (j, s) in keys.clone().zip(sc.iter_mut()) {
                    *s = p.adjust(*s, slope, i, j);
                }
            }
            *m = vm::max(sc);
            *l = vm::exp_sub_sum(sc, *m);
        }
        for (jj, j) in keys.enumerate() {
            let vr = row_of(&self.v, j * p.nkv + kh, hdv, row);
            for (t, o) in ob.chunks_exact_mut(hdv).enumerate() {
                vm::axpy(o, scores[t * n + jj], vr);
            }
        }
    }
}

/// Per-task buffers of the portable kernel: scores, and one converted head row.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    row: Vec<f32>,
}

/// Head row `r` of `hd` values of `rows`: borrowed from an f32 cache, else converted into `buf`.
fn row_of<'a>(rows: &KvRows<'a>, r: usize, hd: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
    if let Some(x) = rows.f32_row(r, hd) {
        return x;
    }
    buf.resize(hd, 0.0);
    rows.load_row(r, buf);
    buf
}

/// Fewest query positions that take the tiled prefill kernel (fewer take the decode kernel).
#[cfg(target_arch = "x86_64")]
const FLASH_MIN_QUERIES: usize = 8;

/// Keys per split when one query's keys are spread over several tasks (decode on many threads).
const MIN_SPLIT_KEYS: usize = 256;

/// Fast attention (same contract as [`attention_ref`]).
///
/// Work unit: one query and one KV head, i.e. the `g` query heads sharing that KV head (their
/// output rows are adjacent), so each K/V row is loaded once per group. When there are fewer
/// units than threads and many keys (decode), each unit's keys are also split into chunks whose
/// partial softmax results (max, sum, unnormalised output) are merged afterwards.
pub fn attention(
    th: &Threads,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: HeadTerms,
    out: &mut [f32],
    p: &AttnParams,
) {
    attention_on(
        th,
        (q, KvRows::F32(k), KvRows::F32(v), heads),
        out,
        p,
        Kernel::Auto,
    );
}

/// [`attention`] over a cache in any [`KvFormat`] (the kernels read it directly).
pub fn attention_kv(
    th: &Threads,
    q: &[f32],
    k: KvRows,
    v: KvRows,
    heads: HeadTerms,
    out: &mut [f32],
    p: &AttnParams,
) {
    attention_on(th, (q, k, v, heads), out, p, Kernel::Auto);
}

/// Which fast kernel runs a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// The tiled or decode kernel where the CPU has AVX-512, the portable one elsewhere.
    Auto,
    /// The portable kernel.
    Portable,
    /// The tiled prefill kernel (AVX-512 only; falls back to `Auto` without it).
    #[cfg(test)]
    Flash,
    /// The decode kernel (AVX-512 only; falls back to `Auto` without it).
    #[cfg(test)]
    Decode,
}

/// The `q`, `k`, `v` and per-head terms of one call.
type Qkvs<'a> = (&'a [f32], KvRows<'a>, KvRows<'a>, HeadTerms<'a>);

/// [`attention`] on a chosen kernel.
fn attention_on(
    th: &Threads,
    (q, k, v, heads): Qkvs,
    out: &mut [f32],
    p: &AttnParams,
    kernel: Kernel,
) {
    if p.hdv == 0 || p.nh == 0 || p.nkv == 0 {
        return;
    }
    let g = (p.nh / p.nkv).max(1);
    let inp = Inputs {
        q,
        k,
        v,
        heads,
        p,
        g,
    };
    #[cfg(target_arch = "x86_64")]
    if kernel != Kernel::Portable && crate::simd::has_avx512() && inp.sizes_ok(out) {
        let flash = match kernel {
            #[cfg(test)]
            Kernel::Flash => true,
            #[cfg(test)]
            Kernel::Decode => false,
            _ => p.sq >= FLASH_MIN_QUERIES,
        };
        if flash {
            flash::run(th, &inp, out);
        } else {
            decode::run(th, &inp, out);
        }
        return;
    }
    portable(th, &inp, out);
}

/// The portable fast kernel (see the module header).
fn portable(th: &Threads, inp: &Inputs, out: &mut [f32]) {
    let (p, g) = (inp.p, inp.g);
    let (hd, hdv) = (p.hd, p.hdv);
    let unit = g * hdv;
    let units = (p.sq * p.nkv).min(out.len() / unit);
    let out = &mut out[..units * unit];
    let splits = if units < th.n() {
        (2 * th.n() / units.max(1)).min(p.skv / MIN_SPLIT_KEYS)
    } else {
        0
    };
    if splits >= 2 {
        split_keys(th, inp, out, units, splits);
        return;
    }
    let per_unit = (p.skv * (hd + hdv) * g).max(1);
    let min_units = (32 * 1024 / per_unit).max(1);
    th.for_row_chunks(out, unit, min_units, |u0, oc| {
        let mut scores = Scratch::default();
        let (mut ms, mut ls) = (vec![0f32; g], vec![0f32; g]);
        for (ui, ob) in oc.chunks_exact_mut(unit).enumerate() {
            let u = u0 + ui;
            let i = u / p.nkv;
            inp.partial(
                (i, u % p.nkv),
                p.visible(i),
                &mut scores,
                ob,
                &mut ms,
                &mut ls,
            );
            let h0 = (u % p.nkv) * g;
            for (t, o) in ob.chunks_exact_mut(hdv).enumerate() {
                let inv = inv_denominator(ls[t], ms[t], inp.heads.sink(h0 + t));
                vm::scale(o, inv);
            }
        }
    });
}

/// The split-keys path of [`attention`]: `splits` key chunks per unit computed in parallel,
/// then merged per unit (`O = Σ e^(m_c - M) acc_c / Σ e^(m_c - M) l_c`).
fn split_keys(th: &Threads, inp: &Inputs, out: &mut [f32], units: usize, splits: usize) {
    let (p, g) = (inp.p, inp.g);
    let hdv = p.hdv;
    // one partial = g outputs of hdv, then g maxima, then g sums
    let part = g * (hdv + 2);
    let mut partials = vec![0f32; units * splits * part];
    let kc = p.skv.div_ceil(splits);
    th.for_row_chunks(&mut partials, part, 1, |r0, pc| {
        let mut scores = Scratch::default();
        for (ri, pr) in pc.chunks_exact_mut(part).enumerate() {
            let (u, c) = ((r0 + ri) / splits, (r0 + ri) % splits);
            let i = u / p.nkv;
            let vis = p.visible(i);
            let keys = vis.start.max(c * kc)..vis.end.min((c + 1) * kc);
            let keys = keys.start..keys.end.max(keys.start);
            let (ob, rest) = pr.split_at_mut(g * hdv);
            let (ms, ls) = rest.split_at_mut(g);
            inp.partial((i, u % p.nkv), keys, &mut scores, ob, ms, ls);
        }
    });
    merge_partials(out, &partials, (g, hdv, splits), inp.heads.sinks);
}

/// Merges `splits` partial softmax results per unit into `out` (`heads` rows of `hdv` per unit):
/// each unit's partials are `splits` runs of `heads` unnormalised outputs, `heads` maxima and
/// `heads` sums; `O = Σ e^(m_c - M) acc_c / (Σ e^(m_c - M) l_c + e^(sink - M))`. Units cover
/// consecutive query heads, so output row `r` belongs to head `r % sinks.len()`.
fn merge_partials(
    out: &mut [f32],
    partials: &[f32],
    (heads, hdv, splits): (usize, usize, usize),
    sinks: Option<&[f32]>,
) {
    let part = heads * (hdv + 2);
    for (u, (ob, pu)) in out
        .chunks_exact_mut(heads * hdv)
        .zip(partials.chunks_exact(splits * part))
        .enumerate()
    {
        for (t, o) in ob.chunks_exact_mut(hdv).enumerate() {
            let m_of = |c: usize| {
                pu.get(c * part + heads * hdv + t)
                    .copied()
                    .unwrap_or(f32::NEG_INFINITY)
            };
            let big = (0..splits).map(m_of).fold(f32::NEG_INFINITY, f32::max);
            o.fill(0.0);
            if big == f32::NEG_INFINITY {
                continue;
            }
            let mut total = 0f32;
            for c in 0..splits {
                let w = (m_of(c) - big).exp();
                total += w * pu
                    .get(c * part + heads * hdv + heads + t)
                    .copied()
                    .unwrap_or(0.0);
                let acc = pu
                    .get(c * part + t * hdv..c * part + (t + 1) * hdv)
                    .unwrap_or(&[]);
                vm::axpy(o, w, acc);
            }
            let sink = sinks.and_then(|s| s.get((u * heads + t) % s.len().max(1)).copied());
            vm::scale(o, inv_denominator(total, big, sink));
        }
    }
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

    /// A test shape: (query rows, keys, heads, KV heads, key head size, value head size).
    type Shape = (usize, usize, usize, usize, usize, usize);

    /// Calls `f` with a pool of each of `threads` and the parameters of each of `shapes`.
    fn each_case(threads: &[usize], shapes: &[Shape], mut f: impl FnMut(&Threads, AttnParams)) {
        for &t in threads {
            let th = Threads::new(t).unwrap();
            for &(sq, skv, nh, nkv, hd, hdv) in shapes {
                let mut p = params(sq, skv, nh, nkv, hd);
                p.hdv = hdv;
                f(&th, p);
            }
        }
    }

    /// `p`'s shape and `th`'s size, for assertion messages.
    fn case(th: &Threads, p: &AttnParams) -> String {
        let t = th.n();
        format!(
            "t{t} {} {} {} {} {} {}",
            p.sq, p.skv, p.nh, p.nkv, p.hd, p.hdv
        )
    }

    /// Sink logits of `nh` heads: around the scores' range, one far above it (its keys get
    /// almost no weight) and one far below (no effect).
    fn sinks(nh: usize) -> Vec<f32> {
        (0..nh)
            .map(|h| match h % 4 {
                0 => 0.7,
                1 => -1.3,
                2 => 40.0,
                _ => -60.0,
            })
            .collect()
    }

    const KERNELS: [Kernel; 4] = [
        Kernel::Auto,
        Kernel::Portable,
        Kernel::Flash,
        Kernel::Decode,
    ];

    /// Runs `kernel` and the reference on the same inputs; returns the NMSE.
    fn check(th: &Threads, p: &AttnParams, heads: HeadTerms, kernel: Kernel) -> f64 {
        let q = vals(p.sq * p.nh * p.hd, 1, -2.0, 2.0);
        let k = vals(p.skv * p.nkv * p.hd, 2, -2.0, 2.0);
        let v = vals(p.skv * p.nkv * p.hdv, 3, -1.0, 1.0);
        let n = p.sq * p.nh * p.hdv;
        let (mut r, mut f) = (vec![0.0; n], vec![1.0; n]);
        attention_ref(&q, &k, &v, heads, &mut r, p);
        let (kr, vr) = (KvRows::F32(&k), KvRows::F32(&v));
        attention_on(th, (&q, kr, vr, heads), &mut f, p, kernel);
        nmse(&f, &r)
    }

    /// A cache of `x` (head rows of `hd`) encoded in `fmt`.
    struct Enc {
        fmt: KvFormat,
        bytes: Vec<u8>,
        halves: Vec<half::f16>,
        floats: Vec<f32>,
    }

    impl Enc {
        fn new(fmt: KvFormat, x: &[f32], hd: usize) -> Enc {
            let mut bytes = vec![0u8; x.len() / hd * fmt.row_bytes(hd)];
            store_rows(fmt, x, hd, &mut bytes);
            let halves = bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                .collect();
            Enc {
                fmt,
                bytes,
                halves,
                floats: x.to_vec(),
            }
        }
        fn rows(&self) -> KvRows<'_> {
            match self.fmt {
                KvFormat::F32 => KvRows::F32(&self.floats),
                KvFormat::F16 => KvRows::F16(&self.halves),
                KvFormat::Q8_0 => KvRows::Q8_0(&self.bytes),
            }
        }
    }

    /// Runs `kernel` over a K cache in `kf` and a V cache in `vf`, and the reference over the
    /// same cache converted to f32 (scalar); returns the NMSE.
    fn check_kv(
        th: &Threads,
        p: &AttnParams,
        (kf, vf): (KvFormat, KvFormat),
        kernel: Kernel,
    ) -> f64 {
        let q = vals(p.sq * p.nh * p.hd, 1, -2.0, 2.0);
        let k = Enc::new(kf, &vals(p.skv * p.nkv * p.hd, 2, -2.0, 2.0), p.hd);
        let v = Enc::new(vf, &vals(p.skv * p.nkv * p.hdv, 3, -1.0, 1.0), p.hdv);
        let n = p.sq * p.nh * p.hdv;
        let (mut r, mut f) = (vec![0.0; n], vec![1.0; n]);
        // sinks on the shapes with an odd query count
        let sinks = sinks(p.nh);
        let heads = HeadTerms {
            alibi: None,
            sinks: (p.sq % 2 == 1).then_some(&sinks[..]),
        };
        attention_ref_kv(&q, k.rows(), v.rows(), heads, &mut r, p);
        attention_on(th, (&q, k.rows(), v.rows(), heads), &mut f, p, kernel);
        nmse(&f, &r)
    }

    #[test]
    fn every_kernel_reads_f16_and_q8_caches_like_the_reference() {
        // head sizes 64 / 80 / 128, key counts not multiples of the tiles, one and many KV heads
        let shapes = [
            (1usize, 37usize, 9usize, 3usize, 64usize, 64usize),
            (1, 300, 8, 1, 128, 128),
            (1, 1100, 6, 6, 80, 80),
            (9, 50, 9, 3, 80, 80),
            (25, 70, 16, 2, 80, 48),
            (40, 333, 4, 1, 128, 128),
            (70, 1100, 9, 3, 64, 64),
        ];
        use KvFormat::{F16, F32, Q8_0};
        let formats = [(F16, F16), (Q8_0, Q8_0), (F16, Q8_0), (Q8_0, F32)];
        each_case(&[1, 2], &shapes, |th, p| {
            for fm in formats {
                for kernel in KERNELS {
                    let e = check_kv(th, &p, fm, kernel);
                    assert!(e < 1e-11, "{kernel:?} {fm:?} {}: {e:e}", case(th, &p));
                }
            }
        });
    }

    /// An f16 cache costs nothing beyond the rounding of its values: every kernel gives the
    /// same bits as over an f32 cache holding the f16-rounded keys and values (q, scores,
    /// probabilities and sums stay f32).
    #[test]
    fn f16_cache_matches_f32_cache_of_rounded_values_bit_for_bit() {
        let shapes = [
            (1usize, 37usize, 9usize, 3usize, 64usize, 64usize),
            (2, 1100, 6, 6, 80, 80),
            (9, 50, 9, 3, 33, 7),
            (25, 70, 16, 2, 80, 48),
            (70, 333, 9, 3, 64, 64),
        ];
        each_case(&[1, 2], &shapes, |th, p| {
            let (hd, hdv) = (p.hd, p.hdv);
            let q = vals(p.sq * p.nh * hd, 1, -2.0, 2.0);
            let k = Enc::new(KvFormat::F16, &vals(p.skv * p.nkv * hd, 2, -9.0, 9.0), hd);
            let v = Enc::new(KvFormat::F16, &vals(p.skv * p.nkv * hdv, 3, -1.0, 1.0), hdv);
            let (kr, vr) = (k.rows().to_f32(hd), v.rows().to_f32(hdv));
            let n = p.sq * p.nh * hdv;
            for kernel in KERNELS {
                let (mut a, mut b) = (vec![0f32; n], vec![1f32; n]);
                let heads = HeadTerms::default();
                attention_on(th, (&q, k.rows(), v.rows(), heads), &mut a, &p, kernel);
                let (kf, vf) = (KvRows::F32(&kr), KvRows::F32(&vr));
                attention_on(th, (&q, kf, vf, heads), &mut b, &p, kernel);
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{kernel:?} {}",
                    case(th, &p)
                );
            }
        });
    }

    #[test]
    fn every_kernel_matches_reference_on_awkward_sizes() {
        // rows and keys not multiples of the tiles, one query row, GQA ratios 1 / 3 / 4 / 8,
        // head sizes 1, 7, 33, 64, 80, 128, value head size differing from the key's
        let shapes = [
            (1usize, 1usize, 1usize, 1usize, 1usize, 1usize),
            (1, 37, 9, 3, 64, 64),
            (1, 300, 8, 1, 128, 128),
            (3, 200, 4, 4, 33, 33),
            (7, 7, 6, 2, 7, 7),
            (8, 8, 8, 2, 64, 64),
            (9, 50, 9, 3, 64, 64),
            (17, 17, 4, 1, 128, 128),
            (25, 70, 16, 2, 80, 48),
            (53, 61, 6, 3, 33, 70),
            (100, 100, 3, 3, 64, 64),
        ];
        each_case(&[1, 2, 5], &shapes, |th, base| {
            let slopes: Vec<f32> = (0..base.nh).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
            let sinks = sinks(base.nh);
            for variant in 0..7 {
                let mut p = base;
                let mut heads = HeadTerms::default();
                match variant {
                    0 => heads.alibi = Some(&slopes),
                    1 => p.softcap = 5.0,
                    2 => p.window = 11,
                    3 => p.causal = false,
                    4 => (p.causal, p.window) = (false, 3),
                    5 => (p.window, heads.sinks) = (4, Some(&sinks[..])),
                    _ => (p.softcap, heads.sinks) = (5.0, Some(&sinks[..])),
                }
                for kernel in KERNELS {
                    let e = check(th, &p, heads, kernel);
                    assert!(e < 1e-11, "{kernel:?} {} v{variant}: {e:e}", case(th, &p));
                }
            }
        });
    }

    #[test]
    fn non_causal_with_fewer_or_no_keys() {
        let th = Threads::new(2).unwrap();
        for skv in [0usize, 9] {
            let mut p = params(40, skv, 6, 2, 64);
            p.causal = false;
            for kernel in KERNELS {
                let e = check(&th, &p, HeadTerms::default(), kernel);
                assert!(e < 1e-11, "{kernel:?} skv={skv}: {e:e}");
            }
        }
    }

    #[test]
    fn long_context_prefill_and_decode_match_reference() {
        let th = Threads::new(2).unwrap();
        for (sq, skv) in [(1usize, 2100usize), (3, 1500), (70, 1100)] {
            let p = params(sq, skv, 9, 3, 64);
            let sinks = sinks(9);
            for (kernel, heads) in KERNELS.into_iter().zip(
                [
                    HeadTerms::default(),
                    HeadTerms {
                        alibi: None,
                        sinks: Some(&sinks),
                    },
                ]
                .into_iter()
                .cycle(),
            ) {
                let e = check(&th, &p, heads, kernel);
                assert!(e < 1e-11, "{kernel:?} {sq} {skv}: {e:e}");
            }
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
                let heads = HeadTerms {
                    alibi: (variant == 0).then_some(&slopes[..]),
                    sinks: None,
                };
                let (mut r, mut f) = (vec![0.0; sq * nh * hd], vec![1.0; sq * nh * hd]);
                attention_ref(&q, &k, &v, heads, &mut r, &p);
                attention(&th, &q, &k, &v, heads, &mut f, &p);
                let e = nmse(&f, &r);
                assert!(e < 1e-11, "{sq} {skv} {nh} {nkv} {hd} v{variant}: {e:e}");
            }
        }
    }

    #[test]
    fn split_keys_path_matches_reference() {
        // 8 threads, 2 units, 1000 keys: the split-keys path runs
        let th = Threads::new(8).unwrap();
        for (sq, skv, window, softcap) in [
            (1usize, 1000usize, 0usize, 0.0f32),
            (1, 1000, 300, 0.0),
            (2, 777, 0, 10.0),
            (1, 600, 5, 0.0),
        ] {
            let mut p = params(sq, skv, 4, 1, 64);
            p.window = window;
            p.softcap = softcap;
            let slopes = [0.01f32, 0.02, 0.03, 0.04];
            let sinks = sinks(4);
            let heads = HeadTerms {
                alibi: Some(&slopes),
                sinks: (window > 0).then_some(&sinks[..]),
            };
            let q = vals(sq * 4 * 64, 1, -2.0, 2.0);
            let k = vals(skv * 64, 2, -2.0, 2.0);
            let v = vals(skv * 64, 3, -1.0, 1.0);
            let (mut r, mut f) = (vec![0.0; sq * 4 * 64], vec![1.0; sq * 4 * 64]);
            attention_ref(&q, &k, &v, heads, &mut r, &p);
            for kernel in KERNELS {
                attention_on(
                    &th,
                    (&q, KvRows::F32(&k), KvRows::F32(&v), heads),
                    &mut f,
                    &p,
                    kernel,
                );
                let e = nmse(&f, &r);
                assert!(
                    e < 1e-11,
                    "{kernel:?} sq={sq} skv={skv} window={window}: {e:e}"
                );
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
        attention_ref(&q, &k, &v, HeadTerms::default(), &mut o, &p);
        assert_eq!(&o[..2], &[3.0, 4.0]);
        // query 1 sees both with scores 0 and 1/sqrt(2)
        let w1 = (1.0f64 / 2f64.sqrt()).exp();
        let e0 = (3.0 + 5.0 * w1) / (1.0 + w1);
        assert!((o[2] as f64 - e0).abs() < 1e-6);
    }
}

#[cfg(test)]
mod sink_tests {
    use super::*;

    #[test]
    fn a_sink_takes_its_share_of_the_softmax() {
        // one query, two keys with scores 0 and 1, sink 0.5: weights e^s / (e^0 + e^1 + e^0.5)
        let p = AttnParams {
            sq: 1,
            skv: 2,
            nh: 1,
            nkv: 1,
            hd: 1,
            hdv: 1,
            scale: 1.0,
            softcap: 0.0,
            causal: true,
            window: 0,
        };
        let (q, k, v) = ([1.0f32], [0.0f32, 1.0], [2.0f32, 3.0]);
        let heads = HeadTerms {
            alibi: None,
            sinks: Some(&[0.5]),
        };
        let z = 1.0 + 1f64.exp() + 0.5f64.exp();
        let want = (2.0 + 3.0 * 1f64.exp()) / z;
        let mut o = [0.0f32];
        attention_ref(&q, &k, &v, heads, &mut o, &p);
        assert!((o[0] as f64 - want).abs() < 1e-6, "{} vs {want}", o[0]);
        let th = Threads::new(1).unwrap();
        attention(&th, &q, &k, &v, heads, &mut o, &p);
        assert!((o[0] as f64 - want).abs() < 1e-6, "{} vs {want}", o[0]);
    }

    #[test]
    fn inv_denominator_limits() {
        assert_eq!(inv_denominator(0.0, f32::NEG_INFINITY, Some(3.0)), 0.0);
        assert_eq!(inv_denominator(2.0, 0.0, None), 0.5);
        assert_eq!(inv_denominator(1.0, 0.0, Some(200.0)), 0.0);
        assert!((inv_denominator(1.0, 0.0, Some(0.0)) - 0.5).abs() < 1e-7);
    }
}
