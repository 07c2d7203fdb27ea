//! Wire types of the control API: request bodies and the structured error that lets a remote
//! client rebuild the [`StoreError`] the server's store returned.
//!
//! Every variant travels with its fields, so the client's error has the server's variant and
//! says the same thing (`tests` hold this for every variant). The one loss: an `Io` error's
//! source arrives as its text, not as the original error type.
//!
//! Plans travel as codec envelopes (`application/octet-stream`); everything else is JSON.

use super::{ApplyItem, ApplyOutcome, PauseState, PlanSays, StoreError};
use crate::codec::CodecError;
use crate::generation::Generation;
use crate::names::DnsName;
use crate::plan::{Endpoint, ValidationError};
use serde::{Deserialize, Serialize};

/// Body of `PUT /v1/active/{endpoint}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyRequest {
    pub generation: Generation,
    pub records: Endpoint,
}

/// Body of `POST /v1/apply`: a batch apply.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyManyRequest {
    pub generation: Generation,
    pub items: Vec<ApplyItem>,
}

/// A batch as a codec envelope (`application/octet-stream`), as `RemoteStore` sends it: a
/// batch of 1,024 items decodes several times faster than as JSON. JSON is still taken.
impl crate::codec::Record for ApplyManyRequest {
    const KIND: u8 = 13;
    const KIND_NAME: &'static str = "apply batch";
    const BODY_BYTES_MAX: usize = crate::codec::BODY_BYTES_MAX;
}

/// Answer of `POST /v1/apply`: one result per item, in order.
pub type ApplyManyResponse = Vec<Result<ApplyOutcome, WireError>>;

/// Query of `GET /v1/active`. With a `limit`, the answer is one `ActivePage` of the endpoints
/// after `after`; without, the whole `ActiveSnapshot`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActiveQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// Query of `GET /v1/changes`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangesQuery {
    pub since: u64,
}

/// Query of `GET /v1/plans/{generation}/changes`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangesFrom {
    pub from: u64,
}

/// Body of `POST /v1/active/{endpoint}/retire`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetireRequest {
    pub generation: Generation,
}

/// Body of `POST /v1/cleanup` and query of `GET /v1/cleanup`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CleanupRequest {
    pub retain: u64,
}

/// Body of `POST /v1/lease`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireLeaseRequest {
    pub holder: String,
    pub ttl_ms: u64,
}

/// Headers of a leased `POST /v1/plans`: the lease holder and its epoch.
pub const LEASE_HOLDER_HEADER: &str = "x-dnsplan-lease-holder";
pub const LEASE_EPOCH_HEADER: &str = "x-dnsplan-lease-epoch";

/// Query of `GET /v1/plans`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub from: Generation,
    pub limit: usize,
}

/// Query of `GET /v1/wait`: the version the caller has seen, and how long it will wait.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    pub latest: Generation,
    pub applied_changes: u64,
    pub control_changes: u64,
    pub timeout_ms: u64,
}

/// Body of `PUT /v1/pause`.
pub type PauseRequest = PauseState;

/// The error body of every failed control API call: `{"error": {...}, "message": "..."}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    pub error: WireError,
    /// The same error as a sentence a person can act on.
    pub message: String,
}

/// [`StoreError`] in a form that survives JSON, plus the control API's own refusals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WireError {
    Conflict {
        attempted: Generation,
        parent: Generation,
        latest: Generation,
    },
    Paused {
        reason: String,
        by: String,
    },
    Stale {
        endpoint: DnsName,
        active: Generation,
        attempted: Generation,
    },
    ContentMismatch {
        endpoint: DnsName,
        generation: Generation,
        plan: PlanSays,
    },
    Unpublished {
        attempted: Generation,
        latest: Generation,
    },
    Pruned {
        attempted: Generation,
        horizon: Generation,
    },
    PlanNotFound {
        generation: Generation,
    },
    LeaseHeld {
        holder: String,
        epoch: u64,
        expires_in_ms: u64,
    },
    NotLeaseHolder {
        holder: Option<String>,
        epoch: u64,
        attempted_epoch: u64,
    },
    DnsZoneMismatch {
        attempted: DnsName,
        stored: DnsName,
    },
    Exhausted {
        latest: Generation,
    },
    Invalid {
        error: ValidationError,
    },
    TooLong {
        what: String,
        len: usize,
        max: usize,
    },
    TooManyHeartbeats,
    Corrupt {
        what: String,
        source: CodecError,
    },
    Io {
        detail: String,
    },
    Unavailable {
        detail: String,
    },
    /// The embedded store went back behind its high-water mark.
    WentBack {
        detail: String,
    },
    /// The request lacked a valid bearer token.
    Unauthorized,
    /// The credential's roles do not allow the request.
    Forbidden {
        detail: String,
    },
    /// The request itself was malformed (bad body, bad name, bad envelope).
    BadRequest {
        detail: String,
    },
    /// A plan the keyring does not trust.
    Untrusted {
        detail: String,
    },
    /// A zone change the zones served refuse (the managed zone, a zone of the config file, a
    /// serial not newer than the one served).
    ZoneConflict {
        detail: String,
    },
    /// No such zone is served.
    ZoneNotFound {
        detail: String,
    },
    /// The managed zone was removed or never added.
    ZoneGone {
        zone: DnsName,
    },
}

