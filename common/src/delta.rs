//! Plans sent as their changes: a [`PlanDelta`] is a plan told as everything but its
//! endpoints (its [`PlanHead`]) and the entries that differ from its parent's. A publish of a
//! delta costs what changed, not what the plan holds (`Store::publish_changes`); the store
//! checks it against the parent it holds and makes it a plan like any other.

use crate::changes::{PLAN_CHANGES_ENDPOINTS_MAX, PlanChanges, PlanEntry};
use crate::codec::{self, Record};
use crate::generation::Generation;
use crate::names::{DnsName, EndpointName};
use crate::plan::{Author, Endpoint, Plan, PlanSignature, Provenance, ValidatedPlan, ValidationError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Everything of a plan but what it says of its endpoints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanHead {
    pub generation: Generation,
    pub parent_generation: Generation,
    pub created_at_unix_ms: u64,
    pub author: Author,
    pub reason: String,
    pub dns_zone: DnsName,
    pub rollback_of: Option<Generation>,
    pub provenance: Vec<Provenance>,
}

impl Record for PlanHead {
    const KIND: u8 = 9;
    const KIND_NAME: &'static str = "plan head";
    // `PROVENANCE_ENTRIES_MAX` entries of two texts each, with the reason.
    const BODY_BYTES_MAX: usize = codec::BODY_BYTES_MAX;
}

impl PlanHead {
    pub fn of(plan: &Plan) -> PlanHead {
        PlanHead {
            generation: plan.generation,
            parent_generation: plan.parent_generation,
            created_at_unix_ms: plan.created_at_unix_ms,
            author: plan.author.clone(),
            reason: plan.reason.clone(),
            dns_zone: plan.dns_zone.clone(),
            rollback_of: plan.rollback_of,
            provenance: plan.provenance.clone(),
        }
    }

    /// The plan with this head and these endpoints (not validated).
    pub fn with_endpoints(self, endpoints: BTreeMap<EndpointName, Endpoint>, retired: BTreeSet<EndpointName>) -> Plan {
        Plan {
            generation: self.generation,
            parent_generation: self.parent_generation,
            created_at_unix_ms: self.created_at_unix_ms,
            author: self.author,
            reason: self.reason,
            dns_zone: self.dns_zone,
            endpoints,
            retired,
            rollback_of: self.rollback_of,
            provenance: self.provenance,
        }
    }
}

/// A plan told as its head and what it changes against its parent
/// (`head.parent_generation`): each endpoint whose entry differs, with its entry in this plan.
/// An endpoint not named keeps the parent's entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanDelta {
    pub head: PlanHead,
    pub changes: BTreeMap<EndpointName, PlanEntry>,
    /// The signature of the whole plan the delta makes (not of the delta): checked on that
    /// plan once it is built from the parent.
    pub signature: Option<PlanSignature>,
}

impl Record for PlanDelta {
    const KIND: u8 = 10;
    const KIND_NAME: &'static str = "plan delta";
    const BODY_BYTES_MAX: usize = codec::BODY_BYTES_MAX;
}

impl PlanDelta {
    /// `plan` told against `parent`; `None` when it changes more than
    /// [`PLAN_CHANGES_ENDPOINTS_MAX`] endpoints (send it whole) or `parent` is not its parent.
    pub fn between(parent: &Plan, plan: &ValidatedPlan) -> Option<PlanDelta> {
        if parent.generation != plan.plan().parent_generation {
            return None;
        }
        let changes = PlanChanges::between(parent, plan.plan())?;
        Some(PlanDelta { head: PlanHead::of(plan.plan()), changes: changes.changes, signature: plan.signature().cloned() })
    }

