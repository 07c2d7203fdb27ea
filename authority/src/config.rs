//! The authority's TOML config (`authority.toml`). Unknown keys are errors; every error
//! names the file, the key and the line.

use crate::dns_zone::DnsZoneConfig;
use dnsplan_common::daemon;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Shortest accepted control token. 16 bytes of randomness resist guessing over HTTP.
pub const TOKEN_BYTES_MIN: usize = 16;
pub use dnsplan_common::daemon::{ConfigError, TOKEN_ENV};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorityConfig {
    /// Directory of the embedded store (created if missing).
    pub data_dir: PathBuf,
    #[serde(default)]
    pub dns: DnsConfig,
    pub control: ControlConfig,
    pub dns_zone: DnsZoneConfig,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsConfig {
    /// Addresses to serve DNS on, UDP and TCP each.
    #[serde(default = "default_dns_listen")]
    pub listen: Vec<SocketAddr>,
    #[serde(default = "default_payload")]
    pub edns_udp_payload_bytes: u16,
    #[serde(default = "default_answer_max")]
    pub answer_addresses_max: usize,
    #[serde(default = "default_tcp_idle")]
    pub tcp_idle_timeout_secs: u64,
    #[serde(default = "default_tcp_max")]
    pub tcp_connections_max: usize,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            listen: default_dns_listen(),
            edns_udp_payload_bytes: default_payload(),
            answer_addresses_max: default_answer_max(),
            tcp_idle_timeout_secs: default_tcp_idle(),
            tcp_connections_max: default_tcp_max(),
        }
    }
}

fn default_dns_listen() -> Vec<SocketAddr> {
    vec![SocketAddr::from(([127, 0, 0, 1], 5353))]
}
fn default_payload() -> u16 {
    1_232
}
fn default_answer_max() -> usize {
    8
}
fn default_tcp_idle() -> u64 {
    10
}
fn default_tcp_max() -> usize {
    1_024
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    #[serde(default = "default_control_listen")]
    pub listen: SocketAddr,
    /// The bearer token for writes. Prefer the `DNSPLAN_TOKEN` environment variable.
    pub token: Option<String>,
}

fn default_control_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8053))
}

impl AuthorityConfig {
    pub fn load(path: &Path) -> Result<AuthorityConfig, ConfigError> {
        let mut config: AuthorityConfig = daemon::load_toml(path)?;
        config.control.token = daemon::token_from_env_or(config.control.token.take());
        config.check().map_err(|detail| ConfigError::invalid(path, detail))?;
        config.data_dir = daemon::relative_to_config(path, &config.data_dir);
        Ok(config)
    }

    /// Every value in range, with a message naming the key.
    pub fn check(&self) -> Result<(), String> {
        let dns = &self.dns;
        if dns.listen.is_empty() {
            return Err("dns.listen: give at least one address".into());
        }
        if dns.edns_udp_payload_bytes < 512 {
            return Err(format!("dns.edns_udp_payload_bytes: {} is below the DNS minimum of 512", dns.edns_udp_payload_bytes));
        }
        if !(1..=64).contains(&dns.answer_addresses_max) {
            return Err(format!("dns.answer_addresses_max: {} is outside 1..=64", dns.answer_addresses_max));
        }
        if dns.tcp_connections_max == 0 || dns.tcp_idle_timeout_secs == 0 {
            return Err("dns.tcp_connections_max and dns.tcp_idle_timeout_secs must be above 0".into());
        }
        match &self.control.token {
            None => Err(format!("control.token is not set; set it or the {TOKEN_ENV} environment variable")),
            Some(t) if t.len() < TOKEN_BYTES_MIN => {
                Err(format!("control.token is shorter than {TOKEN_BYTES_MIN} bytes; use a long random token"))
            }
            Some(_) => Ok(()),
        }
    }

    pub fn token(&self) -> &str {
        // Invariant: `load` refuses a config without a token.
        self.control.token.as_deref().unwrap_or_default()
    }
}
