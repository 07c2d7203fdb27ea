//! The immutable serving snapshot: everything the query path reads, built from the static
//! zone plus the store's active state, and swapped atomically after each change.
//!
//! The query path never touches the store or a lock a writer holds: it loads an `Arc` from an
//! `ArcSwap` and reads. Names are keyed by their lower-case wire form in a hash table split
//! into `SHARDS` shards, so a miss costs the same in a 10-name zone as in a 1,000,000-name
//! one, and a change copies only the shards it touches: `apply(delta)` shares every other
//! shard, and every untouched entry, with the previous snapshot.
//!
//! A managed endpoint's key is built from its `EndpointName` text (lower case, labels of
//! letters, digits, `-` and `_`), with no DNS name parse; a name whose wire form ends with the
//! origin's bytes but not on a label boundary is outside the zone and not served. An entry
//! keeps its key and its managed targets inline, and its static records, in wire form, behind
//! one pointer that is null for the names without any (`Statics`), so a million names cost no
//! allocation each for what they do not have, and a million static names a few bytes of
//! records each. A static zone, which never changes, has as few shards as its names need
//! (`shards_for`). Each entry counts the names with data below it, so an
//! empty non-terminal is an entry without data and a miss is one lookup. The SOA's RDATA with
//! the current serial and the apex NS answer with its in-zone glue (`ApexNs`) are
//! precompiled; the fast path uses the latter only while no in-zone name server is a managed
//! endpoint and the apex has no CNAME.

use crate::zone::compress::{Written, is_label_start, write_name};
use crate::zone::dns_zone::StaticZone;
use crate::zone::serial::serial_of;
use dnsplan_common::store::{ActiveDelta, ActiveRecord, ActiveSnapshot, ActiveState};
use dnsplan_common::{EndpointName, Generation};
use hashbrown::HashTable;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use smallvec::SmallVec;
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, LazyLock};

/// Shards of a managed zone's name table. A change of `k` names copies at most `k` shards
/// (of about `names / SHARDS` entry pointers each). A static zone, which never changes, gets
/// as few as hold its names (`shards_for`), so ten thousand small zones do not cost ten
/// thousand times 1,024 empty tables.
pub const SHARDS: usize = 1024;

/// The shards of a table that will hold `names` names and never change: a power of two,
/// about 64 names a shard, at most `SHARDS`.
pub fn shards_for(names: usize) -> usize {
    (names / 64).next_power_of_two().clamp(1, SHARDS)
}
/// Longest name in wire form (RFC 1035 §2.3.4).
pub const NAME_WIRE_BYTES_MAX: usize = 255;

/// One hasher for the life of the process, randomly seeded, so that keys stay in their shard
/// from one snapshot to the next and names chosen by a client cannot aim at one bucket.
static HASHER: LazyLock<foldhash::quality::RandomState> = LazyLock::new(foldhash::quality::RandomState::default);

/// The hash of a lower-case wire-form name.
pub fn hash_key(key: &[u8]) -> u64 {
    HASHER.hash_one(key)
}

/// Names per shard past which a managed zone's table is split into more shards: four times
/// `shards_for`'s 64, so a table grows fourfold between two splits, and a split (every entry's
/// pointer moved once) costs about a third of a name per name added.
pub const SHARD_NAMES_MAX: usize = 256;

/// The shard of `hash` among `shards` (a power of two).
fn shard_of(hash: u64, shards: usize) -> usize {
    // The table uses the low bits for its buckets and the top 7 for its tags; the shard comes
    // from bits in between so the three stay independent.
    ((hash >> 32) as usize) & (shards - 1)
}

/// The lower-case wire form of `name` (labels with length bytes, ending in the root).
pub fn wire_key(name: &Name) -> Vec<u8> {
    let mut key = Vec::with_capacity(name.len() + 2);
    for label in name.iter() {
        key.push(label.len() as u8);
        key.extend(label.iter().map(u8::to_ascii_lowercase));
    }
    key.push(0);
    key
}

/// SOA RDATA after MNAME and RNAME: five 32-bit numbers.
pub const SOA_TAIL_BYTES: usize = 20;

/// The answer to `origin IN NS`, precompiled for the fast path as it follows a question for
/// the origin at offset 12 (whose length is the origin's, so every offset is known): the NS
/// RRset, then the glue, the in-zone name servers' static A RRsets and then their AAAA
/// RRsets, in NS order (NSD's order, so a size limit keeps the IPv4 glue of every server
/// first). Names are compressed (`compress`): the RRset's owner points at the question, each
/// server's name at the question or an earlier server, each glue owner at its server's name.
#[derive(Debug)]
pub struct ApexNs {
    /// The answer section, then the glue RRsets.
    pub wire: Box<[u8]>,
    pub answers: u16,
    /// Where the answer section ends in `wire`.
    pub answers_end: usize,
    /// Where each glue RRset ends in `wire`, with the glue records up to there, in order.
    pub glue: Box<[(usize, u16)]>,
    /// The in-zone name servers, in lower-case wire form (those with glue and without).
    servers: Box<[Box<[u8]>]>,
}

impl ApexNs {
    /// The apex NS answer of `zone`; `None` if the apex has a CNAME (which the reference path
    /// answers instead, RFC 1034 §3.6.2).
    fn build(zone: &StaticZone, origin_key: &[u8]) -> Option<ApexNs> {
        if zone.records.iter().any(|r| r.record_type() == RecordType::CNAME && r.name == zone.origin) {
            return None;
        }
        let question_end = 12 + origin_key.len() + 4;
        let mut out = vec![0u8; question_end];
        let targets: Vec<(u32, Vec<u8>)> = zone
            .ns
            .iter()
            .filter_map(|r| match &r.data {
                RData::NS(ns) => Some((r.ttl, wire_key(&ns.0))),
                _ => None,
            })
            .collect();
        let mut written = vec![Written::whole(origin_key, 12)];
        let mut servers: Vec<&[u8]> = Vec::new();
        for (ttl, target) in &targets {
            out.extend_from_slice(&[0xc0, 0x0c]);
            out.extend_from_slice(&u16::from(RecordType::NS).to_be_bytes());
            out.extend_from_slice(&CLASS_IN.to_be_bytes());
            out.extend_from_slice(&ttl.to_be_bytes());
            let rdlength_at = out.len();
            out.extend_from_slice(&[0, 0]);
            written.push(write_name(&mut out, target, &written));
            let rdlength = (out.len() - rdlength_at - 2) as u16;
            out[rdlength_at..rdlength_at + 2].copy_from_slice(&rdlength.to_be_bytes());
            let in_zone = target.ends_with(origin_key) && is_label_start(target, target.len() - origin_key.len());
            if in_zone && !servers.contains(&&target[..]) {
                servers.push(target);
            }
        }
        let answers_end = out.len() - question_end;
        let mut glue = Vec::new();
        let mut glue_records = 0u16;
        // A server's name with a CNAME answers the CNAME (RFC 1034 §3.6.2), never glue.
        let aliased = |server: &[u8]| zone.records.iter().any(|r| r.record_type() == RecordType::CNAME && wire_key(&r.name) == server);
        for rtype in [RecordType::A, RecordType::AAAA] {
            for &server in servers.iter().filter(|&&server| !aliased(server)) {
                let mut records = 0;
                for r in zone.records.iter().filter(|r| r.record_type() == rtype && wire_key(&r.name) == server) {
                    let address = match &r.data {
                        RData::A(a) => a.0.octets().to_vec(),
                        RData::AAAA(a) => a.0.octets().to_vec(),
                        _ => continue,
                    };
                    // The owner points at the server's name in the NS RRset.
                    write_name(&mut out, server, &written);
                    out.extend_from_slice(&u16::from(rtype).to_be_bytes());
                    out.extend_from_slice(&CLASS_IN.to_be_bytes());
                    out.extend_from_slice(&r.ttl.to_be_bytes());
                    out.extend_from_slice(&(address.len() as u16).to_be_bytes());
                    out.extend_from_slice(&address);
                    records += 1;
                }
                if records > 0 {
                    glue_records += records;
                    glue.push((out.len() - question_end, glue_records));
                }
            }
        }
        Some(ApexNs {
            wire: out[question_end..].into(),
            answers: targets.len() as u16,
            answers_end,
            glue: glue.into(),
            servers: servers.iter().map(|&s| Box::from(s)).collect(),
        })
    }
}

