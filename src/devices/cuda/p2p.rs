//! Peer-to-peer all-reduce of a tensor-parallel group whose GPUs can address each other's
//! memory (NVLink or PCIe peer access, on one host): [`P2pGroup`], set up once per rank over the
//! group's NCCL communicator, and the kernels of `kernels/p2p.cu` that sum with it — a plain
//! all-reduce, and the all-reduce fused with the residual add and the next `RMSNorm` (for a few
//! rows the low-latency form, each value pushed with the epoch in one word, by the norm or
//! already by the one-row product that wrote it: [`P2pGroup::ll_push_ctx`]; for batched decode
//! rows of f16 / bf16 partials the half low-latency form, two values with the epoch in a word;
//! for prefill rows the row-split form, each rank adding and normalizing a share of the rows).
//! Also the `AllReduceAdd` operator (`input0 += Σ_ranks input1`) that a rank's step uses in
//! place of an all-reduce stage followed by `AddTo` once its GPU has a group.
//!
//! Each rank allocates one buffer (flags, the kernels' context, 2 × world slots of
//! [`P2pGroup::slot_bytes`], the low-latency and the half low-latency slots) and hands its
//! address to the others: ranks of one process use each other's addresses directly (peer
//! access enabled), ranks of other processes on the same host open a CUDA IPC handle of it. Every rank must agree, or none uses the group (then NCCL sums).

use super::gpu::{Gpu, KArg};
use crate::data::DataType;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Where a device's operators find the group of its GPU (set once it joined one).
pub type GroupSlot = Arc<OnceLock<Arc<P2pGroup>>>;

/// The group in `slot`, or an `Err` of `op` saying the GPU is in none.
pub fn group_of<'a>(slot: &'a GroupSlot, op: &str) -> Result<&'a Arc<P2pGroup>> {
    slot.get()
        .ok_or_else(|| super::op_err(op, "this GPU is not a rank of a peer-to-peer group"))
}

/// A group's all-gather of bytes: every rank's bytes (each rank passes as many), in rank order.
pub type Exchange<'a> = &'a dyn Fn(&[u8]) -> Result<Vec<u8>>;

/// Most ranks of a group (`P2P_MAX_RANKS` in the kernels).
const MAX_RANKS: usize = 8;
/// Most blocks of one reduction (`P2P_MAX_BLOCKS`).
const MAX_BLOCKS: usize = 1024;
/// Bytes of the flags area: one u32 per (peer, block).
const FLAGS_BYTES: usize = MAX_RANKS * MAX_BLOCKS * 4;
/// Offsets in a rank's buffer: the epoch state, the kernels' context, the first slot.
const STATE_AT: usize = FLAGS_BYTES;
const CTX_AT: usize = STATE_AT + 64;
const SLOTS_AT: usize = 64 * 1024;
/// Bytes all slots of one rank take together (each slot: this over 2 · world). At two ranks a
/// slot holds a row-split norm of 2048 rows of 4096 (f32 partials and the gathered residual).
const SLOTS_TOTAL: usize = 192 << 20;
/// Fewest rows of a fused norm that the ranks split between them (`p2p_split_addrmsnorm`).
const SPLIT_MIN_ROWS: usize = 512;
/// Values of one low-latency slot (`P2P_LL_ELEMS`; 8 bytes each: the value and the epoch).
const LL_ELEMS: usize = 16384;
/// Values of one half low-latency slot (`P2P_LLH_ELEMS`; 4 bytes each: f16 / bf16 values two to
/// an 8-byte word with the epoch).
const LLH_ELEMS: usize = 262_144;
/// Most blocks of a low-latency norm (one scratch word each, after the low-latency slots).
const LL_BLOCKS: usize = 1024;
/// Values of a row that one block of a low-latency norm takes (about).
const LL_BLOCK_VALUES: usize = 512;
/// Threads of the plain all-reduce kernel.
const THREADS: u32 = 512;

/// `P2pCtx` of kernels/p2p.cu.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CtxBytes {
    bufs: [u64; MAX_RANKS],
    flags: [u64; MAX_RANKS],
    slot_bytes: u64,
    timeout_ns: u64,
    err: u64,
    state: u64,
    world: i32,
    rank: i32,
    ll: [u64; MAX_RANKS],
}

