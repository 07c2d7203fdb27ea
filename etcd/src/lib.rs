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

mod active_log;
pub mod client;
mod keys;

use active_log::ActiveLog;
pub use client::EtcdTls;
use client::{
    Client, ClientOptions, Compare, CompareOp, DeleteOptions, GetOptions, GetResponse, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
    TxnResponse, WatchOptions,
};
use dnsplan_common::Generation;
use dnsplan_common::changes::{PlanChanges, PlanEntry, decode_changes};
use dnsplan_common::codec::{self, CodecError, Record};
use dnsplan_common::names::{DnsName, EndpointName};
use dnsplan_common::plan::{Endpoint, PlanSummary, ValidatedPlan, validate_endpoint};
use dnsplan_common::store::lease::{self, Lease};
use dnsplan_common::store::{
    ACTIVE_PAGE_MAX, AUTHORITIES_MAX, ActiveDelta, ActivePage, ActiveRecord, ActiveSnapshot, ActiveState, ApplyItem, ApplyOutcome,
    AuthorityReport, CleanupDecision, CleanupReport, DELTA_ENDPOINTS_MAX, HEARTBEAT_TEXT_BYTES_MAX, HEARTBEATS_MAX, Heartbeat,
    LIST_LIMIT_MAX, PAUSE_TEXT_BYTES_MAX, PLAN_CHANGES_GAP_MAX, PauseState, Store, StoreError, StoreResult, StoreVersion, WAIT_TIMEOUT_MAX,
    check_batch, check_changes_range, check_generation, check_len, check_page_limit, content_changed, decide_cleanup, fence_step,
    plan_says,
};
use dnsplan_common::store_config::EtcdStoreConfig;
use keys::{Keys, prefix_end};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;

/// How long one etcd request may take before the store reports etcd unavailable. A healthy
/// cluster answers in milliseconds; a leader election takes about one election timeout (1 s by
/// default), so 5 s rides out an election and still fails fast enough for an operator.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// etcd's default `--max-request-bytes` (1.5 MiB). A larger request is refused by etcd.
pub const REQUEST_BYTES_DEFAULT: usize = 1_572_864;
/// etcd's default `--max-txn-ops`: the most operations in one branch of a transaction.
pub const TXN_OPS_DEFAULT: usize = 128;
/// Smallest request limit the store accepts: a chunk must still hold a useful share of a plan.
pub const REQUEST_BYTES_MIN: usize = 16 * 1024;
/// How many times a write reads, decides and tries to commit before it reports contention.
/// Each failed attempt means another writer committed, so the store as a whole progresses;
/// 64 rides out a burst of every enactor of a region writing at once.
pub const ATTEMPTS_MAX: u32 = 64;
/// Decoded plans kept for content checks and parent comparisons. Plans are immutable, so a
/// cached plan is never wrong; 8 covers every generation enactors apply at once.
const PLAN_CACHE_MAX: usize = 8;
/// Slots of the applied-change counter (see `Keys::applied_slot`). Each apply transaction
/// compares and adds to one slot, so writers on different slots (enactors of one zone
/// writing different endpoints) do not fail each other's transactions over the counter; with
/// one counter, all but one of concurrent transactions failed and went round Raft again.
const APPLIED_SLOTS: usize = 16;
/// How long `active_since` waits for its log of the active writes to receive the last switch
/// (normally a millisecond or two after the commit) before it asks etcd instead.
const ACTIVE_LOG_WAIT: Duration = Duration::from_millis(100);
/// Applied-change counts remembered with the revision they were read at, so `active_since`
/// can read what changed since that revision. A follower asks about the count of its last answer.
const REVISIONS_KEPT: usize = 1_024;
/// Abandoned staging areas removed per publish (see `sweep_staging`): garbage goes a little
/// at a time, and never delays a publish much.
const STAGING_SWEEP_MAX: i64 = 16;
/// etcd checks lease expiry on its leader about every 500 ms: a lease past its time but not
/// yet revoked is reported as ending in this long.
const LEASE_EXPIRY_CHECK_MS: u64 = 500;
/// Largest gRPC message the client decodes: the largest plan body plus framing, the same
/// bound as the codec's.
const RESPONSE_BYTES_MAX: usize = codec::BODY_BYTES_MAX + 1024 * 1024;

/// Where and how to reach etcd. Its `Debug` shows the user but never the password.
#[derive(Clone)]
pub struct EtcdConfig {
    /// Client URLs of the cluster's members (`http://host:2379`).
    pub endpoints: Vec<String>,
    /// Every key of this store starts with it (for example `/dnsplan/`); stores with
    /// different prefixes in one cluster are independent.
    pub prefix: String,
    pub request_timeout: Duration,
    /// A member not connected to within this long is skipped for the next (see `client`);
    /// never more than `request_timeout`.
    pub connect_timeout: Duration,
    /// The cluster's `--max-request-bytes`: plans larger than a quarter of it are written in
    /// chunks of half of it.
    pub request_bytes_max: usize,
    /// The cluster's `--max-txn-ops`: batches are split to fit.
    pub txn_ops_max: usize,
    /// User and password, when the cluster has authentication on.
    pub user: Option<(String, String)>,
    /// TLS, for `https://` endpoints; `None` for `http://` ones.
    pub tls: Option<EtcdTls>,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_bytes_max", &self.request_bytes_max)
            .field("txn_ops_max", &self.txn_ops_max)
            .field("user", &self.user.as_ref().map(|(user, _)| (user, "<hidden>")))
            .field("tls", &self.tls)
            .finish()
    }
}

impl EtcdConfig {
    pub fn new(endpoints: Vec<String>, prefix: impl Into<String>) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            prefix: prefix.into(),
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            connect_timeout: client::CONNECT_TIMEOUT_DEFAULT,
            request_bytes_max: REQUEST_BYTES_DEFAULT,
            txn_ops_max: TXN_OPS_DEFAULT,
            user: None,
            tls: None,
        }
    }

    /// The client settings of a daemon's `[store] kind = "etcd"`, once resolved (password and
    /// TLS files read): endpoints, prefix, user and TLS; the limits keep their defaults.
    pub fn from_settings(settings: &EtcdStoreConfig) -> EtcdConfig {
        let mut config = EtcdConfig::new(settings.endpoints.clone(), settings.prefix.clone());
        config.user = settings.credentials().map(|(user, password)| (user, password.expose().to_string()));
        config.tls = settings.tls.as_ref().map(|tls| EtcdTls { ca_pem: tls.ca.clone(), identity: tls.identity.clone() });
        config
    }

    fn check(&self) -> Result<(), ConnectError> {
        let bad = |what: String| Err(ConnectError::Config(what));
        if self.endpoints.is_empty() {
            return bad("no etcd endpoints; give the client URLs of the cluster's members".into());
        }
        // One scheme for all: TLS is set up per client, not per endpoint.
        for endpoint in &self.endpoints {
            match (endpoint.starts_with("https://"), &self.tls) {
                (true, None) => return bad(format!("{endpoint:?} is https:// but no TLS is set up (the CA of the members)")),
                (false, Some(_)) => return bad(format!("{endpoint:?} is not https:// but TLS is set up; give every member as https://")),
                _ => {}
            }
        }
        if !self.prefix.starts_with('/') || !self.prefix.ends_with('/') || self.prefix.len() < 2 {
            return bad(format!("key prefix {:?} must start and end with '/' and name something (for example /dnsplan/)", self.prefix));
        }
        if self.request_bytes_max < REQUEST_BYTES_MIN {
            return bad(format!("request_bytes_max {} is below {REQUEST_BYTES_MIN}", self.request_bytes_max));
        }
        if self.txn_ops_max < 8 {
            return bad(format!("txn_ops_max {} is below 8; etcd's default is {TXN_OPS_DEFAULT}", self.txn_ops_max));
        }
        if self.request_timeout.is_zero() || self.request_timeout > Duration::from_secs(60) {
            return bad(format!("request_timeout {:?} must be in (0, 60 s]", self.request_timeout));
        }
        if self.connect_timeout.is_zero() {
            return bad("connect_timeout must be above 0".into());
        }
        Ok(())
    }

    fn chunk_bytes(&self) -> usize {
        self.request_bytes_max / 2
    }

    fn inline_bytes_max(&self) -> usize {
        self.request_bytes_max / 4
    }

    /// Endpoints one apply transaction switches: a switch is up to four operations (record,
    /// fence, old and new index entries) and the counter's slot is one more; and the records must fit
    /// half a request.
    fn switches_per_txn(&self) -> usize {
        (self.txn_ops_max - 1) / 4
    }
}

