//! The history IXFR answers from: for each snapshot swap, the serial before and after and,
//! for every name the swap changed, its entry before and after (shared `Arc`s of the
//! snapshots' own entries, no copy of records).
//!
//! `diff_since(serial)` condenses every swap after `serial` into one difference (RFC 1995
//! §4: each changed name once): the records a name had at `serial` that it no longer has,
//! and the records it has now that it did not have then, a record's TTL counting as part of
//! it (a TTL change is a deletion at the old TTL and an addition at the new); a name changed and changed back is
//! left out. `None` when the history does not reach back to `serial` (the authority started
//! later, the follower rebuilt from the whole state, or `names_max` pushed it out): the
//! caller sends the whole zone.
//!
//! Kept in memory, at most `names_max` changed names over all swaps (a secondary further
//! behind gets an AXFR); each swap is also written to a file (`serving::ixfr_log`), whose swaps
//! a restart reads back as records (`push_records`), so a restarted primary still answers
//! IXFR from where each secondary is. Swaps are condensed record by record: a record deleted
//! after it was added in the range is neither, and one added back after it was deleted too. The follower appends under the
//! lock and swaps the snapshot inside it, and a transfer loads the snapshot inside it, so a
//! difference always ends at the snapshot the transfer sends.

use crate::zone::records::entry_records;
use crate::zone::serial::serial_newer;
use crate::zone::snapshot::Entry;
use hickory_proto::rr::Record;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// One changed name: its lower-case wire form, its entry before the swap and after.
pub type JournalChange = (Box<[u8]>, Option<Arc<Entry>>, Option<Arc<Entry>>);

/// One swap: the serial after it (the one before is the previous swap's, or the start), and
/// what it changed.
struct Swap {
    to: u32,
    changes: Changes,
}

/// What one swap changed.
enum Changes {
    /// Each changed name with its entry before and after (a swap the follower made).
    Entries(Vec<JournalChange>),
    /// The records the swap removed and added, over `names` names (read back from disk).
    Records { gone: Vec<Record>, new: Vec<Record>, names: usize },
}

impl Changes {
    fn names(&self) -> usize {
        match self {
            Changes::Entries(changes) => changes.len(),
            Changes::Records { names, .. } => *names,
        }
    }

    fn records(&self) -> (Vec<Record>, Vec<Record>) {
        match self {
            Changes::Entries(changes) => swap_records(changes),
            Changes::Records { gone, new, .. } => (gone.clone(), new.clone()),
        }
    }
}

/// What one swap's `changes` removed and added: each name's records before that it no longer
/// has, and its records after that it did not have, a record's TTL counting as part of it.
pub fn swap_records(changes: &[JournalChange]) -> (Vec<Record>, Vec<Record>) {
    let (mut gone, mut new) = (Vec::new(), Vec::new());
    for (_, before, after) in changes {
        let old = before.as_ref().map(|e| entry_records(e)).unwrap_or_default();
        let now = after.as_ref().map(|e| entry_records(e)).unwrap_or_default();
        gone.extend(old.iter().filter(|r| !holds(&now, r)).cloned());
        new.extend(now.iter().filter(|r| !holds(&old, r)).cloned());
    }
    (gone, new)
}

/// The swaps since the oldest serial IXFR can still answer from.
pub struct Journal {
    swaps: VecDeque<Swap>,
    /// The serial served when the history starts (the first swap's `from`).
    start: u32,
    /// The serial after the last swap.
    end: u32,
    names: usize,
    /// Most changed names kept over all swaps (`dns.transfer.ixfr_history_names_max`).
    names_max: usize,
    /// The records at `start` may not be what a secondary holds at that serial (a signed
    /// zone's signatures, made again at each start): the first swap starts the history over
    /// rather than chaining to it (`cut`).
    cut: bool,
}

impl Journal {
    /// An empty history at `serial`.
    pub fn new(serial: u32, names_max: usize) -> Journal {
        Journal { swaps: VecDeque::new(), start: serial, end: serial, names: 0, names_max, cut: false }
    }

