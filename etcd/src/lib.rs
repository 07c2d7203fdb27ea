//! dnsplan's fenced store on etcd v3: [`EtcdStore`], the whole `Store` contract as etcd
//! transactions, so that planners, enactors and authorities on different machines share one
//! replicated store with no single machine to lose.
//!
//! Every write follows one pattern: read what the decision needs (one read transaction, so one
//! consistent revision), decide with the same pure functions as the embedded store
//! (`decide_cleanup`, the lease decisions, the fence rules), then commit in one transaction
//! whose compares restate exactly what was read. A compare that fails means someone wrote in
//! between: read again and decide again, at most [`ATTEMPTS_MAX`] times. So every fence is
//! checked by etcd at write time, atomically with the write; the earlier read only chooses
//! what to write and which error to report. The key layout is in `keys`; each transaction's
//! compares are below. Bad data under the store's keys is `Corrupt`, never a panic.
//!
//! One file per concern: `config` (settings), `txn` (the client, bounded transactions and
//! reads, retries, compare helpers), `plans` (staging, publish, settle, reads and the cache),
//! `active` (fenced switches, the applied-change slots, reads of what is served),
//! `active_log` (the watch `active_since` reads first), `control` (lease, pause), `cleanup`,
//! `zones` (the zones added beside the first, each a store under its own prefix, fenced by its
//! live key); this file has the types and the `Store` impl.
//!
//! Not here: connecting daemons to etcd (their configs), keeping an authority serving while
//! etcd is away (the authority keeps its own copy), and TLS options beyond what the client
//! offers. Plans are immutable, so decoded ones are cached ([`PLAN_CACHE_MAX`]): the cache
//! assumes a prefix is never wiped and reused while a store runs on it.
//!
//! Where each fence is checked (the compares of each transaction):
//!
//! - **publish** (`publish_inner`): `meta/latest` = parent (absent for the first plan);
//!   `lease/live` = the caller's epoch and holder (leased), or absent (an automation publish
//!   without a lease); `state/pause` absent (automation); `state/dns_zone` = the stored zone (or
//!   absent); and, for a chunked plan, its `staging/g nonce` key exists. It writes plan, summary,
//!   changes, `meta/latest` (and the DNS zone and horizon on the first publish) and deletes the
//!   staging key: a plan becomes visible only through this compare-and-swap, so no reader sees half
//!   of one. Chunks are written before it under a fresh nonce. A publish that fails settles in one
//!   more transaction: if `plans/g` (and `changes/g`) hold its own values, its transaction
//!   committed and only the reply was lost (a timeout after the commit), and it reports success;
//!   otherwise the same transaction removes its chunks and staging key, so a commit still in flight
//!   fails its staging compare. (A plan small enough to be inline has no staging key: when its
//!   transaction's reply is lost and etcd does not hold it yet, it may still commit: the caller
//!   hears `Unavailable`, and `latest` tells.) After each commit the store removes (16
//!   at most per publish) staging areas of generations at or below the new latest, which can never
//!   commit, left by a publisher that died between chunks and commit. Chunks without a staging key
//!   (a publisher that died after another's sweep) go with cleanup's range delete.
//! - **apply, retire, apply_many** (`switch_many`, `switch_part`): validation and the content
//!   check come first, against plan `g` decoded (plans are immutable, so a decoded plan is cached,
//!   8 at most); then each transaction compares `state/horizon` < `g + 1` (plan `g` still
//!   stored), every switching endpoint's `fence/name` = the generation read (absent for a new
//!   endpoint), and the store's slot of the applied-change counter = the slot's value read. It
//!   writes record, fence, the `serving/` index entries and the slot plus the switches. A batch
//!   is split into transactions of at most `(max-txn-ops − 1) / 4` endpoints (31) and half a
//!   request of records; each part is atomic for its endpoints, and the outcomes (`Stale`,
//!   `Unchanged`, `Switched`) are sled's; a batch refused part-way (`Pruned`, `Unavailable`)
//!   keeps its earlier parts, which a retry finds `Unchanged`. The fence compare is what keeps
//!   switches monotonic. The counter is kept in 16 slots (`APPLIED_SLOTS`) so that it does not
//!   serialise them: with one counter key every apply transaction would compare it, and of
//!   enactors' concurrent transactions on different endpoints all but one would fail and go
//!   round Raft again. A store picks a slot at random and moves to another after a failed
//!   transaction.
//!   The count is the sum of the slots, read in one range read; every switch writes a slot, so
//!   the highest `mod_revision` among them is the last switch's revision. A slot holds two
//!   big-endian counts: applied changes, and content changes (transactions that changed what
//!   is served, judged against the `active/` records read with the fences; the SOA serial
//!   derives from it). A slot of 8 bytes, written before the content count, counts as both.
//! - **cleanup**: `state/horizon` and `meta/control` = as read, and no key in
//!   `serving/ 0 .. serving/ horizon_after` (a range compare: no endpoint serves a generation
//!   that would be deleted, checked at write time, so an endpoint first applied at an old plan
//!   during cleanup holds it back or is refused as `Pruned`). The same transaction moves the
//!   horizon and deletes the plans, summaries, changes, chunks and staging below it: logical and
//!   physical deletion are one step.
//! - **lease**: acquire and release compare `lease/record` and `lease/live` as read; liveness is
//!   the live key's existence, so etcd's clock decides expiry (TTL in whole seconds, at least
//!   one; etcd raises a shorter one to 1.5 election timeouts, 2 s with its defaults, so a lease
//!   of `LEASE_TTL_MIN` lasts that long there), not any client's. Renewal moves the live key to a
//!   new etcd lease and revokes the old. An acquire whose transaction fails without an answer
//!   reads the live key: on the new etcd lease, etcd committed it and the lease is granted;
//!   otherwise the new etcd lease is revoked, and a commit still in flight then fails (its put
//!   names a lease etcd no longer has). So a renewal whose reply is lost never takes away the
//!   lease its holder had.
//! - **pause/resume** compare `meta/control`; a **heartbeat** of a new enactor compares its key
//!   absent and `state/heartbeats` = the count read, so at most `HEARTBEATS_MAX` are stored.
//!
//! The fences among these compares (publish's latest, lease and pause; apply's fence, counter
//! and horizon; cleanup's `serving/` range) each have a test that fails without them. Races alone
//! land in the window between decision and commit too rarely to show that, so feature `testing`
//! (test builds only) adds two hooks: hold a write between its decision and its transaction
//! while the test changes what it decided on (`hold_next_commit`), and report a committed
//! transaction as `Unavailable`, as a timeout after the commit would (`lose_next_reply`).
//!
//! Followers: `wait_for_change` reads the version and watches `meta/` from the revision after
//! that read, so no change after it is missed, and it never polls. etcd delivers at once only to
//! a watch that starts after its current revision; one that starts in the past gets its history
//! from etcd's unsynced-watcher loop, every 100 ms. So once etcd confirms the watch, the waiter
//! reads the version again: a change in between is answered from that read, and any other write
//! in between (a heartbeat) means a fresh watch from the newer revision. A compacted revision
//! makes it read the version again and watch from there; at its timeout it reads the version, so
//! it answers the current one even when a change has not reached its watch yet.
//!
//! `active_since(n)` knows the revision at which this store last saw count `n` (the counts it
//! answered, 1,024 kept), reads the counter, and answers the endpoints written after that
//! revision up to the last switch's:
//! - from the store's own log of the writes to `active/` (`active_log`): one watch per store,
//!   opened at the current revision at its first `active_since` (so etcd sends each write as it
//!   commits), keeping the last 32,768 writes in memory. It answers when it holds the whole
//!   stretch: it started before it, dropped none of it, and has received the last switch (waited
//!   for at most 100 ms). This is the usual path, and costs one read of the counter.
//! - else from etcd: a range read of `active/` at the counter's revision with
//!   `min_mod_revision` just above `n`'s revision. Active records are never deleted and
//!   compaction keeps each key's last write, so this is exact even after a compaction; but etcd
//!   reads every active record to filter them (15-40 ms at 10,000 endpoints on a busy machine),
//!   which is why the log comes first.
//!
//! A count it never saw, or more than `DELTA_ENDPOINTS_MAX` endpoints, fall back to the whole
//! state, marked `full`.
//!
//! Teeth: with the `latest` compare taken out of publish's transaction, the conformance suite
//! fails `racing_publishes_have_no_gaps` (two publishers acknowledged the same generation);
//! with the fence compare taken out of apply's transaction, it fails
//! `racing_applies_are_monotonic` (the applied-change counter is kept in slots, so writers on
//! different slots are not serialised by it; see [`APPLIED_SLOTS`]); without the `serving/`
//! range compare in cleanup's transaction, the etcd test
//! `cleanup_never_deletes_a_plan_an_endpoint_just_switched_to` fails.
//! Without `settle` (a failed publish checked against what etcd holds before its chunks go),
//! `a_publish_whose_reply_is_lost_keeps_the_plan_it_committed` fails: a publish etcd committed
//! but whose reply was lost removed the chunks of the plan it had just made latest.

