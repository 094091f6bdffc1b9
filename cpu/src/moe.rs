//! Mixture-of-experts bookkeeping over slices: router scoring and expert selection ([`route`]),
//! grouping the (token, choice) slots of a step by expert ([`dispatch`]), and the weighted
//! combine of the experts' outputs back into token rows ([`combine`], [`combine_ref`]).
//!
//! Routing is computed in f64 (scores, group sums, renormalisation) and is exact selection
//! otherwise (ties: lower index first), so it needs no separate fast path. The expert matrix
//! products themselves are `linear` kernels run by the caller (all routed experts of a
//! projection as one `linear::linear_many` job). Must not know about tensors.

use crate::threads::Threads;
use std::cmp::Ordering;

/// How router logits become expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    /// Softmax over all experts of the row (Mixtral, Qwen3-MoE, GPT-OSS).
    Softmax,
    /// Independent sigmoids (DeepSeek-V3).
    Sigmoid,
}

/// Parameters of [`route`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouteParams {
    /// Experts per row of logits.
    pub experts: usize,
    /// Experts chosen per token.
    pub k: usize,
    /// Score function.
    pub scoring: Scoring,
    /// Expert groups (1 = no group limit); must divide `experts`.
    pub groups: usize,
    /// Groups a token may choose from (`1..=groups`).
    pub topk_groups: usize,
    /// Divide the chosen weights by their sum.
    pub normalize: bool,
    /// Multiplies the (renormalised) weights.
    pub scale: f32,
}

impl RouteParams {
    /// Checks the sizes; the message names the bad parameter.
    pub fn check(&self) -> Result<(), String> {
        let p = self;
        if p.experts == 0 || p.k == 0 || p.k > p.experts {
            return Err(format!(
                "k = {} must be in 1..={} (the expert count)",
                p.k, p.experts
            ));
        }
        if p.groups == 0 || !p.experts.is_multiple_of(p.groups) {
            return Err(format!(
                "groups = {} must divide the {} experts",
                p.groups, p.experts
            ));
        }
        if p.topk_groups == 0 || p.topk_groups > p.groups {
            return Err(format!(
                "topk_groups = {} must be in 1..={}",
                p.topk_groups, p.groups
            ));
        }
        if p.k > p.topk_groups * (p.experts / p.groups) {
            return Err(format!(
                "k = {} exceeds the {} experts of the {} chosen groups",
                p.k,
                p.topk_groups * (p.experts / p.groups),
                p.topk_groups
            ));
        }
        Ok(())
    }
}

/// Descending by value (`total_cmp`), then ascending index.
fn rank(v: &[f64], a: usize, b: usize) -> Ordering {
    v[b].total_cmp(&v[a]).then(a.cmp(&b))
}

/// The indices of the `k` best entries of `v` among `allowed`, best first.
fn best(v: &[f64], allowed: impl Iterator<Item = usize>, k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = allowed.collect();
    idx.sort_by(|&a, &b| rank(v, a, b));
    idx.truncate(k);
    idx
}

/// Routes each row of `logits` [rows, experts]: scores by `p.scoring`; the choice uses
/// `score + bias` (DeepSeek-V3's `e_score_correction_bias`, when given), limited to the best
/// `topk_groups` groups (a group's rank is the sum of its best two choice values); the weights
/// are the chosen experts' scores (without the bias), renormalised when `normalize` (by their
/// sum, plus 1e-20 for sigmoid scores), times `scale`. `out` rows hold `k` (index, weight) pairs
/// in the order of the choice (best first).
pub fn route(
    logits: &[f32],
    bias: Option<&[f32]>,
    p: &RouteParams,
    out: &mut [f32],
) -> Result<(), String> {
    p.check()?;
    let e = p.experts;
    if bias.is_some_and(|b| b.len() != e) || !logits.len().is_multiple_of(e) {
        return Err(format!("logits or bias are not rows of {e} experts"));
    }
    let rows = logits.len() / e;
    if out.len() != rows * p.k * 2 {
        return Err(format!(
            "output holds {} values, need {}",
            out.len(),
            rows * p.k * 2
        ));
    }
    let gsize = e / p.groups;
    for (row, o) in logits.chunks_exact(e).zip(out.chunks_exact_mut(2 * p.k)) {
        let scores: Vec<f64> = match p.scoring {
            Scoring::Softmax => {
                let m = row
                    .iter()
                    .map(|&x| x as f64)
                    .fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = row.iter().map(|&x| (x as f64 - m).exp()).collect();
                let s: f64 = ex.iter().sum();
                ex.iter().map(|x| x / s).collect()
            }
            Scoring::Sigmoid => row
                .iter()
                .map(|&x| 1.0 / (1.0 + (-(x as f64)).exp()))
                .collect(),
        };
        let choice: Vec<f64> = match bias {
            Some(b) => scores.iter().zip(b).map(|(s, &b)| s + b as f64).collect(),
            None => scores.clone(),
        };
        let chosen = if p.groups > 1 && p.topk_groups < p.groups {
            let gscore: Vec<f64> = (0..p.groups)
                .map(|g| {
                    let top = best(&choice, g * gsize..(g + 1) * gsize, 2);
                    top.iter().map(|&i| choice[i]).sum()
                })
                .collect();
            let groups = best(&gscore, 0..p.groups, p.topk_groups);
            let allowed = (0..e).filter(|i| groups.contains(&(i / gsize)));
            best(&choice, allowed, p.k)
        } else {
            best(&choice, 0..e, p.k)
        };
        let sum: f64 = chosen.iter().map(|&i| scores[i]).sum();
        let denom = match (p.normalize, p.scoring) {
            (false, _) => 1.0,
            (true, Scoring::Softmax) => sum,
            (true, Scoring::Sigmoid) => sum + 1e-20,
        };
        for (pair, &i) in o.chunks_exact_mut(2).zip(&chosen) {
            pair[0] = i as f32;
            pair[1] = (scores[i] / denom * p.scale as f64) as f32;
        }
    }
    Ok(())
}