    /// As `new`, for a start whose records a secondary at `serial` may not hold (a signed
    /// zone's, signed again at the start): no IXFR is answered from `serial`, so a secondary
    /// there gets the whole zone with the first change.
    pub fn cut(serial: u32, names_max: usize) -> Journal {
        Journal { cut: true, ..Journal::new(serial, names_max) }
    }

    /// Forgets everything: the next swap was a rebuild from the whole state, whose changes
    /// are not known name by name.
    pub fn reset(&mut self, serial: u32) {
        self.swaps.clear();
        self.names = 0;
        self.start = serial;
        self.end = serial;
    }

    /// Records a swap from `from` to `to` that changed `changes` (key, before, after). A swap
    /// that does not follow the last one restarts the history.
    pub fn push(&mut self, from: u32, to: u32, changes: Vec<JournalChange>) {
        self.push_changes(from, to, Changes::Entries(changes));
    }

    /// As `push`, for a swap read back from disk: the records it removed and added over
    /// `names` names.
    pub fn push_records(&mut self, from: u32, to: u32, gone: Vec<Record>, new: Vec<Record>, names: usize) {
        self.push_changes(from, to, Changes::Records { gone, new, names });
    }

    fn push_changes(&mut self, from: u32, to: u32, changes: Changes) {
        if std::mem::take(&mut self.cut) || from != self.end || changes.names() > self.names_max {
            self.reset(to);
            return;
        }
        self.names += changes.names();
        self.swaps.push_back(Swap { to, changes });
        self.end = to;
        while self.names > self.names_max {
            let Some(oldest) = self.swaps.pop_front() else { break };
            self.names -= oldest.changes.names();
            self.start = oldest.to;
        }
    }

    /// The serial the history starts at.
    pub fn start(&self) -> u32 {
        self.start
    }

    /// The serial after the last swap.
    pub fn end(&self) -> u32 {
        self.end
    }

    /// What changed from `serial` to `end()`, condensed: (records gone, records new), or
    /// `None` when the history does not start at or before `serial` on a swap boundary.
    pub fn diff_since(&self, serial: u32) -> Option<(Vec<Record>, Vec<Record>)> {
        if serial == self.end {
            return Some((Vec::new(), Vec::new()));
        }
        let first = if serial == self.start {
            0
        } else {
            // `serial` must be where one of the kept swaps ends.
            if serial_newer(self.start, serial) {
                return None;
            }
            self.swaps.iter().position(|s| s.to == serial)? + 1
        };
        // Keyed by the record's text, which holds its TTL (see `holds`).
        let mut gone: BTreeMap<String, Record> = BTreeMap::new();
        let mut new: BTreeMap<String, Record> = BTreeMap::new();
        for swap in self.swaps.iter().skip(first) {
            let (removed, added) = swap.changes.records();
            for r in removed {
                let key = r.to_string();
                if new.remove(&key).is_none() {
                    gone.insert(key, r);
                }
            }
            for r in added {
                let key = r.to_string();
                if gone.remove(&key).is_none() {
                    new.insert(key, r);
                }
            }
        }
        Some((gone.into_values().collect(), new.into_values().collect()))
    }
}

