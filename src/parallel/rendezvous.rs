//! The rendezvous of a group whose ranks live in several processes (one per host, or one per
//! GPU of a host), as torchrun does it: node 0 listens on `HOST:PORT`, every other node
//! connects to it, says who it is, and is welcomed with a payload (the NCCL id for a GPU group)
//! once all nodes have arrived, or refused with the reason.
//!
//! Node `n` holds the global ranks `n * per_node .. (n + 1) * per_node`. Each rank of a node
//! other than 0 opens two connections to node 0: a control channel (the steps it is told to
//! run, its replies) and a collective channel (host all-reduces of a CPU group). A node that
//! does not arrive within the timeout, a world size that differs between nodes, a node number
//! given twice or a model that differs ends the rendezvous with an error naming it, on node 0
//! and on the nodes that did arrive.

use super::wire::{read_frame, write_frame, Decoder, Encoder};
use crate::error::{Error, Result};
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::time::{Duration, Instant};

const MAGIC: &[u8] = b"fastllm-group-1";
const WELCOME: u8 = 1;
const REFUSED: u8 = 2;

/// Where a process stands in a multi-process group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSpec {
    /// Ranks in the whole group (`--tp`).
    pub tp: usize,
    /// Processes (`--nnodes`); each holds `tp / nnodes` ranks.
    pub nnodes: usize,
    /// This process's number (`--node-rank`), `0..nnodes`; node 0 drives the group.
    pub node_rank: usize,
    /// `HOST:PORT` node 0 listens on and the others connect to (`--rendezvous`).
    pub addr: String,
    /// How long the rendezvous waits for every node, and how long an all-reduce waits for a
    /// rank (`--rendezvous-timeout`).
    pub timeout: Duration,
}

impl GroupSpec {
    /// Checks the numbers: `tp` divisible by `nnodes`, `node_rank < nnodes`, an address.
    pub fn new(
        tp: usize,
        nnodes: usize,
        node_rank: usize,
        addr: &str,
        timeout: Duration,
    ) -> Result<GroupSpec> {
        let bad = |m: String| Error::invalid(format!("process group: {m}"));
        if nnodes < 2 {
            return Err(bad(format!(
                "--nnodes {nnodes}: a group of processes needs at least 2"
            )));
        }
        if tp < nnodes || !tp.is_multiple_of(nnodes) {
            return Err(bad(format!(
                "--tp {tp} does not divide into --nnodes {nnodes} processes with the same number of ranks"
            )));
        }
        if node_rank >= nnodes {
            return Err(bad(format!(
                "--node-rank {node_rank} is not below --nnodes {nnodes}"
            )));
        }
        if addr.trim().is_empty() || !addr.contains(':') {
            return Err(bad(format!("--rendezvous '{addr}' is not HOST:PORT")));
        }
        if timeout.is_zero() {
            return Err(bad("--rendezvous-timeout must be positive".into()));
        }
        Ok(GroupSpec {
            tp,
            nnodes,
            node_rank,
            addr: addr.trim().to_string(),
            timeout,
        })
    }
    /// Ranks per process.
    pub fn per_node(&self) -> usize {
        self.tp / self.nnodes
    }
    /// The global ranks of node `n`.
    pub fn ranks_of(&self, n: usize) -> Range<usize> {
        n * self.per_node()..(n + 1) * self.per_node()
    }
    /// The global ranks of this process.
    pub fn local_ranks(&self) -> Range<usize> {
        self.ranks_of(self.node_rank)
    }
}

/// The connections of one rank of another node, as node 0 holds them (or of a local rank to
/// node 0, as a follower holds them).
pub struct RankLink {
    /// The global rank.
    pub rank: usize,
    /// Steps and replies.
    pub control: TcpStream,
    /// Host all-reduces.
    pub collective: TcpStream,
}

struct Hello {
    channel: u8,
    node: usize,
    nnodes: usize,
    tp: usize,
    rank: usize,
    fingerprint: String,
}

