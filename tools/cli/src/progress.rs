//! Progress bars on stderr for the library's long steps (fetch, convert, load, prefill) and for
//! `bench`'s repetitions: drawn with `indicatif` only when stderr is a terminal and
//! `--no-progress` is not given, one bar at a time. A step that ends leaves its last line (what
//! was done, at what rate); one cut short is cleared.

use fastllm::progress::{Progress, Stage};
use indicatif::{BinaryBytes, ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::Instant;

/// Prompt tokens per prefill step of `run` and `chat`; a longer prompt gets a bar.
pub const PREFILL_CHUNK: usize = 512;

/// The bar being drawn: which step it shows, and where and when that step started.
struct Current {
    stage: Option<Stage>,
    bar: ProgressBar,
    start: Instant,
    start_done: u64,
}

/// Draws the bars of one command.
pub struct Bars {
    on: bool,
    current: Option<Current>,
}

impl Bars {
    /// Bars drawn when stderr is a terminal, unless `no_progress`.
    pub fn new(no_progress: bool) -> Bars {
        Bars {
            on: !no_progress && std::io::stderr().is_terminal(),
            current: None,
        }
    }

    /// Shows a report of the library; a report whose `done` reaches its known `total` ends
    /// the step and leaves its line. A prefill of one chunk or less draws nothing.
    pub fn update(&mut self, p: &Progress<'_>) {
        if !self.on || (p.stage == Stage::Prefill && p.total <= PREFILL_CHUNK as u64) {
            return;
        }
        if self
            .current
            .as_ref()
            .is_some_and(|c| c.stage != Some(p.stage))
        {
            self.finish();
        }
        let c = self
            .current
            .get_or_insert_with(|| start(Some(p.stage), template(p.stage), p.done, p.total));
        let rate = (p.done.saturating_sub(c.start_done)) as f64
            / c.start.elapsed().as_secs_f64().max(1e-3);
        c.bar.set_message(match p.stage {
            Stage::Fetch | Stage::Load => format!("{}/s", BinaryBytes(rate as u64)),
            Stage::Convert => format!("{rate:.0} tensors/s"),
            Stage::Prefill => format!("{rate:.1} tok/s"),
        });
        if p.total > 0 {
            c.bar.set_length(p.total);
        }
        c.bar.set_position(p.done);
        if p.total > 0 && p.done >= p.total {
            self.done();
        }
    }

    /// Shows `bench`'s progress: `rep` of `reps` repetitions done, `rates` the last one's
    /// measured speeds.
    pub fn bench_rep(&mut self, rep: usize, reps: usize, rates: &str) {
        if !self.on {
            return;
        }
        let c = self.current.get_or_insert_with(|| {
            start(
                None,
                "bench {bar:30} rep {pos}/{len}  {msg}",
                0,
                reps as u64,
            )
        });
        c.bar.set_message(rates.to_string());
        c.bar.set_length(reps as u64);
        c.bar.set_position(rep as u64);
        if rep >= reps {
            self.done();
        }
    }

    /// Ends the bar being drawn, leaving its last state on its line.
    fn done(&mut self) {
        if let Some(c) = self.current.take() {
            c.bar.finish();
            eprintln!();
        }
    }

    /// Clears the bar being drawn, if any (its step did not reach its end).
    pub fn finish(&mut self) {
        if let Some(c) = self.current.take() {
            c.bar.finish_and_clear();
        }
    }
}

impl Drop for Bars {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A new bar of `stage` drawn with `template`, starting at `done` of `total`.
fn start(stage: Option<Stage>, template: &str, done: u64, total: u64) -> Current {
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    Current {
        stage,
        bar,
        start: Instant::now(),
        start_done: done,
    }
}

/// The bar's layout for a step (the message is its rate).
fn template(stage: Stage) -> &'static str {
    match stage {
        Stage::Fetch => "{spinner} fetching {binary_bytes} at {msg} ({elapsed})",
        Stage::Convert => "converting {bar:30} {pos}/{len} tensors, {msg}",
        Stage::Load => "loading {bar:30} {binary_bytes}/{binary_total_bytes} at {msg}",
        Stage::Prefill => "prefill {bar:30} {pos}/{len} tokens, {msg}",
    }
}
