//! The planner's TOML config (`planner.toml`): the managed DNS zone, the endpoints with their
//! targets and health checks, and the policy knobs. Unknown keys and bad values are errors
//! that name the key and the line: ranges are checked while parsing (the `Fraction`,
//! `Positive` and `NonZeroU32` types), and each endpoint is checked as a whole with its span.

use dnsplan_common::daemon::{self, ConfigError};
use dnsplan_common::plan::{TARGET_WEIGHT_MAX, TARGETS_PER_ENDPOINT_MAX, TTL_SECS_MAX, TTL_SECS_MIN};
use dnsplan_common::signing::SigningKey;
pub use dnsplan_common::store_config::StoreConfig;
use dnsplan_common::{DnsName, EndpointName, ZoneId};
use serde::Deserialize;
use std::collections::{BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Most endpoints one planner health-checks. Each target is probed on its own interval;
/// beyond this a fleet wants several planners, each for a part of the DNS zone.
pub const ENDPOINTS_MAX: usize = 10_000;

/// A number in `0.0..=1.0`.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Deserialize)]
#[serde(try_from = "f64")]
pub struct Fraction(pub f64);

impl TryFrom<f64> for Fraction {
    type Error = String;
    fn try_from(value: f64) -> Result<Self, String> {
        if (0.0..=1.0).contains(&value) { Ok(Fraction(value)) } else { Err(format!("{value} is not a fraction in 0.0..=1.0")) }
    }
}

/// An integer above zero (intervals, timeouts, windows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "u64")]
pub struct Positive(pub u64);

impl TryFrom<u64> for Positive {
    type Error = String;
    fn try_from(value: u64) -> Result<Self, String> {
        if value > 0 { Ok(Positive(value)) } else { Err("must be above 0".into()) }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannerConfig {
    /// This planner's id: the lease holder and the plans' author.
    pub id: String,
    /// The managed DNS zone's origin.
    pub dns_zone: DnsName,
    /// `dns_zone` is a zone added to the store beside its first one (`dnsplan zone add
    /// --managed`): the planner waits until the store has it, and plans it alone.
    #[serde(default)]
    pub added_zone: bool,
    pub store: StoreConfig,
    #[serde(default)]
    pub planner: LoopConfig,
    #[serde(default)]
    pub policy: Policy,
    #[serde(default)]
    pub metrics: MetricsConfig,
    #[serde(rename = "endpoint", default)]
    pub endpoints: Vec<toml::Spanned<EndpointConfig>>,
    /// Further zones this planner plans (`[[zone]]`), each a zone added to the store beside its
    /// first one: its own lease, plans, endpoints and (if given) policy, in this one process.
    #[serde(rename = "zone", default)]
    pub zones: Vec<toml::Spanned<ZoneConfig>>,
    /// `[signing]`: the key this planner signs its plans with.
    #[serde(default)]
    pub signing: SigningConfig,
}

/// `[signing]`: where the planner's plan signing key is.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigningConfig {
    /// A PEM Ed25519 private key (`dnsplan key new`) that only its owner may read (mode
    /// 0600): every plan is signed with it, for stores and enactors with a keyring. Relative
    /// to the config file. Unset: plans are not signed.
    pub key_file: Option<PathBuf>,
    /// The key, loaded with the config (`PlannerConfig::load`).
    #[serde(skip)]
    pub key: Option<Arc<SigningKey>>,
}

/// A further zone one planner plans (`[[zone]]`): a zone added to the store (`dnsplan zone add
/// --managed`), planned as `dns_zone` is with `added_zone = true`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneConfig {
    pub dns_zone: DnsName,
    /// The zone's own policy (keys not given take their defaults); without it, the top-level
    /// `[policy]`.
    pub policy: Option<Policy>,
    #[serde(rename = "endpoint", default)]
    pub endpoints: Vec<toml::Spanned<EndpointConfig>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoopConfig {
    /// How often the planner decides even without a health change.
    pub decide_interval_ms: Positive,
    /// The planner lease's time-to-live; it is renewed every third of it.
    pub lease_ttl_ms: Positive,
    /// Most health probes in flight at once.
    pub probe_concurrency: Positive,
    /// Timeout of each store call.
    pub call_timeout_ms: Positive,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            decide_interval_ms: Positive(1_000),
            lease_ttl_ms: Positive(10_000),
            probe_concurrency: Positive(64),
            call_timeout_ms: Positive(5_000),
        }
    }
}

