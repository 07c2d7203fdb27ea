//! The `Store` contract: the one interface every plan store implements (the embedded sled
//! store and the remote client over the control API here; etcd v3 in `dnsplan-etcd`), and
//! the types it speaks.
//!
//! The guarantees (each is checked by the conformance suite in `dnsplan-tests`):
//! - `publish` is a compare-and-swap on the latest generation: plan `latest + 1` with parent
//!   `latest` (the first plan: `generation_base + 1`, no parent; see [`next_generation`]), or a
//!   typed [`StoreError::Conflict`] carrying the current latest. Automation is
//!   refused while paused; operators are not.
//! - `apply` is a compare-and-swap against the endpoint's fence, decided inside the store at
//!   write time: older → [`StoreError::Stale`], equal → [`ApplyOutcome::Unchanged`], newer →
//!   fence and a copy of the records switch together, durably, before `Ok` returns. A
//!   generation that was never published or whose plan was cleaned up is refused.
//!   `apply_many` is the same check for each endpoint of a batch, committed and flushed once.
//! - `cleanup` deletes, in one step, only plans older than both the oldest active generation
//!   and the last `retain` plans. Served records are copies, so cleanup never changes what is
//!   served.
//! - Reads see only durable state, and `wait_for_change` wakes on change without polling.
//! - `plan_changes` answers what a plan changes against an older one, folded over every plan
//!   in between, or `None` (read the plan whole).
//! - `active_since` returns what switched after a given applied-change count (or the whole
//!   state, marked `full`), so a follower's cost follows the change, not the state.

pub mod cleanup;
pub mod high_water;
pub mod lease;
#[cfg(feature = "remote")]
pub mod remote;
pub mod rules;
pub mod sled;
pub mod wire;
pub mod zones;

use crate::changes::PlanChanges;
pub use crate::changes::{PLAN_CHANGES_ENDPOINTS_MAX, PLAN_CHANGES_GAP_MAX};
use crate::codec::{self, CodecError, Record};
use crate::delta::PlanDelta;
use crate::generation::Generation;
use crate::names::{DnsName, EndpointName, ZoneId};
use crate::plan::{Author, Endpoint, Plan, PlanSummary, ValidatedPlan, ValidationError};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;
use thiserror::Error;

pub use cleanup::{CleanupDecision, CleanupReport, decide_cleanup};
pub use lease::Lease;
pub use rules::{check_generation, check_len, check_trusted, content_changed, fence_step, plan_says};

/// Most plans one `list` call returns; callers page with `from`.
pub const LIST_LIMIT_MAX: usize = 1_000;
/// Longest a `wait_for_change` may wait. Long-polls over HTTP must end before proxies and
/// clients give up on an idle request (commonly 60 s).
pub const WAIT_TIMEOUT_MAX: Duration = Duration::from_secs(55);
/// Most enactor heartbeats kept. Three per zone is the norm; 1,024 bounds a misconfigured
/// fleet that invents a new id on every start.
pub const HEARTBEATS_MAX: usize = 1_024;
/// Longest pause reason or operator name, in bytes.
pub const PAUSE_TEXT_BYTES_MAX: usize = 1_024;
/// Longest enactor id or state text in a heartbeat, in bytes.
pub const HEARTBEAT_TEXT_BYTES_MAX: usize = 128;
/// Most authority reports kept (see [`AuthorityReport`]): a few authorities serve one zone;
/// 64 bounds a fleet that invents a new id on every start.
pub const AUTHORITIES_MAX: usize = 64;
/// Most DNS addresses in one authority's report.
pub const AUTHORITY_ADDRESSES_MAX: usize = 16;
/// Largest record of a zone's DNSSEC keys the store keeps (`Store::put_dnssec_keys`): far
/// above a schedule of a few dozen keys, below etcd's default request limit (1.5 MiB).
pub const DNSSEC_KEYS_BYTES_MAX: usize = 1 << 20;
/// Most endpoints in one `apply_many`: one transaction and one flush; 4,096 endpoints with
/// the most targets each are about 13 MB of JSON on the control API.
pub const APPLY_BATCH_MAX: usize = 4_096;
/// Most endpoints in one `active_since` answer before it is sent as the whole state instead.
pub const DELTA_ENDPOINTS_MAX: usize = 65_536;
/// Most endpoints in one `active_page` answer: a page is a few hundred kilobytes, so a reader
/// of a large zone never holds the whole active state at once.
pub const ACTIVE_PAGE_MAX: usize = 4_096;

/// What an endpoint serves now, as copied at apply time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ActiveState {
    Serving(Endpoint),
    /// Retired by an operator plan: no longer served and no longer holding back cleanup.
    Retired,
}

/// An endpoint's fence and the records that switched with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActiveRecord {
    pub generation: Generation,
    pub state: ActiveState,
}

