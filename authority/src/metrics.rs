//! Prometheus metrics of the authority, exposed as text on the control API's `/metrics`.
//!
//! Names follow Prometheus conventions (`dnsplan_` prefix, `_total` counters, `_seconds`,
//! `_bytes`). The per-endpoint active-generation gauge has one series per managed endpoint
//! and is only exported while there are at most `PER_ENDPOINT_SERIES_MAX` of them; above
//! that, the min and max gauges remain.

use crate::answer::{Malformed, Outcome, Transport};
use crate::snapshot::Snapshot;
use dnsplan_common::store::ActiveDelta;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Most per-endpoint series. Ten thousand series is what one scrape target can carry
/// comfortably; a million-name DNS zone would swamp a Prometheus server.
pub const PER_ENDPOINT_SERIES_MAX: usize = 10_000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueryLabels {
    pub qtype: &'static str,
    pub rcode: &'static str,
    pub transport: &'static str,
}

/// Query types counted by name; the rest count as `other`, so clients cannot invent series.
const QTYPES: [RecordType; 13] = [
    RecordType::A,
    RecordType::AAAA,
    RecordType::ANY,
    RecordType::CNAME,
    RecordType::MX,
    RecordType::NS,
    RecordType::SOA,
    RecordType::TXT,
    RecordType::SRV,
    RecordType::PTR,
    RecordType::HTTPS,
    RecordType::SVCB,
    RecordType::CAA,
];
const QTYPE_SLOTS: usize = QTYPES.len() + 2; // + other + none (no question)
const RCODES: [ResponseCode; 7] = [
    ResponseCode::NoError,
    ResponseCode::FormErr,
    ResponseCode::ServFail,
    ResponseCode::NXDomain,
    ResponseCode::NotImp,
    ResponseCode::Refused,
    ResponseCode::BADVERS,
];
const RCODE_SLOTS: usize = RCODES.len() + 1; // + other
const TRANSPORTS: [Transport; 2] = [Transport::Udp, Transport::Tcp];
/// Response size buckets: 32, 64, ... 65,536 bytes, then +Inf.
const SIZE_BUCKETS: usize = 12;

fn qtype_slot(qtype: Option<RecordType>) -> usize {
    match qtype {
        None => QTYPE_SLOTS - 1,
        Some(t) => QTYPES.iter().position(|&q| q == t).unwrap_or(QTYPES.len()),
    }
}

fn qtype_label(slot: usize) -> &'static str {
    match QTYPES.get(slot) {
        Some(t) => qtype_name(*t),
        None if slot == QTYPES.len() => "other",
        None => "none",
    }
}

fn qtype_name(t: RecordType) -> &'static str {
    match t {
        RecordType::A => "A",
        RecordType::AAAA => "AAAA",
        RecordType::ANY => "ANY",
        RecordType::CNAME => "CNAME",
        RecordType::MX => "MX",
        RecordType::NS => "NS",
        RecordType::SOA => "SOA",
        RecordType::TXT => "TXT",
        RecordType::SRV => "SRV",
        RecordType::PTR => "PTR",
        RecordType::HTTPS => "HTTPS",
        RecordType::SVCB => "SVCB",
        RecordType::CAA => "CAA",
        _ => "other",
    }
}

fn rcode_slot(rcode: ResponseCode) -> usize {
    RCODES.iter().position(|&r| r == rcode).unwrap_or(RCODES.len())
}

/// Query counters the hot path bumps with relaxed atomic adds (no lock, no allocation),
/// encoded as the `dnsplan_dns_queries_total` family at scrape time.
#[derive(Clone, Debug, Default)]
pub struct QueryCounters {
    cells: Arc<[[[AtomicU64; RCODE_SLOTS]; QTYPE_SLOTS]; 2]>,
}

