//! NCCL through cudarc (loaded at run time like the rest of CUDA): the communicator of one rank
//! of a tensor-parallel group, as a [`Collective`] whose all-reduce is enqueued on the rank's
//! GPU stream (the same in-order stream the operators use, so no extra synchronisation).
//!
//! A group is created from an [`NcclId`] (NCCL's `ncclUniqueId`, 128 bytes): one rank makes it
//! with [`NcclId::new`], every rank passes it to [`NcclComm::new`] with its rank number. Within
//! one process the id is simply shared between the rank threads. Across hosts, rank 0 sends
//! [`NcclId::to_bytes`] to the other processes out of band (a file on shared storage, a TCP
//! socket, an environment variable in hex, MPI broadcast) and they rebuild it with
//! [`NcclId::from_bytes`]; NCCL then connects the ranks itself (set `NCCL_SOCKET_IFNAME` to the
//! interface the hosts reach each other on).
//!
//! Once [`NcclComm::enable_p2p`] set up a peer-to-peer group (ranks on one host whose GPUs
//! reach each other's memory), the all-reduce is that group's kernel instead of NCCL's.

use super::buffer::dptr;
use super::gpu::Gpu;
use crate::data::{Data, DataType};
use crate::error::{Error, Result};
use crate::parallel::Collective;
use cudarc::nccl::{result as nres, sys as nsys};
use std::sync::{Arc, Mutex};

fn nccl_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Device(format!("NCCL {what}: {e:?}"))
}

/// Checks that the NCCL library can be loaded; the `Err` says how to provide it.
pub fn probe() -> Result<()> {
    // SAFETY: only tries to dlopen libnccl.
    if unsafe { nsys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::Device(
            "tensor parallelism needs NCCL, but libnccl.so could not be loaded (install NCCL, or \
             put a directory holding libnccl.so on LD_LIBRARY_PATH; pip's nvidia-nccl ships \
             libnccl.so.2: link it as libnccl.so)"
                .into(),
        ))
    }
}

/// The NCCL version as `major*10000 + minor*100 + patch` (after [`probe`]).
pub fn version() -> Result<i32> {
    probe()?;
    nres::get_nccl_version().map_err(|e| nccl_err("version", e))
}

/// A group's rendezvous id (`ncclUniqueId`).
#[derive(Clone, Copy)]
pub struct NcclId {
    id: nsys::ncclUniqueId,
}

impl NcclId {
    /// A fresh id (made by one rank, then shared with the others).
    pub fn new() -> Result<NcclId> {
        probe()?;
        let id = nres::get_uniqueid().map_err(|e| nccl_err("get unique id", e))?;
        Ok(NcclId { id })
    }

    /// The id's 128 bytes, to send to ranks in other processes.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.id.internal.iter().map(|&c| c as u8).collect()
    }

    /// An id rebuilt from [`NcclId::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Result<NcclId> {
        let mut internal = [0 as ::core::ffi::c_char; 128];
        if b.len() != internal.len() {
            return Err(Error::invalid(format!(
                "an NCCL unique id has 128 bytes, got {}",
                b.len()
            )));
        }
        for (d, &s) in internal.iter_mut().zip(b) {
            *d = s as ::core::ffi::c_char;
        }
        Ok(NcclId {
            id: nsys::ncclUniqueId { internal },
        })
    }
}

struct CommPtr(nsys::ncclComm_t);
// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; every use goes through the Mutex in `NcclComm`.
unsafe impl Send for CommPtr {}

/// One rank's NCCL communicator, bound to that rank's GPU and stream.
pub struct NcclComm {
    comm: Mutex<CommPtr>,
    gpu: Arc<Gpu>,
    rank: usize,
    world: usize,
    /// The peer-to-peer group that sums in NCCL's place, once set up.
    p2p: std::sync::OnceLock<Arc<super::p2p::P2pGroup>>,
}

impl NcclComm {
    /// Joins the group `id` as `rank` of `world` on `gpu`. Blocks until every rank has joined,
    /// so the ranks of one process must call it from different threads.
    pub fn new(gpu: &Arc<Gpu>, id: &NcclId, rank: usize, world: usize) -> Result<NcclComm> {
        probe()?;
        if rank >= world {
            return Err(Error::invalid(format!("NCCL rank {rank} of {world}")));
        }
        gpu.bind()?;
        let mut comm: nsys::ncclComm_t = std::ptr::null_mut();
        let nranks = i32::try_from(world).map_err(|_| Error::invalid("NCCL world too large"))?;
        // SAFETY: `comm` is a valid out-pointer; the id comes from ncclGetUniqueId.
        unsafe { nres::comm_init_rank(&mut comm, nranks, id.id, rank as i32) }
            .map_err(|e| nccl_err(&format!("init rank {rank} of {world}"), e))?;
        Ok(NcclComm {
            comm: Mutex::new(CommPtr(comm)),
            gpu: gpu.clone(),
            rank,
            world,
            p2p: std::sync::OnceLock::new(),
        })
    }
}

