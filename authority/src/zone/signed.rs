//! A signed zone's snapshot (`[dns_zone.dnssec]`): the NSEC chain and the RRSIGs, made when a
//! state is swapped in, for the names that changed, never per query.
//!
//! Each name keeps its signatures after its records (`Statics::signed_raw`): an RRSIG for each of
//! its authoritative RRsets, its NSEC and the NSEC's RRSIG. The snapshot keeps the NSEC owners
//! in canonical order (RFC 4034 §6.1, `chain`): the apex, every name with data, every
//! delegation point; not empty non-terminals nor names below a delegation (RFC 4035 §2.3).
//! `update` marks each name it changes; `set_serial`, which ends every change, signs them
//! (`sign_unsigned`): a name that joins or leaves the chain changes its predecessor's NSEC too,
//! and the SOA changes with every serial. When many names changed (a load, a whole state) the
//! chain is made again and every name signed, on both cores.
//!
//! A managed endpoint's addresses are signed whole (every eligible target, zero weights left
//! out as the query path leaves them out): an answer with DO=1 carries the whole RRset, in
//! the weighted order the sampler chooses, since a sample of it would need a signature made
//! for that sample, per query.
//!
//! Not signed, as RFC 4035 §2.2 says: the NS RRset at a delegation, glue, anything below a
//! delegation. Signatures are valid from an hour before they are made (clocks that lag) for
//! `signature_validity_days`; every one is made again once the oldest has less than
//! `signature_refresh_days` left (`resign_due`).

use crate::zone::dns_zone::ZoneSigner;
use crate::zone::snapshot::{Entry, Found, RawRecord, Snapshot, Statics};
use hickory_proto::dnssec::rdata::NSEC;
use hickory_proto::rr::{Name, Record, RecordType};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder, NameEncoding};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

/// How long before it is made a signature's validity starts: a validator whose clock lags
/// this much still takes it.
const INCEPTION_BACKDATE_SECS: u32 = 3_600;

/// What a `Snapshot::resign_step` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResignStep {
    /// Nothing was due.
    Idle,
    /// A batch was signed; more are left.
    Signing,
    /// The last batch was signed: the serial moved.
    Done,
}

/// A round of signing every name again (`Snapshot::resign_step`): its time, and the first
/// name not yet signed in it (`None`: the first of the chain).
#[derive(Clone, Debug)]
pub struct Round {
    at: u32,
    next: Option<Box<[u8]>>,
    /// Started by a new ZSK (`set_signer`), not by the period.
    keys: bool,
}

/// The validity of signatures made at one time: from an hour before (clocks that lag) for
/// `signature_validity_days`.
#[derive(Clone, Copy, Debug)]
struct Window {
    inception: u32,
    expiration: u32,
}

impl Window {
    /// The signatures of a name changed at `now`.
    fn at(now: u32, signer: &ZoneSigner) -> Window {
        Window { inception: now.wrapping_sub(INCEPTION_BACKDATE_SECS), expiration: now.wrapping_add(signer.validity_secs) }
    }
}

/// The start of the signing period `now` is in (`ZoneSigner::period_secs`).
pub fn period_start(now: u32, signer: &ZoneSigner) -> u32 {
    now - now % signer.period_secs().max(1)
}

/// Seconds since the epoch, mod 2^32 (RRSIG times are RFC 1982 serials).
pub fn unix_now() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as u32)
}

/// The labels of a lower-case wire-form name, from the first.
fn labels(key: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    let mut starts = Vec::with_capacity(8);
    let mut at = 0;
    while at < key.len() && key[at] != 0 {
        let end = (at + 1 + usize::from(key[at])).min(key.len());
        starts.push(&key[at + 1..end]);
        at = end;
    }
    starts.into_iter()
}

/// RFC 4034 §6.1's canonical order of two lower-case wire-form names: label by label from the
/// right, each as an octet string, a name before the names below it.
pub fn canonical_cmp(a: &[u8], b: &[u8]) -> Ordering {
    let (mut x, mut y) = (labels(a).rev(), labels(b).rev());
    loop {
        match (x.next(), y.next()) {
            (Some(l), Some(r)) => match l.cmp(r) {
                Ordering::Equal => continue,
                other => return other,
            },
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
        }
    }
}

