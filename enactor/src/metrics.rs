//! The enactor's Prometheus metrics. Every series carries the label `enactor="<id>"`, so that
//! several enactors can share one registry (the one-process stack) without colliding.
//!
//! Each metric is registered once per registry, as one family over every enactor in it
//! ([`Families`]); an enactor's [`Metrics`] are its handles into those families. Registering
//! the same names again for a second enactor (a labelled sub-registry each, as before) wrote
//! every `# HELP`/`# TYPE` line once per enactor, which Prometheus refuses to parse.
//!
//! The refusal and abandonment series exist from the start, at 0, for every reason: an alert
//! on `increase()` sees the first refusal (a series born at 1 has no increase), and
//! prometheus-client lists no family without a series, not even its `# TYPE` line.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::hash::Hash;
use std::sync::Arc;

/// The enactor's series' labels: `enactor`, and `dns_zone` for the loop of a zone added to the
/// store (`dns_zones`).
pub type EnactorLabels = dnsplan_common::daemon::DaemonLabels;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HowLabels {
    pub how: &'static str,
}

/// Every reason `Metrics::refused` takes: the plan is invalid, removes too much
/// (`guard`), the store found records its plan does not hold (`content_mismatch`), or the
/// keyring does not trust it (`untrusted`: unsigned, an unknown key, a bad signature, or
/// changes that are not the signed plan's).
pub const REFUSAL_REASONS: [&str; 4] = ["invalid", "removal", "content_mismatch", "untrusted"];

/// Every reason `Metrics::abandoned` takes.
pub const ABANDON_REASONS: [&str; 5] = ["newer_plan", "pruned", "deadline", "store_error", "target_error"];

/// Every outcome `Metrics::target_update` takes: an UPDATE to an RFC 2136 target was
/// `applied`; refused on its prerequisite, and the marker read again then held this very
/// plan (`peer_wrote`: another enactor wrote it first), a newer plan (`prerequisite_failed`:
/// a stale write the target's fence stopped, what an alert may watch), or another older one
/// or other records (`contended`: written again, or left to the next reconcile); or it failed
/// (`error`).
pub const TARGET_UPDATE_OUTCOMES: [&str; 5] = ["applied", "peer_wrote", "prerequisite_failed", "contended", "error"];

/// Every cause `Metrics::target_drift` takes: what a reconcile found on an RFC 2136 server for
/// a name whose marker holds the plan's generation: no address (`missing`), other addresses
/// (`other_addresses`), or the plan's addresses at another TTL (`other_ttl`).
pub const DRIFT_CAUSES: [&str; 3] = ["missing", "other_addresses", "other_ttl"];

fn apply_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

type PerEnactor<M> = Family<EnactorLabels, M>;
type PerEnactorBy<L> = Family<(EnactorLabels, L), Counter>;

/// The enactor metric families of one registry, each registered once, with a series per
/// enactor. Clones share the families.
#[derive(Clone, Debug)]
pub struct Families {
    apply_seconds: Family<EnactorLabels, Histogram, fn() -> Histogram>,
    writes: PerEnactorBy<OutcomeLabels>,
    target_updates: PerEnactorBy<OutcomeLabels>,
    target_drift: PerEnactorBy<ReasonLabels>,
    plans_applied: PerEnactor<Counter>,
    skipped_unchanged: PerEnactor<Counter>,
    plan_reads: PerEnactorBy<HowLabels>,
    plans_abandoned: PerEnactorBy<ReasonLabels>,
    refusals: PerEnactorBy<ReasonLabels>,
    store_retries: PerEnactor<Counter>,
    store_errors: PerEnactor<Counter>,
    verify_failures: PerEnactor<Counter>,
    cleanup_deleted_plans: PerEnactor<Counter>,
    last_applied_generation: PerEnactor<Gauge>,
    latest_generation: PerEnactor<Gauge>,
    lag_generations: PerEnactor<Gauge>,
}

