//! Log-probabilities of the tokens a paged step picked, and of the most likely tokens, computed
//! where the step's logits are: a softmax over each row, the top `k` of each row, and a gather
//! of each pick's probability run as ops on the logits' device, so only `rows × (k + 1)`
//! numbers come back to the host, never `rows × vocabulary` logits. They are the model's own
//! distribution (the raw logits, before temperature, penalties and truncation).

use crate::data::{Data, DataType};
use crate::device::{DataDict, FloatDict, IntDict};
use crate::error::{Error, Result};
use crate::executor::Executor;

/// The log-probabilities of one pick.
#[derive(Clone, Debug, PartialEq)]
pub struct PickLogprobs {
    /// Of the picked token.
    pub logprob: f32,
    /// The most likely tokens, most likely first: (id, log-probability).
    pub top: Vec<(u32, f32)>,
}

/// The natural log of a probability; 0 (underflow) gives the log of the smallest normal f32.
fn ln(p: f32) -> f32 {
    p.max(f32::MIN_POSITIVE).ln()
}

/// Log-probabilities of `picks[i]` in row `i` of `logits` (`[rows, vocab]`, on any device),
/// with the `top_n` most likely tokens of each row (`top_n` ≤ vocab).
pub fn pick_logprobs(
    e: &Executor,
    logits: &Data,
    picks: &[u32],
    top_n: usize,
) -> Result<Vec<PickLogprobs>> {
    let dims = logits.dims();
    let (rows, vocab) = match dims {
        [r, v] => (*r, *v),
        _ => {
            return Err(Error::invalid(format!(
                "logprobs: logits {dims:?} are not [rows, vocab]"
            )))
        }
    };
    if picks.len() != rows {
        return Err(Error::invalid(format!(
            "logprobs: {} picks for {rows} rows",
            picks.len()
        )));
    }
    if top_n > vocab || picks.iter().any(|&p| p as usize >= vocab) {
        return Err(Error::invalid(format!(
            "logprobs: top {top_n} or a pick out of the vocabulary of {vocab}"
        )));
    }
    let flat = rows
        .checked_mul(vocab)
        .filter(|&n| n <= i32::MAX as usize)
        .ok_or_else(|| Error::invalid("logprobs: rows × vocab exceeds the index range"))?;
    let mut probs = Data::empty(DataType::F32);
    let mut d = DataDict::new()
        .with("input", logits)
        .with_mut("output", &mut probs);
    e.run("Softmax", &mut d, &FloatDict::new(), &IntDict::new())?;
    // the top k of each row as (index, probability) pairs; k ≥ 1 also gives the row's best
    let k = top_n.max(1);
    let mut top = Data::empty(DataType::F32);
    crate::ops::topk(e, &probs, k, &mut top)?;
    // each pick's probability: the probabilities as a [rows × vocab, 1] table, gathered
    probs.reshape(&[flat, 1])?;
    let at: Vec<i32> = picks
        .iter()
        .enumerate()
        .map(|(i, &p)| (i * vocab + p as usize) as i32)
        .collect();
    let at = Data::from_i32(&[rows], &at)?;
    let mut picked = Data::empty(DataType::F32);
    crate::ops::embedding(e, &at, &probs, &mut picked)?;
    let top = host_f32(top)?;
    let picked = host_f32(picked)?;
    Ok((0..rows)
        .map(|i| PickLogprobs {
            logprob: ln(picked[i]),
            top: top[i * 2 * k..(i * 2 * k + 2 * top_n)]
                .chunks(2)
                .map(|pair| (pair[0] as u32, ln(pair[1])))
                .collect(),
        })
        .collect())
}

fn host_f32(d: Data) -> Result<Vec<f32>> {
    if d.device() == crate::data::DeviceKind::Cpu {
        d.to_f32_vec()
    } else {
        d.to_owned_host()?.to_f32_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against log-softmax in f64 on the host, over awkward sizes.
    #[test]
    fn matches_a_host_log_softmax() {
        let e = Executor::cpu(1).unwrap();
        let mut x = 0x9e37_79b9u64;
        for (rows, vocab, top_n) in [
            (1, 1, 1),
            (1, 7, 0),
            (3, 33, 5),
            (5, 1000, 20),
            (2, 8193, 3),
        ] {
            let v: Vec<f32> = (0..rows * vocab)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % 20_000) as f32 / 1000.0 - 10.0
                })
                .collect();
            let picks: Vec<u32> = (0..rows).map(|i| ((i * 31 + 3) % vocab) as u32).collect();
            let logits = Data::from_f32(&[rows, vocab], &v).unwrap();
            let got = pick_logprobs(&e, &logits, &picks, top_n).unwrap();
            for i in 0..rows {
                let row: Vec<f64> = v[i * vocab..(i + 1) * vocab]
                    .iter()
                    .map(|&a| a as f64)
                    .collect();
                let m = row.iter().cloned().fold(f64::MIN, f64::max);
                let lse = m + row.iter().map(|a| (a - m).exp()).sum::<f64>().ln();
                let want = row[picks[i] as usize] - lse;
                assert!(
                    (got[i].logprob as f64 - want).abs() < 1e-4,
                    "{rows}x{vocab}"
                );
                assert_eq!(got[i].top.len(), top_n);
                let mut order: Vec<usize> = (0..vocab).collect();
                order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap());
                for (j, &(id, lp)) in got[i].top.iter().enumerate() {
                    assert!((lp as f64 - (row[id as usize] - lse)).abs() < 1e-4);
                    // the j-th best (ties may swap ids of equal logits)
                    assert!((row[id as usize] - row[order[j]]).abs() < 1e-6);
                }
            }
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let e = Executor::cpu(1).unwrap();
        let logits = Data::from_f32(&[2, 4], &[0.0; 8]).unwrap();
        assert!(pick_logprobs(&e, &logits, &[1], 1).is_err());
        assert!(pick_logprobs(&e, &logits, &[1, 4], 1).is_err());
        assert!(pick_logprobs(&e, &logits, &[1, 2], 5).is_err());
        let r = pick_logprobs(&e, &logits, &[1, 2], 4).unwrap();
        assert!((r[0].logprob - 0.25f32.ln()).abs() < 1e-6);
    }
}
