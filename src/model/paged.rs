//! The paged KV cache: a [`PagedKvPool`] of fixed-size blocks shared by many sequences, each
//! sequence holding a block table ([`PagedSeqState`]); plus optional prefix caching of full
//! blocks.
//!
//! Prefix caching: when a block of a sequence is full, it is registered under the hash of its
//! tokens chained with the hash of everything before it. A block is reference-counted; when no
//! sequence holds a registered block any more it stays cached (evictable, least recently
//! released first) instead of going back to the free list, and a new sequence whose tokens start
//! with the same full blocks takes them (`match_prefix`) and skips their prefill. A cached block
//! is immutable: only full blocks are registered, a sequence never writes at positions before its
//! length, and the forward pass refuses to write into a block that is registered or shared. A
//! lookup compares the block's tokens exactly and its parent block (id and reuse generation), so a
//! hash collision can cause a miss but never a wrong hit: a sequence only ever reads keys and
//! values computed from exactly its own tokens.

use super::kv_dtype::KvDtype;
use super::paged_buckets::BatchGraphs;
use super::tp_group::RemotePool;
use super::transformer::Model;
use crate::data::{Data, DataType, DeviceKind};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

/// The registration of a cached full block.
struct CacheKey {
    hash: u64,
    /// The block before it in the sequence that filled it: (id, generation).
    parent: Option<(u32, u32)>,
    tokens: Box<[u32]>,
}

#[derive(Default)]
struct BlockMeta {
    /// Sequences holding the block.
    refs: u32,
    /// Bumped every time the block is reused for other contents.
    gen: u32,
    /// Set while the block is registered in the prefix cache.
    key: Option<CacheKey>,
    /// Position in the LRU list while cached and unreferenced.
    lru_tick: u64,
}

/// A pool of fixed-size KV blocks shared by many sequences (the paged KV cache).
pub struct PagedKvPool {
    pub(super) k: Vec<Data>,
    pub(super) v: Vec<Data>,
    free: Vec<u32>,
    n_blocks: usize,
    pub(super) block_size: usize,
    pub(super) nkv: usize,
    pub(super) head_dim: usize,
    meta: Vec<BlockMeta>,
    prefix_caching: bool,
    /// Chained hash -> registered block.
    cached: HashMap<u64, u32>,
    /// Registered blocks that no sequence holds, oldest release first (tick -> block).
    lru: BTreeMap<u64, u32>,
    tick: u64,
    /// Set when the storage lives on the ranks of a tensor-parallel group (this pool then
    /// keeps only the books: block tables, free list, prefix cache).
    pub(super) remote: Option<RemotePool>,
    /// The padded decode steps recorded over this pool's storage (`paged_graph`).
    pub(super) graphs: Option<BatchGraphs>,
}

const HASH_SEED: u64 = 0x6661_7374_6c6c_6d00;

fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl PagedKvPool {
    /// A pool of `n_blocks` blocks of `block_size` tokens for `model` (prefix caching off).
    pub fn new(model: &Model, n_blocks: usize, block_size: usize) -> Result<PagedKvPool> {
        let c = model.config();
        if n_blocks == 0 || block_size == 0 {
            return Err(Error::invalid(
                "paged KV pool needs at least one block of at least one token",
            ));
        }
        if n_blocks > u32::MAX as usize {
            return Err(Error::invalid("paged KV pool: too many blocks"));
        }
        let slots = n_blocks
            .checked_mul(block_size)
            .ok_or_else(|| Error::invalid("paged KV pool size overflows"))?;
        // on a GPU (or other non-CPU) model the pool lives on that device from the start, so
        // the cache ops never move it
        let dev = model
            .executor()
            .devices()
            .first()
            .filter(|d| d.kind() != DeviceKind::Cpu);
        let dtype = Self::kv_dtype(model);
        let hds = KvDtype::of(dtype).map_or(c.head_dim, |k| k.stored_head_dim(c.head_dim));
        let layer = || -> Result<Data> {
            let d = Data::zeros(dtype, &[slots, c.num_kv_heads, hds])?;
            match dev {
                Some(dev) => dev.upload(&d),
                None => Ok(d),
            }
        };
        // a tensor-parallel model keeps the storage on its ranks
        let remote = match model.group() {
            Some(g) => Some(g.new_pool(n_blocks, block_size)?),
            None => None,
        };
        let layers = if remote.is_some() { 0 } else { c.num_layers };
        let mut k = Vec::with_capacity(layers);
        let mut v = Vec::with_capacity(layers);
        for _ in 0..layers {
            k.push(layer()?);
            v.push(layer()?);
        }
        Ok(PagedKvPool {
            k,
            v,
            free: (0..n_blocks as u32).rev().collect(),
            n_blocks,
            block_size,
            nkv: c.num_kv_heads,
            head_dim: c.head_dim,
            meta: (0..n_blocks).map(|_| BlockMeta::default()).collect(),
            prefix_caching: false,
            cached: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            remote,
            graphs: None,
        })
    }

    /// The element type of `model`'s pool: the model's KV dtype ([`Model::kv_dtype`]), on a
    /// device other than the CPU where its paged decode attention (`PagedDecodeAttention`)
    /// reads it (a dtype the device stores), else f32; f32 for a tensor-parallel group.
    pub fn kv_dtype(model: &Model) -> DataType {
        let dt = model.kv_dtype().data_type();
        match model.executor().devices().first() {
            _ if model.group().is_some() => DataType::F32,
            Some(d) if d.kind() != DeviceKind::Cpu => {
                let paged = d.ops().contains_key("PagedDecodeAttention");
                if paged && d.kv_dtypes().contains(&dt) {
                    dt
                } else {
                    DataType::F32
                }
            }
            _ => dt,
        }
    }

    /// Turns prefix caching on or off. Turning it off drops every cached block that no
    /// sequence holds (and stops registering new ones).
    pub fn set_prefix_caching(&mut self, on: bool) {
        self.prefix_caching = on;
        if !on {
            while let Some((_, b)) = self.lru.pop_first() {
                self.unregister(b);
                self.free.push(b);
            }
        }
    }

    /// True when full blocks are cached for reuse.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Bytes one block takes across all layers (K and V).
    pub fn block_bytes(model: &Model, block_size: usize) -> usize {
        let kd = KvDtype::of(Self::kv_dtype(model)).unwrap_or(KvDtype::F32);
        block_size * kd.bytes_per_token(model.config())
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }
    /// Blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.n_blocks
    }
    /// Blocks that can be allocated: free ones plus cached ones no sequence holds (evicted,
    /// least recently released first, when needed).
    pub fn free_blocks(&self) -> usize {
        self.free.len() + self.lru.len()
    }
    /// Cached blocks that no sequence holds (counted in [`free_blocks`](Self::free_blocks)).
    pub fn cached_blocks(&self) -> usize {
        self.lru.len()
    }

    /// Takes a block for writing: a free one, else the least recently released cached one.
    pub(super) fn alloc(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.lru.pop_first()?;
                self.unregister(b);
                b
            }
        };
        if let Some(m) = self.meta.get_mut(b as usize) {
            m.refs = 1;
        }
        Some(b)
    }

    /// Removes `b` from the cache index and marks its contents as replaced.
    fn unregister(&mut self, b: u32) {
        let Some(m) = self.meta.get_mut(b as usize) else {
            return;
        };
        if let Some(key) = m.key.take() {
            if self.cached.get(&key.hash) == Some(&b) {
                self.cached.remove(&key.hash);
            }
        }
        m.gen = m.gen.wrapping_add(1);
    }

    /// True when `b` may be written by the sequence holding it: held by exactly one sequence
    /// and not registered in the prefix cache.
    pub(super) fn writable(&self, b: u32) -> bool {
        self.meta
            .get(b as usize)
            .is_some_and(|m| m.refs == 1 && m.key.is_none())
    }

    /// Returns a finished sequence's blocks to the pool (cached ones stay cached).
    pub fn release(&mut self, st: &mut PagedSeqState) {
        for b in st.blocks.drain(..) {
            let Some(m) = self.meta.get_mut(b as usize) else {
                continue;
            };
            m.refs = m.refs.saturating_sub(1);
            if m.refs > 0 {
                continue;
            }
            if m.key.is_some() && self.prefix_caching {
                self.tick += 1;
                m.lru_tick = self.tick;
                self.lru.insert(self.tick, b);
            } else {
                if m.key.is_some() {
                    self.unregister(b);
                }
                self.free.push(b);
            }
        }
        st.len = 0;
        st.hashes.clear();
        st.pending.clear();
    }

    /// For a sequence with nothing cached yet: takes the cached full blocks its `tokens` start
    /// with (always leaving at least the last token to compute) and returns how many tokens
    /// they cover (0 when prefix caching is off or nothing matches).
    pub fn match_prefix(&mut self, st: &mut PagedSeqState, tokens: &[u32]) -> usize {
        if !self.prefix_caching || !st.blocks.is_empty() || st.len != 0 {
            return 0;
        }
        let bs = self.block_size;
        let max_blocks = tokens.len().saturating_sub(1) / bs;
        let mut prev_hash = HASH_SEED;
        let mut parent: Option<(u32, u32)> = None;
        for chunk in tokens.chunks_exact(bs).take(max_blocks) {
            let h = chain_hash(prev_hash, chunk);
            let Some(&b) = self.cached.get(&h) else {
                break;
            };
            let Some(m) = self.meta.get_mut(b as usize) else {
                break;
            };
            let ok = m
                .key
                .as_ref()
                .is_some_and(|k| k.parent == parent && *k.tokens == *chunk);
            if !ok {
                break;
            }
            if m.refs == 0 {
                self.lru.remove(&m.lru_tick);
            }
            m.refs += 1;
            parent = Some((b, m.gen));
            prev_hash = h;
            st.blocks.push(b);
            st.hashes.push(h);
        }
        st.len = st.blocks.len() * bs;
        st.len
    }

    /// Records that `toks` were written after the sequence's previous length (already
    /// advanced) and registers the blocks they filled.
    pub(super) fn commit(&mut self, st: &mut PagedSeqState, toks: &[u32]) {
        if !self.prefix_caching {
            return;
        }
        let bs = self.block_size;
        st.pending.extend_from_slice(toks);
        while st.pending.len() >= bs {
            let i = st.hashes.len();
            let (Some(&b), prev) = (st.blocks.get(i), i.checked_sub(1)) else {
                st.pending.clear();
                return;
            };
            let chunk = &st.pending[..bs];
            let prev_hash = prev.and_then(|p| st.hashes.get(p).copied());
            let h = chain_hash(prev_hash.unwrap_or(HASH_SEED), chunk);
            let parent = prev
                .and_then(|p| st.blocks.get(p))
                .and_then(|&pb| self.meta.get(pb as usize).map(|m| (pb, m.gen)));
            let fresh = !self.cached.contains_key(&h);
            if let Some(m) = self.meta.get_mut(b as usize) {
                if fresh && m.key.is_none() && m.refs == 1 {
                    m.key = Some(CacheKey {
                        hash: h,
                        parent,
                        tokens: chunk.into(),
                    });
                    self.cached.insert(h, b);
                }
            }
            st.hashes.push(h);
            st.pending.drain(..bs);
        }
    }
}

