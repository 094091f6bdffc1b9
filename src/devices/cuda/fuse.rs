//! The CUDA device's passes over a [`Step`]: they rewrite consecutive op calls into the fused
//! forms this device's kernels take, computing what the plain calls compute.
//!
//! - `Silu` then `MulTo` of its output → `SiluMul`.
//! - Two `RotaryEmbedding` calls with the same angles → one call rotating `input` and `input1`.
//! - That call by the step's tables right before a `DecodeAttention` or `PagedDecodeAttention`
//!   of those q and k → the attention rotates them as it reads the query and stores the key (one
//!   launch less).
//! - Consecutive `Linear` calls on one input (q/k/v, gate/up) → one call with `weight`,
//!   `weight1`, `weight2` when the weights share a dtype (one launch streams them all), else the
//!   later calls reuse the first one's quantized input (`reuse_act`).
//! - A one-row `Linear` without bias whose output is only added into the residual (`AddTo`) →
//!   the `Linear` adds its product there itself (`accumulate`; the GEMV kernels add in their
//!   epilogue).
//! - `AddTo(x += b)` (alpha 1) right before `RMSNorm(x)` → the norm adds `b` into `x` itself
//!   (`input1`; `add_norm`): one launch for the add and the norm, where the add would otherwise
//!   be a launch of its own (after a cuBLAS product, or a tensor-parallel rank's all-reduce).
//!   `AllReduceAdd(x += Σ_ranks b)` before `RMSNorm(x)` → the norm all-reduces `b` as well
//!   (`all_reduce`; one launch for the reduction, add and norm).
//! - Then any other `Linear` without bias whose output only an `AddTo` adds into the residual →
//!   `accumulate` as above.
//! - A one-weight `Linear` whose output is the partial that the next call, a fused norm with
//!   `all_reduce`, sums over the group → the `Linear` may push its outputs to the peers as it
//!   writes them (`push_peers`: one-row half-weight products, into the low-latency slots, see
//!   `P2pGroup::ll_push_ctx`), the same sum either way.
//! - A norm with `all_reduce` whose output only the next call, a tensor-core `Linear`, reads →
//!   `row_split` (1, or 2 where the next item to touch the residual is not such a norm): the
//!   ranks may each add and normalize a share of the rows, leaving only the half copy whole
//!   (and with 2 the residual, gathered again). Not bit-changing, but the f32 output and the
//!   other ranks' residual rows go stale, which only these calls may see.
//! - A producer (`RMSNorm`, `SiluMul`, `Attention`, `DecodeAttention`, `PagedDecodeAttention`)
//!   whose output is the input of the next call, a `quant_act` `Linear` → the producer also
//!   leaves that input in the form the `Linear` reads (`quantize_output`: Q8_0 rows, or
//!   f16/bf16 rows for tensor cores).
//!
//! Every rewrite is arithmetic-preserving: the fused step's results equal the plain step's bit
//! for bit (a multi-weight `Linear` sums each weight as its own launch would; the copies a
//! producer leaves are the values the `Linear` would have made itself). Gate/up products keep
//! f32 outputs: half outputs read by `SiluMul` would round them before the product.

use crate::data::DataType;
use crate::device::{OutputCopy, Q8_COPY_MAX_ROWS};
use crate::error::Result;
use crate::step::{Arg, Call, Item, Step, TensorId};
use crate::step_passes::{call_mut, call_of, multi_linear, plain_linear, silu_mul};

/// Runs every pass over `step`, in order.
pub fn plan(step: &mut Step) -> Result<()> {
    silu_mul(step);
    rotary_pairs(step);
    rope_in_attention(step);
    multi_linear(step, true);
    // a one-row product adds into the residual in its own epilogue; a larger one through
    // cuBLAS would add by a launch of its own, which the next norm saves
    accumulate(step, 1);
    add_norm(step);
    accumulate(step, usize::MAX);
    push_peers(step);
    producer_copies(step);
    row_split_norms(step);
    Ok(())
}

