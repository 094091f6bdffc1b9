//! Fresh random seeds for requests that give none, so that sampling ("regenerate") differs from
//! one request to the next; the seed used is reported back so that a run can be repeated.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// A new random seed: the process's random hash keys (fresh per call) mixed with the clock and
/// a counter.
pub fn fresh_seed() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(nanos);
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// The seed a request runs with: its own, or a fresh one.
pub fn seed_or_fresh(given: Option<u64>) -> u64 {
    given.unwrap_or_else(fresh_seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_seeds_differ_and_given_ones_are_kept() {
        let seeds: std::collections::HashSet<u64> = (0..1000).map(|_| fresh_seed()).collect();
        assert_eq!(seeds.len(), 1000);
        assert_eq!(seed_or_fresh(Some(42)), 42);
        assert_ne!(seed_or_fresh(None), seed_or_fresh(None));
    }
}
