//! Rotary frequencies of a model's layers: the inverse frequencies of every rope scaling
//! (linear, llama3, YaRN, LongRoPE, dynamic NTK — the definitions of HF `modeling_rope_utils`,
//! formed in f64), the attention factor YaRN and LongRoPE apply to the rotated dims of q and k,
//! Gemma-3's second base for its sliding-window layers, and, for the scalings whose frequencies
//! depend on how far a sequence has got (LongRoPE, dynamic NTK), the cos/sin tables of one step.

use super::config::{ModelConfig, RopeScaling};
use crate::data::Data;
use crate::device::BaseDevice;
use crate::error::{Error, Result};

/// Rotary inverse frequencies (`rope_dim / 2` of them) of base `theta` under `scaling`, for a
/// step whose sequence reaches `seq_len` positions (only LongRoPE and dynamic NTK look at it).
pub fn inv_freq_f64(
    rope_dim: usize,
    theta: f32,
    scaling: &RopeScaling,
    seq_len: usize,
) -> Vec<f64> {
    let rot = rope_dim.max(2);
    let d = rot as f64;
    let base = theta as f64;
    let plain = |base: f64| -> Vec<f64> {
        (0..rot / 2)
            .map(|i| 1.0 / base.powf(2.0 * i as f64 / d))
            .collect()
    };
    match scaling {
        RopeScaling::None => plain(base),
        RopeScaling::Linear { factor } => plain(base).iter().map(|f| f / *factor as f64).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context_length,
        } => llama3(
            &plain(base),
            *factor as f64,
            *low_freq_factor as f64,
            *high_freq_factor as f64,
            *original_context_length as f64,
        ),
        RopeScaling::Yarn {
            factor,
            original_context_length,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => yarn(
            &plain(base),
            base,
            *factor as f64,
            *original_context_length as f64,
            (*beta_fast as f64, *beta_slow as f64),
            *truncate,
        ),
        RopeScaling::LongRope {
            original_context_length,
            short_factor,
            long_factor,
            ..
        } => {
            let ext = if seq_len > *original_context_length as usize {
                long_factor
            } else {
                short_factor
            };
            plain(base)
                .iter()
                .zip(ext.iter().chain(std::iter::repeat(&1.0)))
                .map(|(f, e)| f / *e as f64)
                .collect()
        }
        RopeScaling::Dynamic {
            factor,
            original_context_length,
        } => {
            let (factor, orig) = (*factor as f64, *original_context_length as f64);
            let len = (seq_len as f64).max(orig);
            let grown = base * ((factor * len / orig) - (factor - 1.0)).powf(d / (d - 2.0));
            plain(grown)
        }
    }
}

