//! Prometheus metrics of the authority, exposed as text on the control API's `/metrics`.
//!
//! Names follow Prometheus conventions (`dnsplan_` prefix, `_total` counters, `_seconds`,
//! `_bytes`). The per-endpoint active-generation gauge has one series per managed endpoint
//! and is only exported while there are at most `PER_ENDPOINT_SERIES_MAX` of them; above
//! that, the min and max gauges remain.
//!
//! The `dnsplan_store_*`, `dnsplan_automation_*` and `dnsplan_lease_*` gauges are what the
//! store itself says (latest plan, applied changes, pause, planner lease, each enactor's last
//! heartbeat), read at each scrape (`StoreReading`) rather than from the follower, so a stuck
//! follower shows as the served `dnsplan_applied_changes` falling behind
//! `dnsplan_store_applied_changes`, and an enactor that stopped reporting (hung, or its
//! process gone with nothing left to scrape) as an old heartbeat.

use crate::query::answer::{Malformed, Outcome, Transport};
use crate::zone::snapshot::Snapshot;
use dnsplan_common::store::ActiveDelta;
use dnsplan_common::{Heartbeat, Lease, PauseState, Store, StoreError, StoreResult, StoreVersion};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most per-endpoint series. Ten thousand series is what one scrape target can carry
/// comfortably; a million-name DNS zone would swamp a Prometheus server.
pub const PER_ENDPOINT_SERIES_MAX: usize = 10_000;

/// Longest a scrape waits for the store's small records. The reads take the store's writer
/// lock, which a long write (a cleanup of many plans) can hold; a scrape must still answer
/// well within Prometheus's default 10 s scrape timeout, with the gauges it had.
pub const STORE_READ_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ZoneSourceLabels {
    pub source: &'static str,
}

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

/// A refused control API request: the credential that tried (`-` for none or an unknown
/// token) and the status (401, 403). The names are the config's, at most
/// `access::CREDENTIALS_MAX`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub credential: String,
    pub status: u16,
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
    pub control_tls_failures: Counter,
    pub control_refused: Family<RefusedLabels, Counter>,
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
        registry.register(
            "control_tls_handshake_failures",
            "Control API TLS handshakes that failed or timed out (a client without the CA, an expired or refused certificate)",
            self.control_tls_failures.clone(),
        );
        registry.register(
            "control_refused",
            "Control API requests refused: 401 without a known credential, 403 for a credential without the role",
            self.control_refused.clone(),
        );
    }
}

/// What the store says at one scrape: its version (latest plan, applied changes), the pause,
/// the planner lease and the enactors' heartbeats. Four small reads (at most
/// `HEARTBEATS_MAX` heartbeats); the version needs no lock.
#[derive(Clone, Debug, Default)]
pub struct StoreReading {
    pub version: StoreVersion,
    pub paused: Option<PauseState>,
    pub lease: Option<Lease>,
    pub heartbeats: Vec<Heartbeat>,
}

