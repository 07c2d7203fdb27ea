//! The RFC 2136 target: plans enacted onto a DNS primary we do not run (Knot, BIND,
//! PowerDNS) with UPDATE messages signed with TSIG and fenced by prerequisites.
//!
//! Each managed name `N` has a marker, `TXT _dnsplan.N`, holding the generation of the plan
//! its addresses come from, written as [`MARKER_DIGITS`] decimal digits (fixed width, so one
//! generation has exactly one text and an exact-match prerequisite is exact). Writing
//! generation `g` to `N` is a compare-and-swap inside the target server:
//!
//! 1. read the marker (the decision, pure: [`decide`]): already `g` → unchanged; newer →
//!    stale, skipped; older or absent → write;
//! 2. one UPDATE whose prerequisite section requires the marker to hold exactly what was
//!    read (RFC 2136 §2.4.2, RRset exists, value dependent), or no marker at all for a first
//!    write (§2.4.3, RRset does not exist), and whose update section deletes `N`'s A and AAAA
//!    RRsets and the marker and adds the plan's addresses and the new marker. The server
//!    checks the prerequisite and applies the update atomically, at write time.
//! 3. `NXRRSET`/`YXRRSET` (the marker moved since it was read): read it again and decide
//!    again, at most [`CAS_ROUNDS_MAX`] times. A newer marker ends it as stale, the same
//!    outcome the store's fence gives.
//!
//! Retiring `N` at `g` deletes its A and AAAA RRsets and its marker, so that `N` answers
//! NXDOMAIN when nothing else lives there, and writes a tombstone instead,
//! `TXT N-relative._dnsplan-retired.<zone>` holding `g`: outside `N`'s subtree (a marker
//! under `N` would keep it an empty non-terminal, NOERROR without data), and still a fence. A
//! write expecting no marker also requires no tombstone, so a writer of an older plan that read
//! the name before it was retired is refused, reads the tombstone and finds its plan stale; a
//! newer plan that serves `N` again requires the tombstone it read and deletes it.
//!
//! Drift: a reconcile (a full pass) also reads the A and AAAA RRsets of every name whose marker
//! already holds the plan's generation, and when they differ from the plan (an address deleted
//! or replaced by hand, another TTL) writes the name again through the same fence: the
//! prerequisites are the marker *and* both RRsets exactly as read, so a newer write made
//! meanwhile still wins. Each repair is counted by cause (`target_drift`) and logged once per
//! name and cause.
//!
//! A write whose answer was lost is safe to send again: if the first copy was applied, the
//! second one's prerequisite fails, and the marker then reads as this very generation.
//!
//! Never empty: an UPDATE is built only for an endpoint that passes the store's own endpoint
//! validation (`validate_endpoint`), and it always adds at least one address.
//!
//! Not responsible for: which plan to write (the enactor's loop), the cleanup floor (the
//! enactor records acknowledged writes in the store; see `crate::enactor`), TSIG itself
//! (`dnsplan_common::tsig`, over hickory-proto's).
//!
//! An outage of the server is logged once when it begins (WARN, with the cause: "Connection
//! refused", a timeout) and once when it ends (INFO, with the count of exchanges that failed
//! meanwhile), not on every attempt: `Rfc2136` keeps a [`Reachability`] shared by its clones.
//! Every error's log line carries its causes (`describe`), so BADSIG and BADKEY, or a refused
//! connection and a reset one, read differently.
//!
//! With feature `testing` only, [`Fence::Off`] sends the same UPDATE without its
//! prerequisite, the unfenced writer of today's tools, for the race tests' counterfactual.

use crate::metrics::Metrics;
use dnsplan_common::daemon::Reachability;
use dnsplan_common::plan::validate_endpoint;
use dnsplan_common::tsig::{TsigFailure, TsigKey, now_unix_secs};
use dnsplan_common::{DnsName, Endpoint, EndpointName, Generation, ValidationError};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode, UpdateMessage};
use hickory_proto::rr::rdata::{A, AAAA, TXT};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tracing::Instrument;

/// The first label of every marker name.
pub const MARKER_LABEL: &str = "_dnsplan";
/// Digits of a marker's generation: `u64::MAX` has 20.
pub const MARKER_DIGITS: usize = 20;
/// Compare-and-swap rounds for one endpoint. A round fails only when another writer moved
/// the marker between our read and our write; with one enactor per availability zone that
/// settles within a round or two, and four bounds a misbehaving writer.
pub const CAS_ROUNDS_MAX: u32 = 4;
/// Most marker reads and UPDATEs one enactor may have in flight at once (`in_flight`). Each is
/// a connection to the primary; 64 keeps what one enactor can ask of it bounded.
pub const IN_FLIGHT_MAX: usize = 64;
/// Names one UPDATE message carries at most (`write_many`): each with its own prerequisites,
/// all applied or none (RFC 2136 §3.4). One message instead of eight saves the server seven
/// commits; a refused one is sent again a name per message.
pub const NAMES_PER_UPDATE: usize = 8;
/// The default of `in_flight`. In series a name costs a round trip and, on Knot, a zone commit
/// of its own (about 11 ms a name on loopback: 1,000 names took 11 s); Knot commits updates
/// that arrive together together (1,000 names in 3 to 5 s with 8 to 16 in flight), while BIND
/// slowed down past a few (1 s in series, 1.5 s with 4, 3 s with 16, on the same machine).
pub const IN_FLIGHT_DEFAULT: usize = 8;
/// Largest answer read over TCP: the length prefix's maximum.
const ANSWER_BYTES_MAX: usize = u16::MAX as usize;

