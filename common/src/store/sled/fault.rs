//! A write that failed (a full disk): the fault shown to callers and the reopen that clears it.

use super::*;

/// How often a store whose writes fail tries to reopen its database.
pub const REOPEN_EVERY: Duration = Duration::from_secs(1);

/// The shortest time between two ERROR lines about one fault.
pub(super) const FAULT_LOG_EVERY: Duration = Duration::from_secs(60);

/// What a failed call says in a [`StoreFault`]: a full disk in the operating system's words
/// (sled passes it on as the debug form of its `io::Error`), anything else with its causes.
pub(super) fn fault_text(err: &StoreError) -> String {
    if let StoreError::Io(source) = err
        && let Some(sled::Error::Io(io)) = source.downcast_ref::<sled::Error>()
        && io.kind() == std::io::ErrorKind::StorageFull
    {
        return "No space left on device".into();
    }
    crate::store::wire::error_chain(err)
}

impl Database {
    /// Records a failed write and starts reopening the database: sled answers every later
    /// call with the same error until it is opened again. The fault stays until a reopened
    /// database has made a write durable.
    pub(super) fn failed(shared: &Arc<Database>, error: &str) {
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
                std::thread::Builder::new().name("dnsplan-store-reopen".into()).spawn(move || Database::reopen_until_written(&weak));
            if let Err(err) = spawned {
                fault.reopening = false;
                tracing::error!(error = %err, "could not start reopening the store; the next failed write tries again");
            }
        }
    }

    /// Reopens the database every [`REOPEN_EVERY`] until one opens and makes a write
    /// durable, or the store is dropped.
    pub(super) fn reopen_until_written(weak: &std::sync::Weak<Database>) {
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

    /// Drops the database that failed, opens it again (each zone checked against its
    /// high-water mark like any open) and makes one write durable, which fails as long as the
    /// disk is full.
    pub(super) fn reopen(&self) -> StoreResult<()> {
        // Zones are neither added nor removed meanwhile.
        let zones = self.zones.lock().map_err(|_| poisoned())?;
        let first = self.first.lock().map_err(|_| poisoned())?.upgrade();
        let open: Vec<Arc<Shared>> = first.into_iter().chain(zones.values().filter_map(zones::OpenZone::shared)).collect();
        // Taken out first, so sled's lock is released once the calls still on it return
        // (`open_db` waits up to `OPEN_LOCK_WAIT` for that).
        for shared in &open {
            drop(shared.inner.write().map_err(|_| poisoned())?.take());
        }
        let db = open_db(&self.path)?;
        let mut inners = Vec::with_capacity(open.len());
        for (i, shared) in open.iter().enumerate() {
            match Inner::from_db(db.clone(), &shared.zone, &shared.path, shared.version.clone(), shared.high_water.clone(), None) {
                Ok(inner) => inners.push(Some(Arc::new(inner))),
                // The first zone must open; an added zone that does not stays unavailable on
                // its own (its calls say the store is being reopened), the others serve.
                Err(err) if i > 0 => {
                    tracing::error!(path = %shared.path.display(), error = %err, "an added zone did not open again; its calls are refused until the next open");
                    inners.push(None);
                }
                Err(err) => return Err(err),
            }
        }
        if let Some(Some(inner)) = inners.first() {
            let _guard = inner.guard()?;
            inner.meta.insert(META_REOPENED, &lease::now_unix_ms().to_be_bytes()).map_err(io)?;
            inner.flush()?;
            inner.publish_version()?;
        }
        for (shared, inner) in open.iter().zip(inners) {
            *shared.inner.write().map_err(|_| poisoned())? = inner;
        }
        Ok(())
    }
}
