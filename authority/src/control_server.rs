//! Serves the control API's router over HTTP/1.1 with bounds on what clients can hold.
//!
//! - At most `connections_max` connections: at the cap the server stops accepting, and new
//!   connections wait in the kernel's accept queue (which costs no descriptor of ours) until
//!   one closes.
//! - hyper's header read timeout: a connection must deliver a complete request head within
//!   `header_timeout` of being accepted or of its previous answer, so both half-sent requests
//!   and idle keep-alive connections are closed.
//! - tower-http's body timeout: a request body that sends nothing for `body_timeout` fails
//!   (a 4xx answer, then the connection closes).
//! - tower-http's request timeout, `REQUEST_TIMEOUT`, longer than the longest long-poll
//!   (`GET /v1/wait`, `WAIT_TIMEOUT_MAX`), so long-polls are never cut; it bounds a slowly
//!   trickled body and a handler stuck on the store.
//! - Failed accepts back off (`accept::Acceptor`), are counted and rarely logged.
//!
//! The routes, and the limit on concurrent full-state reads, are `control`'s.

use crate::accept::Acceptor;
use crate::metrics::ConnectionMetrics;
use axum::Router;
use axum::http::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::timeout::{RequestBodyTimeoutLayer, TimeoutLayer};

/// Longest a request may take, body and answer included: the longest long-poll plus time to
/// read the request and write the answer. A request cut by it gets 503.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(dnsplan_common::store::WAIT_TIMEOUT_MAX.as_secs() + 5);

/// What a client may hold; see the module docs.
#[derive(Clone, Copy, Debug)]
pub struct ControlLimits {
    pub connections_max: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting, lets requests
/// in flight finish (for at most `REQUEST_TIMEOUT`) and closes idle connections.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ControlLimits,
    metrics: ConnectionMetrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    assert!(limits.connections_max >= 1);
    let service = tower::ServiceBuilder::new()
        .layer(TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, REQUEST_TIMEOUT))
        .layer(RequestBodyTimeoutLayer::new(limits.body_timeout))
        .service(app);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    let permits = Arc::new(Semaphore::new(limits.connections_max));
    let graceful = GracefulShutdown::new();
    let mut acceptor = Acceptor::new(listener, "control API", metrics.control_accept_errors.clone());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // Take a slot first: at the cap, new connections wait in the kernel's queue.
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit,
            () = &mut shutdown => break,
        };
        // Invariant: the semaphore is never closed.
        let Ok(permit) = permit else { break };
        let (stream, _peer) = tokio::select! {
            conn = acceptor.accept() => conn,
            () = &mut shutdown => break,
        };
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service.clone())));
        let open = metrics.control_open.clone();
        open.inc();
        tokio::spawn(async move {
            // Errors are the client's (it went away, sent garbage, or timed out).
            if let Err(err) = conn.await {
                tracing::debug!(%err, "control API connection ended");
            }
            open.dec();
            drop(permit);
        });
    }
    drop(acceptor);
    if tokio::time::timeout(REQUEST_TIMEOUT, graceful.shutdown()).await.is_err() {
        tracing::warn!(after_secs = REQUEST_TIMEOUT.as_secs(), "control API connections still open at shutdown; closing them");
    }
}
