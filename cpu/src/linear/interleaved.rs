//! Block weights interleaved 16 rows at a time, and the integer `Linear` kernels that
//! stream them.
//!
//! An interleaved Q4_0 / Q4_1 / Q8_0 matrix holds the same bytes as the plain one, reordered: rows are
//! taken in groups of [`GROUP_ROWS`], and a group stores, block after block, the block of each of
//! its 16 rows side by side:
//!
//! | format | one block of a group (16 rows) | bytes |
//! |---|---|---|
//! | Q4_0 | 16 f16 scales, then 4 vectors `V_m` | 32 + 256 = 16 × 18 |
//! | Q4_1 | 16 f16 scales, 16 f16 mins, then 4 vectors `V_m` | 64 + 256 = 16 × 20 |
//! | Q8_0 | 16 f16 scales, then 8 vectors `V_m` | 32 + 512 = 16 × 34 |
//!
//! where the 64-byte vector `V_m` holds, in its 32-bit lane `j`, bytes `4m..4m+4` of row `j`'s
//! quants (Q8_0: each byte XOR 0x80, i.e. `q + 128` as an unsigned byte). One 512-bit load thus
//! gives four quant bytes of all 16 rows, which meet one broadcast 4-byte piece of the
//! activation block in a single `vpdpbusd`: the 16 lanes accumulate the 16 rows' dots, so a whole
//! matrix is read as one sequential stream with no shuffling, and each activation piece is loaded
//! once per 16 rows.
//!
//! The integer math per block is the plain kernels': Q4_0 `Σ q·x − 8·Σx`, Q4_1 `Σ q·x` plus the
//! min term `m·(dx·Σx)`, Q8_0 `Σ (q + 128)·x − 128·Σx`; each block's integer sum is scaled by
//! `dw·dx` and added in block order, in the scalar reference and the SIMD kernel alike.
//!
//! Matrices whose row count is not a multiple of [`GROUP_ROWS`] are not interleaved (callers keep the
//! plain layout). F16/BF16 weights have their own layout and kernels ([`super::interleaved_float`]),
//! and so do the K-quants ([`super::interleaved_kquant`]); [`interleave`], [`plain_row`] and
//! [`available_for`] take every type, [`pick`] and [`pick_ref`] the block types and K-quants.
//! This module must not split work across threads or know about tensors.

use super::act_quant::Q8Rows;
use super::{WeightType, MAX_ROWS};
use crate::quant::{Q4_0_BYTES, Q4_1_BYTES, Q8_0_BYTES, QK};
use half::f16;

/// Rows interleaved in one interleaved group (the lanes of a 512-bit vector of i32).
pub const GROUP_ROWS: usize = 16;

/// An interleaved-group kernel: `out[r][j]` = the dot of row `j` of the group at `g` (`acts.blocks`
/// blocks) with activation row `row0 + r`, for `r < rows`, `j < 16`.
///
/// # Safety
/// `1 <= rows <= MAX_ROWS`, `row0 + rows <= acts.rows`, `g` holds a whole interleaved group of
/// `acts.blocks` blocks of the kernel's type, and the CPU has the features the kernel was
/// picked for.
pub type InterleavedFn = unsafe fn(
    g: &[u8],
    acts: &Q8Rows,
    row0: usize,
    rows: usize,
    out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
);

/// Plain block bytes of a packable weight type (`None` for float types).
fn block_bytes(t: WeightType) -> Option<usize> {
    match t {
        WeightType::Q4_0 => Some(Q4_0_BYTES),
        WeightType::Q4_1 => Some(Q4_1_BYTES),
        WeightType::Q8_0 => Some(Q8_0_BYTES),
        _ => None,
    }
}

/// Bytes before the quant vectors in an interleaved block of 16 rows (scales, and Q4_1's mins).
fn header_bytes(t: WeightType) -> usize {
    if t == WeightType::Q4_1 {
        4 * GROUP_ROWS
    } else {
        2 * GROUP_ROWS
    }
}

