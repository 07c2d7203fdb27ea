//! The planner daemon's own HTTP listener (`[metrics] listen`): `/metrics`, `/healthz` and
//! the planner's status as JSON at `/v1/status` and at `/v1/planner` (the path the
//! one-process stack serves it on, so a reader finds it at the same path on either), served
//! through the daemons' bounded HTTP server (`dnsplan_common::http_server`, with
//! `Limits::METRICS`: 64 connections, 10 s to send a request head). The one-process stack serves the planner's metrics and status on the
//! authority's control API instead.

use crate::planner::Status;
use axum::Json;
use axum::routing::get;
use dnsplan_common::daemon;
use dnsplan_common::http_server::{self, Limits, ServerMetrics};
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;

/// Serves `registry` (with this listener's own connection metrics,
/// `dnsplan_planner_http_connections` and `dnsplan_planner_http_accept_errors_total`,
/// labelled with `id`) and `status` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    mut registry: Registry,
    id: &str,
    status: Arc<Mutex<Status>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let server = ServerMetrics::default();
    let labelled =
        registry.sub_registry_with_prefix("planner").sub_registry_with_label((Cow::Borrowed("planner"), Cow::Owned(id.to_owned())));
    server.register(labelled, "http", "Metrics listener");
    let registry = Arc::new(registry);
    let status_json = move || {
        let status = status.lock().map(|s| s.clone()).unwrap_or_default();
        async move { Json(status) }
    };
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move { ([(axum::http::header::CONTENT_TYPE, daemon::METRICS_CONTENT_TYPE)], daemon::metrics_text(&registry)) }
            }),
        )
        .route("/v1/status", get(status_json.clone()))
        .route("/v1/planner", get(status_json))
        .route("/healthz", get(|| async { "ok\n" }));
    http_server::serve(listener, app, Limits::METRICS, server, "metrics", shutdown).await;
}
