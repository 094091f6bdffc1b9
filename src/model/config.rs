//! `ModelConfig`: the architecture-independent description of a model's shape and numerics, as
//! stored in `.flm` metadata (`model.*` keys) and read by the model graphs. Converters fill it
//! from HF `config.json` or GGUF metadata.

/// How rotary embeddings pair dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Rotate-half: pairs `(i, i + rot/2)` (HF Llama, Qwen, Mistral, Phi-3, Gemma).
    Neox,
    /// Interleaved: pairs `(2i, 2i + 1)` (GLM, GPT-J).
    Interleaved,
}

/// Rotary frequency scaling.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain `theta^(-2i/d)` frequencies.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// The factor.
        factor: f32,
    },
    /// Llama-3's piecewise frequency scaling.
    Llama3 {
        /// `factor`.
        factor: f32,
        /// `low_freq_factor`.
        low_freq_factor: f32,
        /// `high_freq_factor`.
        high_freq_factor: f32,
        /// `original_max_position_embeddings`.
        original_context_length: u32,
    },
    /// YaRN: frequencies blended between interpolated (÷ `factor`) and extrapolated by a ramp
    /// over the dimensions, and q·k scaled by `attention_factor²`.
    Yarn {
        /// Context extension factor.
        factor: f32,
        /// The pre-training context the ramp is measured against.
        original_context_length: u32,
        /// Rotations above which a dimension is extrapolated (32 by default).
        beta_fast: f32,
        /// Rotations below which a dimension is interpolated (1 by default).
        beta_slow: f32,
        /// Scale of the rotated q and k (already resolved from `mscale` etc.).
        attention_factor: f32,
        /// Round the ramp's ends to whole dimensions (HF `truncate`, true by default).
        truncate: bool,
    },
    /// LongRoPE (Phi-3.5): each frequency divided by a per-dimension factor, `short` while a
    /// sequence step stays within `original_context_length` positions, `long` beyond; q·k scaled
    /// by `attention_factor²`.
    LongRope {
        /// The pre-training context.
        original_context_length: u32,
        /// Scale of the rotated q and k.
        attention_factor: f32,
        /// Divisors for short sequences (`rope_dim / 2` values).
        short_factor: Vec<f32>,
        /// Divisors for long sequences (`rope_dim / 2` values).
        long_factor: Vec<f32>,
    },
    /// Dynamic NTK: past `context_length` (HF `max_position_embeddings`) positions, the base
    /// grows to `theta·(factor·len/ctx − factor + 1)^(d/(d−2))` for a step reaching `len`.
    Dynamic {
        /// The factor.
        factor: f32,
        /// The context the base is measured against (HF `max_position_embeddings`).
        original_context_length: u32,
    },
}

/// The tensor holding llama.cpp's per-frequency divisors of the rotary frequencies (a GGUF's
/// `rope_freqs.weight`: how a Llama-3.1/3.2 GGUF carries its llama3 rope scaling); a model that
/// has it divides each rotary frequency by its entry.
pub const ROPE_FREQS_TENSOR: &str = "model.rope_freqs.weight";

/// A model's configuration. Tensor names in `.flm` are the Hugging Face names of the
/// architecture, with every linear weight stored as [out_features, in_features].
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// One of: `llama` (also Llama-2/3, SmolLM2), `mistral`, `qwen2`, `qwen3`, `bloom`, `gpt2`,
    /// `phi3`, `gemma2`, `gemma3`, `glm`, `mixtral`, `qwen3_moe`, `deepseek_v3`, `gpt_oss`.
    pub architecture: String,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP inner size.
    pub intermediate_size: usize,
    /// Number of transformer blocks.
    pub num_layers: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// KV heads (GQA); equals `num_heads` without GQA.
    pub num_kv_heads: usize,
    /// Per-head dim (may differ from hidden/heads, e.g. Qwen3, Gemma-2).
    pub head_dim: usize,
    /// Maximum context (max_position_embeddings).
    pub context_length: usize,
    /// RMSNorm / LayerNorm epsilon.
    pub norm_eps: f32,
    /// Rotary base.
    pub rope_theta: f32,
    /// Rotated dims per head (head_dim × partial_rotary_factor); 0 for models without RoPE.
    pub rope_dim: usize,
    /// Rotary pairing.
    pub rope_style: RopeStyle,
    /// Rotary scaling (of every layer, or of the full-attention layers when
    /// `rope_local_theta` is set).
    pub rope_scaling: RopeScaling,
    /// Gemma-3: the rotary base of the sliding-window layers, which use plain unscaled
    /// frequencies (0 = every layer uses `rope_theta` and `rope_scaling`).
    pub rope_local_theta: f32,
    /// LM head shares the embedding matrix.
    pub tie_embeddings: bool,
    /// MLP activation: `silu`, `gelu_tanh` or `gelu` (erf).
    pub hidden_act: String,
    /// Gemma-2: attention logit soft-capping (0 = off).
    pub attn_logit_softcap: f32,
    /// Gemma-2: final logit soft-capping (0 = off).
    pub final_logit_softcap: f32,
    /// Sliding-window size for layers marked sliding (0 = none).
    pub sliding_window: usize,
    /// Per layer: true when the layer uses the sliding window (empty = none do).
    pub sliding_layers: Vec<bool>,
    /// Gemma-2: attention scale is `query_pre_attn_scalar^-0.5` when set (0 = `head_dim^-0.5`).
    pub query_pre_attn_scalar: f32,
    /// Beginning-of-sequence token.
    pub bos_id: Option<u32>,
    /// End-of-sequence tokens (generation stops on any).
    pub eos_ids: Vec<u32>,
    /// Mixture-of-experts layers (`None` for a dense model).
    pub moe: Option<super::moe::MoeConfig>,
    /// Multi-head latent attention (`None` for q/k/v heads). With it, `head_dim` and
    /// `num_kv_heads` describe the cached latent row (see [`super::mla`]).
    pub mla: Option<super::mla::MlaConfig>,
}
