//! The follower: checks that the store is the configured DNS zone's, builds the first
//! snapshot from the store (`Loader`, a page at a time), then waits on the store and swaps in
//! a merged snapshot whenever its applied-change count moves (`Serving::follow`). `Serving`
//! itself, what the DNS listeners in `net` read, is `serving`'s; this module does no DNS I/O.
//!
//! Before the first load, [`check_dns_zone`] compares the configured origin with the store's
//! DNS zone and refuses to start on a mismatch, naming both zones and what to change (an empty
//! store is any zone's). The first snapshot is one moment of the store however long the load
//! took (`Loader`); after it, `follow` asks `active_since(snapshot's applied_changes)` and
//! merges only what switched (changes during a merge coalesce into the next one). A store
//! outage is logged once when it begins and once when it ends (`daemon::Reachability`), and the
//! snapshot is kept meanwhile: serving never waits for the store.

use crate::metrics::Metrics;
use crate::query::answer::AnswerLimits;
use crate::serving::Serving;
use crate::serving::trusted::PlanCheck;
use crate::zone::dns_zone::StaticZone;
use crate::zone::journal::{JournalChange, swap_records};
use crate::zone::snapshot::{Snapshot, wire_key};
use dnsplan_common::daemon::Reachability;
use dnsplan_common::store::{ACTIVE_PAGE_MAX, ActiveDelta, ActivePage, Store, StoreError, StoreResult, StoreVersion};
use dnsplan_common::{DnsName, EndpointName, Generation};
use hickory_proto::rr::Name;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// How long the follower waits on the store per long-poll before asking again.
const FOLLOW_WAIT: Duration = Duration::from_secs(30);
pub use crate::serving::{RESIGN_BATCH, RESIGN_PAUSE};
/// Pause after a failed store read before the follower retries.
const FOLLOW_RETRY: Duration = Duration::from_millis(500);

/// Why the first snapshot was not built.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error(
        "the store holds plans for the DNS zone {stored} (latest plan {latest}), but this authority is configured for \
         {configured} (dns_zone.origin), so it would serve none of the store's names; set dns_zone.origin = \"{stored}\", \
         or give the authority a store of {configured} (data_dir)"
    )]
    DnsZoneMismatch { configured: String, stored: DnsName, latest: Generation },
    #[error("reading the DNS zone of the store's latest plan")]
    Store(#[source] StoreError),
}

/// Refuses a store whose plans are for another DNS zone than `zone`'s origin. Plans carry
/// their DNS zone and the store refuses a plan for another zone than the ones before it, so
/// the latest plan speaks for every stored plan and every active endpoint. An empty store
/// (no plan yet) is any zone's.
///
/// Without this an authority pointed at the wrong store, or configured with the wrong origin,
/// starts and silently serves none of the store's names. The zone is read alone
/// (`Store::dns_zone`: one key on sled and on etcd); reading the latest plan for it cost a
/// second of every start at 1,000,000 endpoints.
pub async fn check_dns_zone<S: Store>(store: &S, zone: &StaticZone) -> Result<(), LoadError> {
    let Some(stored) = store.dns_zone().await.map_err(LoadError::Store)? else {
        return Ok(());
    };
    if Name::from_ascii(stored.as_str()).is_ok_and(|name| name == zone.origin) {
        return Ok(());
    }
    let latest = store.latest().await.map_err(LoadError::Store)?;
    Err(LoadError::DnsZoneMismatch { configured: zone.origin.to_string(), stored, latest })
}

impl Serving {
    /// Checks that the store is one of `zone`'s (`check_dns_zone`), then loads the active
    /// state from `store` and builds the first snapshot (see `Loader`).
    /// With `check`, only records a trusted plan says are served (`trusted`), now and when
    /// followed.
    pub async fn load<S: Store>(
        store: &S,
        zone: Arc<StaticZone>,
        limits: AnswerLimits,
        metrics: Arc<Metrics>,
        check: Option<Arc<PlanCheck>>,
    ) -> anyhow::Result<Serving> {
        check_dns_zone(store, &zone).await?;
        let started = Instant::now();
        let snapshot = Loader::new(zone.clone(), check.clone()).finish(store).await?;
        Ok(Serving::from_loaded(snapshot, zone, limits, metrics, started).with_plan_check(check))
    }

