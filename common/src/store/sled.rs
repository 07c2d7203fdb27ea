//! `SledStore`: the embedded `Store` on a sled database on local disk, compressed by sled
//! (zstd, `COMPRESSION_LEVEL`) when `open` creates it; a store created uncompressed stays so.
//!
//! Layout (one sled tree each):
//! - `plans`: generation (big-endian) → the whole plan's envelope, for plans published whole
//!   and for checkpoints; `plan_heads`: the same keys → [`PlanHead`], for plans published as
//!   their changes (`publish_changes`); `summaries`: the same keys → summary; `plan_changes`:
//!   the same keys → the plan's [`PlanChanges`] against its parent, written with the plan
//!   when it has a parent and the change is at most `PLAN_CHANGES_ENDPOINTS_MAX` endpoints.
//!   A plan published as changes is read by folding the changes after the newest plan stored
//!   whole at or below it onto that plan. So that reads stay near the cost of one whole
//!   plan, a plan is also written whole (a checkpoint, off the publish path) once the changes
//!   since the last whole plan add up to half its size, or to `CHECKPOINT_PLANS_MAX` plans.
//! - `active_runs`: the active records (each endpoint's fence and copied records) in runs of
//!   at most `ACTIVE_RUN_MAX` endpoints in name byte order: the first name of a run (the
//!   first run: a 0 byte, below every name) → [`ActiveRun`] envelope. An apply batch in name
//!   order rewrites a few runs, not a key per endpoint; a run grown past the limit is split
//!   when written. Records are never removed (a retired endpoint keeps a record), so runs
//!   only grow and split. A store written with one `active` key per endpoint is grouped into
//!   runs when it opens (`layout` 3), then that tree is dropped.
//! - `fence_counts`: generation (big-endian) → how many endpoints serve with that fence (8
//!   bytes, big-endian) ++ the name of one of them, or nothing when that one has since moved
//!   on (a witness, for the operator; found again by a scan of `active_runs` when cleanup needs
//!   it). The first key is the oldest active generation. An apply batch writes one value per
//!   generation it touches, not two index entries per endpoint.
//! - `changes`: applied-change count of a batch's last switch (big-endian) → the names the
//!   batch switched, in order, separated by 0 bytes; the batches of the last
//!   `CHANGE_LOG_KEPT` switches, written in the same transaction as the switches, for
//!   `active_since`. (A store written before batches held one name per count: each such entry
//!   reads as a batch of one.)
//! - `meta`: `latest`, `horizon` (oldest stored plan), `applied_changes`, `content_changes`
//!   (apply transactions that changed what is served; absent in a store written before it,
//!   which reads as `applied_changes`), `control_changes`, `dns_zone`, `pause`, `lease`,
//!   `layout`.
//!
//! A store written before `fence_counts` had a `fences` tree (generation ++ name → empty, one
//! entry per serving endpoint): `open` counts it into `fence_counts`, sets `layout` to 2, then
//! drops it. A crash before `layout` is set redoes the count; after, only the drop is left.
//! - `heartbeats`: enactor id → heartbeat envelope.
//! - `contents`: endpoint name ++ 0 ++ generation (big-endian) → [`PlanEntry`] envelope: what
//!   each plan says of each endpoint, written at publish only for the endpoints the plan
//!   changes (its [`PlanChanges`]), so plan `g`'s content for a name is its newest entry at or
//!   below `g`. `contents_full`: generations whose whole content was written (the first plan,
//!   a change too large to record, a parent that could not be read): an entry older than such
//!   a generation is superseded by it, and a name the full plan does not serve is `Absent`.
//!   A whole content goes to `contents_chunks`, not `contents`: generation (big-endian) ++
//!   the first name of a run of `CONTENT_CHUNK_NAMES` names in byte order → [`ContentChunk`]
//!   envelope, so a plan of a million endpoints is a few thousand values, not a million keys.
//!   Plan `g`'s content for a name is then its newest `contents` entry at or below `g` if that
//!   is not older than the newest whole generation `f` at or below `g`, else what `f`'s chunk
//!   says (`Absent` when no chunk holds the name). Whole contents written before chunks are
//!   per-name entries at `f` itself, which the same rule finds first. A plan that is itself
//!   `f`, in chunks, is read from its chunks alone: no entry can come before them.
//!   Applies are checked against these inside the writer lock, so no writer can switch an
//!   endpoint to records its plan does not hold. Cleanup removes the entries no stored plan
//!   can resolve to any more.
//!
//! Concurrency: sled cannot scan inside a transaction, and cleanup must see every fence at
//! the moment it deletes, so one writer mutex serialises every operation; the writes of each
//! operation commit in one multi-tree sled transaction and are flushed before the mutex is
//! released. Readers take the same mutex, so they only ever see flushed state: nothing the
//! authority serves can be lost by a crash. sled locks its directory, so one process owns a
//! store and the mutex is the whole story. Large reads take only the bytes under the mutex
//! and decode them after it (a plan; the whole active state of `active_all` and of an
//! `active_since` that answers with everything): at 1,000,000 endpoints that decode is most
//! of a second, which no writer should wait for.
//!
//! Cleanup is logical first: moving `horizon` is the one atomic, durable step that deletes
//! plans; removing the bytes below it follows and is finished on the next open if a crash
//! interrupts it. The bytes kept start at the newest plan stored whole at or below the
//! horizon, which the plans above it are read from.

use super::high_water::{self, Found, HighWater};
use super::lease;
use super::{
    ActiveDelta, ActivePage, ActiveRecord, ActiveSnapshot, ActiveState, ApplyItem, ApplyOutcome, CleanupDecision, CleanupReport,
    DELTA_ENDPOINTS_MAX, HEARTBEAT_TEXT_BYTES_MAX, HEARTBEATS_MAX, Heartbeat, HistoryMark, LIST_LIMIT_MAX, Lease, PAUSE_TEXT_BYTES_MAX,
    PLAN_CHANGES_GAP_MAX, PauseState, PlanSays, Store, StoreError, StoreFault, StoreResult, StoreVersion, WAIT_TIMEOUT_MAX, check_batch,
    check_changes_range, check_generation, check_len, check_page_limit, content_changed, decide_cleanup, fence_step, plan_says,
};
use crate::changes::{PlanChanges, PlanEntry, decode_changes};
use crate::codec;
use crate::delta::{PlanDelta, PlanHead, apply_entries};
use crate::generation::Generation;
use crate::names::{DnsName, EndpointName};
use crate::plan::{ENDPOINTS_PER_PLAN_MAX, ValidationError};
use crate::plan::{Endpoint, PlanSummary, ValidatedPlan, validate_endpoint};
use compact_str::CompactString;
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;
use tokio::sync::watch;

/// How long `open` waits for another holder of the store's lock to let go. A restarted daemon
/// can race its predecessor's exit by a few hundred milliseconds; longer means a second live
/// process, which is an operator's mistake to report, not to wait out.
pub const OPEN_LOCK_WAIT: Duration = Duration::from_secs(3);

/// zstd level of the pages sled writes (1, its fastest). A store's names and records repeat
/// themselves (every name ends in the DNS zone), so even this level stores a million
/// endpoints in about a seventh of the bytes, for less CPU than a page's serialisation.
const COMPRESSION_LEVEL: i32 = 1;

const META_LATEST: &[u8] = b"latest";
const META_HORIZON: &[u8] = b"horizon";
const META_APPLIED: &[u8] = b"applied_changes";
const META_CONTENT: &[u8] = b"content_changes";
const META_CONTROL: &[u8] = b"control_changes";
const META_DNS_ZONE: &[u8] = b"dns_zone";
/// A random `u64` drawn when the store is first opened: the store's part of a [`HistoryMark`].
const META_STORE_ID: &[u8] = b"store_id";
const META_PAUSE: &[u8] = b"pause";
/// When the database was last reopened after a failed write (Unix milliseconds): the write
/// that proves a reopened database writes again.
const META_REOPENED: &[u8] = b"reopened";
const META_LEASE: &[u8] = b"lease";
/// The layout's version: absent or 1 before `fence_counts`, 2 since, 3 since `active_runs`.
const META_LAYOUT: &[u8] = b"layout";
const LAYOUT_FENCE_COUNTS: u64 = 2;
const LAYOUT_ACTIVE_RUNS: u64 = 3;
/// The tree of a store written before `active_runs`: endpoint name → [`ActiveRecord`].
const LEGACY_ACTIVE: &str = "active";
/// The key of the first run of `active_runs`: below every name (names hold no 0 byte).
const FIRST_RUN: &[u8] = &[0];
/// Most records in one `active_runs` value; a longer run is split when written.
const ACTIVE_RUN_MAX: usize = 128;
/// The tree of a store written before `fence_counts` (see the module docs).
const LEGACY_FENCES: &str = "fences";
/// Names in one `contents_chunks` value: a batch of applies in name order reads a few chunks.
const CONTENT_CHUNK_NAMES: usize = 256;
/// Present once `contents` holds every stored plan's content (a store written before the
/// tree existed gets it on open).
const META_CONTENTS: &[u8] = b"contents";
/// Set while a publish writes its `contents` entries in batches ahead of the transaction that
/// makes its plan visible (the generation, big-endian); that transaction removes it. Found
/// later, the publish did not commit (an error, or a crash), and its entries, which belong to
/// no plan, are removed before anything else reads or writes `contents`.
const META_CONTENTS_PENDING: &[u8] = b"contents_pending";
/// `contents` entries a publish writes inside its transaction; more are written ahead, in
/// batches (see [`META_CONTENTS_PENDING`]). An insert in a sled transaction costs about 14 µs,
/// in a batch about a tenth of that: a 100,000-endpoint plan took 1.4 s in one transaction.
const CONTENTS_IN_TXN_MAX: usize = 1_024;
/// Change-log entries kept for `active_since` followers.
pub const CHANGE_LOG_KEPT: u64 = 1 << 20;
/// How often (in applied changes) the change log is trimmed.
const CHANGE_LOG_TRIM_EVERY: u64 = 1 << 16;
/// Most plans published as changes after the newest plan stored whole before one is written
/// whole (see the module docs).
pub const CHECKPOINT_PLANS_MAX: u64 = 1_024;

/// The embedded store. Clones share one database.
#[derive(Clone)]
pub struct SledStore {
    shared: Arc<Shared>,
}

/// What outlives one opening of the database: sled refuses every call after an I/O error
/// (a full disk), so the store reopens it (see [`Shared::failed`]).
struct Shared {
    path: PathBuf,
    /// The open database; `None` while a reopen replaces it, so that the old one lets go of
    /// sled's lock.
    inner: RwLock<Option<Arc<Inner>>>,
    version: Arc<watch::Sender<StoreVersion>>,
    high_water: Arc<Mutex<HighWater>>,
    fault: Mutex<Option<Fault>>,
}

/// A write that failed, until a reopen writes again.
struct Fault {
    shown: StoreFault,
    /// When it was last logged at ERROR.
    logged: std::time::Instant,
    /// A reopen thread is running.
    reopening: bool,
}

struct Inner {
    db: sled::Db,
    plans: sled::Tree,
    summaries: sled::Tree,
    /// Generation (big-endian) → that plan's changes against its parent.
    plan_changes: sled::Tree,
    /// Generation (big-endian) → the head of a plan published as its changes.
    plan_heads: sled::Tree,
    /// First name of a run → the run's active records (see the module docs).
    active_runs: sled::Tree,
    /// Generation → serving endpoints with that fence and a witness (see the module docs).
    fence_counts: sled::Tree,
    /// Applied-change count of a batch's last switch → the batch's names: the log
    /// `active_since` reads.
    changes: sled::Tree,
    meta: sled::Tree,
    heartbeats: sled::Tree,
    /// Endpoint name ++ 0 ++ generation → what that plan says of the endpoint (see the module
    /// docs).
    contents: sled::Tree,
    /// Generation → empty: plans whose whole content was written.
    contents_full: sled::Tree,
    /// Generation ++ first name → a run of a whole content (see the module docs).
    contents_chunks: sled::Tree,
    /// Serialises every operation; see the module docs.
    lock: Mutex<()>,
    version: Arc<watch::Sender<StoreVersion>>,
    /// Written after each write that moves the version (see `high_water`).
    high_water: Arc<Mutex<HighWater>>,
    /// What lies after the newest plan stored whole; changed under `lock`.
    chain: Mutex<Chain>,
}

/// The plans published as changes since the newest plan stored whole (the base), which
/// decide when the next checkpoint is due.
#[derive(Clone, Copy, Debug, Default)]
struct Chain {
    base_bytes: u64,
    plans: u64,
    change_bytes: u64,
    /// A checkpoint is being written.
    writing: bool,
}

impl Chain {
    fn checkpoint_due(&self) -> bool {
        !self.writing && self.plans > 0 && (self.plans >= CHECKPOINT_PLANS_MAX || self.change_bytes * 2 >= self.base_bytes)
    }
}

/// The active runs as stored, read under the lock and decoded after it.
struct RunBytes {
    applied_changes: u64,
    content_changes: u64,
    runs: Vec<sled::IVec>,
}

impl RunBytes {
    /// Runs and the records in them are in name order, so the map is built in one pass
    /// (`BTreeMap::from_iter` over sorted entries), not an insert per name.
    fn decode(self) -> StoreResult<ActiveSnapshot> {
        let mut entries = Vec::new();
        for run in self.runs {
            for (name, record) in codec::decode::<ActiveRun>(&run).map_err(|e| corrupt("active run", e))?.records {
                entries.push((parse_name(name.as_bytes(), "active endpoint name")?, record));
            }
        }
        Ok(ActiveSnapshot {
            applied_changes: self.applied_changes,
            content_changes: self.content_changes,
            endpoints: entries.into_iter().collect(),
        })
    }
}

/// `active_since` as read under the lock: the delta, or the whole state still to decode.
enum Since {
    Delta(ActiveDelta),
    Whole(RunBytes),
}

/// What a read of a plan needs, taken under the lock and decoded after it.
enum PlanBytes {
    Whole(sled::IVec),
    /// The newest plan stored whole below (none before the first plan), each later plan's
    /// changes in order, and the head of the plan read.
    Chain {
        base: Option<sled::IVec>,
        changes: Vec<sled::IVec>,
        head: sled::IVec,
    },
}

fn io(err: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Io(Box::new(err))
}

fn corrupt(what: impl Into<String>, source: codec::CodecError) -> StoreError {
    StoreError::Corrupt { what: what.into(), source }
}

fn tx_error(err: TransactionError<StoreError>) -> StoreError {
    match err {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => io(e),
    }
}

fn parse_name(bytes: &[u8], what: &str) -> StoreResult<EndpointName> {
    DnsName::parse(&String::from_utf8_lossy(bytes))
        .map_err(|e| corrupt(what, codec::CodecError::Body { kind: "endpoint name".into(), detail: e.to_string() }))
}

fn generation_key(key: &[u8]) -> StoreResult<Generation> {
    let array: [u8; 8] = key.try_into().map_err(|_| corrupt("plan key", codec::CodecError::Truncated { len: key.len() }))?;
    Ok(Generation::from_be_bytes(array))
}

fn change_key(key: &[u8]) -> StoreResult<u64> {
    let array: [u8; 8] = key.try_into().map_err(|_| corrupt("change log key", codec::CodecError::Truncated { len: key.len() }))?;
    Ok(u64::from_be_bytes(array))
}

/// A run of active records in name byte order (`active_runs`).
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct ActiveRun {
    records: Vec<(CompactString, ActiveRecord)>,
}

impl codec::Record for ActiveRun {
    const KIND: u8 = 12;
    const KIND_NAME: &'static str = "active run";
    const BODY_BYTES_MAX: usize = codec::BODY_BYTES_MAX;
}

/// A run read during one operation: where the next run starts (`None`: it is the last), its
/// records, and whether the operation changed them.
#[derive(Default)]
struct LoadedRun {
    next: Option<Vec<u8>>,
    records: Vec<(CompactString, ActiveRecord)>,
    dirty: bool,
}

impl LoadedRun {
    fn find(&self, name: &EndpointName) -> Result<usize, usize> {
        self.records.binary_search_by(|(n, _)| n.as_bytes().cmp(name.as_str().as_bytes()))
    }
}

/// The runs of `active_runs` one operation has read, by key; changed in memory and written
/// together at its end (`Runs::writes`).
#[derive(Default)]
struct Runs {
    loaded: std::collections::BTreeMap<Vec<u8>, LoadedRun>,
}

impl Runs {
    /// The changed runs as keys and values to write, each split into runs of at most
    /// `ACTIVE_RUN_MAX` records of about equal length; a split-off run is keyed by its first
    /// name.
    fn writes(self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        for (key, run) in self.loaded {
            if !run.dirty {
                continue;
            }
            let mut rest = run.records;
            let pieces = rest.len().div_ceil(ACTIVE_RUN_MAX).max(1);
            let size = rest.len().div_ceil(pieces).max(1);
            let mut piece_key = key;
            loop {
                let tail = rest.split_off(size.min(rest.len()));
                out.push((piece_key, codec::encode(&ActiveRun { records: rest })));
                let Some((first, _)) = tail.first() else { break };
                piece_key = first.as_bytes().to_vec();
                rest = tail;
            }
        }
        out
    }
}

/// The key of what plan `generation` says of `name`. Names never hold a 0 byte, so the
/// separator keeps one name's keys apart from a longer name's that starts with it.
fn content_key(name: &EndpointName, generation: Generation) -> Vec<u8> {
    let mut key = Vec::with_capacity(name.as_str().len() + 9);
    key.extend_from_slice(name.as_str().as_bytes());
    key.push(0);
    key.extend_from_slice(&generation.to_be_bytes());
    key
}

