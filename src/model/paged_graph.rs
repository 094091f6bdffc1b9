//! Batched decode steps over the paged KV pool, padded to a bucket of rows and, on a device
//! that records work (CUDA graphs), recorded once per bucket and replayed.
//!
//! A paged step whose items each carry one token is padded to the next size of
//! [`BATCH_BUCKETS`]. Its per-step values (token ids, positions, KV write slots, key counts and
//! block tables) are written into device tensors that the bucket keeps at fixed addresses; the
//! attention (`PagedDecodeAttention`) reads them there, so the recorded work does not depend on
//! host-side lengths and replays as sequences grow, join or leave. Padding rows embed token 0 at
//! position 0, store nothing (slot −1) and see no key (length 0); their logits are ignored.
//! A bucket keeps one recording per key-count class (the longest row's keys rounded up to a
//! power of two), since the attention's split count follows it. The first step of a class runs
//! the same ops directly (every buffer gets its size); the next is recorded and replayed from
//! then on. Prefill chunks and mixed steps run op by op through `PagedAttention`.

use super::paged::{PagedKvPool, PagedSeqState};
use super::paged_batch::{BatchDecode, PagedBatch, BATCH_BUCKETS};
use super::paged_buckets::{BatchGraphs, Bucket};
use super::replay::{replay_or_record, Recorded, StepBufs, MAX_FAILURES};
use super::step_kv::{Layers, Qkv, StepArrays, StepAttention, StepKv};
use super::transformer::Model;
use crate::data::Data;
use crate::device::BaseDevice;
use crate::error::{Error, Result};
use crate::step::{Call, Step, TensorId};

/// Smallest key-count class (the attention's shortest split).
const MIN_CLASS: usize = 256;

/// The key-count class of a step whose longest row has `max_len` keys.
fn key_class(max_len: usize, cap: usize) -> usize {
    max_len.next_power_of_two().max(MIN_CLASS).min(cap.max(1))
}

/// What one padded decode step runs on.
struct DecodeRun<'a> {
    dev: &'a dyn BaseDevice,
    block_size: usize,
    class: usize,
}

/// The KV store of a padded decode step: `PagedDecodeAttention` over the bucket's arrays.
struct DecodeKv<'a> {
    layers: Layers<'a>,
    /// The write slots, key counts and block tables, and the workspace.
    arrays: StepArrays<'a, 3>,
    block_size: i32,
    max_keys: i32,
}

impl<'a> StepKv<'a> for DecodeKv<'a> {
    fn attend(
        &mut self,
        st: &mut Step<'a>,
        layer: usize,
        x: Qkv,
        p: &StepAttention,
        out: TensorId,
    ) -> Result<()> {
        let ([slots, lens, tables], workspace) = self.arrays.get(st)?;
        let (kc, vc) = self.layers.get(st, layer)?;
        let c = Call::new("PagedDecodeAttention")
            .input("q", x.q)
            .input("k", x.k)
            .input("v", x.v)
            .output("k_cache", kc)
            .output("v_cache", vc)
            .input("slots", slots)
            .input("kv_lens", lens)
            .input("block_tables", tables)
            .output("workspace", workspace)
            .int("block_size", self.block_size)
            .int("max_keys", self.max_keys);
        st.push(p.args(c, out));
        Ok(())
    }
}

impl Model {
    /// The bucket a decode step of `b` takes, or `None` when it runs op by op (batch decode
    /// off, a prompt chunk in the step, more rows than the largest bucket, profiling).
    pub(super) fn decode_bucket(&self, b: &PagedBatch) -> Option<usize> {
        if self.batch_decode() == BatchDecode::Off
            || b.tokens.len() != b.seqs
            || self.executor().profiler().enabled()
        {
            return None;
        }
        BATCH_BUCKETS.iter().copied().find(|&r| r >= b.seqs)
    }

