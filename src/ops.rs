//! Typed wrappers over `Executor::run` so model code reads like math and argument-name typos are
//! compile errors. Each function is one op call with fastllm's argument names (see `docs/ops.md`).
//! The string-keyed `Executor::run` stays the public path for custom models (C ABI, Python).

use crate::data::Data;
pub use crate::device::OutputCopy;
use crate::device::{DataDict, FloatDict, IntDict};
use crate::error::Result;
use crate::executor::Executor;

/// Rotary pairing passed to [`rotary`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RotaryStyle {
    /// Pairs `(i, i + rot/2)`.
    Neox = 0,
    /// Pairs `(2i, 2i + 1)`.
    Interleaved = 1,
}

/// `output = input·weightᵀ + bias`.
pub fn linear(
    e: &Executor,
    x: &Data,
    w: &Data,
    b: Option<&Data>,
    out: &mut Data,
    quant_act: bool,
) -> Result<()> {
    let mut d = DataDict::new().with("input", x).with("weight", w);
    if let Some(b) = b {
        d.insert("bias", b);
    }
    d.insert_mut("output", out);
    let ints = IntDict::new().with("quant_act", quant_act as i32);
    e.run("Linear", &mut d, &FloatDict::new(), &ints)
}

/// `output_i = input·weight_iᵀ + bias_i` for two or three weights of the same dtype sharing the
/// input, as one `Linear` call (`weight`, `weight1`, `weight2`, ...): a device may stream them in
/// one launch. Only devices that accept the extra weights (the CUDA device) take this call.
pub fn linear_multi(
    e: &Executor,
    x: &Data,
    parts: &mut [(&Data, Option<&Data>, &mut Data)],
    quant_act: bool,
) -> Result<()> {
    linear_multi_as(e, x, parts, quant_act, OutputCopy::None)
}

/// [`linear_multi`]; with `half` = [`OutputCopy::F16`] / [`OutputCopy::Bf16`] a device that
/// can (CUDA, tensor-core products of many rows in `fast` precision, no bias) writes the outputs
/// as F16/BF16 tensors instead of F32. Other devices and products ignore it, so the caller
/// must accept either dtype (the CUDA `SiluMul` and `Linear` take both).
pub fn linear_multi_as(
    e: &Executor,
    x: &Data,
    parts: &mut [(&Data, Option<&Data>, &mut Data)],
    quant_act: bool,
    half: OutputCopy,
) -> Result<()> {
    const NAMES: [(&str, &str, &str); 3] = [
        ("weight", "bias", "output"),
        ("weight1", "bias1", "output1"),
        ("weight2", "bias2", "output2"),
    ];
    if parts.len() > NAMES.len() {
        return Err(crate::error::Error::invalid(
            "linear_multi: at most three weights",
        ));
    }
    let mut d = DataDict::new().with("input", x);
    for ((w, b, out), (wn, bn, on)) in parts.iter_mut().zip(NAMES) {
        d.insert(wn, w);
        if let Some(b) = b {
            d.insert(bn, b);
        }
        d.insert_mut(on, out);
    }
    e.run(
        "Linear",
        &mut d,
        &FloatDict::new(),
        &IntDict::new()
            .with("quant_act", quant_act as i32)
            .with("half_output", half.param()),
    )
}

/// `output = embedding rows of ids`.
pub fn embedding(e: &Executor, ids: &Data, w: &Data, out: &mut Data) -> Result<()> {
    let mut d = DataDict::new()
        .with("input", ids)
        .with("weight", w)
        .with_mut("output", out);
    e.run("Embedding", &mut d, &FloatDict::new(), &IntDict::new())
}

/// [`embedding`] of ids already on the embedding's device and validated by the caller (the
/// device does not read them back; it clamps an id outside the vocabulary).
pub fn embedding_checked(e: &Executor, ids: &Data, w: &Data, out: &mut Data) -> Result<()> {
    let mut d = DataDict::new()
        .with("input", ids)
        .with("weight", w)
        .with_mut("output", out);
    e.run(
        "Embedding",
        &mut d,
        &FloatDict::new(),
        &IntDict::new().with("checked", 1),
    )
}

