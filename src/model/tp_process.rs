//! Tensor-parallel ranks as processes: node 0 drives the group (its own ranks are threads, the
//! others are [`RemoteRank`]s reached over the control channels of the rendezvous), and every
//! other node follows ([`Follower`]): it runs each step node 0 sends on its local ranks and
//! replies with their logits. The all-reduces go over NCCL for GPU ranks and over
//! [`TcpCollective`] for CPU ranks.
//!
//! A rank that disconnects, times out or fails alone stops the group: node 0's calls return
//! an error naming the rank, and node 0 tells the other nodes why before closing their
//! channels, so every process ends with that error instead of waiting.

use super::config::ModelConfig;
use super::precision::Precision;
use super::tensor_parallel::{rank_model, Cmd, RankLogits, RankState, Reply, ShardPlan, TpGroup};
use super::transformer::{Model, PagedBatch};
use super::weights::WeightSource;
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::options::RuntimeOptions;
use crate::parallel::rendezvous::{self, GroupSpec, RankLink};
use crate::parallel::tcp::TcpCollective;
use crate::parallel::wire::{read_frame, write_frame, Decoder, Encoder};
use crate::parallel::Collective;
use std::io::ErrorKind;
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;

// Frame tags of the control channel.
const NEW_CACHE: u8 = 1;
const TRUNCATE: u8 = 2;
const FREE: u8 = 3;
const FORWARD: u8 = 4;
const NEW_POOL: u8 = 5;
const FREE_POOL: u8 = 6;
const PAGED: u8 = 7;
const SHUTDOWN: u8 = 8;
const ABORT: u8 = 9;
const DONE: u8 = 10;
const LOGITS: u8 = 11;
const TOP: u8 = 12;

fn encode_cmd(c: &Cmd) -> Vec<u8> {
    let mut e = Encoder::new();
    match c {
        Cmd::NewCache { id, cap } => e.u8(NEW_CACHE).u64(*id).usize(*cap),
        Cmd::Truncate { id, len } => e.u8(TRUNCATE).u64(*id).usize(*len),
        Cmd::Free { id } => e.u8(FREE).u64(*id),
        Cmd::Forward {
            id,
            tokens,
            all,
            top,
        } => e
            .u8(FORWARD)
            .u64(*id)
            .u32s(tokens)
            .u8(*all as u8)
            .u8(*top as u8),
        Cmd::NewPool {
            id,
            blocks,
            block_size,
        } => e.u8(NEW_POOL).u64(*id).usize(*blocks).usize(*block_size),
        Cmd::FreePool { id } => e.u8(FREE_POOL).u64(*id),
        Cmd::Paged { id, batch: b, top } => e
            .u8(PAGED)
            .u64(*id)
            .u32s(&b.tokens)
            .i32s(&b.pos)
            .i32s(&b.rows)
            .i32s(&b.slots)
            .i32s(&b.q_starts)
            .i32s(&b.kv_lens)
            .i32s(&b.table)
            .usize(b.seqs)
            .usize(b.max_blocks)
            .u8(*top as u8),
    };
    e.finish()
}

/// What a follower reads on its control channel.
enum Incoming {
    Cmd(Cmd),
    Shutdown,
    Abort(String),
}

fn decode_cmd(body: &[u8]) -> Result<Incoming> {
    let mut d = Decoder::new(body);
    let cmd = match d.u8()? {
        NEW_CACHE => Cmd::NewCache {
            id: d.u64()?,
            cap: d.usize()?,
        },
        TRUNCATE => Cmd::Truncate {
            id: d.u64()?,
            len: d.usize()?,
        },
        FREE => Cmd::Free { id: d.u64()? },
        FORWARD => Cmd::Forward {
            id: d.u64()?,
            tokens: d.u32s()?,
            all: d.u8()? != 0,
            top: d.u8()? != 0,
        },
        NEW_POOL => Cmd::NewPool {
            id: d.u64()?,
            blocks: d.usize()?,
            block_size: d.usize()?,
        },
        FREE_POOL => Cmd::FreePool { id: d.u64()? },
        PAGED => Cmd::Paged {
            id: d.u64()?,
            batch: PagedBatch {
                tokens: d.u32s()?,
                pos: d.i32s()?,
                rows: d.i32s()?,
                slots: d.i32s()?,
                q_starts: d.i32s()?,
                kv_lens: d.i32s()?,
                table: d.i32s()?,
                seqs: d.usize()?,
                max_blocks: d.usize()?,
            },
            top: d.u8()? != 0,
        },
        SHUTDOWN => return Ok(Incoming::Shutdown),
        ABORT => return Ok(Incoming::Abort(d.str()?)),
        t => return Err(Error::Device(format!("group message: unknown tag {t}"))),
    };
    Ok(Incoming::Cmd(cmd))
}

