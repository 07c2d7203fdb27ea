//! Prometheus metrics of the authority, exposed as text on the control API's `/metrics`.
//!
//! Names follow Prometheus conventions (`dnsplan_` prefix, `_total` counters, `_seconds`,
//! `_bytes`). The per-endpoint active-generation gauge has one series per managed endpoint
//! and is only exported while there are at most `PER_ENDPOINT_SERIES_MAX` of them; above
//! that, the min and max gauges remain.

use crate::answer::{Outcome, Transport};
use crate::snapshot::Snapshot;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Most per-endpoint series. Ten thousand series is what one scrape target can carry
/// comfortably; a million-name DNS zone would swamp a Prometheus server.
pub const PER_ENDPOINT_SERIES_MAX: usize = 10_000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueryLabels {
    pub qtype: String,
    pub rcode: String,
    pub transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApplyLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: String,
}

pub struct Metrics {
    registry: Registry,
    queries: Family<QueryLabels, Counter>,
    truncated: Counter,
    response_bytes: Histogram,
    pub applies: Family<ApplyLabels, Counter>,
    snapshot_swap_seconds: Histogram,
    active_generation: Family<EndpointLabels, Gauge>,
    active_generation_min: Gauge,
    active_generation_max: Gauge,
    managed_endpoints: Gauge,
    applied_changes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("dnsplan");
        let queries = Family::<QueryLabels, Counter>::default();
        registry.register("dns_queries", "DNS queries answered, by query type, response code and transport", queries.clone());
        let truncated = Counter::default();
        registry.register("dns_truncated", "UDP answers sent with TC=1 because they did not fit", truncated.clone());
        let response_bytes = Histogram::new(exponential_buckets(32.0, 2.0, 12));
        registry.register("dns_response_bytes", "Size of DNS responses in bytes", response_bytes.clone());
        let applies = Family::<ApplyLabels, Counter>::default();
        registry.register("store_applies", "Applies received through the control API, by outcome", applies.clone());
        let snapshot_swap_seconds = Histogram::new(exponential_buckets(0.000_1, 2.0, 16));
        registry.register(
            "snapshot_swap_seconds",
            "Time to build and swap the serving snapshot after a change",
            snapshot_swap_seconds.clone(),
        );
        let active_generation = Family::<EndpointLabels, Gauge>::default();
        registry.register("active_generation", "Generation each managed endpoint serves", active_generation.clone());
        let active_generation_min = Gauge::default();
        registry.register("active_generation_min", "Oldest generation any managed endpoint serves", active_generation_min.clone());
        let active_generation_max = Gauge::default();
        registry.register("active_generation_max", "Newest generation any managed endpoint serves", active_generation_max.clone());
        let managed_endpoints = Gauge::default();
        registry.register("managed_endpoints", "Managed endpoints being served", managed_endpoints.clone());
        let applied_changes = Gauge::default();
        registry.register("applied_changes", "The store's applied-change counter (the SOA serial's source)", applied_changes.clone());
        Metrics {
            registry,
            queries,
            truncated,
            response_bytes,
            applies,
            snapshot_swap_seconds,
            active_generation,
            active_generation_min,
            active_generation_max,
            managed_endpoints,
            applied_changes,
        }
    }

    pub fn observe_query(&self, outcome: &Outcome, transport: Transport) {
        let qtype = outcome.qtype.map_or_else(|| "none".to_owned(), |t| t.to_string());
        self.queries.get_or_create(&QueryLabels { qtype, rcode: outcome.rcode.to_str().to_owned(), transport: transport.as_str() }).inc();
        self.response_bytes.observe(outcome.bytes as f64);
        if outcome.truncated {
            self.truncated.inc();
        }
    }

    pub fn observe_snapshot(&self, snapshot: &Snapshot, build_seconds: f64) {
        self.snapshot_swap_seconds.observe(build_seconds);
        self.managed_endpoints.set(snapshot.managed_count() as i64);
        self.applied_changes.set(snapshot.applied_changes as i64);
        let (min, max) = snapshot.managed().map(|m| m.generation.0 as i64).fold((i64::MAX, 0), |(lo, hi), g| (lo.min(g), hi.max(g)));
        self.active_generation_min.set(if max == 0 { 0 } else { min });
        self.active_generation_max.set(max);
        self.active_generation.clear();
        if snapshot.managed_count() <= PER_ENDPOINT_SERIES_MAX {
            for m in snapshot.managed() {
                if let Some(endpoint) = &m.endpoint {
                    self.active_generation.get_or_create(&EndpointLabels { endpoint: endpoint.to_string() }).set(m.generation.0 as i64);
                }
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        dnsplan_common::daemon::metrics_text(&self.registry)
    }

    /// This registry's metrics followed by `extra`'s, as one exposition.
    pub fn render_with(&self, extra: &prometheus_client::registry::Registry) -> String {
        dnsplan_common::daemon::metrics_text_of(&[&self.registry, extra])
    }
}
