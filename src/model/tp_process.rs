//! Tensor-parallel ranks as processes: node 0 drives the group (its own ranks are threads, the
//! others are `RemoteRank`s reached over the control channels of the rendezvous), and every
//! other node follows ([`Follower`]): it runs each step node 0 sends on its local ranks and
//! replies with their logits. The all-reduces go over NCCL for GPU ranks and over
//! [`TcpCollective`] for CPU ranks.
//!
//! A rank that disconnects, times out or fails alone stops the group: node 0's calls return
//! an error naming the rank, and node 0 tells the other nodes why before closing their
//! channels, so every process ends with that error instead of waiting.

use super::config::ModelConfig;
use super::precision::Precision;
use super::shard::ShardPlan;
use super::tensor_parallel::{rank_model, RankBuilder, RankState};
use super::tp_group::TpGroup;
use super::tp_link::{decode_cmd, encode_reply, io_text, Incoming, RemoteRank};
use super::transformer::Model;
use super::weights::WeightSource;
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::options::RuntimeOptions;
use crate::parallel::rendezvous::{self, GroupSpec, RankLink};
use crate::parallel::tcp::TcpCollective;
use crate::parallel::wire::{read_frame, write_frame};
use crate::parallel::Collective;
use std::net::TcpStream;
use std::sync::Arc;

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

fn local_builder(m: Model) -> Vec<RankBuilder> {
    vec![Box::new(move || Ok(m))]
}

/// Node 0's driver over its local ranks (`builders`) and the other nodes' ranks (`links`).
fn driver(
    spec: &GroupSpec,
    config: ModelConfig,
    builders: Vec<RankBuilder>,
    links: Vec<RankLink>,
    precision: Precision,
    device: &str,
) -> Result<GroupRole> {
    let plan = ShardPlan::new(&config, spec.tp)?;
    let remote = links
        .into_iter()
        .map(|l| RemoteRank::new(l.control, l.collective))
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
            .map(|i| Box::new(builder(bytes.clone(), first + i, i)) as RankBuilder)
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