#[derive(Debug, Error)]
pub enum ConnectError {
    #[error("etcd store configuration: {0}")]
    Config(String),
    #[error("cannot set up the etcd client")]
    Client(#[source] client::Error),
}

/// The `Store` on etcd v3. Clones share one client.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    keys: Keys,
    config: EtcdConfig,
    plans: Mutex<VecDeque<Arc<ValidatedPlan>>>,
    /// Applied-change count → an etcd revision at which the store had that count.
    revisions: Mutex<BTreeMap<u64, i64>>,
    /// The counter slot this store's apply transactions add to; another, at random, after a
    /// transaction lost a race.
    slot: AtomicUsize,
    /// The writes to the active records since this store's first `active_since`, from a watch
    /// (see `active_log`); started again when it breaks.
    active_log: Mutex<Option<Arc<ActiveLog>>>,
    /// `active_since` answers taken from `active_log`, for tests.
    from_log: AtomicU64,
    /// Test-only: the write transaction whose committed reply is lost next (see
    /// `lose_next_reply`).
    #[cfg(feature = "testing")]
    lose_reply: Mutex<Option<&'static str>>,
    /// Test-only: the write transaction held before it is sent next (see `hold_next_commit`).
    #[cfg(feature = "testing")]
    hold: Mutex<Option<Hold>>,
}

/// What one plan says of its endpoints: the plan itself, or an older plan and the changes
/// from it (the entry of every endpoint whose entry differs, in the newer plan).
enum PlanContents {
    Whole(Arc<ValidatedPlan>),
    Changed { base: Arc<ValidatedPlan>, changes: PlanChanges },
}

impl PlanContents {
    fn entry(&self, name: &EndpointName) -> PlanEntry {
        match self {
            PlanContents::Whole(plan) => PlanEntry::of(plan.plan(), name),
            PlanContents::Changed { base, changes } => {
                changes.changes.get(name).cloned().unwrap_or_else(|| PlanEntry::of(base.plan(), name))
            }
        }
    }
}

/// Test-only: where a held commit waits, and how it says it got there.
#[cfg(feature = "testing")]
struct Hold {
    what: &'static str,
    reached: tokio::sync::oneshot::Sender<()>,
    go: tokio::sync::oneshot::Receiver<()>,
}

fn corrupt(what: impl Into<String>, detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt { what: what.into(), source: CodecError::Body { kind: "etcd value".into(), detail: detail.into() } }
}

fn be_u64(kv: Option<&KeyValue>, what: &str) -> StoreResult<Option<u64>> {
    kv.map(|kv| {
        let bytes: [u8; 8] = kv.value().try_into().map_err(|_| StoreError::Corrupt {
            what: what.to_owned(),
            source: CodecError::LengthMismatch { declared: 8, actual: kv.value().len() },
        })?;
        Ok(u64::from_be_bytes(bytes))
    })
    .transpose()
}

fn first(response: &GetResponse) -> Option<&KeyValue> {
    response.kvs().first()
}

/// `key`'s value is `observed` (absent when `None`).
/// A read of every slot of the applied-change counter.
fn get_applied(keys: &Keys) -> TxnOp {
    get_range(keys.applied(), prefix_end(&keys.applied()), 0)
}

/// The counts of one slot of the applied-change counter: its applied changes and its content
/// changes (apply transactions that changed what is served), each big-endian. A slot written
/// before the content count holds the applied count alone (8 bytes), which counts as both:
/// the serial derived from the applied count then.
fn slot_counts(kv: &KeyValue) -> StoreResult<(u64, u64)> {
    let value = kv.value();
    let half = |bytes: &[u8]| u64::from_be_bytes(bytes.try_into().expect("8 bytes"));
    match value.len() {
        8 => Ok((half(value), half(value))),
        16 => Ok((half(&value[..8]), half(&value[8..]))),
        len => Err(StoreError::Corrupt {
            what: "applied-change count".to_owned(),
            source: CodecError::LengthMismatch { declared: 16, actual: len },
        }),
    }
}

/// The applied-change count and the content-change count (the sums of the slots) and the
/// revision of the last switch (every switch writes a slot), from a `get_applied` read.
fn applied_of(response: &GetResponse) -> StoreResult<(u64, u64, i64)> {
    let (mut applied, mut content) = (0u64, 0u64);
    let mut last = 0;
    for kv in response.kvs() {
        let (a, c) = slot_counts(kv)?;
        applied = applied.wrapping_add(a);
        content = content.wrapping_add(c);
        last = last.max(kv.mod_revision());
    }
    Ok((applied, content, last))
}

fn cmp_u64(key: Vec<u8>, observed: Option<u64>) -> Compare {
    match observed {
        None => Compare::version(key, CompareOp::Equal, 0),
        Some(v) => Compare::value(key, CompareOp::Equal, v.to_be_bytes().to_vec()),
    }
}

fn cmp_bytes(key: Vec<u8>, observed: Option<&[u8]>) -> Compare {
    match observed {
        None => Compare::version(key, CompareOp::Equal, 0),
        Some(v) => Compare::value(key, CompareOp::Equal, v.to_vec()),
    }
}

fn put(key: Vec<u8>, value: impl Into<Vec<u8>>) -> TxnOp {
    TxnOp::put(key, value, None)
}

fn get(key: Vec<u8>) -> TxnOp {
    TxnOp::get(key, None)
}

fn get_range(from: Vec<u8>, to: Vec<u8>, limit: i64) -> TxnOp {
    TxnOp::get(from, Some(GetOptions::new().with_range(to).with_limit(limit)))
}

fn delete_range(from: Vec<u8>, to: Vec<u8>) -> TxnOp {
    TxnOp::delete(from, Some(DeleteOptions::new().with_range(to)))
}

