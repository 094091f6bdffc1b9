//! Random-weight models of real shapes, for measuring speed at real sizes without weight files
//! (`fastllm bench --synthetic NAME --dtype f16|int8|int4|q2_k|q3_k|q4_k|q6_k`).
//!
//! [`SyntheticSource`] is a [`WeightSource`] that generates each tensor on the host when it is
//! asked for, directly in its stored dtype: F16 weights as random half floats, Q8_0 / Q4_0 block
//! weights as random quants with small random f16 scales, norms as f32 ones. A model built from
//! it on a GPU executor uploads each tensor once at load, like a file-backed model.
//!
//! [`tokenizer_spec`] gives a synthetic model a stand-in tokenizer so that text can go in and out
//! (`fastllm serve --synthetic`): byte level, ids 0..255 are the bytes, the configured bos/eos
//! ids are the special tokens `<|bos|>` / `<|eos|>`, and every other id decodes to the fixed
//! piece [`FILLER_PIECE`]. It is not a real vocabulary: text is encoded one token per byte.

use crate::data::{bytes_for, Data, DataType};
use crate::error::{Error, Result};
use crate::model::config::{ModelConfig, RopeScaling, RopeStyle};
use crate::model::weights::WeightSource;
use crate::tokenizer::{
    AddedToken, NormalizerKind, PreTokenizerKind, TokenizerKind, TokenizerSpec,
};
use rayon::prelude::*;
use std::collections::BTreeMap;

/// The known shapes, by name (the names `--synthetic` accepts); `tiny` (2 layers, hidden 64,
/// 512-token vocabulary) is for tests.
pub const KNOWN: [&str; 7] = [
    "llama-3-8b",
    "llama-3.2-1b",
    "qwen2-0.5b",
    "tiny",
    "qwen3-30b-a3b",
    "moe-small",
    "moe-tiny",
];

/// What the stand-in tokenizer decodes every non-byte, non-special id to.
pub const FILLER_PIECE: &str = " tok";

/// The configuration of the named model shape (one of [`KNOWN`]); an error listing the known
/// names otherwise.
pub fn config(name: &str) -> Result<ModelConfig> {
    match name {
        "llama-3-8b" => Ok(llama_3_8b()),
        "llama-3.2-1b" => Ok(llama_3_2_1b()),
        "qwen2-0.5b" => Ok(qwen2_0_5b()),
        "tiny" => Ok(tiny()),
        "qwen3-30b-a3b" => Ok(qwen3_30b_a3b()),
        "moe-small" => Ok(moe_small()),
        "moe-tiny" => Ok(moe_tiny()),
        other => Err(Error::invalid(format!(
            "unknown synthetic model '{other}' (known: {})",
            KNOWN.join(", ")
        ))),
    }
}

/// Llama 3 8B, the base the other shapes change.
fn llama_3_8b() -> ModelConfig {
    ModelConfig {
        architecture: "llama".into(),
        vocab_size: 128256,
        hidden_size: 4096,
        intermediate_size: 14336,
        num_layers: 32,
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 128,
        context_length: 8192,
        norm_eps: 1e-5,
        rope_theta: 500000.0,
        rope_dim: 128,
        rope_style: RopeStyle::Neox,
        rope_scaling: RopeScaling::None,
        rope_local_theta: 0.0,
        tie_embeddings: false,
        hidden_act: "silu".into(),
        attn_logit_softcap: 0.0,
        final_logit_softcap: 0.0,
        sliding_window: 0,
        sliding_layers: Vec::new(),
        query_pre_attn_scalar: 0.0,
        bos_id: Some(128000),
        eos_ids: vec![128001],
        moe: None,
        mla: None,
    }
}

/// Llama 3.2 1B (tied embeddings, Llama 3 RoPE scaling).
fn llama_3_2_1b() -> ModelConfig {
    ModelConfig {
        hidden_size: 2048,
        intermediate_size: 8192,
        num_layers: 16,
        head_dim: 64,
        rope_dim: 64,
        context_length: 131072,
        rope_scaling: RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context_length: 8192,
        },
        tie_embeddings: true,
        ..llama_3_8b()
    }
}

