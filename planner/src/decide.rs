//! The planner's pure core: `(config, health view, previous plan, state, now, rng) ->
//! (Decision, state)`. No I/O, no wall clock, no async. Every change it makes carries its rule
//! and reason into the plan's provenance.
//!
//! The rules, in the order they apply to each endpoint:
//! 1. **Zone impairment.** When at least `zone_impaired_fraction` of one availability zone's
//!    targets are down while every other zone is below that, and the other zones' healthy
//!    capacity covers `capacity_headroom` × demand for every endpoint, the whole zone is
//!    shifted to weight 0 as one decision. Without the capacity the zone's targets are held as
//!    they are (no churn on a gray failure). One zone at a time; a shifted zone comes back
//!    after `zone_recovery_dwell_secs` of health.
//! 2. **Health.** Other targets follow their own (hysteresis-smoothed) health; a target whose
//!    health is not known yet keeps its previous weight.
//! 3. **Fail open.** Below `fail_open_below` healthy targets, or when nothing would be left,
//!    the endpoint serves all its targets at their configured weights. Never empty.
//! 4. **Velocity.** One plan removes at most `removal_fraction_per_plan` of an endpoint's
//!    weight, and at most `removal_fraction_per_window` over `window_secs`; the rest keeps its
//!    previous weight and waits for later plans. Zone shifts are exempt (rule 1 decided them
//!    as one step, with the capacity check).
//! 5. **Breaker.** If the plan changes, for reasons other than a zone shift, more than
//!    `breaker_endpoint_fraction` of all endpoints (and at least `breaker_min_changed`), the
//!    decision is `Breaker`: publish nothing and wait for an operator.
//!
//! Plans are complete: an endpoint the previous plan serves and the config no longer names
//! (removed from the config, or a typo) is carried into every new plan with the previous
//! plan's records and a provenance entry with rule [`UNMANAGED_RULE`], until an operator
//! retires it. A name never goes empty because it vanished from an input, and every active
//! endpoint stays in the newest plans, so the enactors' full writes move its fence and
//! cleanup is never held back by it.

use crate::config::{EndpointConfig, PlannerConfig};
use dnsplan_common::{Endpoint, EndpointName, Plan, Provenance, Target, ZoneId, removed_weight_fraction, validate_endpoint};
use rand::seq::SliceRandom;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The provenance rule of an endpoint carried forward because the config no longer names it.
pub const UNMANAGED_RULE: &str = "unmanaged";

/// A target's health as the checks see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Up,
    Down,
    /// No verdict yet (just started): keep what the previous plan said.
    Unknown,
}

/// Health per (endpoint, address). A missing entry is `Unknown`.
pub type HealthView = BTreeMap<(EndpointName, IpAddr), Health>;

/// A zone shifted away, and since when it looks healthy again.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneShift {
    pub zone: ZoneId,
    pub since_ms: u64,
    pub healthy_since_ms: Option<u64>,
}

/// Weight removed from an endpoint by a published plan, for the window limit.
#[derive(Clone, Debug, PartialEq)]
pub struct Removal {
    pub at_ms: u64,
    pub endpoint: EndpointName,
    pub fraction: f64,
}

/// What the planner remembers between decisions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlannerState {
    pub shifted: Option<ZoneShift>,
    pub removals: Vec<Removal>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    NoChange,
    Publish { endpoints: BTreeMap<EndpointName, Endpoint>, provenance: Vec<Provenance>, reason: String },
    Breaker { reason: String },
}

/// A decision and the state to keep if it is carried out (published, or nothing to do).
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub decision: Decision,
    pub state: PlannerState,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cause {
    Zone,
    Other,
}