fn name_of(key: &[u8], prefix: &[u8], what: &str) -> StoreResult<EndpointName> {
    let rest = Keys::strip(key, prefix).ok_or_else(|| corrupt(what, "key outside its range"))?;
    let text = std::str::from_utf8(rest).map_err(|e| corrupt(what, e.to_string()))?;
    DnsName::parse(text).map_err(|e| corrupt(what, e.to_string()))
}

/// The planner lease's fencing token as stored in the live key: epoch, then holder.
fn lease_token(lease: &Lease) -> Vec<u8> {
    let mut token = lease.epoch.to_be_bytes().to_vec();
    token.extend_from_slice(lease.holder.as_bytes());
    token
}

/// The lease as the pure decisions must see it: live exactly while etcd keeps the live key
/// (etcd's clock decides, not this machine's), with the recorded expiry where it agrees.
fn lease_view(record: Option<Lease>, live: Option<&[u8]>, now_unix_ms: u64) -> StoreResult<Option<Lease>> {
    let Some(mut lease) = record else { return Ok(None) };
    match live {
        Some(token) if token == lease_token(&lease).as_slice() => {
            if lease.expires_at_unix_ms <= now_unix_ms {
                lease.expires_at_unix_ms = now_unix_ms + LEASE_EXPIRY_CHECK_MS;
            }
        }
        Some(_) => return Err(corrupt("planner lease", "the live key does not match the lease record")),
        None => lease.expires_at_unix_ms = lease.expires_at_unix_ms.min(now_unix_ms),
    }
    Ok(Some(lease))
}

/// What etcd holds of a publish that failed (see `settle`).
enum Settled {
    Committed,
    NotCommitted,
}

/// A publish's large values live in chunks; these are what its transaction writes.
struct Staged {
    /// The staging key and nonce, when anything was chunked.
    staging: Option<(Vec<u8>, u64)>,
    plan: Vec<u8>,
    changes: Option<Vec<u8>>,
}

const BLOB_INLINE: u8 = b'I';
const BLOB_CHUNKED: u8 = b'C';
const KIND_PLAN: u8 = b'p';
const KIND_CHANGES: u8 = b'c';

/// A chunked value's manifest: nonce, kind, chunk count, total length.
fn manifest(nonce: u64, kind: u8, chunks: u32, len: u64) -> Vec<u8> {
    let mut m = vec![BLOB_CHUNKED];
    m.extend_from_slice(&nonce.to_be_bytes());
    m.push(kind);
    m.extend_from_slice(&chunks.to_be_bytes());
    m.extend_from_slice(&len.to_be_bytes());
    m
}

fn inline(bytes: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(bytes.len() + 1);
    v.push(BLOB_INLINE);
    v.extend_from_slice(bytes);
    v
}

/// A nonce no other publish picks: a per-process random seed hashed with time and a counter.
fn fresh_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default());
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// A short pause between attempts that lost a race, growing and jittered so that writers
/// that collided do not collide again in step.
async fn back_off(attempt: u32) {
    let base_us = 200u64 << attempt.min(6);
    let jitter = fresh_nonce() % base_us.max(1);
    tokio::time::sleep(Duration::from_micros(base_us / 2 + jitter)).await;
}

fn contention(what: &str) -> StoreError {
    StoreError::Unavailable(format!("{what} lost the race to other writers {ATTEMPTS_MAX} times in a row; retry later"))
}

/// A family of keys kept to `max` (heartbeats, authority reports), counted under `count_key`.
struct Bounded<F: Fn() -> StoreError> {
    what: &'static str,
    count_key: Vec<u8>,
    max: usize,
    /// The error when a new key would go past `max`.
    full: F,
}

impl EtcdStore {
    /// Writes `value` at `key`, one of `bound`'s family: over a key already there, or as a new
    /// key counted against the bound, the count compared with the write.
    async fn put_bounded<F: Fn() -> StoreError>(&self, bound: &Bounded<F>, key: Vec<u8>, value: Vec<u8>) -> StoreResult<()> {
        for attempt in 0..ATTEMPTS_MAX {
            let (_, r) = self.read(bound.what, vec![get(key.clone()), get(bound.count_key.clone())]).await?;
            let known = first(&r[0]).is_some();
            let count = be_u64(first(&r[1]), &format!("{} count", bound.what))?;
            let txn = if known {
                Txn::new().when(vec![Compare::version(key.clone(), CompareOp::Greater, 0)]).and_then(vec![put(key.clone(), value.clone())])
            } else {
                let n = count.unwrap_or(0);
                if n >= bound.max as u64 {
                    return Err((bound.full)());
                }
                Txn::new()
                    .when(vec![Compare::version(key.clone(), CompareOp::Equal, 0), cmp_u64(bound.count_key.clone(), count)])
                    .and_then(vec![put(key.clone(), value.clone()), put(bound.count_key.clone(), (n + 1).to_be_bytes().to_vec())])
            };
            if self.txn(bound.what, txn).await?.succeeded() {
                return Ok(());
            }
            back_off(attempt).await;
        }
        Err(contention(bound.what))
    }

    /// Every record under `prefix`, decoded.
    async fn read_all<T: Record>(&self, what: &'static str, prefix: Vec<u8>) -> StoreResult<Vec<T>> {
        let (_, r) = self.read(what, vec![get_range(prefix.clone(), prefix_end(&prefix), 0)]).await?;
        r[0].kvs()
            .iter()
            .map(|kv| codec::decode::<T>(kv.value()).map_err(|e| StoreError::Corrupt { what: T::KIND_NAME.into(), source: e }))
            .collect()
    }
}

impl EtcdStore {
    /// Sets up a client for `config`. Connections are made on first use, so a store can be
    /// created while etcd is down; every call then fails with `Unavailable` until it is back.
    pub async fn connect(config: EtcdConfig) -> Result<EtcdStore, ConnectError> {
        config.check()?;
        let options = ClientOptions {
            connect_timeout: config.connect_timeout.min(config.request_timeout),
            keep_alive: Some((Duration::from_secs(10), config.request_timeout)),
            user: config.user.clone(),
            tls: config.tls.clone(),
            response_bytes_max: RESPONSE_BYTES_MAX,
        };
        let client = Client::new(&config.endpoints, &options).map_err(ConnectError::Client)?;
        Ok(EtcdStore {
            inner: Arc::new(Inner {
                client,
                keys: Keys::new(&config.prefix),
                config,
                plans: Mutex::new(VecDeque::new()),
                revisions: Mutex::new(BTreeMap::new()),
                slot: AtomicUsize::new(fresh_nonce() as usize % APPLIED_SLOTS),
                active_log: Mutex::new(None),
                from_log: AtomicU64::new(0),
                #[cfg(feature = "testing")]
                lose_reply: Mutex::new(None),
                #[cfg(feature = "testing")]
                hold: Mutex::new(None),
            }),
        })
    }

    /// Test-only: the next write transaction named `what` (`"publish"`, `"apply"`, ...) that
    /// etcd commits is reported as `Unavailable`, as if its reply had been lost to a timeout
    /// after etcd committed it: an ambiguous commit, on demand.
    #[cfg(feature = "testing")]
    pub fn lose_next_reply(&self, what: &'static str) {
        if let Ok(mut lose) = self.inner.lose_reply.lock() {
            *lose = Some(what);
        }
    }

