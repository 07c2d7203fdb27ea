//! Talking to etcd: connecting, bounded transactions and reads, retries, the compare and operation helpers.

use crate::client::{self};
use crate::client::{Client, Compare, CompareOp, DeleteOptions, GetOptions, GetResponse, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};
use crate::handle::*;
use crate::keys::{Keys, prefix_end};
use dnsplan_common::codec::{self, CodecError, Record};
use dnsplan_common::names::{DnsName, EndpointName};
use dnsplan_common::store::{StoreError, StoreResult};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How many times a write reads, decides and tries to commit before it reports contention.
/// Each failed attempt means another writer committed, so the store as a whole progresses;
/// 64 rides out a burst of every enactor of a region writing at once.
pub const ATTEMPTS_MAX: u32 = 64;

pub(crate) fn corrupt(what: impl Into<String>, detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt { what: what.into(), source: CodecError::Body { kind: "etcd value".into(), detail: detail.into() } }
}

pub(crate) fn be_u64(kv: Option<&KeyValue>, what: &str) -> StoreResult<Option<u64>> {
    kv.map(|kv| {
        let bytes: [u8; 8] = kv.value().try_into().map_err(|_| StoreError::Corrupt {
            what: what.to_owned(),
            source: CodecError::LengthMismatch { declared: 8, actual: kv.value().len() },
        })?;
        Ok(u64::from_be_bytes(bytes))
    })
    .transpose()
}

pub(crate) fn first(response: &GetResponse) -> Option<&KeyValue> {
    response.kvs().first()
}

pub(crate) fn cmp_u64(key: Vec<u8>, observed: Option<u64>) -> Compare {
    match observed {
        None => Compare::version(key, CompareOp::Equal, 0),
        Some(v) => Compare::value(key, CompareOp::Equal, v.to_be_bytes().to_vec()),
    }
}

pub(crate) fn cmp_bytes(key: Vec<u8>, observed: Option<&[u8]>) -> Compare {
    match observed {
        None => Compare::version(key, CompareOp::Equal, 0),
        Some(v) => Compare::value(key, CompareOp::Equal, v.to_vec()),
    }
}

pub(crate) fn put(key: Vec<u8>, value: impl Into<Vec<u8>>) -> TxnOp {
    TxnOp::put(key, value, None)
}

pub(crate) fn get(key: Vec<u8>) -> TxnOp {
    TxnOp::get(key, None)
}

pub(crate) fn get_range(from: Vec<u8>, to: Vec<u8>, limit: i64) -> TxnOp {
    TxnOp::get(from, Some(GetOptions::new().with_range(to).with_limit(limit)))
}

pub(crate) fn delete_range(from: Vec<u8>, to: Vec<u8>) -> TxnOp {
    TxnOp::delete(from, Some(DeleteOptions::new().with_range(to)))
}

pub(crate) fn name_of(key: &[u8], prefix: &[u8], what: &str) -> StoreResult<EndpointName> {
    let rest = Keys::strip(key, prefix).ok_or_else(|| corrupt(what, "key outside its range"))?;
    let text = std::str::from_utf8(rest).map_err(|e| corrupt(what, e.to_string()))?;
    DnsName::parse(text).map_err(|e| corrupt(what, e.to_string()))
}

/// A short pause between attempts that lost a race, growing and jittered so that writers
/// that collided do not collide again in step.
pub(crate) async fn back_off(attempt: u32) {
    let base_us = 200u64 << attempt.min(6);
    let jitter = fresh_nonce() % base_us.max(1);
    tokio::time::sleep(Duration::from_micros(base_us / 2 + jitter)).await;
}

pub(crate) fn contention(what: &str) -> StoreError {
    StoreError::Unavailable(format!("{what} lost the race to other writers {ATTEMPTS_MAX} times in a row; retry later"))
}

