//! The planner's lease, the automation pause, and the enactors' heartbeats.

use super::*;

impl Inner {
    pub(super) fn paused(&self) -> StoreResult<Option<PauseState>> {
        self.meta
            .get(META_PAUSE)
            .map_err(io)?
            .map(|bytes| codec::decode::<PauseState>(&bytes).map_err(|e| corrupt("pause state", e)))
            .transpose()
    }

    pub(super) fn read_lease(&self) -> StoreResult<Option<Lease>> {
        self.meta
            .get(META_LEASE)
            .map_err(io)?
            .map(|bytes| codec::decode::<Lease>(&bytes).map_err(|e| corrupt("planner lease", e)))
            .transpose()
    }

    pub(super) fn write_lease(&self, lease: &Lease) -> StoreResult<()> {
        self.meta.insert(META_LEASE, codec::encode(lease)).map_err(io)?;
        self.flush()
    }

    pub(super) fn acquire_lease(&self, holder: &str, ttl: Duration) -> StoreResult<Lease> {
        let _guard = self.guard()?;
        let lease = lease::decide_acquire(self.read_lease()?.as_ref(), holder, ttl, lease::now_unix_ms())?;
        self.write_lease(&lease)?;
        Ok(lease)
    }

    pub(super) fn release_lease(&self, lease: &Lease) -> StoreResult<()> {
        let _guard = self.guard()?;
        match lease::decide_release(self.read_lease()?.as_ref(), lease, lease::now_unix_ms()) {
            Some(released) => self.write_lease(&released),
            None => Ok(()),
        }
    }

    pub(super) fn set_pause(&self, state: Option<PauseState>) -> StoreResult<()> {
        let _guard = self.guard()?;
        let control = self.meta_u64(META_CONTROL, 0)?.wrapping_add(1);
        let mut batch = self.meta.batch();
        match state {
            Some(state) => batch.insert(META_PAUSE, codec::encode(&state)),
            None => batch.remove(META_PAUSE),
        }
        batch.insert(META_CONTROL, &control.to_be_bytes());
        self.meta.apply_batch(batch).map_err(io)?;
        self.flush()?;
        self.publish_version()
    }

    pub(super) fn heartbeat(&self, heartbeat: Heartbeat) -> StoreResult<()> {
        let _guard = self.guard()?;
        let key = heartbeat.enactor_id.as_bytes();
        if !self.heartbeats.contains_key(key).map_err(io)? && self.heartbeats.len() >= HEARTBEATS_MAX {
            return Err(StoreError::TooManyHeartbeats);
        }
        // Heartbeats are status, not state: they are not flushed on their own.
        self.heartbeats.insert(key, codec::encode(&heartbeat)).map_err(io)?;
        Ok(())
    }

    pub(super) fn heartbeats(&self) -> StoreResult<Vec<Heartbeat>> {
        let _guard = self.guard()?;
        self.heartbeats
            .iter()
            .values()
            .map(|bytes| codec::decode::<Heartbeat>(&bytes.map_err(io)?).map_err(|e| corrupt("heartbeat", e)))
            .collect()
    }
}