/// One sequence's place in a [`PagedKvPool`]: its block table and length.
#[derive(Default, Debug)]
pub struct PagedSeqState {
    pub(super) blocks: Vec<u32>,
    pub(super) len: usize,
    /// Chained hashes of the full blocks seen so far (prefix caching).
    hashes: Vec<u64>,
    /// Tokens after the last full block (prefix caching).
    pending: Vec<u32>,
}

impl PagedSeqState {
    /// An empty sequence.
    pub fn new() -> Self {
        Self::default()
    }
    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Blocks held.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forward pass refuses to write into a block that another sequence shares or that is
    /// registered in the prefix cache, and changes nothing when it refuses.
    #[test]
    fn shared_or_cached_blocks_are_never_written() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/tiny/llama");
        let out =
            std::env::temp_dir().join(format!("fastllm-paged-unit-{}.flm", std::process::id()));
        crate::convert::convert(&dir, &out, &Default::default(), &mut |_| {}).unwrap();
        let llm = crate::load::load(&out, &Default::default()).unwrap();
        let _ = std::fs::remove_file(&out);
        let m = &llm.model;
        let mut pool = PagedKvPool::new(m, 8, 4).unwrap();
        pool.set_prefix_caching(true);
        let toks: Vec<u32> = (1..=9).collect();
        let mut a = PagedSeqState::new();
        m.forward_paged(&mut pool, &mut [(&mut a, &toks[..])])
            .unwrap();
        let mut b = PagedSeqState::new();
        assert_eq!(pool.match_prefix(&mut b, &toks), 8);
        let free = pool.free_blocks();
        // rewound into the shared blocks (b) or into its own registered block (a)
        b.len = 5;
        a.len = 4;
        for st in [&mut b, &mut a] {
            let e = m
                .forward_paged(&mut pool, &mut [(st, &[7u32][..])])
                .unwrap_err()
                .to_string();
            assert!(e.contains("shared or cached"), "{e}");
            assert_eq!(pool.free_blocks(), free);
        }
        a.len = 9;
        b.len = 8;
        pool.release(&mut a);
        pool.release(&mut b);
        assert_eq!(pool.free_blocks(), 8);
        assert_eq!(pool.cached_blocks(), 2);
    }
}