const CLASS_IN: u16 = 1;

/// The targets of one address family as served: only those eligible (non-zero weight, or all
/// of them when every weight is zero, which then weigh 1 each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Family<T, const N: usize> {
    /// Inline up to `N` targets, so the common answer reads no further memory.
    pub targets: SmallVec<[(T, u32); N]>,
}

impl<T, const N: usize> Default for Family<T, N> {
    fn default() -> Self {
        Family { targets: SmallVec::new() }
    }
}

impl<T: Copy, const N: usize> Family<T, N> {
    fn new(all: &[(T, u32)]) -> Family<T, N> {
        let any_weighted = all.iter().any(|(_, w)| *w > 0);
        let targets: SmallVec<[(T, u32); N]> =
            all.iter().filter(|(_, w)| !any_weighted || *w > 0).map(|&(t, w)| (t, if any_weighted { w } else { 1 })).collect();
        Family { targets }
    }
}

impl<T, const N: usize> Family<T, N> {
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// Every target has the same weight: sampling is a uniform shuffle. Found when asked (a
    /// few comparisons) rather than kept: a flag beside each family would make `Managed` a
    /// size class larger.
    pub fn uniform(&self) -> bool {
        self.targets.windows(2).all(|w| w[0].1 == w[1].1)
    }
}

/// A managed endpoint as served: addresses by family with their weights. 84 bytes, so that
/// with its box it takes the allocator's 96-byte size class (`entry_sizes`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Managed {
    pub generation: Generation,
    pub ttl_secs: u32,
    pub v4: Family<Ipv4Addr, 4>,
    pub v6: Family<Ipv6Addr, 1>,
}

impl Managed {
    fn from_record(record: &ActiveRecord) -> Option<Box<Managed>> {
        let ActiveState::Serving(served) = &record.state else { return None };
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for t in &served.targets {
            match t.address {
                IpAddr::V4(a) => v4.push((a, t.weight)),
                IpAddr::V6(a) => v6.push((a, t.weight)),
            }
        }
        Some(Box::new(Managed { generation: record.generation, ttl_secs: served.ttl_secs, v4: Family::new(&v4), v6: Family::new(&v6) }))
    }
}

/// The static records at one name, in wire form: for each, its type (2 bytes), TTL (4) and
/// RDATA length (2), then the RDATA, names in it uncompressed and in their own case; class IN
/// (the only class loaded). One boxed slice of exactly those bytes, null for the names that
/// have none (almost every managed endpoint). 12 bytes for an A record where hickory's
/// `Record` takes 280: a million static names fit in a quarter of the memory. The fast path
/// reads the bytes as they are; the reference path decodes a name's records when it answers
/// from them (`records`).
///
/// In a signed zone the name's signatures (`zone::signed`: an RRSIG per RRset, its NSEC and
/// the NSEC's RRSIG) follow its records in the same allocation, after a record header of type
/// 0 (reserved, never a record's: the loader refuses it), so that an entry keeps its size:
/// `raw`, `records`, `has` and `bytes` see the records alone, `signed_raw` the signatures.
#[derive(Clone, Debug, Default)]
pub struct Statics(Option<Box<[u8]>>);

/// The header that ends a name's records where its signatures follow: type 0, TTL 0, no RDATA.
const SIGNED_FROM: [u8; 8] = [0; 8];

/// One static record as stored: its type, TTL and RDATA in wire form.
#[derive(Clone, Copy, Debug)]
pub struct RawRecord<'a> {
    pub rtype: RecordType,
    pub ttl: u32,
    pub rdata: &'a [u8],
}

impl Statics {
    /// Adds `record` (class IN). One whose RDATA does not encode, which the loader never
    /// gives, is left out with an ERROR line.
    pub fn push(&mut self, record: &Record) {
        if record.record_type() == RecordType::Unknown(0) {
            tracing::error!(record = %record, "a static record of type 0 (reserved) is not served");
            return;
        }
        let mut rdata = Vec::new();
        let mut encoder = hickory_proto::serialize::binary::BinEncoder::new(&mut rdata);
        encoder.set_name_encoding(hickory_proto::serialize::binary::NameEncoding::Uncompressed);
        if let Err(err) = hickory_proto::serialize::binary::BinEncodable::emit(&record.data, &mut encoder) {
            tracing::error!(record = %record, error = %err, "a static record does not encode; not served");
            return;
        }
        let Ok(rdlen) = u16::try_from(rdata.len()) else {
            tracing::error!(record = %record, "a static record's data is over 65,535 bytes; not served");
            return;
        };
        let signed = self.signed_bytes().to_vec();
        let mut all = self.bytes().to_vec();
        all.reserve_exact(8 + rdata.len() + signed.len() + SIGNED_FROM.len());
        all.extend_from_slice(&u16::from(record.record_type()).to_be_bytes());
        all.extend_from_slice(&record.ttl.to_be_bytes());
        all.extend_from_slice(&rdlen.to_be_bytes());
        all.extend_from_slice(&rdata);
        self.0 = Some(all.into_boxed_slice());
        self.set_signed(&signed);
    }

    /// Where the records end: at the `SIGNED_FROM` header, or at the end.
    fn records_end(&self) -> usize {
        let all = self.0.as_deref().unwrap_or(&[]);
        let mut at = 0;
        while let Some(head) = all.get(at..at + 8) {
            if head[..2] == [0, 0] {
                return at;
            }
            at += 8 + usize::from(u16::from_be_bytes([head[6], head[7]]));
        }
        all.len()
    }

    /// The signatures' records in wire form (as `bytes`), empty if none.
    pub fn signed_bytes(&self) -> &[u8] {
        let all = self.0.as_deref().unwrap_or(&[]);
        all.get(self.records_end() + SIGNED_FROM.len()..).unwrap_or(&[])
    }

    /// Replaces the signatures with `signed` (records in wire form, as `bytes` gives them).
    pub fn set_signed(&mut self, signed: &[u8]) {
        let records = self.bytes();
        if signed.is_empty() && records.len() == self.0.as_deref().map_or(0, <[u8]>::len) {
            return;
        }
        let mut all = Vec::with_capacity(records.len() + SIGNED_FROM.len() + signed.len());
        all.extend_from_slice(records);
        if !signed.is_empty() {
            all.extend_from_slice(&SIGNED_FROM);
            all.extend_from_slice(signed);
        }
        self.0 = (!all.is_empty()).then(|| all.into_boxed_slice());
    }

