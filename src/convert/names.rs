//! Tensor-name mapping tables, one per source: Hugging Face names pass through (GPT-2's Conv1D
//! weights flagged for transposition), and GGUF names map to their HF names (llama-family
//! names, with `attn_q` / `attn_k` flagged for llama.cpp's rotary row permutation to be undone,
//! plus the names particular to an architecture).

/// What to do with a source tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapped {
    /// The `.flm` (Hugging Face) name.
    pub name: String,
    /// Transpose a 2-D [in, out] Conv1D weight to [out, in].
    pub transpose: bool,
    /// Undo llama.cpp's q/k row permutation with this many heads.
    pub unpermute_heads: Option<usize>,
}

/// HF name → `.flm` name for architecture `arch` (identity; GPT-2 Conv1D weights transposed).
pub fn hf_name(arch: &str, name: &str) -> Mapped {
    let conv1d = arch == "gpt2"
        && name.ends_with(".weight")
        && [".c_attn.", ".c_proj.", ".c_fc."]
            .iter()
            .any(|p| name.contains(p));
    Mapped {
        name: name.to_string(),
        transpose: conv1d,
        unpermute_heads: None,
    }
}

/// GGUF name → HF name for the llama family; `None` for names with no HF counterpart.
/// `heads` / `kv_heads` drive the q/k un-permutation (llama only: `permute_qk`).
pub fn gguf_name(name: &str, heads: usize, kv_heads: usize, permute_qk: bool) -> Option<Mapped> {
    let plain = |n: String| {
        Some(Mapped {
            name: n,
            transpose: false,
            unpermute_heads: None,
        })
    };
    match name {
        "token_embd.weight" => return plain("model.embed_tokens.weight".into()),
        "output_norm.weight" => return plain("model.norm.weight".into()),
        "output.weight" => return plain("lm_head.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, suffix) = rest.split_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let (hf, heads) = match part {
        "attn_q" => ("self_attn.q_proj", permute_qk.then_some(heads)),
        "attn_k" => ("self_attn.k_proj", permute_qk.then_some(kv_heads)),
        "attn_v" => ("self_attn.v_proj", None),
        "attn_output" => ("self_attn.o_proj", None),
        "attn_q_norm" => ("self_attn.q_norm", None),
        "attn_k_norm" => ("self_attn.k_norm", None),
        "ffn_gate" => ("mlp.gate_proj", None),
        "ffn_up" => ("mlp.up_proj", None),
        "ffn_down" => ("mlp.down_proj", None),
        "attn_norm" => ("input_layernorm", None),
        "ffn_norm" => ("post_attention_layernorm", None),
        _ => return None,
    };
    Some(Mapped {
        name: format!("model.layers.{layer}.{hf}.{suffix}"),
        transpose: false,
        unpermute_heads: heads,
    })
}

/// GGUF name → HF name for the tensors whose naming differs by architecture (Gemma-3's four
/// norms per layer, Phi-3's fused projections, DeepSeek's latent attention, GPT-OSS's FFN norm
/// and sinks); `None` to fall
/// back on [`gguf_name`].
pub fn gguf_arch_name(arch: &str, name: &str) -> Option<Mapped> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, suffix) = rest.split_once('.')?;
    let hf = match (arch, part) {
        ("gemma3", "post_attention_norm") => "post_attention_layernorm",
        ("gemma3", "ffn_norm") => "pre_feedforward_layernorm",
        ("gemma3", "post_ffw_norm") => "post_feedforward_layernorm",
        ("phi3", "attn_qkv") => "self_attn.qkv_proj",
        ("phi3", "ffn_up") => "mlp.gate_up_proj",
        ("deepseek2", "attn_q_a") => "self_attn.q_a_proj",
        ("deepseek2", "attn_q_a_norm") => "self_attn.q_a_layernorm",
        ("deepseek2", "attn_q_b") => "self_attn.q_b_proj",
        ("deepseek2", "attn_kv_a_mqa") => "self_attn.kv_a_proj_with_mqa",
        ("deepseek2", "attn_kv_a_norm") => "self_attn.kv_a_layernorm",
        ("deepseek2", "attn_kv_b") => "self_attn.kv_b_proj",
        ("deepseek2", "attn_k_b") => "self_attn.k_b_proj",
        ("deepseek2", "attn_v_b") => "self_attn.v_b_proj",
        ("gpt-oss", "post_attention_norm") => "post_attention_layernorm",
        // the sinks are one tensor without a `.weight` suffix in HF's naming
        ("gpt-oss", "attn_sinks") => {
            return Some(Mapped {
                name: format!("model.layers.{layer}.self_attn.sinks"),
                transpose: false,
                unpermute_heads: None,
            })
        }
        _ => return None,
    };
    Some(Mapped {
        name: format!("model.layers.{layer}.{hf}.{suffix}"),
        transpose: false,
        unpermute_heads: None,
    })
}

