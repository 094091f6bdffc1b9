//! Long prompts in steps of a bounded number of rows (micro-batches). A step's working tensors
//! (activations, projections, the MLP's intermediate rows) grow with its row count, so a prompt
//! of any length run in steps of at most `chunk` rows needs them for `chunk` rows only, while the
//! KV cache alone grows with the prompt. The results are those of one step over the whole prompt
//! up to float rounding (attention of each row still sees every earlier row through the cache).

use super::transformer::{KvCache, Model};
use crate::data::{Data, DeviceKind};
use crate::error::{Error, Result};

impl Model {
    /// [`Model::forward`]'s tokens in steps of at most `chunk` rows (`tokens.len() > chunk`,
    /// checked to fit by the caller). Returns the logits of every row when `all_logits` (on the
    /// host), else the last row's. On error the cache is as before.
    pub(super) fn forward_chunks(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        all_logits: bool,
        chunk: usize,
    ) -> Result<Data> {
        let before = cache.len();
        let r = self.chunk_steps(cache, tokens, all_logits, chunk);
        if r.is_err() {
            cache.truncate(before)?;
        }
        r
    }

    fn chunk_steps(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        all_logits: bool,
        chunk: usize,
    ) -> Result<Data> {
        let vocab = self.config.vocab_size;
        let mut all = match all_logits {
            true => Some(Data::zeros(
                crate::data::DataType::F32,
                &[tokens.len(), vocab],
            )?),
            false => None,
        };
        let mut last = None;
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let l = self.forward_step(cache, part, all_logits)?;
            match &mut all {
                Some(out) => {
                    let l = match l.device() {
                        DeviceKind::Cpu => l,
                        _ => l.to_owned_host()?,
                    };
                    let rows = l.as_f32()?;
                    let at = i * chunk * vocab;
                    out.as_f32_mut()?
                        .get_mut(at..at + rows.len())
                        .ok_or_else(|| Error::invalid("prefill step returned too many logits"))?
                        .copy_from_slice(rows);
                }
                None => last = Some(l),
            }
        }
        match (all, last) {
            (Some(out), _) => Ok(out),
            (None, Some(l)) => Ok(l),
            (None, None) => Err(Error::invalid("forward: no tokens")),
        }
    }
}