/// A family of keys kept to `max` (heartbeats, authority reports), counted under `count_key`.
pub(crate) struct Bounded<F: Fn() -> StoreError> {
    pub(crate) what: &'static str,
    pub(crate) count_key: Vec<u8>,
    pub(crate) max: usize,
    /// The error when a new key would go past `max`.
    pub(crate) full: F,
}

pub(crate) fn etcd_error(what: &str, err: client::Error) -> StoreError {
    // Down, partitioned, without a leader or too slow: unavailable; anything else is etcd
    // refusing the request.
    if err.is_unavailable() { StoreError::Unavailable(format!("etcd {what}: {err}")) } else { StoreError::Io(Box::new(err)) }
}

impl EtcdStore {
    /// Writes `value` at `key`, one of `bound`'s family: over a key already there, or as a new
    /// key counted against the bound, the count compared with the write.
    pub(crate) async fn put_bounded<F: Fn() -> StoreError>(&self, bound: &Bounded<F>, key: Vec<u8>, value: Vec<u8>) -> StoreResult<()> {
        for attempt in 0..ATTEMPTS_MAX {
            let (_, r) = self.read(bound.what, vec![get(key.clone()), get(bound.count_key.clone())]).await?;
            let known = first(&r[0]).is_some();
            let count = be_u64(first(&r[1]), &format!("{} count", bound.what))?;
            let txn = if known {
                Txn::new().when(vec![Compare::version(key.clone(), CompareOp::Greater, 0)]).and_then(vec![put(key.clone(), value.clone())])
            } else {
                let n = count.unwrap_or(0);
                if n >= bound.max as u64 {
                    return Err((bound.full)());
                }
                Txn::new()
                    .when(vec![Compare::version(key.clone(), CompareOp::Equal, 0), cmp_u64(bound.count_key.clone(), count)])
                    .and_then(vec![put(key.clone(), value.clone()), put(bound.count_key.clone(), (n + 1).to_be_bytes().to_vec())])
            };
            if self.txn(bound.what, txn).await?.succeeded() {
                return Ok(());
            }
            back_off(attempt).await;
        }
        Err(contention(bound.what))
    }

    /// Every record under `prefix`, decoded.
    pub(crate) async fn read_all<T: Record>(&self, what: &'static str, prefix: Vec<u8>) -> StoreResult<Vec<T>> {
        let (_, r) = self.read(what, vec![get_range(prefix.clone(), prefix_end(&prefix), 0)]).await?;
        r[0].kvs()
            .iter()
            .map(|kv| codec::decode::<T>(kv.value()).map_err(|e| StoreError::Corrupt { what: T::KIND_NAME.into(), source: e }))
            .collect()
    }
}

impl EtcdStore {
    /// A conditional write: the transaction of a decision (the test-only hold applies here).
    pub(crate) async fn commit(&self, what: &str, txn: Txn) -> StoreResult<TxnResponse> {
        #[cfg(feature = "testing")]
        {
            let held = self.inner.hold.lock().ok().and_then(|mut hold| hold.take_if(|h| h.what == what));
            if let Some(Hold { reached, go, .. }) = held {
                let _ = reached.send(());
                let _ = go.await;
            }
        }
        self.txn(what, txn).await
    }

    /// The etcd client this store uses (for tools and tests: compaction, inspection).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Every key of this store starts with this.
    pub fn prefix(&self) -> &str {
        &self.inner.config.prefix
    }

