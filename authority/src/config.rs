//! The authority's TOML config (`authority.toml`). Unknown keys are errors; every error
//! names the file, the key and the line.

use crate::control::server;
use crate::query::rrl::{self, IpPrefix, RrlSettings};
pub use crate::serving::policy::{SecondaryConfig, TransferConfig};
use crate::zone::dns_zone::DnsZoneConfig;
use dnsplan_common::daemon;
use dnsplan_common::store::WAIT_TIMEOUT_MAX;
use dnsplan_common::store_config::StoreConfig;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::control::access::TOKEN_BYTES_MIN;
use crate::control::access::{CredentialConfig, Credentials};
pub use dnsplan_common::daemon::{ConfigError, TOKEN_ENV};
use dnsplan_common::signing::{Keyring, KeyringConfig};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorityConfig {
    /// Directory of the embedded store (created if missing); on etcd, of the copy of the
    /// state last served (`local_state`).
    pub data_dir: PathBuf,
    /// `[store]`: absent, the embedded store in `data_dir`; `kind = "etcd"`, a store on etcd
    /// that other authorities, planners and enactors share (the same table as theirs).
    #[serde(default)]
    pub store: Option<StoreConfig>,
    #[serde(default)]
    pub dns: DnsConfig,
    pub control: ControlConfig,
    pub dns_zone: DnsZoneConfig,
    /// `[[zones]]`: static zones served beside the managed one, each as `[dns_zone]` is
    /// written (origin, SOA and NS in the table or the master file, `master_file` or
    /// `records`), answered, transferred and notified on their own.
    #[serde(default)]
    pub zones: Vec<DnsZoneConfig>,
    /// On etcd, at start: when the store answers within this long, the state saved on disk is
    /// brought up to the store's before DNS answers, so a restart never first answers with an
    /// older state; otherwise the saved state is served at once and followed up after.
    #[serde(default = "default_catch_up_at_start_ms")]
    pub catch_up_at_start_ms: u64,
    /// `[[keyring.key]]`: the keys trusted to author plans. When set, the store refuses a
    /// plan no key of it signed, and the follower serves an active record only when it is
    /// what a trusted plan of its generation says (`serving::trusted`).
    #[serde(default)]
    pub keyring: KeyringConfig,
    /// `[added_zones]`: how the zones added to the store at run time (`dnsplan zone add
    /// --managed`) are served.
    #[serde(default)]
    pub added_zones: AddedZonesConfig,
    /// `--accept-store-loss`, not a config key: open an embedded store that went back behind
    /// its high-water mark, moving the SOA serial past what was served (`high_water`).
    #[serde(skip)]
    pub accept_store_loss: bool,
    /// The file this config was loaded from, read again for credentials on SIGHUP or when it
    /// changes (`None`: built in code, as `dnsplan up` does; nothing is reloaded).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// `[added_zones]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddedZonesConfig {
    /// `[added_zones.dnssec]`: every zone added to the store is signed, each with a key
    /// directory of its own under `key_root`.
    pub dnssec: Option<AddedZonesDnssec>,
}

/// How the zones added at run time are signed: as a `[dns_zone.dnssec]` with `key_dir`, the
/// directory of zone `Z` being `key_root/Z` (its origin with the final dot, lower case).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddedZonesDnssec {
    /// The directory of the zones' key directories, relative to the config file.
    pub key_root: PathBuf,
    /// A zone added with no key directory gets one, made as `dnsplan zone key init` makes it
    /// (a KSK and a ZSK, the default policy). `false` on authorities that serve copies of
    /// another's directories: a zone whose directory is not there yet is not served (its
    /// status says why) until it is.
    #[serde(default = "default_true")]
    pub create_keys: bool,
    /// The algorithm of the keys made: `ecdsap256sha256` (13) or `ed25519` (15).
    #[serde(default = "default_added_algorithm")]
    pub algorithm: String,
    /// As `[dns_zone.dnssec]`'s.
    #[serde(default = "default_true")]
    pub rolls_keys: bool,
    #[serde(default = "default_added_key_check")]
    pub key_check_secs: u32,
    #[serde(default = "default_added_validity")]
    pub signature_validity_days: u32,
    #[serde(default = "default_added_refresh")]
    pub signature_refresh_days: u32,
    /// Each zone's key directory shared through the zone's store, its private keys sealed
    /// with this key-encryption key (as `dns_zone.dnssec.kek_file`; relative to the config
    /// file): the authority that adds a zone first makes its keys and writes them to the
    /// store, the others take them from there. No copying of directories.
    pub kek_file: Option<PathBuf>,
    /// `kek_file` read (at start).
    #[serde(skip)]
    pub kek: Option<Arc<dnsplan_common::dnssec_share::Kek>>,
}

fn default_true() -> bool {
    true
}
fn default_added_algorithm() -> String {
    "ecdsap256sha256".into()
}
fn default_added_key_check() -> u32 {
    30
}
fn default_added_validity() -> u32 {
    14
}
fn default_added_refresh() -> u32 {
    7
}

