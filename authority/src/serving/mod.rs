//! The serving state every listener, transfer and follower shares (`Serving`: the snapshot in
//! an `ArcSwap`, limits, the rate limiter, the transfer policy, metrics, the IXFR history and
//! the secondaries' statuses), built here and changed only by the follower (`follow`).
//!
//! - `policy.rs`: who may transfer the zone, with which TSIG keys, and whom to NOTIFY.
//! - `local_log.rs`: on etcd, the log each change is made durable in before it is served.
//! - `trusted.rs`: with a keyring, the check the follower makes of each record against its
//!   signed plan before it is served.

pub mod ixfr_log;
pub mod local_log;
pub mod policy;
pub mod shared_keys;
pub mod trusted;
pub mod zone_image;
pub mod zones;

use crate::metrics::Metrics;
use crate::query::answer::AnswerLimits;
use crate::query::rrl::Rrl;
use crate::serving::ixfr_log::IxfrLog;
use crate::serving::local_log::LocalLog;
use crate::serving::policy::{IXFR_HISTORY_NAMES_DEFAULT, TransferPolicy};
use crate::serving::zones::ZoneTable;
use crate::zone::dns_zone::StaticZone;
use crate::zone::journal::Journal;
use crate::zone::signed::ResignStep;
use crate::zone::snapshot::Snapshot;
use arc_swap::ArcSwap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use dnsplan_common::status::SecondaryStatus;

/// Every notified secondary's status, shared by the tasks and `/v1/status`.
pub type Statuses = Arc<Mutex<Vec<SecondaryStatus>>>;

/// What the listeners share: the snapshot, limits, the UDP rate limiter and metrics.
pub struct Serving {
    pub snapshot: ArcSwap<Snapshot>,
    pub zone: Arc<StaticZone>,
    pub limits: AnswerLimits,
    /// Response-rate limiting of UDP answers; `None` when it is off.
    pub rrl: Option<Rrl>,
    /// Who may transfer the zone, and the TSIG keys signed queries are checked against
    /// (shared by every zone of the authority).
    pub transfer: Arc<TransferPolicy>,
    pub metrics: Arc<Metrics>,
    /// The SOA serial served, sent after each swap: what `notify` tells secondaries about.
    pub served_serial: tokio::sync::watch::Sender<u32>,
    /// The applied-change count served, sent after each swap of the follower's: what the
    /// keeper of the state on disk waits on (`Keeper::keep_saved`), so that a quiet zone wakes
    /// nothing (10,000 zones polled every 250 ms were a quarter of a core).
    pub served_applied: tokio::sync::watch::Sender<u64>,
    /// What `notify` knows of each secondary it notifies.
    pub secondaries: Statuses,
    /// The history IXFR answers from. The follower appends each swap and swaps the snapshot
    /// while holding it, so a transfer that loads the snapshot under it sees both at once.
    pub journal: Mutex<Journal>,
    /// On etcd, the log each change is made durable in before it is swapped in (`local_log`).
    pub served_log: Option<Arc<LocalLog>>,
    /// The IXFR history on disk (`ixfr_log`), when secondaries are configured.
    pub ixfr_log: Option<Arc<IxfrLog>>,
    /// On the managed zone's `Serving`: the other zones the listeners answer for (`zones`).
    pub others: Option<Arc<ZoneTable>>,
    /// Queries a static zone answered (`GET /v1/zones`); the managed zone's are in the metrics.
    pub answered: std::sync::atomic::AtomicU64,
    /// With a keyring: the follower serves only records a trusted plan says.
    pub plan_check: Option<Arc<crate::serving::trusted::PlanCheck>>,
    /// Held by whoever makes the next snapshot from the current one, from its load to its
    /// swap: the follower (`rebuild`), re-signing (`resign_step`) and new keys (`keys_step`,
    /// in a task of its own), so that none swaps over another's snapshot.
    pub writer: tokio::sync::Mutex<()>,
}

