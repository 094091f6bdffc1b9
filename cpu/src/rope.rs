//! Rotary position embedding, in place over `x [s, heads, hd]`: rotates the first `rot` dims of
//! every head, pairs `(i, i + rot/2)` (neox, rotate-half) or `(2i, 2i + 1)` (interleaved). The
//! angle of pair `i` at row `t` comes from explicit cos/sin tables, from `positions[t]·inv_freq[i]`,
//! or from `positions[t]·theta^(-2i/rot)`; angles are formed in f64.
//!
//! The reference evaluates cos/sin for every (row, head, pair); the fast path evaluates them once
//! per (row, pair) and splits rows over the thread pool. Sizes are validated by the caller; short
//! slices shorten the work and never read out of bounds. Must not know about tensors.

use crate::threads::Threads;

/// How pairs are formed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Rotate-half: pair `(i, i + rot/2)`.
    Neox,
    /// Adjacent pairs `(2i, 2i + 1)`.
    Interleaved,
}

/// Where the rotation angles come from.
#[derive(Clone, Copy, Debug)]
pub enum RopeFreqs<'a> {
    /// `theta^(-2i/rot)` times the position.
    Theta(f32),
    /// `inv_freq[i]` (length `rot/2`) times the position.
    InvFreq(&'a [f32]),
    /// Explicit tables `[s, rot/2]`, indexed by row (positions unused).
    CosSin {
        /// Cosines.
        cos: &'a [f32],
        /// Sines.
        sin: &'a [f32],
    },
}

/// Shapes of one rotary call.
#[derive(Clone, Copy, Debug)]
pub struct RopeShape {
    /// Rows (tokens).
    pub s: usize,
    /// Heads per row.
    pub heads: usize,
    /// Head size.
    pub hd: usize,
    /// Rotated dims per head (even, ≤ hd).
    pub rot: usize,
}

/// (cos, sin) of pair `i` at row `t` with position `pos`.
fn cos_sin(freqs: &RopeFreqs, rot: usize, t: usize, pos: i32, i: usize) -> (f32, f32) {
    let half = rot / 2;
    let angle = match freqs {
        RopeFreqs::Theta(theta) => pos as f64 * (*theta as f64).powf(-2.0 * i as f64 / rot as f64),
        RopeFreqs::InvFreq(f) => pos as f64 * f.get(i).copied().unwrap_or(0.0) as f64,
        RopeFreqs::CosSin { cos, sin } => {
            let c = cos.get(t * half + i).copied().unwrap_or(1.0);
            let s = sin.get(t * half + i).copied().unwrap_or(0.0);
            return (c, s);
        }
    };
    (angle.cos() as f32, angle.sin() as f32)
}

fn rotate_head(x: &mut [f32], rot: usize, style: RopeStyle, cs: impl Fn(usize) -> (f32, f32)) {
    let half = rot / 2;
    for i in 0..half {
        let (a_at, b_at) = match style {
            RopeStyle::Neox => (i, i + half),
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        };
        let (Some(&a), Some(&b)) = (x.get(a_at), x.get(b_at)) else {
            return;
        };
        let (c, s) = cs(i);
        x[a_at] = a * c - b * s;
        x[b_at] = b * c + a * s;
    }
}

/// Reference rotary embedding.
pub fn rope_ref(
    x: &mut [f32],
    positions: &[i32],
    sh: &RopeShape,
    style: RopeStyle,
    freqs: RopeFreqs,
) {
    if sh.hd == 0 || sh.heads == 0 {
        return;
    }
    for (t, row) in x.chunks_exact_mut(sh.heads * sh.hd).enumerate().take(sh.s) {
        let pos = positions.get(t).copied().unwrap_or(0);
        for head in row.chunks_exact_mut(sh.hd) {
            rotate_head(head, sh.rot, style, |i| cos_sin(&freqs, sh.rot, t, pos, i));
        }
    }
}

/// The `cos`/`sin` tables `[s, rot/2]` of rows at `positions` (`s` = their count) from `freqs`
/// ([`RopeFreqs::Theta`] or [`RopeFreqs::InvFreq`]): the values the rotations would form
/// themselves, bit for bit, so that a step forms them once for all its layers. Tables given as
/// `freqs` are copied.
pub fn tables(positions: &[i32], rot: usize, freqs: RopeFreqs, cos: &mut [f32], sin: &mut [f32]) {
    let half = rot / 2;
    if half == 0 {
        return;
    }
    let rows = cos.chunks_exact_mut(half).zip(sin.chunks_exact_mut(half));
    for (t, ((cr, sr), &pos)) in rows.zip(positions).enumerate() {
        for (i, (c, s)) in cr.iter_mut().zip(sr.iter_mut()).enumerate() {
            (*c, *s) = cos_sin(&freqs, rot, t, pos, i);
        }
    }
}

