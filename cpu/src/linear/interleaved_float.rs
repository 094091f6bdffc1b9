//! F16 / BF16 weights interleaved 16 rows at a time, and the `Linear` kernels that stream them
//! (f32 activations).
//!
//! Rows are taken in groups of [`GROUP_ROWS`]; a group stores its `k` columns one after the
//! other, column `i` holding element `i` of the group's 16 rows side by side (32 bytes). A group
//! is thus one sequential stream: each step loads a column, widens it to 16 f32 lanes (`vcvtph2ps`
//! for f16, a 16-bit shift for bf16) and meets one broadcast activation value in a fused
//! multiply-add, so the 16 lanes accumulate the 16 rows' dots with no horizontal sums, and each
//! activation value is loaded once per 16 rows. Any `k` works; the row count must be a multiple of
//! 16 (callers keep other matrices plain).
//!
//! The arithmetic is fixed, the same in the scalar reference and every SIMD kernel, and the same
//! for an activation row whatever other rows run with it: for weight row `j` and activation row
//! `r`, four f32 partial sums `s_c` (`c = i mod 4`), each a chain of fused multiply-adds in
//! increasing `i` (`s_c = fma(w[j][i], x[r][i], s_c)`), and the result `(s_0 + s_1) + (s_2 + s_3)`.
//! This module must not split work across threads or know about tensors.

use super::interleaved::GROUP_ROWS;
use super::{WeightType, MAX_ROWS};

/// A float interleaved-group kernel: `out[r][j]` = the dot of row `j` of the group at `g` (`k`
/// columns) with activation row `r` (`x[r * k..(r + 1) * k]`), for `r < rows`, `j < 16`.
///
/// # Safety
/// `1 <= rows <= MAX_ROWS`, `x.len() >= rows * k`, `g` holds a whole group of `k` columns of the
/// kernel's type, and the CPU has the features the kernel was picked for.
pub type FloatGroupFn =
    unsafe fn(g: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [[f32; GROUP_ROWS]; MAX_ROWS]);

/// True for the float types this layout holds (F16, BF16).
pub fn is_float(t: WeightType) -> bool {
    matches!(t, WeightType::F16 | WeightType::BF16)
}

/// Checks a request on an `n × k` weight `w` of type `t`; returns the bytes of the matrix.
fn check(t: WeightType, w: &[u8], n: usize, k: usize) -> Result<usize, String> {
    if !is_float(t) {
        return Err(format!(
            "{} weights are not a float interleaved type",
            t.name()
        ));
    }
    if !n.is_multiple_of(GROUP_ROWS) || k == 0 {
        return Err(format!(
            "interleaving needs rows a multiple of {GROUP_ROWS} and k > 0, got {n} x {k}"
        ));
    }
    let need = n
        .checked_mul(k)
        .and_then(|e| e.checked_mul(2))
        .ok_or_else(|| format!("{n} x {k} weight size overflows"))?;
    if w.len() < need {
        return Err(format!(
            "weight has {} bytes, {n} x {k} {} needs {need}",
            w.len(),
            t.name()
        ));
    }
    Ok(need)
}

/// Interleaves the plain `n × k` F16/BF16 weight `w` into `out` (the same number of bytes).
pub fn interleave(
    t: WeightType,
    w: &[u8],
    n: usize,
    k: usize,
    out: &mut [u8],
) -> Result<(), String> {
    let need = check(t, w, n, k)?;
    if out.len() < need {
        return Err(format!(
            "interleaved output has {} bytes, needs {need}",
            out.len()
        ));
    }
    for (g, dst) in out[..need].chunks_exact_mut(GROUP_ROWS * k * 2).enumerate() {
        for j in 0..GROUP_ROWS {
            let src = &w[(g * GROUP_ROWS + j) * k * 2..][..k * 2];
            for (i, v) in src.chunks_exact(2).enumerate() {
                dst[(i * GROUP_ROWS + j) * 2..][..2].copy_from_slice(v);
            }
        }
    }
    Ok(())
}

/// Row `r` of an interleaved `n × k` F16/BF16 weight, in the plain layout, into `out` (`2 k`
/// bytes).
pub fn plain_row(
    t: WeightType,
    w: &[u8],
    n: usize,
    k: usize,
    r: usize,
    out: &mut [u8],
) -> Result<(), String> {
    check(t, w, n, k)?;
    super::interleaved::check_row(r, n, out, 2 * k)?;
    let (g, j) = (r / GROUP_ROWS, r % GROUP_ROWS);
    let src = &w[g * GROUP_ROWS * k * 2..][..GROUP_ROWS * k * 2];
    for (i, o) in out[..2 * k].chunks_exact_mut(2).enumerate() {
        o.copy_from_slice(&src[(i * GROUP_ROWS + j) * 2..][..2]);
    }
    Ok(())
}