    /// Test-only: the next conditional write named `what` (`"publish"`, `"apply"`,
    /// `"cleanup"`, `"pause"`, `"lease"`) stops after its decision, before its transaction is
    /// sent: the first receiver fires when it gets there, and it goes on when the sender is
    /// used or dropped. Whatever the test writes meanwhile, the transaction's compares must
    /// catch: the decision is made, only the write is left.
    #[cfg(feature = "testing")]
    pub fn hold_next_commit(&self, what: &'static str) -> (tokio::sync::oneshot::Receiver<()>, tokio::sync::oneshot::Sender<()>) {
        let (reached, reached_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go) = tokio::sync::oneshot::channel();
        if let Ok(mut hold) = self.inner.hold.lock() {
            *hold = Some(Hold { what, reached, go });
        }
        (reached_rx, go_tx)
    }

    /// A conditional write: the transaction of a decision (the test-only hold applies here).
    async fn commit(&self, what: &str, txn: Txn) -> StoreResult<TxnResponse> {
        #[cfg(feature = "testing")]
        {
            let held = self.inner.hold.lock().ok().and_then(|mut hold| hold.take_if(|h| h.what == what));
            if let Some(Hold { reached, go, .. }) = held {
                let _ = reached.send(());
                let _ = go.await;
            }
        }
        self.txn(what, txn).await
    }

    /// The etcd client this store uses (for tools and tests: compaction, inspection).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Every key of this store starts with this.
    pub fn prefix(&self) -> &str {
        &self.inner.config.prefix
    }

    /// The keys of publishes in progress or abandoned (their chunks wait under them).
    pub async fn staging_keys(&self) -> StoreResult<usize> {
        let keys = &self.inner.keys;
        let (_, r) = self.read("staging", vec![get_range(keys.staging_all(), prefix_end(&keys.staging_all()), 0)]).await?;
        Ok(r[0].kvs().len())
    }

    /// How many chunk keys the store holds.
    pub async fn chunk_keys(&self) -> StoreResult<usize> {
        let keys = &self.inner.keys;
        let (_, r) = self.read("chunks", vec![get_range(keys.blobs(), prefix_end(&keys.blobs()), 0)]).await?;
        Ok(r[0].kvs().len())
    }

    /// Runs `fut` under the request timeout and maps etcd's errors to the store's.
    async fn call<T>(&self, what: &str, fut: impl Future<Output = Result<T, client::Error>>) -> StoreResult<T> {
        let limit = self.inner.config.request_timeout;
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(limit, fut).await;
        tracing::trace!(what, elapsed_us = started.elapsed().as_micros() as u64, "etcd call");
        match answer {
            Err(_) => Err(StoreError::Unavailable(format!(
                "etcd did not answer {what} within {limit:?} (request_timeout); check that the cluster is up and reachable"
            ))),
            Ok(Err(err)) => Err(match etcd_error(what, err) {
                StoreError::Unavailable(detail) => StoreError::Unavailable(format!(
                    "{detail} (endpoints {}); check that the cluster is up and reachable",
                    self.inner.config.endpoints.join(", ")
                )),
                other => other,
            }),
            Ok(Ok(v)) => Ok(v),
        }
    }

    async fn txn(&self, what: &str, txn: Txn) -> StoreResult<TxnResponse> {
        let response = self.call(what, self.inner.client.txn(txn)).await?;
        #[cfg(feature = "testing")]
        if response.succeeded() && response.put_any() {
            let lost = self.inner.lose_reply.lock().ok().and_then(|mut lose| lose.take_if(|w| *w == what)).is_some();
            if lost {
                return Err(StoreError::Unavailable(format!(
                    "etcd did not answer {what} (its reply was lost on purpose, after the commit)"
                )));
            }
        }
        Ok(response)
    }

    /// One read transaction: every get at one revision, returned with that revision.
    async fn read(&self, what: &str, gets: Vec<TxnOp>) -> StoreResult<(i64, Vec<GetResponse>)> {
        let response = self.txn(what, Txn::new().and_then(gets)).await?;
        let revision = response.header().map(|h| h.revision()).unwrap_or_default();
        let mut out = Vec::new();
        for r in response.op_responses() {
            match r {
                TxnOpResponse::Get(g) => out.push(g),
                _ => return Err(StoreError::Unavailable(format!("etcd answered {what} with something other than reads"))),
            }
        }
        Ok((revision, out))
    }

    fn note_revision(&self, applied: u64, revision: i64) {
        if let Ok(mut map) = self.inner.revisions.lock() {
            map.insert(applied, revision);
            while map.len() > REVISIONS_KEPT {
                map.pop_first();
            }
        }
    }

    fn revision_of(&self, applied: u64) -> Option<i64> {
        self.inner.revisions.lock().ok().and_then(|m| m.get(&applied).copied())
    }

    fn cached_plan(&self, g: Generation) -> Option<Arc<ValidatedPlan>> {
        self.inner.plans.lock().ok()?.iter().find(|p| p.generation() == g).cloned()
    }

    fn cache_plan(&self, plan: Arc<ValidatedPlan>) {
        if let Ok(mut cache) = self.inner.plans.lock() {
            if cache.iter().any(|p| p.generation() == plan.generation()) {
                return;
            }
            cache.push_back(plan);
            while cache.len() > PLAN_CACHE_MAX {
                cache.pop_front();
            }
        }
    }

    /// What plan `g` says of each endpoint, for the content check: the plan if cached, else
    /// the newest cached plan below it with the changes since (a read of the change records,
    /// a few bytes for a small change), else the plan read whole. Each enactor's store has
    /// the plan it applied last cached, so a plan that changes one endpoint of 10,000 is not
    /// read whole by every enactor.
    async fn plan_contents(&self, g: Generation) -> StoreResult<PlanContents> {
        if let Some(plan) = self.cached_plan(g) {
            return Ok(PlanContents::Whole(plan));
        }
        let base = self.inner.plans.lock().ok().and_then(|cache| {
            cache
                .iter()
                .filter(|p| p.generation() < g && g.0 - p.generation().0 <= PLAN_CHANGES_GAP_MAX)
                .max_by_key(|p| p.generation())
                .cloned()
        });
        if let Some(base) = base
            && let Ok(Some(changes)) = self.plan_changes(base.generation(), g).await
        {
            return Ok(PlanContents::Changed { base, changes });
        }
        Ok(PlanContents::Whole(self.load_plan(g).await?))
    }