/// The expert index of a route entry, checked.
fn expert_of(v: f32, experts: usize) -> Result<usize, String> {
    if v >= 0.0 && v.fract() == 0.0 && (v as usize) < experts {
        Ok(v as usize)
    } else {
        Err(format!("route names expert {v}, outside 0..{experts}"))
    }
}

/// Groups the slots of `route` [rows, k, 2] by expert: `out[..=experts]` are the offsets
/// (`out[e]..out[e + 1]` are expert `e`'s entries), `out[experts + 1..]` the slots
/// (`token · k + choice`), by expert ascending, then slot ascending. A token naming one expert
/// twice is an error.
pub fn dispatch(route: &[f32], k: usize, experts: usize, out: &mut [i32]) -> Result<(), String> {
    if k == 0 || !route.len().is_multiple_of(2 * k) {
        return Err(format!("route is not rows of {k} (index, weight) pairs"));
    }
    let slots = route.len() / 2;
    if out.len() != experts + 1 + slots {
        return Err(format!(
            "output holds {} values, need {}",
            out.len(),
            experts + 1 + slots
        ));
    }
    let mut ex = Vec::with_capacity(slots);
    for (s, pair) in route.chunks_exact(2).enumerate() {
        let e = expert_of(pair[0], experts)?;
        let t = s / k;
        if route[t * 2 * k..s * 2]
            .chunks_exact(2)
            .any(|p| p[0] == pair[0])
        {
            return Err(format!("token {t} names expert {e} twice"));
        }
        ex.push(e);
    }
    let (offsets, list) = out.split_at_mut(experts + 1);
    offsets.fill(0);
    for &e in &ex {
        offsets[e + 1] += 1;
    }
    for e in 0..experts {
        offsets[e + 1] += offsets[e];
    }
    let mut next: Vec<i32> = offsets[..experts].to_vec();
    for (s, &e) in ex.iter().enumerate() {
        list[next[e] as usize] = s as i32;
        next[e] += 1;
    }
    Ok(())
}

/// Checks [`combine`]'s arguments; returns each slot's position in the dispatch order.
fn combine_positions(
    x: &[f32],
    route: &[f32],
    disp: &[i32],
    k: usize,
    d: usize,
    out: &[f32],
) -> Result<Vec<usize>, String> {
    let slots = route.len() / 2;
    if k == 0
        || !route.len().is_multiple_of(2 * k)
        || x.len() != slots * d
        || out.len() != slots / k * d
    {
        return Err(format!(
            "sizes disagree: {} route values for k = {k}, {} input values, {} output values, d = {d}",
            route.len(),
            x.len(),
            out.len()
        ));
    }
    let list = disp
        .len()
        .checked_sub(slots)
        .map(|at| &disp[at..])
        .ok_or_else(|| format!("dispatch holds {} values for {slots} slots", disp.len()))?;
    let mut pos = vec![usize::MAX; slots];
    for (j, &s) in list.iter().enumerate() {
        let s = usize::try_from(s)
            .ok()
            .filter(|&s| s < slots && pos[s] == usize::MAX)
            .ok_or_else(|| format!("dispatch entry {s} is not a fresh slot below {slots}"))?;
        pos[s] = j;
    }
    Ok(pos)
}

/// One token's combine: `o = Σ_j w_j · x[pos[t·k + j]]`, summed in choice order.
fn combine_row(x: &[f32], route: &[f32], pos: &[usize], t: usize, k: usize, o: &mut [f32]) {
    let d = o.len();
    o.fill(0.0);
    for j in 0..k {
        let s = t * k + j;
        let w = route[2 * s + 1];
        let r = &x[pos[s] * d..(pos[s] + 1) * d];
        o.iter_mut().zip(r).for_each(|(o, &v)| *o += w * v);
    }
}