    /// The signatures, as `raw` gives the records.
    pub fn signed_raw(&self) -> impl Iterator<Item = RawRecord<'_>> {
        Statics::raw_of(self.signed_bytes())
    }

    /// Adds a record of type `rtype` whose RDATA is `rdata` in wire form (names uncompressed).
    /// (For building signatures: it does not keep any signed part.)
    pub fn push_raw(&mut self, rtype: RecordType, ttl: u32, rdata: &[u8]) {
        let Ok(rdlen) = u16::try_from(rdata.len()) else { return };
        let mut all = self.0.take().map(Vec::from).unwrap_or_default();
        all.reserve_exact(8 + rdata.len());
        all.extend_from_slice(&u16::from(rtype).to_be_bytes());
        all.extend_from_slice(&ttl.to_be_bytes());
        all.extend_from_slice(&rdlen.to_be_bytes());
        all.extend_from_slice(rdata);
        self.0 = Some(all.into_boxed_slice());
    }

    /// No records (signatures aside).
    pub fn is_empty(&self) -> bool {
        self.0.as_deref().is_none_or(|all| all.get(..2) == Some(&[0, 0]))
    }

    /// The records' bytes, without the signatures (for the zones' image on disk,
    /// `serving::zone_image`).
    pub fn bytes(&self) -> &[u8] {
        let all = self.0.as_deref().unwrap_or(&[]);
        &all[..self.records_end()]
    }

    /// Records from bytes `bytes` gave; `None` unless they frame as whole records.
    pub fn from_bytes(bytes: Vec<u8>) -> Option<Statics> {
        let statics = Statics((!bytes.is_empty()).then(|| bytes.into_boxed_slice()));
        let framed: usize = statics.raw().map(|r| 8 + r.rdata.len()).sum();
        (framed == statics.bytes().len()).then_some(statics)
    }

    /// Every record as stored, in the order pushed (the signatures not among them).
    pub fn raw(&self) -> impl Iterator<Item = RawRecord<'_>> {
        Statics::raw_of(self.0.as_deref().unwrap_or(&[]))
    }

    /// The records in `bytes`, up to a `SIGNED_FROM` header.
    fn raw_of(bytes: &[u8]) -> impl Iterator<Item = RawRecord<'_>> {
        let mut rest: &[u8] = bytes;
        std::iter::from_fn(move || {
            let (head, tail) = rest.split_at_checked(8)?;
            if head[..2] == [0, 0] {
                return None;
            }
            let rtype = RecordType::from(u16::from_be_bytes([head[0], head[1]]));
            let ttl = u32::from_be_bytes([head[2], head[3], head[4], head[5]]);
            let (rdata, tail) = tail.split_at_checked(usize::from(u16::from_be_bytes([head[6], head[7]])))?;
            rest = tail;
            Some(RawRecord { rtype, ttl, rdata })
        })
    }

    /// Whether a record of type `rtype` is here.
    pub fn has(&self, rtype: RecordType) -> bool {
        self.raw().any(|r| r.rtype == rtype)
    }

    /// The records decoded, owned by `owner`, in the order pushed.
    pub fn records(&self, owner: &Name) -> Vec<Record> {
        self.raw()
            .filter_map(|r| {
                let mut decoder = hickory_proto::serialize::binary::BinDecoder::new(r.rdata);
                let length = hickory_proto::serialize::binary::Restrict::new(r.rdata.len() as u16);
                let data = RData::read(&mut decoder, r.rtype, length).ok()?;
                Some(Record::from_rdata(owner.clone(), r.ttl, data))
            })
            .collect()
    }
}

/// Everything served at one owner name, plus how many names with data lie below it (a name
/// without data but with descendants is an empty non-terminal: NODATA, not NXDOMAIN).
#[derive(Clone, Debug, Default)]
pub struct Entry {
    /// Lower-case wire form, inline up to 32 bytes (most names), beside the rest of the entry:
    /// an entry is 72 bytes, 88 with its `Arc`, in the allocator's 96-byte size class.
    pub key: SmallVec<[u8; 32]>,
    /// A managed endpoint's addresses, boxed: most names of a zone of static records have
    /// none, and inline they made every entry 168 bytes (192 with its `Arc`) rather than 72.
    /// A managed name costs the same 192 bytes as inline (two 96-byte allocations) and one
    /// more pointer read per answer.
    pub managed: Option<Box<Managed>>,
    /// Static records at this name (the apex SOA and NS included).
    pub statics: Statics,
    descendants: u32,
}

impl Entry {
    /// What this name's signatures cover, hashed: its records, and a managed endpoint's TTL
    /// and eligible addresses (not its generation, nor its weights). A hash, not a copy: a
    /// plan that moves every fence calls this twice per name, and copies cost a signed zone
    /// of 100,000 names milliseconds per change.
    fn signs(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        self.statics.bytes().hash(&mut hasher);
        if let Some(m) = &self.managed {
            m.ttl_secs.hash(&mut hasher);
            m.v4.targets.iter().for_each(|(a, _)| a.hash(&mut hasher));
            0xfeu8.hash(&mut hasher);
            m.v6.targets.iter().for_each(|(a, _)| a.hash(&mut hasher));
        }
        hasher.finish()
    }

    pub fn has_data(&self) -> bool {
        self.managed.is_some() || !self.statics.is_empty()
    }

    /// The owner name, from the lower-case wire form. `None` only if the key is not a name,
    /// which `wire_key` never makes.
    pub fn name(&self) -> Option<Name> {
        let mut labels = Vec::new();
        let mut rest = &self.key[..];
        while let Some((&len, tail)) = rest.split_first() {
            if len == 0 {
                break;
            }
            let (label, tail) = tail.split_at_checked(usize::from(len))?;
            labels.push(label);
            rest = tail;
        }
        let mut name = Name::from_labels(labels).ok()?;
        name.set_fqdn(true);
        Some(name)
    }

    /// The endpoint name in text form.
    pub fn endpoint(&self) -> Option<EndpointName> {
        let mut text = String::with_capacity(self.key.len());
        let mut rest = &self.key[..];
        while let Some((&len, tail)) = rest.split_first() {
            if len == 0 {
                break;
            }
            let (label, tail) = tail.split_at_checked(usize::from(len))?;
            text.push_str(std::str::from_utf8(label).ok()?);
            text.push('.');
            rest = tail;
        }
        EndpointName::parse(&text).ok()
    }
}

/// What a zone has for a name (`Snapshot::find`).
#[derive(Clone, Copy, Debug)]
pub enum Found<'a> {
    /// The name's own entry, with data.
    Name(&'a Entry),
    /// A zone cut at or above the name, below the apex: the entry at the cut. Queries at
    /// and below it get a referral, except DS at the cut itself (the parent's data).
    Cut(&'a Entry),
    /// The name does not exist and a wildcard covers it: the wildcard's entry, the source of
    /// synthesis (possibly without data: an empty non-terminal).
    Wildcard(&'a Entry),
    /// An empty non-terminal: the name exists, without data (NODATA).
    Empty,
    /// The name does not exist, and no wildcard covers it (NXDOMAIN).
    Missing,
}

type Shard = HashTable<Arc<Entry>>;

/// The entry at `key` in `shards`, made if missing; copied first where shared.
fn entry_in<'a>(shards: &'a mut Arc<[Arc<Shard>]>, key: &[u8]) -> &'a mut Entry {
    let hash = hash_key(key);
    let n = shards.len();
    let shard = Arc::make_mut(&mut Arc::make_mut(shards)[shard_of(hash, n)]);
    let entry = shard
        .entry(hash, |e| &*e.key == key, |e| hash_key(&e.key))
        .or_insert_with(|| Arc::new(Entry { key: SmallVec::from_slice(key), ..Entry::default() }))
        .into_mut();
    Arc::make_mut(entry)
}

