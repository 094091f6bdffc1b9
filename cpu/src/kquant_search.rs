//! Scale-searching quantizers for the K-quant blocks of [`crate::kquant`] (`Q4_K`, `Q5_K`,
//! `Q6_K`), the method of llama.cpp's reference quantizer:
//! - `Q4_K`/`Q5_K`: each sub-block of 32 gets a scale and a min from a weighted least-squares fit
//!   over a sweep of candidate step sizes (weights `rms(sub-block) + |x|`); the eight scales and
//!   eight mins are then rounded to 6 bits of the super-block's `d`/`dmin`, and every value is
//!   rounded against its quantized scale and min.
//! - `Q6_K`: each group of 16 gets a signed scale from a sweep of 19 candidate steps around
//!   "largest magnitude → −32", the fit weighted by `x²`; the sixteen scales are rounded to i8 of
//!   the super-block's `d` (largest → −128), and every value is rounded against its scale.
//!
//! With `refine`, `d` (and `dmin`) are then refitted by least squares over the whole super-block
//! with the quantized scales and levels fixed, and the values re-rounded; the refit is kept only
//! where it lowers the block's weighted squared error, so it never makes a block worse.
//!
//! Rounding is to nearest with ties to even, as llama.cpp's `nearest_int`. The byte layouts are
//! those documented in [`crate::kquant`]; this module only chooses the numbers.

use crate::kquant::{Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K};
use half::f16;

/// Below this largest magnitude a group is all zeros.
const ZERO_EPS: f32 = 1e-15;

#[inline]
fn nearest(v: f32) -> i32 {
    v.round_ties_even() as i32
}

