//! Tensor parallelism plumbing that knows no model: the [`Collective`] trait (a sum all-reduce
//! across the ranks of a group), [`HostCollective`] (ranks on the host, summed in rank order;
//! the CPU simulation the tests use), and the parsing of multi-device strings such as
//! `cuda:0,1`; for groups whose ranks are processes, the [`rendezvous`], the framed
//! [`wire`] format and the [`tcp::TcpCollective`] all-reduce of CPU ranks.
//!
//! The NCCL collective for GPUs lives in `devices::cuda::nccl`; the sharding of a model and the
//! rank workers in `model::tensor_parallel`.

pub mod rendezvous;
pub mod tcp;
pub mod wire;

use crate::data::{Data, DataType, DeviceKind};
use crate::error::{Error, Result};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A communicator of one rank in a group: sums a tensor element-wise over all ranks, in place.
/// Every rank must call it the same number of times with tensors of the same shape.
pub trait Collective: Send + Sync {
    /// This rank's index, `0..world()`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn world(&self) -> usize;
    /// Replaces `x` by the sum of every rank's `x` (F32; a device collective may also take
    /// F16 and BF16).
    fn all_reduce_sum(&self, x: &mut Data) -> Result<()>;
    /// Whether the rank's device sums partial results over the group inside its own operators
    /// (`AllReduceAdd`, `RMSNorm` with `all_reduce`), so a step may use those instead of an
    /// all-reduce stage followed by the residual add.
    fn reduces_in_ops(&self) -> bool {
        false
    }
    /// `Err` once a reduction inside the device's operators failed (a peer that did not come),
    /// checked after every step.
    fn health(&self) -> Result<()> {
        Ok(())
    }
}

struct HostState {
    generation: u64,
    arrived: usize,
    parts: Vec<Option<Vec<f32>>>,
    result: Arc<Vec<f32>>,
}

struct HostShared {
    world: usize,
    state: Mutex<HostState>,
    cond: Condvar,
    timeout: Duration,
}

/// A host-memory all-reduce between threads of one process (the ranks of a CPU-simulated tensor
/// parallel group). The sum is taken in rank order, so it is deterministic.
#[derive(Clone)]
pub struct HostCollective {
    shared: Arc<HostShared>,
    rank: usize,
}

impl HostCollective {
    /// One communicator per rank of a `world`-rank group. A rank waiting longer than `timeout`
    /// for the others gets an `Err` (a rank that failed never arrives).
    pub fn group(world: usize, timeout: Duration) -> Result<Vec<HostCollective>> {
        if world == 0 {
            return Err(Error::invalid("a parallel group needs at least one rank"));
        }
        let shared = Arc::new(HostShared {
            world,
            state: Mutex::new(HostState {
                generation: 0,
                arrived: 0,
                parts: vec![None; world],
                result: Arc::new(Vec::new()),
            }),
            cond: Condvar::new(),
            timeout,
        });
        Ok((0..world)
            .map(|rank| HostCollective {
                shared: shared.clone(),
                rank,
            })
            .collect())
    }
}

fn poisoned() -> Error {
    Error::Device("host all-reduce: a rank panicked".into())
}

impl Collective for HostCollective {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.shared.world
    }
    fn all_reduce_sum(&self, x: &mut Data) -> Result<()> {
        if x.dtype() != DataType::F32 || x.device() != DeviceKind::Cpu || !x.is_contiguous() {
            return Err(Error::invalid(format!(
                "host all-reduce needs a contiguous F32 host tensor, got {x:?}"
            )));
        }
        let sh = &self.shared;
        let mut st = sh.state.lock().map_err(|_| poisoned())?;
        let gen = st.generation;
        if st.parts.get(self.rank).is_none_or(|p| p.is_some()) {
            return Err(Error::invalid("host all-reduce: rank arrived twice"));
        }
        st.parts[self.rank] = Some(x.as_f32()?.to_vec());
        st.arrived += 1;
        if st.arrived == sh.world {
            let n = x.count();
            let mut sum = vec![0f32; n];
            for p in st.parts.iter_mut() {
                let p = p.take().unwrap_or_default();
                if p.len() != n {
                    return Err(Error::invalid(format!(
                        "host all-reduce: ranks passed {} and {n} elements",
                        p.len()
                    )));
                }
                for (s, v) in sum.iter_mut().zip(&p) {
                    *s += v;
                }
            }
            st.result = Arc::new(sum);
            st.arrived = 0;
            st.generation += 1;
            sh.cond.notify_all();
        } else {
            while st.generation == gen {
                let (g, t) = sh
                    .cond
                    .wait_timeout(st, sh.timeout)
                    .map_err(|_| poisoned())?;
                st = g;
                if t.timed_out() && st.generation == gen {
                    return Err(Error::Device(format!(
                        "host all-reduce: rank {} waited {:?} for the other ranks",
                        self.rank, sh.timeout
                    )));
                }
            }
        }
        let r = st.result.clone();
        drop(st);
        let dst = x.as_f32_mut()?;
        if dst.len() != r.len() {
            return Err(Error::invalid("host all-reduce: result size differs"));
        }
        dst.copy_from_slice(&r);
        Ok(())
    }
}

