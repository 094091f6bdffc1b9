//! The CPU device's pass over a [`Step`]: consecutive `Linear` calls on one input (q/k/v,
//! gate/up) with interleaved weights of one type, `quant_act` and at most [`FUSE_MAX_ROWS`]
//! rows (decode steps) → one call with `weight`, `weight1`, `weight2`. `Linear` then quantizes
//! the input once and streams all those weights in one parallel job, so neither core waits at
//! a barrier between the matrices. The merged call computes what the plain calls compute, bit
//! for bit.

use crate::step::{merge_linear_calls, Call, Item, Step, TensorId};

/// Most activation rows of a merged call (prefills keep their calls: their products are
/// compute-bound, and a merged call's outputs pass through a scratch copy).
pub const FUSE_MAX_ROWS: usize = 16;

/// Runs the pass over `step`.
pub fn plan(step: &mut Step) {
    let mut i = 0;
    while i < step.items().len() {
        let n = run_len(step, i);
        if n >= 2 {
            let parts: Vec<Call> = step
                .items_mut()
                .drain(i..i + n)
                .filter_map(|it| match it {
                    Item::Call(c) => Some(c),
                    _ => None,
                })
                .collect();
            if let Some(m) = merge_linear_calls(&parts) {
                step.items_mut().insert(i, Item::Call(m));
            }
        }
        i += 1;
    }
}

/// The input of a `Linear` call the pass may merge: one weight, no `accumulate`, `quant_act`,
/// a known row count up to [`FUSE_MAX_ROWS`], and an output other than its input.
fn mergeable(c: &Call) -> Option<TensorId> {
    let ok = c.op == "Linear"
        && c.arg("weight1").is_none()
        && c.int_of("accumulate") == 0
        && c.int_of("quant_act") != 0
        && (1..=FUSE_MAX_ROWS).contains(&c.rows);
    let x = c.arg("input").filter(|_| ok)?;
    (c.arg("output") != Some(x)).then_some(x)
}

/// How many calls from item `i` on (at most 3) form a mergeable run: the same input, interleaved
/// weights of one dtype, and no call writing what a later one of the run reads.
fn run_len(step: &Step, i: usize) -> usize {
    let items = step.items();
    let weight_dtype = |c: &Call| {
        let w = c.arg("weight").and_then(|w| step.tensor(w))?;
        w.dtype().is_interleaved().then(|| w.dtype())
    };
    let Some(first) = items.get(i).and_then(Item::call) else {
        return 0;
    };
    let (Some(x), Some(dt)) = (mergeable(first), weight_dtype(first)) else {
        return 0;
    };
    let mut outs = vec![first.arg("output")];
    let mut n = 1;
    while n < 3 {
        let Some(c) = items.get(i + n).and_then(Item::call) else {
            break;
        };
        let same = mergeable(c) == Some(x) && weight_dtype(c) == Some(dt);
        // a later call must not read (weight, bias) or rewrite an earlier call's output
        let clash = outs.iter().flatten().any(|&o| c.reads(o) || c.writes(o));
        if !same || clash {
            break;
        }
        outs.push(c.arg("output"));
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Data, DataType};

    fn linear(x: TensorId, w: TensorId, out: TensorId, rows: usize) -> Call {
        Call::new("Linear")
            .input("input", x)
            .input("weight", w)
            .output("output", out)
            .int("quant_act", 1)
            .rows(rows)
    }

    fn ops(step: &Step) -> Vec<(&'static str, usize)> {
        step.items()
            .iter()
            .filter_map(Item::call)
            .map(|c| (c.op, c.args.len()))
            .collect()
    }

    #[test]
    fn merges_runs_of_linears_on_one_input_with_interleaved_weights() {
        let wi = Data::empty(DataType::Q4_0Interleaved);
        let wp = Data::empty(DataType::Q4_0);
        let wf = Data::empty(DataType::Q8_0Interleaved);
        let mut st = Step::new();
        let (x, h) = (
            st.own(Data::empty(DataType::F32)),
            st.own(Data::empty(DataType::F32)),
        );
        let [q, k, v, g, u, o] = [0; 6].map(|_| st.own(Data::empty(DataType::F32)));
        let [w0, w1, w2, w3] = [&wi, &wi, &wi, &wi].map(|w| st.input(w));
        let (wplain, wother) = (st.input(&wp), st.input(&wf));
        // q, k, v: merged
        st.push(linear(h, w0, q, 1));
        st.push(linear(h, w1, k, 1));
        st.push(linear(h, w2, v, 1));
        // a fourth call on h starts a run of its own, which has no partner: kept
        st.push(linear(h, w3, o, 1));
        // plain weight, other dtype, prefill rows: kept
        st.push(linear(x, wplain, g, 1));
        st.push(linear(x, wother, u, 1));
        st.push(linear(x, w0, q, 64));
        st.push(linear(x, w1, k, 64));
        // the second call reads the first one's output: kept
        st.push(linear(x, w0, g, 2));
        st.push(linear(g, w1, u, 2));
        plan(&mut st);
        assert_eq!(
            ops(&st),
            vec![
                ("Linear", 7),
                ("Linear", 3),
                ("Linear", 3),
                ("Linear", 3),
                ("Linear", 3),
                ("Linear", 3),
                ("Linear", 3),
                ("Linear", 3)
            ]
        );
        let m = st.items()[0]
            .call()
            .cloned()
            .unwrap_or_else(|| Call::new("none"));
        assert_eq!(m.arg("output2"), Some(v));
        assert_eq!(m.arg("weight1"), Some(w1));
        assert_eq!(m.int_of("quant_act"), 1);
        assert_eq!(m.rows, 1);
    }
}