pub fn decide(
    config: &PlannerConfig,
    health: &HealthView,
    previous: Option<&Plan>,
    state: &PlannerState,
    now_ms: u64,
    rng: &mut impl rand::Rng,
) -> Outcome {
    let policy = &config.policy;
    let mut next = state.clone();
    let window_ms = policy.window_secs.0.saturating_mul(1_000);
    next.removals.retain(|r| now_ms.saturating_sub(r.at_ms) < window_ms);
    let health_of = |e: &EndpointName, a: IpAddr| health.get(&(e.clone(), a)).copied().unwrap_or(Health::Unknown);

    // Zone statistics over every target of every endpoint.
    let mut zones: BTreeMap<&ZoneId, (usize, usize)> = BTreeMap::new();
    for ep in config.endpoints() {
        for t in &ep.targets {
            let entry = zones.entry(&t.zone).or_default();
            entry.0 += 1;
            entry.1 += usize::from(health_of(&ep.name, t.address) == Health::Down);
        }
    }
    let impaired_fraction = policy.zone_impaired_fraction.0;
    let is_impaired = |(total, down): (usize, usize)| total > 0 && down as f64 >= impaired_fraction * total as f64;
    let impaired: Vec<ZoneId> = zones.iter().filter(|(_, s)| is_impaired(**s)).map(|(z, _)| (*z).clone()).collect();

    let mut zone_notes = Vec::new();
    let mut held: Option<(ZoneId, String)> = None;
    match next.shifted.clone() {
        Some(mut shift) => {
            if impaired.contains(&shift.zone) {
                shift.healthy_since_ms = None;
                next.shifted = Some(shift);
            } else {
                let since = shift.healthy_since_ms.unwrap_or(now_ms);
                if now_ms.saturating_sub(since) >= policy.zone_recovery_dwell_secs.0.saturating_mul(1_000) {
                    zone_notes.push(format!("zone {} restored after {} s healthy", shift.zone, (now_ms - since) / 1_000));
                    next.shifted = None;
                } else {
                    shift.healthy_since_ms = Some(since);
                    next.shifted = Some(shift);
                }
            }
        }
        None => {
            if let [zone] = impaired.as_slice() {
                match capacity_shortfall(config, health, zone) {
                    None => {
                        zone_notes.push(format!("zone {zone} impaired: shifted away"));
                        next.shifted = Some(ZoneShift { zone: zone.clone(), since_ms: now_ms, healthy_since_ms: None });
                    }
                    Some(detail) => held = Some((zone.clone(), detail)),
                }
            }
        }
    }
    // Never two zones at a time: another impaired zone is held while one is shifted.
    if let Some(shift) = &next.shifted
        && held.is_none()
        && let Some(other) = impaired.iter().find(|z| **z != shift.zone)
    {
        held = Some((other.clone(), format!("zone {} is already shifted", shift.zone)));
    }
    let shifted_zone = next.shifted.as_ref().map(|s| s.zone.clone());
    let restored_zone = state.shifted.as_ref().filter(|_| next.shifted.is_none()).map(|s| s.zone.clone());

    let prev_endpoints = previous.map(|p| &p.endpoints);
    let mut endpoints = BTreeMap::new();
    let mut provenance = Vec::new();
    let mut changed_other = 0usize;
    let mut changed_any = 0usize;
    let mut rules: BTreeMap<&'static str, usize> = BTreeMap::new();
    for ep in config.endpoints() {
        let prev = prev_endpoints.and_then(|p| p.get(&ep.name));
        let decided =
            decide_endpoint(ep, prev, &health_of, (shifted_zone.as_ref(), restored_zone.as_ref()), held.as_ref(), &next, config, rng);
        let changed = prev != Some(&decided.endpoint);
        if changed {
            changed_any += 1;
            if decided.causes.contains(&Cause::Other) || prev.is_none() {
                changed_other += 1;
            }
            for p in &decided.provenance {
                *rules.entry(rule_name(&p.rule)).or_default() += 1;
            }
            provenance.extend(decided.provenance);
            if decided.removed > 0.0 {
                next.removals.push(Removal { at_ms: now_ms, endpoint: ep.name.clone(), fraction: decided.removed });
            }
        }
        // Invariant: every rule above leaves at least one non-zero weight (fail open).
        assert!(validate_endpoint(&ep.name, &decided.endpoint).is_ok(), "decided an invalid endpoint {}", ep.name);
        endpoints.insert(ep.name.clone(), decided.endpoint);
    }

    // Carried forward as served: not a change, so it neither publishes nor trips the breaker.
    for (name, records) in previous.map(|p| &p.endpoints).into_iter().flatten() {
        if !endpoints.contains_key(name) {
            endpoints.insert(name.clone(), records.clone());
            provenance.push(Provenance {
                endpoint: name.clone(),
                rule: UNMANAGED_RULE.into(),
                detail: "not in the planner's config: kept as served until an operator retires it (dnsplan endpoints retire)".into(),
            });
        }
    }

    if changed_any == 0 {
        return Outcome { decision: Decision::NoChange, state: next };
    }
    let total = config.endpoints.len();
    if previous.is_some()
        && changed_other as u64 >= policy.breaker_min_changed.0
        && changed_other as f64 > policy.breaker_endpoint_fraction.0 * total as f64
    {
        let reason = format!(
            "breaker: the plan would change {changed_other} of {total} endpoints (limit {:.0}%); publish nothing until an operator resumes automation",
            policy.breaker_endpoint_fraction.0 * 100.0
        );
        return Outcome { decision: Decision::Breaker { reason }, state: state.clone() };
    }
    let mut reason = if previous.is_none() {
        format!("initial plan: {total} endpoints")
    } else {
        let parts: Vec<String> = rules.iter().map(|(r, n)| format!("{r} ({n})")).collect();
        format!("{changed_any} endpoint(s) changed: {}", parts.join(", "))
    };
    if !zone_notes.is_empty() {
        reason = format!("{reason}; {}", zone_notes.join("; "));
    }
    reason.truncate(dnsplan_common::plan::REASON_BYTES_MAX);
    Outcome { decision: Decision::Publish { endpoints, provenance, reason }, state: next }
}

