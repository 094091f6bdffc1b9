//! Tiled (flash-style) prefill attention on AVX-512: the score matrix is never materialised.
//!
//! The cache is read in place, in any [`KvFormat`]: a task converts each block of [`KB`] keys it
//! visits into a transposed f32 tile (`[d][KB]`), so a tile of [`MR`] query rows × `KB` keys of
//! scores is one register-blocked product, and reads the values straight from the cache
//! (converted 16 at a time in registers). A task owns
//! one KV head and [`RB`] consecutive rows of that head's group (row `r` = query `r / g`, head
//! `kh·g + r % g`); it walks the key blocks its rows see and, per block and per `MR`-row tile,
//! computes the scores, masks them, updates the running max / sum (online softmax, rescaling the
//! accumulated output) and adds `P·V`. Tasks are taken dynamically by the pool, latest rows (the
//! longest under causal masking) first. The caller checks the CPU features and slice sizes.

use super::kv::avx512::{by_kv_formats, Load16};
use super::Inputs;
use crate::threads::Threads;
use crate::vecmath::avx512::exp;
use std::arch::x86_64::*;

/// Keys per block (two 16-lane vectors of scores per row).
const KB: usize = 32;
/// Query rows per register tile.
const MR: usize = 6;
/// Rows per task (a multiple of `MR`).
const RB: usize = 8 * MR;

/// A raw pointer shared by tasks that write disjoint rows.
struct Shared(*mut f32);
// SAFETY: every task writes rows no other task writes (see `run`).
unsafe impl Sync for Shared {}

/// Flash attention over all rows (same contract as `attention_ref`); requires AVX-512 F/BW/VL
/// and caches of at least the rows `p` implies.
pub(super) fn run(th: &Threads, inp: &Inputs, out: &mut [f32]) {
    by_kv_formats!(inp.k.format(), inp.v.format(), run_as(th, inp, out))
}

/// [`run`] with keys stored as `K` and values as `V`.
fn run_as<K: Load16, V: Load16>(th: &Threads, inp: &Inputs, out: &mut [f32]) {
    let p = inp.p;
    let rows = p.sq * inp.g;
    let row_blocks = rows.div_ceil(RB);
    let o = Shared(out.as_mut_ptr());
    th.run_tasks(p.nkv * row_blocks, |task| {
        let (kh, rb) = (task % p.nkv, row_blocks - 1 - task / p.nkv);
        let r0 = rb * RB;
        // SAFETY: AVX-512 checked by the caller; rows r0.. of head group kh are written only by
        // this task, and `out` holds sq·nh·hdv values (checked by the caller).
        unsafe { row_block::<K, V>(inp, kh, r0..(r0 + RB).min(rows), &o) };
    });
}

/// Per-row state of a task: running max and sum, and the unnormalised output `[RB][hdv]`.
struct Acc {
    m: Vec<f32>,
    l: Vec<f32>,
    o: Vec<f32>,
}

/// Converts keys `j0..j0 + nk` of KV head `kh` into the transposed tile `kt` (`[d][KB]`, zero
/// past `nk`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn pack_tile<K: Load16>(inp: &Inputs, kh: usize, j0: usize, nk: usize, kt: &mut [f32]) {
    let p = inp.p;
    let rb = K::row_bytes(p.hd);
    let mut x = [0f32; 16];
    for jj in 0..KB {
        if jj >= nk {
            for d in 0..p.hd {
                kt[d * KB + jj] = 0.0;
            }
            continue;
        }
        let row = inp.k.base().add(((j0 + jj) * p.nkv + kh) * rb);
        for c in (0..p.hd).step_by(16) {
            let n = (p.hd - c).min(16);
            _mm512_storeu_ps(x.as_mut_ptr(), K::load(row, c, lanes(n)));
            for (l, &v) in x.iter().enumerate().take(n) {
                *kt.get_unchecked_mut((c + l) * KB + jj) = v;
            }
        }
    }
}

