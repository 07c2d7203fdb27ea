//! Plan changes: what one plan changes against an earlier one, so that a follower that has
//! applied the earlier plan reads and writes only what changed, not the whole plan.
//!
//! A store records, at publish, each plan's [`PlanChanges`] against its parent: every endpoint
//! whose [`PlanEntry`] (served with some records, retired, or absent) differs between the two.
//! The changes from plan `f` to plan `t` are the [`PlanChanges::then`] fold of the records of
//! plans `f + 1 ..= t`: an endpoint is in it when *any* plan in between changed it, with its
//! entry in `t`. Comparing `f` and `t` alone would be wrong: an endpoint that goes A → B → A
//! is the same in `f` and `t`, but another enactor may have written B in between, so it must
//! be written again.

use crate::codec::{self, Record};
use crate::generation::Generation;
use crate::names::{DnsName, EndpointName};
use crate::plan::{ENDPOINTS_PER_PLAN_MAX, Endpoint, Plan, ValidationError, validate_endpoint};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// Most plans one `plan_changes` answer folds. A follower further behind reads the plan whole.
pub const PLAN_CHANGES_GAP_MAX: u64 = 64;
/// Most endpoints one [`PlanChanges`] names. A change larger than this is no cheaper than the
/// plan: stores do not record it, and a follower reads the plan whole.
pub const PLAN_CHANGES_ENDPOINTS_MAX: usize = 65_536;

/// What a plan says of one endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlanEntry {
    /// Served with these records.
    Serve(Endpoint),
    /// Retired by this (operator) plan.
    Retire,
    /// Not named: enactors leave it as it is.
    Absent,
}

impl Record for PlanEntry {
    const KIND: u8 = 8;
    const KIND_NAME: &'static str = "plan entry";
    const BODY_BYTES_MAX: usize = codec::SMALL_BODY_BYTES_MAX;
}

impl PlanEntry {
    /// What `plan` says of `name`.
    pub fn of(plan: &Plan, name: &EndpointName) -> PlanEntry {
        match plan.endpoints.get(name) {
            Some(records) => PlanEntry::Serve(records.clone()),
            None if plan.retired.contains(name) => PlanEntry::Retire,
            None => PlanEntry::Absent,
        }
    }
}

/// The endpoints whose entry differs between plan `from` and plan `to`, or in any plan in
/// between, with their entries in `to`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanChanges {
    pub from: Generation,
    pub to: Generation,
    /// The DNS zone of `to`; every named endpoint lies inside it.
    pub dns_zone: DnsName,
    /// `to`'s `rollback_of`: a rollback skips the enactor's removal guard.
    pub rollback_of: Option<Generation>,
    /// How many endpoints `to` serves, changed or not.
    pub endpoint_count: u64,
    pub changes: BTreeMap<EndpointName, PlanEntry>,
}

impl Record for PlanChanges {
    const KIND: u8 = 7;
    const KIND_NAME: &'static str = "plan changes";
    // At most `PLAN_CHANGES_ENDPOINTS_MAX` endpoints with the most targets each: about 130 MB.
    const BODY_BYTES_MAX: usize = codec::BODY_BYTES_MAX;
}

