//! Operator workflows as library functions over any `Store`, apart from how the CLI prints
//! them: a rollback (publish an older plan's content as a new plan, wait until it is enacted,
//! check that DNS serves it), the question "is plan N served?" behind `dnsplan verify`, and
//! the retirement of an endpoint the planner no longer manages.
//!
//! *Enacted* means every endpoint serves plan N's content: its active record is at N or newer,
//! or holds exactly what plan N says of it (an endpoint plan N did not change keeps the
//! generation of the plan that last changed it; the store only ever holds a plan's own
//! content under its generation, so equal content is plan N's content). Waiting for every
//! fence to reach N instead would wait for the enactors' next full write of unchanged
//! endpoints.

use dnsplan_common::dns_probe::{self, RecordType};
use dnsplan_common::signing::{SigningKey, sign_with};
use dnsplan_common::store::lease::now_unix_ms;
use dnsplan_common::store::{next_generation, publish_against};
use dnsplan_common::{
    ActiveRecord, ActiveState, Author, Endpoint, EndpointName, Generation, Heartbeat, PauseState, Plan, Provenance, Store, StoreError,
    ValidatedPlan,
};
use dnsplan_planner::decide::UNMANAGED_RULE;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// How many times a rollback publishes again after losing the publish race to a planner.
pub const ROLLBACK_PUBLISH_ATTEMPTS_MAX: u32 = 6;
/// Longest one wait on the store's change feed, so progress is reported now and then.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// How long one DNS question may take.
const DNS_QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// An endpoint that does not serve a plan's content yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EndpointBehind {
    pub endpoint: EndpointName,
    /// Its active generation, `None` when it has never been applied.
    pub active: Option<Generation>,
    /// Plans between its active generation and the plan: how far it lags.
    pub plans_behind: u64,
}

/// An enactor whose last fully applied plan is older than a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EnactorBehind {
    pub enactor_id: String,
    pub last_applied: Generation,
    pub plans_behind: u64,
    pub state: String,
}

/// The endpoints that do not serve `plan`'s content in `active` (see the module docs).
pub fn endpoints_behind(plan: &Plan, active: &BTreeMap<EndpointName, ActiveRecord>) -> Vec<EndpointBehind> {
    let n = plan.generation;
    let behind = |name: &EndpointName, want: ActiveState| -> Option<EndpointBehind> {
        let record = active.get(name);
        let served = record.is_some_and(|r| r.generation >= n || r.state == want)
            // A retirement of a name that never served anything is served already.
            || (record.is_none() && want == ActiveState::Retired);
        (!served).then(|| EndpointBehind {
            endpoint: name.clone(),
            active: record.map(|r| r.generation),
            plans_behind: n.0 - record.map_or(0, |r| r.generation.0),
        })
    };
    let served = plan.endpoints.iter().filter_map(|(name, records)| behind(name, ActiveState::Serving(records.clone())));
    let retired = plan.retired.iter().filter_map(|name| behind(name, ActiveState::Retired));
    served.chain(retired).collect()
}

/// The enactors whose last heartbeat says they have not fully applied plan `n`.
pub fn enactors_behind(n: Generation, heartbeats: &[Heartbeat]) -> Vec<EnactorBehind> {
    heartbeats
        .iter()
        .filter(|h| h.last_applied < n)
        .map(|h| EnactorBehind {
            enactor_id: h.enactor_id.clone(),
            last_applied: h.last_applied,
            plans_behind: n.0 - h.last_applied.0,
            state: h.state.clone(),
        })
        .collect()
}

/// Waits until every endpoint serves `plan`'s content or `deadline` passes, calling
/// `progress` with what is behind before each wait. `Ok(())` when enacted, else what was
/// still behind at the deadline.
pub async fn wait_enacted<S: Store>(
    store: &S,
    plan: &Plan,
    deadline: Instant,
    mut progress: impl FnMut(&[EndpointBehind]),
) -> Result<Result<(), Vec<EndpointBehind>>, StoreError> {
    loop {
        let version = store.version().await?;
        let active = store.active_all().await?;
        let behind = endpoints_behind(plan, &active.endpoints);
        if behind.is_empty() {
            return Ok(Ok(()));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Err(behind));
        }
        progress(&behind);
        store.wait_for_change(version, left.min(PROGRESS_EVERY)).await?;
    }
}