impl Families {
    /// Registers the enactor families in `registry` under `dnsplan_enactor_` (with the
    /// registry's `dnsplan` prefix). Once per registry: every enactor that shares it takes
    /// its [`Metrics`] from the one `Families` ([`Families::enactor`]).
    pub fn register(registry: &mut Registry) -> Families {
        let f = Families {
            apply_seconds: Family::new_with_constructor(apply_histogram),
            writes: Family::default(),
            target_updates: Family::default(),
            target_drift: Family::default(),
            plans_applied: Family::default(),
            skipped_unchanged: Family::default(),
            plan_reads: Family::default(),
            plans_abandoned: Family::default(),
            refusals: Family::default(),
            store_retries: Family::default(),
            store_errors: Family::default(),
            verify_failures: Family::default(),
            cleanup_deleted_plans: Family::default(),
            last_applied_generation: Family::default(),
            latest_generation: Family::default(),
            lag_generations: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("enactor");
        r.register("apply_duration_seconds", "Time to apply one plan fully", f.apply_seconds.clone());
        r.register("endpoint_writes", "Endpoint writes by outcome (stale: a newer plan was already there)", f.writes.clone());
        r.register(
            "target_updates",
            "RFC 2136 UPDATEs sent to the target, by outcome (prerequisite_failed: a newer plan was there, a stale write refused; peer_wrote: another enactor wrote this plan first; contended: the marker or records moved otherwise)",
            f.target_updates.clone(),
        );
        r.register(
            "target_drift",
            "Names a reconcile found changed on the RFC 2136 server behind dnsplan's back (its marker at the plan, its addresses not), by cause; each is written again through the fence",
            f.target_drift.clone(),
        );
        r.register("plans_applied", "Plans applied fully", f.plans_applied.clone());
        r.register(
            "endpoints_skipped_unchanged",
            "Endpoints not written because nothing changed them since the plan applied before",
            f.skipped_unchanged.clone(),
        );
        r.register(
            "plan_reads",
            "Plans read from the store, by how (changes: only what changed since the plan applied before; whole)",
            f.plan_reads.clone(),
        );
        r.register("plans_abandoned", "Plans left unfinished, by reason", f.plans_abandoned.clone());
        r.register("refusals", "Plans refused by the enactor's own checks, by reason", f.refusals.clone());
        r.register("store_retries", "Store calls retried after a transient error", f.store_retries.clone());
        r.register("store_errors", "Store calls that failed after every retry", f.store_errors.clone());
        r.register("verify_failures", "Applied plans the authority did not serve within the verify timeout", f.verify_failures.clone());
        r.register("cleanup_deleted_plans", "Plans deleted by this enactor's cleanups", f.cleanup_deleted_plans.clone());
        r.register("last_applied_generation", "Last generation applied fully", f.last_applied_generation.clone());
        r.register("latest_generation", "Latest published generation seen", f.latest_generation.clone());
        r.register("lag_generations", "Generations behind the latest plan", f.lag_generations.clone());
        f
    }

    /// The metrics of the enactor `id`: its series in every family, created now (at 0).
    /// Asking twice for one id gives handles to the same series.
    pub fn enactor(&self, id: &str) -> Metrics {
        self.labelled(EnactorLabels::new("enactor", Arc::new(id.to_owned()), None))
    }

    /// The metrics of enactor `id`'s loop on zone `zone` (one of its `dns_zones`): its series
    /// labelled `dns_zone` too.
    pub fn zone_enactor(&self, id: &str, zone: &str) -> Metrics {
        self.labelled(EnactorLabels::new("enactor", Arc::new(id.to_owned()), Some(zone)))
    }

    fn labelled(&self, label: EnactorLabels) -> Metrics {
        let m = Metrics {
            apply_seconds: self.apply_seconds.get_or_create(&label).clone(),
            writes: ByLabel::new(&self.writes, &label),
            target_updates: ByLabel::new(&self.target_updates, &label),
            target_drift: ByLabel::new(&self.target_drift, &label),
            plans_applied: self.plans_applied.get_or_create(&label).clone(),
            skipped_unchanged: self.skipped_unchanged.get_or_create(&label).clone(),
            plan_reads: ByLabel::new(&self.plan_reads, &label),
            plans_abandoned: ByLabel::new(&self.plans_abandoned, &label),
            refusals: ByLabel::new(&self.refusals, &label),
            store_retries: self.store_retries.get_or_create(&label).clone(),
            store_errors: self.store_errors.get_or_create(&label).clone(),
            verify_failures: self.verify_failures.get_or_create(&label).clone(),
            cleanup_deleted_plans: self.cleanup_deleted_plans.get_or_create(&label).clone(),
            last_applied_generation: self.last_applied_generation.get_or_create(&label).clone(),
            latest_generation: self.latest_generation.get_or_create(&label).clone(),
            lag_generations: self.lag_generations.get_or_create(&label).clone(),
        };
        for reason in REFUSAL_REASONS {
            let _ = m.refusals.get_or_create(&ReasonLabels { reason });
        }
        for reason in ABANDON_REASONS {
            let _ = m.plans_abandoned.get_or_create(&ReasonLabels { reason });
        }
        for outcome in TARGET_UPDATE_OUTCOMES {
            let _ = m.target_updates.get_or_create(&OutcomeLabels { outcome });
        }
        for reason in DRIFT_CAUSES {
            let _ = m.target_drift.get_or_create(&ReasonLabels { reason });
        }
        m
    }
}

/// One enactor's counters of a family with a second label (outcome, reason, how): the
/// family shared by every enactor of the registry, with this enactor's label.
#[derive(Clone, Debug)]
pub struct ByLabel<L> {
    family: PerEnactorBy<L>,
    enactor: EnactorLabels,
}

impl<L: Clone + Hash + Eq> ByLabel<L> {
    fn new(family: &PerEnactorBy<L>, enactor: &EnactorLabels) -> ByLabel<L> {
        ByLabel { family: family.clone(), enactor: enactor.clone() }
    }

