//! Wiring: binds DNS and the control API, serves the last applied state at once (from the
//! file `local_state` keeps on an authority on etcd, else from the store), reaches the store
//! (`[store]`: embedded sled, or etcd with retries), follows it, and shuts down cleanly.
//!
//! The store seam: everything that serves (follower, DNS, control API, metrics, status page,
//! transfers, NOTIFY) is generic over `S: Store`, in one function, `serve`, which takes a
//! future that reaches the store. `run` picks it from `[store]`: none, `SledStore::open`,
//! ready at once; `kind = "etcd"`, `EtcdStore::connect` and a first read, retried with
//! `daemon::start_with_retry`. `run_with_store` and `run_with_extras` (`dnsplan up`, the tests'
//! `stack`) pass a store already open. On etcd the control API serves the etcd store, so a write
//! through it meets etcd's fences. DNS UDP and TCP share one port per listen address; for port
//! 0 it tries up to 16 ports for one free for both (a port free for UDP may be held by an
//! outgoing TCP connection).

use crate::added::{self, AddedZones};
use crate::config::AuthorityConfig;
use crate::control::access::Access;
use crate::control::gate::Gate;
use crate::control::routes::{self, ApiError, Control, Zoned};
use crate::control::server::{self, ControlLimits};
use crate::control::ui;
use crate::follow::follower::{LoadError, check_dns_zone};
use crate::follow::image;
use crate::follow::kept::{self, Keeping};
use crate::metrics::{Metrics, StoreReading};
use crate::net::budget;
use crate::net::tcp::{TcpLimits, serve_tcp};
use crate::net::udp::{UdpServers, bind_udp};
use crate::query::answer::AnswerLimits;
use crate::query::rrl::Rrl;
use crate::reload;
use crate::serving::policy::TransferPolicy;
use crate::serving::shared_keys::SharedKeys;
use crate::serving::trusted::PlanCheck;
use crate::serving::zones::{self, ZoneTable};
use crate::serving::{KeysOf, Serving};
use crate::zone::dns_zone::StaticZone;
use anyhow::Context;
use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path as UrlPath, Query, State};
use axum::response::Html;
use axum::routing::get;
use dnsplan_common::daemon::{self, Reachability, StartFailure};
use dnsplan_common::dnssec_share::Kek;
use dnsplan_common::signing::Keyring;
use dnsplan_common::status::AuthorityStatus;
use dnsplan_common::store::AuthorityReport;
use dnsplan_common::store::lease::now_unix_ms;
use dnsplan_common::store::sled::OnLoss;
use dnsplan_common::store::zones::ManagedZones;
use dnsplan_common::store_config::{EtcdStoreConfig, StoreConfig};
use dnsplan_common::tls::ServerTls;
use dnsplan_common::{Generation, SledStore, Store, StoreError};
use dnsplan_etcd::{EtcdConfig, EtcdStore};
use hickory_proto::rr::Name;
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
    /// The control API speaks HTTPS (`[control.tls]`).
    pub control_tls: bool,
}

impl Bound {
    /// The control API's URL, `http://` or `https://`.
    pub fn control_url(&self) -> String {
        format!("{}://{}", if self.control_tls { "https" } else { "http" }, self.control)
    }
}

/// Endpoints `/v1/status` lists when the query does not say: enough for a page of a
/// terminal, small at any zone size (the whole state is only read a page at a time, through
/// `GET /v1/active?limit=N&after=NAME`).
pub const STATUS_ENDPOINTS_DEFAULT: usize = 100;

/// How often an authority renews its report on the store (`AuthorityReport`).
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// This authority's report id: its advertised DNS addresses, else its host name and where it
/// listens.
fn report_id(advertise: &[SocketAddr], listening: &[SocketAddr]) -> String {
    let join = |addresses: &[SocketAddr]| addresses.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",");
    if !advertise.is_empty() {
        return join(advertise);
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let host = if host.is_empty() { "localhost".to_string() } else { host };
    format!("{host} {}", join(listening))
}

/// Reports this authority on the store every [`REPORT_EVERY`] until the task is dropped. A
/// failure while the store is unreachable is the follower's to log; another is logged once
/// until a report goes through.
async fn report_itself<S: Store>(store: S, serving: Arc<Serving>, reach: Arc<Reachability>, id: String, dns: Vec<SocketAddr>) {
    let mut failing = false;
    loop {
        let snapshot = serving.snapshot.load();
        let report = AuthorityReport {
            id: id.clone(),
            dns: dns.clone(),
            serial: snapshot.serial,
            applied_changes: snapshot.applied_changes,
            at_unix_ms: now_unix_ms(),
        };
        match store.report_authority(report).await {
            Ok(()) => failing = false,
            Err(err) if reach.is_down() => tracing::debug!(error = %err, "could not report this authority on the store"),
            Err(err) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(error = %err, "could not report this authority on the store; `dnsplan verify` will not find it");
                }
            }
        }
        tokio::time::sleep(REPORT_EVERY).await;
    }
}

