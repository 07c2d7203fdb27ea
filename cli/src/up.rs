//! `dnsplan up`: the authority, the planner, one enactor per zone and the demo backends in one
//! process, sharing one embedded sled store. Each part is the same library code the separate
//! daemons run; only the store is shared in-process instead of reached over HTTP.
//!
//! `Stack::load` reads `examples/dnsplan.toml` (built in) or `--config`, builds the
//! authority's, the planner's and one enactor's config per zone from its sections, and checks
//! each with that daemon's own checks. `Stack::run` opens one `SledStore` and runs the
//! authority (`run_with_extras`, with the planner's and enactors' metrics merged into its
//! `/metrics` and the routes `/v1/planner` and `/v1/demo/backends`), one `Enactor` per zone and
//! the `Planner`, all on that store. On shutdown the enactors and the planner stop first (the
//! planner releases its lease), then the authority.

use crate::demo::Backends;
use anyhow::Context;
use axum::Json;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use dnsplan_authority::config::{AuthorityConfig, ControlConfig, DnsConfig, TOKEN_BYTES_MIN};
use dnsplan_authority::run::{Bound, Extras, run_with_extras};
use dnsplan_authority::zone::dns_zone::DnsZoneConfig;
use dnsplan_common::daemon::{self, ConfigError};
use dnsplan_common::signing::{KeyringConfig, SigningKey};
use dnsplan_common::{DnsName, ZoneId};
use dnsplan_enactor::config::{ApplyConfig, CleanupConfig, EnactorConfig, MetricsConfig as EnactorMetrics, StoreConfig, VerifyConfig};
use dnsplan_planner::PlannerConfig;
use dnsplan_planner::config::{EndpointConfig, LoopConfig, MetricsConfig, Policy, ZoneConfig};
use dnsplan_planner::health::{HealthBook, spawn_checks};
use prometheus_client::registry::Registry;
use serde::Deserialize;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The built-in configuration, also shipped as `examples/dnsplan.toml`.
pub const BUILT_IN: &str = include_str!("../../examples/dnsplan.toml");

