//! Multi-head latent attention (DeepSeek-V2/V3): its configuration ([`MlaConfig`], part of
//! `ModelConfig`), the tensor names of an architecture's latent projections ([`MlaNames`]), the
//! per-head absorbed key/value matrices derived at load ([`prepare`]), and the attention stage
//! ([`mla_attention`]).
//!
//! The KV cache holds one row per token: the normed latent `c` (`kv_lora_rank` values) followed
//! by the rotated shared key (`rope` values), as one KV head of `kv_lora_rank + rope` dims
//! (`ModelConfig::head_dim`, with `num_kv_heads = 1`), kept once where the store allows
//! (`KvStore::attend_shared`: the contiguous cache; a paged pool holds it as key and as value).
//! Each query head is absorbed into that space: `[q_nope·W_ukᵀ | rot(q_rope)]` against
//! `[c | rot(k_rope)]` gives the scores of the full keys `[W_uk·c | rot(k_rope)]`; the same row
//! serves as the value, whose first `kv_lora_rank` outputs are mapped per head by `W_uv` to the
//! `v_head_dim` values.

use super::step_kv::KvStore;
use super::weights::Weights;
use crate::data::{Data, DataType};
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::ops::{self, AttentionParams, RotaryParams};

/// Epsilon of the latent RMSNorms (`q_a_layernorm`, `kv_a_layernorm`), which HF DeepSeek-V3
/// builds with its RMSNorm's default rather than the config's `rms_norm_eps`.
const LATENT_NORM_EPS: f32 = 1e-6;

/// The latent-attention part of a model's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    /// Rank of the query compression (`q_a_proj`); 0 = a plain `q_proj`.
    pub q_lora_rank: usize,
    /// Rank of the key/value latent.
    pub kv_lora_rank: usize,
    /// Per-head query/key dims that are not rotated (`qk_nope_head_dim`); the rotated ones are
    /// `ModelConfig::rope_dim`.
    pub nope_dim: usize,
    /// Per-head value dims.
    pub v_head_dim: usize,
    /// Multiplies the softmax scale `1/√(nope_dim + rope_dim)` (YaRN's `mscale²` of
    /// `mscale_all_dim`; 1 without).
    pub score_scale: f32,
}

impl MlaConfig {
    /// Checks the sizes against a model's `head_dim` / `num_kv_heads` / `rope_dim`, which for
    /// latent attention describe the cached row (see the module docs).
    pub fn validate(
        &self,
        arch: &str,
        head_dim: usize,
        kv_heads: usize,
        rope: usize,
    ) -> Result<()> {
        let bad = |m: String| Err(Error::Unsupported(format!("{arch}: {m}")));
        if self.kv_lora_rank == 0 || self.nope_dim == 0 || self.v_head_dim == 0 || rope == 0 {
            return bad(
                "latent attention needs kv_lora_rank, nope, rope and value dims ≥ 1".into(),
            );
        }
        if head_dim != self.kv_lora_rank + rope || kv_heads != 1 {
            return bad(format!(
                "latent attention caches one row of kv_lora_rank + rope = {} dims, but the \
                 config has {kv_heads} KV heads of {head_dim} dims",
                self.kv_lora_rank + rope
            ));
        }
        if !(self.score_scale.is_finite() && self.score_scale > 0.0) {
            return bad(format!("attention score scale {}", self.score_scale));
        }
        Ok(())
    }

    /// The softmax scale of the scores.
    pub fn attention_scale(&self, rope: usize) -> f32 {
        self.score_scale / ((self.nope_dim + rope) as f32).sqrt()
    }
}

