//! Every non-matrix CPU op fed bad input through `Executor::run` must return an `Err` whose
//! message names the op (never panic): missing inputs, wrong dtypes, shape mismatches, bad axes,
//! out-of-range token ids, k > n, head counts that do not divide, bad parameters.

use fastllm::device::{DataDict, FloatDict, IntDict};
use fastllm::{Data, DataType, Executor};

fn f32d(dims: &[usize]) -> Data {
    let n: usize = dims.iter().product();
    Data::from_f32(
        dims,
        &(0..n).map(|i| i as f32 * 0.01 + 0.1).collect::<Vec<_>>(),
    )
    .unwrap()
}

fn i32d(v: &[i32]) -> Data {
    Data::from_i32(&[v.len()], v).unwrap()
}

/// One argument: name, tensor, passed mutably.
struct Arg(&'static str, Data, bool);

fn inp(name: &'static str, d: Data) -> Arg {
    Arg(name, d, false)
}
fn out(name: &'static str) -> Arg {
    Arg(name, Data::empty(DataType::F32), true)
}
fn inout(name: &'static str, d: Data) -> Arg {
    Arg(name, d, true)
}

/// Runs `op` and asserts an `Err` naming it; returns the message.
fn expect_err(
    op: &str,
    mut args: Vec<Arg>,
    floats: &[(&str, f32)],
    ints: &[(&str, i32)],
) -> String {
    let exec = Executor::cpu(2).unwrap();
    let mut dict = DataDict::new();
    for Arg(name, d, m) in args.iter_mut() {
        if *m {
            dict.insert_mut(name, d);
        } else {
            dict.insert(name, d);
        }
    }
    let mut fl = FloatDict::new();
    for (n, v) in floats {
        fl.insert(n, *v);
    }
    let mut il = IntDict::new();
    for (n, v) in ints {
        il.insert(n, *v);
    }
    match exec.run(op, &mut dict, &fl, &il) {
        Ok(()) => panic!("{op}: expected an error"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(op),
                "{op}: message does not name the op: {msg}"
            );
            msg
        }
    }
}

#[test]
fn norms_reject_bad_input() {
    for op in ["RMSNorm", "LayerNorm"] {
        let vecs: &[&'static str] = if op == "RMSNorm" {
            &["weight"]
        } else {
            &["gamma", "beta"]
        };
        // missing input
        let mut a: Vec<Arg> = vecs.iter().map(|v| inp(v, f32d(&[4]))).collect();
        a.push(out("output"));
        assert!(expect_err(op, a, &[], &[]).contains("input"));
        // weight length mismatch
        let mut a = vec![inp("input", f32d(&[2, 4]))];
        a.extend(vecs.iter().map(|v| inp(v, f32d(&[5]))));
        a.push(out("output"));
        expect_err(op, a, &[], &[]);
        // missing weight
        expect_err(
            op,
            vec![inp("input", f32d(&[2, 4])), out("output")],
            &[],
            &[],
        );
        // wrong dtype
        let mut a = vec![inp("input", i32d(&[1, 2, 3, 4]))];
        a.extend(vecs.iter().map(|v| inp(v, f32d(&[4]))));
        a.push(out("output"));
        expect_err(op, a, &[], &[]);
        // missing output
        let mut a = vec![inp("input", f32d(&[2, 4]))];
        a.extend(vecs.iter().map(|v| inp(v, f32d(&[4]))));
        expect_err(op, a, &[], &[]);
    }
}

