//! Device backends. Each implements `BaseDevice` and registers its operators by op name.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub(crate) mod paged_tables;
pub mod widen;
