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
//! What the rules hold back is said, not only done: [`Outcome::deferred`] lists every
//! decision deferred by a rule (a dead target kept by the velocity limits, by fail open or by
//! a zone hold; a healthy one kept out by the recovery dwell; every change a tripped breaker
//! stopped), with the rule, the numbers, and when it is reconsidered. It is computed beside
//! the decision and changes nothing in it; the loop shows it in its status and metrics, since
//! a decision held back often publishes nothing (`NoChange`) and so leaves no provenance.
//!
//! Plans are complete: an endpoint the previous plan serves and the config no longer names
//! (removed from the config, or a typo) is carried into every new plan with the previous
//! plan's records and a provenance entry with rule [`UNMANAGED_RULE`], until an operator
//! retires it. A name never goes empty because it vanished from an input, and every active
//! endpoint stays in the newest plans, so the enactors' full writes move its fence and
//! cleanup is never held back by it.

use crate::config::{EndpointConfig, PlannerConfig, Policy};
pub use dnsplan_common::status::{Deferred, DeferredRule, Health};
use dnsplan_common::{Endpoint, EndpointName, Plan, Provenance, Target, ZoneId, removed_weight_fraction, validate_endpoint};
use rand::seq::SliceRandom;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The provenance rule of an endpoint carried forward because the config no longer names it.
pub const UNMANAGED_RULE: &str = "unmanaged";

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
    /// `changed`: the endpoints whose records differ from the previous plan's (all of them
    /// for a first plan). The publish sends the plan as its changes against its parent from
    /// these alone, without comparing the plans whole.
    Publish {
        endpoints: BTreeMap<EndpointName, Endpoint>,
        changed: BTreeSet<EndpointName>,
        provenance: Vec<Provenance>,
        reason: String,
    },
    Breaker {
        reason: String,
    },
}

/// A decision and the state to keep if it is carried out (published, or nothing to do).
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub decision: Decision,
    pub state: PlannerState,
    /// What the rules held back in this decision, in config order (endpoint, then target).
    /// For `Breaker`, one entry per endpoint the stopped plan would have changed.
    pub deferred: Vec<Deferred>,
}

/// A short account of `deferred` for a status line: `1 deferred: removal_per_plan
/// api.example.test. 127.0.0.15`, or the count by rule. `None` when nothing is deferred.
pub fn summarize(deferred: &[Deferred]) -> Option<String> {
    match deferred {
        [] => None,
        [one] => {
            let target = one.target.map(|t| format!(" {t}")).unwrap_or_default();
            Some(format!("1 deferred: {} {}{target}", one.rule, one.endpoint))
        }
        many => {
            let mut counts: BTreeMap<DeferredRule, usize> = BTreeMap::new();
            for d in many {
                *counts.entry(d.rule).or_default() += 1;
            }
            let parts: Vec<String> = counts.iter().map(|(r, n)| format!("{r} {n}")).collect();
            Some(format!("{} deferred: {}", many.len(), parts.join(", ")))
        }
    }
}

/// An impaired zone not shifted away, and why (the provenance's text and the deferral's).
struct ZoneHold {
    zone: ZoneId,
    /// The provenance detail's reason (`zone-hold`).
    why: String,
    rule: DeferredRule,
    /// The deferral's account, with the numbers.
    detail: String,
    reconsider_at_unix_ms: Option<u64>,
}

