//! The shapes of etcd requests and answers that the store writes and reads: transaction
//! builders (`Txn`, `TxnOp`, `Compare`), request options, and accessors on etcd's answers.
//! Names follow the common Rust etcd clients', so code reads as etcd's own documentation does.
//!
//! Not here: sending anything (the parent module's `Client`).

use super::pb;
use super::pb::compare::{CompareResult, CompareTarget, TargetUnion};
use super::pb::request_op::Request;
use super::pb::response_op::Response;

pub use pb::event::EventType;
pub type KeyValue = pb::KeyValue;
pub type GetResponse = pb::RangeResponse;
pub type PutResponse = pb::PutResponse;
pub type DeleteResponse = pb::DeleteRangeResponse;
pub type TxnResponse = pb::TxnResponse;
pub type WatchResponse = pb::WatchResponse;
pub type StatusResponse = pb::StatusResponse;
pub type ResponseHeader = pb::ResponseHeader;
pub type Event = pb::Event;

/// Options of a range read.
#[derive(Clone, Debug, Default)]
pub struct GetOptions {
    range_end: Vec<u8>,
    prefix: bool,
    limit: i64,
    revision: i64,
    keys_only: bool,
    count_only: bool,
    min_mod_revision: i64,
    newest_first: bool,
}

impl GetOptions {
    pub fn new() -> GetOptions {
        GetOptions::default()
    }
    /// Every key from the request's key up to `end`, exclusive.
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.range_end = end.into();
        self
    }
    /// Every key starting with the request's key.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }
    /// At most `limit` keys (0: no limit).
    pub fn with_limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }
    /// The keys as they were at `revision`.
    pub fn with_revision(mut self, revision: i64) -> Self {
        self.revision = revision;
        self
    }
    pub fn with_keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }
    pub fn with_count_only(mut self) -> Self {
        self.count_only = true;
        self
    }
    /// Only keys last written at or after `revision`.
    pub fn with_min_mod_revision(mut self, revision: i64) -> Self {
        self.min_mod_revision = revision;
        self
    }
    /// The keys written last first (sorted by their mod revision, descending).
    pub fn with_newest_first(mut self) -> Self {
        self.newest_first = true;
        self
    }

    pub(crate) fn request(self, key: Vec<u8>) -> pb::RangeRequest {
        let range_end = if self.prefix { prefix_end(&key) } else { self.range_end };
        pb::RangeRequest {
            key,
            range_end,
            limit: self.limit,
            revision: self.revision,
            keys_only: self.keys_only,
            count_only: self.count_only,
            min_mod_revision: self.min_mod_revision,
            sort_order: if self.newest_first { pb::range_request::SortOrder::Descend as i32 } else { 0 },
            sort_target: if self.newest_first { pb::range_request::SortTarget::Mod as i32 } else { 0 },
            ..Default::default()
        }
    }
}

/// Options of a put.
#[derive(Clone, Debug, Default)]
pub struct PutOptions {
    lease: i64,
}

impl PutOptions {
    pub fn new() -> PutOptions {
        PutOptions::default()
    }
    /// The key is deleted when etcd lease `id` ends.
    pub fn with_lease(mut self, id: i64) -> Self {
        self.lease = id;
        self
    }

    pub(crate) fn request(self, key: Vec<u8>, value: Vec<u8>) -> pb::PutRequest {
        pb::PutRequest { key, value, lease: self.lease, ..Default::default() }
    }
}

/// Options of a delete.
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    range_end: Vec<u8>,
    prefix: bool,
}

impl DeleteOptions {
    pub fn new() -> DeleteOptions {
        DeleteOptions::default()
    }
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.range_end = end.into();
        self
    }
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }

    pub(crate) fn request(self, key: Vec<u8>) -> pb::DeleteRangeRequest {
        let range_end = if self.prefix { prefix_end(&key) } else { self.range_end };
        pb::DeleteRangeRequest { key, range_end, prev_kv: false }
    }
}

/// Options of a watch.
#[derive(Clone, Debug, Default)]
pub struct WatchOptions {
    prefix: bool,
    start_revision: i64,
}