impl Record for ActiveRecord {
    const KIND: u8 = 3;
    const KIND_NAME: &'static str = "active record";
    const BODY_BYTES_MAX: usize = codec::SMALL_BODY_BYTES_MAX;
}

/// A consistent snapshot of every endpoint's active record.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActiveSnapshot {
    /// How many applies have switched a fence so far.
    pub applied_changes: u64,
    /// How many apply transactions have changed what is served (see [`content_changed`]); the
    /// SOA serial derives from it, so a plan that moves fences without changing any record
    /// leaves the serial where it was.
    pub content_changes: u64,
    #[serde(deserialize_with = "crate::plan::sorted_map")]
    pub endpoints: BTreeMap<EndpointName, ActiveRecord>,
}

/// One page of the active state, in endpoint-name order (`Store::active_page`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivePage {
    /// The store's applied-change count when this page was read. Pages are read at different
    /// moments: a reader that needs one consistent state follows the pages with
    /// `active_since(first page's count)`.
    pub applied_changes: u64,
    pub endpoints: Vec<(EndpointName, ActiveRecord)>,
    /// Endpoints after the last one of this page remain.
    pub more: bool,
}

/// The check of `active_page`'s `limit` that needs no store.
pub fn check_page_limit(limit: usize) -> StoreResult<()> {
    if !(1..=ACTIVE_PAGE_MAX).contains(&limit) {
        return Err(StoreError::BadRequest(format!("an active page of {limit} endpoints; the limit must be in 1..={ACTIVE_PAGE_MAX}")));
    }
    Ok(())
}

/// One endpoint of an `apply_many` batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyItem {
    pub endpoint: EndpointName,
    pub records: Endpoint,
}

/// What switched since a follower last looked (see [`Store::active_since`]).
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActiveDelta {
    /// The applied-change count this answer brings the follower to.
    pub applied_changes: u64,
    /// The content-change count at the same moment (see [`ActiveSnapshot::content_changes`]).
    pub content_changes: u64,
    /// `true`: `endpoints` is the whole active state, to replace what the follower holds
    /// (the change log no longer reaches back far enough, or too much changed).
    /// `false`: only the endpoints that switched, to merge.
    pub full: bool,
    #[serde(deserialize_with = "crate::plan::sorted_map")]
    pub endpoints: BTreeMap<EndpointName, ActiveRecord>,
}

/// The control API's `GET /v1/changes` as a codec envelope, what `RemoteStore` asks for: the
/// whole active state of a million endpoints decodes several times faster than as JSON.
impl Record for ActiveDelta {
    /// 14 before the content-change count, in builds before the first release: not read.
    const KIND: u8 = 16;
    const KIND_NAME: &'static str = "active changes";
    const BODY_BYTES_MAX: usize = codec::BODY_BYTES_MAX;
}

impl From<ActiveSnapshot> for ActiveDelta {
    fn from(snapshot: ActiveSnapshot) -> ActiveDelta {
        ActiveDelta {
            applied_changes: snapshot.applied_changes,
            content_changes: snapshot.content_changes,
            full: true,
            endpoints: snapshot.endpoints,
        }
    }
}

/// The result of an `apply` that was not refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApplyOutcome {
    /// The fence moved from `previous` (NONE for a new endpoint) to the applied generation.
    Switched { previous: Generation },
    /// The endpoint was already at this generation: nothing written.
    Unchanged,
}

/// Who paused automation and why. A pause by the planner is its breaker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseState {
    pub reason: String,
    /// As text on the wire and on disk (`planner:ID`, `operator:NAME`; see [`Author::parse`]).
    #[serde(with = "crate::plan::author_text")]
    pub by: Author,
    pub since_unix_ms: u64,
}

impl PauseState {
    /// An operator's pause, as the CLI and rollbacks make it.
    pub fn by_operator(reason: impl Into<String>, name: impl Into<String>, since_unix_ms: u64) -> PauseState {
        PauseState { reason: reason.into(), by: Author::Operator { name: name.into() }, since_unix_ms }
    }

    /// The planner paused automation itself: its breaker tripped.
    pub fn is_breaker(&self) -> bool {
        !self.by.is_operator()
    }
}

impl Record for PauseState {
    const KIND: u8 = 4;
    const KIND_NAME: &'static str = "pause state";
    const BODY_BYTES_MAX: usize = codec::SMALL_BODY_BYTES_MAX;
}

impl Heartbeat {
    /// How many generations this enactor was behind the latest plan when it reported.
    pub fn lag(&self) -> u64 {
        self.latest_seen.0.saturating_sub(self.last_applied.0)
    }
}

