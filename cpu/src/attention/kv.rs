//! The storage formats of a KV cache and their conversions: a cache is `[tokens][kv heads]` head
//! rows of `hd` values, each row stored as
//! - `f32`: `hd` floats;
//! - `f16`: `hd` IEEE halves (read with `vcvtph2ps`);
//! - `q8_0`: `hd.div_ceil(32)` GGUF `Q8_0` blocks (an f16 scale, then 32 int8), the last block
//!   zero-padded when `hd` is not a multiple of 32. The f16 scale costs one conversion per 32
//!   values, as cheap to read with AVX-512 as an f32 one, and keeps the cache's blocks the same as
//!   the weights' `Q8_0`.
//!
//! [`KvRows`] is a borrowed cache; [`store_rows`] encodes f32 rows into a format. Kernels read a
//! row through [`KvRows::load_row`] (AVX-512, AVX2/F16C or scalar, chosen at run time) or, on
//! AVX-512, 16 values at a time straight from the row's bytes (`avx512::Load16`). The scalar
//! [`KvRows::to_f32`] is the reference every path is tested against.

use crate::quant::{quantize_q8_0, Q8_0_BYTES, QK};
use half::f16;

/// How a KV cache stores its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvFormat {
    /// 32-bit floats.
    F32,
    /// IEEE half floats.
    F16,
    /// `Q8_0` blocks of 32 per head row (the last one zero-padded).
    Q8_0,
}

impl KvFormat {
    /// Values stored per head row of `hd` values (`q8_0` rounds up to whole blocks).
    pub fn stored_len(self, hd: usize) -> usize {
        match self {
            KvFormat::Q8_0 => hd.div_ceil(QK) * QK,
            _ => hd,
        }
    }

    /// Bytes of one head row of `hd` values.
    pub fn row_bytes(self, hd: usize) -> usize {
        match self {
            KvFormat::F32 => 4 * hd,
            KvFormat::F16 => 2 * hd,
            KvFormat::Q8_0 => hd.div_ceil(QK) * Q8_0_BYTES,
        }
    }
}

/// A borrowed KV cache: head rows of `hd` values in one of the [`KvFormat`]s.
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    /// f32 rows.
    F32(&'a [f32]),
    /// f16 rows.
    F16(&'a [f16]),
    /// `Q8_0` rows (bytes).
    Q8_0(&'a [u8]),
}

impl<'a> KvRows<'a> {
    /// The format.
    pub fn format(&self) -> KvFormat {
        match self {
            KvRows::F32(_) => KvFormat::F32,
            KvRows::F16(_) => KvFormat::F16,
            KvRows::Q8_0(_) => KvFormat::Q8_0,
        }
    }

    /// Whole head rows of `hd` values held.
    pub fn rows(&self, hd: usize) -> usize {
        let rb = self.format().row_bytes(hd);
        match self {
            _ if rb == 0 => 0,
            KvRows::F32(x) => x.len() / hd,
            KvRows::F16(x) => x.len() / hd,
            KvRows::Q8_0(x) => x.len() / rb,
        }
    }

    /// The first byte of the storage (rows are `format().row_bytes(hd)` apart).
    pub fn base(&self) -> *const u8 {
        match self {
            KvRows::F32(x) => x.as_ptr().cast(),
            KvRows::F16(x) => x.as_ptr().cast(),
            KvRows::Q8_0(x) => x.as_ptr(),
        }
    }

    /// Row `r` as f32 slice when the cache is f32 (no copy).
    pub fn f32_row(&self, r: usize, hd: usize) -> Option<&'a [f32]> {
        match self {
            KvRows::F32(x) => x.get(r * hd..(r + 1) * hd),
            _ => None,
        }
    }

    /// Row `r` converted into `dst` (`hd = dst.len()` values); zeros when the row is absent.
    pub fn load_row(&self, r: usize, dst: &mut [f32]) {
        let hd = dst.len();
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::has_avx2_fma() && r < self.rows(hd) {
                // SAFETY: AVX2/FMA/F16C checked at run time; row r exists.
                unsafe { avx2::load_row(self, r, dst) };
                return;
            }
        }
        self.load_row_scalar(r, dst);
    }

    /// [`KvRows::load_row`] without SIMD (the reference).
    pub fn load_row_scalar(&self, r: usize, dst: &mut [f32]) {
        let hd = dst.len();
        match self {
            KvRows::F32(x) => match x.get(r * hd..(r + 1) * hd) {
                Some(s) => dst.copy_from_slice(s),
                None => dst.fill(0.0),
            },
            KvRows::F16(x) => match x.get(r * hd..(r + 1) * hd) {
                Some(s) => dst.iter_mut().zip(s).for_each(|(d, h)| *d = h.to_f32()),
                None => dst.fill(0.0),
            },
            KvRows::Q8_0(x) => {
                let rb = KvFormat::Q8_0.row_bytes(hd);
                let Some(row) = x.get(r * rb..(r + 1) * rb) else {
                    dst.fill(0.0);
                    return;
                };
                for (blk, out) in row.chunks_exact(Q8_0_BYTES).zip(dst.chunks_mut(QK)) {
                    let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                    for (o, &q) in out.iter_mut().zip(&blk[2..]) {
                        *o = d * (q as i8) as f32;
                    }
                }
            }
        }
    }

    /// Every row converted to f32 (scalar; for references and tests).
    pub fn to_f32(&self, hd: usize) -> Vec<f32> {
        let n = self.rows(hd);
        let mut out = vec![0f32; n * hd];
        for (r, o) in out.chunks_exact_mut(hd.max(1)).enumerate().take(n) {
            self.load_row_scalar(r, o);
        }
        out
    }
}

