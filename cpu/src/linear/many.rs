//! Several independent `Linear` calls run as one job on the thread pool ([`linear_many`]): the
//! routed experts of a mixture-of-experts step are a handful of small products each, and one
//! pass over the pool for all of them (instead of one per product) keeps every thread on a
//! long stream of weights. Each call's kernel is the one [`super::linear`] picks for it, so its
//! results are those of the call run alone.

use super::act_quant::Q8Rows;
use super::gemm::{self, Part};
use super::{plan, LinearArgs};
use crate::threads::Threads;
use std::cell::RefCell;

thread_local! {
    static SCRATCH: RefCell<Vec<Q8Rows>> = const { RefCell::new(Vec::new()) };
}

/// One call of [`linear_many`]: its arguments and its output (`args.rows * args.n` values).
pub struct LinearCall<'a> {
    /// The call's arguments.
    pub args: LinearArgs<'a>,
    /// Its output, row-major [rows, n].
    pub out: &'a mut [f32],
}

/// Runs every call of `calls` (each validated as [`super::linear`] does) as one job on
/// `threads`, the columns of all calls handed out together; `threads = None` runs the scalar
/// references one after the other (as [`super::linear_ref`]).
pub fn linear_many(threads: Option<&Threads>, calls: &mut [LinearCall]) -> Result<(), String> {
    let mut rbs = Vec::with_capacity(calls.len());
    for (i, c) in calls.iter().enumerate() {
        rbs.push(
            c.args
                .validate(c.out)
                .map_err(|e| format!("call {i}: {e}"))?,
        );
    }
    SCRATCH.with(|s| {
        let mut qs = s
            .try_borrow_mut()
            .map_err(|_| "activation scratch busy (re-entrant call)".to_string())?;
        if qs.len() < calls.len() {
            qs.resize_with(calls.len(), Q8Rows::default);
        }
        let mut parts = Vec::with_capacity(calls.len());
        for ((c, q), rb) in calls.iter_mut().zip(qs.iter_mut()).zip(rbs) {
            parts.push(Part {
                a: c.args,
                rb,
                kern: plan(threads.is_some(), &c.args, q)?,
                out: &mut *c.out,
            });
        }
        gemm::run_many(threads, &mut parts);
        Ok(())
    })
}