/// The generation of a `contents` key.
fn content_generation(key: &[u8]) -> StoreResult<Generation> {
    let tail = key.len().checked_sub(8).and_then(|at| key.get(at..)).and_then(|t| <[u8; 8]>::try_from(t).ok());
    tail.map(Generation::from_be_bytes).ok_or_else(|| corrupt("plan content key", codec::CodecError::Truncated { len: key.len() }))
}

/// A run of one plan's whole content, in name byte order (`contents_chunks`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ContentChunk {
    entries: Vec<(CompactString, PlanEntry)>,
}

impl codec::Record for ContentChunk {
    const KIND: u8 = 11;
    const KIND_NAME: &'static str = "plan content chunk";
    const BODY_BYTES_MAX: usize = codec::BODY_BYTES_MAX;
}

/// The key of the chunk of plan `generation`'s whole content that starts at `first`.
fn chunk_key(generation: Generation, first: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + first.len());
    key.extend_from_slice(&generation.to_be_bytes());
    key.extend_from_slice(first);
    key
}

/// What a publish writes: `contents` entries of the names the plan changes, or chunks of every
/// name it serves or retires (`full`).
struct ContentWrite {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    chunks: Vec<(Vec<u8>, Vec<u8>)>,
    full: bool,
}

impl ContentWrite {
    fn whole(plan: &crate::plan::Plan) -> ContentWrite {
        let served = plan.endpoints.iter().map(|(name, records)| (name.as_str(), PlanEntry::Serve(records.clone())));
        let retired = plan.retired.iter().map(|name| (name.as_str(), PlanEntry::Retire));
        let mut all: Vec<(&str, PlanEntry)> = served.chain(retired).collect();
        all.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let chunks = all
            .chunks(CONTENT_CHUNK_NAMES)
            .map(|run| {
                let entries: Vec<(CompactString, PlanEntry)> = run.iter().map(|(name, entry)| ((*name).into(), entry.clone())).collect();
                (chunk_key(plan.generation, run[0].0.as_bytes()), codec::encode(&ContentChunk { entries }))
            })
            .collect();
        ContentWrite { entries: Vec::new(), chunks, full: true }
    }

    fn changes(changes: &PlanChanges) -> ContentWrite {
        let entries = changes.changes.iter().map(|(name, entry)| (content_key(name, changes.to), codec::encode(entry))).collect();
        ContentWrite { entries, chunks: Vec::new(), full: false }
    }

    /// Values to write: a chunk counts as one.
    fn len(&self) -> usize {
        self.entries.len() + self.chunks.len()
    }
}

/// Reads plan `generation`'s content name by name (see `Inner::content_at`), keeping what the
/// next name of a batch is likely to need: the newest whole generation at or below it, and the
/// chunk read last with where the next one starts.
struct ContentReader {
    generation: Generation,
    whole: Option<Generation>,
    /// The plan itself is the newest whole content, and it is in chunks: no `contents` entry
    /// can answer before them (only a whole content written before chunks has entries at
    /// its own generation), so a name is not looked up there at all.
    chunks_only: bool,
    chunk: Option<ReadChunk>,
}

/// The chunk read last: its key, the key of the chunk after it in the same whole content
/// (`None`: it is the last), and its entries.
type ReadChunk = (sled::IVec, Option<sled::IVec>, Vec<(CompactString, PlanEntry)>);

/// A `fence_counts` value, decoded: how many endpoints serve with the fence, and one of them
/// (empty when not known).
#[derive(Debug, Default, PartialEq)]
struct FenceCount {
    count: u64,
    witness: Vec<u8>,
}

impl FenceCount {
    fn decode(value: &[u8]) -> StoreResult<FenceCount> {
        let (count, witness) =
            value.split_first_chunk::<8>().ok_or_else(|| corrupt("fence count", codec::CodecError::Truncated { len: value.len() }))?;
        Ok(FenceCount { count: u64::from_be_bytes(*count), witness: witness.to_vec() })
    }

    fn encode(&self) -> Vec<u8> {
        let mut value = Vec::with_capacity(8 + self.witness.len());
        value.extend_from_slice(&self.count.to_be_bytes());
        value.extend_from_slice(&self.witness);
        value
    }

    fn join(&mut self, name: &EndpointName) {
        self.count += 1;
        if self.witness.is_empty() {
            self.witness = name.as_str().as_bytes().to_vec();
        }
    }

    fn leave(&mut self, name: &EndpointName, generation: Generation) -> StoreResult<()> {
        self.count = self.count.checked_sub(1).ok_or_else(|| {
            corrupt(
                format!("fence count of plan {generation}"),
                codec::CodecError::Body { kind: "fence count".into(), detail: format!("{name} serves with it, but its count is 0") },
            )
        })?;
        if self.witness == name.as_str().as_bytes() {
            self.witness.clear();
        }
        Ok(())
    }
}

/// The names of one `changes` entry (a batch), oldest first.
fn log_names(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|byte| *byte == 0)
}

/// The count of the first switch of the `changes` entry `key` → `value`.
fn log_first(key: &[u8], value: &[u8]) -> StoreResult<u64> {
    let last = change_key(key)?;
    let len = log_names(value).count() as u64;
    last.checked_add(1).and_then(|end| end.checked_sub(len)).filter(|_| !value.is_empty()).ok_or_else(|| {
        corrupt(
            "change log entry",
            codec::CodecError::Body { kind: "change log".into(), detail: format!("{len} names end at change {last}") },
        )
    })
}

/// What `open` does with a store behind its high-water mark (see `high_water`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLoss {
    /// Refuse to open it, naming the file, what was lost and the ways out.
    Refuse,
    /// Open what is left and move the applied-change count (and with it the SOA serial) past
    /// everything the mark says was served; the operator's `--accept-store-loss`.
    Accept,
}

/// How often a store whose writes fail tries to reopen its database.
pub const REOPEN_EVERY: Duration = Duration::from_secs(1);
/// The shortest time between two ERROR lines about one fault.
const FAULT_LOG_EVERY: Duration = Duration::from_secs(60);

impl SledStore {
    /// Opens (or creates) the store in directory `path`; a store behind its high-water mark
    /// is refused (`OnLoss::Refuse`).
    pub fn open(path: impl AsRef<Path>) -> StoreResult<SledStore> {
        SledStore::open_with(path, OnLoss::Refuse)
    }

    /// Opens (or creates) the store in directory `path`, doing `on_loss` with a store behind
    /// its high-water mark.
    pub fn open_with(path: impl AsRef<Path>, on_loss: OnLoss) -> StoreResult<SledStore> {
        let path = path.as_ref();
        let (high_water, found) = HighWater::open(path).map_err(|err| {
            StoreError::Unavailable(format!(
                "cannot open the store's high-water mark {}: {err}",
                path.join(high_water::FILE_NAME).display()
            ))
        })?;
        let high_water = Arc::new(Mutex::new(high_water));
        let version = Arc::new(watch::Sender::new(StoreVersion::default()));
        let inner = Inner::open(path, version.clone(), high_water.clone(), Some((found, on_loss)))?;
        Ok(SledStore {
            shared: Arc::new(Shared {
                path: path.to_path_buf(),
                inner: RwLock::new(Some(Arc::new(inner))),
                version,
                high_water,
                fault: Mutex::new(None),
            }),
        })
    }

    #[cfg(test)]
    fn inner(&self) -> Arc<Inner> {
        self.current().expect("the store is open")
    }

    /// The open database; while a failed write is not yet undone by a reopen, an error that
    /// says why (sled refuses every call after it anyway).
    fn current(&self) -> StoreResult<Arc<Inner>> {
        if let Some(fault) = self.fault() {
            return Err(StoreError::Unavailable(fault.to_string()));
        }
        let inner = self.shared.inner.read().map_err(|_| poisoned())?.clone();
        inner.ok_or_else(|| StoreError::Unavailable(format!("the store at {} is being reopened", self.shared.path.display())))
    }

    async fn blocking<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> StoreResult<T> + Send + 'static,
    {
        let inner = self.current()?;
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || {
            let result = f(&inner);
            drop(inner);
            if let Err(err @ StoreError::Io(_)) = &result {
                Shared::failed(&shared, &fault_text(err));
            }
            result
        })
        .await
        .map_err(|err| StoreError::Unavailable(format!("store task did not finish: {err}")))?
    }
}

/// What a failed call says in a [`StoreFault`]: a full disk in the operating system's words
/// (sled passes it on as the debug form of its `io::Error`), anything else with its causes.
fn fault_text(err: &StoreError) -> String {
    if let StoreError::Io(source) = err
        && let Some(sled::Error::Io(io)) = source.downcast_ref::<sled::Error>()
        && io.kind() == std::io::ErrorKind::StorageFull
    {
        return "No space left on device".into();
    }
    super::wire::error_chain(err)
}

fn poisoned() -> StoreError {
    StoreError::Unavailable("store lock poisoned by an earlier failure; restart the process".into())
}

impl Shared {
    /// Records a failed write and starts reopening the database: sled answers every later
    /// call with the same error until it is opened again. The fault stays until a reopened
    /// database has made a write durable.
    fn failed(shared: &Arc<Shared>, error: &str) {
        let Ok(mut fault) = shared.fault.lock() else { return };
        let free_bytes = fs2::available_space(&shared.path).ok();
        let now = std::time::Instant::now();
        let fault = fault.get_or_insert_with(|| Fault {
            shown: StoreFault {
                since_unix_ms: lease::now_unix_ms(),
                error: String::new(),
                path: shared.path.display().to_string(),
                free_bytes,
                reopens: 0,
            },
            logged: now - FAULT_LOG_EVERY,
            reopening: false,
        });
        fault.shown.error = error.to_string();
        fault.shown.free_bytes = free_bytes;
        if now.duration_since(fault.logged) >= FAULT_LOG_EVERY {
            fault.logged = now;
            tracing::error!(path = %shared.path.display(), "{}; publishes and applies wait", fault.shown);
        }
        if !fault.reopening {
            fault.reopening = true;
            let weak = Arc::downgrade(shared);
            let spawned =
                std::thread::Builder::new().name("dnsplan-store-reopen".into()).spawn(move || Shared::reopen_until_written(&weak));
            if let Err(err) = spawned {
                fault.reopening = false;
                tracing::error!(error = %err, "could not start reopening the store; the next failed write tries again");
            }
        }
    }

    /// Reopens the database every [`REOPEN_EVERY`] until one opens and makes a write
    /// durable, or the store is dropped.
    fn reopen_until_written(weak: &std::sync::Weak<Shared>) {
        loop {
            // The pace of the retries, not a synchronisation: nothing waits on it.
            std::thread::sleep(REOPEN_EVERY);
            let Some(shared) = weak.upgrade() else { return };
            match shared.reopen() {
                Ok(()) => {
                    if let Ok(mut fault) = shared.fault.lock()
                        && let Some(was) = fault.take()
                    {
                        tracing::info!(path = %shared.path.display(), reopens = was.shown.reopens + 1, "the store reopened and writes again");
                    }
                    return;
                }
                Err(err) => {
                    let Ok(mut fault) = shared.fault.lock() else { return };
                    if let Some(fault) = fault.as_mut() {
                        fault.shown.reopens += 1;
                        fault.shown.error = format!("reopening failed: {}", fault_text(&err));
                        fault.shown.free_bytes = fs2::available_space(&shared.path).ok();
                    }
                }
            }
        }
    }

    /// Drops the database that failed, opens it again (checked against its high-water mark
    /// like any open) and makes one write durable, which fails as long as the disk is full.
    fn reopen(&self) -> StoreResult<()> {
        // Taken out first, so sled's lock is released once the calls still on it return
        // (`Inner::open` waits up to `OPEN_LOCK_WAIT` for that).
        drop(self.inner.write().map_err(|_| poisoned())?.take());
        let inner = Inner::open(&self.path, self.version.clone(), self.high_water.clone(), None)?;
        {
            let _guard = inner.guard()?;
            inner.meta.insert(META_REOPENED, &lease::now_unix_ms().to_be_bytes()).map_err(io)?;
            inner.flush()?;
            inner.publish_version()?;
        }
        *self.inner.write().map_err(|_| poisoned())? = Some(Arc::new(inner));
        Ok(())
    }
}

