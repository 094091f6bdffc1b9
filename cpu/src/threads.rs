//! `Threads`: the CPU device's worker pool (rayon) and the one way kernels split work across it.
//! Small jobs run inline on the caller's thread to keep per-op overhead low.

use std::ops::Range;

/// A fixed-size worker pool.
pub struct Threads {
    pool: Option<rayon::ThreadPool>,
    n: usize,
}

impl Threads {
    /// A pool of `n` threads (0 = all cores). With one thread no pool is made.
    pub fn new(n: usize) -> Result<Threads, String> {
        let n = if n == 0 {
            std::thread::available_parallelism()
                .map(|v| v.get())
                .unwrap_or(1)
        } else {
            n
        };
        let pool = if n > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|i| format!("fastllm-cpu-{i}"))
                    .build()
                    .map_err(|e| format!("cannot start {n} CPU threads: {e}"))?,
            )
        } else {
            None
        };
        Ok(Threads { pool, n })
    }

    /// Number of threads.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Calls `f` on disjoint sub-ranges covering `0..rows`, in parallel when there are at least
    /// `2 * min_rows` rows and more than one thread; each sub-range has at least `min_rows` rows
    /// (except possibly the last).
    pub fn for_rows(&self, rows: usize, min_rows: usize, f: impl Fn(Range<usize>) + Sync) {
        let min_rows = min_rows.max(1);
        match &self.pool {
            Some(pool) if rows >= 2 * min_rows => {
                let tasks = (rows / min_rows).min(self.n * 4).max(1);
                let chunk = rows.div_ceil(tasks);
                pool.scope(|s| {
                    let f = &f;
                    let mut start = 0;
                    while start < rows {
                        let end = (start + chunk).min(rows);
                        s.spawn(move |_| f(start..end));
                        start = end;
                    }
                });
            }
            _ => f(0..rows),
        }
    }

    /// Like [`Threads::for_rows`] but over an output slice split into `rows` equal rows of
    /// `row_len` elements: `f(first_row_index, rows_chunk)`.
    pub fn for_row_chunks<T: Send>(
        &self,
        out: &mut [T],
        row_len: usize,
        min_rows: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        if row_len == 0 {
            return;
        }
        let rows = out.len() / row_len;
        let min_rows = min_rows.max(1);
        match &self.pool {
            Some(pool) if rows >= 2 * min_rows => {
                let tasks = (rows / min_rows).min(self.n * 4).max(1);
                let chunk_rows = rows.div_ceil(tasks);
                pool.scope(|s| {
                    let f = &f;
                    for (i, c) in out.chunks_mut(chunk_rows * row_len).enumerate() {
                        s.spawn(move |_| f(i * chunk_rows, c));
                    }
                });
            }
            _ => f(0, out),
        }
    }
}