#[test]
fn activations_reject_bad_input() {
    for op in ["Softmax", "Silu", "Gelu", "Swiglu", "GeluGated", "SoftCap"] {
        expect_err(op, vec![out("output")], &[("cap", 1.0)], &[]);
        expect_err(
            op,
            vec![inp("input", i32d(&[1, 2])), out("output")],
            &[("cap", 1.0)],
            &[],
        );
        expect_err(
            op,
            vec![inp("input", Data::empty(DataType::F32)), out("output")],
            &[("cap", 1.0)],
            &[],
        );
    }
    expect_err(
        "Swiglu",
        vec![inp("input", f32d(&[2, 7])), out("output")],
        &[],
        &[],
    );
    expect_err(
        "GeluGated",
        vec![inp("input", f32d(&[3])), out("output")],
        &[],
        &[],
    );
    expect_err(
        "Gelu",
        vec![inp("input", f32d(&[3])), out("output")],
        &[],
        &[("approx", 2)],
    );
    expect_err(
        "SoftCap",
        vec![inp("input", f32d(&[3])), out("output")],
        &[],
        &[],
    );
    expect_err(
        "SoftCap",
        vec![inp("input", f32d(&[3])), out("output")],
        &[("cap", -1.0)],
        &[],
    );
    // ClampedSwiglu: gate and up of different shapes, a missing or bad limit
    let glu = |g: &[usize], u: &[usize]| {
        vec![
            inp("input0", f32d(g)),
            inp("input1", f32d(u)),
            out("output"),
        ]
    };
    let good = [("alpha", 1.702), ("limit", 7.0)];
    let m = expect_err("ClampedSwiglu", glu(&[2, 3], &[2, 4]), &good, &[]);
    assert!(m.contains("one shape"), "{m}");
    let m = expect_err("ClampedSwiglu", glu(&[3], &[3]), &[("alpha", 1.0)], &[]);
    assert!(m.contains("limit"), "{m}");
    let bad = [("alpha", 1.0), ("limit", -1.0)];
    expect_err("ClampedSwiglu", glu(&[3], &[3]), &bad, &[]);
}

#[test]
fn elementwise_rejects_bad_input() {
    expect_err(
        "AddTo",
        vec![inout("input0", f32d(&[2, 3])), inp("input1", f32d(&[2]))],
        &[],
        &[],
    );
    expect_err("AddTo", vec![inout("input0", f32d(&[2, 3]))], &[], &[]);
    expect_err(
        "AddTo",
        vec![inp("input0", f32d(&[3])), inp("input1", f32d(&[3]))],
        &[],
        &[],
    );
    expect_err(
        "MulTo",
        vec![inout("input0", f32d(&[2, 3])), inp("input1", f32d(&[3, 2]))],
        &[],
        &[],
    );
    expect_err(
        "MulTo",
        vec![inout("input0", f32d(&[3])), inp("input1", i32d(&[1, 2, 3]))],
        &[],
        &[],
    );
    // Add does not broadcast
    expect_err(
        "Add",
        vec![
            inp("input0", f32d(&[2, 3])),
            inp("input1", f32d(&[3])),
            out("output"),
        ],
        &[],
        &[],
    );
    expect_err(
        "Add",
        vec![inp("input0", f32d(&[3])), out("output")],
        &[],
        &[],
    );
    expect_err("Mul", vec![out("output")], &[("v", 2.0)], &[]);
}

fn attn(q: &[usize], k: &[usize], v: &[usize]) -> Vec<Arg> {
    vec![
        inp("q", f32d(q)),
        inp("k", f32d(k)),
        inp("v", f32d(v)),
        out("output"),
    ]
}

#[test]
fn attention_rejects_bad_input() {
    const OP: &str = "Attention";
    // heads do not divide
    let m = expect_err(OP, attn(&[1, 6, 8], &[4, 4, 8], &[4, 4, 8]), &[], &[]);
    assert!(m.contains("heads"), "{m}");
    // head size mismatch
    expect_err(OP, attn(&[1, 4, 8], &[4, 2, 7], &[4, 2, 8]), &[], &[]);
    // kv length mismatch
    expect_err(OP, attn(&[1, 4, 8], &[4, 2, 8], &[5, 2, 8]), &[], &[]);
    // not 3-D
    expect_err(OP, attn(&[4, 8], &[4, 2, 8], &[4, 2, 8]), &[], &[]);
    // zero kv heads
    expect_err(OP, attn(&[1, 4, 8], &[4, 0, 8], &[4, 0, 8]), &[], &[]);
    // causal with fewer keys than queries
    expect_err(OP, attn(&[5, 4, 8], &[4, 2, 8], &[4, 2, 8]), &[], &[]);
    // bad slopes
    let mut a = attn(&[1, 4, 8], &[4, 2, 8], &[4, 2, 8]);
    a.push(inp("alibi_slopes", f32d(&[3])));
    expect_err(OP, a, &[], &[]);
    // sinks of the wrong size
    let mut a = attn(&[1, 4, 8], &[4, 2, 8], &[4, 2, 8]);
    a.push(inp("sinks", f32d(&[5])));
    let m = expect_err(OP, a, &[], &[]);
    assert!(m.contains("sinks"), "{m}");
    // bad params
    expect_err(
        OP,
        attn(&[1, 4, 8], &[4, 2, 8], &[4, 2, 8]),
        &[],
        &[("sliding_window", -1)],
    );
    expect_err(
        OP,
        attn(&[1, 4, 8], &[4, 2, 8], &[4, 2, 8]),
        &[],
        &[("causal", 7)],
    );
    expect_err(
        OP,
        attn(&[1, 4, 8], &[4, 2, 8], &[4, 2, 8]),
        &[("softcap", -1.0)],
        &[],
    );
    // missing k
    expect_err(
        OP,
        vec![
            inp("q", f32d(&[1, 4, 8])),
            inp("v", f32d(&[4, 2, 8])),
            out("output"),
        ],
        &[],
        &[],
    );
    // wrong dtype
    expect_err(
        OP,
        vec![
            inp("q", i32d(&[1; 8])),
            inp("k", f32d(&[1, 1, 8])),
            inp("v", f32d(&[1, 1, 8])),
            out("output"),
        ],
        &[],
        &[],
    );
}