    /// This enactor's counter for `labels` (a handle: it counts into the family).
    pub fn get_or_create(&self, labels: &L) -> Counter {
        self.family.get_or_create(&(self.enactor.clone(), labels.clone())).clone()
    }
}

/// One enactor's metrics: handles into its registry's [`Families`], every series labelled
/// `enactor="<id>"`.
#[derive(Debug)]
pub struct Metrics {
    /// Time to apply one plan fully (verification excluded).
    pub apply_seconds: Histogram,
    /// Endpoint writes by outcome: `switched`, `unchanged`, `stale` (a newer plan was there).
    pub writes: ByLabel<OutcomeLabels>,
    /// UPDATEs sent to an RFC 2136 target, by outcome (`TARGET_UPDATE_OUTCOMES`).
    pub target_updates: ByLabel<OutcomeLabels>,
    /// Names found drifted on an RFC 2136 target, by cause (`DRIFT_CAUSES`).
    pub target_drift: ByLabel<ReasonLabels>,
    pub plans_applied: Counter,
    /// Endpoints not written because nothing changed them since the base plan.
    pub skipped_unchanged: Counter,
    /// Plans read from the store, by how: `changes` (only what changed since the base plan)
    /// or `whole`.
    pub plan_reads: ByLabel<HowLabels>,
    /// Plans left unfinished, by reason: `newer_plan`, `pruned`, `deadline`, `store_error`,
    /// `target_error` (an RFC 2136 target failed or refused).
    pub plans_abandoned: ByLabel<ReasonLabels>,
    /// Plans refused, by reason: `invalid`, `removal`, `content_mismatch`.
    pub refusals: ByLabel<ReasonLabels>,
    pub store_retries: Counter,
    pub store_errors: Counter,
    pub verify_failures: Counter,
    pub cleanup_deleted_plans: Counter,
    pub last_applied_generation: Gauge,
    pub latest_generation: Gauge,
    /// Generations between the latest plan and the last one this enactor fully applied.
    pub lag_generations: Gauge,
}

impl Metrics {
    /// Registers the enactor families in `registry` and returns the metrics of the one
    /// enactor `id` (the daemon, a test). Several enactors in one registry take theirs from
    /// one [`Families`] instead: calling this twice on one registry registers every name
    /// twice.
    pub fn register(registry: &mut Registry, id: &str) -> Metrics {
        Families::register(registry).enactor(id)
    }

