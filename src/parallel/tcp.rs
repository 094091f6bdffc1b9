//! [`TcpCollective`]: the sum all-reduce of a CPU group whose ranks are processes, over the
//! collective channels the rendezvous opened. Rank 0 is the hub: it receives every other rank's
//! tensor, sums them in rank order (the same order, hence the same bits, as
//! [`super::HostCollective`]) and sends the sum back. A rank that disconnects or stays silent
//! longer than the timeout fails the all-reduce with an error naming it.

use super::wire::{read_frame, write_frame, Decoder, Encoder};
use super::Collective;
use crate::data::{Data, DataType, DeviceKind};
use crate::error::{Error, Result};
use std::io::ErrorKind;
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Duration;

/// One rank's end of a host all-reduce between processes.
pub struct TcpCollective {
    rank: usize,
    world: usize,
    /// Rank 0: the streams of ranks `1..world`, in order. Other ranks: the stream to rank 0.
    peers: Mutex<Vec<TcpStream>>,
    timeout: Duration,
}

impl TcpCollective {
    /// Rank 0's end: `peers[i]` is rank `i + 1`'s collective channel.
    pub fn hub(peers: Vec<TcpStream>, timeout: Duration) -> Result<TcpCollective> {
        Self::make(0, peers.len() + 1, peers, timeout)
    }

    /// Rank `rank`'s end (`rank > 0`) of a `world`-rank group, `to_hub` its channel to rank 0.
    pub fn member(
        rank: usize,
        world: usize,
        to_hub: TcpStream,
        timeout: Duration,
    ) -> Result<TcpCollective> {
        if rank == 0 || rank >= world {
            return Err(Error::invalid(format!(
                "all-reduce member rank {rank} of a {world}-rank group"
            )));
        }
        Self::make(rank, world, vec![to_hub], timeout)
    }

    fn make(
        rank: usize,
        world: usize,
        peers: Vec<TcpStream>,
        timeout: Duration,
    ) -> Result<TcpCollective> {
        for p in &peers {
            p.set_read_timeout(Some(timeout))
                .map_err(|e| Error::Device(format!("all-reduce socket: {e}")))?;
        }
        Ok(TcpCollective {
            rank,
            world,
            peers: Mutex::new(peers),
            timeout,
        })
    }

    fn failed(&self, peer: usize, e: std::io::Error) -> Error {
        Error::Device(match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => format!(
                "all-reduce: rank {} waited {:?} for rank {peer}",
                self.rank, self.timeout
            ),
            ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
                format!("all-reduce: rank {peer} disconnected (its process ended?)")
            }
            _ => format!("all-reduce with rank {peer}: {e}"),
        })
    }

    fn recv(&self, s: &mut TcpStream, peer: usize, n: usize) -> Result<Vec<f32>> {
        let body = read_frame(s).map_err(|e| self.failed(peer, e))?;
        let v = Decoder::new(&body).f32s()?;
        if v.len() != n {
            return Err(Error::invalid(format!(
                "all-reduce: rank {peer} sent {} elements, rank {} has {n}",
                v.len(),
                self.rank
            )));
        }
        Ok(v)
    }

    fn send(&self, s: &mut TcpStream, peer: usize, v: &[f32]) -> Result<()> {
        let mut e = Encoder::new();
        e.f32s(v);
        write_frame(s, &e.finish()).map_err(|e| self.failed(peer, e))
    }
}

impl Collective for TcpCollective {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn all_reduce_sum(&self, x: &mut Data) -> Result<()> {
        if x.dtype() != DataType::F32 || x.device() != DeviceKind::Cpu || !x.is_contiguous() {
            return Err(Error::invalid(format!(
                "host all-reduce needs a contiguous F32 host tensor, got {x:?}"
            )));
        }
        let mut peers = self
            .peers
            .lock()
            .map_err(|_| Error::Device("all-reduce: poisoned".into()))?;
        let n = x.count();
        if self.rank == 0 {
            let mut sum = x.as_f32()?.to_vec();
            for (i, s) in peers.iter_mut().enumerate() {
                let part = self.recv(s, i + 1, n)?;
                sum.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
            }
            for (i, s) in peers.iter_mut().enumerate() {
                self.send(s, i + 1, &sum)?;
            }
            x.as_f32_mut()?.copy_from_slice(&sum);
        } else {
            let s = peers
                .first_mut()
                .ok_or_else(|| Error::Device("all-reduce: no channel to rank 0".into()))?;
            self.send(s, 0, x.as_f32()?)?;
            let sum = self.recv(s, 0, n)?;
            x.as_f32_mut()?.copy_from_slice(&sum);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::HostCollective;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn sums_like_the_host_collective() {
        let t = Duration::from_secs(10);
        let (h1, m1) = pair();
        let (h2, m2) = pair();
        let hub = TcpCollective::hub(vec![h1, h2], t).unwrap();
        let members = [
            TcpCollective::member(1, 3, m1, t).unwrap(),
            TcpCollective::member(2, 3, m2, t).unwrap(),
        ];
        let host = HostCollective::group(3, t).unwrap();
        let input = |r: usize, i: usize| (r as f32 + 0.1) * (i as f32 * 0.37).sin() * 1e3;
        let n = 1000;
        let run = |c: &dyn Collective| {
            let v: Vec<f32> = (0..n).map(|i| input(c.rank(), i)).collect();
            let mut x = Data::from_f32(&[n], &v).unwrap();
            c.all_reduce_sum(&mut x).unwrap();
            x.to_f32_vec().unwrap()
        };
        let got = std::thread::scope(|s| {
            let hs: Vec<_> = members.iter().map(|m| s.spawn(|| run(m))).collect();
            let hostr: Vec<_> = host.iter().map(|h| s.spawn(|| run(h))).collect();
            let mine = run(&hub);
            let others: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            let reference: Vec<_> = hostr.into_iter().map(|h| h.join().unwrap()).collect();
            (mine, others, reference)
        });
        for o in &got.1 {
            assert_eq!(o, &got.0);
        }
        for r in &got.2 {
            assert_eq!(r, &got.0, "the same bits as the in-process sum");
        }
    }

    #[test]
    fn a_silent_or_gone_rank_is_named() {
        let (h1, m1) = pair();
        let hub = TcpCollective::hub(vec![h1], Duration::from_millis(100)).unwrap();
        let mut x = Data::from_f32(&[2], &[1.0, 2.0]).unwrap();
        let e = hub.all_reduce_sum(&mut x).err().unwrap().to_string();
        assert!(e.contains("waited") && e.contains("rank 1"), "{e}");
        drop(m1);
        let e = hub.all_reduce_sum(&mut x).err().unwrap().to_string();
        assert!(e.contains("rank 1 disconnected"), "{e}");
    }
}
