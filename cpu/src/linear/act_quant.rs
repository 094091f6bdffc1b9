//! Activation quantization for the `quant_act = 1` precision: f32 activation rows to Q8_0 blocks
//! (llama.cpp's `quantize_row_q8_0`: `d = amax / 127`, `q = round(x / d)`, `d` kept as f16),
//! plus `d · Σq` of every block (llama.cpp's Q8_1 `s`, needed by Q4_1 weights, whose dot has a
//! `min` term).
//!
//! Rounding is to nearest, ties to even, in both the scalar reference and the SIMD path (that is
//! what `cvtps2dq` does), so both produce bit-identical blocks. This module owns the layout of
//! quantized activations ([`Q8Rows`]); it must not know about weights.

use half::f16;

/// Values per block (same as the weight formats).
pub const QK: usize = 32;

/// Activation rows quantized to Q8_0, stored as separate arrays (scales, values) so the dot
/// kernels can load them directly. Block `b` of row `r` is entry `r * blocks + b`.
#[derive(Default, Clone, Debug)]
pub struct Q8Rows {
    /// Number of rows.
    pub rows: usize,
    /// Blocks per row (`k / 32`).
    pub blocks: usize,
    /// Per block `[d, d * Σq]`: the scale (an f16 value widened to f32) and the scaled sum of
    /// the 32 quantized values (one 8-byte load on the fast path).
    pub ds: Vec<[f32; 2]>,
    /// Per block the integer `Σq` (exact; used by the tiled Q4_0 kernel).
    pub sum: Vec<i32>,
    /// Per block `[8·Σq, 0, 0, 0, 0, 0, 0, 0]`: one 32-byte load turns the 8 partial sums of
    /// `Σ q·x` (unsigned Q4_0 nibbles) into `Σ (q − 8)·x`, exactly, in the AVX2 Q4_0 kernel.
    pub sum8: Vec<[i32; 8]>,
    /// Quantized values, 32 per block.
    pub qs: Vec<i8>,
    /// Per block the integer sums of its two halves of 16 values (used by the interleaved Q2_K
    /// and Q3_K kernels, whose scales change every 16 values); filled by
    /// [`Q8Rows::prepare_sum16`], left stale by a re-quantization.
    pub sum16: Vec<[i32; 2]>,
    /// [`Q8Rows::sum16`] times −32: where the interleaved Q6_K kernel starts each 16-value sum
    /// (`Σ (q − 32)·x` of its unsigned six-bit `q`); filled with it.
    pub q6_bias: Vec<[i32; 2]>,
    /// The same rows in the grouped layout of the streaming GEMV ([`Q8Split`]); empty until
    /// [`Q8Rows::prepare_split`] is called, and emptied by every re-quantization.
    pub split: Q8Split,
}

/// Activation rows rearranged for the `int_split` kernels: blocks in groups of
/// [`SPLIT_GROUP`], each group one 64-byte aligned [`SplitGroup`] record. A row's last group is
/// padded with zero blocks.
#[derive(Default, Clone, Debug)]
pub struct Q8Split {
    /// Rows prepared (0 when not prepared).
    pub rows: usize,
    /// Groups per row (`blocks.div_ceil(4)`).
    pub groups: usize,
    /// `rows × groups` records, row by row.
    pub recs: Vec<SplitGroup>,
    /// `dx·Σq` of every block, contiguous per row ([`Q8Split::sx_stride`] floats a row, zero
    /// padded): the wide tiles add Q4_1's min term 16 blocks at a time from here.
    pub sx: Vec<F32x16>,
}

/// Four activation blocks in the order of Q4 nibbles (low nibbles are values 0..16 of a block,
/// high nibbles 16..32) and their per-block numbers; 64-byte aligned so every load of a record
/// touches whole cache lines.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct SplitGroup {
    /// `[x0[..16], x1[..16], x2[..16], x3[..16], x0[16..], .., x3[16..]]`.
    pub xs: [[i8; 64]; 2],
    /// For blocks `j = 0..4`: word `4 + j` is the scale `dx` (f32 bits), word `8 + j` `−8·Σq`
    /// (i32; turns `Σ q·x` of unsigned Q4_0 nibbles into `Σ (q − 8)·x` exactly); words 0..4 and
    /// 12..16 are zero (Q4_1's min term reads `dx·Σq` from [`Q8Split::sx`]).
    pub meta: [u32; 16],
}

