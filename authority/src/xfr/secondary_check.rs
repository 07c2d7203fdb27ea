//! Whether a notified secondary serves exactly our zone: its whole zone, read by AXFR (signed
//! with the secondary's key), compared record for record, TTL included, with the snapshot of
//! the serial it serves. `notify` runs it once the secondary's SOA shows the serial served
//! here, and again every `CHECK_INTERVAL`, and `/v1/status` says a secondary is current only
//! when the last check found its zone equal at the serial served now.
//!
//! Why a transfer and not the serial alone or ZONEMD: the serial says which content a
//! secondary *should* hold, not which it holds. A primary that sent a wrong IXFR (a TTL change
//! left out, as once here), a replacement store whose `serial_base` repeats a serial the
//! secondaries already hold, or an edit on the secondary itself all leave a secondary at our
//! serial with other records. ZONEMD (RFC 8976) would need a digest of the whole zone computed
//! at every swap (the zone is up to 1,000,000 names, and a swap copies only what it changes),
//! a record in the zone, and secondaries configured to verify it; even then, what a secondary
//! serves is known only by asking it. Reading the zone back costs one AXFR per secondary per
//! check (56 MB at 1,000,000 names), paced by `notify` (after a change no sooner than ten times
//! the last check's duration after it, so at most about a tenth of the time) and bounded by
//! `CHECK_TIMEOUT` and `EXTRA_RECORDS_MAX`; it needs the secondary to allow the primary's key
//! to transfer the zone.
//!
//! Nothing here changes what is served or sent to secondaries; it only reports.

use crate::serving::policy::NotifyTarget;
use crate::zone::records::zone_records;
use crate::zone::snapshot::Snapshot;
use dnsplan_common::tsig;
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{RData, Record, RecordType};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How often a secondary at our serial is checked again while nothing changes: drift on the
/// secondary (an edit, a restore) shows within this; one AXFR per secondary per 5 minutes is
/// small beside the transfers the changes themselves cause.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(300);
/// Longest time one check may take, connect to last message: a loaded secondary sends a
/// 56 MB zone in a few seconds; longer means the check says nothing.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(60);
/// Most records read from a secondary beyond our own count: a secondary sending far more is
/// not ours, and reading on would only cost memory.
const EXTRA_RECORDS_MAX: usize = 10_000;
/// Differences listed in a report: enough to see what kind of difference it is.
const SHOWN_MAX: usize = 3;

/// What a check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// The secondary's zone is ours, record for record, at `serial`.
    Equal { serial: u32, records: usize },
    /// It serves `serial` with other records: how many of ours it lacks and how many it has
    /// that we do not, with a few of them (`-` ours, `+` theirs).
    Differs { serial: u32, missing: usize, extra: usize, shown: Vec<String> },
}

/// Reads the zone from `target` by AXFR and compares it with `snapshot`'s zone. A secondary
/// that sends another serial than the snapshot's has moved on (or not yet): an error, not a
/// difference. Our records are listed and compared on a blocking thread: at 1,000,000 names
/// that is a second of CPU, and both zones are held as records meanwhile (a few hundred MB).
pub async fn check(target: &NotifyTarget, snapshot: Arc<Snapshot>) -> Result<Found, String> {
    let listing = snapshot.clone();
    let ours = tokio::task::spawn_blocking(move || zone_records(&listing).collect::<Vec<Record>>())
        .await
        .map_err(|e| format!("listing our records failed: {e}"))?;
    let theirs = tokio::time::timeout(CHECK_TIMEOUT, axfr(target, &snapshot, ours.len() + EXTRA_RECORDS_MAX))
        .await
        .map_err(|_| format!("the AXFR took over {CHECK_TIMEOUT:?}"))??;
    let serial = snapshot.serial;
    let sent = theirs.first().and_then(|r| match &r.data {
        RData::SOA(soa) => Some(soa.serial),
        _ => None,
    });
    if sent != Some(serial) {
        return Err(format!("its AXFR is of serial {sent:?}, not {serial}: not compared"));
    }
    tokio::task::spawn_blocking(move || compare(serial, &ours, &theirs)).await.map_err(|e| format!("comparing failed: {e}"))
}

