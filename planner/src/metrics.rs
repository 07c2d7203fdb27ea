//! The planner's Prometheus metrics (`dnsplan_planner_*`), labelled with the planner's id.
//!
//! The decision and probe series exist from the start, at 0, for every kind and result, so
//! an alert on `increase()` sees the first one (a series born at 1 has no increase), and so
//! does `dnsplan_planner_deferred{rule}` for every rule that can hold a decision back.

use crate::decide::{Deferred, DeferredRule};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::borrow::Cow;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// Every kind `Metrics::decision` takes.
pub const DECISION_KINDS: [&str; 3] = ["no_change", "publish", "breaker"];

/// Every result `Metrics::probe` takes.
pub const PROBE_RESULTS: [&str; 3] = ["ok", "fail", "inconclusive"];

#[derive(Debug)]
pub struct Metrics {
    /// Decisions by kind: `no_change`, `publish`, `breaker`.
    pub decisions: Family<KindLabels, Counter>,
    pub plans_published: Counter,
    /// Publishes that lost the CAS to another writer (then re-read and re-decided).
    pub publish_conflicts: Counter,
    pub breaker_trips: Counter,
    /// 1 while this planner holds the lease and acts; 0 on standby.
    pub active: Gauge,
    /// 1 while automation is paused (by an operator or by the breaker).
    pub paused: Gauge,
    /// 1 while a zone is shifted away.
    pub zone_shifted: Gauge,
    pub probes: Family<ResultLabels, Counter>,
    /// Targets by verdict: `up`, `down`, `unknown`.
    pub targets: Family<KindLabels, Gauge>,
    pub last_published_generation: Gauge,
    /// Decisions the last decision's rules held back, by rule (`DeferredRule::as_str`).
    pub deferred: Family<RuleLabels, Gauge>,
    /// Health probes in flight now.
    pub probes_in_flight: Gauge,
    /// Targets whose last probe was slow: their probes take no `probe_concurrency` permit.
    pub probe_slow_targets: Gauge,
    /// How late each probe started after its scheduled time.
    pub probe_lag_seconds: Histogram,
}

