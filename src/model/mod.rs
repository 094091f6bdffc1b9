//! Model architectures: configuration, weight naming, and forward passes built from Executor ops.

pub mod config;

pub use config::{ModelConfig, RopeScaling, RopeStyle};