impl WatchOptions {
    pub fn new() -> WatchOptions {
        WatchOptions::default()
    }
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }
    /// Every write from `revision` on (0: from the current one).
    pub fn with_start_revision(mut self, revision: i64) -> Self {
        self.start_revision = revision;
        self
    }

    pub(crate) fn request(self, key: Vec<u8>) -> pb::WatchCreateRequest {
        let range_end = if self.prefix { prefix_end(&key) } else { Vec::new() };
        pb::WatchCreateRequest { key, range_end, start_revision: self.start_revision, ..Default::default() }
    }
}

/// The first key after every key that starts with `prefix` (etcd's range end for a prefix).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff (or empty): to the end of the key space.
    vec![0]
}

/// One operation of a transaction.
#[derive(Clone, Debug)]
pub struct TxnOp(Request);

impl TxnOp {
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, options: Option<PutOptions>) -> TxnOp {
        TxnOp(Request::RequestPut(options.unwrap_or_default().request(key.into(), value.into())))
    }
    pub fn get(key: impl Into<Vec<u8>>, options: Option<GetOptions>) -> TxnOp {
        TxnOp(Request::RequestRange(options.unwrap_or_default().request(key.into())))
    }
    pub fn delete(key: impl Into<Vec<u8>>, options: Option<DeleteOptions>) -> TxnOp {
        TxnOp(Request::RequestDeleteRange(options.unwrap_or_default().request(key.into())))
    }

    fn writes(&self) -> bool {
        match &self.0 {
            Request::RequestRange(_) => false,
            Request::RequestPut(_) | Request::RequestDeleteRange(_) => true,
            Request::RequestTxn(txn) => {
                txn.success.iter().chain(&txn.failure).any(|op| !matches!(op.request, Some(Request::RequestRange(_)) | None))
            }
        }
    }
}

/// How a compare relates the key's target to the given value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    Greater,
    Less,
    NotEqual,
}

impl CompareOp {
    fn result(self) -> CompareResult {
        match self {
            CompareOp::Equal => CompareResult::Equal,
            CompareOp::Greater => CompareResult::Greater,
            CompareOp::Less => CompareResult::Less,
            CompareOp::NotEqual => CompareResult::NotEqual,
        }
    }
}

/// One condition of a transaction.
#[derive(Clone, Debug)]
pub struct Compare(pb::Compare);

impl Compare {
    fn new(key: Vec<u8>, op: CompareOp, target: CompareTarget, union: TargetUnion) -> Compare {
        Compare(pb::Compare { result: op.result() as i32, target: target as i32, key, range_end: Vec::new(), target_union: Some(union) })
    }
    /// The key's version (0: absent) compared with `version`.
    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: i64) -> Compare {
        Compare::new(key.into(), op, CompareTarget::Version, TargetUnion::Version(version))
    }
    /// The key's value compared with `value`.
    pub fn value(key: impl Into<Vec<u8>>, op: CompareOp, value: impl Into<Vec<u8>>) -> Compare {
        Compare::new(key.into(), op, CompareTarget::Value, TargetUnion::Value(value.into()))
    }
    /// The key's last write revision compared with `revision`.
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Compare {
        Compare::new(key.into(), op, CompareTarget::Mod, TargetUnion::ModRevision(revision))
    }
    /// The condition holds for every key from this one up to `end`, exclusive.
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.0.range_end = end.into();
        self
    }
}

/// A transaction: if every compare holds, the `and_then` operations, else the `or_else` ones,
/// all at one revision.
#[derive(Clone, Debug, Default)]
pub struct Txn {
    compare: Vec<Compare>,
    success: Vec<TxnOp>,
    failure: Vec<TxnOp>,
}

impl Txn {
    pub fn new() -> Txn {
        Txn::default()
    }
    pub fn when(mut self, compares: impl Into<Vec<Compare>>) -> Self {
        self.compare = compares.into();
        self
    }
    /// Adds `compare` to those already given.
    pub fn also_when(mut self, compare: Compare) -> Self {
        self.compare.push(compare);
        self
    }
    pub fn and_then(mut self, ops: impl Into<Vec<TxnOp>>) -> Self {
        self.success = ops.into();
        self
    }
    pub fn or_else(mut self, ops: impl Into<Vec<TxnOp>>) -> Self {
        self.failure = ops.into();
        self
    }