/// How the UPDATE is fenced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fence {
    /// The prerequisite on the marker (the only mode production builds have).
    #[default]
    Prerequisites,
    /// No prerequisite: write trusting the earlier read, as unfenced tools do. Feature
    /// `testing` only, for the race tests' counterfactual.
    #[cfg(feature = "testing")]
    Off,
}

/// Where and how an enactor writes with RFC 2136.
#[derive(Clone, Debug)]
pub struct Rfc2136Settings {
    /// The primary's DNS address (UPDATE and marker reads go over TCP).
    pub server: SocketAddr,
    /// The DNS zone the managed names are in, as the primary knows it.
    pub dns_zone: DnsName,
    pub key: TsigKey,
    /// Timeout of one exchange with the server (connect, send, answer).
    pub timeout: Duration,
    /// Attempts of one exchange on a timeout or an I/O error.
    pub attempts: u32,
    /// Marker reads and UPDATEs in flight at once, 1..=[`IN_FLIGHT_MAX`].
    pub in_flight: usize,
    pub fence: Fence,
}

/// What the fence of a name holds: its marker, or for a retired name its tombstone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    /// Neither: never written.
    Absent,
    /// The marker: the name serves plan `g`'s addresses.
    At(Generation),
    /// The tombstone: plan `g` retired the name.
    Retired(Generation),
}

impl Marker {
    pub fn generation(self) -> Generation {
        match self {
            Marker::Absent => Generation::NONE,
            Marker::At(g) | Marker::Retired(g) => g,
        }
    }
}

/// What to do with one endpoint, given its marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Unchanged,
    /// A newer plan is already there: skip, never overwrite.
    Stale {
        active: Generation,
    },
    /// Write, requiring the marker to still hold what was read.
    Write {
        expect: Marker,
    },
}

/// The decision for writing `generation` over `marker`: older → write, equal → unchanged,
/// newer → stale.
pub fn decide(generation: Generation, marker: Marker) -> Decision {
    let active = marker.generation();
    if active == generation {
        Decision::Unchanged
    } else if active > generation {
        Decision::Stale { active }
    } else {
        Decision::Write { expect: marker }
    }
}

/// The outcome of writing one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    Switched { previous: Generation },
    Unchanged,
    Stale { active: Generation },
}

#[derive(Debug, Error)]
pub enum TargetError {
    #[error("{server} is not authoritative for DNS zone {zone} (NOTAUTH); set target.dns_zone to a zone this server is primary for")]
    NotAuth { server: SocketAddr, zone: DnsName },
    #[error(
        "{server} refused the update of DNS zone {zone} (REFUSED): allow TSIG key {key} to update it (Knot: an acl with action update \
         on the zone; BIND: update-policy; PowerDNS: TSIG-ALLOW-DNSUPDATE), or check its secret (PowerDNS answers a wrong secret with \
         an unsigned REFUSED)"
    )]
    Refused { server: SocketAddr, zone: DnsName, key: String },
    #[error("{server} answered {rcode} to an update of {endpoint}")]
    Rcode { server: SocketAddr, endpoint: EndpointName, rcode: String },
    #[error(
        "TSIG with {server}: it must know key {key} with our secret and let it update DNS zone {zone} (Knot also answers BADKEY when \
         no acl with action update names the key)"
    )]
    Tsig {
        server: SocketAddr,
        zone: DnsName,
        key: String,
        #[source]
        source: Box<TsigFailure>,
    },
    #[error("no answer from {server} within {timeout:?}, {attempts} attempts")]
    Timeout { server: SocketAddr, timeout: Duration, attempts: u32 },
    #[error("DNS over TCP with {server} failed")]
    Io {
        server: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("malformed answer from {server}: {detail}")]
    Malformed { server: SocketAddr, detail: String },
    #[error("the marker {name} holds {text:?}, not one {MARKER_DIGITS}-digit generation; delete it (nothing but dnsplan may write it)")]
    BadMarker { name: String, text: String },
    /// The never-empty check, before anything is sent.
    #[error("refusing to send an update that the plan's validation refuses")]
    Invalid(#[from] ValidationError),
    #[error("endpoint {endpoint} is not in DNS zone {zone}")]
    OutsideZone { endpoint: EndpointName, zone: DnsName },
    #[error("the marker of {endpoint} moved under every one of {CAS_ROUNDS_MAX} compare-and-swap rounds; another writer keeps changing it")]
    Contention { endpoint: EndpointName },
}