/// RMS normalization over the last axis.
pub fn rms_norm(e: &Executor, x: &Data, w: &Data, eps: f32, out: &mut Data) -> Result<()> {
    rms_norm_quantizing(e, x, w, eps, out, OutputCopy::None)
}

/// [`rms_norm`]; with a `copy`, a device that can (CUDA) also keeps the output in that form for
/// the next `Linear` (see [`OutputCopy`]).
pub fn rms_norm_quantizing(
    e: &Executor,
    x: &Data,
    w: &Data,
    eps: f32,
    out: &mut Data,
    copy: OutputCopy,
) -> Result<()> {
    let mut d = DataDict::new()
        .with("input", x)
        .with("weight", w)
        .with_mut("output", out);
    e.run(
        "RMSNorm",
        &mut d,
        &FloatDict::new().with("eps", eps),
        &IntDict::new().with("quantize_output", copy.param()),
    )
}

/// Layer normalization over the last axis.
pub fn layer_norm(
    e: &Executor,
    x: &Data,
    g: &Data,
    b: &Data,
    eps: f32,
    out: &mut Data,
) -> Result<()> {
    let mut d = DataDict::new()
        .with("input", x)
        .with("gamma", g)
        .with("beta", b)
        .with_mut("output", out);
    e.run(
        "LayerNorm",
        &mut d,
        &FloatDict::new().with("eps", eps),
        &IntDict::new(),
    )
}

/// Parameters of [`rotary`].
pub struct RotaryParams<'a> {
    /// Positions, I32 \[s\].
    pub positions: &'a Data,
    /// Optional inverse frequencies [rot/2].
    pub inv_freq: Option<&'a Data>,
    /// Rotated dims per head.
    pub rotary_dim: usize,
    /// Pairing.
    pub style: RotaryStyle,
    /// Base.
    pub theta: f32,
    /// `cos`/`sin` tables [s, rotary_dim/2] of these positions ([`rotary_tables`]): when set,
    /// the rotation reads them instead of forming the angles.
    pub tables: Option<(&'a Data, &'a Data)>,
}

impl RotaryParams<'_> {
    /// The ints a rotating op takes: `rotary_dim` and `style`.
    pub fn ints(&self) -> IntDict<'static> {
        IntDict::new()
            .with("rotary_dim", self.rotary_dim as i32)
            .with("style", self.style as i32)
    }
}

/// The `cos`/`sin` tables [s, rotary_dim/2] of `p`'s positions (`RotaryTables`, GPU only: call it
/// where the first device has the op), for [`RotaryParams::tables`].
pub fn rotary_tables(e: &Executor, p: &RotaryParams, cos: &mut Data, sin: &mut Data) -> Result<()> {
    let mut d = angle_inputs(p);
    d.insert_mut("cos", cos);
    d.insert_mut("sin", sin);
    e.run(
        "RotaryTables",
        &mut d,
        &FloatDict::new().with("theta", p.theta),
        &IntDict::new().with("rotary_dim", p.rotary_dim as i32),
    )
}

/// The inputs that give a rotation its angles: the tables, or the positions (and inverse
/// frequencies).
fn rotary_inputs<'a>(p: &RotaryParams<'a>) -> DataDict<'a> {
    match p.tables {
        Some((c, s)) => DataDict::new().with("cos", c).with("sin", s),
        None => angle_inputs(p),
    }
}

/// The positions (and inverse frequencies) the angles are formed from.
fn angle_inputs<'a>(p: &RotaryParams<'a>) -> DataDict<'a> {
    let mut d = DataDict::new().with("positions", p.positions);
    if let Some(f) = p.inv_freq {
        d.insert("inv_freq", f);
    }
    d
}

/// Rotary embedding of `x` [s, heads, hd], in place.
pub fn rotary(e: &Executor, x: &mut Data, p: &RotaryParams) -> Result<()> {
    let mut d = rotary_inputs(p);
    d.insert_mut("input", x);
    e.run(
        "RotaryEmbedding",
        &mut d,
        &FloatDict::new().with("theta", p.theta),
        &p.ints(),
    )
}

