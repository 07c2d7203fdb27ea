//! What a signed zone adds to an answer asked with DO=1 (RFC 4035 §3.1), from the signatures
//! and NSEC records the snapshot keeps with each name (`zone::signed`), after `answer::respond`
//! has built the answer as for DO=0:
//!
//! - each RRset of the answer section gets its RRSIGs (a wildcard's, labels field and all,
//!   for an answer synthesised from it, with the NSEC that proves the name asked does not
//!   exist: §3.1.3.3);
//! - the SOA of a negative answer gets its RRSIG, at the SOA's negative TTL; NXDOMAIN gets the
//!   NSEC covering the name and the one covering the wildcard at its closest encloser
//!   (§3.1.3.2); NODATA the NSEC at the name (§3.1.3.1), or the one covering an empty
//!   non-terminal, or the wildcard's with the one covering the name (§3.1.3.4). After a CNAME
//!   chain the proof is for the chain's last name;
//! - a referral gets the delegation's DS and its RRSIG, or the NSEC at the cut proving there
//!   is none (§3.1.4); the NS RRset and glue stay unsigned.
//!
//! RRSIGs go with the records they cover, in the same section; none are added for glue
//! (additional data), so a size limit never truncates for them.

use crate::zone::signed::{nsec, rrsigs};
use crate::zone::snapshot::{Entry, Found, RawRecord, Snapshot, wire_key};
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// `raw` at `owner`, decoded.
fn record(owner: &Name, ttl: u32, raw: RawRecord<'_>) -> Option<Record> {
    let mut decoder = hickory_proto::serialize::binary::BinDecoder::new(raw.rdata);
    let length = hickory_proto::serialize::binary::Restrict::new(raw.rdata.len() as u16);
    let data = RData::read(&mut decoder, raw.rtype, length).ok()?;
    Some(Record::from_rdata(owner.clone(), ttl, data))
}

/// The RRSIGs over `rtype` at `entry`, owned by `owner`, at `ttl`.
fn signatures(entry: &Entry, rtype: RecordType, owner: &Name, ttl: u32) -> Vec<Record> {
    rrsigs(entry, rtype).filter_map(|r| record(owner, ttl, r)).collect()
}

/// The NSEC `entry` owns and its RRSIGs.
fn nsec_of(entry: &Entry) -> Vec<Record> {
    let Some(owner) = entry.name() else { return Vec::new() };
    let Some(raw) = nsec(entry) else { return Vec::new() };
    let mut out: Vec<Record> = record(&owner, raw.ttl, raw).into_iter().collect();
    out.extend(signatures(entry, RecordType::NSEC, &owner, raw.ttl));
    out
}

/// The proofs gathered for one answer: NSEC records with their RRSIGs, each owner once.
#[derive(Default)]
struct Proofs {
    owners: Vec<Box<[u8]>>,
    records: Vec<Record>,
}

impl Proofs {
    fn add(&mut self, entry: Option<&Entry>) {
        let Some(entry) = entry else { return };
        if self.owners.iter().any(|o| o[..] == entry.key[..]) {
            return;
        }
        self.owners.push(Box::from(&entry.key[..]));
        self.records.extend(nsec_of(entry));
    }

    /// That nothing is at `key` (NXDOMAIN): the NSEC covering it, and the one covering the
    /// wildcard at its closest encloser (the nearest ancestor that exists).
    fn name_error(&mut self, snapshot: &Snapshot, key: &[u8]) {
        self.add(snapshot.covering(key));
        let mut at = usize::from(key.first().copied().unwrap_or(0)) + 1;
        while at < key.len() {
            let encloser = &key[at..];
            if snapshot.get_key(encloser).is_some() || encloser == &snapshot.origin_key[..] {
                let mut wild = vec![1, b'*'];
                wild.extend_from_slice(encloser);
                self.add(snapshot.covering(&wild));
                return;
            }
            at += usize::from(key[at]) + 1;
        }
    }

    /// That `key` has no data of the type asked (NODATA).
    fn no_data(&mut self, snapshot: &Snapshot, key: &[u8]) {
        match snapshot.find(key) {
            Found::Name(entry) | Found::Cut(entry) => self.add(Some(entry)),
            Found::Empty => self.add(snapshot.covering(key)),
            Found::Wildcard(entry) => {
                self.add(Some(entry));
                self.add(snapshot.covering(key));
            }
            Found::Missing => self.name_error(snapshot, key),
        }
    }
}

/// Adds to `resp` (the answer to `qname`, lower case, from `snapshot`, a signed zone's) what
/// DO=1 asks for, as the module says.
pub fn add_dnssec(resp: &mut Message, snapshot: &Snapshot, qname: &Name) {
    let mut proofs = Proofs::default();
    // The answer section's RRsets, in order, each once.
    let mut rrsets: Vec<(Name, RecordType, u32)> = Vec::new();
    for r in &resp.answers {
        let owner = r.name.to_lowercase();
        if !rrsets.iter().any(|(o, t, _)| *o == owner && *t == r.record_type()) {
            rrsets.push((owner, r.record_type(), r.ttl));
        }
    }
    let mut signed_answers = Vec::new();
    for (owner, rtype, ttl) in &rrsets {
        let key = wire_key(owner);
        let entry = match snapshot.find(&key) {
            Found::Name(e) => e,
            Found::Wildcard(e) => {
                proofs.add(snapshot.covering(&key));
                e
            }
            Found::Cut(e) if *rtype == RecordType::DS && e.key[..] == key[..] => e,
            _ => continue,
        };
        signed_answers.extend(signatures(entry, *rtype, owner, *ttl));
    }
    resp.add_answers(signed_answers);

    let mut authority = Vec::new();
    // A referral (or a CNAME chain into one): the cut's NS in the authority section.
    let cut = resp
        .authorities
        .iter()
        .find(|r| r.record_type() == RecordType::NS && r.name != snapshot.zone.origin)
        .map(|r| r.name.to_lowercase());
    if let Some(cut) = cut
        && let Some(entry) = snapshot.get_key(&wire_key(&cut))
    {
        let ds: Vec<Record> = entry.statics.records(&cut).into_iter().filter(|r| r.record_type() == RecordType::DS).collect();
        match ds.first().map(|r| r.ttl) {
            Some(ttl) => {
                authority.extend(ds);
                authority.extend(signatures(entry, RecordType::DS, &cut, ttl));
            }
            None => proofs.add(Some(entry)),
        }
    }
    let soa = resp.authorities.iter().find(|r| r.record_type() == RecordType::SOA).map(|r| (r.name.clone(), r.ttl));
    if let Some((apex, ttl)) = soa {
        if let Some(entry) = snapshot.get_key(&snapshot.origin_key) {
            authority.extend(signatures(entry, RecordType::SOA, &apex, ttl));
        }
        // The proof is for the chain's last name: the target of the last CNAME, if any.
        let last = match resp.answers.iter().rev().find(|r| r.record_type() == RecordType::CNAME).map(|r| &r.data) {
            Some(RData::CNAME(target)) => target.0.to_lowercase(),
            _ => qname.clone(),
        };
        let key = wire_key(&last);
        if snapshot.zone.origin.zone_of(&last) {
            if resp.metadata.response_code == ResponseCode::NXDomain {
                proofs.name_error(snapshot, &key);
            } else {
                proofs.no_data(snapshot, &key);
            }
        }
    }
    authority.extend(proofs.records);
    resp.add_authorities(authority);
}
