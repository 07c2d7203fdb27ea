//! The rules every store decides a write by, as pure functions, so that the embedded store and
//! the store on etcd hold one copy of each: whether plan `g` may be applied at all
//! ([`check_generation`]), what plan `g` says of a write ([`plan_says`]), what the endpoint's
//! fence makes of it ([`fence_step`]), and whether a switch changes what is served
//! ([`content_changed`]). Each store reads what they need inside its own atomic step (sled's
//! writer lock, etcd's transaction with its compares) and applies the answer there.

use super::{ActiveState, ApplyOutcome, PlanSays, StoreError, StoreResult};
use crate::changes::PlanEntry;
use crate::generation::Generation;
use crate::names::EndpointName;

/// Plan `attempted` may be applied: it is published (at most `latest`, and not NONE) and still
/// stored (at least `horizon`, the oldest plan cleanup kept).
pub fn check_generation(attempted: Generation, latest: Generation, horizon: Generation) -> StoreResult<()> {
    if attempted.is_none() || attempted > latest {
        return Err(StoreError::Unpublished { attempted, latest });
    }
    if attempted < horizon {
        return Err(StoreError::Pruned { attempted, horizon });
    }
    Ok(())
}

/// What plan `g`'s `entry` for an endpoint says of writing `state` to it: `None` when the
/// write carries exactly what the plan holds, else what the plan says instead (the write is
/// refused as a content mismatch).
pub fn plan_says(entry: &PlanEntry, state: &ActiveState) -> Option<PlanSays> {
    match (entry, state) {
        (PlanEntry::Serve(planned), ActiveState::Serving(sent)) if planned == sent => None,
        (PlanEntry::Serve(_), ActiveState::Serving(_)) => Some(PlanSays::OtherRecords),
        (PlanEntry::Serve(_), ActiveState::Retired) => Some(PlanSays::Serves),
        (PlanEntry::Retire, ActiveState::Retired) => None,
        (PlanEntry::Retire, ActiveState::Serving(_)) => Some(PlanSays::Retires),
        (PlanEntry::Absent, _) => Some(PlanSays::NothingOf),
    }
}

/// The fence's decision on a write of plan `attempted` to `endpoint`, whose fence is `current`
/// (`None` for an endpoint never applied): refused as `Stale` under a newer fence, `Unchanged`
/// at the same one, else a switch from `current` (NONE for a new endpoint). The store must
/// decide this in the same atomic step that writes, never from an earlier read.
pub fn fence_step(endpoint: &EndpointName, current: Option<Generation>, attempted: Generation) -> StoreResult<ApplyOutcome> {
    match current {
        Some(active) if active > attempted => Err(StoreError::Stale { endpoint: endpoint.clone(), active, attempted }),
        Some(active) if active == attempted => Ok(ApplyOutcome::Unchanged),
        previous => Ok(ApplyOutcome::Switched { previous: previous.unwrap_or(Generation::NONE) }),
    }
}

/// Whether a switch from `before` (the endpoint's active state, `None` for a new one) to
/// `after` changes what is served: the addresses, weights or TTL of a serving endpoint, or
/// whether it serves at all. A switch that only moves the fence to a newer plan with the same
/// records does not, and must not move the SOA serial (secondaries would be notified of and
/// fetch an empty change).
pub fn content_changed(before: Option<&ActiveState>, after: &ActiveState) -> bool {
    fn served(state: Option<&ActiveState>) -> Option<&crate::plan::Endpoint> {
        match state {
            Some(ActiveState::Serving(records)) => Some(records),
            _ => None,
        }
    }
    served(before) != served(Some(after))
}

/// `text` is at most `max` bytes (`what` names it in the error).
pub fn check_len(what: &'static str, text: &str, max: usize) -> StoreResult<()> {
    if text.len() > max { Err(StoreError::TooLong { what: what.into(), len: text.len(), max }) } else { Ok(()) }
}

/// `Ok` when `keyring` is `None` or trusts `plan`: every store's check at publish, so a plan
/// no trusted author signed is never stored ([`StoreError::Untrusted`]).
pub fn check_trusted(keyring: Option<&crate::signing::Keyring>, plan: &crate::plan::ValidatedPlan) -> StoreResult<()> {
    match keyring {
        Some(keyring) => keyring.verify(plan).map(|_| ()).map_err(|e| StoreError::Untrusted(e.to_string())),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::ZoneId;
    use crate::plan::{Endpoint, Target};

    fn serving(ttl_secs: u32) -> ActiveState {
        let target = Target { address: "10.0.0.1".parse().expect("address"), zone: ZoneId::parse("a").expect("zone"), weight: 1 };
        ActiveState::Serving(Endpoint { ttl_secs, targets: vec![target] })
    }

    /// What is served changes with the records, the TTL alone, or serving at all; not with a
    /// retirement of what was not served.
    #[test]
    fn content_changes_with_what_is_served() {
        assert!(content_changed(None, &serving(30)));
        assert!(!content_changed(Some(&serving(30)), &serving(30)));
        assert!(content_changed(Some(&serving(30)), &serving(60)));
        assert!(content_changed(Some(&serving(30)), &ActiveState::Retired));
        assert!(!content_changed(Some(&ActiveState::Retired), &ActiveState::Retired));
        assert!(!content_changed(None, &ActiveState::Retired));
    }

    #[test]
    fn the_fence_refuses_older_keeps_equal_and_switches_newer() {
        let name = EndpointName::parse("api.example.test.").expect("name");
        assert!(matches!(fence_step(&name, Some(Generation(3)), Generation(2)), Err(StoreError::Stale { active: Generation(3), .. })));
        assert!(matches!(fence_step(&name, Some(Generation(3)), Generation(3)), Ok(ApplyOutcome::Unchanged)));
        assert!(matches!(fence_step(&name, Some(Generation(3)), Generation(4)), Ok(ApplyOutcome::Switched { previous: Generation(3) })));
        assert!(matches!(fence_step(&name, None, Generation(1)), Ok(ApplyOutcome::Switched { previous: Generation::NONE })));
    }

    #[test]
    fn only_a_stored_published_plan_is_applied() {
        assert!(matches!(check_generation(Generation::NONE, Generation(5), Generation(1)), Err(StoreError::Unpublished { .. })));
        assert!(matches!(check_generation(Generation(6), Generation(5), Generation(1)), Err(StoreError::Unpublished { .. })));
        assert!(matches!(check_generation(Generation(2), Generation(5), Generation(3)), Err(StoreError::Pruned { .. })));
        assert!(check_generation(Generation(3), Generation(5), Generation(3)).is_ok());
    }

    #[test]
    fn a_write_carries_what_its_plan_says() {
        let records = match serving(30) {
            ActiveState::Serving(e) => e,
            ActiveState::Retired => unreachable!("serving"),
        };
        assert_eq!(plan_says(&PlanEntry::Serve(records.clone()), &serving(30)), None);
        assert_eq!(plan_says(&PlanEntry::Serve(records.clone()), &serving(60)), Some(PlanSays::OtherRecords));
        assert_eq!(plan_says(&PlanEntry::Serve(records), &ActiveState::Retired), Some(PlanSays::Serves));
        assert_eq!(plan_says(&PlanEntry::Retire, &ActiveState::Retired), None);
        assert_eq!(plan_says(&PlanEntry::Retire, &serving(30)), Some(PlanSays::Retires));
        assert_eq!(plan_says(&PlanEntry::Absent, &ActiveState::Retired), Some(PlanSays::NothingOf));
    }
}