    /// `plan` told against `parent` when the caller knows which endpoints can differ:
    /// only `names` are compared, so this costs what they are, not what the plans hold (the
    /// planner names the endpoints its decision changed). An endpoint not named must hold the
    /// same entry in both; a named one that does not differ is left out. `None` as for
    /// [`PlanDelta::between`].
    pub fn between_named<'a>(parent: &Plan, plan: &ValidatedPlan, names: impl IntoIterator<Item = &'a EndpointName>) -> Option<PlanDelta> {
        if parent.generation != plan.plan().parent_generation {
            return None;
        }
        let mut changes = BTreeMap::new();
        for name in names {
            let now = entry_in(plan.plan(), name);
            if now != entry_in(parent, name) {
                if changes.len() == PLAN_CHANGES_ENDPOINTS_MAX && !changes.contains_key(name) {
                    return None;
                }
                changes.insert(name.clone(), now.into_owned());
            }
        }
        Some(PlanDelta { head: PlanHead::of(plan.plan()), changes, signature: plan.signature().cloned() })
    }

    pub fn generation(&self) -> Generation {
        self.head.generation
    }

    /// The checks of plan validation that need no parent: the head (generations, reason,
    /// author, rollback, provenance), the size of the change, and every named endpoint (inside
    /// the DNS zone, served ones valid, retired ones only by an operator).
    pub fn check(&self) -> Result<(), ValidationError> {
        if self.changes.len() > PLAN_CHANGES_ENDPOINTS_MAX {
            return Err(ValidationError::TooManyEndpoints { count: self.changes.len() });
        }
        // The head's rules and each named entry's are plan validation's own, run on a plan
        // holding only the named entries.
        let mut part = self.head.clone().with_endpoints(BTreeMap::new(), BTreeSet::new());
        for (name, entry) in &self.changes {
            match entry {
                PlanEntry::Serve(records) => {
                    part.endpoints.insert(name.clone(), records.clone());
                }
                PlanEntry::Retire => {
                    part.retired.insert(name.clone());
                }
                PlanEntry::Absent if !name.is_in(&self.head.dns_zone) => {
                    return Err(ValidationError::OutsideDnsZone { endpoint: name.clone(), dns_zone: self.head.dns_zone.clone() });
                }
                PlanEntry::Absent => {}
            }
        }
        match ValidatedPlan::new(part) {
            // A change may name only endpoints it leaves out.
            Ok(_) | Err(ValidationError::NoEndpoints) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// The whole plan: `parent` (the plan `head.parent_generation`, or an empty one for the
    /// first plan) with these changes, validated as any plan is.
    pub fn apply_to(self, parent: Option<Plan>) -> Result<ValidatedPlan, ValidationError> {
        let (mut endpoints, mut retired) = parent.map(|p| (p.endpoints, p.retired)).unwrap_or_default();
        apply_entries(&mut endpoints, &mut retired, self.changes);
        Ok(ValidatedPlan::new(self.head.with_endpoints(endpoints, retired))?.with_signature(self.signature))
    }
}

/// What `plan` says of `name`, borrowed where it serves it.
fn entry_in<'a>(plan: &'a Plan, name: &EndpointName) -> EntryOf<'a> {
    match plan.endpoints.get(name) {
        Some(records) => EntryOf::Serve(records),
        None if plan.retired.contains(name) => EntryOf::Retire,
        None => EntryOf::Absent,
    }
}

/// A [`PlanEntry`] that borrows its records, to compare without cloning.
#[derive(PartialEq)]
enum EntryOf<'a> {
    Serve(&'a Endpoint),
    Retire,
    Absent,
}

impl EntryOf<'_> {
    fn into_owned(self) -> PlanEntry {
        match self {
            EntryOf::Serve(records) => PlanEntry::Serve(records.clone()),
            EntryOf::Retire => PlanEntry::Retire,
            EntryOf::Absent => PlanEntry::Absent,
        }
    }
}