mod active;
mod active_log;
mod cleanup;
pub mod client;
mod config;
mod control;
mod handle;
mod keys;
mod plans;
mod txn;
mod zones;

pub use client::EtcdTls;
use client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions};
use dnsplan_common::Generation;
use dnsplan_common::changes::{PlanChanges, decode_changes};
use dnsplan_common::codec;
use dnsplan_common::names::{DnsName, EndpointName};
use dnsplan_common::plan::{Endpoint, PlanSummary, ValidatedPlan};
use dnsplan_common::store::lease::{self, Lease};
use dnsplan_common::store::{
    ACTIVE_PAGE_MAX, AUTHORITIES_MAX, ActiveDelta, ActivePage, ActiveRecord, ActiveSnapshot, ActiveState, ApplyItem, ApplyOutcome,
    AuthorityReport, CleanupDecision, CleanupReport, DELTA_ENDPOINTS_MAX, HEARTBEATS_MAX, Heartbeat, KeysPut, KeysRecord,
    PLAN_CHANGES_GAP_MAX, PauseState, Store, StoreError, StoreResult, StoreVersion,
};
use keys::{Keys, prefix_end};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

// Each concern's file adds to `EtcdStore`; the `Store` impl below uses them all.
use active::*;
use control::*;
pub use handle::{EtcdStore, LAYOUT};
use txn::*;

