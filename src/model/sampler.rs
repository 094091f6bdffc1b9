//! Token sampling from logits: greedy, temperature, top-k, top-p, min-p, repetition / presence /
//! frequency penalties, seeded RNG (same seed → same tokens).
//!
//! The RNG stays on the host: each pick draws one 64-bit word ([`Sampler::next_row`]). The
//! selection itself is `fastllm_cpu::sample` (integer weights, explicitly rounded f32
//! arithmetic), which the GPU's `Sample` op reproduces bit for bit, so the same logits and seed
//! give the same token whether the pick runs on the host or on the device.

use crate::error::{Error, Result};

/// Sampling parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Nucleus: smallest set with cumulative probability ≥ p (1 = off).
    pub top_p: f32,
    /// Drop tokens with probability < min_p × max probability (0 = off).
    pub min_p: f32,
    /// CTRL-style repetition penalty on tokens seen (1 = off).
    pub repetition_penalty: f32,
    /// Subtracted once from logits of tokens seen (0 = off).
    pub presence_penalty: f32,
    /// Subtracted per occurrence (0 = off).
    pub frequency_penalty: f32,
    /// RNG seed.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Checks ranges; errors name the parameter.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::invalid(m.to_string()));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature must be a finite number ≥ 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return bad("repetition_penalty must be > 0");
        }
        if !self.presence_penalty.is_finite() || !self.frequency_penalty.is_finite() {
            return bad("presence/frequency penalties must be finite");
        }
        Ok(())
    }
}

/// Penalties of one pick: the parameters and each distinct earlier token with its count.
#[derive(Clone, Debug, PartialEq)]
pub struct Penalties {
    /// CTRL-style repetition penalty (1 = off).
    pub repetition: f32,
    /// Subtracted once per distinct earlier token.
    pub presence: f32,
    /// Subtracted per occurrence.
    pub frequency: f32,
    /// (token, count) pairs, each token once, ascending.
    pub tokens: Vec<(u32, u32)>,
}

/// Everything one pick needs: the filters, the random word drawn for it, and the penalties.
/// Made by [`Sampler::next_row`]; used by [`sample_logits`] on the host and by
/// `Model::sample_rows` / `Model::forward_paged_sample` on the model's device, which give the
/// same token for the same logits (the selection is defined exactly, see
/// `fastllm_cpu::sample`).
#[derive(Clone, Debug, PartialEq)]
pub struct SampleRow {
    /// 0 = greedy (argmax, lowest id on ties).
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// The random word of this pick (unused when greedy).
    pub random: u64,
    /// `None` when no penalty applies.
    pub penalties: Option<Penalties>,
}

impl SampleRow {
    /// Plain greedy selection (argmax of the raw logits).
    pub fn greedy() -> SampleRow {
        SampleRow {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            random: 0,
            penalties: None,
        }
    }

    /// The kernel's per-row parameters.
    pub fn kernel_params(&self) -> fastllm_cpu::sample::RowParams {
        fastllm_cpu::sample::RowParams {
            temperature: self.temperature,
            top_k: u32::try_from(self.top_k).unwrap_or(u32::MAX),
            top_p: self.top_p,
            min_p: self.min_p,
            random: self.random,
        }
    }
}

/// Picks a token from one row of `logits` (host memory) for `row`: penalties on a copy, then
/// the selection of `fastllm_cpu::sample`. NaN/+Inf logits or only -Inf are an error, never a
/// garbage token.
pub fn sample_logits(logits: &[f32], row: &SampleRow) -> Result<u32> {
    if logits.is_empty() {
        return Err(Error::invalid("sample: empty logits"));
    }
    let mut l: std::borrow::Cow<[f32]> = std::borrow::Cow::Borrowed(logits);
    if let Some(p) = &row.penalties {
        let l = l.to_mut();
        for &(t, n) in &p.tokens {
            if let Some(v) = l.get_mut(t as usize) {
                *v = fastllm_cpu::sample::penalize(*v, n, p.repetition, p.presence, p.frequency);
            }
        }
    }
    let id = fastllm_cpu::sample::sample_row(&l, &row.kernel_params());
    u32::try_from(id).map_err(|_| pick_error(&l))
}

