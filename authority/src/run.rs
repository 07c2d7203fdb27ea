//! Wiring: opens the store, serves the last applied state at once, binds DNS and the control
//! API, follows the store, and shuts down cleanly.

use crate::answer::AnswerLimits;
use crate::budget;
use crate::config::AuthorityConfig;
use crate::control::{self, ApiError, Control};
use crate::control_server::{self, ControlLimits};
use crate::dns_zone::StaticZone;
use crate::follower::Serving;
use crate::metrics::{Metrics, StoreReading};
use crate::rrl::Rrl;
use crate::server::{TcpLimits, serve_tcp};
use crate::transfer::TransferPolicy;
use crate::udp::{UdpServers, bind_udp};
use crate::ui;
use anyhow::Context;
use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path as UrlPath, Query, State};
use axum::response::Html;
use axum::routing::get;
use dnsplan_common::store::lease::now_unix_ms;
use dnsplan_common::{Generation, SledStore, Store};
use serde::Serialize;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Where a running authority listens (ports resolved when 0 was configured).
#[derive(Clone, Debug)]
pub struct Bound {
    pub dns: Vec<SocketAddr>,
    pub control: SocketAddr,
}

/// Endpoints `/v1/status` lists when the query does not say: enough for a page of a
/// terminal, small at any zone size (the whole state is only read a page at a time, through
/// `GET /v1/active?limit=N&after=NAME`).
pub const STATUS_ENDPOINTS_DEFAULT: usize = 100;

/// What `/v1/status` reports: a summary whose size does not grow with the zone. The serving
/// figures come from the snapshot the authority serves, the store is read only for the small
/// records and one page of endpoints.
#[derive(Serialize)]
struct Status {
    latest: dnsplan_common::Generation,
    paused: Option<dnsplan_common::PauseState>,
    serial: u32,
    applied_changes: u64,
    managed_endpoints: usize,
    heartbeats: Vec<dnsplan_common::Heartbeat>,
    /// The first `limit` endpoints after `after`, in name order.
    endpoints: std::collections::BTreeMap<dnsplan_common::EndpointName, dnsplan_common::ActiveRecord>,
    /// More endpoints follow the last one listed (page on with `after`).
    endpoints_more: bool,
    /// Each secondary notified (`[[dns.transfer.secondaries]]` with `notify`): the serial it
    /// was last seen serving and whether it is behind.
    secondaries: Vec<crate::notify::SecondaryStatus>,
}

/// Query of `/v1/status`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusQuery {
    /// Endpoints to list, `0..=ACTIVE_PAGE_MAX` (default `STATUS_ENDPOINTS_DEFAULT`).
    limit: Option<usize>,
    after: Option<String>,
}

/// Runs the authority on the embedded store at `config.data_dir` until `shutdown` resolves.
/// `on_bound` is told where it listens once everything serves.
pub async fn run(
    config: AuthorityConfig,
    config_dir: &Path,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(Bound),
) -> anyhow::Result<()> {
    let store = SledStore::open(&config.data_dir).with_context(|| format!("opening the store in {}", config.data_dir.display()))?;
    run_with_store(store, config, config_dir, shutdown, on_bound).await
}

/// What an embedding process adds to the control API: routes, and metrics to serve with the
/// authority's on `/metrics`.
#[derive(Default)]
pub struct Extras {
    pub routes: Option<axum::Router>,
    pub metrics: Option<Arc<prometheus_client::registry::Registry>>,
    /// The planner's status, for the status page, when the planner runs in this process.
    pub planner_status: Option<ui::PlannerStatus>,
}

/// As `run`, on a store the caller opened (the one-process stack shares it).
pub async fn run_with_store<S: Store>(
    store: S,
    config: AuthorityConfig,
    config_dir: &Path,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(Bound),
) -> anyhow::Result<()> {
    run_with_extras(store, config, config_dir, shutdown, on_bound, Extras::default()).await
}

