//! Cleanup's pure core: which plans may be deleted, decided from numbers alone.
//!
//! Stored plans always form one contiguous range `horizon..=latest` (publish appends
//! `latest + 1`, cleanup removes a prefix), so a decision is a new horizon. The store applies
//! it in one atomic step; this module only chooses.

use crate::generation::Generation;
use crate::names::EndpointName;
use serde::{Deserialize, Serialize};

/// What cleanup would delete and what it keeps for which reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CleanupDecision {
    /// Oldest stored plan before cleanup.
    pub horizon_before: Generation,
    /// Oldest stored plan after cleanup: everything below it goes.
    pub horizon_after: Generation,
    /// Plans kept only because the last `retain` are kept for rollback: `(first, last)`.
    pub kept_for_rollback: Option<(Generation, Generation)>,
    /// The oldest generation still active anywhere, and one endpoint that holds it.
    pub oldest_active: Option<(Generation, EndpointName)>,
    /// How many old-enough plans were refused because they are active or newer than the
    /// oldest active plan.
    pub refused_active_or_newer: u64,
}

impl CleanupDecision {
    pub fn deleted_count(&self) -> u64 {
        self.horizon_after.0 - self.horizon_before.0
    }

    /// The deleted range `(first, last)`, if any.
    pub fn deleted(&self) -> Option<(Generation, Generation)> {
        (self.deleted_count() > 0).then(|| (self.horizon_before, Generation(self.horizon_after.0 - 1)))
    }
}

/// What a cleanup did.
pub type CleanupReport = CleanupDecision;

/// Chooses the new horizon: delete generation `g` only if `g < oldest_active` and
/// `g <= latest - retain` (the last `retain` plans stay for rollback).
///
/// `horizon` is the oldest stored plan (`Generation::NONE` when none is stored).
pub fn decide_cleanup(
    horizon: Generation,
    latest: Generation,
    oldest_active: Option<(Generation, EndpointName)>,
    retain: u64,
) -> CleanupDecision {
    // The latest plan is always kept, whatever `retain` says.
    let keep_from_retain = Generation(latest.0.saturating_sub(retain.max(1)) + 1).max(Generation::FIRST);
    let keep_from_active = oldest_active.as_ref().map_or(keep_from_retain, |(g, _)| *g);
    let horizon_before = horizon.max(Generation::FIRST).min(Generation(latest.0 + 1));
    let horizon_after = keep_from_retain.min(keep_from_active).max(horizon_before);
    let refused = keep_from_retain.0.saturating_sub(horizon_after.0);
    let kept_for_rollback = (keep_from_retain <= latest && !latest.is_none()).then_some((keep_from_retain.max(horizon_after), latest));
    // Invariant: nothing at or above the oldest active generation is ever chosen.
    if let Some((g, _)) = &oldest_active {
        assert!(horizon_after <= *g || horizon_after == horizon_before, "cleanup chose to delete an active plan");
    }
    // Invariant: the last `retain` plans survive.
    assert!(horizon_after <= keep_from_retain || horizon_after == horizon_before, "cleanup chose a plan kept for rollback");
    CleanupDecision { horizon_before, horizon_after, kept_for_rollback, oldest_active, refused_active_or_newer: refused }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> EndpointName {
        EndpointName::parse("x.example.test").unwrap()
    }

    /// (horizon, latest, oldest active, retain) -> (horizon after, refused)
    #[test]
    fn table() {
        let cases = [
            // Nothing stored.
            (0, 0, None, 5, 1, 0),
            // Retain dominates: 30 plans, keep the last 5, nothing active.
            (1, 30, None, 5, 26, 0),
            // An endpoint still at plan 10 holds back everything from 10 on.
            (1, 30, Some(10), 5, 10, 16),
            // The 2025 sequence: everything active at 11, keep 3: delete 1..=8.
            (1, 11, Some(11), 3, 9, 0),
            // Already cleaned further than this decision would go: never move backwards.
            (20, 30, Some(12), 5, 20, 6),
            // retain 0 still keeps the latest plan.
            (1, 30, Some(30), 0, 30, 0),
        ];
        for (horizon, latest, active, retain, want_after, want_refused) in cases {
            let d = decide_cleanup(Generation(horizon), Generation(latest), active.map(|g| (Generation(g), name())), retain);
            assert_eq!(
                (d.horizon_after.0, d.refused_active_or_newer),
                (want_after, want_refused),
                "case {horizon} {latest} {active:?} {retain}"
            );
            assert!(d.horizon_after <= Generation(latest).max(Generation::FIRST));
        }
    }
}
