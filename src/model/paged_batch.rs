//! What a paged step is, shared by the model, its paged pool and a tensor-parallel group's
//! ranks: the planned rows of one step ([`PagedBatch`]) and how steps of one token per
//! sequence run ([`BatchDecode`], padded to [`BATCH_BUCKETS`]).

/// One planned paged step: the rows to run and where their keys and values go.
#[derive(Clone, Debug)]
pub(crate) struct PagedBatch {
    pub tokens: Vec<u32>,
    pub pos: Vec<i32>,
    pub rows: Vec<i32>,
    pub slots: Vec<i32>,
    pub q_starts: Vec<i32>,
    pub kv_lens: Vec<i32>,
    pub table: Vec<i32>,
    pub seqs: usize,
    pub max_blocks: usize,
}

/// How a paged step whose items all carry one token runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchDecode {
    /// Op by op over exactly the step's rows (`PagedCacheWrite` + `PagedAttention`).
    Off,
    /// Padded to a bucket with device-side index arrays (`PagedDecodeAttention`), op by op.
    Eager,
    /// [`BatchDecode::Eager`] recorded once per bucket and key-count class, then replayed.
    Graphs,
}

/// The row counts a batched decode step is padded to; larger batches run op by op.
pub const BATCH_BUCKETS: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