/// Whether `name` answers on `dns` with a non-empty subset of `endpoint`'s addresses, per
/// family it has.
pub async fn check_served(dns: SocketAddr, name: &EndpointName, endpoint: &Endpoint) -> Result<(), String> {
    for (qtype, family) in [(RecordType::A, true), (RecordType::AAAA, false)] {
        let allowed: BTreeSet<IpAddr> = endpoint.targets.iter().map(|t| t.address).filter(|a| a.is_ipv4() == family).collect();
        if allowed.is_empty() {
            continue;
        }
        let answer = dns_probe::query(dns, name.as_str(), qtype, DNS_QUERY_TIMEOUT).await.map_err(|e| format!("{name} {qtype}: {e}"))?;
        if !answer.has_addresses() || !answer.addresses.is_subset(&allowed) {
            return Err(format!(
                "{name} {qtype} answered {:?} {:?}; expected addresses among {:?}",
                answer.rcode, answer.addresses, allowed
            ));
        }
    }
    Ok(())
}

/// Waits until DNS on `dns` serves every endpoint of `plan`, or `deadline` passes (then the
/// first problem).
pub async fn wait_served(dns: SocketAddr, plan: &Plan, deadline: Instant) -> Result<(), String> {
    for (name, endpoint) in &plan.endpoints {
        let mut pause = Duration::from_millis(10);
        loop {
            match check_served(dns, name, endpoint).await {
                Ok(()) => break,
                Err(problem) if Instant::now() >= deadline => return Err(problem),
                Err(_) => {
                    // DNS follows the store within milliseconds; back off gently while it does.
                    tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
            }
        }
    }
    Ok(())
}

/// What an operator asks of a rollback.
#[derive(Clone, Debug)]
pub struct RollbackRequest {
    pub to: Generation,
    pub reason: String,
    pub by: String,
    /// Leave automation running (by default it is paused first, so the planner does not
    /// undo the rollback).
    pub keep_automation: bool,
}

/// Pauses automation (unless asked not to) and publishes `latest + 1` with plan `to`'s
/// content, `rollback_of` set and the reason recorded; retried when a planner publishes in
/// between. Returns the published plan.
pub async fn publish_rollback<S: Store>(
    store: &S,
    request: &RollbackRequest,
    key: Option<&SigningKey>,
) -> Result<ValidatedPlan, StoreError> {
    let old = store.plan(request.to).await?;
    let reason = format!("rollback to plan {}: {}", request.to, request.reason);
    if !request.keep_automation {
        store.pause(PauseState::by_operator(reason.clone(), request.by.clone(), now_unix_ms())).await?;
    }
    let mut attempt = 1;
    loop {
        let latest = store.latest().await?;
        let next = next_generation(store, latest).await?;
        let mut provenance: Vec<Provenance> = old
            .plan()
            .endpoints
            .keys()
            .map(|n| Provenance {
                endpoint: n.clone(),
                rule: "rollback".into(),
                detail: format!("content of plan {}, by {}", request.to, request.by),
            })
            .collect();
        // Endpoints added since plan `to` stay as the latest plan serves them: a rollback
        // never empties a name because an older plan did not know it.
        let mut endpoints = old.plan().endpoints.clone();
        let current = store.plan(latest).await?.into_plan();
        for (name, records) in current.endpoints.clone() {
            if let std::collections::btree_map::Entry::Vacant(slot) = endpoints.entry(name) {
                provenance.push(Provenance {
                    endpoint: slot.key().clone(),
                    rule: "rollback".into(),
                    detail: format!("not in plan {}: kept as plan {latest} serves it", request.to),
                });
                slot.insert(records);
            }
        }
        let plan = ValidatedPlan::new(Plan {
            generation: next,
            parent_generation: latest,
            created_at_unix_ms: now_unix_ms(),
            author: Author::Operator { name: request.by.clone() },
            reason: reason.clone(),
            dns_zone: old.plan().dns_zone.clone(),
            endpoints,
            retired: BTreeSet::new(),
            rollback_of: Some(request.to),
            provenance,
        })?;
        let plan = sign_with(key, plan);
        match publish_against(store, Some(&current), &plan, None).await {
            Ok(()) => return Ok(plan),
            Err(StoreError::Conflict { .. }) if attempt < ROLLBACK_PUBLISH_ATTEMPTS_MAX => attempt += 1,
            Err(err) => return Err(err),
        }
    }
}

/// How many stored plans back the newest planner-authored plan is looked for.
const PLANNER_PLAN_LOOKBACK_MAX: u64 = 256;

/// The endpoints `latest` serves that the planner does not manage: those the newest
/// planner-authored plan (within [`PLANNER_PLAN_LOOKBACK_MAX`] plans) carried forward as
/// [`UNMANAGED_RULE`], or did not name at all (added by an operator since). With no planner
/// plan stored, every endpoint is unmanaged.
pub async fn unmanaged<S: Store>(store: &S, latest: &Plan) -> Result<BTreeSet<EndpointName>, StoreError> {
    let from = Generation(latest.generation.0.saturating_sub(PLANNER_PLAN_LOOKBACK_MAX - 1).max(1));
    let summaries = store.list(from, PLANNER_PLAN_LOOKBACK_MAX as usize).await?;
    let newest_planner = summaries.iter().rev().find(|s| !s.author.is_operator() && s.generation <= latest.generation);
    let planner_plan = match newest_planner {
        Some(summary) if summary.generation == latest.generation => Some(latest.clone()),
        Some(summary) => Some(store.plan(summary.generation).await?.into_plan()),
        None => None,
    };
    let Some(planner_plan) = planner_plan else { return Ok(latest.endpoints.keys().cloned().collect()) };
    let carried: BTreeSet<&EndpointName> =
        planner_plan.provenance.iter().filter(|p| p.rule == UNMANAGED_RULE).map(|p| &p.endpoint).collect();
    Ok(latest.endpoints.keys().filter(|n| carried.contains(n) || !planner_plan.endpoints.contains_key(*n)).cloned().collect())
}

/// Why a retirement was not published.
#[derive(Debug, thiserror::Error)]
pub enum RetireError {
    #[error("{0} is not served by the latest plan {1}; see `dnsplan endpoints list`")]
    NotServed(EndpointName, Generation),
    #[error("{0} was already retired by plan {1}")]
    AlreadyRetired(EndpointName, Generation),
    #[error(
        "the planner manages {0}: retiring it would only last until its next plan; remove it from the planner's config first (it is then kept as served, marked unmanaged) and retire it then"
    )]
    Managed(EndpointName),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Publishes `latest + 1`: the latest plan without `name`, which it retires, authored by