impl AddedZonesDnssec {
    /// The `[dns_zone.dnssec]` of added zone `origin`: its key directory under `key_root`.
    pub fn zone_config(&self, origin: &str) -> crate::zone::dns_zone::DnssecConfig {
        let mut config = crate::zone::dns_zone::DnssecConfig::with_key_file("");
        config.key_file = None;
        config.key_dir = Some(self.key_root.join(origin.to_ascii_lowercase()));
        config.rolls_keys = self.rolls_keys;
        config.key_check_secs = self.key_check_secs;
        config.signature_validity_days = self.signature_validity_days;
        config.signature_refresh_days = self.signature_refresh_days;
        config
    }

    /// The algorithm of the keys made.
    pub fn algorithm(&self) -> Result<dnsplan_common::dnssec::ZoneAlgorithm, String> {
        dnsplan_common::dnssec::ZoneAlgorithm::parse(&self.algorithm).map_err(|e| format!("added_zones.dnssec.algorithm: {e}"))
    }

    /// Signs zone `zone`, added at run time, with its key directory under `key_root`, made
    /// first when there is none and this authority makes them (`create_keys`). `key_root` is
    /// absolute (`run`). Blocking: file I/O.
    pub fn sign(&self, zone: &mut crate::zone::dns_zone::StaticZone) -> anyhow::Result<()> {
        let origin = zone.origin.to_ascii();
        let config = self.zone_config(&origin);
        let dir = config.key_dir.clone().unwrap_or_default();
        if !dir.join(dnsplan_common::dnssec_keys::KEYS_FILE).exists() {
            anyhow::ensure!(
                self.create_keys,
                "zone {origin} is not served until its key directory {} is there: this authority makes none \
                 (added_zones.dnssec.create_keys = false); copy it from the authority that makes them",
                dir.display()
            );
            self.make_keys(&origin, &dir)?;
        }
        zone.sign_with(&config, Path::new("")).map_err(|e| anyhow::anyhow!("zone {origin}: {e}"))
    }

    /// Makes zone `origin`'s key directory `dir` under `key_root` (0700, both).
    pub fn make_keys(&self, origin: &str, dir: &Path) -> anyhow::Result<()> {
        use anyhow::Context;
        use std::os::unix::fs::DirBuilderExt;
        let algorithm = self.algorithm().map_err(anyhow::Error::msg)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.key_root)
            .with_context(|| format!("cannot make the key root {}", self.key_root.display()))?;
        let now = dnsplan_common::dnssec_keys::At(u64::from(crate::zone::signed::unix_now()));
        dnsplan_common::dnssec_keys::KeyDir::init(dir, origin, algorithm, None, Default::default(), now)
            .with_context(|| format!("cannot make zone {origin}'s key directory {}", dir.display()))?;
        tracing::info!(zone = %origin, dir = %dir.display(), "made the added zone's key directory (a KSK and a ZSK); give its parent the DS that `dnsplan zone ds --key-dir` prints");
        Ok(())
    }
}

/// Half a second: a healthy etcd answers and the saved state catches up in milliseconds; a
/// start waits no longer than this for an etcd that is away.
fn default_catch_up_at_start_ms() -> u64 {
    500
}

/// Most `catch_up_at_start_ms`: DNS must answer soon after a start, etcd or not.
pub const CATCH_UP_AT_START_MS_MAX: u64 = 10_000;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsConfig {
    /// Addresses to serve DNS on, UDP and TCP each.
    #[serde(default = "default_dns_listen")]
    pub listen: Vec<SocketAddr>,
    /// On etcd: where clients reach this authority's DNS, when not where it listens (a
    /// container listening on 0.0.0.0:53 behind another address). Reported in the store so
    /// that `dnsplan verify` asks every authority.
    #[serde(default)]
    pub advertise: Vec<SocketAddr>,
    #[serde(default = "default_payload")]
    pub edns_udp_payload_bytes: u16,
    #[serde(default = "default_answer_max")]
    pub answer_addresses_max: usize,
    #[serde(default = "default_tcp_idle")]
    pub tcp_idle_timeout_secs: u64,
    #[serde(default = "default_tcp_max")]
    pub tcp_connections_max: usize,
    /// Response-rate limiting of UDP answers (`[dns.rrl]`).
    #[serde(default)]
    pub rrl: RrlConfig,
    /// Zone transfers to secondaries (`[dns.transfer]`); by default nobody may transfer.
    #[serde(default)]
    pub transfer: TransferConfig,
    /// Interfaces whose UDP queries to the DNS port are answered over AF_XDP (Linux), beside
    /// the sockets, which serve everything else. An interface that cannot be used is said in
    /// one line and served by the sockets.
    #[serde(default)]
    pub xdp: Vec<String>,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            listen: default_dns_listen(),
            advertise: Vec::new(),
            edns_udp_payload_bytes: default_payload(),
            answer_addresses_max: default_answer_max(),
            tcp_idle_timeout_secs: default_tcp_idle(),
            tcp_connections_max: default_tcp_max(),
            rrl: RrlConfig::default(),
            transfer: TransferConfig::default(),
            xdp: Vec::new(),
        }
    }
}