/// Qwen2 0.5B (q/k/v biases).
fn qwen2_0_5b() -> ModelConfig {
    ModelConfig {
        architecture: "qwen2".into(),
        vocab_size: 151936,
        hidden_size: 896,
        intermediate_size: 4864,
        num_layers: 24,
        num_heads: 14,
        num_kv_heads: 2,
        head_dim: 64,
        rope_dim: 64,
        context_length: 32768,
        norm_eps: 1e-6,
        rope_theta: 1000000.0,
        tie_embeddings: true,
        bos_id: None,
        eos_ids: vec![151643],
        ..llama_3_8b()
    }
}

/// A 2-layer Llama of hidden size 64 and 512 tokens, for tests.
fn tiny() -> ModelConfig {
    ModelConfig {
        vocab_size: 512,
        hidden_size: 64,
        intermediate_size: 128,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        rope_dim: 16,
        context_length: 4096,
        rope_theta: 10000.0,
        tie_embeddings: true,
        bos_id: Some(510),
        eos_ids: vec![511],
        ..llama_3_8b()
    }
}

/// Qwen3-30B-A3B: 128 experts, 8 per token.
fn qwen3_30b_a3b() -> ModelConfig {
    moe_shape(
        ModelConfig {
            vocab_size: 151936,
            hidden_size: 2048,
            num_layers: 48,
            num_heads: 32,
            num_kv_heads: 4,
            head_dim: 128,
            rope_dim: 128,
            context_length: 40960,
            rope_theta: 1000000.0,
            ..llama_3_8b()
        },
        (128, 8, 768),
    )
}

/// A small Qwen3-MoE: 8 layers, 32 experts, 4 per token.
fn moe_small() -> ModelConfig {
    moe_shape(
        ModelConfig {
            vocab_size: 32000,
            hidden_size: 1024,
            num_layers: 8,
            num_heads: 16,
            num_kv_heads: 4,
            head_dim: 64,
            rope_dim: 64,
            context_length: 4096,
            bos_id: Some(31998),
            eos_ids: vec![31999],
            ..llama_3_8b()
        },
        (32, 4, 512),
    )
}

/// A 2-layer Qwen3-MoE of hidden size 64 and 8 experts, for tests.
fn moe_tiny() -> ModelConfig {
    moe_shape(
        ModelConfig {
            vocab_size: 512,
            hidden_size: 64,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            rope_dim: 16,
            context_length: 4096,
            bos_id: Some(510),
            eos_ids: vec![511],
            ..llama_3_8b()
        },
        (8, 2, 64),
    )
}

/// `c` as a Qwen3-MoE model whose every layer routes to `k` of `experts` experts of inner size
/// `inner` (no shared expert).
fn moe_shape(c: ModelConfig, (experts, k, inner): (usize, usize, usize)) -> ModelConfig {
    ModelConfig {
        architecture: "qwen3_moe".into(),
        intermediate_size: inner,
        moe: Some(super::MoeConfig {
            experts,
            experts_per_token: k,
            expert_intermediate: inner,
            scoring: super::MoeScoring::Softmax,
            groups: 1,
            topk_groups: 1,
            normalize: true,
            routed_scale: 1.0,
            shared_intermediate: 0,
            layers: vec![true; c.num_layers],
            swiglu_clamp: None,
        }),
        ..c
    }
}

