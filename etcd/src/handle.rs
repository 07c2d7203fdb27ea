//! `EtcdStore` and what it holds: the client, the key layout, the plan cache, the counter slot
//! and the active-change log; `connect`, and the test-only hooks on its transactions.

use crate::active_log::ActiveLog;
use crate::client::{Client, ClientOptions, Compare, CompareOp};
use crate::config::*;
use crate::keys::Keys;
use dnsplan_common::codec::{self};
use dnsplan_common::names::DnsName;
use dnsplan_common::plan::ValidatedPlan;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The one layout of the keys (the table in `keys`) this build reads and writes, kept under
/// `state/layout` from the first publish. A store written before versions (its counter slots
/// 8 bytes wide) or of another layout is refused, not converted: no release has written one.
pub const LAYOUT: u64 = 1;

/// Slots of the applied-change counter (see `Keys::applied_slot`). Each apply transaction
/// compares and adds to one slot, so writers on different slots (enactors of one zone
/// writing different endpoints) do not fail each other's transactions over the counter; with
/// one counter, all but one of concurrent transactions failed and went round Raft again.
pub(crate) const APPLIED_SLOTS: usize = 16;

/// Applied-change counts remembered with the revision they were read at, so `active_since`
/// can read what changed since that revision. A follower asks about the count of its last answer.
pub(crate) const REVISIONS_KEPT: usize = 1_024;

/// Largest gRPC message the client decodes: the largest plan body plus framing, the same
/// bound as the codec's.
pub(crate) const RESPONSE_BYTES_MAX: usize = codec::BODY_BYTES_MAX + 1024 * 1024;

/// A nonce no other publish picks: a per-process random seed hashed with time and a counter.
pub(crate) fn fresh_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default());
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// The `Store` on etcd v3. Clones share one client.
#[derive(Clone)]
pub struct EtcdStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) keys: Keys,
    pub(crate) config: EtcdConfig,
    pub(crate) plans: Mutex<VecDeque<Arc<ValidatedPlan>>>,
    /// Applied-change count → an etcd revision at which the store had that count.
    pub(crate) revisions: Mutex<BTreeMap<u64, i64>>,
    /// The counter slot this store's apply transactions add to; another, at random, after a
    /// transaction lost a race.
    pub(crate) slot: AtomicUsize,
    /// The writes to the active records since this store's first `active_since`, from a watch
    /// (see `active_log`); started again when it breaks.
    pub(crate) active_log: Mutex<Option<Arc<ActiveLog>>>,
    /// `active_since` answers taken from `active_log`, for tests.
    pub(crate) from_log: AtomicU64,
    /// The store's layout was found to be [`LAYOUT`] (or the store empty): checked once, by
    /// the first transaction.
    pub(crate) layout_checked: AtomicBool,
    /// For the handle of an added zone: the zone's live key and the value it had when the
    /// handle was made, compared by every transaction (see `zones`).
    pub(crate) zone: Option<ZoneFence>,
    /// Test-only: the write transaction whose committed reply is lost next (see
    /// `lose_next_reply`).
    #[cfg(feature = "testing")]
    pub(crate) lose_reply: Mutex<Option<&'static str>>,
    /// Test-only: the write transaction held before it is sent next (see `hold_next_commit`).
    #[cfg(feature = "testing")]
    pub(crate) hold: Mutex<Option<Hold>>,
}

/// Test-only: where a held commit waits, and how it says it got there.
#[cfg(feature = "testing")]
pub(crate) struct Hold {
    pub(crate) what: &'static str,
    pub(crate) reached: tokio::sync::oneshot::Sender<()>,
    pub(crate) go: tokio::sync::oneshot::Receiver<()>,
}

impl EtcdStore {
    /// Sets up a client for `config`. Connections are made on first use, so a store can be
    /// created while etcd is down; every call then fails with `Unavailable` until it is back.
    pub async fn connect(config: EtcdConfig) -> Result<EtcdStore, ConnectError> {
        config.check()?;
        let options = ClientOptions {
            connect_timeout: config.connect_timeout.min(config.request_timeout),
            keep_alive: Some((Duration::from_secs(10), config.request_timeout)),
            user: config.user.clone(),
            tls: config.tls.clone(),
            response_bytes_max: RESPONSE_BYTES_MAX,
        };
        let client = Client::new(&config.endpoints, &options).map_err(ConnectError::Client)?;
        Ok(EtcdStore::with_client(client, config, None))
    }

    /// A store on `client` under `config.prefix`; `zone` fences an added zone's handle.
    pub(crate) fn with_client(client: Client, config: EtcdConfig, zone: Option<ZoneFence>) -> EtcdStore {
        EtcdStore {
            inner: Arc::new(Inner {
                client,
                keys: Keys::new(&config.prefix),
                config,
                plans: Mutex::new(VecDeque::new()),
                revisions: Mutex::new(BTreeMap::new()),
                slot: AtomicUsize::new(fresh_nonce() as usize % APPLIED_SLOTS),
                active_log: Mutex::new(None),
                from_log: AtomicU64::new(0),
                layout_checked: AtomicBool::new(false),
                zone,
                #[cfg(feature = "testing")]
                lose_reply: Mutex::new(None),
                #[cfg(feature = "testing")]
                hold: Mutex::new(None),
            }),
        }
    }

    /// Test-only: the next write transaction named `what` (`"publish"`, `"apply"`, ...) that
    /// etcd commits is reported as `Unavailable`, as if its reply had been lost to a timeout
    /// after etcd committed it: an ambiguous commit, on demand.
    #[cfg(feature = "testing")]
    pub fn lose_next_reply(&self, what: &'static str) {
        if let Ok(mut lose) = self.inner.lose_reply.lock() {
            *lose = Some(what);
        }
    }

    /// Test-only: the next conditional write named `what` (`"publish"`, `"apply"`,
    /// `"cleanup"`, `"pause"`, `"lease"`) stops after its decision, before its transaction is
    /// sent: the first receiver fires when it gets there, and it goes on when the sender is
    /// used or dropped. Whatever the test writes meanwhile, the transaction's compares must
    /// catch: the decision is made, only the write is left.
    #[cfg(feature = "testing")]
    pub fn hold_next_commit(&self, what: &'static str) -> (tokio::sync::oneshot::Receiver<()>, tokio::sync::oneshot::Sender<()>) {
        let (reached, reached_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go) = tokio::sync::oneshot::channel();
        if let Ok(mut hold) = self.inner.hold.lock() {
            *hold = Some(Hold { what, reached, go });
        }
        (reached_rx, go_tx)
    }
}

/// An added zone's handle's fence (see `zones`): its live key and the incarnation it was made with.
#[derive(Clone, Debug)]
pub(crate) struct ZoneFence {
    pub(crate) origin: DnsName,
    pub(crate) live_key: Vec<u8>,
    pub(crate) token: Vec<u8>,
}

impl ZoneFence {
    pub(crate) fn compare(&self) -> Compare {
        Compare::value(self.live_key.clone(), CompareOp::Equal, self.token.clone())
    }
}
