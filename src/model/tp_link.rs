//! The driver's channel to one rank of a tensor-parallel group: the commands it sends
//! ([`Cmd`]) and the replies ([`Reply`]), over an in-process channel to a worker thread or the
//! control connection of a rank in another process ([`RemoteRank`]), whose wire form this module
//! also owns.

use super::paged_batch::PagedBatch;
use crate::error::{Error, Result};
use crate::parallel::wire::{read_frame, write_frame, Decoder, Encoder};
use std::io::ErrorKind;
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc::{Receiver, RecvError, Sender, TryRecvError};
use std::time::{Duration, Instant};

/// A step or cache operation sent to a rank.
pub(crate) enum Cmd {
    NewCache {
        id: u64,
        cap: usize,
    },
    Truncate {
        id: u64,
        len: usize,
    },
    Free {
        id: u64,
    },
    /// `tokens` after cache `id`'s: the logits of every new row (`all`) or of the last one;
    /// with `top`, only the last row's best candidate of the rank's vocabulary slice.
    Forward {
        id: u64,
        tokens: Vec<u32>,
        all: bool,
        top: bool,
    },
    NewPool {
        id: u64,
        blocks: usize,
        block_size: usize,
    },
    FreePool {
        id: u64,
    },
    /// A planned paged step on pool `id`: its logits rows, or with `top` each row's best
    /// candidate of the rank's vocabulary slice.
    Paged {
        id: u64,
        batch: PagedBatch,
        top: bool,
    },
}

/// Logits of one rank: rows, width, values.
pub(crate) type RankLogits = (usize, usize, Vec<f32>);

/// Each row's best logit of one rank's vocabulary slice: (index in the slice, value).
pub(crate) type RankTop = Vec<(u32, f32)>;

/// A rank's answer to a [`Cmd`].
pub(crate) enum Reply {
    Done(Result<()>),
    Logits(Result<RankLogits>),
    Top(Result<RankTop>),
}

/// The driver's channel to one rank: a worker thread of this process (whose replies the
/// driver polls for `poll` before it sleeps, see [`recv_polling`]), or a rank of another
/// process (see `model::tp_process`).
pub(super) enum Link {
    Local {
        tx: Sender<Cmd>,
        rx: Receiver<Reply>,
        poll: Duration,
    },
    Remote(RemoteRank),
}

/// How long the two ends of a GPU rank's channel poll before they sleep: a decode step's reply
/// comes within a step (milliseconds) and the next command right after it, and waking a
/// sleeping thread would add its latency to every token. CPU ranks do not poll (their
/// threads need the cores).
pub(super) const GPU_POLL: Duration = Duration::from_millis(20);

/// The next message of `rx`: polled for up to `poll`, then waited for asleep.
pub(super) fn recv_polling<T>(rx: &Receiver<T>, poll: Duration) -> Result<T, RecvError> {
    if !poll.is_zero() {
        let t0 = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(v) => return Ok(v),
                Err(TryRecvError::Disconnected) => return Err(RecvError),
                Err(TryRecvError::Empty) if t0.elapsed() > poll => break,
                Err(TryRecvError::Empty) => std::hint::spin_loop(),
            }
        }
    }
    rx.recv()
}

impl Reply {
    pub(super) fn is_err(&self) -> bool {
        matches!(
            self,
            Reply::Done(Err(_)) | Reply::Logits(Err(_)) | Reply::Top(Err(_))
        )
    }
    pub(super) fn err_text(&self) -> Option<String> {
        match self {
            Reply::Done(Err(e)) | Reply::Logits(Err(e)) | Reply::Top(Err(e)) => Some(e.to_string()),
            _ => None,
        }
    }
}

impl Link {
    pub(super) fn send(&self, cmd: Cmd) -> std::result::Result<(), String> {
        match self {
            Link::Local { tx, .. } => tx.send(cmd).map_err(|_| "its worker stopped".to_string()),
            Link::Remote(r) => r.send(&cmd),
        }
    }
    pub(super) fn recv(&self) -> std::result::Result<Reply, String> {
        match self {
            Link::Local { rx, poll, .. } => {
                recv_polling(rx, *poll).map_err(|_| "its worker stopped".to_string())
            }
            Link::Remote(r) => r.recv(),
        }
    }
}

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
pub(super) enum Incoming {
    Cmd(Cmd),
    Shutdown,
    Abort(String),
}

pub(super) fn decode_cmd(body: &[u8]) -> Result<Incoming> {
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

pub(super) fn encode_reply(r: &Reply) -> Vec<u8> {
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

pub(super) fn io_text(e: &std::io::Error) -> String {
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
    /// Node 0's end of a rank reached over `control`, with its collective channel.
    pub(super) fn new(control: TcpStream, collective: TcpStream) -> RemoteRank {
        RemoteRank {
            control,
            collective,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A message that comes while polling, one that comes after the poll (asleep by then) and
    /// a sender that is gone.
    #[test]
    fn polling_receive_gets_early_and_late_messages_and_sees_a_closed_channel() {
        for (poll_ms, delay_ms) in [(200u64, 5u64), (1, 50), (0, 5)] {
            let (tx, rx) = std::sync::mpsc::channel::<u32>();
            let h = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(delay_ms));
                tx.send(7).unwrap();
            });
            assert_eq!(recv_polling(&rx, Duration::from_millis(poll_ms)), Ok(7));
            h.join().unwrap();
            assert_eq!(
                recv_polling(&rx, Duration::from_millis(poll_ms)),
                Err(RecvError)
            );
        }
    }

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
