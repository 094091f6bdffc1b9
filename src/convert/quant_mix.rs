//! llama.cpp's quantization mixes (the `llama-quantize` file types Q4_K_M, Q5_K_M, Q6_K, Q8_0 and
//! Q4_0) applied to `.flm` tensors: each tensor's role from the architecture table, the per-role
//! type (the output and a tied token embedding get Q6_K; in Q4_K_M/Q5_K_M, attn_v and ffn_down
//! get Q6_K in the layers llama.cpp's `use_more_bits` picks), and the fallback for rows that do
//! not fit a type's block (Q4_K → Q5_0, Q5_K and Q6_K → Q8_0, then F16 when a row is not a
//! multiple of 32). llama.cpp falls Q5_K back to Q5_1, which `.flm` does not have; Q8_0 is the
//! next type at least as precise.
//!
//! As in llama.cpp (whose quantizer visits tensors ordered by layer, then name), attn_v and
//! ffn_down tensors are numbered in (layer, name) order — the layer index in a dense model —
//! except that ffn_down in MoE models uses the layer index. Norms, biases, 1-D tensors, MoE
//! routers and learned position embeddings stay F32.

use crate::data::DataType;
use crate::error::{Error, Result};
use crate::model::arch::{ArchSpec, Mlp, Positions, Qkv};

/// True for tensors that always stay F32 (norm weights, biases, 1-D tensors).
pub fn always_f32(name: &str, dims: &[usize]) -> bool {
    dims.len() <= 1
        || name.ends_with(".bias")
        || name.contains("norm")
        || name.contains(".ln_")
        || name.contains("layernorm")
}

/// A `llama-quantize` file type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantMix {
    /// Mostly Q4_K; Q6_K for the output and about half of attn_v/ffn_down.
    Q4KM,
    /// Mostly Q5_K; Q6_K for the output and about half of attn_v/ffn_down.
    Q5KM,
    /// Q6_K everywhere.
    Q6K,
    /// Q8_0 everywhere.
    Q8_0,
    /// Mostly Q4_0; Q6_K for the output.
    Q4_0,
}

impl QuantMix {
    /// The `--dtype` name.
    pub fn name(self) -> &'static str {
        match self {
            QuantMix::Q4KM => "q4_k_m",
            QuantMix::Q5KM => "q5_k_m",
            QuantMix::Q6K => "q6_k",
            QuantMix::Q8_0 => "q8_0",
            QuantMix::Q4_0 => "q4_0",
        }
    }

    /// The type of tensors without a rule of their own.
    fn default_type(self) -> DataType {
        match self {
            QuantMix::Q4KM => DataType::Q4K,
            QuantMix::Q5KM => DataType::Q5K,
            QuantMix::Q6K => DataType::Q6K,
            QuantMix::Q8_0 => DataType::Q8_0,
            QuantMix::Q4_0 => DataType::Q4_0,
        }
    }

    fn more_bits_mix(self) -> bool {
        matches!(self, QuantMix::Q4KM | QuantMix::Q5KM)
    }
}

/// What a tensor is, for the mix rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The LM head.
    Output,
    /// The token embedding.
    TokenEmbd,
    /// A value projection, or a fused projection that contains one, with its layer.
    AttnV(usize),
    /// A key projection.
    AttnK,
    /// The attention output projection.
    AttnOutput,
    /// A down projection (dense, expert or shared expert), with its layer.
    FfnDown(usize),
    /// Any other weight: the mix's default type.
    Plain,
    /// Not quantized: stays F32.
    Float,
}

/// The role of `.flm` tensor `name` of `dims` under the architecture `spec`.
pub fn role(spec: &ArchSpec, name: &str, dims: &[usize]) -> Role {
    if always_f32(name, dims) {
        return Role::Float;
    }
    let Some(base) = name.strip_suffix(".weight") else {
        return Role::Float;
    };
    if base == spec.lm_head {
        return Role::Output;
    }
    if base == spec.embed {
        return Role::TokenEmbd;
    }
    if matches!(spec.positions, Positions::Learned(p) if p == base) {
        return Role::Float;
    }
    let Some((layer, part)) = base
        .strip_prefix(spec.layer_prefix)
        .and_then(|r| r.split_once('.'))
        .and_then(|(l, p)| Some((l.parse::<usize>().ok()?, p)))
    else {
        return Role::Plain;
    };
    layer_role(spec, layer, part)
}

/// The role of `part` (a layer tensor's name after `layer_prefix` + index + `.`, no `.weight`).
fn layer_role(spec: &ArchSpec, layer: usize, part: &str) -> Role {
    let down = match spec.mlp {
        Mlp::Gated(_, _, d) | Mlp::GatedFused(_, d) | Mlp::Plain(_, d) => d,
    };
    let v_like = match spec.qkv {
        Qkv::Separate(_, _, v) => part == v,
        Qkv::Fused(f) | Qkv::FusedPerHead(f) => part == f,
        Qkv::Latent(mla) => part == mla.kv_b,
    };
    if v_like {
        return Role::AttnV(layer);
    }
    if matches!(spec.qkv, Qkv::Separate(_, k, _) if part == k) {
        return Role::AttnK;
    }
    if part == spec.o_proj {
        return Role::AttnOutput;
    }
    if part == down {
        return Role::FfnDown(layer);
    }
    if let Some(moe) = &spec.moe {
        if part == moe.router {
            return Role::Float;
        }
        let down_of = |prefix: &str| {
            part.strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('.'))
                .is_some_and(|r| r.ends_with(moe.proj.2))
        };
        if down_of(moe.experts) || moe.shared.is_some_and(down_of) {
            return Role::FfnDown(layer);
        }
    }
    Role::Plain
}