    /// As `load`, from the serving image at `image` when it is this store's (see `image`):
    /// the image, brought up to the store, else the store's pages. Also gives the
    /// applied-change count the image used was saved at.
    pub async fn load_imaged<S: Store>(
        store: &S,
        image: &std::path::Path,
        zone: Arc<StaticZone>,
        limits: AnswerLimits,
        metrics: Arc<Metrics>,
        check: Option<Arc<PlanCheck>>,
    ) -> anyhow::Result<(Serving, Option<u64>)> {
        check_dns_zone(store, &zone).await?;
        let started = Instant::now();
        let (snapshot, saved_at) = match crate::follow::image::resume(store, image, zone.clone(), check.as_deref()).await {
            Some((saved_at, snapshot)) => (snapshot, Some(saved_at)),
            None => (Loader::new(zone.clone(), check.clone()).finish(store).await?, None),
        };
        Ok((Serving::from_loaded(snapshot, zone, limits, metrics, started).with_plan_check(check), saved_at))
    }

    /// Rebuilds the snapshot whenever the store's applied-change counter moves. Runs until the
    /// task is dropped. Changes that arrive during a rebuild are picked up by the next one.
    /// `reach` is told whether the store answers (`/readyz` and the metrics read it).
    pub async fn follow<S: Store>(self: Arc<Self>, store: S, reach: Arc<Reachability>) {
        // An outage is logged when it begins and when it ends, not on every retry: the
        // authority keeps serving its snapshot meanwhile, which is the point.
        let mut seen = StoreVersion { applied_changes: self.snapshot.load().applied_changes, ..StoreVersion::default() };
        loop {
            // While a round of re-signing is under way its steps follow one another, a change
            // swapped in between any two.
            let wait = if self.snapshot.load().resigning() { RESIGN_PAUSE } else { FOLLOW_WAIT };
            match store.wait_for_change(seen, wait).await {
                Ok(now) if now.applied_changes != seen.applied_changes => match self.rebuild(&store).await {
                    Ok(applied) => {
                        reach.answered();
                        seen = StoreVersion { applied_changes: applied, ..now };
                        self.resign_step(true, RESIGN_BATCH).await;
                    }
                    Err(err) => {
                        reach.failed(&format!("{err:#}; still serving the previous snapshot"));
                        tokio::time::sleep(FOLLOW_RETRY).await;
                    }
                },
                Ok(now) => {
                    reach.answered();
                    seen = now;
                    self.resign_step(true, RESIGN_BATCH).await;
                }
                Err(err) => {
                    reach.failed(&format!("{err:#}; still serving the current snapshot"));
                    tokio::time::sleep(FOLLOW_RETRY).await;
                }
            }
        }
    }

    /// Brings the snapshot up to the store: merges what switched since the current snapshot,
    /// or rebuilds from the whole state when the store answers with it. Cancel-safe: the
    /// snapshot is swapped after the last await. Returns the applied-change count served.
    pub(crate) async fn rebuild<S: Store>(&self, store: &S) -> anyhow::Result<u64> {
        let started = Instant::now();
        // The next snapshot is made from this one and swapped in with no other made meanwhile
        // (new keys, a re-signing step: `Serving::writer`).
        let _writer = self.writer.lock().await;
        let current = self.snapshot.load_full();
        let from = current.serial;
        let mut delta = store.active_since(current.applied_changes).await?;
        if let Some(check) = &self.plan_check {
            check.keep_trusted_map(store, &mut delta.endpoints).await?;
        }
        let served_log = self.served_log.clone();
        let ixfr_log = self.ixfr_log.clone();
        let (snapshot, delta, changes) = tokio::task::spawn_blocking(move || {
            let next = current.apply(&delta);
            // Every name signed again (a signed zone's full signing) starts the history over,
            // as a rebuild does.
            let changes = (!delta.full && next.last_signed().is_some()).then(|| changed_entries(&current, &next, &delta));
            // The IXFR history on disk, before the swap (as the journal in memory is).
            if let Some(log) = &ixfr_log
                && next.serial != current.serial
            {
                match &changes {
                    Some(changes) => {
                        let (gone, new) = swap_records(changes);
                        log.append_or_say(current.serial, next.serial, changes.len(), &gone, &new);
                    }
                    // A rebuild: no swap to write, so what follows is no chain from the file.
                    None => log.forget(),
                }
            }
            // Persist before serve: on disk before any answer carries it.
            if let Some(log) = &served_log
                && delta.applied_changes != current.applied_changes
            {
                log.append_or_say(&delta);
            }
            (next, delta, changes)
        })
        .await?;
        let applied = snapshot.applied_changes;
        let serial = snapshot.serial;
        self.metrics.observe_snapshot(&snapshot, Some(&delta), started.elapsed().as_secs_f64());
        {
            let mut journal = self.journal.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match changes {
                // Fences moved to a newer plan with the same records: nothing served changed,
                // so neither the serial nor the history IXFR answers from.
                Some(_) if serial == from => {}
                Some(changes) => journal.push(from, serial, changes),
                None => journal.reset(serial),
            }
            self.snapshot.store(Arc::new(snapshot));
        }
        self.served_serial.send_if_modified(|served| std::mem::replace(served, serial) != serial);
        self.served_applied.send_if_modified(|served| std::mem::replace(served, applied) != applied);
        tracing::debug!(applied_changes = applied, "snapshot swapped");
        Ok(applied)
    }
}