/// Query of `/v1/status`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusQuery {
    /// Endpoints to list, `0..=ACTIVE_PAGE_MAX` (default `STATUS_ENDPOINTS_DEFAULT`).
    limit: Option<usize>,
    after: Option<String>,
}

/// Runs the authority until `shutdown` resolves, on the store `config.store` names: the
/// embedded store at `config.data_dir` by default, or etcd (`[store] kind = "etcd"`), where
/// the authority keeps the state it serves on its own disk too (`local_state`) and serves it
/// at once on start, before etcd answers. `on_bound` is told where it listens once DNS
/// answers.
pub async fn run(
    config: AuthorityConfig,
    config_dir: &Path,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(Bound),
) -> anyhow::Result<()> {
    match config.store.clone() {
        None => {
            let store = open_embedded(&config)?;
            if let Some((kek, dir)) = shared_key_dir(&config, config_dir)? {
                SharedKeys::new(store.clone(), kek).pull_or_make(&dir, &config.dns_zone.origin, None::<fn() -> anyhow::Result<()>>).await?;
            }
            run_with_store(store, config, config_dir, shutdown, on_bound).await
        }
        Some(StoreConfig::Etcd(etcd)) => {
            let keyring = config.keyring().map_err(anyhow::Error::msg)?;
            if let Some((kek, dir)) = shared_key_dir(&config, config_dir)?
                && !dir.join(dnsplan_common::dnssec_keys::KEYS_FILE).exists()
            {
                // A new authority of a zone whose keys the store holds: they are taken from
                // the store before the zone is loaded (it cannot be signed without them).
                let stopped = std::future::pending::<()>();
                tokio::pin!(stopped);
                let store = daemon::start_with_retry("the store on etcd", || connect_etcd(&etcd, keyring.clone()), stopped.as_mut())
                    .await
                    .map_err(anyhow::Error::msg)?
                    .context("stopped before the store answered")?;
                SharedKeys::new(store, kek).pull_or_make(&dir, &config.dns_zone.origin, None::<fn() -> anyhow::Result<()>>).await?;
            }
            let reach = move |stop: Stop| async move {
                let stopped = stop.wait();
                tokio::pin!(stopped);
                daemon::start_with_retry("the store on etcd", || connect_etcd(&etcd, keyring.clone()), stopped.as_mut())
                    .await
                    .map_err(anyhow::Error::msg)
            };
            serve(reach, Keeping::OnDisk, config, config_dir, shutdown, on_bound, Extras::default()).await
        }
        // `AuthorityConfig::check` refuses it; said again for a config built in code.
        Some(StoreConfig::Control(_)) => {
            anyhow::bail!("store.kind: an authority serves the embedded store or follows etcd, not another authority's control API")
        }
    }
}

/// The managed zone's key-encryption key and key directory, when its keys are shared through
/// the store (`[dns_zone.dnssec] kek_file`).
fn shared_key_dir(config: &AuthorityConfig, config_dir: &Path) -> anyhow::Result<Option<(Arc<Kek>, std::path::PathBuf)>> {
    let Some(dnssec) = &config.dns_zone.dnssec else { return Ok(None) };
    let (Some(kek), Some(dir)) = (&dnssec.kek_file, &dnssec.key_dir) else { return Ok(None) };
    let kek = Kek::load(&config_dir.join(kek)).map_err(|e| anyhow::anyhow!("dns_zone.dnssec.kek_file: {e}"))?;
    Ok(Some((Arc::new(kek), config_dir.join(dir))))
}

/// Opens the embedded store in `config.data_dir`, refusing one that went back behind its
/// high-water mark unless `config.accept_store_loss`, trusting the plans `config.keyring`
/// trusts.
pub fn open_embedded(config: &AuthorityConfig) -> anyhow::Result<SledStore> {
    let on_loss = if config.accept_store_loss { OnLoss::Accept } else { OnLoss::Refuse };
    let store =
        SledStore::open_with(&config.data_dir, on_loss).with_context(|| format!("opening the store in {}", config.data_dir.display()))?;
    store.set_keyring(config.keyring().map_err(anyhow::Error::msg)?);
    Ok(store)
}