#[test]
fn rotary_rejects_bad_input() {
    const OP: &str = "RotaryEmbedding";
    let x = || inout("input", f32d(&[2, 3, 8]));
    expect_err(OP, vec![x()], &[], &[]); // no positions
    expect_err(OP, vec![x(), inp("positions", i32d(&[0, 1, 2]))], &[], &[]); // wrong length
    expect_err(OP, vec![x(), inp("positions", f32d(&[2]))], &[], &[]); // wrong dtype
    expect_err(
        OP,
        vec![x(), inp("positions", i32d(&[0, 1]))],
        &[],
        &[("rotary_dim", 7)],
    );
    expect_err(
        OP,
        vec![x(), inp("positions", i32d(&[0, 1]))],
        &[],
        &[("rotary_dim", 10)],
    );
    expect_err(
        OP,
        vec![x(), inp("positions", i32d(&[0, 1]))],
        &[],
        &[("style", 2)],
    );
    expect_err(
        OP,
        vec![
            x(),
            inp("positions", i32d(&[0, 1])),
            inp("inv_freq", f32d(&[3])),
        ],
        &[],
        &[],
    );
    expect_err(OP, vec![x(), inp("cos", f32d(&[2, 4]))], &[], &[]); // sin missing
    expect_err(
        OP,
        vec![x(), inp("cos", f32d(&[2, 3])), inp("sin", f32d(&[2, 3]))],
        &[],
        &[],
    );
    expect_err(
        OP,
        vec![
            inout("input", f32d(&[2, 8])),
            inp("positions", i32d(&[0, 1])),
        ],
        &[],
        &[],
    );
    expect_err(
        OP,
        vec![
            inp("input", f32d(&[2, 3, 8])),
            inp("positions", i32d(&[0, 1])),
        ],
        &[],
        &[],
    ); // not mutable
}

