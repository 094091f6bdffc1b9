//! `Threads`: the CPU device's worker pool and the one way kernels split work across it.
//!
//! The pool is persistent and low-latency: `n - 1` worker threads plus the calling thread. A job
//! is published by bumping a generation counter; idle workers spin on it for a short while
//! (so back-to-back ops, as in a decode step, start in well under a microsecond) and then sleep
//! on a condition variable (so an idle runtime does not burn CPU). Tasks are handed out with an
//! atomic counter, so a thread slowed down by other load takes fewer of them.
//!
//! Calls from inside a task, or while another thread is using the pool, run inline (serially)
//! instead of deadlocking. This module owns thread management only; it must not know kernels.

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spin iterations (each a `spin_loop` hint) before an idle worker goes to sleep (~50 µs).
const SPIN_ITERS: usize = 1 << 14;

thread_local! {
    /// True on pool workers and on a caller while it runs a job: nested calls run inline.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// The job being run: a type-erased `&dyn Fn(task)` and the number of tasks.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

/// Bits of [`Shared::ctl`]: generation in the high 32 bits, a "closed" flag, and the number of
/// workers inside the current job in the low bits.
const CLOSED: u64 = 1 << 31;
const ACTIVE: u64 = CLOSED - 1;

/// State shared by the caller and the workers.
struct Shared {
    /// `generation << 32 | closed | active`. A worker may enter a job (active += 1) only while
    /// its generation is current and it is not closed; the caller closes the job when all tasks
    /// are handed out and waits for `active == 0`, so workers that never woke up in time are not
    /// waited for (important when the machine is oversubscribed).
    ctl: AtomicU64,
    /// Written by the caller before publishing a generation, read by workers that entered it.
    job: Mutex<Option<Job>>,
    /// Next task index to hand out.
    next: AtomicUsize,
    /// Workers waiting on `wake`.
    sleeping: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    /// Set when a task panicked on a worker; the caller re-raises it.
    panicked: AtomicBool,
    /// One job at a time.
    submit: Mutex<()>,
}

// SAFETY: the raw closure pointer in `job` is only dereferenced by workers that entered the job
// (see `ctl`), and the submitting call does not return before they have all left it, so the
// closure (which is `Sync`) outlives every use.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// A fixed-size worker pool.
pub struct Threads {
    shared: Option<Arc<Shared>>,
    workers: Vec<JoinHandle<()>>,
    n: usize,
}

impl Threads {
    /// A pool of `n` threads in all, the caller included (0 = all cores). With one thread no
    /// worker is started.
    pub fn new(n: usize) -> Result<Threads, String> {
        let n = if n == 0 {
            std::thread::available_parallelism()
                .map(|v| v.get())
                .unwrap_or(1)
        } else {
            n
        };
        if n <= 1 {
            return Ok(Threads {
                shared: None,
                workers: Vec::new(),
                n: 1,
            });
        }
        let shared = Arc::new(Shared {
            ctl: AtomicU64::new(CLOSED),
            job: Mutex::new(None),
            next: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            submit: Mutex::new(()),
        });
        let mut t = Threads {
            shared: Some(shared.clone()),
            workers: Vec::new(),
            n,
        };
        for i in 1..n {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("fastllm-cpu-{i}"))
                .spawn(move || worker(&s))
                .map_err(|e| format!("cannot start {n} CPU threads: {e}"))?;
            t.workers.push(h);
        }
        Ok(t)
    }

    /// Number of threads (the caller included).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Runs `f(0) .. f(tasks - 1)`, spread over the pool; returns when all are done.
    pub fn run_tasks(&self, tasks: usize, f: impl Fn(usize) + Sync) {
        let inline = || (0..tasks).for_each(&f);
        let Some(s) = &self.shared else {
            return inline();
        };
        if tasks <= 1 || IN_JOB.with(|c| c.get()) {
            return inline();
        }
        let Ok(_busy) = s.submit.try_lock() else {
            return inline();
        };
        let fr: &(dyn Fn(usize) + Sync) = &f;
        // SAFETY: erases the closure's lifetime; `Finish` below does not let this call return
        // (or unwind) before every worker has checked out of this job.
        let fp: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(fr) };
        match s.job.lock() {
            Ok(mut j) => *j = Some(Job { f: fp, tasks }),
            Err(_) => return inline(),
        }
        s.next.store(0, Ordering::SeqCst);
        s.panicked.store(false, Ordering::SeqCst);
        // the previous job is closed with no active worker: start the next generation
        let generation = (s.ctl.load(Ordering::SeqCst) >> 32).wrapping_add(1) & 0xffff_ffff;
        s.ctl.store(generation << 32, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = s.sleep_lock.lock();
            s.wake.notify_all();
        }
        let finish = Finish(s);
        IN_JOB.with(|c| c.set(true));
        let reset = ResetInJob;
        loop {
            let i = s.next.fetch_add(1, Ordering::AcqRel);
            if i >= tasks {
                break;
            }
            f(i);
        }
        drop(finish);
        drop(reset);
        if s.panicked.swap(false, Ordering::SeqCst) {
            // propagate the task's panic (its message was printed on the worker)
            std::panic::resume_unwind(Box::new(
                "a task of Threads::run_tasks panicked on a worker thread",
            ));
        }
    }

    /// Calls `f` on disjoint sub-ranges covering `0..rows`, in parallel when there are at least
    /// `2 * min_rows` rows and more than one thread; each sub-range has at least `min_rows` rows
    /// (except possibly the last). Ranges shrink as the work goes (guided scheduling).
    pub fn for_rows(&self, rows: usize, min_rows: usize, f: impl Fn(Range<usize>) + Sync) {
        let min_rows = min_rows.max(1);
        if self.n <= 1 || rows < 2 * min_rows {
            return f(0..rows);
        }
        // guided: each task takes a quarter of what is left per thread (at least `min_rows`),
        // so the threads stream long ranges first and finish on short ones together
        let mut ends = Vec::with_capacity(4 * self.n + 16);
        let mut done = 0;
        while done < rows {
            let c = (rows - done).div_ceil(2 * self.n).max(min_rows);
            done = (done + c).min(rows);
            ends.push(done);
        }
        self.run_tasks(ends.len(), |i| {
            let start = if i == 0 { 0 } else { ends[i - 1] };
            f(start..ends[i])
        });
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
        if self.n <= 1 || rows < 2 * min_rows {
            return f(0, out);
        }
        let tasks = (rows / min_rows).min(self.n * 4).max(1);
        let chunk_rows = rows.div_ceil(tasks);
        let len = out.len();
        let base = SendPtr(out.as_mut_ptr());
        let n_chunks = len.div_ceil(chunk_rows * row_len);
        self.run_tasks(n_chunks, |i| {
            let start = i * chunk_rows * row_len;
            let end = (start + chunk_rows * row_len).min(len);
            // SAFETY: chunks `start..end` of different tasks are disjoint and inside `out`,
            // which stays mutably borrowed until `run_tasks` returns.
            let c = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
            f(i * chunk_rows, c);
        });
    }
}