/// `[dns.rrl]`: response-rate limiting of UDP answers (see `rrl`). On by default: without it
/// every answer goes to whatever source address a query claims, which makes the server a
/// reflector (a flood of A queries came back 3.8 times as large).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RrlConfig {
    #[serde(default = "default_rrl_enabled")]
    pub enabled: bool,
    /// Answers of one class (see `rrl::AnswerClass`) a client prefix gets per second.
    #[serde(default = "default_rrl_rate")]
    pub responses_per_sec: u32,
    /// Answers a prefix may get at once before the rate applies; `responses_per_sec` if unset.
    #[serde(default)]
    pub burst_responses: Option<u32>,
    /// Every `slip`-th limited answer is sent truncated (TC=1) instead of dropped, so real
    /// clients ask again over TCP; 0 drops every one, 1 truncates every one.
    #[serde(default = "default_rrl_slip")]
    pub slip: u32,
    #[serde(default = "default_rrl_ipv4_prefix")]
    pub ipv4_prefix_len: u8,
    #[serde(default = "default_rrl_ipv6_prefix")]
    pub ipv6_prefix_len: u8,
    /// Buckets in the limiter's table, 16 bytes each, allocated at start.
    #[serde(default = "default_rrl_table_size")]
    pub table_size: usize,
    /// Clients never limited. Replaces the default (loopback) when given.
    #[serde(default = "default_rrl_exempt")]
    pub exempt: Vec<IpPrefix>,
}

impl Default for RrlConfig {
    fn default() -> Self {
        RrlConfig {
            enabled: default_rrl_enabled(),
            responses_per_sec: default_rrl_rate(),
            burst_responses: None,
            slip: default_rrl_slip(),
            ipv4_prefix_len: default_rrl_ipv4_prefix(),
            ipv6_prefix_len: default_rrl_ipv6_prefix(),
            table_size: default_rrl_table_size(),
            exempt: default_rrl_exempt(),
        }
    }
}

fn default_rrl_enabled() -> bool {
    true
}
/// NSD's default. A resolver caches an answer for its TTL, so even a farm of resolvers behind
/// one /24 asks for one answer a few times a second; and a limited real client still gets
/// every `slip`-th answer truncated and its answer over TCP.
fn default_rrl_rate() -> u32 {
    200
}
/// Every other limited answer truncated, as NSD and BIND do: a real client's retry gets
/// through soon, and a reflected flood is cut to half the queries' size.
fn default_rrl_slip() -> u32 {
    2
}
/// The usual allocation to one site (BIND's and NSD's defaults; BIND's for IPv6 too).
fn default_rrl_ipv4_prefix() -> u8 {
    24
}
fn default_rrl_ipv6_prefix() -> u8 {
    56
}
/// 262,144 buckets (4 MiB): tens of thousands of limited keys at once before collisions
/// (which only limit more) become common.
fn default_rrl_table_size() -> usize {
    1 << 18
}
/// Loopback: no packet from outside can carry a loopback source (the kernel drops them), so
/// local probes and benchmarks are never limited and nothing is given away.
fn default_rrl_exempt() -> Vec<IpPrefix> {
    ["127.0.0.0/8", "::1/128"].iter().filter_map(|p| p.parse().ok()).collect()
}

impl RrlConfig {
    /// The limiter's settings, or `None` when it is off. Ranges are checked by `check`.
    pub fn settings(&self) -> Option<RrlSettings> {
        self.enabled.then(|| RrlSettings {
            responses_per_sec: self.responses_per_sec,
            burst_responses: self.burst_responses.unwrap_or(self.responses_per_sec),
            slip: self.slip,
            ipv4_prefix_len: self.ipv4_prefix_len,
            ipv6_prefix_len: self.ipv6_prefix_len,
            table_size: self.table_size,
            exempt: self.exempt.clone(),
        })
    }