#[derive(Clone)]
pub struct Snapshot {
    pub zone: Arc<StaticZone>,
    /// SOA serial: `serial_of(zone.serial_base, content_changes)`, plus `signing_term` in a
    /// signed zone (safety never compares serials; secondaries do, in RFC 1982 arithmetic).
    pub serial: u32,
    /// The store's applied-change count this snapshot is the state at: what the follower asks
    /// the changes since.
    pub applied_changes: u64,
    /// The store's content-change count at `applied_changes`: it moves only when what is
    /// served changes, so a plan that only moves fences leaves the serial as it was.
    pub content_changes: u64,
    /// The origin in lower-case wire form.
    pub origin_key: Box<[u8]>,
    pub origin_labels: usize,
    /// The SOA's MNAME and RNAME in lower-case wire form, for answers that compress them.
    pub soa_names: Arc<[Box<[u8]>; 2]>,
    /// The SOA's RDATA after the names, with this snapshot's serial: serial, refresh, retry,
    /// expire, minimum.
    pub soa_tail: [u8; SOA_TAIL_BYTES],
    /// The precompiled answer to `origin NS` while the fast path may send it: `None` while
    /// an in-zone name server is a managed endpoint (its glue is then the plan's addresses,
    /// which the reference path samples), or when the apex has a CNAME.
    pub apex_ns: Option<Arc<ApexNs>>,
    /// The precompiled apex NS answer, whether or not it may be sent.
    apex_ns_static: Option<Arc<ApexNs>>,
    shards: Arc<[Arc<Shard>]>,
    /// The shards of the static names alone (`statics_in`'s), which a whole state is rebuilt
    /// on (`apply` of a full delta): the zone's records are not kept beside them. Entries are
    /// shared with `shards` until a managed endpoint changes one.
    pub(super) statics: Arc<[Arc<Shard>]>,
    managed_count: usize,
    /// How many managed endpoints serve each generation.
    generations: Arc<BTreeMap<Generation, usize>>,
    /// Endpoints the store says to serve that this zone cannot (at or below a delegation,
    /// outside the zone): `dnsplan_managed_endpoints_not_served`.
    not_served: Arc<std::collections::BTreeSet<EndpointName>>,
    /// A signed zone's NSEC owners in canonical order (`signed`); `None` unsigned.
    pub(super) chain: Option<Arc<crate::zone::chain::NsecChain>>,
    /// The chain of the static names alone (`statics`'s).
    pub(super) statics_chain: Option<Arc<crate::zone::chain::NsecChain>>,
    /// The period start the static names' signatures (`statics`'s) were made for: a whole
    /// state rebuilt on them serves those, so it is as old as they are (`resign_due`).
    pub(super) statics_signed_at: u32,
    /// Names changed since they were last signed (a signed zone's), signed at `set_serial`.
    pub(super) unsigned: Vec<Box<[u8]>>,
    /// The start of the period (`ZoneSigner::period_secs`) every signature was last made again
    /// in, seconds since the epoch: the signatures of a whole signing are valid from it, so it
    /// is the oldest any signature served can be.
    pub(super) signed_all_at: u32,
    /// A signed zone's part of the serial (`set_serial`): the period start of its last whole
    /// signing (`signed_all_at`) plus how many times of its key schedule fell since the start
    /// of the period before (`SigningKeys::events_since`), never back within a process (a whole state rebuilt on
    /// older static signatures keeps it). A zone signed again whole before its signatures
    /// expire (a new period: at least a day on) or whose keys changed has a new serial, and
    /// secondaries transfer it. It follows from the time and the key schedule alone, so a
    /// restart in the same period, or another authority with the same keys, serves the same.
    pub(super) signing_term: u32,
    /// A round of signing every name again under way (`resign_step`).
    pub(super) round: Option<crate::zone::signed::Round>,
    /// The names whose signatures the last signing made again, besides the names changed
    /// (the IXFR history carries them); `None` when it signed every name.
    pub(super) last_signed: Option<Arc<Vec<Box<[u8]>>>>,
}

impl Snapshot {
    /// A snapshot of the static zone and every serving endpoint of `active`.
    pub fn build(zone: Arc<StaticZone>, active: &ActiveSnapshot) -> Snapshot {
        let mut snapshot = Snapshot::statics_only(zone);
        snapshot.merge(active.applied_changes, active.content_changes, active.endpoints.iter());
        snapshot
    }

    /// A snapshot of the static zone alone, at applied-change count 0. Pages of the active
    /// state go in with `load_page`. It starts in as few shards as its static names need and
    /// is split into more as names come (`split_if_dense`, up to `SHARDS`): a small zone costs
    /// a few shards, not 1,024 (about 100 KB each, which ten thousand added zones paid).
    pub fn statics_only(zone: Arc<StaticZone>) -> Snapshot {
        let shards = shards_for(zone.records.len() + zone.ns.len() + 1);
        Snapshot::statics_in(zone, shards)
    }

    /// Splits the name table into more shards when it holds more than `SHARD_NAMES_MAX` names
    /// a shard and may have more: every entry is shared, only the shards' pointers move.
    fn split_if_dense(&mut self) {
        let now = self.shards.len();
        if now >= SHARDS {
            return;
        }
        let names: usize = self.shards.iter().map(|shard| shard.len()).sum();
        if names <= now * SHARD_NAMES_MAX {
            return;
        }
        let count = shards_for(names);
        let mut next: Vec<Shard> = (0..count).map(|_| Shard::with_capacity(names / count + 1)).collect();
        for entry in self.shards.iter().flat_map(|shard| shard.iter()) {
            let hash = hash_key(&entry.key);
            next[shard_of(hash, count)].insert_unique(hash, entry.clone(), |e| hash_key(&e.key));
        }
        self.shards = next.into_iter().map(Arc::new).collect();
    }

    /// A snapshot of a static zone that never changes: as `statics_only`, in as few shards as
    /// its names need (`shards_for`).
    pub fn static_zone(zone: Arc<StaticZone>) -> Snapshot {
        let shards = shards_for(zone.records.len() + zone.ns.len() + 1);
        Snapshot::statics_in(zone, shards)
    }

