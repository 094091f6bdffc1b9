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
    /// The tokens a grammar allows at this pick (`None` = every token).
    pub mask: Option<TokenMask>,
}

/// A set of allowed token ids (constrained decoding): bit `id % 32` of word `id / 32` is set
/// for an allowed `id`. Ids past the words are not allowed. Cheap to clone.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenMask(std::sync::Arc<[u32]>);

impl TokenMask {
    /// A mask from its bit words.
    pub fn from_words(words: &[u32]) -> TokenMask {
        TokenMask(words.into())
    }

    /// True if `id` is allowed.
    pub fn allows(&self, id: usize) -> bool {
        self.0
            .get(id / 32)
            .is_some_and(|w| w & (1u32 << (id % 32)) != 0)
    }

    /// Sets every disallowed logit of `row` to -Inf.
    pub fn apply(&self, row: &mut [f32]) {
        for (w, chunk) in row.chunks_mut(32).enumerate() {
            let bits = self.0.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (b, v) in chunk.iter_mut().enumerate() {
                if bits & (1u32 << b) == 0 {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
    }
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
            mask: None,
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

/// Picks a token from one row of `logits` (host memory) for `row`: the grammar mask and the
/// penalties on a copy, then the selection of `fastllm_cpu::sample`. NaN/+Inf logits or only
/// -Inf (also: a mask that allows no token) are an error, never a garbage token.
pub fn sample_logits(logits: &[f32], row: &SampleRow) -> Result<u32> {
    if logits.is_empty() {
        return Err(Error::invalid("sample: empty logits"));
    }
    let mut l: std::borrow::Cow<[f32]> = std::borrow::Cow::Borrowed(logits);
    if let Some(m) = &row.mask {
        m.apply(l.to_mut());
    }
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
            mask: None,
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

/// Lanes of [`checked_argmax`]'s first pass.
const LANES: usize = 16;

/// Index of the largest value (lowest index on ties), or `None` when `v` holds a NaN or +Inf.
/// Two passes the compiler vectorises: the lane maxima with the check, then the first index
/// of the maximum.
pub fn checked_argmax(v: &[f32]) -> Option<u32> {
    let mut max = [f32::NEG_INFINITY; LANES];
    let mut ok = [true; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            ok[l] &= c[l] < f32::INFINITY; // false for NaN and +Inf
            max[l] = if c[l] > max[l] { c[l] } else { max[l] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in &max {
        m = if x > m { x } else { m };
    }
    for &x in tail {
        if x.is_nan() || x == f32::INFINITY {
            return None;
        }
        m = if x > m { x } else { m };
    }
    if ok.contains(&false) {
        return None;
    }
    Some(v.iter().position(|&x| x == m).unwrap_or(0) as u32)
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
    fn checked_argmax_matches_argmax_and_refuses_nan_and_inf() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for n in [0usize, 1, 15, 16, 17, 33, 1000, 1031] {
            let mut v: Vec<f32> = (0..n)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    (rng % 50) as f32 - 60.0 // many ties
                })
                .collect();
            assert_eq!(checked_argmax(&v), Some(argmax(&v)), "n = {n}");
            if n > 0 {
                v[n - 1] = f32::NEG_INFINITY;
                assert_eq!(checked_argmax(&v), Some(argmax(&v)), "n = {n}, -inf");
                for bad in [f32::NAN, f32::INFINITY] {
                    for at in [0, n / 2, n - 1] {
                        let mut w = v.clone();
                        w[at] = bad;
                        assert_eq!(checked_argmax(&w), None, "n = {n}, {bad} at {at}");
                    }
                }
            }
        }
        assert_eq!(checked_argmax(&[f32::NEG_INFINITY; 40]), Some(0));
    }

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

    /// A mask limits greedy and sampled picks to its tokens (penalties too); a mask that allows
    /// nothing is an error.
    #[test]
    fn masks_limit_picks() {
        let l: Vec<f32> = (0..70).map(|i| (i as f32 * 0.37).sin()).collect();
        let allowed = [3usize, 40, 64, 69];
        let mut words = vec![0u32; 3];
        for &a in &allowed {
            words[a / 32] |= 1 << (a % 32);
        }
        let m = TokenMask::from_words(&words);
        assert!((0..70).all(|i| m.allows(i) == allowed.contains(&i)));
        assert!(!m.allows(1000));
        let best = *allowed
            .iter()
            .max_by(|a, b| l[**a].total_cmp(&l[**b]))
            .unwrap();
        let row = SampleRow {
            mask: Some(m.clone()),
            ..SampleRow::greedy()
        };
        assert_eq!(sample_logits(&l, &row).unwrap() as usize, best);
        let p = SamplingParams {
            temperature: 2.0,
            repetition_penalty: 1.5,
            seed: 9,
            ..Default::default()
        };
        let mut s = Sampler::new(p).unwrap();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let mut row = s.next_row(&[40]);
            row.mask = Some(m.clone());
            let t = sample_logits(&l, &row).unwrap() as usize;
            assert!(allowed.contains(&t), "{t}");
            seen.insert(t);
        }
        assert_eq!(seen.len(), allowed.len());
        let none = SampleRow {
            mask: Some(TokenMask::from_words(&[0, 0, 0])),
            ..SampleRow::greedy()
        };
        assert!(sample_logits(&l, &none).is_err());
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