/// An enactor's report of itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    pub enactor_id: String,
    pub zone: ZoneId,
    /// The generation this enactor has fully applied last.
    pub last_applied: Generation,
    /// The latest published generation it knew of when it reported; the lag is the
    /// difference.
    pub latest_seen: Generation,
    pub at_unix_ms: u64,
    /// Free text such as `applying`, `idle`, `refusing`.
    pub state: String,
}

impl Record for Heartbeat {
    const KIND: u8 = 5;
    const KIND_NAME: &'static str = "heartbeat";
    const BODY_BYTES_MAX: usize = codec::SMALL_BODY_BYTES_MAX;
}

/// An authority's report of itself on a store several authorities follow (etcd): where it
/// serves DNS and what, so `dnsplan verify` asks every authority, not only the one whose
/// control API it talks to. Written every few seconds; a report that stops being renewed is
/// an authority that is gone or cut off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorityReport {
    /// Its `dns.advertise` addresses joined, or its host name and listen addresses: one
    /// authority's reports replace each other.
    pub id: String,
    /// Where clients reach its DNS (`dns.advertise`, else where it listens).
    pub dns: Vec<std::net::SocketAddr>,
    pub serial: u32,
    pub applied_changes: u64,
    pub at_unix_ms: u64,
}

impl Record for AuthorityReport {
    const KIND: u8 = 17;
    const KIND_NAME: &'static str = "authority report";
    const BODY_BYTES_MAX: usize = codec::SMALL_BODY_BYTES_MAX;
}

impl AuthorityReport {
    /// The checks of a report that need no store: its id's length and its address count.
    pub fn check(&self) -> StoreResult<()> {
        check_len("authority id", &self.id, HEARTBEAT_TEXT_BYTES_MAX)?;
        if self.dns.len() > AUTHORITY_ADDRESSES_MAX {
            return Err(StoreError::BadRequest(format!(
                "an authority report with {} DNS addresses; the limit is {AUTHORITY_ADDRESSES_MAX}",
                self.dns.len()
            )));
        }
        Ok(())
    }
}

/// A store's history at one applied-change count: which store, and which endpoint its change
/// number `applied_changes` switched. A copy of the active state saved at that count (the
/// authority's serving image) is this store's state there only if the store still gives the
/// same mark: another store, or this one restored from a backup and gone on differently,
/// gives another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryMark {
    /// Drawn at random when the store is created.
    pub store_id: u64,
    pub applied_changes: u64,
    /// The endpoint of change `applied_changes`; `None` for count 0, or once the change log
    /// no longer holds it (a mark without it matches only one without it).
    pub change: Option<EndpointName>,
}

/// The body of `GET /v1/generation-base` ([`Store::generation_base`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationBase {
    pub generation: Generation,
}

/// Counters that move whenever something a waiter cares about changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreVersion {
    pub latest: Generation,
    pub applied_changes: u64,
    /// Moves on pause, resume and cleanup.
    pub control_changes: u64,
}

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("publish conflict: plan {attempted} (parent {parent}) does not follow the latest plan {latest}; re-read and re-decide")]
    Conflict { attempted: Generation, parent: Generation, latest: Generation },
    #[error("automation is paused by {by}: {reason}; an operator must resume it")]
    Paused { reason: String, by: String },
    /// The records (or the retirement) sent for `endpoint` are not what plan `generation`
    /// says of it. Only a buggy or hostile writer sends this; nothing is written.
    #[error("content mismatch: plan {generation} {plan} for {endpoint}, not what was sent; apply exactly what the plan says")]
    ContentMismatch { endpoint: EndpointName, generation: Generation, plan: PlanSays },
    #[error("stale: {endpoint} is already at generation {active}, refusing older generation {attempted}")]
    Stale { endpoint: EndpointName, active: Generation, attempted: Generation },
    #[error("generation {attempted} has not been published (latest is {latest})")]
    Unpublished { attempted: Generation, latest: Generation },
    #[error("plan {attempted} was cleaned up (oldest stored plan is {horizon}); apply the latest plan instead")]
    Pruned { attempted: Generation, horizon: Generation },
    #[error("the planner lease is held by {holder} (epoch {epoch}) for another {expires_in_ms} ms; this planner stands by")]
    LeaseHeld { holder: String, epoch: u64, expires_in_ms: u64 },
    #[error("{}", not_lease_holder(holder, *epoch, *attempted_epoch))]
    NotLeaseHolder { holder: Option<String>, epoch: u64, attempted_epoch: u64 },
    #[error("plan {0} not found")]
    PlanNotFound(Generation),
    #[error("plan is for DNS zone {attempted} but this store serves {stored}")]
    DnsZoneMismatch { attempted: DnsName, stored: DnsName },
    #[error("generation {0} cannot be followed: the generation space is exhausted")]
    Exhausted(Generation),
    #[error("refused invalid input")]
    Invalid(#[from] ValidationError),
    #[error("{what} is too long ({len} bytes, limit {max})")]
    TooLong { what: Cow<'static, str>, len: usize, max: usize },
    #[error("too many heartbeats stored ({max}); remove retired enactors", max = HEARTBEATS_MAX)]
    TooManyHeartbeats,
    #[error("stored data is corrupt ({what})")]
    Corrupt {
        what: String,
        #[source]
        source: CodecError,
    },
    #[error("store I/O failed")]
    Io(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("store is unavailable: {0}")]
    Unavailable(String),
    /// The embedded store opened behind its high-water mark (see `high_water`).
    #[error("{0}")]
    WentBack(String),
    #[error("the control API refused the request: missing or wrong bearer token (check the token in your config or DNSPLAN_TOKEN)")]
    Unauthorized,
    /// The credential was known but its roles do not allow the request; the detail names
    /// the credential, its roles and the role needed.
    #[error("the control API refused the request: {0}")]
    Forbidden(String),
    #[error("the control API could not understand the request: {0}")]
    BadRequest(String),
    /// A keyring is configured and does not trust the plan (unsigned, unknown key, a key not
    /// allowed for its zone or author, or a signature that does not verify): not published.
    #[error("plan refused: {0}")]
    Untrusted(String),
    /// The zone was removed (or never added): its writes are refused.
    #[error("DNS zone {zone} is not managed by this store: it was removed or never added (`dnsplan zone list` names the zones)")]
    ZoneGone { zone: DnsName },
}

/// A zone's DNSSEC keys as its authorities share them (`dnssec_share`): an opaque record (its
/// private keys sealed with the authorities' key-encryption key) and the version that
/// [`Store::put_dnssec_keys`] compares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysRecord {
    pub version: u64,
    pub bytes: Vec<u8>,
}

