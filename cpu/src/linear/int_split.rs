//! Integer kernels for `quant_act = 1` over the grouped activation layout [`Q8Split`]
//! (AVX-512 VBMI + VNNI), for Q4_0, Q4_1 and Q8_0 weights: a streaming GEMV (one weight row at
//! a time, so every thread reads one sequential stream, what weights larger than the caches
//! want), a GEMV tile (Q4_0: up to four consecutive weight rows, one contiguous stream,
//! against one activation row, sharing its loads; bit-equal to the GEMV) and a wide tile of up to
//! [`WIDE_ROWS`] activation rows × [`WIDE_COLS`] weight rows for batches.
//!
//! Both work on four blocks per step. A step loads the 72 (Q4_0), 80 (Q4_1) or 136 (Q8_0)
//! bytes of four consecutive blocks of a weight row with two (Q8_0: four overlapping) 64-byte
//! loads, gathers their values with one (two) `vpermt2b` and their f16 scales (and mins) with
//! one `vpermt2w`, so the 18/20/34-byte block stride costs no per-block shuffling. Values 0..16
//! of each block (Q4: low nibbles) and 16..32 (high nibbles) meet the activation bytes in the
//! grouped order of [`Q8Split`] (prepared once per call), and two `vpdpbusd` leave each block's
//! integer sum in its four lanes, which are scaled by `dw·dx` and accumulated in f32: per
//! activation row, weight row and four blocks that is two dot instructions, one conversion and
//! two float instructions.
//!
//! The integer math per block is the scalar reference's: Q4_0 computes `Σ q·x − 8·Σx` (the
//! `−8·Σx` is the accumulator's start value), Q4_1 `Σ q·x` plus the min term `mw·(dx·Σx)`,
//! Q8_0 `Σ (x + 128)·w − 128·Σw` (signed weights against unsigned activations, the correction
//! formed once per weight group); only the order of the float sums differs.
//!
//! The GEMV has the [`IntRowsFn`] contract, the GEMV tile the [`IntTileFn`] contract, the wide
//! tile the [`IntWideFn`] contract; all need
//! [`Q8Rows::prepare_split`] to have run on the activations, and without it they fall back to
//! the AVX2 per-block kernels or the other wide tiles. This module must not split work across
//! threads.
//!
//! [`Q8Split`]: super::act_quant::Q8Split
//! [`Q8Rows::prepare_split`]: super::act_quant::Q8Rows::prepare_split
//! [`IntWideFn`]: super::int_wide::IntWideFn

use super::int_wide::IntWideFn;
#[cfg(doc)]
use super::int_wide::{WIDE_COLS, WIDE_ROWS};
use super::{IntRowsFn, IntTileFn, WeightType};

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
                WeightType::Q8_0 => avx512::rows_q8_0,
                _ => return None,
            };
            return Some(f);
        }
    }
    let _ = t;
    None
}

