//! The records of the zone as a secondary should serve them, in transfer order: what a zone
//! transfer sends, what the IXFR history compares and what a secondary's zone is checked against.

use crate::zone::snapshot::{Entry, Snapshot};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};

/// Every record of the zone in transfer order: the SOA, the apex's records, every other
/// name's, the SOA again.
pub fn zone_records(snapshot: &Snapshot) -> impl Iterator<Item = Record> + '_ {
    let soa = snapshot.zone.soa_record(snapshot.serial, snapshot.zone.soa_ttl_secs);
    let apex = snapshot.get_key(&snapshot.origin_key);
    let others = snapshot.entries().filter(|e| *e.key != *snapshot.origin_key);
    std::iter::once(soa.clone()).chain(apex.into_iter().chain(others).flat_map(entry_records)).chain(std::iter::once(soa))
}

/// The records of one name as a secondary should serve them: what `answer::collect` serves
/// for each type, every eligible target (weights are not carried), no SOA (it frames the
/// transfer), and in a signed zone the name's RRSIGs and NSEC.
pub fn entry_records(entry: &Entry) -> Vec<Record> {
    let mut out = Vec::new();
    if let Some(m) = &entry.managed
        && let Some(name) = entry.name()
    {
        out.extend(m.v4.targets.iter().map(|(a, _)| Record::from_rdata(name.clone(), m.ttl_secs, RData::A(A(*a)))));
        out.extend(m.v6.targets.iter().map(|(a, _)| Record::from_rdata(name.clone(), m.ttl_secs, RData::AAAA(AAAA(*a)))));
    }
    let shadowed = |t: RecordType| entry.managed.is_some() && matches!(t, RecordType::A | RecordType::AAAA | RecordType::CNAME);
    if let Some(name) = entry.name() {
        out.extend(entry.statics.records(&name).into_iter().filter(|r| r.record_type() != RecordType::SOA && !shadowed(r.record_type())));
        // A signed zone's RRSIGs and NSEC (`zone::signed`): a secondary serves them too.
        out.extend(entry.statics.signed_raw().filter_map(|raw| {
            let mut decoder = hickory_proto::serialize::binary::BinDecoder::new(raw.rdata);
            let length = hickory_proto::serialize::binary::Restrict::new(raw.rdata.len() as u16);
            let data = RData::read(&mut decoder, raw.rtype, length).ok()?;
            Some(Record::from_rdata(name.clone(), raw.ttl, data))
        }));
    }
    out
}