/// The name of a lower-case wire-form key.
fn name_of(key: &[u8]) -> Option<Name> {
    let mut name = Name::from_labels(labels(key)).ok()?;
    name.set_fqdn(true);
    Some(name)
}

/// The RRSIGs at `entry` that cover `rtype`.
pub fn rrsigs(entry: &Entry, rtype: RecordType) -> impl Iterator<Item = RawRecord<'_>> {
    let covered = u16::from(rtype).to_be_bytes();
    entry.statics.signed_raw().filter(move |r| r.rtype == RecordType::RRSIG && r.rdata.get(..2) == Some(&covered[..]))
}

/// The NSEC record at `entry`, if the name has one.
pub fn nsec(entry: &Entry) -> Option<RawRecord<'_>> {
    entry.statics.signed_raw().find(|r| r.rtype == RecordType::NSEC)
}

impl Snapshot {
    pub fn is_signed(&self) -> bool {
        self.chain.is_some()
    }

    /// The NSEC owner that covers `key` (a name that is not one): the last owner before it
    /// in canonical order. The apex is first, so every name of the zone has one.
    pub fn covering(&self, key: &[u8]) -> Option<&Entry> {
        let chain = self.chain.as_ref()?;
        let owner = match chain.search(key) {
            Ok(i) => chain.get(i)?,
            Err(i) => chain.before(i)?,
        };
        self.get_key(owner)
    }

    /// When the oldest signature served expires (seconds since the epoch); `None` unsigned.
    pub fn signatures_expire_at(&self) -> Option<u32> {
        let signer = self.zone.signer.as_ref()?;
        self.is_signed().then(|| self.signed_all_at.wrapping_add(signer.validity_secs))
    }

    /// Whether a full re-signing is due: a new period began since the last
    /// (`ZoneSigner::period_secs`, validity minus refresh). Every whole signing of a period
    /// makes signatures valid from its start (`sign_everything`), so the oldest has at least the
    /// refresh time left when the next is due, whenever in the period the last was made (a
    /// restart), and a secondary that kept an earlier signing's holds signatures as long valid.
    pub fn resign_due(&self, now: u32) -> bool {
        let Some(signer) = &self.zone.signer else { return false };
        self.is_signed() && period_start(now, signer) > self.signed_all_at
    }

    /// Moves `signing_term` to the period of the last whole signing (the next one's, at `now`,
    /// when the next signing signs every name) plus the key schedule's times since the period
    /// before it. While a
    /// round signs every name with a new ZSK (`Round::keys`), the new keys are not counted:
    /// the serial moves when the round ends, so a secondary that transfers the new serial gets
    /// every new signature.
    pub(super) fn note_signing_term(&mut self, now: u32) {
        let Some(signer) = self.zone.signer.clone() else { return };
        if self.round.as_ref().is_some_and(|r| r.keys) {
            return;
        }
        let start = if self.signs_everything_next() { period_start(now, &signer) } else { self.signed_all_at };
        // Since the period before: a change of keys read a little after a period began (the
        // directory is read every `key_check_secs`, not while a round runs) still counts.
        // Monotonic: the next period's start is a whole period on, far more than the times
        // of one period.
        let since = start.saturating_sub(signer.period_secs());
        let events = u32::try_from(signer.keys.events_since(u64::from(since))).unwrap_or(u32::MAX);
        self.signing_term = self.signing_term.max(start.wrapping_add(events));
    }

    /// Every signature made again at `now` (`resign_due`), the chain made again too. The
    /// serial moves with the period of the signing, so that secondaries transfer the new
    /// signatures.
    pub fn resign_all(&mut self, now: u32) {
        if let Some(signer) = self.zone.signer.clone() {
            self.sign_everything(&signer, now);
            self.set_serial(self.applied_changes, self.content_changes);
            self.last_signed = None;
        }
    }

