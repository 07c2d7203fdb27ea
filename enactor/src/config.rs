//! The enactor's TOML config (`enactor.toml`). Unknown keys are errors; every error names the
//! file, the key and the line. `--id` and `--zone` on the command line override the file.

use crate::rfc2136::{Fence, Rfc2136Settings};
use dnsplan_common::daemon::{self, ConfigError};
pub use dnsplan_common::store_config::StoreConfig;
use dnsplan_common::tsig::{TsigKey, TsigKeyConfig};
use dnsplan_common::{DnsName, ZoneId};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Longest accepted enactor id, in bytes (the store's heartbeat limit).
use dnsplan_common::signing::{Keyring, KeyringConfig};
use std::sync::Arc;

pub const ID_BYTES_MAX: usize = dnsplan_common::store::HEARTBEAT_TEXT_BYTES_MAX;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnactorConfig {
    /// This enactor's id, unique in the fleet (heartbeats are keyed by it).
    pub id: String,
    /// The availability zone it runs in.
    pub zone: ZoneId,
    pub store: StoreConfig,
    /// The DNS zones the store manages beside its first one (`dnsplan zone add --managed`)
    /// that this enactor enacts, each with its own loop, heartbeat and metrics (label
    /// `dns_zone`). Empty (the default): the store's first zone.
    #[serde(default)]
    pub dns_zones: Vec<DnsName>,
    /// Where plans are enacted: the store (the default) or an RFC 2136 primary.
    #[serde(default)]
    pub target: TargetConfig,
    #[serde(default)]
    pub apply: ApplyConfig,
    #[serde(default)]
    pub cleanup: CleanupConfig,
    #[serde(default)]
    pub verify: VerifyConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// `[[keyring.key]]`: the keys trusted to author plans. When set, a plan is read whole
    /// and applied only when a key of it signed it (`signing`), and the store (etcd) refuses
    /// publishes it does not trust.
    #[serde(default)]
    pub keyring: KeyringConfig,
}

/// Where an enactor writes (`[target]`, `kind = "store"` or `kind = "rfc2136"`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum TargetConfig {
    /// The store, served by dnsplan's authority.
    #[default]
    Store,
    /// A DNS primary that takes RFC 2136 UPDATEs signed with TSIG (Knot, BIND, PowerDNS).
    Rfc2136(Box<Rfc2136Config>),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rfc2136Config {
    /// The primary's DNS address; updates and marker reads go over TCP.
    pub server: std::net::SocketAddr,
    /// The DNS zone of the managed names, as the primary knows it.
    pub dns_zone: DnsName,
    /// The TSIG key the primary allows to update the zone.
    pub key: TsigKeyConfig,
    /// Timeout of one exchange with the primary.
    #[serde(default = "Rfc2136Config::default_timeout_ms")]
    pub timeout_ms: u64,
    /// Attempts of one exchange on a timeout or a connection error.
    #[serde(default = "Rfc2136Config::default_attempts")]
    pub attempts: u32,
    /// Marker reads and UPDATEs in flight at once (1..=64).
    #[serde(default = "Rfc2136Config::default_in_flight")]
    pub in_flight: usize,
    /// The key, built by `EnactorConfig::load` (secret files are read relative to the config).
    #[serde(skip)]
    pub resolved_key: Option<TsigKey>,
}

impl Rfc2136Config {
    fn default_timeout_ms() -> u64 {
        2_000
    }
    fn default_attempts() -> u32 {
        3
    }
    fn default_in_flight() -> usize {
        crate::rfc2136::IN_FLIGHT_DEFAULT
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApplyConfig {
    /// Re-apply the latest plan in full this often even when nothing changed.
    pub reconcile_interval_secs: u64,
    /// Timeout of each store call.
    pub call_timeout_ms: u64,
    /// Attempts per store call on transient errors (timeouts, unreachable store).
    pub retry_attempts: u32,
    /// First backoff; doubles per attempt up to `retry_max_ms`, with full jitter.
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// Deadline of one plan application; past it the enactor starts again from the latest plan.
    pub plan_deadline_secs: u64,
    /// Refuse a plan that stops serving more than this fraction of an endpoint's active
    /// weight in one step (operator rollbacks excepted).
    pub max_removal_fraction: f64,
    pub heartbeat_interval_secs: u64,
    /// Endpoints per store write (one transaction and one flush each), at most 4,096.
    pub batch_size: usize,
    /// Write every endpoint of every `full_write_every`-th plan; in between, write only the
    /// endpoints that changed since the plan this enactor applied last. 1 writes every plan
    /// in full. Unchanged endpoints keep their older generation until the next full write, so
    /// cleanup keeps up to this many plans beyond `retain_plans`.
    pub full_write_every: u64,
}

impl Default for ApplyConfig {
    fn default() -> Self {
        ApplyConfig {
            reconcile_interval_secs: 60,
            call_timeout_ms: 5_000,
            retry_attempts: 5,
            retry_base_ms: 50,
            retry_max_ms: 2_000,
            plan_deadline_secs: 120,
            max_removal_fraction: 0.5,
            heartbeat_interval_secs: 10,
            batch_size: 1_024,
            full_write_every: 16,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CleanupConfig {
    pub enabled: bool,
    /// Plans kept for rollback; the store never deletes an active or newer plan anyway.
    pub retain_plans: u64,
}

impl Default for CleanupConfig {
    fn default() -> Self {
        CleanupConfig { enabled: true, retain_plans: 20 }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerifyConfig {
    pub enabled: bool,
    /// The authority's DNS address.
    pub dns_server: SocketAddr,
    /// How long the authority may take to serve an applied plan.
    pub timeout_ms: u64,
    /// Most changed endpoints checked per plan (a sample when more changed).
    pub endpoints_max: usize,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        VerifyConfig { enabled: false, dns_server: SocketAddr::from(([127, 0, 0, 1], 5353)), timeout_ms: 5_000, endpoints_max: 1_000 }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Where `/metrics` and `/healthz` listen; port 0 lets the system choose (the binary prints it).
    pub listen: SocketAddr,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { listen: SocketAddr::from(([127, 0, 0, 1], 9101)) }
    }
}

impl EnactorConfig {
    /// Loads `path`, applies the command-line overrides, then checks every value.
    pub fn load(path: &Path, id: Option<String>, zone: Option<ZoneId>) -> Result<EnactorConfig, ConfigError> {
        let mut config: EnactorConfig = daemon::load_toml(path)?;
        if let Some(id) = id {
            config.id = id;
        }
        if let Some(zone) = zone {
            config.zone = zone;
        }
        config.store.resolve(path).map_err(|detail| ConfigError::invalid(path, detail))?;
        if let TargetConfig::Rfc2136(target) = &mut config.target {
            let dir = path.parent().unwrap_or(Path::new("."));
            let key = TsigKey::from_config(&target.key, dir).map_err(|e| ConfigError::invalid(path, format!("target.key: {e}")))?;
            target.resolved_key = Some(key);
        }
        config.check().map_err(|detail| ConfigError::invalid(path, detail))?;
        Ok(config)
    }

    /// Every value in range, with a message naming the key.
    pub fn check(&self) -> Result<(), String> {
        self.keyring.check()?;
        let id_ok = !self.id.is_empty()
            && self.id.len() <= ID_BYTES_MAX
            && self.id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !id_ok {
            return Err(format!("id: {:?} must be 1..={ID_BYTES_MAX} bytes of letters, digits, '-', '_' or '.'", self.id));
        }
        self.store.check()?;
        let mut zones = std::collections::BTreeSet::new();
        if let Some(twice) = self.dns_zones.iter().find(|z| !zones.insert(*z)) {
            return Err(format!("dns_zones: {twice} is named twice"));
        }
        if let TargetConfig::Rfc2136(target) = &self.target
            && (self.dns_zones.len() > 1 || self.dns_zones.first().is_some_and(|z| z != &target.dns_zone))
        {
            return Err(format!(
                "dns_zones: an RFC 2136 target takes the updates of one zone, target.dns_zone ({}); run one enactor per zone, each with its [target]",
                target.dns_zone
            ));
        }
        let a = &self.apply;
        let positive = [
            ("apply.reconcile_interval_secs", a.reconcile_interval_secs),
            ("apply.call_timeout_ms", a.call_timeout_ms),
            ("apply.retry_attempts", u64::from(a.retry_attempts)),
            ("apply.retry_base_ms", a.retry_base_ms),
            ("apply.plan_deadline_secs", a.plan_deadline_secs),
            ("apply.heartbeat_interval_secs", a.heartbeat_interval_secs),
            ("verify.timeout_ms", self.verify.timeout_ms),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("{key} must be above 0"));
            }
        }
        if a.retry_max_ms < a.retry_base_ms {
            return Err(format!("apply.retry_max_ms ({}) is below apply.retry_base_ms ({})", a.retry_max_ms, a.retry_base_ms));
        }
        if !(1..=dnsplan_common::store::APPLY_BATCH_MAX).contains(&a.batch_size) {
            return Err(format!("apply.batch_size: {} must be in 1..={}", a.batch_size, dnsplan_common::store::APPLY_BATCH_MAX));
        }
        if a.full_write_every == 0 {
            return Err("apply.full_write_every: must be at least 1 (1 writes every plan in full)".into());
        }
        if !(a.max_removal_fraction > 0.0 && a.max_removal_fraction <= 1.0) {
            return Err(format!("apply.max_removal_fraction: {} must be in (0, 1]", a.max_removal_fraction));
        }
        if let TargetConfig::Rfc2136(target) = &self.target {
            if target.resolved_key.is_none() {
                return Err("target.key: the TSIG key was not loaded (load the config with EnactorConfig::load)".into());
            }
            if !(1..=60_000).contains(&target.timeout_ms) {
                return Err(format!("target.timeout_ms: {} must be in 1..=60000", target.timeout_ms));
            }
            if !(1..=10).contains(&target.attempts) {
                return Err(format!("target.attempts: {} must be in 1..=10", target.attempts));
            }
            let in_flight_max = crate::rfc2136::IN_FLIGHT_MAX;
            if !(1..=in_flight_max).contains(&target.in_flight) {
                return Err(format!("target.in_flight: {} must be in 1..={in_flight_max}", target.in_flight));
            }
            // Verifying against the authority's default address while the records go to
            // another server fails every time, and a failed verification skips cleanup.
            let default_dns = VerifyConfig::default().dns_server;
            if self.verify.enabled && self.verify.dns_server == default_dns && target.server != default_dns {
                return Err(format!(
                    "verify.dns_server: with target.kind = \"rfc2136\" verification asks the server the records go to; set it to {} \
                     (or one of its secondaries)",
                    target.server
                ));
            }
        }
        if self.cleanup.retain_plans == 0 {
            return Err("cleanup.retain_plans must be at least 1 (keep something to roll back to)".into());
        }
        Ok(())
    }

    pub fn settings(&self) -> Settings {
        let a = &self.apply;
        Settings {
            id: self.id.clone(),
            zone: self.zone.clone(),
            reconcile_interval: Duration::from_secs(a.reconcile_interval_secs),
            call_timeout: Duration::from_millis(a.call_timeout_ms),
            retry: RetryPolicy {
                attempts: a.retry_attempts,
                base: Duration::from_millis(a.retry_base_ms),
                max: Duration::from_millis(a.retry_max_ms),
            },
            plan_deadline: Duration::from_secs(a.plan_deadline_secs),
            max_removal_fraction: a.max_removal_fraction,
            heartbeat_interval: Duration::from_secs(a.heartbeat_interval_secs),
            batch_size: a.batch_size,
            full_write_every: a.full_write_every,
            cleanup_retain: self.cleanup.enabled.then_some(self.cleanup.retain_plans),
            target: match &self.target {
                TargetConfig::Store => Target::Store,
                TargetConfig::Rfc2136(t) => Target::Rfc2136(Rfc2136Settings {
                    server: t.server,
                    dns_zone: t.dns_zone.clone(),
                    // Invariant: `load` builds the key and `check` refuses a target without
                    // one; writing to the store instead would be a silent wrong target.
                    key: t.resolved_key.clone().expect("an RFC 2136 target's key is loaded before its settings are built"),
                    timeout: Duration::from_millis(t.timeout_ms),
                    attempts: t.attempts,
                    in_flight: t.in_flight,
                    fence: Fence::Prerequisites,
                }),
            },
            verify: self.verify.enabled.then(|| VerifySettings {
                dns_server: self.verify.dns_server,
                timeout: Duration::from_millis(self.verify.timeout_ms),
                endpoints_max: self.verify.endpoints_max,
            }),
            // `check` refused a keyring that does not load.
            keyring: Keyring::from_config(&self.keyring).ok().flatten().map(Arc::new),
        }
    }
}

/// Retries of one store call: `attempts` in all, backoff from `base` doubling to `max`.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub base: Duration,
    pub max: Duration,
}

#[derive(Clone, Debug)]
pub struct VerifySettings {
    pub dns_server: SocketAddr,
    pub timeout: Duration,
    pub endpoints_max: usize,
}

/// What an `Enactor` runs with, from the config or built directly (the one-process stack).
#[derive(Clone, Debug)]
pub struct Settings {
    pub id: String,
    pub zone: ZoneId,
    pub reconcile_interval: Duration,
    pub call_timeout: Duration,
    pub retry: RetryPolicy,
    pub plan_deadline: Duration,
    pub max_removal_fraction: f64,
    pub heartbeat_interval: Duration,
    pub batch_size: usize,
    pub full_write_every: u64,
    /// `Some(retain)` to clean up after each fully applied plan.
    pub cleanup_retain: Option<u64>,
    pub verify: Option<VerifySettings>,
    pub target: Target,
    /// Plans are applied only when it trusts them (`None`: every plan).
    pub keyring: Option<Arc<Keyring>>,
}

/// Where an enactor writes the endpoints of a plan.
#[derive(Clone, Debug, Default)]
pub enum Target {
    /// Through the store's fence (dnsplan's authority serves the store).
    #[default]
    Store,
    /// Onto an RFC 2136 primary through its markers; acknowledged writes are then recorded in
    /// the store, whose fences are the cleanup floor.
    Rfc2136(Rfc2136Settings),
}

impl Settings {
    /// The defaults of `enactor.toml` for `id` in `zone`.
    pub fn new(id: &str, zone: ZoneId) -> Settings {
        let config = EnactorConfig {
            id: id.into(),
            zone,
            store: StoreConfig::control("http://127.0.0.1:8053", None),
            dns_zones: Vec::new(),
            target: TargetConfig::Store,
            apply: ApplyConfig::default(),
            cleanup: CleanupConfig::default(),
            verify: VerifyConfig::default(),
            metrics: MetricsConfig::default(),
            keyring: KeyringConfig::default(),
        };
        config.settings()
    }
}
