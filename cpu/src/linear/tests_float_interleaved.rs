//! Tests of the F16/BF16 interleaved layout and kernels: the layout round-trips, every SIMD
//! kernel gives the scalar reference's bits on awkward sizes (k not a multiple of the vector
//! width or of the 4 partial sums, every row count up to `MAX_ROWS`), and the reference matches
//! a float64 product.

use super::interleaved::GROUP_ROWS;
use super::interleaved_float::{self as fi, FloatGroupFn};
use super::*;
use crate::threads::Threads;

fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// (plain bytes, the values they hold) of `v` in `t` (F16 or BF16).
fn encode(t: WeightType, v: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let bf = t == WeightType::BF16;
    let mut deq = Vec::with_capacity(v.len());
    let mut b = Vec::with_capacity(2 * v.len());
    for &x in v {
        let (bytes, back) = if bf {
            let h = half::bf16::from_f32(x);
            (h.to_le_bytes(), h.to_f32())
        } else {
            let h = half::f16::from_f32(x);
            (h.to_le_bytes(), h.to_f32())
        };
        b.extend_from_slice(&bytes);
        deq.push(back);
    }
    (b, deq)
}

const TYPES: [WeightType; 2] = [WeightType::F16, WeightType::BF16];
const KS: [usize; 9] = [1, 3, 4, 5, 16, 67, 130, 577, 1536];

#[test]
fn float_layout_round_trips() {
    for t in TYPES {
        for (n, k) in [(16usize, 1usize), (32, 67), (48, 130)] {
            let (w, _) = encode(t, &rand_vec(n * k, (n + k) as u64));
            let mut il = vec![0u8; w.len()];
            interleaved::interleave(t, &w, n, k, &mut il).unwrap_or_else(|e| panic!("{e}"));
            assert!(k == 1 || il != w, "{n}x{k}: layout unchanged");
            let mut row = vec![0u8; 2 * k];
            for r in 0..n {
                interleaved::plain_row(t, &il, n, k, r, &mut row).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(row, w[r * 2 * k..(r + 1) * 2 * k], "{} row {r}", t.name());
            }
        }
        // rows not a multiple of 16, short buffers and block types' sizes are refused by name
        let w = vec![0u8; 2 * 17 * 8];
        let mut o = vec![0u8; w.len()];
        let e = fi::interleave(t, &w, 17, 8, &mut o).unwrap_err();
        assert!(e.contains("multiple of 16"), "{e}");
        let e = fi::interleave(t, &w[..10], 16, 8, &mut o).unwrap_err();
        assert!(e.contains("needs"), "{e}");
        assert!(fi::interleave(WeightType::Q4_0, &w, 16, 32, &mut o).is_err());
    }
}

/// Every kernel picked for this CPU (and the AVX2 one on AVX-512 machines) against the
/// reference, bit for bit; the reference against a float64 dot.
#[test]
fn float_interleaved_kernels_match_reference() {
    for t in TYPES {
        let refk = fi::pick_ref(t).unwrap_or_else(|| panic!("no reference"));
        let simd: Vec<FloatGroupFn> = [fi::pick(t), fi::pick_avx2(t)]
            .into_iter()
            .flatten()
            .collect();
        for k in KS {
            let (w, deq) = encode(t, &rand_vec(GROUP_ROWS * k, k as u64));
            let mut g = vec![0u8; w.len()];
            fi::interleave(t, &w, GROUP_ROWS, k, &mut g).unwrap_or_else(|e| panic!("{e}"));
            let x = rand_vec(MAX_ROWS * k, 99 + k as u64);
            for rows in 1..=MAX_ROWS {
                let mut want = [[0f32; GROUP_ROWS]; MAX_ROWS];
                // SAFETY: sizes as the kernel type asks; the reference needs no CPU feature.
                unsafe { refk(&g, &x, k, rows, &mut want) };
                for r in 0..rows {
                    for j in 0..GROUP_ROWS {
                        let exact: f64 = (0..k)
                            .map(|i| deq[j * k + i] as f64 * x[r * k + i] as f64)
                            .sum();
                        let err = (want[r][j] as f64 - exact).abs();
                        assert!(
                            err <= 1e-5 * (k as f64).sqrt() + 1e-6,
                            "{} k={k}: {err}",
                            t.name()
                        );
                    }
                }
                for f in &simd {
                    let mut got = [[7f32; GROUP_ROWS]; MAX_ROWS];
                    // SAFETY: as above; `pick*` checked the CPU features.
                    unsafe { f(&g, &x, k, rows, &mut got) };
                    for r in 0..rows {
                        let same = got[r]
                            .iter()
                            .zip(&want[r])
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{} k={k} rows={rows} row {r}: {:?} vs {:?}",
                            t.name(),
                            got[r],
                            want[r]
                        );
                    }
                }
            }
        }
    }
}

/// `linear_interleaved` on threads gives the reference's bits (bias included), and the plain
/// layout's result within float rounding, for row counts across the 4-row blocks.
#[test]
fn float_interleaved_linear_matches_reference_and_plain() {
    let th = Threads::new(2).unwrap_or_else(|e| panic!("{e}"));
    for t in TYPES {
        for (rows, n, k) in [
            (1usize, 48usize, 67usize),
            (5, 32, 576),
            (9, 64, 130),
            (2, 16, 3),
        ] {
            let (w, _) = encode(t, &rand_vec(n * k, (n * k) as u64));
            let mut il = vec![0u8; w.len()];
            fi::interleave(t, &w, n, k, &mut il).unwrap_or_else(|e| panic!("{e}"));
            let x = rand_vec(rows * k, 5);
            let bias = rand_vec(n, 6);
            let a = LinearArgs {
                x: &x,
                rows,
                k,
                w: &il,
                wtype: t,
                n,
                bias: Some(&bias),
                quant_act: true,
            };
            let (mut fast, mut slow, mut plain) = (
                vec![0f32; rows * n],
                vec![0f32; rows * n],
                vec![0f32; rows * n],
            );
            linear_interleaved(Some(&th), &a, &mut fast).unwrap_or_else(|e| panic!("{e}"));
            linear_interleaved(None, &a, &mut slow).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                fast.iter()
                    .zip(&slow)
                    .all(|(p, q)| p.to_bits() == q.to_bits()),
                "{}",
                t.name()
            );
            linear_ref(&LinearArgs { w: &w, ..a }, &mut plain).unwrap_or_else(|e| panic!("{e}"));
            for (p, q) in fast.iter().zip(&plain) {
                assert!(
                    (p - q).abs() <= 1e-5 * (1.0 + q.abs()) * (k as f32).sqrt(),
                    "{p} vs {q}"
                );
            }
        }
        // a row count that is not a multiple of 16 is refused
        let w = vec![0u8; 2 * 17 * 8];
        let x = vec![0f32; 8];
        let mut out = vec![0f32; 17];
        let a = LinearArgs {
            x: &x,
            rows: 1,
            k: 8,
            w: &w,
            wtype: t,
            n: 17,
            bias: None,
            quant_act: false,
        };
        let e = linear_interleaved(Some(&th), &a, &mut out).unwrap_err();
        assert!(e.contains("multiple of 16"), "{e}");
    }
}