#[test]
fn shape_ops_reject_bad_input() {
    let x = || f32d(&[2, 3, 4]);
    // permutation errors: missing axis, repeated axis, out of range
    expect_err(
        "Permute",
        vec![inp("input", x()), out("output")],
        &[],
        &[("axis0", 1), ("axis1", 0)],
    );
    expect_err(
        "Permute",
        vec![inp("input", x()), out("output")],
        &[],
        &[("axis0", 1), ("axis1", 1), ("axis2", 0)],
    );
    expect_err(
        "PermuteSelf",
        vec![inout("input", x())],
        &[],
        &[("axis0", 3), ("axis1", 1), ("axis2", 0)],
    );
    expect_err(
        "PermuteSelf",
        vec![inout("input", x())],
        &[],
        &[("axis0", -1), ("axis1", 1), ("axis2", 0)],
    );
    let q = Data::zeros(DataType::Q8_0, &[2, 32]).unwrap();
    expect_err(
        "Permute",
        vec![inp("input", q), out("output")],
        &[],
        &[("axis0", 1), ("axis1", 0)],
    );
    // cat: mismatched dims, bad axis, dtype mismatch
    expect_err(
        "Cat",
        vec![
            inp("input0", x()),
            inp("input1", f32d(&[2, 4, 4])),
            out("output"),
        ],
        &[],
        &[("axis", 0)],
    );
    expect_err(
        "Cat",
        vec![inp("input0", x()), inp("input1", x()), out("output")],
        &[],
        &[("axis", 3)],
    );
    expect_err(
        "Cat",
        vec![inp("input0", x()), inp("input1", x()), out("output")],
        &[],
        &[("axis", -1)],
    );
    expect_err(
        "Cat",
        vec![
            inp("input0", x()),
            inp("input1", Data::zeros(DataType::F16, &[2, 3, 4]).unwrap()),
            out("output"),
        ],
        &[],
        &[],
    );
    expect_err(
        "CatDirect",
        vec![inout("input0", x()), inp("input1", f32d(&[2, 3, 5]))],
        &[],
        &[("axis", 1)],
    );
    expect_err(
        "CatDirect",
        vec![inout("input0", x()), inp("input1", x())],
        &[],
        &[("axis", 5)],
    );
    expect_err("CatDirect", vec![inout("input0", x())], &[], &[]);
    // split: bad range, bad axis
    expect_err(
        "Split",
        vec![inp("input", x()), out("output")],
        &[],
        &[("axis", 1), ("start", 2), ("end", 4)],
    );
    expect_err(
        "Split",
        vec![inp("input", x()), out("output")],
        &[],
        &[("axis", 1), ("start", 2), ("end", 1)],
    );
    expect_err(
        "Split",
        vec![inp("input", x()), out("output")],
        &[],
        &[("axis", 3)],
    );
    expect_err(
        "Split",
        vec![inp("input", x()), out("output")],
        &[],
        &[("axis", 0), ("start", -1)],
    );
}

#[test]
fn select_ops_reject_bad_input() {
    let x = || f32d(&[2, 5]);
    let m = expect_err(
        "TopK",
        vec![inp("input", x()), out("output")],
        &[],
        &[("k", 6)],
    );
    assert!(m.contains("k = 6"), "{m}");
    expect_err(
        "TopK",
        vec![inp("input", x()), out("output")],
        &[],
        &[("k", 0)],
    );
    expect_err("TopK", vec![inp("input", x()), out("output")], &[], &[]);
    expect_err(
        "TopK",
        vec![inp("input", i32d(&[1, 2])), out("output")],
        &[],
        &[("k", 1)],
    );
    expect_err(
        "ArgMax",
        vec![inp("input", i32d(&[1, 2])), out("output")],
        &[],
        &[],
    );
    expect_err(
        "ArgMax",
        vec![inp("input", f32d(&[2, 0])), out("output")],
        &[],
        &[],
    );
    expect_err("ArgMax", vec![out("output")], &[], &[]);
}

#[test]
fn embedding_rejects_bad_input() {
    const OP: &str = "Embedding";
    let w = || f32d(&[10, 4]);
    let m = expect_err(
        OP,
        vec![
            inp("input", i32d(&[1, 10])),
            inp("weight", w()),
            out("output"),
        ],
        &[],
        &[],
    );
    assert!(m.contains("token id 10"), "{m}");
    expect_err(
        OP,
        vec![inp("input", i32d(&[-1])), inp("weight", w()), out("output")],
        &[],
        &[],
    );
    expect_err(
        OP,
        vec![inp("input", f32d(&[2])), inp("weight", w()), out("output")],
        &[],
        &[],
    );
    expect_err(
        OP,
        vec![
            inp("input", i32d(&[1])),
            inp("weight", f32d(&[40])),
            out("output"),
        ],
        &[],
        &[],
    );
    expect_err(
        OP,
        vec![
            inp("input", i32d(&[1])),
            inp("weight", i32d(&[1, 2])),
            out("output"),
        ],
        &[],
        &[],
    );
    expect_err(OP, vec![inp("input", i32d(&[1])), out("output")], &[], &[]);
}

