//! The state a paged pool keeps for its padded decode steps (`model::paged_graph`): one
//! [`Bucket`] per padded row count, with the device tensors the recorded work reads at fixed
//! addresses and its recordings per key-count class.

use super::paged_batch::PagedBatch;
use super::replay::{Recording, StepBufs};
use super::transformer::SCRATCH_BUFS;
use crate::data::{Data, DataType};
use crate::device::BaseDevice;
use crate::error::{Error, Result};

/// The padded buckets of one pool (see the module doc).
#[derive(Default)]
pub(crate) struct BatchGraphs {
    /// `Model::id` of the model whose weights the recordings hold.
    pub(super) model: u64,
    pub(super) buckets: Vec<Bucket>,
    pub(super) failures: usize,
}

/// One bucket's device tensors and recordings.
pub(super) struct Bucket {
    pub(super) rows: usize,
    /// Block-table entries per row.
    pub(super) width: usize,
    /// The ids, positions, working tensors and logits of the padded step.
    pub(super) step: StepBufs,
    pub(super) slots: Data,
    pub(super) lens: Data,
    pub(super) tables: Data,
    /// The block tables last written to `tables`.
    pub(super) tables_host: Vec<i32>,
    /// (key-count class, recording).
    pub(super) recordings: Vec<(usize, Recording)>,
    /// Classes that have run once without recording.
    pub(super) sized: Vec<usize>,
}

impl Bucket {
    /// A bucket of `rows` rows and `width` block-table entries per row on `dev`.
    pub(super) fn new(dev: &dyn BaseDevice, rows: usize, width: usize) -> Result<Bucket> {
        let up = |dims: &[usize]| dev.upload(&Data::zeros(DataType::I32, dims)?);
        Ok(Bucket {
            rows,
            width,
            step: StepBufs::new(dev, rows, SCRATCH_BUFS)?,
            slots: up(&[rows])?,
            lens: up(&[rows])?,
            tables: up(&[rows, width])?,
            tables_host: vec![0; rows * width],
            recordings: Vec::new(),
            sized: Vec::new(),
        })
    }

    /// Writes the step's values, padded to the bucket.
    pub(super) fn write(&mut self, dev: &dyn BaseDevice, b: &PagedBatch) -> Result<()> {
        let (n, rows, w) = (b.seqs, self.rows, self.width);
        let pad = |v: &[i32], fill: i32| -> Vec<i32> {
            let mut out = v.to_vec();
            out.resize(rows, fill);
            out
        };
        let ids: Vec<i32> = b.tokens.iter().map(|&t| t as i32).collect();
        dev.write(&Data::from_i32(&[rows], &pad(&ids, 0))?, &mut self.step.ids)?;
        dev.write(
            &Data::from_i32(&[rows], &pad(&b.pos, 0))?,
            &mut self.step.pos,
        )?;
        dev.write(
            &Data::from_i32(&[rows], &pad(&b.slots, -1))?,
            &mut self.slots,
        )?;
        dev.write(
            &Data::from_i32(&[rows], &pad(&b.kv_lens, 0))?,
            &mut self.lens,
        )?;
        let mut t = vec![0i32; rows * w];
        for s in 0..n {
            let src = b.table.get(s * b.max_blocks..(s + 1) * b.max_blocks);
            let src = src.ok_or_else(|| Error::invalid("paged step: short block table"))?;
            let used = src.len().min(w);
            t[s * w..s * w + used].copy_from_slice(&src[..used]);
        }
        if t != self.tables_host {
            dev.write(&Data::from_i32(&[rows, w], &t)?, &mut self.tables)?;
            self.tables_host = t;
        }
        Ok(())
    }
}
