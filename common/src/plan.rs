//! Plans: the immutable values a planner publishes and enactors apply, and their validation.
//!
//! A [`Plan`] is plain data, as decoded from the wire or built by a planner. A
//! [`ValidatedPlan`] is a plan that passed [`ValidatedPlan::new`]; stores accept only those,
//! and enactors validate again after loading (the same check on both sides of the boundary).
//! Every size is bounded by a named limit so that no input, however hostile, makes us
//! allocate or loop without bound.

use crate::generation::Generation;
use crate::names::{DnsName, EndpointName, ZoneId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use thiserror::Error;

/// Most endpoints in one plan. The serving benchmark runs a 1,000,000-name DNS zone from one
/// plan; 2^20 leaves a little room above that while keeping an encoded plan near 100 MB.
pub const ENDPOINTS_PER_PLAN_MAX: usize = 1 << 20;
/// Most targets behind one endpoint. An answer carries at most a handful of addresses and
/// health checking more than 64 backends per name is a sign of a configuration mistake.
pub const TARGETS_PER_ENDPOINT_MAX: usize = 64;
/// Largest weight of one target. Route 53 uses 0..=255; 65,535 allows finer ratios while a sum
/// over `TARGETS_PER_ENDPOINT_MAX` targets still fits easily in a u32.
pub const TARGET_WEIGHT_MAX: u32 = 65_535;
/// Shortest TTL in seconds. Zero-TTL answers defeat resolver caches and multiply load.
pub const TTL_SECS_MIN: u32 = 1;
/// Longest TTL in seconds: one day. Health-steered records with longer TTLs keep clients on a
/// dead target long after the plan moved away from it.
pub const TTL_SECS_MAX: u32 = 86_400;
/// Longest plan reason, in bytes. One or two sentences for `dnsplan plans list`.
pub const REASON_BYTES_MAX: usize = 1_024;
/// Longest author id, in bytes (a planner id or an operator's name).
pub const AUTHOR_BYTES_MAX: usize = 128;
/// Most provenance entries in one plan: a few per endpoint of the largest plan.
pub const PROVENANCE_ENTRIES_MAX: usize = 4 * ENDPOINTS_PER_PLAN_MAX;
/// Longest provenance rule or detail text, in bytes.
pub const PROVENANCE_TEXT_BYTES_MAX: usize = 512;

/// One address behind an endpoint, in an availability zone, with a relative weight.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    pub address: IpAddr,
    pub zone: ZoneId,
    /// Relative share of answers. Zero-weight targets are served only when no target has a
    /// non-zero weight (Route 53 semantics); a plan needs at least one non-zero weight.
    pub weight: u32,
}

/// What one endpoint answers: its TTL and its targets.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub ttl_secs: u32,
    pub targets: Vec<Target>,
}

/// Who made a plan. Automation (`Planner`) is refused while the store is paused; operators
/// are not.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Author {
    Planner { id: String },
    Operator { name: String },
}

impl Author {
    pub fn is_operator(&self) -> bool {
        matches!(self, Author::Operator { .. })
    }

    /// The planner's id or the operator's name.
    pub fn name(&self) -> &str {
        match self {
            Author::Planner { id } => id,
            Author::Operator { name } => name,
        }
    }

    /// The author its text names (`Display`'s `planner:ID` or `operator:NAME`); text with
    /// neither prefix is an operator's name.
    pub fn parse(text: &str) -> Author {
        match (text.strip_prefix("planner:"), text.strip_prefix("operator:")) {
            (Some(id), _) => Author::Planner { id: id.to_owned() },
            (_, Some(name)) => Author::Operator { name: name.to_owned() },
            _ => Author::Operator { name: text.to_owned() },
        }
    }

    fn id(&self) -> &str {
        match self {
            Author::Planner { id } => id,
            Author::Operator { name } => name,
        }
    }
}

impl std::fmt::Display for Author {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Author::Planner { id } => write!(f, "planner:{id}"),
            Author::Operator { name } => write!(f, "operator:{name}"),
        }
    }
}

/// Why one endpoint looks the way it does in this plan (`dnsplan plans explain`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    pub endpoint: EndpointName,
    /// The rule that decided, e.g. `fail-open`, `velocity`, `zone-impairment`, `operator`.
    pub rule: String,
    pub detail: String,
}

