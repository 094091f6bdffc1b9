//! Q6_K weights interleaved 16 rows at a time ([`super::interleaved_kquant`] has the other
//! K-quants and the common parts), and the integer `Linear` kernels that stream them.
//!
//! A group of 16 rows starts with the 16 f16 `d` of each of its super-blocks in turn (so that
//! they stream in ahead of the vectors that need them), then holds, super-block after
//! super-block, 52 vectors of 64 bytes (16 rows of 210 plain bytes less their `d`):
//! - 4 vectors of scales: byte `16·g + j` is scale `g` of row `j` (one 16-byte load and a sign
//!   extension give scale `g` of all rows as i32 lanes);
//! - then, for each group `p = 0..16` of 16 values (the values `16p..16p + 16` that share scale
//!   `p`), three vectors `A`, `B`, `C` whose byte `4j + e` holds values `v_k = v[16p + 4k + e]`
//!   of row `j`, six bits each, repacked so that the four operand vectors of a `vpdpbusd` come
//!   out with few instructions: `A = v0 << 2 | (v3 & 3)`, `B = v1 | (v3 >> 2 & 3) << 6`,
//!   `C = v2 | (v3 >> 4) << 6`.
//!
//! The bits of a row's values and its scales and `d` are those of the plain GGUF super-block,
//! moved: [`gather`] gives the plain bytes back exactly.
//!
//! Activations are Q8_0 blocks of 32 ([`Q8Rows`]); one block lines up with two scale groups.
//! Per activation block `b` of a super-block the integer sum
//! `isum = sc[2b]·(Σ_{first 16} q·x − 32·Σx) + sc[2b+1]·(Σ_{last 16} ..)` is exact, then
//! `acc += isum · (d·dx)` in block order, in the scalar reference and the SIMD kernels alike
//! (the kernels start each 16-value sum at [`Q8Rows::q6_bias`]: call
//! [`Q8Rows::prepare_sum16`] first). This module must not split work across threads or know
//! about tensors.

use super::act_quant::Q8Rows;
use super::interleaved::GROUP_ROWS;
use super::interleaved_kquant::vec_bytes;
use super::MAX_ROWS;
use crate::kquant::{Q6_K_BYTES, QK_K};
use crate::quant::rd_f16 as f16_at;

/// Bytes of the scale vectors at the start of an interleaved super-block.
const SCALES: usize = 256;

/// Bytes of the three vectors of one 16-value scale group.
const TRIPLE: usize = 192;

/// The 256 six-bit values of the plain Q6_K super-block `b` (its `ql` and `qh`), in order.
fn values(b: &[u8]) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for h in 0..2 {
        let (ql, qh) = (&b[64 * h..][..64], &b[128 + 32 * h..][..32]);
        for l in 0..32 {
            let o = 128 * h + l;
            v[o] = ql[l] & 0xF | (qh[l] & 3) << 4;
            v[o + 32] = ql[l + 32] & 0xF | (qh[l] >> 2 & 3) << 4;
            v[o + 64] = ql[l] >> 4 | (qh[l] >> 4 & 3) << 4;
            v[o + 96] = ql[l + 32] >> 4 | (qh[l] >> 6) << 4;
        }
    }
    v
}

/// Writes the six-bit values `v` as the `ql` and `qh` of the plain Q6_K super-block `b`.
fn set_values(v: &[u8; QK_K], b: &mut [u8]) {
    for h in 0..2 {
        for l in 0..32 {
            let o = 128 * h + l;
            b[64 * h + l] = v[o] & 0xF | (v[o + 64] & 0xF) << 4;
            b[64 * h + l + 32] = v[o + 32] & 0xF | (v[o + 96] & 0xF) << 4;
            b[128 + 32 * h + l] =
                v[o] >> 4 | (v[o + 32] >> 4) << 2 | (v[o + 64] >> 4) << 4 | (v[o + 96] >> 4) << 6;
        }
    }
}