    fn statics_in(zone: Arc<StaticZone>, shards: usize) -> Snapshot {
        assert!(shards.is_power_of_two() && shards <= SHARDS);
        let shards: Arc<[Arc<Shard>]> = (0..shards).map(|_| Arc::new(Shard::new())).collect();
        let origin_key = wire_key(&zone.origin);
        let apex_ns = ApexNs::build(&zone, &origin_key).map(Arc::new);
        let mut snapshot = Snapshot {
            serial: 0,
            applied_changes: 0,
            content_changes: 0,
            origin_key: origin_key.into(),
            origin_labels: usize::from(zone.origin.num_labels()),
            soa_names: Arc::new([wire_key(&zone.soa.mname).into(), wire_key(&zone.soa.rname).into()]),
            soa_tail: [0; SOA_TAIL_BYTES],
            apex_ns: apex_ns.clone(),
            apex_ns_static: apex_ns,
            statics: shards.clone(),
            shards,
            managed_count: 0,
            generations: Arc::default(),
            not_served: Arc::default(),
            chain: None,
            statics_chain: None,
            statics_signed_at: 0,
            unsigned: Vec::new(),
            signed_all_at: 0,
            signing_term: 0,
            round: None,
            last_signed: Some(Arc::default()),
            zone: zone.clone(),
        };
        let soa = zone.soa_record(0, zone.soa_ttl_secs);
        for record in std::iter::once(&soa).chain(&zone.ns).chain(&zone.records) {
            let key = wire_key(&record.name);
            snapshot.update(&key, |entry| entry.statics.push(record));
        }
        snapshot.set_serial(0, 0);
        snapshot.statics = snapshot.shards.clone();
        snapshot.statics_chain = snapshot.chain.clone();
        snapshot.statics_signed_at = snapshot.signed_all_at;
        snapshot
    }