fn encode_error(e: &mut Encoder, err: &Error) {
    let code = match err {
        Error::InvalidArgument(_) => 1,
        Error::Unsupported(_) => 2,
        Error::OutOfMemory(_) => 3,
        Error::ContextFull(_) => 4,
        _ => 5,
    };
    let text = match err {
        Error::InvalidArgument(m)
        | Error::Unsupported(m)
        | Error::OutOfMemory(m)
        | Error::ContextFull(m)
        | Error::Device(m) => m.clone(),
        other => other.to_string(),
    };
    e.u8(code).str(&text);
}

fn decode_error(d: &mut Decoder) -> Result<Error> {
    let code = d.u8()?;
    let m = d.str()?;
    Ok(match code {
        1 => Error::InvalidArgument(m),
        2 => Error::Unsupported(m),
        3 => Error::OutOfMemory(m),
        4 => Error::ContextFull(m),
        _ => Error::Device(m),
    })
}

fn encode_reply(r: &Reply) -> Vec<u8> {
    match r {
        Reply::Done(res) => encode_result(DONE, res, |_, ()| {}),
        Reply::Logits(res) => encode_result(LOGITS, res, |e, (rows, width, v)| {
            e.usize(*rows).usize(*width).f32s(v);
        }),
        Reply::Top(res) => encode_result(TOP, res, |e, top| {
            let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
            let vals: Vec<f32> = top.iter().map(|t| t.1).collect();
            e.u32s(&ids).f32s(&vals);
        }),
    }
}

/// A reply of kind `tag`: 0 and what `ok` writes of the value, or 1 and the error.
fn encode_result<T>(tag: u8, res: &Result<T>, ok: impl FnOnce(&mut Encoder, &T)) -> Vec<u8> {
    let mut e = Encoder::new();
    e.u8(tag);
    match res {
        Ok(v) => ok(e.u8(0), v),
        Err(err) => encode_error(e.u8(1), err),
    }
    e.finish()
}

fn decode_reply(body: &[u8]) -> Result<Reply> {
    let mut d = Decoder::new(body);
    let tag = d.u8()?;
    let ok = d.u8()? == 0;
    Ok(match (tag, ok) {
        (DONE, true) => Reply::Done(Ok(())),
        (DONE, false) => Reply::Done(Err(decode_error(&mut d)?)),
        (LOGITS, true) => {
            let logits: RankLogits = (d.usize()?, d.usize()?, d.f32s()?);
            Reply::Logits(Ok(logits))
        }
        (LOGITS, false) => Reply::Logits(Err(decode_error(&mut d)?)),
        (TOP, true) => {
            let (ids, vals) = (d.u32s()?, d.f32s()?);
            if ids.len() != vals.len() {
                return Err(Error::Device(
                    "group reply: candidates and logits differ".into(),
                ));
            }
            Reply::Top(Ok(ids.into_iter().zip(vals).collect()))
        }
        (TOP, false) => Reply::Top(Err(decode_error(&mut d)?)),
        (t, _) => return Err(Error::Device(format!("group reply: unknown tag {t}"))),
    })
}

fn io_text(e: &std::io::Error) -> String {
    match e.kind() {
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
            "disconnected (its process ended?)".to_string()
        }
        _ => e.to_string(),
    }
}

/// Node 0's end of the control channel of a rank in another process.
pub(crate) struct RemoteRank {
    control: TcpStream,
    /// The rank's collective channel, closed on [`RemoteRank::abort`] so that a rank waiting in
    /// an all-reduce wakes up.
    collective: TcpStream,
}

