//! K-quant weights (Q4_K, Q5_K, Q6_K) interleaved 16 rows at a time, and the integer `Linear`
//! kernels that stream them.
//!
//! The layout is a transpose of 4-byte words: rows are taken in groups of [`GROUP_ROWS`], and a
//! group stores, super-block after super-block, `W = bytes / 4` vectors `V_m` of 64 bytes whose
//! 32-bit lane `j` holds bytes `4m..4m+4` of row `j`'s super-block (the plain GGUF bytes,
//! unchanged), after the `bytes % 4` trailing bytes of the 16 rows, row after row; Q6_K's
//! vectors are reordered so that a kernel touches them in ascending order ([`q6_word_pos`]):
//!
//! | format | plain super-block (`crate::kquant`) | one super-block of a group |
//! |---|---|---|
//! | Q4_K | 144 bytes: `d, dmin`, 12 scale bytes, 128 `qs` | 36 vectors (2304 bytes) |
//! | Q5_K | 176 bytes: `d, dmin`, 12 scale bytes, 32 `qh`, 128 `qs` | 44 vectors (2816 bytes) |
//! | Q6_K | 210 bytes: 128 `ql`, 64 `qh`, 16 scales, `d` | 16 f16 `d`, then 52 vectors (3360 bytes) |
//!
//! So one 512-bit load gives the same four bytes of all 16 rows: their `d`/`dmin` pair, a word of
//! packed scales, or four quant bytes, which after masking meet one broadcast 4-byte piece of an
//! activation block in a single `vpdpbusd`; the 16 lanes accumulate the 16 rows' dots.
//!
//! Activations are Q8_0 blocks of 32 ([`Q8Rows`]); one block lines up with one Q4_K/Q5_K
//! sub-block and two Q6_K scale groups. Per activation block `b` the products are summed exactly
//! in integers, then, in block order (the scalar reference and the SIMD kernels alike):
//! - Q4_K/Q5_K: `acc += Σq·x · ((d·sc[b])·dx)` and `accm += (dmin·m[b])·(dx·Σx)`; the result is
//!   `acc − accm`;
//! - Q6_K: `acc += (sc[2b]·(Σ_{first 16} q·x − 32·Σx) + sc[2b+1]·(Σ_{last 16} ..)) · (d·dx)`, the
//!   16-value sums of `x` read from [`Q8Rows::sum16`] (call [`Q8Rows::prepare_sum16`] first).
//!
//! Matrices whose row count is not a multiple of [`GROUP_ROWS`] are not interleaved. This module
//! must not split work across threads or know about tensors.

use super::act_quant::Q8Rows;
use super::interleaved::{InterleavedFn, GROUP_ROWS};
use super::{WeightType, MAX_ROWS};
use crate::kquant::{q6_k_value, scales_mins, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K};
use half::f16;

/// True for the K-quant types this module interleaves.
pub fn is_kquant(t: WeightType) -> bool {
    matches!(t, WeightType::Q4K | WeightType::Q5K | WeightType::Q6K)
}

/// Bytes of one plain super-block of `t` (`None` for other types).
fn block_bytes(t: WeightType) -> Option<usize> {
    match t {
        WeightType::Q4K => Some(Q4_K_BYTES),
        WeightType::Q5K => Some(Q5_K_BYTES),
        WeightType::Q6K => Some(Q6_K_BYTES),
        _ => None,
    }
}

/// Checks an interleaving request: `w` holds `n` plain rows of `k` values of `t`; returns the
/// plain super-block bytes.
fn check(t: WeightType, w: &[u8], n: usize, k: usize) -> Result<usize, String> {
    let bs = block_bytes(t).ok_or_else(|| format!("{} weights are not K-quants", t.name()))?;
    if !n.is_multiple_of(GROUP_ROWS) || !k.is_multiple_of(QK_K) || k == 0 {
        return Err(format!(
            "interleaving needs rows a multiple of {GROUP_ROWS} and k a multiple of {QK_K}, got {n} x {k}"
        ));
    }
    let need = n
        .checked_mul(k / QK_K * bs)
        .ok_or_else(|| format!("{n} x {k} weight size overflows"))?;
    if w.len() < need {
        return Err(format!(
            "weight has {} bytes, {n} x {k} {} needs {need}",
            w.len(),
            t.name()
        ));
    }
    Ok(bs)
}

