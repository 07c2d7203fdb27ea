//! The planner daemon's own HTTP listener (`[metrics] listen`): `/metrics`, `/healthz` and
//! the planner's status as JSON at `/v1/status` and at `/v1/planner` (the path the
//! one-process stack serves it on, so a reader finds it at the same path on either; its first
//! zone's), every planned zone's at `/v1/zones`, served
//! through the daemons' bounded HTTP server (`dnsplan_common::http_server`, with
//! `Limits::METRICS`: 64 connections, 10 s to send a request head). The one-process stack serves the planner's metrics and status on the
//! authority's control API instead.

use crate::planner::Status;
use axum::Json;
use axum::routing::get;
use dnsplan_common::DnsName;
use dnsplan_common::daemon;
use dnsplan_common::http_server::{self, Limits, ServerMetrics};
use prometheus_client::registry::Registry;
use serde::Serialize;
use std::borrow::Cow;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;

/// Serves `registry` (with this listener's own connection metrics,
/// `dnsplan_planner_http_connections` and `dnsplan_planner_http_accept_errors_total`,
/// labelled with `id`) on `listener` until `shutdown` resolves, with the status of the first of
/// `zones` at `/v1/status` and `/v1/planner`, and every zone's at `/v1/zones`.
/// One planned zone's status, as `/v1/zones` lists it.
#[derive(Clone)]
pub struct ZoneStatus {
    pub dns_zone: DnsName,
    pub status: Arc<Mutex<Status>>,
}

/// `/v1/zones`: every planned zone's status, `dns_zone` first.
#[derive(Serialize)]
struct ZoneStatusJson {
    dns_zone: DnsName,
    planner: Status,
}

pub async fn serve(
    listener: TcpListener,
    mut registry: Registry,
    id: &str,
    zones: Vec<ZoneStatus>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let status = zones.first().map(|z| z.status.clone()).unwrap_or_default();
    let zones_json = move || {
        let list: Vec<ZoneStatusJson> = zones
            .iter()
            .map(|z| ZoneStatusJson { dns_zone: z.dns_zone.clone(), planner: z.status.lock().map(|s| s.clone()).unwrap_or_default() })
            .collect();
        async move { Json(list) }
    };
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
        .route("/v1/zones", get(zones_json))
        .route("/healthz", get(|| async { "ok\n" }));
    http_server::serve(listener, app, Limits::METRICS, server, "metrics", shutdown).await;
}
