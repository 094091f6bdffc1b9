//! The arithmetic of perplexity: a row's log-sum-exp in f64 and the running sums of negative
//! log-likelihoods with the mean's standard error.

/// `ln Σ exp(row[i])` in f64 (max-shifted). `-inf` for an empty row or one of all `-inf`.
pub fn log_softmax_row(row: &[f32]) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    if max == f64::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    max + sum.ln()
}

/// Running sums of per-token negative log-likelihoods.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NllStats {
    /// Σ nll.
    pub sum: f64,
    /// Σ nll².
    pub sum2: f64,
    /// Tokens scored.
    pub count: usize,
}

impl NllStats {
    /// Adds one token's negative log-likelihood.
    pub fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum2 += nll * nll;
        self.count += 1;
    }

    /// Mean negative log-likelihood (NaN when nothing was scored).
    pub fn mean(&self) -> f64 {
        self.sum / self.count as f64
    }

    /// Perplexity: exp(mean NLL).
    pub fn ppl(&self) -> f64 {
        self.mean().exp()
    }

    /// Standard error of the mean NLL, `sqrt((E[nll²] − E[nll]²) / (count − 1))`; `None` with
    /// fewer than two tokens or no spread.
    pub fn mean_err(&self) -> Option<f64> {
        if self.count < 2 {
            return None;
        }
        let n = self.count as f64;
        let m = self.sum / n;
        let var = self.sum2 / n - m * m;
        (var > 0.0).then(|| (var / (n - 1.0)).sqrt())
    }

    /// The error llama.cpp prints after `PPL = x ±`: the mean's standard error times the PPL
    /// (first-order propagation through exp).
    pub fn ppl_err(&self) -> Option<f64> {
        self.mean_err().map(|e| e * self.ppl())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_sum_exp_of_a_uniform_row_is_ln_n() {
        let row = [3.5f32; 10];
        assert!((log_softmax_row(&row) - (3.5 + 10f64.ln())).abs() < 1e-12);
        assert_eq!(log_softmax_row(&[]), f64::NEG_INFINITY);
    }

    #[test]
    fn stats_match_a_direct_computation() {
        let xs = [1.0, 2.5, 0.25, 4.0];
        let mut s = NllStats::default();
        xs.iter().for_each(|&x| s.add(x));
        let mean = xs.iter().sum::<f64>() / 4.0;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / 4.0;
        assert!((s.ppl() - mean.exp()).abs() < 1e-12);
        let err = (var / 3.0).sqrt() * mean.exp();
        assert!((s.ppl_err().unwrap_or(0.0) - err).abs() < 1e-12);
        let mut one = NllStats::default();
        one.add(1.0);
        assert_eq!(one.ppl_err(), None);
    }
}
