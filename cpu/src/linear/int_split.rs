//! Integer kernels for `quant_act = 1` with Q4_0 / Q4_1 weights over the grouped activation
//! layout [`Q8Split`] (AVX-512 VBMI + VNNI): a streaming GEMV (one weight row at a time, so
//! every thread reads one sequential stream, what weights larger than the caches want) and a
//! wide tile of up to [`WIDE_ROWS`] activation rows × [`WIDE_COLS`] weight rows for batches.
//!
//! Both work on four blocks per step. A step loads the 72 (Q4_0) or 80 (Q4_1) bytes of four
//! consecutive blocks of a weight row with two 64-byte loads, gathers their 64 nibble bytes with
//! one `vpermt2b` and their f16 scales (and mins) with one `vpermt2w`, so the 18/20-byte block
//! stride costs no per-block shuffling. Low nibbles (values 0..16 of each block) and high
//! nibbles (16..32) meet the activation bytes in the grouped order of [`Q8Split`] (prepared once
//! per call), and two `vpdpbusd` leave each block's integer sum in its four lanes, which are
//! scaled by `dw·dx` and accumulated in f32: per activation row, weight row and four blocks that
//! is two dot instructions, one conversion and two float instructions (three for Q4_1).
//!
//! The integer math per block is the scalar reference's: Q4_0 computes `Σ q·x − 8·Σx` (the
//! `−8·Σx` is the accumulator's start value), Q4_1 `Σ q·x` plus the min term `mw·(dx·Σx)`; only
//! the order of the float sums differs.
//!
//! The GEMV has the [`IntRowsFn`] contract, the tile the [`IntWideFn`] contract; both need
//! [`Q8Rows::prepare_split`] to have run on the activations, and without it they fall back to
//! the AVX2 per-block kernels. This module must not split work across threads.
//!
//! [`Q8Split`]: super::act_quant::Q8Split
//! [`Q8Rows::prepare_split`]: super::act_quant::Q8Rows::prepare_split
//! [`IntWideFn`]: super::int_wide::IntWideFn

use super::int_wide::IntWideFn;
#[cfg(doc)]
use super::int_wide::{WIDE_COLS, WIDE_ROWS};
use super::{IntRowsFn, WeightType};

/// True when this CPU has what these kernels need (AVX-512 F/BW/VL, VNNI and VBMI).
pub fn available() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            super::int_tile::has_vnni() && is_x86_feature_detected!("avx512vbmi")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// The streaming GEMV kernel for `t` if this CPU has one.
pub fn pick_gemv(t: WeightType) -> Option<IntRowsFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if available() {
            let f: IntRowsFn = match t {
                WeightType::Q4_0 => avx512::rows_q4_0,
                WeightType::Q4_1 => avx512::rows_q4_1,
                _ => return None,
            };
            return Some(f);
        }
    }
    let _ = t;
    None
}