impl WireError {
    /// The HTTP status the control API answers with.
    pub fn status(&self) -> u16 {
        match self {
            WireError::Conflict { .. } | WireError::Stale { .. } | WireError::Unpublished { .. } | WireError::Exhausted { .. } => 409,
            WireError::Paused { .. } | WireError::LeaseHeld { .. } => 423,
            WireError::NotLeaseHolder { .. } => 409,
            WireError::Pruned { .. } | WireError::ZoneGone { .. } => 410,
            WireError::PlanNotFound { .. } => 404,
            WireError::DnsZoneMismatch { .. }
            | WireError::Invalid { .. }
            | WireError::ContentMismatch { .. }
            | WireError::Untrusted { .. } => 422,
            WireError::TooLong { .. } => 413,
            WireError::TooManyHeartbeats => 429,
            WireError::Unauthorized => 401,
            WireError::Forbidden { .. } => 403,
            WireError::BadRequest { .. } => 400,
            WireError::ZoneConflict { .. } => 409,
            WireError::ZoneNotFound { .. } => 404,
            WireError::Corrupt { .. } | WireError::Io { .. } => 500,
            WireError::Unavailable { .. } | WireError::WentBack { .. } => 503,
        }
    }
}

impl From<&StoreError> for WireError {
    fn from(err: &StoreError) -> WireError {
        match err {
            StoreError::Conflict { attempted, parent, latest } => {
                WireError::Conflict { attempted: *attempted, parent: *parent, latest: *latest }
            }
            StoreError::Paused { reason, by } => WireError::Paused { reason: reason.clone(), by: by.clone() },
            StoreError::Stale { endpoint, active, attempted } => {
                WireError::Stale { endpoint: endpoint.clone(), active: *active, attempted: *attempted }
            }
            StoreError::Unpublished { attempted, latest } => WireError::Unpublished { attempted: *attempted, latest: *latest },
            StoreError::Pruned { attempted, horizon } => WireError::Pruned { attempted: *attempted, horizon: *horizon },
            StoreError::PlanNotFound(g) => WireError::PlanNotFound { generation: *g },
            StoreError::LeaseHeld { holder, epoch, expires_in_ms } => {
                WireError::LeaseHeld { holder: holder.clone(), epoch: *epoch, expires_in_ms: *expires_in_ms }
            }
            StoreError::NotLeaseHolder { holder, epoch, attempted_epoch } => {
                WireError::NotLeaseHolder { holder: holder.clone(), epoch: *epoch, attempted_epoch: *attempted_epoch }
            }
            StoreError::DnsZoneMismatch { attempted, stored } => {
                WireError::DnsZoneMismatch { attempted: attempted.clone(), stored: stored.clone() }
            }
            StoreError::Exhausted(g) => WireError::Exhausted { latest: *g },
            StoreError::ContentMismatch { endpoint, generation, plan } => {
                WireError::ContentMismatch { endpoint: endpoint.clone(), generation: *generation, plan: *plan }
            }
            StoreError::Invalid(e) => WireError::Invalid { error: e.clone() },
            StoreError::TooLong { what, len, max } => WireError::TooLong { what: what.to_string(), len: *len, max: *max },
            StoreError::TooManyHeartbeats => WireError::TooManyHeartbeats,
            StoreError::Corrupt { what, source } => WireError::Corrupt { what: what.clone(), source: source.clone() },
            StoreError::Io(e) => WireError::Io { detail: error_chain(e.as_ref()) },
            StoreError::Unavailable(d) => WireError::Unavailable { detail: d.clone() },
            StoreError::WentBack(d) => WireError::WentBack { detail: d.clone() },
            StoreError::Unauthorized => WireError::Unauthorized,
            StoreError::Forbidden(d) => WireError::Forbidden { detail: d.clone() },
            StoreError::Untrusted(d) => WireError::Untrusted { detail: d.clone() },
            StoreError::BadRequest(d) => WireError::BadRequest { detail: d.clone() },
            StoreError::ZoneGone { zone } => WireError::ZoneGone { zone: zone.clone() },
        }
    }
}

