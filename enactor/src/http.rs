//! The enactor daemon's own HTTP listener (`[metrics] listen`): `/metrics` and `/healthz`,
//! served through the daemons' bounded HTTP server (`dnsplan_common::http_server`, with
//! `Limits::METRICS`: 64 connections, 10 s to send a request head). The one-process stack
//! serves the enactors' metrics on the authority's control API instead.

use axum::routing::get;
use dnsplan_common::daemon;
use dnsplan_common::http_server::{self, Limits, ServerMetrics};
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Serves `registry` (with this listener's own connection metrics,
/// `dnsplan_enactor_http_connections` and `dnsplan_enactor_http_accept_errors_total`,
/// labelled with `id`) on `listener` until `shutdown` resolves.
pub async fn serve(listener: TcpListener, mut registry: Registry, id: &str, shutdown: impl Future<Output = ()> + Send + 'static) {
    let server = ServerMetrics::default();
    let labelled =
        registry.sub_registry_with_prefix("enactor").sub_registry_with_label((Cow::Borrowed("enactor"), Cow::Owned(id.to_owned())));
    server.register(labelled, "http", "Metrics listener");
    let registry = Arc::new(registry);
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move { ([(axum::http::header::CONTENT_TYPE, daemon::METRICS_CONTENT_TYPE)], daemon::metrics_text(&registry)) }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }));
    http_server::serve(listener, app, Limits::METRICS, server, "metrics", shutdown).await;
}