impl TargetError {
    /// Whether waiting and trying again may help (the server or the network), as opposed to a
    /// configuration or authorisation error a person must fix.
    pub fn is_transient(&self) -> bool {
        matches!(self, TargetError::Timeout { .. } | TargetError::Io { .. } | TargetError::Contention { .. })
    }
}

/// The label under the DNS zone's apex that holds the tombstones of retired names.
pub const TOMBSTONES_LABEL: &str = "_dnsplan-retired";

/// `<endpoint relative to zone>._dnsplan-retired.<zone>`: outside the endpoint's subtree.
pub fn tombstone_name(endpoint: &EndpointName, zone: &DnsName) -> String {
    let relative = endpoint.as_str().strip_suffix(zone.as_str()).unwrap_or(endpoint.as_str());
    format!("{relative}{TOMBSTONES_LABEL}.{zone}")
}

/// `_dnsplan.<endpoint>`.
pub fn marker_name(endpoint: &EndpointName) -> String {
    format!("{MARKER_LABEL}.{endpoint}")
}

/// A generation as a marker holds it: [`MARKER_DIGITS`] digits, zero-padded.
pub fn marker_text(generation: Generation) -> String {
    format!("{:0width$}", generation.0, width = MARKER_DIGITS)
}

/// The generation a marker's text holds; `None` unless it is exactly [`MARKER_DIGITS`] digits.
pub fn parse_marker(text: &[u8]) -> Option<Generation> {
    if text.len() != MARKER_DIGITS || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse::<u64>().ok().map(Generation)
}

/// The addresses an endpoint serves from a plain DNS server, by family: the targets with a
/// weight, or all of a family's when none of them has one (fail open, as the authority
/// does). Plain RRsets carry no weights; the server answers with every address.
pub fn addresses(records: &Endpoint) -> (Vec<IpAddr>, Vec<IpAddr>) {
    let family = |v6: bool| {
        let all: Vec<_> = records.targets.iter().filter(|t| t.address.is_ipv6() == v6).collect();
        let weighted = all.iter().any(|t| t.weight > 0);
        all.iter().filter(|t| !weighted || t.weight > 0).map(|t| t.address).collect::<Vec<_>>()
    };
    (family(false), family(true))
}

fn dns_name(text: &str, server: SocketAddr) -> Result<Name, TargetError> {
    Name::from_ascii(text).map_err(|e| TargetError::Malformed { server, detail: format!("name {text:?}: {e}") })
}

/// The UPDATE that writes `records` (or, `None`, retires the name) at `generation` when the
/// marker holds `expect`. Refuses, before anything is sent, what the plan's endpoint
/// validation refuses: an empty endpoint is never written.
pub fn update_message(
    settings: &Rfc2136Settings,
    endpoint: &EndpointName,
    generation: Generation,
    records: Option<&Endpoint>,
    expect: Marker,
) -> Result<Message, TargetError> {
    let server = settings.server;
    if !endpoint.is_in(&settings.dns_zone) {
        return Err(TargetError::OutsideZone { endpoint: endpoint.clone(), zone: settings.dns_zone.clone() });
    }
    if let Some(records) = records {
        validate_endpoint(endpoint, records)?;
    }
    let zone = dns_name(settings.dns_zone.as_str(), server)?;
    let name = dns_name(endpoint.as_str(), server)?;
    let marker = dns_name(&marker_name(endpoint), server)?;
    let tombstone = dns_name(&tombstone_name(endpoint, &settings.dns_zone), server)?;
    let mut message = Message::new(rand::random(), MessageType::Query, OpCode::Update);
    message.add_zone(Query::query(zone, RecordType::SOA));

    // RFC 2136 §2.4.3: RRset does not exist (class NONE, TTL 0, no RDATA).
    let absent = |owner: &Name| {
        let mut none = Record::update0(owner.clone(), 0, RecordType::TXT);
        none.dns_class = DNSClass::NONE;
        none.into_record_of_rdata()
    };
    // §2.4.2: RRset exists, value dependent (class of the zone, TTL 0, the RDATA).
    let exactly = |owner: &Name, g: Generation| Record::from_rdata(owner.clone(), 0, RData::TXT(TXT::new(vec![marker_text(g)])));
    match (settings.fence, expect) {
        (Fence::Prerequisites, Marker::Absent) => {
            message.add_pre_requisite(absent(&marker));
            message.add_pre_requisite(absent(&tombstone));
        }
        (Fence::Prerequisites, Marker::At(read)) => {
            message.add_pre_requisite(exactly(&marker, read));
        }
        (Fence::Prerequisites, Marker::Retired(read)) => {
            message.add_pre_requisite(exactly(&tombstone, read));
        }
        #[cfg(feature = "testing")]
        (Fence::Off, _) => {}
    }

    // §2.5.2: delete an RRset (class ANY, TTL 0, no RDATA), then add the new ones.
    for (owner, rtype) in [(&name, RecordType::A), (&name, RecordType::AAAA), (&marker, RecordType::TXT), (&tombstone, RecordType::TXT)] {
        let mut delete = Record::update0(owner.clone(), 0, rtype);
        delete.dns_class = DNSClass::ANY;
        message.add_update(delete.into_record_of_rdata());
    }

    let ttl = records.map_or(dnsplan_common::plan::TTL_SECS_MIN, |r| r.ttl_secs);
    let fence = match records {
        Some(records) => {
            let (v4, v6) = addresses(records);
            // Validation above guarantees a weighted target, so at least one address.
            assert!(!(v4.is_empty() && v6.is_empty()), "a validated endpoint has an address");
            for address in v4.into_iter().chain(v6) {
                let data = match address {
                    IpAddr::V4(a) => RData::A(A(a)),
                    IpAddr::V6(a) => RData::AAAA(AAAA(a)),
                };
                message.add_update(Record::from_rdata(name.clone(), ttl, data));
            }
            marker
        }
        None => tombstone,
    };
    message.add_update(Record::from_rdata(fence, ttl, RData::TXT(TXT::new(vec![marker_text(generation)]))));
    Ok(message)
}