/// Tensor names of the latent projections, relative to the layer prefix, without `.weight`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaNames {
    /// The plain query projection (models without query compression).
    pub q: &'static str,
    /// Query down-projection [q_lora_rank, hidden].
    pub q_a: &'static str,
    /// RMSNorm of the query latent.
    pub q_a_norm: &'static str,
    /// Query up-projection [heads·(nope + rope), q_lora_rank].
    pub q_b: &'static str,
    /// Key/value down-projection [kv_lora_rank + rope, hidden] (latent, then the shared key).
    pub kv_a: &'static str,
    /// RMSNorm of the key/value latent.
    pub kv_a_norm: &'static str,
    /// Key/value up-projection [heads·(nope + v), kv_lora_rank].
    pub kv_b: &'static str,
    /// Per-head key up-projection, transposed [heads, kv_lora_rank, nope] (llama.cpp's
    /// `attn_k_b`; derived from `kv_b` at load when the file lacks it).
    pub k_b: &'static str,
    /// Per-head value up-projection [heads, v, kv_lora_rank] (llama.cpp's `attn_v_b`; derived
    /// likewise).
    pub v_b: &'static str,
}

/// True when `name` is a layer's `k_b` / `v_b` matrix (`….{k_b}.weight`, `….{v_b}.weight`).
pub fn is_absorbed(names: &MlaNames, name: &str) -> bool {
    [names.k_b, names.v_b]
        .iter()
        .any(|n| name.ends_with(&format!(".{n}.weight")))
}

/// Layer `prefix`'s `k_b` / `v_b` matrices as resident F32 tensors, from the file's own
/// (`k_b`, `v_b`) or split out of `kv_b`; checked against `heads` and `m`.
pub fn prepare(
    weights: &mut Weights,
    names: &MlaNames,
    m: &MlaConfig,
    heads: usize,
    prefix: &str,
) -> Result<()> {
    let (r, n, v) = (m.kv_lora_rank, m.nope_dim, m.v_head_dim);
    let kb = format!("{prefix}{}.weight", names.k_b);
    let vb = format!("{prefix}{}.weight", names.v_b);
    let (k_vals, v_vals) = if weights.has(&kb) && weights.has(&vb) {
        (
            checked_f32(weights, &kb, &[heads, r, n])?,
            checked_f32(weights, &vb, &[heads, v, r])?,
        )
    } else {
        let kvb = format!("{prefix}{}.weight", names.kv_b);
        split_kv_b(
            &checked_f32(weights, &kvb, &[heads * (n + v), r])?,
            heads,
            m,
        )
    };
    weights.set_resident(&kb, Data::from_f32(&[heads, r, n], &k_vals)?);
    weights.set_resident(&vb, Data::from_f32(&[heads, v, r], &v_vals)?);
    Ok(())
}

/// The values of `name`, an error naming it unless its dims are `want` (any leading dims
/// flattened into the first).
fn checked_f32(weights: &Weights, name: &str, want: &[usize]) -> Result<Vec<f32>> {
    let w = weights.get(name)?;
    if w.count() != want.iter().product::<usize>() || w.dims().last() != want.last() {
        return Err(Error::Unsupported(format!(
            "{name}: dims {:?}, expected {want:?} for the latent attention config",
            w.dims()
        )));
    }
    w.to_f32_vec()
}

/// `kv_b` [heads·(nope + v), rank] split into `k_b` [heads, rank, nope] (transposed per head)
/// and `v_b` [heads, v, rank].
pub fn split_kv_b(kv_b: &[f32], heads: usize, m: &MlaConfig) -> (Vec<f32>, Vec<f32>) {
    let (r, n, v) = (m.kv_lora_rank, m.nope_dim, m.v_head_dim);
    let mut k = vec![0f32; heads * r * n];
    let mut vv = Vec::with_capacity(heads * v * r);
    for h in 0..heads {
        let rows = &kv_b[h * (n + v) * r..(h + 1) * (n + v) * r];
        for j in 0..n {
            for c in 0..r {
                k[(h * r + c) * n + j] = rows[j * r + c];
            }
        }
        vv.extend_from_slice(&rows[n * r..]);
    }
    (k, vv)
}

/// What the latent attention stage needs from the model it runs in.
pub struct MlaStep<'a> {
    /// The executor.
    pub exec: &'a Executor,
    /// The model's tensors (with [`prepare`]'s `k_b` / `v_b`).
    pub weights: &'a Weights,
    /// `quant_act` for the projections (the `fast` precision).
    pub quant_act: bool,
    /// Query heads.
    pub heads: usize,
    /// Rotated dims per head.
    pub rope_dim: usize,
    /// Multiplier of the rotated query dims (the rope's attention factor², 1 without).
    pub rope_q_scale: f32,
}