/// What a zone rule defers, handed to each endpoint's decision.
struct Zones<'a> {
    shifted: Option<&'a ZoneId>,
    restored: Option<&'a ZoneId>,
    held: Option<&'a ZoneHold>,
    /// When the recovery dwell of a shifted zone that looks healthy again ends.
    recovering: Option<u64>,
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
    let mut held: Option<ZoneHold> = None;
    let dwell_ms = policy.zone_recovery_dwell_secs.0.saturating_mul(1_000);
    let zone_stats = |zone: &ZoneId| {
        let (total, down) = zones.get(zone).copied().unwrap_or_default();
        format!("zone {zone} impaired ({down} of {total} targets down, threshold {:.0}%)", impaired_fraction * 100.0)
    };
    match next.shifted.clone() {
        Some(mut shift) => {
            if impaired.contains(&shift.zone) {
                shift.healthy_since_ms = None;
                next.shifted = Some(shift);
            } else {
                let since = shift.healthy_since_ms.unwrap_or(now_ms);
                if now_ms.saturating_sub(since) >= dwell_ms {
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
                    Some(short) => {
                        let Shortfall { endpoint, remaining, needed, demand } = short;
                        held = Some(ZoneHold {
                            zone: zone.clone(),
                            why: format!("{endpoint}: the other zones carry {remaining} of the {needed} needed"),
                            rule: DeferredRule::Capacity,
                            detail: format!(
                                "{} but not shifted away: without it {endpoint} has {} of the {} capacity needed (capacity_headroom {} x demand {}); held as it is until the other zones' healthy capacity covers it",
                                zone_stats(zone),
                                number(remaining),
                                number(needed),
                                number(policy.capacity_headroom),
                                number(demand)
                            ),
                            reconsider_at_unix_ms: None,
                        });
                    }
                }
            }
        }
    }
    // Never two zones at a time: another impaired zone is held while one is shifted.
    if let Some(shift) = &next.shifted
        && held.is_none()
        && let Some(other) = impaired.iter().find(|z| **z != shift.zone)
    {
        let back = match shift.healthy_since_ms {
            Some(_) => format!("zone {} is back, after {} s of health", shift.zone, policy.zone_recovery_dwell_secs.0),
            None => format!("zone {} is healthy again and then for {} s", shift.zone, policy.zone_recovery_dwell_secs.0),
        };
        held = Some(ZoneHold {
            zone: other.clone(),
            why: format!("zone {} is already shifted", shift.zone),
            rule: DeferredRule::ZoneOneAtATime,
            detail: format!(
                "{} but not shifted away while zone {} is (one zone at a time); held as it is until {back}",
                zone_stats(other),
                shift.zone
            ),
            reconsider_at_unix_ms: shift.healthy_since_ms.map(|since| since.saturating_add(dwell_ms)),
        });
    }
    let shifted_zone = next.shifted.as_ref().map(|s| s.zone.clone());
    let restored_zone = state.shifted.as_ref().filter(|_| next.shifted.is_none()).map(|s| s.zone.clone());
    let zone_rules = Zones {
        shifted: shifted_zone.as_ref(),
        restored: restored_zone.as_ref(),
        held: held.as_ref(),
        recovering: next.shifted.as_ref().and_then(|s| s.healthy_since_ms).map(|since| since.saturating_add(dwell_ms)),
    };

    let prev_endpoints = previous.map(|p| &p.endpoints);
    let mut endpoints = BTreeMap::new();
    let mut provenance = Vec::new();
    let mut changed_other = 0usize;
    let mut changed_any = BTreeSet::new();
    let mut rules: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut deferred = Vec::new();
    // What each endpoint changed for reasons other than a zone shift, should the breaker stop it.
    let mut stopped: Vec<(EndpointName, Vec<String>)> = Vec::new();
    for ep in config.endpoints() {
        let prev = prev_endpoints.and_then(|p| p.get(&ep.name));
        let decided = decide_endpoint(ep, prev, &health_of, &zone_rules, &next, config, now_ms, rng);
        deferred.extend(decided.deferred);
        let changed = prev != Some(&decided.endpoint);
        if changed {
            changed_any.insert(ep.name.clone());
            if decided.causes.contains(&Cause::Other) || prev.is_none() {
                changed_other += 1;
                stopped.push((ep.name.clone(), decided.provenance.iter().map(|p| p.detail.clone()).collect()));
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

    if changed_any.is_empty() {
        return Outcome { decision: Decision::NoChange, state: next, deferred };
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
        let limits = format!(
            "the plan changes {changed_other} of {total} endpoints, above the breaker's {:.0}% (and at least {}): nothing published, automation paused until an operator resumes it (dnsplan resume)",
            policy.breaker_endpoint_fraction.0 * 100.0,
            policy.breaker_min_changed.0
        );
        let deferred = stopped
            .into_iter()
            .map(|(endpoint, changes)| Deferred {
                rule: DeferredRule::Breaker,
                endpoint,
                target: None,
                detail: format!("would change: {}; {limits}", changes.join("; ")),
                reconsider_at_unix_ms: None,
            })
            .collect();
        return Outcome { decision: Decision::Breaker { reason }, state: state.clone(), deferred };
    }
    let mut reason = if previous.is_none() {
        format!("initial plan: {total} endpoints")
    } else {
        let parts: Vec<String> = rules.iter().map(|(r, n)| format!("{r} ({n})")).collect();
        format!("{} endpoint(s) changed: {}", changed_any.len(), parts.join(", "))
    };
    if !zone_notes.is_empty() {
        reason = format!("{reason}; {}", zone_notes.join("; "));
    }
    reason.truncate(dnsplan_common::plan::REASON_BYTES_MAX);
    Outcome { decision: Decision::Publish { endpoints, changed: changed_any, provenance, reason }, state: next, deferred }
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

/// A capacity for people: at most two decimals, no trailing zeros (`3.6`, not
/// `3.5999999999999996`).
fn number(x: f64) -> String {
    let text = format!("{x:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The first endpoint the other zones cannot carry when `zone` is shifted away.
struct Shortfall {
    endpoint: EndpointName,
    remaining: f64,
    needed: f64,
    demand: f64,
}

/// Why zone `zone` cannot be shifted away, if it cannot.
fn capacity_shortfall(config: &PlannerConfig, health: &HealthView, zone: &ZoneId) -> Option<Shortfall> {
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
            return Some(Shortfall { endpoint: ep.name.clone(), remaining, needed, demand: ep.demand() });
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
    deferred: Vec<Deferred>,
}

/// A target the velocity limits kept: what its removal is, and its share of the previous weight.
struct VelocityHold {
    what: &'static str,
    share: f64,
}

#[allow(clippy::too_many_arguments)]
fn decide_endpoint(
    ep: &EndpointConfig,
    prev: Option<&Endpoint>,
    health_of: &impl Fn(&EndpointName, IpAddr) -> Health,
    zones: &Zones<'_>,
    state: &PlannerState,
    config: &PlannerConfig,
    now_ms: u64,
    rng: &mut impl rand::Rng,
) -> Decided {
    let policy = &config.policy;
    let (shifted, restored) = (zones.shifted, zones.restored);
    let prev_weight = |a: IpAddr| prev.and_then(|p| p.targets.iter().find(|t| t.address == a)).map(|t| t.weight);
    // (target, weight, rule, detail, cause)
    let mut rows: Vec<(Target, &'static str, String, Cause)> = Vec::new();
    for t in &ep.targets {
        let h = health_of(&ep.name, t.address);
        let (weight, rule, detail, cause) = if shifted == Some(&t.zone) {
            (0, "zone-impairment", format!("zone {} shifted away", t.zone), Cause::Zone)
        } else if let Some(hold) = zones.held.filter(|z| z.zone == t.zone) {
            (
                prev_weight(t.address).unwrap_or(t.weight),
                "zone-hold",
                format!("zone {} impaired but kept: {}", hold.zone, hold.why),
                Cause::Zone,
            )
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
    let below = (healthy as f64) < policy.fail_open_below.0 * total as f64;
    if below || nothing_left {
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
    let mut velocity_holds: BTreeMap<usize, VelocityHold> = BTreeMap::new();
    let mut window_used = 0.0;
    if let Some(prev) = prev {
        let prev_total: u64 = prev.targets.iter().map(|t| u64::from(t.weight)).sum();
        let used: f64 = state.removals.iter().filter(|r| r.endpoint == ep.name).map(|r| r.fraction).sum();
        window_used = used;
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
                let what = if health_of(&ep.name, target.address) == Health::Down { "down" } else { "weight 0 in the config" };
                velocity_holds.insert(i, VelocityHold { what, share });
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
                velocity_holds.insert(rows.len(), VelocityHold { what: "removed from the config", share });
                rows.push((old.clone(), "velocity", "removed from the config, kept for now (velocity limit)".into(), Cause::Other));
            }
        }
    }

    // Configured targets stay (weight 0 included); dropped ones only while velocity holds them.
    let configured = |a: IpAddr| ep.targets.iter().any(|c| c.address == a);
    let targets = rows.iter().map(|(t, ..)| t.clone()).filter(|t| t.weight > 0 || configured(t.address)).collect();
    let endpoint = Endpoint { ttl_secs: ep.ttl_secs, targets };

    // What the rules held back, target by target.
    let mut deferred = Vec::new();
    let new_total: u64 = endpoint.targets.iter().map(|t| u64::from(t.weight)).sum();
    let mut window: Vec<(u64, f64)> = state.removals.iter().filter(|r| r.endpoint == ep.name).map(|r| (r.at_ms, r.fraction)).collect();
    if removed > 0.0 {
        window.push((now_ms, removed));
    }
    let next_decision_ms = now_ms.saturating_add(config.planner.decide_interval_ms.0);
    for (i, (target, rule, _, _)) in rows.iter().enumerate() {
        let conf = ep.targets.get(i);
        let health = health_of(&ep.name, target.address);
        let entry = |rule, detail, reconsider_at_unix_ms| Deferred {
            rule,
            endpoint: ep.name.clone(),
            target: Some(target.address),
            detail,
            reconsider_at_unix_ms,
        };
        if let Some(hold) = velocity_holds.get(&i) {
            let next_share = f64::from(target.weight) / new_total.max(1) as f64;
            let at = window_opens(&window, next_share, policy, next_decision_ms);
            deferred.push(entry(velocity_rule(policy, window_used), velocity_detail(hold, removed, window_used, policy, at.is_some()), at));
        } else if *rule == "fail-open" && health == Health::Down && target.weight > 0 {
            let detail = if below {
                let need = (policy.fail_open_below.0 * total as f64).ceil();
                format!(
                    "down, still served: {healthy} of {total} targets healthy, below fail_open_below ({:.0}%), so the endpoint serves all of them; until at least {need} are healthy",
                    policy.fail_open_below.0 * 100.0
                )
            } else {
                format!(
                    "down, still served: no other target would be left to serve ({healthy} of {total} healthy), so the endpoint serves all of them; until one is"
                )
            };
            deferred.push(entry(DeferredRule::FailOpen, detail, None));
        } else if *rule == "zone-hold"
            && let Some(hold) = zones.held
        {
            let would = match (health, conf) {
                (Health::Up, Some(c)) => Some(c.weight),
                (Health::Down, _) => Some(0),
                _ => None,
            };
            if would.is_some_and(|w| w != target.weight) {
                let state = if health == Health::Down { "down, still served" } else { "up, not served" };
                deferred.push(entry(hold.rule, format!("{state}: {}", hold.detail), hold.reconsider_at_unix_ms));
            }
        } else if *rule == "zone-impairment"
            && health == Health::Up
            && conf.is_some_and(|c| c.weight > 0)
            && let Some(back_at) = zones.recovering
        {
            let detail = format!(
                "up, not served: zone {} was shifted away and looks healthy again; it comes back after zone_recovery_dwell_secs ({} s) of health",
                target.zone, policy.zone_recovery_dwell_secs.0
            );
            deferred.push(entry(DeferredRule::ZoneRecovery, detail, Some(back_at)));
        }
    }

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
    Decided { endpoint, provenance, causes, removed, deferred }
}

/// Which velocity limit binds: the per-plan one, unless the window has less room left.
fn velocity_rule(policy: &Policy, window_used: f64) -> DeferredRule {
    if policy.removal_fraction_per_plan.0 <= policy.removal_fraction_per_window.0 - window_used {
        DeferredRule::RemovalPerPlan
    } else {
        DeferredRule::RemovalPerWindow
    }
}

fn velocity_detail(hold: &VelocityHold, removed: f64, window_used: f64, policy: &Policy, opens: bool) -> String {
    let pct = |f: f64| format!("{:.0}%", f * 100.0);
    let window_secs = policy.window_secs.0;
    let numbers = match velocity_rule(policy, window_used) {
        DeferredRule::RemovalPerPlan if removed > 0.0 => format!(
            "this plan removes {} of the endpoint's weight; removing it ({}) too would make {}, above removal_fraction_per_plan ({})",
            pct(removed),
            pct(hold.share),
            pct(removed + hold.share),
            pct(policy.removal_fraction_per_plan.0)
        ),
        DeferredRule::RemovalPerPlan => format!(
            "removing it would take {} of the endpoint's weight, above removal_fraction_per_plan ({})",
            pct(hold.share),
            pct(policy.removal_fraction_per_plan.0)
        ),
        _ => format!(
            "{} of the endpoint's weight was removed in the last {window_secs} s{}; removing it ({}) too would make {}, above removal_fraction_per_window ({} per {window_secs} s)",
            pct(window_used),
            if removed > 0.0 { format!(" and this plan removes {}", pct(removed)) } else { String::new() },
            pct(hold.share),
            pct(window_used + removed + hold.share),
            pct(policy.removal_fraction_per_window.0)
        ),
    };
    let until = if opens {
        "until the window's removals leave room for it"
    } else {
        "it alone is more than the velocity limits let a plan remove, so it stays until its health or the config changes"
    };
    format!("{}, still served: {numbers}; {until}", hold.what)
}

/// The first decision, at `next_decision_ms` or later, at which the velocity limits let a
/// removal of `share` through, given the window's removals `(at_ms, fraction)`: the next
/// decision, or the moment enough of them leave the window. `None` if even an empty window
/// would not (the share alone is above a limit).
fn window_opens(window: &[(u64, f64)], share: f64, policy: &Policy, next_decision_ms: u64) -> Option<u64> {
    let window_ms = policy.window_secs.0.saturating_mul(1_000);
    let mut times: Vec<u64> = window.iter().map(|(at, _)| at.saturating_add(window_ms)).filter(|t| *t > next_decision_ms).collect();
    times.push(next_decision_ms);
    times.sort_unstable();
    times.into_iter().find(|&t| {
        // The same test as the decision's: removals younger than the window count.
        let used: f64 = window.iter().filter(|(at, _)| t.saturating_sub(*at) < window_ms).map(|(_, f)| f).sum();
        share <= policy.removal_fraction_per_plan.0.min((policy.removal_fraction_per_window.0 - used).max(0.0)) + 1e-9
    })
}

impl Decision {
    /// The decision as a few lines of text (logs, `dnsplan plans explain`, scenario tests).
    pub fn describe(&self) -> String {
        match self {
            Decision::NoChange => "no change".into(),
            Decision::Breaker { reason } => reason.clone(),
            Decision::Publish { endpoints, provenance, reason, .. } => {
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

#[cfg(test)]
mod tests;
