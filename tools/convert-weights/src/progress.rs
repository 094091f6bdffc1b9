//! Conversion progress: an `indicatif` bar when stderr is a terminal, plain lines otherwise.

use fastllm::convert::Progress;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// Reports tensors as they are written.
pub struct Reporter {
    bar: Option<ProgressBar>,
}

impl Reporter {
    /// A reporter for the current stderr.
    pub fn new() -> Reporter {
        Reporter { bar: None }
    }

    /// Called after each tensor.
    pub fn update(&mut self, p: &Progress<'_>) {
        if !std::io::stderr().is_terminal() {
            eprintln!(
                "[{}/{}] {} {} {} bytes",
                p.done, p.total, p.name, p.dtype, p.bytes
            );
            return;
        }
        let bar = self.bar.get_or_insert_with(|| {
            let b = ProgressBar::new(p.total as u64);
            if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}") {
                b.set_style(style);
            }
            b
        });
        bar.set_position(p.done as u64);
        bar.set_message(format!("{} ({})", p.name, p.dtype));
    }

    /// Clears the bar.
    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
