//! Mixture-of-experts layers: their configuration ([`MoeConfig`], part of `ModelConfig`), the
//! tensor names of an architecture's experts ([`MoeNames`], part of its `ArchSpec`), and the FFN
//! stage that runs them ([`moe_ffn`]): router `Linear` → `MoeRoute` → `MoeDispatch` → per
//! active expert a row gather (`Embedding` over the step's rows), the gate/up `Linear`s, the
//! activation (or GPT-OSS's `ClampedSwiglu`), the down `Linear` → `MoeCombine`, plus the shared
//! experts. Each active expert's
//! weights are read once per step for all its tokens; in low-memory mode only the experts a step
//! routes to are read from the file.

use super::weights::Weights;
use crate::data::{Data, DataType};
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::ops::{self, MoeRouteParams};

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
        if let Some(c) = clamp {
            ops::clamped_swiglu(self.exec, g, u, (c.alpha, c.limit), a)?;
            return self.linear(a, &format!("{prefix}.{}", proj.2), out);
        }
        match self.act {
            "silu" => ops::silu(self.exec, g, a)?,
            "gelu_tanh" => ops::gelu(self.exec, g, true, a)?,
            "gelu" => ops::gelu(self.exec, g, false, a)?,
            other => return Err(Error::Unsupported(format!("activation '{other}'"))),
        }
        ops::mul_to(self.exec, a, u)?;
        self.linear(a, &format!("{prefix}.{}", proj.2), out)
    }
}

/// The MoE FFN of one layer: `out` [s, hidden] = Σ over each token's chosen experts of
/// weight · expert(x), plus the shared experts. `layer` is the layer's tensor prefix (ending in
/// `.`); `x` [s, hidden] is the normed input.
pub fn moe_ffn(
    st: &MoeStep,
    cfg: &MoeConfig,
    names: &MoeNames,
    layer: &str,
    x: &Data,
    out: &mut Data,
) -> Result<()> {
    let e = st.exec;
    let mut logits = Data::empty(DataType::F32);
    st.linear(x, &format!("{layer}{}", names.router), &mut logits)?;
    let bias = match names.score_bias {
        Some(b) => st.weights.opt(&format!("{layer}{b}"))?,
        None => None,
    };
    let mut route = Data::empty(DataType::F32);
    ops::moe_route(e, &logits, bias.as_deref(), &cfg.route_params(), &mut route)?;
    let mut disp = Data::empty(DataType::I32);
    ops::moe_dispatch(e, &route, cfg.experts, &mut disp)?;
    // the grouping decides which experts run: it comes to the host (experts + 1 + s·k ints)
    let disp = disp.to_owned_host()?;
    let dv = disp.as_i32()?;
    let k = cfg.experts_per_token;
    let (offsets, slots) = dv.split_at(cfg.experts + 1);
    let hidden = x.dim(-1);
    let mut gathered = Data::zeros(DataType::F32, &[0, hidden])?;
    gathered.reserve(0, slots.len())?;
    let mut rows = Data::empty(DataType::F32);
    let mut y = Data::empty(DataType::F32);
    let mut t = [
        Data::empty(DataType::F32),
        Data::empty(DataType::F32),
        Data::empty(DataType::F32),
    ];
    for (ex, w) in offsets.windows(2).enumerate() {
        let (a, b) = (w[0] as usize, w[1] as usize);
        if a == b {
            continue; // no token chose this expert: its weights are not touched
        }
        let tokens: Vec<i32> = slots[a..b].iter().map(|&s| s / k as i32).collect();
        let idx = Data::from_i32(&[tokens.len()], &tokens)?;
        ops::embedding(e, &idx, x, &mut rows)?; // the expert's token rows
        let prefix = format!("{layer}{}.{ex}", names.experts);
        st.gated(
            &rows,
            &prefix,
            (names.proj, cfg.swiglu_clamp),
            &mut t,
            &mut y,
        )?;
        ops::cat_direct(e, &mut gathered, &y, 0)?;
    }
    ops::moe_combine(e, &gathered, &route, &disp, out)?;
    if let Some(sh) = names.shared.filter(|_| cfg.shared_intermediate > 0) {
        let shared = (names.proj, cfg.swiglu_clamp);
        st.gated(x, &format!("{layer}{sh}"), shared, &mut t, &mut y)?;
        ops::add_to(e, out, &y, 1.0)?;
    }
    Ok(())
}
