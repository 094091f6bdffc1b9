//! K-quant weights (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) interleaved 16 rows at a time, and the
//! integer `Linear` kernels that stream Q4_K/Q5_K (`super::interleaved_kquant_low` has Q2_K's
//! and Q3_K's, `super::interleaved_q6` Q6_K's layout and kernels).
//!
//! The layout is a transpose of 4-byte words: rows are taken in groups of [`GROUP_ROWS`], and a
//! group stores, super-block after super-block, `W = bytes / 4` vectors `V_m` of 64 bytes whose
//! 32-bit lane `j` holds bytes `4m..4m+4` of row `j`'s super-block (the plain GGUF bytes,
//! unchanged). Q3_K's 110-byte super-blocks end in a 2-byte `d`: a group starts with the 16 f16
//! `d` of each of its super-blocks in turn (so that they stream in ahead of the vectors that
//! need them), then keeps the whole vectors of each super-block (whole cache lines); the
//! Q2_K/Q3_K layouts are in
//! `super::interleaved_kquant_low`:
//!
//! | format | plain super-block (`crate::kquant`) | one super-block of a group |
//! |---|---|---|
//! | Q4_K | 144 bytes: `d, dmin`, 12 scale bytes, 128 `qs` | 36 vectors (2304 bytes) |
//! | Q5_K | 176 bytes: `d, dmin`, 12 scale bytes, 32 `qh`, 128 `qs` | 44 vectors (2816 bytes) |
//! | Q6_K | 210 bytes: 128 `ql`, 64 `qh`, 16 scales, `d` | 52 vectors (3328 bytes) + 32 bytes of `d` at the group's start, bits repacked (`super::interleaved_q6`) |
//!
//! So one 512-bit load gives the same four bytes of all 16 rows: their `d`/`dmin` pair, a word of
//! packed scales, or four quant bytes, which after masking meet one broadcast 4-byte piece of an
//! activation block in a single `vpdpbusd`; the 16 lanes accumulate the 16 rows' dots.
//!
//! Activations are Q8_0 blocks of 32 ([`Q8Rows`]); one block lines up with one Q4_K/Q5_K
//! sub-block. Per activation block `b` the products are summed exactly in integers, then, in
//! block order (the scalar reference and the SIMD kernels alike),
//! `acc += Σq·x · ((d·sc[b])·dx)` and `accm += (dmin·m[b])·(dx·Σx)`; the result is `acc − accm`.
//!
//! Matrices whose row count is not a multiple of [`GROUP_ROWS`] are not interleaved. This module
//! must not split work across threads or know about tensors.

use super::act_quant::Q8Rows;
use super::interleaved::{InterleavedFn, GROUP_ROWS};
use super::{WeightType, MAX_ROWS};
use crate::kquant::{scales_mins, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K};
use crate::kquant_low::{Q2_K_BYTES, Q3_K_BYTES};
use crate::quant::rd_f16 as f16_at;

/// True for the K-quant types this module interleaves (all of them).
pub fn is_kquant(t: WeightType) -> bool {
    t.is_kquant()
}

/// Bytes of one plain super-block of `t` (`None` for other types).
fn block_bytes(t: WeightType) -> Option<usize> {
    match t {
        WeightType::Q4K => Some(Q4_K_BYTES),
        WeightType::Q5K => Some(Q5_K_BYTES),
        WeightType::Q6K => Some(Q6_K_BYTES),
        WeightType::Q2K => Some(Q2_K_BYTES),
        WeightType::Q3K => Some(Q3_K_BYTES),
        _ => None,
    }
}

/// Checks an interleaving request: `w` holds `n` plain rows of `k` values of `t`; returns the
/// plain super-block bytes.
fn check(t: WeightType, w: &[u8], n: usize, k: usize) -> Result<usize, String> {
    let bs = block_bytes(t).ok_or_else(|| format!("{} weights are not K-quants", t.name()))?;
    super::interleaved::check_shape(t, w, n, k, QK_K, bs)?;
    Ok(bs)
}

/// Bytes of the vectors of one interleaved super-block (16 rows): all of it for Q2_K/Q4_K/Q5_K,
/// the whole vectors without the 16 `d` for Q3_K/Q6_K.
pub(super) fn vec_bytes(bs: usize) -> usize {
    GROUP_ROWS * (bs / 4) * 4
}

