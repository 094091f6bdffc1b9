//! Progress of the steps that can take long enough for a user to wonder: fetching a model,
//! converting it to `.flm`, loading it, and prefilling a long prompt. The library reports each
//! through a callback its caller passes in ([`OnProgress`]); it draws nothing itself.

/// Which step is reporting, and what [`Progress::done`] and [`Progress::total`] count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Downloading a model: bytes received (the total is not known in advance: 0).
    Fetch,
    /// Converting a GGUF file or Hugging Face directory to `.flm`: tensors written.
    Convert,
    /// Loading a model: bytes of weights prepared for the device (read from the file, laid out
    /// for the CPU kernels or copied to a GPU).
    Load,
    /// Prefilling a prompt: prompt tokens processed.
    Prefill,
}

/// One report of a step's progress.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// The step.
    pub stage: Stage,
    /// Units done so far (0 in the report that starts the step).
    pub done: u64,
    /// Units in all; 0 when not known.
    pub total: u64,
    /// What is being worked on (a package, a tensor), or empty.
    pub item: &'a str,
}

/// A callback receiving progress reports.
pub type OnProgress<'a> = &'a mut dyn FnMut(&Progress<'_>);

/// A callback that ignores every report.
pub fn ignore(_: &Progress<'_>) {}