fn hello_bytes(spec: &GroupSpec, channel: u8, rank: usize, fingerprint: &str) -> Vec<u8> {
    let mut e = Encoder::new();
    e.bytes(MAGIC)
        .u8(channel)
        .usize(spec.node_rank)
        .usize(spec.nnodes)
        .usize(spec.tp)
        .usize(rank)
        .str(fingerprint);
    e.finish()
}

fn parse_hello(b: &[u8]) -> Result<Hello> {
    let mut d = Decoder::new(b);
    if d.bytes()? != MAGIC {
        return Err(Error::Device("not a fastllm group member".into()));
    }
    Ok(Hello {
        channel: d.u8()?,
        node: d.usize()?,
        nnodes: d.usize()?,
        tp: d.usize()?,
        rank: d.usize()?,
        fingerprint: d.str()?,
    })
}

fn io_err(addr: &str, what: &str, e: std::io::Error) -> Error {
    Error::Device(format!("rendezvous {addr}: {what}: {e}"))
}

/// Checks a newcomer against node 0's own view; `Err` is the refusal's text.
fn check_hello(spec: &GroupSpec, fingerprint: &str, h: &Hello) -> std::result::Result<(), String> {
    if h.nnodes != spec.nnodes {
        return Err(format!(
            "node {} says --nnodes {} but node 0 has --nnodes {}",
            h.node, h.nnodes, spec.nnodes
        ));
    }
    if h.tp != spec.tp {
        return Err(format!(
            "node {} says --tp {} but node 0 has --tp {} (the world sizes differ)",
            h.node, h.tp, spec.tp
        ));
    }
    if h.node == 0 || h.node >= spec.nnodes || !spec.ranks_of(h.node).contains(&h.rank) {
        return Err(format!(
            "node {} (rank {}) is not a valid other node of {} nodes",
            h.node, h.rank, spec.nnodes
        ));
    }
    if h.fingerprint != fingerprint {
        return Err(format!(
            "node {} loaded a different model or precision ({}) than node 0 ({})",
            h.node, h.fingerprint, fingerprint
        ));
    }
    Ok(())
}