    pub fn write(&self, outcome: &'static str) {
        self.writes.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    pub fn target_update(&self, outcome: &'static str) {
        debug_assert!(TARGET_UPDATE_OUTCOMES.contains(&outcome), "{outcome} is not in TARGET_UPDATE_OUTCOMES");
        self.target_updates.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// UPDATEs with `outcome` so far (tests count the target's refusals with it).
    pub fn target_updates(&self, outcome: &'static str) -> u64 {
        self.target_updates.get_or_create(&OutcomeLabels { outcome }).get()
    }

    pub fn plan_read(&self, how: &'static str) {
        self.plan_reads.get_or_create(&HowLabels { how }).inc();
    }

    pub fn abandoned(&self, reason: &'static str) {
        debug_assert!(ABANDON_REASONS.contains(&reason), "{reason} is not in ABANDON_REASONS");
        self.plans_abandoned.get_or_create(&ReasonLabels { reason }).inc();
    }

    pub fn refused(&self, reason: &'static str) {
        debug_assert!(REFUSAL_REASONS.contains(&reason), "{reason} is not in REFUSAL_REASONS");
        self.refusals.get_or_create(&ReasonLabels { reason }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every refusal and abandonment reason is a series at 0 before anything happened.
    #[test]
    fn reasons_exist_at_zero() {
        let mut registry = Registry::with_prefix("dnsplan");
        let metrics = Metrics::register(&mut registry, "enactor-a");
        metrics.refused("removal");
        let text = dnsplan_common::daemon::metrics_text(&registry);
        for (family, reasons) in [("refusals", &REFUSAL_REASONS[..]), ("plans_abandoned", &ABANDON_REASONS[..])] {
            for reason in reasons {
                let count = if (family, *reason) == ("refusals", "removal") { 1 } else { 0 };
                let want = format!("dnsplan_enactor_{family}_total{{enactor=\"enactor-a\",reason=\"{reason}\"}} {count}");
                assert!(text.lines().any(|l| l == want), "want {want:?} in\n{text}");
            }
        }
    }

    /// Enactors sharing one registry, and one enactor's loops on several zones, are one family
    /// per metric, each enactor (and zone) a series of it: every `# HELP` and `# TYPE` line
    /// appears once, as Prometheus requires. With a `Metrics::register` per enactor on one
    /// registry (how `dnsplan up` registered its three enactors), or per zone in a sub-registry
    /// labelled `dns_zone` (how the daemon registered its `dns_zones`), each appeared once per
    /// enactor or zone.
    #[test]
    fn enactors_sharing_a_registry_are_one_family_each() {
        let mut registry = Registry::with_prefix("dnsplan");
        let families = Families::register(&mut registry);
        let (a, b) = (families.enactor("enactor-a"), families.enactor("enactor-b"));
        let (zone_a, zone_b) = (families.zone_enactor("enactor-z", "a.test."), families.zone_enactor("enactor-z", "b.test."));
        a.plans_applied.inc();
        b.refused("invalid");
        a.apply_seconds.observe(0.5);
        zone_b.plans_applied.inc();
        zone_a.refused("removal");
        let text = dnsplan_common::daemon::metrics_text(&registry);
        dnsplan_tests::exposition::assert_each_family_described_once(&text);
        for want in [
            "dnsplan_enactor_plans_applied_total{enactor=\"enactor-a\"} 1",
            "dnsplan_enactor_plans_applied_total{enactor=\"enactor-b\"} 0",
            "dnsplan_enactor_refusals_total{enactor=\"enactor-b\",reason=\"invalid\"} 1",
            "dnsplan_enactor_refusals_total{enactor=\"enactor-a\",reason=\"invalid\"} 0",
            "dnsplan_enactor_apply_duration_seconds_count{enactor=\"enactor-a\"} 1",
            "dnsplan_enactor_apply_duration_seconds_count{enactor=\"enactor-b\"} 0",
            "dnsplan_enactor_plans_applied_total{enactor=\"enactor-z\",dns_zone=\"b.test.\"} 1",
            "dnsplan_enactor_plans_applied_total{enactor=\"enactor-z\",dns_zone=\"a.test.\"} 0",
            "dnsplan_enactor_refusals_total{enactor=\"enactor-z\",dns_zone=\"a.test.\",reason=\"removal\"} 1",
        ] {
            assert!(text.lines().any(|l| l == want), "want {want:?} in\n{text}");
        }
    }
}