pub use config::{ConnectError, EtcdConfig, REQUEST_BYTES_DEFAULT, REQUEST_BYTES_MIN, REQUEST_TIMEOUT_DEFAULT, TXN_OPS_DEFAULT};
pub use txn::ATTEMPTS_MAX;

impl Store for EtcdStore {
    async fn publish(&self, plan: &ValidatedPlan) -> StoreResult<()> {
        self.publish_inner(plan, None).await
    }

    async fn publish_leased(&self, plan: &ValidatedPlan, lease: &Lease) -> StoreResult<()> {
        self.publish_inner(plan, Some(lease)).await
    }

    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> StoreResult<Lease> {
        let keys = &self.inner.keys;
        for attempt in 0..ATTEMPTS_MAX {
            let (_, r) = self.read("lease", vec![get(keys.lease_record()), get(keys.lease_live())]).await?;
            let record_kv = first(&r[0]);
            let live_kv = first(&r[1]);
            let record = record_kv
                .map(|kv| codec::decode::<Lease>(kv.value()))
                .transpose()
                .map_err(|e| StoreError::Corrupt { what: "planner lease".into(), source: e })?;
            let now = lease::now_unix_ms();
            let current = lease_view(record, live_kv.map(|kv| kv.value()), now)?;
            let granted = lease::decide_acquire(current.as_ref(), holder, ttl, now)?;
            // etcd's lease holds the live key; whole seconds, at least one.
            let ttl_secs = (ttl.as_millis().div_ceil(1000) as i64).max(1);
            let etcd_lease = self.call("lease grant", self.inner.client.lease_grant(ttl_secs)).await?;
            let txn = Txn::new()
                .when(vec![
                    cmp_bytes(keys.lease_record(), record_kv.map(|kv| kv.value())),
                    cmp_bytes(keys.lease_live(), live_kv.map(|kv| kv.value())),
                ])
                .and_then(vec![
                    put(keys.lease_record(), codec::encode(&granted)),
                    TxnOp::put(keys.lease_live(), lease_token(&granted), Some(PutOptions::new().with_lease(etcd_lease))),
                ]);
            let committed = match self.commit("lease", txn).await {
                Ok(r) => Ok(r.succeeded()),
                // etcd may have committed it and only the reply was lost: then the live key is
                // on the new etcd lease, and revoking that lease below would take away a lease
                // the holder had (on renewal, mid-term). Settled by reading the live key.
                Err(err) => match self.read("lease", vec![get(keys.lease_live())]).await {
                    Ok((_, r)) if first(&r[0]).is_some_and(|kv| kv.lease() == etcd_lease) => {
                        tracing::info!(error = %err, "the lease's reply was lost, but etcd committed it");
                        Ok(true)
                    }
                    _ => Err(err),
                },
            };
            let old = live_kv.map(|kv| kv.lease()).filter(|id| *id != 0);
            // The lease that no longer holds the live key (the new one on failure, the old
            // one on renewal) is revoked; if that fails, etcd expires it at its TTL. A commit
            // still in flight after the new one is revoked fails (its put names a lease etcd
            // no longer has).
            let revoke = match &committed {
                Ok(true) => old,
                _ => Some(etcd_lease),
            };
            if let Some(id) = revoke
                && let Err(err) = self.call("lease revoke", self.inner.client.lease_revoke(id)).await
            {
                tracing::debug!(error = %err, "could not revoke an unused etcd lease; it expires at its TTL");
            }
            if committed? {
                return Ok(granted);
            }
            back_off(attempt).await;
        }
        Err(contention("lease"))
    }