impl PlanChanges {
    /// What `plan` changes against its parent `parent`; `None` when that is more than
    /// [`PLAN_CHANGES_ENDPOINTS_MAX`] endpoints.
    pub fn between(parent: &Plan, plan: &Plan) -> Option<PlanChanges> {
        // Borrowed comparisons and one clone per change: plans are large and changes few.
        let mut changes = BTreeMap::new();
        let mut note = |name: &EndpointName, entry: PlanEntry| {
            changes.insert(name.clone(), entry);
            changes.len() <= PLAN_CHANGES_ENDPOINTS_MAX
        };
        // Both maps are in name order: one merge pass, no lookups.
        let (mut before, mut now) = (parent.endpoints.iter().peekable(), plan.endpoints.iter().peekable());
        loop {
            let order = match (before.peek(), now.peek()) {
                (None, None) => break,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some((old, _)), Some((new, _))) => old.cmp(new),
            };
            let noted = match order {
                // Served before and not now: retired or left out now.
                Ordering::Less => before
                    .next()
                    .is_none_or(|(name, _)| note(name, if plan.retired.contains(name) { PlanEntry::Retire } else { PlanEntry::Absent })),
                Ordering::Greater => now.next().is_none_or(|(name, records)| note(name, PlanEntry::Serve(records.clone()))),
                Ordering::Equal => match (before.next(), now.next()) {
                    (Some((_, old)), Some((name, records))) if old != records => note(name, PlanEntry::Serve(records.clone())),
                    _ => true,
                },
            };
            if !noted {
                return None;
            }
        }
        // Retired now and neither served nor retired before.
        for name in plan.retired.iter().filter(|n| !parent.endpoints.contains_key(*n) && !parent.retired.contains(*n)) {
            if !note(name, PlanEntry::Retire) {
                return None;
            }
        }
        // Retired before and left out now (one this plan serves is noted above).
        for name in parent.retired.iter().filter(|n| !plan.retired.contains(*n) && !plan.endpoints.contains_key(*n)) {
            if !note(name, PlanEntry::Absent) {
                return None;
            }
        }
        Some(PlanChanges {
            from: parent.generation,
            to: plan.generation,
            dns_zone: plan.dns_zone.clone(),
            rollback_of: plan.rollback_of,
            endpoint_count: plan.endpoints.len() as u64,
            changes,
        })
    }

    /// These changes followed by `next` (which must start where these end): the changes from
    /// `self.from` to `next.to`. `None` when they do not join or when the result is larger
    /// than [`PLAN_CHANGES_ENDPOINTS_MAX`].
    pub fn then(mut self, next: PlanChanges) -> Option<PlanChanges> {
        if next.from != self.to {
            return None;
        }
        self.changes.extend(next.changes);
        if self.changes.len() > PLAN_CHANGES_ENDPOINTS_MAX {
            return None;
        }
        Some(PlanChanges {
            from: self.from,
            to: next.to,
            dns_zone: next.dns_zone,
            rollback_of: next.rollback_of,
            endpoint_count: next.endpoint_count,
            changes: self.changes,
        })
    }

    /// The same rules as plan validation, for the parts a change carries: generations in
    /// order, bounded size, every name inside the DNS zone, every served endpoint valid.
    pub fn check(&self) -> Result<(), ValidationError> {
        if self.from >= self.to {
            return Err(ValidationError::BadGeneration { generation: self.to, parent: self.from });
        }
        if self.changes.len() > PLAN_CHANGES_ENDPOINTS_MAX || self.endpoint_count > ENDPOINTS_PER_PLAN_MAX as u64 {
            return Err(ValidationError::TooManyEndpoints { count: self.changes.len().max(self.endpoint_count as usize) });
        }
        for (name, entry) in &self.changes {
            if !name.is_in(&self.dns_zone) {
                return Err(ValidationError::OutsideDnsZone { endpoint: name.clone(), dns_zone: self.dns_zone.clone() });
            }
            if let PlanEntry::Serve(records) = entry {
                validate_endpoint(name, records)?;
            }
        }
        Ok(())
    }
}