/// An immutable, numbered description of what every managed endpoint should answer.
///
/// Plans are full, not deltas: every endpoint that should keep answering is in `endpoints`.
/// An endpoint that is absent is left as it is by enactors (a missing input is never a
/// removal); only an operator can retire an endpoint, by naming it in `retired`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub generation: Generation,
    pub parent_generation: Generation,
    pub created_at_unix_ms: u64,
    pub author: Author,
    pub reason: String,
    /// The managed DNS zone's origin; every endpoint lies inside it.
    pub dns_zone: DnsName,
    #[serde(deserialize_with = "crate::plan::sorted_map")]
    pub endpoints: BTreeMap<EndpointName, Endpoint>,
    /// Endpoints this plan stops serving (operator plans only).
    pub retired: BTreeSet<EndpointName>,
    /// Set when an operator rolled back (forward) to an older plan's content.
    pub rollback_of: Option<Generation>,
    pub provenance: Vec<Provenance>,
}

/// Why a plan or endpoint was refused. Each variant names what is wrong and where.
#[derive(Debug, Error, PartialEq, Eq, Clone, Serialize, Deserialize)]
pub enum ValidationError {
    #[error("generation must be at least 1 and follow its parent (generation {generation}, parent {parent})")]
    BadGeneration { generation: Generation, parent: Generation },
    #[error("plan has {count} endpoints; the limit is {max}", max = ENDPOINTS_PER_PLAN_MAX)]
    TooManyEndpoints { count: usize },
    #[error("plan names no endpoint to serve and retires none")]
    NoEndpoints,
    #[error("endpoint {endpoint} has no targets; an endpoint must never be empty")]
    EmptyEndpoint { endpoint: EndpointName },
    #[error("endpoint {endpoint} has {count} targets; the limit is {max}", max = TARGETS_PER_ENDPOINT_MAX)]
    TooManyTargets { endpoint: EndpointName, count: usize },
    #[error("endpoint {endpoint}: every target has weight 0; at least one must be non-zero")]
    AllWeightsZero { endpoint: EndpointName },
    #[error("endpoint {endpoint}: target weight {weight} is above the limit {max}", max = TARGET_WEIGHT_MAX)]
    WeightTooLarge { endpoint: EndpointName, weight: u32 },
    #[error("endpoint {endpoint}: address {address} appears more than once")]
    DuplicateAddress { endpoint: EndpointName, address: IpAddr },
    #[error("endpoint {endpoint} is outside the DNS zone {dns_zone}")]
    OutsideDnsZone { endpoint: EndpointName, dns_zone: DnsName },
    #[error("endpoint {endpoint}: TTL {ttl_secs}s is outside {min}..={max}s", min = TTL_SECS_MIN, max = TTL_SECS_MAX)]
    TtlOutOfRange { endpoint: EndpointName, ttl_secs: u32 },
    #[error("reason is {len} bytes; the limit is {max}", max = REASON_BYTES_MAX)]
    ReasonTooLong { len: usize },
    #[error("author id is empty or longer than {max} bytes", max = AUTHOR_BYTES_MAX)]
    BadAuthor,
    #[error("endpoint {endpoint} is both served and retired")]
    ServedAndRetired { endpoint: EndpointName },
    #[error("only an operator may retire endpoints; {author} tried to retire {endpoint}")]
    RetireByAutomation { author: String, endpoint: EndpointName },
    #[error("only an operator may roll back; {author} marked a rollback")]
    RollbackByAutomation { author: String },
    #[error("rollback target {target} must be older than the plan ({generation})")]
    RollbackNotOlder { target: Generation, generation: Generation },
    #[error("plan has {count} provenance entries; the limit is {max}", max = PROVENANCE_ENTRIES_MAX)]
    TooMuchProvenance { count: usize },
    #[error("provenance entry for {endpoint} has a text longer than {max} bytes", max = PROVENANCE_TEXT_BYTES_MAX)]
    ProvenanceTextTooLong { endpoint: EndpointName },
}