#[inline]
fn f16_round(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// Weighted least-squares fit of `x ≈ scale·l − min` with `l` in `0..=nmax`, over the candidate
/// steps `(max − lo) / (nmax + rmin + rdelta·k)`, `k = 0..=nstep`. Writes the levels to `l`;
/// returns `(scale, min)` with `min ≥ 0` (the amount subtracted).
fn fit_with_min(
    x: &[f32],
    w: &[f32],
    nmax: i32,
    sweep: (f32, f32, i32),
    l: &mut [u8],
) -> (f32, f32) {
    let (rmin, rdelta, nstep) = sweep;
    let lo = x.iter().cloned().fold(x[0], f32::min).min(0.0);
    let hi = x.iter().cloned().fold(x[0], f32::max);
    if hi == lo {
        l.fill(0);
        return (0.0, -lo);
    }
    let (sum_w, sum_x) = x
        .iter()
        .zip(w)
        .fold((0f32, 0f32), |(sw, sx), (&v, &wi)| (sw + wi, sx + wi * v));
    let level = |iscale: f32, v: f32, min: f32| nearest(iscale * (v - min)).clamp(0, nmax) as u8;
    let err = |scale: f32, min: f32, ls: &[u8]| -> f32 {
        x.iter()
            .zip(w)
            .zip(ls)
            .map(|((&v, &wi), &q)| {
                let d = scale * q as f32 + min - v;
                wi * d * d
            })
            .sum()
    };
    let iscale = nmax as f32 / (hi - lo);
    let (mut scale, mut min) = (1.0 / iscale, lo);
    for (q, &v) in l.iter_mut().zip(x) {
        *q = level(iscale, v, lo);
    }
    let mut best = err(scale, min, l);
    let mut aux = [0u8; 32];
    let aux = &mut aux[..x.len()];
    for k in 0..=nstep {
        let iscale = (rmin + rdelta * k as f32 + nmax as f32) / (hi - lo);
        let (mut sl, mut sl2, mut sxl) = (0f32, 0f32, 0f32);
        for ((q, &v), &wi) in aux.iter_mut().zip(x).zip(w) {
            *q = level(iscale, v, lo);
            let lf = *q as f32;
            sl += wi * lf;
            sl2 += wi * lf * lf;
            sxl += wi * lf * v;
        }
        let det = sum_w * sl2 - sl * sl;
        if det <= 0.0 {
            continue;
        }
        let mut this_scale = (sum_w * sxl - sum_x * sl) / det;
        let mut this_min = (sl2 * sum_x - sl * sxl) / det;
        if this_min > 0.0 {
            this_min = 0.0;
            this_scale = sxl / sl2;
        }
        let e = err(this_scale, this_min, aux);
        if e < best {
            l.copy_from_slice(aux);
            best = e;
            scale = this_scale;
            min = this_min;
        }
    }
    (scale, -min)
}

/// A `Q4_K`/`Q5_K` super-block before packing.
struct MinBlock {
    d: f32,
    dmin: f32,
    sc: [u8; 8],
    m: [u8; 8],
    l: [u8; QK_K],
}

/// Per-sub-block weights `rms + |x|`.
fn rms_weights(x: &[f32]) -> [f32; QK_K] {
    let mut w = [0f32; QK_K];
    for (xs, ws) in x.chunks_exact(32).zip(w.chunks_exact_mut(32)) {
        let av = (xs.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
        for (wi, v) in ws.iter_mut().zip(xs) {
            *wi = av + v.abs();
        }
    }
    w
}

/// Rounds every value of `x` against the quantized scales and mins of `b` (sub-blocks whose
/// scale is zero keep their levels).
fn requantize_min(x: &[f32], nmax: i32, b: &mut MinBlock) {
    for (j, (xs, ls)) in x.chunks_exact(32).zip(b.l.chunks_exact_mut(32)).enumerate() {
        let d = b.d * b.sc[j] as f32;
        if d == 0.0 {
            continue;
        }
        let dm = b.dmin * b.m[j] as f32;
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = nearest((v + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

fn min_block_error(x: &[f32], w: &[f32], b: &MinBlock) -> f64 {
    x.iter()
        .zip(w)
        .enumerate()
        .map(|(i, (&v, &wi))| {
            let j = i / 32;
            let y = b.d * b.sc[j] as f32 * b.l[i] as f32 - b.dmin * b.m[j] as f32;
            wi as f64 * ((y - v) as f64).powi(2)
        })
        .sum()
}

/// Least-squares `d`, `dmin` for fixed scales, mins and levels; keeps the refit (after f16
/// rounding and re-rounding the levels) only where it lowers the weighted error.
fn refine_min_block(x: &[f32], w: &[f32], nmax: i32, b: &mut MinBlock) {
    for _ in 0..2 {
        let (mut saa, mut sab, mut sbb, mut sax, mut sbx) = (0f64, 0f64, 0f64, 0f64, 0f64);
        for (i, (&v, &wi)) in x.iter().zip(w).enumerate() {
            let j = i / 32;
            let a = b.sc[j] as f64 * b.l[i] as f64;
            let c = -(b.m[j] as f64);
            let (wi, v) = (wi as f64, v as f64);
            saa += wi * a * a;
            sab += wi * a * c;
            sbb += wi * c * c;
            sax += wi * a * v;
            sbx += wi * c * v;
        }
        let det = saa * sbb - sab * sab;
        let (d, dmin) = if det > 1e-30 * saa * sbb && sbb > 0.0 {
            ((sax * sbb - sbx * sab) / det, (saa * sbx - sab * sax) / det)
        } else if saa > 0.0 {
            (sax / saa, b.dmin as f64)
        } else {
            return;
        };
        let mut cand = MinBlock {
            d: f16_round(d as f32),
            dmin: f16_round(dmin as f32),
            ..*b
        };
        if !(cand.d.is_finite() && cand.dmin.is_finite() && cand.d >= 0.0 && cand.dmin >= 0.0) {
            return;
        }
        requantize_min(x, nmax, &mut cand);
        if min_block_error(x, w, &cand) < min_block_error(x, w, b) {
            *b = cand;
        } else {
            return;
        }
    }
}

/// The f16 value nearest `v` that is at least as large in magnitude.
fn f16_round_out(v: f32) -> f32 {
    let h = f16::from_f32(v);
    if h.to_f32().abs() < v.abs() && h.is_finite() {
        f16::from_bits(h.to_bits() + 1).to_f32()
    } else {
        h.to_f32()
    }
}

/// 6-bit codes of `vals` (each `≥ 0`) against the step `unit` (`0` when `unit` is 0).
fn codes6(vals: &[f32; 8], unit: f32) -> [u8; 8] {
    let inv = if unit > 0.0 { 1.0 / unit } else { 0.0 };
    vals.map(|v| nearest(inv * v).clamp(0, 63) as u8)
}

/// Quantizes one super-block of 256 values with levels `0..=nmax` (15 for Q4_K, 31 for Q5_K).
/// llama.cpp codes the sub-block scales against the unrounded `max / 63`; with `refine`, codes
/// against the f16 `d`/`dmin` (rounded up) are tried too, the better kept and then refitted.
fn min_block(x: &[f32], nmax: i32, sweep: (f32, f32, i32), refine: bool) -> MinBlock {
    let w = rms_weights(x);
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    for j in 0..8 {
        let r = 32 * j..32 * j + 32;
        (scales[j], mins[j]) = fit_with_min(&x[r.clone()], &w[r.clone()], nmax, sweep, &mut l[r]);
    }
    let max_scale = scales.iter().cloned().fold(0f32, f32::max);
    let max_min = mins.iter().cloned().fold(0f32, f32::max);
    let mut b = MinBlock {
        d: f16_round(max_scale / 63.0),
        dmin: f16_round(max_min / 63.0),
        sc: codes6(&scales, max_scale / 63.0),
        m: codes6(&mins, max_min / 63.0),
        l,
    };
    requantize_min(x, nmax, &mut b);
    if refine {
        let (d, dmin) = (
            f16_round_out(max_scale / 63.0),
            f16_round_out(max_min / 63.0),
        );
        let mut alt = MinBlock {
            d,
            dmin,
            sc: codes6(&scales, d),
            m: codes6(&mins, dmin),
            l,
        };
        requantize_min(x, nmax, &mut alt);
        if min_block_error(x, &w, &alt) < min_block_error(x, &w, &b) {
            b = alt;
        }
        refine_min_block(x, &w, nmax, &mut b);
    }
    b
}

/// Writes `d`, `dmin` and the packed 6-bit scales/mins (the packing [`crate::kquant::scales_mins`]
/// reads) into the first 16 bytes of `out`.
fn pack_min_header(b: &MinBlock, out: &mut [u8]) {
    out[0..2].copy_from_slice(&f16::from_f32(b.d).to_le_bytes());
    out[2..4].copy_from_slice(&f16::from_f32(b.dmin).to_le_bytes());
    let q = &mut out[4..16];
    for j in 0..4 {
        q[j] = b.sc[j] | ((b.sc[j + 4] >> 4) << 6);
        q[j + 4] = b.m[j] | ((b.m[j + 4] >> 4) << 6);
        q[j + 8] = (b.sc[j + 4] & 0xF) | ((b.m[j + 4] & 0xF) << 4);
    }
}

/// `Q4_K` with llama.cpp's scale search (see the module docs); `src.len()` must be a multiple of
/// 256 and `dst.len()` `src.len() / 256 * 144`.
pub fn quantize_q4_k(src: &[f32], dst: &mut [u8], refine: bool) {
    for (x, out) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q4_K_BYTES)) {
        let b = min_block(x, 15, (-1.0, 0.1, 20), refine);
        pack_min_header(&b, out);
        let qs = &mut out[16..144];
        for (c, chunk) in b.l.chunks_exact(64).enumerate() {
            for k in 0..32 {
                qs[32 * c + k] = chunk[k] | (chunk[k + 32] << 4);
            }
        }
    }
}

/// `Q5_K` with llama.cpp's scale search (see the module docs); `src.len()` must be a multiple of
/// 256 and `dst.len()` `src.len() / 256 * 176`.
pub fn quantize_q5_k(src: &[f32], dst: &mut [u8], refine: bool) {
    for (x, out) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q5_K_BYTES)) {
        let b = min_block(x, 31, (-0.5, 0.1, 15), refine);
        pack_min_header(&b, out);
        out[16..48].fill(0);
        for (c, chunk) in b.l.chunks_exact(64).enumerate() {
            for k in 0..32 {
                let (lo, hi) = (chunk[k], chunk[k + 32]);
                out[48 + 32 * c + k] = (lo & 0xF) | ((hi & 0xF) << 4);
                out[16 + k] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
            }
        }
    }
}

/// Signed-scale fit of one group (levels `−nmax..nmax−1`, weights `x²`) over 19 candidate steps
/// around "largest magnitude → −nmax"; writes `level + nmax` to `l` and returns the scale.
fn fit_signed(x: &[f32], nmax: i32, l: &mut [u8]) -> f32 {
    let big = x
        .iter()
        .cloned()
        .fold(0f32, |a, v| if v.abs() > a.abs() { v } else { a });
    if big.abs() < ZERO_EPS {
        l.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        x.iter().fold((0f32, 0f32), |(slx, sl2), &v| {
            let q = level(iscale, v) as f32;
            let w = v * v;
            (slx + w * v * q, sl2 + w * q * q)
        })
    };
    let write = |iscale: f32, l: &mut [u8]| {
        for (q, &v) in l.iter_mut().zip(x) {
            *q = (level(iscale, v) + nmax) as u8;
        }
    };
    let iscale = -(nmax as f32) / big;
    write(iscale, l);
    let (slx, sl2) = sums(iscale);
    let mut scale = if sl2 != 0.0 { slx / sl2 } else { 0.0 };
    let mut best = scale * slx;
    for k in (-9..=9).filter(|&k| k != 0) {
        let iscale = -(nmax as f32 + 0.1 * k as f32) / big;
        let (slx, sl2) = sums(iscale);
        if sl2 > 0.0 && slx * slx > best * sl2 {
            write(iscale, l);
            scale = slx / sl2;
            best = scale * slx;
        }
    }
    scale
}

/// A `Q6_K` super-block before packing (levels stored with offset 32).
struct SignedBlock {
    d: f32,
    sc: [i8; 16],
    l: [u8; QK_K],
}

fn requantize_signed(x: &[f32], b: &mut SignedBlock) {
    for (g, (xs, ls)) in x.chunks_exact(16).zip(b.l.chunks_exact_mut(16)).enumerate() {
        let d = b.d * b.sc[g] as f32;
        if d == 0.0 {
            continue;
        }
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = (nearest(v / d).clamp(-32, 31) + 32) as u8;
        }
    }
}

fn signed_block_error(x: &[f32], b: &SignedBlock) -> f64 {
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            let y = b.d * b.sc[i / 16] as f32 * (b.l[i] as i32 - 32) as f32;
            (v as f64) * (v as f64) * ((y - v) as f64).powi(2)
        })
        .sum()
}

