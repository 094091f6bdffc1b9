//! Rope definitions the tests compute on their own, in f64.

#![allow(dead_code)]

/// llama.cpp's `rope_freqs` divisors (one per rotated pair) for a llama3 scaling of base
/// `theta` over `dim` rotated dims: `factor`, low / high frequency factors `lo` / `hi`, original
/// context `old`.
pub fn llama3_divisors(
    theta: f64,
    dim: usize,
    factor: f64,
    lo: f64,
    hi: f64,
    old: f64,
) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf(2.0 * i as f64 / dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let scaled = if wavelen < old / hi {
                freq
            } else if wavelen > old / lo {
                freq / factor
            } else {
                let smooth = (old / wavelen - lo) / (hi - lo);
                (1.0 - smooth) * freq / factor + smooth * freq
            };
            (freq / scaled) as f32
        })
        .collect()
}