impl RemoteRank {
    /// Sends `cmd`; `Err` says why the channel is gone.
    pub(crate) fn send(&self, cmd: &Cmd) -> std::result::Result<(), String> {
        write_frame(&mut &self.control, &encode_cmd(cmd)).map_err(|e| io_text(&e))
    }
    /// The rank's reply to the last command.
    pub(crate) fn recv(&self) -> std::result::Result<Reply, String> {
        let body = read_frame(&mut &self.control).map_err(|e| io_text(&e))?;
        decode_reply(&body).map_err(|e| e.to_string())
    }
    /// Tells the rank why the group stops, and closes its channels.
    pub(crate) fn abort(&self, why: &str) {
        let mut e = Encoder::new();
        e.u8(ABORT).str(why);
        let _ = write_frame(&mut &self.control, &e.finish());
        let _ = self.control.shutdown(Shutdown::Both);
        let _ = self.collective.shutdown(Shutdown::Both);
    }
}

impl Drop for RemoteRank {
    fn drop(&mut self) {
        let _ = write_frame(&mut &self.control, &[SHUTDOWN]);
    }
}

/// A short digest of what must agree between the nodes of a group (the model's configuration
/// and the precision), compared at the rendezvous.
fn fingerprint(config: &ModelConfig, precision: Precision, device: &str) -> String {
    let text = format!("{config:?}|{precision:?}|{}", device_kind(device));
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{}-{h:016x}", config.architecture)
}

fn device_kind(device: &str) -> &str {
    device.split(':').next().unwrap_or(device)
}

/// What a process became in a group of processes.
pub enum GroupRole {
    /// Node 0: the model that drives the whole group.
    Driver(Box<Model>),
    /// Another node: call [`Follower::run`] to serve node 0's steps.
    Follower(Follower),
}

/// The local ranks of a node other than 0, ready to follow node 0's steps.
pub struct Follower {
    ranks: Vec<(Model, TcpStream)>,
    node: usize,
    addr: String,
}

impl Follower {
    /// Runs node 0's steps on the local ranks until node 0 shuts the group down (`Ok`) or it
    /// ends: node 0's process gone, or a rank's failure it reports (`Err` naming it).
    pub fn run(self) -> Result<()> {
        let (node, addr) = (self.node, self.addr.as_str());
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = self
                .ranks
                .into_iter()
                .map(|(m, c)| s.spawn(move || follow(&m, c, node, addr)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Device("a rank thread panicked".into())))
                })
                .collect()
        });
        results.into_iter().collect()
    }

    /// This node's number.
    pub fn node(&self) -> usize {
        self.node
    }
}

fn follow(model: &Model, mut control: TcpStream, node: usize, addr: &str) -> Result<()> {
    let mut state = RankState::default();
    loop {
        let body = read_frame(&mut control).map_err(|e| {
            Error::Device(format!(
                "node {node}: node 0 ({addr}) {}",
                io_text(&e).replace("its process", "node 0's process")
            ))
        })?;
        let cmd = match decode_cmd(&body)? {
            Incoming::Cmd(c) => c,
            Incoming::Shutdown => return Ok(()),
            Incoming::Abort(why) => {
                return Err(Error::Device(format!("node 0 stopped the group: {why}")))
            }
        };
        if let Some(reply) = state.handle(model, cmd) {
            write_frame(&mut control, &encode_reply(&reply)).map_err(|e| {
                Error::Device(format!("node {node}: replying to node 0: {}", io_text(&e)))
            })?;
        }
    }
}

/// How the ranks of this process are built: the load options every rank shares.
#[derive(Clone, Debug)]
pub struct RankSetup {
    /// CPU threads per rank (0 = the device's default).
    pub threads: usize,
    /// Activation precision.
    pub precision: Precision,
    /// Weights read from disk right before use.
    pub low_memory: bool,
    /// The run-time switches.
    pub runtime: RuntimeOptions,
}