/// The `(plain offset, offset in the group, length)` pieces of row `j` of super-block `sb` of an
/// interleaved group of `nb` super-blocks of `bs`-byte plain super-blocks (not Q6_K): the
/// (Q3_K) 16 f16 `d` of every super-block at the group's start, then the vectors of super-block
/// `sb` at `sb * vec_bytes(bs)` past them, so that each vector starts on a cache line.
fn pieces(
    bs: usize,
    nb: usize,
    sb: usize,
    j: usize,
) -> impl Iterator<Item = (usize, usize, usize)> {
    let (nw, tail) = (bs / 4, bs % 4);
    let at = GROUP_ROWS * tail * nb + sb * vec_bytes(bs);
    let tail_at = GROUP_ROWS * tail * sb + tail * j;
    (0..nw)
        .map(move |m| (4 * m, at + 64 * m + 4 * j, 4))
        .chain(std::iter::once((4 * nw, tail_at, tail)))
}

/// Writes the plain super-block `src` as row `j` of super-block `sb` of the interleaved group
/// `grp` (`nb` super-blocks).
fn scatter(src: &[u8], grp: &mut [u8], nb: usize, sb: usize, j: usize) {
    if src.len() == Q6_K_BYTES {
        return super::interleaved_q6::scatter(src, grp, nb, sb, j);
    }
    for (s, d, len) in pieces(src.len(), nb, sb, j) {
        grp[d..d + len].copy_from_slice(&src[s..s + len]);
    }
}

/// Reads row `j` of super-block `sb` of the interleaved group `grp` (`nb` super-blocks) back
/// into the plain super-block `out`.
pub(super) fn gather(grp: &[u8], nb: usize, sb: usize, j: usize, out: &mut [u8]) {
    if out.len() == Q6_K_BYTES {
        return super::interleaved_q6::gather(grp, nb, sb, j, out);
    }
    for (s, d, len) in pieces(out.len(), nb, sb, j) {
        out[s..s + len].copy_from_slice(&grp[d..d + len]);
    }
}

/// Interleaves the plain `n × k` K-quant weight `w` of type `t` into `out` (the same number of
/// bytes).
pub fn interleave(
    t: WeightType,
    w: &[u8],
    n: usize,
    k: usize,
    out: &mut [u8],
) -> Result<(), String> {
    let bs = check(t, w, n, k)?;
    let nb = k / QK_K;
    if out.len() < n * nb * bs {
        return Err(format!(
            "interleaved output has {} bytes, needs {}",
            out.len(),
            n * nb * bs
        ));
    }
    for g in 0..n / GROUP_ROWS {
        let dst = &mut out[g * nb * GROUP_ROWS * bs..][..nb * GROUP_ROWS * bs];
        for b in 0..nb {
            for j in 0..GROUP_ROWS {
                scatter(
                    &w[((g * GROUP_ROWS + j) * nb + b) * bs..][..bs],
                    dst,
                    nb,
                    b,
                    j,
                );
            }
        }
    }
    Ok(())
}

/// Row `r` of an interleaved `n × k` K-quant weight of type `t`, in the plain layout, into `out`.
pub fn plain_row(
    t: WeightType,
    w: &[u8],
    n: usize,
    k: usize,
    r: usize,
    out: &mut [u8],
) -> Result<(), String> {
    let bs = check(t, w, n, k)?;
    let nb = k / QK_K;
    super::interleaved::check_row(r, n, out, nb * bs)?;
    let (g, j) = (r / GROUP_ROWS, r % GROUP_ROWS);
    let grp = &w[g * nb * GROUP_ROWS * bs..][..nb * GROUP_ROWS * bs];
    for b in 0..nb {
        gather(grp, nb, b, j, &mut out[b * bs..(b + 1) * bs]);
    }
    Ok(())
}

/// Scalar reference of the Q4_K (`Q5 = false`) / Q5_K group kernels: each row's plain
/// super-block is gathered back from the words, then the module's integer math in block order.
fn ref_q45<const Q5: bool>(
    g: &[u8],
    acts: &Q8Rows,
    row0: usize,
    rows: usize,
    out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
) {
    let (bs, qs_at) = if Q5 {
        (Q5_K_BYTES, 48)
    } else {
        (Q4_K_BYTES, 16)
    };
    let nb = acts.blocks;
    let mut pb = vec![0u8; bs];
    for (r, o) in out.iter_mut().enumerate().take(rows) {
        for (j, oj) in o.iter_mut().enumerate() {
            let (mut acc, mut accm) = (0f32, 0f32);
            for sb in 0..nb / 8 {
                gather(g, nb / 8, sb, j, &mut pb);
                let (d, dmin) = (f16_at(&pb, 0), f16_at(&pb, 2));
                let (sc, m) = scales_mins(&pb[4..16]);
                for s in 0..8 {
                    let a = (row0 + r) * nb + sb * 8 + s;
                    let x = &acts.qs[a * 32..][..32];
                    let q = &pb[qs_at + 32 * (s / 2)..][..32];
                    let mut isum = 0i32;
                    for l in 0..32 {
                        let lo = (q[l] >> (4 * (s % 2))) & 0xF;
                        let hi = if Q5 { ((pb[16 + l] >> s) & 1) << 4 } else { 0 };
                        isum += (lo | hi) as i32 * x[l] as i32;
                    }
                    let [dx, sx] = acts.ds[a];
                    let scf = d * ((sc >> (8 * s)) & 0xff) as f32;
                    acc = (isum as f32).mul_add(scf * dx, acc);
                    accm = (dmin * ((m >> (8 * s)) & 0xff) as f32).mul_add(sx, accm);
                }
            }
            *oj = acc - accm;
        }
    }
}