impl EncodeMetric for QueryCounters {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (t, transport) in TRANSPORTS.iter().enumerate() {
            for (q, row) in self.cells[t].iter().enumerate() {
                for (r, cell) in row.iter().enumerate() {
                    let value = cell.load(Ordering::Relaxed);
                    if value == 0 {
                        continue;
                    }
                    let rcode = RCODES.get(r).map_or("other", |c| c.to_str());
                    let labels = QueryLabels { qtype: qtype_label(q), rcode, transport: transport.as_str() };
                    encoder.encode_family(&labels)?.encode_counter::<NoLabelSet, _, u64>(&value, None)?;
                }
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// A response-size histogram the hot path bumps with relaxed atomic adds.
#[derive(Clone, Debug, Default)]
pub struct SizeHistogram {
    inner: Arc<([AtomicU64; SIZE_BUCKETS + 1], AtomicU64)>,
}

impl SizeHistogram {
    fn observe(&self, bytes: usize) {
        // Bucket i holds sizes up to 32 * 2^i.
        let slot = (usize::BITS - bytes.saturating_sub(1).leading_zeros()).saturating_sub(5) as usize;
        self.inner.0[slot.min(SIZE_BUCKETS)].fetch_add(1, Ordering::Relaxed);
        self.inner.1.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

impl EncodeMetric for SizeHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counts: Vec<u64> = self.inner.0.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let buckets: Vec<(f64, u64)> = counts
            .iter()
            .enumerate()
            .map(|(i, &c)| (if i < SIZE_BUCKETS { 32.0 * f64::from(1u32 << i) } else { f64::INFINITY }, c))
            .collect();
        let sum = self.inner.1.load(Ordering::Relaxed) as f64;
        encoder.encode_histogram::<NoLabelSet>(sum, counts.iter().sum(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApplyLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: String,
}

/// The TCP listeners' connections (DNS and the control API): failed accepts, connections
/// refused over the cap, connections open.
#[derive(Clone, Debug, Default)]
pub struct ConnectionMetrics {
    pub dns_tcp_accept_errors: Counter,
    pub dns_tcp_refused: Counter,
    pub dns_tcp_open: Gauge,
    pub control_accept_errors: Counter,
    pub control_open: Gauge,
}

impl ConnectionMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "dns_tcp_accept_errors",
            "DNS TCP accepts that failed (out of descriptors or memory, or the peer reset first)",
            self.dns_tcp_accept_errors.clone(),
        );
        registry.register(
            "dns_tcp_refused",
            "DNS TCP connections closed at once because dns.tcp_connections_max were open",
            self.dns_tcp_refused.clone(),
        );
        registry.register("dns_tcp_connections", "DNS TCP connections open", self.dns_tcp_open.clone());
        registry.register(
            "control_accept_errors",
            "Control API accepts that failed (out of descriptors or memory, or the peer reset first)",
            self.control_accept_errors.clone(),
        );
        registry.register("control_connections", "Control API connections open", self.control_open.clone());
    }
}

pub struct Metrics {
    registry: Registry,
    pub connections: ConnectionMetrics,
    queries: QueryCounters,
    truncated: Counter,
    udp_unsent: Counter,
    response_bytes: SizeHistogram,
    pub applies: Family<ApplyLabels, Counter>,
    snapshot_swap_seconds: Histogram,
    active_generation: Family<EndpointLabels, Gauge>,
    /// `active_generation` holds one series per managed endpoint (the zone is small enough).
    per_endpoint: Arc<AtomicBool>,
    active_generation_min: Gauge,
    active_generation_max: Gauge,
    managed_endpoints: Gauge,
    applied_changes: Gauge,
    /// `dnsplan_dns_malformed_total`, one counter per `Malformed::ALL` entry, in its order.
    malformed: [Counter; Malformed::ALL.len()],
    rrl_dropped: Counter,
    rrl_slipped: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MalformedLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RrlLabels {
    pub action: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("dnsplan");
        let queries = QueryCounters::default();
        registry.register("dns_queries", "DNS queries answered, by query type, response code and transport", queries.clone());
        let truncated = Counter::default();
        registry.register("dns_truncated", "UDP answers sent with TC=1 because they did not fit", truncated.clone());
        let udp_unsent = Counter::default();
        registry.register(
            "dns_udp_unsent",
            "UDP answers not sent: the kernel refused their peer, or the send buffer was full",
            udp_unsent.clone(),
        );
        let response_bytes = SizeHistogram::default();
        registry.register("dns_response_bytes", "Size of DNS responses in bytes", response_bytes.clone());
        // The series exist from the start (at 0), and the hot path holds each counter itself:
        // no label lookup, no lock, per packet.
        let malformed_family = Family::<MalformedLabels, Counter>::default();
        registry.register(
            "dns_malformed",
            "DNS packets that were not well-formed queries, by reason (short, response, unparsable, edns_option)",
            malformed_family.clone(),
        );
        let malformed = Malformed::ALL.map(|m| malformed_family.get_or_create(&MalformedLabels { reason: m.as_str() }).clone());
        let rrl_family = Family::<RrlLabels, Counter>::default();
        registry.register(
            "dns_rrl",
            "UDP answers over the response rate limit ([dns.rrl]): dropped, or slipped (sent truncated)",
            rrl_family.clone(),
        );
        let rrl_dropped = rrl_family.get_or_create(&RrlLabels { action: "dropped" }).clone();
        let rrl_slipped = rrl_family.get_or_create(&RrlLabels { action: "slipped" }).clone();
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
        let connections = ConnectionMetrics::default();
        connections.register(&mut registry);
        Metrics {
            registry,
            connections,
            queries,
            truncated,
            udp_unsent,
            response_bytes,
            applies,
            snapshot_swap_seconds,
            active_generation,
            per_endpoint: Arc::default(),
            active_generation_min,
            active_generation_max,
            managed_endpoints,
            applied_changes,
            malformed,
            rrl_dropped,
            rrl_slipped,
        }
    }

    /// An answer was sent. A slip (`rrl::slip`) counts here too, with its own size, and in
    /// `observe_rrl_slipped`; `truncated` counts only answers too big for UDP.
    pub fn observe_query(&self, outcome: &Outcome, transport: Transport) {
        let t = usize::from(transport == Transport::Tcp);
        self.queries.cells[t][qtype_slot(outcome.qtype)][rcode_slot(outcome.rcode)].fetch_add(1, Ordering::Relaxed);
        self.response_bytes.observe(outcome.bytes);
        if outcome.truncated {
            self.truncated.inc();
        }
        if let Some(why) = outcome.malformed {
            self.observe_malformed(why);
        }
    }

    /// A packet that was not a well-formed query: dropped, or answered FORMERR (then
    /// `observe_query` calls this).
    pub fn observe_malformed(&self, why: Malformed) {
        self.malformed[why as usize].inc();
    }

    /// The rate limiter dropped this answer.
    pub fn observe_rrl_dropped(&self, outcome: &Outcome) {
        self.rrl_dropped.inc();
        if let Some(why) = outcome.malformed {
            self.observe_malformed(why);
        }
    }

    /// The rate limiter sent this answer truncated (`observe_query` counts it as sent).
    pub fn observe_rrl_slipped(&self) {
        self.rrl_slipped.inc();
    }

    /// `count` UDP answers were not sent (see `udp::send_answers`).
    pub fn observe_udp_unsent(&self, count: usize) {
        if count > 0 {
            self.udp_unsent.inc_by(count as u64);
        }
    }

    /// After a swap to `snapshot`. `changed` is the delta it was merged from, if any: then
    /// only the per-endpoint series of the endpoints in it are touched, so the cost follows
    /// the change, not the zone. Without one (the first build, a `full` delta, or the zone
    /// crossing `PER_ENDPOINT_SERIES_MAX`), the series are rebuilt from the whole snapshot.
    pub fn observe_snapshot(&self, snapshot: &Snapshot, changed: Option<&ActiveDelta>, build_seconds: f64) {
        self.snapshot_swap_seconds.observe(build_seconds);
        self.managed_endpoints.set(snapshot.managed_count() as i64);
        self.applied_changes.set(snapshot.applied_changes as i64);
        let (min, max) = snapshot.generation_range().map_or((0, 0), |(lo, hi)| (lo.0 as i64, hi.0 as i64));
        self.active_generation_min.set(min);
        self.active_generation_max.set(max);
        let fits = snapshot.managed_count() <= PER_ENDPOINT_SERIES_MAX;
        let exported = self.per_endpoint.swap(fits, Ordering::Relaxed);
        match changed {
            Some(delta) if fits && exported && !delta.full => {
                for endpoint in delta.endpoints.keys() {
                    let labels = EndpointLabels { endpoint: endpoint.to_string() };
                    match snapshot.managed_generation(endpoint) {
                        Some(g) => {
                            self.active_generation.get_or_create(&labels).set(g.0 as i64);
                        }
                        None => {
                            self.active_generation.remove(&labels);
                        }
                    }
                }
            }
            _ => {
                self.active_generation.clear();
                if fits {
                    for entry in snapshot.managed() {
                        if let (Some(endpoint), Some(m)) = (entry.endpoint(), &entry.managed) {
                            self.active_generation
                                .get_or_create(&EndpointLabels { endpoint: endpoint.to_string() })
                                .set(m.generation.0 as i64);
                        }
                    }
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