/// Joins (node > 0) or hosts (node 0) a group of CPU processes, one rank per process, over
/// `source` (each rank reads only its shard), its rank on the executor `executor` makes.
/// Node 0 gets the driver model.
pub fn cpu_process_group(
    spec: &GroupSpec,
    config: ModelConfig,
    source: Arc<dyn WeightSource>,
    setup: &RankSetup,
    executor: &dyn Fn() -> Result<Executor>,
) -> Result<GroupRole> {
    if spec.per_node() != 1 {
        return Err(Error::Unsupported(format!(
            "CPU ranks as processes: one rank per process (--tp {} with --nnodes {} gives {})",
            spec.tp,
            spec.nnodes,
            spec.per_node()
        )));
    }
    let plan = ShardPlan::new(&config, spec.tp)?;
    let fp = fingerprint(&config, setup.precision, "cpu");
    let (timeout, world, precision) = (spec.timeout, spec.tp, setup.precision);
    let build = |rank: usize, comm: Arc<dyn Collective>| -> Result<Model> {
        let exec = executor()?;
        let s = setup;
        rank_model(
            &plan,
            rank,
            source.clone(),
            exec,
            comm,
            s.precision,
            false,
            &s.runtime,
        )
    };
    if spec.node_rank == 0 {
        let links = rendezvous::host(spec, &fp, &[])?;
        let hub_streams = links
            .iter()
            .map(|l| l.collective.try_clone())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| Error::Device(format!("group socket: {e}")))?;
        let hub: Arc<dyn Collective> = Arc::new(TcpCollective::hub(hub_streams, timeout)?);
        let local = build(0, hub)?;
        driver(
            spec,
            config.clone(),
            local_builder(local),
            links,
            precision,
            "cpu",
        )
    } else {
        let (_, links) = rendezvous::join(spec, &fp)?;
        let mut ranks = Vec::new();
        for l in links {
            let comm = TcpCollective::member(l.rank, world, l.collective, timeout)?;
            ranks.push((build(l.rank, Arc::new(comm))?, l.control));
        }
        Ok(GroupRole::Follower(Follower {
            ranks,
            node: spec.node_rank,
            addr: spec.addr.clone(),
        }))
    }
}

fn local_builder(m: Model) -> Vec<super::tensor_parallel::RankBuilder> {
    vec![Box::new(move || Ok(m))]
}

/// Node 0's driver over its local ranks (`builders`) and the other nodes' ranks (`links`).
fn driver(
    spec: &GroupSpec,
    config: ModelConfig,
    builders: Vec<super::tensor_parallel::RankBuilder>,
    links: Vec<RankLink>,
    precision: Precision,
    device: &str,
) -> Result<GroupRole> {
    let plan = ShardPlan::new(&config, spec.tp)?;
    let remote = links
        .into_iter()
        .map(|l| RemoteRank {
            control: l.control,
            collective: l.collective,
        })
        .collect();
    let label = format!("{device} x{} over {} nodes", spec.tp, spec.nnodes);
    let group = TpGroup::start_with_remote(plan, builders, remote, &label)?;
    Ok(GroupRole::Driver(Box::new(Model::driver(
        config,
        Arc::new(group),
        precision,
    )?)))
}

/// The devices of a group of GPU processes, made by the caller (the program's edge): the
/// group's id that node 0 hands out at the rendezvous (NCCL's unique id), and each local rank's
/// executor and all-reduce from that id.
pub struct DeviceRanks<'a> {
    /// The device kind, part of the group's fingerprint (`cuda`).
    pub kind: &'a str,
    /// Ranks of this process.
    pub local: usize,
    /// Node 0 makes the group's id.
    pub new_id: &'a dyn Fn() -> Result<Vec<u8>>,
    /// (id, global rank, local index) → that rank's executor and all-reduce, on its thread.
    pub rank: RankParts,
}

/// Makes one rank's executor and all-reduce (see [`DeviceRanks`]).
pub type RankParts =
    Arc<dyn Fn(&[u8], usize, usize) -> Result<(Executor, Arc<dyn Collective>)> + Send + Sync>;

