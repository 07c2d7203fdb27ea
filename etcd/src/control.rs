//! The planner's lease and the automation pause.

use crate::client::{Txn, TxnOp};
use crate::handle::*;
use crate::txn::*;
use dnsplan_common::codec::{self};
use dnsplan_common::store::lease::Lease;
use dnsplan_common::store::{PauseState, StoreResult};

/// etcd checks lease expiry on its leader about every 500 ms: a lease past its time but not
/// yet revoked is reported as ending in this long.
pub(crate) const LEASE_EXPIRY_CHECK_MS: u64 = 500;

/// The planner lease's fencing token as stored in the live key: epoch, then holder.
pub(crate) fn lease_token(lease: &Lease) -> Vec<u8> {
    let mut token = lease.epoch.to_be_bytes().to_vec();
    token.extend_from_slice(lease.holder.as_bytes());
    token
}

/// The lease as the pure decisions must see it: live exactly while etcd keeps the live key
/// (etcd's clock decides, not this machine's), with the recorded expiry where it agrees.
pub(crate) fn lease_view(record: Option<Lease>, live: Option<&[u8]>, now_unix_ms: u64) -> StoreResult<Option<Lease>> {
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

impl EtcdStore {
    pub(crate) async fn set_pause(&self, state: Option<PauseState>) -> StoreResult<()> {
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
}