/// Position of plain word `m` among the vectors of an interleaved Q6_K super-block: the scales,
/// then per half `h` the `ql` words of its first 32 bytes, its `qh` words, the `ql` words of its
/// last 32 bytes (the order the kernel first touches them).
fn q6_word_pos(m: usize) -> usize {
    match m {
        48..52 => m - 48,
        32..48 => 4 + 24 * ((m - 32) / 8) + 8 + (m - 32) % 8,
        _ => 4 + 24 * (m / 16) + if m % 16 < 8 { m % 16 } else { 8 + m % 16 },
    }
}

/// The `(plain offset, interleaved offset, length)` pieces of row `j` of an interleaved
/// super-block of `bs`-byte plain super-blocks (Q6_K: the 16 `d` first, then the words in the
/// order of [`q6_word_pos`]).
fn pieces(bs: usize, j: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let (nw, tail) = (bs / 4, bs % 4);
    let q6 = bs == Q6_K_BYTES;
    let pos = move |m| if q6 { 32 + 64 * q6_word_pos(m) } else { 64 * m };
    (0..nw)
        .map(move |m| (4 * m, pos(m) + 4 * j, 4))
        .chain(std::iter::once((4 * nw, tail * j, tail)))
}

/// Writes the plain super-block `src` as row `j` of the interleaved super-block `grp`.
fn scatter(src: &[u8], grp: &mut [u8], j: usize) {
    for (s, d, len) in pieces(src.len(), j) {
        grp[d..d + len].copy_from_slice(&src[s..s + len]);
    }
}