    /// One step of signing every name again (`resign_due`), `batch` names at a time in
    /// canonical order, so that a change the follower has to swap in waits for one batch, not
    /// for the whole zone (a million names take half a minute on two cores). A round starts
    /// when due, at `now`, and every batch signs at that time; names changed meanwhile are
    /// signed as they change. When the last batch is done the zone is as old as the round's
    /// start, and the serial moves as after `resign_all`.
    pub fn resign_step(&mut self, now: u32, batch: usize) -> ResignStep {
        let (Some(signer), Some(chain)) = (self.zone.signer.clone(), self.chain.clone()) else { return ResignStep::Idle };
        let round = match self.round.take() {
            Some(round) => round,
            None if self.resign_due(now) => Round { at: period_start(now, &signer), next: None, keys: false },
            None => return ResignStep::Idle,
        };
        let start = match &round.next {
            Some(next) => chain.search(next).unwrap_or_else(|at| at),
            None => 0,
        };
        let end = start.saturating_add(batch.max(1)).min(chain.len());
        let keys: Vec<Box<[u8]>> = (start..end).filter_map(|i| chain.get(i).map(Box::from)).collect();
        self.sign_keys(
            &keys,
            &signer,
            Window { inception: round.at.wrapping_sub(INCEPTION_BACKDATE_SECS), expiration: round.at.wrapping_add(signer.validity_secs) },
        );
        if end < chain.len() {
            self.round = Some(Round { at: round.at, next: chain.get(end).map(Box::from), keys: round.keys });
            return ResignStep::Signing;
        }
        self.signed_all_at = round.at;
        self.set_serial(self.applied_changes, self.content_changes);
        self.last_signed = None;
        ResignStep::Done
    }

    /// The zone's keys changed (`ZoneSigner::with_keys`, read from its key directory): the
    /// apex's DNSKEY, CDS and CDNSKEY are replaced, in the names served and in the static names
    /// a whole state is rebuilt on (which then signs every name: its signatures may be by a
    /// key gone), and the apex is signed again with the new keys. A new ZSK starts a round of
    /// signing every name with it (`resign_step`; the serial moves when it ends); else the
    /// serial moves now. Not while a round is under way: the caller waits for its end.
    pub fn set_signer(&mut self, signer: Arc<ZoneSigner>, now: u32) -> Result<(), String> {
        let Some(old) = self.zone.signer.clone() else { return Err("the zone is not signed".into()) };
        let origin = self.zone.origin.clone();
        let apex_rdata = signer.keys.apex_rdata(&origin).map_err(|e| e.to_string())?;
        let keys: Vec<Record> =
            apex_rdata.into_iter().map(|data| Record::from_rdata(origin.clone(), signer.dnskey_ttl_secs, data)).collect();
        let is_key = |r: &Record| matches!(r.record_type(), RecordType::DNSKEY | RecordType::CDS | RecordType::CDNSKEY);
        let replace = |entry: &mut Entry| {
            let mut records: Vec<Record> = entry.statics.records(&origin).into_iter().filter(|r| !is_key(r)).collect();
            records.extend(keys.iter().cloned());
            let signed = entry.statics.signed_bytes().to_vec();
            entry.statics = Statics::default();
            for r in &records {
                entry.statics.push(r);
            }
            entry.statics.set_signed(&signed);
        };
        let apex = self.origin_key.clone();
        replace(self.entry_mut(&apex));
        replace(self.static_entry_mut(&apex));
        self.statics_chain = None;
        let mut zone = (*self.zone).clone();
        if zone.records.iter().any(|r| r.name == origin && is_key(r)) {
            zone.records.retain(|r| !(r.name == origin && is_key(r)));
            zone.records.extend(keys.iter().cloned());
        }
        zone.signer = Some(signer.clone());
        self.zone = Arc::new(zone);
        if !old.keys.same_zsk(&signer.keys) {
            self.round = Some(Round { at: period_start(now, &signer).max(self.signed_all_at), next: None, keys: true });
        }
        self.unsigned.push(apex);
        self.set_serial(self.applied_changes, self.content_changes);
        Ok(())
    }

    /// Whether a round of `resign_step` is under way.
    pub fn resigning(&self) -> bool {
        self.round.is_some()
    }

    /// Whether the next `sign_unsigned` signs every name: nothing signed yet, or so many
    /// names changed that signing them all on both cores costs less.
    pub(super) fn signs_everything_next(&self) -> bool {
        let chain_len = self.chain.as_ref().map_or(0, |c| c.len());
        self.chain.is_none() || self.unsigned.len() > 64 && self.unsigned.len() * 8 > chain_len
    }

    /// Whether the entry at `key` owns an NSEC: it has data, and it is not below a delegation.
    fn owns_nsec(&self, key: &[u8]) -> bool {
        match self.get_key(key) {
            Some(e) if e.has_data() => match self.find(key) {
                Found::Cut(cut) => &cut.key[..] == key,
                _ => true,
            },
            _ => false,
        }
    }