fn rule_name(rule: &str) -> &'static str {
    match rule {
        "zone-impairment" => "zone-impairment",
        "zone-hold" => "zone-hold",
        "zone-recovery" => "zone-recovery",
        "fail-open" => "fail-open",
        "velocity" => "velocity",
        "initial" => "initial",
        "config" => "config",
        _ => "health",
    }
}

/// Why zone `zone` cannot be shifted away, if it cannot.
fn capacity_shortfall(config: &PlannerConfig, health: &HealthView, zone: &ZoneId) -> Option<String> {
    for ep in config.endpoints() {
        if !ep.targets.iter().any(|t| &t.zone == zone) {
            continue;
        }
        let remaining: f64 = ep
            .targets
            .iter()
            .filter(|t| &t.zone != zone && t.weight > 0)
            .filter(|t| health.get(&(ep.name.clone(), t.address)).copied().unwrap_or(Health::Unknown) != Health::Down)
            .map(|t| t.capacity)
            .sum();
        let needed = config.policy.capacity_headroom * ep.demand();
        if remaining < needed {
            return Some(format!("{}: the other zones carry {remaining} of the {needed} needed", ep.name));
        }
    }
    None
}

struct Decided {
    endpoint: Endpoint,
    provenance: Vec<Provenance>,
    causes: BTreeSet<Cause>,
    /// Weight removed by this plan for reasons other than a zone shift (for the window).
    removed: f64,
}