/// Checks one endpoint on its own. Used by plan validation and again by every store's
/// `apply`, so an empty endpoint is refused at build, at publish and at apply.
pub fn validate_endpoint(name: &EndpointName, endpoint: &Endpoint) -> Result<(), ValidationError> {
    if endpoint.targets.is_empty() {
        return Err(ValidationError::EmptyEndpoint { endpoint: name.clone() });
    }
    if endpoint.targets.len() > TARGETS_PER_ENDPOINT_MAX {
        return Err(ValidationError::TooManyTargets { endpoint: name.clone(), count: endpoint.targets.len() });
    }
    if !(TTL_SECS_MIN..=TTL_SECS_MAX).contains(&endpoint.ttl_secs) {
        return Err(ValidationError::TtlOutOfRange { endpoint: name.clone(), ttl_secs: endpoint.ttl_secs });
    }
    let mut seen = HashSet::with_capacity(endpoint.targets.len());
    for target in &endpoint.targets {
        if target.weight > TARGET_WEIGHT_MAX {
            return Err(ValidationError::WeightTooLarge { endpoint: name.clone(), weight: target.weight });
        }
        if !seen.insert(target.address) {
            return Err(ValidationError::DuplicateAddress { endpoint: name.clone(), address: target.address });
        }
    }
    if endpoint.targets.iter().all(|t| t.weight == 0) {
        return Err(ValidationError::AllWeightsZero { endpoint: name.clone() });
    }
    Ok(())
}

/// An endpoint's targets as `address (zone, wWEIGHT)`, comma-separated: how the CLI and the
/// status page print them.
pub fn target_list(endpoint: &Endpoint) -> String {
    endpoint.targets.iter().map(|t| format!("{} ({}, w{})", t.address, t.zone, t.weight)).collect::<Vec<_>>().join(", ")
}

/// What changes from plan `a` to plan `b`, as `('-' | '+', text)` lines by endpoint name: a
/// new endpoint, a retired one, a TTL, and each target added, removed or changed. An
/// endpoint absent from `b` and not retired by it is left as it was, so it is no line.
pub fn diff_lines(a: &Plan, b: &Plan) -> Vec<(char, String)> {
    let mut lines = Vec::new();
    let names: BTreeSet<&EndpointName> = a.endpoints.keys().chain(b.endpoints.keys()).collect();
    for name in names {
        match (a.endpoints.get(name), b.endpoints.get(name)) {
            (Some(_), None) if b.retired.contains(name) => lines.push(('-', format!("{name} (retired)"))),
            (Some(_), None) | (None, None) => {}
            (None, Some(e)) => lines.push(('+', format!("{name} ttl {} {}", e.ttl_secs, target_list(e)))),
            (Some(x), Some(y)) => {
                if x.ttl_secs != y.ttl_secs {
                    lines.push(('-', format!("{name} ttl {}", x.ttl_secs)));
                    lines.push(('+', format!("{name} ttl {}", y.ttl_secs)));
                }
                let old: BTreeMap<IpAddr, &Target> = x.targets.iter().map(|t| (t.address, t)).collect();
                let new: BTreeMap<IpAddr, &Target> = y.targets.iter().map(|t| (t.address, t)).collect();
                for (addr, t) in &old {
                    if new.get(addr) != Some(t) {
                        lines.push(('-', format!("{name} {addr} zone {} weight {}", t.zone, t.weight)));
                    }
                }
                for (addr, t) in &new {
                    if old.get(addr) != Some(t) {
                        lines.push(('+', format!("{name} {addr} zone {} weight {}", t.zone, t.weight)));
                    }
                }
            }
        }
    }
    lines
}

/// The fraction (0.0..=1.0) of `active`'s weight that `next` stops serving: the summed weight
/// of active targets with a non-zero weight that `next` drops or sets to zero, over the
/// active total. Lowering a weight that stays above zero, or adding targets, removes nothing.
///
/// The planner's velocity control limits this per plan, and enactors refuse plans above
/// their own limit: both sides measure removals the same way.
pub fn removed_weight_fraction(active: &Endpoint, next: &Endpoint) -> f64 {
    let total: u64 = active.targets.iter().map(|t| u64::from(t.weight)).sum();
    if total == 0 {
        return 0.0;
    }
    let kept: HashSet<IpAddr> = next.targets.iter().filter(|t| t.weight > 0).map(|t| t.address).collect();
    let removed: u64 = active.targets.iter().filter(|t| t.weight > 0 && !kept.contains(&t.address)).map(|t| u64::from(t.weight)).sum();
    removed as f64 / total as f64
}

/// An Ed25519 signature of a plan by its author's key (see `signing`): over the plan's codec
/// body, so over every field of it. Carried beside the plan, in a "signed plan" envelope.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSignature {
    /// The signer's public key: how a keyring finds the key (and its name and rights).
    pub public_key: [u8; 32],
    /// 64 bytes; any other length does not verify.
    pub signature: Vec<u8>,
}

/// A plan that passed validation. The only kind of plan a store accepts.
///
/// It may carry its author's signature. Validation does not check it: whether a signature
/// is trusted is a keyring's question (`signing::Keyring::verify`), asked where a keyring is
/// configured.
// Invariant: `plan` satisfies every rule in `ValidatedPlan::new`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidatedPlan {
    plan: Plan,
    signature: Option<PlanSignature>,
}