    async fn release_lease(&self, released: &Lease) -> StoreResult<()> {
        let keys = &self.inner.keys;
        for attempt in 0..ATTEMPTS_MAX {
            let (_, r) = self.read("lease", vec![get(keys.lease_record()), get(keys.lease_live())]).await?;
            let record_kv = first(&r[0]);
            let live_kv = first(&r[1]);
            let record = record_kv
                .map(|kv| codec::decode::<Lease>(kv.value()))
                .transpose()
                .map_err(|e| StoreError::Corrupt { what: "planner lease".into(), source: e })?;
            let now = lease::now_unix_ms();
            let current = lease_view(record, live_kv.map(|kv| kv.value()), now)?;
            let Some(after) = lease::decide_release(current.as_ref(), released, now) else { return Ok(()) };
            let txn = Txn::new()
                .when(vec![
                    cmp_bytes(keys.lease_record(), record_kv.map(|kv| kv.value())),
                    cmp_bytes(keys.lease_live(), live_kv.map(|kv| kv.value())),
                ])
                .and_then(vec![put(keys.lease_record(), codec::encode(&after)), TxnOp::delete(keys.lease_live(), None)]);
            if self.txn("lease release", txn).await?.succeeded() {
                if let Some(id) = live_kv.map(|kv| kv.lease()).filter(|id| *id != 0)
                    && let Err(err) = self.call("lease revoke", self.inner.client.lease_revoke(id)).await
                {
                    tracing::debug!(error = %err, "could not revoke a released etcd lease; it expires at its TTL");
                }
                return Ok(());
            }
            back_off(attempt).await;
        }
        Err(contention("lease release"))
    }

    async fn lease(&self) -> StoreResult<Option<Lease>> {
        let keys = &self.inner.keys;
        let (_, r) = self.read("lease", vec![get(keys.lease_record()), get(keys.lease_live())]).await?;
        let record = first(&r[0])
            .map(|kv| codec::decode::<Lease>(kv.value()))
            .transpose()
            .map_err(|e| StoreError::Corrupt { what: "planner lease".into(), source: e })?;
        lease_view(record, first(&r[1]).map(|kv| kv.value()), lease::now_unix_ms())
    }

    async fn plan(&self, generation: Generation) -> StoreResult<ValidatedPlan> {
        // The key is read every time, so a plan cleaned up is not found even if cached.
        let what = format!("plan {generation}");
        let (_, r) = self.read(&what, vec![get(self.inner.keys.plan(generation))]).await?;
        let Some(kv) = first(&r[0]) else { return Err(StoreError::PlanNotFound(generation)) };
        if let Some(plan) = self.cached_plan(generation) {
            return Ok((*plan).clone());
        }
        let bytes = self.read_blob(generation, kv.key(), kv.value(), &what).await?;
        let plan = codec::decode_plan(&bytes).map_err(|e| StoreError::Corrupt { what: what.clone(), source: e })?;
        if plan.generation() != generation {
            return Err(corrupt(what, format!("holds plan {}", plan.generation())));
        }
        self.cache_plan(Arc::new(plan.clone()));
        Ok(plan)
    }