/// The log target of the audit lines (every write that changes what is served or automated).
pub const AUDIT_TARGET: &str = "dnsplan::audit";

impl Serving {
    /// Serves `snapshot` (read from the file on disk before the store answers, on etcd);
    /// the follower goes on from its applied-change count. `started`: when the load began.
    pub fn from_loaded(
        snapshot: Snapshot,
        zone: Arc<StaticZone>,
        limits: AnswerLimits,
        metrics: Arc<Metrics>,
        started: Instant,
    ) -> Serving {
        Serving::from_snapshot(snapshot, zone, limits, metrics, started)
    }

    fn from_snapshot(
        mut snapshot: Snapshot,
        zone: Arc<StaticZone>,
        limits: AnswerLimits,
        metrics: Arc<Metrics>,
        started: Instant,
    ) -> Serving {
        // The static records are in the snapshot's names now, which later snapshots are
        // rebuilt from: a copy in the zone would double them (tens of KB a zone).
        let zone = Arc::new(zone.without_records());
        snapshot.zone = zone.clone();
        metrics.observe_snapshot(&snapshot, None, started.elapsed().as_secs_f64());
        let serial = snapshot.serial;
        let served_serial = tokio::sync::watch::Sender::new(serial);
        let served_applied = tokio::sync::watch::Sender::new(snapshot.applied_changes);
        let journal = Mutex::new(journal_at(&snapshot, IXFR_HISTORY_NAMES_DEFAULT));
        Serving {
            snapshot: ArcSwap::from_pointee(snapshot),
            zone,
            limits,
            rrl: None,
            transfer: Arc::new(TransferPolicy::closed()),
            metrics,
            served_serial,
            served_applied,
            secondaries: Statuses::default(),
            journal,
            served_log: None,
            ixfr_log: None,
            others: None,
            answered: Default::default(),
            plan_check: None,
            writer: tokio::sync::Mutex::new(()),
        }
    }

    /// The `Serving` of a static zone (`zones`): its records at its own serial, no store
    /// behind it. Its figures are not the managed zone's, so the snapshot gauges are left
    /// alone.
    pub fn for_static(zone: Arc<StaticZone>, limits: AnswerLimits, metrics: Arc<Metrics>, transfer: Arc<TransferPolicy>) -> Serving {
        let mut snapshot = Snapshot::static_zone(zone.clone());
        // The records are in the snapshot now; a copy in the zone would double them.
        let zone = Arc::new(zone.without_records());
        snapshot.zone = zone.clone();
        let (serial, applied) = (snapshot.serial, snapshot.applied_changes);
        let journal = Mutex::new(journal_at(&snapshot, transfer.ixfr_history_names_max()));
        Serving {
            snapshot: ArcSwap::from_pointee(snapshot),
            zone,
            limits,
            rrl: None,
            journal,
            transfer,
            metrics,
            served_serial: tokio::sync::watch::Sender::new(serial),
            served_applied: tokio::sync::watch::Sender::new(applied),
            secondaries: Statuses::default(),
            served_log: None,
            ixfr_log: None,
            others: None,
            answered: Default::default(),
            plan_check: None,
            writer: tokio::sync::Mutex::new(()),
        }
    }

    /// With the other zones the listeners answer for.
    pub fn with_zones(self, others: Arc<ZoneTable>) -> Serving {
        Serving { others: Some(others), ..self }
    }

    /// With each change logged durably before it is served (`local_log`).
    pub fn with_served_log(self, served_log: Option<Arc<LocalLog>>) -> Serving {
        Serving { served_log, ..self }
    }

    /// With the follower serving only records a trusted plan says (`None`: every record).
    pub fn with_plan_check(self, plan_check: Option<Arc<crate::serving::trusted::PlanCheck>>) -> Serving {
        Serving { plan_check, ..self }
    }

