//! Mixture-of-experts layers: their configuration ([`MoeConfig`], part of `ModelConfig`), the
//! tensor names of an architecture's experts ([`MoeNames`], part of its `ArchSpec`), and the FFN
//! stage that runs them ([`moe_ffn`]): router `Linear` → `MoeRoute` → `MoeDispatch` → the
//! experts → `MoeCombine`, plus the shared experts. Each active expert's weights are read once
//! per step for all its tokens.
//!
//! The experts run in one of three ways. Where the first device runs `MoeLinear` (a GPU),
//! [`stack_experts`] stacks each layer's per-expert projections at load into [experts, n, k]
//! tensors, and a step runs the gate, up and down projections of all routed experts as three
//! grouped `MoeLinear` launches: routing, dispatch and expert products stay on the device, with
//! no host sync. On the CPU the dispatch comes to the host, the routed experts' tensors are
//! fetched as loaded (mapped from the file; in low-memory mode only the routed ones are read)
//! and the same three `MoeLinear`s run in their per-expert form. Otherwise (a GPU in
//! low-memory mode, or experts that could not be stacked) each active expert runs as a row
//! gather (`Embedding` over the step's rows), its gate/up `Linear`s, the activation (or
//! GPT-OSS's `ClampedSwiglu`) and its down `Linear`.

use super::weights::Weights;
use crate::data::{Data, DataType, DeviceKind};
use crate::device::BaseDevice;
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::ops::{self, MoeLinearRows, MoeRouteParams};

/// How router logits become expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeScoring {
    /// Softmax over the experts (Mixtral, Qwen3-MoE).
    Softmax,
    /// Independent sigmoids (DeepSeek-V3).
    Sigmoid,
}

/// GPT-OSS's clamped SwiGLU of the experts: `(clamp(up, −limit, limit) + 1) · g·σ(alpha·g)`,
/// `g = min(gate, limit)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SwigluClamp {
    /// The sigmoid's slope.
    pub alpha: f32,
    /// The clamp of the gate (from above) and of the up projection (both sides).
    pub limit: f32,
}

/// The mixture-of-experts part of a model's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts each token is routed to.
    pub experts_per_token: usize,
    /// Inner size of one routed expert.
    pub expert_intermediate: usize,
    /// Score function of the router.
    pub scoring: MoeScoring,
    /// Expert groups for group-limited routing (1 = none).
    pub groups: usize,
    /// Groups a token may choose from.
    pub topk_groups: usize,
    /// Renormalise the chosen weights to sum to 1.
    pub normalize: bool,
    /// Multiplies the routed weights.
    pub routed_scale: f32,
    /// Inner size of the shared experts together (0 = no shared expert).
    pub shared_intermediate: usize,
    /// Per layer: true where the layer is a MoE layer (the others use the dense MLP of
    /// `intermediate_size`).
    pub layers: Vec<bool>,
    /// The experts' clamped SwiGLU (GPT-OSS); `None`: `act(gate) · up` with the model's
    /// activation.
    pub swiglu_clamp: Option<SwigluClamp>,
}

impl MoeConfig {
    /// True when layer `i` routes to experts.
    pub fn is_moe(&self, i: usize) -> bool {
        self.layers.get(i).copied().unwrap_or(false)
    }

    /// Checks the sizes against a model of `num_layers` layers.
    pub fn validate(&self, arch: &str, num_layers: usize) -> Result<()> {
        let bad = |m: String| Err(Error::Unsupported(format!("{arch}: {m}")));
        if self.experts == 0 || self.experts_per_token == 0 {
            return bad("a MoE model needs experts and experts per token ≥ 1".into());
        }
        if self.experts_per_token > self.experts {
            return bad(format!(
                "{} experts per token but only {} experts",
                self.experts_per_token, self.experts
            ));
        }
        if self.groups == 0
            || !self.experts.is_multiple_of(self.groups)
            || self.topk_groups == 0
            || self.topk_groups > self.groups
        {
            return bad(format!(
                "expert groups {} / chosen groups {} do not fit {} experts",
                self.groups, self.topk_groups, self.experts
            ));
        }
        if self.layers.len() != num_layers {
            return bad(format!(
                "{} MoE layer flags for {num_layers} layers",
                self.layers.len()
            ));
        }
        Ok(())
    }

