//! Opening a store: sled's lock, the high-water check, the layout, crash recovery.

use super::*;

/// How long `open` waits for another holder of the store's lock to let go. A restarted daemon
/// can race its predecessor's exit by a few hundred milliseconds; longer means a second live
/// process, which is an operator's mistake to report, not to wait out.
pub const OPEN_LOCK_WAIT: Duration = Duration::from_secs(3);

/// zstd level of the pages sled writes (1, its fastest). A store's names and records repeat
/// themselves (every name ends in the DNS zone), so even this level stores a million
/// endpoints in about a seventh of the bytes, for less CPU than a page's serialisation.
pub(super) const COMPRESSION_LEVEL: i32 = 1;

/// The layout's version, in `meta`: written when a store is created, and the only one this
/// build opens (see [`Inner::check_layout`]).
pub(super) const META_LAYOUT: &[u8] = b"layout";

/// The one layout this build reads and writes: the trees of the module docs. Layouts before it
/// (1 to 3: a fence index, a key per active endpoint, no content count) belong to builds before
/// any release and are refused, not converted.
pub const LAYOUT: u64 = 4;

/// What `open` does with a store behind its high-water mark (see `high_water`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLoss {
    /// Refuse to open it, naming the file, what was lost and the ways out.
    Refuse,
    /// Open what is left and move the applied-change count (and with it the SOA serial) past
    /// everything the mark says was served; the operator's `--accept-store-loss`.
    Accept,
}

impl Inner {
    /// Opens the database in `path`; `check` is the high-water mark found at the store's
    /// first open and what to do with a store behind it (a reopen checks against the mark
    /// kept since).
    pub(super) fn open(
        path: &Path,
        version: Arc<watch::Sender<StoreVersion>>,
        high_water: Arc<Mutex<HighWater>>,
        check: Option<(Found, OnLoss)>,
    ) -> StoreResult<Inner> {
        let db = open_db(path)?;
        Inner::from_db(db, &ZoneTrees::first(), path, version, high_water, check)
    }

    /// A zone's trees in the open database `db` (`trees` says which zone's), checked and
    /// recovered; `path` is the zone's directory, which holds its high-water mark.
    pub(super) fn from_db(
        db: sled::Db,
        trees: &ZoneTrees,
        path: &Path,
        version: Arc<watch::Sender<StoreVersion>>,
        high_water: Arc<Mutex<HighWater>>,
        check: Option<(Found, OnLoss)>,
    ) -> StoreResult<Inner> {
        let tree = |name: &str| trees.tree(&db, name);
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
            zone: trees.clone(),
            version,
            high_water,
            chain: Mutex::new(Chain::default()),
        };
        inner.check_layout(path)?;
        inner.check_high_water(path, check)?;
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
}

/// Opens the sled database in `path`, waiting briefly for a lock a process that just exited
/// still holds.
pub(super) fn open_db(path: &Path) -> StoreResult<sled::Db> {
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
            // is opened as it is (and one of an older layout is then refused by name).
            Err(sled::Error::Unsupported(why)) if compressed && why.contains("use_compression") => compressed = false,
            // sled reports a held lock as an `Other` error naming it, with the
            // `WouldBlock` of the lock call only in its text.
            Err(sled::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("could not acquire lock") => {
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
    Ok(db)
}

impl Inner {
    /// Refuses a store behind its high-water mark, or accepts the loss (see `high_water`).
    /// `check` is `None` on a reopen: the mark is then the one this process kept.
    pub(super) fn check_high_water(&self, path: &Path, check: Option<(Found, OnLoss)>) -> StoreResult<()> {
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
            let content = self.meta_u64(META_CONTENT, 0)?;
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
    /// Marks a new store with [`LAYOUT`]; refuses a store of any other layout, naming both.
    /// A store is new when its `meta` is empty: every open of a store writes its id there.
    pub(super) fn check_layout(&self, path: &Path) -> StoreResult<()> {
        // The layout first: a store already marked (every open but the first) takes one read.
        let found = self.meta_u64(META_LAYOUT, 0)?;
        if found == LAYOUT {
            return Ok(());
        }
        if found == 0 && self.meta.is_empty().map_err(io)? {
            self.meta.insert(META_LAYOUT, &LAYOUT.to_be_bytes()).map_err(io)?;
            return self.flush();
        }
        let found = if found == 0 { "no layout version (a store written before versions)".to_string() } else { format!("layout {found}") };
        Err(StoreError::Unavailable(format!(
            "the store in {} has {found}, and this dnsplan opens layout {LAYOUT} only: stores written by builds before \
             the first release are not converted. Move the directory aside, put a copy of its {} in an empty one and \
             start once with --accept-store-loss: the SOA serial goes on past what secondaries hold, and the planner \
             publishes a plan into the new store (the runbook's \"The store has another layout\")",
            path.display(),
            high_water::FILE_NAME,
        )))
    }

    /// Finishes an interrupted cleanup and checks that the plan range is whole.
    pub(super) fn recover(&self) -> StoreResult<()> {
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
        self.flush()
    }
}
