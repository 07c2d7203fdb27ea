//! The planner's Prometheus metrics (`dnsplan_planner_*`), labelled with the planner's id.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::borrow::Cow;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

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
        m
    }

    /// Counts one probe: `ok`, `fail` (the target failed it) or `inconclusive` (the checker
    /// could not probe: out of descriptors, buffers or local addresses).
    pub fn probe(&self, result: &'static str) {
        self.probes.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn decision(&self, kind: &'static str) {
        self.decisions.get_or_create(&KindLabels { kind }).inc();
    }
}