    /// Whether the transaction writes anything (a read-only one may be sent to another member
    /// after any failure; a write only when it never reached etcd).
    pub(crate) fn writes(&self) -> bool {
        self.success.iter().chain(&self.failure).any(TxnOp::writes)
    }

    pub(crate) fn request(self) -> pb::TxnRequest {
        let ops = |ops: Vec<TxnOp>| ops.into_iter().map(|op| pb::RequestOp { request: Some(op.0) }).collect();
        pb::TxnRequest { compare: self.compare.into_iter().map(|c| c.0).collect(), success: ops(self.success), failure: ops(self.failure) }
    }
}

/// The answer to one operation of a transaction.
#[derive(Clone, Debug)]
pub enum TxnOpResponse {
    Get(GetResponse),
    Put(PutResponse),
    Delete(DeleteResponse),
    Txn(TxnResponse),
}

impl pb::TxnResponse {
    pub fn succeeded(&self) -> bool {
        self.succeeded
    }
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }
    /// Whether any operation that ran was a put.
    pub fn put_any(&self) -> bool {
        self.responses.iter().any(|r| matches!(r.response, Some(Response::ResponsePut(_))))
    }
    /// The answers of the operations that ran, in order.
    pub fn op_responses(self) -> Vec<TxnOpResponse> {
        self.responses
            .into_iter()
            .filter_map(|r| {
                Some(match r.response? {
                    Response::ResponseRange(g) => TxnOpResponse::Get(g),
                    Response::ResponsePut(p) => TxnOpResponse::Put(p),
                    Response::ResponseDeleteRange(d) => TxnOpResponse::Delete(d),
                    Response::ResponseTxn(t) => TxnOpResponse::Txn(t),
                })
            })
            .collect()
    }
}

impl pb::RangeResponse {
    pub fn kvs(&self) -> &[KeyValue] {
        &self.kvs
    }
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }
    pub fn count(&self) -> i64 {
        self.count
    }
    pub fn more(&self) -> bool {
        self.more
    }
}

impl pb::ResponseHeader {
    pub fn revision(&self) -> i64 {
        self.revision
    }
    pub fn member_id(&self) -> u64 {
        self.member_id
    }
}

impl pb::KeyValue {
    pub fn key(&self) -> &[u8] {
        &self.key
    }
    pub fn value(&self) -> &[u8] {
        &self.value
    }
    pub fn mod_revision(&self) -> i64 {
        self.mod_revision
    }
    pub fn create_revision(&self) -> i64 {
        self.create_revision
    }
    pub fn version(&self) -> i64 {
        self.version
    }
    pub fn lease(&self) -> i64 {
        self.lease
    }
}

impl pb::Event {
    pub fn kv(&self) -> Option<&KeyValue> {
        self.kv.as_ref()
    }
    /// Put or delete (an unknown kind reads as a delete: whatever is not a put is not data).
    pub fn event_type(&self) -> EventType {
        EventType::try_from(self.r#type).unwrap_or(EventType::Delete)
    }
}

impl pb::WatchResponse {
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }
    pub fn events(&self) -> &[Event] {
        &self.events
    }
    pub fn canceled(&self) -> bool {
        self.canceled
    }
    pub fn created(&self) -> bool {
        self.created
    }
    pub fn compact_revision(&self) -> i64 {
        self.compact_revision
    }
    pub fn cancel_reason(&self) -> &str {
        &self.cancel_reason
    }
}

impl pb::StatusResponse {
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }
    /// The member id of the leader this member knows (0: none).
    pub fn leader(&self) -> u64 {
        self.leader
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_are_the_next_key_after_the_prefix() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn a_transaction_writes_when_either_branch_does() {
        assert!(!Txn::new().and_then(vec![TxnOp::get("k", None)]).writes());
        assert!(Txn::new().and_then(vec![TxnOp::get("k", None)]).or_else(vec![TxnOp::delete("k", None)]).writes());
        assert!(Txn::new().and_then(vec![TxnOp::put("k", "v", None)]).writes());
    }
}
