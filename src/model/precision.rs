//! [`Precision`]: the numeric precision of a model's activations, chosen when it is loaded.

use crate::error::{Error, Result};

/// Numeric precision of activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// Activations quantized to int8 inside matmuls with block-quantized weights (llama.cpp's
    /// scheme): fastest.
    #[default]
    Fast,
    /// f32 activations everywhere.
    Exact,
}

impl Precision {
    /// Parses `fast` / `exact`.
    pub fn parse(s: &str) -> Result<Precision> {
        match s {
            "fast" => Ok(Precision::Fast),
            "exact" => Ok(Precision::Exact),
            _ => Err(Error::invalid(format!(
                "precision '{s}' (expected fast or exact)"
            ))),
        }
    }
}