/// The rules' knobs. Defaults are safe for three availability zones.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// Below this fraction of healthy targets, an endpoint serves all of its targets.
    pub fail_open_below: Fraction,
    /// Most of an endpoint's weight one plan removes (a zone shift is one decision and exempt).
    pub removal_fraction_per_plan: Fraction,
    /// Most of an endpoint's weight removed over `window_secs`.
    pub removal_fraction_per_window: Fraction,
    pub window_secs: Positive,
    /// This fraction of one zone's targets failing together, with the other zones healthy,
    /// is a zone problem.
    pub zone_impaired_fraction: Fraction,
    /// A zone is shifted away only if the other zones' healthy capacity covers this times
    /// the demand, for every endpoint.
    pub capacity_headroom: f64,
    /// A shifted zone comes back after being healthy this long.
    pub zone_recovery_dwell_secs: Positive,
    /// A plan changing more than this fraction of all endpoints trips the breaker...
    pub breaker_endpoint_fraction: Fraction,
    /// ...if it changes at least this many (small fleets change "most" endpoints at once).
    pub breaker_min_changed: Positive,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            fail_open_below: Fraction(0.5),
            removal_fraction_per_plan: Fraction(0.34),
            removal_fraction_per_window: Fraction(0.5),
            window_secs: Positive(300),
            zone_impaired_fraction: Fraction(0.5),
            capacity_headroom: 1.2,
            zone_recovery_dwell_secs: Positive(120),
            breaker_endpoint_fraction: Fraction(0.5),
            breaker_min_changed: Positive(3),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Where `/metrics`, `/healthz` and `/v1/status` listen; port 0 lets the system choose (the binary prints it).
    pub listen: SocketAddr,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { listen: SocketAddr::from(([127, 0, 0, 1], 9102)) }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub name: EndpointName,
    pub ttl_secs: u32,
    /// Current demand in the unit of `capacity`; defaults to half the total capacity.
    pub demand: Option<f64>,
    /// The check for targets that have none of their own.
    pub check: Option<Check>,
    #[serde(rename = "target")]
    pub targets: Vec<TargetConfig>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    pub address: IpAddr,
    pub zone: ZoneId,
    #[serde(default = "one")]
    pub weight: u32,
    /// What this target can carry, in any unit shared with `demand` (default 1).
    #[serde(default = "one_f")]
    pub capacity: f64,
    pub check: Option<Check>,
}

fn one() -> u32 {
    1
}
fn one_f() -> f64 {
    1.0
}

/// A health check: what to probe, how often, and the hysteresis.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(try_from = "RawCheck")]
pub struct Check {
    pub probe: Probe,
    pub interval_ms: Positive,
    pub timeout_ms: Positive,
    /// Consecutive successes for a down target to come back.
    pub rise: NonZeroU32,
    /// Consecutive failures for an up target to go down.
    pub fall: NonZeroU32,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Probe {
    /// A TCP connect to the target's address on `port`.
    Tcp { port: u16 },
    /// `GET http://address:port{path}`: the status must be in `expect` (`2xx`, `3xx`, or an
    /// exact code such as `204`) and the body, if `body_contains` is set, must contain it.
    Http { port: u16, path: String, expect: StatusExpectation, body_contains: Option<String> },
}

/// The check table as written: one flat table (`kind = "tcp"` or `"http"`), so that an
/// unknown key is still an error.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCheck {
    kind: String,
    port: u16,
    path: Option<String>,
    expect: Option<StatusExpectation>,
    body_contains: Option<String>,
    #[serde(default = "default_interval")]
    interval_ms: Positive,
    #[serde(default = "default_timeout")]
    timeout_ms: Positive,
    #[serde(default = "two")]
    rise: NonZeroU32,
    #[serde(default = "three")]
    fall: NonZeroU32,
}

impl TryFrom<RawCheck> for Check {
    type Error = String;
    fn try_from(raw: RawCheck) -> Result<Check, String> {
        let probe = match raw.kind.as_str() {
            "tcp" => {
                if raw.path.is_some() || raw.expect.is_some() || raw.body_contains.is_some() {
                    return Err("path, expect and body_contains are for kind = \"http\" checks only".into());
                }
                Probe::Tcp { port: raw.port }
            }
            "http" => {
                let path = raw.path.unwrap_or_else(slash);
                if !path.starts_with('/') {
                    return Err(format!("path {path:?} must start with '/'"));
                }
                Probe::Http { port: raw.port, path, expect: raw.expect.unwrap_or_else(two_xx), body_contains: raw.body_contains }
            }
            other => return Err(format!("kind {other:?} is not a check; use \"tcp\" or \"http\"")),
        };
        if raw.timeout_ms > raw.interval_ms {
            return Err(format!("timeout_ms ({}) is longer than interval_ms ({})", raw.timeout_ms.0, raw.interval_ms.0));
        }
        Ok(Check { probe, interval_ms: raw.interval_ms, timeout_ms: raw.timeout_ms, rise: raw.rise, fall: raw.fall })
    }
}