    /// Signs what changed since the last signing (`unsigned`), as the module says.
    pub(super) fn sign_unsigned(&mut self) {
        let Some(signer) = self.zone.signer.clone() else { return };
        let now = unix_now();
        if self.signs_everything_next() {
            self.sign_everything(&signer, now);
            return;
        }
        let mut pending = std::mem::take(&mut self.unsigned);
        pending.sort_unstable();
        pending.dedup();
        let mut to_sign: Vec<Box<[u8]>> = Vec::with_capacity(pending.len() * 2);
        for key in pending {
            let owns = self.owns_nsec(&key);
            // Looked up in the chain the last snapshot shares; copied only when a name joins
            // or leaves it.
            let found = self.chain.as_ref().map_or(Err(0), |chain| chain.search(&key));
            if owns == found.is_ok() {
                to_sign.push(key);
                continue;
            }
            // Only the chunk the name joins or leaves is copied (`NsecChain`).
            let chain = Arc::make_mut(self.chain.get_or_insert_with(Arc::default));
            match (owns, found) {
                (true, Err(i)) => {
                    chain.insert(i, key.clone());
                    to_sign.extend(chain.before(i).map(Box::from));
                }
                (false, Ok(i)) => {
                    chain.remove(i);
                    to_sign.extend(chain.before(i).map(Box::from));
                }
                _ => {}
            }
            to_sign.push(key);
        }
        to_sign.sort_unstable();
        to_sign.dedup();
        self.last_signed = Some(Arc::new(to_sign.clone()));
        let window = Window::at(now, &signer);
        for key in to_sign {
            let signed = self.signatures(&key, &signer, window);
            if self.get_key(&key).is_some_and(|e| e.statics.signed_bytes() != signed.bytes()) {
                self.entry_mut(&key).statics.set_signed(signed.bytes());
            }
        }
    }

    /// The chain made again from every name, and every name signed (on both cores: the
    /// signatures are most of the time), valid from the start of `now`'s period.
    fn sign_everything(&mut self, signer: &ZoneSigner, now: u32) {
        let start = period_start(now, signer);
        self.unsigned.clear();
        let mut chain: Vec<Box<[u8]>> = self.entries().filter(|e| self.owns_nsec(&e.key)).map(|e| Box::from(&e.key[..])).collect();
        chain.sort_unstable_by(|a, b| canonical_cmp(a, b));
        self.chain = Some(Arc::new(crate::zone::chain::NsecChain::from_sorted(chain)));
        let keys: Vec<Box<[u8]>> = self.entries().map(|e| Box::from(&e.key[..])).collect();
        let window =
            Window { inception: start.wrapping_sub(INCEPTION_BACKDATE_SECS), expiration: start.wrapping_add(signer.validity_secs) };
        self.sign_keys(&keys, signer, window);
        self.signed_all_at = start;
        self.round = None;
        self.last_signed = None;
    }

    /// The names of `keys` signed with `window` on every core (the signatures are most of the
    /// time).
    fn sign_keys(&mut self, keys: &[Box<[u8]>], signer: &ZoneSigner, window: Window) {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
        let chunk = keys.len().div_ceil(threads).max(1);
        let this = &*self;
        let signed: Vec<(Box<[u8]>, Statics)> = std::thread::scope(|scope| {
            let workers: Vec<_> = keys
                .chunks(chunk)
                .map(|keys| scope.spawn(move || keys.iter().map(|k| (k.clone(), this.signatures(k, signer, window))).collect::<Vec<_>>()))
                .collect();
            workers.into_iter().flat_map(|w| w.join().unwrap_or_default()).collect()
        });
        for (key, statics) in signed {
            if self.get_key(&key).is_some_and(|e| e.statics.signed_bytes() != statics.bytes()) {
                self.entry_mut(&key).statics.set_signed(statics.bytes());
            }
        }
    }

