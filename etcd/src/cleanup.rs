//! Which plans cleanup may delete.

use crate::handle::*;
use crate::keys::{Keys, prefix_end};
use crate::txn::*;
use dnsplan_common::Generation;
use dnsplan_common::names::DnsName;
use dnsplan_common::store::{CleanupDecision, StoreResult, decide_cleanup};

impl EtcdStore {
    /// Horizon, latest, control count and the oldest serving fence, at one revision.
    pub(crate) async fn decide(&self, retain: u64) -> StoreResult<(CleanupDecision, Option<u64>, Option<u64>)> {
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
}