    async fn plan_changes_unchecked(&self, from: Generation, to: Generation) -> StoreResult<Option<PlanChanges>> {
        if to.0.checked_sub(from.0).is_none_or(|gap| gap > PLAN_CHANGES_GAP_MAX) {
            return Ok(None);
        }
        let keys = &self.inner.keys;
        let (_, r) = self
            .read(
                "plan changes",
                vec![
                    get(keys.latest()),
                    get(keys.horizon()),
                    get_range(
                        keys.plan_changes(Generation(from.0 + 1)),
                        to.next().map_or_else(|| prefix_end(&keys.changes()), |n| keys.plan_changes(n)),
                        0,
                    ),
                ],
            )
            .await?;
        let latest = Generation(be_u64(first(&r[0]), "latest generation")?.unwrap_or(0));
        let horizon = Generation(be_u64(first(&r[1]), "horizon")?.unwrap_or(Generation::FIRST.0));
        if to < horizon || to > latest {
            return Err(StoreError::PlanNotFound(to));
        }
        let records = r[2].kvs();
        if records.len() as u64 != to.0 - from.0 {
            return Ok(None);
        }
        let mut folded: Option<PlanChanges> = None;
        for kv in records {
            let g = Keys::strip(kv.key(), &keys.changes())
                .and_then(|rest| <[u8; 8]>::try_from(rest).ok())
                .map(Generation::from_be_bytes)
                .ok_or_else(|| corrupt("plan changes key", "not a generation"))?;
            let bytes = match self.read_blob(g, kv.key(), kv.value(), "plan changes").await {
                Ok(bytes) => bytes,
                // Cleaned up meanwhile: the caller reads the plan whole (and finds it gone).
                Err(StoreError::PlanNotFound(_)) => return Ok(None),
                Err(err) => return Err(err),
            };
            let step = decode_changes(&bytes).map_err(|e| StoreError::Corrupt { what: "plan changes".into(), source: e })?;
            folded = match folded {
                None => Some(step),
                Some(acc) => match acc.then(step) {
                    Some(next) => Some(next),
                    None => return Ok(None),
                },
            };
        }
        Ok(folded.filter(|c| c.from == from && c.to == to))
    }

    async fn latest(&self) -> StoreResult<Generation> {
        let (_, r) = self.read("latest", vec![get(self.inner.keys.latest())]).await?;
        Ok(Generation(be_u64(first(&r[0]), "latest generation")?.unwrap_or(0)))
    }

    async fn generation_base(&self) -> StoreResult<Generation> {
        let (_, r) = self.read("generation base", vec![get(self.inner.keys.generation_base())]).await?;
        Ok(Generation(be_u64(first(&r[0]), "generation base")?.unwrap_or(0)))
    }

    async fn dns_zone(&self) -> StoreResult<Option<DnsName>> {
        // Every publish compares and writes `state/dns_zone` in its transaction.
        let (_, r) = self.read("dns_zone", vec![get(self.inner.keys.dns_zone())]).await?;
        first(&r[0])
            .map(|kv| DnsName::parse(&String::from_utf8_lossy(kv.value())).map_err(|e| corrupt("stored DNS zone", e.to_string())))
            .transpose()
    }

    async fn list_unchecked(&self, from: Generation, limit: usize) -> StoreResult<Vec<PlanSummary>> {
        let keys = &self.inner.keys;
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Summaries below the horizon go in cleanup's transaction, so none is ever read here.
        let (_, r) = self.read("list", vec![get_range(keys.summary(from), prefix_end(&keys.summaries()), limit as i64)]).await?;
        r[0].kvs()
            .iter()
            .map(|kv| codec::decode::<PlanSummary>(kv.value()).map_err(|e| StoreError::Corrupt { what: "plan summary".into(), source: e }))
            .collect()
    }

    async fn apply(&self, endpoint: &EndpointName, generation: Generation, records: &Endpoint) -> StoreResult<ApplyOutcome> {
        let mut results = self.switch_many(generation, vec![(endpoint.clone(), ActiveState::Serving(records.clone()))]).await?;
        // Invariant: one result per item.
        assert_eq!(results.len(), 1, "switch_many returned {} results for one item", results.len());
        results.remove(0)
    }

    async fn apply_many_unchecked(&self, generation: Generation, items: &[ApplyItem]) -> StoreResult<Vec<StoreResult<ApplyOutcome>>> {
        let items = items.iter().map(|i| (i.endpoint.clone(), ActiveState::Serving(i.records.clone()))).collect();
        self.switch_many(generation, items).await
    }

    async fn retire(&self, endpoint: &EndpointName, generation: Generation) -> StoreResult<ApplyOutcome> {
        let mut results = self.switch_many(generation, vec![(endpoint.clone(), ActiveState::Retired)]).await?;
        assert_eq!(results.len(), 1, "switch_many returned {} results for one item", results.len());
        results.remove(0)
    }

