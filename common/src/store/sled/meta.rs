//! The meta tree's counters and marks, and the version watchers follow.

use super::*;

impl Inner {
    /// The writer lock (see the module docs); refused once the zone was removed, so a write
    /// that waited for the removal's lock never lands.
    pub(super) fn guard(&self) -> StoreResult<MutexGuard<'_, ()>> {
        let guard = self.lock.lock().map_err(|_| poisoned())?;
        self.zone.check_live()?;
        Ok(guard)
    }

    /// The applied-change and content-change counts (both 0 in a new store).
    pub(super) fn counts(&self) -> StoreResult<(u64, u64)> {
        Ok((self.meta_u64(META_APPLIED, 0)?, self.meta_u64(META_CONTENT, 0)?))
    }

    pub(super) fn meta_u64(&self, key: &[u8], default: u64) -> StoreResult<u64> {
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

    /// Draws the store's id if it has none (a new store).
    pub(super) fn ensure_store_id(&self) -> StoreResult<()> {
        if self.meta.get(META_STORE_ID).map_err(io)?.is_some() {
            return Ok(());
        }
        let id = crate::store::zones::random_id();
        // Set only if still absent, so two opens racing agree on one id.
        let _ = self.meta.compare_and_swap(META_STORE_ID, None, Some(&id.to_be_bytes()[..])).map_err(io)?;
        self.db.flush().map_err(io)?;
        Ok(())
    }

    pub(super) fn history_mark(&self, applied: u64) -> StoreResult<Option<HistoryMark>> {
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
    pub(super) fn dns_zone(&self) -> StoreResult<Option<DnsName>> {
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

    pub(super) fn latest(&self) -> StoreResult<Generation> {
        Ok(Generation(self.meta_u64(META_LATEST, 0)?))
    }

    pub(super) fn generation_base(&self) -> StoreResult<Generation> {
        Ok(Generation(self.meta_u64(META_GENERATION_BASE, 0)?))
    }

    pub(super) fn horizon(&self) -> StoreResult<Generation> {
        Ok(Generation(self.meta_u64(META_HORIZON, Generation::FIRST.0)?))
    }

    pub(super) fn read_version(&self) -> StoreResult<StoreVersion> {
        Ok(StoreVersion {
            latest: self.latest()?,
            applied_changes: self.meta_u64(META_APPLIED, 0)?,
            control_changes: self.meta_u64(META_CONTROL, 0)?,
        })
    }

    /// Tells the store's watchers of its version and moves the high-water mark to it; called
    /// under the lock once the write that moved it is flushed.
    pub(super) fn publish_version(&self) -> StoreResult<()> {
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

    pub(super) fn flush(&self) -> StoreResult<()> {
        self.db.flush().map(|_| ()).map_err(io)
    }

    /// The zone's shared DNSSEC keys and their version.
    pub(super) fn dnssec_keys(&self) -> StoreResult<Option<KeysRecord>> {
        self.zone.check_live()?;
        self.meta.get(META_DNSSEC_KEYS).map_err(io)?.map(|bytes| split_keys_record(&bytes)).transpose()
    }

    /// Replaces the shared DNSSEC keys if still at version `expected`; flushed before it
    /// returns.
    pub(super) fn put_dnssec_keys(&self, expected: Option<u64>, bytes: &[u8]) -> StoreResult<KeysPut> {
        let _guard = self.guard()?;
        let old = self.meta.get(META_DNSSEC_KEYS).map_err(io)?;
        let current = old.as_deref().map(split_keys_record).transpose()?.map(|r| r.version);
        if current != expected {
            return Ok(KeysPut::Moved { current });
        }
        let version = current.map_or(1, |v| v + 1);
        let mut value = version.to_be_bytes().to_vec();
        value.extend_from_slice(bytes);
        // Under the writer lock: nothing else writes the key, so the swap cannot miss.
        self.meta.insert(META_DNSSEC_KEYS, value).map_err(io)?;
        self.flush()?;
        Ok(KeysPut::Written { version })
    }
}

fn split_keys_record(bytes: &[u8]) -> StoreResult<KeysRecord> {
    let (version, record) =
        bytes.split_at_checked(8).ok_or_else(|| corrupt("the DNSSEC keys record", codec::CodecError::Truncated { len: bytes.len() }))?;
    let version = u64::from_be_bytes(version.try_into().expect("eight bytes"));
    Ok(KeysRecord { version, bytes: record.to_vec() })
}