    fn route_params(&self) -> MoeRouteParams {
        MoeRouteParams {
            k: self.experts_per_token,
            sigmoid: self.scoring == MoeScoring::Sigmoid,
            groups: self.groups,
            topk_groups: self.topk_groups,
            normalize: self.normalize,
            scale: self.routed_scale,
        }
    }
}

/// Tensor names of an architecture's MoE layers, relative to the layer prefix, without
/// `.weight`. Expert `e`'s projections are `{experts}.{e}.{gate|up|down}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeNames {
    /// The router linear [experts, hidden].
    pub router: &'static str,
    /// The full name of the router's choice bias (DeepSeek-V3's `e_score_correction_bias`).
    pub score_bias: Option<&'static str>,
    /// Prefix of the routed experts.
    pub experts: &'static str,
    /// Gate, up and down projection names inside an expert.
    pub proj: (&'static str, &'static str, &'static str),
    /// The shared experts (one gated MLP with the same projection names).
    pub shared: Option<&'static str>,
}

/// True when `name` is a routed expert's tensor under the experts prefix `experts`
/// (`…{experts}.{e}.…`).
pub fn is_expert_tensor(experts: &str, name: &str) -> bool {
    name.split_once(&format!(".{experts}."))
        .is_some_and(|(_, rest)| {
            rest.split('.')
                .next()
                .is_some_and(|e| e.parse::<usize>().is_ok())
        })
}

/// What the MoE stage needs from the model it runs in.
pub struct MoeStep<'a> {
    /// The executor.
    pub exec: &'a Executor,
    /// The model's tensors.
    pub weights: &'a Weights,
    /// `quant_act` for the projections (the `fast` precision).
    pub quant_act: bool,
    /// The expert activation (`silu`, `gelu_tanh`, `gelu`).
    pub act: &'a str,
}

impl MoeStep<'_> {
    /// `out = act(g) · u` (or the clamped SwiGLU of `g`, `u`).
    fn activate(
        &self,
        g: &Data,
        u: &Data,
        clamp: Option<SwigluClamp>,
        out: &mut Data,
    ) -> Result<()> {
        if let Some(c) = clamp {
            return ops::clamped_swiglu(self.exec, g, u, (c.alpha, c.limit), out);
        }
        let fused = |d: &std::sync::Arc<dyn BaseDevice>| d.ops().contains_key("SiluMul");
        if self.act == "silu" && self.exec.devices().first().is_some_and(fused) {
            return ops::silu_mul(self.exec, g, u, out); // one launch on a GPU
        }
        match self.act {
            "silu" => ops::silu(self.exec, g, out)?,
            "gelu_tanh" => ops::gelu(self.exec, g, true, out)?,
            "gelu" => ops::gelu(self.exec, g, false, out)?,
            other => return Err(Error::Unsupported(format!("activation '{other}'"))),
        }
        ops::mul_to(self.exec, out, u)
    }

    /// The grouped product of the stacked projection `name` (see [`stacked_name`]).
    fn grouped(&self, x: &Data, name: &str, rows: MoeLinearRows, out: &mut Data) -> Result<()> {
        let w = self.weights.get(&format!("{name}.weight"))?;
        let b = self.weights.opt(&format!("{name}.bias"))?;
        ops::moe_linear(self.exec, x, (&w, b.as_deref()), rows, self.quant_act, out)
    }

    fn linear(&self, x: &Data, name: &str, out: &mut Data) -> Result<()> {
        let w = self.weights.get(&format!("{name}.weight"))?;
        let b = self.weights.opt(&format!("{name}.bias"))?;
        ops::linear(self.exec, x, &w, b.as_deref(), out, self.quant_act)
    }

    /// `out = down(act(gate(x)) · up(x))` for the gated MLP under `prefix` (the clamped SwiGLU
    /// when `clamp` is given).
    fn gated(
        &self,
        x: &Data,
        prefix: &str,
        (proj, clamp): ((&str, &str, &str), Option<SwigluClamp>),
        t: &mut [Data; 3],
        out: &mut Data,
    ) -> Result<()> {
        let [g, u, a] = t;
        self.linear(x, &format!("{prefix}.{}", proj.0), g)?;
        self.linear(x, &format!("{prefix}.{}", proj.1), u)?;
        self.activate(g, u, clamp, a)?;
        self.linear(a, &format!("{prefix}.{}", proj.2), out)
    }
}