/// A norm that all-reduces (`all_reduce`) and leaves the half copy for the next call, a
/// `Linear` that alone reads its output → `row_split`: the ranks may each add and normalize a
/// share of its rows (`P2pGroup::split_launch`), which leaves the f32 output and the other
/// ranks' rows of the residual stale. 1 where the next item to touch the residual is such a
/// norm too (it reads only this rank's rows), else 2: the norm makes the residual whole again.
fn row_split_norms(step: &mut Step) {
    let n = step.items().len();
    let splittable: Vec<bool> = (0..n).map(|i| splittable_norm(step.items(), i)).collect();
    for i in (0..n).filter(|&i| splittable[i]) {
        let items = step.items();
        let Some(x) = items[i].call().and_then(|c| c.arg("input")) else {
            continue;
        };
        let next = (i + 1..n).find(|&j| items[j].reads(x) || items[j].writes(x));
        let chained = next.is_some_and(|j| {
            splittable[j] && items[j].call().and_then(|c| c.arg("input")) == Some(x)
        });
        if let Some(c) = call_mut(step.items_mut(), i) {
            c.set_int("row_split", if chained { 1 } else { 2 });
        }
    }
}

/// Item `i` is a norm [`row_split_norms`] may split.
fn splittable_norm(items: &[Item], i: usize) -> bool {
    let Some(c) = items[i].call() else {
        return false;
    };
    let half = [OutputCopy::F16.param(), OutputCopy::Bf16.param()];
    if c.op != "RMSNorm"
        || c.int_of("all_reduce") != 1
        || !half.contains(&c.int_of("quantize_output"))
    {
        return false;
    }
    let (Some(y), Some(x)) = (c.arg("output"), c.arg("input")) else {
        return false;
    };
    let Some(j) = (i + 1..items.len()).find(|&j| !matches!(items[j], Item::Reshape(..))) else {
        return false;
    };
    // (producer_copies set the copy for that Linear: it reads `y` as its input)
    let only_reader = items[j]
        .call()
        .is_some_and(|l| l.op == "Linear" && !l.writes(x));
    only_reader && !read_later(items, j + 1, y)
}

/// `Linear(x → b)` (one weight), then `RMSNorm(input1 = b, all_reduce)` → the `Linear` gets
/// `push_peers` 1.
fn push_peers(step: &mut Step) {
    let items = step.items_mut();
    for i in 0..items.len().saturating_sub(1) {
        let push = match (
            call_of(items, i, "Linear"),
            call_of(items, i + 1, "RMSNorm"),
        ) {
            (Some(l), Some(n)) => {
                l.arg("weight1").is_none()
                    && l.arg("output").is_some()
                    && n.int_of("all_reduce") == 1
                    && n.arg("input1") == l.arg("output")
            }
            _ => false,
        };
        if push {
            if let Some(l) = call_mut(items, i) {
                l.ints.push(("push_peers", 1));
            }
        }
    }
}