/// The weight dtype of a synthetic model: `f16`, `int8` (Q8_0 blocks), `int4` (Q4_0 blocks),
/// `q2_k`, `q3_k`, `q4_k` or `q6_k` (K-quant super-blocks: `hidden_size` and `intermediate_size` must be
/// multiples of 256); an error naming the accepted values otherwise.
pub fn weight_dtype(name: &str) -> Result<DataType> {
    match name {
        "f16" => Ok(DataType::F16),
        "int8" | "q8_0" => Ok(DataType::Q8_0),
        "int4" | "q4_0" => Ok(DataType::Q4_0),
        "q4_k" => Ok(DataType::Q4K),
        "q6_k" => Ok(DataType::Q6K),
        "q2_k" => Ok(DataType::Q2K),
        "q3_k" => Ok(DataType::Q3K),
        other => Err(Error::invalid(format!(
            "unknown synthetic dtype '{other}' (known: f16, int8, int4, q2_k, q3_k, q4_k, q6_k)"
        ))),
    }
}

/// The stand-in tokenizer of a synthetic model of `config` (see the module docs): byte-level
/// BPE without merges, so text encodes to one id per byte; `Err` when the vocabulary is too
/// small for the 256 bytes and the special tokens.
pub fn tokenizer_spec(config: &ModelConfig) -> Result<TokenizerSpec> {
    let n = config.vocab_size;
    let specials: Vec<u32> = config
        .bos_id
        .iter()
        .chain(config.eos_ids.iter())
        .copied()
        .collect();
    if n < 257
        || specials
            .iter()
            .any(|&id| (id as usize) < 256 || id as usize >= n)
    {
        return Err(Error::invalid(format!(
            "synthetic tokenizer: a vocabulary of {n} with special ids {specials:?} has no room \
             for the 256 byte tokens"
        )));
    }
    let filler = crate::tokenizer::byte_level_piece(FILLER_PIECE.as_bytes());
    let mut vocab: Vec<Vec<u8>> = Vec::with_capacity(n);
    for b in 0..=255u8 {
        vocab.push(crate::tokenizer::byte_level_piece(&[b]).into_bytes());
    }
    vocab.resize(n, filler.into_bytes());
    let mut added = Vec::new();
    if let Some(b) = config.bos_id {
        added.push(AddedToken {
            id: b,
            content: "<|bos|>".into(),
            special: true,
        });
    }
    for &e in &config.eos_ids {
        if Some(e) != config.bos_id {
            added.push(AddedToken {
                id: e,
                content: "<|eos|>".into(),
                special: true,
            });
        }
    }
    Ok(TokenizerSpec {
        kind: TokenizerKind::ByteLevelBpe,
        vocab,
        scores: Vec::new(),
        merges: Vec::new(),
        added,
        pre_tokenizer: PreTokenizerKind::None,
        normalizer: NormalizerKind::None,
        add_prefix_space: false,
        byte_fallback: false,
        bos_id: config.bos_id,
        eos_ids: config.eos_ids.clone(),
        unk_id: None,
        pad_id: None,
        add_bos: config.bos_id.is_some(),
        add_eos: false,
    })
}

/// One tensor to generate.
#[derive(Clone, Debug)]
struct Spec {
    dtype: DataType,
    dims: Vec<usize>,
    /// Fill: `None` = random in `dtype`, `Some(v)` = every element `v` (f32 only).
    fill: Option<f32>,
    seed: u64,
}

/// The tensors of a model being listed, each with a seed of its own.
struct SpecList {
    tensors: BTreeMap<String, Spec>,
    /// The seed of the last tensor added.
    seed: u64,
}

impl SpecList {
    /// Adds tensor `name`: random in `dtype`, or every element `fill` (f32 only).
    fn add(&mut self, name: String, dtype: DataType, dims: Vec<usize>, fill: Option<f32>) {
        self.seed += 1;
        let seed = self.seed;
        self.tensors.insert(
            name,
            Spec {
                dtype,
                dims,
                fill,
                seed,
            },
        );
    }