/// The address RRsets a server serves for a name, as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Served {
    pub v4: Vec<std::net::Ipv4Addr>,
    pub v6: Vec<std::net::Ipv6Addr>,
    /// The lowest TTL of those records, when there is one.
    pub ttl: Option<u32>,
}

/// What differs between what a name serves and what `records` says it should (a cause of
/// `DRIFT_CAUSES`), or `None`.
pub fn drift(served: &Served, records: &Endpoint) -> Option<&'static str> {
    let (v4, v6) = addresses(records);
    let want: std::collections::BTreeSet<IpAddr> = v4.into_iter().chain(v6).collect();
    let have: std::collections::BTreeSet<IpAddr> =
        served.v4.iter().map(|a| IpAddr::V4(*a)).chain(served.v6.iter().map(|a| IpAddr::V6(*a))).collect();
    if have.is_empty() {
        Some("missing")
    } else if have != want {
        Some("other_addresses")
    } else if served.ttl != Some(records.ttl_secs) {
        Some("other_ttl")
    } else {
        None
    }
}

/// The UPDATE that writes `records` at `generation` over a drifted name: `update_message`'s,
/// with the marker at `generation` and both address RRsets exactly as `served` required, so
/// that any write made since the read wins.
pub fn repair_message(
    settings: &Rfc2136Settings,
    endpoint: &EndpointName,
    generation: Generation,
    records: &Endpoint,
    served: &Served,
) -> Result<Message, TargetError> {
    let mut message = update_message(settings, endpoint, generation, Some(records), Marker::At(generation))?;
    let name = dns_name(endpoint.as_str(), settings.server)?;
    for (rtype, data) in [
        (RecordType::A, served.v4.iter().map(|a| RData::A(A(*a))).collect::<Vec<_>>()),
        (RecordType::AAAA, served.v6.iter().map(|a| RData::AAAA(AAAA(*a))).collect()),
    ] {
        if data.is_empty() {
            // RFC 2136 §2.4.3: RRset does not exist.
            let mut none = Record::update0(name.clone(), 0, rtype);
            none.dns_class = DNSClass::NONE;
            message.add_pre_requisite(none.into_record_of_rdata());
        } else {
            // §2.4.2: RRset exists, value dependent: every record of it, TTL 0.
            for data in data {
                message.add_pre_requisite(Record::from_rdata(name.clone(), 0, data));
            }
        }
    }
    Ok(message)
}

/// One UPDATE that writes every `(endpoint, records, marker as read)` of `group` at
/// `generation`: each name's prerequisites and updates of `update_message`, in one message
/// the server applies whole or not at all; `None` for an empty group.
pub fn group_message(
    settings: &Rfc2136Settings,
    generation: Generation,
    group: &[(EndpointName, Endpoint, Marker)],
) -> Result<Option<Message>, TargetError> {
    let mut message: Option<Message> = None;
    for (name, records, marker) in group {
        let one = update_message(settings, name, generation, Some(records), *marker)?;
        match message.as_mut() {
            None => message = Some(one),
            Some(all) => {
                all.add_pre_requisites(one.prerequisites().iter().cloned());
                all.add_updates(one.updates().iter().cloned());
            }
        }
    }
    Ok(message)
}

/// How the server answered one UPDATE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UpdateAnswer {
    Applied,
    /// NXRRSET or YXRRSET: the marker no longer holds what was read.
    PrerequisiteFailed,
}