/// Reads row `j` of the interleaved super-block `grp` back into the plain super-block `out`.
fn gather(grp: &[u8], j: usize, out: &mut [u8]) {
    for (s, d, len) in pieces(out.len(), j) {
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
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * GROUP_ROWS * bs..][..GROUP_ROWS * bs];
            for j in 0..GROUP_ROWS {
                scatter(&w[((g * GROUP_ROWS + j) * nb + b) * bs..][..bs], dst, j);
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
    if r >= n || out.len() < nb * bs {
        return Err(format!(
            "row {r} of {n}, or output of {} bytes too small",
            out.len()
        ));
    }
    let (g, j) = (r / GROUP_ROWS, r % GROUP_ROWS);
    for b in 0..nb {
        let grp = &w[(g * nb + b) * GROUP_ROWS * bs..][..GROUP_ROWS * bs];
        gather(grp, j, &mut out[b * bs..(b + 1) * bs]);
    }
    Ok(())
}

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
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
                gather(&g[sb * GROUP_ROWS * bs..][..GROUP_ROWS * bs], j, &mut pb);
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

/// Scalar reference of the Q6_K group kernel.
fn ref_q6(
    g: &[u8],
    acts: &Q8Rows,
    row0: usize,
    rows: usize,
    out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
) {
    let bs = Q6_K_BYTES;
    let nb = acts.blocks;
    let mut pb = vec![0u8; bs];
    for (r, o) in out.iter_mut().enumerate().take(rows) {
        for (j, oj) in o.iter_mut().enumerate() {
            let mut acc = 0f32;
            for sb in 0..nb / 8 {
                gather(&g[sb * GROUP_ROWS * bs..][..GROUP_ROWS * bs], j, &mut pb);
                let d = f16_at(&pb, 208);
                for b in 0..8 {
                    let a = (row0 + r) * nb + sb * 8 + b;
                    let x = &acts.qs[a * 32..][..32];
                    let mut isum = 0i32;
                    for (h, xh) in x.chunks_exact(16).enumerate() {
                        let mut s = 0i32;
                        for (l, &xl) in xh.iter().enumerate() {
                            let q = q6_k_value(&pb, 32 * b + 16 * h + l) as i32;
                            s += (q - 32) * xl as i32;
                        }
                        isum += pb[192 + 2 * b + h] as i8 as i32 * s;
                    }
                    acc = (isum as f32).mul_add(d * acts.ds[a][0], acc);
                }
            }
            *oj = acc;
        }
    }
}

/// # Safety
/// See [`InterleavedFn`].
unsafe fn ref_q4_k(
    g: &[u8],
    a: &Q8Rows,
    r0: usize,
    n: usize,
    o: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
) {
    ref_q45::<false>(g, a, r0, n, o)
}
/// # Safety
/// See [`InterleavedFn`].
unsafe fn ref_q5_k(
    g: &[u8],
    a: &Q8Rows,
    r0: usize,
    n: usize,
    o: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
) {
    ref_q45::<true>(g, a, r0, n, o)
}
/// # Safety
/// See [`InterleavedFn`].
unsafe fn ref_q6_k(
    g: &[u8],
    a: &Q8Rows,
    r0: usize,
    n: usize,
    o: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
) {
    ref_q6(g, a, r0, n, o)
}

/// The scalar reference kernel for interleaved K-quant weights of type `t` (`None` for other
/// types). Q6_K reads [`Q8Rows::sum16`] in its SIMD kernel only; the reference sums `x` itself.
pub fn pick_ref(t: WeightType) -> Option<InterleavedFn> {
    Some(match t {
        WeightType::Q4K => ref_q4_k,
        WeightType::Q5K => ref_q5_k,
        WeightType::Q6K => ref_q6_k,
        _ => return None,
    })
}

/// The SIMD kernel for interleaved K-quant weights of type `t`, if this CPU has one (AVX-512
/// F/BW/VL and VNNI).
pub fn pick(t: WeightType) -> Option<InterleavedFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if super::interleaved::available() {
            let f: InterleavedFn = match t {
                WeightType::Q4K => avx512::group_q4_k,
                WeightType::Q5K => avx512::group_q5_k,
                WeightType::Q6K => avx512::group_q6_k,
                _ => return None,
            };
            return Some(f);
        }
    }
    let _ = t;
    None
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The kernels; only called after `interleaved::available()`.
    use super::super::act_quant::Q8Rows;
    use super::super::MAX_ROWS;
    use super::GROUP_ROWS;
    use crate::kquant::{Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES};
    use std::arch::x86_64::*;

    /// The 4-byte piece of activation values at `p`, broadcast to every lane.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn piece(p: *const i8) -> __m512i {
        _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32))
    }

    /// Super-blocks ahead of the one being computed that are prefetched (past a group's end too:
    /// the next group follows; a prefetch never faults).
    const PREFETCH_AHEAD: usize = 2;

    /// Prefetches the `bytes` bytes at `p` into L1 (one hint per cache line).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn prefetch(p: *const u8, bytes: usize) {
        let mut o = 0;
        while o < bytes {
            _mm_prefetch(p.wrapping_add(o) as *const i8, _MM_HINT_T0);
            o += 64;
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn ld(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p as *const _)
    }

    /// `(v >> n) & mask` in every 32-bit lane.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn field(v: __m512i, n: u32, mask: i32) -> __m512i {
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
    unsafe fn q45<const R: usize, const Q5: bool>(
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
            prefetch(
                p.wrapping_add(PREFETCH_AHEAD * GROUP_ROWS * bs),
                GROUP_ROWS * bs,
            );
            let w0 = ld(p);
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w0));
            let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(w0)));
            let (wa, wb, wc) = (ld(p.add(64)), ld(p.add(128)), ld(p.add(192)));
            for c in 0..4 {
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

    /// Q6_K: all super-blocks of one group against activation rows `row0..row0 + R`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn q6<const R: usize>(
        g: &[u8],
        acts: &Q8Rows,
        row0: usize,
        out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
    ) {
        let nb = acts.blocks;
        let (base, xs, ds, s16) = (
            g.as_ptr(),
            acts.qs.as_ptr(),
            acts.ds.as_ptr(),
            acts.sum16.as_ptr(),
        );
        let (m4, m3) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(3));
        let mut acc = [_mm512_setzero_ps(); R];
        for sb in 0..nb / 8 {
            let p = base.add(sb * GROUP_ROWS * Q6_K_BYTES);
            let ahead = PREFETCH_AHEAD * GROUP_ROWS * Q6_K_BYTES;
            prefetch(p.wrapping_add(ahead), GROUP_ROWS * Q6_K_BYTES);
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
            let v = p.add(32); // the vectors, in the order of `q6_word_pos`
            for b in 0..8 {
                let (h, t) = (b / 4, b % 4);
                let sw = ld(v.add(64 * (b / 2)));
                let i0 = 16 * (b % 2) as i32;
                let sc0 =
                    _mm512_srai_epi32::<24>(_mm512_sllv_epi32(sw, _mm512_set1_epi32(24 - i0)));
                let sc1 =
                    _mm512_srai_epi32::<24>(_mm512_sllv_epi32(sw, _mm512_set1_epi32(16 - i0)));
                let lo_sh = _mm_cvtsi32_si128(4 * (t / 2) as i32);
                let hi_sh = _mm_cvtsi32_si128(2 * t as i32);
                let mut s = [[_mm512_setzero_si512(); 2]; R];
                for (r, sr) in s.iter_mut().enumerate() {
                    let [a, c] = *s16.add((row0 + r) * nb + sb * 8 + b);
                    *sr = [_mm512_set1_epi32(-32 * a), _mm512_set1_epi32(-32 * c)];
                }
                for u in 0..8 {
                    let ql = ld(v.add(64 * (4 + 24 * h + 16 * (t % 2) + u)));
                    let qh = ld(v.add(64 * (12 + 24 * h + u)));
                    let lo = _mm512_and_si512(_mm512_srl_epi16(ql, lo_sh), m4);
                    let hi = _mm512_and_si512(_mm512_srl_epi16(qh, hi_sh), m3);
                    let q = _mm512_or_si512(lo, _mm512_slli_epi16::<4>(hi));
                    for (r, sr) in s.iter_mut().enumerate() {
                        let x = xs.add(((row0 + r) * nb + sb * 8 + b) * 32 + 4 * u);
                        sr[u / 4] = _mm512_dpbusd_epi32(sr[u / 4], q, piece(x));
                    }
                }
                for r in 0..R {
                    let a = (row0 + r) * nb + sb * 8 + b;
                    let isum = _mm512_add_epi32(
                        _mm512_mullo_epi32(s[r][0], sc0),
                        _mm512_mullo_epi32(s[r][1], sc1),
                    );
                    let f = _mm512_mul_ps(d, _mm512_set1_ps((*ds.add(a))[0]));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), f, acc[r]);
                }
            }
        }
        for r in 0..R {
            _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
    }

    macro_rules! entry {
        ($(#[$doc:meta])* $name:ident, $f:ident $(, $c:expr)?) => {
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
                    1 => $f::<1 $(, $c)?>(g, a, r0, o),
                    2 => $f::<2 $(, $c)?>(g, a, r0, o),
                    3 => $f::<3 $(, $c)?>(g, a, r0, o),
                    _ => $f::<4 $(, $c)?>(g, a, r0, o),
                }
            }
        };
    }

    entry!(
        /// Q4_K ([`super::InterleavedFn`]).
        group_q4_k, q45, false
    );
    entry!(
        /// Q5_K ([`super::InterleavedFn`]).
        group_q5_k, q45, true
    );
    entry!(
        /// Q6_K ([`super::InterleavedFn`]; needs [`Q8Rows::sum16`]).
        group_q6_k, q6
    );
}