/// Joins (node > 0) or hosts (node 0) a group of GPU processes: each process runs the ranks
/// of its local GPUs (`dev.local`, as many as `spec.per_node()`), node 0 makes the group's id
/// and hands it out at the rendezvous, and the devices' collective then connects the ranks.
pub fn device_process_group(
    spec: &GroupSpec,
    config: ModelConfig,
    source: Arc<dyn WeightSource>,
    setup: &RankSetup,
    dev: &DeviceRanks,
) -> Result<GroupRole> {
    if dev.local != spec.per_node() {
        return Err(Error::invalid(format!(
            "this process lists {} GPUs but --tp {} over --nnodes {} gives {} per process",
            dev.local,
            spec.tp,
            spec.nnodes,
            spec.per_node()
        )));
    }
    let plan = ShardPlan::new(&config, spec.tp)?;
    let precision = setup.precision;
    let fp = fingerprint(&config, precision, dev.kind);
    let builder = |id: Vec<u8>, rank: usize, i: usize| {
        let (plan, source, s, parts) = (
            plan.clone(),
            source.clone(),
            setup.clone(),
            dev.rank.clone(),
        );
        move || -> Result<Model> {
            let (exec, comm) = parts(&id, rank, i)?;
            rank_model(
                &plan,
                rank,
                source,
                exec,
                comm,
                s.precision,
                s.low_memory,
                &s.runtime,
            )
        }
    };
    let first = spec.local_ranks().start;
    if spec.node_rank == 0 {
        let bytes = (dev.new_id)()?;
        // NCCL's communicator creation blocks until every rank joins: the local ranks start
        // (in their threads) only after the other nodes have the id.
        let links = rendezvous::host(spec, &fp, &bytes)?;
        let builders = (0..dev.local)
            .map(|i| {
                Box::new(builder(bytes.clone(), first + i, i))
                    as super::tensor_parallel::RankBuilder
            })
            .collect();
        driver(spec, config.clone(), builders, links, precision, dev.kind)
    } else {
        let (bytes, links) = rendezvous::join(spec, &fp)?;
        let models: Vec<Result<Model>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..dev.local)
                .map(|i| {
                    let b = builder(bytes.clone(), first + i, i);
                    s.spawn(b)
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Device("a rank thread panicked".into())))
                })
                .collect()
        });
        let mut ranks = Vec::new();
        for (m, l) in models.into_iter().zip(links) {
            ranks.push((m?, l.control));
        }
        Ok(GroupRole::Follower(Follower {
            ranks,
            node: spec.node_rank,
            addr: spec.addr.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_replies_round_trip() {
        let b = PagedBatch {
            tokens: vec![1, 2],
            pos: vec![0, 5],
            rows: vec![0, 1],
            slots: vec![3, 9],
            q_starts: vec![0, 1, 2],
            kv_lens: vec![1, 6],
            table: vec![0, 1, 2, -1],
            seqs: 2,
            max_blocks: 2,
        };
        let body = encode_cmd(&Cmd::Paged {
            id: 7,
            batch: b,
            top: true,
        });
        match decode_cmd(&body).unwrap() {
            Incoming::Cmd(Cmd::Paged { id, batch, top }) => {
                assert_eq!(id, 7);
                assert!(top);
                assert_eq!(batch.table, vec![0, 1, 2, -1]);
                assert_eq!(batch.max_blocks, 2);
            }
            _ => panic!("wrong command"),
        }
        let r = encode_reply(&Reply::Logits(Ok((1, 3, vec![0.5, -1.0, 2.0]))));
        match decode_reply(&r).unwrap() {
            Reply::Logits(Ok((1, 3, v))) => assert_eq!(v, vec![0.5, -1.0, 2.0]),
            _ => panic!("wrong reply"),
        }
        let body = encode_cmd(&Cmd::Forward {
            id: 3,
            tokens: vec![4, 5],
            all: true,
            top: false,
        });
        match decode_cmd(&body).unwrap() {
            Incoming::Cmd(Cmd::Forward {
                id: 3,
                tokens,
                all: true,
                top: false,
            }) => assert_eq!(tokens, vec![4, 5]),
            _ => panic!("wrong command"),
        }
        let r = encode_reply(&Reply::Top(Ok(vec![(7, 1.5), (0, -2.0)])));
        match decode_reply(&r).unwrap() {
            Reply::Top(Ok(t)) => assert_eq!(t, vec![(7, 1.5), (0, -2.0)]),
            _ => panic!("wrong reply"),
        }
        let r = encode_reply(&Reply::Done(Err(Error::ContextFull("full".into()))));
        match decode_reply(&r).unwrap() {
            Reply::Done(Err(Error::ContextFull(m))) => assert_eq!(m, "full"),
            _ => panic!("wrong reply"),
        }
        assert!(decode_cmd(&[200]).is_err());
    }
}