/// Whether `records` holds `record` with the same TTL. hickory's `Record` equality is RFC
/// 2136's, which leaves the TTL out: a change of TTL alone would make no difference at all,
/// and secondaries would keep the old TTL under the new serial. A record whose TTL changed is
/// deleted at the old TTL and added at the new one, as Knot's IXFR sends it.
fn holds(records: &[Record], record: &Record) -> bool {
    records.iter().any(|r| r == record && r.ttl == record.ttl)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zone::snapshot::{Snapshot, wire_key};
    use dnsplan_common::store::{ActiveRecord, ActiveSnapshot, ActiveState};
    use dnsplan_common::{Endpoint, EndpointName, Generation, Target, ZoneId};
    use hickory_proto::rr::Name;

    fn changes(n: usize) -> Vec<JournalChange> {
        (0..n).map(|i| (vec![1, b'a' + i as u8, 0].into_boxed_slice(), None, None)).collect()
    }

    /// The history answers from the serials it holds on a swap boundary, forgets the oldest
    /// swaps past `names_max`, and starts over after a gap or a rebuild.
    #[test]
    fn the_history_reaches_back_to_what_it_holds_and_no_further() {
        let mut journal = Journal::new(10, 3);
        journal.push(10, 11, changes(1));
        journal.push(11, 13, changes(2));
        assert_eq!(journal.end(), 13);
        for (serial, reaches) in [(10, true), (11, true), (12, false), (13, true), (9, false), (14, false)] {
            assert_eq!(journal.diff_since(serial).is_some(), reaches, "from {serial}");
        }
        journal.push(13, 14, changes(1)); // four names: the first swap goes
        assert!(journal.diff_since(10).is_none() && journal.diff_since(11).is_some());
        journal.push(20, 21, changes(1)); // not from 14: a gap
        assert!(journal.diff_since(14).is_none() && journal.diff_since(21).is_some());
        journal.push(21, 22, changes(4)); // more than names_max in one swap
        assert!(journal.diff_since(21).is_none() && journal.diff_since(22).is_some());
        journal.reset(30);
        assert!(journal.diff_since(22).is_none() && journal.diff_since(30).is_some());
        // Across the wrap of the serial.
        let mut journal = Journal::new(u32::MAX, 10);
        journal.push(u32::MAX, 1, changes(1));
        assert!(journal.diff_since(u32::MAX).is_some() && journal.diff_since(0).is_none());
    }

    /// The snapshot of `example.test.` serving `api` with one target at `ttl_secs`.
    fn serving_api(ttl_secs: u32, g: u64) -> Snapshot {
        let target = Target { address: "10.0.0.1".parse().expect("address"), zone: ZoneId::parse("a").expect("zone"), weight: 1 };
        let record = ActiveRecord { generation: Generation(g), state: ActiveState::Serving(Endpoint { ttl_secs, targets: vec![target] }) };
        let active = ActiveSnapshot {
            applied_changes: g,
            content_changes: g,
            endpoints: [(EndpointName::parse("api.example.test.").expect("name"), record)].into(),
        };
        Snapshot::build(crate::zone::dns_zone::test_zone("example.test."), &active)
    }

    /// A change of TTL alone is a difference: the record at the old TTL goes, the one at the
    /// new TTL comes. A TTL changed and changed back is none.
    ///
    /// Teeth: with `holds` comparing by hickory's `Record` equality (which leaves the TTL
    /// out, RFC 2136 §1.1.1), both lists were empty and the test failed at "gone".
    #[test]
    fn a_ttl_change_alone_deletes_at_the_old_ttl_and_adds_at_the_new() {
        let key = wire_key(&Name::from_ascii("api.example.test.").expect("name")).into_boxed_slice();
        let (at_60, at_90, at_60_again) = (serving_api(60, 1), serving_api(90, 2), serving_api(60, 3));
        let mut journal = Journal::new(1, 10);
        journal.push(1, 2, vec![(key.clone(), at_60.entry_arc(&key), at_90.entry_arc(&key))]);
        let (gone, new) = journal.diff_since(1).expect("the history reaches back");
        assert_eq!(gone.iter().map(|r| r.ttl).collect::<Vec<_>>(), [60], "gone: {gone:?}");
        assert_eq!(new.iter().map(|r| r.ttl).collect::<Vec<_>>(), [90], "new: {new:?}");
        journal.push(2, 3, vec![(key.clone(), at_90.entry_arc(&key), at_60_again.entry_arc(&key))]);
        assert_eq!(journal.diff_since(1), Some((Vec::new(), Vec::new())), "changed back");
    }
}
