//! The error function: an accurate f64 `erf` (the reference for exact GELU) and a fast f32
//! rational approximation (used by the fast GELU path).
//!
//! `erf_f64` sums the everywhere-convergent series `erf x = 2/√π · e^{-x²} · Σ 2ⁿ x^{2n+1} /
//! (1·3·…·(2n+1))` (all terms positive, so no cancellation) for |x| < 3, and the continued fraction
//! of `erfc` (modified Lentz) beyond; relative error about 1e-15. This module must not know about
//! tensors.

const TWO_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;

/// `erf(x)` in double precision (relative error ≲ 1e-15).
pub fn erf_f64(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    let ax = x.abs();
    let r = if ax < 3.0 {
        erf_series(ax)
    } else {
        1.0 - erfc_continued_fraction(ax)
    };
    r.copysign(x)
}

/// `erfc(x)` for x ≥ 0 in double precision.
pub fn erfc_f64(x: f64) -> f64 {
    if x < 3.0 {
        1.0 - erf_f64(x)
    } else {
        erfc_continued_fraction(x)
    }
}

fn erf_series(x: f64) -> f64 {
    let x2 = x * x;
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0f64;
    while n < 200.0 {
        n += 1.0;
        term *= 2.0 * x2 / (2.0 * n + 1.0);
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    TWO_OVER_SQRT_PI * (-x2).exp() * sum
}

/// `erfc x = e^{-x²}/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + 2/(x + …)))))`, x ≥ 3.
fn erfc_continued_fraction(x: f64) -> f64 {
    let tiny = 1e-300;
    // f = b0 + a1/(b1 + a2/(b2 + ...)) with b_k = x, a_k = k/2
    let mut f = x;
    let mut c = x;
    let mut d = 0.0;
    for k in 1..300 {
        let a = k as f64 * 0.5;
        d = x + a * d;
        if d.abs() < tiny {
            d = tiny;
        }
        c = x + a / c;
        if c.abs() < tiny {
            c = tiny;
        }
        d = 1.0 / d;
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    (-x * x).exp() / (std::f64::consts::PI.sqrt() * f)
}

/// Coefficients of the fast f32 rational `erf` (odd numerator, even denominator; the form used by
/// Eigen's `generic_fast_erf_float`), valid on [-4, 4] (clamped outside).
pub(crate) const ERF_P: [f32; 7] = [
    -2.726_142_3e-10,
    2.770_681_4e-8,
    -2.101_024e-6,
    -5.692_506_4e-5,
    -7.349_906_3e-4,
    -2.954_600_1e-3,
    -1.609_603_3e-2,
];
pub(crate) const ERF_Q: [f32; 5] = [
    -1.456_607_2e-5,
    -2.133_740_6e-4,
    -1.682_827e-3,
    -7.373_329_2e-3,
    -1.426_474e-2,
];

/// Fast `erf` in f32 (absolute error ≲ 2e-7).
pub fn erf_fast(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = ERF_P[0];
    for c in &ERF_P[1..] {
        p = p * x2 + c;
    }
    let mut q = ERF_Q[0];
    for c in &ERF_Q[1..] {
        q = q * x2 + c;
    }
    x * p / q
}

#[cfg(test)]
mod tests {
    use super::*;

    // Values from tables of erf/erfc (Abramowitz & Stegun table 7.1, and mpmath to 16 digits).
    const KNOWN: [(f64, f64); 9] = [
        (0.0, 0.0),
        (0.1, 0.112_462_916_018_284_9),
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (1.5, 0.966_105_146_475_310_7),
        (2.0, 0.995_322_265_018_952_7),
        (2.5, 0.999_593_047_982_555),
        (3.0, 0.999_977_909_503_001_4),
        (4.0, 0.999_999_984_582_742_1),
    ];

    #[test]
    fn erf_f64_matches_known_values() {
        for (x, e) in KNOWN {
            let v = erf_f64(x);
            assert!(
                (v - e).abs() <= 2e-15 * e.max(1e-300) + 1e-300,
                "erf({x}) = {v:e}, want {e:e}"
            );
            assert!(
                (erf_f64(-x) + e).abs() <= 2e-15 * e.abs() + 1e-300,
                "erf odd at {x}"
            );
        }
        // erfc in the tail, where 1 - erf loses everything
        let tail = [
            (3.0, 2.209_049_699_858_544e-5),
            (5.0, 1.537_459_794_428_035e-12),
            (10.0, 2.088_487_583_762_545e-45),
        ];
        for (x, e) in tail {
            let v = erfc_f64(x);
            assert!((v - e).abs() <= 1e-13 * e, "erfc({x}) = {v:e}, want {e:e}");
        }
        // continuity where the two methods meet
        let a = erf_series(3.0);
        let b = 1.0 - erfc_continued_fraction(3.0);
        assert!((a - b).abs() < 1e-15);
    }

    #[test]
    fn erf_fast_is_close_to_erf_f64() {
        let mut worst = 0f64;
        for i in -6000..=6000 {
            let x = i as f32 * 1e-3;
            let d = (erf_fast(x) as f64 - erf_f64(x as f64)).abs();
            worst = worst.max(d);
        }
        assert!(worst < 5e-7, "worst abs error {worst:e}");
    }
}
