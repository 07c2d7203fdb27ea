//! dnsplan's etcd v3 client: a gRPC channel to each member of the cluster, and every call sent
//! to one member and moved to the next when that member cannot be reached.
//!
//! Why our own and not a crate's: the common Rust etcd clients balance calls over all members
//! through one channel, and a call that lands on a dead member fails instead of moving on (with
//! a follower of three down, a third to a half of all calls failed); and their build scripts
//! need `protoc`. Here the generated code of the part of etcd's API we use is checked in
//! (`etcdserverpb.rs`, from `etcd/proto/etcd.proto`; `etcd/tests/proto.rs` checks it), so a
//! build needs nothing but Rust.
//!
//! Failover, the rule of etcd's own Go client:
//! - a call goes to the member that last answered (the *preferred* one), then to the others in
//!   order, members that failed in the last [`MEMBER_HOLD`] last of all;
//! - a read (a range, a transaction without writes, a status, a watch) moves on after any
//!   answer that says the member failed: `Unavailable` (down, partitioned, without a leader),
//!   a lost connection, a call cancelled by a member killed under it, a timeout;
//! - a write moves on only when it never left this process: the member could not be connected
//!   to (refused, unreachable, or no connection within the connect timeout). A write that
//!   reached a member and then failed is ambiguous (etcd may have committed it); the store
//!   above settles those by reading what etcd holds.
//!
//! So with a quorum up, no call fails because one member is down, and a call to a dead member
//! moves to a live one within one connect timeout (at once when the member's port refuses).
//!
//! Not here: deadlines of whole calls (the store wraps each call in its request timeout),
//! transaction builders and answers' accessors (`ops`).

mod ops;

/// etcd's v3 API as prost and tonic generate it (see `etcd/proto/etcd.proto`).
#[allow(clippy::all, clippy::pedantic, missing_docs, unreachable_pub)]
pub mod pb {
    include!("etcdserverpb.rs");
}

pub use ops::Compare;
pub use ops::{
    CompareOp, DeleteOptions, DeleteResponse, Event, EventType, GetOptions, GetResponse, KeyValue, PutOptions, PutResponse, ResponseHeader,
    StatusResponse, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchOptions, WatchResponse, prefix_end,
};

use pb::auth_client::AuthClient;
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::maintenance_client::MaintenanceClient;
use pb::watch_client::WatchClient;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use thiserror::Error;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

/// How long a member that failed is tried after the others: long enough that calls do not
/// keep knocking at a dead member, short enough that a restarted one is used again soon.
pub const MEMBER_HOLD: Duration = Duration::from_secs(2);
/// A connection to a member within this long, or the member counts as unreachable. Members
/// answer a connect in a millisecond on a LAN; 1 s rides out a lost SYN (retried by the kernel
/// after 1 s) only just, so a partitioned member costs a call at most about this much.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);
/// Requests queued on a watch stream (only its create request is ever sent).
const WATCH_REQUESTS_MAX: usize = 4;

/// How to reach the cluster.
#[derive(Clone)]
pub struct ClientOptions {
    pub connect_timeout: Duration,
    /// HTTP/2 pings this often on an open connection, and the connection is dropped when one
    /// is not answered within the second duration: a member that vanished without closing its
    /// connections is noticed.
    pub keep_alive: Option<(Duration, Duration)>,
    /// User and password, when the cluster has authentication on.
    pub user: Option<(String, String)>,
    /// For `https://` members.
    pub tls: Option<EtcdTls>,
    /// The largest answer decoded.
    pub response_bytes_max: usize,
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions {
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            keep_alive: None,
            user: None,
            tls: None,
            // tonic's default.
            response_bytes_max: 4 * 1024 * 1024,
        }
    }
}

/// TLS to etcd: the CA that signed the members' certificates and, when the members check
/// their clients (`--client-cert-auth`), this client's certificate and key. All PEM.
#[derive(Clone)]
pub struct EtcdTls {
    pub ca_pem: Vec<u8>,
    /// The client's certificate (chain) and private key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("identity", &self.identity.as_ref().map(|_| "<certificate and hidden key>"))
            .finish()
    }
}