impl Inner {
    /// Opens the database in `path`; `check` is the high-water mark found at the store's
    /// first open and what to do with a store behind it (a reopen checks against the mark
    /// kept since).
    fn open(
        path: &Path,
        version: Arc<watch::Sender<StoreVersion>>,
        high_water: Arc<Mutex<HighWater>>,
        check: Option<(Found, OnLoss)>,
    ) -> StoreResult<Inner> {
        // A process that just exited (or a store just dropped) releases sled's file lock from
        // background threads a moment later, so lock contention is retried briefly before it
        // is reported. Other errors are not retried.
        let deadline = std::time::Instant::now() + OPEN_LOCK_WAIT;
        let mut backoff = Duration::from_millis(5);
        let mut compressed = true;
        let db = loop {
            let config = sled::Config::new().path(path).use_compression(compressed).compression_factor(COMPRESSION_LEVEL);
            match config.open() {
                Ok(db) => break db,
                // sled fixes compression when it creates a store: a store created without it
                // (before compression, or by an older dnsplan) is opened as it is.
                Err(sled::Error::Unsupported(why)) if compressed && why.contains("use_compression") => compressed = false,
                // sled reports a held lock as an `Other` error naming it, with the
                // `WouldBlock` of the lock call only in its text.
                Err(sled::Error::Io(e))
                    if e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("could not acquire lock") =>
                {
                    if std::time::Instant::now() >= deadline {
                        return Err(StoreError::Unavailable(format!(
                            "{} is in use by another process (sled holds a lock on it); stop that process first: {e}",
                            path.display()
                        )));
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                Err(other) => return Err(io(other)),
            }
        };
        let tree = |name: &str| db.open_tree(name).map_err(io);
        let inner = Inner {
            plans: tree("plans")?,
            summaries: tree("summaries")?,
            plan_changes: tree("plan_changes")?,
            plan_heads: tree("plan_heads")?,
            active_runs: tree("active_runs")?,
            fence_counts: tree("fence_counts")?,
            changes: tree("changes")?,
            meta: tree("meta")?,
            heartbeats: tree("heartbeats")?,
            contents: tree("contents")?,
            contents_full: tree("contents_full")?,
            contents_chunks: tree("contents_chunks")?,
            db,
            lock: Mutex::new(()),
            version,
            high_water,
            chain: Mutex::new(Chain::default()),
        };
        inner.check_high_water(path, check)?;
        inner.migrate_fences()?;
        inner.migrate_active()?;
        inner.recover()?;
        inner.ensure_store_id()?;
        let chain = inner.read_chain()?;
        *inner.chain_state()? = chain;
        {
            let _guard = inner.guard()?;
            inner.publish_version()?;
        }
        Ok(inner)
    }

    /// Refuses a store behind its high-water mark, or accepts the loss (see `high_water`).
    /// `check` is `None` on a reopen: the mark is then the one this process kept.
    fn check_high_water(&self, path: &Path, check: Option<(Found, OnLoss)>) -> StoreResult<()> {
        let (found, on_loss) = match check {
            Some(check) => check,
            None => match self.high_water.lock().map_err(|_| poisoned())?.last() {
                Some(mark) => (Found::Mark(mark), OnLoss::Refuse),
                None => (Found::None, OnLoss::Refuse),
            },
        };
        let store_id = self.meta.get(META_STORE_ID).map_err(io)?.map(|_| self.meta_u64(META_STORE_ID, 0)).transpose()?;
        let applied = self.meta_u64(META_APPLIED, 0)?;
        let latest = self.latest()?;
        let mark_path = path.join(high_water::FILE_NAME);
        let lost = match found {
            Found::None => return Ok(()),
            Found::Mark(mark) if store_id == Some(mark.store_id) && applied >= mark.applied_changes && latest >= mark.latest => {
                return Ok(());
            }
            Found::Mark(mark) => {
                let now = match store_id {
                    None => "it opens empty".to_string(),
                    Some(id) if id != mark.store_id => format!("it is another store (id {id:016x}, the mark's is {:016x})", mark.store_id),
                    Some(_) => format!("it holds {applied} applied changes and plans up to {latest}"),
                };
                Some((mark, format!("it had reached {} applied changes and plan {}, but {now}", mark.applied_changes, mark.latest)))
            }
            Found::Torn => None,
        };
        let what =
            lost.as_ref().map_or_else(|| "its high-water mark is torn, so nothing says how far it had been".to_string(), |l| l.1.clone());
        if on_loss == OnLoss::Refuse {
            return Err(StoreError::WentBack(format!(
                "the store in {} went back: {what} ({}). sled drops a damaged page and everything written after it without an \
                 error, so data was lost; serving it would answer older records and restart the SOA serial below what \
                 secondaries hold. Ways out: restore a copy of the whole directory {} taken from this store (it carries its \
                 own mark), or start once with --accept-store-loss, which keeps what is left, moves the SOA serial past \
                 everything served and lets the planner publish again",
                path.display(),
                mark_path.display(),
                path.display(),
            )));
        }
        tracing::warn!(path = %path.display(), "--accept-store-loss: the store went back ({what}); opening what is left");
        if let Some((mark, _)) = lost {
            // One past the mark: the state now served is new, so its serial must be too.
            let past = mark.applied_changes.saturating_add(1);
            // The serial derives from the content count, which never exceeds the applied
            // count: one past the mark's applied count is past every serial served. Each count
            // is moved on its own: another store may be ahead on one and behind on the other.
            let content = self.meta_u64(META_CONTENT, applied)?;
            let mut moved = false;
            for (key, now) in [(META_APPLIED, applied), (META_CONTENT, content)] {
                if now < past {
                    self.meta.insert(key, &past.to_be_bytes()).map_err(io)?;
                    moved = true;
                }
            }
            if moved {
                self.flush()?;
                tracing::warn!(
                    applied_changes = past,
                    "moved the applied-change and content-change counts, and with them the SOA serial, past everything served"
                );
            }
        }
        Ok(())
    }
}

impl Inner {
    fn guard(&self) -> StoreResult<MutexGuard<'_, ()>> {
        self.lock.lock().map_err(|_| poisoned())
    }

    /// The applied-change and content-change counts. A store written before the content count
    /// has none: it starts at the applied count, where the serial was.
    fn counts(&self) -> StoreResult<(u64, u64)> {
        let applied = self.meta_u64(META_APPLIED, 0)?;
        Ok((applied, self.meta_u64(META_CONTENT, applied)?))
    }

    fn meta_u64(&self, key: &[u8], default: u64) -> StoreResult<u64> {
        match self.meta.get(key).map_err(io)? {
            None => Ok(default),
            Some(bytes) => {
                let array: [u8; 8] = bytes.as_ref().try_into().map_err(|_| {
                    corrupt(
                        format!("meta key {}", String::from_utf8_lossy(key)),
                        codec::CodecError::LengthMismatch { declared: 8, actual: bytes.len() },
                    )
                })?;
                Ok(u64::from_be_bytes(array))
            }
        }
    }

    /// Converts a store whose tree `legacy` belongs to a layout before `layout`: `convert`
    /// writes the new trees from it (starting from empty, so a rerun redoes it), then `layout`
    /// is marked and `legacy` dropped, each step flushed. Interrupted before the mark, the
    /// next open converts again; after it, only the drop is left. A store without `legacy`
    /// (a new one) only gets the mark.
    fn convert_legacy(&self, legacy: &str, layout: u64, convert: impl FnOnce(&sled::Tree) -> StoreResult<()>) -> StoreResult<()> {
        let has_legacy = self.db.tree_names().iter().any(|name| name.as_ref() == legacy.as_bytes());
        let current = self.meta_u64(META_LAYOUT, 1)?;
        if has_legacy && current < layout {
            convert(&self.db.open_tree(legacy).map_err(io)?)?;
            self.flush()?;
        }
        if current < layout {
            self.meta.insert(META_LAYOUT, &layout.to_be_bytes()).map_err(io)?;
            self.flush()?;
        }
        if has_legacy {
            self.db.drop_tree(legacy).map_err(io)?;
            self.flush()?;
        }
        Ok(())
    }

    /// Counts the `fences` index of a store written before `fence_counts` into it (see the
    /// module docs).
    fn migrate_fences(&self) -> StoreResult<()> {
        self.convert_legacy(LEGACY_FENCES, LAYOUT_FENCE_COUNTS, |fences| {
            let mut counts: std::collections::BTreeMap<Generation, FenceCount> = Default::default();
            let mut endpoints = 0u64;
            for key in fences.iter().keys() {
                let key = key.map_err(io)?;
                let (g, name) =
                    key.split_first_chunk::<8>().ok_or_else(|| corrupt("fence index", codec::CodecError::Truncated { len: key.len() }))?;
                counts.entry(Generation::from_be_bytes(*g)).or_default().join(&parse_name(name, "fence index")?);
                endpoints += 1;
            }
            self.fence_counts.clear().map_err(io)?;
            let mut batch = sled::Batch::default();
            for (g, count) in &counts {
                batch.insert(&g.to_be_bytes(), count.encode());
            }
            self.fence_counts.apply_batch(batch).map_err(io)?;
            tracing::info!(endpoints, generations = counts.len(), "counted the store's fence index into fence counts");
            Ok(())
        })
    }

    /// Groups the `active` tree of a store written before `active_runs` into runs (see the
    /// module docs).
    fn migrate_active(&self) -> StoreResult<()> {
        self.convert_legacy(LEGACY_ACTIVE, LAYOUT_ACTIVE_RUNS, |legacy| {
            self.active_runs.clear().map_err(io)?;
            let mut run = Vec::with_capacity(ACTIVE_RUN_MAX);
            let mut key = FIRST_RUN.to_vec();
            let mut batch = sled::Batch::default();
            let mut endpoints = 0u64;
            for entry in legacy.iter() {
                let (name, value) = entry.map_err(io)?;
                let name = parse_name(&name, "active endpoint name")?;
                let record = codec::decode::<ActiveRecord>(&value).map_err(|e| corrupt(format!("active record of {name}"), e))?;
                if run.len() == ACTIVE_RUN_MAX {
                    let first = std::mem::replace(&mut key, name.as_str().as_bytes().to_vec());
                    batch.insert(first, codec::encode(&ActiveRun { records: std::mem::take(&mut run) }));
                }
                run.push((name.as_str().into(), record));
                endpoints += 1;
            }
            if !run.is_empty() {
                batch.insert(key, codec::encode(&ActiveRun { records: run }));
            }
            self.active_runs.apply_batch(batch).map_err(io)?;
            tracing::info!(endpoints, "grouped the store's active records into runs");
            Ok(())
        })
    }

    /// The run that holds (or would hold) `name`: from `runs` if read already, else read from
    /// the store. An empty store gives an empty first run.
    fn run_of<'a>(&self, runs: &'a mut Runs, name: &[u8]) -> StoreResult<&'a mut LoadedRun> {
        let cached = runs
            .loaded
            .range::<[u8], _>((std::ops::Bound::Unbounded, std::ops::Bound::Included(name)))
            .next_back()
            .filter(|(_, run)| run.next.as_deref().is_none_or(|next| name < next))
            .map(|(key, _)| key.clone());
        let key = match cached {
            Some(key) => key,
            None => {
                let found = self.active_runs.range::<&[u8], _>(..=name).next_back().transpose().map_err(io)?;
                let (key, records) = match found {
                    Some((key, value)) => (key.to_vec(), codec::decode::<ActiveRun>(&value).map_err(|e| corrupt("active run", e))?.records),
                    None => (FIRST_RUN.to_vec(), Vec::new()),
                };
                let next = self
                    .active_runs
                    .range::<&[u8], _>((std::ops::Bound::Excluded(key.as_slice()), std::ops::Bound::Unbounded))
                    .next()
                    .transpose()
                    .map_err(io)?
                    .map(|(next, _)| next.to_vec());
                runs.loaded.insert(key.clone(), LoadedRun { next, records, dirty: false });
                key
            }
        };
        Ok(runs.loaded.entry(key).or_default())
    }

    /// `name`'s active record, through `runs`.
    fn active_in(&self, runs: &mut Runs, name: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        let run = self.run_of(runs, name.as_str().as_bytes())?;
        Ok(run.find(name).ok().map(|at| run.records[at].1.clone()))
    }

    /// Draws the store's id if it has none (a new store, or one written before ids).
    fn ensure_store_id(&self) -> StoreResult<()> {
        use std::hash::{BuildHasher, Hasher};
        if self.meta.get(META_STORE_ID).map_err(io)?.is_some() {
            return Ok(());
        }
        // The standard library's hasher keys are drawn from the operating system's randomness.
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
        hasher.write_u32(std::process::id());
        let id = hasher.finish().max(1);
        // Set only if still absent, so two opens racing agree on one id.
        let _ = self.meta.compare_and_swap(META_STORE_ID, None as Option<&[u8]>, Some(&id.to_be_bytes()[..])).map_err(io)?;
        self.db.flush().map_err(io)?;
        Ok(())
    }

    fn history_mark(&self, applied: u64) -> StoreResult<Option<HistoryMark>> {
        let store_id = self.meta_u64(META_STORE_ID, 0)?;
        if store_id == 0 || applied > self.meta_u64(META_APPLIED, 0)? {
            return Ok(None);
        }
        let change = match applied {
            0 => None,
            n => match self.changes.range(n.to_be_bytes()..).next().transpose().map_err(io)? {
                Some((key, names)) => {
                    let first = log_first(&key, &names)?;
                    let at = n.checked_sub(first).and_then(|i| usize::try_from(i).ok());
                    at.and_then(|i| log_names(&names).nth(i)).map(|name| parse_name(name, "change log entry")).transpose()?
                }
                None => None,
            },
        };
        Ok(Some(HistoryMark { store_id, applied_changes: applied, change }))
    }

    /// The zone every plan publish records (`META_DNS_ZONE`); read from the latest plan for
    /// a store without the key.
    fn dns_zone(&self) -> StoreResult<Option<DnsName>> {
        if let Some(stored) = self.meta.get(META_DNS_ZONE).map_err(io)? {
            return DnsName::parse(&String::from_utf8_lossy(&stored))
                .map(Some)
                .map_err(|e| corrupt("stored DNS zone", codec::CodecError::Body { kind: "DNS zone".into(), detail: e.to_string() }));
        }
        match self.latest()? {
            Generation::NONE => Ok(None),
            latest => Ok(Some(self.plan(latest)?.into_plan().dns_zone)),
        }
    }

    fn latest(&self) -> StoreResult<Generation> {
        Ok(Generation(self.meta_u64(META_LATEST, 0)?))
    }

    fn horizon(&self) -> StoreResult<Generation> {
        Ok(Generation(self.meta_u64(META_HORIZON, Generation::FIRST.0)?))
    }

    fn chain_state(&self) -> StoreResult<MutexGuard<'_, Chain>> {
        self.chain.lock().map_err(|_| StoreError::Unavailable("store lock poisoned by an earlier failure; restart the process".into()))
    }

    /// The plans after the newest plan stored whole, as the store holds them now.
    fn read_chain(&self) -> StoreResult<Chain> {
        let latest = self.latest()?;
        let Some((key, base)) = self.plans.range(..=latest.to_be_bytes()).next_back().transpose().map_err(io)? else {
            return Ok(Chain::default());
        };
        let mut chain = Chain { base_bytes: base.len() as u64, ..Chain::default() };
        let after = generation_key(&key)?.next().unwrap_or(Generation(u64::MAX));
        for value in self.plan_changes.range(after.to_be_bytes()..=latest.to_be_bytes()).values() {
            chain.plans += 1;
            chain.change_bytes += value.map_err(io)?.len() as u64;
        }
        Ok(chain)
    }

    /// Whether plan `generation` is stored, whole or as changes.
    fn stored(&self, generation: Generation) -> StoreResult<bool> {
        let key = generation.to_be_bytes();
        Ok(self.plans.contains_key(key).map_err(io)?
            || (self.plan_heads.contains_key(key).map_err(io)? && self.plan_changes.contains_key(key).map_err(io)?))
    }

    fn read_version(&self) -> StoreResult<StoreVersion> {
        Ok(StoreVersion {
            latest: self.latest()?,
            applied_changes: self.meta_u64(META_APPLIED, 0)?,
            control_changes: self.meta_u64(META_CONTROL, 0)?,
        })
    }

    /// Tells the store's watchers of its version and moves the high-water mark to it; called
    /// under the lock once the write that moved it is flushed.
    fn publish_version(&self) -> StoreResult<()> {
        let version = self.read_version()?;
        let store_id = self.meta_u64(META_STORE_ID, 0)?;
        let marked = self.high_water.lock().map_err(|_| poisoned())?.advance(store_id, version.applied_changes, version.latest);
        if let Err(err) = marked {
            // The write itself is durable; only the check of a later open lags behind it.
            tracing::warn!(error = %err, "could not write the store's high-water mark; a store damaged later is noticed only up to the last mark written");
        }
        self.version.send_replace(version);
        Ok(())
    }

    fn flush(&self) -> StoreResult<()> {
        self.db.flush().map(|_| ()).map_err(io)
    }

    /// Finishes an interrupted cleanup and checks that the plan range is whole.
    fn recover(&self) -> StoreResult<()> {
        self.remove_pending_contents()?;
        let horizon = self.horizon()?;
        self.remove_plans_below(horizon)?;
        let latest = self.latest()?;
        if latest >= horizon {
            for g in [horizon, latest] {
                if !self.stored(g)? {
                    return Err(StoreError::Corrupt {
                        what: format!("plan {g} is missing although plans {horizon}..={latest} should be stored"),
                        source: codec::CodecError::Truncated { len: 0 },
                    });
                }
            }
        }
        if !self.meta.contains_key(META_CONTENTS).map_err(io)? {
            self.write_contents(horizon, latest)?;
        }
        self.flush()
    }

    /// Writes the `contents` entries of plan `generation`, not yet published, in batches,
    /// after marking them pending (on disk first). The caller holds the lock, and its
    /// transaction then removes the mark along with making the plan visible.
    fn write_contents_ahead(&self, generation: Generation, contents: &ContentWrite) -> StoreResult<()> {
        self.meta.insert(META_CONTENTS_PENDING, &generation.to_be_bytes()).map_err(io)?;
        self.flush()?;
        for chunk in contents.entries.chunks(65_536) {
            let mut batch = sled::Batch::default();
            for (key, value) in chunk {
                batch.insert(key.as_slice(), value.as_slice());
            }
            self.contents.apply_batch(batch).map_err(io)?;
        }
        for run in contents.chunks.chunks(256) {
            let mut batch = sled::Batch::default();
            for (key, value) in run {
                batch.insert(key.as_slice(), value.as_slice());
            }
            self.contents_chunks.apply_batch(batch).map_err(io)?;
        }
        Ok(())
    }

    /// Removes the `contents` entries of a publish that wrote them ahead and did not commit,
    /// if any (see [`META_CONTENTS_PENDING`]): every entry of its generation, which no plan
    /// holds since the latest is below it. A scan of `contents`, only after such a failure.
    fn remove_pending_contents(&self) -> StoreResult<()> {
        let Some(pending) = self.meta.get(META_CONTENTS_PENDING).map_err(io)? else { return Ok(()) };
        let bytes: [u8; 8] = pending
            .as_ref()
            .try_into()
            .map_err(|_| corrupt("pending contents mark", codec::CodecError::Truncated { len: pending.len() }))?;
        let generation = Generation::from_be_bytes(bytes);
        if generation > self.latest()? {
            let mut removed = 0usize;
            let mut batch = sled::Batch::default();
            for entry in self.contents.iter() {
                let (key, _) = entry.map_err(io)?;
                if content_generation(&key)? == generation {
                    batch.remove(key);
                    removed += 1;
                    if removed.is_multiple_of(65_536) {
                        self.contents.apply_batch(std::mem::take(&mut batch)).map_err(io)?;
                    }
                }
            }
            self.contents.apply_batch(batch).map_err(io)?;
            let mut chunks = sled::Batch::default();
            for key in self.contents_chunks.scan_prefix(generation.to_be_bytes()).keys() {
                chunks.remove(key.map_err(io)?);
                removed += 1;
            }
            self.contents_chunks.apply_batch(chunks).map_err(io)?;
            tracing::warn!(%generation, removed, "removed the contents of a publish that did not commit");
        }
        self.meta.remove(META_CONTENTS_PENDING).map_err(io)?;
        self.flush()
    }

    /// Writes `contents` for the stored plans `horizon..=latest` of a store that has none:
    /// the oldest plan whole, each later one as its recorded changes (or whole without them).
    /// Starts from empty trees and marks the end, so an interrupted run is redone.
    fn write_contents(&self, horizon: Generation, latest: Generation) -> StoreResult<()> {
        self.contents.clear().map_err(io)?;
        self.contents_full.clear().map_err(io)?;
        self.contents_chunks.clear().map_err(io)?;
        let mut g = horizon;
        while g <= latest && !g.is_none() {
            let changes = match self.plan_changes.get(g.to_be_bytes()).map_err(io)? {
                Some(bytes) if g != horizon => Some(decode_changes(&bytes).map_err(|e| corrupt("plan changes", e))?),
                _ => None,
            };
            let write = match changes {
                Some(changes) => ContentWrite::changes(&changes),
                None => {
                    let bytes = self.plans.get(g.to_be_bytes()).map_err(io)?.ok_or(StoreError::PlanNotFound(g))?;
                    ContentWrite::whole(codec::decode_plan(&bytes).map_err(|e| corrupt(format!("plan {g}"), e))?.plan())
                }
            };
            let mut batch = sled::Batch::default();
            for (key, value) in write.entries {
                batch.insert(key, value);
            }
            self.contents.apply_batch(batch).map_err(io)?;
            let mut batch = sled::Batch::default();
            for (key, value) in write.chunks {
                batch.insert(key, value);
            }
            self.contents_chunks.apply_batch(batch).map_err(io)?;
            if write.full {
                self.contents_full.insert(g.to_be_bytes(), &[]).map_err(io)?;
            }
            let Some(next) = g.next() else { break };
            g = next;
        }
        self.flush()?;
        self.meta.insert(META_CONTENTS, &[1]).map_err(io)?;
        Ok(())
    }

    /// Removes the bytes of plans below `horizon` that no plan from `horizon` on is read from:
    /// those older than the newest plan stored whole at or below it.
    fn remove_plans_below(&self, horizon: Generation) -> StoreResult<()> {
        let Some(base) = self.plans.range(..=horizon.to_be_bytes()).next_back().transpose().map_err(io)? else {
            return Ok(());
        };
        let keep_from = generation_key(&base.0)?;
        for tree in [&self.plans, &self.plan_heads, &self.summaries, &self.plan_changes] {
            let mut batch = sled::Batch::default();
            for key in tree.range(..keep_from.to_be_bytes().to_vec()).keys() {
                batch.remove(key.map_err(io)?);
            }
            tree.apply_batch(batch).map_err(io)?;
        }
        Ok(())
    }

    fn paused(&self) -> StoreResult<Option<PauseState>> {
        self.meta
            .get(META_PAUSE)
            .map_err(io)?
            .map(|bytes| codec::decode::<PauseState>(&bytes).map_err(|e| corrupt("pause state", e)))
            .transpose()
    }

    fn read_lease(&self) -> StoreResult<Option<Lease>> {
        self.meta
            .get(META_LEASE)
            .map_err(io)?
            .map(|bytes| codec::decode::<Lease>(&bytes).map_err(|e| corrupt("planner lease", e)))
            .transpose()
    }

    fn write_lease(&self, lease: &Lease) -> StoreResult<()> {
        self.meta.insert(META_LEASE, codec::encode(lease)).map_err(io)?;
        self.flush()
    }

    fn acquire_lease(&self, holder: &str, ttl: Duration) -> StoreResult<Lease> {
        let _guard = self.guard()?;
        let lease = lease::decide_acquire(self.read_lease()?.as_ref(), holder, ttl, lease::now_unix_ms())?;
        self.write_lease(&lease)?;
        Ok(lease)
    }

    fn release_lease(&self, lease: &Lease) -> StoreResult<()> {
        let _guard = self.guard()?;
        match lease::decide_release(self.read_lease()?.as_ref(), lease, lease::now_unix_ms()) {
            Some(released) => self.write_lease(&released),
            None => Ok(()),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn publish(
        &self,
        generation: Generation,
        parent: Generation,
        dns_zone: &DnsName,
        is_operator: bool,
        lease: Option<&Lease>,
        plan: Vec<u8>,
        summary: Vec<u8>,
        changes: Option<Vec<u8>>,
        contents: ContentWrite,
    ) -> StoreResult<()> {
        let _guard = self.guard()?;
        self.remove_pending_contents()?;
        self.check_publish(generation, parent, dns_zone, is_operator, lease)?;
        let key = generation.to_be_bytes();
        // Invariant: a plan's changes are recorded exactly when its contents are written as
        // changes; cleanup relies on it to find what to prune.
        assert_eq!(changes.is_some(), !contents.full, "plan {generation}: changes recorded and contents written whole");
        let ahead = contents.len() > CONTENTS_IN_TXN_MAX;
        if ahead && let Err(err) = self.write_contents_ahead(generation, &contents) {
            let _ = self.remove_pending_contents();
            return Err(err);
        }
        let trees =
            (&self.plans, &self.summaries, &self.plan_changes, &self.meta, &self.contents, &self.contents_full, &self.contents_chunks);
        let committed = trees
            .transaction(|(plans, summaries, plan_changes, meta, content, content_full, content_chunks)| {
                plans.insert(&key, plan.as_slice())?;
                summaries.insert(&key, summary.as_slice())?;
                if let Some(changes) = &changes {
                    plan_changes.insert(&key, changes.as_slice())?;
                }
                if ahead {
                    meta.remove(META_CONTENTS_PENDING)?;
                } else {
                    for (k, v) in &contents.entries {
                        content.insert(k.as_slice(), v.as_slice())?;
                    }
                    for (k, v) in &contents.chunks {
                        content_chunks.insert(k.as_slice(), v.as_slice())?;
                    }
                }
                if contents.full {
                    content_full.insert(&key, &[])?;
                }
                meta.insert(META_LATEST, &key)?;
                meta.insert(META_DNS_ZONE, dns_zone.as_str().as_bytes())?;
                Ok::<_, ConflictableTransactionError<StoreError>>(())
            })
            .map_err(tx_error);
        if let Err(err) = committed {
            let _ = self.remove_pending_contents();
            return Err(err);
        }
        self.flush()?;
        {
            let mut chain = self.chain_state()?;
            *chain = Chain { base_bytes: plan.len() as u64, writing: chain.writing, ..Chain::default() };
        }
        self.publish_version()
    }

    /// The checks every publish makes under the lock before it writes: the lease (the fencing
    /// token, in the same critical section as the CAS), the CAS, the pause, the DNS zone.
    fn check_publish(
        &self,
        generation: Generation,
        parent: Generation,
        dns_zone: &DnsName,
        is_operator: bool,
        lease: Option<&Lease>,
    ) -> StoreResult<()> {
        let current = self.read_lease()?;
        match lease {
            Some(lease) => lease::check_holder(current.as_ref(), lease, lease::now_unix_ms())?,
            None if !is_operator => lease::check_unleased(current.as_ref(), lease::now_unix_ms())?,
            None => {}
        }
        let latest = self.latest()?;
        let next = latest.next().ok_or(StoreError::Exhausted(latest))?;
        if generation != next || parent != latest {
            return Err(StoreError::Conflict { attempted: generation, parent, latest });
        }
        if !is_operator && let Some(pause) = self.paused()? {
            return Err(StoreError::Paused { reason: pause.reason, by: pause.by });
        }
        if let Some(stored) = self.meta.get(META_DNS_ZONE).map_err(io)? {
            let stored = DnsName::parse(&String::from_utf8_lossy(&stored))
                .map_err(|e| corrupt("stored DNS zone", codec::CodecError::Body { kind: "DNS zone".into(), detail: e.to_string() }))?;
            if &stored != dns_zone {
                return Err(StoreError::DnsZoneMismatch { attempted: dns_zone.clone(), stored });
            }
        }
        Ok(())
    }

    /// Publishes `delta` as its changes: the CAS and every check of `publish`, the whole-plan
    /// rules from the parent's counts and each named endpoint's entry in the parent, and one
    /// transaction writing the head, the summary, the changes and their `contents`. Costs
    /// what changed. Returns whether a checkpoint is now due, or `None` when the delta is
    /// not published here because its answer needs the parent read whole: the first plan
    /// (no parent), or an automation plan that leaves some of the parent's retirements in
    /// place (refused, and the refusal names one). The caller then publishes it whole.
    fn publish_changes(&self, delta: &PlanDelta, lease: Option<&Lease>) -> StoreResult<Option<bool>> {
        let head = &delta.head;
        let (generation, parent, is_operator) = (head.generation, head.parent_generation, head.author.is_operator());
        let _guard = self.guard()?;
        self.remove_pending_contents()?;
        self.check_publish(generation, parent, &head.dns_zone, is_operator, lease)?;
        if parent.is_none() {
            return Ok(None);
        }
        let key = generation.to_be_bytes();
        let parent_summary = self.summaries.get(parent.to_be_bytes()).map_err(io)?.ok_or_else(|| {
            corrupt(format!("the summary of the latest plan {parent} is missing"), codec::CodecError::Truncated { len: 0 })
        })?;
        let parent_summary = codec::decode::<PlanSummary>(&parent_summary).map_err(|e| corrupt("plan summary", e))?;
        let (mut served, mut retired) = (parent_summary.endpoint_count, parent_summary.retired_count);
        let mut changes = std::collections::BTreeMap::new();
        let mut reader = self.content_reader(parent)?;
        for (name, entry) in &delta.changes {
            let before = self.content_at(name, &mut reader)?;
            if &before == entry {
                continue;
            }
            match before {
                PlanEntry::Serve(_) => served = served.saturating_sub(1),
                PlanEntry::Retire => retired = retired.saturating_sub(1),
                PlanEntry::Absent => {}
            }
            match entry {
                PlanEntry::Serve(_) => served += 1,
                PlanEntry::Retire => retired += 1,
                PlanEntry::Absent => {}
            }
            changes.insert(name.clone(), entry.clone());
        }
        let total = served + retired;
        if total > ENDPOINTS_PER_PLAN_MAX as u64 {
            return Err(StoreError::Invalid(ValidationError::TooManyEndpoints { count: total as usize }));
        }
        if total == 0 {
            return Err(StoreError::Invalid(ValidationError::NoEndpoints));
        }
        if retired > 0 && !is_operator {
            return Ok(None);
        }
        let summary = PlanSummary {
            generation,
            parent_generation: parent,
            created_at_unix_ms: head.created_at_unix_ms,
            author: head.author.clone(),
            reason: head.reason.clone(),
            endpoint_count: served,
            retired_count: retired,
            rollback_of: head.rollback_of,
        };
        let changes = PlanChanges {
            from: parent,
            to: generation,
            dns_zone: head.dns_zone.clone(),
            rollback_of: head.rollback_of,
            endpoint_count: served,
            changes,
        };
        let contents = ContentWrite::changes(&changes);
        let (head_bytes, summary_bytes, changes_bytes) = (codec::encode(head), codec::encode(&summary), codec::encode(&changes));
        let dns_zone = head.dns_zone.as_str().as_bytes();
        let ahead = contents.entries.len() > CONTENTS_IN_TXN_MAX;
        if ahead && let Err(err) = self.write_contents_ahead(generation, &contents) {
            let _ = self.remove_pending_contents();
            return Err(err);
        }
        let committed = (&self.plan_heads, &self.summaries, &self.plan_changes, &self.meta, &self.contents)
            .transaction(|(plan_heads, summaries, plan_changes, meta, content)| {
                plan_heads.insert(&key, head_bytes.as_slice())?;
                summaries.insert(&key, summary_bytes.as_slice())?;
                plan_changes.insert(&key, changes_bytes.as_slice())?;
                if ahead {
                    meta.remove(META_CONTENTS_PENDING)?;
                } else {
                    for (k, v) in &contents.entries {
                        content.insert(k.as_slice(), v.as_slice())?;
                    }
                }
                meta.insert(META_LATEST, &key)?;
                meta.insert(META_DNS_ZONE, dns_zone)?;
                Ok::<_, ConflictableTransactionError<StoreError>>(())
            })
            .map_err(tx_error);
        if let Err(err) = committed {
            let _ = self.remove_pending_contents();
            return Err(err);
        }
        self.flush()?;
        let due = {
            let mut chain = self.chain_state()?;
            chain.plans += 1;
            chain.change_bytes += changes_bytes.len() as u64;
            let due = chain.checkpoint_due();
            chain.writing |= due;
            due
        };
        self.publish_version()?;
        Ok(Some(due))
    }

    /// What reading plan `generation` needs, taken under the lock.
    fn plan_bytes(&self, generation: Generation) -> StoreResult<PlanBytes> {
        let _guard = self.guard()?;
        if generation < self.horizon()? {
            return Err(StoreError::PlanNotFound(generation));
        }
        let key = generation.to_be_bytes();
        if let Some(bytes) = self.plans.get(key).map_err(io)? {
            return Ok(PlanBytes::Whole(bytes));
        }
        let head = self.plan_heads.get(key).map_err(io)?.ok_or(StoreError::PlanNotFound(generation))?;
        let (base, from) = match self.plans.range(..key).next_back().transpose().map_err(io)? {
            Some((key, bytes)) => (Some(bytes), generation_key(&key)?),
            None => (None, Generation::NONE),
        };
        let first = Generation(from.0 + 1).to_be_bytes();
        let changes = self.plan_changes.range(first..=key).values().collect::<Result<Vec<_>, _>>().map_err(io)?;
        if changes.len() as u64 != generation.0 - from.0 {
            return Err(corrupt(
                format!("plan {generation} is stored as changes, but some of the changes after plan {from} are missing"),
                codec::CodecError::Truncated { len: 0 },
            ));
        }
        Ok(PlanBytes::Chain { base, changes, head })
    }

    fn plan(&self, generation: Generation) -> StoreResult<ValidatedPlan> {
        // Plans are immutable: decoding outside the lock cannot see a torn plan, and keeps a
        // large decode from stalling every other operation.
        let (base, changes, head) = match self.plan_bytes(generation)? {
            PlanBytes::Whole(bytes) => return codec::decode_plan(&bytes).map_err(|e| corrupt(format!("plan {generation}"), e)),
            PlanBytes::Chain { base, changes, head } => (base, changes, head),
        };
        let (mut endpoints, mut retired) = match base {
            Some(bytes) => {
                let base = codec::decode::<crate::plan::Plan>(&bytes).map_err(|e| corrupt(format!("the plan below {generation}"), e))?;
                (base.endpoints, base.retired)
            }
            None => Default::default(),
        };
        for bytes in changes {
            let step = decode_changes(&bytes).map_err(|e| corrupt("plan changes", e))?;
            apply_entries(&mut endpoints, &mut retired, step.changes);
        }
        let head = codec::decode::<PlanHead>(&head).map_err(|e| corrupt(format!("plan {generation}'s head"), e))?;
        ValidatedPlan::new(head.with_endpoints(endpoints, retired))
            .map_err(|e| corrupt(format!("plan {generation}, read from its changes"), codec::CodecError::Invalid(e)))
    }

    /// Writes plan `generation` whole (a checkpoint), then takes stock of the chain again.
    fn write_checkpoint(&self, generation: Generation) -> StoreResult<()> {
        let plan = self.plan(generation);
        let _guard = self.guard()?;
        let written = match plan {
            Ok(plan) if generation >= self.horizon()? => {
                self.plans.insert(generation.to_be_bytes(), codec::encode_plan(&plan)).map_err(io)?;
                self.flush()
            }
            Ok(_) | Err(StoreError::PlanNotFound(_)) => Ok(()),
            Err(err) => Err(err),
        };
        let chain = self.read_chain();
        let mut state = self.chain_state()?;
        state.writing = false;
        if let Ok(chain) = &chain {
            *state = *chain;
        }
        written.and(chain.map(|_| ()))
    }

    fn plan_changes(&self, from: Generation, to: Generation) -> StoreResult<Option<PlanChanges>> {
        check_changes_range(from, to)?;
        if to.0 - from.0 > PLAN_CHANGES_GAP_MAX {
            return Ok(None);
        }
        let records = {
            let _guard = self.guard()?;
            if to < self.horizon()? || to > self.latest()? {
                return Err(StoreError::PlanNotFound(to));
            }
            let (first, last) = (Generation(from.0 + 1).to_be_bytes(), to.to_be_bytes());
            let records = self.plan_changes.range(first..=last).values().collect::<Result<Vec<_>, _>>().map_err(io)?;
            if records.len() as u64 != to.0 - from.0 {
                return Ok(None);
            }
            records
        };
        let mut folded: Option<PlanChanges> = None;
        for bytes in records {
            let step = decode_changes(&bytes).map_err(|e| corrupt("plan changes", e))?;
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

    fn list(&self, from: Generation, limit: usize) -> StoreResult<Vec<PlanSummary>> {
        let _guard = self.guard()?;
        let from = from.max(self.horizon()?);
        self.summaries
            .range(from.to_be_bytes()..)
            .values()
            .take(limit.min(LIST_LIMIT_MAX))
            .map(|bytes| {
                let bytes = bytes.map_err(io)?;
                codec::decode::<PlanSummary>(&bytes).map_err(|e| corrupt("plan summary", e))
            })
            .collect()
    }

    fn read_active(&self, name: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        self.active_in(&mut Runs::default(), name)
    }

    /// The fenced write shared by `apply` and `retire`.
    fn switch(&self, name: &EndpointName, generation: Generation, state: ActiveState) -> StoreResult<ApplyOutcome> {
        let mut results = self.switch_many(generation, vec![(name.clone(), state)])?;
        // Invariant: one result per item.
        assert_eq!(results.len(), 1, "switch_many returned {} results for one item", results.len());
        results.remove(0)
    }

    /// The fenced write of `apply_many`: every item compared against its own fence under the
    /// writer lock, and every switch committed in one transaction and flushed once.
    fn switch_many(&self, generation: Generation, items: Vec<(EndpointName, ActiveState)>) -> StoreResult<Vec<StoreResult<ApplyOutcome>>> {
        // Pair check: plans were validated at build and publish; check again at apply.
        let valid: Vec<StoreResult<()>> = items
            .iter()
            .map(|(name, state)| match state {
                ActiveState::Serving(records) => validate_endpoint(name, records).map_err(StoreError::from),
                ActiveState::Retired => Ok(()),
            })
            .collect();
        let _guard = self.guard()?;
        check_generation(generation, self.latest()?, self.horizon()?)?;
        let (mut applied, mut content) = self.counts()?;
        let mut content_moved = false;
        let mut results = Vec::with_capacity(items.len());
        // The names switched, in order, for the change log.
        let mut switched: Vec<EndpointName> = Vec::new();
        let mut runs = Runs::default();
        let mut reader = self.content_reader(generation)?;
        // The fence counts this batch changes, read once each.
        let mut counts: std::collections::BTreeMap<Generation, FenceCount> = Default::default();
        for ((name, state), valid) in items.into_iter().zip(valid) {
            if let Err(err) = valid {
                results.push(Err(err));
                continue;
            }
            // The content check and the fence are decided here, under the writer lock, in the
            // same critical section that writes: no earlier reading of either is trusted.
            let run = self.run_of(&mut runs, name.as_str().as_bytes())?;
            let at = run.find(&name);
            // Already serving exactly this at this generation: the write that put it there
            // passed the content check against the same plan, and plans do not change, so the
            // check would pass again and nothing is written. Enactors of one zone each send
            // every endpoint of a full plan, so most items end here, and the content read (the
            // larger part of a write's time under the lock) is saved for the writes.
            if let Ok(at) = at
                && run.records[at].1.generation == generation
                && run.records[at].1.state == state
            {
                results.push(Ok(ApplyOutcome::Unchanged));
                continue;
            }
            if let Some(plan) = self.content_mismatch(&name, &state, &mut reader)? {
                results.push(Err(StoreError::ContentMismatch { endpoint: name, generation, plan }));
                continue;
            }
            let current = at.ok().map(|at| &run.records[at].1);
            let previous = match fence_step(&name, current.map(|a| a.generation), generation) {
                Ok(ApplyOutcome::Switched { previous }) => previous,
                decided => {
                    results.push(decided);
                    continue;
                }
            };
            let was_serving = current.is_some_and(|a| matches!(a.state, ActiveState::Serving(_)));
            let serves = matches!(state, ActiveState::Serving(_));
            content_moved |= content_changed(current.map(|a| &a.state), &state);
            let record = ActiveRecord { generation, state };
            match at {
                Ok(at) => run.records[at].1 = record,
                Err(at) => run.records.insert(at, (name.as_str().into(), record)),
            }
            run.dirty = true;
            applied = applied.wrapping_add(1);
            if was_serving {
                self.fence_count(&mut counts, previous)?.leave(&name, previous)?;
            }
            if serves {
                self.fence_count(&mut counts, generation)?.join(&name);
            }
            switched.push(name);
            results.push(Ok(ApplyOutcome::Switched { previous }));
        }
        if switched.is_empty() {
            return Ok(results);
        }
        let mut log = Vec::with_capacity(switched.iter().map(|name| name.as_str().len() + 1).sum());
        for name in &switched {
            if !log.is_empty() {
                log.push(0);
            }
            log.extend_from_slice(name.as_str().as_bytes());
        }
        if content_moved {
            content = content.wrapping_add(1);
        }
        let run_writes = runs.writes();
        let counts: Vec<(Generation, Option<Vec<u8>>)> =
            counts.into_iter().map(|(g, count)| (g, (count.count > 0).then(|| count.encode()))).collect();
        (&self.active_runs, &self.fence_counts, &self.meta, &self.changes)
            .transaction(|(active_runs, fence_counts, meta, changes)| {
                for (key, run) in &run_writes {
                    active_runs.insert(key.as_slice(), run.as_slice())?;
                }
                for (g, value) in &counts {
                    match value {
                        Some(value) => fence_counts.insert(&g.to_be_bytes(), value.as_slice())?,
                        None => fence_counts.remove(&g.to_be_bytes())?,
                    };
                }
                changes.insert(&applied.to_be_bytes(), log.as_slice())?;
                meta.insert(META_APPLIED, &applied.to_be_bytes())?;
                meta.insert(META_CONTENT, &content.to_be_bytes())?;
                Ok::<_, ConflictableTransactionError<StoreError>>(())
            })
            .map_err(tx_error)?;
        self.flush()?;
        self.publish_version()?;
        let before = applied - switched.len() as u64;
        if before / CHANGE_LOG_TRIM_EVERY != applied / CHANGE_LOG_TRIM_EVERY {
            self.trim_change_log(applied)?;
        }
        Ok(results)
    }

    /// The fence count of `generation` in `counts`, read from the store on first use.
    fn fence_count<'a>(
        &self,
        counts: &'a mut std::collections::BTreeMap<Generation, FenceCount>,
        generation: Generation,
    ) -> StoreResult<&'a mut FenceCount> {
        Ok(match counts.entry(generation) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => {
                let stored = self.fence_counts.get(generation.to_be_bytes()).map_err(io)?;
                entry.insert(stored.map(|value| FenceCount::decode(&value)).transpose()?.unwrap_or_default())
            }
        })
    }

    /// A reader of plan `generation`'s content, for `content_at`.
    fn content_reader(&self, generation: Generation) -> StoreResult<ContentReader> {
        let whole = self.contents_full.range(..=generation.to_be_bytes()).next_back().transpose().map_err(io)?;
        let whole = whole.map(|(key, _)| generation_key(&key)).transpose()?;
        let chunks_only = whole == Some(generation) && self.contents_chunks.scan_prefix(generation.to_be_bytes()).next().is_some();
        Ok(ContentReader { generation, whole, chunks_only, chunk: None })
    }

    /// What plan `reader.generation` says of `name`, from `contents` and `contents_chunks`
    /// (see the module docs).
    fn content_at(&self, name: &EndpointName, reader: &mut ContentReader) -> StoreResult<PlanEntry> {
        // A name has few entries (cleanup keeps about one), and sled reads forward faster than
        // backward: the newest is the last one read.
        let mut newest = None;
        if !reader.chunks_only {
            for entry in self.contents.range(content_key(name, Generation::NONE)..=content_key(name, reader.generation)) {
                newest = Some(entry.map_err(io)?);
            }
        }
        if let Some((key, value)) = newest {
            let written = content_generation(&key)?;
            // A plan written whole after this entry supersedes it.
            if reader.whole.is_none_or(|whole| written >= whole) {
                return codec::decode::<PlanEntry>(&value).map_err(|e| corrupt(format!("plan {written}'s content for {name}"), e));
            }
        }
        let Some(whole) = reader.whole else { return Ok(PlanEntry::Absent) };
        let probe = chunk_key(whole, name.as_str().as_bytes());
        let cached = reader.chunk.as_ref().is_some_and(|(key, next, _)| {
            key.as_ref() <= probe.as_slice() && next.as_ref().is_none_or(|next| probe.as_slice() < next.as_ref())
        });
        if !cached {
            let found = self.contents_chunks.range(chunk_key(whole, &[])..=probe.clone()).next_back();
            let Some(found) = found else { return Ok(PlanEntry::Absent) };
            let (key, value) = found.map_err(io)?;
            let next = self.contents_chunks.range::<&[u8], _>((std::ops::Bound::Excluded(key.as_ref()), std::ops::Bound::Unbounded)).next();
            let next = next.transpose().map_err(io)?.map(|(next, _)| next).filter(|next| next.starts_with(&whole.to_be_bytes()));
            let chunk = codec::decode::<ContentChunk>(&value).map_err(|e| corrupt(format!("plan {whole}'s content chunk"), e))?;
            reader.chunk = Some((key, next, chunk.entries));
        }
        let Some((_, _, entries)) = &reader.chunk else { return Ok(PlanEntry::Absent) };
        Ok(match entries.binary_search_by(|(n, _)| n.as_bytes().cmp(name.as_str().as_bytes())) {
            Ok(at) => entries[at].1.clone(),
            Err(_) => PlanEntry::Absent,
        })
    }

    /// `None` when `state` is what plan `generation` says of `name`, else what the plan says.
    fn content_mismatch(&self, name: &EndpointName, state: &ActiveState, reader: &mut ContentReader) -> StoreResult<Option<PlanSays>> {
        Ok(plan_says(&self.content_at(name, reader)?, state))
    }

    /// Removes the `contents` entries no plan from `horizon` on can resolve to: for each name,
    /// every entry older than its newest one at or below `horizon`, and that one too when it
    /// says `Absent`. Only names written by the plans `after..=horizon` can have such
    /// entries, found through those plans' change records; a plan among them written whole
    /// makes it a scan of every entry. Runs before those plans' records are removed.
    fn prune_contents(&self, after: Generation, horizon: Generation) -> StoreResult<()> {
        let mut names = std::collections::BTreeSet::new();
        let mut whole = false;
        let mut g = after;
        while let Some(next) = g.next().filter(|n| *n <= horizon) {
            g = next;
            if self.contents_full.contains_key(g.to_be_bytes()).map_err(io)? {
                whole = true;
                break;
            }
            match self.plan_changes.get(g.to_be_bytes()).map_err(io)? {
                Some(bytes) => names.extend(decode_changes(&bytes).map_err(|e| corrupt("plan changes", e))?.changes.into_keys()),
                None => {
                    whole = true;
                    break;
                }
            }
        }
        // The newest whole content at or below the horizon: every entry older than it is
        // superseded. A name's newest entry saying `Absent` can go too, unless that content is
        // in chunks, which would then answer for the name.
        let base = self.contents_full.range(..=horizon.to_be_bytes()).next_back().transpose().map_err(io)?;
        let base = base.map(|(key, _)| generation_key(&key)).transpose()?;
        let base_chunked = match base {
            Some(base) => self.contents_chunks.scan_prefix(base.to_be_bytes()).next().is_some(),
            None => false,
        };
        let mut batch = sled::Batch::default();
        let mut prune_name = |entries: &mut dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>| -> StoreResult<()> {
            // Entries of one name, oldest first, all at or below `horizon`.
            let mut previous: Option<(sled::IVec, sled::IVec)> = None;
            for entry in entries {
                let entry = entry.map_err(io)?;
                if base.is_some_and(|base| content_generation(&entry.0).is_ok_and(|g| g < base)) {
                    batch.remove(entry.0);
                    continue;
                }
                if let Some((key, _)) = previous.replace(entry) {
                    batch.remove(key);
                }
            }
            if let Some((key, value)) = previous
                && !base_chunked
                && codec::decode::<PlanEntry>(&value).is_ok_and(|e| e == PlanEntry::Absent)
            {
                batch.remove(key);
            }
            Ok(())
        };
        if whole {
            let mut current: Vec<u8> = Vec::new();
            let mut group: Vec<sled::Result<(sled::IVec, sled::IVec)>> = Vec::new();
            for entry in self.contents.iter() {
                let (key, value) = entry.map_err(io)?;
                let split = key.len().saturating_sub(9);
                let (name, generation) = (&key[..split], content_generation(&key)?);
                if name != current.as_slice() {
                    prune_name(&mut group.drain(..))?;
                    current = name.to_vec();
                }
                if generation <= horizon {
                    group.push(Ok((key, value)));
                }
            }
            prune_name(&mut group.drain(..))?;
            if let Some(base) = base {
                let mut markers = sled::Batch::default();
                for key in self.contents_full.range(..base.to_be_bytes()).keys() {
                    markers.remove(key.map_err(io)?);
                }
                self.contents_full.apply_batch(markers).map_err(io)?;
                let mut chunks = sled::Batch::default();
                for key in self.contents_chunks.range(..base.to_be_bytes()).keys() {
                    chunks.remove(key.map_err(io)?);
                }
                self.contents_chunks.apply_batch(chunks).map_err(io)?;
            }
        } else {
            for name in &names {
                prune_name(&mut self.contents.range(content_key(name, Generation::NONE)..=content_key(name, horizon)))?;
            }
        }
        self.contents.apply_batch(batch).map_err(io)
    }

    /// Drops change-log entries older than the last `CHANGE_LOG_KEPT`. Followers further
    /// behind get the whole state from `active_since`, so this never loses a change.
    fn trim_change_log(&self, applied: u64) -> StoreResult<()> {
        let keep_from = applied.saturating_sub(CHANGE_LOG_KEPT) + 1;
        let mut batch = sled::Batch::default();
        for key in self.changes.range(..keep_from.to_be_bytes().to_vec()).keys() {
            batch.remove(key.map_err(io)?);
        }
        self.changes.apply_batch(batch).map_err(io)
    }

    fn active_all(&self) -> StoreResult<ActiveSnapshot> {
        let runs = {
            let _guard = self.guard()?;
            self.active_runs_locked()?
        };
        runs.decode()
    }

    #[cfg(test)]
    fn active_all_locked(&self) -> StoreResult<ActiveSnapshot> {
        self.active_runs_locked()?.decode()
    }

    /// Every active run's bytes with the applied-change count they go with, read under the
    /// writer lock: values sled shares, so this is cheap, and decoding them (most of a second
    /// at 1,000,000 endpoints) happens after the lock is released.
    fn active_runs_locked(&self) -> StoreResult<RunBytes> {
        let (applied_changes, content_changes) = self.counts()?;
        let runs = self.active_runs.iter().values().collect::<Result<Vec<_>, _>>().map_err(io)?;
        Ok(RunBytes { applied_changes, content_changes, runs })
    }

    fn active_page(&self, after: Option<&EndpointName>, limit: usize) -> StoreResult<ActivePage> {
        check_page_limit(limit)?;
        let _guard = self.guard()?;
        let mut page = ActivePage { applied_changes: self.meta_u64(META_APPLIED, 0)?, endpoints: Vec::with_capacity(limit), more: false };
        let after = after.map(|a| a.as_str().as_bytes());
        // The run that holds `after` (or would), then the runs after it.
        let start = match after {
            Some(a) => self.active_runs.range::<&[u8], _>(..=a).next_back().transpose().map_err(io)?.map(|(key, _)| key),
            None => None,
        };
        let start = start.map_or_else(|| FIRST_RUN.to_vec(), |key| key.to_vec());
        'runs: for run in self.active_runs.range(start..).values() {
            let run = codec::decode::<ActiveRun>(&run.map_err(io)?).map_err(|e| corrupt("active run", e))?;
            for (name, record) in run.records {
                if after.is_some_and(|a| name.as_bytes() <= a) {
                    continue;
                }
                if page.endpoints.len() == limit {
                    page.more = true;
                    break 'runs;
                }
                page.endpoints.push((parse_name(name.as_bytes(), "active endpoint name")?, record));
            }
        }
        Ok(page)
    }

    fn active_since(&self, since: u64) -> StoreResult<ActiveDelta> {
        match self.active_since_locked(since)? {
            Since::Delta(delta) => Ok(delta),
            // The whole state, decoded after the lock is released.
            Since::Whole(runs) => runs.decode().map(ActiveDelta::from),
        }
    }

    fn active_since_locked(&self, since: u64) -> StoreResult<Since> {
        let _guard = self.guard()?;
        let (applied, content) = self.counts()?;
        if since == applied {
            return Ok(Since::Delta(ActiveDelta {
                applied_changes: applied,
                content_changes: content,
                full: false,
                endpoints: Default::default(),
            }));
        }
        // The log must hold every change after `since`: its first entry is `since + 1` or
        // older. A follower ahead of the store (a store that was replaced) gets everything.
        let first = self.changes.first().map_err(io)?.map(|(key, names)| log_first(&key, &names)).transpose()?;
        if since > applied || first.is_none_or(|first| first > since + 1) {
            return self.active_runs_locked().map(Since::Whole);
        }
        let mut names = std::collections::BTreeSet::new();
        for entry in self.changes.range((since + 1).to_be_bytes()..) {
            let (key, batch) = entry.map_err(io)?;
            let first = log_first(&key, &batch)?;
            // The batch holding `since + 1` may start before it.
            let skip = usize::try_from((since + 1).saturating_sub(first)).unwrap_or(usize::MAX);
            names.extend(log_names(&batch).skip(skip).map(<[u8]>::to_vec));
            if names.len() > DELTA_ENDPOINTS_MAX {
                return self.active_runs_locked().map(Since::Whole);
            }
        }
        let mut delta = ActiveDelta { applied_changes: applied, content_changes: content, full: false, endpoints: Default::default() };
        let mut runs = Runs::default();
        for key in names {
            let name = parse_name(&key, "change log")?;
            let record = self.active_in(&mut runs, &name)?.ok_or_else(|| {
                corrupt(format!("change log names {name}, which has no active record"), codec::CodecError::Truncated { len: 0 })
            })?;
            delta.endpoints.insert(name, record);
        }
        Ok(Since::Delta(delta))
    }

    fn decide(&self, retain: u64) -> StoreResult<CleanupDecision> {
        let oldest = match self.fence_counts.first().map_err(io)? {
            None => None,
            Some((key, value)) => {
                let g = generation_key(&key)?;
                let mut count = FenceCount::decode(&value)?;
                if count.witness.is_empty() {
                    count.witness = self.serving_at(g)?.as_str().as_bytes().to_vec();
                    // For the next decision; nothing depends on it, so it is not flushed.
                    self.fence_counts.insert(key, count.encode()).map_err(io)?;
                }
                Some((g, parse_name(&count.witness, "fence count witness")?))
            }
        };
        Ok(decide_cleanup(self.horizon()?, self.latest()?, oldest, retain))
    }

    /// An endpoint serving with fence `generation`, found by a scan of `active_runs` (the cost of
    /// a fence count whose witness moved on).
    fn serving_at(&self, generation: Generation) -> StoreResult<EndpointName> {
        for run in self.active_runs.iter().values() {
            let run = codec::decode::<ActiveRun>(&run.map_err(io)?).map_err(|e| corrupt("active run", e))?;
            for (name, record) in run.records {
                if record.generation == generation && matches!(record.state, ActiveState::Serving(_)) {
                    return parse_name(name.as_bytes(), "active endpoint name");
                }
            }
        }
        Err(corrupt(
            format!("fence count of plan {generation}"),
            codec::CodecError::Body { kind: "fence count".into(), detail: "counts endpoints serving with it, but none does".into() },
        ))
    }

    fn cleanup_preview(&self, retain: u64) -> StoreResult<CleanupDecision> {
        let _guard = self.guard()?;
        self.decide(retain)
    }

    fn cleanup(&self, retain: u64) -> StoreResult<CleanupReport> {
        let _guard = self.guard()?;
        let decision = self.decide(retain)?;
        if decision.deleted_count() == 0 {
            return Ok(decision);
        }
        let control = self.meta_u64(META_CONTROL, 0)?.wrapping_add(1);
        let mut batch = sled::Batch::default();
        batch.insert(META_HORIZON, &decision.horizon_after.to_be_bytes());
        batch.insert(META_CONTROL, &control.to_be_bytes());
        self.meta.apply_batch(batch).map_err(io)?;
        self.flush()?;
        // Space only: what no stored plan resolves to. A crash before it leaves entries that
        // are never read; they go with a later scan.
        self.prune_contents(decision.horizon_before, decision.horizon_after)?;
        self.remove_plans_below(decision.horizon_after)?;
        self.flush()?;
        self.publish_version()?;
        Ok(decision)
    }

    fn set_pause(&self, state: Option<PauseState>) -> StoreResult<()> {
        let _guard = self.guard()?;
        let control = self.meta_u64(META_CONTROL, 0)?.wrapping_add(1);
        let mut batch = sled::Batch::default();
        match state {
            Some(state) => batch.insert(META_PAUSE, codec::encode(&state)),
            None => batch.remove(META_PAUSE),
        }
        batch.insert(META_CONTROL, &control.to_be_bytes());
        self.meta.apply_batch(batch).map_err(io)?;
        self.flush()?;
        self.publish_version()
    }

    fn heartbeat(&self, heartbeat: Heartbeat) -> StoreResult<()> {
        let _guard = self.guard()?;
        let key = heartbeat.enactor_id.as_bytes();
        if !self.heartbeats.contains_key(key).map_err(io)? && self.heartbeats.len() >= HEARTBEATS_MAX {
            return Err(StoreError::TooManyHeartbeats);
        }
        // Heartbeats are status, not state: they are not flushed on their own.
        self.heartbeats.insert(key, codec::encode(&heartbeat)).map_err(io)?;
        Ok(())
    }

    fn heartbeats(&self) -> StoreResult<Vec<Heartbeat>> {
        let _guard = self.guard()?;
        self.heartbeats
            .iter()
            .values()
            .map(|bytes| codec::decode::<Heartbeat>(&bytes.map_err(io)?).map_err(|e| corrupt("heartbeat", e)))
            .collect()
    }
}

