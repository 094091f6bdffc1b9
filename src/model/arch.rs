//! The architecture table: for each supported architecture, its tensor names and the choices
//! its forward pass makes (norm kind, fused projections, position encoding, MLP shape). Adding an
//! architecture of a known shape is one table entry.

use super::mla::MlaNames;
use super::moe::MoeNames;
use crate::error::{Error, Result};

/// Normalization layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// RMSNorm (`.weight`).
    Rms,
    /// RMSNorm with `(1 + weight)` (Gemma).
    RmsPlusOne,
    /// LayerNorm (`.weight`, `.bias`).
    Layer,
}

/// How q, k and v are projected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qkv {
    /// Three linears.
    Separate(&'static str, &'static str, &'static str),
    /// One linear whose output is `[q | k | v]`.
    Fused(&'static str),
    /// One linear whose output is per head `[q_h | k_h | v_h]` (Bloom).
    FusedPerHead(&'static str),
    /// Multi-head latent attention (DeepSeek-V3; `ModelConfig::mla` has its sizes).
    Latent(MlaNames),
}

/// The MLP shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mlp {
    /// `down(act(gate(x)) * up(x))`.
    Gated(&'static str, &'static str, &'static str),
    /// `down(act(gu[..d]) * gu[d..])` with `gu = gate_up(x)`.
    GatedFused(&'static str, &'static str),
    /// `down(act(up(x)))`.
    Plain(&'static str, &'static str),
}

/// How positions enter the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Positions {
    /// Rotary embeddings on q and k.
    Rope,
    /// ALiBi biases in attention.
    Alibi,
    /// A learned position embedding added to the token embedding.
    Learned(&'static str),
}

/// One architecture's layout. Names without `.weight`/`.bias`; layer names are relative to
/// `layer_prefix` + index + `.`.
#[derive(Clone, Debug)]
pub struct ArchSpec {
    /// Architecture name (`ModelConfig::architecture`).
    pub name: &'static str,
    /// Token embedding.
    pub embed: &'static str,
    /// LayerNorm right after the embedding (Bloom).
    pub embed_norm: Option<&'static str>,
    /// Multiply embeddings by sqrt(hidden) (Gemma).
    pub embed_scale: bool,
    /// Position encoding.
    pub positions: Positions,
    /// Norm kind everywhere.
    pub norm: NormKind,
    /// Prefix of layer tensors, e.g. `model.layers.`.
    pub layer_prefix: &'static str,
    /// Norm before attention.
    pub attn_norm: &'static str,
    /// q/k/v projection.
    pub qkv: Qkv,
    /// Per-head q/k RMSNorm (Qwen3, Gemma-3).
    pub qk_norm: Option<(&'static str, &'static str)>,
    /// Attention output projection.
    pub o_proj: &'static str,
    /// Per-head attention sink logits `[heads]` (GPT-OSS).
    pub attn_sinks: Option<&'static str>,
    /// Norm applied to the attention output before the residual (Gemma-2).
    pub post_attn_norm: Option<&'static str>,
    /// Norm before the MLP.
    pub ffn_norm: &'static str,
    /// Norm applied to the MLP output before the residual (Gemma-2).
    pub post_ffn_norm: Option<&'static str>,
    /// MLP.
    pub mlp: Mlp,
    /// Final norm.
    pub final_norm: &'static str,
    /// LM head (tied to `embed` when absent or when the config says so).
    pub lm_head: &'static str,
    /// The experts of the MoE layers (`ModelConfig::moe` says which layers they are).
    pub moe: Option<MoeNames>,
}

const LLAMA: ArchSpec = ArchSpec {
    name: "llama",
    embed: "model.embed_tokens",
    embed_norm: None,
    embed_scale: false,
    positions: Positions::Rope,
    norm: NormKind::Rms,
    layer_prefix: "model.layers.",
    attn_norm: "input_layernorm",
    qkv: Qkv::Separate("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    qk_norm: None,
    o_proj: "self_attn.o_proj",
    attn_sinks: None,
    post_attn_norm: None,
    ffn_norm: "post_attention_layernorm",
    post_ffn_norm: None,
    mlp: Mlp::Gated("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    final_norm: "model.norm",
    lm_head: "lm_head",
    moe: None,
};

/// The MoE names of Qwen3-MoE (and of DeepSeek-V3 without its bias and shared experts).
const QWEN_MOE: MoeNames = MoeNames {
    router: "mlp.gate",
    score_bias: None,
    experts: "mlp.experts",
    proj: ("gate_proj", "up_proj", "down_proj"),
    shared: None,
};

/// DeepSeek-V3's latent attention projections.
const DEEPSEEK_MLA: MlaNames = MlaNames {
    q: "self_attn.q_proj",
    q_a: "self_attn.q_a_proj",
    q_a_norm: "self_attn.q_a_layernorm",
    q_b: "self_attn.q_b_proj",
    kv_a: "self_attn.kv_a_proj_with_mqa",
    kv_a_norm: "self_attn.kv_a_layernorm",
    kv_b: "self_attn.kv_b_proj",
    k_b: "self_attn.k_b_proj",
    v_b: "self_attn.v_b_proj",
};

const TABLE: &[ArchSpec] = &[
    LLAMA,
    ArchSpec {
        name: "mistral",
        ..LLAMA
    },
    ArchSpec {
        name: "qwen2",
        ..LLAMA
    },
    ArchSpec {
        name: "qwen3",
        qk_norm: Some(("self_attn.q_norm", "self_attn.k_norm")),
        ..LLAMA
    },
    ArchSpec {
        name: "mixtral",
        moe: Some(MoeNames {
            router: "block_sparse_moe.gate",
            score_bias: None,
            experts: "block_sparse_moe.experts",
            proj: ("w1", "w3", "w2"),
            shared: None,
        }),
        ..LLAMA
    },
    ArchSpec {
        name: "qwen3_moe",
        qk_norm: Some(("self_attn.q_norm", "self_attn.k_norm")),
        moe: Some(QWEN_MOE),
        ..LLAMA
    },
    ArchSpec {
        name: "deepseek_v3",
        qkv: Qkv::Latent(DEEPSEEK_MLA),
        moe: Some(MoeNames {
            score_bias: Some("mlp.gate.e_score_correction_bias"),
            shared: Some("mlp.shared_experts"),
            ..QWEN_MOE
        }),
        ..LLAMA
    },
    ArchSpec {
        name: "gpt_oss",
        attn_sinks: Some("self_attn.sinks"),
        moe: Some(MoeNames {
            router: "mlp.router",
            score_bias: None,
            experts: "mlp.experts",
            proj: ("gate_proj", "up_proj", "down_proj"),
            shared: None,
        }),
        ..LLAMA
    },
    ArchSpec {
        name: "phi3",
        qkv: Qkv::Fused("self_attn.qkv_proj"),
        mlp: Mlp::GatedFused("mlp.gate_up_proj", "mlp.down_proj"),
        ..LLAMA
    },
    ArchSpec {
        name: "glm",
        mlp: Mlp::GatedFused("mlp.gate_up_proj", "mlp.down_proj"),
        ..LLAMA
    },
    ArchSpec {
        name: "gemma2",
        embed_scale: true,
        norm: NormKind::RmsPlusOne,
        post_attn_norm: Some("post_attention_layernorm"),
        ffn_norm: "pre_feedforward_layernorm",
        post_ffn_norm: Some("post_feedforward_layernorm"),
        ..LLAMA
    },
    ArchSpec {
        name: "gemma3",
        embed_scale: true,
        norm: NormKind::RmsPlusOne,
        qk_norm: Some(("self_attn.q_norm", "self_attn.k_norm")),
        post_attn_norm: Some("post_attention_layernorm"),
        ffn_norm: "pre_feedforward_layernorm",
        post_ffn_norm: Some("post_feedforward_layernorm"),
        ..LLAMA
    },
    ArchSpec {
        name: "bloom",
        embed: "transformer.word_embeddings",
        embed_norm: Some("transformer.word_embeddings_layernorm"),
        embed_scale: false,
        positions: Positions::Alibi,
        norm: NormKind::Layer,
        layer_prefix: "transformer.h.",
        attn_norm: "input_layernorm",
        qkv: Qkv::FusedPerHead("self_attention.query_key_value"),
        qk_norm: None,
        o_proj: "self_attention.dense",
        attn_sinks: None,
        post_attn_norm: None,
        ffn_norm: "post_attention_layernorm",
        post_ffn_norm: None,
        mlp: Mlp::Plain("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
        final_norm: "transformer.ln_f",
        lm_head: "lm_head",
        moe: None,
    },
    ArchSpec {
        name: "gpt2",
        embed: "transformer.wte",
        embed_norm: None,
        embed_scale: false,
        positions: Positions::Learned("transformer.wpe"),
        norm: NormKind::Layer,
        layer_prefix: "transformer.h.",
        attn_norm: "ln_1",
        qkv: Qkv::Fused("attn.c_attn"),
        qk_norm: None,
        o_proj: "attn.c_proj",
        attn_sinks: None,
        post_attn_norm: None,
        ffn_norm: "ln_2",
        post_ffn_norm: None,
        mlp: Mlp::Plain("mlp.c_fc", "mlp.c_proj"),
        final_norm: "transformer.ln_f",
        lm_head: "lm_head",
        moe: None,
    },
];

/// The names of every supported architecture.
pub fn supported() -> Vec<&'static str> {
    TABLE.iter().map(|a| a.name).collect()
}

/// The spec of `architecture`, or an error listing the supported ones.
pub fn lookup(architecture: &str) -> Result<&'static ArchSpec> {
    TABLE
        .iter()
        .find(|a| a.name == architecture)
        .ok_or_else(|| {
            Error::Unsupported(format!(
                "architecture '{architecture}' (supported: {})",
                supported().join(", ")
            ))
        })
}