#[allow(clippy::too_many_arguments)]
fn decide_endpoint(
    ep: &EndpointConfig,
    prev: Option<&Endpoint>,
    health_of: &impl Fn(&EndpointName, IpAddr) -> Health,
    (shifted, restored): (Option<&ZoneId>, Option<&ZoneId>),
    held: Option<&(ZoneId, String)>,
    state: &PlannerState,
    config: &PlannerConfig,
    rng: &mut impl rand::Rng,
) -> Decided {
    let policy = &config.policy;
    let prev_weight = |a: IpAddr| prev.and_then(|p| p.targets.iter().find(|t| t.address == a)).map(|t| t.weight);
    // (target, weight, rule, detail, cause)
    let mut rows: Vec<(Target, &'static str, String, Cause)> = Vec::new();
    for t in &ep.targets {
        let h = health_of(&ep.name, t.address);
        let (weight, rule, detail, cause) = if shifted == Some(&t.zone) {
            (0, "zone-impairment", format!("zone {} shifted away", t.zone), Cause::Zone)
        } else if let Some((zone, why)) = held.filter(|(z, _)| *z == t.zone) {
            (prev_weight(t.address).unwrap_or(t.weight), "zone-hold", format!("zone {zone} impaired but kept: {why}"), Cause::Zone)
        } else {
            match h {
                Health::Up if restored == Some(&t.zone) => {
                    (t.weight, "zone-recovery", format!("zone {} healthy for the recovery dwell", t.zone), Cause::Zone)
                }
                Health::Up => (t.weight, "health", "up".to_owned(), Cause::Other),
                Health::Down => (0, "health", "down".to_owned(), Cause::Other),
                Health::Unknown => (prev_weight(t.address).unwrap_or(t.weight), "health", "not checked yet".to_owned(), Cause::Other),
            }
        };
        rows.push((Target { address: t.address, zone: t.zone.clone(), weight }, rule, detail, cause));
    }

    // Fail open.
    let total = ep.targets.len();
    let healthy = ep.targets.iter().filter(|t| health_of(&ep.name, t.address) != Health::Down).count();
    let nothing_left = rows.iter().all(|(t, ..)| t.weight == 0);
    if (healthy as f64) < policy.fail_open_below.0 * total as f64 || nothing_left {
        let why = format!("{healthy} of {total} targets healthy: serving all of them");
        for ((target, rule, detail, cause), conf) in rows.iter_mut().zip(&ep.targets) {
            target.weight = conf.weight;
            *rule = "fail-open";
            *detail = why.clone();
            *cause = Cause::Other;
        }
    }

    // Velocity: removals against the previous plan, except the zone shift's.
    let mut removed = 0.0;
    if let Some(prev) = prev {
        let prev_total: u64 = prev.targets.iter().map(|t| u64::from(t.weight)).sum();
        let used: f64 = state.removals.iter().filter(|r| r.endpoint == ep.name).map(|r| r.fraction).sum();
        let allowed = policy.removal_fraction_per_plan.0.min((policy.removal_fraction_per_window.0 - used).max(0.0));
        let mut candidates: Vec<usize> = rows
            .iter()
            .enumerate()
            .filter(|(_, (t, _, _, cause))| t.weight == 0 && *cause == Cause::Other && prev_weight(t.address).is_some_and(|w| w > 0))
            .map(|(i, _)| i)
            .collect();
        candidates.shuffle(rng);
        for i in candidates {
            let share = prev_weight(rows[i].0.address).unwrap_or(0) as f64 / prev_total.max(1) as f64;
            if removed + share <= allowed + 1e-9 {
                removed += share;
            } else {
                let (target, rule, detail, _) = &mut rows[i];
                target.weight = prev_weight(target.address).unwrap_or(target.weight);
                *detail = format!(
                    "{detail}, but kept for now: removing it would exceed the velocity limit ({:.0}% per plan, {:.0}% per {} s)",
                    policy.removal_fraction_per_plan.0 * 100.0,
                    policy.removal_fraction_per_window.0 * 100.0,
                    policy.window_secs.0
                );
                *rule = "velocity";
            }
        }
        // Targets dropped from the config are removals too, under the same limits.
        for old in &prev.targets {
            if rows.iter().any(|(t, ..)| t.address == old.address) {
                continue;
            }
            let share = old.weight as f64 / prev_total.max(1) as f64;
            if old.weight == 0 || removed + share <= allowed + 1e-9 {
                removed += share;
                rows.push((Target { weight: 0, ..old.clone() }, "config", "removed from the config".into(), Cause::Other));
            } else {
                rows.push((old.clone(), "velocity", "removed from the config, kept for now (velocity limit)".into(), Cause::Other));
            }
        }
    }

    // Configured targets stay (weight 0 included); dropped ones only while velocity holds them.
    let configured = |a: IpAddr| ep.targets.iter().any(|c| c.address == a);
    let targets = rows.iter().map(|(t, ..)| t.clone()).filter(|t| t.weight > 0 || configured(t.address)).collect();
    let endpoint = Endpoint { ttl_secs: ep.ttl_secs, targets };
    let mut provenance = Vec::new();
    let mut causes = BTreeSet::new();
    for (target, rule, detail, cause) in &rows {
        let before = prev_weight(target.address);
        let in_plan = endpoint.targets.iter().any(|t| t.address == target.address);
        // Unchanged targets are not explained, except those a rule holds back on purpose.
        if before == Some(target.weight) && in_plan && !matches!(*rule, "velocity" | "zone-hold") {
            continue;
        }
        if prev.is_none() {
            continue;
        }
        causes.insert(*cause);
        let before = before.map(|w| w.to_string()).unwrap_or_else(|| "absent".into());
        let after = if in_plan { target.weight.to_string() } else { "absent".into() };
        provenance.push(Provenance {
            endpoint: ep.name.clone(),
            rule: (*rule).to_owned(),
            detail: format!("{} (zone {}) weight {before} -> {after}: {detail}", target.address, target.zone),
        });
    }
    if prev.is_none() {
        provenance.push(Provenance { endpoint: ep.name.clone(), rule: "initial".into(), detail: "first plan for this endpoint".into() });
        causes.insert(Cause::Other);
    }
    if prev.is_some_and(|p| p.ttl_secs != ep.ttl_secs) {
        provenance.push(Provenance { endpoint: ep.name.clone(), rule: "config".into(), detail: format!("TTL {} s", ep.ttl_secs) });
        causes.insert(Cause::Other);
    }
    debug_assert!(prev.is_none_or(|p| removed_weight_fraction(p, &endpoint) + 1e-9 >= removed));
    Decided { endpoint, provenance, causes, removed }
}

impl Decision {
    /// The decision as a few lines of text (logs, `dnsplan plans explain`, scenario tests).
    pub fn describe(&self) -> String {
        match self {
            Decision::NoChange => "no change".into(),
            Decision::Breaker { reason } => reason.clone(),
            Decision::Publish { endpoints, provenance, reason } => {
                let mut out = format!("publish: {reason}");
                for (name, e) in endpoints {
                    let targets: Vec<String> = e.targets.iter().map(|t| format!("{}:{}={}", t.zone, t.address, t.weight)).collect();
                    out.push_str(&format!("\n  {name} {}", targets.join(" ")));
                }
                for p in provenance {
                    out.push_str(&format!("\n  - {} {}: {}", p.rule, p.endpoint, p.detail));
                }
                out
            }
        }
    }
}