/// The body of `GET /v1/dnssec-keys` (the record and its version) and of `PUT` (the record
/// and the version expected): the record in base64.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeysBody {
    pub version: Option<u64>,
    pub record_base64: String,
}

impl KeysBody {
    pub fn new(version: Option<u64>, bytes: &[u8]) -> KeysBody {
        KeysBody { version, record_base64: data_encoding::BASE64.encode(bytes) }
    }

    pub fn bytes(&self) -> StoreResult<Vec<u8>> {
        data_encoding::BASE64
            .decode(self.record_base64.as_bytes())
            .map_err(|e| StoreError::BadRequest(format!("the DNSSEC keys record is not base64: {e}")))
    }
}

/// What [`Store::put_dnssec_keys`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeysPut {
    /// Written; the record's new version.
    Written { version: u64 },
    /// Not written: the record was not at the version expected (another authority wrote it
    /// first); `current` is its version now (`None`: there is none).
    Moved { current: Option<u64> },
}

/// What a plan says of an endpoint when an apply sent something else
/// ([`StoreError::ContentMismatch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlanSays {
    /// Serves it with other records than those sent.
    OtherRecords,
    /// Serves it (the apply tried to retire it).
    Serves,
    /// Retires it (the apply sent records).
    Retires,
    /// Does not name it.
    NothingOf,
}

impl std::fmt::Display for PlanSays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PlanSays::OtherRecords => "has other records",
            PlanSays::Serves => "serves (does not retire)",
            PlanSays::Retires => "retires it",
            PlanSays::NothingOf => "says nothing",
        })
    }
}

fn not_lease_holder(holder: &Option<String>, epoch: u64, attempted_epoch: u64) -> String {
    match (holder, attempted_epoch) {
        (Some(h), 0) => format!("automation must publish under the planner lease, which {h} holds (epoch {epoch})"),
        (Some(h), _) => format!("lease epoch {attempted_epoch} is not current: {h} holds epoch {epoch}; this planner lost its lease"),
        (None, _) => format!("lease epoch {attempted_epoch} is not current (no live lease; last epoch {epoch}); acquire it again"),
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Why the embedded store's writes fail, while they do: for `/v1/status`, the metrics and
/// the logs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreFault {
    /// When the first write failed (Unix milliseconds).
    pub since_unix_ms: u64,
    /// The last error: the failed write, or the failed reopen.
    pub error: String,
    /// The store's directory.
    pub path: String,
    /// Free bytes on its filesystem, for an unprivileged process, when known.
    pub free_bytes: Option<u64>,
    /// Reopens tried since the first failure.
    pub reopens: u64,
}

impl std::fmt::Display for StoreFault {
    /// What failed, where, and what to do, in one line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let free = self.free_bytes.map_or_else(|| "unknown".to_string(), |b| b.to_string());
        write!(
            f,
            "the store's writes fail ({}); {free} bytes free on the disk of {}. If it is full, free space there: the store \
             reopens itself every second and writes resume without a restart; DNS keeps answering meanwhile",
            self.error, self.path
        )
    }
}