/// Fast rotary embedding (same contract as [`rope_ref`]).
pub fn rope(
    th: &Threads,
    x: &mut [f32],
    positions: &[i32],
    sh: &RopeShape,
    style: RopeStyle,
    freqs: RopeFreqs,
) {
    let row = sh.heads * sh.hd;
    if row == 0 {
        return;
    }
    let rows = sh.s.min(x.len() / row);
    let x = &mut x[..rows * row];
    let half = sh.rot / 2;
    // per-pair inverse frequencies, computed once
    let inv: Vec<f64> = match freqs {
        RopeFreqs::Theta(theta) => (0..half)
            .map(|i| (theta as f64).powf(-2.0 * i as f64 / sh.rot as f64))
            .collect(),
        RopeFreqs::InvFreq(f) => (0..half)
            .map(|i| f.get(i).copied().unwrap_or(0.0) as f64)
            .collect(),
        RopeFreqs::CosSin { .. } => Vec::new(),
    };
    th.for_row_chunks(x, row, (4096 / row).max(1), |r0, xc| {
        let mut c = vec![0f32; half];
        let mut s = vec![0f32; half];
        for (ti, xr) in xc.chunks_exact_mut(row).enumerate() {
            let t = r0 + ti;
            let pos = positions.get(t).copied().unwrap_or(0);
            for i in 0..half {
                (c[i], s[i]) = match freqs {
                    RopeFreqs::CosSin { .. } => cos_sin(&freqs, sh.rot, t, pos, i),
                    _ => {
                        let a = pos as f64 * inv[i];
                        (a.cos() as f32, a.sin() as f32)
                    }
                };
            }
            for head in xr.chunks_exact_mut(sh.hd) {
                match style {
                    RopeStyle::Neox if 2 * half <= head.len() => {
                        let (lo, hi) = head[..2 * half].split_at_mut(half);
                        for (((a, b), &cc), &ss) in lo.iter_mut().zip(hi.iter_mut()).zip(&c).zip(&s)
                        {
                            let (x0, x1) = (*a, *b);
                            *a = x0 * cc - x1 * ss;
                            *b = x1 * cc + x0 * ss;
                        }
                    }
                    _ => rotate_head(head, sh.rot, style, |i| (c[i], s[i])),
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{nmse, vals};

    #[test]
    fn rotation_over_tables_equals_rotation_over_angles_bit_for_bit() {
        let th = Threads::new(2).unwrap();
        for (s, heads, hd, rot) in [
            (1usize, 3usize, 64usize, 64usize),
            (5, 2, 10, 6),
            (33, 4, 128, 96),
        ] {
            let pos: Vec<i32> = (0..s as i32).map(|t| 7 * t + 3).collect();
            let inv = vals(rot / 2, 9, 0.001, 1.0);
            for f in [RopeFreqs::Theta(500000.0), RopeFreqs::InvFreq(&inv)] {
                let (mut cos, mut sin) = (vec![0f32; s * rot / 2], vec![0f32; s * rot / 2]);
                tables(&pos, rot, f, &mut cos, &mut sin);
                let t = RopeFreqs::CosSin {
                    cos: &cos,
                    sin: &sin,
                };
                let sh = RopeShape { s, heads, hd, rot };
                for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
                    let x = vals(s * heads * hd, 1, -1.0, 1.0);
                    let (mut a, mut b) = (x.clone(), x.clone());
                    rope(&th, &mut a, &pos, &sh, style, f);
                    rope(&th, &mut b, &pos, &sh, style, t);
                    assert_eq!(a, b, "{s} {heads} {hd} {rot} {style:?} {f:?}");
                }
            }
        }
    }

    #[test]
    fn fast_matches_reference_on_awkward_sizes() {
        let th = Threads::new(2).unwrap();
        for (s, heads, hd, rot) in [
            (1usize, 1usize, 2usize, 2usize),
            (3, 5, 10, 6),
            (7, 3, 64, 64),
            (300, 9, 64, 32),
        ] {
            let pos: Vec<i32> = (0..s as i32).map(|t| 3 * t + 1).collect();
            let inv = vals(rot / 2, 9, 0.001, 1.0);
            let cos = vals(s * rot / 2, 10, -1.0, 1.0);
            let sin = vals(s * rot / 2, 11, -1.0, 1.0);
            let sources = [
                RopeFreqs::Theta(10000.0),
                RopeFreqs::InvFreq(&inv),
                RopeFreqs::CosSin {
                    cos: &cos,
                    sin: &sin,
                },
            ];
            for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
                for f in sources {
                    let x = vals(s * heads * hd, 1, -1.0, 1.0);
                    let (mut r, mut fa) = (x.clone(), x.clone());
                    let sh = RopeShape { s, heads, hd, rot };
                    rope_ref(&mut r, &pos, &sh, style, f);
                    rope(&th, &mut fa, &pos, &sh, style, f);
                    assert!(
                        nmse(&fa, &r) < 1e-13,
                        "{s} {heads} {hd} {rot} {style:?} {f:?}"
                    );
                    assert_eq!(&r[rot..hd], &x[rot..hd], "dims past rot must be untouched");
                }
            }
        }
    }

    #[test]
    fn rotation_by_known_angle() {
        // one pair, theta source: pair 0 has inverse frequency 1, position 1 → angle 1 rad
        let mut x = [1.0f32, 0.0];
        let sh = RopeShape {
            s: 1,
            heads: 1,
            hd: 2,
            rot: 2,
        };
        rope_ref(
            &mut x,
            &[1],
            &sh,
            RopeStyle::Neox,
            RopeFreqs::Theta(10000.0),
        );
        assert!((x[0] - 1f32.cos()).abs() < 1e-7 && (x[1] - 1f32.sin()).abs() < 1e-7);
    }
}
