//! The immutable serving snapshot: everything the query path reads, built from the static
//! zone plus the store's active state, and swapped atomically after each change.
//!
//! The query path never touches the store or a lock a writer holds: it loads an `Arc` from an
//! `ArcSwap` and reads. Lookups are hash lookups, so a miss costs the same in a 10-name zone as
//! in a 1,000,000-name one.

use crate::dns_zone::StaticZone;
use dnsplan_common::store::{ActiveSnapshot, ActiveState};
use dnsplan_common::{EndpointName, Generation};
use hickory_proto::rr::{Name, Record};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// A managed endpoint as served: addresses by family with their weights.
#[derive(Clone, Debug, Default)]
pub struct Managed {
    pub endpoint: Option<EndpointName>,
    pub generation: Generation,
    pub ttl_secs: u32,
    pub v4: Vec<(Ipv4Addr, u32)>,
    pub v6: Vec<(Ipv6Addr, u32)>,
}

/// Everything served at one owner name.
#[derive(Clone, Debug, Default)]
pub struct NameData {
    pub managed: Option<Managed>,
    /// Static records at this name (the apex SOA and NS included).
    pub statics: Vec<Record>,
}

pub struct Snapshot {
    pub zone: Arc<StaticZone>,
    /// SOA serial: the store's applied-change counter mod 2^32 (RFC 1982 arithmetic is the
    /// secondaries' business; safety never compares serials).
    pub serial: u32,
    pub applied_changes: u64,
    /// Keyed by lower-case absolute name.
    names: HashMap<Name, NameData>,
    /// Names without records that have descendants (empty non-terminals): NODATA, not NXDOMAIN.
    empty_non_terminals: HashSet<Name>,
    managed_count: usize,
}

impl Snapshot {
    pub fn build(zone: Arc<StaticZone>, active: &ActiveSnapshot) -> Snapshot {
        let serial = active.applied_changes as u32; // mod 2^32 by truncation, as documented
        let mut names: HashMap<Name, NameData> = HashMap::with_capacity(active.endpoints.len() + zone.records.len() + 1);
        let apex = names.entry(zone.origin.clone()).or_default();
        apex.statics.push(zone.soa_record(serial, zone.soa_ttl_secs));
        apex.statics.extend(zone.ns.iter().cloned());
        for record in &zone.records {
            names.entry(record.name.clone()).or_default().statics.push(record.clone());
        }
        let mut managed_count = 0;
        for (endpoint, record) in &active.endpoints {
            let ActiveState::Serving(served) = &record.state else { continue };
            let Ok(name) = Name::from_ascii(endpoint.as_str()) else {
                // Invariant: every EndpointName is a valid DNS name; log rather than serve wrong.
                tracing::error!(%endpoint, "active endpoint is not a valid DNS name; not served");
                continue;
            };
            let name = name.to_lowercase();
            if !zone.origin.zone_of(&name) {
                tracing::error!(%endpoint, origin = %zone.origin, "active endpoint is outside the DNS zone; not served");
                continue;
            }
            let mut managed = Managed {
                endpoint: Some(endpoint.clone()),
                generation: record.generation,
                ttl_secs: served.ttl_secs,
                ..Managed::default()
            };
            for t in &served.targets {
                match t.address {
                    IpAddr::V4(a) => managed.v4.push((a, t.weight)),
                    IpAddr::V6(a) => managed.v6.push((a, t.weight)),
                }
            }
            names.entry(name).or_default().managed = Some(managed);
            managed_count += 1;
        }
        let mut empty_non_terminals = HashSet::new();
        for name in names.keys() {
            let mut parent = name.base_name();
            while parent.num_labels() > zone.origin.num_labels() {
                if !names.contains_key(&parent) && !empty_non_terminals.insert(parent.clone()) {
                    break; // this branch is already recorded
                }
                parent = parent.base_name();
            }
        }
        Snapshot { zone, serial, applied_changes: active.applied_changes, names, empty_non_terminals, managed_count }
    }

    /// The data at `name` (lower case).
    pub fn get(&self, name: &Name) -> Option<&NameData> {
        self.names.get(name)
    }

    pub fn is_empty_non_terminal(&self, name: &Name) -> bool {
        self.empty_non_terminals.contains(name)
    }

    pub fn managed_count(&self) -> usize {
        self.managed_count
    }

    pub fn managed(&self) -> impl Iterator<Item = &Managed> {
        self.names.values().filter_map(|d| d.managed.as_ref())
    }
}