/// The plan store. Cheap to clone (implementations share state behind an `Arc`).
///
/// Every method is a future so that remote implementations fit, and so that callers can put
/// a timeout on every call.
///
/// The input checks every store shares are made once, here: a method that takes input a
/// store would otherwise have to check (`apply_many`, `plan_changes`, `list`, `active_page`,
/// `pause`, `heartbeat`, `report_authority`, `wait_for_change`) is provided, checks or caps
/// it, and calls its `_unchecked` twin, which is what a store implements. Callers call the
/// checked one; no store overrides it.
pub trait Store: Clone + Send + Sync + 'static {
    /// Why the store's writes fail now, when it knows (the embedded store after a failed
    /// write, until it has reopened and written again); `None` otherwise.
    fn fault(&self) -> Option<StoreFault> {
        None
    }
    /// Free bytes on the filesystem of a store on local disk (the embedded one).
    fn disk_free_bytes(&self) -> Option<u64> {
        None
    }

    /// Publishes `plan` iff `plan.generation == latest + 1` and `plan.parent == latest`.
    fn publish(&self, plan: &ValidatedPlan) -> impl Future<Output = StoreResult<()>> + Send;
    /// As `publish`, under the planner lease: refused with [`StoreError::NotLeaseHolder`] unless
    /// `lease` is the live lease, checked atomically with the publish CAS. A planner-authored
    /// plain `publish` is refused while anyone holds a live lease.
    fn publish_leased(&self, plan: &ValidatedPlan, lease: &Lease) -> impl Future<Output = StoreResult<()>> + Send;
    /// Publishes the plan `delta` tells against its parent, under the rules of `publish`
    /// (`lease` `None`) or `publish_leased`: the CAS on `delta.head`'s generation and parent,
    /// then the whole plan's validation. What it costs follows the change, not the plan, in
    /// stores that override it; the default reads the parent, builds the plan and publishes
    /// it whole, which is correct and slow. A parent that is not the latest plan is a
    /// [`StoreError::Conflict`].
    fn publish_changes(&self, delta: &PlanDelta, lease: Option<&Lease>) -> impl Future<Output = StoreResult<()>> + Send {
        publish_changes_whole(self, delta, lease)
    }
    /// Grants or renews the planner lease for `ttl` (store clock), or refuses with
    /// [`StoreError::LeaseHeld`] while another holder's lease is live.
    fn acquire_lease(&self, holder: &str, ttl: Duration) -> impl Future<Output = StoreResult<Lease>> + Send;
    /// Gives `lease` up at once (a clean shutdown), if it is still the current one.
    fn release_lease(&self, lease: &Lease) -> impl Future<Output = StoreResult<()>> + Send;
    /// The current (possibly expired) lease, `None` if none was ever granted.
    fn lease(&self) -> impl Future<Output = StoreResult<Option<Lease>>> + Send;
    fn plan(&self, generation: Generation) -> impl Future<Output = StoreResult<ValidatedPlan>> + Send;
    /// Plan `generation` as its codec envelope (`codec::encode_plan`), what the control API
    /// sends. The default encodes `plan`; a store that keeps a plan's envelope sends it as
    /// stored, without decoding a plan only to encode it again (the reader decodes and
    /// checks it).
    fn plan_envelope(&self, generation: Generation) -> impl Future<Output = StoreResult<Vec<u8>>> + Send {
        async move { Ok(crate::codec::encode_plan(&self.plan(generation).await?)) }
    }
    /// What plan `to` changes against plan `from` (`from < to`): every endpoint that any plan
    /// in `from + 1 ..= to` changed, with its entry in `to` (see [`crate::changes`]), for a
    /// follower that applied `from` and wants to read and write only what changed.
    ///
    /// `Ok(None)` when the store cannot say it in less than the plan: a gap over
    /// [`PLAN_CHANGES_GAP_MAX`] plans, a plan in between whose changes were not recorded (the
    /// first plan, a change over [`PLAN_CHANGES_ENDPOINTS_MAX`] endpoints, a plan older than
    /// the record, one cleaned up), or a result over that limit. The caller then reads plan
    /// `to` whole. `to` unpublished or cleaned up is [`StoreError::PlanNotFound`]. The
    /// default always answers `None`, which is correct and slow.
    fn plan_changes(&self, from: Generation, to: Generation) -> impl Future<Output = StoreResult<Option<PlanChanges>>> + Send {
        async move {
            check_changes_range(from, to)?;
            self.plan_changes_unchecked(from, to).await
        }
    }
    /// `plan_changes` once `from` is older than `to`.
    fn plan_changes_unchecked(&self, from: Generation, to: Generation) -> impl Future<Output = StoreResult<Option<PlanChanges>>> + Send {
        let _ = (from, to);
        async { Ok(None) }
    }
    /// The latest published generation, `Generation::NONE` if none.
    fn latest(&self) -> impl Future<Output = StoreResult<Generation>> + Send;
    /// The generation the store's first plan follows: `Generation::NONE` (the first plan is
    /// plan 1), or for a zone added again under a removed zone's name, that zone's latest, so
    /// that generations never go back under one name ([`zones::Restart`]).
    fn generation_base(&self) -> impl Future<Output = StoreResult<Generation>> + Send;
    /// The mark of this store's history at applied-change count `applied` (see
    /// [`HistoryMark`]); `None` from a store that cannot say (the default), or when `applied`
    /// is past the store's count.
    fn history_mark(&self, applied: u64) -> impl Future<Output = StoreResult<Option<HistoryMark>>> + Send {
        async move {
            let _ = applied;
            Ok(None)
        }
    }
    /// The DNS zone of the store's plans, `None` before the first plan. Every plan of a store
    /// has the same one. The default reads the latest plan whole; a store that keeps the zone
    /// apart answers without decoding a plan (an authority checks it at every start).
    fn dns_zone(&self) -> impl Future<Output = StoreResult<Option<DnsName>>> + Send {
        async move {
            match self.latest().await? {
                Generation::NONE => Ok(None),
                latest => Ok(Some(self.plan(latest).await?.into_plan().dns_zone)),
            }
        }
    }
    /// Summaries of stored plans with generation `>= from`, oldest first, at most `limit`
    /// (capped at `LIST_LIMIT_MAX`).
    fn list(&self, from: Generation, limit: usize) -> impl Future<Output = StoreResult<Vec<PlanSummary>>> + Send {
        self.list_unchecked(from, limit.min(LIST_LIMIT_MAX))
    }
    /// `list` with `limit` at most `LIST_LIMIT_MAX`.
    fn list_unchecked(&self, from: Generation, limit: usize) -> impl Future<Output = StoreResult<Vec<PlanSummary>>> + Send;
    /// Switches `endpoint` to `generation` with a copy of `records`, fenced at write time.
    fn apply(
        &self,
        endpoint: &EndpointName,
        generation: Generation,
        records: &Endpoint,
    ) -> impl Future<Output = StoreResult<ApplyOutcome>> + Send;
    /// `apply` for every item of `items` at one `generation`, in one durable step: each item
    /// is fenced on its own and gets its own result (a `Stale` item does not stop the others).
    /// The whole batch is refused for what concerns the generation (unpublished, pruned), a
    /// batch over [`APPLY_BATCH_MAX`] items, or an endpoint named twice.
    ///
    /// The default applies one by one; stores override it with one transaction.
    fn apply_many(
        &self,
        generation: Generation,
        items: &[ApplyItem],
    ) -> impl Future<Output = StoreResult<Vec<StoreResult<ApplyOutcome>>>> + Send {
        async move {
            check_batch(items)?;
            self.apply_many_unchecked(generation, items).await
        }
    }
    /// `apply_many` of a batch that passed [`check_batch`].
    fn apply_many_unchecked(
        &self,
        generation: Generation,
        items: &[ApplyItem],
    ) -> impl Future<Output = StoreResult<Vec<StoreResult<ApplyOutcome>>>> + Send {
        async move {
            let mut results = Vec::with_capacity(items.len());
            for item in items {
                match self.apply(&item.endpoint, generation, &item.records).await {
                    Err(
                        e @ (StoreError::Unpublished { .. } | StoreError::Pruned { .. } | StoreError::Io(_) | StoreError::Unavailable(_)),
                    ) => {
                        return Err(e);
                    }
                    other => results.push(other),
                }
            }
            Ok(results)
        }
    }
    /// Retires `endpoint` at `generation` (an operator plan's decision), fenced like `apply`.
    fn retire(&self, endpoint: &EndpointName, generation: Generation) -> impl Future<Output = StoreResult<ApplyOutcome>> + Send;
    fn active(&self, endpoint: &EndpointName) -> impl Future<Output = StoreResult<Option<ActiveRecord>>> + Send;
    fn active_all(&self) -> impl Future<Output = StoreResult<ActiveSnapshot>> + Send;
    /// The endpoints whose active record switched after the store's applied-change count was
    /// `since`, with their records now; or, marked `full`, the whole state. The default always
    /// answers with the whole state, which is correct and slow.
    fn active_since(&self, since: u64) -> impl Future<Output = StoreResult<ActiveDelta>> + Send {
        let _ = since;
        async move { Ok(ActiveDelta::from(self.active_all().await?)) }
    }
    /// Up to `limit` (1..=[`ACTIVE_PAGE_MAX`]) active endpoints whose names sort after
    /// `after` (from the first when `None`). The default reads the whole state and slices it,
    /// which is correct and not lean.
    fn active_page(&self, after: Option<EndpointName>, limit: usize) -> impl Future<Output = StoreResult<ActivePage>> + Send {
        async move {
            check_page_limit(limit)?;
            self.active_page_unchecked(after, limit).await
        }
    }
    /// `active_page` with `limit` in 1..=[`ACTIVE_PAGE_MAX`].
    fn active_page_unchecked(&self, after: Option<EndpointName>, limit: usize) -> impl Future<Output = StoreResult<ActivePage>> + Send {
        async move {
            let all = self.active_all().await?;
            let lower = match &after {
                Some(a) => std::ops::Bound::Excluded(a),
                None => std::ops::Bound::Unbounded,
            };
            let mut rest = all.endpoints.range((lower, std::ops::Bound::Unbounded));
            let endpoints: Vec<_> = rest.by_ref().take(limit).map(|(n, r)| (n.clone(), r.clone())).collect();
            Ok(ActivePage { applied_changes: all.applied_changes, endpoints, more: rest.next().is_some() })
        }
    }
    /// What `cleanup(retain)` would do now, without doing it.
    fn cleanup_preview(&self, retain: u64) -> impl Future<Output = StoreResult<CleanupDecision>> + Send;
    fn cleanup(&self, retain: u64) -> impl Future<Output = StoreResult<CleanupReport>> + Send;
    /// Pauses automation (planner publishes are refused) with `state`'s reason and author.
    fn pause(&self, state: PauseState) -> impl Future<Output = StoreResult<()>> + Send {
        async move {
            check_len("pause reason", &state.reason, PAUSE_TEXT_BYTES_MAX)?;
            check_len("pause author", state.by.name(), PAUSE_TEXT_BYTES_MAX)?;
            self.pause_unchecked(state).await
        }
    }
    /// `pause` once `state`'s texts are within [`PAUSE_TEXT_BYTES_MAX`].
    fn pause_unchecked(&self, state: PauseState) -> impl Future<Output = StoreResult<()>> + Send;
    fn resume(&self) -> impl Future<Output = StoreResult<()>> + Send;
    fn paused(&self) -> impl Future<Output = StoreResult<Option<PauseState>>> + Send;
    /// Records an enactor's heartbeat, replacing its last.
    fn heartbeat(&self, heartbeat: Heartbeat) -> impl Future<Output = StoreResult<()>> + Send {
        async move {
            check_len("enactor id", &heartbeat.enactor_id, HEARTBEAT_TEXT_BYTES_MAX)?;
            check_len("enactor state", &heartbeat.state, HEARTBEAT_TEXT_BYTES_MAX)?;
            self.heartbeat_unchecked(heartbeat).await
        }
    }
    /// `heartbeat` once its texts are within [`HEARTBEAT_TEXT_BYTES_MAX`].
    fn heartbeat_unchecked(&self, heartbeat: Heartbeat) -> impl Future<Output = StoreResult<()>> + Send;
    fn heartbeats(&self) -> impl Future<Output = StoreResult<Vec<Heartbeat>>> + Send;
    /// Records an authority's report of itself, replacing its last. A store one authority
    /// serves alone (the embedded one, and a remote store through that authority) keeps none:
    /// the default does nothing.
    fn report_authority(&self, report: AuthorityReport) -> impl Future<Output = StoreResult<()>> + Send {
        async move {
            report.check()?;
            self.report_authority_unchecked(report).await
        }
    }
    /// `report_authority` of a report that passed [`AuthorityReport::check`].
    fn report_authority_unchecked(&self, report: AuthorityReport) -> impl Future<Output = StoreResult<()>> + Send {
        let _ = report;
        async { Ok(()) }
    }
    /// The authorities' last reports (none on a store that keeps none).
    fn authorities(&self) -> impl Future<Output = StoreResult<Vec<AuthorityReport>>> + Send {
        async { Ok(Vec::new()) }
    }
    /// The zone's shared DNSSEC keys (`None` before an authority first writes them). A store
    /// that keeps none (the test doubles) refuses.
    fn dnssec_keys(&self) -> impl Future<Output = StoreResult<Option<KeysRecord>>> + Send {
        async { Err(StoreError::BadRequest("this store keeps no DNSSEC keys".into())) }
    }
    /// Replaces the zone's shared DNSSEC keys with `bytes` if they are still at version
    /// `expected` (`None`: there are none yet): a compare-and-swap, so that of two authorities
    /// rolling at once one wins and the other reads the winner's keys.
    fn put_dnssec_keys(&self, expected: Option<u64>, bytes: Vec<u8>) -> impl Future<Output = StoreResult<KeysPut>> + Send {
        async move {
            if bytes.len() > DNSSEC_KEYS_BYTES_MAX {
                return Err(StoreError::TooLong { what: "the DNSSEC keys record".into(), len: bytes.len(), max: DNSSEC_KEYS_BYTES_MAX });
            }
            self.put_dnssec_keys_unchecked(expected, bytes).await
        }
    }
    /// `put_dnssec_keys` of a record within [`DNSSEC_KEYS_BYTES_MAX`].
    fn put_dnssec_keys_unchecked(&self, expected: Option<u64>, bytes: Vec<u8>) -> impl Future<Output = StoreResult<KeysPut>> + Send {
        let _ = (expected, bytes);
        async { Err(StoreError::BadRequest("this store keeps no DNSSEC keys".into())) }
    }
    fn version(&self) -> impl Future<Output = StoreResult<StoreVersion>> + Send;
    /// Returns as soon as the store's version differs from `seen`, or after `timeout`
    /// (capped at `WAIT_TIMEOUT_MAX`) with the current version. Never busy-polls.
    fn wait_for_change(&self, seen: StoreVersion, timeout: Duration) -> impl Future<Output = StoreResult<StoreVersion>> + Send {
        self.wait_for_change_unchecked(seen, timeout.min(WAIT_TIMEOUT_MAX))
    }
    /// `wait_for_change` with `timeout` at most `WAIT_TIMEOUT_MAX`.
    fn wait_for_change_unchecked(&self, seen: StoreVersion, timeout: Duration) -> impl Future<Output = StoreResult<StoreVersion>> + Send;
}

