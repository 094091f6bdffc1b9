//! How many prompt rows one forward step takes by default ([`CPU_PREFILL_CHUNK`] on the CPU), and
//! which rotations allow a prompt to be split into steps at all. `ubatch` runs the steps.

use super::rope::RopePlan;
use crate::data::DeviceKind;
use crate::executor::Executor;

/// Prompt rows per step of a model on the CPU. The CPU products of 512 rows already read each
/// weight block once per 512 rows, so longer steps gain nothing but their working memory.
pub const CPU_PREFILL_CHUNK: usize = 512;

/// The default rows per step of a model on `exec` rotated by `rope`: [`CPU_PREFILL_CHUNK`] when
/// every device is the CPU, else 0 (any). A rotation that depends on how far the sequence reaches
/// in a step (long-RoPE, dynamic NTK) is also unbounded: a chunk would rotate its rows for a
/// shorter reach than the whole prompt's.
pub(crate) fn default_chunk(exec: &Executor, rope: &RopePlan) -> usize {
    let devs = exec.devices();
    let cpu_only = !devs.is_empty() && devs.iter().all(|d| d.kind() == DeviceKind::Cpu);
    if cpu_only && chunk_allowed(rope) {
        CPU_PREFILL_CHUNK
    } else {
        0
    }
}

/// True when this rotation gives the same result in any split of a step (see [`default_chunk`]).
pub(crate) fn chunk_allowed(rope: &RopePlan) -> bool {
    !rope.length_dependent()
}