impl From<WireError> for StoreError {
    fn from(err: WireError) -> StoreError {
        match err {
            WireError::Conflict { attempted, parent, latest } => StoreError::Conflict { attempted, parent, latest },
            WireError::Paused { reason, by } => StoreError::Paused { reason, by },
            WireError::Stale { endpoint, active, attempted } => StoreError::Stale { endpoint, active, attempted },
            WireError::Unpublished { attempted, latest } => StoreError::Unpublished { attempted, latest },
            WireError::Pruned { attempted, horizon } => StoreError::Pruned { attempted, horizon },
            WireError::PlanNotFound { generation } => StoreError::PlanNotFound(generation),
            WireError::LeaseHeld { holder, epoch, expires_in_ms } => StoreError::LeaseHeld { holder, epoch, expires_in_ms },
            WireError::NotLeaseHolder { holder, epoch, attempted_epoch } => StoreError::NotLeaseHolder { holder, epoch, attempted_epoch },
            WireError::DnsZoneMismatch { attempted, stored } => StoreError::DnsZoneMismatch { attempted, stored },
            WireError::Exhausted { latest } => StoreError::Exhausted(latest),
            WireError::ContentMismatch { endpoint, generation, plan } => StoreError::ContentMismatch { endpoint, generation, plan },
            WireError::Invalid { error } => StoreError::Invalid(error),
            WireError::TooLong { what, len, max } => StoreError::TooLong { what: what.into(), len, max },
            WireError::TooManyHeartbeats => StoreError::TooManyHeartbeats,
            WireError::Corrupt { what, source } => StoreError::Corrupt { what, source },
            WireError::Io { detail } => StoreError::Io(Box::new(RemoteIo(detail))),
            WireError::Unavailable { detail } => StoreError::Unavailable(detail),
            WireError::WentBack { detail } => StoreError::WentBack(detail),
            WireError::Unauthorized => StoreError::Unauthorized,
            WireError::Forbidden { detail } => StoreError::Forbidden(detail),
            WireError::Untrusted { detail } => StoreError::Untrusted(detail),
            WireError::BadRequest { detail } => StoreError::BadRequest(detail),
            WireError::ZoneGone { zone } => StoreError::ZoneGone { zone },
            // Not store calls: a store that receives one was asked something it never asks.
            WireError::ZoneConflict { detail } | WireError::ZoneNotFound { detail } => StoreError::BadRequest(detail),
        }
    }
}

/// The text of an error and its sources, `outer: inner: ...`.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// The server's I/O error as it arrives: its text.
#[derive(Debug)]
struct RemoteIo(String);

impl std::fmt::Display for RemoteIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RemoteIo {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::EndpointName;
    use proptest::prelude::*;

    /// Which variant `err` is. No wildcard arm: a new variant does not compile until the
    /// round-trip test below builds it too.
    fn variant(err: &StoreError) -> usize {
        match err {
            StoreError::Conflict { .. } => 0,
            StoreError::Paused { .. } => 1,
            StoreError::ContentMismatch { .. } => 2,
            StoreError::Stale { .. } => 3,
            StoreError::Unpublished { .. } => 4,
            StoreError::Pruned { .. } => 5,
            StoreError::LeaseHeld { .. } => 6,
            StoreError::NotLeaseHolder { .. } => 7,
            StoreError::PlanNotFound(_) => 8,
            StoreError::DnsZoneMismatch { .. } => 9,
            StoreError::Exhausted(_) => 10,
            StoreError::Invalid(_) => 11,
            StoreError::TooLong { .. } => 12,
            StoreError::TooManyHeartbeats => 13,
            StoreError::Corrupt { .. } => 14,
            StoreError::Io(_) => 15,
            StoreError::Unavailable(_) => 16,
            StoreError::Unauthorized => 17,
            StoreError::BadRequest(_) => 18,
            StoreError::WentBack(_) => 19,
            StoreError::ZoneGone { .. } => 20,
            StoreError::Forbidden(_) => 21,
            StoreError::Untrusted(_) => 22,
        }
    }
    const VARIANTS: usize = 23;