    /// With UDP answers limited by `rrl` (`None`: not limited).
    pub fn with_rrl(self, rrl: Option<Rrl>) -> Serving {
        Serving { rrl, ..self }
    }

    /// With zone transfers allowed as `transfer` says (closed by default), and its IXFR
    /// history size.
    pub fn with_transfer(self, transfer: Arc<TransferPolicy>) -> Serving {
        let journal = Mutex::new(journal_at(&self.snapshot.load(), transfer.ixfr_history_names_max()));
        Serving { transfer, journal, ..self }
    }

    /// With the IXFR history kept on disk in `data_dir` (`ixfr_log`) and read back from it,
    /// when secondaries may transfer and `dns.transfer.ixfr_journal_bytes_max` is not 0. Call
    /// after `with_transfer`, before the follower starts. A file that cannot be opened is a
    /// WARN line, and the history is kept in memory only.
    pub fn with_ixfr_log(self, data_dir: &std::path::Path) -> Serving {
        let bytes_max = self.transfer.ixfr_journal_bytes_max();
        if bytes_max == 0 || !self.transfer.has_secondaries() {
            return self;
        }
        let path = ixfr_log::path_in(data_dir);
        let serial = self.snapshot.load().serial;
        let digest = self.snapshot.load().statics_digest();
        let (log, restored) = match IxfrLog::open(&path, digest, serial, bytes_max) {
            Ok(opened) => opened,
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "cannot open the IXFR history on disk; keeping it in memory only");
                return self;
            }
        };
        // A signed zone's signatures are made again at each start: the history on disk holds
        // the ones before, which are no longer served, so it starts over (secondaries then
        // transfer the whole zone once).
        let restored = if self.snapshot.load().is_signed() {
            log.forget();
            Vec::new()
        } else {
            restored
        };
        {
            let mut journal = self.journal.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(first) = restored.first() {
                *journal = Journal::new(first.from, self.transfer.ixfr_history_names_max());
            }
            let swaps = restored.len();
            for swap in restored {
                journal.push_records(swap.from, swap.to, swap.gone, swap.new, swap.names);
            }
            if swaps > 0 {
                tracing::info!(swaps, from_serial = journal.start(), to_serial = journal.end(), "IXFR history read back from disk");
            }
        }
        Serving { ixfr_log: Some(Arc::new(log)), ..self }
    }
}

impl Serving {
    /// A signed zone whose oldest signatures have less than `signature_refresh_days` left is
    /// signed again whole, the zone changed or not, `batch` names a step
    /// (`Snapshot::resign_step`): the managed zone's follower takes a step each time its wait
    /// on the store ends (back to back while a round is under way, changes swapped in between),
    /// the static zones' task (`resign_static_zones`) a whole round every `RESIGN_CHECK`. Each
    /// step cuts the IXFR history (a secondary at the serial holds other signatures); the last
    /// moves the serial (`Snapshot::signing_term`), so the secondaries transfer the new
    /// signatures before theirs expire: the managed zone's NOTIFY tasks see `served_serial`
    /// move; a static zone's caller notifies. `observe`: the metrics are this zone's own (a
    /// static zone shares the managed zone's).
    pub async fn resign_step(&self, observe: bool, batch: usize) -> ResignStep {
        let _writer = self.writer.lock().await;
        let current = self.snapshot.load_full();
        let now = crate::zone::signed::unix_now();
        if !current.resigning() && !current.resign_due(now) {
            return ResignStep::Idle;
        }
        let started = Instant::now();
        let from = current.clone();
        let stepped = tokio::task::spawn_blocking(move || {
            let mut next = (*from).clone();
            let step = next.resign_step(now, batch);
            (next, step)
        })
        .await;
        let (next, step) = match stepped {
            Ok((_, ResignStep::Idle)) => return ResignStep::Idle,
            Ok((next, step)) => (Arc::new(next), step),
            Err(err) => {
                tracing::error!(zone = %self.zone.origin, error = %err, "signing the zone again did not finish; the signatures served stay");
                return ResignStep::Idle;
            }
        };
        let serial = next.serial;
        {
            let mut journal = self.journal.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            // Only over the snapshot it started from; a change swapped in meanwhile keeps the
            // round where it was, and the step is taken again.
            let before = self.snapshot.compare_and_swap(&current, next.clone());
            if !Arc::ptr_eq(&before, &current) {
                return ResignStep::Idle;
            }
            // A secondary at this serial holds the signatures before: the next change
            // reaches it as a whole zone.
            *journal = Journal::cut(serial, self.transfer.ixfr_history_names_max());
        }
        if step == ResignStep::Done {
            if observe {
                self.metrics.observe_signatures(&next);
            }
            self.served_serial.send_if_modified(|served| std::mem::replace(served, serial) != serial);
            tracing::info!(
                zone = %self.zone.origin,
                seconds = started.elapsed().as_secs_f64(),
                serial,
                "every RRset of the signed zone signed again before its signatures expire"
            );
        }
        step
    }
}

