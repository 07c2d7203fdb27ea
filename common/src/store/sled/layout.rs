//! The meta tree's keys, the key encodings shared by the trees, and the errors they raise.

use super::*;

pub(super) const META_LATEST: &[u8] = b"latest";

pub(super) const META_HORIZON: &[u8] = b"horizon";

/// The generation the first plan follows (`Store::generation_base`), for a zone added again
/// under a removed zone's name; absent: `Generation::NONE`.
pub(super) const META_GENERATION_BASE: &[u8] = b"generation_base";

pub(super) const META_APPLIED: &[u8] = b"applied_changes";

pub(super) const META_CONTENT: &[u8] = b"content_changes";

pub(super) const META_CONTROL: &[u8] = b"control_changes";

pub(super) const META_DNS_ZONE: &[u8] = b"dns_zone";

/// A random `u64` drawn when the store is first opened: the store's part of a [`HistoryMark`].
pub(super) const META_STORE_ID: &[u8] = b"store_id";

pub(super) const META_PAUSE: &[u8] = b"pause";

/// When the database was last reopened after a failed write (Unix milliseconds): the write
/// that proves a reopened database writes again.
pub(super) const META_REOPENED: &[u8] = b"reopened";

pub(super) const META_LEASE: &[u8] = b"lease";

/// The zone's shared DNSSEC keys (`Store::dnssec_keys`): their version (8 bytes, big-endian)
/// then the record.
pub(super) const META_DNSSEC_KEYS: &[u8] = b"dnssec_keys";

pub(super) fn io(err: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Io(Box::new(err))
}

pub(super) fn corrupt(what: impl Into<String>, source: codec::CodecError) -> StoreError {
    StoreError::Corrupt { what: what.into(), source }
}

pub(super) fn tx_error(err: TransactionError<StoreError>) -> StoreError {
    match err {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => io(e),
    }
}

pub(super) fn parse_name(bytes: &[u8], what: &str) -> StoreResult<EndpointName> {
    DnsName::parse(&String::from_utf8_lossy(bytes))
        .map_err(|e| corrupt(what, codec::CodecError::Body { kind: "endpoint name".into(), detail: e.to_string() }))
}

pub(super) fn generation_key(key: &[u8]) -> StoreResult<Generation> {
    let array: [u8; 8] = key.try_into().map_err(|_| corrupt("plan key", codec::CodecError::Truncated { len: key.len() }))?;
    Ok(Generation::from_be_bytes(array))
}

pub(super) fn change_key(key: &[u8]) -> StoreResult<u64> {
    let array: [u8; 8] = key.try_into().map_err(|_| corrupt("change log key", codec::CodecError::Truncated { len: key.len() }))?;
    Ok(u64::from_be_bytes(array))
}

pub(super) fn poisoned() -> StoreError {
    StoreError::Unavailable("store lock poisoned by an earlier failure; restart the process".into())
}