/// Mask of the first `n` (≤ 16) lanes.
#[inline]
fn lanes(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// One task: rows `rows` of KV head `kh` over every key block they see.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn row_block<K: Load16, V: Load16>(
    inp: &Inputs,
    kh: usize,
    rows: std::ops::Range<usize>,
    out: &Shared,
) {
    let (p, g) = (inp.p, inp.g);
    let n = rows.len();
    let mut acc = Acc {
        m: vec![f32::NEG_INFINITY; n],
        l: vec![0.0; n],
        o: vec![0.0; n * p.hdv],
    };
    let first = p.visible(rows.start / g);
    let last = p.visible((rows.end - 1) / g);
    let zero_q = vec![0f32; p.hd];
    let mut kt = vec![0f32; p.hd * KB];
    let vrb = V::row_bytes(p.hdv);
    for b in first.start / KB..last.end.div_ceil(KB) {
        let nk = KB.min(p.skv - b * KB);
        pack_tile::<K>(inp, kh, b * KB, nk, &mut kt);
        for t0 in (0..n).step_by(MR) {
            let mut qp = [zero_q.as_ptr(); MR];
            for (t, q) in qp.iter_mut().enumerate().take((n - t0).min(MR)) {
                let r = rows.start + t0 + t;
                let (i, h) = (r / g, kh * g + r % g);
                *q = inp.q.as_ptr().add((i * p.nh + h) * p.hd);
            }
            let mut s = [[0f32; KB]; MR];
            qk_tile(&qp, kt.as_ptr(), p.hd, &mut s);
            let w = softmax_tile(inp, &mut s, &mut acc, kh, rows.start + t0, t0, b * KB, n);
            let vp = inp.v.base().add((b * KB * p.nkv + kh) * vrb);
            let o = acc.o.as_mut_ptr().add(t0 * p.hdv);
            let tile = VTile {
                vp,
                stride: p.nkv * vrb,
                nk,
            };
            pv_tile::<V>(&s, &w, &tile, o, p.hdv, (n - t0).min(MR));
        }
    }
    for (t, r) in rows.enumerate() {
        let (i, h) = (r / g, kh * g + r % g);
        let dst = out.0.add((i * p.nh + h) * p.hdv);
        let inv = super::inv_denominator(acc.l[t], acc.m[t], inp.heads.sink(h));
        for c in 0..p.hdv {
            *dst.add(c) = acc.o[t * p.hdv + c] * inv;
        }
    }
}

/// The value rows of one key block: `nk` rows, the first at `vp`, `stride` bytes apart.
struct VTile {
    vp: *const u8,
    stride: usize,
    nk: usize,
}

/// Scores of `MR` query rows (`qp`, each `hd` long) against one packed key block:
/// `s[r][jj] = q_r · k_jj` (unscaled).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn qk_tile(qp: &[*const f32; MR], kt: *const f32, hd: usize, s: &mut [[f32; KB]; MR]) {
    let mut a = [[_mm512_setzero_ps(); 2]; MR];
    for d in 0..hd {
        let k0 = _mm512_loadu_ps(kt.add(d * KB));
        let k1 = _mm512_loadu_ps(kt.add(d * KB + 16));
        for r in 0..MR {
            let qv = _mm512_set1_ps(*qp[r].add(d));
            a[r][0] = _mm512_fmadd_ps(qv, k0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(qv, k1, a[r][1]);
        }
    }
    for r in 0..MR {
        _mm512_storeu_ps(s[r].as_mut_ptr(), a[r][0]);
        _mm512_storeu_ps(s[r].as_mut_ptr().add(16), a[r][1]);
    }
}