/// An RFC 2136 primary, written through its markers.
#[derive(Clone, Debug)]
pub struct Rfc2136 {
    settings: Arc<Rfc2136Settings>,
    /// Whether the server answers, shared by every clone (see the module docs).
    reach: Arc<Reachability>,
    /// The names and causes of drift logged already (each is logged once).
    drift_logged: Arc<std::sync::Mutex<std::collections::HashSet<(EndpointName, &'static str)>>>,
    /// Open TCP connections to the server, idle between exchanges (at most `in_flight`):
    /// each exchange takes one (or connects) and gives it back, so a plan of a thousand names
    /// is a few connections, not a thousand in TIME_WAIT (RFC 7766 §6.2.1).
    idle: Arc<std::sync::Mutex<Vec<TcpStream>>>,
}

/// The text of `err` with every cause, for a log line: `outer: inner: ...`.
pub fn describe(err: &TargetError) -> String {
    dnsplan_common::store::wire::error_chain(err)
}

impl Rfc2136 {
    pub fn new(settings: Rfc2136Settings) -> Rfc2136 {
        let reach = Arc::new(Reachability::named(format!("the RFC 2136 server {}", settings.server)));
        Rfc2136 { settings: Arc::new(settings), reach, drift_logged: Arc::default(), idle: Arc::default() }
    }

    /// Whether the server is in an outage now (its last exchange got no answer).
    pub fn is_unreachable(&self) -> bool {
        self.reach.is_down()
    }

    /// The markers of `names`, in order, at most `in_flight` reads at once.
    pub async fn read_markers(&self, names: &[EndpointName]) -> Result<Vec<Marker>, TargetError> {
        let jobs = names.iter().map(|name| {
            let (target, name) = (self.clone(), name.clone());
            async move { target.read_marker(&name).await }
        });
        in_flight(jobs.collect(), self.settings.in_flight).await
    }

    /// `write` of each `(endpoint, records, marker as read)` at `generation`, in order: the
    /// names to write go [`NAMES_PER_UPDATE`] to a message, each fenced on its own marker
    /// within it, at most `in_flight` messages at once; a message refused on any
    /// prerequisite is sent again a name per message (`write`, which reads and decides
    /// again). The first error ends it.
    pub async fn write_many(
        &self,
        generation: Generation,
        items: Vec<(EndpointName, Endpoint, Marker)>,
        metrics: Arc<Metrics>,
    ) -> Result<Vec<Written>, TargetError> {
        let mut results: Vec<Option<Written>> = vec![None; items.len()];
        let mut writes = Vec::new();
        for (i, (name, records, marker)) in items.into_iter().enumerate() {
            match decide(generation, marker) {
                Decision::Unchanged => results[i] = Some(Written::Unchanged),
                Decision::Stale { active } => results[i] = Some(Written::Stale { active }),
                Decision::Write { .. } => writes.push((i, name, records, marker)),
            }
        }
        let groups: Vec<Vec<(usize, EndpointName, Endpoint, Marker)>> = {
            let mut groups = Vec::new();
            let mut rest = writes.into_iter().peekable();
            while rest.peek().is_some() {
                groups.push(rest.by_ref().take(NAMES_PER_UPDATE).collect());
            }
            groups
        };
        let jobs = groups.into_iter().map(|group| {
            let (target, metrics) = (self.clone(), metrics.clone());
            let span = tracing::debug_span!("update", endpoints = group.len(), first = %group[0].1);
            async move { target.write_group(generation, group, &metrics).await }.instrument(span)
        });
        for (i, written) in in_flight(jobs.collect(), self.settings.in_flight).await?.into_iter().flatten() {
            results[i] = Some(written);
        }
        // Invariant: every item was decided above or written by its group.
        Ok(results.into_iter().map(|w| w.expect("every item has an outcome")).collect())
    }

    /// One UPDATE for `group` (each name to be written over its marker as read), or, refused,
    /// a name per message. Outcomes by the items' indices.
    async fn write_group(
        &self,
        generation: Generation,
        group: Vec<(usize, EndpointName, Endpoint, Marker)>,
        metrics: &Metrics,
    ) -> Result<Vec<(usize, Written)>, TargetError> {
        if let [(i, name, records, marker)] = group.as_slice() {
            return Ok(vec![(*i, self.write(name, generation, Some(records), *marker, metrics).await?)]);
        }
        let parts: Vec<(EndpointName, Endpoint, Marker)> = group.iter().map(|(_, n, r, m)| (n.clone(), r.clone(), *m)).collect();
        let Some(message) = group_message(&self.settings, generation, &parts)? else { return Ok(Vec::new()) };
        match self.update(&group[0].1, message).await {
            Ok(UpdateAnswer::Applied) => Ok(group
                .iter()
                .map(|(i, _, _, marker)| {
                    metrics.target_update("applied");
                    (*i, Written::Switched { previous: marker.generation() })
                })
                .collect()),
            Ok(UpdateAnswer::PrerequisiteFailed) => {
                let mut out = Vec::with_capacity(group.len());
                for (i, name, records, marker) in &group {
                    out.push((*i, self.write(name, generation, Some(records), *marker, metrics).await?));
                }
                Ok(out)
            }
            Err(err) => {
                metrics.target_update("error");
                Err(err)
            }
        }
    }