impl Default for SplitGroup {
    fn default() -> Self {
        SplitGroup {
            xs: [[0; 64]; 2],
            meta: [0; 16],
        }
    }
}

/// 16 floats, 64-byte aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub struct F32x16(pub [f32; 16]);

impl Q8Split {
    /// Floats per row of [`Q8Split::sx`]: the row's blocks (padded to whole groups) rounded up
    /// to 16.
    pub fn sx_stride(&self) -> usize {
        (self.groups * SPLIT_GROUP).next_multiple_of(16)
    }
}

/// Blocks per group of [`Q8Split`].
pub const SPLIT_GROUP: usize = 4;

impl Q8Rows {
    /// Resizes for `rows` rows of `blocks` blocks (contents unspecified until quantized into).
    pub fn resize(&mut self, rows: usize, blocks: usize) {
        self.rows = rows;
        self.blocks = blocks;
        self.ds.resize(rows * blocks, [0.0; 2]);
        self.sum.resize(rows * blocks, 0);
        self.sum8.resize(rows * blocks, [0; 8]);
        self.qs.resize(rows * blocks * QK, 0);
        self.split.rows = 0;
    }

    /// Fills [`Q8Rows::sum16`] and [`Q8Rows::q6_bias`] from the quantized values (one pass over
    /// `k` bytes per row).
    pub fn prepare_sum16(&mut self) {
        let n = self.rows * self.blocks;
        self.sum16.clear();
        let half = |h: &[i8]| h.iter().map(|&v| v as i32).sum::<i32>();
        let blocks = self.qs[..n * QK].chunks_exact(QK);
        self.sum16
            .extend(blocks.map(|b| [half(&b[..QK / 2]), half(&b[QK / 2..])]));
        self.q6_bias.clear();
        self.q6_bias
            .extend(self.sum16.iter().map(|&[a, b]| [-32 * a, -32 * b]));
    }

    /// Fills [`Q8Rows::split`] from the quantized rows (cheap: one pass over `k` bytes per row).
    pub fn prepare_split(&mut self) {
        let (rows, blocks) = (self.rows, self.blocks);
        let groups = blocks.div_ceil(SPLIT_GROUP);
        let sp = &mut self.split;
        sp.groups = groups;
        sp.recs.clear();
        sp.recs.resize(rows * groups, SplitGroup::default());
        let sxs = sp.sx_stride();
        sp.sx.clear();
        sp.sx.resize(rows * sxs / 16, F32x16::default());
        for r in 0..rows {
            for b in 0..blocks {
                let j = b % SPLIT_GROUP;
                let rec = &mut sp.recs[r * groups + b / SPLIT_GROUP];
                let src = &self.qs[(r * blocks + b) * QK..(r * blocks + b + 1) * QK];
                rec.xs[0][16 * j..16 * j + 16].copy_from_slice(&src[..16]);
                rec.xs[1][16 * j..16 * j + 16].copy_from_slice(&src[16..]);
                let [d, s] = self.ds[r * blocks + b];
                rec.meta[4 + j] = d.to_bits();
                rec.meta[8 + j] = (-8 * self.sum[r * blocks + b]) as u32;
                let at = r * sxs + b;
                sp.sx[at / 16].0[at % 16] = s;
            }
        }
        sp.rows = rows;
    }
}

#[inline]
fn block_scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (f16::from_f32(d).to_f32(), id)
}

/// Scalar reference: quantizes `rows` rows of `k` values (`k % 32 == 0`, `x.len() >= rows * k`)
/// into `out`. Returns `Err` naming the mismatch otherwise.
pub fn quantize_rows_ref(x: &[f32], rows: usize, k: usize, out: &mut Q8Rows) -> Result<(), String> {
    check(x, rows, k)?;
    let blocks = k / QK;
    out.resize(rows, blocks);
    for (i, xb) in x[..rows * k].chunks_exact(QK).enumerate() {
        let amax = xb.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let (d, id) = block_scale(amax);
        let mut s = 0i32;
        for (q, &v) in out.qs[i * QK..(i + 1) * QK].iter_mut().zip(xb) {
            let r = ((v * id).round_ties_even() as i32).clamp(-127, 127);
            s += r;
            *q = r as i8;
        }
        out.ds[i] = [d, d * s as f32];
        out.sum[i] = s;
        out.sum8[i] = [8 * s, 0, 0, 0, 0, 0, 0, 0];
    }
    Ok(())
}