/// As `run_with_store`, with routes and metrics of the embedding process.
pub async fn run_with_extras<S: Store>(
    store: S,
    config: AuthorityConfig,
    config_dir: &Path,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(Bound),
    extras: Extras,
) -> anyhow::Result<()> {
    let zone = Arc::new(StaticZone::load(&config.dns_zone, config_dir)?);
    let metrics = Arc::new(Metrics::new());
    let serving_metrics = metrics.clone();
    let limits =
        AnswerLimits { edns_udp_payload_bytes: config.dns.edns_udp_payload_bytes, answer_addresses_max: config.dns.answer_addresses_max };
    // Static stability: serve the last applied state from our own disk before anything else.
    let rrl = config.dns.rrl.settings().map(|settings| Rrl::new(&settings));
    let transfer = TransferPolicy::from_config(&config.dns.transfer, config_dir)?;
    let serving = Arc::new(Serving::load(&store, zone.clone(), limits, serving_metrics).await?.with_rrl(rrl).with_transfer(transfer));

    let mut tasks = tokio::task::JoinSet::new();
    let mut dns = Vec::new();
    let mut tcp_listeners = Vec::new();
    let mut udp_sockets = Vec::new();
    for addr in &config.dns.listen {
        let sockets = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (udp, tcp) = bind_dns(*addr, sockets).await?;
        dns.push(udp[0].local_addr()?);
        udp_sockets.extend(udp);
        tcp_listeners.push(tcp);
    }
    // Threads of their own, stopped and joined when dropped (below, or on an early return).
    let udp = UdpServers::start(udp_sockets, serving.clone()).context("starting the UDP threads")?;
    tasks.spawn(serving.clone().follow(store.clone()));
    crate::notify::spawn(&mut tasks, &serving);

    let connection_metrics = metrics.connections.clone();
    let ctl = Control::new(store.clone(), config.token()).with_metrics(metrics.clone()).with_full_reads_max(config.control.full_reads_max);
    let extra_metrics = extras.metrics.clone();
    let metrics_store = store.clone();
    let render = move || {
        let (metrics, extra, store) = (metrics.clone(), extra_metrics.clone(), metrics_store.clone());
        async move {
            // The store's own figures, read now: independent of the follower, which they check.
            match StoreReading::read(&store).await {
                Ok(reading) => metrics.observe_store(&reading, now_unix_ms()),
                Err(err) => {
                    metrics.observe_store_read_error();
                    tracing::warn!(error = %err, "metrics: cannot read the store; its gauges keep their last values");
                }
            }
            let body = match &extra {
                Some(extra) => metrics.render_with(extra),
                None => metrics.render(),
            };
            ([(axum::http::header::CONTENT_TYPE, dnsplan_common::daemon::METRICS_CONTENT_TYPE)], body)
        }
    };
    // `/v1/status` and the status page share `control.status_reads_max` permits.
    let status_reads = tower::limit::GlobalConcurrencyLimitLayer::new(config.control.status_reads_max);
    let mut app = control::router(ctl.clone())
        .route("/readyz", get(|| async { "ready\n" }))
        .route(
            "/v1/status",
            get({
                let serving = serving.clone();
                move |State(ctl): State<Control<S>>, q: Result<Query<StatusQuery>, QueryRejection>| {
                    let serving = serving.clone();
                    async move {
                        let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
                        status(ctl, serving, q).await
                    }
                }
            })
            // Pollers take turns: a flood of them cannot take every core from writes.
            .layer(status_reads.clone()),
        )
        .route(
            "/ui",
            get({
                let (serving, planner) = (serving.clone(), extras.planner_status.clone());
                move |State(ctl): State<Control<S>>| {
                    let (serving, planner) = (serving.clone(), planner.clone());
                    async move { ui::index(&ctl.store, &serving, planner.as_ref()).await.map(Html).map_err(ApiError::from) }
                }
            })
            .layer(status_reads.clone()),
        )
        .route(
            "/ui/plans/{generation}",
            get(|State(ctl): State<Control<S>>, g: Result<UrlPath<u64>, PathRejection>| async move {
                let UrlPath(g) = g.map_err(|e| ApiError::bad_request(e.body_text()))?;
                ui::plan_page(&ctl.store, Generation(g)).await.map(Html).map_err(ApiError::from)
            })
            .layer(status_reads),
        )
        .with_state(ctl)
        .route("/metrics", get(render));
    if let Some(routes) = extras.routes {
        app = app.merge(routes);
    }
    let listener = tokio::net::TcpListener::bind(config.control.listen)
        .await
        .with_context(|| format!("binding the control API on {}", config.control.listen))?;
    let control_addr = listener.local_addr()?;
    // Every connection holds a descriptor: the caps stay under what the process has left.
    let wanted = budget::Caps { dns_tcp_per_listener: config.dns.tcp_connections_max, control: config.control.connections_max };
    let caps = budget::fit_to_process(tcp_listeners.len(), wanted)?;
    let tcp_limits =
        TcpLimits { idle_timeout: Duration::from_secs(config.dns.tcp_idle_timeout_secs), connections_max: caps.dns_tcp_per_listener };
    for tcp in tcp_listeners {
        tasks.spawn(serve_tcp(tcp, serving.clone(), tcp_limits));
    }
    let control_limits = ControlLimits {
        connections_max: caps.control,
        header_timeout: Duration::from_secs(config.control.header_timeout_secs),
        body_timeout: Duration::from_secs(config.control.body_timeout_secs),
        request_timeout: Duration::from_secs(config.control.request_timeout_secs),
    };
    on_bound(Bound { dns: dns.clone(), control: control_addr });
    let _ = serving; // the listeners hold their own references
    tracing::info!(dns = ?dns, control = %control_addr, origin = %zone.origin, "authority serving");
    // Stop accepting control requests on shutdown, finish those in flight, then stop DNS.
    control_server::serve(listener, app, control_limits, connection_metrics, shutdown).await;
    tasks.shutdown().await;
    drop(udp);
    tracing::info!("authority stopped");
    Ok(())
}