impl CtxBytes {
    fn bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(std::mem::size_of::<CtxBytes>());
        for a in self.bufs.iter().chain(&self.flags) {
            v.extend(a.to_le_bytes());
        }
        for a in [self.slot_bytes, self.timeout_ns, self.err, self.state] {
            v.extend(a.to_le_bytes());
        }
        v.extend(self.world.to_le_bytes());
        v.extend(self.rank.to_le_bytes());
        for a in self.ll {
            v.extend(a.to_le_bytes());
        }
        v
    }
}

fn cu(what: &str, r: sys::CUresult) -> Result<()> {
    r.result()
        .map_err(|e| Error::Device(format!("peer all-reduce: {what}: {e:?}")))
}

/// What a rank tells the others when the group is set up (fixed size, see [`Record::bytes`]).
struct Record {
    host: [u8; 64],
    pid: u32,
    ordinal: u32,
    blocks: u32,
    usable: u32,
    base: u64,
    ipc: [u8; 64],
}

const RECORD_BYTES: usize = 64 + 4 * 4 + 8 + 64;

impl Record {
    fn bytes(&self) -> Vec<u8> {
        let mut v = self.host.to_vec();
        for a in [self.pid, self.ordinal, self.blocks, self.usable] {
            v.extend(a.to_le_bytes());
        }
        v.extend(self.base.to_le_bytes());
        v.extend(self.ipc);
        v
    }
    fn parse(b: &[u8]) -> Record {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut host = [0u8; 64];
        host.copy_from_slice(&b[..64]);
        let mut base = [0u8; 8];
        base.copy_from_slice(&b[80..88]);
        let mut ipc = [0u8; 64];
        ipc.copy_from_slice(&b[88..152]);
        Record {
            host,
            pid: u32_at(64),
            ordinal: u32_at(68),
            blocks: u32_at(72),
            usable: u32_at(76),
            base: u64::from_le_bytes(base),
            ipc,
        }
    }
}

/// This machine: its boot id and host name (ranks that differ are on other hosts).
fn host_id() -> [u8; 64] {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut id = [0u8; 64];
    for (d, s) in id.iter_mut().zip(
        boot.trim()
            .bytes()
            .chain(std::iter::once(b'/'))
            .chain(name.trim().bytes()),
    ) {
        *d = s;
    }
    id
}

/// A rank's peer-to-peer reduction state (see the module docs).
pub struct P2pGroup {
    ctx: Arc<CudaContext>,
    /// This rank's buffer (cuMemAlloc: IPC handles need it).
    own: u64,
    /// Peers' buffers opened through IPC (closed on drop).
    opened: Vec<u64>,
    /// The page-locked error word the kernels set when a wait times out, and its device address.
    err_host: *mut u32,
    err_dev: u64,
    world: usize,
    rank: usize,
    slot_bytes: usize,
    /// Blocks of one reduction at most (the same on every rank): four per multiprocessor,
    /// which a looping slot norm of 256 threads (`p2p_addrmsnorm_rows_*`) keeps resident.
    blocks: u32,
    /// The output of the last one-row product that pushed its values to the peers itself
    /// ([`P2pGroup::ll_push_ctx`]), until the norm that sums it takes it.
    ll_pushed: std::sync::Mutex<Option<u64>>,
    /// How many one-row products pushed their outputs themselves.
    ll_pushes: std::sync::atomic::AtomicU64,
    /// How many fused norms took [`P2pGroup::split_launch`]'s kernels.
    split_norms: std::sync::atomic::AtomicU64,
    /// The host's count of this rank's reductions (their epochs).
    epochs: std::sync::Mutex<EpochClock>,
}

// SAFETY: `err_host` is page-locked memory owned by the group and only read through volatile
// loads; everything else is plain addresses.
unsafe impl Send for P2pGroup {}
// SAFETY: as above; launches go through the caller's stream.
unsafe impl Sync for P2pGroup {}

impl Drop for P2pGroup {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: these were opened / allocated by this group and no kernel uses them any more
        // (the rank's stream is idle when its device goes away).
        unsafe {
            for &p in &self.opened {
                let _ = sys::cuIpcCloseMemHandle(p);
            }
            if self.own != 0 {
                let _ = sys::cuMemFree_v2(self.own);
            }
            if !self.err_host.is_null() {
                let _ = sys::cuMemFreeHost(self.err_host as *mut std::ffi::c_void);
            }
        }
    }
}