/// Names signed again in one step of a round (`Serving::resign_step`): about 50 ms of
/// signatures on two cores, the longest a change waits for one.
pub const RESIGN_BATCH: usize = 2_048;
/// The wait on the store between two steps of a round: a change that came meanwhile is
/// swapped in first.
pub const RESIGN_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// Whose keys `keep_keys` follows.
pub enum KeysOf {
    /// A zone the store manages: its NOTIFY tasks follow `served_serial`; its directory may be
    /// shared through its store.
    Managed(Option<shared_keys::SharedKeys>),
    /// A static zone: `notify` tells its secondaries of a change (`xfr::notify::spawn_static`);
    /// followed while `table` serves this very zone (a zone added at run time may be replaced
    /// or removed).
    Static { notify: fn(Arc<Serving>), table: Arc<ZoneTable> },
}

/// Reads a signed zone's key directory every `every` (`Serving::keys_step`, `key_check_secs`);
/// when its keys changed, a round of signing every name with a new ZSK is taken here a batch
/// at a time (the follower may take steps of it too: each is a swap over the snapshot it
/// started from, so none is taken twice). Until dropped, or, for a static zone, until its
/// table serves another zone of its name or none.
pub async fn keep_keys(serving: Arc<Serving>, every: std::time::Duration, of: KeysOf) {
    loop {
        tokio::time::sleep(every).await;
        let shared = match &of {
            KeysOf::Managed(shared) => shared.as_ref(),
            KeysOf::Static { table, .. } => {
                if !table.get(&serving.zone.origin).is_some_and(|now| Arc::ptr_eq(&now, &serving)) {
                    return;
                }
                None
            }
        };
        if !serving.keys_step(shared).await {
            continue;
        }
        // A step that does nothing (it failed: logged) ten times in a row leaves the round to
        // the next look, not to a loop every millisecond.
        let mut idle = 0;
        let managed = matches!(of, KeysOf::Managed(_));
        while serving.snapshot.load().resigning() && idle < 10 {
            match serving.resign_step(managed, RESIGN_BATCH).await {
                ResignStep::Idle => idle += 1,
                _ => idle = 0,
            }
            tokio::time::sleep(RESIGN_PAUSE).await;
        }
        if let KeysOf::Static { notify, .. } = &of {
            notify(serving.clone());
        }
    }
}