    /// The norms and attention projections of the layer named `p`.
    fn attention(&mut self, c: &ModelConfig, p: &str, dtype: DataType) {
        let f32t = DataType::F32;
        let (h, q, kv) = (
            c.hidden_size,
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
        );
        for n in ["input_layernorm", "post_attention_layernorm"] {
            self.add(format!("{p}{n}.weight"), f32t, vec![h], Some(1.0));
        }
        for (n, out, inp) in [
            ("self_attn.q_proj", q, h),
            ("self_attn.k_proj", kv, h),
            ("self_attn.v_proj", kv, h),
            ("self_attn.o_proj", h, q),
        ] {
            self.add(format!("{p}{n}.weight"), dtype, vec![out, inp], None);
        }
    }

    /// The q/k/v biases (f32) of the layer named `p` of a Qwen2 model; none for other models.
    fn qkv_biases(&mut self, c: &ModelConfig, p: &str) {
        if c.architecture != "qwen2" {
            return;
        }
        let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        for (n, out) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            self.add(
                format!("{p}self_attn.{n}.bias"),
                DataType::F32,
                vec![out],
                None,
            );
        }
    }

    /// The gate, up and down projections of a dense MLP of the layer named `p`.
    fn dense_mlp(&mut self, c: &ModelConfig, p: &str, dtype: DataType) {
        let (h, f) = (c.hidden_size, c.intermediate_size);
        for (n, out, inp) in [
            ("mlp.gate_proj", f, h),
            ("mlp.up_proj", f, h),
            ("mlp.down_proj", h, f),
        ] {
            self.add(format!("{p}{n}.weight"), dtype, vec![out, inp], None);
        }
    }

    /// Qwen3-MoE parts of the layer named `p`: q/k norms, an f32 router and the experts.
    fn experts(&mut self, c: &ModelConfig, m: &super::MoeConfig, p: &str, dtype: DataType) {
        let f32t = DataType::F32;
        let (h, fe) = (c.hidden_size, m.expert_intermediate);
        for n in ["q_norm", "k_norm"] {
            let name = format!("{p}self_attn.{n}.weight");
            self.add(name, f32t, vec![c.head_dim], Some(1.0));
        }
        let router = vec![m.experts, h];
        self.add(format!("{p}mlp.gate.weight"), f32t, router, None);
        for e in 0..m.experts {
            let x = format!("{p}mlp.experts.{e}.");
            self.add(format!("{x}gate_proj.weight"), dtype, vec![fe, h], None);
            self.add(format!("{x}up_proj.weight"), dtype, vec![fe, h], None);
            self.add(format!("{x}down_proj.weight"), dtype, vec![h, fe], None);
        }
    }
}

/// Bytes of `tensors` read per decoded token of a model of `c`: every weight once, except the
/// embedding, of which one row is read (unless it doubles as the LM head), and the routed
/// experts, of which a token reads `k` of every layer's experts (counted as that share of them).
fn bytes_per_token(tensors: &BTreeMap<String, Spec>, c: &ModelConfig) -> Result<usize> {
    let mut per_token = 0usize;
    for (name, s) in tensors {
        let b = bytes_for(s.dtype, &s.dims)
            .map_err(|e| Error::invalid(format!("synthetic tensor '{name}' {:?}: {e}", s.dims)))?;
        if let Some(m) = c.moe.as_ref().filter(|_| name.contains(".mlp.experts.")) {
            per_token += b * m.experts_per_token / m.experts;
        } else if name != "model.embed_tokens.weight" || c.tie_embeddings {
            per_token += b;
        }
    }
    Ok(per_token)
}

/// A [`WeightSource`] generating random tensors of a model shape on demand (see the module docs).
pub struct SyntheticSource {
    tensors: BTreeMap<String, Spec>,
    per_token: usize,
}