/// [`rotary`] of `q` and `k` (same rows and head size) in one call (`input1`); only devices that
/// accept `input1` (the CUDA device) take it.
pub fn rotary_pair(e: &Executor, q: &mut Data, k: &mut Data, p: &RotaryParams) -> Result<()> {
    let mut d = rotary_inputs(p);
    d.insert_mut("input", q);
    d.insert_mut("input1", k);
    e.run(
        "RotaryEmbedding",
        &mut d,
        &FloatDict::new().with("theta", p.theta),
        &p.ints(),
    )
}

/// Parameters of [`attention`].
pub struct AttentionParams<'a> {
    /// Score scale.
    pub scale: f32,
    /// Soft-capping (0 = off).
    pub softcap: f32,
    /// Sliding window (0 = off).
    pub sliding_window: usize,
    /// ALiBi slopes \[nh\].
    pub alibi: Option<&'a Data>,
    /// Attention sinks \[nh\]: a logit per head in each softmax's denominator (GPT-OSS).
    pub sinks: Option<&'a Data>,
    /// Reduced-precision arithmetic allowed (the `fast` precision): a device may use TF32 /
    /// f16 tensor cores for long prefills.
    pub fast: bool,
    /// The copy of the output the next `Linear` reads (the output projection), as for
    /// [`rms_norm_quantizing`]; the CUDA flash-attention kernel writes the f16/bf16 forms.
    pub output_copy: OutputCopy,
}

impl<'a> AttentionParams<'a> {
    /// Adds the arguments every attention op shares to `d`: the ALiBi slopes and sinks (when
    /// given), then `output`; returns the float parameters (`scale`, `softcap`).
    pub fn args<'d>(&self, d: &mut DataDict<'d>, out: &'d mut Data) -> FloatDict<'static>
    where
        'a: 'd,
    {
        if let Some(a) = self.alibi {
            d.insert("alibi_slopes", a);
        }
        if let Some(s) = self.sinks {
            d.insert("sinks", s);
        }
        d.insert_mut("output", out);
        FloatDict::new()
            .with("scale", self.scale)
            .with("softcap", self.softcap)
    }
}

/// Causal attention of `q` [sq, nh, hd] over `k`, `v` [skv, nkv, hd].
pub fn attention(
    e: &Executor,
    q: &Data,
    k: &Data,
    v: &Data,
    p: &AttentionParams,
    out: &mut Data,
) -> Result<()> {
    let mut d = DataDict::new().with("q", q).with("k", k).with("v", v);
    let floats = p.args(&mut d, out);
    e.run(
        "Attention",
        &mut d,
        &floats,
        &IntDict::new()
            .with("causal", 1)
            .with("sliding_window", p.sliding_window as i32)
            .with("fast", p.fast as i32)
            .with("quantize_output", p.output_copy.param()),
    )
}

/// GPT-OSS's clamped SwiGLU: `out = (clamp(up, −limit, limit) + 1) · g·σ(alpha·g)` with
/// `g = min(gate, limit)`; `gate` and `up` of one shape.
pub fn clamped_swiglu(
    e: &Executor,
    gate: &Data,
    up: &Data,
    (alpha, limit): (f32, f32),
    out: &mut Data,
) -> Result<()> {
    let mut d = DataDict::new()
        .with("input0", gate)
        .with("input1", up)
        .with_mut("output", out);
    e.run(
        "ClampedSwiglu",
        &mut d,
        &FloatDict::new().with("alpha", alpha).with("limit", limit),
        &IntDict::new(),
    )
}

/// `x += alpha·y`.
pub fn add_to(e: &Executor, x: &mut Data, y: &Data, alpha: f32) -> Result<()> {
    let mut d = DataDict::new().with_mut("input0", x).with("input1", y);
    e.run(
        "AddTo",
        &mut d,
        &FloatDict::new().with("alpha", alpha),
        &IntDict::new(),
    )
}

/// `x *= y` (elementwise or row broadcast).
pub fn mul_to(e: &Executor, x: &mut Data, y: &Data) -> Result<()> {
    let mut d = DataDict::new().with_mut("input0", x).with("input1", y);
    e.run("MulTo", &mut d, &FloatDict::new(), &IntDict::new())
}