#[derive(Debug, Error)]
pub enum Error {
    #[error("etcd endpoint {url:?}: {detail}")]
    Endpoint { url: String, detail: String },
    /// The answer of a member (or of the path to it). The status is not the error's source:
    /// its text is in this one's.
    #[error("etcd at {member}: {} ({:?})", status.message(), status.code())]
    Status { member: String, status: Status },
    #[error("etcd watch: {0}")]
    Watch(String),
    #[error("etcd answered something unusable: {0}")]
    Answer(String),
}

impl Error {
    /// The gRPC code etcd (or the way to it) answered with, if any.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Status { status, .. } => Some(status.code()),
            _ => None,
        }
    }

    /// Whether etcd, or the way to it, is unavailable (as opposed to etcd refusing the
    /// request): down, partitioned, without a leader, or too slow.
    pub fn is_unavailable(&self) -> bool {
        match self {
            // `Unknown` with an error under it is the connection failing mid-call (hyper or h2).
            Error::Status { status, .. } => {
                matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled)
                    || (status.code() == Code::Unknown && std::error::Error::source(status).is_some())
            }
            Error::Watch(_) => true,
            Error::Endpoint { .. } | Error::Answer(_) => false,
        }
    }
}

/// Whether a call may go to another member after `status`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// A read: after any `Unavailable`.
    Read,
    /// A write: only when it never reached a member.
    Write,
}

/// Whether the call failed before any byte of it reached the member: tonic answers a failed
/// connection with `Unavailable` and the connector's own message (hyper's "tcp connect error"
/// for a refused, unreachable or timed-out connect; a TLS handshake error otherwise), while
/// etcd's own `Unavailable` answers start with "etcdserver:" and a connection lost mid-call
/// is a hyper or h2 error ("connection reset", "broken pipe", "stream closed").
fn never_sent(status: &Status) -> bool {
    status.code() == Code::Unavailable && {
        let message = status.message();
        message.contains("connect error") || message.contains("error trying to connect") || message.contains("handshake")
    }
}

/// Whether a call goes on to the next member after `status`. A read does after anything that
/// says the member or the way to it failed: `Unavailable`, `Unknown` (a connection error under
/// it), `Cancelled` (hyper's "operation was canceled": the member was killed while the call was
/// in flight) and `DeadlineExceeded`; never after etcd's own refusals. A write only when it
/// never reached the member: otherwise it may have committed, and the store settles it.
fn moves_on(retry: Retry, status: &Status) -> bool {
    match retry {
        Retry::Read => {
            matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded)
                && !is_invalid_token(status)
        }
        Retry::Write => never_sent(status),
    }
}

/// etcd's answer to a token it no longer knows (a restarted member forgets simple tokens).
fn is_invalid_token(status: &Status) -> bool {
    status.code() == Code::Unauthenticated && status.message().contains("invalid auth token")
}

struct Member {
    url: String,
    channel: Channel,
    /// When a call to this member last failed for want of the member.
    failed_at: Mutex<Option<Instant>>,
}

struct Shared {
    members: Vec<Member>,
    /// The member that answered last: calls start there.
    preferred: AtomicUsize,
    user: Option<(String, String)>,
    token: RwLock<Option<MetadataValue<Ascii>>>,
    response_bytes_max: usize,
}

/// A client of one etcd cluster. Clones share the connections.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