/// Reference combine: `out[t] = Σ_j weight(t, j) · x[row of slot (t, j)]`, where `x` [slots, d]
/// holds the expert outputs in the dispatch order of `disp` (from [`dispatch`]) and the weights
/// come from `route` [rows, k, 2].
pub fn combine_ref(
    x: &[f32],
    route: &[f32],
    disp: &[i32],
    k: usize,
    d: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let pos = combine_positions(x, route, disp, k, d, out)?;
    if d == 0 {
        return Ok(());
    }
    for (t, o) in out.chunks_exact_mut(d).enumerate() {
        combine_row(x, route, &pos, t, k, o);
    }
    Ok(())
}

/// [`combine_ref`] with token rows split over the thread pool (the same sums in the same order).
pub fn combine(
    th: &Threads,
    x: &[f32],
    route: &[f32],
    disp: &[i32],
    k: usize,
    d: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let pos = combine_positions(x, route, disp, k, d, out)?;
    if d == 0 {
        return Ok(());
    }
    th.for_row_chunks(out, d, crate::vecmath::min_rows_for(d * k), |r0, oc| {
        for (i, o) in oc.chunks_exact_mut(d).enumerate() {
            combine_row(x, route, &pos, r0 + i, k, o);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(experts: usize, k: usize) -> RouteParams {
        RouteParams {
            experts,
            k,
            scoring: Scoring::Softmax,
            groups: 1,
            topk_groups: 1,
            normalize: true,
            scale: 1.0,
        }
    }

    #[test]
    fn softmax_top2_renormalised() {
        let logits = [0.0f32, 2.0, 1.0, -1.0];
        let mut out = [0f32; 4];
        route(&logits, None, &params(4, 2), &mut out).unwrap();
        let (a, b) = (2f64.exp(), 1f64.exp());
        assert_eq!(out[0], 1.0);
        assert_eq!(out[2], 2.0);
        assert!((out[1] as f64 - a / (a + b)).abs() < 1e-7);
        assert!((out[3] as f64 - b / (a + b)).abs() < 1e-7);
    }

    #[test]
    fn sigmoid_groups_limit_the_choice_and_bias_only_chooses() {
        // groups {0,1} and {2,3}; group 1 wins on its top-2 sum although expert 0 is best
        let logits = [3.0f32, -3.0, 1.0, 1.0];
        let p = RouteParams {
            scoring: Scoring::Sigmoid,
            groups: 2,
            topk_groups: 1,
            scale: 2.5,
            ..params(4, 2)
        };
        let mut out = [0f32; 4];
        route(&logits, None, &p, &mut out).unwrap();
        assert_eq!((out[0], out[2]), (2.0, 3.0));
        assert!((out[1] - 1.25).abs() < 1e-6 && (out[3] - 1.25).abs() < 1e-6);
        // a bias moves the choice but not the weight
        let bias = [0.0f32, 0.0, 0.0, 0.5];
        route(&logits, Some(&bias), &p, &mut out).unwrap();
        assert_eq!((out[0], out[2]), (3.0, 2.0));
    }

    #[test]
    fn dispatch_and_combine() {
        // 3 tokens, k = 2, 4 experts; expert 3 gets no token
        let route = [
            0.0f32, 0.5, 1.0, 0.5, 1.0, 1.0, 2.0, 2.0, 2.0, 0.25, 0.0, 0.75,
        ];
        let mut disp = [0i32; 5 + 6];
        dispatch(&route, 2, 4, &mut disp).unwrap();
        assert_eq!(&disp[..5], &[0, 2, 4, 6, 6]);
        assert_eq!(&disp[5..], &[0, 5, 1, 2, 3, 4]);
        // expert outputs: value = 10·expert + token
        let x: Vec<f32> = [0.0f32, 2.0, 10.0, 11.0, 21.0, 22.0].to_vec();
        let mut out = [0f32; 3];
        combine_ref(&x, &route, &disp, 2, 1, &mut out).unwrap();
        assert_eq!(
            out,
            [
                0.5 * 0.0 + 0.5 * 10.0,
                11.0 + 2.0 * 21.0,
                0.25 * 22.0 + 0.75 * 2.0
            ]
        );
        let bad = [0.0f32, 1.0, 0.0, 1.0];
        let mut d2 = [0i32; 2 + 1 + 2];
        assert!(dispatch(&bad, 2, 2, &mut d2).unwrap_err().contains("twice"));
    }

    #[test]
    fn bad_parameters_are_named() {
        let mut out = [0f32; 2];
        assert!(route(&[0.0; 4], None, &params(4, 5), &mut out)
            .unwrap_err()
            .contains("k = 5"));
        let p = RouteParams {
            groups: 3,
            ..params(4, 1)
        };
        assert!(route(&[0.0; 4], None, &p, &mut out)
            .unwrap_err()
            .contains("groups"));
    }
}
