//! Helpers for this crate's unit tests: deterministic pseudo-random values and NMSE.

/// `n` deterministic values in `[lo, hi)`, never exactly zero.
pub fn vals(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
            let v = lo + (hi - lo) * u;
            if v == 0.0 {
                1e-3
            } else {
                v
            }
        })
        .collect()
}

/// Normalised mean squared error of `a` against the reference `b`.
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mut num = 0f64;
    let mut den = 0f64;
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    if den > 0.0 {
        num / den
    } else {
        num
    }
}
