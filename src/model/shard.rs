//! Which slice of every tensor each rank of a tensor-parallel group holds ([`ShardPlan`]),
//! and a [`WeightSource`] that hands a rank its slices ([`ShardedSource`]): q/k/v and gate/up
//! column-parallel by whole heads and 32-wide blocks of the MLP; o_proj and down_proj
//! row-parallel (their biases on rank 0 only); the embedding vocab-parallel (a slice of rows
//! plus one zero row); the LM head column-parallel over the vocabulary; norms replicated (see
//! `model::tensor_parallel` for how the ranks run them).

use super::arch::{self, Mlp, Qkv};
use super::config::ModelConfig;
use super::weights::WeightSource;
use crate::data::Data;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

/// `[n*r/w, n*(r+1)/w)`: rank `r`'s part of `n` items split over `w` ranks.
fn split(n: usize, w: usize, r: usize) -> Range<usize> {
    n * r / w..n * (r + 1) / w
}

fn scale(r: &Range<usize>, k: usize) -> Range<usize> {
    r.start * k..r.end * k
}

fn shift(r: &Range<usize>, k: usize) -> Range<usize> {
    r.start + k..r.end + k
}

/// How attention is divided between the ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttentionSplit {
    /// Each rank holds whole KV-head groups (or part of one group's query heads with that KV
    /// head copied): `heads[r]` query heads and `kv_heads[r]` KV heads, global indices.
    Heads {
        /// Query heads per rank.
        heads: Vec<Range<usize>>,
        /// KV heads per rank.
        kv_heads: Vec<Range<usize>>,
    },
    /// Every rank computes the whole attention (head counts that cannot be split).
    Replicated,
}

/// Which slice of the model each rank of a `world`-rank group holds (see the module docs).
#[derive(Clone, Debug)]
pub struct ShardPlan {
    world: usize,
    config: ModelConfig,
    /// The attention split.
    pub attention: AttentionSplit,
    /// MLP inner features per rank.
    pub ffn: Vec<Range<usize>>,
    /// Vocabulary rows per rank (embedding and LM head).
    pub vocab: Vec<Range<usize>>,
}