impl SledStore {
    /// The parent's decode runs on a blocking thread; the comparison with `plan` on the
    /// caller's, like the plan's encoding.
    async fn changes_for(&self, plan: &ValidatedPlan) -> StoreResult<(Option<Vec<u8>>, ContentWrite)> {
        let changes = self.parent_changes(plan).await?;
        Ok(match changes {
            Some(changes) => (Some(codec::encode(&changes)), ContentWrite::changes(&changes)),
            None => (None, ContentWrite::whole(plan.plan())),
        })
    }

    async fn parent_changes(&self, plan: &ValidatedPlan) -> StoreResult<Option<PlanChanges>> {
        let parent = plan.plan().parent_generation;
        if parent == Generation::NONE {
            return Ok(None);
        }
        let parent = match self.blocking(move |inner| inner.plan(parent)).await {
            Ok(parent) => parent,
            // Without the parent there is nothing to compare with; followers read this plan
            // whole. A publish that will conflict also ends up here.
            Err(StoreError::PlanNotFound(_)) => return Ok(None),
            Err(err @ StoreError::Corrupt { .. }) => {
                tracing::error!(error = %err, "cannot read the parent plan; this plan's changes are not recorded and followers read it whole");
                return Ok(None);
            }
            Err(err) => return Err(err),
        };
        Ok(PlanChanges::between(parent.plan(), plan.plan()))
    }
}