/// Encodes `src` (head rows of `hd` values) into `dst` in `fmt`: `dst.len()` must be
/// `src.len() / hd · fmt.row_bytes(hd)` bytes (extra rows of either are left alone).
pub fn store_rows(fmt: KvFormat, src: &[f32], hd: usize, dst: &mut [u8]) {
    let rb = fmt.row_bytes(hd);
    if hd == 0 || rb == 0 {
        return;
    }
    let mut pad = [0f32; QK];
    for (x, out) in src.chunks_exact(hd).zip(dst.chunks_exact_mut(rb)) {
        match fmt {
            KvFormat::F32 => {
                for (o, v) in out.chunks_exact_mut(4).zip(x) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            KvFormat::F16 => store_f16(x, out),
            KvFormat::Q8_0 => {
                let whole = hd / QK * QK;
                let (head, tail) = out.split_at_mut(whole / QK * Q8_0_BYTES);
                quantize_q8_0(&x[..whole], head);
                if whole < hd {
                    pad.fill(0.0);
                    pad[..hd - whole].copy_from_slice(&x[whole..]);
                    quantize_q8_0(&pad, tail);
                }
            }
        }
    }
}

/// `x` as little-endian halves (round to nearest even) into `out` (`2·x.len()` bytes).
fn store_f16(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2_fma() && out.len() >= 2 * x.len() {
            // SAFETY: AVX2/F16C checked at run time; out holds 2·x.len() bytes.
            unsafe { avx2::store_f16(x, out) };
            return;
        }
    }
    for (o, v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! AVX2/F16C row conversions.
    use super::{KvFormat, KvRows};
    use crate::quant::{Q8_0_BYTES, QK};
    use std::arch::x86_64::*;

    /// Row `r` (which exists) into `dst`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn load_row(rows: &KvRows, r: usize, dst: &mut [f32]) {
        let hd = dst.len();
        let row = rows.base().add(r * rows.format().row_bytes(hd));
        let o = dst.as_mut_ptr();
        match rows.format() {
            KvFormat::F32 => std::ptr::copy_nonoverlapping(row.cast::<f32>(), o, hd),
            KvFormat::F16 => {
                let h = row.cast::<u16>();
                let mut c = 0;
                while c + 8 <= hd {
                    let x = _mm_loadu_si128(h.add(c).cast());
                    _mm256_storeu_ps(o.add(c), _mm256_cvtph_ps(x));
                    c += 8;
                }
                for c in c..hd {
                    *o.add(c) = half::f16::from_bits(h.add(c).read_unaligned()).to_f32();
                }
            }
            KvFormat::Q8_0 => {
                for b in 0..hd.div_ceil(QK) {
                    let bp = row.add(b * Q8_0_BYTES);
                    let d = scale(bp);
                    let n = (hd - b * QK).min(QK);
                    let mut c = 0;
                    while c + 8 <= n {
                        let q = _mm_loadl_epi64(bp.add(2 + c).cast());
                        let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                        _mm256_storeu_ps(o.add(b * QK + c), _mm256_mul_ps(x, _mm256_set1_ps(d)));
                        c += 8;
                    }
                    for c in c..n {
                        *o.add(b * QK + c) = d * (*bp.add(2 + c) as i8) as f32;
                    }
                }
            }
        }
    }

    /// The f16 scale at the start of a `Q8_0` block.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn scale(bp: *const u8) -> f32 {
        let bits = bp.cast::<u16>().read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    /// `x` as halves into `out` (`2·x.len()` bytes).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn store_f16(x: &[f32], out: &mut [u8]) {
        let (n, o) = (x.len(), out.as_mut_ptr());
        let mut c = 0;
        while c + 8 <= n {
            let h =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.as_ptr().add(c)));
            _mm_storeu_si128(o.add(2 * c).cast(), h);
            c += 8;
        }
        for (i, v) in x.iter().enumerate().skip(c) {
            let b = half::f16::from_f32(*v).to_bits();
            o.add(2 * i).cast::<u16>().write_unaligned(b);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    //! AVX-512 reads of 16 values of a head row straight from the cache's bytes, one type per
    //! format so that kernels are compiled once per format.
    use crate::quant::{Q8_0_BYTES, QK};
    use std::arch::x86_64::*;

    /// Reads values of a head row stored in one format.
    pub(crate) trait Load16 {
        /// Bytes of a head row of `hd` values.
        fn row_bytes(hd: usize) -> usize;
        /// Values `c..c + 16` (`c` a multiple of 16) of the row at `row`, lanes outside `m` zero;
        /// reads no byte of a lane outside `m` (with `m == 0`, nothing).
        ///
        /// # Safety
        /// AVX-512 F/BW/VL and F16C; every lane in `m` is a value of the row.
        unsafe fn load(row: *const u8, c: usize, m: __mmask16) -> __m512;
    }

    /// Calls `$f::<K, V>(args…)` with `K` and `V` the [`Load16`] types of the key and value
    /// formats `$k` and `$v` (each a [`KvFormat`](super::KvFormat)), so that a kernel is
    /// compiled once per pair of formats.
    macro_rules! by_kv_formats {
        ($k:expr, $v:expr, $f:ident($($a:expr),* $(,)?)) => {{
            use $crate::attention::kv::avx512::{F16, F32, Q8};
            use $crate::attention::kv::KvFormat as F;
            match ($k, $v) {
                (F::F32, F::F32) => $f::<F32, F32>($($a),*),
                (F::F32, F::F16) => $f::<F32, F16>($($a),*),
                (F::F32, F::Q8_0) => $f::<F32, Q8>($($a),*),
                (F::F16, F::F32) => $f::<F16, F32>($($a),*),
                (F::F16, F::F16) => $f::<F16, F16>($($a),*),
                (F::F16, F::Q8_0) => $f::<F16, Q8>($($a),*),
                (F::Q8_0, F::F32) => $f::<Q8, F32>($($a),*),
                (F::Q8_0, F::F16) => $f::<Q8, F16>($($a),*),
                (F::Q8_0, F::Q8_0) => $f::<Q8, Q8>($($a),*),
            }
        }};
    }
    pub(crate) use by_kv_formats;

    /// f32 rows.
    pub(crate) struct F32;
    /// f16 rows.
    pub(crate) struct F16;
    /// `Q8_0` rows.
    pub(crate) struct Q8;

    impl Load16 for F32 {
        fn row_bytes(hd: usize) -> usize {
            4 * hd
        }
        #[inline(always)]
        unsafe fn load(row: *const u8, c: usize, m: __mmask16) -> __m512 {
            _mm512_maskz_loadu_ps(m, row.cast::<f32>().add(c))
        }
    }

    impl Load16 for F16 {
        fn row_bytes(hd: usize) -> usize {
            2 * hd
        }
        #[inline(always)]
        unsafe fn load(row: *const u8, c: usize, m: __mmask16) -> __m512 {
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row.cast::<i16>().add(c).cast()))
        }
    }

    impl Load16 for Q8 {
        fn row_bytes(hd: usize) -> usize {
            hd.div_ceil(QK) * Q8_0_BYTES
        }
        #[inline(always)]
        unsafe fn load(row: *const u8, c: usize, m: __mmask16) -> __m512 {
            if m == 0 {
                return _mm512_setzero_ps();
            }
            let bp = row.add(c / QK * Q8_0_BYTES);
            let bits = bp.cast::<u16>().read_unaligned();
            let d = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
            let q = _mm_maskz_loadu_epi8(m, bp.add(2 + c % QK).cast());
            let x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
            _mm512_mul_ps(x, _mm512_broadcastss_ps(d))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::vals;

    fn encode(fmt: KvFormat, x: &[f32], hd: usize) -> Vec<u8> {
        let mut b = vec![0u8; x.len() / hd * fmt.row_bytes(hd)];
        store_rows(fmt, x, hd, &mut b);
        b
    }

    fn rows_of(fmt: KvFormat, b: &[u8]) -> (Vec<f32>, Vec<f16>) {
        match fmt {
            KvFormat::F32 => (
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                vec![],
            ),
            KvFormat::F16 => (
                vec![],
                b.chunks_exact(2)
                    .map(|c| f16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            KvFormat::Q8_0 => (vec![], vec![]),
        }
    }

    #[test]
    fn store_and_load_round_trip_within_the_format_precision() {
        for hd in [1usize, 7, 33, 64, 80, 128] {
            let x = vals(5 * hd, hd as u64, -3.0, 3.0);
            for (fmt, tol) in [
                (KvFormat::F32, 0.0f32),
                (KvFormat::F16, 1e-3),
                (KvFormat::Q8_0, 3.0 / 127.0 * 0.51 + 1e-3),
            ] {
                let b = encode(fmt, &x, hd);
                let (f, h) = rows_of(fmt, &b);
                let rows = match fmt {
                    KvFormat::F32 => KvRows::F32(&f),
                    KvFormat::F16 => KvRows::F16(&h),
                    KvFormat::Q8_0 => KvRows::Q8_0(&b),
                };
                assert_eq!(rows.rows(hd), 5);
                let r = rows.to_f32(hd);
                for (a, e) in r.iter().zip(&x) {
                    assert!(
                        (a - e).abs() <= tol * e.abs().max(1.0),
                        "{fmt:?} {hd}: {a} {e}"
                    );
                }
                let mut fast = vec![0f32; hd];
                for row in 0..5 {
                    rows.load_row(row, &mut fast);
                    assert_eq!(fast, r[row * hd..(row + 1) * hd], "{fmt:?} {hd} row {row}");
                }
                rows.load_row(5, &mut fast);
                assert!(fast.iter().all(|&v| v == 0.0));
            }
        }
    }

    #[test]
    fn f16_store_matches_scalar_rounding() {
        let x = vals(1000, 9, -70000.0, 70000.0);
        let b = encode(KvFormat::F16, &x, 100);
        for (c, v) in b.chunks_exact(2).zip(&x) {
            assert_eq!(f16::from_le_bytes([c[0], c[1]]), f16::from_f32(*v));
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_loads_match_scalar() {
        use avx512::Load16;
        use std::arch::x86_64::*;
        if !crate::simd::has_avx512() {
            return;
        }
        unsafe fn all<L: Load16>(row: *const u8, hd: usize) -> Vec<f32> {
            let mut out = vec![0f32; hd.div_ceil(16) * 16];
            for c in (0..hd).step_by(16) {
                let m = ((1u32 << (hd - c).min(16)) - 1) as __mmask16;
                _mm512_storeu_ps(out.as_mut_ptr().add(c), L::load(row, c, m));
            }
            out.truncate(hd);
            out
        }
        for hd in [7usize, 33, 64, 80, 128] {
            let x = vals(3 * hd, 5, -2.0, 2.0);
            for fmt in [KvFormat::F32, KvFormat::F16, KvFormat::Q8_0] {
                let b = encode(fmt, &x, hd);
                let (f, h) = rows_of(fmt, &b);
                let rows = match fmt {
                    KvFormat::F32 => KvRows::F32(&f),
                    KvFormat::F16 => KvRows::F16(&h),
                    KvFormat::Q8_0 => KvRows::Q8_0(&b),
                };
                let r = rows.to_f32(hd);
                for row in 0..3 {
                    let p = unsafe { rows.base().add(row * fmt.row_bytes(hd)) };
                    let got = unsafe {
                        match fmt {
                            KvFormat::F32 => all::<avx512::F32>(p, hd),
                            KvFormat::F16 => all::<avx512::F16>(p, hd),
                            KvFormat::Q8_0 => all::<avx512::Q8>(p, hd),
                        }
                    };
                    assert_eq!(got, r[row * hd..(row + 1) * hd], "{fmt:?} {hd}");
                }
            }
        }
    }
}
