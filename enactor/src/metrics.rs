//! The enactor's Prometheus metrics. Every series carries the label `enactor="<id>"`, so that
//! several enactors can share one registry (the one-process stack) without colliding.
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
use std::borrow::Cow;

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
/// (`guard`), or the store found records its plan does not hold (`content_mismatch`).
pub const REFUSAL_REASONS: [&str; 3] = ["invalid", "removal", "content_mismatch"];

/// Every reason `Metrics::abandoned` takes.
pub const ABANDON_REASONS: [&str; 4] = ["newer_plan", "pruned", "deadline", "store_error"];

#[derive(Debug)]
pub struct Metrics {
    /// Time to apply one plan fully (verification excluded).
    pub apply_seconds: Histogram,
    /// Endpoint writes by outcome: `switched`, `unchanged`, `stale` (a newer plan was there).
    pub writes: Family<OutcomeLabels, Counter>,
    pub plans_applied: Counter,
    /// Endpoints not written because nothing changed them since the base plan.
    pub skipped_unchanged: Counter,
    /// Plans read from the store, by how: `changes` (only what changed since the base plan)
    /// or `whole`.
    pub plan_reads: Family<HowLabels, Counter>,
    /// Plans left unfinished, by reason: `newer_plan`, `pruned`, `deadline`, `store_error`.
    pub plans_abandoned: Family<ReasonLabels, Counter>,
    /// Plans refused, by reason: `invalid`, `removal`.
    pub refusals: Family<ReasonLabels, Counter>,
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
    /// Registers the enactor's metrics in `registry` under `dnsplan_enactor_`, labelled with `id`.
    pub fn register(registry: &mut Registry, id: &str) -> Metrics {
        let m = Metrics {
            apply_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            writes: Family::default(),
            plans_applied: Counter::default(),
            skipped_unchanged: Counter::default(),
            plan_reads: Family::default(),
            plans_abandoned: Family::default(),
            refusals: Family::default(),
            store_retries: Counter::default(),
            store_errors: Counter::default(),
            verify_failures: Counter::default(),
            cleanup_deleted_plans: Counter::default(),
            last_applied_generation: Gauge::default(),
            latest_generation: Gauge::default(),
            lag_generations: Gauge::default(),
        };
        let r = registry.sub_registry_with_prefix("enactor").sub_registry_with_label((Cow::Borrowed("enactor"), Cow::Owned(id.to_owned())));
        r.register("apply_duration_seconds", "Time to apply one plan fully", m.apply_seconds.clone());
        r.register("endpoint_writes", "Endpoint writes by outcome (stale: a newer plan was already there)", m.writes.clone());
        r.register("plans_applied", "Plans applied fully", m.plans_applied.clone());
        r.register(
            "endpoints_skipped_unchanged",
            "Endpoints not written because nothing changed them since the plan applied before",
            m.skipped_unchanged.clone(),
        );
        r.register(
            "plan_reads",
            "Plans read from the store, by how (changes: only what changed since the plan applied before; whole)",
            m.plan_reads.clone(),
        );
        r.register("plans_abandoned", "Plans left unfinished, by reason", m.plans_abandoned.clone());
        r.register("refusals", "Plans refused by the enactor's own checks, by reason", m.refusals.clone());
        r.register("store_retries", "Store calls retried after a transient error", m.store_retries.clone());
        r.register("store_errors", "Store calls that failed after every retry", m.store_errors.clone());
        r.register("verify_failures", "Applied plans the authority did not serve within the verify timeout", m.verify_failures.clone());
        r.register("cleanup_deleted_plans", "Plans deleted by this enactor's cleanups", m.cleanup_deleted_plans.clone());
        r.register("last_applied_generation", "Last generation applied fully", m.last_applied_generation.clone());
        r.register("latest_generation", "Latest published generation seen", m.latest_generation.clone());
        r.register("lag_generations", "Generations behind the latest plan", m.lag_generations.clone());
        for reason in REFUSAL_REASONS {
            let _ = m.refusals.get_or_create(&ReasonLabels { reason });
        }
        for reason in ABANDON_REASONS {
            let _ = m.plans_abandoned.get_or_create(&ReasonLabels { reason });
        }
        m
    }

    pub fn write(&self, outcome: &'static str) {
        self.writes.get_or_create(&OutcomeLabels { outcome }).inc();
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
}