/// The GEMV tile kernel for `t` (Q4_0) if this CPU has one: up to [`MAX_ROWS`] weight rows
/// against one activation row at a time, each entry with the bits of [`pick_gemv`]'s kernel.
/// Q8_0 (its tile streams slower than its GEMV) and Q4_1 (whose GEMV defers its min terms)
/// have none.
///
/// [`MAX_ROWS`]: super::MAX_ROWS
pub fn pick_gemv_tile(t: WeightType) -> Option<IntTileFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if available() {
            let f: IntTileFn = match t {
                WeightType::Q4_0 => avx512::tile_q4_0,
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
                WeightType::Q8_0 => avx512::wide_q8_0,
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
    use crate::quant::{Q4_0_BYTES, Q4_1_BYTES, Q8_0_BYTES};
    use std::arch::x86_64::*;

    /// Weight kinds (const parameter of the kernels).
    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q8_0: u8 = 2;

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
    /// Q8_0: values 0..16 of the four blocks from the bytes `[0, 128)` of the group, values
    /// 16..32 from the bytes `[8, 136)` (a group is 136 bytes, more than one `vpermt2b` sees).
    static Q8_0_LOW: [u8; 64] = nibble_index(Q8_0_BYTES, 2);
    static Q8_0_HIGH: [u8; 64] = nibble_index(Q8_0_BYTES, 18 - 8);
    static Q8_0_SCALES: [u16; 32] = scale_index(Q8_0_BYTES);

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
        /// `vpermt2b` indices of the low nibbles / values 0..16.
        nib: __m512i,
        /// Q8_0: `vpermt2b` indices of values 16..32 (in the window at byte 8).
        high: __m512i,
        /// `vpermt2w` scale indices.
        sca: __m512i,
        /// Meta record → `dx` per lane.
        idx_d: __m512i,
        /// Meta record → `−8·Σq` in each block's first lane.
        idx_c: __m512i,
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn consts<const KIND: u8>() -> Consts {
        let (bs, nib, sca): (usize, *const u8, *const u16) = match KIND {
            Q4_0 => (Q4_0_BYTES, Q4_0_NIBBLES.as_ptr(), Q4_0_SCALES.as_ptr()),
            Q4_1 => (Q4_1_BYTES, Q4_1_NIBBLES.as_ptr(), Q4_1_SCALES.as_ptr()),
            _ => (Q8_0_BYTES, Q8_0_LOW.as_ptr(), Q8_0_SCALES.as_ptr()),
        };
        Consts {
            bs,
            nib: _mm512_loadu_si512(nib as *const _),
            high: _mm512_loadu_si512(Q8_0_HIGH.as_ptr() as *const _),
            sca: _mm512_loadu_si512(sca as *const _),
            idx_d: _mm512_set_epi32(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4),
            idx_c: _mm512_set_epi32(0, 0, 0, 11, 0, 0, 0, 10, 0, 0, 0, 9, 0, 0, 0, 8),
        }
    }

    /// Bytes `from..to` of the 64 at `p` (clamped to `left` readable bytes from the group
    /// start at `p - from`), zero elsewhere; a plain load when all 64 are readable.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn window(p: *const u8, from: usize, left: usize) -> __m512i {
        if left >= from + 64 {
            _mm512_loadu_si512(p as *const _)
        } else if left > from {
            _mm512_maskz_loadu_epi8(first(left - from), p as *const i8)
        } else {
            _mm512_setzero_si512()
        }
    }

    /// Four blocks of one weight row, expanded.
    #[derive(Clone, Copy)]
    struct WeightGroup {
        /// Values 0..16 of blocks 0..4, 16 bytes each (Q4: low nibbles; Q8_0: signed bytes).
        lo: __m512i,
        /// Values 16..32 (Q4: high nibbles).
        hi: __m512i,
        /// `dw` of block `lane / 4`.
        dw: __m512,
        /// Q4_1: `mw` of block `lane` in lanes 0..4, zero above.
        mw: __m512,
        /// Q8_0: `−128·Σw` of each lane's 8 weights (the start of the integer accumulator,
        /// which takes the activations as unsigned `x + 128`).
        start: __m512i,
    }

    /// Group `g` of the weight row at `w` (`nb` blocks). Loads are masked to the row's bytes
    /// (no byte past the row is touched; missing blocks of the last group read as zero values
    /// and zero scales).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn weight_group<const KIND: u8>(
        k: &Consts,
        w: *const u8,
        g: usize,
        nb: usize,
    ) -> WeightGroup {
        let p = w.wrapping_add(g * SPLIT_GROUP * k.bs);
        let left = (nb - g * SPLIT_GROUP).min(SPLIT_GROUP) * k.bs;
        let va = window(p, 0, left);
        let vb = window(p.wrapping_add(64), 64, left);
        let s = _mm512_maskz_permutex2var_epi16(0x000F_FFFF, va, k.sca, vb);
        let dw = _mm512_cvtph_ps(_mm512_castsi512_si256(s));
        if KIND == Q8_0 {
            let lo = _mm512_permutex2var_epi8(va, k.nib, vb);
            let vc = window(p.wrapping_add(8), 8, left);
            let vd = window(p.wrapping_add(72), 72, left);
            let hi = _mm512_permutex2var_epi8(vc, k.high, vd);
            let b = _mm512_set1_epi8(-128);
            let c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), b, lo);
            let c = _mm512_dpbusd_epi32(c, b, hi);
            return WeightGroup {
                lo,
                hi,
                dw,
                mw: _mm512_setzero_ps(),
                start: _mm512_sub_epi32(_mm512_setzero_si512(), c),
            };
        }
        let q = _mm512_permutex2var_epi8(va, k.nib, vb);
        let fifteen = _mm512_set1_epi8(15);
        WeightGroup {
            lo: _mm512_and_si512(q, fifteen),
            hi: _mm512_and_si512(_mm512_srli_epi16(q, 4), fifteen),
            dw,
            mw: if KIND == Q4_1 {
                _mm512_cvtph_ps(_mm512_extracti64x4_epi64(s, 1))
            } else {
                _mm512_setzero_ps()
            },
            start: _mm512_setzero_si512(),
        }
    }

    /// One activation row's share of a group.
    #[derive(Clone, Copy)]
    struct ActGroup {
        /// Values 0..16 of blocks 0..4 (Q8_0 weights: as unsigned `x + 128`).
        x0: __m512i,
        /// Values 16..32.
        x1: __m512i,
        /// `dx` of block `lane / 4`.
        dx: __m512,
        /// Integer accumulator start (Q4_0: `−8·Σq` in each block's first lane).
        start: __m512i,
    }

    /// Group `g` of activation row `r`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn act_group<const KIND: u8>(k: &Consts, a: &Q8Rows, r: usize, g: usize) -> ActGroup {
        let sp = &a.split;
        let rec = sp.recs.as_ptr().add(r * sp.groups + g);
        let m = _mm512_load_si512((*rec).meta.as_ptr() as *const _);
        let x0 = _mm512_load_si512((*rec).xs[0].as_ptr() as *const _);
        let x1 = _mm512_load_si512((*rec).xs[1].as_ptr() as *const _);
        let (x0, x1) = if KIND == Q8_0 {
            let b = _mm512_set1_epi8(-128);
            (_mm512_xor_si512(x0, b), _mm512_xor_si512(x1, b))
        } else {
            (x0, x1)
        };
        ActGroup {
            x0,
            x1,
            dx: _mm512_permutexvar_ps(k.idx_d, _mm512_castsi512_ps(m)),
            start: if KIND == Q4_0 {
                _mm512_maskz_permutexvar_epi32(0x1111, k.idx_c, m)
            } else {
                _mm512_setzero_si512()
            },
        }
    }

    /// `acc += w · x` for one group: the integer dot and its scaling (Q4_1's min term is added
    /// by the callers).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn dot_group<const KIND: u8>(w: &WeightGroup, x: &ActGroup, acc: __m512) -> __m512 {
        let p = if KIND == Q8_0 {
            let p = _mm512_dpbusd_epi32(w.start, x.x0, w.lo);
            _mm512_dpbusd_epi32(p, x.x1, w.hi)
        } else {
            let p = _mm512_dpbusd_epi32(x.start, w.lo, x.x0);
            _mm512_dpbusd_epi32(p, w.hi, x.x1)
        };
        _mm512_fmadd_ps(_mm512_mul_ps(w.dw, x.dx), _mm512_cvtepi32_ps(p), acc)
    }

    /// One weight row (`rb` bytes at `w`) against activation row `r`: the arithmetic of one
    /// entry of [`wide`], so a row gives the same bits alone and in a batch (Q4_0 and Q8_0 run
    /// the same chain of [`dot_group`]s directly; Q4_1 takes [`wide`] itself for its deferred
    /// min terms).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn row<const KIND: u8>(w: &[u8], a: &Q8Rows, r: usize) -> f32 {
        if KIND == Q4_1 {
            let mut o = [[0f32; WIDE_ROWS]; WIDE_COLS];
            wide::<1, 1, KIND>(w, w.len(), a, r, &mut o);
            return o[0][0];
        }
        let k = consts::<KIND>();
        let mut acc = _mm512_setzero_ps();
        for g in 0..a.split.groups {
            let wg = weight_group::<KIND>(&k, w.as_ptr(), g, a.blocks);
            let x = act_group::<KIND>(&k, a, r, g);
            acc = dot_group::<KIND>(&wg, &x, acc);
        }
        _mm512_reduce_add_ps(acc)
    }

    /// True when `a` carries a split layout of its current rows.
    fn prepared(a: &Q8Rows) -> bool {
        a.split.rows == a.rows && a.split.groups == a.blocks.div_ceil(SPLIT_GROUP)
    }

    macro_rules! rows_fn {
        ($name:ident, $kind:expr, $fallback:path) => {
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
                    *o = row::<{ $kind }>(w, a, row0 + t);
                }
            }
        };
    }

    rows_fn!(rows_q4_0, Q4_0, super::super::int_dot::avx2::rows_q4_0);
    rows_fn!(rows_q4_1, Q4_1, super::super::int_dot::avx2::rows_q4_1);
    rows_fn!(rows_q8_0, Q8_0, super::super::int_dot::avx2::rows_q8_0);

    /// `C` weight rows (`rb` bytes apart) against activation row `r` into `out[c][t]`, sharing
    /// each activation group; every row runs [`row`]'s chain of [`dot_group`]s (Q4_0 and Q8_0
    /// alike), so its bits. The `C` rows are one contiguous stream read at `C` places at once, which
    /// the hardware prefetcher follows badly: while a tile runs, the next tile's bytes (plus
    /// [`TILE_PF`]) are prefetched as one sequential stream, in step with this tile's progress.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn rows_tile<const C: usize, const KIND: u8>(
        w: &[u8],
        rb: usize,
        a: &Q8Rows,
        r: usize,
        out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
        t: usize,
    ) {
        let k = consts::<KIND>();
        let wp = w.as_ptr();
        let span = C * SPLIT_GROUP * k.bs;
        let mut acc = [_mm512_setzero_ps(); C];
        for g in 0..a.split.groups {
            let x = act_group::<KIND>(&k, a, r, g);
            // a hint past the tile: the address is only formed, a prefetch never faults
            let ahead = wp.wrapping_add(C * rb + g * span + TILE_PF);
            let mut o = 0;
            while o < span {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(o) as *const i8);
                o += 64;
            }
            for (c, ac) in acc.iter_mut().enumerate() {
                let wg = weight_group::<KIND>(&k, wp.add(c * rb), g, a.blocks);
                *ac = dot_group::<KIND>(&wg, &x, *ac);
            }
        }
        for (o, ac) in out.iter_mut().zip(acc.iter()) {
            o[t] = _mm512_reduce_add_ps(*ac);
        }
    }

    /// Bytes past the next tile's share that the GEMV tile prefetches.
    const TILE_PF: usize = 1024;

    macro_rules! tile_fn {
        ($name:ident, $kind:expr, $rows:ident) => {
            /// GEMV tile ([`super::super::IntTileFn`] contract): every activation row alone
            /// against `cols` weight rows at once ([`rows_tile`]: the bits of the streaming
            /// GEMV). Unprepared activations take the streaming GEMV's fallback column by
            /// column.
            pub unsafe fn $name(
                w: &[u8],
                rb: usize,
                a: &Q8Rows,
                row0: usize,
                rows: usize,
                cols: usize,
                out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
            ) {
                let cols = cols.min(MAX_ROWS);
                if !prepared(a) {
                    for (c, oc) in out.iter_mut().enumerate().take(cols) {
                        $rows(&w[c * rb..(c + 1) * rb], a, row0, rows, oc);
                    }
                    return;
                }
                for t in 0..rows.min(MAX_ROWS) {
                    match cols {
                        1 => rows_tile::<1, { $kind }>(w, rb, a, row0 + t, out, t),
                        2 => rows_tile::<2, { $kind }>(w, rb, a, row0 + t, out, t),
                        3 => rows_tile::<3, { $kind }>(w, rb, a, row0 + t, out, t),
                        _ => rows_tile::<4, { $kind }>(w, rb, a, row0 + t, out, t),
                    }
                }
            }
        };
    }

    tile_fn!(tile_q4_0, Q4_0, rows_q4_0);

    /// Groups whose Q4_1 mins a wide tile keeps before adding their term (64 blocks).
    const MIN_CHUNK: usize = 16;

    /// `R` activation rows × `C` weight rows (`rb` bytes apart). Q4_1's min term is not added
    /// per group and tile entry (that costs registers the accumulators need): the mins of
    /// [`MIN_CHUNK`] groups are kept per column and dotted with the rows' `dx·Σq` 16 blocks at
    /// a time.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn wide<const R: usize, const C: usize, const KIND: u8>(
        w: &[u8],
        rb: usize,
        a: &Q8Rows,
        row0: usize,
        out: &mut [[f32; WIDE_ROWS]; WIDE_COLS],
    ) {
        let k = consts::<KIND>();
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
                let mut wg = [weight_group::<KIND>(&k, wp, g, a.blocks); C];
                for (c, v) in wg.iter_mut().enumerate().skip(1) {
                    *v = weight_group::<KIND>(&k, wp.add(c * rb), g, a.blocks);
                }
                if KIND == Q4_1 {
                    for (m, v) in mins.iter_mut().zip(wg.iter()) {
                        let at = m.as_mut_ptr().add((g - g0) * SPLIT_GROUP);
                        _mm512_mask_storeu_ps(at, 0x000F, v.mw);
                    }
                }
                for (r, ar) in acc.iter_mut().enumerate() {
                    let x = act_group::<KIND>(&k, a, row0 + r, g);
                    for (ac, wc) in ar.iter_mut().zip(wg.iter()) {
                        *ac = dot_group::<KIND>(wc, &x, *ac);
                    }
                }
            }
            if KIND == Q4_1 {
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
        ($name:ident, $kind:expr, $fallback:path) => {
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
                            1 => wide::<$r, 1, { $kind }>(w, rb, a, row0, out),
                            _ => wide::<$r, 2, { $kind }>(w, rb, a, row0, out),
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

    wide_fn!(wide_q4_0, Q4_0, super::super::int_wide::avx512::wide_q4_0);
    wide_fn!(wide_q4_1, Q4_1, super::super::int_wide::avx512::wide_q4_1);
    wide_fn!(wide_q8_0, Q8_0, super::super::int_wide::avx512::wide_q8_0);
}