/// `output = silu(g)·u` (a device op; the CPU device does not have it).
pub fn silu_mul(e: &Executor, g: &Data, u: &Data, out: &mut Data) -> Result<()> {
    silu_mul_quantizing(e, g, u, out, OutputCopy::None)
}

/// [`silu_mul`]; `copy` as in [`rms_norm_quantizing`].
pub fn silu_mul_quantizing(
    e: &Executor,
    g: &Data,
    u: &Data,
    out: &mut Data,
    copy: OutputCopy,
) -> Result<()> {
    let mut d = DataDict::new()
        .with("input0", g)
        .with("input1", u)
        .with_mut("output", out);
    e.run(
        "SiluMul",
        &mut d,
        &FloatDict::new(),
        &IntDict::new().with("quantize_output", copy.param()),
    )
}

/// `output = x·v`.
pub fn mul(e: &Executor, x: &Data, v: f32, out: &mut Data) -> Result<()> {
    let mut d = DataDict::new().with("input", x).with_mut("output", out);
    e.run(
        "Mul",
        &mut d,
        &FloatDict::new().with("v", v),
        &IntDict::new(),
    )
}

fn unary(e: &Executor, op: &str, x: &Data, out: &mut Data, f: FloatDict, i: IntDict) -> Result<()> {
    let mut d = DataDict::new().with("input", x).with_mut("output", out);
    e.run(op, &mut d, &f, &i)
}

/// `output = silu(x)`.
pub fn silu(e: &Executor, x: &Data, out: &mut Data) -> Result<()> {
    unary(e, "Silu", x, out, FloatDict::new(), IntDict::new())
}

/// `output = gelu(x)` (tanh approximation when `tanh`).
pub fn gelu(e: &Executor, x: &Data, tanh: bool, out: &mut Data) -> Result<()> {
    unary(
        e,
        "Gelu",
        x,
        out,
        FloatDict::new(),
        IntDict::new().with("approx", tanh as i32),
    )
}

/// `output = silu(x[..d])·x[d..]`.
pub fn swiglu(e: &Executor, x: &Data, out: &mut Data) -> Result<()> {
    unary(e, "Swiglu", x, out, FloatDict::new(), IntDict::new())
}

/// `output = gelu(x[..d])·x[d..]`.
pub fn gelu_gated(e: &Executor, x: &Data, tanh: bool, out: &mut Data) -> Result<()> {
    unary(
        e,
        "GeluGated",
        x,
        out,
        FloatDict::new(),
        IntDict::new().with("approx", tanh as i32),
    )
}

/// `output = cap·tanh(x/cap)`.
pub fn soft_cap(e: &Executor, x: &Data, cap: f32, out: &mut Data) -> Result<()> {
    unary(
        e,
        "SoftCap",
        x,
        out,
        FloatDict::new().with("cap", cap),
        IntDict::new(),
    )
}

/// `output = x[start..end]` along `axis`.
pub fn split(
    e: &Executor,
    x: &Data,
    axis: usize,
    start: usize,
    end: usize,
    out: &mut Data,
) -> Result<()> {
    unary(
        e,
        "Split",
        x,
        out,
        FloatDict::new(),
        IntDict::new()
            .with("axis", axis as i32)
            .with("start", start as i32)
            .with("end", end as i32),
    )
}

/// `output = [x | y]` along `axis` (every other dim equal).
pub fn cat(e: &Executor, x: &Data, y: &Data, axis: usize, out: &mut Data) -> Result<()> {
    let mut d = DataDict::new()
        .with("input0", x)
        .with("input1", y)
        .with_mut("output", out);
    e.run(
        "Cat",
        &mut d,
        &FloatDict::new(),
        &IntDict::new().with("axis", axis as i32),
    )
}

