//! The key layout of one store under its prefix, and the fixed-width encodings compared in
//! transactions.
//!
//! Every generation and counter is 8 bytes big-endian, in keys and in values, so etcd's byte
//! comparison (`Compare::value` with `Less`) is numeric comparison and a key range over
//! generations is a numeric range. An endpoint name is always the last part of its key, so
//! no separator has to follow it.
//!
//! The keys, under the prefix:
//!
//! | key | value |
//! |---|---|
//! | `meta/latest`, `meta/applied` and `meta/applied/NN`, `meta/control` | the version: latest generation, applied-change count (the sum of 16 slots), control count (what `wait_for_change` watches) |
//! | `state/layout`, `state/horizon`, `state/dns_zone`, `state/pause`, `state/heartbeats`, `state/authorities` | the layout's version (`LAYOUT`) and the oldest stored plan (both written by the first publish), the DNS zone, the pause, the heartbeat and authority-report counts |
//! | `plans/g`, `summaries/g`, `changes/g` | plan `g` (inline, or a manifest of its chunks), its summary, its `PlanChanges` against its parent |
//! | `blobs/g nonce kind index` | chunks of a plan or its changes larger than a quarter of a request (each half a request) |
//! | `staging/g nonce` | a publish in progress that wrote chunks |
//! | `active/name`, `fence/name` | the endpoint's `ActiveRecord`, and its fence (generation) alone |
//! | `serving/g name` | index of serving endpoints by generation: the first key is the oldest active fence |
//! | `lease/record`, `lease/live` | the planner `Lease`; the live key (epoch ++ holder) is attached to an etcd lease of the TTL |
//! | `heartbeats/id` | an enactor's heartbeat |
//! | `authorities/id` | an authority's `AuthorityReport` |
//! | `dnssec/keys` | the zone's DNSSEC keys as its authorities share them (`Store::dnssec_keys`: private keys sealed), versioned by its mod revision |
//! | `zones/registry/<origin>` | a zone added beside the first: its `ManagedZone` (live with its incarnation, or a tombstone) |
//! | `zones/z/<origin>/...` | that zone's own store, this layout under it, plus `state/live` (its incarnation, compared by each of its transactions) and `state/master` (its master file) |

use dnsplan_common::Generation;
use dnsplan_common::names::EndpointName;

/// The keys of one store. Every key starts with the store's prefix, so one cluster holds
/// several independent stores.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: Vec<u8>,
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    let mut key = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        key.extend_from_slice(p);
    }
    key
}

pub(crate) use crate::client::prefix_end;

impl Keys {
    pub(crate) fn new(prefix: &str) -> Keys {
        Keys { prefix: prefix.as_bytes().to_vec() }
    }

    fn k(&self, parts: &[&[u8]]) -> Vec<u8> {
        let mut all = vec![self.prefix.as_slice()];
        all.extend_from_slice(parts);
        join(&all)
    }

    // meta/: the counters and flags a `wait_for_change` waiter watches.
    pub(crate) fn meta(&self) -> Vec<u8> {
        self.k(&[b"meta/"])
    }
    pub(crate) fn latest(&self) -> Vec<u8> {
        self.k(&[b"meta/latest"])
    }
    /// The applied-change count is kept in slots, `meta/applied` (slot 0) and
    /// `meta/applied/NN`: a switch adds to one slot, the count is their sum, and every slot
    /// key starts with `applied()`, so one prefix read gets them all.
    pub(crate) fn applied(&self) -> Vec<u8> {
        self.k(&[b"meta/applied"])
    }
    pub(crate) fn applied_slot(&self, slot: usize) -> Vec<u8> {
        if slot == 0 { self.applied() } else { self.k(&[b"meta/applied/", format!("{slot:02}").as_bytes()]) }
    }
    pub(crate) fn control(&self) -> Vec<u8> {
        self.k(&[b"meta/control"])
    }
    pub(crate) fn horizon(&self) -> Vec<u8> {
        self.k(&[b"state/horizon"])
    }
    /// The generation the first plan follows: written when a zone is added again under a
    /// removed zone's name (`Store::generation_base`).
    pub(crate) fn generation_base(&self) -> Vec<u8> {
        self.k(&[b"state/generation_base"])
    }
    pub(crate) fn layout(&self) -> Vec<u8> {
        self.k(&[b"state/layout"])
    }
    pub(crate) fn dns_zone(&self) -> Vec<u8> {
        self.k(&[b"state/dns_zone"])
    }
    pub(crate) fn pause(&self) -> Vec<u8> {
        self.k(&[b"state/pause"])
    }
    pub(crate) fn heartbeat_count(&self) -> Vec<u8> {
        self.k(&[b"state/heartbeats"])
    }
    pub(crate) fn authority_count(&self) -> Vec<u8> {
        self.k(&[b"state/authorities"])
    }

