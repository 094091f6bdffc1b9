//! The AVX2 exact-precision kernel of the block types whose blocks decode to 32 signed 8-bit
//! values and one f32 scale (Q5_0, MXFP4): each block is widened to f32, scaled, and multiplied
//! with up to four f32 activation rows by FMAs. Each type supplies its block decoder
//! ([`avx2::SignedBlock`]).

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! Only called after `simd::has_avx2_fma()`.
    use super::super::MAX_ROWS;
    use crate::linear::hsum_avx2 as hsum;
    use crate::quant::QK;
    use std::arch::x86_64::*;

    /// How the blocks of one weight type decode for [`rows`].
    pub(in super::super) trait SignedBlock {
        /// Bytes of one block (of 32 values).
        const BYTES: usize;
        /// The 32 values of the block at `b` as signed bytes, in element order.
        ///
        /// # Safety
        /// `b` points at a whole block, and the CPU has AVX2, FMA and F16C.
        unsafe fn values(b: *const u8) -> __m256i;
        /// The scale of the block at `b`.
        ///
        /// # Safety
        /// As [`SignedBlock::values`].
        unsafe fn scale(b: *const u8) -> f32;
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn float_n<B: SignedBlock, const R: usize>(
        w: &[u8],
        x: &[f32],
        k: usize,
        out: &mut [f32; MAX_ROWS],
    ) {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut b8 = [0i8; 32];
        for b in 0..k / QK {
            let blk = w.as_ptr().add(b * B::BYTES);
            _mm256_storeu_si256(b8.as_mut_ptr() as *mut __m256i, B::values(blk));
            let d = _mm256_set1_ps(B::scale(blk));
            let mut wf = [_mm256_setzero_ps(); 4];
            for (t, f) in wf.iter_mut().enumerate() {
                let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b8.as_ptr().add(8 * t) as *const _));
                *f = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
            }
            for (r, ac) in acc.iter_mut().enumerate() {
                let xp = x.as_ptr().add(r * k + b * QK);
                for (t, f) in wf.iter().enumerate() {
                    *ac = _mm256_fmadd_ps(*f, _mm256_loadu_ps(xp.add(8 * t)), *ac);
                }
            }
        }
        for (r, ac) in acc.iter().enumerate() {
            out[r] = hsum(*ac);
        }
    }

    /// The AVX2 kernel of block type `B` ([`super::super::FloatRowsFn`] contract).
    ///
    /// # Safety
    /// That contract, and the CPU has AVX2, FMA and F16C.
    pub(in super::super) unsafe fn rows<B: SignedBlock>(
        w: &[u8],
        x: &[f32],
        k: usize,
        n: usize,
        o: &mut [f32; MAX_ROWS],
    ) {
        match n {
            1 => float_n::<B, 1>(w, x, k, o),
            2 => float_n::<B, 2>(w, x, k, o),
            3 => float_n::<B, 3>(w, x, k, o),
            _ => float_n::<B, 4>(w, x, k, o),
        }
    }
}