impl SyntheticSource {
    /// The tensors of a Llama/Qwen2-shaped `config` with matrix weights in `dtype` (F16, BF16,
    /// F32, Q8_0, Q4_0, Q4_1, Q2_K, Q3_K, Q4_K or Q6_K; `hidden_size` and `intermediate_size` must be
    /// multiples of 32 for block dtypes, of 256 for K-quants). Qwen2 gets its q/k/v biases (f32).
    pub fn new(config: &ModelConfig, dtype: DataType) -> Result<SyntheticSource> {
        if dtype == DataType::I32 {
            return Err(Error::invalid("synthetic weights cannot be I32"));
        }
        let c = config;
        let h = c.hidden_size;
        let mut list = SpecList {
            tensors: BTreeMap::new(),
            seed: 1,
        };
        let embed = vec![c.vocab_size, h];
        list.add(
            "model.embed_tokens.weight".into(),
            dtype,
            embed.clone(),
            None,
        );
        if !c.tie_embeddings {
            list.add("lm_head.weight".into(), dtype, embed, None);
        }
        list.add(
            "model.norm.weight".into(),
            DataType::F32,
            vec![h],
            Some(1.0),
        );
        for i in 0..c.num_layers {
            let p = format!("model.layers.{i}.");
            list.attention(c, &p, dtype);
            match c.moe.as_ref().filter(|m| m.is_moe(i)) {
                Some(m) => list.experts(c, m, &p, dtype),
                None => list.dense_mlp(c, &p, dtype),
            }
            list.qkv_biases(c, &p);
        }
        let per_token = bytes_per_token(&list.tensors, c)?;
        Ok(SyntheticSource {
            tensors: list.tensors,
            per_token,
        })
    }

    /// Bytes of weights read per decoded token (every matrix once; the embedding only when it is
    /// also the LM head): the numerator of the memory-bandwidth bound on decode speed.
    pub fn weight_bytes_per_token(&self) -> usize {
        self.per_token
    }

    /// Bytes of all tensors.
    pub fn total_bytes(&self) -> usize {
        self.tensors
            .values()
            .map(|s| bytes_for(s.dtype, &s.dims).unwrap_or(0))
            .sum()
    }
}

/// xorshift64* step.
#[inline]
fn next(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// A random f16 of magnitude 2^-9 .. 2^-6 (about 0.002 .. 0.03) with a random sign.
#[inline]
fn rand_f16_bits(r: u64) -> u16 {
    let sign = ((r >> 15) & 1) as u16;
    let exp = 6 + ((r >> 10) & 3) as u16; // biased exponent 6..9
    (sign << 15) | (exp << 10) | (r & 0x3ff) as u16
}

/// Fills `bytes` with random values of `dtype`, in parallel chunks seeded from `seed`.
fn fill_random(dtype: DataType, bytes: &mut [u8], seed: u64) {
    // Chunk sizes are whole elements / blocks of every dtype (34 = Q8_0, 18 = Q4_0, 20 = Q4_1,
    // 144 = Q4_K, 210 = Q6_K, 84 = Q2_K, 110 = Q3_K).
    let unit = match dtype {
        DataType::Q8_0 => 34,
        DataType::Q4_0 => 18,
        DataType::Q4_1 => 20,
        DataType::Q4K => 144,
        DataType::Q6K => 210,
        DataType::Q2K => 84,
        DataType::Q3K => 110,
        _ => 4,
    };
    let chunk = unit * 16384;
    bytes
        .par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(ci, out)| {
            let mut x = seed
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(ci as u64 + 1)
                | 1;
            match dtype {
                DataType::F16 | DataType::BF16 => fill_half(dtype == DataType::BF16, out, &mut x),
                DataType::F32 => fill_f32(out, &mut x),
                _ => fill_blocks(dtype, unit, out, &mut x),
            }
        });
}

/// Random f16 (or, `bf16`, bf16 of the same magnitudes) values into `out`, from generator `x`.
fn fill_half(bf16: bool, out: &mut [u8], x: &mut u64) {
    for w in out.chunks_exact_mut(8) {
        let r = next(x);
        for (j, e) in w.chunks_exact_mut(2).enumerate() {
            let mut v = rand_f16_bits(r >> (16 * j));
            if bf16 {
                // Same magnitude range in bf16: rebias the exponent.
                let f = half::f16::from_bits(v).to_f32();
                v = half::bf16::from_f32(f).to_bits();
            }
            e.copy_from_slice(&v.to_le_bytes());
        }
    }
    let rest = out.len() / 8 * 8;
    for e in out[rest..].chunks_exact_mut(2) {
        e.copy_from_slice(&rand_f16_bits(next(x)).to_le_bytes());
    }
}

