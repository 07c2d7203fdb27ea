//! The planner's Prometheus metrics (`dnsplan_planner_*`), labelled with the planner's id,
//! and with `dns_zone` for the zones of the config's `[[zone]]` tables: each metric is one
//! family, a series per zone (`Metrics::for_zone`).
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
use std::hash::Hash;
use std::sync::Arc;

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

/// The planner's series' labels: `planner`, and `dns_zone` for the config's `[[zone]]` tables.
pub type PlannerLabels = dnsplan_common::daemon::DaemonLabels;

type ByZone<M> = Family<PlannerLabels, M>;
type ByZoneAnd<L, M> = Family<(PlannerLabels, L), M>;

/// The planner metric families of one registry, each registered once (Prometheus refuses a
/// name described twice), with a series per planned zone. Clones share the families.
#[derive(Clone, Debug)]
struct Families {
    decisions: ByZoneAnd<KindLabels, Counter>,
    plans_published: ByZone<Counter>,
    publish_conflicts: ByZone<Counter>,
    breaker_trips: ByZone<Counter>,
    active: ByZone<Gauge>,
    paused: ByZone<Gauge>,
    zone_shifted: ByZone<Gauge>,
    targets: ByZoneAnd<KindLabels, Gauge>,
    last_published_generation: ByZone<Gauge>,
    deferred: ByZoneAnd<RuleLabels, Gauge>,
}

/// One zone's series of a family with a second label (kind, rule, result): the family shared
/// by every zone of the registry, with this zone's labels.
#[derive(Clone, Debug)]
pub struct ByLabel<L, M> {
    family: ByZoneAnd<L, M>,
    zone: PlannerLabels,
}

impl<L: Clone + Hash + Eq, M: Clone + prometheus_client::metrics::TypedMetric + Default> ByLabel<L, M> {
    /// This zone's metric for `labels` (a handle: it counts into the family).
    pub fn get_or_create(&self, labels: &L) -> M {
        self.family.get_or_create(&(self.zone.clone(), labels.clone())).clone()
    }
}

/// One zone's planner metrics: handles into its registry's families, labelled `planner` (and
/// `dns_zone` for a `[[zone]]`), and the process's health-probe metrics, which every zone
/// shares (the probes are the process's, one set for every zone's targets).
#[derive(Debug)]
pub struct Metrics {
    /// Decisions by kind: `no_change`, `publish`, `breaker`.
    pub decisions: ByLabel<KindLabels, Counter>,
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
    pub probes: ByLabel<ResultLabels, Counter>,
    /// Targets by verdict: `up`, `down`, `unknown`.
    pub targets: ByLabel<KindLabels, Gauge>,
    pub last_published_generation: Gauge,
    /// Decisions the last decision's rules held back, by rule (`DeferredRule::as_str`).
    pub deferred: ByLabel<RuleLabels, Gauge>,
    /// Health probes in flight now.
    pub probes_in_flight: Gauge,
    /// Targets whose last probe was slow: their probes take no `probe_concurrency` permit.
    pub probe_slow_targets: Gauge,
    /// How late each probe started after its scheduled time.
    pub probe_lag_seconds: Histogram,
    families: Families,
}

impl Metrics {
    /// Registers the planner's metrics in `registry` (once per registry) and returns those of
    /// planner `id`'s first zone; `for_zone` gives each further zone's.
    pub fn register(registry: &mut Registry, id: &str) -> Metrics {
        let f = Families {
            decisions: Family::default(),
            plans_published: Family::default(),
            publish_conflicts: Family::default(),
            breaker_trips: Family::default(),
            active: Family::default(),
            paused: Family::default(),
            zone_shifted: Family::default(),
            targets: Family::default(),
            last_published_generation: Family::default(),
            deferred: Family::default(),
        };
        let probes: ByZoneAnd<ResultLabels, Counter> = Family::default();
        let (probes_in_flight, probe_slow_targets) = (Gauge::default(), Gauge::default());
        let probe_lag_seconds = Histogram::new([0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]);
        let planner = registry.sub_registry_with_prefix("planner");
        planner.register("decisions", "Decisions by kind", f.decisions.clone());
        planner.register("plans_published", "Plans published", f.plans_published.clone());
        planner.register(
            "publish_conflicts",
            "Publishes that lost the compare-and-swap and were decided again",
            f.publish_conflicts.clone(),
        );
        planner.register("breaker_trips", "Times the breaker stopped a mass change", f.breaker_trips.clone());
        planner.register("active", "1 while this planner holds the lease", f.active.clone());
        planner.register("paused", "1 while automation is paused", f.paused.clone());
        planner.register("zone_shifted", "1 while an availability zone is shifted away", f.zone_shifted.clone());
        planner.register("probes", "Health probes by result", probes.clone());
        planner.register("targets", "Targets by health verdict", f.targets.clone());
        planner.register(
            "last_published_generation",
            "Generation of the last plan this planner published",
            f.last_published_generation.clone(),
        );
        planner.register(
            "deferred",
            "Decisions the last decision's rules held back (a dead target still served, a change not published), by rule",
            f.deferred.clone(),
        );
        let r = planner.sub_registry_with_label((Cow::Borrowed("planner"), Cow::Owned(id.to_owned())));
        r.register("probes_in_flight", "Health probes in flight", probes_in_flight.clone());
        r.register(
            "probe_slow_targets",
            "Targets whose last probe took longer than 100 ms (or timed out): their probes run outside probe_concurrency, so they cannot delay the others",
            probe_slow_targets.clone(),
        );
        r.register(
            "probe_lag_seconds",
            "How late each health probe started after its scheduled time (waiting for a probe_concurrency permit, or its own previous probe)",
            probe_lag_seconds.clone(),
        );
        let first = PlannerLabels::new("planner", Arc::new(id.to_owned()), None);
        let probes = ByLabel { family: probes, zone: first.clone() };
        for result in PROBE_RESULTS {
            let _ = probes.get_or_create(&ResultLabels { result });
        }
        Metrics::labelled(f, first, probes, probes_in_flight, probe_slow_targets, probe_lag_seconds)
    }