/// The scalar reference kernel for interleaved K-quant weights of type `t` (`None` for other
/// types).
pub(super) fn pick_ref(t: WeightType) -> Option<InterleavedFn> {
    Some(match t {
        WeightType::Q4K => ref_q45::<false>,
        WeightType::Q5K => ref_q45::<true>,
        WeightType::Q6K => super::interleaved_q6::group_ref,
        _ => return super::interleaved_kquant_low::pick_ref(t),
    })
}

/// The SIMD kernel for interleaved K-quant weights of type `t`, for a CPU that has
/// [`super::interleaved::pick`]'s kernels (`None` for other types); `pf`: Q4_K and Q5_K
/// prefetch their stream ([`crate::simd::wants_weight_prefetch`]).
#[cfg(target_arch = "x86_64")]
pub(super) fn simd(t: WeightType, pf: bool) -> Option<InterleavedFn> {
    Some(match (t, pf) {
        (WeightType::Q4K, false) => avx512::group_q4_k,
        (WeightType::Q5K, false) => avx512::group_q5_k,
        (WeightType::Q4K, true) => avx512::group_q4_k_pf,
        (WeightType::Q5K, true) => avx512::group_q5_k_pf,
        (WeightType::Q6K, _) => super::interleaved_q6::simd(),
        _ => return super::interleaved_kquant_low::simd(t),
    })
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! The kernels, and the helpers the Q2_K/Q3_K kernels share; only called after
    //! `interleaved::available()`.
    use super::super::act_quant::Q8Rows;
    use super::super::interleaved::avx512::{entry, piece, PREFETCH_AHEAD};
    use super::super::MAX_ROWS;
    use super::GROUP_ROWS;
    use crate::kquant::{Q4_K_BYTES, Q5_K_BYTES};
    use std::arch::x86_64::*;

    /// Prefetches the `bytes` bytes at `p` into L1 (one hint per cache line).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(in crate::linear) unsafe fn prefetch(p: *const u8, bytes: usize) {
        let mut o = 0;
        while o < bytes {
            _mm_prefetch(p.wrapping_add(o) as *const i8, _MM_HINT_T0);
            o += 64;
        }
    }

    /// Prefetches the `bytes` bytes at `p` into L2 only (one hint per cache line): for a stream
    /// that a kernel reads far ahead of its use, where filling L1 early would evict the lines in
    /// use.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(in crate::linear) unsafe fn prefetch_l2(p: *const u8, bytes: usize) {
        let mut o = 0;
        while o < bytes {
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(o) as *const i8);
            o += 64;
        }
    }

    /// The 64 bytes at `p`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(in crate::linear) unsafe fn ld(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p as *const _)
    }

    /// `(v >> n) & mask` in every 32-bit lane.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(in crate::linear) unsafe fn field(v: __m512i, n: u32, mask: i32) -> __m512i {
        _mm512_and_si512(
            _mm512_srlv_epi32(v, _mm512_set1_epi32(n as i32)),
            _mm512_set1_epi32(mask),
        )
    }

    /// Scale and min of sub-block `s` of all 16 rows (f32 lanes, not yet times `d`/`dmin`), from
    /// the three packed-scale words `a`, `b`, `c` (plain bytes 4..16; `crate::kquant::scales_mins`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn scale_min(a: __m512i, b: __m512i, c: __m512i, s: u32) -> (__m512, __m512) {
        let (sc, m) = if s < 4 {
            (field(a, 8 * s, 63), field(b, 8 * s, 63))
        } else {
            let i = s - 4;
            let top = |v| _mm512_slli_epi32::<4>(field(v, 8 * i + 6, 3));
            (
                _mm512_or_si512(field(c, 8 * i, 15), top(a)),
                _mm512_or_si512(field(c, 8 * i + 4, 15), top(b)),
            )
        };
        (_mm512_cvtepi32_ps(sc), _mm512_cvtepi32_ps(m))
    }

    /// Q4_K / Q5_K: all super-blocks of one group against activation rows `row0..row0 + R`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn q45<const R: usize, const Q5: bool, const PF: bool>(
        g: &[u8],
        acts: &Q8Rows,
        row0: usize,
        out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
    ) {
        let (bs, qs_word) = if Q5 {
            (Q5_K_BYTES, 12)
        } else {
            (Q4_K_BYTES, 4)
        };
        let nb = acts.blocks;
        let (base, xs, ds) = (g.as_ptr(), acts.qs.as_ptr(), acts.ds.as_ptr());
        let (m4, one) = (_mm512_set1_epi8(15), _mm512_set1_epi8(1));
        let mut acc = [_mm512_setzero_ps(); R];
        let mut accm = [_mm512_setzero_ps(); R];
        for sb in 0..nb / 8 {
            let p = base.add(sb * GROUP_ROWS * bs);
            let w0 = ld(p);
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w0));
            let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(w0)));
            let (wa, wb, wc) = (ld(p.add(64)), ld(p.add(128)), ld(p.add(192)));
            for c in 0..4 {
                if PF {
                    // a quarter of the super-block per chunk; a hint never faults
                    let q = GROUP_ROWS * bs / 4;
                    prefetch(p.wrapping_add(PREFETCH_AHEAD + c * q), q);
                }
                let (sc0, mn0) = scale_min(wa, wb, wc, 2 * c as u32);
                let (sc1, mn1) = scale_min(wa, wb, wc, 2 * c as u32 + 1);
                let mut s = [[_mm512_setzero_si512(); 4]; R];
                for u in 0..8 {
                    let v = ld(p.add(64 * (qs_word + 8 * c + u)));
                    let mut lo = _mm512_and_si512(v, m4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                    if Q5 {
                        let h = ld(p.add(64 * (4 + u)));
                        let h = _mm512_srl_epi16(h, _mm_cvtsi32_si128(2 * c as i32));
                        let b0 = _mm512_and_si512(h, one);
                        let b1 = _mm512_and_si512(_mm512_srli_epi16::<1>(h), one);
                        lo = _mm512_or_si512(lo, _mm512_slli_epi16::<4>(b0));
                        hi = _mm512_or_si512(hi, _mm512_slli_epi16::<4>(b1));
                    }
                    for (r, sr) in s.iter_mut().enumerate() {
                        let x = xs.add(((row0 + r) * nb + sb * 8 + 2 * c) * 32 + 4 * u);
                        sr[u / 4] = _mm512_dpbusd_epi32(sr[u / 4], lo, piece(x));
                        sr[2 + u / 4] = _mm512_dpbusd_epi32(sr[2 + u / 4], hi, piece(x.add(32)));
                    }
                }
                let (f0, f1) = (_mm512_mul_ps(d, sc0), _mm512_mul_ps(d, sc1));
                let (n0, n1) = (_mm512_mul_ps(dmin, mn0), _mm512_mul_ps(dmin, mn1));
                for r in 0..R {
                    let a = (row0 + r) * nb + sb * 8 + 2 * c;
                    let ([dx0, sx0], [dx1, sx1]) = (*ds.add(a), *ds.add(a + 1));
                    let i0 = _mm512_cvtepi32_ps(_mm512_add_epi32(s[r][0], s[r][1]));
                    let i1 = _mm512_cvtepi32_ps(_mm512_add_epi32(s[r][2], s[r][3]));
                    acc[r] = _mm512_fmadd_ps(i0, _mm512_mul_ps(f0, _mm512_set1_ps(dx0)), acc[r]);
                    accm[r] = _mm512_fmadd_ps(n0, _mm512_set1_ps(sx0), accm[r]);
                    acc[r] = _mm512_fmadd_ps(i1, _mm512_mul_ps(f1, _mm512_set1_ps(dx1)), acc[r]);
                    accm[r] = _mm512_fmadd_ps(n1, _mm512_set1_ps(sx1), accm[r]);
                }
            }
        }
        for r in 0..R {
            _mm512_storeu_ps(out[r].as_mut_ptr(), _mm512_sub_ps(acc[r], accm[r]));
        }
    }

    entry!(
        /// Q4_K ([`super::InterleavedFn`]).
        group_q4_k, q45, false, false
    );
    entry!(
        /// Q5_K ([`super::InterleavedFn`]).
        group_q5_k, q45, true, false
    );
    entry!(
        /// Q4_K, prefetching `PREFETCH_AHEAD` ([`super::InterleavedFn`]).
        group_q4_k_pf, q45, false, true
    );
    entry!(
        /// Q5_K, prefetching `PREFETCH_AHEAD` ([`super::InterleavedFn`]).
        group_q5_k_pf, q45, true, true
    );
}
