//! The planner lease: at most one active planner at a time, decided by the store's clock.
//!
//! A planner acquires the lease for a time-to-live and renews it well before it expires. A
//! different holder can take it only once it expired or was released, and then the epoch
//! grows. Publishing with a lease checks holder and epoch in the same critical section as the
//! publish CAS, so a planner that lost its lease (paused by the OS, partitioned) cannot
//! publish even if it still believes it is active: the epoch is a fencing token.
//!
//! The decisions are pure functions of the current lease, the request and the store's "now".

use super::StoreError;
use crate::codec::{self, Record};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Shortest lease. Below this, renewals would need to be faster than a slow disk flush.
pub const LEASE_TTL_MIN: Duration = Duration::from_millis(100);
/// Longest lease: how long a dead planner can keep its standby from taking over.
pub const LEASE_TTL_MAX: Duration = Duration::from_secs(300);
/// Longest holder id, in bytes.
pub const LEASE_HOLDER_BYTES_MAX: usize = 128;

/// Who holds the planner lease, under which epoch, until when (store clock, Unix ms).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    pub holder: String,
    pub epoch: u64,
    pub expires_at_unix_ms: u64,
}

impl Record for Lease {
    const KIND: u8 = 6;
    const KIND_NAME: &'static str = "planner lease";
    const BODY_BYTES_MAX: usize = codec::SMALL_BODY_BYTES_MAX;
}

impl Lease {
    pub fn is_live(&self, now_unix_ms: u64) -> bool {
        self.expires_at_unix_ms > now_unix_ms
    }
}

/// Grants, renews or refuses `holder`'s request for the lease at `now` for `ttl`.
pub fn decide_acquire(current: Option<&Lease>, holder: &str, ttl: Duration, now_unix_ms: u64) -> Result<Lease, StoreError> {
    if holder.is_empty() || holder.len() > LEASE_HOLDER_BYTES_MAX {
        return Err(StoreError::TooLong { what: "lease holder (1 byte at least)".into(), len: holder.len(), max: LEASE_HOLDER_BYTES_MAX });
    }
    if !(LEASE_TTL_MIN..=LEASE_TTL_MAX).contains(&ttl) {
        return Err(StoreError::BadRequest(format!("lease TTL {ttl:?} is outside {LEASE_TTL_MIN:?}..={LEASE_TTL_MAX:?}")));
    }
    let expires_at_unix_ms = now_unix_ms.saturating_add(ttl.as_millis() as u64);
    let epoch = match current {
        // Renewal: same holder, lease still live, same epoch.
        Some(l) if l.holder == holder && l.is_live(now_unix_ms) => l.epoch,
        Some(l) if l.is_live(now_unix_ms) => {
            return Err(StoreError::LeaseHeld {
                holder: l.holder.clone(),
                epoch: l.epoch,
                expires_in_ms: l.expires_at_unix_ms - now_unix_ms,
            });
        }
        // Expired or released: a new epoch, even for the previous holder, so that anything it
        // did under the old epoch is fenced off.
        Some(l) => l.epoch + 1,
        None => 1,
    };
    Ok(Lease { holder: holder.to_owned(), epoch, expires_at_unix_ms })
}

/// Checks that `lease` is the live lease now; the fencing check of a leased publish.
pub fn check_holder(current: Option<&Lease>, lease: &Lease, now_unix_ms: u64) -> Result<(), StoreError> {
    match current {
        Some(c) if c.holder == lease.holder && c.epoch == lease.epoch && c.is_live(now_unix_ms) => Ok(()),
        Some(c) => Err(StoreError::NotLeaseHolder {
            holder: c.is_live(now_unix_ms).then(|| c.holder.clone()),
            epoch: c.epoch,
            attempted_epoch: lease.epoch,
        }),
        None => Err(StoreError::NotLeaseHolder { holder: None, epoch: 0, attempted_epoch: lease.epoch }),
    }
}

/// An automation publish without a lease is refused while someone holds a live lease.
pub fn check_unleased(current: Option<&Lease>, now_unix_ms: u64) -> Result<(), StoreError> {
    match current {
        Some(c) if c.is_live(now_unix_ms) => {
            Err(StoreError::NotLeaseHolder { holder: Some(c.holder.clone()), epoch: c.epoch, attempted_epoch: 0 })
        }
        _ => Ok(()),
    }
}

/// The lease after `lease` is released: expired now, epoch kept (the next holder gets a
/// higher one). `None` when `lease` is not the current one (nothing to release).
pub fn decide_release(current: Option<&Lease>, lease: &Lease, now_unix_ms: u64) -> Option<Lease> {
    match current {
        Some(c) if c.holder == lease.holder && c.epoch == lease.epoch => Some(Lease { expires_at_unix_ms: now_unix_ms, ..c.clone() }),
        _ => None,
    }
}

/// The store's clock, in Unix milliseconds.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn grant_renew_refuse_expire_release() {
        let a = decide_acquire(None, "a", TTL, 1_000).unwrap();
        assert_eq!((a.epoch, a.expires_at_unix_ms), (1, 11_000));
        let renewed = decide_acquire(Some(&a), "a", TTL, 5_000).unwrap();
        assert_eq!((renewed.epoch, renewed.expires_at_unix_ms), (1, 15_000));
        let refused = decide_acquire(Some(&renewed), "b", TTL, 6_000).unwrap_err();
        assert!(matches!(refused, StoreError::LeaseHeld { ref holder, epoch: 1, expires_in_ms: 9_000 } if holder == "a"), "{refused}");
        // Expired: b takes over with a new epoch; a's old lease no longer publishes.
        let b = decide_acquire(Some(&renewed), "b", TTL, 15_000).unwrap();
        assert_eq!(b.epoch, 2);
        assert!(check_holder(Some(&b), &renewed, 15_001).is_err());
        assert!(check_holder(Some(&b), &b, 15_001).is_ok());
        assert!(check_unleased(Some(&b), 15_001).is_err());
        // Released: gone at once, and a comes back under a newer epoch.
        let released = decide_release(Some(&b), &b, 16_000).unwrap();
        assert!(check_unleased(Some(&released), 16_000).is_ok());
        assert!(decide_release(Some(&released), &renewed, 16_000).is_none());
        let again = decide_acquire(Some(&released), "a", TTL, 16_000).unwrap();
        assert_eq!(again.epoch, 3);
        assert!(decide_acquire(None, "a", Duration::from_millis(10), 0).is_err());
        assert!(decide_acquire(None, "", TTL, 0).is_err());
    }
}