/// `AddTo(x += b)` with alpha 1, then `RMSNorm(x → h)` → `RMSNorm(x += b → h)`; the same for
/// `AllReduceAdd(x += Σ b)`, whose norm then sums `b` over the group (`all_reduce` 1).
fn add_norm(step: &mut Step) {
    let items = step.items_mut();
    let mut i = 0;
    while i + 1 < items.len() {
        let add = call_of(items, i, "AddTo").or_else(|| call_of(items, i, "AllReduceAdd"));
        let reduce = call_of(items, i, "AllReduceAdd").is_some();
        let fuse = match (add, call_of(items, i + 1, "RMSNorm")) {
            (Some(a), Some(n)) => {
                let alpha = a.float_or("alpha", 1.0);
                match (a.arg("input0"), a.arg("input1")) {
                    (Some(x), Some(b))
                        if alpha == 1.0
                            && x != b
                            && n.arg("input") == Some(x)
                            && n.arg("input1").is_none()
                            && n.arg("output") != Some(b)
                            && n.arg("output") != Some(x) =>
                    {
                        Some(b)
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(b) = fuse {
            if let Some(n) = call_mut(items, i + 1) {
                for a in n.args.iter_mut().filter(|a| a.name == "input") {
                    a.written = true;
                }
                n.args.push(Arg {
                    name: "input1",
                    tensor: b,
                    written: false,
                });
                if reduce {
                    n.ints.push(("all_reduce", 1));
                }
            }
            items.remove(i);
        }
        i += 1;
    }
}

/// Two `RotaryEmbedding` calls of equal angles and parameters → one with `input1`.
fn rotary_pairs(step: &mut Step) {
    let items = step.items_mut();
    let mut i = 0;
    while i + 1 < items.len() {
        let pair = match (
            call_of(items, i, "RotaryEmbedding"),
            call_of(items, i + 1, "RotaryEmbedding"),
        ) {
            (Some(a), Some(b)) => {
                let rest = |c: &Call| -> Vec<Arg> {
                    c.args
                        .iter()
                        .filter(|x| x.name != "input")
                        .copied()
                        .collect()
                };
                let same = rest(a) == rest(b)
                    && a.floats == b.floats
                    && a.ints == b.ints
                    && a.arg("input1").is_none()
                    && b.arg("input1").is_none();
                match (same, b.arg("input")) {
                    (true, Some(k)) if a.arg("input") != Some(k) => Some(k),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(k) = pair {
            if let Some(a) = call_mut(items, i) {
                a.args.push(Arg {
                    name: "input1",
                    tensor: k,
                    written: true,
                });
            }
            items.remove(i + 1);
        }
        i += 1;
    }
}

/// `RotaryEmbedding(q, k by tables)`, `DecodeAttention(q, k)` or `PagedDecodeAttention(q, k)`
/// with q and k read by nothing after → the attention takes the tables and rotates them itself.
fn rope_in_attention(step: &mut Step) {
    let items = step.items_mut();
    let mut i = 0;
    while i + 1 < items.len() {
        let attention = call_of(items, i + 1, "DecodeAttention")
            .or_else(|| call_of(items, i + 1, "PagedDecodeAttention"));
        let moved = match (call_of(items, i, "RotaryEmbedding"), attention) {
            (Some(r), Some(a)) => {
                match (r.arg("input"), r.arg("input1"), r.arg("cos"), r.arg("sin")) {
                    (Some(q), Some(k), Some(cos), Some(sin))
                        if a.arg("q") == Some(q)
                            && a.arg("k") == Some(k)
                            && a.arg("cos").is_none()
                            && !read_later(items, i + 2, q)
                            && !read_later(items, i + 2, k) =>
                    {
                        Some((cos, sin, r.int_of("rotary_dim"), r.int_of("style")))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some((cos, sin, dim, style)) = moved {
            if let Some(a) = call_mut(items, i + 1) {
                for (name, t) in [("cos", cos), ("sin", sin)] {
                    a.args.push(Arg {
                        name,
                        tensor: t,
                        written: false,
                    });
                }
                a.set_int("rotary_dim", dim);
                a.set_int("style", style);
            }
            items.remove(i);
        }
        i += 1;
    }
}

/// True when an item after `from` reads `t` before one writes it.
fn read_later(items: &[Item], from: usize, t: TensorId) -> bool {
    for it in items.iter().skip(from) {
        if it.reads(t) {
            return true;
        }
        if it.writes(t) {
            return false;
        }
    }
    false
}

/// `Linear(a → b)` of at most `most_rows` rows without bias, `AddTo(x += b)` with `b` dead
/// after → `Linear(a → x, accumulate)`. (With a bias the fused form would add `x + p + bias`
/// where the plain steps add `x + (p + bias)`, a different rounding.)
fn accumulate(step: &mut Step, most_rows: usize) {
    let items = step.items_mut();
    let mut i = 0;
    while i + 1 < items.len() {
        let fuse = match (call_of(items, i, "Linear"), call_of(items, i + 1, "AddTo")) {
            (Some(l), Some(a))
                if plain_linear(l).is_some() && l.arg("bias").is_none() && l.rows <= most_rows =>
            {
                let (b, x) = (l.arg("output"), a.arg("input0"));
                let alpha = a.float_or("alpha", 1.0);
                match (b, x) {
                    (Some(b), Some(x))
                        if a.arg("input1") == Some(b)
                            && x != b
                            && l.arg("input") != Some(x)
                            && alpha == 1.0
                            && !read_later(items, i + 2, b) =>
                    {
                        Some(x)
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(x) = fuse {
            if let Some(l) = call_mut(items, i) {
                for a in l.args.iter_mut().filter(|a| a.name == "output") {
                    a.tensor = x;
                }
                l.set_int("accumulate", 1);
            }
            items.remove(i + 1);
        }
        i += 1;
    }
}

/// The copy a producer leaves for a `quant_act` `Linear` of `rows` rows and weight `w` of `k`
/// inputs: Q8_0 rows up to the rows at which that weight's int8 products read them, else
/// (more than one row) the tensor-core form.
fn copy_for(rows: usize, w: DataType, k: usize) -> OutputCopy {
    let q8_rows = match w {
        DataType::Q8_0 | DataType::Q4_0 | DataType::Q4_1 => Q8_COPY_MAX_ROWS,
        // Q4_K / Q6_K weights read Q8_0 rows at one row only (`linear_q8act_kq_*`)
        DataType::Q4K | DataType::Q6K => 1,
        _ => 0,
    };
    match rows {
        0 => OutputCopy::None,
        r if r <= q8_rows => OutputCopy::Q8,
        1 => OutputCopy::None,
        _ => OutputCopy::tensor_core_form(w, k),
    }
}

/// The next call after item `i`, skipping reshapes.
fn next_call<'s>(items: &'s [Item], i: usize) -> Option<&'s Call> {
    items
        .iter()
        .skip(i + 1)
        .find(|it| !matches!(it, Item::Reshape(..)))
        .and_then(Item::call)
}

/// The copy the `quant_act` `Linear` that reads `t` next after item `i` takes.
fn consumer_copy(step: &Step, i: usize, t: TensorId) -> OutputCopy {
    let Some(l) = next_call(step.items(), i) else {
        return OutputCopy::None;
    };
    if l.op != "Linear" || l.arg("input") != Some(t) || l.int_of("quant_act") == 0 {
        return OutputCopy::None;
    }
    match l.arg("weight").and_then(|w| step.tensor(w)) {
        Some(w) => copy_for(l.rows, w.dtype(), w.dims().get(1).copied().unwrap_or(0)),
        None => OutputCopy::None,
    }
}

/// Producers whose output the next `Linear` reads leave it in that `Linear`'s form.
fn producer_copies(step: &mut Step) {
    const PRODUCERS: [&str; 5] = [
        "RMSNorm",
        "SiluMul",
        "Attention",
        "DecodeAttention",
        "PagedDecodeAttention",
    ];
    for i in 0..step.items().len() {
        let out = match step.items()[i].call() {
            Some(c) if PRODUCERS.contains(&c.op) => c.arg("output"),
            _ => None,
        };
        let Some(t) = out else { continue };
        let copy = consumer_copy(step, i, t);
        if copy != OutputCopy::None {
            if let Some(c) = call_mut(step.items_mut(), i) {
                c.set_int("quantize_output", copy.param());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Data;

    fn ops(step: &Step) -> Vec<&'static str> {
        step.items()
            .iter()
            .map(|it| it.call().map_or("-", |c| c.op))
            .collect()
    }

    fn rms_norm(x: TensorId, w: TensorId, out: TensorId) -> Call {
        Call::new("RMSNorm")
            .input("input", x)
            .input("weight", w)
            .output("output", out)
    }

    fn linear(x: TensorId, w: TensorId, out: TensorId, rows: usize) -> Call {
        Call::new("Linear")
            .input("input", x)
            .input("weight", w)
            .output("output", out)
            .int("quant_act", 1)
            .rows(rows)
    }

    /// A norm, q/k/v of one dtype, SiLU·mul of gate/up, and the down projection added into
    /// the residual: every pass fires once.
    #[test]
    fn passes_fuse_a_layer_into_the_device_forms() {
        let wq = Data::zeros(DataType::Q4_0, &[64, 64]).unwrap();
        let wv = Data::zeros(DataType::Q4_0, &[32, 64]).unwrap();
        let mut bufs: Vec<Data> = (0..8).map(|_| Data::empty(DataType::F32)).collect();
        let mut st = Step::new();
        let (wq, wv) = (st.input(&wq), st.input(&wv));
        let t: Vec<TensorId> = bufs.iter_mut().map(|b| st.mutable(b)).collect();
        let (x, h, q, k, g, u, a, b) = (t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
        st.push(rms_norm(x, wq, h));
        st.push(linear(h, wq, q, 3));
        st.push(linear(h, wv, k, 3));
        st.push(linear(h, wq, g, 3));
        st.push(Call::new("Silu").input("input", g).output("output", a));
        st.push(Call::new("MulTo").output("input0", a).input("input1", u));
        st.push(linear(a, wq, b, 3));
        st.push(
            Call::new("AddTo")
                .output("input0", x)
                .input("input1", b)
                .float("alpha", 1.0),
        );
        plan(&mut st).unwrap();
        assert_eq!(ops(&st), ["RMSNorm", "Linear", "SiluMul", "Linear"]);
        let items = st.items();
        let c = |i: usize| items[i].call().unwrap();
        assert_eq!(c(0).int_of("quantize_output"), OutputCopy::Q8.param());
        assert_eq!(c(1).arg("weight2"), Some(wq), "q/k/v in one call");
        assert_eq!(c(1).arg("output1"), Some(k));
        assert_eq!(c(2).int_of("quantize_output"), OutputCopy::Q8.param());
        assert_eq!(
            c(3).arg("output"),
            Some(x),
            "the down projection adds into x"
        );
        assert_eq!(c(3).int_of("accumulate"), 1);
    }

    /// A residual add left by an all-reduce stage between the `Linear` and it goes into the
    /// next `RMSNorm`, and so does a group's `AllReduceAdd` (`all_reduce` 1); one whose norm
    /// reads another tensor, or with another alpha, stays.
    #[test]
    fn residual_add_moves_into_the_next_norm() {
        let w = Data::zeros(DataType::F32, &[64]).unwrap();
        for (op, alpha, norm_of_x, fused) in [
            ("AddTo", 1.0, true, true),
            ("AddTo", 0.5, true, false),
            ("AddTo", 1.0, false, false),
            ("AllReduceAdd", 1.0, true, true),
            ("AllReduceAdd", 1.0, false, false),
        ] {
            let mut bufs: Vec<Data> = (0..4).map(|_| Data::empty(DataType::F32)).collect();
            let mut st = Step::new();
            let w = st.input(&w);
            let t: Vec<TensorId> = bufs.iter_mut().map(|b| st.mutable(b)).collect();
            let (x, b, h, y) = (t[0], t[1], t[2], t[3]);
            let add = Call::new(op).output("input0", x).input("input1", b);
            st.push(if op == "AddTo" {
                add.float("alpha", alpha)
            } else {
                add
            });
            st.push(
                Call::new("RMSNorm")
                    .input("input", if norm_of_x { x } else { y })
                    .input("weight", w)
                    .output("output", h),
            );
            plan(&mut st).unwrap();
            if !fused {
                assert_eq!(ops(&st), [op, "RMSNorm"]);
                continue;
            }
            assert_eq!(ops(&st), ["RMSNorm"]);
            let n = st.items()[0].call().unwrap();
            assert_eq!(n.arg("input1"), Some(b));
            assert!(n.args.iter().any(|a| a.name == "input" && a.written));
            assert_eq!(n.int_of("all_reduce"), (op == "AllReduceAdd") as i32);
        }
    }

    /// Norms that all-reduce, each read only by the next tensor-core `Linear`, split their rows
    /// over the ranks: the first keeps the residual split (the next toucher is the second), the
    /// second makes it whole (a plain all-reduce follows). A norm whose output something else
    /// reads too, or of one row (no half copy), does not split.
    #[test]
    fn reducing_norms_read_by_one_product_split_their_rows() {
        let w = Data::zeros(DataType::F16, &[64, 64]).unwrap();
        let wn = Data::zeros(DataType::F32, &[64]).unwrap();
        for (rows, extra_reader) in [(600, false), (600, true), (1, false)] {
            let mut bufs: Vec<Data> = (0..9).map(|_| Data::empty(DataType::F32)).collect();
            let mut st = Step::new();
            let (w, wn) = (st.input(&w), st.input(&wn));
            let t: Vec<TensorId> = bufs.iter_mut().map(|b| st.mutable(b)).collect();
            let (x, b1, h, q, b2, h2, g, b3, s) =
                (t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]);
            let reduce = |b| {
                Call::new("AllReduceAdd")
                    .output("input0", x)
                    .input("input1", b)
            };
            st.push(reduce(b1));
            st.push(rms_norm(x, wn, h).rows(rows));
            st.push(linear(h, w, q, rows));
            st.push(linear(q, w, b2, rows));
            if extra_reader {
                st.push(Call::new("Silu").input("input", h).output("output", s));
            }
            st.push(reduce(b2));
            st.push(rms_norm(x, wn, h2).rows(rows));
            st.push(linear(h2, w, g, rows));
            st.push(linear(g, w, b3, rows));
            st.push(reduce(b3));
            plan(&mut st).unwrap();
            let splits: Vec<i32> = st
                .items()
                .iter()
                .filter_map(Item::call)
                .filter(|c| c.op == "RMSNorm")
                .map(|c| c.int_of("row_split"))
                .collect();
            let want = match (rows, extra_reader) {
                (1, _) => [0, 0],
                (_, true) => [0, 2],
                _ => [1, 2],
            };
            assert_eq!(splits, want, "{rows} rows, extra reader {extra_reader}");
        }
    }

    /// A product added into the residual right before the next norm of it: of one row, the
    /// product adds into the residual (its epilogue); of more (cuBLAS rows), the add goes into
    /// the norm (one launch for both) and the product keeps its own output.
    #[test]
    fn residual_add_before_a_norm_goes_into_the_norm_above_one_row() {
        let w = Data::zeros(DataType::F16, &[64, 64]).unwrap();
        let wn = Data::zeros(DataType::F32, &[64]).unwrap();
        for rows in [1, 64] {
            let mut bufs: Vec<Data> = (0..4).map(|_| Data::empty(DataType::F32)).collect();
            let mut st = Step::new();
            let (w, wn) = (st.input(&w), st.input(&wn));
            let t: Vec<TensorId> = bufs.iter_mut().map(|b| st.mutable(b)).collect();
            let (x, a, b, h) = (t[0], t[1], t[2], t[3]);
            st.push(linear(a, w, b, rows));
            st.push(
                Call::new("AddTo")
                    .output("input0", x)
                    .input("input1", b)
                    .float("alpha", 1.0),
            );
            st.push(rms_norm(x, wn, h));
            plan(&mut st).unwrap();
            assert_eq!(ops(&st), ["Linear", "RMSNorm"]);
            let c = |i: usize| st.items()[i].call().unwrap();
            let one = rows == 1;
            assert_eq!(
                c(0).arg("output"),
                Some(if one { x } else { b }),
                "{rows} rows"
            );
            assert_eq!(c(0).int_of("accumulate"), one as i32, "{rows} rows");
            assert_eq!(c(1).arg("input1"), (!one).then_some(b), "{rows} rows");
        }
    }

    /// A row-parallel product summed by the next fused norm pushes its outputs to the peers; one
    /// whose output the norm does not sum, or with two weights, does not.
    #[test]
    fn row_parallel_product_before_a_reducing_norm_pushes() {
        let w16 = Data::zeros(DataType::F16, &[64, 64]).unwrap();
        let wn = Data::zeros(DataType::F32, &[64]).unwrap();
        for (summed, two_weights, pushes) in [
            (true, false, true),
            (false, false, false),
            (true, true, false),
        ] {
            let mut bufs: Vec<Data> = (0..5).map(|_| Data::empty(DataType::F32)).collect();
            let mut st = Step::new();
            let (w, wn) = (st.input(&w16), st.input(&wn));
            let t: Vec<TensorId> = bufs.iter_mut().map(|b| st.mutable(b)).collect();
            let (a, b, c, x, h) = (t[0], t[1], t[2], t[3], t[4]);
            let mut l = linear(a, w, b, 512);
            if two_weights {
                l = l.input("weight1", w).output("output1", c);
            }
            st.push(l);
            let partial = if summed { b } else { c };
            st.push(
                Call::new("AllReduceAdd")
                    .output("input0", x)
                    .input("input1", partial),
            );
            st.push(rms_norm(x, wn, h));
            plan(&mut st).unwrap();
            assert_eq!(ops(&st), ["Linear", "RMSNorm"]);
            let l = st.items()[0].call().unwrap();
            assert_eq!(
                l.int_of("push_peers"),
                pushes as i32,
                "{summed} {two_weights}"
            );
        }
    }

    /// The two rotations of a decode step by its tables become one, then part of the
    /// `DecodeAttention` or `PagedDecodeAttention` that stores the key, which also leaves the
    /// o-projection's input form.
    #[test]
    fn decode_rotation_moves_into_the_attention() {
        let w4 = Data::zeros(DataType::Q4_0, &[64, 64]).unwrap();
        for (op, rows) in [("DecodeAttention", 1), ("PagedDecodeAttention", 64)] {
            let mut bufs: Vec<Data> = (0..7).map(|_| Data::empty(DataType::F32)).collect();
            let mut st = Step::new();
            let w = st.input(&w4);
            let t: Vec<TensorId> = bufs.iter_mut().map(|b| st.mutable(b)).collect();
            let (q, k, v, cos, sin, out, o) = (t[0], t[1], t[2], t[3], t[4], t[5], t[6]);
            for x in [q, k] {
                st.push(
                    Call::new("RotaryEmbedding")
                        .input("cos", cos)
                        .input("sin", sin)
                        .output("input", x)
                        .int("rotary_dim", 64)
                        .int("style", 0),
                );
            }
            st.push(
                Call::new(op)
                    .input("q", q)
                    .input("k", k)
                    .input("v", v)
                    .output("output", out),
            );
            st.push(linear(out, w, o, rows));
            plan(&mut st).unwrap();
            assert_eq!(ops(&st), [op, "Linear"]);
            let a = st.items()[0].call().unwrap();
            assert_eq!((a.arg("cos"), a.arg("sin")), (Some(cos), Some(sin)));
            assert_eq!(a.int_of("rotary_dim"), 64);
            // the o-projection's input form: Q8_0 rows for one row, f16 rows for 64
            let want = if rows == 1 {
                OutputCopy::Q8
            } else {
                OutputCopy::F16
            };
            assert_eq!(a.int_of("quantize_output"), want.param(), "{op}");
        }
    }

    /// Mixed dtypes are not merged (the later calls reuse the quantized input); an output
    /// read after the `AddTo` is not folded into it; a prefill's gate/up keep f32
    /// outputs, the `SiluMul` after them leaves the f16 rows of the down projection.
    #[test]
    fn passes_keep_what_they_cannot_fuse() {
        let w4 = Data::zeros(DataType::Q4_0, &[64, 64]).unwrap();
        let w8 = Data::zeros(DataType::Q8_0, &[64, 64]).unwrap();
        let mut bufs: Vec<Data> = (0..6).map(|_| Data::empty(DataType::F32)).collect();
        let mut st = Step::new();
        let (i4, i8) = (st.input(&w4), st.input(&w8));
        let t: Vec<TensorId> = bufs.iter_mut().map(|b| st.mutable(b)).collect();
        let (x, h, q, k, b, y) = (t[0], t[1], t[2], t[3], t[4], t[5]);
        st.push(linear(h, i4, q, 1));
        st.push(linear(h, i8, k, 1));
        st.push(linear(q, i4, b, 1));
        st.push(
            Call::new("AddTo")
                .output("input0", x)
                .input("input1", b)
                .float("alpha", 1.0),
        );
        st.push(Call::new("Mul").input("input", b).output("output", y));
        plan(&mut st).unwrap();
        assert_eq!(ops(&st), ["Linear", "Linear", "Linear", "AddTo", "Mul"]);
        let c = |i: usize| st.items()[i].call().unwrap();
        assert_eq!(c(1).int_of("reuse_act"), 1);
        assert_eq!(c(2).int_of("accumulate"), 0);

        // a Linear with a bias keeps its own output: x + (p + bias) is not (x + p) + bias
        let bias = Data::zeros(DataType::F32, &[64]).unwrap();
        let mut bufs: Vec<Data> = (0..3).map(|_| Data::empty(DataType::F32)).collect();
        let mut st = Step::new();
        let (w, bi) = (st.input(&w4), st.input(&bias));
        let t: Vec<TensorId> = bufs.iter_mut().map(|b| st.mutable(b)).collect();
        let (x, h, b) = (t[0], t[1], t[2]);
        st.push(linear(h, w, b, 1).input("bias", bi));
        st.push(
            Call::new("AddTo")
                .output("input0", x)
                .input("input1", b)
                .float("alpha", 1.0),
        );
        plan(&mut st).unwrap();
        assert_eq!(ops(&st), ["Linear", "AddTo"]);

        let mut bufs: Vec<Data> = (0..5).map(|_| Data::empty(DataType::F32)).collect();
        let mut st = Step::new();
        let w = st.input(&w4);
        let t: Vec<TensorId> = bufs.iter_mut().map(|b| st.mutable(b)).collect();
        let (h, g, u, a, o) = (t[0], t[1], t[2], t[3], t[4]);
        st.push(linear(h, w, g, 100));
        st.push(linear(h, w, u, 100));
        st.push(Call::new("Silu").input("input", g).output("output", a));
        st.push(Call::new("MulTo").output("input0", a).input("input1", u));
        st.push(linear(a, w, o, 100));
        plan(&mut st).unwrap();
        assert_eq!(ops(&st), ["Linear", "SiluMul", "Linear"]);
        let c = |i: usize| st.items()[i].call().unwrap();
        assert_eq!(c(0).int_of("half_output"), 0, "gate/up outputs stay f32");
        assert_eq!(c(1).int_of("quantize_output"), OutputCopy::F16.param());
    }
}