/// Each endpoint of `delta` with its entry in `before` and in `after`, for the IXFR history,
/// and in a signed zone each other name whose signatures the change made again (its NSEC
/// neighbours, the apex: `Snapshot::last_signed`).
fn changed_entries(before: &Snapshot, after: &Snapshot, delta: &ActiveDelta) -> Vec<JournalChange> {
    let mut keys: Vec<Box<[u8]>> = delta
        .endpoints
        .keys()
        .filter_map(|endpoint| Some(wire_key(&Name::from_ascii(endpoint.as_str()).ok()?).into_boxed_slice()))
        .collect();
    keys.extend(after.last_signed().unwrap_or_default().iter().cloned());
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .map(|key| {
            let (was, is) = (before.entry_arc(&key), after.entry_arc(&key));
            (key, was, is)
        })
        .collect()
}

/// Builds the first snapshot from the store a page at a time (`Store::active_page`), so a
/// large zone is never held twice, once decoded and once as the snapshot: the peak memory of
/// a start is the snapshot plus one page.
///
/// The pages are read at different moments. `finish` merges every endpoint that switched
/// after the first page was read (`active_since`), so the result is the store's state at one
/// applied-change count, whatever changed during the load. (If more than
/// `DELTA_ENDPOINTS_MAX` endpoints changed meanwhile, the store answers with the whole state
/// and the snapshot is rebuilt from it, at the old peak; only under that much churn.)
pub struct Loader {
    check: Option<Arc<PlanCheck>>,
    snapshot: Snapshot,
    after: Option<EndpointName>,
    since: Option<u64>,
    done: bool,
}

impl Loader {
    /// With `check`, a record no trusted plan says is left out (`trusted`).
    pub fn new(zone: Arc<StaticZone>, check: Option<Arc<PlanCheck>>) -> Loader {
        Loader { check, snapshot: Snapshot::statics_only(zone), after: None, since: None, done: false }
    }

    /// Reads and merges the next page. `false` once the last page is in.
    pub async fn next_page<S: Store>(&mut self, store: &S) -> StoreResult<bool> {
        if self.done {
            return Ok(false);
        }
        let mut page = store.active_page(self.after.take(), ACTIVE_PAGE_MAX).await?;
        self.since.get_or_insert(page.applied_changes);
        self.after = page.endpoints.last().map(|(name, _)| name.clone());
        self.done = !page.more || self.after.is_none();
        if let Some(check) = &self.check {
            check.keep_trusted(store, &mut page.endpoints).await?;
        }
        self.snapshot.load_page(&page.endpoints);
        Ok(!self.done)
    }

    /// Reads and merges every page left, reading each page while the one before is merged
    /// (the store decodes on a blocking thread, the merge runs here): on two cores a large
    /// load takes about the longer of the two, not their sum.
    async fn load_pages<S: Store>(&mut self, store: &S) -> StoreResult<()> {
        if self.done {
            return Ok(());
        }
        let read = |after: Option<EndpointName>| {
            let store = store.clone();
            tokio::spawn(async move { store.active_page(after, ACTIVE_PAGE_MAX).await })
        };
        let joined = |joined: Result<StoreResult<ActivePage>, tokio::task::JoinError>| {
            joined.map_err(|err| StoreError::Unavailable(format!("reading a page of the active state did not finish: {err}")))?
        };
        let mut reading = read(self.after.take());
        loop {
            let mut page = joined(reading.await)?;
            self.since.get_or_insert(page.applied_changes);
            let after = page.endpoints.last().map(|(name, _)| name.clone());
            self.done = !page.more || after.is_none();
            let next = (!self.done).then(|| read(after.clone()));
            if let Some(check) = &self.check {
                check.keep_trusted(store, &mut page.endpoints).await?;
            }
            self.snapshot.load_page(&page.endpoints);
            self.after = after;
            match next {
                Some(next) => reading = next,
                None => return Ok(()),
            }
        }
    }

    /// The snapshot, brought up to the store by the changes made during the load.
    pub async fn finish<S: Store>(mut self, store: &S) -> StoreResult<Snapshot> {
        self.load_pages(store).await?;
        let mut delta = store.active_since(self.since.unwrap_or_default()).await?;
        if let Some(check) = &self.check {
            check.keep_trusted_map(store, &mut delta.endpoints).await?;
        }
        Ok(self.snapshot.apply(&delta))
    }
}