/// Connects to etcd and reads the store's version once, so that the store answers before the
/// follower and the control API use it. An outage is retried (`start_with_retry`); a store
/// that answers with something else than an outage (bad data under the prefix) is fatal.
async fn connect_etcd(settings: &EtcdStoreConfig, keyring: Option<Arc<Keyring>>) -> Result<EtcdStore, StartFailure> {
    let mut config = EtcdConfig::from_settings(settings);
    config.keyring = keyring;
    let store = EtcdStore::connect(config).await.map_err(|err| StartFailure::Retry(format!("{:#}", anyhow::Error::new(err))))?;
    match store.version().await {
        Ok(_) => Ok(store),
        Err(err @ (StoreError::Unavailable(_) | StoreError::Io(_))) => Err(StartFailure::Retry(format!("{:#}", anyhow::Error::new(err)))),
        Err(err) => Err(StartFailure::Fatal(format!("{:#}", anyhow::Error::new(err)))),
    }
}

/// A failed load from the store at start: an outage is retried, anything else (another DNS
/// zone, bad data) ends the start.
fn start_failure(err: anyhow::Error) -> StartFailure {
    let outage = err.chain().any(|cause| {
        matches!(cause.downcast_ref::<StoreError>(), Some(StoreError::Unavailable(_) | StoreError::Io(_)))
            || matches!(cause.downcast_ref::<LoadError>(), Some(LoadError::Store(StoreError::Unavailable(_) | StoreError::Io(_))))
    });
    match outage {
        true => StartFailure::Retry(format!("{err:#}")),
        false => StartFailure::Fatal(format!("{err:#}")),
    }
}

/// What is served for the added zone of `store` (`added`: a moment after it was added).
async fn served_zone<S: Store>(others: &ZoneTable, store: &S) -> Result<Arc<Serving>, ApiError> {
    let origin = store.dns_zone().await?.map(|z| z.to_string()).unwrap_or_default();
    Name::from_ascii(&origin)
        .ok()
        .and_then(|name| others.get(&name))
        .ok_or_else(|| ApiError::from(StoreError::Unavailable(format!("zone {origin} is in the store but not served here yet"))))
}

/// Signs each signed static zone of `zones` again when due (`Serving::resign_step`, a whole round at once) and
/// notifies its secondaries, every `RESIGN_CHECK`, until dropped. Records the earliest
/// signature expiry among them and the signed zones added to the store in `metrics` (the
/// managed zone's own is beside it).
async fn resign_static_zones(zones: Arc<ZoneTable>, metrics: Arc<Metrics>) {
    loop {
        let mut earliest: Option<u32> = None;
        for serving in zones.signed() {
            // A static zone's signatures change only here (its keys: `keep_keys`): its whole
            // round in one step.
            if serving.resign_step(false, usize::MAX).await == crate::zone::signed::ResignStep::Done {
                crate::xfr::notify::spawn_static(serving.clone());
            }
            if let Some(at) = serving.snapshot.load().signatures_expire_at() {
                earliest = Some(earliest.map_or(at, |e| e.min(at)));
            }
        }
        // The signed zones added to the store are signed again by their followers; their
        // expiry counts here, so a follower that stopped signing is alerted on too.
        for serving in zones.signed_managed() {
            if let Some(at) = serving.snapshot.load().signatures_expire_at() {
                earliest = Some(earliest.map_or(at, |e| e.min(at)));
            }
        }
        metrics.observe_static_signatures(earliest);
        tokio::time::sleep(crate::serving::RESIGN_CHECK).await;
    }
}

