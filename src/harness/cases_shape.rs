//! Harness cases for the shape ops: `Permute`/`PermuteSelf` (F32, F16, BF16, I32; the fast copy
//! path is checked against the per-element reference), `Cat` and `CatDirect` on every axis
//! (including appends into reserved capacity and growth past it), `Split`.

use super::{CaseRng, OpCase};
use crate::data::DataType::{self, BF16, F16, F32, I32};

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(15);
    let perms: [(&[usize], &[usize]); 6] = [
        (&[3, 5, 7], &[1, 0, 2]),
        (&[3, 5, 7], &[2, 1, 0]),
        (&[2, 9, 1, 33], &[0, 2, 1, 3]),
        (&[4, 3, 2, 65], &[3, 2, 0, 1]),
        (&[37, 64], &[1, 0]),
        (&[33], &[0]),
    ];
    let dtypes: [DataType; 4] = [F32, F16, BF16, I32];
    for (dims, perm) in perms {
        for dt in dtypes {
            for op in ["Permute", "PermuteSelf"] {
                let mut c = OpCase::new(op, format!("{dt} {dims:?} -> {perm:?}"), 0.0);
                c = if op == "Permute" {
                    c.input("input", rng.data_range(dt, dims, -100.0, 100.0))
                        .output("output", dt)
                } else {
                    c.inout("input", rng.data_range(dt, dims, -100.0, 100.0))
                };
                for (i, &a) in perm.iter().enumerate() {
                    c = c.int(["axis0", "axis1", "axis2", "axis3"][i], a as i32);
                }
                v.push(c);
            }
        }
    }
    let bases: [&[usize]; 3] = [&[3, 5, 7], &[2, 1, 33], &[6, 4]];
    for base in bases {
        for axis in 0..base.len() {
            for dt in [F32, F16] {
                let mut other = base.to_vec();
                other[axis] = 3;
                v.push(
                    OpCase::new("Cat", format!("{dt} {base:?} + {other:?} axis {axis}"), 0.0)
                        .input("input0", rng.data(dt, base))
                        .input("input1", rng.data(dt, &other))
                        .output("output", dt)
                        .int("axis", axis as i32),
                );
                let len = base[axis];
                v.push(
                    OpCase::new("Split", format!("{dt} {base:?} axis {axis} 1..{len}"), 0.0)
                        .input("input", rng.data(dt, base))
                        .output("output", dt)
                        .int("axis", axis as i32)
                        .int("start", 1.min(len as i32))
                        .int("end", len as i32),
                );
            }
            let mut other = base.to_vec();
            other[axis] = 2;
            for cap in [0usize, 4, 40] {
                let mut a = rng.data(F32, base);
                if cap > 0 {
                    a.reserve(axis, base[axis] + cap).expect("harness: reserve");
                }
                v.push(
                    OpCase::new(
                        "CatDirect",
                        format!("f32 {base:?} + {other:?} axis {axis} reserved +{cap}"),
                        0.0,
                    )
                    .inout("input0", a)
                    .input("input1", rng.data(F32, &other))
                    .int("axis", axis as i32),
                );
            }
        }
    }
}