    pub fn settings(&self) -> &Rfc2136Settings {
        &self.settings
    }

    /// For each `(endpoint, records)` whose marker holds `generation` already: reads its
    /// address RRsets and, when they drifted from `records`, writes it again through the
    /// fence (`repair_message`), at most `in_flight` at once. Returns how many were repaired.
    pub async fn repair_many(
        &self,
        generation: Generation,
        items: Vec<(EndpointName, Endpoint)>,
        metrics: Arc<Metrics>,
    ) -> Result<usize, TargetError> {
        let jobs = items.into_iter().map(|(name, records)| {
            let (target, metrics) = (self.clone(), metrics.clone());
            async move { target.repair(&name, generation, &records, &metrics).await }
        });
        Ok(in_flight(jobs.collect(), self.settings.in_flight).await?.into_iter().filter(|repaired| *repaired).count())
    }

    async fn repair(
        &self,
        endpoint: &EndpointName,
        generation: Generation,
        records: &Endpoint,
        metrics: &Metrics,
    ) -> Result<bool, TargetError> {
        let served = self.read_served(endpoint).await?;
        self.repair_from(endpoint, generation, records, &served, metrics).await
    }

    /// Writes `records` over `endpoint` if what it served when read (`served`) drifted from
    /// them, fenced on that read (`repair_message`). Whether the server applied it.
    pub async fn repair_from(
        &self,
        endpoint: &EndpointName,
        generation: Generation,
        records: &Endpoint,
        served: &Served,
        metrics: &Metrics,
    ) -> Result<bool, TargetError> {
        let Some(cause) = drift(served, records) else { return Ok(false) };
        metrics.target_drift.get_or_create(&crate::metrics::ReasonLabels { reason: cause }).inc();
        let first = self.drift_logged.lock().map(|mut logged| logged.insert((endpoint.clone(), cause))).unwrap_or(true);
        if first {
            tracing::warn!(endpoint = %endpoint, cause, served = ?served, plan = %generation, "the server's records of this name were changed behind dnsplan's back; writing the plan's again");
        }
        let message = repair_message(&self.settings, endpoint, generation, records, served)?;
        match self.update(endpoint, message).await {
            Ok(UpdateAnswer::Applied) => {
                metrics.target_update("applied");
                Ok(true)
            }
            Ok(UpdateAnswer::PrerequisiteFailed) => {
                // Changed again since the read (a newer plan, or a person): the next reconcile looks again.
                metrics.target_update("contended");
                Ok(false)
            }
            Err(err) => {
                metrics.target_update("error");
                Err(err)
            }
        }
    }

    /// The A and AAAA RRsets `endpoint` serves now (unsigned queries).
    pub async fn read_served(&self, endpoint: &EndpointName) -> Result<Served, TargetError> {
        let mut served = Served::default();
        for rtype in [RecordType::A, RecordType::AAAA] {
            let answer = self.query(endpoint, endpoint.as_str(), rtype).await?;
            for record in &answer.answers {
                match &record.data {
                    RData::A(a) => served.v4.push(a.0),
                    RData::AAAA(a) => served.v6.push(a.0),
                    _ => continue,
                }
                served.ttl = Some(served.ttl.map_or(record.ttl, |t| t.min(record.ttl)));
            }
        }
        Ok(served)
    }

    /// What `endpoint`'s fence holds now: its marker, else its tombstone (unsigned queries;
    /// the answer is advisory, the prerequisite decides).
    pub async fn read_marker(&self, endpoint: &EndpointName) -> Result<Marker, TargetError> {
        if let Some(g) = self.read_generation(endpoint, marker_name(endpoint)).await? {
            return Ok(Marker::At(g));
        }
        let tombstone = tombstone_name(endpoint, &self.settings.dns_zone);
        Ok(self.read_generation(endpoint, tombstone).await?.map_or(Marker::Absent, Marker::Retired))
    }

    /// The authoritative answer to `name` `rtype` (about `endpoint`), NXDOMAIN included.
    async fn query(&self, endpoint: &EndpointName, name: &str, rtype: RecordType) -> Result<Message, TargetError> {
        let server = self.settings.server;
        let mut query = Message::new(rand::random(), MessageType::Query, OpCode::Query);
        query.add_query(Query::query(dns_name(name, server)?, rtype));
        let answer = self.exchange(&query, None).await?;
        match answer.metadata.response_code {
            ResponseCode::NoError | ResponseCode::NXDomain => {}
            ResponseCode::NotAuth | ResponseCode::Refused => {
                return Err(TargetError::NotAuth { server, zone: self.settings.dns_zone.clone() });
            }
            other => return Err(TargetError::Rcode { server, endpoint: endpoint.clone(), rcode: other.to_string() }),
        }
        if !answer.metadata.authoritative {
            return Err(TargetError::NotAuth { server, zone: self.settings.dns_zone.clone() });
        }
        Ok(answer)
    }

