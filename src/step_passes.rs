//! Rewrites of a [`Step`] that devices share in their planning passes
//! ([`BaseDevice::plan_step`](crate::device::BaseDevice::plan_step)): each turns consecutive op
//! calls into one call of a fused form the device implements, computing what the plain calls
//! compute.
//!
//! - `Silu` then `MulTo` of its output → `SiluMul` ([`silu_mul`]).
//! - Consecutive `Linear` calls on one input (q/k/v, gate/up) → one call with `weight`,
//!   `weight1`, `weight2` ([`multi_linear`]).
//!
//! This module knows no device and no model.

use crate::data::DataType;
use crate::step::{Call, Item, Step, TensorId};

/// The call at `i`, when item `i` is a call of `op`.
pub fn call_of<'s>(items: &'s [Item], i: usize, op: &str) -> Option<&'s Call> {
    items.get(i)?.call().filter(|c| c.op == op)
}

/// The call at `i`, mutably, when item `i` is a call.
pub fn call_mut<'s>(items: &'s mut [Item], i: usize) -> Option<&'s mut Call> {
    match items.get_mut(i)? {
        Item::Call(c) => Some(c),
        _ => None,
    }
}

/// `Silu(g → t)`, `MulTo(t *= u)` → `SiluMul(g, u → t)`.
pub fn silu_mul(step: &mut Step) {
    let items = step.items_mut();
    let mut i = 0;
    while i + 1 < items.len() {
        let fused = match (call_of(items, i, "Silu"), call_of(items, i + 1, "MulTo")) {
            (Some(s), Some(m)) => {
                match (
                    s.arg("input"),
                    s.arg("output"),
                    m.arg("input0"),
                    m.arg("input1"),
                ) {
                    (Some(g), Some(t), Some(t2), Some(u)) if t == t2 && u != t && g != t => Some(
                        Call::new("SiluMul")
                            .input("input0", g)
                            .input("input1", u)
                            .output("output", t)
                            .int("quantize_output", 0)
                            .rows(s.rows),
                    ),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(c) = fused {
            items[i] = Item::Call(c);
            items.remove(i + 1);
        }
        i += 1;
    }
}

/// A plain one-weight `Linear` (no flags): its input.
pub fn plain_linear(c: &Call) -> Option<TensorId> {
    let plain = c.op == "Linear"
        && c.arg("weight1").is_none()
        && c.int_of("accumulate") == 0
        && c.int_of("reuse_act") == 0
        && c.int_of("half_output") == 0;
    plain.then(|| c.arg("input")).flatten()
}

/// Consecutive `Linear` calls on one input → one multi-weight call when the weights (at most
/// three) share a dtype; else, with `reuse_act`, the later calls reuse the first one's
/// quantized input.
pub fn multi_linear(step: &mut Step, reuse_act: bool) {
    let mut i = 0;
    while i < step.items().len() {
        let items = step.items();
        let Some((x, qa)) = items[i]
            .call()
            .and_then(|c| plain_linear(c).map(|x| (x, c.int_of("quant_act"))))
        else {
            i += 1;
            continue;
        };
        let mut n = 1;
        while let Some(c) = items.get(i + n).and_then(Item::call) {
            let same = plain_linear(c) == Some(x) && c.int_of("quant_act") == qa;
            // the run ends at a call that writes its own input
            if !same || c.arg("output") == Some(x) {
                break;
            }
            n += 1;
        }
        if n < 2 || items[i].call().and_then(|c| c.arg("output")) == Some(x) {
            i += 1;
            continue;
        }
        let dtypes: Vec<Option<DataType>> = (i..i + n)
            .map(|j| {
                let w = items[j].call().and_then(|c| c.arg("weight"));
                w.and_then(|w| step.tensor(w)).map(|d| d.dtype())
            })
            .collect();
        let same = dtypes.iter().all(|d| d.is_some() && *d == dtypes[0]);
        if same && n <= 3 {
            merge_linears(step, i, n);
        } else if reuse_act {
            for j in i + 1..i + n {
                if let Some(c) = call_mut(step.items_mut(), j) {
                    c.set_int("reuse_act", 1);
                }
            }
        }
        i += n;
    }
}

/// Replaces the `n` (≤ 3) `Linear` calls at `i` by one with numbered weights.
fn merge_linears(step: &mut Step, i: usize, n: usize) {
    const NAMES: [(&str, &str, &str); 3] = [
        ("weight", "bias", "output"),
        ("weight1", "bias1", "output1"),
        ("weight2", "bias2", "output2"),
    ];
    let items = step.items_mut();
    let parts: Vec<Call> = items
        .drain(i..i + n)
        .filter_map(|it| match it {
            Item::Call(c) => Some(c),
            _ => None,
        })
        .collect();
    let Some(first) = parts.first() else { return };
    let mut m = Call::new("Linear").rows(first.rows);
    if let Some(x) = first.arg("input") {
        m = m.input("input", x);
    }
    for (c, (wn, bn, on)) in parts.iter().zip(NAMES) {
        if let Some(w) = c.arg("weight") {
            m = m.input(wn, w);
        }
        m = m.input_opt(bn, c.arg("bias"));
        if let Some(o) = c.arg("output") {
            m = m.output(on, o);
        }
    }
    m = m
        .int("quant_act", first.int_of("quant_act"))
        .int("half_output", 0);
    items.insert(i, Item::Call(m));
}