/// Least-squares `d` for fixed group scales and levels; kept only where it lowers the error.
fn refine_signed_block(x: &[f32], b: &mut SignedBlock) {
    for _ in 0..2 {
        let (mut saa, mut sax) = (0f64, 0f64);
        for (i, &v) in x.iter().enumerate() {
            let a = b.sc[i / 16] as f64 * (b.l[i] as i32 - 32) as f64;
            let w = v as f64 * v as f64;
            saa += w * a * a;
            sax += w * a * v as f64;
        }
        if saa <= 0.0 {
            return;
        }
        let mut cand = SignedBlock {
            d: f16_round((sax / saa) as f32),
            ..*b
        };
        if !cand.d.is_finite() {
            return;
        }
        requantize_signed(x, &mut cand);
        if signed_block_error(x, &cand) < signed_block_error(x, b) {
            *b = cand;
        } else {
            return;
        }
    }
}

/// Quantizes one Q6_K super-block. llama.cpp codes the group scales against the unrounded
/// `max / −128`; with `refine`, codes against the f16 `d` (rounded outwards) are tried too, the
/// better kept and then refitted.
fn signed_block(x: &[f32], refine: bool) -> SignedBlock {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    for (g, s) in scales.iter_mut().enumerate() {
        *s = fit_signed(&x[16 * g..16 * g + 16], 32, &mut l[16 * g..16 * g + 16]);
    }
    let max_scale = scales
        .iter()
        .cloned()
        .fold(0f32, |a, v| if v.abs() > a.abs() { v } else { a });
    if max_scale.abs() < ZERO_EPS {
        return SignedBlock {
            d: 0.0,
            sc: [0; 16],
            l: [32; QK_K],
        };
    }
    let codes = |unit: f32| scales.map(|s| nearest(s / unit).clamp(-128, 127) as i8);
    let iscale = -128.0 / max_scale;
    let mut b = SignedBlock {
        d: f16_round(1.0 / iscale),
        sc: scales.map(|s| nearest(iscale * s).clamp(-128, 127) as i8),
        l,
    };
    requantize_signed(x, &mut b);
    if refine {
        let d = f16_round_out(1.0 / iscale);
        let mut alt = SignedBlock { d, sc: codes(d), l };
        requantize_signed(x, &mut alt);
        if signed_block_error(x, &alt) < signed_block_error(x, &b) {
            b = alt;
        }
        refine_signed_block(x, &mut b);
    }
    b
}