    /// Runs the decode step `b` padded to `rows` rows (see the module doc); returns the bucket's
    /// logits [rows, vocab] on the device (rows past `b.seqs` are padding).
    pub(super) fn paged_decode_step<'p>(
        &self,
        pool: &'p mut PagedKvPool,
        b: &PagedBatch,
        rows: usize,
    ) -> Result<&'p Data> {
        let dev = self
            .executor()
            .devices()
            .first()
            .cloned()
            .ok_or_else(|| Error::invalid("batched decode needs a device"))?;
        let bs = pool.block_size;
        let width = (self.config().context_length.div_ceil(bs))
            .min(pool.total_blocks())
            .max(1);
        let graphs = pool.graphs.get_or_insert_with(Default::default);
        if graphs.model != self.id() {
            *graphs = BatchGraphs {
                model: self.id(),
                ..Default::default()
            };
        }
        let i = match graphs.buckets.iter().position(|k| k.rows == rows) {
            Some(i) => i,
            None => {
                graphs.buckets.push(Bucket::new(dev.as_ref(), rows, width)?);
                graphs.buckets.len() - 1
            }
        };
        let max_len = b.kv_lens.iter().copied().max().unwrap_or(1).max(1) as usize;
        let class = key_class(max_len, width * bs);
        let record = self.batch_decode() == BatchDecode::Graphs && graphs.failures < MAX_FAILURES;
        let step = DecodeRun {
            dev: dev.as_ref(),
            block_size: bs,
            class,
        };
        let bucket = graphs
            .buckets
            .get_mut(i)
            .ok_or_else(|| Error::invalid("batched decode bucket"))?;
        bucket.write(dev.as_ref(), b)?;
        let outcome = match record {
            true => self.replay_bucket(&step, bucket, &mut pool.k, &mut pool.v)?,
            false => Recorded::NotTried,
        };
        if let Recorded::Failed(why) = &outcome {
            eprintln!(
                "fastllm: batched decode step not recorded as a graph ({why}); running it op by op"
            );
        }
        if !matches!(outcome, Recorded::Replayed) {
            if matches!(outcome, Recorded::NotReplayed | Recorded::Failed(_)) {
                graphs.failures += 1;
            }
            let bucket = graphs
                .buckets
                .get_mut(i)
                .ok_or_else(|| Error::invalid("batched decode bucket"))?;
            self.decode_ops(bucket, &mut pool.k, &mut pool.v, bs, class)?;
            if !bucket.sized.contains(&class) {
                bucket.sized.push(class);
            }
        }
        graphs
            .buckets
            .get(i)
            .map(|b| &b.step.logits)
            .ok_or_else(|| Error::invalid("batched decode bucket"))
    }

    /// Replays the bucket's recording of `step.class`, or records it when that class has run
    /// once already ([`replay_or_record`]).
    fn replay_bucket(
        &self,
        step: &DecodeRun,
        bucket: &mut Bucket,
        k: &mut [Data],
        v: &mut [Data],
    ) -> Result<Recorded> {
        let class = step.class;
        let mut rec = match bucket.recordings.iter().position(|r| r.0 == class) {
            Some(j) => Some(bucket.recordings.swap_remove(j).1),
            None => None,
        };
        let sized = bucket.sized.contains(&class);
        let r = replay_or_record(step.dev, &mut rec, sized, || {
            self.decode_ops(bucket, k, v, step.block_size, class)
        });
        if let Some(rec) = rec {
            bucket.recordings.push((class, rec));
        }
        r
    }

    /// The ops of one padded decode step (recorded or run directly).
    fn decode_ops(
        &self,
        bucket: &mut Bucket,
        k: &mut [Data],
        v: &mut [Data],
        block_size: usize,
        class: usize,
    ) -> Result<()> {
        let Bucket {
            rows,
            step,
            slots,
            lens,
            tables,
            ..
        } = bucket;
        let StepBufs {
            ids,
            pos,
            bufs,
            workspace,
            logits,
        } = step;
        let mut kv = DecodeKv {
            layers: Layers::new(k, v),
            arrays: StepArrays::new([slots, lens, tables], workspace),
            block_size: i32::try_from(block_size).map_err(|_| Error::invalid("block size"))?,
            max_keys: i32::try_from(class).unwrap_or(i32::MAX),
        };
        let all: Vec<i32> = (0..*rows as i32).collect();
        self.layers(ids, pos, &all, &mut kv, bufs, logits, true)
    }
}