/// `ours` against `theirs` as multisets of records, TTL included (hickory's `Record`
/// equality leaves the TTL out, RFC 2136 §1.1.1), owner names compared in lower case.
pub fn compare(serial: u32, ours: &[Record], theirs: &[Record]) -> Found {
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for r in ours {
        *counts.entry(canonical(r)).or_default() += 1;
    }
    for r in theirs {
        *counts.entry(canonical(r)).or_default() -= 1;
    }
    let missing: i64 = counts.values().filter(|n| **n > 0).sum();
    let extra: i64 = -counts.values().filter(|n| **n < 0).sum::<i64>();
    if missing == 0 && extra == 0 {
        return Found::Equal { serial, records: ours.len() };
    }
    let shown = counts
        .iter()
        .filter(|(_, n)| **n != 0)
        .take(SHOWN_MAX)
        .map(|(record, n)| format!("{}{record}", if *n > 0 { "-" } else { "+" }))
        .collect();
    Found::Differs { serial, missing: missing.unsigned_abs() as usize, extra: extra.unsigned_abs() as usize, shown }
}

/// A record as one line: lower-case owner, TTL, class, type, data.
fn canonical(r: &Record) -> String {
    format!("{} {} {} {} {}", r.name.to_lowercase(), r.ttl, r.dns_class, r.record_type(), r.data)
}

/// The records of an AXFR of `snapshot`'s zone from `target`, SOA first and last, each message
/// verified with the target's key when it has one; at most `records_max` records.
async fn axfr(target: &NotifyTarget, snapshot: &Snapshot, records_max: usize) -> Result<Vec<Record>, String> {
    let mut query = Message::query();
    query.add_query(Query::query(snapshot.zone.origin.clone(), RecordType::AXFR));
    let mut verifier = match &target.key {
        Some(key) => Some(key.sign_query(&mut query, tsig::now_unix_secs()).map_err(|e| e.to_string())?),
        None => None,
    };
    let bytes = query.to_vec().map_err(|e| format!("encoding the AXFR query: {e}"))?;
    let len = u16::try_from(bytes.len()).map_err(|_| "the AXFR query does not fit a TCP frame".to_owned())?;
    let mut stream = tokio::net::TcpStream::connect(target.addr).await.map_err(|e| format!("connecting for the AXFR: {e}"))?;
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend_from_slice(&bytes);
    stream.write_all(&framed).await.map_err(|e| format!("sending the AXFR query: {e}"))?;
    let mut records = Vec::new();
    let mut soas = 0;
    loop {
        let len = stream.read_u16().await.map_err(|e| format!("reading the AXFR: {e}"))?;
        let mut buf = vec![0u8; usize::from(len)];
        stream.read_exact(&mut buf).await.map_err(|e| format!("reading the AXFR: {e}"))?;
        let message = match verifier.as_mut() {
            Some(v) => v.verify(&buf).map_err(|e| format!("the AXFR does not verify: {e}"))?,
            None => Message::from_vec(&buf).map_err(|e| format!("the AXFR does not decode: {e}"))?,
        };
        if message.metadata.response_code != ResponseCode::NoError {
            return Err(format!("the AXFR was answered {}", message.metadata.response_code));
        }
        if message.answers.is_empty() {
            return Err("the AXFR sent a message without records".into());
        }
        for record in message.answers {
            if record.record_type() == RecordType::SOA {
                soas += 1;
            }
            records.push(record);
            if records.len() > records_max {
                return Err(format!("the secondary sent more than {records_max} records"));
            }
            if soas == 2 {
                return Ok(records);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::Name;
    use hickory_proto::rr::rdata::A;

    fn a(name: &str, ttl: u32, address: [u8; 4]) -> Record {
        Record::from_rdata(Name::from_ascii(name).expect("name"), ttl, RData::A(A::from(std::net::Ipv4Addr::from(address))))
    }

    /// A TTL alone is a difference; owner case is not; a record twice is not the record once.
    #[test]
    fn records_are_compared_with_their_ttl_and_as_many_as_they_are() {
        let ours = [a("api.example.test.", 60, [10, 0, 0, 1]), a("api.example.test.", 60, [10, 0, 0, 2])];
        let same = [a("API.example.test.", 60, [10, 0, 0, 2]), a("api.example.test.", 60, [10, 0, 0, 1])];
        assert_eq!(compare(7, &ours, &same), Found::Equal { serial: 7, records: 2 });
        let ttl = [a("api.example.test.", 90, [10, 0, 0, 1]), a("api.example.test.", 60, [10, 0, 0, 2])];
        let Found::Differs { missing, extra, shown, .. } = compare(7, &ours, &ttl) else { panic!("a TTL alone made no difference") };
        assert_eq!((missing, extra), (1, 1), "{shown:?}");
        assert!(shown.iter().any(|l| l.starts_with("-api.example.test. 60 IN A 10.0.0.1")), "{shown:?}");
        let twice = [a("api.example.test.", 60, [10, 0, 0, 1]), a("api.example.test.", 60, [10, 0, 0, 1])];
        assert!(matches!(compare(7, &ours, &twice), Found::Differs { missing: 1, extra: 1, .. }));
    }
}