/// A raw pointer that may cross threads (the users guarantee disjoint access).
struct SendPtr<T>(*mut T);
// SAFETY: see the users: every task touches a disjoint region; `T: Send`.
unsafe impl<T: Send> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    fn get(&self) -> *mut T {
        self.0
    }
}

/// Closes the current job and waits (spinning, then yielding) until every worker that entered
/// it has left.
struct Finish<'a>(&'a Shared);
impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.ctl.fetch_or(CLOSED, Ordering::SeqCst);
        let mut spins = 0usize;
        while self.0.ctl.load(Ordering::Acquire) & ACTIVE != 0 {
            spins += 1;
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

struct ResetInJob;
impl Drop for ResetInJob {
    fn drop(&mut self) {
        IN_JOB.with(|c| c.set(false));
    }
}

fn worker(s: &Shared) {
    IN_JOB.with(|c| c.set(true));
    let mut seen = s.ctl.load(Ordering::SeqCst) >> 32;
    loop {
        let mut spins = 0usize;
        let mut c;
        loop {
            c = s.ctl.load(Ordering::SeqCst);
            if c >> 32 != seen {
                seen = c >> 32;
                break;
            }
            if s.shutdown.load(Ordering::SeqCst) {
                return;
            }
            spins += 1;
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
                continue;
            }
            let Ok(mut guard) = s.sleep_lock.lock() else {
                return;
            };
            s.sleeping.fetch_add(1, Ordering::SeqCst);
            while s.ctl.load(Ordering::SeqCst) >> 32 == seen && !s.shutdown.load(Ordering::SeqCst) {
                guard = match s.wake.wait(guard) {
                    Ok(g) => g,
                    Err(_) => return,
                };
            }
            s.sleeping.fetch_sub(1, Ordering::SeqCst);
            spins = 0;
        }
        // enter the job unless it is already closed (or superseded)
        let entered = loop {
            if c >> 32 != seen || c & CLOSED != 0 {
                break false;
            }
            match s
                .ctl
                .compare_exchange_weak(c, c + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break true,
                Err(now) => c = now,
            }
        };
        if !entered {
            continue;
        }
        let job = s.job.lock().ok().and_then(|j| *j);
        if let Some(job) = job {
            loop {
                let i = s.next.fetch_add(1, Ordering::AcqRel);
                if i >= job.tasks {
                    break;
                }
                // SAFETY: this worker is counted in `ctl`'s active bits, so the submitter is
                // still waiting and the closure is alive; a panicking task is caught so the
                // count is always decremented.
                let f = unsafe { &*job.f };
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))).is_err() {
                    s.panicked.store(true, Ordering::SeqCst);
                }
            }
        }
        s.ctl.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            s.shutdown.store(true, Ordering::SeqCst);
            let _g = s.sleep_lock.lock();
            s.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_row_exactly_once() {
        for n in [1, 2, 3] {
            let t = Threads::new(n).unwrap();
            for rows in [0usize, 1, 5, 64, 1000] {
                let hits: Vec<AtomicU64> = (0..rows).map(|_| AtomicU64::new(0)).collect();
                t.for_rows(rows, 3, |r| {
                    for i in r {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "n={n} rows={rows}"
                );
                let mut out = vec![0usize; rows * 3];
                t.for_row_chunks(&mut out, 3, 2, |r0, c| {
                    for (j, v) in c.iter_mut().enumerate() {
                        *v += r0 * 3 + j + 1;
                    }
                });
                assert!(
                    out.iter().enumerate().all(|(i, &v)| v == i + 1),
                    "n={n} rows={rows}"
                );
            }
        }
    }

    #[test]
    fn nested_and_concurrent_calls_run() {
        let t = Arc::new(Threads::new(2).unwrap());
        let total = AtomicU64::new(0);
        t.for_rows(100, 1, |r| {
            // nested: runs inline
            t.for_rows(10, 1, |q| {
                total.fetch_add((r.len() * q.len()) as u64, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 1000);
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let s = AtomicU64::new(0);
                    for _ in 0..200 {
                        t.for_rows(64, 1, |r| {
                            s.fetch_add(r.len() as u64, Ordering::Relaxed);
                        });
                    }
                    s.load(Ordering::Relaxed)
                })
            })
            .collect();
        for h in hs {
            assert_eq!(h.join().unwrap(), 64 * 200);
        }
    }

    #[test]
    fn task_panics_reach_the_caller() {
        let t = Threads::new(2).unwrap();
        for _ in 0..20 {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                t.run_tasks(8, |i| assert!(i != 5, "task 5"));
            }));
            assert!(r.is_err());
        }
        // the pool still works afterwards
        let s = AtomicU64::new(0);
        t.run_tasks(4, |_| {
            s.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(s.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn idle_workers_wake_up() {
        let t = Threads::new(2).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let s = AtomicU64::new(0);
        t.run_tasks(8, |i| {
            s.fetch_add(i as u64, Ordering::Relaxed);
        });
        assert_eq!(s.load(Ordering::Relaxed), 28);
    }
}