impl MlaStep<'_> {
    fn linear(&self, x: &Data, name: &str, out: &mut Data) -> Result<()> {
        let w = self.weights.get(&format!("{name}.weight"))?;
        let b = self.weights.opt(&format!("{name}.bias"))?;
        ops::linear(self.exec, x, &w, b.as_deref(), out, self.quant_act)
    }

    fn norm(&self, x: &Data, name: &str, out: &mut Data) -> Result<()> {
        let w = self.weights.get(&format!("{name}.weight"))?;
        ops::rms_norm(self.exec, x, &w, LATENT_NORM_EPS, out)
    }

    /// `out[t, h] = x[t, h] · w[h]ᵀ` for `x` [s, heads, a] and `w` [heads, b, a]: [s, heads, b].
    fn per_head(&self, x: &Data, w: &str, t: &mut Data, out: &mut Data) -> Result<()> {
        let w = self.weights.get(&format!("{w}.weight"))?;
        ops::permute(self.exec, x, &[1, 0, 2], t)?;
        ops::matmul_trans_b(self.exec, t, &w, 1.0, out)?;
        ops::permute(self.exec, out, &[1, 0, 2], t)?;
        std::mem::swap(out, t);
        Ok(())
    }

    /// The absorbed queries [s, heads, rank + rope] of the normed input `x` [s, hidden].
    fn queries(
        &self,
        m: &MlaConfig,
        names: &MlaNames,
        p: &str,
        x: &Data,
        rope: &RotaryParams,
        out: &mut Data,
    ) -> Result<()> {
        let e = self.exec;
        let (s, nh, n, r) = (x.dim(0), self.heads, m.nope_dim, self.rope_dim);
        let (mut t0, mut t1) = (Data::empty(DataType::F32), Data::empty(DataType::F32));
        if m.q_lora_rank > 0 {
            self.linear(x, &format!("{p}{}", names.q_a), &mut t0)?;
            self.norm(&t0, &format!("{p}{}", names.q_a_norm), &mut t1)?;
            self.linear(&t1, &format!("{p}{}", names.q_b), &mut t0)?;
        } else {
            self.linear(x, &format!("{p}{}", names.q), &mut t0)?;
        }
        if t0.dim(-1) != nh * (n + r) {
            return Err(Error::Unsupported(format!(
                "{p}: the query projection gives {} values, expected {nh} heads of {}",
                t0.dim(-1),
                n + r
            )));
        }
        t0.reshape(&[s, nh, n + r])?;
        let (nope, mut rot) = split_at(e, &t0, 2, n, n + r)?;
        ops::rotary(e, &mut rot, rope)?;
        if self.rope_q_scale != 1.0 {
            ops::mul(e, &rot, self.rope_q_scale, &mut t1)?;
            std::mem::swap(&mut rot, &mut t1);
        }
        self.per_head(&nope, &format!("{p}{}", names.k_b), &mut t1, &mut t0)?;
        ops::cat(e, &t0, &rot, 2, out)
    }

    /// This step's cache rows [s, 1, rank + rope]: the normed latent and the rotated key.
    fn latent_rows(
        &self,
        m: &MlaConfig,
        names: &MlaNames,
        p: &str,
        x: &Data,
        rope: &RotaryParams,
        out: &mut Data,
    ) -> Result<()> {
        let e = self.exec;
        let (s, rank, r) = (x.dim(0), m.kv_lora_rank, self.rope_dim);
        let mut t0 = Data::empty(DataType::F32);
        self.linear(x, &format!("{p}{}", names.kv_a), &mut t0)?;
        if t0.dim(-1) != rank + r {
            return Err(Error::Unsupported(format!(
                "{p}{}: {} outputs, expected kv_lora_rank + rope = {}",
                names.kv_a,
                t0.dim(-1),
                rank + r
            )));
        }
        let (c, mut rot) = split_at(e, &t0, 1, rank, rank + r)?;
        let mut cn = Data::empty(DataType::F32);
        self.norm(&c, &format!("{p}{}", names.kv_a_norm), &mut cn)?;
        cn.reshape(&[s, 1, rank])?;
        rot.reshape(&[s, 1, r])?;
        ops::rotary(e, &mut rot, rope)?;
        ops::cat(e, &cn, &rot, 2, out)
    }
}