    /// What the entry at `key` should keep in `signed`: nothing unless it owns an NSEC; else
    /// an RRSIG per RRset and signing key (the KSKs sign the apex's DNSKEY, CDS and CDNSKEY,
    /// the ZSK every other RRset), the NSEC and its RRSIG.
    fn signatures(&self, key: &[u8], signer: &ZoneSigner, window: Window) -> Statics {
        let mut out = Statics::default();
        let (Some(entry), Some(chain)) = (self.get_key(key), self.chain.as_ref()) else { return out };
        let Ok(at) = chain.search(key) else { return out };
        let (Some(owner), Some(next)) = (name_of(key), chain.after(at).and_then(name_of)) else { return out };
        let origin = &self.zone.origin;
        let cut = self.is_cut(entry);
        let managed = entry.managed.as_deref();
        let mut rrsets: BTreeMap<u16, (u32, Vec<Vec<u8>>)> = BTreeMap::new();
        let mut types: Vec<RecordType> = vec![RecordType::RRSIG, RecordType::NSEC];
        for r in entry.statics.raw() {
            let shadowed = managed.is_some() && matches!(r.rtype, RecordType::A | RecordType::AAAA);
            if shadowed {
                continue;
            }
            if !types.contains(&r.rtype) {
                types.push(r.rtype);
            }
            // At a delegation only the DS is the parent's to sign (RFC 4035 §2.2).
            if cut && r.rtype != RecordType::DS {
                continue;
            }
            rrsets.entry(u16::from(r.rtype)).or_insert_with(|| (r.ttl, Vec::new())).1.push(r.rdata.to_vec());
        }
        if let Some(m) = managed {
            let v4: Vec<Vec<u8>> = m.v4.targets.iter().map(|(a, _)| a.octets().to_vec()).collect();
            let v6: Vec<Vec<u8>> = m.v6.targets.iter().map(|(a, _)| a.octets().to_vec()).collect();
            for (rtype, rdata) in [(RecordType::A, v4), (RecordType::AAAA, v6)] {
                if !rdata.is_empty() {
                    types.push(rtype);
                    rrsets.insert(u16::from(rtype), (m.ttl_secs, rdata));
                }
            }
        }
        let nsec = NSEC::new(next, types);
        let mut nsec_rdata = Vec::with_capacity(64);
        {
            let mut e = BinEncoder::new(&mut nsec_rdata);
            e.set_name_encoding(NameEncoding::Uncompressed);
            if nsec.emit(&mut e).is_err() {
                return out;
            }
        }
        let nsec_ttl = self.zone.negative_ttl_secs();
        rrsets.insert(u16::from(RecordType::NSEC), (nsec_ttl, vec![nsec_rdata.clone()]));
        let Window { inception, expiration } = window;
        let apex = key == &self.origin_key[..];
        for (rtype, (ttl, rdata)) in &rrsets {
            let rtype = RecordType::from(*rtype);
            if rtype == RecordType::NSEC {
                out.push_raw(RecordType::NSEC, *ttl, &nsec_rdata);
            }
            let refs: Vec<&[u8]> = rdata.iter().map(Vec::as_slice).collect();
            let keys = match rtype {
                RecordType::DNSKEY | RecordType::CDS | RecordType::CDNSKEY if apex => &signer.keys.ksks,
                _ => &signer.keys.zsk,
            };
            for signing_key in keys {
                match signing_key.sign_rrset(origin, &owner, rtype, *ttl, &refs, inception, expiration) {
                    Ok(rrsig) => out.push_raw(RecordType::RRSIG, *ttl, &rrsig),
                    // Not reached: the records came from our own wire form. The RRset is then
                    // served unsigned, which validators refuse: the log says why.
                    Err(err) => tracing::error!(%owner, %rtype, error = %err, "an RRset could not be signed"),
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dnsplan_common::dnssec::{ZoneAlgorithm, ZoneKey};
    use dnsplan_common::store::{ActiveDelta, ActiveRecord, ActiveState};
    use dnsplan_common::{EndpointName, Generation};

    /// A signed zone of a few names, its key in `dir`.
    fn signed_zone(dir: &std::path::Path, validity_days: u32, refresh_days: u32) -> Snapshot {
        ZoneKey::create(&dir.join("zone.key"), ZoneAlgorithm::Ed25519).expect("key");
        signed_with(dir, validity_days, refresh_days, Some("zone.key"), None)
    }

    fn signed_with(dir: &std::path::Path, validity_days: u32, refresh_days: u32, file: Option<&str>, key_dir: Option<&str>) -> Snapshot {
        let config = crate::zone::dns_zone::DnsZoneConfig {
            dnssec: Some(crate::zone::dns_zone::DnssecConfig {
                key_file: file.map(Into::into),
                key_dir: key_dir.map(Into::into),
                signature_validity_days: validity_days,
                signature_refresh_days: refresh_days,
                ..crate::zone::dns_zone::DnssecConfig::with_key_file("")
            }),
            origin: "example.test.".into(),
            soa: None,
            ns: vec!["ns1.example.test.".into()],
            ns_ttl_secs: 3600,
            master_file: None,
            records: Some("$TTL 300\n@ SOA ns1 hostmaster 1 2 3 4 5\nwww A 192.0.2.1\nmail A 192.0.2.2\n".into()),
        };
        let zone = crate::zone::dns_zone::StaticZone::load(&config, dir).expect("zone");
        Snapshot::build(Arc::new(zone), &dnsplan_common::store::ActiveSnapshot::default())
    }

    /// Signatures are made again whole when a new period (validity minus refresh) begins, not
    /// before; those of a whole signing are valid from the start of its period, so the oldest
    /// has the refresh time left then; every RRset is signed anew.
    #[test]
    fn a_quiet_zone_is_signed_again_before_its_signatures_expire() {
        const PERIOD: u32 = 7 * 86_400;
        let dir = tempfile::tempdir().expect("dir");
        let mut snapshot = signed_zone(dir.path(), 14, 7);
        let now = unix_now();
        let start = now - now % PERIOD;
        assert!(!snapshot.resign_due(now), "just signed");
        assert!(!snapshot.resign_due(start + PERIOD - 1), "the same period");
        assert!(snapshot.resign_due(start + PERIOD), "the next period");
        assert_eq!(snapshot.signatures_expire_at(), Some(start + 14 * 86_400), "valid from the period's start");
        let www = key("www.example.test.");
        let before = snapshot.get_key(&www).expect("www").statics.signed_bytes().to_vec();
        assert!(!before.is_empty(), "www is signed");
        let later = now + 8 * 86_400;
        assert!(snapshot.resign_due(later));
        let serial = snapshot.serial;
        assert_eq!(serial, 1 + start, "the base, no change, the period of the first signing");
        assert_eq!(soa_serial(&snapshot), serial);
        snapshot.resign_all(later);
        assert!(!snapshot.resign_due(later));
        assert_ne!(snapshot.get_key(&www).expect("www").statics.signed_bytes(), &before[..], "signed again");
        // Secondaries must see a new serial to transfer the new signatures.
        assert_eq!(snapshot.serial, 1 + (later - later % PERIOD), "the serial moves with the period of the signing");
        assert_eq!(soa_serial(&snapshot), snapshot.serial, "the SOA served says it");
        // A whole state rebuilt on the static names serves their first signatures: it is as
        // old as they are, so due at once; its serial does not go back.
        let rebuilt = snapshot.apply(&dnsplan_common::store::ActiveDelta { full: true, ..Default::default() });
        assert!(rebuilt.resign_due(later), "a rebuild on the static names' first signatures is due");
        assert_eq!(rebuilt.serial, snapshot.serial, "a rebuild keeps the period of the newest signing");
    }

    /// A round of re-signing in steps signs every name once, a batch a step, keeps the serial
    /// until its last step, and a change swapped in between two steps is kept and signed.
    #[test]
    fn a_round_of_re_signing_in_steps_signs_every_name_and_then_moves_the_serial() {
        let dir = tempfile::tempdir().expect("dir");
        let mut snapshot = signed_zone(dir.path(), 14, 7);
        let now = unix_now();
        assert_eq!(snapshot.resign_step(now, 1), ResignStep::Idle, "not due");
        let names: Vec<Vec<u8>> = ["example.test.", "mail.example.test.", "www.example.test."].map(key).to_vec();
        let signed_of =
            |s: &Snapshot| names.iter().map(|k| s.get_key(k).expect("name").statics.signed_bytes().to_vec()).collect::<Vec<_>>();
        let before = signed_of(&snapshot);
        let serial = snapshot.serial;
        let mut want = serial;
        let later = now + 8 * 86_400;
        let mut steps = 0;
        loop {
            steps += 1;
            match snapshot.resign_step(later, 1) {
                ResignStep::Signing => {
                    assert!(snapshot.resigning());
                    assert_eq!(snapshot.serial, want, "the serial waits for the last step");
                    if steps == 1 {
                        // A change between two steps: a name added, as a plan adds one.
                        let api = EndpointName::parse("api.example.test.").expect("name");
                        let record = ActiveRecord { generation: Generation(1), state: ActiveState::Serving(endpoint()) };
                        let delta = ActiveDelta { applied_changes: 1, content_changes: 1, full: false, endpoints: [(api, record)].into() };
                        snapshot = snapshot.apply(&delta);
                        want += 1;
                        assert_eq!(snapshot.serial, want, "the change moves the serial as ever");
                        assert!(snapshot.resigning(), "the round goes on past a change");
                    }
                }
                ResignStep::Done => break,
                ResignStep::Idle => panic!("a round under way is never idle"),
            }
            assert!(steps < 10, "the round ends");
        }
        assert!(steps >= 3, "one name a step: {steps} steps");
        assert!(!snapshot.resigning() && !snapshot.resign_due(later));
        let after = signed_of(&snapshot);
        for ((name, old), new) in names.iter().zip(&before).zip(&after) {
            assert!(!new.is_empty() && old != new, "{name:?} signed again");
        }
        let period = |t: u32| t - t % (7 * 86_400);
        assert_eq!(snapshot.serial, serial + 1 + period(later) - period(now), "one content change, and the period of the round");
        assert_eq!(soa_serial(&snapshot), snapshot.serial);
        assert!(
            snapshot.get_key(&key("api.example.test.")).is_some_and(|e| !e.statics.signed_bytes().is_empty()),
            "the name added is signed"
        );
    }

    /// The key tags of the RRSIGs at `name` covering `rtype`.
    fn signers_of(snapshot: &Snapshot, name: &str, rtype: RecordType) -> Vec<u16> {
        let entry = snapshot.get_key(&key(name)).expect("name");
        rrsigs(entry, rtype).map(|r| u16::from_be_bytes([r.rdata[16], r.rdata[17]])).collect()
    }

    /// A zone signed from a key directory: the KSK signs the DNSKEY RRset, the ZSK the rest. A
    /// new ZSK published changes the apex and the serial at once; once it signs, a round signs
    /// every name with it and the serial moves only when the round ends; a whole state rebuilt
    /// after the change signs every name again (its static names' signatures may be by a key
    /// since removed).
    #[test]
    fn new_keys_are_published_then_sign_every_name_and_the_serial_follows() {
        use dnsplan_common::dnssec_keys::{At, KeyDir, Policy};
        let dir = tempfile::tempdir().expect("dir");
        let now = unix_now();
        let policy = Policy { dnskey_ttl_secs: 300, propagation_delay_secs: 300, ..Policy::default() };
        let mut keys = KeyDir::init(&dir.path().join("keys"), "example.test.", ZoneAlgorithm::Ed25519, None, policy, At(u64::from(now)))
            .expect("init");
        let mut snapshot = signed_with(dir.path(), 14, 7, None, Some("keys"));
        let view = keys.view(At(u64::from(now))).expect("view");
        let (ksk, zsk) = (view.ksks[0].tag(), view.zsk[0].tag());
        assert_eq!(signers_of(&snapshot, "example.test.", RecordType::DNSKEY), vec![ksk]);
        assert_eq!(signers_of(&snapshot, "www.example.test.", RecordType::A), vec![zsk]);
        let signer = |keys: &KeyDir, t: u32| {
            let old = snapshot_signer(&keys.view(At(u64::from(t))).expect("view"));
            Arc::new(old)
        };
        // The roll: a new ZSK published.
        let t1 = now + 10;
        keys.roll_zsk(At(u64::from(t1))).expect("roll");
        keys.mark_served(At(u64::from(t1)));
        let serial = snapshot.serial;
        snapshot.set_signer(signer(&keys, t1), t1).expect("set");
        assert!(!snapshot.resigning(), "the signing key is the same");
        assert_eq!(snapshot.serial, serial + 1, "a new DNSKEY RRset, a new serial");
        let dnskeys =
            snapshot.get_key(&key("example.test.")).expect("apex").statics.raw().filter(|r| r.rtype == RecordType::DNSKEY).count();
        assert_eq!(dnskeys, 3, "the KSK and both ZSKs");
        assert_eq!(signers_of(&snapshot, "www.example.test.", RecordType::A), vec![zsk], "the old ZSK signs until the lead is over");
        // The new ZSK signs: a round, the serial held until its end.
        let t2 = t1 + 600;
        let next = signer(&keys, t2);
        let new_zsk = next.keys.zsk[0].tag();
        assert_ne!(new_zsk, zsk);
        let serial = snapshot.serial;
        snapshot.set_signer(next, t2).expect("set");
        assert!(snapshot.resigning(), "a round signs every name with the new ZSK");
        assert_eq!(snapshot.serial, serial, "the serial waits for the round");
        while snapshot.resign_step(t2, 1) == ResignStep::Signing {
            assert_eq!(snapshot.serial, serial);
        }
        assert_eq!(snapshot.serial, serial + 1, "the round's end moves the serial");
        for name in ["example.test.", "www.example.test.", "mail.example.test."] {
            let rtype = if name == "example.test." { RecordType::SOA } else { RecordType::A };
            assert_eq!(signers_of(&snapshot, name, rtype), vec![new_zsk], "{name} signed by the new ZSK");
        }
        assert_eq!(signers_of(&snapshot, "example.test.", RecordType::DNSKEY), vec![ksk], "the KSK signs the DNSKEY RRset");
        let rebuilt = snapshot.apply(&dnsplan_common::store::ActiveDelta { full: true, ..Default::default() });
        assert_eq!(signers_of(&rebuilt, "www.example.test.", RecordType::A), vec![new_zsk], "a rebuild signs with the keys of now");
        assert!(rebuilt.serial >= snapshot.serial, "and never goes back");
    }

    /// A `ZoneSigner` of the test zone's validity with `keys`.
    fn snapshot_signer(keys: &dnsplan_common::dnssec_keys::SigningKeys) -> crate::zone::dns_zone::ZoneSigner {
        crate::zone::dns_zone::ZoneSigner {
            keys: keys.clone(),
            source: crate::zone::dns_zone::KeySource::File,
            validity_secs: 14 * 86_400,
            refresh_secs: 7 * 86_400,
            dnskey_ttl_secs: 300,
        }
    }

    fn endpoint() -> dnsplan_common::Endpoint {
        dnsplan_common::Endpoint {
            ttl_secs: 30,
            targets: vec![dnsplan_common::Target {
                address: "10.0.0.1".parse().expect("address"),
                zone: dnsplan_common::ZoneId::parse("a").expect("zone"),
                weight: 1,
            }],
        }
    }

    /// The serial of the SOA record at the apex.
    fn soa_serial(snapshot: &Snapshot) -> u32 {
        let origin = snapshot.zone.origin.clone();
        let apex = snapshot.get_key(&key(&origin.to_ascii())).expect("apex");
        let records = apex.statics.records(&origin);
        match records.iter().find_map(|r| match &r.data {
            hickory_proto::rr::RData::SOA(soa) => Some(soa.serial),
            _ => None,
        }) {
            Some(serial) => serial,
            None => panic!("no SOA at the apex: {records:?}"),
        }
    }

    fn key(name: &str) -> Vec<u8> {
        crate::zone::snapshot::wire_key(&Name::from_ascii(name).expect("name"))
    }

    /// RFC 4034 §6.1's example, in its order.
    #[test]
    fn canonical_order_is_rfc_4034s() {
        let names: [&[&[u8]]; 9] = [
            &[b"example"],
            &[b"a", b"example"],
            &[b"yljkjljk", b"a", b"example"],
            &[b"z", b"a", b"example"],
            &[b"zabc", b"a", b"example"],
            &[b"z", b"example"],
            &[b"\x01", b"z", b"example"],
            &[b"*", b"z", b"example"],
            &[b"\xc8", b"z", b"example"],
        ];
        let keys: Vec<Vec<u8>> = names
            .iter()
            .map(|labels| {
                let mut key = Vec::new();
                for label in *labels {
                    key.push(label.len() as u8);
                    key.extend_from_slice(label);
                }
                key.push(0);
                key
            })
            .collect();
        let mut sorted = keys.clone();
        sorted.reverse();
        sorted.sort_by(|a, b| canonical_cmp(a, b));
        assert_eq!(sorted, keys);
        assert_eq!(canonical_cmp(&key("a.example."), &key("A.example.")), Ordering::Equal);
    }
}
