//! Harness cases for `MoeRoute`, `MoeDispatch`, `MoeLinear` and `MoeCombine` on awkward
//! routings: an expert that receives no token, one token going to every expert (top-k equal to
//! the expert count), softmax and sigmoid scoring, group-limited choice with a correction bias,
//! expert counts and hidden sizes that are not multiples of 8, every `MoeLinear` weight dtype
//! with and without bias, rows gathered by token or taken in dispatch order. Dispatch is exact
//! (threshold 0) and the combine sums in a fixed order (threshold 0 as well). Routing computes in
//! f64: the chosen experts are exact, a weight may differ from the reference by the last bit of
//! a device's f64 `exp` (`ROUTE_NMSE`). `MoeLinear` sums like `Linear` (`LINEAR_NMSE`, see
//! `cases_linear`).

use super::{f32_data, i32_data, CaseRng, OpCase};
use crate::data::Data;
use crate::data::DataType::{self, *};

/// See the module doc.
const ROUTE_NMSE: f64 = 1e-12;
/// See the module doc.
const LINEAR_NMSE: f64 = 1e-9;

/// A route [rows, k, 2] where token `t` picks experts `pick(t, j)` with random weights.
fn route(rng: &mut CaseRng, rows: usize, k: usize, pick: impl Fn(usize, usize) -> usize) -> Data {
    let mut v = Vec::with_capacity(rows * k * 2);
    for t in 0..rows {
        for j in 0..k {
            v.push(pick(t, j) as f32);
            v.push(rng.uniform(0.05, 1.0));
        }
    }
    f32_data(&[rows, k, 2], &v)
}

/// The dispatch of `r` for `experts` experts (computed by the kernel the op wraps; the
/// `MoeDispatch` cases check it against the reference device separately).
fn dispatch_of(r: &Data, experts: usize) -> Data {
    let rows = r.dim(0);
    let k = r.dim(1);
    let mut out = vec![0i32; experts + 1 + rows * k];
    let rv = r.to_f32_vec().expect("harness: route values");
    fastllm_cpu::moe::dispatch(&rv, k, experts, &mut out).expect("harness: valid route");
    i32_data(&[out.len()], &out)
}

fn route_cases(v: &mut Vec<OpCase>, rng: &mut CaseRng) {
    // (rows, experts, k, scoring, groups, topk_groups, normalize, scale, bias)
    for (rows, e, k, scoring, groups, tg, norm, scale, bias) in [
        (1usize, 4usize, 2usize, 0, 1, 1, 1, 1.0f32, false),
        (5, 8, 2, 0, 1, 1, 0, 1.0, false),
        (3, 7, 7, 0, 1, 1, 1, 1.0, false),
        (9, 8, 2, 1, 2, 1, 1, 2.5, true),
        (4, 12, 3, 1, 4, 2, 1, 1.0, true),
        (2, 5, 5, 1, 1, 1, 0, 1.0, false),
        (17, 64, 6, 0, 1, 1, 1, 1.0, false),
    ] {
        let mut c = OpCase::new(
            "MoeRoute",
            format!("[{rows}, {e}] k={k} scoring={scoring} groups={groups}/{tg} bias={bias}"),
            ROUTE_NMSE,
        )
        .input("input", rng.data_range(F32, &[rows, e], -4.0, 4.0));
        if bias {
            c = c.input("bias", rng.data_range(F32, &[e], -0.3, 0.3));
        }
        v.push(
            c.output("output", F32)
                .int("k", k as i32)
                .int("scoring", scoring)
                .int("groups", groups)
                .int("topk_groups", tg)
                .int("normalize", norm)
                .float("scale", scale),
        );
    }
}

/// Adds this family's cases to `v`.
pub fn cases(v: &mut Vec<OpCase>) {
    let mut rng = CaseRng::new(26);
    route_cases(v, &mut rng);
    // (label, rows, experts, k, pick): the routings the model steps produce at the edges
    type Pick = fn(usize, usize) -> usize;
    let routings: [(&str, usize, usize, usize, Pick); 5] = [
        ("expert 3 gets no token", 5, 4, 2, |t, j| (t + 2 * j) % 3),
        ("one token to every expert", 1, 6, 6, |_, j| 5 - j),
        ("top-k = expert count", 7, 3, 3, |t, j| (t + j) % 3),
        ("all tokens to one pair", 9, 8, 2, |_, j| 6 + j),
        ("one expert, one choice", 3, 1, 1, |_, _| 0),
    ];
    for (label, rows, e, k, pick) in routings {
        let r = route(&mut rng, rows, k, pick);
        v.push(
            OpCase::new("MoeDispatch", format!("{label}: [{rows}, {k}] of {e}"), 0.0)
                .input("input", r.to_owned_host().expect("harness: copy"))
                .output("output", I32)
                .int("experts", e as i32),
        );
        let disp = dispatch_of(&r, e);
        linear_cases(v, &mut rng, label, (&r, &disp), e);
        for d in [1usize, 13, 64] {
            v.push(
                OpCase::new("MoeCombine", format!("{label}: [{rows}, {k}] d={d}"), 0.0)
                    .input("input", rng.data(F32, &[rows * k, d]))
                    .input("route", r.to_owned_host().expect("harness: copy"))
                    .input("dispatch", disp.to_owned_host().expect("harness: copy"))
                    .output("output", F32),
            );
        }
    }
}

/// `MoeLinear` cases for one routing `(route, dispatch)` over `experts`: every weight dtype, odd
/// output sizes, with and without bias, gathered by token and in dispatch order.
fn linear_cases(
    v: &mut Vec<OpCase>,
    rng: &mut CaseRng,
    label: &str,
    rd: (&Data, &Data),
    experts: usize,
) {
    let (r, disp) = rd;
    let (rows, k) = (r.dim(0), r.dim(1));
    let dtypes: [(DataType, usize); 12] = [
        (F32, 45),
        (F16, 40),
        (F16, 1056),
        (BF16, 33),
        (Q8_0, 96),
        (Q4_0, 160),
        (Q4_1, 64),
        (Q5_0, 96),
        (Q4K, 256),
        (Q6K, 512),
        (Mxfp4, 96),
        (Mxfp4, 1056),
    ];
    for (i, (wt, kk)) in dtypes.into_iter().enumerate() {
        let n = [7usize, 13, 1, 37][i % 4];
        let gather = i % 2 == 0;
        let x_rows = if gather { rows } else { rows * k };
        let mut c = OpCase::new(
            "MoeLinear",
            format!("{label}: {wt} [{experts}, {n}, {kk}] gather={gather}"),
            LINEAR_NMSE,
        )
        .input("input", rng.data(F32, &[x_rows, kk]))
        .input("weight", rng.data(wt, &[experts, n, kk]))
        .input("dispatch", disp.to_owned_host().expect("harness: copy"));
        if i % 3 == 0 {
            c = c.input("bias", rng.data(F32, &[experts, n]));
        }
        v.push(
            c.output("output", F32)
                .int("k", k as i32)
                .int("gather", gather as i32),
        );
    }
}