/// Working tensors [`moe_ffn`] takes: router logits, route, dispatch, gate, up, activation,
/// expert outputs.
pub const MOE_BUFS: usize = 7;

/// The MoE FFN of one layer: `out` [s, hidden] = Σ over each token's chosen experts of
/// weight · expert(x), plus the shared experts. `layer` is the layer's tensor prefix (ending in
/// `.`); `x` [s, hidden] is the normed input, `scratch` [`MOE_BUFS`] working tensors (kept
/// across steps, so a recorded decode step finds them in place).
pub fn moe_ffn(
    st: &MoeStep,
    cfg: &MoeConfig,
    names: &MoeNames,
    layer: &str,
    (x, scratch): (&Data, &mut [Data]),
    out: &mut Data,
) -> Result<()> {
    let e = st.exec;
    let [logits, route, disp, t @ .., y] = scratch else {
        return Err(Error::invalid(format!(
            "moe_ffn needs {MOE_BUFS} working tensors"
        )));
    };
    let t: &mut [Data; 3] = t
        .try_into()
        .map_err(|_| Error::invalid(format!("moe_ffn needs {MOE_BUFS} working tensors")))?;
    st.linear(x, &format!("{layer}{}", names.router), logits)?;
    let bias = match names.score_bias {
        Some(b) => st.weights.opt(&format!("{layer}{b}"))?,
        None => None,
    };
    ops::moe_route(e, logits, bias.as_deref(), &cfg.route_params(), route)?;
    ops::moe_dispatch(e, route, cfg.experts, disp)?;
    if st.weights.has(&format!(
        "{}.weight",
        stacked_name(layer, names, names.proj.0)
    )) {
        grouped_experts(st, cfg, names, layer, x, disp, t, y)?;
    } else if st
        .exec
        .devices()
        .first()
        .is_some_and(|d| d.kind() == DeviceKind::Cpu)
    {
        host_experts(st, cfg, names, layer, x, disp, t, y)?;
    } else {
        each_expert(st, cfg, names, layer, x, disp, t, y)?;
    }
    ops::moe_combine(e, y, route, disp, out)?;
    if let Some(sh) = names.shared.filter(|_| cfg.shared_intermediate > 0) {
        let shared = (names.proj, cfg.swiglu_clamp);
        st.gated(x, &format!("{layer}{sh}"), shared, t, y)?;
        ops::add_to(e, out, y, 1.0)?;
    }
    Ok(())
}

/// The routed experts as three grouped products over the stacked weights (on the device of the
/// dispatch: nothing comes to the host): `out` [slots, hidden] in dispatch order.
#[allow(clippy::too_many_arguments)]
fn grouped_experts(
    st: &MoeStep,
    cfg: &MoeConfig,
    names: &MoeNames,
    layer: &str,
    x: &Data,
    disp: &Data,
    t: &mut [Data; 3],
    out: &mut Data,
) -> Result<()> {
    let [g, u, a] = t;
    let rows = |gather| MoeLinearRows {
        dispatch: disp,
        k: cfg.experts_per_token,
        gather,
    };
    let (gp, up, dp) = names.proj;
    st.grouped(x, &stacked_name(layer, names, gp), rows(true), g)?;
    st.grouped(x, &stacked_name(layer, names, up), rows(true), u)?;
    st.activate(g, u, cfg.swiglu_clamp, a)?;
    st.grouped(a, &stacked_name(layer, names, dp), rows(false), out)
}