impl P2pGroup {
    /// Sets up the group of rank `rank` of `world` on `gpu` (every rank calls it, as a
    /// collective), the ranks' records swapped by `exchange`.
    /// `Ok(None)` when some rank does not `want` it or some pair of ranks cannot reach each
    /// other's memory (other hosts, no peer access, more than `MAX_RANKS` ranks): every rank
    /// then gets `None`. A wait for a peer longer than `timeout` fails the step (see
    /// [`P2pGroup::check`]).
    pub fn join(
        gpu: &Gpu,
        (rank, world, exchange): (usize, usize, Exchange),
        want: bool,
        timeout: Duration,
    ) -> Result<Option<P2pGroup>> {
        gpu.bind()?;
        let slot_bytes = (SLOTS_TOTAL / (2 * world.max(1))) & !4095;
        let mut g = P2pGroup {
            ctx: gpu.context().clone(),
            own: 0,
            opened: Vec::new(),
            err_host: std::ptr::null_mut(),
            err_dev: 0,
            world,
            rank,
            slot_bytes,
            blocks: (4 * gpu.sms()).min(MAX_BLOCKS) as u32,
            ll_pushed: Default::default(),
            ll_pushes: Default::default(),
            split_norms: Default::default(),
            epochs: std::sync::Mutex::new(EpochClock::new()),
        };
        let mut usable = want && (2..=MAX_RANKS).contains(&world) && gpu.arch().0 >= 7;
        let mut ipc = [0u8; 64];
        if usable {
            usable = g
                .allocate(
                    g.ll_at() + (2 * world * LL_ELEMS + LL_BLOCKS) * 8 + 2 * world * LLH_ELEMS * 4,
                    &mut ipc,
                )
                .is_ok();
        }
        let mine = Record {
            host: host_id(),
            pid: std::process::id(),
            ordinal: gpu.ordinal(),
            blocks: g.blocks,
            usable: usable as u32,
            base: g.own,
            ipc,
        };
        let all = exchange(&mine.bytes())?;
        let records: Vec<Record> = all.chunks_exact(RECORD_BYTES).map(Record::parse).collect();
        let mut bases = [0u64; MAX_RANKS];
        if usable && records.len() == world && records.iter().all(|r| r.usable == 1) {
            g.blocks = records.iter().map(|r| r.blocks).min().unwrap_or(1).max(1);
            usable = g.reach(&records, &mine, &mut bases).is_ok();
        } else {
            usable = false;
        }
        if !exchange(&[usable as u8])?.iter().all(|&b| b == 1) {
            return Ok(None);
        }
        g.write_context(&bases, timeout)?;
        Ok(Some(g))
    }

    /// Allocates this rank's buffer (zeroed), its IPC handle and the error word.
    fn allocate(&mut self, bytes: usize, ipc: &mut [u8; 64]) -> Result<()> {
        // SAFETY: out-pointers to locals; the context is bound.
        unsafe {
            cu("allocate", sys::cuMemAlloc_v2(&mut self.own, bytes))?;
            cu("clear", sys::cuMemsetD8_v2(self.own, 0, bytes))?;
            cu("clear (wait)", sys::cuCtxSynchronize())?;
            let mut h: sys::CUipcMemHandle = std::mem::zeroed();
            cu("IPC handle", sys::cuIpcGetMemHandle(&mut h, self.own))?;
            for (d, s) in ipc.iter_mut().zip(h.reserved.iter()) {
                *d = *s as u8;
            }
            let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
            cu(
                "error word",
                sys::cuMemHostAlloc(&mut p, 4, sys::CU_MEMHOSTALLOC_DEVICEMAP),
            )?;
            self.err_host = p as *mut u32;
            std::ptr::write_volatile(self.err_host, 0);
            cu(
                "error word address",
                sys::cuMemHostGetDevicePointer_v2(&mut self.err_dev, p, 0),
            )?;
        }
        Ok(())
    }