/// The f32 value of the 16-bit float `bits` (bf16 when `BF`, else IEEE half).
fn widen<const BF: bool>(bits: u16) -> f32 {
    if BF {
        f32::from_bits(u32::from(bits) << 16)
    } else {
        half::f16::from_bits(bits).to_f32()
    }
}

/// Scalar reference of the group kernels (the module's arithmetic, written out).
fn group_ref<const BF: bool>(
    g: &[u8],
    x: &[f32],
    k: usize,
    rows: usize,
    out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
) {
    for (r, o) in out.iter_mut().enumerate().take(rows) {
        let xr = &x[r * k..(r + 1) * k];
        for (j, oj) in o.iter_mut().enumerate() {
            let mut s = [0f32; 4];
            for (i, &xv) in xr.iter().enumerate() {
                let b = &g[(i * GROUP_ROWS + j) * 2..];
                let w = widen::<BF>(u16::from_le_bytes([b[0], b[1]]));
                s[i % 4] = w.mul_add(xv, s[i % 4]);
            }
            *oj = (s[0] + s[1]) + (s[2] + s[3]);
        }
    }
}

/// # Safety
/// See [`FloatGroupFn`].
unsafe fn ref_f16(g: &[u8], x: &[f32], k: usize, n: usize, o: &mut [[f32; 16]; MAX_ROWS]) {
    group_ref::<false>(g, x, k, n, o)
}
/// # Safety
/// See [`FloatGroupFn`].
unsafe fn ref_bf16(g: &[u8], x: &[f32], k: usize, n: usize, o: &mut [[f32; 16]; MAX_ROWS]) {
    group_ref::<true>(g, x, k, n, o)
}

/// The scalar reference kernel for interleaved weights of type `t` (`None` for other types).
pub fn pick_ref(t: WeightType) -> Option<FloatGroupFn> {
    Some(match t {
        WeightType::F16 => ref_f16,
        WeightType::BF16 => ref_bf16,
        _ => return None,
    })
}

/// True when this CPU has a SIMD kernel for `t` (AVX-512 F/BW/VL, or AVX2 + FMA + F16C):
/// interleaving pays only then.
pub fn available(t: WeightType) -> bool {
    pick(t).is_some()
}

/// The fastest SIMD kernel for interleaved weights of type `t`, if this CPU has one.
pub fn pick(t: WeightType) -> Option<FloatGroupFn> {
    #[cfg(target_arch = "x86_64")]
    {
        let bf = match t {
            WeightType::F16 => false,
            WeightType::BF16 => true,
            _ => return None,
        };
        if crate::simd::has_avx512() {
            return Some(if bf { avx512::bf16 } else { avx512::f16 });
        }
        if crate::simd::has_avx2_fma() {
            return Some(if bf { avx2::bf16 } else { avx2::f16 });
        }
    }
    let _ = t;
    None
}

/// The AVX2 kernel for `t` where the CPU has AVX2 + FMA + F16C (for tests on AVX-512 machines).
pub fn pick_avx2(t: WeightType) -> Option<FloatGroupFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            return match t {
                WeightType::F16 => Some(avx2::f16),
                WeightType::BF16 => Some(avx2::bf16),
                _ => None,
            };
        }
    }
    let _ = t;
    None
}