    /// The metrics of the zone `dns_zone` of a `[[zone]]` table: its series labelled
    /// `dns_zone` too, in the same families; the probe metrics are the process's.
    pub fn for_zone(&self, dns_zone: &str) -> Metrics {
        let zone = PlannerLabels::new("planner", self.decisions.zone.id.clone(), Some(dns_zone));
        Metrics::labelled(
            self.families.clone(),
            zone,
            self.probes.clone(),
            self.probes_in_flight.clone(),
            self.probe_slow_targets.clone(),
            self.probe_lag_seconds.clone(),
        )
    }

    fn labelled(
        f: Families,
        zone: PlannerLabels,
        probes: ByLabel<ResultLabels, Counter>,
        probes_in_flight: Gauge,
        probe_slow_targets: Gauge,
        probe_lag_seconds: Histogram,
    ) -> Metrics {
        let counter = |family: &ByZone<Counter>| family.get_or_create(&zone).clone();
        let gauge = |family: &ByZone<Gauge>| family.get_or_create(&zone).clone();
        let (plans_published, publish_conflicts, breaker_trips) =
            (counter(&f.plans_published), counter(&f.publish_conflicts), counter(&f.breaker_trips));
        let (active, paused, zone_shifted, last_published_generation) =
            (gauge(&f.active), gauge(&f.paused), gauge(&f.zone_shifted), gauge(&f.last_published_generation));
        let m = Metrics {
            decisions: ByLabel { family: f.decisions.clone(), zone: zone.clone() },
            plans_published,
            publish_conflicts,
            breaker_trips,
            active,
            paused,
            zone_shifted,
            probes,
            targets: ByLabel { family: f.targets.clone(), zone: zone.clone() },
            last_published_generation,
            deferred: ByLabel { family: f.deferred.clone(), zone },
            probes_in_flight,
            probe_slow_targets,
            probe_lag_seconds,
            families: f,
        };
        for kind in DECISION_KINDS {
            let _ = m.decisions.get_or_create(&KindLabels { kind });
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

    /// A second zone's series are in the same families, labelled `dns_zone`: every `# HELP`
    /// and `# TYPE` line once; the probe series are the process's, not a zone's.
    #[test]
    fn zones_are_one_family_each() {
        let mut registry = Registry::with_prefix("dnsplan");
        let first = Metrics::register(&mut registry, "p");
        let shop = first.for_zone("shop.test.");
        shop.plans_published.inc();
        shop.decision("publish");
        first.active.set(1);
        shop.probe("ok");
        let text = dnsplan_common::daemon::metrics_text(&registry);
        dnsplan_tests::exposition::assert_each_family_described_once(&text);
        for want in [
            "dnsplan_planner_plans_published_total{planner=\"p\",dns_zone=\"shop.test.\"} 1",
            "dnsplan_planner_plans_published_total{planner=\"p\"} 0",
            "dnsplan_planner_decisions_total{planner=\"p\",dns_zone=\"shop.test.\",kind=\"publish\"} 1",
            "dnsplan_planner_active{planner=\"p\"} 1",
            "dnsplan_planner_active{planner=\"p\",dns_zone=\"shop.test.\"} 0",
            "dnsplan_planner_probes_total{planner=\"p\",result=\"ok\"} 1",
        ] {
            assert!(text.lines().any(|l| l == want), "want {want:?} in\n{text}");
        }
    }
}