/// The GPU ordinals of a multi-GPU device string, `None` for a single device.
///
/// `cuda:0,1` (or `cuda:0,1,2,3`) names the GPUs of a tensor-parallel group; `tp` > 1 with
/// `cuda` / `cuda:N` means GPUs `N..N+tp`. `cpu` with `tp` > 1 is an error, as is a list
/// repeating a GPU or a list whose length disagrees with `tp` > 1.
pub fn parse_gpu_group(device: &str, tp: usize) -> Result<Option<Vec<u32>>> {
    let bad = |m: String| Error::invalid(format!("device '{device}': {m}"));
    let list: Vec<u32> = match device {
        "cuda" => vec![0],
        d if d.starts_with("cuda:") => d["cuda:".len()..]
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<u32>()
                    .map_err(|_| bad(format!("'{s}' is not a GPU number")))
            })
            .collect::<Result<_>>()?,
        _ => {
            if tp > 1 {
                return Err(bad(format!(
                    "tensor parallelism (--tp {tp}) needs CUDA devices (cuda:0,1,...)"
                )));
            }
            return Ok(None);
        }
    };
    let list = match (list.len(), tp) {
        (1, 0 | 1) => return Ok(None),
        (1, n) => (list[0]..list[0] + n as u32).collect(),
        (n, t) if t > 1 && t != n => {
            return Err(bad(format!("lists {n} GPUs but --tp is {t}")));
        }
        _ => list,
    };
    for (i, a) in list.iter().enumerate() {
        if list[..i].contains(a) {
            return Err(bad(format!("GPU {a} is listed twice")));
        }
    }
    Ok(Some(list))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_gpu_groups() {
        assert_eq!(parse_gpu_group("cpu", 1).unwrap(), None);
        assert_eq!(parse_gpu_group("cuda", 0).unwrap(), None);
        assert_eq!(parse_gpu_group("cuda:1", 1).unwrap(), None);
        assert_eq!(parse_gpu_group("cuda:0,1", 0).unwrap(), Some(vec![0, 1]));
        assert_eq!(parse_gpu_group("cuda:0,1", 2).unwrap(), Some(vec![0, 1]));
        assert_eq!(parse_gpu_group("cuda", 2).unwrap(), Some(vec![0, 1]));
        assert_eq!(parse_gpu_group("cuda:2", 2).unwrap(), Some(vec![2, 3]));
        assert!(parse_gpu_group("cpu", 2).is_err());
        assert!(parse_gpu_group("cuda:0,0", 0).is_err());
        assert!(parse_gpu_group("cuda:0,1", 4).is_err());
        assert!(parse_gpu_group("cuda:0,x", 0).is_err());
    }

    #[test]
    fn host_all_reduce_sums_in_rank_order() {
        let g = HostCollective::group(3, Duration::from_secs(10)).unwrap();
        let hs: Vec<_> = g
            .into_iter()
            .map(|c| {
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    for round in 0..20 {
                        let v = (c.rank() + 1) as f32 * (round + 1) as f32;
                        let mut x = Data::from_f32(&[2], &[v, -v]).unwrap();
                        c.all_reduce_sum(&mut x).unwrap();
                        out.push(x.to_f32_vec().unwrap());
                    }
                    out
                })
            })
            .collect();
        for h in hs {
            let out = h.join().unwrap();
            for (round, v) in out.iter().enumerate() {
                let s = 6.0 * (round + 1) as f32;
                assert_eq!(v, &vec![s, -s]);
            }
        }
    }

    #[test]
    fn host_all_reduce_times_out_when_a_rank_is_missing() {
        let g = HostCollective::group(2, Duration::from_millis(50)).unwrap();
        let mut x = Data::from_f32(&[1], &[1.0]).unwrap();
        assert!(g[0].all_reduce_sum(&mut x).is_err());
    }
}