/// Batched `output = alpha · a·bᵀ` for `a` [.., m, k] and `b` [.., n, k] (`MatMulTransB`).
pub fn matmul_trans_b(e: &Executor, a: &Data, b: &Data, alpha: f32, out: &mut Data) -> Result<()> {
    let mut d = DataDict::new()
        .with("input0", a)
        .with("input1", b)
        .with_mut("output", out);
    e.run(
        "MatMulTransB",
        &mut d,
        &FloatDict::new().with("alpha", alpha),
        &IntDict::new(),
    )
}

/// Appends `src` to `dst` along `axis` in place.
pub fn cat_direct(e: &Executor, dst: &mut Data, src: &Data, axis: usize) -> Result<()> {
    let mut d = DataDict::new().with_mut("input0", dst).with("input1", src);
    e.run(
        "CatDirect",
        &mut d,
        &FloatDict::new(),
        &IntDict::new().with("axis", axis as i32),
    )
}

/// Encodes the f32 rows `src [n, nkv, hd]` at the end of the KV cache `cache` (f16 or q8_0, or
/// f32) in place (`KvAppend`).
pub fn kv_append(e: &Executor, cache: &mut Data, src: &Data) -> Result<()> {
    let mut d = DataDict::new().with_mut("cache", cache).with("input", src);
    e.run("KvAppend", &mut d, &FloatDict::new(), &IntDict::new())
}

/// `output = x` with axes permuted.
pub fn permute(e: &Executor, x: &Data, axes: &[usize], out: &mut Data) -> Result<()> {
    const NAMES: [&str; 8] = [
        "axis0", "axis1", "axis2", "axis3", "axis4", "axis5", "axis6", "axis7",
    ];
    let mut ints = IntDict::new();
    for (n, a) in NAMES.iter().zip(axes) {
        ints.insert(n, *a as i32);
    }
    unary(e, "Permute", x, out, FloatDict::new(), ints)
}

/// Row-wise argmax into I32.
pub fn argmax(e: &Executor, x: &Data, out: &mut Data) -> Result<()> {
    unary(e, "ArgMax", x, out, FloatDict::new(), IntDict::new())
}

/// The `k` largest of each row as (index, value) f32 pairs, descending, ties by lower index
/// (`TopK`: output [.., k, 2]).
pub fn topk(e: &Executor, x: &Data, k: usize, out: &mut Data) -> Result<()> {
    unary(
        e,
        "TopK",
        x,
        out,
        FloatDict::new(),
        IntDict::new().with("k", k as i32),
    )
}

/// Parameters of [`moe_route`] (see `MoeRoute` in `docs/ops.md`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeRouteParams {
    /// Experts chosen per token.
    pub k: usize,
    /// Sigmoid scores instead of a softmax.
    pub sigmoid: bool,
    /// Expert groups (1 = no group limit).
    pub groups: usize,
    /// Groups a token may choose from.
    pub topk_groups: usize,
    /// Renormalise the chosen weights to sum to 1.
    pub normalize: bool,
    /// Multiplies the weights (DeepSeek-V3's routed scaling factor).
    pub scale: f32,
}

/// Router logits [rows, experts] (+ DeepSeek-V3's correction `bias` \[experts\], used for the
/// choice only) → `out` [rows, k, 2]: each token's chosen experts and weights, best first.
pub fn moe_route(
    e: &Executor,
    logits: &Data,
    bias: Option<&Data>,
    p: &MoeRouteParams,
    out: &mut Data,
) -> Result<()> {
    let mut d = DataDict::new().with("input", logits);
    if let Some(b) = bias {
        d.insert("bias", b);
    }
    d.insert_mut("output", out);
    e.run(
        "MoeRoute",
        &mut d,
        &FloatDict::new().with("scale", p.scale),
        &IntDict::new()
            .with("k", p.k as i32)
            .with("scoring", p.sigmoid as i32)
            .with("groups", p.groups as i32)
            .with("topk_groups", p.topk_groups as i32)
            .with("normalize", p.normalize as i32),
    )
}