impl Client {
    /// Sets up a channel to each member. Nothing is connected until the first call, so a
    /// client can be made while etcd is down.
    pub fn new(endpoints: &[String], options: &ClientOptions) -> Result<Client, Error> {
        if endpoints.is_empty() {
            return Err(Error::Endpoint { url: String::new(), detail: "no endpoints".into() });
        }
        let mut members = Vec::with_capacity(endpoints.len());
        for url in endpoints {
            let bad = |detail: String| Error::Endpoint { url: url.clone(), detail };
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| bad(format!("not a URL: {e}")))?
                .connect_timeout(options.connect_timeout)
                .tcp_nodelay(true);
            if let Some((interval, timeout)) = options.keep_alive {
                endpoint = endpoint.http2_keep_alive_interval(interval).keep_alive_timeout(timeout);
            }
            if let Some(EtcdTls { ca_pem, identity }) = &options.tls {
                let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
                if let Some((cert, key)) = identity {
                    tls = tls.identity(Identity::from_pem(cert, key));
                }
                endpoint = endpoint.tls_config(tls).map_err(|e| bad(format!("TLS: {e}")))?;
            }
            members.push(Member { url: url.clone(), channel: endpoint.connect_lazy(), failed_at: Mutex::new(None) });
        }
        Ok(Client {
            shared: Arc::new(Shared {
                members,
                preferred: AtomicUsize::new(0),
                user: options.user.clone(),
                token: RwLock::new(None),
                response_bytes_max: options.response_bytes_max,
            }),
        })
    }

    /// The members' URLs, as configured.
    pub fn endpoints(&self) -> Vec<String> {
        self.shared.members.iter().map(|m| m.url.clone()).collect()
    }

    /// The member calls go to first now (the one that answered last).
    pub fn preferred_endpoint(&self) -> &str {
        &self.shared.members[self.shared.preferred.load(Ordering::Relaxed) % self.shared.members.len()].url
    }

    /// The order in which a call tries the members: from the preferred one on, members that
    /// failed within [`MEMBER_HOLD`] last.
    fn order(&self) -> Vec<usize> {
        let n = self.shared.members.len();
        let start = self.shared.preferred.load(Ordering::Relaxed) % n;
        let now = Instant::now();
        let (mut fresh, mut held) = (Vec::with_capacity(n), Vec::new());
        for i in (0..n).map(|k| (start + k) % n) {
            let failed = self.shared.members[i].failed_at.lock().ok().and_then(|f| *f);
            match failed {
                Some(at) if now.duration_since(at) < MEMBER_HOLD => held.push(i),
                _ => fresh.push(i),
            }
        }
        fresh.extend(held);
        fresh
    }

    fn answered(&self, i: usize) {
        self.shared.preferred.store(i, Ordering::Relaxed);
        if let Ok(mut failed) = self.shared.members[i].failed_at.lock() {
            *failed = None;
        }
    }

    fn failed(&self, i: usize, status: &Status) {
        let member = &self.shared.members[i];
        tracing::debug!(member = %member.url, code = ?status.code(), message = status.message(), "etcd member failed a call; trying the next");
        if let Ok(mut failed) = member.failed_at.lock() {
            *failed = Some(Instant::now());
        }
    }

    fn token(&self) -> Option<MetadataValue<Ascii>> {
        self.shared.token.read().ok().and_then(|t| t.clone())
    }

    /// A token for the configured user, asked of the members in turn.
    async fn authenticate(&self) -> Result<(), Error> {
        let Some((name, password)) = self.shared.user.clone() else { return Ok(()) };
        let request = pb::AuthenticateRequest { name, password };
        let answer = self
            .each_member(Retry::Read, None, request, |channel, request| async move { AuthClient::new(channel).authenticate(request).await })
            .await?;
        let token = MetadataValue::try_from(answer.token.as_str())
            .map_err(|e| Error::Answer(format!("an authentication token that is not header text: {e}")))?;
        if let Ok(mut t) = self.shared.token.write() {
            *t = Some(token);
        }
        Ok(())
    }

    /// `call` with `request` on each member in turn (see the module's doc) until one answers
    /// or the failure is not one to move on from.
    async fn each_member<Req, Resp, F, Fut>(
        &self,
        retry: Retry,
        token: Option<&MetadataValue<Ascii>>,
        request: Req,
        call: F,
    ) -> Result<Resp, Error>
    where
        Req: Clone,
        F: Fn(Channel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let mut last = None;
        for i in self.order() {
            let member = &self.shared.members[i];
            let mut r = tonic::Request::new(request.clone());
            if let Some(token) = token {
                r.metadata_mut().insert("token", token.clone());
            }
            match call(member.channel.clone(), r).await {
                Ok(answer) => {
                    self.answered(i);
                    return Ok(answer.into_inner());
                }
                Err(status) if moves_on(retry, &status) => {
                    self.failed(i, &status);
                    last = Some(Error::Status { member: member.url.clone(), status });
                }
                Err(status) => return Err(Error::Status { member: member.url.clone(), status }),
            }
        }
        Err(last.unwrap_or_else(|| Error::Endpoint { url: String::new(), detail: "no endpoints".into() }))
    }

    /// A call with the authentication token when the cluster wants one: fetched before the
    /// first call, and again once when a member says it no longer knows it.
    async fn call<Req, Resp, F, Fut>(&self, retry: Retry, request: Req, call: F) -> Result<Resp, Error>
    where
        Req: Clone,
        F: Fn(Channel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        if self.shared.user.is_none() {
            return self.each_member(retry, None, request, call).await;
        }
        if self.token().is_none() {
            self.authenticate().await?;
        }
        match self.each_member(retry, self.token().as_ref(), request.clone(), &call).await {
            Err(Error::Status { status, .. }) if is_invalid_token(&status) => {
                self.authenticate().await?;
                self.each_member(retry, self.token().as_ref(), request, &call).await
            }
            other => other,
        }
    }

    pub async fn get(&self, key: impl Into<Vec<u8>>, options: Option<GetOptions>) -> Result<GetResponse, Error> {
        let request = options.unwrap_or_default().request(key.into());
        let max = self.shared.response_bytes_max;
        self.call(Retry::Read, request, |channel, request| async move {
            KvClient::new(channel).max_decoding_message_size(max).range(request).await
        })
        .await
    }

    pub async fn put(&self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, options: Option<PutOptions>) -> Result<PutResponse, Error> {
        let request = options.unwrap_or_default().request(key.into(), value.into());
        self.call(Retry::Write, request, |channel, request| async move { KvClient::new(channel).put(request).await }).await
    }

    pub async fn delete(&self, key: impl Into<Vec<u8>>, options: Option<DeleteOptions>) -> Result<DeleteResponse, Error> {
        let request = options.unwrap_or_default().request(key.into());
        self.call(Retry::Write, request, |channel, request| async move { KvClient::new(channel).delete_range(request).await }).await
    }

    /// A transaction. One that only reads may be sent to another member after any failure.
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error> {
        let retry = if txn.writes() { Retry::Write } else { Retry::Read };
        let max = self.shared.response_bytes_max;
        self.call(retry, txn.request(), |channel, request| async move {
            KvClient::new(channel).max_decoding_message_size(max).txn(request).await
        })
        .await
    }

    /// Compacts etcd's history up to `revision`; `physical`: wait until the space is freed.
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<(), Error> {
        let request = pb::CompactionRequest { revision, physical };
        self.call(Retry::Write, request, |channel, request| async move { KvClient::new(channel).compact(request).await }).await?;
        Ok(())
    }

    /// The status of the first member that answers (its id and the leader it knows).
    pub async fn status(&self) -> Result<StatusResponse, Error> {
        self.call(
            Retry::Read,
            pb::StatusRequest {},
            |channel, request| async move { MaintenanceClient::new(channel).status(request).await },
        )
        .await
    }

    /// A new etcd lease of `ttl_secs` seconds; its id.
    pub async fn lease_grant(&self, ttl_secs: i64) -> Result<i64, Error> {
        let request = pb::LeaseGrantRequest { ttl: ttl_secs, id: 0 };
        let answer = self
            .call(Retry::Write, request, |channel, request| async move { LeaseClient::new(channel).lease_grant(request).await })
            .await?;
        Ok(answer.id)
    }

    pub async fn lease_revoke(&self, id: i64) -> Result<(), Error> {
        let request = pb::LeaseRevokeRequest { id };
        self.call(Retry::Write, request, |channel, request| async move { LeaseClient::new(channel).lease_revoke(request).await }).await?;
        Ok(())
    }

    /// A watch of `key` (or the keys it starts, `with_prefix`), opened on the first member that
    /// takes it. The watch requires a leader: a member that loses its leader ends the watch
    /// with an error instead of going quiet, so the caller opens it again elsewhere.
    pub async fn watch(&self, key: impl Into<Vec<u8>>, options: Option<WatchOptions>) -> Result<WatchStream, Error> {
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(options.unwrap_or_default().request(key.into()))),
        };
        if self.shared.user.is_some() && self.token().is_none() {
            self.authenticate().await?;
        }
        let token = self.token();
        let mut last = None;
        for i in self.order() {
            let member = &self.shared.members[i];
            let (sender, receiver) = tokio::sync::mpsc::channel(WATCH_REQUESTS_MAX);
            sender.send(create.clone()).await.map_err(|_| Error::Watch("the watch's request stream closed".into()))?;
            let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(receiver));
            request.metadata_mut().insert("hasleader", MetadataValue::from_static("true"));
            if let Some(token) = &token {
                request.metadata_mut().insert("token", token.clone());
            }
            let mut client = WatchClient::new(member.channel.clone()).max_decoding_message_size(self.shared.response_bytes_max);
            match client.watch(request).await {
                Ok(stream) => {
                    self.answered(i);
                    return Ok(WatchStream { _requests: sender, stream: stream.into_inner(), member: member.url.clone() });
                }
                Err(status) if moves_on(Retry::Read, &status) => {
                    self.failed(i, &status);
                    last = Some(Error::Status { member: member.url.clone(), status });
                }
                Err(status) => return Err(Error::Status { member: member.url.clone(), status }),
            }
        }
        Err(last.unwrap_or_else(|| Error::Watch("no member to watch on".into())))
    }
}