    /// A stored value, inline or in chunks. Chunks are immutable while their manifest exists
    /// (cleanup removes both in one transaction), so a missing chunk under a present manifest
    /// is corruption; under a removed one, the plan was cleaned up meanwhile.
    async fn read_blob(&self, g: Generation, key: &[u8], value: &[u8], what: &str) -> StoreResult<Vec<u8>> {
        match value.split_first() {
            Some((&BLOB_INLINE, rest)) => Ok(rest.to_vec()),
            Some((&BLOB_CHUNKED, rest)) if rest.len() == 8 + 1 + 4 + 8 => {
                let nonce = u64::from_be_bytes(rest[0..8].try_into().expect("8 bytes"));
                let kind = rest[8];
                let chunks = u32::from_be_bytes(rest[9..13].try_into().expect("4 bytes"));
                let len = u64::from_be_bytes(rest[13..21].try_into().expect("8 bytes"));
                if len > codec::BODY_BYTES_MAX as u64 + codec::HEADER_BYTES as u64 {
                    return Err(corrupt(what, format!("manifest claims {len} bytes")));
                }
                let mut bytes = Vec::with_capacity(len as usize);
                for index in 0..chunks {
                    let chunk = self.inner.keys.blob_chunk(g, nonce, kind, index);
                    let (_, r) = self.read(what, vec![get(chunk)]).await?;
                    let Some(kv) = first(&r[0]) else {
                        let (_, r) = self.read(what, vec![get(key.to_vec())]).await?;
                        if r[0].kvs().is_empty() {
                            return Err(StoreError::PlanNotFound(g));
                        }
                        return Err(corrupt(what, format!("chunk {index} of {chunks} is missing")));
                    };
                    bytes.extend_from_slice(kv.value());
                }
                if bytes.len() as u64 != len {
                    return Err(corrupt(what, format!("chunks hold {} bytes, the manifest says {len}", bytes.len())));
                }
                Ok(bytes)
            }
            _ => Err(corrupt(what, "neither an inline value nor a chunk manifest")),
        }
    }

    /// Plan `g` decoded, from the cache or from etcd.
    async fn load_plan(&self, g: Generation) -> StoreResult<Arc<ValidatedPlan>> {
        if let Some(plan) = self.cached_plan(g) {
            return Ok(plan);
        }
        let plan = Arc::new(self.read_plan(g).await?);
        self.cache_plan(plan.clone());
        Ok(plan)
    }

    async fn read_plan(&self, g: Generation) -> StoreResult<ValidatedPlan> {
        let what = format!("plan {g}");
        let (_, r) = self.read(&what, vec![get(self.inner.keys.plan(g))]).await?;
        let Some(kv) = first(&r[0]) else { return Err(StoreError::PlanNotFound(g)) };
        let bytes = self.read_blob(g, kv.key(), kv.value(), &what).await?;
        let plan = codec::decode_plan(&bytes).map_err(|e| StoreError::Corrupt { what: what.clone(), source: e })?;
        if plan.generation() != g {
            return Err(corrupt(what, format!("holds plan {}", plan.generation())));
        }
        Ok(plan)
    }

    async fn parent_changes(&self, plan: &ValidatedPlan) -> StoreResult<Option<PlanChanges>> {
        let parent = plan.plan().parent_generation;
        if parent.is_none() {
            return Ok(None);
        }
        let parent = match self.load_plan(parent).await {
            Ok(parent) => parent,
            Err(StoreError::PlanNotFound(_)) => return Ok(None),
            Err(err @ StoreError::Corrupt { .. }) => {
                tracing::error!(error = %err, "cannot read the parent plan; this plan's changes are not recorded and followers read it whole");
                return Ok(None);
            }
            Err(err) => return Err(err),
        };
        Ok(PlanChanges::between(parent.plan(), plan.plan()))
    }

    /// Writes the values of plan `g` too large for one request in chunks under a fresh nonce,
    /// registered first under a staging key that the publish transaction requires and removes.
    async fn stage(&self, g: Generation, plan: &[u8], changes: Option<&[u8]>) -> StoreResult<Staged> {
        let config = &self.inner.config;
        let large = |b: &[u8]| b.len() > config.inline_bytes_max();
        if !large(plan) && !changes.is_some_and(large) {
            return Ok(Staged { staging: None, plan: inline(plan), changes: changes.map(inline) });
        }
        let nonce = fresh_nonce();
        let staging = self.inner.keys.staging(g, nonce);
        let kv = &self.inner.client;
        self.call("publish staging", kv.put(staging.clone(), lease::now_unix_ms().to_be_bytes().to_vec(), None)).await?;
        let write = async |bytes: &[u8], kind: u8| -> StoreResult<Vec<u8>> {
            if !large(bytes) {
                return Ok(inline(bytes));
            }
            let mut count = 0u32;
            for (index, chunk) in bytes.chunks(config.chunk_bytes()).enumerate() {
                let key = self.inner.keys.blob_chunk(g, nonce, kind, index as u32);
                self.call("publish chunk", kv.put(key, chunk.to_vec(), None)).await?;
                count += 1;
            }
            Ok(manifest(nonce, kind, count, bytes.len() as u64))
        };
        let staged = async {
            let plan = write(plan, KIND_PLAN).await?;
            let changes = match changes {
                Some(c) => Some(write(c, KIND_CHANGES).await?),
                None => None,
            };
            Ok::<_, StoreError>((plan, changes))
        }
        .await;
        match staged {
            Ok((plan, changes)) => Ok(Staged { staging: Some((staging, nonce)), plan, changes }),
            Err(err) => {
                self.discard(g, nonce).await;
                Err(err)
            }
        }
    }

    /// Removes a staging area and its chunks (a publish that did not commit).
    async fn discard(&self, g: Generation, nonce: u64) {
        let keys = &self.inner.keys;
        let set = keys.blob_set(g, nonce);
        let txn = Txn::new().and_then(vec![delete_range(set.clone(), prefix_end(&set)), TxnOp::delete(keys.staging(g, nonce), None)]);
        if let Err(err) = self.txn("discard staging", txn).await {
            tracing::warn!(generation = %g, error = %err, "could not remove an uncommitted publish's chunks; a later publish removes them");
        }
    }

    /// Removes staging areas of generations at or below `latest`: their publish can never
    /// commit (its transaction requires `latest` to be one less), so they are garbage left by
    /// a publisher that died between chunks and commit.
    async fn sweep_staging(&self, latest: Generation) -> StoreResult<()> {
        let keys = &self.inner.keys;
        let end = keys.staging(Generation(latest.0.saturating_add(1)), 0);
        let gets =
            vec![TxnOp::get(keys.staging_all(), Some(GetOptions::new().with_range(end).with_limit(STAGING_SWEEP_MAX).with_keys_only()))];
        let (_, r) = self.read("staging sweep", gets).await?;
        for kv in r[0].kvs() {
            let rest = Keys::strip(kv.key(), &keys.staging_all()).unwrap_or_default();
            if rest.len() != 16 {
                tracing::warn!(key = ?kv.key(), "a staging key of the wrong shape; removing it");
                self.call("staging sweep", self.inner.client.delete(kv.key().to_vec(), None)).await?;
                continue;
            }
            let g = Generation::from_be_bytes(rest[..8].try_into().expect("8 bytes"));
            let nonce = u64::from_be_bytes(rest[8..].try_into().expect("8 bytes"));
            tracing::warn!(generation = %g, "removing the chunks of a publish that never committed");
            self.discard(g, nonce).await;
        }
        Ok(())
    }

