//! Token sampling from logits: greedy, temperature, top-k, top-p, min-p, repetition / presence /
//! frequency penalties, seeded RNG (same seed → same tokens).

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

    fn next_f64(&mut self) -> f64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Picks the next token from `logits` given the tokens so far (`history`, for penalties).
    /// NaN/Inf logits are an error, never a garbage token.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(Error::invalid("sample: empty logits"));
        }
        if logits.iter().any(|v| v.is_nan() || *v == f32::INFINITY) {
            return Err(Error::invalid("sample: logits contain NaN or +Inf"));
        }
        let p = &self.params;
        // a copy only when penalties change the logits
        let mut l: std::borrow::Cow<[f32]> = std::borrow::Cow::Borrowed(logits);
        if p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            let l = l.to_mut();
            let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
            for &t in history {
                *counts.entry(t).or_default() += 1;
            }
            for (&t, &n) in &counts {
                if let Some(v) = l.get_mut(t as usize) {
                    if p.repetition_penalty != 1.0 {
                        *v = if *v > 0.0 {
                            *v / p.repetition_penalty
                        } else {
                            *v * p.repetition_penalty
                        };
                    }
                    *v -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
        if p.temperature == 0.0 {
            return Ok(argmax(&l));
        }
        // candidates sorted by logit, descending
        let mut idx: Vec<u32> = (0..l.len() as u32).collect();
        let k = if p.top_k > 0 {
            p.top_k.min(l.len())
        } else {
            l.len()
        };
        if k < l.len() {
            idx.select_nth_unstable_by(k - 1, |&a, &b| {
                cmp_desc(l[a as usize], l[b as usize], a, b)
            });
            idx.truncate(k);
        }
        idx.sort_unstable_by(|&a, &b| cmp_desc(l[a as usize], l[b as usize], a, b));
        let max = l[idx[0] as usize];
        if max == f32::NEG_INFINITY {
            return Err(Error::invalid("sample: every logit is -Inf"));
        }
        let mut probs: Vec<f64> = idx
            .iter()
            .map(|&i| (((l[i as usize] - max) / p.temperature) as f64).exp())
            .collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|v| *v /= sum);
        let mut keep = probs.len();
        if p.min_p > 0.0 {
            let thr = p.min_p as f64 * probs[0];
            keep = probs.iter().take_while(|&&v| v >= thr).count().max(1);
        }
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut n = 0;
            for v in &probs[..keep] {
                cum += v;
                n += 1;
                if cum >= p.top_p as f64 {
                    break;
                }
            }
            keep = n.max(1);
        }
        let total: f64 = probs[..keep].iter().sum();
        let mut r = self.next_f64() * total;
        for (i, v) in probs[..keep].iter().enumerate() {
            r -= v;
            if r <= 0.0 {
                return Ok(idx[i]);
            }
        }
        Ok(idx[keep - 1])
    }
}

fn cmp_desc(x: f32, y: f32, a: u32, b: u32) -> std::cmp::Ordering {
    y.partial_cmp(&x)
        .unwrap_or(std::cmp::Ordering::Equal)
        .then(a.cmp(&b))
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