impl ValidatedPlan {
    pub fn new(plan: Plan) -> Result<ValidatedPlan, ValidationError> {
        let generation_ok = plan.generation >= Generation::FIRST && plan.parent_generation < plan.generation;
        if !generation_ok {
            return Err(ValidationError::BadGeneration { generation: plan.generation, parent: plan.parent_generation });
        }
        if plan.endpoints.len() + plan.retired.len() > ENDPOINTS_PER_PLAN_MAX {
            return Err(ValidationError::TooManyEndpoints { count: plan.endpoints.len() + plan.retired.len() });
        }
        if plan.endpoints.is_empty() && plan.retired.is_empty() {
            return Err(ValidationError::NoEndpoints);
        }
        if plan.reason.len() > REASON_BYTES_MAX {
            return Err(ValidationError::ReasonTooLong { len: plan.reason.len() });
        }
        let author_id = plan.author.id();
        if author_id.is_empty() || author_id.len() > AUTHOR_BYTES_MAX {
            return Err(ValidationError::BadAuthor);
        }
        for (name, endpoint) in &plan.endpoints {
            if !name.is_in(&plan.dns_zone) {
                return Err(ValidationError::OutsideDnsZone { endpoint: name.clone(), dns_zone: plan.dns_zone.clone() });
            }
            validate_endpoint(name, endpoint)?;
        }
        for name in &plan.retired {
            if !name.is_in(&plan.dns_zone) {
                return Err(ValidationError::OutsideDnsZone { endpoint: name.clone(), dns_zone: plan.dns_zone.clone() });
            }
            if plan.endpoints.contains_key(name) {
                return Err(ValidationError::ServedAndRetired { endpoint: name.clone() });
            }
            if !plan.author.is_operator() {
                return Err(ValidationError::RetireByAutomation { author: plan.author.to_string(), endpoint: name.clone() });
            }
        }
        if let Some(target) = plan.rollback_of {
            if !plan.author.is_operator() {
                return Err(ValidationError::RollbackByAutomation { author: plan.author.to_string() });
            }
            if target >= plan.generation {
                return Err(ValidationError::RollbackNotOlder { target, generation: plan.generation });
            }
        }
        if plan.provenance.len() > PROVENANCE_ENTRIES_MAX {
            return Err(ValidationError::TooMuchProvenance { count: plan.provenance.len() });
        }
        for entry in &plan.provenance {
            if entry.rule.len() > PROVENANCE_TEXT_BYTES_MAX || entry.detail.len() > PROVENANCE_TEXT_BYTES_MAX {
                return Err(ValidationError::ProvenanceTextTooLong { endpoint: entry.endpoint.clone() });
            }
        }
        Ok(ValidatedPlan { plan, signature: None })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The author's signature, when the plan carries one.
    pub fn signature(&self) -> Option<&PlanSignature> {
        self.signature.as_ref()
    }

    /// The plan with `signature` attached (replacing any it had). Not checked here.
    pub fn with_signature(self, signature: Option<PlanSignature>) -> ValidatedPlan {
        ValidatedPlan { signature, ..self }
    }

    pub fn into_plan(self) -> Plan {
        self.plan
    }

    pub fn generation(&self) -> Generation {
        self.plan.generation
    }

    pub fn summary(&self) -> PlanSummary {
        ValidatedPlan::summary_of(&self.plan)
    }

    /// What `Store::list` says of `plan`.
    pub fn summary_of(plan: &Plan) -> PlanSummary {
        PlanSummary {
            generation: plan.generation,
            parent_generation: plan.parent_generation,
            created_at_unix_ms: plan.created_at_unix_ms,
            author: plan.author.clone(),
            reason: plan.reason.clone(),
            endpoint_count: plan.endpoints.len() as u64,
            retired_count: plan.retired.len() as u64,
            rollback_of: plan.rollback_of,
        }
    }
}

/// What `Store::list` returns for each plan: everything but the endpoints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSummary {
    pub generation: Generation,
    pub parent_generation: Generation,
    pub created_at_unix_ms: u64,
    pub author: Author,
    pub reason: String,
    pub endpoint_count: u64,
    pub retired_count: u64,
    pub rollback_of: Option<Generation>,
}