/// `t` cut along `axis` into its parts `0..at` and `at..end`.
fn split_at(e: &Executor, t: &Data, axis: usize, at: usize, end: usize) -> Result<(Data, Data)> {
    let (mut a, mut b) = (Data::empty(DataType::F32), Data::empty(DataType::F32));
    ops::split(e, t, axis, 0, at, &mut a)?;
    ops::split(e, t, axis, at, end, &mut b)?;
    Ok((a, b))
}

/// Latent attention of one layer: `out` [s, heads·v_head_dim] (the input of `o_proj`) from the
/// normed input `x` [s, hidden]; the step's latent rows are appended to layer `layer` of `kv`.
/// `p` is the layer's tensor prefix (ending in `.`); `ap` carries the score scale.
#[allow(clippy::too_many_arguments)]
pub fn mla_attention(
    st: &MlaStep,
    m: &MlaConfig,
    names: &MlaNames,
    p: &str,
    layer: usize,
    x: &Data,
    rope: &RotaryParams,
    kv: &mut dyn KvStore,
    ap: &AttentionParams,
    out: &mut Data,
) -> Result<()> {
    let e = st.exec;
    let (s, nh, rank) = (x.dim(0), st.heads, m.kv_lora_rank);
    let mut q = Data::empty(DataType::F32);
    st.queries(m, names, p, x, rope, &mut q)?;
    let mut k = Data::empty(DataType::F32);
    st.latent_rows(m, names, p, x, rope, &mut k)?;
    // the cached row is both key and value; the value's rope dims are dropped after
    let mut a = Data::empty(DataType::F32);
    kv.attend_shared(e, layer, &q, &k, ap, &mut a)?;
    let mut lat = Data::empty(DataType::F32);
    ops::split(e, &a, 2, 0, rank, &mut lat)?;
    st.per_head(&lat, &format!("{p}{}", names.v_b), &mut q, out)?;
    out.reshape(&[s, nh * m.v_head_dim])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absorbed_matrices_are_recognised_by_name() {
        let n = super::super::arch::lookup("deepseek_v3")
            .ok()
            .and_then(|a| match a.qkv {
                super::super::arch::Qkv::Latent(n) => Some(n),
                _ => None,
            });
        let Some(n) = n else {
            panic!("deepseek_v3 has latent attention names");
        };
        assert!(is_absorbed(&n, "model.layers.3.self_attn.k_b_proj.weight"));
        assert!(is_absorbed(&n, "model.layers.0.self_attn.v_b_proj.weight"));
        assert!(!is_absorbed(
            &n,
            "model.layers.0.self_attn.kv_b_proj.weight"
        ));
        assert!(!is_absorbed(&n, "model.layers.0.self_attn.q_b_proj.weight"));
    }

    #[test]
    fn kv_b_splits_into_transposed_keys_and_values() {
        let m = MlaConfig {
            q_lora_rank: 0,
            kv_lora_rank: 3,
            nope_dim: 2,
            v_head_dim: 1,
            score_scale: 1.0,
        };
        let heads = 2;
        let kv_b: Vec<f32> = (0..heads * 3 * 3).map(|i| i as f32).collect();
        let (k, v) = split_kv_b(&kv_b, heads, &m);
        // head h, key row j, latent c is kv_b[(h·3 + j)·3 + c]; k_b[h][c][j]
        for h in 0..heads {
            for j in 0..2 {
                for c in 0..3 {
                    assert_eq!(k[(h * 3 + c) * 2 + j], kv_b[(h * 3 + j) * 3 + c]);
                }
            }
            for c in 0..3 {
                assert_eq!(v[h * 3 + c], kv_b[(h * 3 + 2) * 3 + c]);
            }
        }
    }
}
