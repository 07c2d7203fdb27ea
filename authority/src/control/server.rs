//! Serves the control API's router through the daemons' one bounded HTTP server
//! (`dnsplan_common::http_server`: connection cap, header, body and request timeouts, accepts
//! that back off), with the limits of `[control]`:
//!
//! - `connections_max` connections (`control.connections_max`, fitted to the open-file
//!   limit by `budget`); more wait in the kernel's accept queue.
//! - `header_timeout` (`control.header_timeout_secs`): half-sent requests and idle
//!   keep-alive connections are closed.
//! - `body_timeout` (`control.body_timeout_secs`): a request body that pauses this long fails.
//! - `request_timeout` (`control.request_timeout_secs`, `REQUEST_TIMEOUT_DEFAULT`), longer
//!   than the longest long-poll (`GET /v1/wait`, `WAIT_TIMEOUT_MAX`; the config refuses
//!   less), so long-polls are never cut; it bounds a slowly trickled body and a handler stuck
//!   on the store.
//!
//! The routes, and the limit on concurrent full-state reads, are in `routes`.

use crate::metrics::ConnectionMetrics;
use axum::Router;
use dnsplan_common::http_server::{self, Limits, ServerMetrics};
use dnsplan_common::store::WAIT_TIMEOUT_MAX;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;

/// Longest a request may take by default, body and answer included: the longest long-poll
/// (`WAIT_TIMEOUT_MAX`, 55 s) plus time to read the request and write the answer. A request
/// cut by it gets 503.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(WAIT_TIMEOUT_MAX.as_secs() + 5);
/// Longest `control.request_timeout_secs`: a request held an hour is a stuck handler, not a
/// slow client, and shutdown waits this long for requests in flight.
pub const REQUEST_TIMEOUT_MAX: Duration = Duration::from_secs(3_600);

/// What a client may hold; see the module docs.
#[derive(Clone, Copy, Debug)]
pub struct ControlLimits {
    pub connections_max: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    /// Invariant (`config` checks it): above `WAIT_TIMEOUT_MAX`, at most `REQUEST_TIMEOUT_MAX`.
    pub request_timeout: Duration,
}

/// Serves `app` on `listener` (over TLS with `tls`, `[control.tls]`) until `shutdown` resolves, then stops accepting, lets requests
/// in flight finish (for at most `request_timeout`) and closes idle connections. Failed
/// accepts and open connections are counted in `dnsplan_control_accept_errors_total` and
/// `dnsplan_control_connections`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ControlLimits,
    metrics: ConnectionMetrics,
    tls: Option<dnsplan_common::tls::ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    assert!(limits.request_timeout > WAIT_TIMEOUT_MAX);
    let limits = Limits {
        connections_max: limits.connections_max,
        header_timeout: limits.header_timeout,
        body_timeout: limits.body_timeout,
        request_timeout: limits.request_timeout,
    };
    let metrics = ServerMetrics {
        accept_errors: metrics.control_accept_errors,
        open: metrics.control_open,
        tls_failures: metrics.control_tls_failures,
    };
    http_server::serve_tls(listener, app, limits, metrics, "control API", tls, shutdown).await;
}