    /// Every value in range, with a message naming the key (below `dns.rrl`).
    pub fn check(&self) -> Result<(), String> {
        let rates = 1..=rrl::RESPONSES_PER_SEC_MAX;
        if !rates.contains(&self.responses_per_sec) {
            return Err(format!("dns.rrl.responses_per_sec: {} is outside 1..={}", self.responses_per_sec, rates.end()));
        }
        if let Some(burst) = self.burst_responses.filter(|b| !rates.contains(b)) {
            return Err(format!("dns.rrl.burst_responses: {burst} is outside 1..={}", rates.end()));
        }
        if self.slip > rrl::SLIP_MAX {
            return Err(format!("dns.rrl.slip: {} is above {} (0 drops every limited answer)", self.slip, rrl::SLIP_MAX));
        }
        if !(1..=32).contains(&self.ipv4_prefix_len) {
            return Err(format!("dns.rrl.ipv4_prefix_len: {} is outside 1..=32", self.ipv4_prefix_len));
        }
        if !(1..=128).contains(&self.ipv6_prefix_len) {
            return Err(format!("dns.rrl.ipv6_prefix_len: {} is outside 1..=128", self.ipv6_prefix_len));
        }
        if !(rrl::TABLE_SIZE_MIN..=rrl::TABLE_SIZE_MAX).contains(&self.table_size) {
            return Err(format!("dns.rrl.table_size: {} is outside {}..={}", self.table_size, rrl::TABLE_SIZE_MIN, rrl::TABLE_SIZE_MAX));
        }
        if self.exempt.len() > rrl::EXEMPT_PREFIXES_MAX {
            return Err(format!(
                "dns.rrl.exempt: {} prefixes; at most {} (each packet is compared with every one)",
                self.exempt.len(),
                rrl::EXEMPT_PREFIXES_MAX
            ));
        }
        Ok(())
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

/// `[control.tls]`: PEM files, relative to the config file; read again on SIGHUP and when
/// they change, as the credentials are.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlTlsConfig {
    /// The server's certificate chain, leaf first.
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The CA whose client certificates are taken as credentials (`client_cert` in a
    /// `[[control.credential]]`); clients with tokens need none.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

impl ControlTlsConfig {
    /// The files, each with its key, for reading and for watching.
    pub fn files(&self) -> Vec<(&'static str, &Path)> {
        let mut files = vec![("control.tls.cert_file", self.cert_file.as_path()), ("control.tls.key_file", self.key_file.as_path())];
        if let Some(ca) = &self.client_ca_file {
            files.push(("control.tls.client_ca_file", ca.as_path()));
        }
        files
    }

    /// The rustls server config the files make; errors name the key and the file.
    pub fn server_config(&self) -> Result<dnsplan_common::tls::ServerConfig, String> {
        let read = |key: &str, path: &Path| dnsplan_common::store_config::read_pem(key, path);
        let cert = read("control.tls.cert_file", &self.cert_file)?;
        let key = read("control.tls.key_file", &self.key_file)?;
        let ca = self.client_ca_file.as_deref().map(|ca| read("control.tls.client_ca_file", ca)).transpose()?;
        dnsplan_common::tls::server_config(&dnsplan_common::tls::ServerTlsPem { cert: &cert, key: &key, client_ca: ca.as_deref() })
            .map_err(|e| format!("control.tls.{e}"))
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    #[serde(default = "default_control_listen")]
    pub listen: SocketAddr,
    /// A bearer token with every role (`access`). Prefer the `DNSPLAN_TOKEN` environment
    /// variable. Optional once `[[control.credential]]` tables are set.
    pub token: Option<String>,
    /// `[[control.credential]]`: named tokens with roles, each by its SHA-256; once one is set,
    /// reads need a credential too.
    #[serde(default, rename = "credential")]
    pub credentials: Vec<CredentialConfig>,
    /// How often the config file (and the TLS files) are checked for changes; credentials and
    /// TLS are also read again on SIGHUP; 0: on SIGHUP only.
    #[serde(default = "default_control_reload_check")]
    pub reload_check_secs: u64,
    /// `[control.tls]`: the control API over HTTPS. Required when `listen` is not loopback,
    /// unless `insecure_plaintext`.
    #[serde(default)]
    pub tls: Option<ControlTlsConfig>,
    /// Plain HTTP on an address that is not loopback: only behind something that encrypts
    /// (a service mesh, a proxy) or on a network of one host (compose's bridge).
    #[serde(default)]
    pub insecure_plaintext: bool,
    /// Most control API connections open at once; more wait to be accepted. Lowered at start
    /// to fit the open-file limit (see `budget`).
    #[serde(default = "default_control_connections_max")]
    pub connections_max: usize,
    /// A connection must send a whole request head within this long of opening or of its
    /// last answer, or it is closed: half-sent requests and idle keep-alives.
    #[serde(default = "default_control_header_timeout")]
    pub header_timeout_secs: u64,
    /// A request body that sends nothing for this long fails.
    #[serde(default = "default_control_body_timeout")]
    pub body_timeout_secs: u64,
    /// A request that takes longer, body and answer included, gets 503. Above the longest
    /// long-poll (`GET /v1/wait`, `WAIT_TIMEOUT_MAX`), or every long-poll would be cut.
    #[serde(default = "default_control_request_timeout")]
    pub request_timeout_secs: u64,
    /// Most full-state reads served at once (`GET /v1/active` without a limit,
    /// `/v1/plans/{g}`, `/v1/plans/{g}/changes`, `/v1/changes`); more wait their turn.
    #[serde(default = "default_control_full_reads_max")]
    pub full_reads_max: usize,
    /// Most `/v1/status` summaries computed at once; more wait their turn, so that clients
    /// polling it as fast as they can take at most this many cores from writes and DNS.
    #[serde(default = "default_control_status_reads_max")]
    pub status_reads_max: usize,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            listen: default_control_listen(),
            token: None,
            credentials: Vec::new(),
            reload_check_secs: default_control_reload_check(),
            tls: None,
            insecure_plaintext: false,
            connections_max: default_control_connections_max(),
            header_timeout_secs: default_control_header_timeout(),
            body_timeout_secs: default_control_body_timeout(),
            request_timeout_secs: default_control_request_timeout(),
            full_reads_max: default_control_full_reads_max(),
            status_reads_max: default_control_status_reads_max(),
        }
    }
}

/// A revoked credential stops working within two seconds of the file's change; reading a
/// small file that often costs nothing.
fn default_control_reload_check() -> u64 {
    2
}
fn default_control_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8053))
}
/// Planners, enactors, operators and scrapers of one stack need tens; 512 leaves room for
/// bursts without letting connections eat the descriptors DNS needs.
fn default_control_connections_max() -> usize {
    512
}
/// Our clients send a request in one write; 10 s is generous for a slow network. `RemoteStore`
/// drops its idle connections sooner (`POOL_IDLE_TIMEOUT`), so it does not send a request on
/// a connection the server is closing.
fn default_control_header_timeout() -> u64 {
    10
}
/// As for headers: a client that pauses this long in the middle of a body is gone or hostile.
fn default_control_body_timeout() -> u64 {
    10
}
/// The longest long-poll, 55 s, plus 5 s to read the request and write the answer.
fn default_control_request_timeout() -> u64 {
    server::REQUEST_TIMEOUT_DEFAULT.as_secs()
}
/// A full read of a 100,000-endpoint zone is tens of MB and hundreds of ms; four at once
/// keep the memory bounded and leave the store to writers.
fn default_control_full_reads_max() -> usize {
    4
}
/// A summary takes about a millisecond: one at a time answers a thousand pollers a second
/// and leaves the other cores to writes (bench/status.sh).
fn default_control_status_reads_max() -> usize {
    1
}