    /// Every rank's buffer as this rank addresses it: its own, a peer of this process's directly
    /// (peer access enabled), one of another process through its IPC handle.
    fn reach(&mut self, records: &[Record], mine: &Record, bases: &mut [u64]) -> Result<()> {
        for (r, rec) in records.iter().enumerate() {
            if r == self.rank {
                bases[r] = self.own;
                continue;
            }
            if rec.host != mine.host {
                return Err(Error::Device("a rank is on another host".into()));
            }
            if rec.pid == mine.pid {
                self.enable_peer(rec.ordinal)?;
                bases[r] = rec.base;
            } else {
                // SAFETY: the handle is plain bytes; all-zero is a valid value, overwritten next.
                let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
                for (d, s) in h.reserved.iter_mut().zip(rec.ipc) {
                    *d = s as std::ffi::c_char;
                }
                let mut p = 0u64;
                // SAFETY: `h` came from cuIpcGetMemHandle in the peer process.
                cu("open IPC handle", unsafe {
                    sys::cuIpcOpenMemHandle_v2(
                        &mut p,
                        h,
                        sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                    )
                })?;
                self.opened.push(p);
                bases[r] = p;
            }
        }
        Ok(())
    }

    /// Lets this context address GPU `ordinal`'s memory (same process).
    fn enable_peer(&self, ordinal: u32) -> Result<()> {
        // SAFETY: out-pointers to locals; this rank's context is bound.
        unsafe {
            let (mut me, mut peer, mut can) = (0, 0, 0);
            cu("device", sys::cuCtxGetDevice(&mut me))?;
            cu("peer device", sys::cuDeviceGet(&mut peer, ordinal as i32))?;
            cu("peer check", sys::cuDeviceCanAccessPeer(&mut can, me, peer))?;
            if can == 0 {
                return Err(Error::Device(format!("no peer access to cuda:{ordinal}")));
            }
            let mut pctx: sys::CUcontext = std::ptr::null_mut();
            cu(
                "peer context",
                sys::cuDevicePrimaryCtxRetain(&mut pctx, peer),
            )?;
            let r = sys::cuCtxEnablePeerAccess(pctx, 0);
            let _ = sys::cuDevicePrimaryCtxRelease_v2(peer);
            if r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                cu("enable peer access", r)?;
            }
        }
        Ok(())
    }

    /// Writes the kernels' context into this rank's buffer.
    fn write_context(&self, bases: &[u64; MAX_RANKS], timeout: Duration) -> Result<()> {
        let mut c = CtxBytes {
            slot_bytes: self.slot_bytes as u64,
            timeout_ns: timeout.as_nanos().min(u64::MAX as u128) as u64,
            err: self.err_dev,
            state: self.own + STATE_AT as u64,
            world: self.world as i32,
            rank: self.rank as i32,
            ..CtxBytes::default()
        };
        for (r, &b) in bases.iter().enumerate().take(self.world) {
            c.bufs[r] = b + SLOTS_AT as u64;
            c.flags[r] = b;
            c.ll[r] = b + self.ll_at() as u64;
        }
        let b = c.bytes();
        // SAFETY: the context area lies inside this rank's buffer; the copy is synchronous.
        cu("write context", unsafe {
            sys::cuMemcpyHtoD_v2(self.ctx_addr(), b.as_ptr() as *const _, b.len())
        })
    }

    /// Where the low-latency slots start in a rank's buffer.
    fn ll_at(&self) -> usize {
        SLOTS_AT + 2 * self.world * self.slot_bytes
    }

    fn ctx_addr(&self) -> u64 {
        self.own + CTX_AT as u64
    }

    /// Bytes of one slot: the most one launch reduces (larger tensors go in pieces).
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// `Err` naming the rank that did not arrive once a reduction's wait timed out; the group
    /// is then broken (later reductions no longer wait, their sums are wrong).
    pub fn check(&self) -> Result<()> {
        // SAFETY: page-locked word owned by the group.
        let v = unsafe { std::ptr::read_volatile(self.err_host) };
        if v == 0 {
            return Ok(());
        }
        Err(Error::Device(format!(
            "tensor-parallel rank {}: rank {} did not reach a peer-to-peer all-reduce in time; \
             the group cannot continue",
            self.rank,
            v - 1
        )))
    }

    /// How a fused norm over `rows` rows of `row` values of `elem_bytes` bytes runs (`plain`:
    /// the threads of the plain norm's launch): the low-latency kernels where all values fit a
    /// low-latency slot, each row split over blocks of about `LL_BLOCK_VALUES` values; the half
    /// low-latency kernels, split alike, where 2-byte values fit a half slot; else the slot
    /// kernels, a block per row, or their grid looping over the rows where there are
    /// more rows than blocks; `None` when the rows do not fit one slot.
    pub fn norm_launch(
        &self,
        rows: usize,
        row: usize,
        elem_bytes: usize,
        plain: u32,
    ) -> Option<NormLaunch> {
        let ctx = KArg::Ptr(self.ctx_addr());
        if rows == 0 || rows * row * elem_bytes > self.slot_bytes {
            return None;
        }
        if rows * row > LL_ELEMS && elem_bytes == 2 && rows * row <= LLH_ELEMS {
            let (parts, threads) = ll_split(rows, row).unwrap_or((1, plain));
            return Some(NormLaunch {
                ctx,
                blocks: (rows * parts) as u32,
                threads,
                n: parts as i32,
                kernel: "p2p_llh_addrmsnorm",
                low_latency: false,
                pushed: false,
                epoch: 0,
            });
        }
        if rows * row > LL_ELEMS {
            let looping = rows > self.blocks as usize;
            return Some(NormLaunch {
                ctx,
                blocks: rows.min(self.blocks as usize) as u32,
                threads: plain,
                n: rows as i32,
                kernel: if looping {
                    "p2p_addrmsnorm_rows"
                } else {
                    "p2p_addrmsnorm"
                },
                low_latency: false,
                pushed: false,
                epoch: 0,
            });
        }
        let (parts, threads) = ll_split(rows, row).unwrap_or((1, plain));
        Some(NormLaunch {
            ctx,
            blocks: (rows * parts) as u32,
            threads,
            n: parts as i32,
            kernel: "p2p_ll_addrmsnorm",
            low_latency: true,
            pushed: false,
            epoch: 0,
        })
    }

    /// How a row-split fused norm over `rows` rows of `row` values runs with `threads` a block
    /// (`p2p_split_addrmsnorm_v4h_f32`: each rank adds and normalizes its share of the rows,
    /// leaving only the half copy whole; with `gather` `p2p_split_gather_addrmsnorm_v4h_f32`,
    /// which makes the residual whole too); `None` below 512 rows (`SPLIT_MIN_ROWS`) or where a
    /// rank's share of f32 partials, half rows and residual rows does not fit one slot. The
    /// answer depends on the rows and the group only, so the norms of one step's chain all
    /// split or none does.
    pub fn split_launch(
        &self,
        rows: usize,
        row: usize,
        threads: u32,
        gather: bool,
    ) -> Option<NormLaunch> {
        if self.world < 2 || rows < SPLIT_MIN_ROWS {
            return None;
        }
        let per = rows.div_ceil(self.world);
        if per * row * (4 + 2 + 4) + 512 > self.slot_bytes {
            return None;
        }
        Some(NormLaunch {
            ctx: KArg::Ptr(self.ctx_addr()),
            blocks: per.min(self.blocks as usize) as u32,
            threads,
            n: rows as i32,
            kernel: if gather {
                "p2p_split_gather_addrmsnorm"
            } else {
                "p2p_split_addrmsnorm"
            },
            low_latency: false,
            pushed: false,
            epoch: 0,
        })
    }

    /// The kernels' context for a one-row product of `row` f32 outputs at `y` whose fused norm
    /// runs the low-latency kernels: the product pushes each output into the peers' slots as
    /// it writes it (`p2p_ll_push` in kernels/p2p.cu), and the norm then only sums
    /// ([`P2pGroup::take_ll_pushed`]). `None` where the norm would not take those kernels.
    /// The product records its launch with [`P2pGroup::mark_ll_pushed`].
    /// Also the epoch offset of that norm's reduction (the next one), which the pushes carry.
    pub fn ll_push_ctx(&self, row: usize, y: u64) -> Result<Option<(u64, i32)>> {
        let low_latency = self
            .norm_launch(1, row, 4, 256)
            .is_some_and(|l| l.low_latency);
        if !(low_latency && row.is_multiple_of(4) && y.is_multiple_of(16)) {
            return Ok(None);
        }
        Ok(Some((self.ctx_addr(), self.clock()?.peek())))
    }

    /// The epoch offset a reduction launched now passes (counted: the next one gets the next).
    pub fn take_epoch(&self) -> Result<i32> {
        Ok(self.clock()?.take())
    }

    /// Starts counting the reductions of a recorded step from a base of their own.
    pub fn begin_recording(&self) -> Result<()> {
        self.clock()?.begin_recording();
        Ok(())
    }

    /// Ends a recording: the reductions it holds (the count is back where it was: nothing ran).
    pub fn end_recording(&self) -> Result<u32> {
        Ok(self.clock()?.end_recording())
    }

    /// Writes the next reduction's epoch into the base word on `gpu`'s stream (before the
    /// replay of a recording whose reductions count from it), then `launch`es; when it did,
    /// the `reductions` it holds are counted.
    pub fn replay(
        &self,
        gpu: &Gpu,
        reductions: u32,
        launch: impl FnOnce() -> Result<bool>,
    ) -> Result<bool> {
        let mut clock = self.clock()?;
        let base = clock.next_base();
        gpu.bind()?;
        // SAFETY: the base word lies in this rank's buffer; the write is ordered on the stream.
        cu("epoch base", unsafe {
            sys::cuStreamWriteValue32_v2(
                gpu.stream().cu_stream(),
                self.own + STATE_AT as u64,
                base,
                0,
            )
        })?;
        clock.rebased(base);
        let ran = launch()?;
        if ran {
            clock.advance(reductions);
        }
        Ok(ran)
    }

    fn clock(&self) -> Result<std::sync::MutexGuard<'_, EpochClock>> {
        self.epochs
            .lock()
            .map_err(|_| Error::Device("peer-to-peer epoch count poisoned".into()))
    }

    /// Records that the product writing `y` was launched with [`P2pGroup::ll_push_ctx`].
    pub fn mark_ll_pushed(&self, y: u64) -> Result<()> {
        *self.ll_pushed_slot()? = Some(y);
        self.ll_pushes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Records the launch of a row-split norm ([`P2pGroup::split_launch`]).
    pub fn mark_split(&self) {
        self.split_norms
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many fused norms split their rows over the ranks.
    pub fn split_norms(&self) -> u64 {
        self.split_norms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many one-row products pushed their outputs to the peers themselves.
    pub fn ll_pushes(&self) -> u64 {
        self.ll_pushes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the partial at `r` was pushed by the product that wrote it
    /// ([`P2pGroup::ll_push_ctx`]); the record ends either way.
    pub fn take_ll_pushed(&self, r: u64) -> Result<bool> {
        Ok(self.ll_pushed_slot()?.take() == Some(r))
    }

    fn ll_pushed_slot(&self) -> Result<std::sync::MutexGuard<'_, Option<u64>>> {
        self.ll_pushed
            .lock()
            .map_err(|_| Error::Device("peer-to-peer push record poisoned".into()))
    }

    /// Sums the `n` elements of `dtype` (f32, f16, bf16) at `x` over the ranks on `gpu`'s
    /// stream: into `x` (`add` none), or added into the f32 elements at `add`.
    pub fn all_reduce(
        &self,
        gpu: &Gpu,
        x: u64,
        (n, dtype): (usize, DataType),
        add: Option<u64>,
    ) -> Result<()> {
        let (code, es) = match dtype {
            DataType::F32 => (0, 4),
            DataType::F16 => (1, 2),
            DataType::BF16 => (2, 2),
            t => {
                return Err(Error::invalid(format!(
                    "peer all-reduce of {t:?}: f32, f16 or bf16 only"
                )))
            }
        };
        let per = (self.slot_bytes / es) & !7;
        let mut at = 0;
        while at < n {
            let k = per.min(n - at);
            let blocks = k.div_ceil(THREADS as usize * 4).min(self.blocks as usize) as u32;
            let out = add.map_or(0, |a| a + 4 * at as u64);
            gpu.launch(
                "p2p_allreduce",
                (blocks, 1, 1),
                THREADS,
                &[
                    KArg::Ptr(self.ctx_addr()),
                    KArg::Ptr(x + (at * es) as u64),
                    KArg::Ptr(out),
                    KArg::I64(k as i64),
                    KArg::I32(code),
                    KArg::I32(add.is_some() as i32),
                    KArg::I32(self.take_epoch()?),
                ],
            )?;
            at += k;
        }
        Ok(())
    }
}

/// The host's count of a rank's reductions, which numbers them for the kernels (each rank counts
/// the same): a reduction's epoch is the device's base word plus the offset its launch passes.
/// The base changes only where the host writes it into the stream, before a recorded step is
/// replayed; the reductions recorded in a step count from their own base.
#[derive(Debug)]
struct EpochClock {
    /// The next reduction's epoch (0 is never one: cleared buffers carry it).
    next: u32,
    /// The base word's value, in stream order.
    base: u32,
    /// While a step is recorded: `next` and `base` before it.
    saved: Option<(u32, u32)>,
}

impl EpochClock {
    fn new() -> EpochClock {
        EpochClock {
            next: 1,
            base: 0,
            saved: None,
        }
    }

    /// The next reduction's offset from the base.
    fn peek(&self) -> i32 {
        self.next.wrapping_sub(self.base) as i32
    }

    /// The next reduction's offset, counting it.
    fn take(&mut self) -> i32 {
        let k = self.peek();
        self.next = self.next.wrapping_add(1);
        k
    }

    fn begin_recording(&mut self) {
        self.end_recording();
        self.saved = Some((self.next, self.base));
        self.base = self.next;
    }

    /// The reductions recorded since `begin_recording`; the counts return to theirs then.
    fn end_recording(&mut self) -> u32 {
        let Some((next, base)) = self.saved.take() else {
            return 0;
        };
        let k = self.next.wrapping_sub(next);
        (self.next, self.base) = (next, base);
        k
    }

    /// The base to write before a replay: the next reduction's epoch, where the recording's
    /// first reduction counts from.
    fn next_base(&self) -> u32 {
        self.next
    }

    /// Notes that the base word now holds `base` (in stream order).
    fn rebased(&mut self, base: u32) {
        self.base = base;
    }

    /// Counts the `k` reductions of a replayed recording.
    fn advance(&mut self, k: u32) {
        self.next = self.next.wrapping_add(k);
    }
}

/// Blocks per row and threads per block of a low-latency norm over `rows` rows of `row` values
/// that splits its rows (`None`: a block per row, the plain norm's threads): blocks of a
/// multiple of 8 float4s (whole Q8_0 blocks), about [`LL_BLOCK_VALUES`] values each, one float4
/// per thread, at most [`LL_BLOCKS`] blocks in all. The kernels recompute a block's float4s
/// from the blocks per row (`p2p_part` in kernels/p2p.cu) and get the same count.
fn ll_split(rows: usize, row: usize) -> Option<(usize, u32)> {
    let n4 = row / 4;
    let want = n4.div_ceil(LL_BLOCK_VALUES / 4);
    if want <= 1 || rows * want > LL_BLOCKS {
        return None;
    }
    let per = n4.div_ceil(want).next_multiple_of(8);
    Some((n4.div_ceil(per), per.next_multiple_of(32).min(1024) as u32))
}

/// How [`P2pGroup::norm_launch`] runs a fused norm.
pub struct NormLaunch {
    /// The kernels' context argument.
    pub ctx: KArg,
    /// Blocks of the launch.
    pub blocks: u32,
    /// Threads per block.
    pub threads: u32,
    /// The kernels' last argument: the rows (slot kernels) or the blocks per row (low-latency).
    pub n: i32,
    /// The kernels' name before `_v4*`: `p2p_ll_addrmsnorm` (low-latency), `p2p_llh_addrmsnorm`
    /// (half low-latency), `p2p_addrmsnorm`
    /// (slot kernels, at most a row per block), `p2p_addrmsnorm_rows` (slot kernels whose
    /// blocks loop over the rows, fewer registers a thread) or `p2p_split_addrmsnorm` /
    /// `p2p_split_gather_addrmsnorm` (rows split over the ranks, [`P2pGroup::split_launch`]).
    pub kernel: &'static str,
    /// The `p2p_ll_*` kernels (values pushed with their epoch) rather than the slot kernels.
    pub low_latency: bool,
    /// The low-latency kernels' `pushed`: the product that wrote the partial already pushed
    /// its values ([`P2pGroup::ll_push_ctx`]).
    pub pushed: bool,
    /// The reduction's epoch offset ([`P2pGroup::take_epoch`], taken once the launch is
    /// certain).
    pub epoch: i32,
}

/// Registers `AllReduceAdd`, which sums over the group in `group`.
pub fn register(ops: &mut OpRegistry, gpu: &Arc<Gpu>, group: &GroupSlot) {
    let op = AllReduceAdd {
        gpu: gpu.clone(),
        group: group.clone(),
    };
    ops.insert("AllReduceAdd", Box::new(op));
}

/// `input0 += Σ_ranks input1`: `input0` f32, `input1` (this rank's partial sum) f32, f16 or
/// bf16 of the same count, summed in rank order and rounded to its dtype first (an all-reduce
/// of `input1` followed by `AddTo`). Needs the GPU to be a rank of a [`P2pGroup`].
struct AllReduceAdd {
    gpu: Arc<Gpu>,
    group: GroupSlot,
}

const OP: &str = "AllReduceAdd";

impl Operator for AllReduceAdd {
    fn can_run(&self, d: &DataDict, _: &FloatDict, _: &IntDict) -> bool {
        d.dtype("input0") == Some(DataType::F32)
            && matches!(
                d.dtype("input1"),
                Some(DataType::F32 | DataType::F16 | DataType::BF16)
            )
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let x = d.require(OP, "input0")?;
        let b = d.require(OP, "input1")?;
        if x.count() != b.count() || !x.is_contiguous() || !b.is_contiguous() {
            return Err(super::op_err(
                OP,
                format!("input0 {x:?} and input1 {b:?} must be contiguous with one count"),
            ));
        }
        Ok(())
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, _: &IntDict) -> Result<()> {
        let group = group_of(&self.group, OP)?;
        let ([b], [x]) = d.io_many(OP, ["input1"], ["input0"])?;
        let (Some(b), Some(x)) = (b, x) else {
            return Err(super::op_err(OP, "needs input0 (mutable) and input1"));
        };
        let (bp, xp) = (super::dptr(b, "input1")?, super::dptr(x, "input0")?);
        group.all_reduce(&self.gpu, bp, (b.count(), b.dtype()), Some(xp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block's float4s as `p2p_part` in kernels/p2p.cu computes them from the blocks per row.
    fn kernel_per(n4: usize, parts: usize) -> usize {
        n4.div_ceil(parts).next_multiple_of(8)
    }

    /// The epochs the kernels compute (base word + offset) across launches, a recording and its
    /// replays, and launches between them, with a stale replay (nothing launched) among them.
    #[test]
    fn reductions_get_consecutive_epochs_whether_launched_or_replayed() {
        let mut c = EpochClock::new();
        let mut device_base = 0u32;
        let mut seen = Vec::new();
        let launch = |c: &mut EpochClock, base: u32| base.wrapping_add(c.take() as u32);
        seen.push(launch(&mut c, device_base));
        seen.push(launch(&mut c, device_base));
        // a recording of three reductions runs nothing
        c.begin_recording();
        let recorded: Vec<i32> = (0..3).map(|_| c.take()).collect();
        assert_eq!(c.end_recording(), 3);
        assert_eq!(recorded, [0, 1, 2]);
        for ran in [true, false, true] {
            device_base = c.next_base();
            c.rebased(device_base);
            if ran {
                seen.extend(recorded.iter().map(|&k| device_base.wrapping_add(k as u32)));
                c.advance(3);
            }
            seen.push(launch(&mut c, device_base));
        }
        let want: Vec<u32> = (1..=seen.len() as u32).collect();
        assert_eq!(seen, want);
        // the offset a product's pushes carry is the next reduction's
        let k = c.peek();
        assert_eq!(c.take(), k);
    }

    #[test]
    fn split_rows_cover_each_row_once_with_whole_q8_blocks() {
        for row in (4..=16384).step_by(4) {
            for rows in [1, 2, 3, 4, 7, 16] {
                let n4 = row / 4;
                let Some((parts, threads)) = ll_split(rows, row) else {
                    // a few rows longer than one block's share are always split
                    assert!(row <= LL_BLOCK_VALUES, "{rows}x{row} not split");
                    continue;
                };
                let per = kernel_per(n4, parts);
                assert!(parts > 1 && rows * parts <= LL_BLOCKS, "{rows}x{row}");
                assert_eq!(per % 8, 0, "{row}");
                // every block has float4s, the last one the rest
                assert!(
                    (parts - 1) * per < n4 && n4 <= parts * per,
                    "{row}: {parts} x {per}"
                );
                assert!(threads as usize >= per && threads % 32 == 0 && threads <= 1024);
                assert!(per * 4 <= LL_BLOCK_VALUES, "{row}: {per} float4s a block");
            }
        }
        // more blocks than scratch words: a block per row
        assert_eq!(ll_split(LL_BLOCKS, 4096), None);
    }
}