/// The routed experts on the CPU: the dispatch offsets decide which experts' tensors are
/// fetched (in low-memory mode only those are read), then the gate, up and down products of all
/// of them run as three per-expert `MoeLinear`s over the tensors as loaded (mapped from the
/// file): `out` [slots, hidden] in dispatch order.
#[allow(clippy::too_many_arguments)]
fn host_experts(
    st: &MoeStep,
    cfg: &MoeConfig,
    names: &MoeNames,
    layer: &str,
    x: &Data,
    disp: &Data,
    t: &mut [Data; 3],
    out: &mut Data,
) -> Result<()> {
    let host = disp.to_owned_host()?;
    let offsets = host.as_i32()?.get(..=cfg.experts).ok_or_else(|| {
        Error::invalid(format!(
            "dispatch holds no offsets for {} experts",
            cfg.experts
        ))
    })?;
    let routed: Vec<usize> = (0..cfg.experts)
        .filter(|&e| offsets[e] != offsets[e + 1])
        .collect();
    let rows = |gather| MoeLinearRows {
        dispatch: disp,
        k: cfg.experts_per_token,
        gather,
    };
    let [g, u, a] = t;
    let (gp, up, dp) = names.proj;
    let prefix = format!("{layer}{}", names.experts);
    let each = |x: &Data, proj: &str, gather: bool, out: &mut Data| -> Result<()> {
        let ws = (routed.iter())
            .map(|&e| {
                let w = st.weights.get(&format!("{prefix}.{e}.{proj}.weight"))?;
                let b = st.weights.opt(&format!("{prefix}.{e}.{proj}.bias"))?;
                Ok((e, w, b))
            })
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<_> = ws
            .iter()
            .map(|(e, w, b)| (*e, &**w, b.as_deref()))
            .collect();
        let experts = (&refs[..], cfg.experts);
        ops::moe_linear_each(st.exec, x, experts, rows(gather), st.quant_act, out)
    };
    each(x, gp, true, g)?;
    each(x, up, true, u)?;
    st.activate(g, u, cfg.swiglu_clamp, a)?;
    each(a, dp, false, out)
}

/// The routed experts one by one, op by op (a GPU in low-memory mode or with experts that could
/// not be stacked; the dispatch comes to the host to decide which run):
/// `gathered` [slots, hidden] in dispatch order.
#[allow(clippy::too_many_arguments)]
fn each_expert(
    st: &MoeStep,
    cfg: &MoeConfig,
    names: &MoeNames,
    layer: &str,
    x: &Data,
    disp: &Data,
    t: &mut [Data; 3],
    gathered: &mut Data,
) -> Result<()> {
    let e = st.exec;
    // the grouping decides which experts run: it comes to the host (experts + 1 + s·k ints)
    let disp = disp.to_owned_host()?;
    let dv = disp.as_i32()?;
    let k = cfg.experts_per_token;
    let (offsets, slots) = dv.split_at(cfg.experts + 1);
    let hidden = x.dim(-1);
    *gathered = Data::zeros(DataType::F32, &[0, hidden])?;
    gathered.reserve(0, slots.len())?;
    let mut rows = Data::empty(DataType::F32);
    let mut y = Data::empty(DataType::F32);
    for (ex, w) in offsets.windows(2).enumerate() {
        let (a, b) = (w[0] as usize, w[1] as usize);
        if a == b {
            continue; // no token chose this expert: its weights are not touched
        }
        let tokens: Vec<i32> = slots[a..b].iter().map(|&s| s / k as i32).collect();
        let idx = Data::from_i32(&[tokens.len()], &tokens)?;
        ops::embedding(e, &idx, x, &mut rows)?; // the expert's token rows
        let prefix = format!("{layer}{}.{ex}", names.experts);
        st.gated(&rows, &prefix, (names.proj, cfg.swiglu_clamp), t, &mut y)?;
        ops::cat_direct(e, gathered, &y, 0)?;
    }
    Ok(())
}

/// The name (without `.weight` / `.bias`) of layer `layer`'s stacked projection `proj`.
pub fn stacked_name(layer: &str, names: &MoeNames, proj: &str) -> String {
    format!("{layer}{}.stacked.{proj}", names.experts)
}