/// The wide tile kernel for `t` if this CPU has one.
pub fn pick_wide(t: WeightType) -> Option<IntWideFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if available() {
            let f: IntWideFn = match t {
                WeightType::Q4_0 => avx512::wide_q4_0,
                WeightType::Q4_1 => avx512::wide_q4_1,
                _ => return None,
            };
            return Some(f);
        }
    }
    let _ = t;
    None
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! The kernels; only called after [`super::available`].
    use super::super::act_quant::{Q8Rows, SPLIT_GROUP};
    use super::super::int_wide::{WIDE_COLS, WIDE_ROWS};
    use super::super::MAX_ROWS;
    use crate::quant::{Q4_0_BYTES, Q4_1_BYTES};
    use std::arch::x86_64::*;

    /// `vpermt2b` indices: byte `i` of the result is nibble byte `i % 16` of block `i / 16`
    /// (blocks `bs` bytes apart, nibbles `off` bytes into a block).
    const fn nibble_index(bs: usize, off: usize) -> [u8; 64] {
        let mut t = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            t[i] = (bs * (i / 16) + off + i % 16) as u8;
            i += 1;
        }
        t
    }

    /// `vpermt2w` indices: words 0..16 are the f16 scale of block `i / 4` (4 lanes per
    /// block), words 16..20 the word after the scale of block `i - 16` (Q4_1's min; words
    /// 20..32 are masked off).
    const fn scale_index(bs: usize) -> [u16; 32] {
        let mut t = [0u16; 32];
        let mut i = 0;
        while i < 32 {
            t[i] = if i < 16 {
                (bs / 2 * (i / 4)) as u16
            } else {
                (bs / 2 * ((i - 16) % 4) + 1) as u16
            };
            i += 1;
        }
        t
    }

    static Q4_0_NIBBLES: [u8; 64] = nibble_index(Q4_0_BYTES, 2);
    static Q4_1_NIBBLES: [u8; 64] = nibble_index(Q4_1_BYTES, 4);
    static Q4_0_SCALES: [u16; 32] = scale_index(Q4_0_BYTES);
    static Q4_1_SCALES: [u16; 32] = scale_index(Q4_1_BYTES);

    /// The first `n` bits set (`n <= 64`).
    #[inline]
    fn first(n: usize) -> u64 {
        if n >= 64 {
            !0
        } else {
            (1u64 << n) - 1
        }
    }

    /// Constants of one kernel call.
    #[derive(Clone, Copy)]
    struct Consts {
        /// Block bytes.
        bs: usize,
        /// `vpermt2b` nibble indices.
        nib: __m512i,
        /// `vpermt2w` scale indices.
        sca: __m512i,
        /// Meta record → `dx` per lane.
        idx_d: __m512i,
        /// Meta record → `−8·Σq` in each block's first lane.
        idx_c: __m512i,
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn consts<const MIN: bool>() -> Consts {
        let (bs, nib, sca) = if MIN {
            (
                Q4_1_BYTES,
                Q4_1_NIBBLES.as_ptr(),
                Q4_1_SCALES.as_ptr() as *const u8,
            )
        } else {
            (
                Q4_0_BYTES,
                Q4_0_NIBBLES.as_ptr(),
                Q4_0_SCALES.as_ptr() as *const u8,
            )
        };
        Consts {
            bs,
            nib: _mm512_loadu_si512(nib as *const _),
            sca: _mm512_loadu_si512(sca as *const _),
            idx_d: _mm512_set_epi32(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4),
            idx_c: _mm512_set_epi32(0, 0, 0, 11, 0, 0, 0, 10, 0, 0, 0, 9, 0, 0, 0, 8),
        }
    }

    /// Four blocks of one weight row, expanded.
    #[derive(Clone, Copy)]
    struct WeightGroup {
        /// Low nibbles (values 0..16) of blocks 0..4, 16 bytes each.
        lo: __m512i,
        /// High nibbles (values 16..32).
        hi: __m512i,
        /// `dw` of block `lane / 4`.
        dw: __m512,
        /// Q4_1: `mw` of block `lane` in lanes 0..4, zero above.
        mw: __m512,
    }

    /// Group `g` of the weight row at `w` (`nb` blocks): full groups with two plain loads, the
    /// last 1..3 blocks with masked loads (no byte past the row is touched; the missing blocks
    /// read as zero nibbles and zero scales).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn weight_group<const MIN: bool>(
        k: &Consts,
        w: *const u8,
        g: usize,
        nb: usize,
    ) -> WeightGroup {
        let gb = SPLIT_GROUP * k.bs;
        let p = w.add(g * gb);
        let left = (nb - g * SPLIT_GROUP).min(SPLIT_GROUP) * k.bs;
        let (va, vb) = if left == gb {
            (
                _mm512_loadu_si512(p as *const _),
                _mm512_maskz_loadu_epi8(first(gb - 64), p.add(64) as *const i8),
            )
        } else {
            let va = _mm512_maskz_loadu_epi8(first(left), p as *const i8);
            let vb = if left > 64 {
                _mm512_maskz_loadu_epi8(first(left - 64), p.add(64) as *const i8)
            } else {
                _mm512_setzero_si512()
            };
            (va, vb)
        };
        let q = _mm512_permutex2var_epi8(va, k.nib, vb);
        let fifteen = _mm512_set1_epi8(15);
        let s = _mm512_maskz_permutex2var_epi16(0x000F_FFFF, va, k.sca, vb);
        WeightGroup {
            lo: _mm512_and_si512(q, fifteen),
            hi: _mm512_and_si512(_mm512_srli_epi16(q, 4), fifteen),
            dw: _mm512_cvtph_ps(_mm512_castsi512_si256(s)),
            mw: if MIN {
                _mm512_cvtph_ps(_mm512_extracti64x4_epi64(s, 1))
            } else {
                _mm512_setzero_ps()
            },
        }
    }

    /// One activation row's share of a group.
    #[derive(Clone, Copy)]
    struct ActGroup {
        /// Values 0..16 of blocks 0..4.
        x0: __m512i,
        /// Values 16..32.
        x1: __m512i,
        /// `dx` of block `lane / 4`.
        dx: __m512,
        /// The meta record (Q4_1: `dx·Σq` of block `lane` in lanes 0..4).
        meta: __m512,
        /// Integer accumulator start (Q4_0: `−8·Σq` in each block's first lane).
        start: __m512i,
    }

    /// Group `g` of activation row `r`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn act_group<const MIN: bool>(k: &Consts, a: &Q8Rows, r: usize, g: usize) -> ActGroup {
        let sp = &a.split;
        let rec = sp.recs.as_ptr().add(r * sp.groups + g);
        let m = _mm512_load_si512((*rec).meta.as_ptr() as *const _);
        ActGroup {
            x0: _mm512_load_si512((*rec).xs[0].as_ptr() as *const _),
            x1: _mm512_load_si512((*rec).xs[1].as_ptr() as *const _),
            dx: _mm512_permutexvar_ps(k.idx_d, _mm512_castsi512_ps(m)),
            meta: _mm512_castsi512_ps(m),
            start: if MIN {
                _mm512_setzero_si512()
            } else {
                _mm512_maskz_permutexvar_epi32(0x1111, k.idx_c, m)
            },
        }
    }

    /// `acc += w · x` for one group (the dot, its scaling and Q4_1's min term).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn dot_group<const MIN: bool>(w: &WeightGroup, x: &ActGroup, acc: __m512) -> __m512 {
        let p = _mm512_dpbusd_epi32(x.start, w.lo, x.x0);
        let p = _mm512_dpbusd_epi32(p, w.hi, x.x1);
        let acc = _mm512_fmadd_ps(_mm512_mul_ps(w.dw, x.dx), _mm512_cvtepi32_ps(p), acc);
        if MIN {
            // the record's other lanes are not floats: only lanes 0..4 take part
            _mm512_mask3_fmadd_ps(w.mw, x.meta, acc, 0x000F)
        } else {
            acc
        }
    }

    /// One weight row against activation row `r`; Q4_1 when `MIN`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn row<const MIN: bool>(w: *const u8, a: &Q8Rows, r: usize) -> f32 {
        let k = consts::<MIN>();
        let mut acc = _mm512_setzero_ps();
        for g in 0..a.split.groups {
            let wg = weight_group::<MIN>(&k, w, g, a.blocks);
            acc = dot_group::<MIN>(&wg, &act_group::<MIN>(&k, a, r, g), acc);
        }
        _mm512_reduce_add_ps(acc)
    }

    /// True when `a` carries a split layout of its current rows.
    fn prepared(a: &Q8Rows) -> bool {
        a.split.rows == a.rows && a.split.groups == a.blocks.div_ceil(SPLIT_GROUP)
    }

    macro_rules! rows_fn {
        ($name:ident, $min:expr, $fallback:path) => {
            /// Streaming GEMV ([`super::super::IntRowsFn`] contract; activation rows one by one).
            pub unsafe fn $name(
                w: &[u8],
                a: &Q8Rows,
                row0: usize,
                rows: usize,
                out: &mut [f32; MAX_ROWS],
            ) {
                if !prepared(a) {
                    return $fallback(w, a, row0, rows, out);
                }
                for (t, o) in out.iter_mut().enumerate().take(rows.min(MAX_ROWS)) {
                    *o = row::<{ $min }>(w.as_ptr(), a, row0 + t);
                }
            }
        };
    }

    rows_fn!(rows_q4_0, false, super::super::int_dot::avx2::rows_q4_0);
    rows_fn!(rows_q4_1, true, super::super::int_dot::avx2::rows_q4_1);

    /// Groups whose Q4_1 mins a wide tile keeps before adding their term (64 blocks).
    const MIN_CHUNK: usize = 16;

    /// `R` activation rows × `C` weight rows (`rb` bytes apart). Q4_1's min term is not added
    /// per group and tile entry (that costs registers the accumulators need): the mins of
    /// [`MIN_CHUNK`] groups are kept per column and dotted with the rows' `dx·Σq` 16 blocks at
    /// a time.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn wide<const R: usize, const C: usize, const MIN: bool>(
        w: &[u8],
        rb: usize,
        a: &Q8Rows,
        row0: usize,
        out: &mut [[f32; WIDE_ROWS]; WIDE_COLS],
    ) {
        let k = consts::<MIN>();
        let wp = w.as_ptr();
        let sp = &a.split;
        let sxs = sp.sx_stride();
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut mins = [[0f32; MIN_CHUNK * SPLIT_GROUP]; C];
        let mut g0 = 0;
        while g0 < sp.groups {
            let g1 = (g0 + MIN_CHUNK).min(sp.groups);
            for g in g0..g1 {
                // the next column pair at this group, one pair ahead of its use (the weights
                // stream from memory; a prefetch never faults and the address is only formed)
                for c in 0..C {
                    let next = wp.wrapping_add((C + c) * rb + g * SPLIT_GROUP * k.bs);
                    _mm_prefetch::<_MM_HINT_T0>(next as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64) as *const i8);
                }
                let mut wg = [weight_group::<MIN>(&k, wp, g, a.blocks); C];
                for (c, v) in wg.iter_mut().enumerate().skip(1) {
                    *v = weight_group::<MIN>(&k, wp.add(c * rb), g, a.blocks);
                }
                if MIN {
                    for (m, v) in mins.iter_mut().zip(wg.iter()) {
                        let at = m.as_mut_ptr().add((g - g0) * SPLIT_GROUP);
                        _mm512_mask_storeu_ps(at, 0x000F, v.mw);
                    }
                }
                for (r, ar) in acc.iter_mut().enumerate() {
                    let x = act_group::<MIN>(&k, a, row0 + r, g);
                    for (ac, wc) in ar.iter_mut().zip(wg.iter()) {
                        *ac = dot_group::<false>(wc, &x, *ac);
                    }
                }
            }
            if MIN {
                let blocks = (g1 - g0) * SPLIT_GROUP;
                let mut h = 0;
                while h < blocks {
                    let lanes = first((blocks - h).min(16)) as __mmask16;
                    let mut mv = [_mm512_setzero_ps(); C];
                    for (v, m) in mv.iter_mut().zip(mins.iter()) {
                        *v = _mm512_maskz_loadu_ps(lanes, m.as_ptr().add(h));
                    }
                    for (r, ar) in acc.iter_mut().enumerate() {
                        // in bounds: the offset is a multiple of 16 below the row's padded size
                        let at = (row0 + r) * sxs + g0 * SPLIT_GROUP + h;
                        let sv = _mm512_load_ps(sp.sx.as_ptr().add(at / 16) as *const f32);
                        for (ac, v) in ar.iter_mut().zip(mv.iter()) {
                            *ac = _mm512_fmadd_ps(*v, sv, *ac);
                        }
                    }
                    h += 16;
                }
            }
            g0 = g1;
        }
        for (r, ar) in acc.iter().enumerate() {
            for (c, v) in ar.iter().enumerate() {
                out[c][r] = _mm512_reduce_add_ps(*v);
            }
        }
    }

    macro_rules! wide_fn {
        ($name:ident, $min:expr, $fallback:path) => {
            /// Wide tile ([`super::super::int_wide::IntWideFn`] contract).
            pub unsafe fn $name(
                w: &[u8],
                rb: usize,
                a: &Q8Rows,
                row0: usize,
                rows: usize,
                cols: usize,
                out: &mut [[f32; WIDE_ROWS]; WIDE_COLS],
            ) {
                if !prepared(a) {
                    return $fallback(w, rb, a, row0, rows, cols, out);
                }
                macro_rules! by_cols {
                    ($r:literal) => {
                        match cols {
                            1 => wide::<$r, 1, { $min }>(w, rb, a, row0, out),
                            _ => wide::<$r, 2, { $min }>(w, rb, a, row0, out),
                        }
                    };
                }
                match rows {
                    1 => by_cols!(1),
                    2 => by_cols!(2),
                    3 => by_cols!(3),
                    4 => by_cols!(4),
                    5 => by_cols!(5),
                    6 => by_cols!(6),
                    7 => by_cols!(7),
                    _ => by_cols!(8),
                }
            }
        };
    }

    wide_fn!(wide_q4_0, false, super::super::int_wide::avx512::wide_q4_0);
    wide_fn!(wide_q4_1, true, super::super::int_wide::avx512::wide_q4_1);
}