    fn build(index: usize, g: u64, n: u64, text: &str, label: &str) -> StoreError {
        let name = |l: &str| EndpointName::parse(&format!("{l}.example.test.")).expect("name");
        let says = [PlanSays::OtherRecords, PlanSays::Serves, PlanSays::Retires, PlanSays::NothingOf][(n % 4) as usize];
        match index {
            0 => StoreError::Conflict { attempted: Generation(g), parent: Generation(n), latest: Generation(g ^ n) },
            1 => StoreError::Paused { reason: text.into(), by: label.into() },
            2 => StoreError::ContentMismatch { endpoint: name(label), generation: Generation(g), plan: says },
            3 => StoreError::Stale { endpoint: name(label), active: Generation(g), attempted: Generation(n) },
            4 => StoreError::Unpublished { attempted: Generation(g), latest: Generation(n) },
            5 => StoreError::Pruned { attempted: Generation(g), horizon: Generation(n) },
            6 => StoreError::LeaseHeld { holder: text.into(), epoch: g, expires_in_ms: n },
            7 => StoreError::NotLeaseHolder { holder: n.is_multiple_of(2).then(|| text.to_owned()), epoch: g, attempted_epoch: n },
            8 => StoreError::PlanNotFound(Generation(g)),
            9 => StoreError::DnsZoneMismatch { attempted: name(label), stored: name("other") },
            10 => StoreError::Exhausted(Generation(g)),
            11 => StoreError::Invalid(match n % 3 {
                0 => ValidationError::EmptyEndpoint { endpoint: name(label) },
                1 => ValidationError::DuplicateAddress { endpoint: name(label), address: [192, 0, 2, (g % 256) as u8].into() },
                _ => ValidationError::RetireByAutomation { author: text.into(), endpoint: name(label) },
            }),
            12 => StoreError::TooLong { what: text.to_owned().into(), len: g as usize, max: n as usize },
            13 => StoreError::TooManyHeartbeats,
            14 => StoreError::Corrupt {
                what: text.into(),
                source: match n % 3 {
                    0 => CodecError::ChecksumMismatch,
                    1 => CodecError::Body { kind: "plan".into(), detail: label.into() },
                    _ => CodecError::Invalid(ValidationError::NoEndpoints),
                },
            },
            15 => StoreError::Io(Box::new(std::io::Error::other(text.to_owned()))),
            16 => StoreError::Unavailable(text.into()),
            17 => StoreError::Unauthorized,
            19 => StoreError::WentBack(text.into()),
            20 => StoreError::ZoneGone { zone: name(label) },
            21 => StoreError::Forbidden(text.into()),
            22 => StoreError::Untrusted(text.into()),
            _ => StoreError::BadRequest(text.into()),
        }
    }

    fn chain(err: &StoreError) -> String {
        error_chain(err)
    }

    proptest! {
        /// Every `StoreError` crosses the control API (to `WireError`, JSON and back) as the
        /// same variant with the same fields and the same text, sources included.
        #[test]
        fn every_store_error_round_trips(index in 0..VARIANTS, g in any::<u64>(), n in any::<u64>(), text in ".{0,40}", label in "[a-z]{1,12}") {
            let sent = build(index, g, n, &text, &label);
            prop_assert_eq!(variant(&sent), index);
            let wire = WireError::from(&sent);
            let json = serde_json::to_string(&wire).expect("encode");
            let received = StoreError::from(serde_json::from_str::<WireError>(&json).expect("decode"));
            prop_assert_eq!(variant(&received), index);
            prop_assert_eq!(WireError::from(&received), wire);
            prop_assert_eq!(chain(&received), chain(&sent));
        }
    }
}