/// Decodes plan changes from an envelope and checks them (see [`PlanChanges::check`]).
pub fn decode_changes(bytes: &[u8]) -> Result<PlanChanges, codec::CodecError> {
    let changes = codec::decode::<PlanChanges>(bytes)?;
    changes.check()?;
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Author, Target};
    use crate::{Generation, ZoneId};

    fn name(label: &str) -> EndpointName {
        DnsName::parse(&format!("{label}.example.test.")).unwrap()
    }

    fn records(last: u8) -> Endpoint {
        Endpoint { ttl_secs: 30, targets: vec![Target { address: [192, 0, 2, last].into(), zone: ZoneId::parse("a").unwrap(), weight: 1 }] }
    }

    fn plan(g: u64, served: &[(&str, u8)], retired: &[&str]) -> Plan {
        Plan {
            generation: Generation(g),
            parent_generation: Generation(g - 1),
            created_at_unix_ms: 0,
            author: Author::Operator { name: "test".into() },
            reason: String::new(),
            dns_zone: DnsName::parse("example.test.").unwrap(),
            endpoints: served.iter().map(|(n, a)| (name(n), records(*a))).collect(),
            retired: retired.iter().map(|n| name(n)).collect(),
            rollback_of: None,
            provenance: Vec::new(),
        }
    }

    fn fold(plans: &[Plan]) -> PlanChanges {
        let mut steps = plans.windows(2).map(|w| PlanChanges::between(&w[0], &w[1]).unwrap());
        let first = steps.next().unwrap();
        steps.fold(first, |acc, next| acc.then(next).unwrap())
    }

    fn changed(changes: &PlanChanges) -> Vec<(String, PlanEntry)> {
        changes.changes.iter().map(|(n, e)| (n.as_str().trim_end_matches(".example.test.").to_owned(), e.clone())).collect()
    }

    proptest::proptest! {
        /// `between` is the definition: every name either plan mentions, whose entry differs.
        #[test]
        fn between_names_exactly_the_entries_that_differ(
            before in proptest::collection::vec(0u8..4, 12),
            after in proptest::collection::vec(0u8..4, 12),
        ) {
            // Per name: 0 absent, 1 retired, 2 and 3 served with two different records.
            let make = |g: u64, states: &[u8]| {
                let labels: Vec<String> = (0..states.len()).map(|i| format!("n{i}")).collect();
                let served: Vec<(&str, u8)> =
                    states.iter().zip(&labels).filter(|(s, _)| **s >= 2).map(|(s, l)| (l.as_str(), *s)).collect();
                let retired: Vec<&str> = states.iter().zip(&labels).filter(|(s, _)| **s == 1).map(|(_, l)| l.as_str()).collect();
                plan(g, &served, &retired)
            };
            let (a, b) = (make(1, &before), make(2, &after));
            let changes = PlanChanges::between(&a, &b).unwrap();
            let want: BTreeMap<EndpointName, PlanEntry> = (0..before.len())
                .map(|i| name(&format!("n{i}")))
                .filter(|n| PlanEntry::of(&a, n) != PlanEntry::of(&b, n))
                .map(|n| { let e = PlanEntry::of(&b, &n); (n, e) })
                .collect();
            proptest::prop_assert_eq!(changes.changes, want);
        }
    }

    #[test]
    fn one_step_names_only_what_differs() {
        let base = plan(1, &[("a", 1), ("b", 1), ("c", 1), ("d", 1)], &[]);
        let next = plan(2, &[("a", 2), ("b", 1), ("c", 1), ("e", 1)], &[]);
        let c = PlanChanges::between(&base, &next).unwrap();
        assert_eq!(
            changed(&c),
            [("a".into(), PlanEntry::Serve(records(2))), ("d".into(), PlanEntry::Absent), ("e".into(), PlanEntry::Serve(records(1)))]
        );
        assert_eq!((c.from, c.to, c.endpoint_count), (Generation(1), Generation(2), 4));
        assert!(c.check().is_ok());
    }

    #[test]
    fn a_flap_in_between_is_a_change() {
        // b goes 1 -> 2 -> 1: another enactor may have written plan 2's b, so the changes from
        // plan 1 to plan 3 must name b although plans 1 and 3 agree on it.
        let plans = [plan(1, &[("a", 1), ("b", 1)], &[]), plan(2, &[("a", 1), ("b", 2)], &[]), plan(3, &[("a", 1), ("b", 1)], &[])];
        assert_eq!(changed(&fold(&plans)), [("b".into(), PlanEntry::Serve(records(1)))]);
    }

    #[test]
    fn retirements_and_returns_are_changes() {
        let plans = [
            plan(1, &[("a", 1), ("b", 1), ("c", 1)], &[]),
            plan(2, &[("a", 1), ("c", 1)], &["b"]),
            plan(3, &[("a", 1), ("b", 1)], &["c"]),
            plan(4, &[("a", 1), ("b", 1)], &[]),
        ];
        // b was retired and serves again; c was retired, then left out.
        assert_eq!(changed(&fold(&plans)), [("b".into(), PlanEntry::Serve(records(1))), ("c".into(), PlanEntry::Absent)]);
        assert_eq!(changed(&fold(&plans[..3])), [("b".into(), PlanEntry::Serve(records(1))), ("c".into(), PlanEntry::Retire)]);
    }

    #[test]
    fn changes_that_do_not_join_or_break_the_rules_are_refused() {
        let (p1, p2, p3) = (plan(1, &[("a", 1)], &[]), plan(2, &[("a", 2)], &[]), plan(3, &[("a", 3)], &[]));
        let one = PlanChanges::between(&p1, &p2).unwrap();
        let gap = PlanChanges::between(&p2, &p3).unwrap();
        assert!(one.clone().then(one.clone()).is_none(), "2..2 does not follow 1..2");
        assert!(one.clone().then(gap).is_some());
        let mut backwards = one.clone();
        backwards.from = Generation(5);
        assert!(matches!(backwards.check(), Err(ValidationError::BadGeneration { .. })));
        let mut outside = one.clone();
        outside.changes.insert(DnsName::parse("x.other.test.").unwrap(), PlanEntry::Retire);
        assert!(matches!(outside.check(), Err(ValidationError::OutsideDnsZone { .. })));
        let mut empty = one;
        empty.changes.insert(name("z"), PlanEntry::Serve(Endpoint { ttl_secs: 30, targets: vec![] }));
        assert!(matches!(empty.check(), Err(ValidationError::EmptyEndpoint { .. })));
        let bytes = codec::encode(&empty);
        assert!(matches!(decode_changes(&bytes), Err(codec::CodecError::Invalid(ValidationError::EmptyEndpoint { .. }))));
    }

    #[test]
    fn a_change_larger_than_the_limit_is_not_recorded() {
        let labels: Vec<String> = (0..=PLAN_CHANGES_ENDPOINTS_MAX).map(|i| format!("n{i}")).collect();
        let served: Vec<(&str, u8)> = labels.iter().map(|l| (l.as_str(), 1)).collect();
        let (empty, big) = (plan(1, &[], &["n0"]), plan(2, &served, &[]));
        assert!(PlanChanges::between(&empty, &big).is_none());
    }
}