impl SledStore {
    /// Writes plan `generation` whole on a thread of its own, off the publish path. The
    /// thread holds the store only while it works; a store dropped first skips it, and the
    /// next publish finds the checkpoint due again.
    fn spawn_checkpoint(&self, generation: Generation) {
        let weak = match self.current() {
            Ok(inner) => Arc::downgrade(&inner),
            Err(_) => return self.checkpoint_not_started(),
        };
        let spawned = std::thread::Builder::new().name("dnsplan-checkpoint".into()).spawn(move || {
            let Some(inner) = weak.upgrade() else { return };
            if let Err(err) = inner.write_checkpoint(generation) {
                tracing::warn!(error = %err, generation = generation.0, "could not write a plan whole; plans stay readable from their changes");
            }
        });
        if let Err(err) = spawned {
            tracing::warn!(error = %err, "could not start writing a plan whole; trying again after the next publish");
            self.checkpoint_not_started();
        }
    }

    fn checkpoint_not_started(&self) {
        if let Ok(inner) = self.current()
            && let Ok(mut chain) = inner.chain_state()
        {
            chain.writing = false;
        }
    }
}

impl Store for SledStore {
    async fn publish_changes(&self, delta: &PlanDelta, lease: Option<&Lease>) -> StoreResult<()> {
        delta.check()?;
        let (owned, lease_owned) = (delta.clone(), lease.cloned());
        match self.blocking(move |inner| inner.publish_changes(&owned, lease_owned.as_ref())).await? {
            None => super::publish_changes_whole(self, delta, lease).await,
            Some(checkpoint_due) => {
                if checkpoint_due {
                    self.spawn_checkpoint(delta.generation());
                }
                Ok(())
            }
        }
    }