fn default_interval() -> Positive {
    Positive(1_000)
}
fn default_timeout() -> Positive {
    Positive(500)
}
fn two() -> NonZeroU32 {
    NonZeroU32::MIN.saturating_add(1)
}
fn three() -> NonZeroU32 {
    NonZeroU32::MIN.saturating_add(2)
}

fn slash() -> String {
    "/".into()
}
fn two_xx() -> StatusExpectation {
    StatusExpectation::Class(2)
}

/// `2xx` style classes or one exact status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum StatusExpectation {
    Class(u16),
    Exact(u16),
}

impl TryFrom<String> for StatusExpectation {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let bad = || format!("{text:?} is not a status class like \"2xx\" or a code like \"204\"");
        match text.as_bytes() {
            [c @ b'1'..=b'5', b'x', b'x'] => Ok(StatusExpectation::Class(u16::from(c - b'0'))),
            _ => match text.parse::<u16>() {
                Ok(code) if (100..=599).contains(&code) => Ok(StatusExpectation::Exact(code)),
                _ => Err(bad()),
            },
        }
    }
}

impl StatusExpectation {
    pub fn accepts(self, status: u16) -> bool {
        match self {
            StatusExpectation::Class(c) => status / 100 == c,
            StatusExpectation::Exact(code) => status == code,
        }
    }
}

impl EndpointConfig {
    /// Demand in capacity units.
    pub fn demand(&self) -> f64 {
        self.demand.unwrap_or_else(|| self.targets.iter().map(|t| t.capacity).sum::<f64>() / 2.0)
    }

    pub fn check_for<'a>(&'a self, target: &'a TargetConfig) -> Option<&'a Check> {
        target.check.as_ref().or(self.check.as_ref())
    }

    fn validate(&self, dns_zone: &DnsName) -> Result<(), String> {
        let name = &self.name;
        if !name.is_in(dns_zone) {
            return Err(format!("endpoint {name} is outside the DNS zone {dns_zone}"));
        }
        if !(TTL_SECS_MIN..=TTL_SECS_MAX).contains(&self.ttl_secs) {
            return Err(format!("endpoint {name}: ttl_secs {} is outside {TTL_SECS_MIN}..={TTL_SECS_MAX}", self.ttl_secs));
        }
        if self.targets.is_empty() || self.targets.len() > TARGETS_PER_ENDPOINT_MAX {
            return Err(format!("endpoint {name} has {} targets; give 1..={TARGETS_PER_ENDPOINT_MAX}", self.targets.len()));
        }
        let mut seen = HashSet::new();
        for t in &self.targets {
            if !seen.insert(t.address) {
                return Err(format!("endpoint {name}: target {} appears more than once", t.address));
            }
            if t.weight > TARGET_WEIGHT_MAX {
                return Err(format!("endpoint {name}: target {} weight {} is above {TARGET_WEIGHT_MAX}", t.address, t.weight));
            }
            if !(t.capacity.is_finite() && t.capacity >= 0.0) {
                return Err(format!("endpoint {name}: target {} capacity must be a number at least 0", t.address));
            }
            if self.check_for(t).is_none() {
                return Err(format!("endpoint {name}: target {} has no check (set endpoint.check or target.check)", t.address));
            }
        }
        if self.targets.iter().all(|t| t.weight == 0) {
            return Err(format!("endpoint {name}: every target has weight 0"));
        }
        if let Some(d) = self.demand
            && !(d.is_finite() && d >= 0.0)
        {
            return Err(format!("endpoint {name}: demand must be a number at least 0"));
        }
        Ok(())
    }
}