    async fn active(&self, endpoint: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        let keys = &self.inner.keys;
        let (_, r) = self.read("active", vec![get(keys.active(endpoint))]).await?;
        first(&r[0]).map(|kv| Self::decode_active(kv, &keys.active_all()).map(|(_, record)| record)).transpose()
    }

    async fn active_all(&self) -> StoreResult<ActiveSnapshot> {
        let keys = &self.inner.keys;
        let prefix = keys.active_all();
        let (revision, r) = self.read("active state", vec![get_applied(keys), get_range(prefix.clone(), prefix_end(&prefix), 0)]).await?;
        let (applied, content, _) = applied_of(&r[0])?;
        self.note_revision(applied, revision);
        let mut snapshot = ActiveSnapshot { applied_changes: applied, content_changes: content, endpoints: BTreeMap::new() };
        for kv in r[1].kvs() {
            let (name, record) = Self::decode_active(kv, &prefix)?;
            snapshot.endpoints.insert(name, record);
        }
        Ok(snapshot)
    }

    async fn active_page_unchecked(&self, after: Option<EndpointName>, limit: usize) -> StoreResult<ActivePage> {
        let keys = &self.inner.keys;
        let prefix = keys.active_all();
        let start = match &after {
            // Names hold no 0 byte: the first key after `after`'s own.
            Some(a) => {
                let mut k = keys.active(a);
                k.push(0);
                k
            }
            None => prefix.clone(),
        };
        let (revision, r) =
            self.read("active page", vec![get_applied(keys), get_range(start, prefix_end(&prefix), limit as i64 + 1)]).await?;
        let applied = applied_of(&r[0])?.0;
        self.note_revision(applied, revision);
        let kvs = r[1].kvs();
        let mut page =
            ActivePage { applied_changes: applied, endpoints: Vec::with_capacity(limit.min(ACTIVE_PAGE_MAX)), more: kvs.len() > limit };
        for kv in kvs.iter().take(limit) {
            page.endpoints.push(Self::decode_active(kv, &prefix)?);
        }
        Ok(page)
    }

    async fn active_since(&self, since: u64) -> StoreResult<ActiveDelta> {
        let keys = &self.inner.keys;
        let prefix = keys.active_all();
        let from = self.revision_of(since);
        let (revision, r) = self.read("active since", vec![get_applied(keys)]).await?;
        let (applied, content, last_switch) = applied_of(&r[0])?;
        self.note_revision(applied, revision);
        let log = self.active_log(revision);
        let mut delta = ActiveDelta { applied_changes: applied, content_changes: content, full: false, endpoints: BTreeMap::new() };
        if since == applied {
            return Ok(delta);
        }
        let Some(from) = from.filter(|&from| since < applied && from < last_switch) else {
            // A follower ahead of the store, or one whose position this store never saw: the
            // whole state.
            return self.active_all().await.map(ActiveDelta::from);
        };
        // What switched after `from`, up to the last switch: from this store's log when it
        // holds all of it, which is the usual case.
        if let Some(written) = log.written(from, last_switch, ACTIVE_LOG_WAIT).await {
            if written.len() > DELTA_ENDPOINTS_MAX {
                return self.active_all().await.map(ActiveDelta::from);
            }
            for (key, value) in &written {
                let (name, record) = Self::decode_active_parts(key, value, &prefix)?;
                delta.endpoints.insert(name, record);
            }
            self.inner.from_log.fetch_add(1, Ordering::Relaxed);
            return Ok(delta);
        }
        // Else from etcd, at the revision of the read.
        let mut start = prefix.clone();
        loop {
            let page = match self.read("active since", vec![self.written_after(start, from, Some(revision))]).await {
                Ok((_, r)) => match r.into_iter().next() {
                    Some(page) => page,
                    None => return self.active_all().await.map(ActiveDelta::from),
                },
                Err(err @ StoreError::Unavailable(_)) => return Err(err),
                Err(err) => {
                    // Compacted meanwhile: the whole state.
                    tracing::info!(error = %err, "could not read the changed records; reading the whole state");
                    return self.active_all().await.map(ActiveDelta::from);
                }
            };
            for kv in page.kvs() {
                let (name, record) = Self::decode_active(kv, &prefix)?;
                delta.endpoints.insert(name, record);
            }
            if delta.endpoints.len() > DELTA_ENDPOINTS_MAX {
                return self.active_all().await.map(ActiveDelta::from);
            }
            start = match page.kvs().last() {
                Some(last) if page.more() => [last.key(), &[0]].concat(),
                _ => return Ok(delta),
            };
        }
    }