impl NcclComm {
    /// Every rank's `mine` (each rank passes as many bytes), concatenated in rank order; blocks
    /// until every rank has called it.
    pub fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<u8>> {
        let n = mine.len();
        let send = super::buffer::CudaBuffer::zeroed(&self.gpu, n)?;
        let recv = super::buffer::CudaBuffer::zeroed(&self.gpu, n * self.world)?;
        self.gpu.htod(mine, send.ptr())?;
        self.on_stream("all-gather", |comm, stream| {
            // SAFETY: `send` holds n bytes and `recv` n · world on this rank's GPU, alive until
            // the stream is synchronised below.
            unsafe {
                nres::all_gather(
                    send.ptr() as *const ::core::ffi::c_void,
                    recv.ptr() as *mut ::core::ffi::c_void,
                    n,
                    nsys::ncclDataType_t::ncclUint8,
                    comm,
                    stream,
                )
            }
        })?;
        let mut all = vec![0u8; n * self.world];
        self.gpu.sync()?;
        self.gpu.dtoh(recv.ptr(), &mut all)?;
        Ok(all)
    }

    /// Enqueues the NCCL call `f` (given the communicator and this rank's stream) on the
    /// rank's stream; `what` names it in the error.
    fn on_stream<T>(
        &self,
        what: &str,
        f: impl FnOnce(nsys::ncclComm_t, nsys::cudaStream_t) -> std::result::Result<T, nres::NcclError>,
    ) -> Result<()> {
        let c = self
            .comm
            .lock()
            .map_err(|_| Error::Device("NCCL comm poisoned".into()))?;
        self.gpu.bind()?;
        let stream = self.gpu.stream().cu_stream() as nsys::cudaStream_t;
        f(c.0, stream).map_err(|e| nccl_err(what, e))?;
        Ok(())
    }
}

impl NcclComm {
    /// Sets up the peer-to-peer group of this communicator's ranks on its GPU (a collective:
    /// every rank calls it, `want` or not), which then sums in NCCL's place; the caller attaches
    /// it to the rank's device too (`CudaDevice::attach_group`). `Ok(None)` where some rank does
    /// not `want` it or some ranks cannot reach each other's memory (NCCL keeps summing).
    /// `timeout`: the longest wait for a peer.
    pub fn enable_p2p(
        &self,
        want: bool,
        timeout: std::time::Duration,
    ) -> Result<Option<Arc<super::p2p::P2pGroup>>> {
        let exchange = |b: &[u8]| self.all_gather_bytes(b);
        let me = (self.rank, self.world, &exchange as super::p2p::Exchange);
        let Some(g) = super::p2p::P2pGroup::join(&self.gpu, me, want, timeout)? else {
            return Ok(None);
        };
        let g = Arc::new(g);
        self.p2p
            .set(g.clone())
            .map_err(|_| Error::invalid("this communicator already has a peer-to-peer group"))?;
        Ok(Some(g))
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if let Ok(c) = self.comm.lock() {
            if !c.0.is_null() {
                let _ = self.gpu.bind();
                // SAFETY: the communicator is valid and no longer used.
                let _ = unsafe { nres::comm_destroy(c.0) };
            }
        }
    }
}

impl Collective for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn reduces_in_ops(&self) -> bool {
        self.p2p.get().is_some()
    }
    fn health(&self) -> Result<()> {
        self.p2p.get().map_or(Ok(()), |g| g.check())
    }
    fn all_reduce_sum(&self, x: &mut Data) -> Result<()> {
        let dtype = match x.dtype() {
            DataType::F32 => Some(nsys::ncclDataType_t::ncclFloat32),
            DataType::F16 => Some(nsys::ncclDataType_t::ncclFloat16),
            DataType::BF16 => Some(nsys::ncclDataType_t::ncclBfloat16),
            _ => None,
        };
        let Some(dtype) = dtype.filter(|_| x.is_contiguous()) else {
            return Err(Error::invalid(format!(
                "NCCL all-reduce needs a contiguous F32, F16 or BF16 tensor, got {x:?}"
            )));
        };
        if x.device() != crate::data::DeviceKind::Cuda(self.gpu.ordinal()) {
            // Produced by a fallback device: copy it onto this rank's GPU first.
            let host = x.to_owned_host()?;
            let mut up = super::buffer::alloc_data(&self.gpu, x.dtype(), x.dims(), x.dims())?;
            self.gpu.htod(host.bytes()?, dptr(&up, "all-reduce")?)?;
            up.name = std::mem::take(&mut x.name);
            *x = up;
        }
        let p = dptr(x, "all-reduce")?;
        if let Some(g) = self.p2p.get() {
            return g.all_reduce(&self.gpu, p, (x.count(), x.dtype()), None);
        }
        let n = x.count();
        self.on_stream("all-reduce", |comm, stream| {
            // SAFETY: `p` addresses `n` elements of `dtype` on this rank's GPU, alive for the
            // call; the reduction is in place and enqueued on the stream that produced `x`
            // (recorded with the step's other work while that stream records a graph).
            unsafe {
                nres::all_reduce(
                    p as *const ::core::ffi::c_void,
                    p as *mut ::core::ffi::c_void,
                    n,
                    dtype,
                    nsys::ncclRedOp_t::ncclSum,
                    comm,
                    stream,
                )
            }
        })
    }
}