    // Plans: written by publish's transaction, removed by cleanup's.
    pub(crate) fn plan(&self, g: Generation) -> Vec<u8> {
        self.k(&[b"plans/", &g.to_be_bytes()])
    }
    pub(crate) fn summaries(&self) -> Vec<u8> {
        self.k(&[b"summaries/"])
    }
    pub(crate) fn summary(&self, g: Generation) -> Vec<u8> {
        self.k(&[b"summaries/", &g.to_be_bytes()])
    }
    pub(crate) fn changes(&self) -> Vec<u8> {
        self.k(&[b"changes/"])
    }
    pub(crate) fn plan_changes(&self, g: Generation) -> Vec<u8> {
        self.k(&[b"changes/", &g.to_be_bytes()])
    }
    /// Chunks of large plans and plan changes: `blobs/ g nonce kind index`.
    pub(crate) fn blobs(&self) -> Vec<u8> {
        self.k(&[b"blobs/"])
    }
    pub(crate) fn blob_set(&self, g: Generation, nonce: u64) -> Vec<u8> {
        self.k(&[b"blobs/", &g.to_be_bytes(), &nonce.to_be_bytes()])
    }
    pub(crate) fn blob_chunk(&self, g: Generation, nonce: u64, kind: u8, index: u32) -> Vec<u8> {
        self.k(&[b"blobs/", &g.to_be_bytes(), &nonce.to_be_bytes(), &[kind], &index.to_be_bytes()])
    }
    /// A publish in progress that has written chunks: `staging/ g nonce` → start time.
    pub(crate) fn staging_all(&self) -> Vec<u8> {
        self.k(&[b"staging/"])
    }
    pub(crate) fn staging(&self, g: Generation, nonce: u64) -> Vec<u8> {
        self.k(&[b"staging/", &g.to_be_bytes(), &nonce.to_be_bytes()])
    }

    // Endpoints: written by apply's transactions.
    pub(crate) fn active_all(&self) -> Vec<u8> {
        self.k(&[b"active/"])
    }
    pub(crate) fn active(&self, name: &EndpointName) -> Vec<u8> {
        self.k(&[b"active/", name.as_str().as_bytes()])
    }
    /// The fence: the endpoint's active generation, 8 bytes big-endian.
    pub(crate) fn fence(&self, name: &EndpointName) -> Vec<u8> {
        self.k(&[b"fence/", name.as_str().as_bytes()])
    }
    /// The index of serving endpoints by generation: `serving/ g name` → empty. Its first key
    /// is the oldest active generation.
    pub(crate) fn serving_all(&self) -> Vec<u8> {
        self.k(&[b"serving/"])
    }
    pub(crate) fn serving(&self, g: Generation, name: &EndpointName) -> Vec<u8> {
        self.k(&[b"serving/", &g.to_be_bytes(), name.as_str().as_bytes()])
    }
    pub(crate) fn serving_below(&self, g: Generation) -> Vec<u8> {
        self.k(&[b"serving/", &g.to_be_bytes()])
    }

    // The planner lease.
    pub(crate) fn lease_record(&self) -> Vec<u8> {
        self.k(&[b"lease/record"])
    }
    /// Attached to an etcd lease: exists exactly while the planner lease is live.
    pub(crate) fn lease_live(&self) -> Vec<u8> {
        self.k(&[b"lease/live"])
    }

    pub(crate) fn heartbeats(&self) -> Vec<u8> {
        self.k(&[b"heartbeats/"])
    }
    pub(crate) fn heartbeat(&self, id: &str) -> Vec<u8> {
        self.k(&[b"heartbeats/", id.as_bytes()])
    }
    pub(crate) fn authorities(&self) -> Vec<u8> {
        self.k(&[b"authorities/"])
    }
    pub(crate) fn dnssec_keys(&self) -> Vec<u8> {
        self.k(&[b"dnssec/keys"])
    }
    pub(crate) fn authority(&self, id: &str) -> Vec<u8> {
        self.k(&[b"authorities/", id.as_bytes()])
    }

    /// The part of `key` after `prefix`, if it starts with it.
    pub(crate) fn strip<'a>(key: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
        key.strip_prefix(prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_endian_keys_sort_numerically() {
        let keys = Keys::new("/p/");
        let mut gens: Vec<u64> = vec![1, 255, 256, 65_536, 2, 1 << 40, 0];
        let mut encoded: Vec<Vec<u8>> = gens.iter().map(|g| keys.plan(Generation(*g))).collect();
        gens.sort();
        encoded.sort();
        let back: Vec<u64> = encoded.iter().map(|k| u64::from_be_bytes(k[k.len() - 8..].try_into().expect("8 bytes"))).collect();
        assert_eq!(back, gens);
        assert_eq!(prefix_end(b"/p/"), b"/p0");
        assert!(keys.serving_below(Generation(3)) > keys.serving(Generation(2), &EndpointName::parse("zz.example.").expect("name")));
    }
}