impl StoreReading {
    /// Reads `store`, within `STORE_READ_TIMEOUT` for the four reads together.
    pub async fn read<S: Store>(store: &S) -> StoreResult<StoreReading> {
        let read = async {
            Ok(StoreReading {
                version: store.version().await?,
                paused: store.paused().await?,
                lease: store.lease().await?,
                heartbeats: store.heartbeats().await?,
            })
        };
        tokio::time::timeout(STORE_READ_TIMEOUT, read)
            .await
            .unwrap_or_else(|_| Err(StoreError::Unavailable(format!("store reads took over {STORE_READ_TIMEOUT:?}"))))
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HolderLabels {
    pub holder: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct EnactorLabels {
    pub enactor: String,
    pub zone: String,
}

/// The store's own figures (see the module comment), set from a `StoreReading`.
#[derive(Clone, Debug, Default)]
struct StoreGauges {
    /// Each enactor's last heartbeat, in Unix seconds: one series per heartbeat the store
    /// keeps (at most `HEARTBEATS_MAX`), removed when the store no longer lists it.
    heartbeat_seconds: Family<EnactorLabels, Gauge>,
    /// The series `heartbeat_seconds` holds now, to remove the ones gone from the store.
    heartbeat_series: Arc<Mutex<BTreeSet<EnactorLabels>>>,
    latest_generation: Gauge,
    applied_changes: Gauge,
    read_errors: Counter,
    /// 1 while the store answers (the last call to it succeeded), 0 while it does not.
    reachable: Gauge,
    /// 1 while the embedded store's writes fail (a full disk), until it has reopened and
    /// written again.
    writes_failing: Gauge,
    /// Free bytes on the embedded store's filesystem; -1 for a store not on local disk.
    disk_free_bytes: Gauge,
    paused: Gauge,
    paused_since_seconds: Gauge,
    lease_held: Gauge,
    lease_epoch: Gauge,
    /// One series, at 1, for the holder of a live lease; none without one.
    lease_holder: Family<HolderLabels, Gauge>,
}

impl StoreGauges {
    fn register(&self, registry: &mut Registry) {
        registry.register("store_latest_generation", "Latest plan generation in the store", self.latest_generation.clone());
        registry.register(
            "store_applied_changes",
            "The store's applied-change counter; the served dnsplan_applied_changes follows it",
            self.applied_changes.clone(),
        );
        registry.register(
            "store_read_errors",
            "Scrapes whose store reads failed or timed out (the store gauges kept their values)",
            self.read_errors.clone(),
        );
        registry.register(
            "store_reachable",
            "1 while the store (etcd, or the embedded one) answers; 0 while it does not and the authority serves the state it has",
            self.reachable.clone(),
        );
        registry.register(
            "store_writes_failing",
            "1 while the embedded store's writes fail (a full disk, an I/O error); DNS keeps answering, nothing is published or applied; the store reopens itself every second",
            self.writes_failing.clone(),
        );
        self.disk_free_bytes.set(-1);
        registry.register(
            "store_disk_free_bytes",
            "Free bytes on the embedded store's filesystem, for the daemon; -1 for a store not on local disk (etcd)",
            self.disk_free_bytes.clone(),
        );
        registry.register(
            "automation_paused",
            "1 while automation is paused in the store (by an operator or the breaker)",
            self.paused.clone(),
        );
        registry.register(
            "automation_paused_since_timestamp_seconds",
            "When automation was paused, in Unix seconds; 0 while it runs",
            self.paused_since_seconds.clone(),
        );
        registry.register("lease_held", "1 while a planner holds a live lease in the store", self.lease_held.clone());
        registry.register("lease_epoch", "Epoch of the store's planner lease (moves on every takeover)", self.lease_epoch.clone());
        registry.register("lease_holder", "The planner holding the live lease (1), by holder id", self.lease_holder.clone());
        registry.register(
            "store_enactor_heartbeat_timestamp_seconds",
            "When each enactor last reported to the store, in Unix seconds",
            self.heartbeat_seconds.clone(),
        );
    }
}

pub struct Metrics {
    registry: Registry,
    pub connections: ConnectionMetrics,
    store: StoreGauges,
    queries: QueryCounters,
    truncated: Counter,
    udp_unsent: Counter,
    xdp_answers: Counter,
    /// `dnsplan_dns_xdp_dropped_total` by reason, in `XDP_DROP_REASONS`' order.
    xdp_dropped: [Counter; 6],
    response_bytes: SizeHistogram,
    pub applies: Family<ApplyLabels, Counter>,
    snapshot_swap_seconds: Histogram,
    active_generation: Family<EndpointLabels, Gauge>,
    /// `active_generation` holds one series per managed endpoint (the zone is small enough).
    per_endpoint: Arc<AtomicBool>,
    active_generation_min: Gauge,
    active_generation_max: Gauge,
    managed_endpoints: Gauge,
    managed_endpoints_not_served: Gauge,
    applied_changes: Gauge,
    soa_serial: Gauge,
    /// The earliest signature expiry of every signed zone served (seconds since the epoch), 0
    /// when none is signed: the managed zone's (`signatures_expire_managed`) and the static
    /// zones' (`signatures_expire_static`), each 0 when unsigned.
    signatures_expire: Gauge,
    /// Reads of a signed zone's key directory that failed, or whose keys could not be served
    /// (`Serving::keys_step`).
    pub dnssec_key_dir_failures: Counter,
    signatures_expire_managed: Arc<AtomicI64>,
    signatures_expire_static: Arc<AtomicI64>,
    /// `dnsplan_static_zones{source}`: how many static zones are served (per-zone figures are
    /// in `GET /v1/zones`, not here: one series per zone would be 100,000 series at 100,000
    /// zones).
    static_zones: Family<ZoneSourceLabels, Gauge>,
    /// The zones the store manages beside its first one (`observe_added_zones`): counts by
    /// state, their secondaries by state, and the zones in trouble by name, at most
    /// `ZONE_SERIES_MAX` of them.
    added_zones: Family<StateLabels, Gauge>,
    added_zone_secondaries: Family<StateLabels, Gauge>,
    added_zone_trouble: Family<TroubleLabels, Gauge>,
    /// The series `added_zone_trouble` holds, so a zone out of trouble loses its series alone:
    /// clearing the family and filling it again would let a scrape in between see none. Its
    /// lock also keeps two scrapes' observations from interleaving.
    added_zone_trouble_listed: Arc<std::sync::Mutex<Vec<TroubleLabels>>>,
    added_zone_trouble_unlisted: Gauge,
    /// `dnsplan_dns_malformed_total`, one counter per `Malformed::ALL` entry, in its order.
    malformed: [Counter; Malformed::ALL.len()],
    rrl_dropped: Counter,
    rrl_slipped: Counter,
    transfers: Family<TransferLabels, Counter>,
    notify_failed: Counter,
    /// `dnsplan_untrusted_records_total`: active records not served for want of a trusted plan.
    pub untrusted_records: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TroubleLabels {
    pub zone: String,
    pub reason: &'static str,
}

/// Most zones named by `dnsplan_managed_zone_trouble`: the label cardinality of the added
/// zones is bounded by this, whatever their number (100,000 zones in trouble are 100 series and
/// a count of the others).
pub const ZONE_SERIES_MAX: usize = 100;

/// Every state of `dnsplan_managed_zones`, created at 0 at start: served and following its
/// store; served from the state kept on disk, its store not read yet (an authority on etcd
/// started in an outage); served, its store failing (its last state served); live in the
/// store's registry and not served (REFUSED: its master file or its store cannot be read).
pub const ADDED_ZONE_STATES: [&str; 4] = ["following", "kept", "store_failing", "not_served"];

/// Every state of `dnsplan_managed_zone_secondaries`, created at 0 at start.
pub const SECONDARY_STATES: [&str; 5] = ["current", "unverified", "behind", "differs", "unreachable"];

/// What the added zones come to, at one scrape (`added::ZoneBook::summary`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AddedZonesSummary {
    /// Zones by state, in `ADDED_ZONE_STATES`' order.
    pub states: [usize; ADDED_ZONE_STATES.len()],
    /// Their secondaries by state, in `SECONDARY_STATES`' order.
    pub secondaries: [usize; SECONDARY_STATES.len()],
    /// The zones in trouble, by name, with the worst reason each (a state but `following`, or
    /// a secondary `behind`, `differs` or `unreachable`), at most `ZONE_SERIES_MAX`.
    pub trouble: Vec<(String, &'static str)>,
    /// The zones in trouble past `ZONE_SERIES_MAX`.
    pub unlisted: usize,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransferLabels {
    pub result: &'static str,
}

/// Every `result` of `dnsplan_dns_transfers_total`, created at 0 at start.
pub const TRANSFER_RESULTS: [&str; 8] = ["sent", "incremental", "current", "refused", "tsig_failed", "not_auth", "busy", "failed"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MalformedLabels {
    pub reason: &'static str,
}

/// The reasons of `dnsplan_dns_xdp_dropped_total`, in the order of `observe_xdp_counts`' array.
pub const XDP_DROP_REASONS: [&str; 6] = ["rx_ring_full", "fill_ring_empty", "rx_dropped", "invalid", "tx_ring_full", "too_large"];

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
        let xdp_answers = Counter::default();
        registry.register(
            "dns_xdp_answers",
            "UDP answers sent over AF_XDP ([dns] xdp), counted in dns_queries_total too",
            xdp_answers.clone(),
        );
        let xdp_family = Family::<MalformedLabels, Counter>::default();
        registry.register(
            "dns_xdp_dropped",
            "UDP frames lost on the AF_XDP path, by reason: rx_ring_full (a queue's thread did not keep up), \
             fill_ring_empty (no free frame), rx_dropped (the kernel's other reasons), invalid (a descriptor refused), \
             tx_ring_full (an answer not sent), too_large (an answer larger than the interface's MTU allows)",
            xdp_family.clone(),
        );
        let xdp_dropped = XDP_DROP_REASONS.map(|reason| xdp_family.get_or_create(&MalformedLabels { reason }).clone());
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
        let transfers = Family::<TransferLabels, Counter>::default();
        registry.register(
            "dns_transfers",
            "Zone transfer requests (AXFR, IXFR over TCP), by result: sent (the whole zone), incremental (IXFR from the \
             history), current (IXFR, SOA alone), refused (address or no signature), tsig_failed, not_auth (not our zone), \
             busy (transfers_max), failed (stopped midway)",
            transfers.clone(),
        );
        for result in TRANSFER_RESULTS {
            let _ = transfers.get_or_create(&TransferLabels { result });
        }
        let notify_failed = Counter::default();
        registry.register(
            "dns_notify_failed",
            "NOTIFY messages to secondaries not acknowledged in time (each is tried again)",
            notify_failed.clone(),
        );
        let untrusted_records = Counter::default();
        registry.register(
            "untrusted_records",
            "Active records not served because no plan the keyring trusts says them at their generation (written around the \
             store's checks, or of a plan not signed by a trusted key)",
            untrusted_records.clone(),
        );
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
        let managed_endpoints_not_served = Gauge::default();
        registry.register(
            "managed_endpoints_not_served",
            "Endpoints the store says to serve that the zone cannot (at or below a delegation, or outside the zone): each has an ERROR line",
            managed_endpoints_not_served.clone(),
        );
        let applied_changes = Gauge::default();
        registry.register("applied_changes", "The store's applied-change count the served state is at", applied_changes.clone());
        let soa_serial = Gauge::default();
        registry.register(
            "soa_serial",
            "The SOA serial served: serial_base plus the store's content-change count (it moves only when served records change)",
            soa_serial.clone(),
        );
        let signatures_expire = Gauge::default();
        registry.register(
            "dnssec_signatures_expire_timestamp_seconds",
            "The earliest signature expiry of the signed zones served ([dns_zone.dnssec], [zones.dnssec], [added_zones.dnssec]), seconds since the \
             epoch (every RRset of a zone is signed again once less than signature_refresh_days is left); 0 when none is signed",
            signatures_expire.clone(),
        );
        let dnssec_key_dir_failures = Counter::default();
        registry.register(
            "dnssec_key_dir_failures",
            "Reads of a signed zone's key directory (key_dir) that failed, or whose new keys could not be served: the zone stays \
             signed with the keys it has, and misses the schedule's changes meanwhile (the log says why)",
            dnssec_key_dir_failures.clone(),
        );
        let static_zones = Family::<ZoneSourceLabels, Gauge>::default();
        registry.register(
            "static_zones",
            "Static zones served beside the managed one, by where they come from (config, added); per zone: GET /v1/zones",
            static_zones.clone(),
        );
        for source in ["config", "added"] {
            static_zones.get_or_create(&ZoneSourceLabels { source }).set(0);
        }
        let added_zones = Family::<StateLabels, Gauge>::default();
        registry.register(
            "managed_zones",
            "Zones the store manages beside its first one, by state: following (served, following its store), kept (served from \
             the state kept on disk, its store not read yet), store_failing (served, its store failing: its last state), \
             not_served (live in the store, REFUSED here)",
            added_zones.clone(),
        );
        for state in ADDED_ZONE_STATES {
            added_zones.get_or_create(&StateLabels { state }).set(0);
        }
        let added_zone_secondaries = Family::<StateLabels, Gauge>::default();
        registry.register(
            "managed_zone_secondaries",
            "Secondaries of the zones the store manages beside its first one, over every such zone, by state",
            added_zone_secondaries.clone(),
        );
        for state in SECONDARY_STATES {
            added_zone_secondaries.get_or_create(&StateLabels { state }).set(0);
        }
        let added_zone_trouble = Family::<TroubleLabels, Gauge>::default();
        registry.register(
            "managed_zone_trouble",
            "1 for each zone the store manages beside its first one that is not served and following with its secondaries \
             current, by zone and its worst reason; at most 100 zones, by name (the others: managed_zone_trouble_unlisted)",
            added_zone_trouble.clone(),
        );
        let added_zone_trouble_unlisted = Gauge::default();
        registry.register(
            "managed_zone_trouble_unlisted",
            "Zones in trouble past the 100 dnsplan_managed_zone_trouble names (GET /v1/managed lists every zone)",
            added_zone_trouble_unlisted.clone(),
        );
        let connections = ConnectionMetrics::default();
        connections.register(&mut registry);
        let store = StoreGauges::default();
        store.register(&mut registry);
        Metrics {
            registry,
            connections,
            store,
            queries,
            truncated,
            udp_unsent,
            xdp_answers,
            xdp_dropped,
            response_bytes,
            applies,
            snapshot_swap_seconds,
            active_generation,
            per_endpoint: Arc::default(),
            active_generation_min,
            active_generation_max,
            managed_endpoints,
            managed_endpoints_not_served,
            applied_changes,
            soa_serial,
            signatures_expire,
            dnssec_key_dir_failures,
            signatures_expire_managed: Arc::default(),
            signatures_expire_static: Arc::default(),
            static_zones,
            added_zones,
            added_zone_secondaries,
            added_zone_trouble,
            added_zone_trouble_listed: Arc::default(),
            added_zone_trouble_unlisted,
            malformed,
            rrl_dropped,
            rrl_slipped,
            transfers,
            notify_failed,
            untrusted_records,
        }
    }

    /// A NOTIFY went unacknowledged.
    pub fn observe_notify_failed(&self) {
        self.notify_failed.inc();
    }

    /// A zone transfer request ended with `result`, one of `TRANSFER_RESULTS`.
    pub fn observe_transfer(&self, result: &'static str) {
        assert!(TRANSFER_RESULTS.contains(&result), "transfer result {result:?} is not in TRANSFER_RESULTS");
        self.transfers.get_or_create(&TransferLabels { result }).inc();
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

    /// An answer handed to an AF_XDP queue's transmit ring.
    pub fn observe_xdp_answer(&self) {
        self.xdp_answers.inc();
    }

    /// Frames an AF_XDP queue lost since its counts were last observed, by reason
    /// (`XDP_DROP_REASONS`' order).
    pub fn observe_xdp_dropped(&self, lost: [u64; 6]) {
        for (counter, lost) in self.xdp_dropped.iter().zip(lost) {
            if lost > 0 {
                counter.inc_by(lost);
            }
        }
    }

    /// `count` UDP answers were not sent (see `udp::send_answers`).
    pub fn observe_udp_unsent(&self, count: usize) {
        if count > 0 {
            self.udp_unsent.inc_by(count as u64);
        }
    }

    /// When `snapshot`'s oldest signatures expire (a signed zone's; 0 unsigned), and its
    /// serial, which a signing of every name moves.
    pub fn observe_signatures(&self, snapshot: &Snapshot) {
        self.signatures_expire_managed.store(snapshot.signatures_expire_at().map_or(0, i64::from), Ordering::Relaxed);
        self.set_signatures_expire();
        self.soa_serial.set(i64::from(snapshot.serial));
    }

    /// The earliest signature expiry among the signed static zones (`None`: none is signed).
    pub fn observe_static_signatures(&self, earliest: Option<u32>) {
        self.signatures_expire_static.store(earliest.map_or(0, i64::from), Ordering::Relaxed);
        self.set_signatures_expire();
    }

    fn set_signatures_expire(&self) {
        let [managed, statics] = [&self.signatures_expire_managed, &self.signatures_expire_static].map(|a| a.load(Ordering::Relaxed));
        self.signatures_expire.set([managed, statics].into_iter().filter(|&at| at > 0).min().unwrap_or(0));
    }

    /// After a swap to `snapshot`. `changed` is the delta it was merged from, if any: then
    /// only the per-endpoint series of the endpoints in it are touched, so the cost follows
    /// the change, not the zone. Without one (the first build, a `full` delta, or the zone
    /// crossing `PER_ENDPOINT_SERIES_MAX`), the series are rebuilt from the whole snapshot.
    pub fn observe_snapshot(&self, snapshot: &Snapshot, changed: Option<&ActiveDelta>, build_seconds: f64) {
        self.snapshot_swap_seconds.observe(build_seconds);
        self.managed_endpoints.set(snapshot.managed_count() as i64);
        self.managed_endpoints_not_served.set(snapshot.not_served_count() as i64);
        self.applied_changes.set(snapshot.applied_changes as i64);
        self.observe_signatures(snapshot);
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

    /// Sets the store gauges from `reading`, taken at `now_unix_ms` (the store's clock, which
    /// decides whether the lease is live).
    pub fn observe_store(&self, reading: &StoreReading, now_unix_ms: u64) {
        let g = &self.store;
        g.reachable.set(1);
        g.latest_generation.set(reading.version.latest.0 as i64);
        g.applied_changes.set(reading.version.applied_changes as i64);
        g.paused.set(i64::from(reading.paused.is_some()));
        g.paused_since_seconds.set(reading.paused.as_ref().map_or(0, |p| (p.since_unix_ms / 1_000) as i64));
        let live = reading.lease.as_ref().filter(|l| l.is_live(now_unix_ms));
        g.lease_held.set(i64::from(live.is_some()));
        let listed: BTreeSet<EnactorLabels> = reading
            .heartbeats
            .iter()
            .map(|h| {
                let labels = EnactorLabels { enactor: h.enactor_id.clone(), zone: h.zone.to_string() };
                g.heartbeat_seconds.get_or_create(&labels).set((h.at_unix_ms / 1_000) as i64);
                labels
            })
            .collect();
        if let Ok(mut series) = g.heartbeat_series.lock() {
            for gone in series.difference(&listed) {
                g.heartbeat_seconds.remove(gone);
            }
            *series = listed;
        }
        if let Some(lease) = &reading.lease {
            g.lease_epoch.set(lease.epoch as i64);
        }
        // Cleared only when the holder changes, so a concurrent scrape never sees a held lease
        // without its holder.
        match live.map(|lease| HolderLabels { holder: lease.holder.clone() }) {
            Some(holder) => {
                if g.lease_holder.get(&holder).is_none() {
                    g.lease_holder.clear();
                }
                g.lease_holder.get_or_create(&holder).set(1);
            }
            None => g.lease_holder.clear(),
        }
    }

    /// A scrape could not read the store: the store gauges keep their last values.
    pub fn observe_store_read_error(&self) {
        self.store.read_errors.inc();
        self.store.reachable.set(0);
    }

    /// Whether the store's writes fail (`dnsplan_store_writes_failing`) and the free bytes on
    /// its disk (`dnsplan_store_disk_free_bytes`), for a store on local disk.
    pub fn observe_store_disk(&self, writes_failing: bool, free_bytes: Option<u64>) {
        self.store.writes_failing.set(i64::from(writes_failing));
        self.store.disk_free_bytes.set(free_bytes.map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX)));
    }

    /// How many static zones come from the config file and how many were added at run time.
    pub fn observe_static_zones(&self, config: usize, added: usize) {
        for (source, count) in [("config", config), ("added", added)] {
            self.static_zones.get_or_create(&ZoneSourceLabels { source }).set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// The added zones' figures (`dnsplan_managed_zone*`), the zones in trouble named anew.
    pub fn observe_added_zones(&self, summary: &AddedZonesSummary) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        for (state, n) in ADDED_ZONE_STATES.iter().zip(summary.states) {
            self.added_zones.get_or_create(&StateLabels { state }).set(count(n));
        }
        for (state, n) in SECONDARY_STATES.iter().zip(summary.secondaries) {
            self.added_zone_secondaries.get_or_create(&StateLabels { state }).set(count(n));
        }
        let now: Vec<TroubleLabels> = summary.trouble.iter().map(|(zone, reason)| TroubleLabels { zone: zone.clone(), reason }).collect();
        // A poisoned lock held only a list of labels: take it as it is.
        let mut listed = self.added_zone_trouble_listed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for gone in listed.iter().filter(|l| !now.contains(l)) {
            self.added_zone_trouble.remove(gone);
        }
        for labels in &now {
            self.added_zone_trouble.get_or_create(labels).set(1);
        }
        *listed = now;
        self.added_zone_trouble_unlisted.set(count(summary.unlisted));
    }

    /// The metrics of a zone added beside the first: its counters and histograms are these
    /// (its queries, transfers, NOTIFYs and swaps count with every zone's), its gauges its own
    /// (its serial and endpoints are summed up by `observe_added_zones`, not exported per zone:
    /// 100,000 zones would be 100,000 series each).
    pub fn for_added_zone(&self) -> Metrics {
        Metrics {
            connections: self.connections.clone(),
            queries: self.queries.clone(),
            truncated: self.truncated.clone(),
            udp_unsent: self.udp_unsent.clone(),
            xdp_answers: self.xdp_answers.clone(),
            xdp_dropped: self.xdp_dropped.clone(),
            response_bytes: self.response_bytes.clone(),
            applies: self.applies.clone(),
            snapshot_swap_seconds: self.snapshot_swap_seconds.clone(),
            malformed: self.malformed.clone(),
            rrl_dropped: self.rrl_dropped.clone(),
            rrl_slipped: self.rrl_slipped.clone(),
            transfers: self.transfers.clone(),
            notify_failed: self.notify_failed.clone(),
            untrusted_records: self.untrusted_records.clone(),
            dnssec_key_dir_failures: self.dnssec_key_dir_failures.clone(),
            // Its own, exported nowhere: an empty registry, not a whole one registered and
            // dropped (a few KB a zone, at every start of every zone).
            registry: Registry::default(),
            store: StoreGauges::default(),
            active_generation: Family::default(),
            per_endpoint: Arc::default(),
            active_generation_min: Gauge::default(),
            active_generation_max: Gauge::default(),
            managed_endpoints: Gauge::default(),
            managed_endpoints_not_served: Gauge::default(),
            applied_changes: Gauge::default(),
            soa_serial: Gauge::default(),
            signatures_expire: Gauge::default(),
            signatures_expire_managed: Arc::default(),
            signatures_expire_static: Arc::default(),
            static_zones: Family::default(),
            added_zones: Family::default(),
            added_zone_secondaries: Family::default(),
            added_zone_trouble: Family::default(),
            added_zone_trouble_listed: Arc::default(),
            added_zone_trouble_unlisted: Gauge::default(),
        }
    }

    /// Whether the store answers now (`dnsplan_store_reachable`).
    pub fn observe_store_reachable(&self, reachable: bool) {
        self.store.reachable.set(i64::from(reachable));
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

#[cfg(test)]
mod tests {
    use super::*;
    use dnsplan_common::Generation;

    fn reading(paused: Option<u64>, lease: Option<(&str, u64, u64)>) -> StoreReading {
        StoreReading {
            version: StoreVersion { latest: Generation(7), applied_changes: 42, control_changes: 3 },
            paused: paused.map(|since_unix_ms| PauseState {
                reason: "drill".into(),
                by: dnsplan_common::Author::Planner { id: "p".into() },
                since_unix_ms,
            }),
            lease: lease.map(|(holder, epoch, expires_at_unix_ms)| Lease { holder: holder.into(), epoch, expires_at_unix_ms }),
            heartbeats: Vec::new(),
        }
    }

    /// A zone that leaves trouble loses its series, the others keep theirs, a zone whose
    /// reason changed has only the new one.
    #[test]
    fn trouble_series_follow_the_zones_in_trouble() {
        let metrics = Metrics::new();
        let observe = |trouble: &[(&str, &'static str)]| {
            let trouble = trouble.iter().map(|(z, r)| (z.to_string(), *r)).collect();
            metrics.observe_added_zones(&AddedZonesSummary { trouble, ..Default::default() });
            metrics.render().lines().filter(|l| l.starts_with("dnsplan_managed_zone_trouble{")).map(str::to_owned).collect::<Vec<_>>()
        };
        assert_eq!(observe(&[("a.test.", "kept"), ("b.test.", "store_failing")]).len(), 2);
        let after = observe(&[("b.test.", "not_served")]);
        assert_eq!(after, ["dnsplan_managed_zone_trouble{zone=\"b.test.\",reason=\"not_served\"} 1"], "{after:?}");
        assert!(observe(&[]).is_empty());
    }

    fn heartbeat(enactor: &str, zone: &str, at_unix_ms: u64) -> Heartbeat {
        Heartbeat {
            enactor_id: enactor.into(),
            zone: dnsplan_common::ZoneId::parse(zone).expect("zone"),
            last_applied: Generation(7),
            latest_seen: Generation(7),
            at_unix_ms,
            state: "idle".into(),
        }
    }

    /// Each enactor's last heartbeat is a series of its own, and one the store no longer
    /// lists (evicted) is removed rather than left at its last value.
    #[test]
    fn heartbeats_are_series_that_follow_the_store() {
        let metrics = Metrics::new();
        let mut now = reading(None, None);
        now.heartbeats = vec![heartbeat("enactor-a", "a", 1_700_000_001_500), heartbeat("enactor-b", "b", 1_700_000_002_000)];
        metrics.observe_store(&now, 10_000);
        let got = lines(&metrics);
        for want in [
            "dnsplan_store_enactor_heartbeat_timestamp_seconds{enactor=\"enactor-a\",zone=\"a\"} 1700000001",
            "dnsplan_store_enactor_heartbeat_timestamp_seconds{enactor=\"enactor-b\",zone=\"b\"} 1700000002",
        ] {
            assert!(has(&got, want), "want {want:?} in {got:#?}");
        }
        now.heartbeats = vec![heartbeat("enactor-b", "b", 1_700_000_012_000)];
        metrics.observe_store(&now, 10_000);
        let got = lines(&metrics);
        assert!(has(&got, "dnsplan_store_enactor_heartbeat_timestamp_seconds{enactor=\"enactor-b\",zone=\"b\"} 1700000012"), "{got:#?}");
        assert!(!got.iter().any(|l| l.contains("enactor-a")), "a heartbeat gone from the store is still exported: {got:#?}");
    }

    fn lines(metrics: &Metrics) -> Vec<String> {
        metrics.render().lines().filter(|l| !l.starts_with('#')).map(str::to_owned).collect()
    }

    fn has(lines: &[String], want: &str) -> bool {
        lines.iter().any(|l| l == want)
    }

    /// Every store gauge follows the reading: a live lease names its holder, an expired one
    /// (the planner died) is not held, and a resume clears the pause's timestamp.
    #[test]
    fn store_gauges_follow_the_reading() {
        let metrics = Metrics::new();
        metrics.observe_store(&reading(Some(1_700_000_000_999), Some(("planner-1", 4, 10_000))), 9_999);
        let got = lines(&metrics);
        for want in [
            "dnsplan_store_latest_generation 7",
            "dnsplan_store_applied_changes 42",
            "dnsplan_automation_paused 1",
            "dnsplan_automation_paused_since_timestamp_seconds 1700000000",
            "dnsplan_lease_held 1",
            "dnsplan_lease_epoch 4",
            "dnsplan_lease_holder{holder=\"planner-1\"} 1",
            "dnsplan_store_read_errors_total 0",
        ] {
            assert!(has(&got, want), "want {want:?} in {got:#?}");
        }

        metrics.observe_store(&reading(None, Some(("planner-1", 4, 10_000))), 10_000);
        metrics.observe_store_read_error();
        let got = lines(&metrics);
        for want in [
            "dnsplan_automation_paused 0",
            "dnsplan_automation_paused_since_timestamp_seconds 0",
            "dnsplan_lease_held 0",
            "dnsplan_lease_epoch 4",
            "dnsplan_store_read_errors_total 1",
        ] {
            assert!(has(&got, want), "want {want:?} in {got:#?}");
        }
        assert!(!got.iter().any(|l| l.starts_with("dnsplan_lease_holder")), "an expired lease has no holder: {got:#?}");

        // A takeover: only the new holder is listed.
        metrics.observe_store(&reading(None, Some(("planner-2", 5, 20_000))), 10_000);
        let got = lines(&metrics);
        assert!(has(&got, "dnsplan_lease_holder{holder=\"planner-2\"} 1"), "{got:#?}");
        assert_eq!(got.iter().filter(|l| l.starts_with("dnsplan_lease_holder")).count(), 1, "{got:#?}");

        metrics.observe_store(&reading(None, None), 10_000);
        assert!(has(&lines(&metrics), "dnsplan_lease_held 0"));
    }
}