/// `dnsplan.toml` as written, before `Stack::load` checks it and builds each daemon's config.
/// Public so that the documentation's test can trace the keys it takes; its fields are not.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpConfig {
    data_dir: PathBuf,
    token: Option<String>,
    authority: AuthoritySection,
    enactors: EnactorsSection,
    planner: PlannerSection,
    #[serde(default)]
    demo: DemoSection,
    /// `[[keyring.key]]`: the keys the stack trusts to author plans (without it, with the demo
    /// token, the demo key).
    #[serde(default)]
    keyring: KeyringConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthoritySection {
    #[serde(default)]
    dns: DnsConfig,
    control: ControlListen,
    dns_zone: DnsZoneConfig,
    /// `[[authority.zones]]`: static zones served beside the managed one.
    #[serde(default)]
    zones: Vec<DnsZoneConfig>,
    /// `[authority.added_zones]`: as authority.toml's, `key_root` and `kek_file` relative to
    /// this file.
    #[serde(default)]
    added_zones: dnsplan_authority::config::AddedZonesConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlListen {
    listen: SocketAddr,
    /// As authority.toml's `[control.tls]`, paths relative to this file.
    #[serde(default)]
    tls: Option<dnsplan_authority::config::ControlTlsConfig>,
    #[serde(default)]
    insecure_plaintext: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnactorsSection {
    zones: Vec<ZoneId>,
    #[serde(default)]
    apply: ApplyConfig,
    #[serde(default)]
    cleanup: CleanupConfig,
    #[serde(default)]
    verify: VerifyToggle,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyToggle {
    #[serde(default)]
    enabled: bool,
    #[serde(default = "verify_timeout")]
    timeout_ms: u64,
}

impl Default for VerifyToggle {
    fn default() -> Self {
        VerifyToggle { enabled: true, timeout_ms: verify_timeout() }
    }
}

fn verify_timeout() -> u64 {
    5_000
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlannerSection {
    #[serde(default)]
    planner: LoopConfig,
    #[serde(default)]
    policy: Policy,
    #[serde(rename = "endpoint", default)]
    endpoints: Vec<toml::Spanned<EndpointConfig>>,
    /// Zones added to the store that the planner plans too (`[[planner.zone]]`).
    #[serde(rename = "zone", default)]
    zones: Vec<toml::Spanned<ZoneConfig>>,
    /// `[planner.signing]`: as planner.toml's `[signing]`, its path relative to this file.
    #[serde(default)]
    signing: dnsplan_planner::config::SigningConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DemoSection {
    backends: bool,
}

impl Default for DemoSection {
    fn default() -> Self {
        DemoSection { backends: true }
    }
}

/// The `dns_zone` label of the series of `dnsplan up`'s enactor loops on the zones added to
/// its store: one set for all of them.
const ADDED_ZONES: &str = "*";

/// The `token` of a stack config file, for the operator commands.
pub fn token_of(path: &Path) -> anyhow::Result<Option<String>> {
    #[derive(Deserialize)]
    struct TokenOnly {
        token: Option<String>,
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let parsed: TokenOnly = toml::from_str::<toml::Table>(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
        .and_then(|t| toml::Value::Table(t).try_into().map_err(|e| anyhow::anyhow!("{}: token: {e}", path.display())))?;
    Ok(parsed.token)
}

/// Command-line overrides of the config.
#[derive(Debug, Default)]
pub struct Overrides {
    pub data_dir: Option<PathBuf>,
    pub dns: Option<SocketAddr>,
    pub control: Option<SocketAddr>,
    /// `--accept-store-loss`.
    pub accept_store_loss: bool,
}

/// Everything `up` runs, checked.
pub struct Stack {
    authority: AuthorityConfig,
    config_dir: PathBuf,
    enactors: Vec<EnactorConfig>,
    planner: PlannerConfig,
    demo: bool,
}

impl Stack {
    /// Reads `path`, or the built-in configuration when `None`.
    pub fn load(path: Option<&Path>, overrides: Overrides) -> Result<Stack, ConfigError> {
        let (text, shown, config_dir) = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read { path: p.into(), source })?;
                (text, p.to_path_buf(), p.parent().map(PathBuf::from).unwrap_or_default())
            }
            None => (BUILT_IN.to_owned(), PathBuf::from("(built-in examples/dnsplan.toml)"), PathBuf::from(".")),
        };
        let invalid = |detail: String| ConfigError::invalid(&shown, detail);
        let up: UpConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse { path: shown.clone(), detail: e.to_string() })?;
        let token =
            daemon::token_from_env_or(up.token).ok_or_else(|| invalid(format!("token is not set; set it or {}", daemon::TOKEN_ENV)))?;
        if token.len() < TOKEN_BYTES_MIN {
            return Err(invalid(format!("token is shorter than {TOKEN_BYTES_MIN} bytes; use a long random token")));
        }
        let data_dir = overrides.data_dir.unwrap_or(up.data_dir);
        let data_dir = if path.is_some() { daemon::relative_to_config(&shown, &data_dir) } else { data_dir };
        let mut dns = up.authority.dns;
        if let Some(addr) = overrides.dns {
            dns.listen = vec![addr];
        }
        let control_listen = overrides.control.unwrap_or(up.authority.control.listen);
        if daemon::is_placeholder_token(&token) && !control_listen.ip().is_loopback() {
            return Err(invalid(format!(
                "the demo token is accepted only with the control API on loopback, and it would listen on {control_listen}; set token \
                 or {} to a long random token (e.g. the output of `openssl rand -hex 24`)",
                daemon::TOKEN_ENV
            )));
        }
        let dns_zone = DnsName::parse(&up.authority.dns_zone.origin).map_err(|e| invalid(format!("authority.dns_zone.origin: {e}")))?;
        let authority = AuthorityConfig {
            data_dir,
            store: None,
            dns,
            control: ControlConfig {
                listen: control_listen,
                token: Some(token.clone()),
                tls: up.authority.control.tls.map(|mut tls| {
                    tls.cert_file = daemon::relative_to_config(&shown, &tls.cert_file);
                    tls.key_file = daemon::relative_to_config(&shown, &tls.key_file);
                    tls.client_ca_file = tls.client_ca_file.map(|ca| daemon::relative_to_config(&shown, &ca));
                    tls
                }),
                insecure_plaintext: up.authority.control.insecure_plaintext,
                ..ControlConfig::default()
            },
            dns_zone: up.authority.dns_zone,
            zones: up.authority.zones,
            // The embedded store has no saved state to catch up: it is the store.
            catch_up_at_start_ms: 0,
            keyring: Default::default(),
            added_zones: {
                let mut added = up.authority.added_zones;
                if let Some(dnssec) = &mut added.dnssec {
                    dnssec.key_root = daemon::relative_to_config(&shown, &dnssec.key_root);
                    dnssec.kek_file = dnssec.kek_file.as_ref().map(|kek| daemon::relative_to_config(&shown, kek));
                }
                added
            },
            accept_store_loss: overrides.accept_store_loss,
            source: None,
        };
        authority.check().map_err(|detail| invalid(format!("authority.{detail}")))?;

        let planner = PlannerConfig {
            id: "planner".into(),
            dns_zone,
            added_zone: false,
            store: dnsplan_planner::config::StoreConfig::control("http://embedded", None),
            planner: up.planner.planner,
            policy: up.planner.policy,
            metrics: MetricsConfig::default(),
            endpoints: up.planner.endpoints,
            zones: up.planner.zones,
            signing: Default::default(),
        };
        let signing_key_file = up.planner.signing.key_file.clone();
        planner.validate(&text).map_err(|detail| invalid(format!("planner: {detail}")))?;

        if up.enactors.zones.is_empty() {
            return Err(invalid("enactors.zones: give at least one availability zone".into()));
        }
        let mut enactors = Vec::new();
        for zone in up.enactors.zones {
            let config = EnactorConfig {
                id: format!("enactor-{zone}"),
                zone,
                store: StoreConfig::control("http://embedded", None),
                dns_zones: Vec::new(),
                // The one-process stack enacts onto its own store.
                target: Default::default(),
                apply: up.enactors.apply.clone(),
                cleanup: up.enactors.cleanup.clone(),
                // The DNS address is filled in once the authority has bound it.
                verify: VerifyConfig {
                    enabled: up.enactors.verify.enabled,
                    timeout_ms: up.enactors.verify.timeout_ms,
                    ..VerifyConfig::default()
                },
                metrics: EnactorMetrics::default(),
                keyring: Default::default(),
            };
            config.check().map_err(|detail| invalid(format!("enactors: {detail}")))?;
            enactors.push(config);
        }
        // Plans signed by their authors: the keyring and the planner's key of the file, else
        // with the demo token its demo key (as public as the token, and as bound to loopback),
        // with which the CLI signs when it sends the demo token.
        let mut authority = authority;
        let mut planner = planner;
        if let Some(file) = &signing_key_file {
            let file = if path.is_some() { daemon::relative_to_config(&shown, file) } else { file.clone() };
            let key = SigningKey::load(&file).map_err(|e| invalid(format!("planner.signing.key_file: {e}")))?;
            planner.signing.key = Some(Arc::new(key));
        }
        let keyring = if !up.keyring.key.is_empty() {
            up.keyring.check().map_err(invalid)?;
            up.keyring
        } else if daemon::is_placeholder_token(&token) {
            planner.signing.key.get_or_insert_with(|| Arc::new(SigningKey::demo()));
            KeyringConfig::demo()
        } else {
            KeyringConfig::default()
        };
        authority.keyring = keyring.clone();
        enactors.iter_mut().for_each(|e| e.keyring = keyring.clone());
        Ok(Stack { authority, config_dir, enactors, planner, demo: up.demo.backends })
    }

    /// Runs until `shutdown`; `on_ready` is told where everything listens.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
        on_ready: impl FnOnce(Ready),
    ) -> anyhow::Result<()> {
        let data_dir = self.authority.data_dir.clone();
        std::fs::create_dir_all(&data_dir).with_context(|| format!("creating the data directory {}", data_dir.display()))?;
        let store = dnsplan_authority::run::open_embedded(&self.authority)?;
        let planner_config = Arc::new(self.planner);
        let backends = if self.demo { Backends::start(&planner_config).await? } else { Backends::default() };

        let mut registry = Registry::with_prefix("dnsplan");
        let planner_metrics = Arc::new(dnsplan_planner::metrics::Metrics::register(&mut registry, &planner_config.id));
        // One family per metric, a series per enactor: Prometheus refuses a name described twice.
        let enactor_families = dnsplan_enactor::Families::register(&mut registry);
        let enactor_metrics: Vec<_> = self.enactors.iter().map(|e| Arc::new(enactor_families.enactor(&e.id))).collect();
        let registry = Arc::new(registry);

        let book = Arc::new(HealthBook::default());
        let zone_configs: Vec<Arc<PlannerConfig>> = planner_config.each_zone().into_iter().map(Arc::new).collect();
        let zone_planner_metrics = dnsplan_planner::zones::zone_metrics(&planner_metrics, &zone_configs);
        let statuses: Vec<_> = zone_configs
            .iter()
            .map(|_| {
                Arc::new(std::sync::Mutex::new(dnsplan_planner::planner::Status { id: planner_config.id.clone(), ..Default::default() }))
            })
            .collect();
        let status = statuses[0].clone();
        let page_status = status.clone();
        let planner_status: dnsplan_authority::control::ui::PlannerStatus = Arc::new(move || page_status.lock().ok().map(|s| s.clone()));
        let demo_state = DemoState { backends: backends.clone() };
        let routes = axum::Router::new()
            .route(
                "/v1/planner",
                get(move || {
                    let status = status.lock().map(|s| s.clone()).unwrap_or_default();
                    async move { Json(status) }
                }),
            )
            .route("/v1/demo/backends", get(list_backends))
            .route("/v1/demo/backends/{address}/{action}", post(switch_backend))
            .with_state(demo_state);

        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let zones_stopped = stop_rx.clone();
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<Bound>();
        let (authority_config, config_dir, authority_store, authority_stopped) =
            (self.authority, self.config_dir, store.clone(), stopped());
        let authority = tokio::spawn(async move {
            let on_bound = move |b| {
                let _ = bound_tx.send(b);
            };
            let extras = Extras { routes: Some(routes), metrics: Some(registry), planner_status: Some(planner_status) };
            run_with_extras(authority_store, authority_config, &config_dir, authority_stopped, on_bound, extras).await
        });
        let bound = match bound_rx.await {
            Ok(bound) => bound,
            Err(_) => return authority.await?.context("the authority stopped before serving"),
        };

        let mut tasks = tokio::task::JoinSet::new();
        for (config, metrics) in self.enactors.iter().zip(enactor_metrics) {
            let mut settings = config.settings();
            if let Some(v) = settings.verify.as_mut() {
                v.dns_server = bound.dns[0];
            }
            // The zones added to the store beside the first (`dnsplan zone add --managed`):
            // each enactor enacts them too, a loop each. Their series are one set for all of
            // them (`dns_zone="*"`): the stack enacts every zone added, so a set per zone would
            // grow with the zones (100,000 zones, millions of series).
            let added_metrics = Arc::new(enactor_families.zone_enactor(&config.id, ADDED_ZONES));
            let zone_metrics = move |_: &dnsplan_common::DnsName| added_metrics.clone();
            tasks.spawn(dnsplan_enactor::zones::enact_added_zones(store.clone(), settings.clone(), zone_metrics, zones_stopped.clone()));
            tasks.spawn(dnsplan_enactor::Enactor::new(store.clone(), settings, metrics).run(stopped()));
        }
        let checks = spawn_checks(&planner_config, book.clone(), planner_metrics.clone());
        tasks.spawn(dnsplan_planner::zones::plan_zones(store.clone(), zone_configs, book, zone_planner_metrics, statuses, stopped()));

        on_ready(Ready {
            dns: bound.dns[0],
            control: bound.control,
            control_url: bound.control_url(),
            data_dir,
            zone: planner_config.dns_zone.to_string(),
            first_endpoint: planner_config.endpoints().next().map(|e| e.name.to_string()).unwrap_or_default(),
            demo_backends: backends.list().len(),
        });
        shutdown.await;
        tracing::info!("stopping: enactors and planner first, then the authority");
        let _ = stop_tx.send(true);
        drop(checks);
        while tasks.join_next().await.is_some() {}
        authority.await??;
        Ok(())
    }
}

/// Where a running stack listens.
pub struct Ready {
    pub dns: SocketAddr,
    pub control: SocketAddr,
    /// `http://` or, with `[authority.control.tls]`, `https://`.
    pub control_url: String,
    pub data_dir: PathBuf,
    pub zone: String,
    pub first_endpoint: String,
    pub demo_backends: usize,
}

#[derive(Clone)]
struct DemoState {
    backends: Backends,
}

async fn list_backends(State(demo): State<DemoState>) -> Json<Vec<crate::demo::BackendStatus>> {
    Json(demo.backends.list())
}

async fn switch_backend(
    State(demo): State<DemoState>,
    UrlPath((address, action)): UrlPath<(String, String)>,
) -> (StatusCode, Json<serde_json::Value>) {
    // The authority's `access::guard` admitted the caller (the operate role).
    let Ok(ip) = address.parse::<IpAddr>() else {
        return (StatusCode::BAD_REQUEST, Json(serde_json::json!({"message": format!("{address:?} is not an IP address")})));
    };
    let healthy = match action.as_str() {
        "heal" => true,
        "fail" => false,
        other => return (StatusCode::BAD_REQUEST, Json(serde_json::json!({"message": format!("{other:?}: use fail or heal")}))),
    };
    match demo.backends.set(ip, healthy) {
        0 => (StatusCode::NOT_FOUND, Json(serde_json::json!({"message": format!("no demo backend on {ip}")}))),
        n => {
            tracing::warn!(%ip, action = %action, "demo backend switched");
            (StatusCode::OK, Json(serde_json::json!({"address": ip, "healthy": healthy, "listeners": n})))
        }
    }
}