/// `by` with `reason` (an operator's plan: the store refuses retirements from automation).
/// Refused when the planner manages `name` or the latest plan does not serve it; published
/// again when a planner publishes in between.
pub async fn publish_retirement<S: Store>(
    store: &S,
    name: &EndpointName,
    reason: &str,
    by: &str,
    key: Option<&SigningKey>,
) -> Result<ValidatedPlan, RetireError> {
    let mut attempt = 1;
    loop {
        let latest = store.latest().await?;
        let current = store.plan(latest).await?.into_plan();
        if current.retired.contains(name) {
            return Err(RetireError::AlreadyRetired(name.clone(), latest));
        }
        if !current.endpoints.contains_key(name) {
            return Err(RetireError::NotServed(name.clone(), latest));
        }
        if !unmanaged(store, &current).await?.contains(name) {
            return Err(RetireError::Managed(name.clone()));
        }
        let next = next_generation(store, latest).await?;
        let mut endpoints = current.endpoints.clone();
        endpoints.remove(name);
        let plan = ValidatedPlan::new(Plan {
            generation: next,
            parent_generation: latest,
            created_at_unix_ms: now_unix_ms(),
            author: Author::Operator { name: by.to_owned() },
            reason: format!("retire {name}: {reason}"),
            dns_zone: current.dns_zone.clone(),
            endpoints,
            retired: [name.clone()].into(),
            rollback_of: None,
            provenance: vec![Provenance { endpoint: name.clone(), rule: "operator".into(), detail: format!("retired by {by}: {reason}") }],
        })
        .map_err(StoreError::from)?;
        let plan = sign_with(key, plan);
        match publish_against(store, Some(&current), &plan, None).await {
            Ok(()) => return Ok(plan),
            Err(StoreError::Conflict { .. }) if attempt < ROLLBACK_PUBLISH_ATTEMPTS_MAX => attempt += 1,
            Err(err) => return Err(err.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dnsplan_common::{DnsName, Target, ZoneId};

    fn name(label: &str) -> EndpointName {
        DnsName::parse(&format!("{label}.example.test.")).expect("name")
    }

    fn records(last: u8) -> Endpoint {
        Endpoint {
            ttl_secs: 30,
            targets: vec![Target { address: [192, 0, 2, last].into(), zone: ZoneId::parse("a").expect("zone"), weight: 1 }],
        }
    }

    fn plan(g: u64, api: u8, db: u8) -> Plan {
        Plan {
            generation: Generation(g),
            parent_generation: Generation(g - 1),
            created_at_unix_ms: 0,
            author: Author::Operator { name: "test".into() },
            reason: String::new(),
            dns_zone: DnsName::parse("example.test.").expect("zone"),
            endpoints: [(name("api"), records(api)), (name("db"), records(db))].into(),
            retired: BTreeSet::new(),
            rollback_of: None,
            provenance: Vec::new(),
        }
    }

    fn active(entries: &[(&str, u64, u8)]) -> BTreeMap<EndpointName, ActiveRecord> {
        entries
            .iter()
            .map(|(l, g, r)| (name(l), ActiveRecord { generation: Generation(*g), state: ActiveState::Serving(records(*r)) }))
            .collect()
    }

    /// The tour's rollback: plan 2 changed api only, plan 3 rolls back to plan 1. Once api is
    /// at 3, plan 3 is enacted although db still holds plan 1's generation: db serves plan
    /// 3's content. (Waiting for every fence to reach 3 waited for the 20 s reconcile.)
    #[test]
    fn an_endpoint_the_plan_did_not_change_is_not_behind() {
        let rollback = plan(3, 1, 9);
        assert_eq!(endpoints_behind(&rollback, &active(&[("api", 3, 1), ("db", 1, 9)])), vec![]);
        let behind = endpoints_behind(&rollback, &active(&[("api", 2, 2), ("db", 1, 9)]));
        assert_eq!(behind, vec![EndpointBehind { endpoint: name("api"), active: Some(Generation(2)), plans_behind: 1 }]);
        // Newer than the plan counts as past it; never applied is behind by the whole plan.
        assert_eq!(endpoints_behind(&rollback, &active(&[("api", 4, 7), ("db", 4, 7)])), vec![]);
        let behind = endpoints_behind(&rollback, &active(&[("api", 3, 1)]));
        assert_eq!(behind, vec![EndpointBehind { endpoint: name("db"), active: None, plans_behind: 3 }]);
    }

    #[test]
    fn enactors_behind_say_by_how_much() {
        let beat = |id: &str, g: u64| Heartbeat {
            enactor_id: id.into(),
            zone: ZoneId::parse("a").expect("zone"),
            last_applied: Generation(g),
            latest_seen: Generation(g),
            at_unix_ms: 0,
            state: "idle".into(),
        };
        let behind = enactors_behind(Generation(7), &[beat("en-a", 7), beat("en-b", 5)]);
        assert_eq!(behind.len(), 1);
        assert_eq!((behind[0].enactor_id.as_str(), behind[0].plans_behind), ("en-b", 2));
    }
}