/// Turns the raw scores of rows `r0..` of KV head `kh` (tile offset `t0` in `acc`) for keys `j0..j0+KB` into
/// probabilities relative to each row's new running max, updating `acc.m` / `acc.l`; returns
/// the factor each row's accumulated output must be scaled by. Rows at or past `n` get zeros.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn softmax_tile(
    inp: &Inputs,
    s: &mut [[f32; KB]; MR],
    acc: &mut Acc,
    kh: usize,
    r0: usize,
    t0: usize,
    j0: usize,
    n: usize,
) -> [f32; MR] {
    let (p, g) = (inp.p, inp.g);
    let mut w = [1f32; MR];
    for (t, (row, wt)) in s.iter_mut().zip(w.iter_mut()).enumerate() {
        let vis = if t0 + t < n {
            p.visible((r0 + t) / g)
        } else {
            0..0
        };
        let lo = vis.start.saturating_sub(j0).min(KB);
        let hi = vis.end.saturating_sub(j0).min(KB);
        if lo >= hi {
            *row = [0.0; KB];
            continue;
        }
        let bits = ((1u64 << hi) - 1) & !((1u64 << lo) - 1);
        let (m0, m1) = (bits as __mmask16, (bits >> 16) as __mmask16);
        adjust_row(inp, row, (r0 + t) / g, kh * g + (r0 + t) % g, j0);
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let s0 = _mm512_mask_loadu_ps(ninf, m0, row.as_ptr());
        let s1 = _mm512_mask_loadu_ps(ninf, m1, row.as_ptr().add(16));
        let bmax = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
        let m_old = acc.m[t0 + t];
        let m_new = m_old.max(bmax);
        *wt = if m_old == f32::NEG_INFINITY {
            0.0
        } else {
            (m_old - m_new).exp()
        };
        let mv = _mm512_set1_ps(m_new);
        let e0 = _mm512_maskz_mov_ps(m0, exp(_mm512_sub_ps(s0, mv)));
        let e1 = _mm512_maskz_mov_ps(m1, exp(_mm512_sub_ps(s1, mv)));
        _mm512_storeu_ps(row.as_mut_ptr(), e0);
        _mm512_storeu_ps(row.as_mut_ptr().add(16), e1);
        acc.m[t0 + t] = m_new;
        acc.l[t0 + t] = acc.l[t0 + t] * *wt + _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
    }
    w
}

/// Scales one row of raw scores of query `i` and head `h` for keys `j0..j0+KB`, and applies
/// soft-capping and ALiBi.
#[inline]
fn adjust_row(inp: &Inputs, row: &mut [f32; KB], i: usize, h: usize, j0: usize) {
    let p = inp.p;
    for s in row.iter_mut() {
        *s *= p.scale;
    }
    let slope = inp.slope(h);
    if p.softcap > 0.0 || slope != 0.0 {
        for (jj, s) in row.iter_mut().enumerate() {
            *s = p.adjust(*s, slope, i, j0 + jj);
        }
    }
}

/// `o[r] = w[r]·o[r] + Σ_jj s[r][jj]·v[jj]` for `rows` rows of `hdv` values over the value
/// rows of `t` (index loops over the register tile).
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
#[inline]
unsafe fn pv_tile<V: Load16>(
    s: &[[f32; KB]; MR],
    w: &[f32; MR],
    t: &VTile,
    o: *mut f32,
    hdv: usize,
    rows: usize,
) {
    for c0 in (0..hdv).step_by(64) {
        let mut mk = [0 as __mmask16; 4];
        for (z, m) in mk.iter_mut().enumerate() {
            *m = lanes(hdv.saturating_sub(c0 + 16 * z).min(16));
        }
        let mut a = [[_mm512_setzero_ps(); 4]; MR];
        for r in 0..rows {
            let wr = _mm512_set1_ps(w[r]);
            for z in 0..4 {
                let x = _mm512_maskz_loadu_ps(mk[z], o.add(r * hdv + c0 + 16 * z));
                a[r][z] = _mm512_mul_ps(x, wr);
            }
        }
        for jj in 0..t.nk {
            let vr = t.vp.add(jj * t.stride);
            let mut vz = [_mm512_setzero_ps(); 4];
            for z in 0..4 {
                vz[z] = V::load(vr, c0 + 16 * z, mk[z]);
            }
            for r in 0..MR {
                let pb = _mm512_set1_ps(s[r][jj]);
                for z in 0..4 {
                    a[r][z] = _mm512_fmadd_ps(pb, vz[z], a[r][z]);
                }
            }
        }
        for r in 0..rows {
            for z in 0..4 {
                _mm512_mask_storeu_ps(o.add(r * hdv + c0 + 16 * z), mk[z], a[r][z]);
            }
        }
    }
}