    async fn publish(&self, plan: &ValidatedPlan) -> StoreResult<()> {
        let (changes, contents) = self.changes_for(plan).await?;
        let bytes = codec::encode_plan(plan);
        let summary = codec::encode(&plan.summary());
        let p = plan.plan();
        let (generation, parent, zone, is_operator) = (p.generation, p.parent_generation, p.dns_zone.clone(), p.author.is_operator());
        self.blocking(move |inner| inner.publish(generation, parent, &zone, is_operator, None, bytes, summary, changes, contents)).await
    }

    async fn publish_leased(&self, plan: &ValidatedPlan, lease: &Lease) -> StoreResult<()> {
        let (changes, contents) = self.changes_for(plan).await?;
        let bytes = codec::encode_plan(plan);
        let summary = codec::encode(&plan.summary());
        let p = plan.plan();
        let (generation, parent, zone, is_operator) = (p.generation, p.parent_generation, p.dns_zone.clone(), p.author.is_operator());
        let lease = lease.clone();
        self.blocking(move |inner| inner.publish(generation, parent, &zone, is_operator, Some(&lease), bytes, summary, changes, contents))
            .await
    }

    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> StoreResult<Lease> {
        let holder = holder.to_owned();
        self.blocking(move |inner| inner.acquire_lease(&holder, ttl)).await
    }

    async fn release_lease(&self, lease: &Lease) -> StoreResult<()> {
        let lease = lease.clone();
        self.blocking(move |inner| inner.release_lease(&lease)).await
    }

    async fn lease(&self) -> StoreResult<Option<Lease>> {
        self.blocking(|inner| {
            let _guard = inner.guard()?;
            inner.read_lease()
        })
        .await
    }

    async fn plan(&self, generation: Generation) -> StoreResult<ValidatedPlan> {
        self.blocking(move |inner| inner.plan(generation)).await
    }

    async fn plan_changes(&self, from: Generation, to: Generation) -> StoreResult<Option<PlanChanges>> {
        self.blocking(move |inner| inner.plan_changes(from, to)).await
    }

    async fn latest(&self) -> StoreResult<Generation> {
        Ok(self.shared.version.borrow().latest)
    }

    async fn dns_zone(&self) -> StoreResult<Option<DnsName>> {
        self.blocking(|inner| inner.dns_zone()).await
    }

    async fn history_mark(&self, applied: u64) -> StoreResult<Option<HistoryMark>> {
        self.blocking(move |inner| inner.history_mark(applied)).await
    }

    async fn list(&self, from: Generation, limit: usize) -> StoreResult<Vec<PlanSummary>> {
        self.blocking(move |inner| inner.list(from, limit)).await
    }

    async fn plan_envelope(&self, generation: Generation) -> StoreResult<Vec<u8>> {
        self.blocking(move |inner| match inner.plan_bytes(generation)? {
            PlanBytes::Whole(bytes) => Ok(bytes.to_vec()),
            PlanBytes::Chain { .. } => Ok(codec::encode_plan(&inner.plan(generation)?)),
        })
        .await
    }

    async fn apply(&self, endpoint: &EndpointName, generation: Generation, records: &Endpoint) -> StoreResult<ApplyOutcome> {
        let (name, state) = (endpoint.clone(), ActiveState::Serving(records.clone()));
        self.blocking(move |inner| inner.switch(&name, generation, state)).await
    }

    async fn apply_many(&self, generation: Generation, items: &[ApplyItem]) -> StoreResult<Vec<StoreResult<ApplyOutcome>>> {
        check_batch(items)?;
        let items: Vec<_> = items.iter().map(|i| (i.endpoint.clone(), ActiveState::Serving(i.records.clone()))).collect();
        self.blocking(move |inner| inner.switch_many(generation, items)).await
    }

    async fn retire(&self, endpoint: &EndpointName, generation: Generation) -> StoreResult<ApplyOutcome> {
        let name = endpoint.clone();
        self.blocking(move |inner| inner.switch(&name, generation, ActiveState::Retired)).await
    }

    async fn active(&self, endpoint: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        let name = endpoint.clone();
        self.blocking(move |inner| {
            let _guard = inner.guard()?;
            inner.read_active(&name)
        })
        .await
    }

    async fn active_all(&self) -> StoreResult<ActiveSnapshot> {
        self.blocking(|inner| inner.active_all()).await
    }

    async fn active_page(&self, after: Option<EndpointName>, limit: usize) -> StoreResult<ActivePage> {
        self.blocking(move |inner| inner.active_page(after.as_ref(), limit)).await
    }

    async fn active_since(&self, since: u64) -> StoreResult<ActiveDelta> {
        self.blocking(move |inner| inner.active_since(since)).await
    }

    async fn cleanup_preview(&self, retain: u64) -> StoreResult<CleanupDecision> {
        self.blocking(move |inner| inner.cleanup_preview(retain)).await
    }

    async fn cleanup(&self, retain: u64) -> StoreResult<CleanupReport> {
        self.blocking(move |inner| inner.cleanup(retain)).await
    }

    async fn pause(&self, state: PauseState) -> StoreResult<()> {
        check_len("pause reason", &state.reason, PAUSE_TEXT_BYTES_MAX)?;
        check_len("pause author", &state.by, PAUSE_TEXT_BYTES_MAX)?;
        self.blocking(move |inner| inner.set_pause(Some(state))).await
    }

    async fn resume(&self) -> StoreResult<()> {
        self.blocking(|inner| inner.set_pause(None)).await
    }

    async fn paused(&self) -> StoreResult<Option<PauseState>> {
        self.blocking(|inner| {
            let _guard = inner.guard()?;
            inner.paused()
        })
        .await
    }

    async fn heartbeat(&self, heartbeat: Heartbeat) -> StoreResult<()> {
        check_len("enactor id", &heartbeat.enactor_id, HEARTBEAT_TEXT_BYTES_MAX)?;
        check_len("enactor state", &heartbeat.state, HEARTBEAT_TEXT_BYTES_MAX)?;
        self.blocking(move |inner| inner.heartbeat(heartbeat)).await
    }

    async fn heartbeats(&self) -> StoreResult<Vec<Heartbeat>> {
        self.blocking(|inner| inner.heartbeats()).await
    }

    async fn version(&self) -> StoreResult<StoreVersion> {
        Ok(*self.shared.version.borrow())
    }

    /// Set by a failed write, cleared once a reopened database has written again.
    fn fault(&self) -> Option<StoreFault> {
        self.shared.fault.lock().ok()?.as_ref().map(|f| f.shown.clone())
    }

    fn disk_free_bytes(&self) -> Option<u64> {
        fs2::available_space(&self.shared.path).ok()
    }

    async fn wait_for_change(&self, seen: StoreVersion, timeout: Duration) -> StoreResult<StoreVersion> {
        let mut rx = self.shared.version.subscribe();
        let deadline = tokio::time::Instant::now() + timeout.min(WAIT_TIMEOUT_MAX);
        loop {
            let current = *rx.borrow_and_update();
            if current != seen {
                return Ok(current);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Err(_elapsed) => return Ok(current),
                // The sender lives as long as the store; a closed channel means it is gone.
                Ok(Err(_closed)) => return Err(StoreError::Unavailable("store closed".into())),
                Ok(Ok(())) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::ZoneId;
    use crate::plan::{Author, Plan, Target};
    use std::collections::{BTreeMap, BTreeSet};

    fn endpoint(last: u8) -> Endpoint {
        let zone = ZoneId::parse("a").expect("zone");
        Endpoint { ttl_secs: 30, targets: vec![Target { address: [192, 0, 2, last].into(), zone, weight: 1 }] }
    }

    fn items(labels: &[&str], last: u8) -> Vec<ApplyItem> {
        labels
            .iter()
            .map(|l| ApplyItem { endpoint: DnsName::parse(&format!("{l}.example.test.")).expect("name"), records: endpoint(last) })
            .collect()
    }

    async fn store_with_plans(dir: &Path, plans: u64) -> SledStore {
        let store = SledStore::open(dir).expect("open");
        for g in 1..=plans {
            let plan = Plan {
                generation: Generation(g),
                parent_generation: Generation(g - 1),
                created_at_unix_ms: 0,
                author: Author::Operator { name: "test".into() },
                reason: "test".into(),
                dns_zone: DnsName::parse("example.test.").expect("zone"),
                endpoints: items(&["a"], 1).into_iter().map(|i| (i.endpoint, i.records)).collect(),
                retired: BTreeSet::new(),
                rollback_of: None,
                provenance: Vec::new(),
            };
            store.publish(&ValidatedPlan::new(plan).expect("valid")).await.expect("publish");
        }
        store
    }

    /// Plan `g` (parent `g - 1`) serving `count` endpoints `e0..`, each with records `last`.
    fn uniform_plan(g: u64, count: usize, last: u8) -> ValidatedPlan {
        let labels: Vec<String> = (0..count).map(|i| format!("e{i}")).collect();
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        ValidatedPlan::new(Plan {
            generation: Generation(g),
            parent_generation: Generation(g - 1),
            created_at_unix_ms: 0,
            author: Author::Operator { name: "test".into() },
            reason: "test".into(),
            dns_zone: DnsName::parse("example.test.").expect("zone"),
            endpoints: items(&labels, last).into_iter().map(|i| (i.endpoint, i.records)).collect(),
            retired: BTreeSet::new(),
            rollback_of: None,
            provenance: Vec::new(),
        })
        .expect("valid")
    }

    /// The names plan `generation`'s own content entries and chunks hold.
    fn contents_of(store: &SledStore, generation: Generation) -> usize {
        let entries = store
            .inner()
            .contents
            .iter()
            .keys()
            .filter(|k| content_generation(k.as_ref().expect("key")).expect("generation") == generation)
            .count();
        let chunked: usize = store
            .inner()
            .contents_chunks
            .scan_prefix(generation.to_be_bytes())
            .values()
            .map(|chunk| codec::decode::<ContentChunk>(&chunk.expect("chunk")).expect("decodes").entries.len())
            .sum();
        entries + chunked
    }

    /// A history mark names the store (an id kept across opens, another for another store)
    /// and the endpoint of the change at that count; none past the store's count.
    #[tokio::test]
    async fn history_marks_name_the_store_and_the_change() {
        let (one, two) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
        let first = {
            let store = store_serving_abcd(one.path(), 1).await;
            assert_eq!(store.apply_many(Generation(1), &items(&["a", "b", "c"], 1)).await.expect("apply").len(), 3);
            assert_eq!(store.apply_many(Generation(1), &items(&["d"], 1)).await.expect("apply").len(), 1);
            // Every count names its own switch, inside a batch of three or alone.
            for (count, label) in [(1, "a"), (2, "b"), (3, "c"), (4, "d")] {
                let mark = store.history_mark(count).await.expect("mark").expect("a mark");
                assert_eq!(mark.change, Some(DnsName::parse(&format!("{label}.example.test.")).expect("name")), "change {count}");
            }
            let mark = store.history_mark(1).await.expect("mark").expect("a mark at 1");
            let zero = store.history_mark(0).await.expect("mark").expect("a mark at 0");
            assert_eq!((zero.store_id, zero.change), (mark.store_id, None));
            assert_eq!(store.history_mark(5).await.expect("mark"), None, "a mark past the store's count");
            mark
        };
        let reopened = SledStore::open(one.path()).expect("open");
        assert_eq!(reopened.history_mark(1).await.expect("mark"), Some(first.clone()), "the id is kept across opens");
        let other = store_serving_abcd(two.path(), 1).await;
        other.apply_many(Generation(1), &items(&["a"], 1)).await.expect("apply");
        let mark = other.history_mark(1).await.expect("mark").expect("a mark");
        assert_ne!(mark.store_id, first.store_id, "two stores drew the same id");
    }

    /// A large plan's contents go in batches ahead of its transaction. A publish that wrote
    /// them and then did not commit (a crash, here: the store dropped right after) leaves
    /// entries for a generation no plan has; the store removes them when it opens, so the
    /// plan that does take that generation is checked against its own content only.
    #[tokio::test]
    async fn contents_of_a_publish_that_did_not_commit_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wide = CONTENTS_IN_TXN_MAX + 500;
        {
            let store = store_with_plans(dir.path(), 1).await;
            // A large publish commits with its contents written ahead, and leaves no mark.
            store.publish(&uniform_plan(2, wide, 7)).await.expect("publish");
            // Its changes against plan 1: every `e` served, and `a` left out.
            assert_eq!(contents_of(&store, Generation(2)), wide + 1);
            assert!(store.inner().meta.get(META_CONTENTS_PENDING).expect("meta").is_none());
            // The next one writes its contents and dies before its transaction.
            let orphan = uniform_plan(3, wide, 9);
            let inner = store.inner();
            let _guard = inner.guard().expect("lock");
            inner.write_contents_ahead(Generation(3), &ContentWrite::whole(orphan.plan())).expect("write ahead");
            assert_eq!(contents_of(&store, Generation(3)), wide);
        }
        let store = SledStore::open(dir.path()).expect("reopen");
        assert_eq!(contents_of(&store, Generation(3)), 0, "the entries of the publish that did not commit survived the reopen");
        assert!(store.inner().meta.get(META_CONTENTS_PENDING).expect("meta").is_none());
        // Plan 3 is now another one: plan 2 with `e0` changed, so it writes an entry for `e0`
        // alone. The dead publish's records for `e1` are refused at plan 3 (its entry would
        // have been found first), plan 3's own are taken.
        let mut plan = uniform_plan(3, wide, 7).into_plan();
        plan.endpoints.insert(items(&["e0"], 1)[0].endpoint.clone(), endpoint(11));
        store.publish(&ValidatedPlan::new(plan).expect("valid")).await.expect("publish plan 3");
        assert_eq!(contents_of(&store, Generation(3)), 1);
        let refused = store.apply(&items(&["e1"], 9)[0].endpoint, Generation(3), &endpoint(9)).await;
        assert!(matches!(refused, Err(StoreError::ContentMismatch { .. })), "{refused:?}");
        store.apply(&items(&["e0"], 11)[0].endpoint, Generation(3), &endpoint(11)).await.expect("plan 3's own content");
        store.apply(&items(&["e1"], 7)[0].endpoint, Generation(3), &endpoint(7)).await.expect("plan 3's content, as plan 2's");
    }

    /// Plan `g` serving `a` with records that change every plan, `b` with the same records
    /// throughout, and `c` on even plans only.
    fn churning_plan(g: u64) -> ValidatedPlan {
        let mut endpoints: std::collections::BTreeMap<_, _> =
            [(items(&["a"], 1)[0].endpoint.clone(), endpoint((g % 250) as u8 + 1)), (items(&["b"], 1)[0].endpoint.clone(), endpoint(1))]
                .into();
        if g.is_multiple_of(2) {
            endpoints.insert(items(&["c"], 1)[0].endpoint.clone(), endpoint(2));
        }
        ValidatedPlan::new(Plan {
            generation: Generation(g),
            parent_generation: Generation(g - 1),
            created_at_unix_ms: 0,
            author: Author::Operator { name: "test".into() },
            reason: "test".into(),
            dns_zone: DnsName::parse("example.test.").expect("zone"),
            endpoints,
            retired: BTreeSet::new(),
            rollback_of: None,
            provenance: Vec::new(),
        })
        .expect("valid")
    }

    async fn apply_plan(store: &SledStore, g: u64) {
        let plan = churning_plan(g);
        let batch: Vec<_> = plan.plan().endpoints.iter().map(|(n, r)| ApplyItem { endpoint: n.clone(), records: r.clone() }).collect();
        for result in store.apply_many(Generation(g), &batch).await.expect("batch") {
            result.expect("each endpoint carries its plan's records");
        }
    }

    /// A store written before the content-change count has no `content_changes` key: it
    /// reads as the applied count (where the SOA serial was), so the serial goes on from
    /// there, and the next switch writes it.
    #[tokio::test]
    async fn a_store_without_a_content_count_goes_on_from_its_applied_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path()).expect("open");
        for g in 1..=2 {
            store.publish(&churning_plan(g)).await.expect("publish");
            apply_plan(&store, g).await;
        }
        store.inner().meta.remove(META_CONTENT).expect("remove");
        store.inner().flush().expect("flush");
        drop(store);
        let store = SledStore::open(dir.path()).expect("reopen");
        let old = store.active_all().await.expect("active");
        assert_eq!(old.content_changes, old.applied_changes, "no content count reads as the applied count");
        store.publish(&churning_plan(3)).await.expect("publish");
        apply_plan(&store, 3).await;
        let now = store.active_all().await.expect("active");
        // Plan 3 moves a's records, keeps b's and drops c (not retired: still served).
        assert_eq!((now.applied_changes, now.content_changes), (old.applied_changes + 2, old.content_changes + 1));
        assert!(store.inner().meta.get(META_CONTENT).expect("meta").is_some(), "the switch wrote the content count");
    }