    /// The generation the TXT RRset at `name` (`endpoint`'s marker or tombstone) holds.
    async fn read_generation(&self, endpoint: &EndpointName, name: String) -> Result<Option<Generation>, TargetError> {
        let answer = self.query(endpoint, &name, RecordType::TXT).await?;
        let texts: Vec<Vec<u8>> = answer
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::TXT(txt) => Some(txt.txt_data.iter().flat_map(|s| s.iter().copied()).collect()),
                _ => None,
            })
            .collect();
        match texts.as_slice() {
            [] => Ok(None),
            [one] => {
                parse_marker(one).map(Some).ok_or_else(|| TargetError::BadMarker { name, text: String::from_utf8_lossy(one).into_owned() })
            }
            many => Err(TargetError::BadMarker { name, text: format!("{} strings", many.len()) }),
        }
    }

    /// Writes `records` (`None`: retires the name) at `generation`, starting from `marker` as
    /// read before: one UPDATE fenced on it, and on a failed prerequisite a new read and
    /// decision, at most [`CAS_ROUNDS_MAX`] rounds. Counts every UPDATE's outcome.
    pub async fn write(
        &self,
        endpoint: &EndpointName,
        generation: Generation,
        records: Option<&Endpoint>,
        mut marker: Marker,
        metrics: &Metrics,
    ) -> Result<Written, TargetError> {
        for _ in 0..CAS_ROUNDS_MAX {
            let expect = match decide(generation, marker) {
                Decision::Unchanged => return Ok(Written::Unchanged),
                Decision::Stale { active } => return Ok(Written::Stale { active }),
                Decision::Write { expect } => expect,
            };
            let message = update_message(&self.settings, endpoint, generation, records, expect)?;
            match self.update(endpoint, message).await {
                Ok(UpdateAnswer::Applied) => {
                    metrics.target_update("applied");
                    return Ok(Written::Switched { previous: expect.generation() });
                }
                Ok(UpdateAnswer::PrerequisiteFailed) => {
                    marker = self.read_marker(endpoint).await?;
                    // What moved the marker says what the refusal was.
                    match decide(generation, marker) {
                        Decision::Unchanged => metrics.target_update("peer_wrote"),
                        Decision::Stale { active } => {
                            metrics.target_update("prerequisite_failed");
                            tracing::info!(endpoint = %endpoint, read = %expect.generation(), %active, "the target refused a stale write: a newer plan is there");
                        }
                        Decision::Write { .. } => metrics.target_update("contended"),
                    }
                }
                Err(err) => {
                    metrics.target_update("error");
                    return Err(err);
                }
            }
        }
        Err(TargetError::Contention { endpoint: endpoint.clone() })
    }

    /// One length-prefixed message out and one back, on an idle connection when there is one
    /// (and on a new one if the server closed that meanwhile: sending again is safe, see the
    /// module docs), else on a new connection; the connection is kept for the next exchange.
    async fn exchange_tcp(&self, packet: &[u8]) -> Result<Vec<u8>, TargetError> {
        let server = self.settings.server;
        let len = u16::try_from(packet.len()).map_err(|_| TargetError::Malformed { server, detail: "message over 65,535 bytes".into() })?;
        let mut out = Vec::with_capacity(packet.len() + 2);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(packet);
        let reused = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        if let Some(mut stream) = reused
            && let Ok(answer) = Self::send_on(&mut stream, &out).await
        {
            self.keep(stream);
            return Ok(answer);
        }
        let io = |source| TargetError::Io { server, source };
        let mut stream = TcpStream::connect(server).await.map_err(io)?;
        let _ = stream.set_nodelay(true);
        let answer = Self::send_on(&mut stream, &out).await.map_err(io)?;
        self.keep(stream);
        Ok(answer)
    }

    async fn send_on(stream: &mut TcpStream, out: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(out).await?;
        let len = usize::from(stream.read_u16().await?);
        debug_assert!(len <= ANSWER_BYTES_MAX);
        let mut buf = vec![0u8; len];
        stream.read_exact(&mut buf).await?;
        Ok(buf)
    }

    /// Keeps `stream` for a later exchange, unless `in_flight` are kept already.
    fn keep(&self, stream: TcpStream) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < self.settings.in_flight.max(1)
        {
            idle.push(stream);
        }
    }

    /// Sends one signed UPDATE and reads its verified answer.
    async fn update(&self, endpoint: &EndpointName, message: Message) -> Result<UpdateAnswer, TargetError> {
        let server = self.settings.server;
        let answer = self.exchange(&message, Some(&self.settings.key)).await?;
        match answer.metadata.response_code {
            ResponseCode::NoError => Ok(UpdateAnswer::Applied),
            ResponseCode::NXRRSet | ResponseCode::YXRRSet => Ok(UpdateAnswer::PrerequisiteFailed),
            ResponseCode::NotAuth => Err(TargetError::NotAuth { server, zone: self.settings.dns_zone.clone() }),
            ResponseCode::Refused => {
                Err(TargetError::Refused { server, zone: self.settings.dns_zone.clone(), key: self.settings.key.name().to_string() })
            }
            other => Err(TargetError::Rcode { server, endpoint: endpoint.clone(), rcode: other.to_string() }),
        }
    }

    fn tsig_error(&self, source: TsigFailure) -> TargetError {
        let s = &self.settings;
        TargetError::Tsig { server: s.server, zone: s.dns_zone.clone(), key: s.key.name().to_string(), source: Box::new(source) }
    }

    /// One exchange over TCP, signed with `key` when given (and its answer verified), retried
    /// on timeouts and I/O errors up to `attempts` times. Resending an UPDATE is safe: see the
    /// module's docs.
    async fn exchange(&self, message: &Message, key: Option<&TsigKey>) -> Result<Message, TargetError> {
        let server = self.settings.server;
        let attempts = self.settings.attempts.max(1);
        let mut last = None;
        for attempt in 1..=attempts {
            let mut message = message.clone();
            message.metadata.id = rand::random();
            let verifier = match key {
                Some(key) => Some(key.sign_query(&mut message, now_unix_secs()).map_err(|source| self.tsig_error(source))?),
                None => None,
            };
            let packet = message.to_vec().map_err(|e| TargetError::Malformed { server, detail: format!("encoding: {e}") })?;
            let result = tokio::time::timeout(self.settings.timeout, self.exchange_tcp(&packet)).await;
            let bytes = match result {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(err)) => {
                    // Once when the outage begins, with its cause; quietly after.
                    self.reach.failed(&describe(&err));
                    last = Some(err);
                    continue;
                }
                Err(_) => {
                    self.reach.failed(&format!("no answer within {:?} (attempt {attempt} of {attempts})", self.settings.timeout));
                    continue;
                }
            };
            self.reach.answered();
            let answer = match verifier {
                Some(mut verifier) => match Message::from_vec(&bytes) {
                    // An error the server could not sign (RFC 8945 §5.3.2; Knot's NOTAUTH for
                    // a zone it does not serve) is reported as what it says: it can only stop
                    // a write. Success and failed prerequisites are believed only signed.
                    Ok(unsigned) if unsigned.signature().is_none() && is_refusal(unsigned.metadata.response_code) => unsigned,
                    _ => verifier.verify(&bytes).map_err(|source| self.tsig_error(source))?,
                },
                None => Message::from_vec(&bytes).map_err(|e| TargetError::Malformed { server, detail: e.to_string() })?,
            };
            if answer.metadata.id != message.metadata.id
                || answer.metadata.message_type != MessageType::Response
                || answer.queries != message.queries
            {
                return Err(TargetError::Malformed {
                    server,
                    detail: "the answer is not to our message (id, QR or question differ)".into(),
                });
            }
            return Ok(answer);
        }
        Err(last.unwrap_or(TargetError::Timeout { server, timeout: self.settings.timeout, attempts }))
    }
}

