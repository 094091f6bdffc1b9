//! Selection over rows: `argmax` (lowest index on ties) and `topk` (the k largest, descending,
//! ties broken by lower index, as (index, value) pairs). Values are ordered by `f32::total_cmp`,
//! so NaN sorts above everything and results are deterministic.
//!
//! The references sort / scan naively; the fast paths keep a small sorted buffer (top-k) or use a
//! SIMD max (argmax), rows split over the thread pool. Must not know about tensors.

use crate::threads::Threads;
use std::cmp::Ordering;

/// True when (value a, index ia) ranks before (value b, index ib).
fn before(a: f32, ia: usize, b: f32, ib: usize) -> bool {
    match a.total_cmp(&b) {
        Ordering::Greater => true,
        Ordering::Less => false,
        Ordering::Equal => ia < ib,
    }
}

/// Reference argmax over rows of `n`.
pub fn argmax_ref(x: &[f32], n: usize, out: &mut [i32]) {
    if n == 0 {
        return;
    }
    for (xr, o) in x.chunks_exact(n).zip(out.iter_mut()) {
        let mut best = 0;
        for j in 1..n {
            if before(xr[j], j, xr[best], best) {
                best = j;
            }
        }
        *o = best as i32;
    }
}

/// Fast argmax over rows of `n`.
pub fn argmax(th: &Threads, x: &[f32], n: usize, out: &mut [i32]) {
    if n == 0 {
        return;
    }
    th.for_row_chunks(out, 1, crate::vecmath::min_rows_for(n), |r0, oc| {
        for (xr, o) in x.chunks_exact(n).skip(r0).zip(oc.iter_mut()) {
            let m = crate::vecmath::max(xr);
            // The SIMD max ignores NaN and does not order -0 below +0; total_cmp does, so those
            // rows take the exact scalar scan.
            let simple = m != 0.0 && !xr.iter().any(|v| v.is_nan());
            *o = match xr.iter().position(|&v| v == m) {
                Some(p) if simple => p as i32,
                _ => {
                    let mut best = 0;
                    for (j, &v) in xr.iter().enumerate().skip(1) {
                        if before(v, j, xr[best], best) {
                            best = j;
                        }
                    }
                    best as i32
                }
            };
        }
    });
}

/// Reference top-k over rows of `n`: `out` rows of `2k` values `(index, value)`, descending.
pub fn topk_ref(x: &[f32], n: usize, k: usize, out: &mut [f32]) {
    if n == 0 || k == 0 {
        return;
    }
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(2 * k)) {
        let mut idx: Vec<usize> = (0..n).collect();
        // a consistent total order: descending value (total_cmp), then ascending index
        idx.sort_by(|&a, &b| xr[b].total_cmp(&xr[a]).then(a.cmp(&b)));
        for (p, &j) in or.chunks_exact_mut(2).zip(&idx) {
            p[0] = j as f32;
            p[1] = xr[j];
        }
    }
}

/// Fast top-k (same contract as [`topk_ref`]): a sorted buffer of the best `k` seen so far.
pub fn topk(th: &Threads, x: &[f32], n: usize, k: usize, out: &mut [f32]) {
    if n == 0 || k == 0 {
        return;
    }
    th.for_row_chunks(
        out,
        2 * k,
        (crate::vecmath::min_rows_for(n) / 4).max(1),
        |r0, oc| {
            let mut best: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
            for (xr, or) in x.chunks_exact(n).skip(r0).zip(oc.chunks_exact_mut(2 * k)) {
                best.clear();
                for (j, &v) in xr.iter().enumerate() {
                    if best.len() == k {
                        if let Some(&(lv, lj)) = best.last() {
                            if !before(v, j, lv, lj) {
                                continue;
                            }
                        }
                        best.pop();
                    }
                    let at = best.partition_point(|&(bv, bj)| before(bv, bj, v, j));
                    best.insert(at, (v, j));
                }
                for (p, &(v, j)) in or.chunks_exact_mut(2).zip(&best) {
                    p[0] = j as f32;
                    p[1] = v;
                }
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::vals;

    #[test]
    fn fast_matches_reference_on_awkward_sizes() {
        let th = Threads::new(2).unwrap();
        for (rows, n) in [(1usize, 1usize), (3, 7), (2, 33), (50, 1000), (4, 49153)] {
            let mut x = vals(rows * n, n as u64, -1.0, 1.0);
            // ties: repeat a value
            if n > 4 {
                x[3] = 5.0;
                x[1] = 5.0;
            }
            let (mut r, mut f) = (vec![0; rows], vec![0; rows]);
            argmax_ref(&x, n, &mut r);
            argmax(&th, &x, n, &mut f);
            assert_eq!(f, r, "argmax {rows}x{n}");
            for k in [1usize, 3, n.min(40)] {
                let (mut r, mut f) = (vec![0.0; rows * 2 * k], vec![0.0; rows * 2 * k]);
                topk_ref(&x, n, k, &mut r);
                topk(&th, &x, n, k, &mut f);
                assert_eq!(f, r, "topk {rows}x{n} k={k}");
            }
        }
    }

    #[test]
    fn ties_prefer_lower_index() {
        let x = [1.0, 3.0, 2.0, 3.0, f32::NEG_INFINITY];
        let mut a = [0];
        argmax_ref(&x, 5, &mut a);
        assert_eq!(a, [1]);
        let mut t = [0.0; 6];
        topk_ref(&x, 5, 3, &mut t);
        assert_eq!(t, [1.0, 3.0, 3.0, 3.0, 2.0, 2.0]);
    }
}