/// Random f32 values in ±0.02 into `out`, from generator `x`.
fn fill_f32(out: &mut [u8], x: &mut u64) {
    for e in out.chunks_exact_mut(4) {
        let r = next(x);
        let v = ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04;
        e.copy_from_slice(&v.to_le_bytes());
    }
}

/// Random blocks of `dtype` (`unit` bytes each) into `out`, from generator `x`: random quant
/// bytes, then a small f16 scale (and min) per block.
fn fill_blocks(dtype: DataType, unit: usize, out: &mut [u8], x: &mut u64) {
    for b in out.chunks_exact_mut(unit) {
        for q in b.chunks_mut(8) {
            let r = next(x).to_le_bytes();
            q.copy_from_slice(&r[..q.len()]);
        }
        let r = next(x);
        let scale = half::f16::from_f32(0.001 + (r & 0xffff) as f32 * 3e-8);
        set_block_scale(dtype, b, scale);
    }
}

/// Writes `scale` into block `b` of `dtype` where the format keeps its scales: K-quants get a
/// super-block `d` (and `dmin`) sized to their sub-scales, Q4_1 a min of `-8 · scale`.
fn set_block_scale(dtype: DataType, b: &mut [u8], scale: half::f16) {
    let sub = |div: f32| {
        half::f16::from_f32(scale.to_f32() / div)
            .to_bits()
            .to_le_bytes()
    };
    match dtype {
        // super-block scale d (and Q4_K's dmin) over 6-bit / int8 sub-scales
        DataType::Q4K => {
            let d = sub(32.0);
            b[..2].copy_from_slice(&d);
            b[2..4].copy_from_slice(&d);
        }
        DataType::Q6K => b[208..].copy_from_slice(&sub(64.0)),
        // d and dmin over 4-bit scales and mins
        DataType::Q2K => {
            let d = sub(8.0);
            b[80..82].copy_from_slice(&d);
            b[82..84].copy_from_slice(&d);
        }
        // d over signed 6-bit scales
        DataType::Q3K => b[108..].copy_from_slice(&sub(32.0)),
        _ => b[..2].copy_from_slice(&scale.to_bits().to_le_bytes()),
    }
    if dtype == DataType::Q4_1 {
        let min = half::f16::from_f32(-8.0 * scale.to_f32());
        b[2..4].copy_from_slice(&min.to_bits().to_le_bytes());
    }
}