/// Offset in the group of the f16 `d` of row `j` of super-block `sb` (`nb` super-blocks).
fn d_at(sb: usize, j: usize) -> usize {
    2 * (GROUP_ROWS * sb + j)
}

/// Offset in the group of the vectors of super-block `sb` (`nb` super-blocks): after the `d`
/// of all super-blocks.
fn vec_at(nb: usize, sb: usize) -> usize {
    2 * GROUP_ROWS * nb + sb * vec_bytes(Q6_K_BYTES)
}

/// Writes the plain Q6_K super-block `src` as row `j` of super-block `sb` of the interleaved
/// group `grp` (`nb` super-blocks).
pub(super) fn scatter(src: &[u8], grp: &mut [u8], nb: usize, sb: usize, j: usize) {
    let at = vec_at(nb, sb);
    for (g, &s) in src[192..208].iter().enumerate() {
        grp[at + 16 * g + j] = s;
    }
    let v = values(src);
    for (p, vp) in v.chunks_exact(16).enumerate() {
        let t = at + SCALES + TRIPLE * p + 4 * j;
        for e in 0..4 {
            let v3 = vp[12 + e];
            grp[t + e] = vp[e] << 2 | (v3 & 3);
            grp[t + 64 + e] = vp[4 + e] | (v3 >> 2 & 3) << 6;
            grp[t + 128 + e] = vp[8 + e] | (v3 >> 4) << 6;
        }
    }
    let d = d_at(sb, j);
    grp[d..d + 2].copy_from_slice(&src[208..210]);
}

/// Reads row `j` of super-block `sb` of the interleaved group `grp` (`nb` super-blocks) back
/// into the plain Q6_K super-block `out`.
pub(super) fn gather(grp: &[u8], nb: usize, sb: usize, j: usize, out: &mut [u8]) {
    let at = vec_at(nb, sb);
    for (g, o) in out[192..208].iter_mut().enumerate() {
        *o = grp[at + 16 * g + j];
    }
    let mut v = [0u8; QK_K];
    for (p, vp) in v.chunks_exact_mut(16).enumerate() {
        let t = at + SCALES + TRIPLE * p + 4 * j;
        for e in 0..4 {
            let (a, b, c) = (grp[t + e], grp[t + 64 + e], grp[t + 128 + e]);
            vp[e] = a >> 2;
            vp[4 + e] = b & 63;
            vp[8 + e] = c & 63;
            vp[12 + e] = a & 3 | (b >> 6) << 2 | (c >> 6) << 4;
        }
    }
    set_values(&v, out);
    let d = d_at(sb, j);
    out[208..210].copy_from_slice(&grp[d..d + 2]);
}

/// Scalar reference of the Q6_K group kernel (a [`super::interleaved::InterleavedFn`]): each
/// row's plain super-block is gathered back, then the module's integer math in block order.
pub(super) fn group_ref(
    g: &[u8],
    acts: &Q8Rows,
    row0: usize,
    rows: usize,
    out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
) {
    let nb = acts.blocks;
    let mut pb = vec![0u8; Q6_K_BYTES];
    for (r, o) in out.iter_mut().enumerate().take(rows) {
        for (j, oj) in o.iter_mut().enumerate() {
            let mut acc = 0f32;
            for sb in 0..nb / 8 {
                gather(g, nb / 8, sb, j, &mut pb);
                let d = f16_at(&pb, 208);
                let v = values(&pb);
                for b in 0..8 {
                    let a = (row0 + r) * nb + sb * 8 + b;
                    let x = &acts.qs[a * 32..][..32];
                    let mut isum = 0i32;
                    for (h, xh) in x.chunks_exact(16).enumerate() {
                        let q = &v[32 * b + 16 * h..][..16];
                        let s: i32 = q
                            .iter()
                            .zip(xh)
                            .map(|(&q, &x)| (q as i32 - 32) * x as i32)
                            .sum();
                        isum += pb[192 + 2 * b + h] as i8 as i32 * s;
                    }
                    acc = (isum as f32).mul_add(d * acts.ds[a][0], acc);
                }
            }
            *oj = acc;
        }
    }
}