fn check(x: &[f32], rows: usize, k: usize) -> Result<(), String> {
    if !k.is_multiple_of(QK) {
        return Err(format!(
            "activation quantization needs k % 32 == 0, got k = {k}"
        ));
    }
    if rows.checked_mul(k).is_none_or(|n| n > x.len()) {
        return Err(format!(
            "activation has {} values, need {rows} x {k}",
            x.len()
        ));
    }
    Ok(())
}

/// Fast path of [`quantize_rows_ref`] (AVX2 when available); bit-identical results.
pub fn quantize_rows(x: &[f32], rows: usize, k: usize, out: &mut Q8Rows) -> Result<(), String> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() {
            check(x, rows, k)?;
            out.resize(rows, k / QK);
            // SAFETY: AVX2 checked at run time; sizes checked above.
            unsafe { quantize_rows_avx2(&x[..rows * k], out) };
            return Ok(());
        }
    }
    quantize_rows_ref(x, rows, k, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_rows_avx2(x: &[f32], out: &mut Q8Rows) {
    use std::arch::x86_64::*;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for (i, xb) in x.chunks_exact(QK).enumerate() {
        let p = xb.as_ptr();
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
            _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)),
        );
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m1 = _mm_max_ss(m2, _mm_movehdup_ps(m2));
        let (d, id) = block_scale(_mm_cvtss_f32(m1));
        let idv = _mm256_set1_ps(id);
        let lo = _mm256_set1_epi32(-127);
        let hi = _mm256_set1_epi32(127);
        let mut qi = [0i32; QK];
        for (j, vj) in v.iter().enumerate() {
            let q = _mm256_cvtps_epi32(_mm256_mul_ps(*vj, idv));
            let q = _mm256_min_epi32(_mm256_max_epi32(q, lo), hi);
            _mm256_storeu_si256(qi.as_mut_ptr().add(8 * j) as *mut __m256i, q);
        }
        let mut s = 0i32;
        for (o, &q) in out.qs[i * QK..(i + 1) * QK].iter_mut().zip(&qi) {
            s += q;
            *o = q as i8;
        }
        out.ds[i] = [d, d * s as f32];
        out.sum[i] = s;
        out.sum8[i] = [8 * s, 0, 0, 0, 0, 0, 0, 0];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_equals_reference_bitwise() {
        // include exact ties (x * id = n + 0.5) and zero blocks
        let mut x: Vec<f32> = (0..320)
            .map(|i| ((i * 7919 % 263) as f32 - 131.0) / 17.0)
            .collect();
        x[0] = 127.0;
        x[1] = 0.5;
        x[2] = 1.5;
        x[3] = -2.5;
        for v in &mut x[64..96] {
            *v = 0.0;
        }
        let (mut a, mut b) = (Q8Rows::default(), Q8Rows::default());
        quantize_rows_ref(&x, 2, 160, &mut a).unwrap();
        quantize_rows(&x, 2, 160, &mut b).unwrap();
        assert_eq!(a.qs, b.qs);
        assert_eq!(a.ds, b.ds);
        assert_eq!(a.sum, b.sum);
        assert_eq!(a.sum8, b.sum8);
        assert_eq!(&a.qs[..4], &[127, 0, 2, -2]); // ties to even
                                                  // dequantized values are close to the input
        for (i, &v) in x.iter().enumerate() {
            let d = a.ds[i / 32][0];
            let r = d * a.qs[i] as f32;
            assert!(
                (r - v).abs() <= d * 0.51 + 1e-3 * v.abs(),
                "{i}: {v} vs {r}"
            );
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        let mut q = Q8Rows::default();
        assert!(quantize_rows_ref(&[0.0; 40], 1, 40, &mut q).is_err());
        assert!(quantize_rows(&[0.0; 32], 2, 32, &mut q).is_err());
    }
}