    async fn cleanup_preview(&self, retain: u64) -> StoreResult<CleanupDecision> {
        Ok(self.decide(retain).await?.0)
    }

    async fn cleanup(&self, retain: u64) -> StoreResult<CleanupReport> {
        let keys = &self.inner.keys;
        for attempt in 0..ATTEMPTS_MAX {
            let (decision, horizon_raw, control) = self.decide(retain).await?;
            if decision.deleted_count() == 0 {
                return Ok(decision);
            }
            let (before, after) = (decision.horizon_before, decision.horizon_after);
            let next_control = control.unwrap_or(0).wrapping_add(1);
            let compares = vec![
                cmp_u64(keys.horizon(), horizon_raw),
                cmp_u64(keys.control(), control),
                // No endpoint serves a generation below the new horizon: the oldest active
                // fence, compared at write time over the whole range.
                Compare::version(keys.serving_all(), CompareOp::Equal, 0).with_range(keys.serving_below(after)),
            ];
            let ops = vec![
                put(keys.horizon(), after.to_be_bytes().to_vec()),
                put(keys.control(), next_control.to_be_bytes().to_vec()),
                delete_range(keys.plan(before), keys.plan(after)),
                delete_range(keys.summary(before), keys.summary(after)),
                delete_range(keys.plan_changes(before), keys.plan_changes(after)),
                delete_range(keys.blob_set(before, 0), keys.blob_set(after, 0)),
                delete_range(keys.staging(before, 0), keys.staging(after, 0)),
            ];
            if self.commit("cleanup", Txn::new().when(compares).and_then(ops)).await?.succeeded() {
                return Ok(decision);
            }
            back_off(attempt).await;
        }
        Err(contention("cleanup"))
    }

    async fn pause_unchecked(&self, state: PauseState) -> StoreResult<()> {
        self.set_pause(Some(state)).await
    }

    async fn resume(&self) -> StoreResult<()> {
        self.set_pause(None).await
    }

    async fn paused(&self) -> StoreResult<Option<PauseState>> {
        let (_, r) = self.read("pause", vec![get(self.inner.keys.pause())]).await?;
        first(&r[0])
            .map(|kv| codec::decode::<PauseState>(kv.value()).map_err(|e| StoreError::Corrupt { what: "pause state".into(), source: e }))
            .transpose()
    }

    async fn heartbeat_unchecked(&self, heartbeat: Heartbeat) -> StoreResult<()> {
        let keys = &self.inner.keys;
        let bound =
            Bounded { what: "heartbeat", count_key: keys.heartbeat_count(), max: HEARTBEATS_MAX, full: || StoreError::TooManyHeartbeats };
        self.put_bounded(&bound, keys.heartbeat(&heartbeat.enactor_id), codec::encode(&heartbeat)).await
    }

    async fn heartbeats(&self) -> StoreResult<Vec<Heartbeat>> {
        self.read_all("heartbeats", self.inner.keys.heartbeats()).await
    }

    async fn report_authority_unchecked(&self, report: AuthorityReport) -> StoreResult<()> {
        let keys = &self.inner.keys;
        let full = || {
            StoreError::BadRequest(format!("{AUTHORITIES_MAX} authority reports are stored already; remove those of retired authorities"))
        };
        let bound = Bounded { what: "authority report", count_key: keys.authority_count(), max: AUTHORITIES_MAX, full };
        self.put_bounded(&bound, keys.authority(&report.id), codec::encode(&report)).await
    }

    async fn authorities(&self) -> StoreResult<Vec<AuthorityReport>> {
        self.read_all("authority reports", self.inner.keys.authorities()).await
    }

    async fn dnssec_keys(&self) -> StoreResult<Option<KeysRecord>> {
        let (_, r) = self.read("DNSSEC keys", vec![get(self.inner.keys.dnssec_keys())]).await?;
        Ok(first(&r[0]).map(|kv| KeysRecord { version: kv.mod_revision() as u64, bytes: kv.value().to_vec() }))
    }

