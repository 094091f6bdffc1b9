//! The layer stack of a [`Model`] as one [`Step`]: the model describes a forward step once, as
//! op calls over named tensors in their plain forms (embedding, norms, one `Linear` per
//! projection, `Silu` then `MulTo`, separate rotations, the residual `AddTo`), and hands it to
//! its executor, whose first device decides how to run it (its passes fuse what its kernels
//! take together). Work the step does not describe op by op runs as stages: a tensor-parallel
//! rank's all-reduces, mixture-of-experts layers (they read their routing back) and latent
//! attention (through a direct KV store of its layer).

use super::arch::{Mlp, NormKind, Positions, Qkv};
use super::config::RopeStyle;
use super::precision::Precision;
use super::step_kv::{rotary_params, Qkv as QkvIds, StepAttention, StepKv, StepRotary};
use super::tp_group::RankTp;
use super::transformer::Model;
use super::weights::W;
use crate::data::{Data, DataType};
use crate::error::{Error, Result};
use crate::ops::{OutputCopy, RotaryStyle};
use crate::step::{Arg, Call, Step, TensorId};

/// The working tensors of one step: `x` the residual stream, `h` the normed input of the next
/// projection, `q`/`k`/`v`, `a` the attention output, `b` a projection's output before its
/// residual add, `g` the gate (or up) projection, and the temporaries `t0`..`t2`.
#[derive(Clone, Copy)]
struct Bufs {
    x: TensorId,
    h: TensorId,
    q: TensorId,
    k: TensorId,
    v: TensorId,
    a: TensorId,
    b: TensorId,
    g: TensorId,
    t0: TensorId,
    t1: TensorId,
    t2: TensorId,
    /// The embedding's scale and norm (then swapped with `x`), the learned positions and the
    /// post-norms write here: it only ever holds `[rows, hidden]` f32, so a recorded step
    /// never regrows a buffer.
    p: TensorId,
    /// The MoE stage's working tensors ([`super::moe::MOE_BUFS`]).
    moe: [TensorId; super::moe::MOE_BUFS],
}

/// The rotations of one step: the global one and Gemma-3's local one.
struct StepRopes {
    global: StepRotary,
    local: Option<StepRotary>,
}

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::Unsupported(msg.to_string())
}

/// The names of the MoE stage's working tensors in its arguments.
const MOE_SCRATCH: [&str; super::moe::MOE_BUFS] = ["m0", "m1", "m2", "m3", "m4", "m5", "m6"];

fn read(name: &'static str, t: TensorId) -> Arg {
    Arg {
        name,
        tensor: t,
        written: false,
    }
}

fn write(name: &'static str, t: TensorId) -> Arg {
    Arg {
        name,
        tensor: t,
        written: true,
    }
}