    async fn publish_inner(&self, plan: &ValidatedPlan, lease: Option<&Lease>) -> StoreResult<()> {
        let changes = self.parent_changes(plan).await?;
        let plan_bytes = codec::encode_plan(plan);
        let summary = codec::encode(&plan.summary());
        let changes_bytes = changes.as_ref().map(codec::encode);
        let p = plan.plan();
        let (g, parent, zone, is_operator) = (p.generation, p.parent_generation, p.dns_zone.clone(), p.author.is_operator());
        let keys = &self.inner.keys;
        let mut staged: Option<Staged> = None;
        // Whether the error ending the publish came from its own transaction: etcd may have
        // committed it (a timeout after the commit), so it is settled against what etcd holds.
        let mut ambiguous = false;
        let result = async {
            for attempt in 0..ATTEMPTS_MAX {
                let (_, r) = self
                    .read(
                        "publish",
                        vec![get(keys.latest()), get(keys.pause()), get(keys.lease_record()), get(keys.lease_live()), get(keys.dns_zone())],
                    )
                    .await?;
                let latest = be_u64(first(&r[0]), "latest generation")?;
                let pause = first(&r[1]).map(|kv| kv.value().to_vec());
                let record = first(&r[2])
                    .map(|kv| codec::decode::<Lease>(kv.value()))
                    .transpose()
                    .map_err(|e| StoreError::Corrupt { what: "planner lease".into(), source: e })?;
                let live = first(&r[3]).map(|kv| kv.value().to_vec());
                let stored_zone = first(&r[4]).map(|kv| kv.value().to_vec());
                // The same decisions, in the same order, as the embedded store.
                let now = lease::now_unix_ms();
                let current = lease_view(record, live.as_deref(), now)?;
                match lease {
                    Some(lease) => lease::check_holder(current.as_ref(), lease, now)?,
                    None if !is_operator => lease::check_unleased(current.as_ref(), now)?,
                    None => {}
                }
                let latest = Generation(latest.unwrap_or(0));
                let next = latest.next().ok_or(StoreError::Exhausted(latest))?;
                if g != next || parent != latest {
                    return Err(StoreError::Conflict { attempted: g, parent, latest });
                }
                if !is_operator && let Some(pause) = &pause {
                    let pause =
                        codec::decode::<PauseState>(pause).map_err(|e| StoreError::Corrupt { what: "pause state".into(), source: e })?;
                    return Err(StoreError::Paused { reason: pause.reason, by: pause.by });
                }
                if let Some(stored) = &stored_zone {
                    let stored = DnsName::parse(&String::from_utf8_lossy(stored)).map_err(|e| corrupt("stored DNS zone", e.to_string()))?;
                    if stored != zone {
                        return Err(StoreError::DnsZoneMismatch { attempted: zone.clone(), stored });
                    }
                }
                if staged.is_none() {
                    staged = Some(self.stage(g, &plan_bytes, changes_bytes.as_deref()).await?);
                }
                let s = staged.as_ref().expect("staged above");
                // The compares restate every condition decided above.
                let mut compares = vec![cmp_u64(keys.latest(), (!latest.is_none()).then_some(latest.0))];
                match lease {
                    Some(lease) => compares.push(Compare::value(keys.lease_live(), CompareOp::Equal, lease_token(lease))),
                    None if !is_operator => compares.push(Compare::version(keys.lease_live(), CompareOp::Equal, 0)),
                    None => {}
                }
                if !is_operator {
                    compares.push(Compare::version(keys.pause(), CompareOp::Equal, 0));
                }
                compares.push(cmp_bytes(keys.dns_zone(), stored_zone.as_deref()));
                let mut ops = vec![
                    put(keys.plan(g), s.plan.clone()),
                    put(keys.summary(g), summary.clone()),
                    put(keys.latest(), g.to_be_bytes().to_vec()),
                ];
                if let Some(c) = &s.changes {
                    ops.push(put(keys.plan_changes(g), c.clone()));
                }
                if stored_zone.is_none() {
                    ops.push(put(keys.dns_zone(), zone.as_str().as_bytes().to_vec()));
                }
                if latest.is_none() {
                    ops.push(put(keys.horizon(), Generation::FIRST.to_be_bytes().to_vec()));
                }
                if let Some((staging, _)) = &s.staging {
                    compares.push(Compare::version(staging.clone(), CompareOp::Greater, 0));
                    ops.push(TxnOp::delete(staging.clone(), None));
                }
                let response = match self.commit("publish", Txn::new().when(compares).and_then(ops)).await {
                    Ok(response) => response,
                    Err(err) => {
                        ambiguous = true;
                        return Err(err);
                    }
                };
                if response.succeeded() {
                    return Ok(());
                }
                back_off(attempt).await;
            }
            Err(contention("publish"))
        }
        .await;
        let result = match (result, &staged) {
            (Err(err), Some(s)) => match self.settle(g, s, ambiguous).await {
                Settled::Committed => {
                    tracing::info!(generation = %g, error = %err, "the publish's reply was lost, but etcd committed it");
                    Ok(())
                }
                Settled::NotCommitted => Err(err),
            },
            (result, _) => result,
        };
        if result.is_ok() {
            self.cache_plan(Arc::new(plan.clone()));
            if let Err(err) = self.sweep_staging(g).await {
                tracing::warn!(error = %err, "could not look for abandoned publishes");
            }
        }
        result
    }

    /// After a publish that failed: whether etcd holds this publish's own plan `g` (its
    /// transaction committed and only the reply was lost, when `ambiguous`), and otherwise the
    /// removal of its chunks and staging key. One transaction does both, so the chunks of a
    /// committed plan are never removed, and a commit still in flight finds its staging key gone
    /// and fails. A plan that is not chunked has nothing to remove: only an ambiguous error is
    /// settled, and one still in flight may yet commit (the caller is told `Unavailable`).
    async fn settle(&self, g: Generation, s: &Staged, ambiguous: bool) -> Settled {
        let keys = &self.inner.keys;
        let mut ours = vec![Compare::value(keys.plan(g), CompareOp::Equal, s.plan.clone())];
        if let Some(changes) = &s.changes {
            ours.push(Compare::value(keys.plan_changes(g), CompareOp::Equal, changes.clone()));
        }
        let remove = match &s.staging {
            Some((staging, nonce)) => {
                let set = keys.blob_set(g, *nonce);
                vec![delete_range(set.clone(), prefix_end(&set)), TxnOp::delete(staging.clone(), None)]
            }
            None if ambiguous => Vec::new(),
            None => return Settled::NotCommitted,
        };
        match self.txn("publish settle", Txn::new().when(ours).or_else(remove)).await {
            // A chunked plan's manifest names this publish's nonce: only its own commit put it
            // there. An inline plan with the same bytes is the same plan.
            Ok(r) if r.succeeded() && ambiguous => Settled::Committed,
            Ok(_) => Settled::NotCommitted,
            Err(err) => {
                tracing::warn!(generation = %g, error = %err, "could not settle a failed publish; a later publish or cleanup removes its chunks");
                Settled::NotCommitted
            }
        }
    }