/// Bytes ahead of the current column that the kernels prefetch (the stream's next lines).
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 2048;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! AVX-512 kernels: all activation rows of a call against one group, 4 partial sums per row.
    use super::super::MAX_ROWS;
    use super::{GROUP_ROWS, PREFETCH};
    use std::arch::x86_64::*;

    /// Column `i` of the group at `p` as 16 f32 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn column<const BF: bool>(p: *const u8, i: usize) -> __m512 {
        let v = _mm256_loadu_si256(p.add(i * 2 * GROUP_ROWS) as *const __m256i);
        if BF {
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))
        } else {
            _mm512_cvtph_ps(v)
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const BF: bool, const R: usize>(
        g: &[u8],
        x: &[f32],
        k: usize,
        out: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
    ) {
        let p = g.as_ptr();
        let xp = x.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        let k4 = k / 4 * 4;
        let mut i = 0;
        while i < k4 {
            // a hint on the stream's next lines (never faults; the address is only formed)
            let ahead = p.wrapping_add(i * 2 * GROUP_ROWS + PREFETCH) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            let w = [
                column::<BF>(p, i),
                column::<BF>(p, i + 1),
                column::<BF>(p, i + 2),
                column::<BF>(p, i + 3),
            ];
            for (r, a) in acc.iter_mut().enumerate() {
                let xr = xp.add(r * k + i);
                for (c, ac) in a.iter_mut().enumerate() {
                    *ac = _mm512_fmadd_ps(w[c], _mm512_set1_ps(*xr.add(c)), *ac);
                }
            }
            i += 4;
        }
        for c in 0..k - k4 {
            let w = column::<BF>(p, k4 + c);
            for (r, a) in acc.iter_mut().enumerate() {
                a[c] = _mm512_fmadd_ps(w, _mm512_set1_ps(*xp.add(r * k + k4 + c)), a[c]);
            }
        }
        for (a, o) in acc.iter().zip(out.iter_mut()) {
            let s = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
            _mm512_storeu_ps(o.as_mut_ptr(), s);
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn rows<const BF: bool>(
        g: &[u8],
        x: &[f32],
        k: usize,
        n: usize,
        o: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
    ) {
        match n {
            1 => group::<BF, 1>(g, x, k, o),
            2 => group::<BF, 2>(g, x, k, o),
            3 => group::<BF, 3>(g, x, k, o),
            _ => group::<BF, 4>(g, x, k, o),
        }
    }

    /// F16 ([`super::FloatGroupFn`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn f16(g: &[u8], x: &[f32], k: usize, n: usize, o: &mut [[f32; 16]; MAX_ROWS]) {
        rows::<false>(g, x, k, n, o)
    }
    /// BF16 ([`super::FloatGroupFn`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn bf16(g: &[u8], x: &[f32], k: usize, n: usize, o: &mut [[f32; 16]; MAX_ROWS]) {
        rows::<true>(g, x, k, n, o)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! AVX2 kernels: one activation row at a time against one group (the group stays in cache
    //! for the next row), 16 rows as two 8-lane halves, 4 partial sums per half.
    use super::super::MAX_ROWS;
    use super::{GROUP_ROWS, PREFETCH};
    use std::arch::x86_64::*;

    /// Half `h` (rows `8h..8h + 8`) of column `i` of the group at `p` as 8 f32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn column<const BF: bool>(p: *const u8, i: usize, h: usize) -> __m256 {
        let v = _mm_loadu_si128(p.add(i * 2 * GROUP_ROWS + 16 * h) as *const __m128i);
        if BF {
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
        } else {
            _mm256_cvtph_ps(v)
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row<const BF: bool>(g: &[u8], x: &[f32], out: &mut [f32; GROUP_ROWS]) {
        let p = g.as_ptr();
        let k = x.len();
        let mut acc = [[_mm256_setzero_ps(); 4]; 2];
        let k4 = k / 4 * 4;
        let mut i = 0;
        while i < k4 {
            let ahead = p.wrapping_add(i * 2 * GROUP_ROWS + PREFETCH) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            for c in 0..4 {
                let xv = _mm256_set1_ps(*x.get_unchecked(i + c));
                for (h, a) in acc.iter_mut().enumerate() {
                    a[c] = _mm256_fmadd_ps(column::<BF>(p, i + c, h), xv, a[c]);
                }
            }
            i += 4;
        }
        for c in 0..k - k4 {
            let xv = _mm256_set1_ps(*x.get_unchecked(k4 + c));
            for (h, a) in acc.iter_mut().enumerate() {
                a[c] = _mm256_fmadd_ps(column::<BF>(p, k4 + c, h), xv, a[c]);
            }
        }
        for (h, a) in acc.iter().enumerate() {
            let s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), s);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows<const BF: bool>(
        g: &[u8],
        x: &[f32],
        k: usize,
        n: usize,
        o: &mut [[f32; GROUP_ROWS]; MAX_ROWS],
    ) {
        for (r, or) in o.iter_mut().enumerate().take(n) {
            row::<BF>(g, &x[r * k..(r + 1) * k], or);
        }
    }

    /// F16 ([`super::FloatGroupFn`]).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16(g: &[u8], x: &[f32], k: usize, n: usize, o: &mut [[f32; 16]; MAX_ROWS]) {
        rows::<false>(g, x, k, n, o)
    }
    /// BF16 ([`super::FloatGroupFn`]).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn bf16(g: &[u8], x: &[f32], k: usize, n: usize, o: &mut [[f32; 16]; MAX_ROWS]) {
        rows::<true>(g, x, k, n, o)
    }
}