fn refuse(streams: &mut [TcpStream], why: &str) {
    let mut e = Encoder::new();
    e.u8(REFUSED).str(why);
    let body = e.finish();
    for s in streams {
        let _ = write_frame(s, &body);
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
}

/// Node 0's side: listens on `spec.addr` until every rank of every other node has opened its
/// two channels, then sends each the `payload`. Returns the links of ranks `per_node..tp`, in
/// rank order.
pub fn host(spec: &GroupSpec, fingerprint: &str, payload: &[u8]) -> Result<Vec<RankLink>> {
    let listener =
        TcpListener::bind(&spec.addr).map_err(|e| io_err(&spec.addr, "cannot listen", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| io_err(&spec.addr, "listener", e))?;
    let deadline = Instant::now() + spec.timeout;
    let remote = spec.per_node()..spec.tp;
    let mut slots: Vec<[Option<TcpStream>; 2]> = remote.clone().map(|_| [None, None]).collect();
    let mut accepted: Vec<TcpStream> = Vec::new();
    let fail = |accepted: &mut Vec<TcpStream>, why: String| -> Error {
        refuse(accepted, &why);
        Error::Device(format!("rendezvous {}: {why}", spec.addr))
    };
    while slots.iter().any(|s| s[0].is_none() || s[1].is_none()) {
        let (mut stream, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing = missing_nodes(spec, &slots);
                    return Err(fail(
                        &mut accepted,
                        format!(
                            "node(s) {missing} never arrived within {:?} (--nnodes {})",
                            spec.timeout, spec.nnodes
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => return Err(fail(&mut accepted, format!("accept: {e}"))),
        };
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        let hello = stream
            .set_nonblocking(false)
            .and_then(|_| stream.set_read_timeout(Some(wait)))
            .map_err(|e| e.to_string())
            .and_then(|_| read_frame(&mut stream).map_err(|e| e.to_string()))
            .and_then(|b| parse_hello(&b).map_err(|e| e.to_string()));
        let h = match hello {
            Ok(h) => h,
            Err(_) => continue, // not one of ours (a port scan, a stray client): ignore it
        };
        let slot = (h.channel as usize).wrapping_sub(1);
        match stream.try_clone() {
            Ok(c) => accepted.push(c),
            Err(e) => return Err(fail(&mut accepted, format!("socket: {e}"))),
        }
        if let Err(why) = check_hello(spec, fingerprint, &h) {
            return Err(fail(&mut accepted, why));
        }
        let Some(s) = slots
            .get_mut(h.rank - remote.start)
            .and_then(|s| s.get_mut(slot))
        else {
            return Err(fail(
                &mut accepted,
                format!("node {} sent an unknown channel", h.node),
            ));
        };
        if s.is_some() {
            return Err(fail(
                &mut accepted,
                format!(
                    "node {} arrived twice (two processes with --node-rank {})",
                    h.node, h.node
                ),
            ));
        }
        *s = Some(stream);
    }
    welcome(spec, slots, payload, remote.start)
}

fn missing_nodes(spec: &GroupSpec, slots: &[[Option<TcpStream>; 2]]) -> String {
    let mut nodes: Vec<usize> = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s[0].is_none() || s[1].is_none())
        .map(|(i, _)| (i + spec.per_node()) / spec.per_node())
        .collect();
    nodes.dedup();
    nodes
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn welcome(
    spec: &GroupSpec,
    slots: Vec<[Option<TcpStream>; 2]>,
    payload: &[u8],
    first: usize,
) -> Result<Vec<RankLink>> {
    let mut e = Encoder::new();
    e.u8(WELCOME).bytes(payload);
    let body = e.finish();
    let mut links = Vec::new();
    for (i, [c, k]) in slots.into_iter().enumerate() {
        let (Some(mut control), Some(collective)) = (c, k) else {
            return Err(Error::Device("rendezvous: a channel is missing".into()));
        };
        write_frame(&mut control, &body).map_err(|e| io_err(&spec.addr, "welcome", e))?;
        for s in [&control, &collective] {
            s.set_read_timeout(None)
                .and_then(|_| s.set_nodelay(true))
                .map_err(|e| io_err(&spec.addr, "socket", e))?;
        }
        links.push(RankLink {
            rank: first + i,
            control,
            collective,
        });
    }
    Ok(links)
}

/// Connects to `addr`, retrying while nobody listens yet, until `deadline`.
fn connect(addr: &str, deadline: Instant) -> Result<TcpStream> {
    loop {
        let targets = addr
            .to_socket_addrs()
            .map_err(|e| io_err(addr, "cannot resolve the address", e))?;
        let mut last = None;
        for t in targets {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(&t, left.max(Duration::from_millis(50))) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        if Instant::now() >= deadline {
            return Err(Error::Device(format!(
                "rendezvous {addr}: node 0 did not answer within the timeout ({})",
                last.map_or("no address".to_string(), |e| e.to_string())
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A follower's side (node > 0): opens both channels of every local rank to node 0 and waits
/// for the welcome. Returns node 0's payload and the links of the local ranks in rank order.
pub fn join(spec: &GroupSpec, fingerprint: &str) -> Result<(Vec<u8>, Vec<RankLink>)> {
    let deadline = Instant::now() + spec.timeout;
    let mut links = Vec::new();
    for rank in spec.local_ranks() {
        let open = |channel: u8| -> Result<TcpStream> {
            let mut s = connect(&spec.addr, deadline)?;
            write_frame(&mut s, &hello_bytes(spec, channel, rank, fingerprint))
                .map_err(|e| io_err(&spec.addr, "hello", e))?;
            s.set_nodelay(true)
                .map_err(|e| io_err(&spec.addr, "socket", e))?;
            Ok(s)
        };
        let control = open(1)?;
        let collective = open(2)?;
        links.push(RankLink {
            rank,
            control,
            collective,
        });
    }
    let mut payload = Vec::new();
    for l in &mut links {
        let left = deadline.saturating_duration_since(Instant::now());
        l.control
            .set_read_timeout(Some(left.max(Duration::from_millis(100))))
            .map_err(|e| io_err(&spec.addr, "socket", e))?;
        let reply = read_frame(&mut l.control).map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => Error::Device(format!(
                "rendezvous {}: the group was not complete within {:?}",
                spec.addr, spec.timeout
            )),
            _ => io_err(&spec.addr, "node 0 closed the rendezvous", e),
        })?;
        let mut d = Decoder::new(&reply);
        match d.u8()? {
            WELCOME => payload = d.bytes()?.to_vec(),
            _ => {
                return Err(Error::Device(format!(
                    "rendezvous {}: node 0 refused node {}: {}",
                    spec.addr,
                    spec.node_rank,
                    d.str()?
                )))
            }
        }
        l.control
            .set_read_timeout(None)
            .map_err(|e| io_err(&spec.addr, "socket", e))?;
    }
    Ok((payload, links))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_addr() -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    }

    fn spec(tp: usize, nnodes: usize, node: usize, addr: &str, ms: u64) -> GroupSpec {
        GroupSpec::new(tp, nnodes, node, addr, Duration::from_millis(ms)).unwrap()
    }

    #[test]
    fn spec_checks_its_numbers() {
        let t = Duration::from_secs(1);
        assert!(GroupSpec::new(2, 1, 0, "h:1", t).is_err());
        assert!(GroupSpec::new(3, 2, 0, "h:1", t).is_err());
        assert!(GroupSpec::new(2, 2, 2, "h:1", t).is_err());
        assert!(GroupSpec::new(2, 2, 1, "nohost", t).is_err());
        let s = GroupSpec::new(4, 2, 1, "h:1", t).unwrap();
        assert_eq!(s.local_ranks(), 2..4);
    }

    #[test]
    fn three_nodes_meet_and_get_the_payload() {
        let addr = free_addr();
        let joins: Vec<_> = (1..3)
            .map(|n| {
                let s = spec(3, 3, n, &addr, 5000);
                std::thread::spawn(move || join(&s, "m"))
            })
            .collect();
        let links = host(&spec(3, 3, 0, &addr, 5000), "m", b"id").unwrap();
        assert_eq!(links.iter().map(|l| l.rank).collect::<Vec<_>>(), vec![1, 2]);
        for j in joins {
            let (p, l) = j.join().unwrap().unwrap();
            assert_eq!(p, b"id");
            assert_eq!(l.len(), 1);
        }
    }

    #[test]
    fn a_different_world_size_is_refused_on_both_sides() {
        let addr = free_addr();
        let s = spec(4, 2, 1, &addr, 5000);
        let j = std::thread::spawn(move || join(&s, "m"));
        let e = host(&spec(2, 2, 0, &addr, 5000), "m", b"").err().unwrap();
        assert!(e.to_string().contains("--tp 4"), "{e}");
        let e = j.join().unwrap().err().unwrap();
        assert!(e.to_string().contains("world sizes differ"), "{e}");
    }

    #[test]
    fn a_missing_node_times_out_with_its_number() {
        let addr = free_addr();
        let e = host(&spec(2, 2, 0, &addr, 300), "m", b"").err().unwrap();
        assert!(e.to_string().contains("node(s) 1 never arrived"), "{e}");
        let e = join(&spec(2, 2, 1, &free_addr(), 300), "m").err().unwrap();
        assert!(e.to_string().contains("did not answer"), "{e}");
    }

    #[test]
    fn a_different_model_is_refused() {
        let addr = free_addr();
        let s = spec(2, 2, 1, &addr, 5000);
        let j = std::thread::spawn(move || join(&s, "other"));
        assert!(host(&spec(2, 2, 0, &addr, 5000), "m", b"").is_err());
        let e = j.join().unwrap().err().unwrap();
        assert!(e.to_string().contains("different model"), "{e}");
    }
}
