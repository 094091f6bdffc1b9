//! What the recorded decode steps share (one sequence's in `transformer`, the padded paged
//! buckets' in `paged_graph`): the tensors a recording reads and writes at fixed addresses
//! ([`StepBufs`]) and the stage that replays a step's recording or records it
//! ([`replay_or_record`]).

use crate::data::{Data, DataType};
use crate::device::BaseDevice;
use crate::error::Result;
use std::any::Any;

/// Recorded work of a device ([`BaseDevice::end_recording`]).
pub(super) type Recording = Box<dyn Any + Send + Sync>;

/// Failed recordings after which a cache or a pool stops trying to record its decode steps.
pub(super) const MAX_FAILURES: usize = 3;

/// The tensors of a recorded step besides the weights and the KV cache: the per-step values
/// written before each replay (token ids and positions, one per row) and the step's working
/// tensors, workspace and logits, each kept at a fixed address from one step to the next.
pub(super) struct StepBufs {
    pub(super) ids: Data,
    pub(super) pos: Data,
    pub(super) bufs: Vec<Data>,
    pub(super) workspace: Data,
    pub(super) logits: Data,
}

impl StepBufs {
    /// The tensors of a step of `rows` rows through `scratch` working tensors, the ids and
    /// positions zeroed on `dev`.
    pub(super) fn new(dev: &dyn BaseDevice, rows: usize, scratch: usize) -> Result<StepBufs> {
        let zeros = || dev.upload(&Data::zeros(DataType::I32, &[rows])?);
        Ok(StepBufs {
            ids: zeros()?,
            pos: zeros()?,
            bufs: (0..scratch).map(|_| Data::empty(DataType::F32)).collect(),
            workspace: Data::empty(DataType::F32),
            logits: Data::empty(DataType::F32),
        })
    }
}

/// What [`replay_or_record`] did.
pub(super) enum Recorded {
    /// The step ran: its recording was replayed (or just recorded and replayed).
    Replayed,
    /// Nothing ran and nothing was recorded: the step has not run op by op once yet (that
    /// run sizes every buffer).
    NotTried,
    /// Recorded, but the device would not replay the new recording; nothing ran.
    NotReplayed,
    /// Recording failed (an op that allocates, copies to the host or falls back to the CPU):
    /// why. Nothing ran.
    Failed(String),
}

/// Replays `rec` on `dev`, forgetting it when stale; else, once the step has run op by op
/// (`sized`), records `ops`, replays the recording and keeps it in `rec`. Unless it returns
/// [`Recorded::Replayed`], the caller runs the step op by op.
pub(super) fn replay_or_record(
    dev: &dyn BaseDevice,
    rec: &mut Option<Recording>,
    sized: bool,
    ops: impl FnOnce() -> Result<()>,
) -> Result<Recorded> {
    if let Some(r) = rec.as_ref() {
        if dev.replay(r.as_ref())? {
            return Ok(Recorded::Replayed);
        }
        *rec = None; // stale: record again
    }
    if !sized {
        return Ok(Recorded::NotTried);
    }
    dev.begin_recording()?;
    let run = ops();
    let made = dev.end_recording();
    match (run, made) {
        (Ok(()), Ok(made)) => {
            if dev.replay(made.as_ref())? {
                *rec = Some(made);
                return Ok(Recorded::Replayed);
            }
            Ok(Recorded::NotReplayed)
        }
        (run, made) => {
            let why = run.err().or(made.err()).map(|e| e.to_string());
            Ok(Recorded::Failed(why.unwrap_or_default()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DeviceKind;
    use crate::device::OpRegistry;
    use crate::error::Error;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A device whose recordings are numbered; it replays them unless `stale` is set.
    #[derive(Default)]
    struct Recorder {
        ops: OpRegistry,
        made: AtomicUsize,
        replays: AtomicUsize,
        stale: AtomicBool,
    }

    impl BaseDevice for Recorder {
        fn name(&self) -> &str {
            "recorder"
        }
        fn kind(&self) -> DeviceKind {
            DeviceKind::Cpu
        }
        fn ops(&self) -> &OpRegistry {
            &self.ops
        }
        fn upload(&self, data: &Data) -> Result<Data> {
            data.to_owned_host()
        }
        fn download(&self, _data: &mut Data) -> Result<()> {
            Ok(())
        }
        fn begin_recording(&self) -> Result<()> {
            Ok(())
        }
        fn end_recording(&self) -> Result<Recording> {
            Ok(Box::new(self.made.fetch_add(1, Ordering::Relaxed)))
        }
        fn replay(&self, _recording: &(dyn Any + Send + Sync)) -> Result<bool> {
            if self.stale.load(Ordering::Relaxed) {
                return Ok(false);
            }
            self.replays.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        }
    }

    fn number(rec: &Option<Recording>) -> Option<usize> {
        rec.as_ref()
            .and_then(|r| r.downcast_ref::<usize>())
            .copied()
    }

    #[test]
    fn records_once_sized_then_replays_and_records_a_stale_one_again() {
        let dev = Recorder::default();
        let mut rec = None;
        let ran = AtomicUsize::new(0);
        let ops = || {
            ran.fetch_add(1, Ordering::Relaxed);
            Ok(())
        };
        // not sized yet: nothing runs, nothing is recorded
        let r = replay_or_record(&dev, &mut rec, false, ops).unwrap();
        assert!(matches!(r, Recorded::NotTried));
        assert!(rec.is_none() && ran.load(Ordering::Relaxed) == 0);
        // sized: recorded (the ops run inside the recording) and replayed
        let r = replay_or_record(&dev, &mut rec, true, ops).unwrap();
        assert!(matches!(r, Recorded::Replayed));
        assert_eq!((number(&rec), ran.load(Ordering::Relaxed)), (Some(0), 1));
        // kept: replayed without recording again
        let r = replay_or_record(&dev, &mut rec, true, ops).unwrap();
        assert!(matches!(r, Recorded::Replayed));
        assert_eq!((number(&rec), ran.load(Ordering::Relaxed)), (Some(0), 1));
        assert_eq!(dev.replays.load(Ordering::Relaxed), 2);
        // stale and the new recording not replayed either: dropped, nothing ran
        dev.stale.store(true, Ordering::Relaxed);
        let r = replay_or_record(&dev, &mut rec, true, ops).unwrap();
        assert!(matches!(r, Recorded::NotReplayed));
        assert!(rec.is_none());
        // stale: recorded again
        dev.stale.store(false, Ordering::Relaxed);
        let r = replay_or_record(&dev, &mut rec, true, ops).unwrap();
        assert!(matches!(r, Recorded::Replayed));
        assert_eq!(number(&rec), Some(2));
    }

    #[test]
    fn a_step_that_fails_while_recording_says_why_and_keeps_nothing() {
        let dev = Recorder::default();
        let mut rec = None;
        let r = replay_or_record(&dev, &mut rec, true, || {
            Err(Error::Unsupported("copies to the host".into()))
        })
        .unwrap();
        match r {
            Recorded::Failed(why) => assert!(why.contains("copies to the host"), "{why}"),
            _ => panic!("expected a failed recording"),
        }
        assert!(rec.is_none());
    }
}