/// `Q6_K` with llama.cpp's scale search (see the module docs); `src.len()` must be a multiple of
/// 256 and `dst.len()` `src.len() / 256 * 210`.
pub fn quantize_q6_k(src: &[f32], dst: &mut [u8], refine: bool) {
    for (x, out) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q6_K_BYTES)) {
        let b = signed_block(x, refine);
        if b.d == 0.0 {
            out.fill(0);
            continue;
        }
        for h in 0..2 {
            let l = &b.l[128 * h..128 * h + 128];
            for k in 0..32 {
                out[64 * h + k] = (l[k] & 0xF) | ((l[k + 64] & 0xF) << 4);
                out[64 * h + k + 32] = (l[k + 32] & 0xF) | ((l[k + 96] & 0xF) << 4);
                out[128 + 32 * h + k] = (l[k] >> 4)
                    | ((l[k + 32] >> 4) << 2)
                    | ((l[k + 64] >> 4) << 4)
                    | ((l[k + 96] >> 4) << 6);
            }
        }
        for (o, &s) in out[192..208].iter_mut().zip(&b.sc) {
            *o = s as u8;
        }
        out[208..210].copy_from_slice(&f16::from_f32(b.d).to_le_bytes());
    }
}

#[cfg(test)]
#[path = "kquant_search_tests.rs"]
mod tests;