impl Model {
    /// The layer stack as one step, run on the executor: rows `ids` at positions `pos`, keys
    /// and values kept by `kv`, the working tensors in `sc` (the last two: the step's rope
    /// tables), the logits of `logit_rows` written into `logits`. `ids_on_device`: the ids were
    /// validated and uploaded by the caller (the embedding does not read them back). In
    /// low-memory mode each layer runs as soon as it is described, and the weights read from
    /// the file for it are dropped.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layers<'a>(
        &'a self,
        ids: &'a Data,
        pos: &'a Data,
        logit_rows: &[i32],
        kv: &mut dyn StepKv<'a>,
        sc: &'a mut [Data],
        logits: &'a mut Data,
        ids_on_device: bool,
    ) -> Result<()> {
        let [x, h, q, k, v, a, b, g, t0, t1, t2, p, moe @ .., cos, sin] = sc else {
            return Err(Error::invalid("scratch"));
        };
        let mut st = Step::new();
        let mut moe_ids = Vec::with_capacity(super::moe::MOE_BUFS);
        for d in moe.iter_mut() {
            moe_ids.push(st.mutable(d));
        }
        let moe: [TensorId; super::moe::MOE_BUFS] = moe_ids
            .try_into()
            .map_err(|_| Error::invalid("scratch: MoE working tensors"))?;
        let mut bufs = Bufs {
            x: st.mutable(x),
            h: st.mutable(h),
            q: st.mutable(q),
            k: st.mutable(k),
            v: st.mutable(v),
            a: st.mutable(a),
            b: st.mutable(b),
            g: st.mutable(g),
            t0: st.mutable(t0),
            t1: st.mutable(t1),
            t2: st.mutable(t2),
            p: st.mutable(p),
            moe,
        };
        let tables = (st.mutable(cos), st.mutable(sin));
        let rows = ids.dim(0);
        let ids = st.input(ids);
        let pos_t = st.input(pos);
        let logits = st.mutable(logits);
        self.embed(&mut st, (ids, ids_on_device), (pos, pos_t), &mut bufs)?;
        let ropes = self.step_rope(&mut st, pos_t, tables)?;
        for i in 0..self.config.num_layers {
            self.attention_block(&mut st, i, (&ropes, pos), kv, &mut bufs, rows)?;
            self.ffn_block(&mut st, i, &mut bufs, rows)?;
            if self.weights.low_memory() {
                self.exec.run_step(&mut st)?;
                st.release_owned();
            }
        }
        self.head(&mut st, logit_rows, &mut bufs, logits, rows)?;
        self.exec.run_step(&mut st)
    }

    /// The step tensor of weight `name`.
    fn weight<'a>(&'a self, st: &mut Step<'a>, name: &str) -> Result<TensorId> {
        Ok(match self.weights.get(name)? {
            W::Borrowed(d) => st.input(d),
            W::Owned(d) => st.own(d),
        })
    }

    /// The step tensor of weight `name`, when the model has it.
    fn weight_opt<'a>(&'a self, st: &mut Step<'a>, name: &str) -> Result<Option<TensorId>> {
        Ok(match self.weights.opt(name)? {
            Some(W::Borrowed(d)) => Some(st.input(d)),
            Some(W::Owned(d)) => Some(st.own(d)),
            None => None,
        })
    }

    /// Sums `t` over the ranks (a stage) when this model is a rank and `on` holds.
    fn all_reduce_stage<'a>(
        &'a self,
        st: &mut Step<'a>,
        t: TensorId,
        on: impl Fn(&RankTp) -> bool,
    ) {
        if let Some(tp) = self.tp.as_ref().filter(|tp| on(tp)) {
            st.stage(
                "all-reduce",
                vec![write("input", t)],
                Box::new(move |d| {
                    tp.comm
                        .all_reduce_sum(d.require_mut("all-reduce", "input")?)
                }),
            );
        }
    }

    /// `out = norm(x)` with the layer's weight `name` (`rows` rows).
    fn norm<'a>(
        &'a self,
        st: &mut Step<'a>,
        x: TensorId,
        name: &str,
        out: TensorId,
        rows: usize,
    ) -> Result<()> {
        let eps = self.config.norm_eps;
        let w = self.weight(st, &format!("{name}.weight"))?;
        let c = match self.spec.norm {
            NormKind::Rms | NormKind::RmsPlusOne => Call::new("RMSNorm")
                .input("input", x)
                .input("weight", w)
                .output("output", out)
                .float("eps", eps)
                .int("quantize_output", 0),
            NormKind::Layer => {
                let b = self.weight(st, &format!("{name}.bias"))?;
                Call::new("LayerNorm")
                    .input("input", x)
                    .input("gamma", w)
                    .input("beta", b)
                    .output("output", out)
                    .float("eps", eps)
            }
        };
        st.push(c.rows(rows));
        Ok(())
    }

    /// `out = x·Wᵀ + b` of projection `name` over `rows` rows.
    fn linear<'a>(
        &'a self,
        st: &mut Step<'a>,
        x: TensorId,
        name: &str,
        out: TensorId,
        rows: usize,
    ) -> Result<()> {
        self.linear_half(st, x, name, out, (rows, 0))
    }

    /// [`Self::linear`] with the `half_output` form `half` (see [`Self::half_partial`]).
    fn linear_half<'a>(
        &'a self,
        st: &mut Step<'a>,
        x: TensorId,
        name: &str,
        out: TensorId,
        (rows, half): (usize, i32),
    ) -> Result<()> {
        let w = self.weight(st, &format!("{name}.weight"))?;
        let b = self.weight_opt(st, &format!("{name}.bias"))?;
        let mut c = self.linear_call(x, w, b, out, rows);
        if half != 0 {
            c = c.int("half_output", half);
        }
        st.push(c);
        Ok(())
    }

    fn linear_call(
        &self,
        x: TensorId,
        w: TensorId,
        b: Option<TensorId>,
        out: TensorId,
        rows: usize,
    ) -> Call {
        Call::new("Linear")
            .input("input", x)
            .input("weight", w)
            .input_opt("bias", b)
            .output("output", out)
            .int("quant_act", (self.precision == Precision::Fast) as i32)
            .rows(rows)
    }

    /// The `half_output` form (f16 / bf16, 0 for none) of a row-parallel projection `name` whose
    /// partial sums are all-reduced (`reduced`) and then only added into the residual: in
    /// `fast` precision a tensor-core product writes them in its half form, and the
    /// all-reduce moves half the bytes. `exact` keeps them f32.
    fn half_partial(&self, reduced: bool, name: &str) -> i32 {
        let allowed = self.tp.as_ref().is_some_and(|tp| tp.half_partials);
        if !reduced || !allowed || self.precision != Precision::Fast {
            return 0;
        }
        // a weight fetched per step (low memory) is not read just for its dtype: f32 sums
        let Some(w) = self.weights.resident(&format!("{name}.weight")) else {
            return 0;
        };
        let k = w.dims().get(1).copied().unwrap_or(0);
        match OutputCopy::tensor_core_form(w.dtype(), k) {
            c @ (OutputCopy::F16 | OutputCopy::Bf16) => c.param(),
            _ => 0,
        }
    }

    /// `out = act(x)` of the model's activation over `rows` rows.
    fn act(&self, st: &mut Step, x: TensorId, out: TensorId, rows: usize) -> Result<()> {
        let c = match self.config.hidden_act.as_str() {
            "silu" => Call::new("Silu"),
            "gelu_tanh" => Call::new("Gelu").int("approx", 1),
            "gelu" => Call::new("Gelu").int("approx", 0),
            a => return Err(bad(format!("activation '{a}'"))),
        };
        st.push(c.input("input", x).output("output", out).rows(rows));
        Ok(())
    }

    /// `x += y`.
    fn add_to(st: &mut Step, x: TensorId, y: TensorId) {
        st.push(
            Call::new("AddTo")
                .output("input0", x)
                .input("input1", y)
                .float("alpha", 1.0),
        );
    }

    /// The step's embedding into `x`: token rows, then the learned positions, the embedding
    /// scale and norm where the architecture has them.
    fn embed<'a>(
        &'a self,
        st: &mut Step<'a>,
        (ids, on_device): (TensorId, bool),
        (pos, pos_t): (&Data, TensorId),
        bufs: &mut Bufs,
    ) -> Result<()> {
        let c = &self.config;
        let w = self.weight(st, &format!("{}.weight", self.spec.embed))?;
        let mut e = Call::new("Embedding")
            .input("input", ids)
            .input("weight", w)
            .output("output", bufs.x);
        if on_device {
            e = e.int("checked", 1);
        }
        st.push(e);
        self.all_reduce_stage(st, bufs.x, |_| true); // vocab-parallel embedding
        if self.spec.embed_scale {
            st.push(
                Call::new("Mul")
                    .input("input", bufs.x)
                    .output("output", bufs.p)
                    .float("v", (c.hidden_size as f32).sqrt()),
            );
            std::mem::swap(&mut bufs.x, &mut bufs.p);
        }
        if let Positions::Learned(wpe) = self.spec.positions {
            let w = self.weight(st, &format!("{wpe}.weight"))?;
            let n = st.tensor(w).map_or(0, |d| d.dim(0));
            let max_pos = pos.as_i32()?.iter().copied().max().unwrap_or(0) as usize;
            if max_pos >= n {
                return Err(Error::ContextFull(format!(
                    "position {max_pos} beyond the {n} learned positions"
                )));
            }
            st.push(
                Call::new("Embedding")
                    .input("input", pos_t)
                    .input("weight", w)
                    .output("output", bufs.p),
            );
            Self::add_to(st, bufs.x, bufs.p);
        }
        if let Some(n) = self.spec.embed_norm {
            let rows = st.tensor(ids).map_or(0, |d| d.dim(0));
            self.norm(st, bufs.x, n, bufs.p, rows)?;
            std::mem::swap(&mut bufs.x, &mut bufs.p);
        }
        Ok(())
    }

    /// The step's rotations: the global one, whose angles are formed once for all layers into
    /// the `tables` where the device keeps tables (or were formed by the caller for a
    /// length-dependent scaling), and Gemma-3's local one for the sliding-window layers.
    fn step_rope<'a>(
        &'a self,
        st: &mut Step<'a>,
        pos: TensorId,
        (cos, sin): (TensorId, TensorId),
    ) -> Result<StepRopes> {
        let c = &self.config;
        let style = match c.rope_style {
            RopeStyle::Neox => RotaryStyle::Neox,
            RopeStyle::Interleaved => RotaryStyle::Interleaved,
        };
        let mut rotary = |r: &'a super::rope::LayerRope| StepRotary {
            positions: pos,
            inv_freq: r.inv_freq.as_ref().map(|f| st.input(f)),
            rotary_dim: c.rope_dim,
            style,
            theta: r.theta,
            tables: None,
        };
        let mut global = rotary(&self.rope.global);
        let local = self.rope.local.as_ref().map(rotary);
        if self.rope.length_dependent() {
            global.tables = Some((cos, sin));
        } else if self.rope_tables() && self.spec.positions == Positions::Rope {
            st.push(
                Call::new("RotaryTables")
                    .input("positions", pos)
                    .input_opt("inv_freq", global.inv_freq)
                    .output("cos", cos)
                    .output("sin", sin)
                    .float("theta", global.theta)
                    .int("rotary_dim", global.rotary_dim as i32),
            );
            global.tables = Some((cos, sin));
        }
        Ok(StepRopes { global, local })
    }

    /// The attention scale: `query_pre_attn_scalar`, else the head size.
    fn attention_scale(&self) -> f32 {
        let c = &self.config;
        if c.query_pre_attn_scalar > 0.0 {
            1.0 / c.query_pre_attn_scalar.sqrt()
        } else {
            1.0 / (c.head_dim as f32).sqrt()
        }
    }

    /// Layer `i`'s q, k, v [rows, heads, head dim] from the normed input `h`, in the
    /// architecture's projection form.
    fn qkv<'a>(&'a self, st: &mut Step<'a>, i: usize, bufs: &Bufs, s: usize) -> Result<()> {
        let c = &self.config;
        let Bufs { h, q, k, v, t0, .. } = *bufs;
        let ln = |n: &str| format!("{}{i}.{n}", self.spec.layer_prefix);
        let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let split = |st: &mut Step, x: TensorId, axis: i32, (a, b): (usize, usize), out| {
            st.push(
                Call::new("Split")
                    .input("input", x)
                    .output("output", out)
                    .int("axis", axis)
                    .int("start", a as i32)
                    .int("end", b as i32),
            )
        };
        match self.spec.qkv {
            Qkv::Separate(qn, kn, vn) => {
                self.linear(st, h, &ln(qn), q, s)?;
                self.linear(st, h, &ln(kn), k, s)?;
                self.linear(st, h, &ln(vn), v, s)?;
            }
            Qkv::Fused(n) => {
                let (qd, kd) = (nh * hd, nkv * hd);
                let w = self.weight(st, &format!("{}.weight", ln(n)))?;
                let outs = st.tensor(w).map_or(0, |d| d.dim(0));
                if outs != qd + 2 * kd {
                    return Err(bad(format!(
                        "{}: fused qkv has {outs} outputs, expected {}",
                        ln(n),
                        qd + 2 * kd
                    )));
                }
                let b = self.weight_opt(st, &format!("{}.bias", ln(n)))?;
                st.push(self.linear_call(h, w, b, t0, s));
                split(st, t0, 1, (0, qd), q);
                split(st, t0, 1, (qd, qd + kd), k);
                split(st, t0, 1, (qd + kd, qd + 2 * kd), v);
            }
            Qkv::FusedPerHead(n) => {
                if nh != nkv {
                    return Err(bad("per-head fused qkv needs as many KV heads as heads"));
                }
                // q, k, v straight out of [rows, heads, 3, head dim] (no permuted copy in t1,
                // which the MLP activation reuses at another size)
                self.linear(st, h, &ln(n), t0, s)?;
                st.reshape(t0, &[s, nh, 3, hd]);
                split(st, t0, 2, (0, 1), q);
                split(st, t0, 2, (1, 2), k);
                split(st, t0, 2, (2, 3), v);
            }
            Qkv::Latent(_) => return Err(bad("latent attention has no separate q/k/v heads")),
        }
        st.reshape(q, &[s, nh, hd]);
        st.reshape(k, &[s, nkv, hd]);
        st.reshape(v, &[s, nkv, hd]);
        Ok(())
    }

    /// Layer `i`'s attention: norm, q/k/v, the layer's query scale and q/k norms, rotation,
    /// attention through `kv`, o projection, and the residual added into `x`.
    fn attention_block<'a>(
        &'a self,
        st: &mut Step<'a>,
        i: usize,
        (ropes, pos): (&StepRopes, &'a Data),
        kv: &mut dyn StepKv<'a>,
        bufs: &mut Bufs,
        s: usize,
    ) -> Result<()> {
        let c = &self.config;
        let ln = |n: &str| format!("{}{i}.{n}", self.spec.layer_prefix);
        self.norm(st, bufs.x, &ln(self.spec.attn_norm), bufs.h, s)?;
        if let (Qkv::Latent(names), Some(m)) = (self.spec.qkv, &c.mla) {
            self.latent_stage(st, i, (names, m), (&ropes.global, pos), kv, bufs)?;
            return self.attention_out(st, i, bufs, s);
        }
        self.qkv(st, i, bufs, s)?;
        let (nh, hd) = (c.num_heads, c.head_dim);
        let layer_rope = self.rope.layer(c, i);
        let rope = match &ropes.local {
            Some(r) if self.rope.is_local(c, i) => r,
            _ => &ropes.global,
        };
        if let Some((qn, kn)) = self.spec.qk_norm {
            // q's norm through the attention output `a` (q's size; free until the attention)
            self.norm(st, bufs.q, &ln(qn), bufs.a, s * nh)?;
            std::mem::swap(&mut bufs.q, &mut bufs.a);
            // k's norm through a buffer of its own size: a recorded step never regrows one
            self.norm(st, bufs.k, &ln(kn), bufs.t2, s * c.num_kv_heads)?;
            std::mem::swap(&mut bufs.k, &mut bufs.t2);
        }
        if let Some(m) = &layer_rope.q_scale {
            // the attention factor on the rotated dims only (after the norm)
            let m = st.input(m);
            st.push(
                Call::new("MulTo")
                    .output("input0", bufs.q)
                    .input("input1", m),
            );
        }
        if self.spec.positions == Positions::Rope {
            for t in [bufs.q, bufs.k] {
                st.push(rope.args(Call::new("RotaryEmbedding").output("input", t)));
            }
        }
        let sliding = c.sliding_layers.get(i).copied().unwrap_or(false);
        let sinks = match self.spec.attn_sinks {
            Some(n) => Some(self.weight(st, &ln(n))?),
            None => None,
        };
        let alibi = self.alibi.as_ref().map(|a| st.input(a));
        let ap = StepAttention {
            scale: self.attention_scale() * layer_rope.score_scale,
            softcap: c.attn_logit_softcap,
            sliding_window: if sliding { c.sliding_window } else { 0 },
            alibi,
            sinks,
            fast: self.precision == Precision::Fast,
            rows: s,
        };
        let x = QkvIds {
            q: bufs.q,
            k: bufs.k,
            v: bufs.v,
        };
        kv.attend(st, i, x, &ap, bufs.a)?;
        st.reshape(bufs.a, &[s, nh * hd]);
        self.attention_out(st, i, bufs, s)
    }

    /// Layer `i`'s o projection of the attention output `a`, its post-norm where the
    /// architecture has one, and the residual added into `x`.
    fn attention_out<'a>(
        &'a self,
        st: &mut Step<'a>,
        i: usize,
        bufs: &mut Bufs,
        s: usize,
    ) -> Result<()> {
        let ln = |n: &str| format!("{}{i}.{n}", self.spec.layer_prefix);
        let post = self.spec.post_attn_norm;
        let reduced = self.tp.as_ref().is_some_and(|tp| tp.reduce_attention);
        let half = self.half_partial(reduced && post.is_none(), &ln(self.spec.o_proj));
        self.linear_half(st, bufs.a, &ln(self.spec.o_proj), bufs.b, (s, half))?;
        self.reduced_residual(st, (i, post), bufs, s, |tp| tp.reduce_attention)
    }

    /// Layer `i`'s latent attention ([`super::mla`]) of the normed input `h` into `a`, as a
    /// stage over a direct store of the layer's cache.
    fn latent_stage<'a>(
        &'a self,
        st: &mut Step<'a>,
        i: usize,
        (names, m): (super::mla::MlaNames, &'a super::mla::MlaConfig),
        (rope, pos): (&StepRotary, &'a Data),
        kv: &mut dyn StepKv<'a>,
        bufs: &Bufs,
    ) -> Result<()> {
        let mut store = kv.latent_layer(i)?;
        let mut args = vec![read("input", bufs.h), write("output", bufs.a)];
        if let Some((cos, sin)) = rope.tables {
            args.extend([read("cos", cos), read("sin", sin)]);
        }
        let r = *rope;
        let inv_freq = self.rope.global.inv_freq.as_ref();
        let run = move |d: &mut crate::device::DataDict| {
            let ([h, cos, sin], a) = d.io("latent attention", ["input", "cos", "sin"], "output")?;
            let h = h.ok_or_else(|| Error::invalid("latent attention: no input"))?;
            let rope = rotary_params(&r, pos, inv_freq, cos.zip(sin));
            self.latent_attention(i, &names, m, &rope, store.as_mut(), h, a)
        };
        st.stage("latent attention", args, Box::new(run));
        Ok(())
    }

    /// Layer `i`'s MLP: norm, the architecture's gate/up form and activation, down projection,
    /// and the residual added into `x`.
    fn ffn_block<'a>(
        &'a self,
        st: &mut Step<'a>,
        i: usize,
        bufs: &mut Bufs,
        s: usize,
    ) -> Result<()> {
        let c = &self.config;
        let ln = |n: &str| format!("{}{i}.{n}", self.spec.layer_prefix);
        self.norm(st, bufs.x, &ln(self.spec.ffn_norm), bufs.h, s)?;
        let Bufs {
            h,
            b,
            g,
            t0,
            t1,
            moe,
            ..
        } = *bufs;
        if let Some((m, names)) = self.moe_layer(i) {
            let prefix = ln("");
            let run = move |d: &mut crate::device::DataDict| {
                // the working tensors are moved out for the call and back after it
                let mut scratch = Vec::with_capacity(MOE_SCRATCH.len());
                for n in MOE_SCRATCH {
                    let t = d.require_mut("moe", n)?;
                    scratch.push(std::mem::replace(t, Data::empty(DataType::F32)));
                }
                let r = {
                    let ([h], b) = d.io("moe", ["input"], "output")?;
                    let h = h.ok_or_else(|| Error::invalid("moe: no input"))?;
                    super::moe::moe_ffn(&self.moe_step(), m, &names, &prefix, (h, &mut scratch), b)
                };
                for (n, t) in MOE_SCRATCH.iter().zip(scratch) {
                    *d.require_mut("moe", n)? = t;
                }
                r
            };
            let mut args = vec![read("input", h), write("output", b)];
            args.extend(MOE_SCRATCH.iter().zip(moe).map(|(n, t)| write(n, t)));
            st.stage("moe", args, Box::new(run));
            return self.residual(st, i, self.spec.post_ffn_norm, bufs, s);
        }
        let down = match self.spec.mlp {
            Mlp::Gated(gn, un, dn) => {
                self.linear(st, h, &ln(gn), g, s)?;
                self.linear(st, h, &ln(un), t0, s)?;
                self.act(st, g, t1, s)?;
                st.push(Call::new("MulTo").output("input0", t1).input("input1", t0));
                dn
            }
            Mlp::GatedFused(gun, dn) => {
                self.linear(st, h, &ln(gun), g, s)?;
                let op = match c.hidden_act.as_str() {
                    "silu" => Call::new("Swiglu"),
                    "gelu_tanh" => Call::new("GeluGated").int("approx", 1),
                    "gelu" => Call::new("GeluGated").int("approx", 0),
                    other => return Err(bad(format!("activation '{other}'"))),
                };
                st.push(op.input("input", g).output("output", t1));
                dn
            }
            Mlp::Plain(un, dn) => {
                self.linear(st, h, &ln(un), g, s)?;
                self.act(st, g, t1, s)?;
                dn
            }
        };
        let post = self.spec.post_ffn_norm;
        let half = self.half_partial(self.tp.is_some() && post.is_none(), &ln(down));
        self.linear_half(st, t1, &ln(down), b, (s, half))?;
        // row-parallel down projection
        self.reduced_residual(st, (i, post), bufs, s, |_| true)
    }

    /// `x += post(Σ_ranks b)` (the sum where this model is a rank and `on` holds): one
    /// `AllReduceAdd` where the rank's device sums inside its operators and there is no
    /// post-norm, else an all-reduce stage and [`Self::residual`].
    fn reduced_residual<'a>(
        &'a self,
        st: &mut Step<'a>,
        (i, post): (usize, Option<&str>),
        bufs: &mut Bufs,
        s: usize,
        on: impl Fn(&RankTp) -> bool,
    ) -> Result<()> {
        let in_ops = self.tp.as_ref().filter(|tp| on(tp));
        if post.is_none() && in_ops.is_some_and(|tp| tp.comm.reduces_in_ops()) {
            st.push(
                Call::new("AllReduceAdd")
                    .output("input0", bufs.x)
                    .input("input1", bufs.b),
            );
            return Ok(());
        }
        self.all_reduce_stage(st, bufs.b, on);
        self.residual(st, i, post, bufs, s)
    }

    /// `x += post(b)`: layer `i`'s norm `post` where the architecture has one (its output in
    /// `p`, so `b` keeps the products' size and dtype from step to step).
    fn residual<'a>(
        &'a self,
        st: &mut Step<'a>,
        i: usize,
        post: Option<&str>,
        bufs: &mut Bufs,
        s: usize,
    ) -> Result<()> {
        let mut add = bufs.b;
        if let Some(n) = post {
            let name = format!("{}{i}.{n}", self.spec.layer_prefix);
            self.norm(st, bufs.b, &name, bufs.p, s)?;
            add = bufs.p;
        }
        Self::add_to(st, bufs.x, add);
        Ok(())
    }

    /// The final norm and LM head over the rows `logit_rows` of `x` into `logits`, with the
    /// logit soft-capping where the architecture has it.
    fn head<'a>(
        &'a self,
        st: &mut Step<'a>,
        logit_rows: &[i32],
        bufs: &mut Bufs,
        logits: TensorId,
        s: usize,
    ) -> Result<()> {
        let c = &self.config;
        let n = logit_rows.len();
        let rows = if n == s && logit_rows.iter().enumerate().all(|(i, &r)| r as usize == i) {
            bufs.x
        } else {
            let idx = st.own(Data::from_i32(&[n], logit_rows)?);
            st.push(
                Call::new("Embedding")
                    .input("input", idx)
                    .input("weight", bufs.x)
                    .output("output", bufs.t1),
            ); // row gather
            bufs.t1
        };
        self.norm(st, rows, self.spec.final_norm, bufs.h, n)?;
        let head =
            if !c.tie_embeddings && self.weights.has(&format!("{}.weight", self.spec.lm_head)) {
                self.spec.lm_head
            } else {
                self.spec.embed
            };
        let w = self.weight(st, &format!("{head}.weight"))?;
        if c.final_logit_softcap > 0.0 {
            st.push(self.linear_call(bufs.h, w, None, bufs.t2, n));
            st.push(
                Call::new("SoftCap")
                    .input("input", bufs.t2)
                    .output("output", logits)
                    .float("cap", c.final_logit_softcap),
            );
        } else {
            st.push(self.linear_call(bufs.h, w, None, logits, n));
        }
        Ok(())
    }
}