impl WeightSource for SyntheticSource {
    fn tensor(&self, name: &str) -> Result<Data> {
        let s = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::Unsupported(format!("synthetic model has no tensor '{name}'")))?;
        let mut d = Data::zeros(s.dtype, &s.dims)?;
        match s.fill {
            Some(v) => {
                for e in d.as_f32_mut()? {
                    *e = v;
                }
            }
            None => fill_random(s.dtype, d.bytes_mut()?, s.seed),
        }
        Ok(d)
    }
    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_errors() {
        for n in KNOWN {
            let c = config(n).unwrap();
            for dt in ["f16", "int8", "int4", "q4_k", "q6_k"] {
                let t = weight_dtype(dt).unwrap();
                let s = SyntheticSource::new(&c, t);
                if !c.hidden_size.is_multiple_of(t.block_elems())
                    || !c.intermediate_size.is_multiple_of(t.block_elems())
                {
                    assert!(
                        s.is_err(),
                        "{n} {dt}: sizes off the super-block must be refused"
                    );
                    continue;
                }
                let s = s.unwrap();
                assert!(s.weight_bytes_per_token() <= s.total_bytes());
            }
        }
        let e = config("gpt-5").unwrap_err().to_string();
        assert!(e.contains("gpt-5") && e.contains("llama-3-8b"), "{e}");
        assert!(weight_dtype("int3")
            .unwrap_err()
            .to_string()
            .contains("int4"));
        // llama-3-8b in f16: ~16 GB read per token
        let s = SyntheticSource::new(&config("llama-3-8b").unwrap(), DataType::F16).unwrap();
        let gb = s.weight_bytes_per_token() as f64 / 1e9;
        assert!((14.0..16.5).contains(&gb), "{gb}");
    }

    #[test]
    fn moe_shapes_count_the_active_experts() {
        // qwen3-30b-a3b: ~3.0 B active parameters (8 of 128 experts), ~30 B in all
        let c = config("qwen3-30b-a3b").unwrap();
        let s = SyntheticSource::new(&c, DataType::F16).unwrap();
        let (active, total) = (
            s.weight_bytes_per_token() as f64 / 1e9,
            s.total_bytes() as f64 / 1e9,
        );
        assert!((5.5..6.8).contains(&active), "{active}");
        assert!((55.0..66.0).contains(&total), "{total}");
        // the tiny MoE shape runs
        let c = config("moe-tiny").unwrap();
        let src = std::sync::Arc::new(SyntheticSource::new(&c, DataType::Q8_0).unwrap());
        let exec = crate::executor::Executor::cpu(1).unwrap();
        let m =
            crate::model::Model::new(c, src, exec, crate::model::Precision::Fast, false).unwrap();
        let mut cache = m.new_cache(8).unwrap();
        let l = m.forward(&mut cache, &[1, 2, 3], false).unwrap();
        assert!(l.to_f32_vec().unwrap().iter().all(|v| v.is_finite()));
    }

    #[test]
    fn stand_in_tokenizer_round_trips_bytes() {
        use crate::tokenizer::Tokenizer;
        for name in KNOWN {
            let c = config(name).unwrap();
            let t = Tokenizer::new(tokenizer_spec(&c).unwrap()).unwrap();
            assert_eq!(t.vocab_size(), c.vocab_size);
            let text = "Hi, wörld! <|im_start|>";
            let ids = t.encode(text, false, true).unwrap();
            assert_eq!(ids.len(), text.len(), "{name}: one id per byte");
            assert!(ids.iter().all(|&i| i < 256));
            assert_eq!(t.decode(&ids, false).unwrap(), text);
            // other ids decode to the filler piece; bos is prepended when asked
            assert_eq!(t.decode(&[300, 301], false).unwrap(), " tok tok");
            if let Some(b) = c.bos_id {
                assert_eq!(t.encode("a", true, true).unwrap(), vec![b, 97]);
            }
            assert!(t.eos_ids().contains(&c.eos_ids[0]));
        }
        let small = ModelConfig {
            vocab_size: 100,
            ..config("tiny").unwrap()
        };
        let e = tokenizer_spec(&small).unwrap_err().to_string();
        assert!(e.contains("256"), "{e}");
    }

    #[test]
    fn random_values_are_finite_and_small() {
        let c = ModelConfig {
            num_layers: 1,
            vocab_size: 64,
            hidden_size: 64,
            intermediate_size: 64,
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 32,
            rope_dim: 32,
            ..config("qwen2-0.5b").unwrap()
        };
        for dt in [
            DataType::F16,
            DataType::Q8_0,
            DataType::Q4_0,
            DataType::Q4_1,
        ] {
            let s = SyntheticSource::new(&c, dt).unwrap();
            let v = s.tensor("model.layers.0.mlp.up_proj.weight").unwrap();
            let f = v.to_f32_vec().unwrap();
            assert!(f.iter().all(|x| x.is_finite() && x.abs() < 0.5), "{dt:?}");
            assert!(f.iter().any(|x| *x != 0.0));
        }
    }
}