impl AuthorityConfig {
    pub fn load(path: &Path) -> Result<AuthorityConfig, ConfigError> {
        let mut config: AuthorityConfig = daemon::load_toml(path)?;
        config.control.token = daemon::token_from_env_or(config.control.token.take());
        if let Some(store) = &mut config.store {
            store.resolve(path).map_err(|detail| ConfigError::invalid(path, detail))?;
        }
        config.check().map_err(|detail| ConfigError::invalid(path, detail))?;
        if config.control.token.as_deref().is_some_and(daemon::is_placeholder_token) {
            return Err(ConfigError::invalid(
                path,
                format!(
                    "control.token is the placeholder from the examples, which anyone can read; only `dnsplan up` accepts it, on \
                     loopback. Set control.token or {TOKEN_ENV} to a long random token (e.g. the output of `openssl rand -hex 24`)"
                ),
            ));
        }
        config.data_dir = daemon::relative_to_config(path, &config.data_dir);
        if let Some(dnssec) = &mut config.added_zones.dnssec {
            dnssec.key_root = daemon::relative_to_config(path, &dnssec.key_root);
            dnssec.kek_file = dnssec.kek_file.as_ref().map(|kek| daemon::relative_to_config(path, kek));
        }
        if let Some(tls) = &mut config.control.tls {
            tls.cert_file = daemon::relative_to_config(path, &tls.cert_file);
            tls.key_file = daemon::relative_to_config(path, &tls.key_file);
            tls.client_ca_file = tls.client_ca_file.as_ref().map(|ca| daemon::relative_to_config(path, ca));
        }
        config.source = Some(path.to_owned());
        Ok(config)
    }

    /// The keyring of `[[keyring.key]]`, `None` when it names no key (every plan trusted).
    pub fn keyring(&self) -> Result<Option<Arc<Keyring>>, String> {
        Ok(Keyring::from_config(&self.keyring)?.map(Arc::new))
    }