/// A route [rows, k, 2] made by [`moe_route`] → `out` I32 [experts + 1 + rows·k]: per-expert
/// offsets, then the slots (`token·k + choice`) grouped by expert. The route is passed as
/// `checked` (a GPU does not read it back to validate it).
pub fn moe_dispatch(e: &Executor, route: &Data, experts: usize, out: &mut Data) -> Result<()> {
    unary(
        e,
        "MoeDispatch",
        route,
        out,
        FloatDict::new(),
        IntDict::new()
            .with("experts", experts as i32)
            .with("checked", 1),
    )
}

/// How [`moe_linear`] reads its input rows and routing.
#[derive(Clone, Copy, Debug)]
pub struct MoeLinearRows<'a> {
    /// The dispatch from [`moe_dispatch`] (passed as `checked`).
    pub dispatch: &'a Data,
    /// Experts chosen per token.
    pub k: usize,
    /// The input has one row per token (gathered for each of its slots) instead of one per
    /// dispatch position.
    pub gather: bool,
}

/// The grouped expert product (`MoeLinear`): `out` [slots, n] in dispatch order, row `j` =
/// `x(j) · weight[e(j)]ᵀ + bias[e(j)]` for the stacked expert weights `weight` [experts, n, k]
/// (and `bias` [experts, n]); each routed expert's weights are read once for all its rows.
pub fn moe_linear(
    e: &Executor,
    x: &Data,
    (weight, bias): (&Data, Option<&Data>),
    rows: MoeLinearRows,
    quant_act: bool,
    out: &mut Data,
) -> Result<()> {
    let mut d = DataDict::new()
        .with("input", x)
        .with("weight", weight)
        .with("dispatch", rows.dispatch);
    if let Some(b) = bias {
        d.insert("bias", b);
    }
    d.insert_mut("output", out);
    e.run(
        "MoeLinear",
        &mut d,
        &FloatDict::new(),
        &IntDict::new()
            .with("k", rows.k as i32)
            .with("gather", rows.gather as i32)
            .with("quant_act", quant_act as i32)
            .with("checked", 1),
    )
}

/// One routed expert of [`moe_linear_each`]: its index, weight [n, k] and bias \[n\].
pub type ExpertMatrix<'a> = (usize, &'a Data, Option<&'a Data>);

/// [`moe_linear`] in its per-expert form (on the devices that run it: the CPU): `experts` lists
/// (expert, weight [n, k], bias \[n\]) for every expert with dispatch entries (the others are not
/// passed, so they are not read), `count` experts in all; the matrices stay where they are (a
/// mapped file's layout is read in place).
pub fn moe_linear_each(
    e: &Executor,
    x: &Data,
    (experts, count): (&[ExpertMatrix], usize),
    rows: MoeLinearRows,
    quant_act: bool,
    out: &mut Data,
) -> Result<()> {
    let names: Vec<(String, String)> = experts
        .iter()
        .map(|(i, _, _)| (format!("weight.{i}"), format!("bias.{i}")))
        .collect();
    let mut d = DataDict::new()
        .with("input", x)
        .with("dispatch", rows.dispatch);
    for ((_, w, b), (wn, bn)) in experts.iter().zip(&names) {
        d.insert(wn, w);
        if let Some(b) = b {
            d.insert(bn, b);
        }
    }
    d.insert_mut("output", out);
    e.run(
        "MoeLinear",
        &mut d,
        &FloatDict::new(),
        &IntDict::new()
            .with("k", rows.k as i32)
            .with("gather", rows.gather as i32)
            .with("quant_act", quant_act as i32)
            .with("experts", count as i32)
            .with("checked", 1),
    )
}

/// `out[t] = Σ_j weight(t, j) · x[row of slot (t, j)]`: `x` [rows·k, d] holds the experts'
/// outputs in the order of `dispatch` (made by [`moe_dispatch`] from `route`; passed as
/// `checked`).
pub fn moe_combine(
    e: &Executor,
    x: &Data,
    route: &Data,
    dispatch: &Data,
    out: &mut Data,
) -> Result<()> {
    let mut d = DataDict::new()
        .with("input", x)
        .with("route", route)
        .with("dispatch", dispatch)
        .with_mut("output", out);
    e.run(
        "MoeCombine",
        &mut d,
        &FloatDict::new(),
        &IntDict::new().with("checked", 1),
    )
}