/// The `.flm` name of a GGUF `rope_freqs.weight` (see [`ROPE_FREQS_TENSOR`](crate::model::ROPE_FREQS_TENSOR)).
pub use crate::model::ROPE_FREQS_TENSOR as ROPE_FREQS;

/// For row `r` of an HF-ordered q/k weight with `rows` rows and `heads` heads, the GGUF row that
/// holds it: within each head, HF row `j·half + i` is GGUF row `2i + j` (`half` = head_dim / 2).
pub fn unpermuted_source_row(r: usize, rows: usize, heads: usize) -> usize {
    let head_dim = rows / heads.max(1);
    let half = head_dim / 2;
    if half == 0 {
        return r;
    }
    let (h, within) = (r / head_dim, r % head_dim);
    let (j, i) = (within / half, within % half);
    h * head_dim + 2 * i + j
}

/// Which part of a MoE layer a GGUF tensor is (llama.cpp's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufMoePart {
    /// `ffn_gate_inp`: the router.
    Router,
    /// `exp_probs_b`: the router's choice bias.
    ScoreBias,
    /// `ffn_{gate,up,down}_exps`: all routed experts' projections stacked [experts, out, in]
    /// (0 = gate, 1 = up, 2 = down).
    Stacked(usize),
    /// `ffn_{gate,up,down}.E`: one routed expert's projection (older Mixtral files).
    Expert(usize, usize),
    /// `ffn_{gate,up,down}_shexp`: the shared experts' projection.
    Shared(usize),
}

/// The MoE part and layer of a GGUF tensor name (`blk.N.…`), if it is one.
pub fn gguf_moe_part(name: &str) -> Option<(usize, GgufMoePart)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let proj = |p: &str| {
        ["ffn_gate", "ffn_up", "ffn_down"]
            .iter()
            .position(|&x| x == p)
    };
    let part = match rest.split('.').collect::<Vec<_>>().as_slice() {
        ["ffn_gate_inp", "weight"] => GgufMoePart::Router,
        ["exp_probs_b", "bias"] | ["exp_probs_b", "weight"] => GgufMoePart::ScoreBias,
        [p, "weight"] => match p.strip_suffix("_exps").and_then(proj) {
            Some(i) => GgufMoePart::Stacked(i),
            None => GgufMoePart::Shared(p.strip_suffix("_shexp").and_then(proj)?),
        },
        [p, e, "weight"] => GgufMoePart::Expert(proj(p)?, e.parse().ok()?),
        _ => return None,
    };
    Some((layer, part))
}

/// The `.flm` name of a MoE part in layer `layer` under the architecture's `names`; for
/// [`GgufMoePart::Stacked`], `expert` picks the slice. `None` when the architecture has no
/// such tensor (e.g. a choice bias for Qwen3-MoE).
pub fn moe_hf_name(
    names: &crate::model::MoeNames,
    layer: usize,
    part: GgufMoePart,
    expert: usize,
) -> Option<String> {
    let proj = |i: usize| [names.proj.0, names.proj.1, names.proj.2].get(i).copied();
    let p = format!("model.layers.{layer}.");
    Some(match part {
        GgufMoePart::Router => format!("{p}{}.weight", names.router),
        GgufMoePart::ScoreBias => format!("{p}{}", names.score_bias?),
        GgufMoePart::Stacked(i) => format!("{p}{}.{expert}.{}.weight", names.experts, proj(i)?),
        GgufMoePart::Expert(i, e) => format!("{p}{}.{e}.{}.weight", names.experts, proj(i)?),
        GgufMoePart::Shared(i) => format!("{p}{}.{}.weight", names.shared?, proj(i)?),
    })
}