impl ShardPlan {
    /// The plan for `config` over `world` ranks; `Err` when a dimension is too small to give
    /// every rank a part.
    pub fn new(config: &ModelConfig, world: usize) -> Result<ShardPlan> {
        let c = config;
        let spec = arch::lookup(&c.architecture)?;
        if world == 0 {
            return Err(Error::invalid("tensor parallelism needs at least one rank"));
        }
        if c.moe.is_some() {
            return Err(Error::Unsupported(format!(
                "{}: tensor parallelism of mixture-of-experts layers",
                c.architecture
            )));
        }
        if c.mla.is_some() {
            return Err(Error::Unsupported(format!(
                "{}: tensor parallelism of latent attention",
                c.architecture
            )));
        }
        let (nh, nkv) = (c.num_heads, c.num_kv_heads);
        if nkv == 0 || nh == 0 || !nh.is_multiple_of(nkv) {
            return Err(Error::Unsupported(format!(
                "{}: {nh} heads not divisible into {nkv} KV heads",
                c.architecture
            )));
        }
        let group = nh / nkv;
        let attention = if nkv >= world {
            let kv: Vec<_> = (0..world).map(|r| split(nkv, world, r)).collect();
            AttentionSplit::Heads {
                heads: kv.iter().map(|k| scale(k, group)).collect(),
                kv_heads: kv,
            }
        } else if world.is_multiple_of(nkv) && group.is_multiple_of(world / nkv) {
            let per = world / nkv;
            AttentionSplit::Heads {
                heads: (0..world)
                    .map(|r| shift(&split(group, per, r % per), (r / per) * group))
                    .collect(),
                kv_heads: (0..world).map(|r| r / per..r / per + 1).collect(),
            }
        } else {
            AttentionSplit::Replicated
        };
        // Bloom keeps q, k and v of a head together: it needs whole heads, which every split
        // above gives (it has as many KV heads as heads).
        if matches!(spec.qkv, Qkv::FusedPerHead(_)) && nh != nkv {
            return Err(Error::Unsupported(
                "per-head fused qkv needs as many KV heads as heads".into(),
            ));
        }
        let unit = if c.intermediate_size.is_multiple_of(32) {
            32
        } else {
            1
        };
        let units = c.intermediate_size / unit;
        if units < world {
            return Err(Error::Unsupported(format!(
                "MLP width {} too small for {world} ranks",
                c.intermediate_size
            )));
        }
        if c.vocab_size < world {
            return Err(Error::Unsupported(format!(
                "vocabulary {} too small for {world} ranks",
                c.vocab_size
            )));
        }
        Ok(ShardPlan {
            world,
            config: c.clone(),
            attention,
            ffn: (0..world)
                .map(|r| scale(&split(units, world, r), unit))
                .collect(),
            vocab: (0..world).map(|r| split(c.vocab_size, world, r)).collect(),
        })
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The full model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The bias names of the row-parallel layers (on rank 0 only; none with one rank).
    pub fn row_parallel_biases(&self) -> Result<Vec<String>> {
        if self.world < 2 {
            return Ok(Vec::new());
        }
        let mut v: Vec<String> = self
            .rules(1)?
            .into_iter()
            .filter(|(_, r)| matches!(r, Rule::Absent))
            .map(|(n, _)| n)
            .collect();
        v.sort();
        Ok(v)
    }

    /// True when attention is split (an all-reduce follows o_proj).
    pub fn splits_attention(&self) -> bool {
        matches!(self.attention, AttentionSplit::Heads { .. })
    }

    /// Rank `rank`'s query and KV heads (global indices).
    pub fn heads(&self, rank: usize) -> (Range<usize>, Range<usize>) {
        match &self.attention {
            AttentionSplit::Heads { heads, kv_heads } => (
                heads.get(rank).cloned().unwrap_or(0..0),
                kv_heads.get(rank).cloned().unwrap_or(0..0),
            ),
            AttentionSplit::Replicated => (0..self.config.num_heads, 0..self.config.num_kv_heads),
        }
    }

    /// The configuration rank `rank` runs: its heads, MLP width and vocabulary slice (+1 for
    /// the zero row of out-of-slice ids).
    pub fn local_config(&self, rank: usize) -> ModelConfig {
        let (h, kv) = self.heads(rank);
        let f = self.ffn.get(rank).cloned().unwrap_or(0..0);
        let v = self.vocab.get(rank).cloned().unwrap_or(0..0);
        ModelConfig {
            num_heads: h.len(),
            num_kv_heads: kv.len(),
            intermediate_size: f.len(),
            vocab_size: v.len() + 1,
            ..self.config.clone()
        }
    }

    /// `tokens` as rank `rank`'s local embedding rows (ids outside its slice → the zero row).
    pub fn local_ids(&self, rank: usize, tokens: &[u32]) -> Vec<u32> {
        let v = self.vocab.get(rank).cloned().unwrap_or(0..0);
        tokens
            .iter()
            .map(|&t| {
                if v.contains(&(t as usize)) {
                    (t as usize - v.start) as u32
                } else {
                    v.len() as u32
                }
            })
            .collect()
    }

    /// The slicing rules of rank `rank`, by tensor name (tensors not named are replicated).
    fn rules(&self, rank: usize) -> Result<HashMap<String, Rule>> {
        let c = &self.config;
        let spec = arch::lookup(&c.architecture)?;
        let hd = c.head_dim;
        let (h, kv) = self.heads(rank);
        let f = self.ffn.get(rank).cloned().unwrap_or(0..0);
        let mut m = HashMap::new();
        let both = |m: &mut HashMap<String, Rule>, n: &str, r: Rule| {
            m.insert(format!("{n}.bias"), r.clone());
            m.insert(format!("{n}.weight"), r);
        };
        for i in 0..c.num_layers {
            let ln = |n: &str| format!("{}{i}.{n}", spec.layer_prefix);
            let row_parallel = |m: &mut HashMap<String, Rule>, n: &str, cols: Range<usize>| {
                m.insert(format!("{n}.weight"), Rule::Cols(cols));
                if rank != 0 {
                    m.insert(format!("{n}.bias"), Rule::Absent);
                }
            };
            if self.splits_attention() {
                let (qd, kd) = (c.num_heads * hd, c.num_kv_heads * hd);
                match spec.qkv {
                    Qkv::Separate(q, k, v) => {
                        both(&mut m, &ln(q), Rule::Rows(vec![scale(&h, hd)]));
                        both(&mut m, &ln(k), Rule::Rows(vec![scale(&kv, hd)]));
                        both(&mut m, &ln(v), Rule::Rows(vec![scale(&kv, hd)]));
                    }
                    Qkv::Fused(n) => both(
                        &mut m,
                        &ln(n),
                        Rule::Rows(vec![
                            scale(&h, hd),
                            shift(&scale(&kv, hd), qd),
                            shift(&scale(&kv, hd), qd + kd),
                        ]),
                    ),
                    Qkv::FusedPerHead(n) => {
                        both(&mut m, &ln(n), Rule::Rows(vec![scale(&h, 3 * hd)]))
                    }
                    Qkv::Latent(_) => {} // refused by `ShardPlan::new`
                }
                row_parallel(&mut m, &ln(spec.o_proj), scale(&h, hd));
                if let Some(sk) = spec.attn_sinks {
                    m.insert(ln(sk), Rule::Rows(vec![h.clone()])); // one logit per query head
                }
            }
            match spec.mlp {
                Mlp::Gated(g, u, d) => {
                    both(&mut m, &ln(g), Rule::Rows(vec![f.clone()]));
                    both(&mut m, &ln(u), Rule::Rows(vec![f.clone()]));
                    row_parallel(&mut m, &ln(d), f.clone());
                }
                Mlp::GatedFused(gu, d) => {
                    let inter = c.intermediate_size;
                    both(
                        &mut m,
                        &ln(gu),
                        Rule::Rows(vec![f.clone(), shift(&f, inter)]),
                    );
                    row_parallel(&mut m, &ln(d), f.clone());
                }
                Mlp::Plain(u, d) => {
                    both(&mut m, &ln(u), Rule::Rows(vec![f.clone()]));
                    row_parallel(&mut m, &ln(d), f.clone());
                }
            }
        }
        let v = self.vocab.get(rank).cloned().unwrap_or(0..0);
        m.insert(format!("{}.weight", spec.embed), Rule::EmbedRows(v.clone()));
        m.insert(format!("{}.weight", spec.lm_head), Rule::Rows(vec![v]));
        Ok(m)
    }
}

/// How one tensor is cut for one rank.
#[derive(Clone, Debug)]
enum Rule {
    /// These rows of dim 0 (elements of a 1-D tensor), concatenated.
    Rows(Vec<Range<usize>>),
    /// These columns of a 2-D `[out, in]` weight (row-parallel layers).
    Cols(Range<usize>),
    /// These rows plus one zero row (the vocab-parallel embedding).
    EmbedRows(Range<usize>),
    /// Not on this rank (a row-parallel layer's bias lives on rank 0).
    Absent,
}

fn slice_rows(t: &Data, ranges: &[Range<usize>], zero_row: bool) -> Result<Data> {
    let dims = t.dims().to_vec();
    let rows = *dims.first().ok_or_else(|| Error::invalid("a 0-D tensor"))?;
    let bytes = t.bytes()?;
    let rb = if dims.len() == 1 {
        t.dtype().row_bytes(1)?
    } else {
        bytes.len() / rows.max(1)
    };
    let mut out = Vec::new();
    let mut n = 0;
    for r in ranges {
        if r.end > rows || r.start > r.end {
            return Err(Error::invalid(format!(
                "rows {r:?} of a tensor with {rows} rows"
            )));
        }
        out.extend_from_slice(bytes.get(r.start * rb..r.end * rb).unwrap_or(&[]));
        n += r.len();
    }
    if zero_row {
        out.resize(out.len() + rb, 0);
        n += 1;
    }
    let mut d = dims;
    d[0] = n;
    Data::from_bytes(t.dtype(), &d, &out)
}

fn slice_cols(t: &Data, cols: &Range<usize>) -> Result<Data> {
    let dims = t.dims();
    if dims.len() != 2 || cols.end > dims[1] || cols.start > cols.end {
        return Err(Error::invalid(format!(
            "columns {cols:?} of a tensor of dims {dims:?}"
        )));
    }
    let dt = t.dtype();
    let rb = dt.row_bytes(dims[1])?;
    let (c0, c1) = (dt.row_bytes(cols.start)?, dt.row_bytes(cols.end)?);
    let bytes = t.bytes()?;
    let mut out = Vec::with_capacity(dims[0] * (c1 - c0));
    for row in 0..dims[0] {
        out.extend_from_slice(bytes.get(row * rb + c0..row * rb + c1).unwrap_or(&[]));
    }
    Data::from_bytes(dt, &[dims[0], cols.len()], &out)
}

/// A rank's view of the full model's tensors: each tensor cut by the [`ShardPlan`].
pub struct ShardedSource {
    inner: Arc<dyn WeightSource>,
    rules: HashMap<String, Rule>,
}

impl ShardedSource {
    /// Rank `rank`'s tensors of `inner` under `plan`.
    pub fn new(inner: Arc<dyn WeightSource>, plan: &ShardPlan, rank: usize) -> Result<Self> {
        if rank >= plan.world {
            return Err(Error::invalid(format!(
                "rank {rank} of a {}-rank plan",
                plan.world
            )));
        }
        Ok(ShardedSource {
            inner,
            rules: plan.rules(rank)?,
        })
    }
}

impl WeightSource for ShardedSource {
    fn tensor(&self, name: &str) -> Result<Data> {
        let rule = self.rules.get(name);
        if matches!(rule, Some(Rule::Absent)) {
            return Err(Error::Unsupported(format!(
                "tensor '{name}' is held by rank 0"
            )));
        }
        let t = self.inner.tensor(name)?;
        let t = if t.is_contiguous() {
            t
        } else {
            t.to_owned_host()?
        };
        let r = match rule {
            None => return Ok(t),
            Some(Rule::Rows(rs)) => slice_rows(&t, rs, false),
            Some(Rule::EmbedRows(r)) => slice_rows(&t, std::slice::from_ref(r), true),
            Some(Rule::Cols(c)) => slice_cols(&t, c),
            Some(Rule::Absent) => Err(Error::invalid("absent")),
        };
        r.map_err(|e| Error::Unsupported(format!("sharding tensor '{name}': {e}")))
    }
    fn has(&self, name: &str) -> bool {
        !matches!(self.rules.get(name), Some(Rule::Absent)) && self.inner.has(name)
    }
    fn names(&self) -> Vec<String> {
        self.inner
            .names()
            .into_iter()
            .filter(|n| !matches!(self.rules.get(n), Some(Rule::Absent)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DataType;
    use crate::model::synthetic;

    fn cfg(nh: usize, nkv: usize) -> ModelConfig {
        ModelConfig {
            num_heads: nh,
            num_kv_heads: nkv,
            ..synthetic::config("llama-3-8b").unwrap()
        }
    }

    fn heads(p: &ShardPlan) -> Vec<(Range<usize>, Range<usize>)> {
        (0..p.world()).map(|r| p.heads(r)).collect()
    }

    #[test]
    fn attention_is_split_by_kv_groups() {
        // even
        let p = ShardPlan::new(&cfg(32, 8), 2).unwrap();
        assert_eq!(heads(&p), vec![(0..16, 0..4), (16..32, 4..8)]);
        // SmolLM2: 9 heads, 3 KV heads over 2 ranks: 1 and 2 groups
        let p = ShardPlan::new(&cfg(9, 3), 2).unwrap();
        assert_eq!(heads(&p), vec![(0..3, 0..1), (3..9, 1..3)]);
        assert_eq!(p.local_config(0).num_heads, 3);
        assert_eq!(p.local_config(1).num_kv_heads, 2);
        // one KV head shared by two ranks
        let p = ShardPlan::new(&cfg(4, 1), 2).unwrap();
        assert_eq!(heads(&p), vec![(0..2, 0..1), (2..4, 0..1)]);
        let p = ShardPlan::new(&cfg(8, 2), 4).unwrap();
        assert_eq!(
            heads(&p),
            vec![(0..2, 0..1), (2..4, 0..1), (4..6, 1..2), (6..8, 1..2)]
        );
        // cannot split: replicated
        let p = ShardPlan::new(&cfg(9, 1), 2).unwrap();
        assert_eq!(p.attention, AttentionSplit::Replicated);
        assert_eq!(heads(&p), vec![(0..9, 0..1), (0..9, 0..1)]);
    }

    /// o_proj and down_proj of every layer (rank 0 holds their biases), none on one rank.
    #[test]
    fn row_parallel_biases_name_o_and_down_of_each_layer() {
        let c = cfg(32, 8);
        let b = ShardPlan::new(&c, 2)
            .unwrap()
            .row_parallel_biases()
            .unwrap();
        assert_eq!(b.len(), 2 * c.num_layers, "{b:?}");
        assert!(
            b.contains(&"model.layers.0.self_attn.o_proj.bias".to_string()),
            "{b:?}"
        );
        assert!(
            b.contains(&"model.layers.31.mlp.down_proj.bias".to_string()),
            "{b:?}"
        );
        let one = ShardPlan::new(&c, 1)
            .unwrap()
            .row_parallel_biases()
            .unwrap();
        assert!(one.is_empty());
    }

    #[test]
    fn mlp_and_vocab_ranges_cover_everything_once() {
        let p = ShardPlan::new(&cfg(32, 8), 3).unwrap();
        assert_eq!(p.ffn, vec![0..4768, 4768..9536, 9536..14336]);
        assert!(p.ffn.iter().all(|r| r.start % 32 == 0));
        assert_eq!(p.vocab[0].start, 0);
        assert_eq!(p.vocab[2].end, 128256);
        assert_eq!(p.vocab[0].end, p.vocab[1].start);
        assert_eq!(p.local_ids(1, &[0, 42752, 42753]), vec![42752, 0, 1]);
    }

    #[test]
    fn slices_rows_cols_and_blocks() {
        let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let t = Data::from_f32(&[4, 6], &v).unwrap();
        let r = slice_rows(&t, &[1..2, 3..4], true).unwrap();
        assert_eq!(r.dims(), &[3, 6]);
        assert_eq!(
            r.to_f32_vec().unwrap(),
            [6., 7., 8., 9., 10., 11., 18., 19., 20., 21., 22., 23., 0., 0., 0., 0., 0., 0.]
        );
        let c = slice_cols(&t, &(2..4)).unwrap();
        assert_eq!(
            c.to_f32_vec().unwrap(),
            [2., 3., 8., 9., 14., 15., 20., 21.]
        );
        let b = Data::from_f32(&[4], &[1., 2., 3., 4.]).unwrap();
        assert_eq!(
            slice_rows(&b, std::slice::from_ref(&(2..4)), false)
                .unwrap()
                .to_f32_vec()
                .unwrap(),
            [3., 4.]
        );
        // Q8_0: columns must fall on 32-element blocks
        let w: Vec<f32> = (0..128).map(|i| (i % 7) as f32 * 0.1).collect();
        let q = Data::from_bytes(
            DataType::Q8_0,
            &[2, 64],
            &crate::data::encode_from_f32(DataType::Q8_0, &w).unwrap(),
        )
        .unwrap();
        let qc = slice_cols(&q, &(32..64)).unwrap();
        let full = q.to_f32_vec().unwrap();
        let part = qc.to_f32_vec().unwrap();
        assert_eq!(&part[..32], &full[32..64]);
        assert_eq!(&part[32..], &full[96..128]);
        assert!(slice_cols(&q, &(16..48)).is_err());
    }
}