/// A spawned task aborted when dropped (an early return), or awaited to its end (`finish`).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl AbortOnDrop {
    async fn finish(mut self) {
        let handle = std::mem::replace(&mut self.0, tokio::spawn(async {}));
        if let Err(err) = handle.await {
            tracing::error!(error = %err, "the control API's server task failed");
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves once shutdown was asked for; cloned by everything that stops on it.
#[derive(Clone)]
struct Stop(tokio::sync::watch::Receiver<bool>);

impl Stop {
    async fn wait(mut self) {
        // An error means the sender is gone, which happens only after it sent.
        let _ = self.0.wait_for(|stopped| *stopped).await;
    }
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
pub async fn run_with_store<S: ManagedZones>(
    store: S,
    config: AuthorityConfig,
    config_dir: &Path,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(Bound),
) -> anyhow::Result<()> {
    run_with_extras(store, config, config_dir, shutdown, on_bound, Extras::default()).await
}

/// As `run_with_store`, with routes and metrics of the embedding process.
pub async fn run_with_extras<S: ManagedZones>(
    store: S,
    config: AuthorityConfig,
    config_dir: &Path,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(Bound),
    extras: Extras,
) -> anyhow::Result<()> {
    serve(|_| async { Ok(Some(store)) }, Keeping::InStore, config, config_dir, shutdown, on_bound, extras).await
}

/// The authority on whichever store `reach` resolves to (`None`: shutdown came first).
///
/// With `Keeping::OnDisk` (on etcd: `follow::kept`), the state saved in `data_dir` is served at once, before
/// `reach` resolves, so an unreachable store never stops the answers; a missing or refused
/// file means waiting for the store, and then the state served is saved there after each
/// change. DNS and the control API are bound first in any case; DNS answers once a state is
/// loaded, the control API once the store is reached (until then its connections wait).
async fn serve<S, R, F>(
    reach: R,
    local: Keeping,
    config: AuthorityConfig,
    config_dir: &Path,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(Bound),
    extras: Extras,
) -> anyhow::Result<()>
where
    S: ManagedZones,
    R: FnOnce(Stop) -> F,
    F: Future<Output = anyhow::Result<Option<S>>>,
{
    let zone = Arc::new(StaticZone::load(&config.dns_zone, config_dir)?);
    let metrics = Arc::new(Metrics::new());
    let limits =
        AnswerLimits { edns_udp_payload_bytes: config.dns.edns_udp_payload_bytes, answer_addresses_max: config.dns.answer_addresses_max };
    let rrl = config.dns.rrl.settings().map(|settings| Rrl::new(&settings));
    let transfer = Arc::new(TransferPolicy::from_config(&config.dns.transfer, config_dir)?);
    // How the zones added at run time are signed (`[added_zones.dnssec]`).
    let added_dnssec = match config.added_zones.dnssec.clone() {
        Some(mut dnssec) => {
            // Absolute: the process's directory may change, the zones' keys must not move.
            let root = config_dir.join(&dnssec.key_root);
            dnssec.key_root = std::path::absolute(&root).unwrap_or(root);
            if let Some(file) = &dnssec.kek_file {
                let kek = Kek::load(&config_dir.join(file)).map_err(|e| anyhow::anyhow!("added_zones.dnssec.kek_file: {e}"))?;
                dnssec.kek = Some(Arc::new(kek));
            }
            Some(dnssec)
        }
        None => None,
    };
    // The other zones: the config file's, then those added at run time and kept on disk (the
    // static ones signed as the store's are, with their keys on this authority only).
    let signer: Option<zones::Signer> = added_dnssec.clone().map(|dnssec| -> zones::Signer { Arc::new(move |zone| dnssec.sign(zone)) });
    let others = Arc::new(
        ZoneTable::new(&zone.origin, limits, metrics.clone(), transfer.clone(), Some(config.data_dir.join(zones::DIR_NAME)))
            .with_signer(signer),
    );
    let from_image = others.add_configured(&config.zones, config_dir).context("[[zones]]")?;
    let added = others.load_added().context("the zones added at run time")?;
    if !others.is_empty() {
        tracing::info!(zones = others.len(), added, from_image, "serving other zones beside the managed one");
    }
    // Who may call the control API, and its TLS; read again on SIGHUP and when files change.
    let access = Access::new(config.credentials().map_err(|e| anyhow::anyhow!("control: {e}"))?)
        .with_refusals_counted(metrics.connections.control_refused.clone());
    let control_tls: Option<ServerTls> = match &config.control.tls {
        Some(tls) => Some(Arc::new(arc_swap::ArcSwap::from_pointee(tls.server_config().map_err(|e| anyhow::anyhow!(e))?))),
        None => None,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop = Stop(stop_rx);
    if let Some(path) = config.source.clone() {
        let reload_every = (config.control.reload_check_secs > 0).then(|| Duration::from_secs(config.control.reload_check_secs));
        tokio::spawn(reload::follow(path, &config, access.clone(), control_tls.clone(), reload_every, stop.clone().wait()));
    }
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });

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
    let listener = tokio::net::TcpListener::bind(config.control.listen)
        .await
        .with_context(|| format!("binding the control API on {}", config.control.listen))?;
    let control_addr = listener.local_addr()?;
    // Every connection holds a descriptor: the caps stay under what the process has left.
    let wanted = budget::Caps { dns_tcp_per_listener: config.dns.tcp_connections_max, control: config.control.connections_max };
    let caps = budget::fit_to_process(tcp_listeners.len(), wanted)?;
    let tcp_limits =
        TcpLimits { idle_timeout: Duration::from_secs(config.dns.tcp_idle_timeout_secs), connections_max: caps.dns_tcp_per_listener };
    let bound = Bound { dns: dns.clone(), control: control_addr, control_tls: config.control.tls.is_some() };
    let mut on_bound = Some(on_bound);
    let mut tasks = tokio::task::JoinSet::new();

    // The control API answers from now on: health and readiness from this process's own
    // state, the other routes 503 until the store is reached (`control::gate`).
    let store_reach = Arc::new(Reachability::unreached("the store"));
    let gate = Gate::new(store_reach.clone(), metrics.clone());
    let control_limits = ControlLimits {
        connections_max: caps.control,
        header_timeout: Duration::from_secs(config.control.header_timeout_secs),
        body_timeout: Duration::from_secs(config.control.body_timeout_secs),
        request_timeout: Duration::from_secs(config.control.request_timeout_secs),
    };
    let control_server = AbortOnDrop(tokio::spawn(server::serve(
        listener,
        gate.router(),
        control_limits,
        metrics.connections.clone(),
        control_tls,
        stop.clone().wait(),
    )));

    // The zones the store manages beside its first one (`added`).
    let book = Arc::new(added::book::ZoneBook::default());
    // With a keyring, every zone's follower serves only what trusted plans say.
    let keyring = config.keyring().map_err(anyhow::Error::msg)?;
    let plan_check = keyring.clone().map(|keyring| PlanCheck::new(keyring, metrics.clone()));
    let setup = added::Setup {
        table: others.clone(),
        limits,
        transfer: transfer.clone(),
        data_dir: config.data_dir.clone(),
        keeping: local,
        metrics: metrics.clone(),
        book: book.clone(),
        keyring,
        dnssec: added_dnssec,
    };
    // On etcd, the added zones' saved states are served at once too, beside the first zone's
    // (not before it: the first zone answers without waiting for them).
    let kept_zones = tokio::spawn({
        let setup = setup.clone();
        async move { added::serve_kept(&setup).await }
    });
    // Static stability: the state saved on our own disk, served before anything else.
    let mut rrl = Some(rrl);
    let mut transfer = Some(transfer);
    let mut dress = |serving: Serving| {
        Arc::new(
            serving
                .with_rrl(rrl.take().flatten())
                .with_transfer(transfer.take().unwrap_or_else(|| Arc::new(TransferPolicy::closed())))
                .with_ixfr_log(&config.data_dir)
                .with_zones(others.clone())
                .with_plan_check(plan_check.clone()),
        )
    };
    let mut serving = None;
    let mut udp = None;
    // The saved state, loaded, not answered from yet (see below).
    let mut saved = None;
    // What writes the state served to disk: `local` on etcd, the serving image on the
    // embedded store (set once the store is read).
    let mut keeper = None;
    // On etcd, the log each change is made durable in before it is served (`local_log`).
    let mut served_log = None;
    if local == Keeping::OnDisk {
        let started = std::time::Instant::now();
        let kept = kept::open(&config.data_dir, zone.clone()).await?;
        served_log = kept.served_log.clone();
        if kept.state.is_some() {
            keeper = Some(kept.keeper(&config.data_dir));
        }
        if let Some((snapshot, _)) = kept.state {
            saved = Some(dress(
                Serving::from_loaded(snapshot, zone.clone(), limits, metrics.clone(), started).with_served_log(served_log.clone()),
            ));
        }
    }

    let reach = reach(stop.clone());
    tokio::pin!(reach);
    let mut reached = None;
    if let Some(saved) = saved.take() {
        // Catch up first when the store answers at once: a restart then never answers with a
        // state older than the one it answered with before it stopped (the saved one may
        // lag it by up to the save interval). Else the saved state now, and catch up after.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(config.catch_up_at_start_ms);
        if let Ok(result) = tokio::time::timeout_at(deadline, reach.as_mut()).await {
            let result = result?;
            if let Some(store) = &result {
                match tokio::time::timeout_at(deadline, saved.rebuild(store)).await {
                    Ok(Ok(applied)) => {
                        tracing::info!(applied_changes = applied, "caught the saved state up with the store before answering")
                    }
                    Ok(Err(err)) => tracing::warn!(error = %format!("{err:#}"), "cannot catch the saved state up now; serving it as saved"),
                    Err(_) => tracing::info!(
                        catch_up_at_start_ms = config.catch_up_at_start_ms,
                        "the store did not catch the saved state up in time; serving it as saved, catching up after"
                    ),
                }
            }
            reached = Some(result);
        }
        udp = Some(start_dns(
            std::mem::take(&mut udp_sockets),
            std::mem::take(&mut tcp_listeners),
            &saved,
            tcp_limits,
            &config.dns.xdp,
            &mut tasks,
        )?);
        if let Some(on_bound) = on_bound.take() {
            on_bound(bound.clone());
        }
        tracing::info!(dns = ?dns, control = %control_addr, origin = %zone.origin, "authority serving its saved state");
        gate.dns_ready();
        serving = Some(saved);
    }
    let reached = match reached {
        Some(reached) => reached,
        None => reach.await?,
    };
    // `reach` said so when the store answered after a wait.
    store_reach.mark_quietly(false);
    let Some(store) = reached else {
        drop(control_server);
        tasks.shutdown().await;
        drop(udp);
        tracing::info!("authority stopped before the store answered");
        return Ok(());
    };
    let serving = match serving {
        Some(serving) => {
            match check_dns_zone(&store, &zone).await {
                Ok(()) => {}
                Err(err @ LoadError::DnsZoneMismatch { .. }) => return Err(err.into()),
                // The follower retries the store and says when it answers again.
                Err(err @ LoadError::Store(_)) => {
                    tracing::warn!(error = %format!("{:#}", anyhow::Error::new(err)), "cannot check the store's DNS zone now")
                }
            }
            serving
        }
        None => {
            let serving = match local {
                // On etcd, a member that answered the first read may not answer the next ones
                // (a cluster coming back): the load is retried as the connect is.
                Keeping::OnDisk => {
                    keeper = Some(kept::keeper(&config.data_dir, None, served_log.clone()));
                    let (store, zone, metrics, served_log, check) = (&store, &zone, &metrics, &served_log, &plan_check);
                    let load = move || {
                        let (zone, metrics, served_log, check) = (zone.clone(), metrics.clone(), served_log.clone(), check.clone());
                        async move {
                            Ok(Serving::load(store, zone, limits, metrics, check).await.map_err(start_failure)?.with_served_log(served_log))
                        }
                    };
                    let stopped = stop.clone().wait();
                    tokio::pin!(stopped);
                    match daemon::start_with_retry("the store's active state", load, stopped.as_mut()).await.map_err(anyhow::Error::msg)? {
                        Some(serving) => serving,
                        None => {
                            tasks.shutdown().await;
                            tracing::info!("authority stopped before the store's state was read");
                            return Ok(());
                        }
                    }
                }
                Keeping::InStore => {
                    let path = image::path_in(&config.data_dir);
                    let (serving, saved_at) =
                        Serving::load_imaged(&store, &path, zone.clone(), limits, metrics.clone(), plan_check.clone()).await?;
                    keeper = Some(image::Keeper::new(path, saved_at, image::SAVE_INTERVAL));
                    serving
                }
            };
            let serving = dress(serving);
            udp = Some(start_dns(udp_sockets, tcp_listeners, &serving, tcp_limits, &config.dns.xdp, &mut tasks)?);
            gate.dns_ready();
            serving
        }
    };
    if let Some(keeper) = &keeper {
        tasks.spawn(keeper.clone().keep_saved(serving.clone(), store.clone()));
    }
    tasks.spawn(serving.clone().follow(store.clone(), store_reach.clone()));
    crate::xfr::notify::spawn(&mut tasks, &serving);
    if others.has_signed() || config.added_zones.dnssec.is_some() {
        tasks.spawn(resign_static_zones(others.clone(), metrics.clone()));
    }
    // Zones signed with a key directory: read again, their keys rolled.
    // The managed zone's directory may be shared through the store (`kek_file`).
    let shared = shared_key_dir(&config, config_dir)?.map(|(kek, _)| SharedKeys::new(store.clone(), kek));
    for (zone, static_zone) in std::iter::once((serving.clone(), false)).chain(others.signed().into_iter().map(|z| (z, true))) {
        if let Some(every) = zone.zone.signer.as_ref().and_then(|s| s.key_check()) {
            let of = match static_zone {
                true => KeysOf::Static { notify: crate::xfr::notify::spawn_static, table: others.clone() },
                false => KeysOf::Managed(shared.clone()),
            };
            tasks.spawn(crate::serving::keep_keys(zone, every, of));
        }
    }
    // The zones the store manages beside its first one, served as its registry says.
    let zones_changed = Arc::new(crate::serving::zones::ZoneChanges::default());
    let kept_zones = kept_zones.await.unwrap_or_else(|err| {
        tracing::error!(error = %err, "serving the added zones' saved states failed; they are served once the store is read");
        Default::default()
    });
    let added = AddedZones::new(store.clone(), setup, zones_changed.clone(), kept_zones);
    tasks.spawn(added.keep());
    let id = report_id(&config.dns.advertise, &dns);
    // On etcd, where several authorities may follow one store, each reports where it serves.
    if local == Keeping::OnDisk {
        let advertised = if config.dns.advertise.is_empty() { dns.clone() } else { config.dns.advertise.clone() };
        tasks.spawn(report_itself(store.clone(), serving.clone(), store_reach.clone(), id.clone(), advertised));
    }

    let ctl = Control::new(store.clone(), access.clone())
        .with_metrics(metrics.clone())
        .with_full_reads_max(config.control.full_reads_max)
        .with_zone(zone.clone())
        .with_zones(others.clone())
        .with_zone_changes(zones_changed);
    let extra_metrics = extras.metrics.clone();
    let metrics_store = store.clone();
    // A store outage (etcd down) is logged when it begins and ends, not on every scrape.
    let metrics_reach = Arc::new(daemon::Reachability::new("the store, for metrics,"));
    let render_zones = others.clone();
    let render_book = book.clone();
    let render = move || {
        let (metrics, extra, store, reach) = (metrics.clone(), extra_metrics.clone(), metrics_store.clone(), metrics_reach.clone());
        let (config_zones, added_zones) = render_zones.counts();
        let added_summary = render_book.summary();
        async move {
            metrics.observe_static_zones(config_zones, added_zones);
            metrics.observe_added_zones(&added_summary);
            metrics.observe_store_disk(store.fault().is_some(), store.disk_free_bytes());
            // The store's own figures, read now: independent of the follower, which they check.
            match StoreReading::read(&store).await {
                Ok(reading) => {
                    reach.answered();
                    metrics.observe_store(&reading, now_unix_ms());
                }
                Err(err) => {
                    metrics.observe_store_read_error();
                    reach.failed(&format!("{err}; the store's gauges keep their last values"));
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
    let status_routes = axum::Router::new()
        .route(
            "/readyz",
            get({
                let ready = gate.ready();
                move || {
                    let ready = ready.clone();
                    async move { ready.readiness() }
                }
            }),
        )
        .route(
            "/v1/status",
            get({
                let (serving, dns, id) = (serving.clone(), dns.clone(), id.clone());
                move |State(ctl): State<Control<S>>, q: Result<Query<StatusQuery>, QueryRejection>| {
                    let (serving, dns, id) = (serving.clone(), dns.clone(), id.clone());
                    async move {
                        let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
                        status(&ctl.store, &ctl.store, serving, dns, id, q).await
                    }
                }
            })
            // Pollers take turns: a flood of them cannot take every core from writes.
            .layer(status_reads.clone()),
        )
        .route(
            "/v1/managed/{zone}/status",
            get({
                let (others, dns, id) = (others.clone(), dns.clone(), id.clone());
                move |State(ctl): State<Control<S>>, Zoned(zoned): Zoned<S>, q: Result<Query<StatusQuery>, QueryRejection>| {
                    let (others, dns, id) = (others.clone(), dns.clone(), id.clone());
                    async move {
                        let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
                        let serving = served_zone(&others, &zoned.store).await?;
                        status(&zoned.store, &ctl.store, serving, dns, id, q).await
                    }
                }
            })
            .layer(status_reads.clone()),
        )
        .route(
            "/ui",
            get({
                let (serving, planner, book) = (serving.clone(), extras.planner_status.clone(), book.clone());
                move |State(ctl): State<Control<S>>| {
                    let (serving, planner) = (serving.clone(), planner.clone());
                    let zones = ui::ZonesPanel { summary: book.summary(), first: book.first(ui::ZONES_SHOWN) };
                    async move {
                        ui::index(&ctl.store, &serving, planner.as_ref(), &ui::Base::first(), Some(&zones))
                            .await
                            .map(Html)
                            .map_err(ApiError::from)
                    }
                }
            })
            .layer(status_reads.clone()),
        )
        .route(
            "/ui/plans/{generation}",
            get(|State(ctl): State<Control<S>>, g: Result<UrlPath<u64>, PathRejection>| async move {
                let UrlPath(g) = g.map_err(|e| ApiError::bad_request(e.body_text()))?;
                ui::plan_page(&ctl.store, Generation(g), &ui::Base::first()).await.map(Html).map_err(ApiError::from)
            })
            .layer(status_reads.clone()),
        )
        .route(
            "/ui/managed/{zone}",
            get({
                let others = others.clone();
                move |Zoned(zoned): Zoned<S>, UrlPath(zone): UrlPath<String>| {
                    let others = others.clone();
                    async move {
                        let serving = served_zone(&others, &zoned.store).await?;
                        ui::index(&zoned.store, &serving, None, &ui::Base::managed(&zone), None).await.map(Html).map_err(ApiError::from)
                    }
                }
            })
            .layer(status_reads.clone()),
        )
        .route(
            "/ui/managed/{zone}/plans/{generation}",
            get(|Zoned(zoned): Zoned<S>, p: Result<UrlPath<(String, u64)>, PathRejection>| async move {
                let UrlPath((zone, g)) = p.map_err(|e| ApiError::bad_request(e.body_text()))?;
                ui::plan_page(&zoned.store, Generation(g), &ui::Base::managed(&zone)).await.map(Html).map_err(ApiError::from)
            })
            .layer(status_reads),
        );
    let mut app = routes::router(ctl.clone()).merge(routes::guarded(status_routes, &access)).with_state(ctl).route("/metrics", get(render));
    if let Some(extra) = extras.routes {
        app = app.merge(routes::guarded(extra, &access));
    }
    gate.open(app);
    if let Some(on_bound) = on_bound.take() {
        on_bound(bound);
        tracing::info!(dns = ?dns, control = %control_addr, origin = %zone.origin, "authority serving");
    } else {
        tracing::info!(control = %control_addr, "following the store; the control API serves");
    }
    // Stop accepting control requests on shutdown, finish those in flight, then stop DNS.
    stop.clone().wait().await;
    control_server.finish().await;
    tasks.shutdown().await;
    drop(udp);
    if let Some(keeper) = keeper {
        // The last state served, for the next start; a failure is said, and that start
        // serves (on etcd) or merges from (embedded) the one saved before, or reads the store.
        if let Err(err) = keeper.save_now(&serving, &store).await {
            tracing::error!(error = %format!("{err:#}"), "cannot save the served state at shutdown");
        }
    }
    tracing::info!("authority stopped");
    Ok(())
}

/// Starts answering DNS on the bound sockets from `serving`: the UDP threads (stopped and
/// joined when the result is dropped), the `xdp` interfaces' AF_XDP queues and one TCP task
/// per listener.
fn start_dns(
    udp_sockets: Vec<std::net::UdpSocket>,
    tcp_listeners: Vec<tokio::net::TcpListener>,
    serving: &Arc<Serving>,
    tcp_limits: TcpLimits,
    xdp: &[String],
    tasks: &mut tokio::task::JoinSet<()>,
) -> anyhow::Result<UdpServers> {
    let port = udp_sockets.first().and_then(|s| s.local_addr().ok()).map(|a| a.port());
    // XDP takes the datagrams to the addresses the sockets listen on, and no others.
    let addresses: Vec<std::net::IpAddr> = udp_sockets.iter().filter_map(|s| s.local_addr().ok()).map(|a| a.ip()).collect();
    let mut udp = UdpServers::start(udp_sockets, serving.clone()).context("starting the UDP threads")?;
    if let Some(port) = port {
        udp.serve_xdp(xdp, &addresses, port, serving);
    }
    for tcp in tcp_listeners {
        tasks.spawn(serve_tcp(tcp, serving.clone(), tcp_limits));
    }
    Ok(udp)
}

/// The status of the zone `store` holds and `serving` serves; the authorities' reports are the
/// store's first zone's (`root`), where every authority reports.
async fn status<S: Store>(
    store: &S,
    root: &S,
    serving: Arc<Serving>,
    dns: Vec<SocketAddr>,
    id: String,
    q: StatusQuery,
) -> Result<Json<dnsplan_common::status::Status>, ApiError> {
    let limit = q.limit.unwrap_or(STATUS_ENDPOINTS_DEFAULT);
    let after = q.after.as_deref().map(routes::parse_endpoint).transpose()?;
    let (endpoints, endpoints_more) = match limit {
        0 => (Default::default(), true),
        _ => {
            let page = store.active_page(after, limit).await?;
            (page.endpoints.into_iter().collect(), page.more)
        }
    };
    let snapshot = serving.snapshot.load();
    Ok(Json(dnsplan_common::status::Status {
        latest: store.latest().await?,
        paused: store.paused().await?,
        serial: snapshot.serial,
        applied_changes: snapshot.applied_changes,
        managed_endpoints: snapshot.managed_count(),
        dns,
        id,
        authorities: {
            let now = now_unix_ms();
            root.authorities().await?.into_iter().map(|report| AuthorityStatus::of(report, now)).collect()
        },
        heartbeats: store.heartbeats().await?,
        endpoints,
        endpoints_more,
        secondaries: serving.secondaries.lock().map(|s| s.clone()).unwrap_or_default(),
    }))
}

/// A TCP listener on `addr`, IPv6 only for an IPv6 address (as the UDP sockets: a dual-stack
/// `[::]` would take IPv4's port too), with `SO_REUSEADDR` as tokio's `bind` sets it.
fn bind_tcp(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    tokio::net::TcpListener::from_std(socket.into())
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
        match bind_tcp(bound) {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(err) if err.kind() == std::io::ErrorKind::AddrInUse && attempt < attempts => attempt += 1,
            Err(err) => return Err(err).with_context(|| format!("binding DNS TCP on {bound}")),
        }
    }
}