impl Metrics {
    pub fn register(registry: &mut Registry, id: &str) -> Metrics {
        let m = Metrics {
            decisions: Family::default(),
            plans_published: Counter::default(),
            publish_conflicts: Counter::default(),
            breaker_trips: Counter::default(),
            active: Gauge::default(),
            paused: Gauge::default(),
            zone_shifted: Gauge::default(),
            probes: Family::default(),
            targets: Family::default(),
            last_published_generation: Gauge::default(),
            deferred: Family::default(),
            probes_in_flight: Gauge::default(),
            probe_slow_targets: Gauge::default(),
            probe_lag_seconds: Histogram::new([0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
        };
        let r = registry.sub_registry_with_prefix("planner").sub_registry_with_label((Cow::Borrowed("planner"), Cow::Owned(id.to_owned())));
        r.register("decisions", "Decisions by kind", m.decisions.clone());
        r.register("plans_published", "Plans published", m.plans_published.clone());
        r.register("publish_conflicts", "Publishes that lost the compare-and-swap and were decided again", m.publish_conflicts.clone());
        r.register("breaker_trips", "Times the breaker stopped a mass change", m.breaker_trips.clone());
        r.register("active", "1 while this planner holds the lease", m.active.clone());
        r.register("paused", "1 while automation is paused", m.paused.clone());
        r.register("zone_shifted", "1 while an availability zone is shifted away", m.zone_shifted.clone());
        r.register("probes", "Health probes by result", m.probes.clone());
        r.register("targets", "Targets by health verdict", m.targets.clone());
        r.register("last_published_generation", "Generation of the last plan this planner published", m.last_published_generation.clone());
        r.register(
            "deferred",
            "Decisions the last decision's rules held back (a dead target still served, a change not published), by rule",
            m.deferred.clone(),
        );
        r.register("probes_in_flight", "Health probes in flight", m.probes_in_flight.clone());
        r.register(
            "probe_slow_targets",
            "Targets whose last probe took longer than 100 ms (or timed out): their probes run outside probe_concurrency, so they cannot delay the others",
            m.probe_slow_targets.clone(),
        );
        r.register(
            "probe_lag_seconds",
            "How late each health probe started after its scheduled time (waiting for a probe_concurrency permit, or its own previous probe)",
            m.probe_lag_seconds.clone(),
        );
        for kind in DECISION_KINDS {
            let _ = m.decisions.get_or_create(&KindLabels { kind });
        }
        for result in PROBE_RESULTS {
            let _ = m.probes.get_or_create(&ResultLabels { result });
        }
        m.set_deferred(&[]);
        m
    }

    /// Sets `deferred{rule}` to the count of each rule in `deferred`, every rule included.
    pub fn set_deferred(&self, deferred: &[Deferred]) {
        for rule in DeferredRule::ALL {
            let count = deferred.iter().filter(|d| d.rule == rule).count();
            self.deferred.get_or_create(&RuleLabels { rule: rule.as_str() }).set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// Counts one probe: `ok`, `fail` (the target failed it) or `inconclusive` (the checker
    /// could not probe: out of descriptors, buffers or local addresses).
    pub fn probe(&self, result: &'static str) {
        debug_assert!(PROBE_RESULTS.contains(&result), "{result} is not in PROBE_RESULTS");
        self.probes.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn decision(&self, kind: &'static str) {
        debug_assert!(DECISION_KINDS.contains(&kind), "{kind} is not in DECISION_KINDS");
        self.decisions.get_or_create(&KindLabels { kind }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every decision kind, probe result and deferral rule is a series at 0 before anything
    /// happened.
    #[test]
    fn kinds_and_results_exist_at_zero() {
        let mut registry = Registry::with_prefix("dnsplan");
        let metrics = Metrics::register(&mut registry, "p");
        metrics.probe("inconclusive");
        let text = dnsplan_common::daemon::metrics_text(&registry);
        let series = DECISION_KINDS
            .iter()
            .map(|kind| (format!("dnsplan_planner_decisions_total{{planner=\"p\",kind=\"{kind}\"}}"), 0))
            .chain(
                PROBE_RESULTS
                    .iter()
                    .map(|r| (format!("dnsplan_planner_probes_total{{planner=\"p\",result=\"{r}\"}}"), u8::from(*r == "inconclusive"))),
            )
            .chain(DeferredRule::ALL.iter().map(|r| (format!("dnsplan_planner_deferred{{planner=\"p\",rule=\"{r}\"}}"), 0)));
        for (name, count) in series {
            let want = format!("{name} {count}");
            assert!(text.lines().any(|l| l == want), "want {want:?} in\n{text}");
        }
    }

    /// The deferral gauge counts by rule, and a rule no longer deferring goes back to 0.
    #[test]
    fn deferred_counts_by_rule() {
        let mut registry = Registry::with_prefix("dnsplan");
        let metrics = Metrics::register(&mut registry, "p");
        let held = |rule| Deferred {
            rule,
            endpoint: dnsplan_common::DnsName::parse("api.example.test.").expect("name"),
            target: None,
            detail: String::new(),
            reconsider_at_unix_ms: None,
        };
        let count = |rule: &str| {
            let text = dnsplan_common::daemon::metrics_text(&registry);
            let prefix = format!("dnsplan_planner_deferred{{planner=\"p\",rule=\"{rule}\"}} ");
            text.lines().find_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_owned)).unwrap_or_default()
        };
        metrics.set_deferred(&[held(DeferredRule::FailOpen), held(DeferredRule::FailOpen), held(DeferredRule::RemovalPerPlan)]);
        assert_eq!((count("fail_open"), count("removal_per_plan"), count("breaker")), ("2".into(), "1".into(), "0".into()));
        metrics.set_deferred(&[held(DeferredRule::RemovalPerWindow)]);
        assert_eq!((count("fail_open"), count("removal_per_plan"), count("removal_per_window")), ("0".into(), "0".into(), "1".into()));
    }
}