/// Runs the padded decode step of every bucket of up to `max_rows` rows over throwaway
/// sequences of `pool` (one eager step that sizes the bucket's buffers, one that records it, one
/// replay), so that a server's first requests neither compile kernels nor record graphs for
/// short sequences (longer key-count classes are recorded when first reached); then two prompt
/// steps (`warm_prompt_steps`). Every block taken is returned and prefix caching is left as
/// it was. Returns the buckets warmed: none when batched decode is off, and only those whose
/// sequences fit the free blocks.
pub fn warm_batch_decode(model: &Model, pool: &mut PagedKvPool, max_rows: usize) -> Result<usize> {
    if model.batch_decode() == BatchDecode::Off {
        return Ok(0);
    }
    let caching = pool.prefix_caching();
    pool.set_prefix_caching(false);
    let mut warmed = 0;
    let mut result = Ok(());
    for &rows in BATCH_BUCKETS.iter().filter(|&&r| r <= max_rows.max(1)) {
        if rows > pool.free_blocks() {
            break;
        }
        let mut seqs: Vec<PagedSeqState> = (0..rows).map(|_| PagedSeqState::new()).collect();
        for step in 0..3u32 {
            let toks: Vec<[u32; 1]> = (0..rows).map(|_| [step]).collect();
            let mut items: Vec<(&mut PagedSeqState, &[u32])> = seqs
                .iter_mut()
                .zip(&toks)
                .map(|(s, t)| (s, t.as_slice()))
                .collect();
            if let Err(e) = model.forward_paged_greedy(pool, &mut items) {
                result = Err(e);
                break;
            }
        }
        for s in seqs.iter_mut() {
            pool.release(s);
        }
        if result.is_err() {
            break;
        }
        warmed += 1;
    }
    if result.is_ok() {
        result = warm_prompt_steps(model, pool);
    }
    pool.set_prefix_caching(caching);
    result.map(|()| warmed)
}

/// Prompt tokens per sequence of the first warm prompt step, and of the second.
const WARM_PROMPT: [usize; 2] = [64, 5];

/// Runs two prompt steps over up to 4 throwaway sequences of `pool`: chunks of 64 tokens, then
/// 5 more after them, the shapes of a server's first wave of requests (a prompt step of a few
/// hundred rows, then chunks after cached keys), so that what those steps set up on first use
/// (buffer sizes, library handles) is done before the server says ready. Every block taken is
/// returned.
fn warm_prompt_steps(model: &Model, pool: &mut PagedKvPool) -> Result<()> {
    let per_seq = WARM_PROMPT
        .iter()
        .sum::<usize>()
        .div_ceil(pool.block_size().max(1));
    let n = (pool.free_blocks() / per_seq.max(1)).min(4);
    let mut seqs: Vec<PagedSeqState> = (0..n).map(|_| PagedSeqState::new()).collect();
    let mut result = Ok(());
    for len in WARM_PROMPT {
        // tokens 0 and 1, which every vocabulary has
        let toks: Vec<Vec<u32>> = (0..n)
            .map(|_| (0..len as u32).map(|i| i % 2).collect())
            .collect();
        let mut items: Vec<(&mut PagedSeqState, &[u32])> = seqs
            .iter_mut()
            .zip(&toks)
            .map(|(s, t)| (s, t.as_slice()))
            .collect();
        if n > 0 {
            if let Err(e) = model.forward_paged_greedy(pool, &mut items) {
                result = Err(e);
                break;
            }
        }
    }
    for s in seqs.iter_mut() {
        pool.release(s);
    }
    result
}