    /// Runs `fut` under the request timeout and maps etcd's errors to the store's.
    pub(crate) async fn call<T>(&self, what: &str, fut: impl Future<Output = Result<T, client::Error>>) -> StoreResult<T> {
        let limit = self.inner.config.request_timeout;
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(limit, fut).await;
        tracing::trace!(what, elapsed_us = started.elapsed().as_micros() as u64, "etcd call");
        match answer {
            Err(_) => Err(StoreError::Unavailable(format!(
                "etcd did not answer {what} within {limit:?} (request_timeout); check that the cluster is up and reachable"
            ))),
            Ok(Err(err)) => Err(match etcd_error(what, err) {
                StoreError::Unavailable(detail) => StoreError::Unavailable(format!(
                    "{detail} (endpoints {}); check that the cluster is up and reachable",
                    self.inner.config.endpoints.join(", ")
                )),
                other => other,
            }),
            Ok(Ok(v)) => Ok(v),
        }
    }

    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> StoreResult<TxnResponse> {
        self.check_layout().await?;
        let txn = match &self.inner.zone {
            Some(fence) => txn.also_when(fence.compare()),
            None => txn,
        };
        let response = self.call(what, self.inner.client.txn(txn)).await?;
        if !response.succeeded()
            && let Some(fence) = &self.inner.zone
        {
            self.check_zone_live(fence).await?;
        }
        #[cfg(feature = "testing")]
        if response.succeeded() && response.put_any() {
            let lost = self.inner.lose_reply.lock().ok().and_then(|mut lose| lose.take_if(|w| *w == what)).is_some();
            if lost {
                return Err(StoreError::Unavailable(format!(
                    "etcd did not answer {what} (its reply was lost on purpose, after the commit)"
                )));
            }
        }
        Ok(response)
    }

    /// Refuses a store of another layout than [`LAYOUT`], naming both, before this store's
    /// first transaction; an empty store is taken as this layout (its first publish writes it).
    async fn check_layout(&self) -> StoreResult<()> {
        if self.inner.layout_checked.load(Ordering::Relaxed) {
            return Ok(());
        }
        let keys = &self.inner.keys;
        let response =
            self.call("layout", self.inner.client.txn(Txn::new().and_then(vec![get(keys.layout()), get(keys.latest())]))).await?;
        let gets: Vec<GetResponse> = response
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            })
            .collect();
        let [layout, latest] = gets.as_slice() else {
            return Err(StoreError::Unavailable("etcd answered the layout read with something other than two reads".into()));
        };
        let found = match (be_u64(first(layout), "layout")?, be_u64(first(latest), "latest generation")?) {
            (Some(LAYOUT), _) | (None, None) => {
                self.inner.layout_checked.store(true, Ordering::Relaxed);
                return Ok(());
            }
            (Some(other), _) => format!("layout {other}"),
            (None, Some(_)) => "no layout version (a store written before versions)".to_string(),
        };
        Err(StoreError::Unavailable(format!(
            "the store under prefix {:?} has {found}, and this dnsplan opens layout {LAYOUT} only: stores written by builds \
             before the first release are not converted. Start a store under a new prefix (or delete this one's keys), and set \
             the authorities' dns_zone.soa.serial_base past the serial secondaries hold (the runbook's \"The store has another \
             layout\")",
            self.inner.config.prefix
        )))
    }

    /// One read transaction: every get at one revision, returned with that revision.
    pub(crate) async fn read(&self, what: &str, gets: Vec<TxnOp>) -> StoreResult<(i64, Vec<GetResponse>)> {
        let response = self.txn(what, Txn::new().and_then(gets)).await?;
        let revision = response.header().map(|h| h.revision()).unwrap_or_default();
        let mut out = Vec::new();
        for r in response.op_responses() {
            match r {
                TxnOpResponse::Get(g) => out.push(g),
                _ => return Err(StoreError::Unavailable(format!("etcd answered {what} with something other than reads"))),
            }
        }
        Ok((revision, out))
    }

    pub(crate) fn note_revision(&self, applied: u64, revision: i64) {
        if let Ok(mut map) = self.inner.revisions.lock() {
            map.insert(applied, revision);
            while map.len() > REVISIONS_KEPT {
                map.pop_first();
            }
        }
    }

    pub(crate) fn revision_of(&self, applied: u64) -> Option<i64> {
        self.inner.revisions.lock().ok().and_then(|m| m.get(&applied).copied())
    }
}
