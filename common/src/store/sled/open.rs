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

/// The layout's version: absent or 1 before `fence_counts`, 2 since, 3 since `active_runs`.
pub(super) const META_LAYOUT: &[u8] = b"layout";

pub(super) const LAYOUT_FENCE_COUNTS: u64 = 2;

pub(super) const LAYOUT_ACTIVE_RUNS: u64 = 3;

/// The tree of a store written before `active_runs`: endpoint name → [`ActiveRecord`].
pub(super) const LEGACY_ACTIVE: &str = "active";

/// The tree of a store written before `fence_counts` (see the module docs).
pub(super) const LEGACY_FENCES: &str = "fences";

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
    /// Converts a store whose tree `legacy` belongs to a layout before `layout`: `convert`
    /// writes the new trees from it (starting from empty, so a rerun redoes it), then `layout`
    /// is marked and `legacy` dropped, each step flushed. Interrupted before the mark, the
    /// next open converts again; after it, only the drop is left. A store without `legacy`
    /// (a new one) only gets the mark.
    pub(super) fn convert_legacy(
        &self,
        legacy: &str,
        layout: u64,
        convert: impl FnOnce(&sled::Tree) -> StoreResult<()>,
    ) -> StoreResult<()> {
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
    pub(super) fn migrate_fences(&self) -> StoreResult<()> {
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
    pub(super) fn migrate_active(&self) -> StoreResult<()> {
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
        if !self.meta.contains_key(META_CONTENTS).map_err(io)? {
            self.write_contents(horizon, latest)?;
        }
        self.flush()
    }
}