    /// Cleanup prunes what no stored plan resolves to: with 300 plans, an endpoint that
    /// changes on every plan, one that never does and one that comes and goes, the content
    /// entries stay a few per endpoint, and every endpoint still resolves.
    #[tokio::test]
    async fn plan_contents_stay_bounded_through_cleanup() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path()).expect("open");
        for g in 1..=300 {
            store.publish(&churning_plan(g)).await.expect("publish");
            apply_plan(&store, g).await;
            store.cleanup(3).await.expect("cleanup");
            let entries = store.inner().contents.len();
            assert!(entries <= 3 * 4 + 3, "plan {g}: {entries} content entries for 3 endpoints and 3 plans kept");
            assert!(store.inner().contents_chunks.len() <= 1, "plan {g}: chunks of whole contents older than the horizon's are kept");
        }
        let c = items(&["c"], 1)[0].endpoint.clone();
        let r = store.apply(&c, Generation(299), &endpoint(2)).await;
        assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::NothingOf, .. })), "c is not in odd plans: {r:?}");
        assert!(store.inner().contents_full.len() <= 1, "markers older than the horizon go");
    }

    /// A store written before plan contents were recorded gets them on open, and an open
    /// interrupted while writing them writes them again.
    #[tokio::test]
    async fn plan_contents_are_written_for_an_older_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path()).expect("open");
        for g in 1..=6 {
            store.publish(&churning_plan(g)).await.expect("publish");
        }
        store.inner().contents.clear().expect("clear");
        store.inner().contents.insert(b"half-written", &[]).expect("insert");
        store.inner().meta.remove(META_CONTENTS).expect("remove");
        store.inner().flush().expect("flush");
        drop(store);
        let store = SledStore::open(dir.path()).expect("reopen");
        apply_plan(&store, 5).await;
        let b = items(&["b"], 1)[0].endpoint.clone();
        let r = store.apply(&b, Generation(6), &endpoint(2)).await;
        assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::OtherRecords, .. })), "{r:?}");
        assert!(!store.inner().contents.contains_key(b"half-written").expect("read"));
    }

    /// A store with plans 1..=`plans`, plan `g` serving a, b, c and d with `endpoint(g)`.
    async fn store_serving_abcd(dir: &Path, plans: u8) -> SledStore {
        let store = SledStore::open(dir).expect("open");
        for g in 1..=plans {
            let mut plan = churning_plan(u64::from(g)).into_plan();
            plan.endpoints = items(&["a", "b", "c", "d"], g).into_iter().map(|i| (i.endpoint, i.records)).collect();
            store.publish(&ValidatedPlan::new(plan).expect("valid")).await.expect("publish");
        }
        store
    }

    #[tokio::test]
    async fn a_delta_names_only_what_switched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store_serving_abcd(dir.path(), 2).await;
        store.apply_many(Generation(1), &items(&["a", "b", "c", "d"], 1)).await.expect("batch");
        let seen = store.version().await.expect("version").applied_changes;
        store.apply_many(Generation(2), &items(&["b", "d"], 2)).await.expect("batch");
        let delta = store.active_since(seen).await.expect("delta");
        assert!(!delta.full, "the log reaches back: want a delta");
        let names: Vec<_> = delta.endpoints.keys().map(|n| n.as_str().to_owned()).collect();
        assert_eq!(names, ["b.example.test.", "d.example.test."]);
        assert_eq!(delta.applied_changes, seen + 2);
    }

    #[tokio::test]
    async fn a_follower_behind_the_log_gets_the_whole_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store_serving_abcd(dir.path(), 2).await;
        store.apply_many(Generation(1), &items(&["a"], 1)).await.expect("batch");
        store.apply_many(Generation(1), &items(&["b"], 1)).await.expect("batch");
        store.apply_many(Generation(2), &items(&["b"], 2)).await.expect("batch");
        // A store written before the log existed, or a log trimmed past the follower.
        store.inner().changes.remove(1u64.to_be_bytes()).expect("remove");
        let delta = store.active_since(0).await.expect("delta");
        assert!(delta.full, "the log misses change 1: want the whole state");
        assert_eq!(delta.endpoints.len(), 2);
        let delta = store.active_since(1).await.expect("delta");
        assert!(!delta.full, "changes 2 and 3 are in the log");
        assert_eq!(delta.endpoints.keys().map(|n| n.as_str()).collect::<Vec<_>>(), ["b.example.test."]);
    }

    /// Plan changes are recorded at publish and answered from the records while they reach
    /// back; a gap in them, a cleaned-up range or a too-long gap makes the follower read the
    /// plan whole, and the reopened store still has them.
    #[tokio::test]
    async fn plan_changes_come_from_records_kept_with_the_plans() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store_with_plans(dir.path(), 4).await;
        let changes = store.plan_changes(Generation(1), Generation(4)).await.expect("changes");
        let changes = changes.expect("plans 2..=4 have recorded changes");
        assert!(changes.changes.is_empty(), "the fixture plans are all alike: {changes:?}");
        assert_eq!(changes.endpoint_count, 1);
        drop(store);
        let store = SledStore::open(dir.path()).expect("reopen");
        assert!(store.plan_changes(Generation(2), Generation(4)).await.expect("changes").is_some());
        // A plan without a record (the first plan has no parent; an older store kept none).
        store.inner().plan_changes.remove(3u64.to_be_bytes()).expect("remove");
        assert_eq!(store.plan_changes(Generation(1), Generation(4)).await.expect("changes"), None);
        assert!(store.plan_changes(Generation(3), Generation(4)).await.expect("changes").is_some());
        assert!(store.plan_changes(Generation(0), Generation(2)).await.expect("changes").is_none(), "plan 1 has no parent");
        assert!(matches!(store.plan_changes(Generation(1), Generation(9)).await, Err(StoreError::PlanNotFound(_))));
        let far = store_with_plans(tempfile::tempdir().expect("tempdir").path(), PLAN_CHANGES_GAP_MAX + 2).await;
        assert!(far.plan_changes(Generation(1), Generation(PLAN_CHANGES_GAP_MAX + 1)).await.expect("changes").is_some());
        assert!(far.plan_changes(Generation(1), Generation(PLAN_CHANGES_GAP_MAX + 2)).await.expect("changes").is_none(), "gap too long");
        // Cleanup removes the records with the plans.
        far.apply(&items(&["a"], 1)[0].endpoint, Generation(PLAN_CHANGES_GAP_MAX + 2), &endpoint(1)).await.expect("apply");
        far.cleanup(2).await.expect("cleanup");
        assert!(matches!(far.plan_changes(Generation(1), Generation(3)).await, Err(StoreError::PlanNotFound(_))));
        // Plan 65's record, its changes against the deleted plan 64, stays with plan 65.
        assert!(far.plan_changes(Generation(PLAN_CHANGES_GAP_MAX), Generation(PLAN_CHANGES_GAP_MAX + 2)).await.expect("changes").is_some());
        assert_eq!(
            far.plan_changes(Generation(PLAN_CHANGES_GAP_MAX - 1), Generation(PLAN_CHANGES_GAP_MAX + 2)).await.expect("changes"),
            None
        );
        assert_eq!(far.inner().plan_changes.len(), 2, "records below the horizon are gone");
    }

    /// Plan `g` serving `count` endpoints, endpoint `g % count` with records of its own.
    fn wide_plan(g: u64, count: usize) -> ValidatedPlan {
        let mut endpoints: std::collections::BTreeMap<_, _> =
            (0..count).map(|i| (DnsName::parse(&format!("e{i}.example.test.")).expect("name"), endpoint(1))).collect();
        if g > 1 {
            let changed = DnsName::parse(&format!("e{}.example.test.", g as usize % count)).expect("name");
            endpoints.insert(changed, endpoint((g % 250) as u8 + 2));
        }
        ValidatedPlan::new(Plan {
            generation: Generation(g),
            parent_generation: Generation(g - 1),
            created_at_unix_ms: g,
            author: Author::Planner { id: "p".into() },
            reason: format!("plan {g}"),
            dns_zone: DnsName::parse("example.test.").expect("zone"),
            endpoints,
            retired: BTreeSet::new(),
            rollback_of: None,
            provenance: Vec::new(),
        })
        .expect("valid")
    }

    fn whole_plans(store: &SledStore) -> Vec<u64> {
        store.inner().plans.iter().keys().map(|k| generation_key(&k.expect("key")).expect("key").0).collect()
    }

    /// Waits until the checkpoint thread is done (it clears `writing`), with a deadline.
    fn wait_checkpoint_done(store: &SledStore) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while store.inner().chain_state().expect("chain").writing {
            assert!(std::time::Instant::now() < deadline, "the checkpoint did not finish");
            std::thread::yield_now();
        }
    }

    /// A one-endpoint change to a 1,000-endpoint plan published as changes writes no whole
    /// plan: the plan is its head and its change, and reads back whole.
    #[tokio::test]
    async fn a_small_change_is_stored_as_its_change() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path()).expect("open");
        let first = wide_plan(1, 1_000);
        store.publish(&first).await.expect("publish");
        let mut previous = first;
        for g in 2..=20 {
            let next = wide_plan(g, 1_000);
            let delta = PlanDelta::between(previous.plan(), &next).expect("delta");
            assert_eq!(delta.changes.len(), if g == 2 { 1 } else { 2 }, "plan {g} changes what it should");
            store.publish_changes(&delta, None).await.expect("publish changes");
            assert_eq!(store.plan(Generation(g)).await.expect("read"), next);
            previous = next;
        }
        assert_eq!(whole_plans(&store), [1], "no plan was written whole");
        let chain = *store.inner().chain_state().expect("chain");
        assert_eq!(chain.plans, 19);
        assert!(chain.change_bytes * 2 < chain.base_bytes, "{chain:?}");
        // Read back the same after a restart.
        drop(store);
        let store = SledStore::open(dir.path()).expect("reopen");
        assert_eq!(store.plan(Generation(20)).await.expect("read"), previous);
        assert_eq!(store.inner().chain_state().expect("chain").plans, 19, "the chain is counted again on open");
    }

    /// Once the changes since the last whole plan add up to half of it, the plan is written
    /// whole off the publish path; cleanup keeps the bytes from the newest whole plan at or
    /// below its horizon, and every plan from the horizon on still reads back.
    #[tokio::test]
    async fn checkpoints_bound_the_chain_and_cleanup_keeps_what_reads_need() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path()).expect("open");
        let mut plans = vec![wide_plan(1, 20)];
        store.publish(&plans[0]).await.expect("publish");
        for g in 2..=120 {
            let next = wide_plan(g, 20);
            let delta = PlanDelta::between(plans.last().expect("plan").plan(), &next).expect("delta");
            store.publish_changes(&delta, None).await.expect("publish changes");
            wait_checkpoint_done(&store);
            plans.push(next);
        }
        let whole = whole_plans(&store);
        assert!(whole.len() > 10, "checkpoints written: {whole:?}");
        let chain = *store.inner().chain_state().expect("chain");
        assert!(chain.change_bytes * 2 < chain.base_bytes + 2_000, "{chain:?}");
        for p in &plans {
            assert_eq!(&store.plan(p.generation()).await.expect("read"), p);
        }
        let report = store.cleanup(10).await.expect("cleanup");
        let horizon = report.horizon_after;
        assert_eq!(horizon, Generation(111));
        let base = *whole.iter().filter(|g| **g <= horizon.0).max().expect("a whole plan below the horizon");
        assert_eq!(whole_plans(&store).first(), Some(&base), "bytes kept from the newest whole plan at or below the horizon");
        let oldest_head = store.inner().plan_heads.iter().keys().next().map(|k| generation_key(&k.expect("key")).expect("key").0);
        assert!(oldest_head.is_none_or(|g| g >= base), "heads kept from {oldest_head:?}, whole plan {base}");
        for p in &plans {
            match store.plan(p.generation()).await {
                Ok(read) => assert!(p.generation() >= horizon && &read == p),
                Err(StoreError::PlanNotFound(_)) => assert!(p.generation() < horizon),
                Err(err) => panic!("plan {}: {err}", p.generation()),
            }
        }
        drop(store);
        let store = SledStore::open(dir.path()).expect("reopen");
        assert_eq!(&store.plan(Generation(120)).await.expect("read"), plans.last().expect("plan"));
    }

    /// The fence counts as the active records give them: generation → serving endpoints.
    fn recount(store: &SledStore) -> BTreeMap<Generation, u64> {
        let mut counts = BTreeMap::new();
        for (_, record) in store.inner().active_all_locked().expect("active").endpoints {
            if matches!(record.state, ActiveState::Serving(_)) {
                *counts.entry(record.generation).or_default() += 1;
            }
        }
        counts
    }

    fn stored_counts(store: &SledStore) -> BTreeMap<Generation, u64> {
        store
            .inner()
            .fence_counts
            .iter()
            .map(|entry| {
                let (key, value) = entry.expect("entry");
                (generation_key(&key).expect("key"), FenceCount::decode(&value).expect("count").count)
            })
            .collect()
    }

    /// Each batch keeps the fence counts equal to a recount of the active records, through
    /// applies, retires and stale writes; cleanup's oldest active generation is the first
    /// count, and the endpoint it names serves with that fence, also after the endpoint the
    /// count last named moved on.
    #[tokio::test]
    async fn fence_counts_follow_every_switch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path()).expect("open");
        let labels: Vec<String> = (0..12).map(|i| format!("e{i}")).collect();
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        for g in 1..=6u64 {
            let mut plan = uniform_plan(g, 12, g as u8).into_plan();
            // Plan 3 retires e0..e3; the others serve them again.
            if g == 3 {
                for label in &labels[..4] {
                    let name = DnsName::parse(&format!("{label}.example.test.")).expect("name");
                    plan.endpoints.remove(&name);
                    plan.retired.insert(name);
                }
            }
            store.publish(&ValidatedPlan::new(plan).expect("valid")).await.expect("publish");
        }
        // (plan, endpoints applied in one batch): a plan applied in parts, with some endpoints
        // left behind on older plans, and one stale batch.
        let steps: [(u64, &[&str]); 8] = [
            (1, &labels[..]),
            (2, &labels[..6]),
            (3, &labels[..8]),
            (2, &labels[6..]),
            (5, &labels[2..5]),
            (4, &labels[9..]),
            (1, &labels[..3]),
            (6, &labels[..1]),
        ];
        for (g, batch) in steps {
            let plan = store.plan(Generation(g)).await.expect("plan").into_plan();
            let items: Vec<ApplyItem> = batch
                .iter()
                .map(|l| DnsName::parse(&format!("{l}.example.test.")).expect("name"))
                .map(|name| match plan.endpoints.get(&name) {
                    Some(records) => ApplyItem { endpoint: name, records: records.clone() },
                    None => ApplyItem { endpoint: name, records: Endpoint { ttl_secs: 0, targets: vec![] } },
                })
                .collect();
            if g == 3 {
                for item in &items[..4] {
                    store.retire(&item.endpoint, Generation(g)).await.expect("retire");
                }
                store.apply_many(Generation(g), &items[4..]).await.expect("batch");
            } else {
                store.apply_many(Generation(g), &items).await.expect("batch");
            }
            assert_eq!(stored_counts(&store), recount(&store), "after plan {g}'s batch {batch:?}");
            let decision = store.cleanup_preview(1).await.expect("preview");
            let (oldest, name) = decision.oldest_active.expect("something serves");
            assert_eq!(Some(&oldest), recount(&store).keys().next(), "after plan {g}'s batch");
            let record = store.active(&name).await.expect("active").expect("a record");
            assert_eq!(record.generation, oldest, "the named endpoint serves with the oldest fence");
            assert!(matches!(record.state, ActiveState::Serving(_)));
        }
        let reopened = {
            drop(store);
            SledStore::open(dir.path()).expect("reopen")
        };
        assert_eq!(stored_counts(&reopened), recount(&reopened), "after a reopen");
    }

    /// A store written with the `fences` index gets its counts from it when opened, and the
    /// index is dropped.
    #[tokio::test]
    async fn a_store_with_a_fence_index_is_counted_at_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store_serving_abcd(dir.path(), 2).await;
        store.apply_many(Generation(1), &items(&["a", "b", "c", "d"], 1)).await.expect("batch");
        store.apply_many(Generation(2), &items(&["b", "d"], 2)).await.expect("batch");
        let want = recount(&store);
        assert_eq!(want, BTreeMap::from([(Generation(1), 2), (Generation(2), 2)]));
        // Back to the older layout: the index, no counts, no layout mark.
        let fences = store.inner().db.open_tree(LEGACY_FENCES).expect("tree");
        for (name, record) in store.inner().active_all_locked().expect("active").endpoints {
            let mut key = record.generation.to_be_bytes().to_vec();
            key.extend_from_slice(name.as_str().as_bytes());
            fences.insert(key, &[]).expect("insert");
        }
        store.inner().fence_counts.clear().expect("clear");
        store.inner().meta.remove(META_LAYOUT).expect("remove");
        store.inner().flush().expect("flush");
        drop((fences, store));
        let store = SledStore::open(dir.path()).expect("reopen");
        assert_eq!(stored_counts(&store), want);
        assert!(!store.inner().db.tree_names().iter().any(|n| n.as_ref() == LEGACY_FENCES.as_bytes()), "the index is dropped");
        let (oldest, name) = store.cleanup_preview(1).await.expect("preview").oldest_active.expect("oldest");
        assert_eq!(oldest, Generation(1));
        assert!(["a.example.test.", "c.example.test."].contains(&name.as_str()), "{name} is not on plan 1");
    }

    /// A whole plan's content is in chunks: each of its names is checked against its own
    /// entry in whichever chunk holds it, a later plan's entries take precedence, and a later
    /// plan that leaves a name out still does so after cleanup (the chunk below would answer
    /// for the name otherwise).
    #[tokio::test]
    async fn whole_contents_are_chunked_and_later_plans_take_precedence() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path()).expect("open");
        let wide = CONTENT_CHUNK_NAMES * 2 + 50;
        let mut one = uniform_plan(1, wide, 1).into_plan();
        let gone = items(&["zz-retired"], 1)[0].endpoint.clone();
        one.retired.insert(gone.clone());
        store.publish(&ValidatedPlan::new(one).expect("valid")).await.expect("publish");
        assert_eq!(store.inner().contents_chunks.len(), 3, "{wide} names and one retired in chunks of {CONTENT_CHUNK_NAMES}");
        assert_eq!(contents_of(&store, Generation(1)), wide + 1);
        let name = |i: usize| items(&[&format!("e{i}")], 1)[0].endpoint.clone();
        for i in [0, 1, 99, 255, 256, 511, wide - 1] {
            store.apply(&name(i), Generation(1), &endpoint(1)).await.unwrap_or_else(|e| panic!("e{i}: {e}"));
            let r = store.apply(&name(i), Generation(1), &endpoint(2)).await;
            assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::OtherRecords, .. })), "e{i}: {r:?}");
        }
        let r = store.apply(&name(wide), Generation(1), &endpoint(1)).await;
        assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::NothingOf, .. })), "{r:?}");
        let r = store.apply(&gone, Generation(1), &endpoint(1)).await;
        assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::Retires, .. })), "{r:?}");
        store.retire(&gone, Generation(1)).await.expect("retire as plan 1 says");
        // Plan 2: e5 changes, e7 is left out; both recorded as entries of plan 2.
        let mut two = uniform_plan(2, wide, 1).into_plan();
        two.endpoints.insert(name(5), endpoint(9));
        two.endpoints.remove(&name(7));
        two.retired.insert(gone.clone());
        store.publish(&ValidatedPlan::new(two).expect("valid")).await.expect("publish");
        assert_eq!(store.inner().contents_chunks.len(), 3, "plan 2 is stored as its change");
        // Everything applied at plan 1 moves to plan 2, so cleanup can delete plan 1.
        let mut batch: Vec<ApplyItem> = [0, 1, 5, 6, 99, 255, 256, 511, wide - 1]
            .into_iter()
            .map(|i| ApplyItem { endpoint: name(i), records: endpoint(if i == 5 { 9 } else { 1 }) })
            .collect();
        batch.sort_by(|a, b| a.endpoint.as_str().cmp(b.endpoint.as_str()));
        for result in store.apply_many(Generation(2), &batch).await.expect("batch") {
            result.expect("plan 2's content");
        }
        for (g, cleanup) in [(2, false), (2, true)] {
            if cleanup {
                let report = store.cleanup(1).await.expect("cleanup");
                assert_eq!(report.horizon_after, Generation(2));
            }
            let r = store.apply(&name(7), Generation(g), &endpoint(1)).await;
            assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::NothingOf, .. })), "cleanup {cleanup}: {r:?}");
            let r = store.apply(&name(5), Generation(g), &endpoint(1)).await;
            assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::OtherRecords, .. })), "cleanup {cleanup}: {r:?}");
        }
        // A whole plan later: the older chunks go with cleanup.
        store.publish(&uniform_plan(3, 10, 3)).await.expect("publish");
        assert_eq!(store.inner().contents_chunks.len(), 3, "plan 3 is stored as its change");
        let mut big = uniform_plan(4, wide + 300, 4).into_plan();
        big.endpoints.extend((0..70_000).map(|i| (items(&[&format!("w{i}")], 4)[0].endpoint.clone(), endpoint(4))));
        store.publish(&ValidatedPlan::new(big).expect("valid")).await.expect("publish a change too large to record");
        let whole: Vec<u64> = store.inner().contents_full.iter().keys().map(|k| generation_key(&k.expect("key")).expect("g").0).collect();
        assert_eq!(whole, [1, 4]);
        for item in &mut batch {
            item.records = endpoint(4);
        }
        for result in store.apply_many(Generation(4), &batch).await.expect("batch") {
            result.expect("plan 4's content");
        }
        assert_eq!(store.cleanup(1).await.expect("cleanup").horizon_after, Generation(4));
        assert!(store.inner().contents_chunks.scan_prefix(Generation(1).to_be_bytes()).next().is_none(), "plan 1's chunks are gone");
        assert_eq!(contents_of(&store, Generation(4)), wide + 300 + 70_000);
    }

    /// The control API sends a plan stored whole as its stored envelope, and a plan stored as
    /// changes encoded from the plan read: both decode to the plan published.
    #[tokio::test]
    async fn plan_envelopes_decode_to_the_plans_published() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path()).expect("open");
        let one = uniform_plan(1, 300, 1);
        let mut two = uniform_plan(2, 300, 1).into_plan();
        let first = two.endpoints.keys().next().expect("an endpoint").clone();
        two.endpoints.insert(first, endpoint(2));
        let two = ValidatedPlan::new(two).expect("valid");
        store.publish(&one).await.expect("publish 1");
        crate::store::publish_against(&store, Some(one.plan()), &two, None).await.expect("publish 2 as its changes");
        assert!(store.inner().plans.get(Generation(2).to_be_bytes()).expect("read").is_none(), "plan 2 is stored as its changes");
        for plan in [&one, &two] {
            let g = plan.generation();
            let envelope = store.plan_envelope(g).await.expect("envelope");
            assert_eq!(codec::decode_plan(&envelope).expect("decodes").plan(), plan.plan(), "plan {g}");
        }
        let stored = store.inner().plans.get(Generation(1).to_be_bytes()).expect("read").expect("plan 1 is stored whole");
        assert_eq!(store.plan_envelope(Generation(1)).await.expect("envelope"), stored.to_vec(), "sent as stored");
        let r = store.plan_envelope(Generation(3)).await;
        assert!(matches!(r, Err(StoreError::PlanNotFound(_))), "{r:?}");
    }

    /// A whole content written before chunks (an entry per name at the plan's own generation,
    /// no chunks) is still read name by name: a plan read from chunks alone skips the
    /// per-name lookup, and that must not apply to it.
    #[tokio::test]
    async fn a_whole_content_written_before_chunks_is_read_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path()).expect("open");
        let plan = uniform_plan(1, 20, 1);
        store.publish(&plan).await.expect("publish");
        // As an older dnsplan wrote it: the chunks become entries at generation 1.
        let chunks: Vec<sled::IVec> = store.inner().contents_chunks.iter().keys().map(|k| k.expect("key")).collect();
        assert!(!chunks.is_empty(), "plan 1 is written in chunks");
        for key in chunks {
            store.inner().contents_chunks.remove(key).expect("remove chunk");
        }
        for (name, records) in &plan.plan().endpoints {
            let entry = codec::encode(&PlanEntry::Serve(records.clone()));
            store.inner().contents.insert(content_key(name, Generation(1)), entry).expect("insert entry");
        }
        let batch: Vec<ApplyItem> =
            plan.plan().endpoints.iter().map(|(name, records)| ApplyItem { endpoint: name.clone(), records: records.clone() }).collect();
        for result in store.apply_many(Generation(1), &batch).await.expect("batch") {
            assert!(matches!(result, Ok(ApplyOutcome::Switched { .. })), "{result:?}");
        }
        let other = ApplyItem { endpoint: batch[0].endpoint.clone(), records: endpoint(2) };
        let r = store.apply(&other.endpoint, Generation(1), &other.records).await;
        assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::OtherRecords, .. })), "{r:?}");
    }

    /// Every run as stored: its key and its names.
    fn stored_runs(store: &SledStore) -> Vec<(Vec<u8>, Vec<String>)> {
        store
            .inner()
            .active_runs
            .iter()
            .map(|entry| {
                let (key, value) = entry.expect("entry");
                let run = codec::decode::<ActiveRun>(&value).expect("run");
                (key.to_vec(), run.records.into_iter().map(|(name, _)| name.into_string()).collect())
            })
            .collect()
    }

    /// Endpoints applied in batches of scattered names land in runs that stay in name order,
    /// within `ACTIVE_RUN_MAX`, each keyed by its first name (the first by a 0 byte); every
    /// read (one name, a page walk, the whole state, a delta) gives each endpoint its own
    /// record.
    #[tokio::test]
    async fn active_runs_split_in_name_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path()).expect("open");
        let count = ACTIVE_RUN_MAX * 5 + 17;
        store.publish(&uniform_plan(1, count, 1)).await.expect("publish");
        store.publish(&uniform_plan(2, count, 2)).await.expect("publish");
        // A fixed shuffle: an enactor's batches are in name order, a retry's or another
        // enactor's need not be.
        let mut order: Vec<usize> = (0..count).collect();
        let mut x = 7u64;
        for i in (1..order.len()).rev() {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            order.swap(i, (x >> 33) as usize % (i + 1));
        }
        let name = |i: usize| items(&[&format!("e{i}")], 1)[0].endpoint.clone();
        for batch in order.chunks(100) {
            let mut items: Vec<ApplyItem> = batch.iter().map(|&i| ApplyItem { endpoint: name(i), records: endpoint(1) }).collect();
            items.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
            for result in store.apply_many(Generation(1), &items).await.expect("batch") {
                result.expect("plan 1's content");
            }
        }
        let seen = store.version().await.expect("version").applied_changes;
        // Plan 2 on every third endpoint, scattered through the runs.
        let moved: Vec<ApplyItem> = (0..count).step_by(3).map(|i| ApplyItem { endpoint: name(i), records: endpoint(2) }).collect();
        let mut moved_sorted = moved.clone();
        moved_sorted.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
        for batch in moved_sorted.chunks(crate::store::APPLY_BATCH_MAX) {
            for result in store.apply_many(Generation(2), batch).await.expect("batch") {
                result.expect("plan 2's content");
            }
        }
        let runs = stored_runs(&store);
        assert!(runs.len() >= count.div_ceil(ACTIVE_RUN_MAX), "{} runs for {count} endpoints", runs.len());
        assert_eq!(runs[0].0, FIRST_RUN);
        let mut all: Vec<String> = Vec::new();
        for (key, names) in &runs {
            assert!(!names.is_empty() && names.len() <= ACTIVE_RUN_MAX, "a run of {}", names.len());
            if key.as_slice() != FIRST_RUN {
                assert_eq!(key.as_slice(), names[0].as_bytes(), "a run is keyed by its first name");
            }
            all.extend(names.iter().cloned());
        }
        let mut want: Vec<String> = (0..count).map(|i| name(i).as_str().to_owned()).collect();
        want.sort();
        assert_eq!(all, want, "every endpoint once, in name byte order");
        let generation_of = |i: usize| Generation(if i.is_multiple_of(3) { 2 } else { 1 });
        for i in [0, 1, 2, 3, count / 2, count - 1] {
            let record = store.active(&name(i)).await.expect("active").expect("a record");
            assert_eq!(record.generation, generation_of(i), "e{i}");
        }
        let mut walked = Vec::new();
        let mut after = None;
        loop {
            let page = store.active_page(after.clone(), 7).await.expect("page");
            walked.extend(page.endpoints.iter().map(|(n, r)| (n.as_str().to_owned(), r.generation)));
            after = page.endpoints.last().map(|(n, _)| n.clone());
            if !page.more {
                break;
            }
        }
        let by_name: Vec<(String, Generation)> = (0..count).map(|i| (name(i).as_str().to_owned(), generation_of(i))).collect();
        let mut by_name = by_name;
        by_name.sort();
        assert_eq!(walked, by_name, "a walk in pages of 7");
        let whole = store.active_all().await.expect("all");
        assert_eq!(whole.endpoints.len(), count);
        let delta = store.active_since(seen).await.expect("delta");
        assert!(!delta.full);
        assert_eq!(delta.endpoints.len(), moved.len());
        assert!(delta.endpoints.values().all(|r| r.generation == Generation(2)));
        assert_eq!(stored_counts(&store), recount(&store));
    }

    /// A store written with one `active` key per endpoint gets its runs when opened, and the
    /// tree is dropped.
    #[tokio::test]
    async fn a_store_with_a_key_per_endpoint_is_grouped_at_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let count = ACTIVE_RUN_MAX * 2 + 5;
        let before = {
            let store = SledStore::open(dir.path()).expect("open");
            store.publish(&uniform_plan(1, count, 1)).await.expect("publish");
            let items: Vec<ApplyItem> = uniform_plan(1, count, 1)
                .into_plan()
                .endpoints
                .into_iter()
                .map(|(endpoint, records)| ApplyItem { endpoint, records })
                .collect();
            for result in store.apply_many(Generation(1), &items).await.expect("batch") {
                result.expect("applied");
            }
            let before = store.active_all().await.expect("all");
            // Back to the older layout: a key per endpoint, no runs, layout 2.
            let legacy = store.inner().db.open_tree(LEGACY_ACTIVE).expect("tree");
            for (name, record) in &before.endpoints {
                legacy.insert(name.as_str().as_bytes(), codec::encode(record)).expect("insert");
            }
            store.inner().active_runs.clear().expect("clear");
            store.inner().meta.insert(META_LAYOUT, &LAYOUT_FENCE_COUNTS.to_be_bytes()).expect("layout");
            store.inner().flush().expect("flush");
            before
        };
        let store = SledStore::open(dir.path()).expect("reopen");
        assert_eq!(store.active_all().await.expect("all").endpoints, before.endpoints);
        assert!(!store.inner().db.tree_names().iter().any(|n| n.as_ref() == LEGACY_ACTIVE.as_bytes()), "the tree is dropped");
        assert_eq!(stored_runs(&store).len(), count.div_ceil(ACTIVE_RUN_MAX));
        assert_eq!(store.inner().meta_u64(META_LAYOUT, 0).expect("layout"), LAYOUT_ACTIVE_RUNS);
    }

    /// A store held open is reported as in use, after `OPEN_LOCK_WAIT` of retries (the time
    /// a store just dropped, or a process that just exited, takes to let go), not as an I/O
    /// error at once.
    #[test]
    fn a_store_in_use_is_waited_for_then_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let held = SledStore::open(dir.path()).expect("open");
        let started = std::time::Instant::now();
        let refused = SledStore::open(dir.path()).err().expect("a second open while the first holds the lock");
        assert!(matches!(&refused, StoreError::Unavailable(why) if why.contains("in use by another process")), "{refused}");
        assert!(started.elapsed() >= OPEN_LOCK_WAIT, "refused after {:?}, before retrying for {OPEN_LOCK_WAIT:?}", started.elapsed());
        drop(held);
    }

    /// Whether sled compresses the store in `dir`, as it recorded when it created it.
    fn compressed(dir: &Path) -> bool {
        let conf = std::fs::read(dir.join("conf")).expect("sled's conf");
        let conf = String::from_utf8_lossy(&conf);
        assert!(conf.contains("use_compression: "), "sled's conf names its compression: {conf}");
        conf.contains("use_compression: true")
    }

    /// A new store is compressed; a store created without compression (by an older dnsplan)
    /// opens as it is, keeps its plans and records, and stays uncompressed (sled refuses to
    /// change it).
    #[tokio::test]
    async fn a_store_created_uncompressed_opens_as_it_is() {
        let fresh = tempfile::tempdir().expect("tempdir");
        drop(SledStore::open(fresh.path()).expect("open"));
        assert!(compressed(fresh.path()), "a new store is compressed");

        let dir = tempfile::tempdir().expect("tempdir");
        drop(sled::Config::new().path(dir.path()).use_compression(false).open().expect("an uncompressed sled store"));
        let store = SledStore::open(dir.path()).expect("open an uncompressed store");
        store.publish(&uniform_plan(1, 3, 1)).await.expect("publish");
        store.apply_many(Generation(1), &items(&["e0", "e1", "e2"], 1)).await.expect("apply");
        let active = store.active_all().await.expect("active");
        drop(store);
        let store = SledStore::open(dir.path()).expect("reopen");
        assert_eq!(store.plan(Generation(1)).await.expect("plan 1"), uniform_plan(1, 3, 1));
        assert_eq!(store.active_all().await.expect("active"), active);
        assert_eq!(active.endpoints.len(), 3);
        drop(store);
        assert!(!compressed(dir.path()), "the store stays as it was created");
    }
}