/// The SIMD kernel for this CPU (called only where `interleaved::available()`): the one that
/// assembles the six-bit values with GFNI byte transforms where the CPU has GFNI.
#[cfg(target_arch = "x86_64")]
pub(super) fn simd() -> super::interleaved::InterleavedFn {
    if is_x86_feature_detected!("gfni") {
        avx512::group_q6_k_gfni
    } else {
        avx512::group_q6_k
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! The kernels; only called after `interleaved::available()` (and GFNI detected, for
    //! [`group_q6_k_gfni`]).
    use super::super::act_quant::Q8Rows;
    use super::super::interleaved::avx512::piece;
    use super::super::interleaved_kquant::avx512::{ld, prefetch, prefetch_l2};
    use super::super::MAX_ROWS;
    use super::{vec_bytes, GROUP_ROWS, Q6_K_BYTES, SCALES, TRIPLE};
    use std::arch::x86_64::*;

    /// Super-blocks ahead of the one being computed that are prefetched into L2 (past the
    /// group's end too: the next group follows; a prefetch never faults).
    const L2_AHEAD: usize = 16;

    /// Super-blocks ahead of the one being computed that are prefetched again, into L1.
    const L1_AHEAD: usize = 2;

    /// The four operand vectors of the scale group whose vectors `A`, `B`, `C` are at `p`
    /// (module docs): lane `j` of vector `k` holds values `4k..4k + 4` of row `j`'s group, one
    /// byte each. Shifts and masks.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn quads(p: *const u8) -> [__m512i; 4] {
        let (a, b, c) = (ld(p), ld(p.add(64)), ld(p.add(128)));
        let (m3, m15, m63) = (
            _mm512_set1_epi8(3),
            _mm512_set1_epi8(15),
            _mm512_set1_epi8(63),
        );
        // bits 0..2 of `a`, the rest of `b >> 4` (its bits 2..4 are `B`'s top two)
        let t = _mm512_ternarylogic_epi32::<0xE4>(a, _mm512_srli_epi16::<4>(b), m3);
        // bits 0..4 of `t`, the rest of `c >> 2` (bits 4..6: `C`'s top two; 6..8 masked)
        let u = _mm512_ternarylogic_epi32::<0xE4>(t, _mm512_srli_epi16::<2>(c), m15);
        [
            _mm512_and_si512(_mm512_srli_epi16::<2>(a), m63),
            _mm512_and_si512(b, m63),
            _mm512_and_si512(c, m63),
            _mm512_and_si512(u, m63),
        ]
    }

    /// [`quads`] with GFNI: a byte's bits moved by `vgf2p8affineqb` (the matrix's byte `7 − i`
    /// selects the source bits of result bit `i`; the immediate is XORed in).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
    unsafe fn quads_gfni(p: *const u8) -> [__m512i; 4] {
        let (a, b, c) = (ld(p), ld(p.add(64)), ld(p.add(128)));
        let m63 = _mm512_set1_epi8(63);
        let shr2 = _mm512_set1_epi64(0x0408_1020_4080_0000); // bit i + 2 to bit i
        let b67_to_23 = _mm512_set1_epi64(0x0000_4080_0000_0000);
        let c67_to_45 = _mm512_set1_epi64(0x0000_0000_4080_0000);
        // `B`'s and `C`'s top bits moved into place, with bits 0..2 set in both: a marker
        // that picks `a`'s own bits 0..2 in the select below
        let bb = _mm512_gf2p8affine_epi64_epi8::<3>(b, b67_to_23);
        let cc = _mm512_gf2p8affine_epi64_epi8::<3>(c, c67_to_45);
        [
            _mm512_gf2p8affine_epi64_epi8::<0>(a, shr2),
            _mm512_and_si512(b, m63),
            _mm512_and_si512(c, m63),
            // (bb & cc) ? a : (bb | cc)
            _mm512_ternarylogic_epi32::<0xE6>(a, bb, cc),
        ]
    }

    /// All super-blocks of one group against activation rows `row0..row0 + R` into `out[..R]`,
    /// the values assembled by [`quads_gfni`] (`GFNI`) or [`quads`]; inlined into a caller
    /// that enables the features of both.
    #[inline(always)]
    unsafe fn q6<const R: usize, const GFNI: bool>(
        g: &[u8],
        acts: &Q8Rows,
        row0: usize,
        out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
    ) {
        let nb = acts.blocks;
        let vb = vec_bytes(Q6_K_BYTES);
        let (base, xs, ds, bias) = (
            g.as_ptr(),
            acts.qs.as_ptr(),
            acts.ds.as_ptr(),
            acts.q6_bias.as_ptr(),
        );
        // the 16 f16 `d` of each super-block, then the vectors
        let (dbase, base) = (base, base.add(2 * GROUP_ROWS * (nb / 8)));
        let mut acc = [_mm512_setzero_ps(); R];
        for sb in 0..nb / 8 {
            let v = base.add(sb * vb);
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(dbase.add(32 * sb) as *const __m256i));
            for b in 0..8 {
                let a0 = |r: usize| (row0 + r) * nb + sb * 8 + b;
                // this block's share (an eighth, rounded up to lines) of the super-blocks
                // `L2_AHEAD` and `L1_AHEAD` on
                prefetch_l2(v.wrapping_add(L2_AHEAD * vb + 416 * b), 448);
                prefetch(v.wrapping_add(L1_AHEAD * vb + 416 * b), 448);
                let mut isum = [_mm512_setzero_si512(); R];
                for h in 0..2 {
                    let p = 2 * b + h;
                    let q = if GFNI {
                        quads_gfni(v.add(SCALES + TRIPLE * p))
                    } else {
                        quads(v.add(SCALES + TRIPLE * p))
                    };
                    let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(v.add(16 * p) as *const _));
                    for (r, ir) in isum.iter_mut().enumerate() {
                        let x = xs.add(a0(r) * 32 + 16 * h);
                        let mut s = _mm512_set1_epi32((*bias.add(a0(r)))[h]);
                        for (k, qk) in q.iter().enumerate() {
                            s = _mm512_dpbusd_epi32(s, *qk, piece(x.add(4 * k)));
                        }
                        *ir = _mm512_add_epi32(*ir, _mm512_mullo_epi32(s, sc));
                    }
                }
                for (r, ar) in acc.iter_mut().enumerate() {
                    let f = _mm512_mul_ps(d, _mm512_set1_ps((*ds.add(a0(r)))[0]));
                    *ar = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), f, *ar);
                }
            }
        }
        for (r, ar) in acc.iter().enumerate() {
            _mm512_storeu_ps(out[r].as_mut_ptr(), *ar);
        }
    }

    /// Q6_K ([`super::super::interleaved::InterleavedFn`]; needs [`Q8Rows::q6_bias`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn group_q6_k(
        g: &[u8],
        a: &Q8Rows,
        r0: usize,
        n: usize,
        o: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
    ) {
        match n {
            1 => q6::<1, false>(g, a, r0, o),
            2 => q6::<2, false>(g, a, r0, o),
            3 => q6::<3, false>(g, a, r0, o),
            _ => q6::<4, false>(g, a, r0, o),
        }
    }

    /// Q6_K with GFNI ([`super::super::interleaved::InterleavedFn`]; needs
    /// [`Q8Rows::q6_bias`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,gfni")]
    pub unsafe fn group_q6_k_gfni(
        g: &[u8],
        a: &Q8Rows,
        r0: usize,
        n: usize,
        o: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
    ) {
        match n {
            1 => q6::<1, true>(g, a, r0, o),
            2 => q6::<2, true>(g, a, r0, o),
            3 => q6::<3, true>(g, a, r0, o),
            _ => q6::<4, true>(g, a, r0, o),
        }
    }
}
