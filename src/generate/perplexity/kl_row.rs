//! One row of a KL-divergence base file: encoding a row's top-K log-probabilities and the
//! rest's mass, the KL divergence of new logits against such a record, and the running sums.

use super::{log_softmax_row, NllStats};

/// The base row of logits `row` whose target has negative log-likelihood `nll`.
pub(super) fn encode_row(row: &[f32], nll: f64, k: usize) -> Vec<u8> {
    let lse = log_softmax_row(row);
    let top = top_ids(row, k);
    let kept: f64 = top.iter().map(|&i| (row[i] as f64 - lse).exp()).sum();
    let rest = if k >= row.len() {
        f64::NEG_INFINITY
    } else {
        (1.0 - kept).max(0.0).ln()
    };
    let mut out = Vec::with_capacity(8 + 8 * k);
    out.extend_from_slice(&(-nll as f32).to_le_bytes());
    out.extend_from_slice(&(rest as f32).to_le_bytes());
    for i in top {
        out.extend_from_slice(&(i as u32).to_le_bytes());
        out.extend_from_slice(&((row[i] as f64 - lse) as f32).to_le_bytes());
    }
    out
}

/// Indices of the `k` largest values, descending (ties: lower index first).
fn top_ids(row: &[f32], k: usize) -> Vec<usize> {
    let order = |a: &usize, b: &usize| row[*b].total_cmp(&row[*a]).then(a.cmp(b));
    let mut idx: Vec<usize> = (0..row.len()).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k, order);
        idx.truncate(k);
    }
    idx.sort_unstable_by(order);
    idx
}

fn f32_at(b: &[u8], at: usize) -> f32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    f32::from_le_bytes(a)
}

/// One row's comparison.
pub(super) struct RowKl {
    kld: f64,
    same_top: bool,
    base_nll: f64,
}

/// KL(base ‖ new) over the base's top K and the rest, top-1 agreement, the base's NLL.
pub(super) fn row_kl(row: &[f32], rec: &[u8]) -> RowKl {
    let lse = log_softmax_row(row);
    let k = (rec.len() - 8) / 8;
    let mut kld = 0.0;
    let mut q_kept = 0.0;
    for j in 0..k {
        let at = 8 + 8 * j;
        let id = u32::from_le_bytes([rec[at], rec[at + 1], rec[at + 2], rec[at + 3]]) as usize;
        let lp = f32_at(rec, at + 4) as f64;
        let lq = row.get(id).map_or(f64::NEG_INFINITY, |&x| x as f64 - lse);
        q_kept += lq.exp();
        kld += lp.exp() * (lp - lq);
    }
    let lp_rest = f32_at(rec, 4) as f64;
    if lp_rest > f64::NEG_INFINITY {
        let lq_rest = (1.0 - q_kept).max(f64::MIN_POSITIVE).ln();
        kld += lp_rest.exp() * (lp_rest - lq_rest);
    }
    let base_top = u32::from_le_bytes([rec[8], rec[9], rec[10], rec[11]]) as usize;
    RowKl {
        // a KL between two distributions over the same K + 1 outcomes is ≥ 0; below 0 is only
        // the base's f32 rounding (e.g. a model compared with itself)
        kld: kld.max(0.0),
        same_top: argmax(row) == base_top,
        base_nll: -(f32_at(rec, 0) as f64),
    }
}

/// The first index of the largest value.
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

/// Running sums of a comparison against a base file.
#[derive(Clone, Copy, Debug, Default)]
pub struct KlStats {
    /// Σ KL.
    pub sum_kld: f64,
    /// Σ KL².
    pub sum_kld2: f64,
    /// Rows whose most likely token is the base's.
    pub same_top: usize,
    /// Rows compared.
    pub count: usize,
    /// The base run's NLL of the same targets.
    pub base: NllStats,
}

impl KlStats {
    pub(super) fn add(&mut self, r: &RowKl) {
        self.sum_kld += r.kld;
        self.sum_kld2 += r.kld * r.kld;
        self.same_top += r.same_top as usize;
        self.count += 1;
        self.base.add(r.base_nll);
    }

    /// Mean KL divergence (nats per token).
    pub fn mean_kld(&self) -> f64 {
        self.sum_kld / self.count as f64
    }

    /// Standard error of the mean KL divergence (`None` with fewer than two rows).
    pub fn kld_err(&self) -> Option<f64> {
        let s = NllStats {
            sum: self.sum_kld,
            sum2: self.sum_kld2,
            count: self.count,
        };
        s.mean_err().or((self.count >= 2).then_some(0.0))
    }

    /// Fraction of rows whose top token agrees with the base's.
    pub fn top1(&self) -> f64 {
        self.same_top as f64 / self.count as f64
    }

    /// Binomial standard error of [`KlStats::top1`] (`None` with fewer than two rows).
    pub fn top1_err(&self) -> Option<f64> {
        let p = self.top1();
        (self.count >= 2).then(|| (p * (1.0 - p) / (self.count as f64 - 1.0)).sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_ids_are_descending_with_low_ids_first_on_ties() {
        let row = [1.0, 5.0, 3.0, 5.0, -2.0, 3.0];
        assert_eq!(top_ids(&row, 4), vec![1, 3, 2, 5]);
        assert_eq!(top_ids(&row, 6), vec![1, 3, 2, 5, 0, 4]);
    }

    #[test]
    fn row_kl_matches_a_direct_kl_over_k_plus_rest() {
        let p: Vec<f32> = (0..300).map(|i| ((i * 37 % 101) as f32) * 0.05).collect();
        let q: Vec<f32> = p
            .iter()
            .enumerate()
            .map(|(i, x)| x + ((i % 7) as f32) * 0.03)
            .collect();
        let rec = encode_row(&p, 0.0, 10);
        let r = row_kl(&q, &rec);
        let (lp, lq) = (log_softmax(&p), log_softmax(&q));
        let top = top_ids(&p, 10);
        let mut want = 0.0;
        let (mut pr, mut qr) = (1.0, 1.0);
        for &i in &top {
            want += lp[i].exp() * (lp[i] - lq[i]);
            pr -= lp[i].exp();
            qr -= lq[i].exp();
        }
        want += pr * (pr.ln() - qr.ln());
        assert!((r.kld - want).abs() < 1e-6, "{} vs {want}", r.kld);
        assert!(r.kld > 0.0);
        // the whole vocabulary kept: the exact KL
        let rec = encode_row(&p, 0.0, 300);
        let full: f64 = (0..300).map(|i| lp[i].exp() * (lp[i] - lq[i])).sum();
        assert!((row_kl(&q, &rec).kld - full).abs() < 1e-6);
    }

    fn log_softmax(row: &[f32]) -> Vec<f64> {
        let lse = super::log_softmax_row(row);
        row.iter().map(|&x| x as f64 - lse).collect()
    }
}