/// YaRN: each frequency blended between `f / factor` (interpolated) and `f` (extrapolated) by
/// a ramp over the dimensions whose ends are where a frequency turns `betas.0` and `betas.1`
/// times over the original context.
fn yarn(
    plain: &[f64],
    base: f64,
    factor: f64,
    orig: f64,
    betas: (f64, f64),
    truncate: bool,
) -> Vec<f64> {
    let d = 2.0 * plain.len() as f64;
    let dim_of = |rotations: f64| {
        d * (orig / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let (mut low, mut high) = (dim_of(betas.0), dim_of(betas.1));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
    if low == high {
        high += 0.001;
    }
    plain
        .iter()
        .enumerate()
        .map(|(i, &f)| {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolated = 1.0 - ramp;
            f / factor * (1.0 - extrapolated) + f * extrapolated
        })
        .collect()
}

fn llama3(base: &[f64], factor: f64, lo: f64, hi: f64, old: f64) -> Vec<f64> {
    let (low_wavelen, high_wavelen) = (old / lo, old / hi);
    base.iter()
        .map(|&f| {
            let wavelen = 2.0 * std::f64::consts::PI / f;
            if wavelen < high_wavelen {
                f
            } else if wavelen > low_wavelen {
                f / factor
            } else {
                let smooth = (old / wavelen - lo) / (hi - lo);
                (1.0 - smooth) * f / factor + smooth * f
            }
        })
        .collect()
}

/// The factor YaRN and LongRoPE multiply the rotated dims of q and k by (1 for the others).
pub fn attention_factor(scaling: &RopeScaling) -> f32 {
    match scaling {
        RopeScaling::Yarn {
            attention_factor, ..
        }
        | RopeScaling::LongRope {
            attention_factor, ..
        } => *attention_factor,
        _ => 1.0,
    }
}

/// True for the scalings whose frequencies depend on the sequence length a step reaches.
pub fn length_dependent(scaling: &RopeScaling) -> bool {
    matches!(
        scaling,
        RopeScaling::LongRope { .. } | RopeScaling::Dynamic { .. }
    )
}

/// The rotation of one kind of layer, resolved at load.
pub(crate) struct LayerRope {
    /// Rotary base.
    pub theta: f32,
    /// Its scaling.
    pub scaling: RopeScaling,
    /// Divisors of the frequencies (a GGUF's `rope_freqs.weight`), if any.
    divisors: Option<Vec<f32>>,
    /// Fixed inverse frequencies; `None` when the op's own `theta^(-2i/d)` is exact.
    pub inv_freq: Option<Data>,
    /// Multiplier of the attention scores (the attention factor², when every dim rotates).
    pub score_scale: f32,
    /// With partial rotary and an attention factor: q is multiplied by this [head_dim] vector
    /// (factor² on the rotated dims, 1 on the others).
    pub q_scale: Option<Data>,
}

impl LayerRope {
    fn new(
        c: &ModelConfig,
        theta: f32,
        scaling: RopeScaling,
        divisors: Option<Vec<f32>>,
    ) -> Result<LayerRope> {
        check(c, &scaling)?;
        let plain = matches!(scaling, RopeScaling::None) && divisors.is_none();
        let inv_freq = if plain || length_dependent(&scaling) {
            None
        } else {
            let f = scaled(c.rope_dim, theta, &scaling, divisors.as_deref(), 0);
            Some(Data::from_f32(&[f.len()], &f)?)
        };
        let m = attention_factor(&scaling);
        let m2 = m * m;
        let (score_scale, q_scale) = if m2 == 1.0 {
            (1.0, None)
        } else if c.rope_dim >= c.head_dim {
            (m2, None)
        } else {
            let v: Vec<f32> = (0..c.head_dim)
                .map(|i| if i < c.rope_dim { m2 } else { 1.0 })
                .collect();
            (1.0, Some(Data::from_f32(&[c.head_dim], &v)?))
        };
        Ok(LayerRope {
            theta,
            scaling,
            divisors,
            inv_freq,
            score_scale,
            q_scale,
        })
    }

    /// The `cos`/`sin` tables [rows, rope_dim/2] of a step (length-dependent scalings): row `r`
    /// at position `pos[r]` rotates with the frequencies of the length its sequence reaches in
    /// this step, `runs` giving where each sequence's rows start (as `q_starts`: the first is 0,
    /// the last is the row count).
    pub fn step_tables(
        &self,
        rope_dim: usize,
        pos: &[i32],
        runs: &[usize],
    ) -> Result<(Data, Data)> {
        let half = rope_dim / 2;
        let (mut cos, mut sin) = (vec![0f32; pos.len() * half], vec![0f32; pos.len() * half]);
        for w in runs.windows(2) {
            let rows = pos
                .get(w[0]..w[1])
                .ok_or_else(|| Error::invalid("rotary step: sequence rows out of range"))?;
            let reach = rows
                .iter()
                .map(|&p| p.max(0) as usize + 1)
                .max()
                .unwrap_or(0);
            let f = scaled(
                rope_dim,
                self.theta,
                &self.scaling,
                self.divisors.as_deref(),
                reach,
            );
            for (r, &p) in rows.iter().enumerate() {
                let at = (w[0] + r) * half;
                for (i, f) in f.iter().enumerate() {
                    let a = p as f64 * *f as f64;
                    cos[at + i] = a.cos() as f32;
                    sin[at + i] = a.sin() as f32;
                }
            }
        }
        Ok((
            Data::from_f32(&[pos.len(), half], &cos)?,
            Data::from_f32(&[pos.len(), half], &sin)?,
        ))
    }

    fn upload(&mut self, dev: &dyn BaseDevice) -> Result<()> {
        for t in [&mut self.inv_freq, &mut self.q_scale]
            .into_iter()
            .flatten()
        {
            *t = dev.upload(t)?;
        }
        Ok(())
    }
}

/// [`inv_freq_f64`] divided by `divisors`, as f32.
fn scaled(
    rope_dim: usize,
    theta: f32,
    s: &RopeScaling,
    divisors: Option<&[f32]>,
    len: usize,
) -> Vec<f32> {
    let mut f = inv_freq_f64(rope_dim, theta, s, len);
    for (f, d) in f.iter_mut().zip(divisors.unwrap_or_default()) {
        *f /= *d as f64;
    }
    f.iter().map(|&f| f as f32).collect()
}

/// `Err` for a scaling whose parameters cannot work with this model's rotary dims.
fn check(c: &ModelConfig, s: &RopeScaling) -> Result<()> {
    let half = c.rope_dim / 2;
    let bad = |m: String| Err(Error::Unsupported(format!("{}: {m}", c.architecture)));
    match s {
        RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_context_length,
            ..
        } => {
            if short_factor.len() != half || long_factor.len() != half {
                return bad(format!(
                    "longrope needs {half} short and long factors (rope dim {}), got {} and {}",
                    c.rope_dim,
                    short_factor.len(),
                    long_factor.len()
                ));
            }
            if short_factor
                .iter()
                .chain(long_factor)
                .any(|f| !f.is_finite() || *f <= 0.0)
            {
                return bad("longrope factors must be positive".into());
            }
            if *original_context_length == 0 {
                return bad("longrope needs an original context length".into());
            }
            Ok(())
        }
        RopeScaling::Yarn {
            factor,
            original_context_length,
            ..
        }
        | RopeScaling::Dynamic {
            factor,
            original_context_length,
        } if *factor <= 0.0 || *original_context_length == 0 => bad(format!(
            "rope scaling {s:?} needs a positive factor and original context length"
        )),
        RopeScaling::Linear { factor } if *factor <= 0.0 => bad(format!(
            "linear rope scaling factor {factor} must be positive"
        )),
        RopeScaling::Dynamic { .. } if c.rope_dim <= 2 => {
            bad("dynamic rope scaling needs a rotary dim above 2".into())
        }
        _ => Ok(()),
    }
}

/// The rotations of a model: every layer's, or, with Gemma-3's local base, the sliding-window
/// layers' apart.
pub(crate) struct RopePlan {
    /// Full-attention layers (every layer without a local base).
    pub global: LayerRope,
    /// Sliding-window layers, when they rotate with a base of their own.
    pub local: Option<LayerRope>,
}

impl RopePlan {
    /// The plan of `c`, with the GGUF `rope_freqs` divisors when the model has them.
    pub fn new(c: &ModelConfig, divisors: Option<Vec<f32>>) -> Result<RopePlan> {
        let global = LayerRope::new(c, c.rope_theta, c.rope_scaling.clone(), divisors)?;
        let local = if c.rope_local_theta > 0.0 {
            Some(LayerRope::new(
                c,
                c.rope_local_theta,
                RopeScaling::None,
                None,
            )?)
        } else {
            None
        };
        Ok(RopePlan { global, local })
    }

    /// True when layer `i` rotates with the sliding-window layers' own base.
    pub fn is_local(&self, c: &ModelConfig, i: usize) -> bool {
        self.local.is_some() && c.sliding_layers.get(i).copied().unwrap_or(false)
    }

    /// The rotation of layer `i`.
    pub fn layer(&self, c: &ModelConfig, i: usize) -> &LayerRope {
        match &self.local {
            Some(l) if self.is_local(c, i) => l,
            _ => &self.global,
        }
    }

    /// True when a step's frequencies depend on how far its sequences reach (its tables are
    /// then formed on the host, [`LayerRope::step_tables`]).
    pub fn length_dependent(&self) -> bool {
        length_dependent(&self.global.scaling)
    }

    /// Moves the fixed tensors to `dev`.
    pub fn upload(&mut self, dev: &dyn BaseDevice) -> Result<()> {
        self.global.upload(dev)?;
        if let Some(l) = &mut self.local {
            l.upload(dev)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RopeStyle;

    fn config(head_dim: usize, rope_dim: usize, scaling: RopeScaling) -> ModelConfig {
        ModelConfig {
            architecture: "llama".into(),
            vocab_size: 8,
            hidden_size: 4 * head_dim,
            intermediate_size: 8,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 4,
            head_dim,
            context_length: 64,
            norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_dim,
            rope_style: RopeStyle::Neox,
            rope_scaling: scaling,
            rope_local_theta: 0.0,
            tie_embeddings: true,
            hidden_act: "silu".into(),
            attn_logit_softcap: 0.0,
            final_logit_softcap: 0.0,
            sliding_window: 0,
            sliding_layers: Vec::new(),
            query_pre_attn_scalar: 0.0,
            bos_id: None,
            eos_ids: Vec::new(),
            moe: None,
            mla: None,
        }
    }

    fn yarn(attention_factor: f32) -> RopeScaling {
        RopeScaling::Yarn {
            factor: 4.0,
            original_context_length: 32,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor,
            truncate: true,
        }
    }

    #[test]
    fn attention_factor_scores_or_rotated_dims() {
        // every dim rotates: the factor² multiplies the scores
        let full = LayerRope::new(&config(16, 16, yarn(1.5)), 1e4, yarn(1.5), None).unwrap();
        assert_eq!((full.score_scale, full.q_scale.is_none()), (2.25, true));
        // partial rotary: q's rotated dims only
        let part = LayerRope::new(&config(16, 8, yarn(1.5)), 1e4, yarn(1.5), None).unwrap();
        assert_eq!(part.score_scale, 1.0);
        let v = part.q_scale.unwrap().to_f32_vec().unwrap();
        assert_eq!(v, [[2.25f32; 8], [1.0; 8]].concat());
        let plain = LayerRope::new(&config(16, 8, yarn(1.0)), 1e4, yarn(1.0), None).unwrap();
        assert!(plain.q_scale.is_none() && plain.score_scale == 1.0);
    }

    #[test]
    fn linear_scaling_rotates_position_p_as_plain_rope_rotates_p_over_factor() {
        let plain = inv_freq_f64(16, 1e4, &RopeScaling::None, 0);
        let linear = inv_freq_f64(16, 1e4, &RopeScaling::Linear { factor: 4.0 }, 0);
        assert_eq!(linear.len(), 8);
        // the angle at position 8 under factor 4 is the plain angle at position 2
        for (l, p) in linear.iter().zip(&plain) {
            assert!((8.0 * l - 2.0 * p).abs() <= 1e-12, "{l} vs {p}");
        }
    }

    #[test]
    fn dynamic_ntk_grows_the_base_past_the_original_context() {
        let s = RopeScaling::Dynamic {
            factor: 2.0,
            original_context_length: 32,
        };
        let plain = inv_freq_f64(8, 1e4, &RopeScaling::None, 0);
        assert_eq!(inv_freq_f64(8, 1e4, &s, 32), plain);
        // at 64 positions: base · (2·64/32 − 1)^(8/6)
        let base = 1e4 * 3f64.powf(8.0 / 6.0);
        let want = inv_freq_f64(8, base as f32, &RopeScaling::None, 0);
        for (a, b) in inv_freq_f64(8, 1e4, &s, 64).iter().zip(&want) {
            assert!((a - b).abs() <= 1e-6 * b, "{a} vs {b}");
        }
    }

    #[test]
    fn longrope_tables_follow_each_sequence_reach() {
        let s = RopeScaling::LongRope {
            original_context_length: 4,
            attention_factor: 1.0,
            short_factor: vec![1.0, 1.0],
            long_factor: vec![2.0, 4.0],
        };
        let r = LayerRope::new(&config(4, 4, s.clone()), 100.0, s, None).unwrap();
        // sequence A: rows 0..2 at positions 0, 1 (reach 2: short); B: positions 3..6 (long)
        let (cos, _) = r.step_tables(4, &[0, 1, 3, 4, 5], &[0, 2, 5]).unwrap();
        let cos = cos.to_f32_vec().unwrap();
        assert!((cos[2] - 1f32.cos()).abs() < 1e-6); // row 1, pair 0: 1·1/1
        assert!((cos[4] - (3.0f32 / 2.0).cos()).abs() < 1e-6); // row 2, pair 0: 3·1/2
        assert!((cos[5] - (3.0f32 * 0.1 / 4.0).cos()).abs() < 1e-6); // pair 1: 3·100^-0.5/4
    }

    #[test]
    fn bad_longrope_factors_are_refused() {
        let s = RopeScaling::LongRope {
            original_context_length: 4,
            attention_factor: 1.0,
            short_factor: vec![1.0],
            long_factor: vec![2.0, 4.0],
        };
        let e = RopePlan::new(&config(4, 4, s), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("longrope") && e.contains("2 short and long"),
            "{e}"
        );
    }
}