/// The answers of one watch. Dropping it ends the watch.
pub struct WatchStream {
    /// Kept open: etcd ends a watch whose request stream closes.
    _requests: tokio::sync::mpsc::Sender<pb::WatchRequest>,
    stream: tonic::Streaming<pb::WatchResponse>,
    member: String,
}

impl WatchStream {
    /// The next answer; `None` when etcd closed the watch.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        self.stream.message().await.map_err(|status| Error::Status { member: self.member.clone(), status })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read moves on after every way a member can fail under it, a killed one's cancelled
    /// call included (seen as a failed read in the member-down chaos scenario before it did);
    /// a write only when it never left; neither after etcd's own refusals.
    #[test]
    fn reads_move_on_after_a_member_fails_and_writes_only_when_unsent() {
        let failed = [
            Status::unavailable("etcdserver: leader changed"),
            Status::cancelled("operation was canceled"),
            Status::deadline_exceeded("Timeout expired"),
            Status::unknown("transport error"),
            Status::unavailable("tcp connect error: Connection refused (os error 111)"),
        ];
        for status in &failed {
            assert!(moves_on(Retry::Read, status), "a read stops after {status:?}");
        }
        let unsent = Status::unavailable("tcp connect error: Connection refused (os error 111)");
        assert!(moves_on(Retry::Write, &unsent));
        for status in &failed[..4] {
            assert!(!moves_on(Retry::Write, status), "a write that may have reached the member moves on after {status:?}");
        }
        for refused in
            [Status::invalid_argument("etcdserver: too many operations in txn request"), Status::unauthenticated("invalid auth token")]
        {
            assert!(!moves_on(Retry::Read, &refused) && !moves_on(Retry::Write, &refused), "{refused:?}");
        }
    }
}