#[test]
fn fused_forms_reject_bad_input() {
    // a group's sums: no peer-to-peer group on the CPU
    expect_err(
        "AllReduceAdd",
        vec![inout("input0", f32d(&[4])), inp("input1", f32d(&[4]))],
        &[],
        &[],
    );
    expect_err(
        "RMSNorm",
        vec![
            inp("input", f32d(&[2, 4])),
            inp("weight", f32d(&[4])),
            out("output"),
        ],
        &[],
        &[("all_reduce", 1)],
    );
    // SiluMul: gate and up of different shapes, an output copy the CPU cannot keep, no up
    let m = expect_err(
        "SiluMul",
        vec![
            inp("input0", f32d(&[2, 4])),
            inp("input1", f32d(&[2, 5])),
            out("output"),
        ],
        &[],
        &[],
    );
    assert!(m.contains("one shape"), "{m}");
    let m = expect_err(
        "SiluMul",
        vec![
            inp("input0", f32d(&[2, 4])),
            inp("input1", f32d(&[2, 4])),
            out("output"),
        ],
        &[],
        &[("quantize_output", 1)],
    );
    assert!(m.contains("quantize_output"), "{m}");
    expect_err(
        "SiluMul",
        vec![inp("input0", f32d(&[4])), out("output")],
        &[],
        &[],
    );
    // RotaryTables: odd or missing rotary_dim, a bad theta, a short inv_freq, no positions
    let tables = |extra: Vec<Arg>| {
        let mut a = vec![inp("positions", i32d(&[0, 1, 2])), out("cos"), out("sin")];
        a.extend(extra);
        a
    };
    let m = expect_err("RotaryTables", tables(vec![]), &[], &[("rotary_dim", 5)]);
    assert!(m.contains("rotary_dim"), "{m}");
    expect_err("RotaryTables", tables(vec![]), &[], &[]);
    let m = expect_err(
        "RotaryTables",
        tables(vec![]),
        &[("theta", -1.0)],
        &[("rotary_dim", 4)],
    );
    assert!(m.contains("theta"), "{m}");
    let short = vec![inp("inv_freq", f32d(&[1]))];
    let m = expect_err("RotaryTables", tables(short), &[], &[("rotary_dim", 8)]);
    assert!(m.contains("inv_freq"), "{m}");
    expect_err(
        "RotaryTables",
        vec![out("cos"), out("sin")],
        &[],
        &[("rotary_dim", 4)],
    );
    // Linear with several weights: weight2 alone, accumulate, a k mismatch, a missing output
    let lin = |extra: Vec<Arg>| {
        let mut a = vec![
            inp("input", f32d(&[2, 8])),
            inp("weight", f32d(&[3, 8])),
            out("output"),
        ];
        a.extend(extra);
        a
    };
    let m = expect_err(
        "Linear",
        lin(vec![inp("weight2", f32d(&[3, 8])), out("output2")]),
        &[],
        &[],
    );
    assert!(m.contains("weight2"), "{m}");
    let one = || vec![inp("weight1", f32d(&[4, 8])), out("output1")];
    let m = expect_err("Linear", lin(one()), &[], &[("accumulate", 1)]);
    assert!(m.contains("accumulate"), "{m}");
    let m = expect_err(
        "Linear",
        lin(vec![inp("weight1", f32d(&[4, 6])), out("output1")]),
        &[],
        &[],
    );
    assert!(m.contains("weight1"), "{m}");
    let m = expect_err("Linear", lin(vec![inp("weight1", f32d(&[4, 8]))]), &[], &[]);
    assert!(m.contains("output1"), "{m}");
}

#[test]
fn valid_calls_still_work() {
    // guards against the error tests passing because everything fails
    let exec = Executor::cpu(2).unwrap();
    let x = f32d(&[2, 4]);
    let w = Data::from_f32(&[4], &[1.0; 4]).unwrap();
    let mut o = Data::empty(DataType::F32);
    let mut d = DataDict::new()
        .with("input", &x)
        .with("weight", &w)
        .with_mut("output", &mut o);
    exec.run("RMSNorm", &mut d, &FloatDict::new(), &IntDict::new())
        .unwrap();
    assert_eq!(o.dims(), &[2, 4]);
    let ids = i32d(&[3, 0]);
    let table = f32d(&[5, 4]);
    let mut e = Data::empty(DataType::F32);
    let mut d = DataDict::new()
        .with("input", &ids)
        .with("weight", &table)
        .with_mut("output", &mut e);
    exec.run("Embedding", &mut d, &FloatDict::new(), &IntDict::new())
        .unwrap();
    assert_eq!(
        &e.to_f32_vec().unwrap()[..4],
        &table.to_f32_vec().unwrap()[12..16]
    );
}
