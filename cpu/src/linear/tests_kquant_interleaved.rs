//! Tests of the interleaved K-quant layout and kernels (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): the layout
//! round-trips and refuses shapes it cannot hold; the SIMD kernels give the scalar reference's
//! bits on awkward sizes (1, 3 and 5 super-blocks, several groups, every activation row count up to
//! `MAX_ROWS` and a remainder), and the reference matches the plain integer K-quant path within
//! float reordering. Weights are random bytes (every bit of the packed scales, mins and high bits
//! exercised, negative Q6_K scales included) with sane f16 scales.

use super::interleaved::{self, GROUP_ROWS};
use super::interleaved_kquant as ik;
use super::*;
use crate::threads::Threads;
use half::f16;

const TYPES: [WeightType; 5] = [
    WeightType::Q2K,
    WeightType::Q3K,
    WeightType::Q4K,
    WeightType::Q5K,
    WeightType::Q6K,
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `n` rows of `k` values of K-quant type `t`: random bytes, with every super-block's f16
/// scales (`d`, and `dmin` for Q4_K/Q5_K) set to small finite values.
fn rand_weight(t: WeightType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let rb = t.row_bytes(k).unwrap();
    let mut w: Vec<u8> = (0..n * rb).map(|_| rng.next() as u8).collect();
    let bs = rb / (k / 256);
    let scales: &[usize] = match t {
        WeightType::Q6K => &[208],
        WeightType::Q3K => &[108],
        WeightType::Q2K => &[80, 82],
        _ => &[0, 2],
    };
    for blk in w.chunks_exact_mut(bs) {
        for &at in scales {
            let v = f16::from_f32(rng.f() * 0.01);
            blk[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    w
}

fn rand_x(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..n).map(|_| rng.f()).collect()
}

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den.max(1e-30)
}

#[test]
fn kquant_layout_round_trips() {
    for t in TYPES {
        for (n, k) in [(16usize, 256usize), (32, 768), (48, 1280)] {
            let plain = rand_weight(t, n, k, (n + k) as u64);
            let mut il = vec![0u8; plain.len()];
            interleaved::interleave(t, &plain, n, k, &mut il).unwrap();
            assert_ne!(
                il,
                plain,
                "{} {n}x{k}: interleaving changed nothing",
                t.name()
            );
            let rb = t.row_bytes(k).unwrap();
            let mut row = vec![0u8; rb];
            for r in 0..n {
                interleaved::plain_row(t, &il, n, k, r, &mut row).unwrap();
                assert_eq!(
                    row,
                    plain[r * rb..(r + 1) * rb],
                    "{} {n}x{k} row {r}",
                    t.name()
                );
            }
        }
        let plain = rand_weight(t, 24, 512, 5);
        let mut o = vec![0u8; plain.len()];
        let e = ik::interleave(t, &plain, 24, 512, &mut o).unwrap_err();
        assert!(e.contains("multiple of 16"), "{e}");
        let e = ik::interleave(t, &plain, 16, 128, &mut o).unwrap_err();
        assert!(e.contains("multiple of 256"), "{e}");
        let e = ik::interleave(t, &plain[..100], 16, 512, &mut o).unwrap_err();
        assert!(e.contains("needs"), "{e}");
        let e = ik::plain_row(t, &plain, 16, 512, 16, &mut o).unwrap_err();
        assert!(e.contains("row 16 of 16"), "{e}");
    }
    let mut o = vec![0u8; 16 * 18];
    assert!(ik::interleave(WeightType::Q4_0, &o.clone(), 16, 32, &mut o).is_err());
}

/// SIMD bit-equal to the interleaved reference; both equal to the plain integer K-quant path
/// within float reordering (`quant_act = 1`); `quant_act = 0` equal to the plain exact path.
#[test]
fn kquant_interleaved_kernels_match_reference() {
    let threads = Threads::new(2).unwrap();
    for t in TYPES {
        for (n, k) in [(16usize, 256usize), (32, 768), (48, 1280), (64, 2048)] {
            let plain = rand_weight(t, n, k, (3 * n + k) as u64);
            let mut il = vec![0u8; plain.len()];
            interleaved::interleave(t, &plain, n, k, &mut il).unwrap();
            let bias = rand_x(n, 99);
            for rows in [1usize, 2, 3, 4, 5, 9] {
                let x = rand_x(rows * k, (rows * 31 + k) as u64);
                for quant_act in [true, false] {
                    let a = LinearArgs {
                        x: &x,
                        rows,
                        k,
                        w: &il,
                        wtype: t,
                        n,
                        bias: Some(&bias),
                        quant_act,
                    };
                    let mut want = vec![0f32; rows * n];
                    linear_ref(&LinearArgs { w: &plain, ..a }, &mut want).unwrap();
                    let mut r = vec![0f32; rows * n];
                    linear_interleaved(None, &a, &mut r).unwrap();
                    let mut f = vec![0f32; rows * n];
                    linear_interleaved(Some(&threads), &a, &mut f).unwrap();
                    let what = format!("{} {n}x{k} rows {rows} qa {quant_act}", t.name());
                    if quant_act && interleaved::pick(t).is_some() {
                        assert_eq!(r, f, "{what}: SIMD differs from the interleaved reference");
                    }
                    let e = nmse(&r, &want);
                    assert!(e < 1e-10, "{what}: nmse {e} against the plain path");
                    let e = nmse(&f, &want);
                    assert!(
                        e < 1e-10,
                        "{what}: nmse {e} (threads) against the plain path"
                    );
                }
            }
        }
    }
}

/// The interleaved group kernels called directly on one group with activation rows starting past
/// row 0 (the row offset the threaded split passes).
#[test]
fn kquant_group_kernels_row_offset() {
    for t in TYPES {
        let (Some(simd), Some(rf)) = (interleaved::pick(t), interleaved::pick_ref(t)) else {
            continue;
        };
        let k = 768;
        let plain = rand_weight(t, GROUP_ROWS, k, 17);
        let mut il = vec![0u8; plain.len()];
        ik::interleave(t, &plain, GROUP_ROWS, k, &mut il).unwrap();
        let mut q = act_quant::Q8Rows::default();
        act_quant::quantize_rows_ref(&rand_x(7 * k, 3), 7, k, &mut q).unwrap();
        q.prepare_sum16();
        for rows in 1..=MAX_ROWS {
            let mut a = [[f32::NAN; GROUP_ROWS]; MAX_ROWS];
            let mut b = [[f32::NAN; GROUP_ROWS]; MAX_ROWS];
            // SAFETY: one whole group of `k / 256` super-blocks; rows 3..3 + rows exist; kernel
            // picked for this CPU.
            unsafe {
                simd(&il, &q, 3, rows, &mut a);
                rf(&il, &q, 3, rows, &mut b);
            }
            assert_eq!(a[..rows], b[..rows], "{} rows {rows}", t.name());
        }
    }
}

/// Both Q6_K SIMD kernels (GFNI and shifts-and-masks; the run-time pick uses one) give the
/// reference's bits on 1, 3 and 5 super-blocks and every activation row count.
#[cfg(target_arch = "x86_64")]
#[test]
fn q6_k_kernels_with_and_without_gfni() {
    use super::interleaved_q6::avx512::{group_q6_k, group_q6_k_gfni};
    if !interleaved::available() {
        return;
    }
    let rf = interleaved::pick_ref(WeightType::Q6K).unwrap();
    let mut kernels: Vec<interleaved::InterleavedFn> = vec![group_q6_k];
    if is_x86_feature_detected!("gfni") {
        kernels.push(group_q6_k_gfni);
    }
    for k in [256usize, 768, 1280] {
        let plain = rand_weight(WeightType::Q6K, GROUP_ROWS, k, k as u64 + 5);
        let mut il = vec![0u8; plain.len()];
        ik::interleave(WeightType::Q6K, &plain, GROUP_ROWS, k, &mut il).unwrap();
        let mut q = act_quant::Q8Rows::default();
        act_quant::quantize_rows_ref(&rand_x(6 * k, k as u64), 6, k, &mut q).unwrap();
        q.prepare_sum16();
        for rows in 1..=MAX_ROWS {
            let mut want = [[f32::NAN; GROUP_ROWS]; MAX_ROWS];
            // SAFETY: one whole group of `k / 256` super-blocks; rows 2..2 + rows exist.
            unsafe { rf(&il, &q, 2, rows, &mut want) };
            for (i, f) in kernels.iter().enumerate() {
                let mut got = [[f32::NAN; GROUP_ROWS]; MAX_ROWS];
                // SAFETY: as above; the kernel's features were checked.
                unsafe { f(&il, &q, 2, rows, &mut got) };
                assert_eq!(got[..rows], want[..rows], "kernel {i} k {k} rows {rows}");
            }
        }
    }
}