    /// A digest of everything static the zone serves (every static record at its name, the
    /// apex SOA at the serial of content-change count 0, so the SOA's fields and the serial
    /// base too): swaps made with other static records are not a history of what is served
    /// now (`serving::ixfr_log`). FNV-1a of each name's wire form and its records in wire
    /// form, summed (the table's order is not the same from one run to the next), from the
    /// static names alone, so neither the endpoints nor the serial served move it.
    pub fn statics_digest(&self) -> u64 {
        let mut sum: u64 = 0;
        for entry in self.statics.iter().flat_map(|shard| shard.iter()).filter(|entry| !entry.statics.is_empty()) {
            let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
            for byte in entry.key.iter().chain(&[0xff]).chain(entry.statics.bytes()) {
                hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3);
            }
            sum = sum.wrapping_add(hash);
        }
        sum
    }

    /// This snapshot's static names alone, at applied-change count 0 (what `statics_in` made).
    fn statics_again(&self) -> Snapshot {
        Snapshot {
            zone: self.zone.clone(),
            serial: 0,
            applied_changes: 0,
            content_changes: 0,
            origin_key: self.origin_key.clone(),
            origin_labels: self.origin_labels,
            soa_names: self.soa_names.clone(),
            soa_tail: self.soa_tail,
            apex_ns: self.apex_ns_static.clone(),
            apex_ns_static: self.apex_ns_static.clone(),
            shards: self.statics.clone(),
            statics: self.statics.clone(),
            managed_count: 0,
            generations: Arc::default(),
            not_served: Arc::default(),
            chain: self.statics_chain.clone(),
            statics_chain: self.statics_chain.clone(),
            statics_signed_at: self.statics_signed_at,
            unsigned: Vec::new(),
            signed_all_at: self.statics_signed_at,
            signing_term: self.signing_term,
            round: None,
            last_signed: None,
        }
    }

    /// Merges one page of the active state into this snapshot in place (a snapshot being
    /// loaded, not yet served). The applied-change count and serial stay as they are: pages
    /// are read at different moments, so the loader ends with `apply` of the changes since
    /// the first page, which sets them.
    pub fn load_page(&mut self, endpoints: &[(EndpointName, ActiveRecord)]) {
        self.merge_endpoints(endpoints.iter().map(|(n, r)| (n, r)));
    }

    /// The snapshot after `delta`: merged into this one, or rebuilt when `delta` is the whole
    /// state. Untouched shards and entries are shared with `self`.
    pub fn apply(&self, delta: &ActiveDelta) -> Snapshot {
        if delta.full {
            let mut next = self.statics_again();
            next.merge(delta.applied_changes, delta.content_changes, delta.endpoints.iter());
            return next;
        }
        let mut next = self.clone();
        next.merge(delta.applied_changes, delta.content_changes, delta.endpoints.iter());
        next
    }

    fn merge<'a>(
        &mut self,
        applied_changes: u64,
        content_changes: u64,
        endpoints: impl Iterator<Item = (&'a EndpointName, &'a ActiveRecord)>,
    ) {
        self.merge_endpoints(endpoints);
        self.set_serial(applied_changes, content_changes);
    }

    fn merge_endpoints<'a>(&mut self, endpoints: impl Iterator<Item = (&'a EndpointName, &'a ActiveRecord)>) {
        for (endpoint, record) in endpoints {
            let key = self.managed_key(endpoint);
            let refused = key.is_none() && matches!(record.state, ActiveState::Serving(_));
            if refused != self.not_served.contains(endpoint) {
                let not_served = Arc::make_mut(&mut self.not_served);
                if refused {
                    not_served.insert(endpoint.clone());
                } else {
                    not_served.remove(endpoint);
                }
            }
            if let Some(key) = key {
                self.put_managed(&key, Managed::from_record(record));
            }
        }
        self.split_if_dense();
        self.refresh_apex_ns();
    }

    /// Merges served entries (`key`: a lower-case wire-form name inside the zone, checked by
    /// the caller) into a snapshot being loaded, as `load_page` merges records; `finish_load`
    /// then sets its applied-change count.
    pub fn load_served(&mut self, key: &[u8], managed: Managed) {
        self.put_managed(key, Some(Box::new(managed)));
    }

    /// Ends a load by `load_served`: the snapshot is the state at `applied_changes`, where
    /// the store's content-change count was `content_changes`.
    pub fn finish_load(&mut self, applied_changes: u64, content_changes: u64) {
        self.split_if_dense();
        self.refresh_apex_ns();
        self.set_serial(applied_changes, content_changes);
    }

    /// Sets the managed part of the entry at `key`, keeping the counts by generation.
    fn put_managed(&mut self, key: &[u8], managed: Option<Box<Managed>>) {
        {
            let mut delta_count: isize = 0;
            let mut before = None;
            self.update(key, |entry| {
                before = entry.managed.as_ref().map(|m| m.generation);
                entry.managed = managed.clone();
            });
            let generations = Arc::make_mut(&mut self.generations);
            if let Some(g) = before {
                delta_count -= 1;
                if let Some(n) = generations.get_mut(&g) {
                    *n -= 1;
                    if *n == 0 {
                        generations.remove(&g);
                    }
                }
            }
            if let Some(m) = &managed {
                delta_count += 1;
                *generations.entry(m.generation).or_default() += 1;
            }
            self.managed_count = self.managed_count.saturating_add_signed(delta_count);
        }
    }

    /// The fast path sends the precompiled apex NS answer only while no in-zone name server
    /// is a managed endpoint: its glue would be the plan's addresses.
    fn refresh_apex_ns(&mut self) {
        self.apex_ns = self
            .apex_ns_static
            .clone()
            .filter(|ns| ns.servers.iter().all(|server| self.get_key(server).is_none_or(|e| e.managed.is_none())));
    }

    pub(super) fn set_serial(&mut self, applied_changes: u64, content_changes: u64) {
        let serial_before = (self.serial, self.content_changes);
        self.applied_changes = applied_changes;
        self.content_changes = content_changes;
        self.serial = serial_of(self.zone.serial_base, content_changes);
        if self.zone.signer.is_some() {
            self.note_signing_term(crate::zone::signed::unix_now());
            self.serial = self.serial.wrapping_add(self.signing_term);
        }
        let soa = &self.zone.soa;
        let [refresh, retry, expire] = [soa.refresh, soa.retry, soa.expire].map(i32::to_be_bytes);
        let fields = [self.serial.to_be_bytes(), refresh, retry, expire, soa.minimum.to_be_bytes()];
        for (chunk, field) in self.soa_tail.chunks_exact_mut(4).zip(fields) {
            chunk.copy_from_slice(&field);
        }
        // The apex SOA as a static record carries the same serial.
        let record = self.zone.soa_record(self.serial, self.zone.soa_ttl_secs);
        let apex = self.origin_key.clone();
        let entry = self.entry_mut(&apex);
        let signed_apex = entry.statics.signed_bytes().to_vec();
        let origin = record.name.clone();
        let mut records = entry.statics.records(&origin);
        match records.iter_mut().find(|r| r.record_type() == RecordType::SOA) {
            Some(soa) => *soa = record,
            None => records.push(record),
        }
        entry.statics = Statics::default();
        for r in &records {
            entry.statics.push(r);
        }
        if self.zone.signer.is_some() {
            // The apex's signatures (the SOA's) are made again when the serial moves.
            if serial_before != (self.serial, self.content_changes) || self.chain.is_none() {
                self.unsigned.push(apex);
            } else {
                self.entry_mut(&apex).statics.set_signed(&signed_apex);
            }
            self.last_signed = Some(Arc::default());
            self.sign_unsigned();
        }
    }

    /// The names whose signatures the last change made again besides the names it changed (a
    /// signed zone's: NSEC neighbours, the apex), for the IXFR history; `None` when every
    /// name was signed again (the history then starts over, as after a rebuild).
    pub fn last_signed(&self) -> Option<&[Box<[u8]>]> {
        self.last_signed.as_deref().map(Vec::as_slice)
    }

    /// The key of a managed endpoint, or `None` (logged) for a name this zone cannot serve.
    /// An `EndpointName` is lower-case presentation form whose labels hold only letters,
    /// digits, `-` and `_`, so its wire form is its labels with their lengths.
    fn managed_key(&self, endpoint: &EndpointName) -> Option<Vec<u8>> {
        let text = endpoint.as_str();
        let text = text.strip_suffix('.').unwrap_or(text);
        let mut key = Vec::with_capacity(text.len() + 2);
        // Where the labels start: the origin must begin at one of them (or be the name).
        let boundary = (key.len() + text.len() + 2).checked_sub(self.origin_key.len());
        let mut aligned = boundary == Some(0);
        for label in text.split('.') {
            aligned |= Some(key.len()) == boundary;
            let Ok(len) = u8::try_from(label.len()) else {
                // Invariant: DnsName labels are at most 63 bytes.
                tracing::error!(%endpoint, "active endpoint is not a valid DNS name; not served");
                return None;
            };
            key.push(len);
            key.extend_from_slice(label.as_bytes());
        }
        aligned |= Some(key.len()) == boundary;
        key.push(0);
        if !aligned || !key.ends_with(&self.origin_key) {
            tracing::error!(%endpoint, origin = %self.zone.origin, "active endpoint is outside the DNS zone; not served");
            return None;
        }
        if let Some(Found::Cut(cut)) = (!self.zone.cuts.is_empty()).then(|| self.find(&key)) {
            let cut = cut.name().map(|n| n.to_string()).unwrap_or_default();
            tracing::error!(%endpoint, %cut, "active endpoint is at or below a delegation of the DNS zone; not served (the child zone answers for it)");
            return None;
        }
        Some(key)
    }

    /// Changes the entry at `key` (created if missing) with `change`, then keeps the
    /// empty-non-terminal counts of its ancestors and drops entries left with nothing.
    fn update(&mut self, key: &[u8], change: impl FnOnce(&mut Entry)) {
        let signed = self.zone.signer.is_some();
        let signs_before = if signed { self.get_key(key).map(Entry::signs) } else { None };
        let had = self.get_key(key).is_some_and(Entry::has_data);
        let has = {
            let entry = self.entry_mut(key);
            change(entry);
            entry.has_data()
        };
        // Signed again only when what the signatures cover changed: a plan that moves a
        // name's fence alone leaves its signatures (and the serial) as they were.
        if signed && signs_before != self.get_key(key).map(Entry::signs) {
            self.unsigned.push(key.into());
        }
        if had != has {
            // Every ancestor strictly below the origin counts this name.
            let origin_len = self.origin_key.len();
            let mut at = usize::from(key[0]) + 1;
            while key.len() - at > origin_len {
                let parent = &key[at..];
                let entry = self.entry_mut(parent);
                entry.descendants = if has { entry.descendants + 1 } else { entry.descendants.saturating_sub(1) };
                self.remove_if_empty(parent);
                at += usize::from(key[at]) + 1;
            }
        }
        self.remove_if_empty(key);
    }

    fn remove_if_empty(&mut self, key: &[u8]) {
        if self.get_key(key).is_some_and(|e| !e.has_data() && e.descendants == 0) {
            let hash = hash_key(key);
            let shard = {
                let n = self.shards.len();
                Arc::make_mut(&mut Arc::make_mut(&mut self.shards)[shard_of(hash, n)])
            };
            if let Ok(found) = shard.find_entry(hash, |e| &*e.key == key) {
                found.remove();
            }
        }
    }

    pub(super) fn entry_mut(&mut self, key: &[u8]) -> &mut Entry {
        entry_in(&mut self.shards, key)
    }

    /// The entry at `key` among the static names alone (`statics`), made if missing: for a
    /// change of the static records themselves (a signed zone's keys, `signed`).
    pub(super) fn static_entry_mut(&mut self, key: &[u8]) -> &mut Entry {
        entry_in(&mut self.statics, key)
    }

    /// The entry at a lower-case wire-form name.
    pub fn get_key(&self, key: &[u8]) -> Option<&Entry> {
        self.get_hashed(key, hash_key(key))
    }

    /// As `get_key`, with the key's hash already computed.
    pub fn get_hashed(&self, key: &[u8], hash: u64) -> Option<&Entry> {
        self.shards[shard_of(hash, self.shards.len())].find(hash, |e| &*e.key == key).map(|e| &**e)
    }

    /// The entry at a lower-case wire-form name, shared (for the IXFR history).
    pub fn entry_arc(&self, key: &[u8]) -> Option<Arc<Entry>> {
        self.shards[shard_of(hash_key(key), self.shards.len())].find(hash_key(key), |e| &*e.key == key).cloned()
    }

    /// The data at `name`, if it has any.
    pub fn get(&self, name: &Name) -> Option<&Entry> {
        self.get_key(&wire_key(name)).filter(|e| e.has_data())
    }

    /// The generation `endpoint` serves, if this snapshot serves it.
    pub fn managed_generation(&self, endpoint: &EndpointName) -> Option<Generation> {
        let name = Name::from_ascii(endpoint.as_str()).ok()?;
        self.get_key(&wire_key(&name))?.managed.as_ref().map(|m| m.generation)
    }

    /// Whether the entry is a delegation point: NS records below the apex.
    pub fn is_cut(&self, entry: &Entry) -> bool {
        entry.key.len() > self.origin_key.len() && entry.statics.has(RecordType::NS)
    }

    /// What the zone has for `key` (a lower-case wire-form name inside the zone), as RFC 1034
    /// §4.3.2 finds it from the apex down: a zone cut at or above the name comes first (its
    /// data and everything below is the child's, served only as glue); then the name itself;
    /// then, for a name that does not exist, the wildcard at its closest encloser (RFC 4592
    /// §3.3.1). A zone without cuts or wildcards needs one lookup.
    pub fn find(&self, key: &[u8]) -> Found<'_> {
        let own = || match self.get_key(key) {
            Some(e) if e.has_data() => Found::Name(e),
            Some(_) => Found::Empty,
            None => Found::Missing,
        };
        if !self.zone.has_cuts_or_wildcards() {
            return own();
        }
        let mut starts: SmallVec<[usize; 16]> = SmallVec::new();
        let mut at = 0;
        while at < key.len() && key[at] != 0 {
            starts.push(at);
            at += usize::from(key[at]) + 1;
        }
        // Labels below the origin, from the one just under the apex down to the name's own.
        let below = starts.len().saturating_sub(self.origin_labels);
        for i in (0..below).rev() {
            match self.get_key(&key[starts[i]..]) {
                Some(e) if self.is_cut(e) => return Found::Cut(e),
                Some(_) => {}
                None => {
                    let encloser = starts.get(i + 1).map_or(&key[key.len() - 1..], |&s| &key[s..]);
                    return self.wildcard_at(encloser).map_or(Found::Missing, Found::Wildcard);
                }
            }
        }
        own()
    }

    /// The wildcard `*.<encloser>`, if the zone has it.
    fn wildcard_at(&self, encloser: &[u8]) -> Option<&Entry> {
        if !self.zone.wildcards || encloser.len() + 2 > NAME_WIRE_BYTES_MAX {
            return None;
        }
        let mut wild: SmallVec<[u8; 64]> = SmallVec::from_slice(&[1, b'*']);
        wild.extend_from_slice(encloser);
        self.get_key(&wild)
    }

    pub fn is_empty_non_terminal(&self, name: &Name) -> bool {
        self.get_key(&wire_key(name)).is_some_and(|e| !e.has_data() && e.descendants > 0)
    }

    pub fn managed_count(&self) -> usize {
        self.managed_count
    }

    /// How many endpoints the store says to serve that this zone does not (see `not_served`).
    pub fn not_served_count(&self) -> usize {
        self.not_served.len()
    }

    /// The oldest and newest generation any managed endpoint serves.
    pub fn generation_range(&self) -> Option<(Generation, Generation)> {
        Some((*self.generations.first_key_value()?.0, *self.generations.last_key_value()?.0))
    }

    /// Every entry, in no particular order (the table's). Walks the whole table: for zone
    /// transfers, which send every name.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.shards.iter().flat_map(|s| s.iter()).map(|e| &**e)
    }

    /// Every entry with a managed endpoint. Walks the whole table: for metrics of small zones.
    pub fn managed(&self) -> impl Iterator<Item = &Entry> {
        self.shards.iter().flat_map(|s| s.iter()).map(|e| &**e).filter(|e| e.managed.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dnsplan_common::store::ActiveState;
    use dnsplan_common::{Endpoint, Target, ZoneId};

    /// What a name costs: an entry with its `Arc` counts in the allocator's 96-byte size class
    /// (glibc: the request plus 8 bytes, rounded up to 16), and so does a managed endpoint's
    /// box. A field that grows either is a tenth more memory at a million names.
    #[test]
    fn entry_sizes() {
        let class = |bytes: usize| (bytes + 8).next_multiple_of(16);
        assert_eq!(std::mem::size_of::<Entry>(), 72);
        assert_eq!(class(std::mem::size_of::<Entry>() + 16), 96, "an entry with its Arc");
        assert_eq!(class(std::mem::size_of::<Managed>()), 96, "a managed endpoint's box");
    }

    /// A name's signatures follow its records in one allocation: every view of the records
    /// is as without them, a record added keeps them, and they are replaced whole.
    #[test]
    fn signatures_ride_after_the_records() {
        let owner = Name::from_ascii("x.example.test.").expect("name");
        let a = Record::from_rdata(owner.clone(), 60, RData::A(hickory_proto::rr::rdata::A("192.0.2.1".parse().expect("address"))));
        let txt = Record::from_rdata(owner.clone(), 60, RData::TXT(hickory_proto::rr::rdata::TXT::new(vec!["t".into()])));
        let mut statics = Statics::default();
        statics.set_signed(&[]);
        assert!(statics.is_empty() && statics.signed_bytes().is_empty());
        statics.set_signed(&[0, 46, 0, 0, 0, 60, 0, 2, 0xab, 0xcd]);
        assert!(statics.is_empty(), "signatures alone are no records");
        statics.push(&a);
        let unsigned = {
            let mut plain = Statics::default();
            plain.push(&a);
            plain
        };
        assert_eq!(statics.bytes(), unsigned.bytes(), "the records' bytes");
        assert_eq!(
            statics.signed_raw().map(|r| (r.rtype, r.ttl, r.rdata.to_vec())).collect::<Vec<_>>(),
            vec![(RecordType::RRSIG, 60, vec![0xab, 0xcd])]
        );
        statics.push(&txt);
        assert_eq!(statics.records(&owner), vec![a.clone(), txt.clone()], "records, the signatures not among them");
        assert!(statics.has(RecordType::TXT) && !statics.has(RecordType::RRSIG) && !statics.is_empty());
        assert_eq!(statics.signed_raw().count(), 1, "kept through a push");
        statics.set_signed(&[]);
        assert!(statics.signed_bytes().is_empty());
        assert_eq!(statics.records(&owner), vec![a, txt]);
    }

    fn serving() -> ActiveRecord {
        let target = Target { address: "10.0.0.1".parse().expect("address"), zone: ZoneId::parse("a").expect("zone"), weight: 1 };
        ActiveRecord { generation: Generation(1), state: ActiveState::Serving(Endpoint { ttl_secs: 30, targets: vec![target] }) }
    }

    fn served(origin: &str, endpoints: &[&str]) -> Snapshot {
        let active = ActiveSnapshot {
            applied_changes: 1,
            content_changes: 1,
            endpoints: endpoints.iter().map(|n| (EndpointName::parse(n).expect("name"), serving())).collect(),
        };
        Snapshot::build(crate::zone::dns_zone::test_zone(origin), &active)
    }

    /// Managed names go in under their wire form, the origin's own name included; a name
    /// outside the zone does not, even when its wire form ends with the origin's bytes.
    /// Static records come back from their wire form as they went in: every kind the loader
    /// takes (names in RDATA, strings, a generic type), TTLs kept; the raw view gives the fast
    /// path the same bytes.
    #[test]
    fn static_records_round_trip_through_their_wire_form() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = "$TTL 3600\nx 60 A 192.0.2.1\nx 61 AAAA 2001:db8::1\nx MX 10 Mail.Example.Test.\nx TXT \"a\" \"b c\"\n\
                    x SRV 1 2 3 t.example.test.\nx CAA 0 issue \"ca.example.net\"\nx SVCB 1 svc.example.test. port=8443\n\
                    x TYPE65000 \\# 2 beef\n";
        let config = crate::zone::dns_zone::DnsZoneConfig {
            origin: "example.test.".into(),
            soa: None,
            ns: vec!["ns1.example.test.".into()],
            ns_ttl_secs: 3600,
            master_file: None,
            records: Some(format!("{text}@ SOA ns1 hostmaster 1 2 3 4 5\n")),
            dnssec: None,
        };
        let zone = StaticZone::load(&config, dir.path()).expect("zone");
        let owner = Name::from_ascii("x.example.test.").expect("name");
        let mut statics = Statics::default();
        let given: Vec<Record> = zone.records.iter().filter(|r| r.name == owner).cloned().collect();
        for r in &given {
            statics.push(r);
        }
        let back = statics.records(&owner);
        assert_eq!(back.len(), given.len());
        for (a, b) in back.iter().zip(&given) {
            assert_eq!((a.to_string(), a.ttl), (b.to_string(), b.ttl));
        }
        let a = statics.raw().find(|r| r.rtype == RecordType::A).expect("the A record");
        assert_eq!((a.ttl, a.rdata), (60, &[192, 0, 2, 1][..]));
        assert!(statics.has(RecordType::SVCB) && !statics.has(RecordType::NS));
        assert!(Statics::default().is_empty() && Statics::default().records(&owner).is_empty());
    }

    #[test]
    fn managed_names_are_keyed_by_wire_form_inside_the_zone_only() {
        let name = |n: &str| Name::from_ascii(n).expect("name");
        let snapshot = served("example.test.", &["api.example.test.", "A.b.Example.test.", "example.test.", "other.test."]);
        assert_eq!(snapshot.managed_count(), 3);
        for inside in ["api.example.test.", "a.b.example.test.", "example.test."] {
            assert!(snapshot.get(&name(inside)).is_some_and(|e| e.managed.is_some()), "{inside}");
        }
        assert!(snapshot.get(&name("other.test.")).is_none());
        // The origin's first label is 48 bytes long, and 48 is the byte `0`: the name's
        // wire form ends with the origin's bytes, one label off.
        let long = "a".repeat(48);
        let origin = format!("{long}.test.");
        let beside = format!("x0{long}.test.");
        let snapshot = served(&origin, &[&format!("api.{origin}"), &beside]);
        assert!(wire_key(&name(&beside)).ends_with(&wire_key(&name(&origin))));
        assert_eq!(snapshot.managed_count(), 1, "a name outside the zone was served");
        assert!(snapshot.get(&name(&beside)).is_none());
    }

    /// A small zone is a few shards, and a zone that grows is split as it grows (every name
    /// still found, with its empty-non-terminal counts), up to `SHARDS` and no further; a
    /// change after that copies only the shards it touches.
    #[test]
    fn a_zone_is_split_into_more_shards_as_it_grows() {
        let small = served("example.test.", &["api.example.test."]);
        assert_eq!(small.shards.len(), 1, "one shard for a few names");
        let names: Vec<String> = (0..100_000).map(|i| format!("n{i}.deep.example.test.")).collect();
        let mut snapshot = Snapshot::statics_only(crate::zone::dns_zone::test_zone("example.test."));
        for page in names.chunks(7_000) {
            let endpoints: Vec<(EndpointName, ActiveRecord)> =
                page.iter().map(|n| (EndpointName::parse(n).expect("name"), serving())).collect();
            snapshot.load_page(&endpoints);
            let total: usize = snapshot.shards.iter().map(|s| s.len()).sum();
            assert!(
                total <= snapshot.shards.len() * SHARD_NAMES_MAX || snapshot.shards.len() == SHARDS,
                "{total} names in {} shards",
                snapshot.shards.len()
            );
        }
        snapshot.finish_load(1, 1);
        assert_eq!(snapshot.shards.len(), SHARDS);
        assert_eq!(snapshot.managed_count(), names.len());
        for n in names.iter().step_by(997) {
            assert!(snapshot.get(&Name::from_ascii(n).expect("name")).is_some_and(|e| e.managed.is_some()), "{n}");
        }
        let deep = snapshot.get_key(&wire_key(&Name::from_ascii("deep.example.test.").expect("name"))).expect("an empty non-terminal");
        assert_eq!(deep.descendants as usize, names.len(), "the empty non-terminal counts every name below it");
    }

    /// A whole state (a full delta) is rebuilt on the static names the snapshot was built
    /// with, though its zone no longer holds its records (a managed zone's `Serving` drops
    /// them): the static names stay, the endpoints are the delta's alone, at its counts, and
    /// the snapshot it came from is as it was.
    #[test]
    fn a_whole_state_is_rebuilt_on_the_static_names_without_the_records() {
        let name = |n: &str| Name::from_ascii(n).expect("name");
        let dir = tempfile::tempdir().expect("tempdir");
        let config = crate::zone::dns_zone::DnsZoneConfig {
            origin: "example.test.".into(),
            soa: None,
            ns: vec!["ns1.example.test.".into()],
            ns_ttl_secs: 3600,
            master_file: None,
            records: Some(
                "$TTL 300\n@ SOA ns1 hostmaster 7 2 3 4 5\nstatic A 192.0.2.7\nns1 A 192.0.2.53\nsub NS ns.elsewhere.test.\n".into(),
            ),
            dnssec: None,
        };
        let zone = Arc::new(StaticZone::load(&config, dir.path()).expect("zone"));
        let mut first = {
            let mut built = Snapshot::build(zone.clone(), &ActiveSnapshot::default());
            built.merge_endpoints([(EndpointName::parse("a.example.test.").expect("name"), serving())].iter().map(|(n, r)| (n, r)));
            built
        };
        first.zone = Arc::new(zone.without_records());
        let digest = first.statics_digest();
        let full = ActiveDelta {
            applied_changes: 9,
            content_changes: 4,
            full: true,
            endpoints: [(EndpointName::parse("b.example.test.").expect("name"), serving())].into_iter().collect(),
        };
        let next = first.apply(&full);
        for statics in ["static.example.test.", "ns1.example.test.", "sub.example.test.", "example.test."] {
            assert!(next.get(&name(statics)).is_some_and(|e| !e.statics.is_empty()), "{statics}'s static records after the rebuild");
        }
        assert!(next.get(&name("b.example.test.")).is_some_and(|e| e.managed.is_some()));
        assert!(next.get(&name("a.example.test.")).is_none(), "an endpoint the whole state does not hold stayed");
        assert_eq!((next.managed_count(), next.applied_changes, next.serial), (1, 9, 7 + 4));
        assert!(first.get(&name("a.example.test.")).is_some_and(|e| e.managed.is_some()), "the snapshot rebuilt from changed");
        assert!(first.get(&name("b.example.test.")).is_none());
        // The static digest follows the static records only: not the endpoints, not the serial.
        assert_eq!(next.statics_digest(), digest, "the digest moved with the endpoints or the serial");
        let other = |text: &str| {
            let config = crate::zone::dns_zone::DnsZoneConfig { records: Some(text.into()), ..config.clone() };
            Snapshot::build(Arc::new(StaticZone::load(&config, dir.path()).expect("zone")), &ActiveSnapshot::default()).statics_digest()
        };
        let text = config.records.clone().unwrap_or_default();
        assert_eq!(other(&text), digest, "the same records, another digest");
        for changed in
            [text.replace("192.0.2.7", "192.0.2.8"), text.replace("$TTL 300", "$TTL 301"), text.replace(" 7 2 3 4 5", " 8 2 3 4 5")]
        {
            assert_ne!(other(&changed), digest, "another static zone, the same digest:\n{changed}");
        }
    }
}