/// A map read as its entries, then built in one pass (`deserialize_with`). A stored plan's
/// endpoints and an active state come in name order, which `BTreeMap::from_iter` builds
/// from without an insert (and its name comparisons) per entry: a 1,000,000-endpoint plan
/// decodes in about 410 ms instead of 650 ms. Entries out of order are sorted first; a
/// repeated name keeps its last entry, as inserting them did.
pub(crate) fn sorted_map<'de, D, K, V>(deserializer: D) -> Result<BTreeMap<K, V>, D::Error>
where
    D: serde::Deserializer<'de>,
    K: Deserialize<'de> + Ord,
    V: Deserialize<'de>,
{
    struct Entries<K, V>(std::marker::PhantomData<(K, V)>);
    impl<'de, K: Deserialize<'de> + Ord, V: Deserialize<'de>> serde::de::Visitor<'de> for Entries<K, V> {
        type Value = BTreeMap<K, V>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            // Bounded: a length from the input is only a hint.
            let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(4_096));
            while let Some(entry) = map.next_entry()? {
                entries.push(entry);
            }
            Ok(entries.into_iter().collect())
        }
    }
    deserializer.deserialize_map(Entries(std::marker::PhantomData))
}

/// An [`Author`] as its text (`serde(with)`): `planner:ID` or `operator:NAME`, as people and
/// JSON readers see it.
pub(crate) mod author_text {
    use super::Author;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(author: &Author, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(author)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Author, D::Error> {
        Ok(Author::parse(&String::deserialize(deserializer)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An author's text names it back (`planner:ID`, `operator:NAME`), and text without a
    /// prefix is an operator's name: what a pause's `by` carries on the wire and on disk.
    #[test]
    fn an_author_reads_back_from_its_text() {
        for author in [Author::Planner { id: "p1".into() }, Author::Operator { name: "alice".into() }, Author::Operator { name: "".into() }]
        {
            assert_eq!(Author::parse(&author.to_string()), author);
        }
        assert_eq!(Author::parse("alice"), Author::Operator { name: "alice".into() });
        let pause: crate::store::PauseState =
            serde_json::from_str(r#"{"reason": "r", "by": "planner:p1", "since_unix_ms": 1}"#).expect("a pause");
        assert!(pause.is_breaker() && pause.by.name() == "p1", "{pause:?}");
        let json = serde_json::to_value(crate::store::PauseState::by_operator("r", "bob", 1)).expect("json");
        assert_eq!(json["by"], "operator:bob");
    }

    fn name(s: &str) -> EndpointName {
        DnsName::parse(s).unwrap()
    }

    fn target(addr: &str, weight: u32) -> Target {
        Target { address: addr.parse().unwrap(), zone: ZoneId::parse("a").unwrap(), weight }
    }

    fn plan_with(endpoint: Endpoint) -> Plan {
        Plan {
            generation: Generation(1),
            parent_generation: Generation::NONE,
            created_at_unix_ms: 0,
            author: Author::Planner { id: "p1".into() },
            reason: "test".into(),
            dns_zone: name("example.test"),
            endpoints: [(name("api.example.test"), endpoint)].into(),
            retired: BTreeSet::new(),
            rollback_of: None,
            provenance: vec![],
        }
    }

    /// Endpoints read in any order come out as inserting them would make them: sorted, and
    /// a repeated name with its last entry. Read through the codec (in order) and through
    /// JSON (as written, out of order and repeated).
    #[test]
    fn endpoints_are_read_as_inserting_them_would_make_them() {
        let mut plan = plan_with(Endpoint { ttl_secs: 30, targets: vec![target("192.0.2.1", 1)] });
        for (i, label) in ["m", "b", "z", "a"].iter().enumerate() {
            plan.endpoints.insert(
                name(&format!("{label}.example.test")),
                Endpoint { ttl_secs: 30 + i as u32, targets: vec![target("192.0.2.9", 1)] },
            );
        }
        let bytes = crate::codec::encode(&plan);
        assert_eq!(crate::codec::decode::<Plan>(&bytes).unwrap(), plan);

        // The same plan as JSON, its endpoints written in reverse order, with `z` given
        // twice (first with other records).
        let entry = |name: &EndpointName, records: &Endpoint| format!("\"{name}\":{}", serde_json::to_string(records).unwrap());
        let mut entries: Vec<String> = plan.endpoints.iter().rev().map(|(n, r)| entry(n, r)).collect();
        let z = name("z.example.test");
        entries.insert(0, entry(&z, &Endpoint { ttl_secs: 99, targets: vec![target("192.0.2.8", 1)] }));
        let mut value = serde_json::to_value(&plan).unwrap();
        value["endpoints"] = serde_json::json!({});
        let json = serde_json::to_string(&value).unwrap().replace("\"endpoints\":{}", &format!("\"endpoints\":{{{}}}", entries.join(",")));
        assert_eq!(serde_json::from_str::<Plan>(&json).unwrap(), plan, "{json}");
    }

    #[test]
    fn removed_weight_counts_only_targets_that_stop_serving() {
        let active = Endpoint { ttl_secs: 30, targets: vec![target("192.0.2.1", 1), target("192.0.2.2", 1), target("192.0.2.3", 2)] };
        let same = active.clone();
        assert_eq!(removed_weight_fraction(&active, &same), 0.0);
        let drop_one = Endpoint { ttl_secs: 30, targets: vec![target("192.0.2.1", 1), target("192.0.2.3", 2)] };
        assert_eq!(removed_weight_fraction(&active, &drop_one), 0.25);
        let zero_heavy = Endpoint { ttl_secs: 30, targets: vec![target("192.0.2.1", 1), target("192.0.2.2", 1), target("192.0.2.3", 0)] };
        assert_eq!(removed_weight_fraction(&active, &zero_heavy), 0.5);
        let lowered_and_added = Endpoint {
            ttl_secs: 30,
            targets: vec![target("192.0.2.1", 1), target("192.0.2.2", 1), target("192.0.2.3", 1), target("192.0.2.9", 5)],
        };
        assert_eq!(removed_weight_fraction(&active, &lowered_and_added), 0.0);
        let replaced = Endpoint { ttl_secs: 30, targets: vec![target("192.0.2.9", 1)] };
        assert_eq!(removed_weight_fraction(&active, &replaced), 1.0);
    }

    /// Each rule, data-driven: a plan breaking exactly that rule and the error we expect.
    #[test]
    fn every_rule_refuses_its_violation() {
        let good = Endpoint { ttl_secs: 30, targets: vec![target("192.0.2.1", 1), target("192.0.2.2", 0)] };
        assert!(ValidatedPlan::new(plan_with(good.clone())).is_ok());

        let mut cases: Vec<(&str, Plan)> = vec![
            ("no targets", plan_with(Endpoint { ttl_secs: 30, targets: vec![] })),
            ("weight 0", plan_with(Endpoint { ttl_secs: 30, targets: vec![target("192.0.2.1", 0)] })),
            ("more than once", plan_with(Endpoint { ttl_secs: 30, targets: vec![target("192.0.2.1", 1), target("192.0.2.1", 2)] })),
            ("TTL 0s", plan_with(Endpoint { ttl_secs: 0, targets: good.targets.clone() })),
            ("TTL 86401s", plan_with(Endpoint { ttl_secs: 86_401, targets: good.targets.clone() })),
            ("above the limit", plan_with(Endpoint { ttl_secs: 30, targets: vec![target("192.0.2.1", TARGET_WEIGHT_MAX + 1)] })),
        ];
        let many = (0..=TARGETS_PER_ENDPOINT_MAX).map(|i| target(&format!("10.0.0.{i}"), 1)).collect();
        cases.push(("65 targets", plan_with(Endpoint { ttl_secs: 30, targets: many })));
        let mut outside = plan_with(good.clone());
        outside.endpoints = [(name("api.other.test"), good.clone())].into();
        cases.push(("outside the DNS zone", outside));
        let mut long_reason = plan_with(good.clone());
        long_reason.reason = "x".repeat(REASON_BYTES_MAX + 1);
        cases.push(("reason is 1025 bytes", long_reason));
        let mut retire_auto = plan_with(good.clone());
        retire_auto.retired.insert(name("old.example.test"));
        cases.push(("only an operator may retire", retire_auto));
        let mut both = plan_with(good.clone());
        both.author = Author::Operator { name: "alice".into() };
        both.retired.insert(name("api.example.test"));
        cases.push(("both served and retired", both));
        let mut bad_generation = plan_with(good.clone());
        bad_generation.generation = Generation::NONE;
        cases.push(("generation must be at least 1", bad_generation));
        let mut rollback = plan_with(good.clone());
        rollback.rollback_of = Some(Generation(1));
        cases.push(("only an operator may roll back", rollback));
        let mut empty = plan_with(good);
        empty.endpoints.clear();
        cases.push(("names no endpoint", empty));

        for (want, plan) in cases {
            let err = ValidatedPlan::new(plan).expect_err(want);
            assert!(err.to_string().contains(want), "want {want:?}, got {err}");
        }
    }
}