/// Offset of the quants in a plain block (after the f16 scale, and Q4_1's f16 min).
fn quant_offset(t: WeightType) -> usize {
    if t == WeightType::Q4_1 {
        4
    } else {
        2
    }
}

/// Checks an interleaving request: `w` holds `n` plain rows of `k` values of `t`; returns the plain
/// block bytes.
fn check(t: WeightType, w: &[u8], n: usize, k: usize) -> Result<usize, String> {
    let bs = block_bytes(t).ok_or_else(|| format!("{} weights cannot be interleaved", t.name()))?;
    check_shape(t, w, n, k, QK, bs)?;
    Ok(bs)
}

/// Checks that `n` is a whole number of groups, `k` a whole number of `qk`-value blocks of `bs`
/// bytes, and `w` holds the `n × k` weight of type `t`.
pub(super) fn check_shape(
    t: WeightType,
    w: &[u8],
    n: usize,
    k: usize,
    qk: usize,
    bs: usize,
) -> Result<(), String> {
    if !n.is_multiple_of(GROUP_ROWS) || !k.is_multiple_of(qk) || k == 0 {
        return Err(format!(
            "interleaving needs rows a multiple of {GROUP_ROWS} and k a multiple of {qk}, got {n} x {k}"
        ));
    }
    let need = n
        .checked_mul(k / qk * bs)
        .ok_or_else(|| format!("{n} x {k} weight size overflows"))?;
    if w.len() < need {
        return Err(format!(
            "weight has {} bytes, {n} x {k} {} needs {need}",
            w.len(),
            t.name()
        ));
    }
    Ok(())
}