impl PlannerConfig {
    pub fn load(path: &Path) -> Result<PlannerConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        let mut config = PlannerConfig::parse(&text).map_err(|detail| ConfigError::invalid(path, detail))?;
        config.store.resolve(path).map_err(|detail| ConfigError::invalid(path, detail))?;
        if let Some(file) = &config.signing.key_file {
            let file = daemon::relative_to_config(path, file);
            let key = SigningKey::load(&file).map_err(|err| ConfigError::invalid(path, format!("signing.key_file: {err}")))?;
            config.signing.key = Some(Arc::new(key));
        }
        Ok(config)
    }

    /// Parses and checks a config text; errors name the key or endpoint and the line.
    pub fn parse(text: &str) -> Result<PlannerConfig, String> {
        let config: PlannerConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        config.store.check()?;
        config.validate(text)?;
        Ok(config)
    }

    /// Checks what parsing cannot: cross-field rules and each endpoint as a whole. `text` is
    /// the document the endpoints' spans point into, for line numbers.
    pub fn validate(&self, text: &str) -> Result<(), String> {
        let config = self;
        let line = |offset: usize| text[..offset.min(text.len())].bytes().filter(|b| *b == b'\n').count() + 1;
        if config.id.is_empty() || config.id.len() > dnsplan_common::plan::AUTHOR_BYTES_MAX {
            return Err(format!("id: give 1..={} bytes", dnsplan_common::plan::AUTHOR_BYTES_MAX));
        }
        check_policy(&config.policy, "policy")?;
        let (interval, ttl) = (config.planner.decide_interval_ms.0, config.planner.lease_ttl_ms.0);
        if interval.saturating_mul(3) > ttl {
            return Err(format!(
                "planner.decide_interval_ms ({interval}) must be at most a third of planner.lease_ttl_ms ({ttl}): the lease is renewed every decision"
            ));
        }
        if config.endpoints.is_empty() || config.endpoints.len() > ENDPOINTS_MAX {
            return Err(format!("give 1..={ENDPOINTS_MAX} [[endpoint]] tables (found {})", config.endpoints.len()));
        }
        let total = config.all_endpoints().count();
        if total > ENDPOINTS_MAX {
            return Err(format!(
                "{total} endpoints in all: one planner health-checks at most {ENDPOINTS_MAX}; split the zones between planners"
            ));
        }
        // Names are unique across zones: the probes' health is kept by endpoint name.
        let mut names = BTreeSet::new();
        let mut check_endpoints = |dns_zone: &DnsName, endpoints: &[toml::Spanned<EndpointConfig>]| -> Result<(), String> {
            for spanned in endpoints {
                let at = line(spanned.span().start);
                let endpoint = spanned.get_ref();
                endpoint.validate(dns_zone).map_err(|e| format!("line {at}: {e}"))?;
                if !names.insert(endpoint.name.clone()) {
                    return Err(format!("line {at}: endpoint {} is configured twice", endpoint.name));
                }
            }
            Ok(())
        };
        check_endpoints(&config.dns_zone, &config.endpoints)?;
        let mut zones = BTreeSet::from([config.dns_zone.clone()]);
        for spanned in &config.zones {
            let at = line(spanned.span().start);
            let zone = spanned.get_ref();
            if !zones.insert(zone.dns_zone.clone()) {
                return Err(format!("line {at}: zone {} is planned twice (dns_zone or another [[zone]])", zone.dns_zone));
            }
            if let Some(policy) = &zone.policy {
                check_policy(policy, &format!("line {at}: zone {}: policy", zone.dns_zone))?;
            }
            if zone.endpoints.is_empty() {
                return Err(format!("line {at}: zone {} has no [[zone.endpoint]] table", zone.dns_zone));
            }
            check_endpoints(&zone.dns_zone, &zone.endpoints)?;
        }
        Ok(())
    }

    /// The endpoints of `dns_zone` (not those of the `[[zone]]` tables).
    pub fn endpoints(&self) -> impl Iterator<Item = &EndpointConfig> {
        self.endpoints.iter().map(|s| s.get_ref())
    }

    /// Every endpoint of every zone the config plans: the health checks'.
    pub fn all_endpoints(&self) -> impl Iterator<Item = &EndpointConfig> {
        self.endpoints().chain(self.zones.iter().flat_map(|zone| zone.get_ref().endpoints.iter().map(|s| s.get_ref())))
    }

    /// The config of each zone planned, one zone each: `dns_zone` first, then each `[[zone]]`
    /// (an added zone, with its own policy or the top-level one).
    pub fn each_zone(&self) -> Vec<PlannerConfig> {
        let first = PlannerConfig { zones: Vec::new(), ..self.clone() };
        let others = self.zones.iter().map(|zone| {
            let zone = zone.get_ref();
            PlannerConfig {
                dns_zone: zone.dns_zone.clone(),
                added_zone: true,
                policy: zone.policy.clone().unwrap_or_else(|| self.policy.clone()),
                endpoints: zone.endpoints.clone(),
                zones: Vec::new(),
                ..self.clone()
            }
        });
        std::iter::once(first).chain(others).collect()
    }

    pub fn decide_interval(&self) -> Duration {
        Duration::from_millis(self.planner.decide_interval_ms.0)
    }
}

/// The checks of a policy parsing cannot make; `at` names it in the error.
fn check_policy(policy: &Policy, at: &str) -> Result<(), String> {
    if !(policy.capacity_headroom.is_finite() && policy.capacity_headroom >= 1.0) {
        return Err(format!("{at}.capacity_headroom: {} must be at least 1.0", policy.capacity_headroom));
    }
    Ok(())
}
