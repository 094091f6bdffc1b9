//! CPU kernels for fastllm: for every op a plain scalar reference and a fast path (AVX2/FMA, AVX-512
//! where the CPU has it, chosen at run time; a portable path elsewhere), over plain slices.
//!
//! This crate must not depend on the runtime's tensor types: callers pass slices, dimensions and a
//! thread pool ([`threads::Threads`]). The runtime's `CpuDevice` (in the `fastllm` crate) adapts
//! `Data` to these kernels.

pub mod activation;
pub mod attention;
pub mod elementwise;
pub mod embedding;
pub mod erf;
pub mod kquant;
pub mod kquant_low;
pub mod kquant_search;
pub mod linear;
pub mod moe;
pub mod mxfp4;
pub mod norm;
pub mod paged;
pub mod quant;
pub mod rope;
pub mod sample;
pub mod select;
pub mod shape;
pub mod simd;
#[cfg(test)]
mod testutil;
pub mod threads;
pub mod vecmath;
