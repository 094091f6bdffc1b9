//! The host-side index arguments of `PagedAttention` (block size, `q_starts`, `kv_lens`,
//! `block_tables`), checked the same way by every device that runs the op.

use crate::error::{Error, Result};

/// The index arguments of a paged attention call, read on the host.
pub(crate) struct BlockTables<'a> {
    /// Where each sequence's query rows start, then the row count (`sequences + 1` values).
    pub q_starts: &'a [i32],
    /// Keys cached per sequence, the new ones included.
    pub kv_lens: &'a [i32],
    /// The block tables, `tables` rows of `max_blocks` block ids.
    pub table: &'a [i32],
    /// Rows of `table`.
    pub tables: usize,
    /// Block ids per row of `table`.
    pub max_blocks: usize,
}

/// One sequence of a paged attention call.
pub(crate) struct SeqRows<'a> {
    /// First query row.
    pub q_start: usize,
    /// One past its last query row.
    pub q_end: usize,
    /// Keys cached for it, the new ones included.
    pub kv_len: usize,
    /// The ids of the blocks holding those keys, in order.
    pub blocks: &'a [i32],
}

/// Checks `t` for `op` over `rows` query rows and a cache of `slots` slots in blocks of
/// `block_size` (which must divide them): the tables agree on the number of sequences,
/// `q_starts` runs from 0 to `rows`, each sequence has at most as many new rows as keys and a
/// table row long enough for them, and every block id it reads is in the pool. Returns the
/// block size and the sequences.
pub(crate) fn check_block_tables<'a>(
    op: &str,
    rows: usize,
    slots: usize,
    block_size: i32,
    t: &BlockTables<'a>,
) -> Result<(usize, Vec<SeqRows<'a>>)> {
    let (qs, kl, maxb) = (t.q_starts, t.kv_lens, t.max_blocks);
    if block_size <= 0 || !slots.is_multiple_of(block_size as usize) {
        return Err(Error::op(
            op,
            format!("block_size {block_size} does not divide the {slots} cache slots"),
        ));
    }
    let bs = block_size as usize;
    let nseq = kl.len();
    if qs.len() != nseq + 1 || t.tables != nseq {
        return Err(Error::op(
            op,
            format!(
                "{} q_starts, {nseq} kv_lens and {} block tables disagree",
                qs.len(),
                t.tables
            ),
        ));
    }
    if qs.first() != Some(&0) || qs.last().map(|&v| v as usize) != Some(rows) {
        return Err(Error::op(op, format!("q_starts must run from 0 to {rows}")));
    }
    let n_blocks = (slots / bs) as i64;
    let mut seqs = Vec::with_capacity(nseq);
    for s in 0..nseq {
        let (a, b, len) = (qs[s], qs[s + 1], kl[s]);
        if a > b || len < 0 || (b - a) > len {
            return Err(Error::op(
                op,
                format!("sequence {s}: query rows {a}..{b} with {len} cached keys"),
            ));
        }
        let need_blocks = (len as usize).div_ceil(bs);
        if need_blocks > maxb {
            return Err(Error::op(
                op,
                format!("sequence {s}: {len} keys need {need_blocks} blocks, table has {maxb}"),
            ));
        }
        let blocks = t
            .table
            .get(s * maxb..s * maxb + need_blocks)
            .ok_or_else(|| Error::op(op, format!("sequence {s}: block table too short")))?;
        if let Some(bad) = blocks.iter().find(|&&b| b < 0 || b as i64 >= n_blocks) {
            return Err(Error::op(
                op,
                format!("sequence {s}: block id {bad} outside the pool of {n_blocks}"),
            ));
        }
        seqs.push(SeqRows {
            q_start: a as usize,
            q_end: b as usize,
            kv_len: len as usize,
            blocks,
        });
    }
    Ok((bs, seqs))
}