async fn status<S: Store>(ctl: Control<S>, serving: Arc<Serving>, q: StatusQuery) -> Result<Json<Status>, ApiError> {
    let store = &ctl.store;
    let limit = q.limit.unwrap_or(STATUS_ENDPOINTS_DEFAULT);
    let after = q.after.as_deref().map(control::parse_endpoint).transpose()?;
    let (endpoints, endpoints_more) = match limit {
        0 => (Default::default(), true),
        _ => {
            let page = store.active_page(after, limit).await?;
            (page.endpoints.into_iter().collect(), page.more)
        }
    };
    let snapshot = serving.snapshot.load();
    Ok(Json(Status {
        latest: store.latest().await?,
        paused: store.paused().await?,
        serial: snapshot.serial,
        applied_changes: snapshot.applied_changes,
        managed_endpoints: snapshot.managed_count(),
        heartbeats: store.heartbeats().await?,
        endpoints,
        endpoints_more,
        secondaries: serving.secondaries.lock().map(|s| s.clone()).unwrap_or_default(),
    }))
}

/// UDP (`sockets` of them) and TCP on one address and port. For port 0 the system picks a
/// port free for UDP; it may be taken for TCP (any outgoing connection can hold it), so a
/// few ports are tried.
async fn bind_dns(addr: std::net::SocketAddr, sockets: usize) -> anyhow::Result<(Vec<std::net::UdpSocket>, tokio::net::TcpListener)> {
    let attempts = if addr.port() == 0 { 16 } else { 1 };
    let mut attempt = 1;
    loop {
        let udp = bind_udp(addr, sockets).with_context(|| format!("binding DNS UDP on {addr}"))?;
        let bound = udp[0].local_addr()?;
        match tokio::net::TcpListener::bind(bound).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(err) if err.kind() == std::io::ErrorKind::AddrInUse && attempt < attempts => attempt += 1,
            Err(err) => return Err(err).with_context(|| format!("binding DNS TCP on {bound}")),
        }
    }
}