    async fn put_dnssec_keys_unchecked(&self, expected: Option<u64>, bytes: Vec<u8>) -> StoreResult<KeysPut> {
        let key = self.inner.keys.dnssec_keys();
        let compare = match expected {
            None => Compare::version(key.clone(), CompareOp::Equal, 0),
            Some(version) => Compare::mod_revision(key.clone(), CompareOp::Equal, version as i64),
        };
        let txn = Txn::new().when(vec![compare]).and_then(vec![put(key.clone(), bytes)]).or_else(vec![get(key)]);
        let response = self.txn("DNSSEC keys", txn).await?;
        if response.succeeded() {
            let version = response.header().map(|h| h.revision()).unwrap_or_default();
            return Ok(KeysPut::Written { version: version as u64 });
        }
        let current = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(r) => Some(r.kvs().first().map(|kv| kv.mod_revision() as u64)),
            _ => None,
        });
        Ok(KeysPut::Moved { current: current.flatten() })
    }

    async fn version(&self) -> StoreResult<StoreVersion> {
        Ok(self.read_version().await?.0)
    }

    async fn wait_for_change_unchecked(&self, seen: StoreVersion, timeout: Duration) -> StoreResult<StoreVersion> {
        let deadline = tokio::time::Instant::now() + timeout;
        let meta = self.inner.keys.meta();
        let mut read = self.read_version().await?;
        loop {
            let (current, revision) = read;
            if current != seen {
                return Ok(current);
            }
            // Watch from just after the revision read: a change after the read cannot be
            // missed. etcd delivers at once only to a watch that starts after its current
            // revision when it is registered; one that starts in the past waits for etcd's
            // unsynced-watcher loop (every 100 ms). So once etcd confirms the watch, read
            // again: a change in between is returned from that read, and any other write in
            // between (a heartbeat) means a fresh watch from the newer revision.
            let options = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
            let mut stream = self.call("watch", self.inner.client.watch(meta.clone(), Some(options))).await?;
            let mut confirmed = false;
            loop {
                let message = match tokio::time::timeout_at(deadline, stream.message()).await {
                    // The current version, read: a change may have committed that the watch
                    // has not delivered yet.
                    Err(_elapsed) => return self.version().await,
                    Ok(Err(err)) => return Err(etcd_error("watch", err)),
                    Ok(Ok(None)) => return Err(StoreError::Unavailable("etcd closed the watch".into())),
                    Ok(Ok(Some(m))) => m,
                };
                if message.compact_revision() > 0 || message.canceled() {
                    tracing::info!(revision, "etcd compacted the watched revision; reading the version again");
                    break;
                }
                if !message.events().is_empty() {
                    break;
                }
                if message.created() && !confirmed {
                    confirmed = true;
                    let again = self.read_version().await?;
                    if again.0 != seen || again.1 > revision {
                        read = again;
                        break;
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return self.version().await;
            }
            if read.1 <= revision {
                read = self.read_version().await?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plans::{KIND_PLAN, manifest};

    #[test]
    fn debug_hides_the_password() {
        let mut config = EtcdConfig::new(vec!["http://127.0.0.1:2379".into()], "/dnsplan/");
        config.user = Some(("dnsplan".into(), "s3cret-password".into()));
        let shown = format!("{config:?}");
        assert!(shown.contains("dnsplan") && !shown.contains("s3cret-password"), "{shown}");
    }

    #[test]
    fn config_is_checked() {
        let good = EtcdConfig::new(vec!["http://127.0.0.1:2379".into()], "/dnsplan/");
        assert!(good.check().is_ok());
        for prefix in ["", "/", "dnsplan/", "/dnsplan"] {
            assert!(EtcdConfig::new(good.endpoints.clone(), prefix).check().is_err(), "prefix {prefix:?}");
        }
        assert!(EtcdConfig::new(vec![], "/d/").check().is_err());
        assert_eq!(good.switches_per_txn(), 31);
    }

    #[test]
    fn the_lease_is_live_exactly_while_its_key_is() {
        let lease = Lease { holder: "a".into(), epoch: 3, expires_at_unix_ms: 1_000 };
        let token = lease_token(&lease);
        let live = lease_view(Some(lease.clone()), Some(&token), 2_000).expect("view").expect("lease");
        assert!(live.is_live(2_000), "etcd still holds the key: live, whatever this clock says");
        let gone = lease_view(Some(lease.clone()), None, 500).expect("view").expect("lease");
        assert!(!gone.is_live(500), "etcd dropped the key: expired, whatever this clock says");
        assert!(lease_view(Some(lease), Some(b"other"), 0).is_err());
    }

    #[test]
    fn bad_values_are_clear_errors() {
        let r = be_u64(None, "x").expect("absent is fine");
        assert_eq!(r, None);
        let manifest = manifest(7, KIND_PLAN, 2, 10);
        assert_eq!(manifest.len(), 22);
    }
}