/// Interleaves the plain `n × k` weight `w` of type `t` into `out` (the same number of bytes);
/// F16/BF16 weights take the layout of [`super::interleaved_float`], K-quants that of
/// [`super::interleaved_kquant`].
pub fn interleave(
    t: WeightType,
    w: &[u8],
    n: usize,
    k: usize,
    out: &mut [u8],
) -> Result<(), String> {
    if super::interleaved_float::is_float(t) {
        return super::interleaved_float::interleave(t, w, n, k, out);
    }
    if super::interleaved_kquant::is_kquant(t) {
        return super::interleaved_kquant::interleave(t, w, n, k, out);
    }
    let bs = check(t, w, n, k)?;
    let nb = k / QK;
    if out.len() < n * nb * bs {
        return Err(format!(
            "interleaved output has {} bytes, needs {}",
            out.len(),
            n * nb * bs
        ));
    }
    let (hb, qoff) = (header_bytes(t), quant_offset(t));
    let qlen = bs - qoff;
    for g in 0..n / GROUP_ROWS {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * GROUP_ROWS * bs..][..GROUP_ROWS * bs];
            for j in 0..GROUP_ROWS {
                let src = &w[((g * GROUP_ROWS + j) * nb + b) * bs..][..bs];
                dst[2 * j..2 * j + 2].copy_from_slice(&src[..2]);
                if t == WeightType::Q4_1 {
                    dst[32 + 2 * j..32 + 2 * j + 2].copy_from_slice(&src[2..4]);
                }
                for m in 0..qlen / 4 {
                    for i in 0..4 {
                        let v = src[qoff + 4 * m + i];
                        let v = if t == WeightType::Q8_0 { v ^ 0x80 } else { v };
                        dst[hb + 64 * m + 4 * j + i] = v;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Row `r` of an interleaved `n × k` weight of type `t`, in the plain block layout, into `out`
/// (`k / 32` plain blocks; K-quants: `k / 256` super-blocks; F16/BF16: `k` values).
pub fn plain_row(
    t: WeightType,
    w: &[u8],
    n: usize,
    k: usize,
    r: usize,
    out: &mut [u8],
) -> Result<(), String> {
    if super::interleaved_float::is_float(t) {
        return super::interleaved_float::plain_row(t, w, n, k, r, out);
    }
    if super::interleaved_kquant::is_kquant(t) {
        return super::interleaved_kquant::plain_row(t, w, n, k, r, out);
    }
    let bs = check(t, w, n, k)?;
    let nb = k / QK;
    check_row(r, n, out, nb * bs)?;
    let (g, j) = (r / GROUP_ROWS, r % GROUP_ROWS);
    let (hb, qoff) = (header_bytes(t), quant_offset(t));
    for b in 0..nb {
        let src = &w[(g * nb + b) * GROUP_ROWS * bs..][..GROUP_ROWS * bs];
        let dst = &mut out[b * bs..(b + 1) * bs];
        dst[..2].copy_from_slice(&src[2 * j..2 * j + 2]);
        if t == WeightType::Q4_1 {
            dst[2..4].copy_from_slice(&src[32 + 2 * j..32 + 2 * j + 2]);
        }
        for m in 0..(bs - qoff) / 4 {
            for i in 0..4 {
                let v = src[hb + 64 * m + 4 * j + i];
                dst[qoff + 4 * m + i] = if t == WeightType::Q8_0 { v ^ 0x80 } else { v };
            }
        }
    }
    Ok(())
}

/// `Err` unless `r` is a row of `n` and `out` holds at least `need` bytes (a `plain_row`).
pub(super) fn check_row(r: usize, n: usize, out: &[u8], need: usize) -> Result<(), String> {
    if r >= n || out.len() < need {
        return Err(format!(
            "row {r} of {n}, or output of {} bytes too small",
            out.len()
        ));
    }
    Ok(())
}

/// Scalar reference of the interleaved-group kernels (same integer math and float order as the SIMD
/// kernel, so both give the same bits).
fn group_ref<const KIND: u8>(
    g: &[u8],
    acts: &Q8Rows,
    row0: usize,
    rows: usize,
    out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
) {
    let t = kind_type(KIND);
    let (bs, hb) = (block_bytes(t).unwrap_or(Q4_0_BYTES), header_bytes(t));
    let nb = acts.blocks;
    for (r, o) in out.iter_mut().enumerate().take(rows) {
        *o = [0.0; GROUP_ROWS];
        let ab = (row0 + r) * nb;
        for b in 0..nb {
            let blk = &g[b * GROUP_ROWS * bs..][..GROUP_ROWS * bs];
            let x = &acts.qs[(ab + b) * QK..][..QK];
            let [dx, sx] = acts.ds[ab + b];
            for (j, oj) in o.iter_mut().enumerate() {
                let byte = |m: usize, i: usize| blk[hb + 64 * m + 4 * j + i];
                let mut isum: i32 = match KIND {
                    Q4_0 => -8 * acts.sum[ab + b],
                    Q8_0 => -128 * acts.sum[ab + b],
                    _ => 0,
                };
                for m in 0..(if KIND == Q8_0 { 8 } else { 4 }) {
                    for i in 0..4 {
                        let q = byte(m, i) as i32;
                        isum += if KIND == Q8_0 {
                            q * x[4 * m + i] as i32
                        } else {
                            (q & 15) * x[4 * m + i] as i32 + (q >> 4) * x[16 + 4 * m + i] as i32
                        };
                    }
                }
                let dw = f16::from_le_bytes([blk[2 * j], blk[2 * j + 1]]).to_f32();
                *oj = (dw * dx).mul_add(isum as f32, *oj);
                if KIND == Q4_1 {
                    let mw = f16::from_le_bytes([blk[32 + 2 * j], blk[33 + 2 * j]]).to_f32();
                    *oj = mw.mul_add(sx, *oj);
                }
            }
        }
    }
}

/// Weight kinds (const parameter of the kernels).
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;

fn kind_type(kind: u8) -> WeightType {
    match kind {
        Q4_0 => WeightType::Q4_0,
        Q4_1 => WeightType::Q4_1,
        _ => WeightType::Q8_0,
    }
}

/// The scalar reference kernel for interleaved weights of type `t` (block types and, from
/// [`super::interleaved_kquant`], K-quants; `None` for float types).
pub fn pick_ref(t: WeightType) -> Option<InterleavedFn> {
    Some(match t {
        WeightType::Q4_0 => group_ref::<Q4_0>,
        WeightType::Q4_1 => group_ref::<Q4_1>,
        WeightType::Q8_0 => group_ref::<Q8_0>,
        _ => return super::interleaved_kquant::pick_ref(t),
    })
}

/// True when this CPU has the SIMD kernels (AVX-512 F/BW/VL and VNNI): interleaving pays only then.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::int_tile::has_vnni()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when weights of type `t` are worth interleaving on this CPU: it has the SIMD kernels
/// (block types and the interleaved K-quants: [`available`]; F16/BF16: [`super::interleaved_float::available`]).
pub fn available_for(t: WeightType) -> bool {
    if super::interleaved_float::is_float(t) {
        super::interleaved_float::available(t)
    } else {
        (t.is_block() || super::interleaved_kquant::is_kquant(t)) && available()
    }
}

/// The SIMD kernel for interleaved weights of type `t` (block types and K-quants), if this CPU
/// has one.
pub fn pick(t: WeightType) -> Option<InterleavedFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if available() {
            let pf = crate::simd::wants_weight_prefetch();
            let f: InterleavedFn = match (t, pf) {
                (WeightType::Q4_0, false) => avx512::group_q4_0,
                (WeightType::Q4_1, false) => avx512::group_q4_1,
                (WeightType::Q8_0, false) => avx512::group_q8_0,
                (WeightType::Q4_0, true) => avx512::group_q4_0_pf,
                (WeightType::Q4_1, true) => avx512::group_q4_1_pf,
                (WeightType::Q8_0, true) => avx512::group_q8_0_pf,
                _ => return super::interleaved_kquant::simd(t, pf),
            };
            return Some(f);
        }
    }
    let _ = t;
    None
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! The kernels, and the helpers the K-quant kernels share; only called after
    //! [`super::available`].
    use super::super::act_quant::Q8Rows;
    use super::super::MAX_ROWS;
    use super::{block_bytes, header_bytes, kind_type, GROUP_ROWS, Q4_0, Q4_1, Q8_0};
    use crate::quant::QK;
    use std::arch::x86_64::*;

    /// The 4-byte piece of activation values at `p`, broadcast to every lane.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(in crate::linear) unsafe fn piece(p: *const i8) -> __m512i {
        _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32))
    }

    /// Bytes ahead of the block being computed that the `PF` kernels (block types and K-quants)
    /// prefetch, one hint per cache line ([`crate::simd::wants_weight_prefetch`]).
    pub(in crate::linear) const PREFETCH_AHEAD: usize = 4608;

    /// All blocks of one group against activation rows `row0..row0 + R`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn group<const R: usize, const KIND: u8, const PF: bool>(
        g: &[u8],
        acts: &Q8Rows,
        row0: usize,
        out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
    ) {
        let t = kind_type(KIND);
        let bs = block_bytes(t).unwrap_or(0);
        let stride = GROUP_ROWS * bs;
        let hb = header_bytes(t);
        let nb = acts.blocks;
        let base = g.as_ptr();
        let xs = acts.qs.as_ptr();
        let mut acc = [_mm512_setzero_ps(); R];
        let nib = _mm512_set1_epi8(15);
        for b in 0..nb {
            let p = base.add(b * stride);
            if PF {
                // a hint never faults, so running past the group's end is harmless
                let ahead = p.wrapping_add(PREFETCH_AHEAD);
                for o in (0..stride).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(o) as *const i8);
                }
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
            let q = p.add(hb);
            if KIND == Q8_0 {
                let v: [__m512i; 8] =
                    std::array::from_fn(|m| _mm512_loadu_si512(q.add(64 * m) as *const _));
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let a = (row0 + r) * nb + b;
                    let x = xs.add(a * QK);
                    let mut s0 = _mm512_set1_epi32(-128 * *acts.sum.get_unchecked(a));
                    let mut s1 = _mm512_setzero_si512();
                    for m in 0..4 {
                        s0 = _mm512_dpbusd_epi32(s0, v[m], piece(x.add(4 * m)));
                        s1 = _mm512_dpbusd_epi32(s1, v[4 + m], piece(x.add(16 + 4 * m)));
                    }
                    let [dx, _] = *acts.ds.get_unchecked(a);
                    let s = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
                    *acc_r = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(dx)), s, *acc_r);
                }
            } else {
                let v: [__m512i; 4] =
                    std::array::from_fn(|m| _mm512_loadu_si512(q.add(64 * m) as *const _));
                let lo: [__m512i; 4] = std::array::from_fn(|m| _mm512_and_si512(v[m], nib));
                let hi: [__m512i; 4] =
                    std::array::from_fn(|m| _mm512_and_si512(_mm512_srli_epi16(v[m], 4), nib));
                let mw = if KIND == Q4_1 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32) as *const __m256i))
                } else {
                    _mm512_setzero_ps()
                };
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let a = (row0 + r) * nb + b;
                    let x = xs.add(a * QK);
                    let mut s0 = if KIND == Q4_0 {
                        _mm512_set1_epi32(-8 * *acts.sum.get_unchecked(a))
                    } else {
                        _mm512_setzero_si512()
                    };
                    let mut s1 = _mm512_setzero_si512();
                    for m in 0..4 {
                        s0 = _mm512_dpbusd_epi32(s0, lo[m], piece(x.add(4 * m)));
                        s1 = _mm512_dpbusd_epi32(s1, hi[m], piece(x.add(16 + 4 * m)));
                    }
                    let [dx, sx] = *acts.ds.get_unchecked(a);
                    let s = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
                    *acc_r = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(dx)), s, *acc_r);
                    if KIND == Q4_1 {
                        *acc_r = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), *acc_r);
                    }
                }
            }
        }
        for r in 0..R {
            _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
    }

    /// Defines the public [`super::InterleavedFn`] `$name`, which hands its row count (1..=4)
    /// to `$f::<R, $c…>`.
    macro_rules! entry {
        ($(#[$doc:meta])* $name:ident, $f:ident $(, $c:expr)*) => {
            $(#[$doc])*
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            pub unsafe fn $name(
                g: &[u8],
                a: &Q8Rows,
                r0: usize,
                n: usize,
                o: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
            ) {
                match n {
                    1 => $f::<1 $(, $c)*>(g, a, r0, o),
                    2 => $f::<2 $(, $c)*>(g, a, r0, o),
                    3 => $f::<3 $(, $c)*>(g, a, r0, o),
                    _ => $f::<4 $(, $c)*>(g, a, r0, o),
                }
            }
        };
    }
    pub(in crate::linear) use entry;

    entry!(
        /// Q4_0 ([`super::InterleavedFn`]).
        group_q4_0, group, Q4_0, false
    );
    entry!(
        /// Q4_1 ([`super::InterleavedFn`]).
        group_q4_1, group, Q4_1, false
    );
    entry!(
        /// Q8_0 ([`super::InterleavedFn`]).
        group_q8_0, group, Q8_0, false
    );
    entry!(
        /// Q4_0, prefetching [`PREFETCH_AHEAD`] ([`super::InterleavedFn`]).
        group_q4_0_pf, group, Q4_0, true
    );
    entry!(
        /// Q4_1, prefetching [`PREFETCH_AHEAD`] ([`super::InterleavedFn`]).
        group_q4_1_pf, group, Q4_1, true
    );
    entry!(
        /// Q8_0, prefetching [`PREFETCH_AHEAD`] ([`super::InterleavedFn`]).
        group_q8_0_pf, group, Q8_0, true
    );
}