/// Where `device` is not the CPU (whose per-expert kernels read the experts mapped from the
/// file), runs `MoeLinear`, and the weights are resident: stacks every MoE layer's
/// per-expert projections into [experts, n, k] tensors ([`stacked_name`], their biases into
/// [experts, n]) and drops the per-expert tensors, so [`moe_ffn`] runs the grouped products. A
/// layer whose experts differ in dtype or shape keeps its per-expert tensors. `layer_prefix`
/// gives layer `i`'s tensor prefix. Returns the number of stacked tensors.
pub fn stack_experts(
    weights: &mut Weights,
    (cfg, names): (&MoeConfig, &MoeNames),
    num_layers: usize,
    layer_prefix: &dyn Fn(usize) -> String,
    device: &dyn BaseDevice,
) -> Result<usize> {
    let cpu = device.kind() == crate::data::DeviceKind::Cpu;
    if cpu || weights.low_memory() || !device.ops().contains_key("MoeLinear") {
        return Ok(0);
    }
    let mut stacked = 0;
    for i in (0..num_layers).filter(|&i| cfg.is_moe(i)) {
        stacked += stack_layer_experts(weights, (cfg, names), &layer_prefix(i))?;
    }
    Ok(stacked)
}

/// Stacks the routed experts of the layer with tensor prefix `layer` as [`stack_experts`] does,
/// on any device; returns the number of stacked tensors (0 when the layer's experts are not
/// all resident with one dtype and shape per projection).
pub fn stack_layer_experts(
    weights: &mut Weights,
    (cfg, names): (&MoeConfig, &MoeNames),
    layer: &str,
) -> Result<usize> {
    let projs = [names.proj.0, names.proj.1, names.proj.2];
    let parts = |proj: &str, what: &str| -> Vec<String> {
        (0..cfg.experts)
            .map(|e| format!("{layer}{}.{e}.{proj}.{what}", names.experts))
            .collect()
    };
    if !projs
        .iter()
        .all(|p| stackable(weights, &parts(p, "weight"), 2))
    {
        return Ok(0);
    }
    let mut stacked = 0;
    for p in projs {
        let base = stacked_name(layer, names, p);
        stack(weights, &parts(p, "weight"), &format!("{base}.weight"))?;
        stacked += 1;
        let biases = parts(p, "bias");
        if stackable(weights, &biases, 1) {
            stack(weights, &biases, &format!("{base}.bias"))?;
            stacked += 1;
        }
    }
    Ok(stacked)
}

/// True when every tensor of `names` is resident on the host with one dtype and one shape of
/// `rank` dims.
fn stackable(weights: &Weights, names: &[String], rank: usize) -> bool {
    let first = names.first().and_then(|n| weights.resident(n));
    first.is_some_and(|f| {
        f.dims().len() == rank
            && !f.dtype().is_interleaved()
            && names.iter().all(|n| {
                weights.resident(n).is_some_and(|d| {
                    d.dtype() == f.dtype()
                        && d.dims() == f.dims()
                        && d.device() == crate::data::DeviceKind::Cpu
                })
            })
    })
}

/// Replaces the resident tensors `parts` (checked by [`stackable`]) by one tensor `name` of dims
/// [parts, ..their dims].
fn stack(weights: &mut Weights, parts: &[String], name: &str) -> Result<()> {
    let mut bytes = Vec::new();
    let mut dims = vec![parts.len()];
    let mut dtype = DataType::F32;
    for p in parts {
        let d = weights
            .take_resident(p)
            .ok_or_else(|| Error::Unsupported(format!("expert tensor '{p}' is not resident")))?;
        if bytes.is_empty() {
            dims.extend_from_slice(d.dims());
            dtype = d.dtype();
            bytes.reserve(d.bytes()?.len() * parts.len());
        }
        bytes.extend_from_slice(d.bytes()?);
        crate::interleave::release_view(&d);
    }
    let mut t = Data::from_bytes(dtype, &dims, &bytes)?;
    t.name = name.to_string();
    weights.set_resident(name, t);
    Ok(())
}