    /// Every value in range, with a message naming the key.
    pub fn check(&self) -> Result<(), String> {
        self.keyring.check()?;
        match &self.store {
            None | Some(StoreConfig::Etcd(_)) => {}
            Some(StoreConfig::Control(_)) => {
                return Err("store.kind: \"control\" is how planners and enactors reach an authority; an authority serves the \
                            embedded store in data_dir (leave [store] out) or follows etcd (kind = \"etcd\" with endpoints)"
                    .into());
            }
        }
        if self.catch_up_at_start_ms > CATCH_UP_AT_START_MS_MAX {
            return Err(format!(
                "catch_up_at_start_ms: {} is above {CATCH_UP_AT_START_MS_MAX}; DNS waits for it at every start",
                self.catch_up_at_start_ms
            ));
        }
        let dns = &self.dns;
        if dns.listen.is_empty() {
            return Err("dns.listen: give at least one address".into());
        }
        if let Some(bad) = dns.advertise.iter().find(|a| a.ip().is_unspecified() || a.port() == 0) {
            return Err(format!("dns.advertise: {bad} is not an address clients can reach; give the address and port they ask"));
        }
        if dns.advertise.len() > dnsplan_common::store::AUTHORITY_ADDRESSES_MAX {
            return Err(format!(
                "dns.advertise: {} addresses; the limit is {}",
                dns.advertise.len(),
                dnsplan_common::store::AUTHORITY_ADDRESSES_MAX
            ));
        }
        if let Some(dnssec) = &self.dns_zone.dnssec
            && dnssec.kek_file.is_some()
            && dnssec.key_dir.is_none()
        {
            return Err("dns_zone.dnssec.kek_file: shares a key directory through the store; give key_dir too".into());
        }
        if let Some(zone) = self.zones.iter().find(|z| z.dnssec.as_ref().is_some_and(|d| d.kek_file.is_some())) {
            return Err(format!(
                "[[zones]] {}: kek_file shares keys through the store, and a zone of the config file is not in the store; \
                 copy its key directory to each authority instead",
                zone.origin
            ));
        }
        if let Some(dnssec) = &self.added_zones.dnssec {
            dnssec.algorithm()?;
            if !(1..=3_600).contains(&dnssec.key_check_secs) {
                return Err(format!("added_zones.dnssec.key_check_secs: {} is outside 1..=3600", dnssec.key_check_secs));
            }
            if !(1..=365).contains(&dnssec.signature_validity_days)
                || dnssec.signature_refresh_days == 0
                || dnssec.signature_refresh_days >= dnssec.signature_validity_days
            {
                return Err(format!(
                    "added_zones.dnssec: signature_validity_days ({}) must be 1..=365 and signature_refresh_days ({}) above 0 and below it",
                    dnssec.signature_validity_days, dnssec.signature_refresh_days
                ));
            }
        }
        dns.rrl.check()?;
        dns.transfer.check()?;
        if !dns.xdp.is_empty() {
            let mut ports: Vec<u16> = dns.listen.iter().map(SocketAddr::port).collect();
            ports.sort_unstable();
            ports.dedup();
            if ports.len() > 1 {
                return Err(format!("dns.xdp: dns.listen has ports {ports:?}; XDP serves one port, so listen on one"));
            }
            if let Some(bad) = dns.xdp.iter().find(|name| name.is_empty() || name.len() >= 16 || name.contains(['/', '\0', ' '])) {
                return Err(format!("dns.xdp: {bad:?} is not an interface name"));
            }
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
        let control = &self.control;
        if control.connections_max == 0 || control.full_reads_max == 0 || control.status_reads_max == 0 {
            return Err("control.connections_max, control.full_reads_max and control.status_reads_max must be above 0".into());
        }
        if control.header_timeout_secs == 0 || control.body_timeout_secs == 0 {
            return Err("control.header_timeout_secs and control.body_timeout_secs must be above 0".into());
        }
        let long_poll_secs = WAIT_TIMEOUT_MAX.as_secs();
        if control.request_timeout_secs <= long_poll_secs {
            return Err(format!(
                "control.request_timeout_secs: {} s is not above the longest long-poll, {long_poll_secs} s (GET /v1/wait, which \
                 followers and enactors hold open that long), so every long-poll would be cut; give more than {long_poll_secs} \
                 (the default is {})",
                control.request_timeout_secs,
                default_control_request_timeout()
            ));
        }
        let max_secs = server::REQUEST_TIMEOUT_MAX.as_secs();
        if control.request_timeout_secs > max_secs {
            return Err(format!(
                "control.request_timeout_secs: {} s is above {max_secs} s; a request held that long is stuck, and shutdown \
                 waits this long for requests in flight",
                control.request_timeout_secs
            ));
        }
        if !control.listen.ip().is_loopback() && control.tls.is_none() && !control.insecure_plaintext {
            return Err(format!(
                "control.listen: {} is not a loopback address, and without TLS tokens and plans would cross the network in \
                 the clear. Set [control.tls] (cert_file, key_file), or listen on 127.0.0.1; behind a proxy or mesh that \
                 encrypts, or on one host's private network, set control.insecure_plaintext = true",
                control.listen
            ));
        }
        let credentials = self.credentials()?;
        if credentials.wants_client_certificates() && control.tls.as_ref().is_none_or(|t| t.client_ca_file.is_none()) {
            return Err("control.credential: a credential names a client_cert, which needs control.tls.client_ca_file (the CA \
                        that signs the clients' certificates)"
                .into());
        }
        Ok(())
    }

    /// The control API's credentials: `control.token`'s and the `[[control.credential]]`
    /// tables'. A placeholder token is refused in a table; `load` refuses it as
    /// `control.token` (`dnsplan up` builds its config in code, with the demo token).
    pub fn credentials(&self) -> Result<Credentials, String> {
        Credentials::new(self.control.token.as_deref(), &self.control.credentials, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "data_dir = \"d\"\n[control]\ntoken = \"0123456789abcdef0\"\n[dns_zone]\norigin = \"example.test.\"\n";

    fn load(extra: &str) -> Result<AuthorityConfig, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("authority.toml");
        std::fs::write(&path, format!("{BASE}{extra}")).map_err(|e| e.to_string())?;
        AuthorityConfig::load(&path).map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn rrl_is_on_by_default_with_loopback_exempt() {
        let config = load("").expect("loads");
        let settings = config.dns.rrl.settings().expect("on by default");
        assert_eq!((settings.responses_per_sec, settings.burst_responses, settings.slip), (200, 200, 2));
        assert_eq!((settings.ipv4_prefix_len, settings.ipv6_prefix_len, settings.table_size), (24, 56, 1 << 18));
        let exempt: Vec<String> = settings.exempt.iter().map(|p| p.to_string()).collect();
        assert_eq!(exempt, ["127.0.0.0/8", "::1/128"]);
        assert!(load("[dns.rrl]\nenabled = false\n").expect("loads").dns.rrl.settings().is_none());
        let set = load("[dns.rrl]\nresponses_per_sec = 5\nburst_responses = 20\nexempt = [\"192.0.2.0/24\"]\n").expect("loads");
        let settings = set.dns.rrl.settings().expect("on");
        assert_eq!((settings.responses_per_sec, settings.burst_responses, settings.exempt.len()), (5, 20, 1));
    }

    /// Loads `BASE` with `line` in its `[control]` table.
    fn load_control(line: &str) -> Result<AuthorityConfig, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("authority.toml");
        std::fs::write(&path, BASE.replace("[control]\n", &format!("[control]\n{line}\n"))).map_err(|e| e.to_string())?;
        AuthorityConfig::load(&path).map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn the_request_timeout_is_60_s_by_default_and_must_be_above_the_long_poll() {
        assert_eq!(load("").expect("loads").control.request_timeout_secs, 60);
        assert_eq!(load_control("request_timeout_secs = 56").expect("loads").control.request_timeout_secs, 56);
        for value in [55, 30, 0] {
            let err = load_control(&format!("request_timeout_secs = {value}")).expect_err("at or below the long-poll");
            for want in ["control.request_timeout_secs", &format!("{value} s"), "long-poll, 55 s"] {
                assert!(err.contains(want), "{value}: want {want:?} in {err}");
            }
        }
        let err = load_control("request_timeout_secs = 3601").expect_err("above the maximum");
        assert!(err.contains("control.request_timeout_secs") && err.contains("3600"), "{err}");
    }

    #[test]
    fn transfer_is_closed_by_default_and_its_errors_name_their_key() {
        let config = load("").expect("loads");
        assert!(config.dns.transfer.secondaries.is_empty() && config.dns.transfer.tsig_required);
        let key = "[[dns.transfer.keys]]\nname = \"xfr\"\nsecret = \"c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTEyMzQ=\"\n";
        let ok = load(&format!("{key}[[dns.transfer.secondaries]]\naddress = \"192.0.2.0/24\"\nkey = \"XFR.\"\n")).expect("loads");
        assert_eq!(ok.dns.transfer.secondaries.len(), 1);
        for (extra, want) in [
            ("[[dns.transfer.secondaries]]\naddress = \"192.0.2.1\"\n".to_string(), "no key, and dns.transfer.tsig_required"),
            (format!("{key}[[dns.transfer.secondaries]]\naddress = \"192.0.2.1\"\nkey = \"other\"\n"), "\"other\" is not one of"),
            ("[[dns.transfer.secondaries]]\naddress = \"nowhere\"\nkey = \"x\"\n".to_string(), "not an address"),
            ("[dns.transfer]\ntransfers_max = 0\n".to_string(), "dns.transfer.transfers_max"),
            (
                format!("{key}[[dns.transfer.secondaries]]\naddress = \"127.0.0.1\"\nkey = \"xfr\"\nnotify = \"192.0.2.9:53\"\n"),
                "notify 192.0.2.9:53 is outside its address",
            ),
        ] {
            let err = load(&extra).expect_err(&extra);
            assert!(err.contains(want), "{extra:?}: want {want:?} in {err}");
            assert!(!err.contains("c2VjcmV0"), "{err} shows a secret");
        }
        let open = load("[dns.transfer]\ntsig_required = false\n[[dns.transfer.secondaries]]\naddress = \"192.0.2.1\"\n");
        assert!(open.is_ok(), "{open:?}");
    }

    /// The example's commented `[dns.transfer]` section, uncommented, loads and allows what it
    /// says; its errors never show the secret.
    #[test]
    fn the_examples_transfer_section_loads_uncommented() {
        let example = include_str!("../../examples/authority.toml");
        let mut text = String::new();
        let mut inside = false;
        for line in example.lines() {
            inside |= line.starts_with("# [dns.transfer]");
            match line.strip_prefix("# ") {
                Some(rest) if inside && (rest.starts_with('[') || rest.contains(" = ")) => text.push_str(rest),
                _ => text.push_str(line),
            }
            text.push('\n');
            inside &= !line.trim().is_empty() || text.ends_with("#\n");
        }
        let text = text.replace("change-me-to-a-long-random-token", "0123456789abcdef0123");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("dnsplan-xfr.key"), "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTEyMzQ=\n").expect("write");
        let path = dir.path().join("authority.toml");
        std::fs::write(&path, &text).expect("write");
        let config = AuthorityConfig::load(&path).expect("the uncommented example loads");
        let transfer = &config.dns.transfer;
        assert_eq!((transfer.keys.len(), transfer.secondaries.len(), transfer.transfers_max), (1, 1, 2), "{text}");
        let policy = crate::serving::policy::TransferPolicy::from_config(transfer, dir.path()).expect("the key file is read");
        assert_eq!(policy.notify_targets().len(), 1);
        std::fs::write(dir.path().join("dnsplan-xfr.key"), "short").expect("write");
        let err =
            crate::serving::policy::TransferPolicy::from_config(transfer, dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("dnsplan-xfr.key") && !err.contains("short"), "{err}");
    }

    #[test]
    fn the_store_is_embedded_by_default_and_etcd_takes_the_planners_table() {
        assert!(load("").expect("loads").store.is_none());
        let etcd = load("[store]\nkind = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\"]\n").expect("loads");
        match etcd.store {
            Some(StoreConfig::Etcd(e)) => assert_eq!((e.endpoints.len(), e.prefix.as_str()), (1, "/dnsplan/")),
            other => panic!("want etcd, got {other:?}"),
        }
        for (extra, want) in [
            ("[store]\nkind = \"control\"\nurl = \"http://127.0.0.1:8053\"\n", "store.kind: \"control\""),
            ("[store]\nkind = \"etcd\"\n", "store.endpoints: missing"),
            ("[store]\nkind = \"etcd\"\nendpoints = [\"127.0.0.1:2379\"]\n", "store.endpoints"),
            ("[store]\nkind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nurl = \"http://x\"\n", "store.url: only for kind"),
            ("[store]\nkind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nusername = \"u\"\n", "has no password"),
            ("[store]\nkind = \"zookeeper\"\n", "store.kind"),
        ] {
            let err = load(extra).expect_err(extra);
            assert!(err.contains(want), "{extra:?}: want {want:?} in {err}");
        }
    }

    /// The example's commented `[store]` block, uncommented (without the credentials), loads as
    /// etcd.
    #[test]
    fn the_examples_store_block_loads_uncommented() {
        let example = include_str!("../../examples/authority.toml");
        let mut text = String::new();
        let mut inside = false;
        for line in example.lines() {
            inside |= line == "# [store]";
            match line.strip_prefix("# ") {
                Some(rest) if inside && !rest.starts_with("username") && !rest.starts_with("password") => text.push_str(rest),
                _ => text.push_str(line),
            }
            text.push('\n');
            inside &= !line.trim().is_empty();
        }
        assert!(text.contains("\n[store]\nkind = \"etcd\"\n"), "{text}");
        let text = text.replace("change-me-to-a-long-random-token", "0123456789abcdef0123");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("authority.toml");
        std::fs::write(&path, &text).expect("write");
        let config = AuthorityConfig::load(&path).expect("the uncommented example loads");
        assert!(matches!(config.store, Some(StoreConfig::Etcd(_))), "{:?}", config.store);
    }

    #[test]
    fn rrl_values_out_of_range_name_their_key() {
        for (extra, want) in [
            ("[dns.rrl]\nresponses_per_sec = 0\n", "dns.rrl.responses_per_sec"),
            ("[dns.rrl]\nburst_responses = 2000000\n", "dns.rrl.burst_responses"),
            ("[dns.rrl]\nslip = 101\n", "dns.rrl.slip"),
            ("[dns.rrl]\nipv4_prefix_len = 33\n", "dns.rrl.ipv4_prefix_len"),
            ("[dns.rrl]\nipv6_prefix_len = 0\n", "dns.rrl.ipv6_prefix_len"),
            ("[dns.rrl]\ntable_size = 10\n", "dns.rrl.table_size"),
            ("[dns.rrl]\nexempt = [\"10.0.0.1/8\"]\n", "beyond /8"),
            ("[dns.rrl]\nexempt = [\"example.test\"]\n", "not an address"),
            ("[dns.rrl]\nrate_limit = 5\n", "rate_limit"),
        ] {
            let err = load(extra).expect_err(extra);
            assert!(err.contains(want), "{extra:?}: want {want:?} in {err}");
        }
    }
}