    /// The fenced write of `apply`, `retire` and `apply_many`. A batch larger than one
    /// transaction commits part by part; one refused part-way (`Pruned`, `Unavailable`) keeps
    /// the parts before it, which a retry finds `Unchanged`.
    async fn switch_many(&self, g: Generation, items: Vec<(EndpointName, ActiveState)>) -> StoreResult<Vec<StoreResult<ApplyOutcome>>> {
        let keys = &self.inner.keys;
        let (_, r) = self.read("apply", vec![get(keys.latest()), get(keys.horizon())]).await?;
        let latest = Generation(be_u64(first(&r[0]), "latest generation")?.unwrap_or(0));
        let horizon = Generation(be_u64(first(&r[1]), "horizon")?.unwrap_or(Generation::FIRST.0));
        check_generation(g, latest, horizon)?;
        let plan = match self.plan_contents(g).await {
            Ok(plan) => plan,
            Err(StoreError::PlanNotFound(_)) => {
                let (_, r) = self.read("apply", vec![get(keys.horizon())]).await?;
                let horizon = Generation(be_u64(first(&r[0]), "horizon")?.unwrap_or(Generation::FIRST.0));
                return Err(StoreError::Pruned { attempted: g, horizon });
            }
            Err(err) => return Err(err),
        };
        // Pair check, then the content check: plans are immutable, so what plan `g` says is
        // the same now as at the write; the write itself is fenced on the horizon, which keeps
        // plan `g` stored.
        let mut results: Vec<Option<StoreResult<ApplyOutcome>>> = Vec::with_capacity(items.len());
        let mut pending = Vec::new();
        for (i, (name, state)) in items.iter().enumerate() {
            if let ActiveState::Serving(records) = state
                && let Err(err) = validate_endpoint(name, records)
            {
                results.push(Some(Err(err.into())));
                continue;
            }
            if let Some(plan) = plan_says(&plan.entry(name), state) {
                results.push(Some(Err(StoreError::ContentMismatch { endpoint: name.clone(), generation: g, plan })));
                continue;
            }
            results.push(None);
            pending.push(i);
        }
        let records: Vec<Vec<u8>> =
            items.iter().map(|(_, state)| codec::encode(&ActiveRecord { generation: g, state: state.clone() })).collect();
        // Parts that fit etcd's limits on operations and request size.
        let bytes_max = self.inner.config.request_bytes_max / 2;
        let mut part: Vec<usize> = Vec::new();
        let mut part_bytes = 0;
        for i in pending {
            let size = records[i].len() + 3 * keys.active(&items[i].0).len() + 64;
            if !part.is_empty() && (part.len() == self.inner.config.switches_per_txn() || part_bytes + size > bytes_max) {
                self.switch_part(g, &items, &records, &std::mem::take(&mut part), &mut results).await?;
                part_bytes = 0;
            }
            part.push(i);
            part_bytes += size;
        }
        if !part.is_empty() {
            self.switch_part(g, &items, &records, &part, &mut results).await?;
        }
        Ok(results.into_iter().map(|r| r.expect("every item has a result")).collect())
    }

    /// One transaction's share of a batch: each endpoint's write conditional on its fence as
    /// read, on this store's slot of the applied-change counter as read and on the horizon, all
    /// at once.
    async fn switch_part(
        &self,
        g: Generation,
        items: &[(EndpointName, ActiveState)],
        records: &[Vec<u8>],
        part: &[usize],
        results: &mut [Option<StoreResult<ApplyOutcome>>],
    ) -> StoreResult<()> {
        let keys = &self.inner.keys;
        for attempt in 0..ATTEMPTS_MAX {
            let slot = self.inner.slot.load(Ordering::Relaxed);
            let slot_key = keys.applied_slot(slot);
            let mut gets = vec![get(slot_key.clone()), get(keys.horizon())];
            gets.extend(part.iter().map(|&i| get(keys.fence(&items[i].0))));
            // The records as served now, to tell whether a switch changes what is served.
            gets.extend(part.iter().map(|&i| get(keys.active(&items[i].0))));
            let (_, r) = self.read("apply", gets).await?;
            let slot_read = first(&r[0]);
            let (applied, content) = slot_read.map(slot_counts).transpose()?.unwrap_or((0, 0));
            let horizon = Generation(be_u64(first(&r[1]), "horizon")?.unwrap_or(Generation::FIRST.0));
            if g < horizon {
                return Err(StoreError::Pruned { attempted: g, horizon });
            }
            let mut outcomes = Vec::with_capacity(part.len());
            let mut compares = vec![Compare::value(keys.horizon(), CompareOp::Less, Generation(g.0 + 1).to_be_bytes().to_vec())];
            let mut ops = Vec::new();
            let mut count = applied;
            let mut content_moved = false;
            let (fences, served) = r[2..].split_at(part.len());
            for ((&i, fence), served) in part.iter().zip(fences).zip(served) {
                let (name, state) = &items[i];
                let current = be_u64(first(fence), &format!("fence of {name}"))?.map(Generation);
                let outcome = match fence_step(name, current, g) {
                    Ok(ApplyOutcome::Switched { previous }) => {
                        compares.push(cmp_u64(keys.fence(name), current.map(|c| c.0)));
                        ops.push(put(keys.active(name), records[i].clone()));
                        ops.push(put(keys.fence(name), g.to_be_bytes().to_vec()));
                        if let Some(old) = current {
                            ops.push(TxnOp::delete(keys.serving(old, name), None));
                        }
                        if matches!(state, ActiveState::Serving(_)) {
                            ops.push(put(keys.serving(g, name), Vec::new()));
                        }
                        count = count.wrapping_add(1);
                        let before = first(served).map(|kv| Self::decode_active(kv, &keys.active_all())).transpose()?;
                        content_moved |= content_changed(before.as_ref().map(|(_, record)| &record.state), state);
                        Ok(ApplyOutcome::Switched { previous })
                    }
                    decided => decided,
                };
                outcomes.push(outcome);
            }
            if ops.is_empty() {
                for (&i, outcome) in part.iter().zip(outcomes) {
                    results[i] = Some(outcome);
                }
                return Ok(());
            }
            compares.push(match slot_read {
                None => Compare::version(slot_key.clone(), CompareOp::Equal, 0),
                Some(kv) => Compare::value(slot_key.clone(), CompareOp::Equal, kv.value().to_vec()),
            });
            let content = content.wrapping_add(u64::from(content_moved));
            ops.push(put(slot_key, [count.to_be_bytes(), content.to_be_bytes()].concat()));
            let response = self.commit("apply", Txn::new().when(compares).and_then(ops)).await?;
            if response.succeeded() {
                for (&i, outcome) in part.iter().zip(outcomes) {
                    results[i] = Some(outcome);
                }
                return Ok(());
            }
            // A fence or the slot moved: if the slot, another writer is on it, so move on.
            self.inner.slot.store(fresh_nonce() as usize % APPLIED_SLOTS, Ordering::Relaxed);
            back_off(attempt).await;
        }
        Err(contention("apply"))
    }

    /// Horizon, latest, control count and the oldest serving fence, at one revision.
    async fn decide(&self, retain: u64) -> StoreResult<(CleanupDecision, Option<u64>, Option<u64>)> {
        let keys = &self.inner.keys;
        let serving = keys.serving_all();
        let (_, r) = self
            .read(
                "cleanup",
                vec![get(keys.horizon()), get(keys.latest()), get(keys.control()), get_range(serving.clone(), prefix_end(&serving), 1)],
            )
            .await?;
        let horizon_raw = be_u64(first(&r[0]), "horizon")?;
        let latest = Generation(be_u64(first(&r[1]), "latest generation")?.unwrap_or(0));
        let control = be_u64(first(&r[2]), "control count")?;
        let oldest = match first(&r[3]) {
            None => None,
            Some(kv) => {
                let rest = Keys::strip(kv.key(), &serving).unwrap_or_default();
                let (g, name) = rest.split_at_checked(8).ok_or_else(|| corrupt("serving index", "key too short"))?;
                let g = Generation::from_be_bytes(g.try_into().expect("8 bytes"));
                let name = DnsName::parse(&String::from_utf8_lossy(name)).map_err(|e| corrupt("serving index", e.to_string()))?;
                Some((g, name))
            }
        };
        let horizon = Generation(horizon_raw.unwrap_or(Generation::FIRST.0));
        Ok((decide_cleanup(horizon, latest, oldest, retain), horizon_raw, control))
    }