/// The generation of the plan that follows `latest` in `store`: `latest + 1`, or before any
/// plan, `generation_base + 1`.
pub async fn next_generation<S: Store>(store: &S, latest: Generation) -> StoreResult<Generation> {
    let after = if latest.is_none() { store.generation_base().await? } else { latest };
    after.next().ok_or(StoreError::Exhausted(after))
}

/// `publish_changes` the slow way: reads the parent whole, builds the plan and publishes it
/// whole. Stores without a faster way use it, and the fast ways fall back to it.
pub async fn publish_changes_whole<S: Store>(store: &S, delta: &PlanDelta, lease: Option<&Lease>) -> StoreResult<()> {
    delta.check()?;
    let head = &delta.head;
    let parent = match head.parent_generation {
        Generation::NONE => None,
        g => match store.plan(g).await {
            // The store's zone is its plans' zone: refused as a whole plan for another would be.
            Ok(parent) if parent.plan().dns_zone != head.dns_zone => {
                return Err(StoreError::DnsZoneMismatch { attempted: head.dns_zone.clone(), stored: parent.into_plan().dns_zone });
            }
            Ok(parent) => Some(parent.into_plan()),
            Err(StoreError::PlanNotFound(_)) => {
                let latest = store.latest().await?;
                return Err(StoreError::Conflict { attempted: head.generation, parent: g, latest });
            }
            Err(err) => return Err(err),
        },
    };
    let plan = delta.clone().apply_to(parent)?;
    match lease {
        Some(lease) => store.publish_leased(&plan, lease).await,
        None => store.publish(&plan).await,
    }
}