/// The error of a row the selection refused (-1).
pub fn pick_error(logits: &[f32]) -> Error {
    if logits.iter().any(|v| v.is_nan() || *v == f32::INFINITY) {
        Error::invalid("sample: logits contain NaN or +Inf")
    } else if logits.iter().all(|v| *v == f32::NEG_INFINITY) {
        Error::invalid("sample: every logit is -Inf")
    } else {
        Error::invalid("sample: no token could be picked (bad sampling parameters)")
    }
}

/// A sampler with its RNG state.
pub struct Sampler {
    params: SamplingParams,
    rng: u64,
}

impl Sampler {
    /// A sampler; errors on invalid parameters.
    pub fn new(params: SamplingParams) -> Result<Sampler> {
        params.validate()?;
        let rng = params.seed ^ 0x853c_49e6_748f_ea9b;
        Ok(Sampler { params, rng })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    fn next_u64(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True when this sampler picks the argmax of the raw logits (temperature 0, no penalties).
    pub fn is_plain_greedy(&self) -> bool {
        let p = &self.params;
        p.temperature == 0.0
            && p.repetition_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
    }

    /// The next pick's parameters given the tokens so far (`history`, for penalties). Draws
    /// this pick's random word (only when the temperature is above 0), so call it once per
    /// token actually generated.
    pub fn next_row(&mut self, history: &[u32]) -> SampleRow {
        let p = self.params.clone();
        let penalties = if p.repetition_penalty != 1.0
            || p.presence_penalty != 0.0
            || p.frequency_penalty != 0.0
        {
            let mut counts: std::collections::BTreeMap<u32, u32> = Default::default();
            for &t in history {
                *counts.entry(t).or_default() += 1;
            }
            Some(Penalties {
                repetition: p.repetition_penalty,
                presence: p.presence_penalty,
                frequency: p.frequency_penalty,
                tokens: counts.into_iter().collect(),
            })
        } else {
            None
        };
        let random = if p.temperature > 0.0 {
            self.next_u64()
        } else {
            0
        };
        SampleRow {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            random,
            penalties,
        }
    }

    /// Picks the next token from `logits` given the tokens so far (`history`, for penalties).
    /// NaN/Inf logits are an error, never a garbage token.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(Error::invalid("sample: empty logits"));
        }
        let row = self.next_row(history);
        sample_logits(logits, &row)
    }
}

/// Index of the largest value (lowest index on ties).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_and_seeded() {
        let l = [0.1, 2.0, 1.9, -1.0];
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&l, &[]).unwrap(), 1);
        let p = SamplingParams {
            temperature: 1.0,
            seed: 7,
            ..Default::default()
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p.clone()).unwrap();
            (0..50).map(|_| s.sample(&l, &[]).unwrap()).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p).unwrap();
            (0..50).map(|_| s.sample(&l, &[]).unwrap()).collect()
        };
        assert_eq!(a, b);
        assert!(a.contains(&2) && a.contains(&1));
    }

    #[test]
    fn filters() {
        let l = [0.0, 5.0, 4.9, 1.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(p).unwrap();
        for _ in 0..20 {
            assert_eq!(s.sample(&l, &[]).unwrap(), 1);
        }
        let p = SamplingParams {
            temperature: 1.0,
            min_p: 0.5,
            ..Default::default()
        };
        let mut s = Sampler::new(p).unwrap();
        for _ in 0..50 {
            assert!([1, 2].contains(&s.sample(&l, &[]).unwrap()));
        }
        let p = SamplingParams {
            repetition_penalty: 100.0,
            ..Default::default()
        };
        let mut s = Sampler::new(p).unwrap();
        assert_eq!(s.sample(&l, &[1]).unwrap(), 2);
    }

    #[test]
    fn bad_input() {
        assert!(Sampler::new(SamplingParams {
            top_p: 0.0,
            ..Default::default()
        })
        .is_err());
        assert!(Sampler::new(SamplingParams {
            temperature: -1.0,
            ..Default::default()
        })
        .is_err());
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert!(s.sample(&[1.0, f32::NAN], &[]).is_err());
        assert!(s.sample(&[], &[]).is_err());
    }
}