/// Sets each named endpoint's entry in a plan's `endpoints` and `retired`.
pub fn apply_entries(
    endpoints: &mut BTreeMap<EndpointName, Endpoint>,
    retired: &mut BTreeSet<EndpointName>,
    changes: impl IntoIterator<Item = (EndpointName, PlanEntry)>,
) {
    for (name, entry) in changes {
        match entry {
            PlanEntry::Serve(records) => {
                retired.remove(&name);
                endpoints.insert(name, records);
            }
            PlanEntry::Retire => {
                endpoints.remove(&name);
                retired.insert(name);
            }
            PlanEntry::Absent => {
                endpoints.remove(&name);
                retired.remove(&name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Target;
    use crate::{DnsName, ZoneId};

    fn name(label: &str) -> EndpointName {
        DnsName::parse(&format!("{label}.example.test.")).unwrap()
    }

    fn records(last: u8) -> Endpoint {
        Endpoint { ttl_secs: 30, targets: vec![Target { address: [192, 0, 2, last].into(), zone: ZoneId::parse("a").unwrap(), weight: 1 }] }
    }

    fn plan(g: u64, author: Author, served: &[(&str, u8)], retired: &[&str]) -> Plan {
        Plan {
            generation: Generation(g),
            parent_generation: Generation(g - 1),
            created_at_unix_ms: g,
            author,
            reason: format!("plan {g}"),
            dns_zone: DnsName::parse("example.test.").unwrap(),
            endpoints: served.iter().map(|(n, a)| (name(n), records(*a))).collect(),
            retired: retired.iter().map(|n| name(n)).collect(),
            rollback_of: None,
            provenance: Vec::new(),
        }
    }

    fn operator() -> Author {
        Author::Operator { name: "op".into() }
    }

    fn planner() -> Author {
        Author::Planner { id: "p".into() }
    }

    proptest::proptest! {
        /// A delta applied to the parent is the plan it was made from, whatever each name
        /// does between the two.
        #[test]
        fn a_delta_applied_to_its_parent_is_the_plan(
            before in proptest::collection::vec(0u8..4, 10),
            after in proptest::collection::vec(0u8..4, 10),
            also in proptest::collection::vec(proptest::bool::ANY, 10),
        ) {
            // Per name: 0 absent, 1 retired, 2 and 3 served with two different records.
            let make = |g: u64, states: &[u8]| {
                let labels: Vec<String> = (0..states.len()).map(|i| format!("n{i}")).collect();
                let served: Vec<(&str, u8)> =
                    states.iter().zip(&labels).filter(|(s, _)| **s >= 2).map(|(s, l)| (l.as_str(), *s)).collect();
                let retired: Vec<&str> = states.iter().zip(&labels).filter(|(s, _)| **s == 1).map(|(_, l)| l.as_str()).collect();
                let mut p = plan(g, operator(), &served, &retired);
                if p.endpoints.is_empty() && p.retired.is_empty() {
                    p.endpoints.insert(name("always"), records(9));
                }
                p
            };
            let (a, b) = (make(1, &before), ValidatedPlan::new(make(2, &after)).unwrap());
            let delta = PlanDelta::between(&a, &b).unwrap();
            proptest::prop_assert!(delta.check().is_ok());
            // Told with the names that may differ (every changed one, some that did not
            // change), the delta is the same.
            let mut named: Vec<EndpointName> = delta.changes.keys().cloned().collect();
            named.extend((0..also.len()).filter(|i| also[*i]).map(|i| name(&format!("n{i}"))));
            named.push(name("always"));
            proptest::prop_assert_eq!(PlanDelta::between_named(&a, &b, &named), Some(delta.clone()));
            proptest::prop_assert_eq!(delta.apply_to(Some(a)).unwrap(), b);
        }
    }

    #[test]
    fn a_delta_names_what_changed_and_carries_the_head() {
        let a = plan(1, planner(), &[("a", 1), ("b", 1), ("c", 1)], &[]);
        let mut b = plan(2, planner(), &[("a", 2), ("b", 1), ("d", 1)], &[]);
        b.provenance.push(Provenance { endpoint: name("a"), rule: "velocity".into(), detail: "held".into() });
        let b = ValidatedPlan::new(b).unwrap();
        let delta = PlanDelta::between(&a, &b).unwrap();
        assert_eq!(delta.head, PlanHead::of(b.plan()));
        let named: Vec<&str> = delta.changes.keys().map(|n| n.as_str()).collect();
        assert_eq!(named, ["a.example.test.", "c.example.test.", "d.example.test."]);
        assert_eq!(delta.changes[&name("c")], PlanEntry::Absent);
    }

    #[test]
    fn a_delta_is_refused_what_a_plan_is_refused() {
        let a = plan(1, planner(), &[("a", 1)], &[]);
        let b = ValidatedPlan::new(plan(2, planner(), &[("a", 2)], &[])).unwrap();
        let good = PlanDelta::between(&a, &b).unwrap();

        let mut empty = good.clone();
        empty.changes.insert(name("a"), PlanEntry::Serve(Endpoint { ttl_secs: 30, targets: vec![] }));
        assert_eq!(empty.check(), Err(ValidationError::EmptyEndpoint { endpoint: name("a") }));

        let mut retire = good.clone();
        retire.changes.insert(name("b"), PlanEntry::Retire);
        assert!(matches!(retire.check(), Err(ValidationError::RetireByAutomation { .. })));

        let mut outside = good.clone();
        outside.changes.insert(DnsName::parse("x.other.test.").unwrap(), PlanEntry::Absent);
        assert!(matches!(outside.check(), Err(ValidationError::OutsideDnsZone { .. })));

        let mut generation = good.clone();
        generation.head.parent_generation = Generation(2);
        assert!(matches!(generation.check(), Err(ValidationError::BadGeneration { .. })));

        // Leaving endpoints out is a valid change on its own.
        let mut only_absent = good;
        only_absent.changes = [(name("a"), PlanEntry::Absent)].into();
        assert_eq!(only_absent.check(), Ok(()));
        // ... but not when it leaves the plan with nothing.
        assert_eq!(only_absent.apply_to(Some(a)).unwrap_err(), ValidationError::NoEndpoints);
    }

    #[test]
    fn an_automation_delta_must_clear_the_parents_retirements() {
        let a = plan(1, operator(), &[("a", 1)], &[("r")]);
        let b = ValidatedPlan::new(plan(2, planner(), &[("a", 2)], &[])).unwrap();
        let delta = PlanDelta::between(&a, &b).unwrap();
        assert_eq!(delta.changes[&name("r")], PlanEntry::Absent);
        let mut keeps = delta.clone();
        keeps.changes.remove(&name("r"));
        assert!(keeps.check().is_ok(), "the change alone is valid");
        assert!(matches!(keeps.apply_to(Some(a.clone())), Err(ValidationError::RetireByAutomation { .. })));
        assert_eq!(delta.apply_to(Some(a)).unwrap(), b);
    }
}