impl Serving {
    /// A zone signed with a key directory (`key_dir`): the directory is read again (and the
    /// rolls its schedule calls for made, when this authority makes them:
    /// `ZoneSigner::read_dir`); keys changed since are swapped in
    /// (`Snapshot::set_signer`: the apex's DNSKEY, CDS and CDNSKEY, and with a new ZSK a round
    /// of signing every name with it). Not while a round is under way. The IXFR history is cut
    /// (a secondary at the serial holds other signatures). Returns whether new keys were
    /// swapped in (a new ZSK's round is then under way, and the serial moves at its end):
    /// a static zone's caller notifies; the managed zone's NOTIFY tasks see `served_serial`.
    /// `shared`: the directory is shared through the store (`shared_keys`).
    pub async fn keys_step(&self, shared: Option<&shared_keys::SharedKeys>) -> bool {
        let current = self.snapshot.load_full();
        let Some(signer) = current.zone.signer.clone() else { return false };
        let crate::zone::dns_zone::KeySource::Dir { path, rolls, .. } = signer.source.clone() else { return false };
        if current.resigning() {
            return false;
        }
        let now = crate::zone::signed::unix_now();
        let (dir, origin) = (path.clone(), self.zone.origin.clone());
        let read = match shared {
            Some(shared) => Ok(shared.look(&dir, &origin, rolls, now).await),
            None => tokio::task::spawn_blocking(move || crate::zone::dns_zone::ZoneSigner::read_dir(&dir, &origin, rolls, now)).await,
        };
        let (keys, policy) = match read {
            Ok(Ok(read)) => read,
            Ok(Err(err)) => {
                self.metrics.dnssec_key_dir_failures.inc();
                tracing::error!(zone = %self.zone.origin, key_dir = %path.display(), error = %err, "the zone's key directory could not be read; it stays signed with the keys it has");
                return false;
            }
            Err(err) => {
                self.metrics.dnssec_key_dir_failures.inc();
                tracing::error!(zone = %self.zone.origin, error = %err, "reading the zone's key directory did not finish");
                return false;
            }
        };
        // From here to the swap, no other snapshot is made from this one.
        let _writer = self.writer.lock().await;
        let current = self.snapshot.load_full();
        let Some(signer) = current.zone.signer.clone() else { return false };
        if current.resigning() {
            return false;
        }
        // A new DNSKEY TTL alone waits for the next change of keys: the serial would not move.
        if keys.same_keys(&signer.keys) {
            return false;
        }
        let summary = keys.summary();
        let next_signer = Arc::new(signer.with_keys(keys, policy.dnskey_ttl_secs));
        let from = current.clone();
        let changed = tokio::task::spawn_blocking(move || {
            let mut next = (*from).clone();
            next.set_signer(next_signer, now).map(|()| next)
        })
        .await;
        let next = match changed {
            Ok(Ok(next)) => Arc::new(next),
            Ok(Err(err)) => {
                self.metrics.dnssec_key_dir_failures.inc();
                tracing::error!(zone = %self.zone.origin, error = %err, "the zone's new keys could not be served; it stays signed with the keys it has");
                return false;
            }
            Err(err) => {
                self.metrics.dnssec_key_dir_failures.inc();
                tracing::error!(zone = %self.zone.origin, error = %err, "serving the zone's new keys did not finish");
                return false;
            }
        };
        let serial = next.serial;
        {
            let mut journal = self.journal.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let before = self.snapshot.compare_and_swap(&current, next.clone());
            if !Arc::ptr_eq(&before, &current) {
                // A change came in meanwhile: read again at the next look.
                return false;
            }
            *journal = Journal::cut(serial, self.transfer.ixfr_history_names_max());
        }
        tracing::info!(zone = %self.zone.origin, keys = %summary, serial, resigning = next.resigning(), "the zone's DNSSEC keys changed");
        self.served_serial.send_if_modified(|served| std::mem::replace(served, serial) != serial);
        true
    }
}

/// How often the static zones' signatures are looked at (`resign_static_zones`).
pub const RESIGN_CHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// The IXFR history of a snapshot just loaded: a signed zone's is `cut` (its signatures were
/// made again at this start, so a secondary at its serial may hold others).
fn journal_at(snapshot: &Snapshot, names_max: usize) -> Journal {
    if snapshot.is_signed() { Journal::cut(snapshot.serial, names_max) } else { Journal::new(snapshot.serial, names_max) }
}