/// Runs `jobs` as tasks, at most `limit` (clamped to 1..=[`IN_FLIGHT_MAX`]) at once, and
/// returns their results in the jobs' order; the first error ends it (the tasks still
/// running are aborted with the set).
async fn in_flight<T, F>(jobs: Vec<F>, limit: usize) -> Result<Vec<T>, TargetError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, TargetError>> + Send + 'static,
{
    let total = jobs.len();
    let mut results: Vec<Option<T>> = std::iter::repeat_with(|| None).take(total).collect();
    let mut set = JoinSet::new();
    let mut jobs = jobs.into_iter().enumerate();
    loop {
        while set.len() < limit.clamp(1, IN_FLIGHT_MAX) {
            let Some((i, job)) = jobs.next() else { break };
            set.spawn(async move { (i, job.await) });
        }
        let Some(joined) = set.join_next().await else { break };
        match joined {
            Ok((i, Ok(value))) => results[i] = Some(value),
            Ok((_, Err(err))) => return Err(err),
            // Our own tasks never panic on input; carry a bug's panic on rather than hide it.
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(err) => panic!("a target task was cancelled while its set was alive: {err}"),
        }
    }
    let results: Vec<T> = results.into_iter().flatten().collect();
    assert!(results.len() == total, "every job of the set finished");
    Ok(results)
}

/// Answers that refuse an update: believed unsigned, since they can only stop a write.
fn is_refusal(rcode: ResponseCode) -> bool {
    matches!(rcode, ResponseCode::NotAuth | ResponseCode::Refused | ResponseCode::ServFail | ResponseCode::FormErr | ResponseCode::NotImp)
}

#[cfg(test)]
mod tests;