/// Publishes `plan`, as its changes against `parent` (the plan its parent generation names,
/// as read from this store) when that is smaller, else whole.
pub async fn publish_against<S: Store>(store: &S, parent: Option<&Plan>, plan: &ValidatedPlan, lease: Option<&Lease>) -> StoreResult<()> {
    publish_told(store, parent.and_then(|parent| PlanDelta::between(parent, plan)), plan, lease).await
}

/// Publishes `plan` as `delta` (its changes, found by the caller) when there is one, else whole.
pub async fn publish_told<S: Store>(store: &S, delta: Option<PlanDelta>, plan: &ValidatedPlan, lease: Option<&Lease>) -> StoreResult<()> {
    match delta {
        Some(delta) => store.publish_changes(&delta, lease).await,
        None => match lease {
            Some(lease) => store.publish_leased(plan, lease).await,
            None => store.publish(plan).await,
        },
    }
}

/// The check of `plan_changes`'s range that needs no store.
pub fn check_changes_range(from: Generation, to: Generation) -> StoreResult<()> {
    if from >= to {
        return Err(StoreError::BadRequest(format!("changes from plan {from} to plan {to}: the first must be older than the second")));
    }
    Ok(())
}

/// The batch-wide checks of `apply_many` that need no store: size and duplicate names.
pub fn check_batch(items: &[ApplyItem]) -> StoreResult<()> {
    if items.len() > APPLY_BATCH_MAX {
        return Err(StoreError::BadRequest(format!("a batch apply has {} endpoints; the limit is {APPLY_BATCH_MAX}", items.len())));
    }
    let mut seen = std::collections::HashSet::with_capacity(items.len());
    for item in items {
        if !seen.insert(&item.endpoint) {
            return Err(StoreError::BadRequest(format!("endpoint {} appears twice in one batch apply", item.endpoint)));
        }
    }
    Ok(())
}