    async fn set_pause(&self, state: Option<PauseState>) -> StoreResult<()> {
        let keys = &self.inner.keys;
        for attempt in 0..ATTEMPTS_MAX {
            let (_, r) = self.read("pause", vec![get(keys.control())]).await?;
            let control = be_u64(first(&r[0]), "control count")?;
            let next = control.unwrap_or(0).wrapping_add(1);
            let write = match &state {
                Some(state) => put(keys.pause(), codec::encode(state)),
                None => TxnOp::delete(keys.pause(), None),
            };
            let txn = Txn::new()
                .when(vec![cmp_u64(keys.control(), control)])
                .and_then(vec![write, put(keys.control(), next.to_be_bytes().to_vec())]);
            if self.commit("pause", txn).await?.succeeded() {
                return Ok(());
            }
            back_off(attempt).await;
        }
        Err(contention("pause"))
    }

    async fn read_version(&self) -> StoreResult<(StoreVersion, i64)> {
        let keys = &self.inner.keys;
        let (revision, r) = self.read("version", vec![get(keys.latest()), get_applied(keys), get(keys.control())]).await?;
        let version = StoreVersion {
            latest: Generation(be_u64(first(&r[0]), "latest generation")?.unwrap_or(0)),
            applied_changes: applied_of(&r[1])?.0,
            control_changes: be_u64(first(&r[2]), "control count")?.unwrap_or(0),
        };
        self.note_revision(version.applied_changes, revision);
        Ok((version, revision))
    }

    fn decode_active(kv: &KeyValue, prefix: &[u8]) -> StoreResult<(EndpointName, ActiveRecord)> {
        Self::decode_active_parts(kv.key(), kv.value(), prefix)
    }

    fn decode_active_parts(key: &[u8], value: &[u8], prefix: &[u8]) -> StoreResult<(EndpointName, ActiveRecord)> {
        let name = name_of(key, prefix, "active endpoint name")?;
        let record = codec::decode::<ActiveRecord>(value)
            .map_err(|e| StoreError::Corrupt { what: format!("active record of {name}"), source: e })?;
        Ok((name, record))
    }

    /// This store's log of the active writes, started (from `revision`) if it is not running.
    fn active_log(&self, revision: i64) -> Arc<ActiveLog> {
        let mut running = self.inner.active_log.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match &*running {
            Some(log) if !log.broken() => log.clone(),
            _ => {
                let log = Arc::new(ActiveLog::start(self.inner.client.clone(), self.inner.keys.active_all(), revision));
                *running = Some(log.clone());
                log
            }
        }
    }

    /// Test-only: how many `active_since` answers came from the store's own log of the active
    /// writes rather than from a read of etcd.
    #[cfg(feature = "testing")]
    pub fn active_since_from_log(&self) -> u64 {
        self.inner.from_log.load(Ordering::Relaxed)
    }

    /// A read of the active records last written after revision `from`, from key `start` on,
    /// a page at a time, at revision `at` (the current one when `None`): etcd reads the range
    /// and keeps the keys whose `mod_revision` is above `from`. Active records are never
    /// deleted, and compaction keeps each key's last write, so this is exactly what was written
    /// since `from`, however much history etcd has compacted.
    ///
    /// Not a watch from `from`: etcd delivers the history of a watch that starts in the past
    /// only from its unsynced-watcher loop, every 100 ms, where a read answers at once.
    fn written_after(&self, start: Vec<u8>, from: i64, at: Option<i64>) -> TxnOp {
        let options = GetOptions::new()
            .with_range(prefix_end(&self.inner.keys.active_all()))
            .with_min_mod_revision(from + 1)
            .with_limit(ACTIVE_PAGE_MAX as i64);
        TxnOp::get(start, Some(at.map_or(options.clone(), |at| options.with_revision(at))))
    }
}

fn etcd_error(what: &str, err: client::Error) -> StoreError {
    // Down, partitioned, without a leader or too slow: unavailable; anything else is etcd
    // refusing the request.
    if err.is_unavailable() { StoreError::Unavailable(format!("etcd {what}: {err}")) } else { StoreError::Io(Box::new(err)) }
}

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

    async fn plan_changes(&self, from: Generation, to: Generation) -> StoreResult<Option<PlanChanges>> {
        check_changes_range(from, to)?;
        if to.0 - from.0 > PLAN_CHANGES_GAP_MAX {
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

    async fn dns_zone(&self) -> StoreResult<Option<DnsName>> {
        // Every publish compares and writes `state/dns_zone` in its transaction.
        let (_, r) = self.read("dns_zone", vec![get(self.inner.keys.dns_zone())]).await?;
        first(&r[0])
            .map(|kv| DnsName::parse(&String::from_utf8_lossy(kv.value())).map_err(|e| corrupt("stored DNS zone", e.to_string())))
            .transpose()
    }

    async fn list(&self, from: Generation, limit: usize) -> StoreResult<Vec<PlanSummary>> {
        let keys = &self.inner.keys;
        let limit = limit.min(LIST_LIMIT_MAX);
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

    async fn apply_many(&self, generation: Generation, items: &[ApplyItem]) -> StoreResult<Vec<StoreResult<ApplyOutcome>>> {
        check_batch(items)?;
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

    async fn active_page(&self, after: Option<EndpointName>, limit: usize) -> StoreResult<ActivePage> {
        check_page_limit(limit)?;
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

    async fn pause(&self, state: PauseState) -> StoreResult<()> {
        check_len("pause reason", &state.reason, PAUSE_TEXT_BYTES_MAX)?;
        check_len("pause author", &state.by, PAUSE_TEXT_BYTES_MAX)?;
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

    async fn heartbeat(&self, heartbeat: Heartbeat) -> StoreResult<()> {
        check_len("enactor id", &heartbeat.enactor_id, HEARTBEAT_TEXT_BYTES_MAX)?;
        check_len("enactor state", &heartbeat.state, HEARTBEAT_TEXT_BYTES_MAX)?;
        let keys = &self.inner.keys;
        let bound =
            Bounded { what: "heartbeat", count_key: keys.heartbeat_count(), max: HEARTBEATS_MAX, full: || StoreError::TooManyHeartbeats };
        self.put_bounded(&bound, keys.heartbeat(&heartbeat.enactor_id), codec::encode(&heartbeat)).await
    }

    async fn heartbeats(&self) -> StoreResult<Vec<Heartbeat>> {
        self.read_all("heartbeats", self.inner.keys.heartbeats()).await
    }

    async fn report_authority(&self, report: AuthorityReport) -> StoreResult<()> {
        report.check()?;
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

    async fn version(&self) -> StoreResult<StoreVersion> {
        Ok(self.read_version().await?.0)
    }

    async fn wait_for_change(&self, seen: StoreVersion, timeout: Duration) -> StoreResult<StoreVersion> {
        let deadline = tokio::time::Instant::now() + timeout.min(WAIT_TIMEOUT_MAX);
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
