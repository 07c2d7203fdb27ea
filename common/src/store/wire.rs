//! Wire types of the control API: request bodies and the structured error that lets a remote
//! client rebuild the exact [`StoreError`] the server's store returned.
//!
//! Plans travel as codec envelopes (`application/octet-stream`); everything else is JSON.

use super::{ApplyItem, ApplyOutcome, PauseState, StoreError};
use crate::codec::CodecError;
use crate::generation::Generation;
use crate::names::DnsName;
use crate::plan::Endpoint;
use serde::{Deserialize, Serialize};

/// Body of `PUT /v1/active/{endpoint}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ApplyRequest {
    pub generation: Generation,
    pub records: Endpoint,
}

/// Body of `POST /v1/apply`: a batch apply.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ApplyManyRequest {
    pub generation: Generation,
    pub items: Vec<ApplyItem>,
}

/// Answer of `POST /v1/apply`: one result per item, in order.
pub type ApplyManyResponse = Vec<Result<ApplyOutcome, WireError>>;

/// Query of `GET /v1/active`. With a `limit`, the answer is one `ActivePage` of the endpoints
/// after `after`; without, the whole `ActiveSnapshot`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ActiveQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// Query of `GET /v1/changes`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChangesQuery {
    pub since: u64,
}

/// Query of `GET /v1/plans/{generation}/changes`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChangesFrom {
    pub from: u64,
}

/// Body of `POST /v1/active/{endpoint}/retire`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RetireRequest {
    pub generation: Generation,
}

/// Body of `POST /v1/cleanup` and query of `GET /v1/cleanup`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CleanupRequest {
    pub retain: u64,
}

/// Body of `POST /v1/lease`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AcquireLeaseRequest {
    pub holder: String,
    pub ttl_ms: u64,
}

/// Headers of a leased `POST /v1/plans`: the lease holder and its epoch.
pub const LEASE_HOLDER_HEADER: &str = "x-dnsplan-lease-holder";
pub const LEASE_EPOCH_HEADER: &str = "x-dnsplan-lease-epoch";

/// Query of `GET /v1/plans`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ListQuery {
    pub from: Generation,
    pub limit: usize,
}

/// Query of `GET /v1/wait`: the version the caller has seen, and how long it will wait.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
pub struct ErrorBody {
    pub error: WireError,
    /// The same error as a sentence a person can act on.
    pub message: String,
}

/// [`StoreError`] in a form that survives JSON, plus the control API's own refusals.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
        detail: String,
    },
    TooLong {
        what: String,
        len: usize,
        max: usize,
    },
    TooManyHeartbeats,
    Corrupt {
        detail: String,
    },
    Io {
        detail: String,
    },
    Unavailable {
        detail: String,
    },
    /// The request lacked a valid bearer token.
    Unauthorized,
    /// The request itself was malformed (bad body, bad name, bad envelope).
    BadRequest {
        detail: String,
    },
}

impl WireError {
    /// The HTTP status the control API answers with.
    pub fn status(&self) -> u16 {
        match self {
            WireError::Conflict { .. } | WireError::Stale { .. } | WireError::Unpublished { .. } | WireError::Exhausted { .. } => 409,
            WireError::Paused { .. } | WireError::LeaseHeld { .. } => 423,
            WireError::NotLeaseHolder { .. } => 409,
            WireError::Pruned { .. } => 410,
            WireError::PlanNotFound { .. } => 404,
            WireError::DnsZoneMismatch { .. } | WireError::Invalid { .. } => 422,
            WireError::TooLong { .. } => 413,
            WireError::TooManyHeartbeats => 429,
            WireError::Unauthorized => 401,
            WireError::BadRequest { .. } => 400,
            WireError::Corrupt { .. } | WireError::Io { .. } => 500,
            WireError::Unavailable { .. } => 503,
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
            StoreError::Invalid(e) => WireError::Invalid { detail: e.to_string() },
            StoreError::TooLong { what, len, max } => WireError::TooLong { what: (*what).to_owned(), len: *len, max: *max },
            StoreError::TooManyHeartbeats => WireError::TooManyHeartbeats,
            StoreError::Corrupt { what, source } => WireError::Corrupt { detail: format!("{what}: {source}") },
            StoreError::Io(e) => WireError::Io { detail: e.to_string() },
            StoreError::Unavailable(d) => WireError::Unavailable { detail: d.clone() },
            StoreError::Unauthorized => WireError::Unauthorized,
            StoreError::BadRequest(d) => WireError::BadRequest { detail: d.clone() },
            StoreError::Rejected(d) => WireError::Invalid { detail: d.clone() },
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
            // The validation error's structure stays on the server; its text travels.
            WireError::Invalid { detail } => StoreError::Rejected(format!("invalid: {detail}")),
            WireError::TooLong { what, len, max } => StoreError::Rejected(format!("{what} is too long ({len} bytes, limit {max})")),
            WireError::TooManyHeartbeats => StoreError::TooManyHeartbeats,
            WireError::Corrupt { detail } => StoreError::Corrupt { what: detail, source: CodecError::ChecksumMismatch },
            WireError::Io { detail } => StoreError::Unavailable(format!("server store I/O failed: {detail}")),
            WireError::Unavailable { detail } => StoreError::Unavailable(detail),
            WireError::Unauthorized => StoreError::Unauthorized,
            WireError::BadRequest { detail } => StoreError::BadRequest(detail),
        }
    }
}