/// llama.cpp's choice of layers that get more bits: the first and last eighth, and every third
/// layer in between.
fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8).rem_euclid(3) == 2
}

/// The type `want` falls back to for rows of `cols` values.
fn fallback(want: DataType, cols: usize) -> DataType {
    let fits = |t: DataType| cols > 0 && cols.is_multiple_of(t.block_elems());
    let t = if fits(want) {
        want
    } else {
        match want {
            DataType::Q4K => DataType::Q5_0,
            DataType::Q5K | DataType::Q6K => DataType::Q8_0,
            other => other,
        }
    };
    if fits(t) {
        t
    } else {
        DataType::F16
    }
}

/// One tensor as the mix sees it, in the order the converter writes them.
#[derive(Clone, Debug)]
pub struct MixTensor {
    /// `.flm` name.
    pub name: String,
    /// Stored dims.
    pub dims: Vec<usize>,
    /// The source's type name when it is already quantized (`None` for F32/F16/BF16).
    pub quantized_source: Option<String>,
}

/// For each tensor whose role passes `pick`, its rank among those in (layer, name) order, the
/// order llama.cpp's quantizer visits them in (0 for the others).
fn ranks(tensors: &[MixTensor], roles: &[Role], pick: impl Fn(Role) -> bool) -> Vec<usize> {
    let layer = |r: Role| match r {
        Role::AttnV(l) | Role::FfnDown(l) => l,
        _ => 0,
    };
    let mut picked: Vec<usize> = (0..tensors.len()).filter(|&k| pick(roles[k])).collect();
    picked.sort_by(|&a, &b| {
        (layer(roles[a]), &tensors[a].name).cmp(&(layer(roles[b]), &tensors[b].name))
    });
    let mut rank = vec![0; tensors.len()];
    for (i, k) in picked.into_iter().enumerate() {
        rank[k] = i;
    }
    rank
}

/// The stored dtype of every tensor of `tensors` (same order) under `mix`, for a model of
/// `layers` layers and `experts` routed experts per MoE layer (0 for a dense model); an error
/// naming the tensor when one that would be quantized comes from an already-quantized source.
pub fn plan(
    mix: QuantMix,
    spec: &ArchSpec,
    (layers, experts): (usize, usize),
    tensors: &[MixTensor],
) -> Result<Vec<DataType>> {
    let roles: Vec<Role> = tensors
        .iter()
        .map(|t| role(spec, &t.name, &t.dims))
        .collect();
    let tied = !roles.contains(&Role::Output);
    let v_rank = ranks(tensors, &roles, |r| matches!(r, Role::AttnV(_)));
    let down_rank = ranks(tensors, &roles, |r| matches!(r, Role::FfnDown(_)));
    let n_v = roles.iter().filter(|r| matches!(r, Role::AttnV(_))).count();
    let def = mix.default_type();
    let mut out = Vec::with_capacity(tensors.len());
    for (k, (t, &r)) in tensors.iter().zip(&roles).enumerate() {
        let cols = t.dims.last().copied().unwrap_or(0);
        let want = match r {
            Role::Float => {
                out.push(DataType::F32);
                continue;
            }
            Role::Output | Role::TokenEmbd if r == Role::Output || tied => {
                if !cols.is_multiple_of(def.block_elems()) {
                    DataType::Q8_0
                } else if def != DataType::Q8_0 {
                    DataType::Q6K
                } else {
                    def
                }
            }
            Role::AttnV(_) if experts == 8 => DataType::Q8_0,
            Role::AttnV(_) if mix.more_bits_mix() && use_more_bits(v_rank[k], n_v) => DataType::Q6K,
            Role::AttnK if experts == 8 => DataType::Q8_0,
            Role::AttnOutput if experts == 8 && mix == QuantMix::Q4KM => DataType::Q5K,
            Role::FfnDown(layer) => {
                let i = if experts > 1 { layer } else { down_rank[k] };
                if mix.more_bits_mix() && use_more_bits(i, layers) {
                    DataType::Q6K
                } else {
                    def
                }
            }
            _ => def,
        };
        let dtype = fallback(want, cols);
        if let (Some(src), true) = (&t.quantized_source, dtype.is_quantized()) {
            return Err(Error::invalid(format!(
                "tensor {}: the source is already quantized ({src}); quantizing it again to {} \
                 compounds the error: convert from an f32, f16 or bf16 source (or keep the \
                 source's blocks with --dtype keep)",
                t.name,
                mix.name()
            )));
        }
        out.push(dtype);
    }
    Ok(out)
}

#[cfg(test)]
#[path = "quant_mix_tests.rs"]
mod tests;
