//! The `[store]` table of `planner.toml` and `enactor.toml`: which store a daemon writes to,
//! an authority's control API (`kind = "control"`, the default) or etcd directly
//! (`kind = "etcd"`), and with which credentials.
//!
//! This module holds the TOML shape, its checks (errors name the key; parse errors from TOML
//! also carry the line) and where secrets come from; it does not connect to anything. The
//! daemons build the store from it themselves: `RemoteStore` from common, `EtcdStore` from
//! `dnsplan-etcd`, which sits above this crate, so common never depends on etcd's client.
//!
//! Secrets (the control token, the etcd password) are never logged and never shown in an
//! error: they are held in [`Secret`], whose `Debug` prints nothing of them, and errors about a
//! password file name the file, not its content.

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The key prefix of the store on etcd when `prefix` is not given: every dnsplan daemon of one
/// deployment must use the same one, so the default is the one the examples and docs use.
pub const ETCD_PREFIX_DEFAULT: &str = "/dnsplan/";
/// Environment variable that supplies (and overrides) the etcd password, so it need not be in
/// a file on disk.
pub const ETCD_PASSWORD_ENV: &str = "DNSPLAN_ETCD_PASSWORD";
/// Most etcd endpoints a daemon accepts. Clusters have 3, 5 or 7 members; the bound only
/// catches a list generated wrongly.
pub const ETCD_ENDPOINTS_MAX: usize = 16;
/// Largest password file read, in bytes. etcd passwords are short; a larger file is the wrong
/// file, and is not read into memory.
pub const PASSWORD_FILE_BYTES_MAX: u64 = 4_096;
/// Largest certificate or key file read for TLS to etcd: a chain of a few certificates is a
/// few KiB; more is the wrong file.
pub const TLS_FILE_BYTES_MAX: u64 = 1 << 20;

/// A credential. Its `Debug` hides it, and it has no `Display`, so a log line or an error
/// cannot show it by accident.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself, for the one call that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(hidden)")
    }
}

/// Where a daemon's store is.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "RawStore")]
pub enum StoreConfig {
    /// Through an authority's control API (`RemoteStore`).
    Control(ControlStore),
    /// On etcd v3 directly (`EtcdStore`), with no authority in the write path.
    Etcd(EtcdStoreConfig),
}

/// `kind = "control"`: the control API of the authority that holds the store.
#[derive(Clone, Debug, Default)]
pub struct ControlStore {
    /// For example `http://127.0.0.1:8053`, or `https://` with `ca_file`.
    pub url: String,
    /// Bearer token for writes. Prefer the `DNSPLAN_TOKEN` environment variable.
    pub token: Option<String>,
    /// For an `https://` URL: the CA that signed the authority's certificate (PEM, relative to
    /// the config file).
    pub ca_file: Option<PathBuf>,
    /// This client's certificate and key (PEM), when the authority takes client certificates.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The files' contents, read by [`StoreConfig::resolve`]; `None` without TLS.
    pub tls: Option<Box<TlsPem>>,
}

#[cfg(feature = "remote")]
impl ControlStore {
    /// The client of this control API, over TLS for an `https://` URL.
    pub fn connect(&self) -> crate::store::StoreResult<crate::store::remote::RemoteStore> {
        crate::store::remote::RemoteStore::with_tls(&self.url, self.token.clone(), self.client_tls().as_ref())
    }

    /// The TLS files' contents as the client takes them.
    pub fn client_tls(&self) -> Option<crate::store::remote::ClientTls<'_>> {
        self.tls.as_ref().map(|t| crate::store::remote::ClientTls {
            ca: &t.ca,
            identity: t.identity.as_ref().map(|(cert, key)| (cert.as_slice(), key.as_slice())),
        })
    }
}

/// `kind = "etcd"`: the cluster and the key prefix.
#[derive(Clone, Debug)]
pub struct EtcdStoreConfig {
    /// Client URLs of the cluster's members (`http://host:2379`).
    pub endpoints: Vec<String>,
    /// Every key of the store starts with it ([`ETCD_PREFIX_DEFAULT`] unless given).
    pub prefix: String,
    /// The etcd user, when the cluster has authentication on.
    pub username: Option<String>,
    /// The password: `password` in the file, or `password_file`, or [`ETCD_PASSWORD_ENV`]
    /// (which wins). Set by [`StoreConfig::resolve`].
    pub password: Option<Secret>,
    /// A file holding the password (relative to the config file), read by `resolve`.
    pub password_file: Option<PathBuf>,
    /// For `https://` endpoints: the CA that signed the members' certificates (PEM, relative
    /// to the config file).
    pub ca_file: Option<PathBuf>,
    /// This client's certificate and key (PEM), when the members check clients
    /// (`--client-cert-auth`).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The files' contents, read by [`StoreConfig::resolve`]; `None` without TLS.
    pub tls: Option<Box<TlsPem>>,
}

/// TLS to etcd or the control API as read from `ca_file`, `cert_file` and `key_file`.
#[derive(Clone)]
pub struct TlsPem {
    pub ca: Vec<u8>,
    /// The certificate and the key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPem").field("ca_bytes", &self.ca.len()).field("identity", &self.identity.as_ref().map(|_| "hidden")).finish()
    }
}

impl EtcdStoreConfig {
    /// User and password for the client, once resolved; `None` without authentication.
    pub fn credentials(&self) -> Option<(String, Secret)> {
        Some((self.username.clone()?, self.password.clone()?))
    }
}

/// What the table may hold; checked and sorted into [`StoreConfig`] by `TryFrom`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    kind: Option<String>,
    url: Option<String>,
    token: Option<String>,
    endpoints: Option<Vec<String>>,
    prefix: Option<String>,
    username: Option<String>,
    password: Option<Secret>,
    password_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

impl TryFrom<RawStore> for StoreConfig {
    type Error = String;

    fn try_from(raw: RawStore) -> Result<StoreConfig, String> {
        let only = |key: &str, set: bool, kind: &str| {
            if set { Err(format!("store.{key}: only for kind = \"{kind}\"")) } else { Ok(()) }
        };
        match raw.kind.as_deref().unwrap_or("control") {
            "control" => {
                only("endpoints", raw.endpoints.is_some(), "etcd")?;
                only("prefix", raw.prefix.is_some(), "etcd")?;
                only("username", raw.username.is_some(), "etcd")?;
                only("password", raw.password.is_some(), "etcd")?;
                only("password_file", raw.password_file.is_some(), "etcd")?;
                let url = raw.url.ok_or("store.url: missing; give the authority's control API (http://host:port), or kind = \"etcd\"")?;
                let store = ControlStore {
                    url,
                    token: raw.token,
                    ca_file: raw.ca_file,
                    cert_file: raw.cert_file,
                    key_file: raw.key_file,
                    tls: None,
                };
                let config = StoreConfig::Control(store);
                config.check()?;
                Ok(config)
            }
            "etcd" => {
                only("url", raw.url.is_some(), "control")?;
                only("token", raw.token.is_some(), "control")?;
                if raw.password.is_some() && raw.password_file.is_some() {
                    return Err("store.password: give store.password or store.password_file, not both".into());
                }
                let endpoints = raw.endpoints.ok_or("store.endpoints: missing; give the client URLs of the etcd members")?;
                let etcd = EtcdStoreConfig {
                    endpoints,
                    prefix: raw.prefix.unwrap_or_else(|| ETCD_PREFIX_DEFAULT.into()),
                    username: raw.username,
                    password: raw.password,
                    password_file: raw.password_file,
                    ca_file: raw.ca_file,
                    cert_file: raw.cert_file,
                    key_file: raw.key_file,
                    tls: None,
                };
                let config = StoreConfig::Etcd(etcd);
                config.check()?;
                Ok(config)
            }
            other => Err(format!(
                "store.kind: {other:?} is not a store; use \"control\" (an authority's control API) or \"etcd\" (etcd v3 directly)"
            )),
        }
    }
}

impl StoreConfig {
    /// The control API at `url`, with `token` for writes.
    pub fn control(url: impl Into<String>, token: Option<String>) -> StoreConfig {
        StoreConfig::Control(ControlStore { url: url.into(), token, ..ControlStore::default() })
    }

    /// The control API's URL, for a store reached through it.
    pub fn control_url(&self) -> Option<&str> {
        match self {
            StoreConfig::Control(c) => Some(&c.url),
            StoreConfig::Etcd(_) => None,
        }
    }

    /// Every value usable, with a message naming the key; before or after `resolve`.
    pub fn check(&self) -> Result<(), String> {
        match self {
            StoreConfig::Control(c) => {
                if !(c.url.starts_with("http://") || c.url.starts_with("https://")) {
                    return Err(format!("store.url: {:?} must start with http:// or https://", c.url));
                }
                check_tls_files(
                    c.url.starts_with("https://"),
                    "an https:// url needs the CA that signed the authority's certificate",
                    [&c.ca_file, &c.cert_file, &c.key_file],
                )
            }
            StoreConfig::Etcd(e) => check_etcd(e),
        }
    }

    /// Takes the secrets from where they are: `DNSPLAN_TOKEN` for the control API; for etcd,
    /// `DNSPLAN_ETCD_PASSWORD`, else `password_file` (relative to `config_path`'s directory),
    /// else `password`. Errors name the key and the file, never the secret.
    pub fn resolve(&mut self, config_path: &Path) -> Result<(), String> {
        match self {
            StoreConfig::Control(c) => {
                c.token = crate::daemon::token_from_env_or(c.token.take());
                c.tls = read_tls_files(config_path, &c.ca_file, &c.cert_file, &c.key_file)?;
                Ok(())
            }
            StoreConfig::Etcd(e) => {
                let from_env = std::env::var(ETCD_PASSWORD_ENV).ok().filter(|p| !p.is_empty()).map(Secret);
                if let Some(password) = from_env {
                    e.password = Some(password);
                } else if let Some(file) = &e.password_file {
                    let path = crate::daemon::relative_to_config(config_path, file);
                    e.password = Some(read_password(&path)?);
                }
                e.tls = read_tls_files(config_path, &e.ca_file, &e.cert_file, &e.key_file)?;
                if e.username.is_some() && e.password.is_none() {
                    return Err(format!(
                        "store.username: {:?} has no password; set store.password_file or {ETCD_PASSWORD_ENV}",
                        e.username.as_deref().unwrap_or_default()
                    ));
                }
                Ok(())
            }
        }
    }

    /// Where the store is, for banners and logs (no secret).
    pub fn describe(&self) -> String {
        match self {
            StoreConfig::Control(c) => c.url.clone(),
            StoreConfig::Etcd(e) => format!("etcd {} under {}", e.endpoints.join(","), e.prefix),
        }
    }
}

fn check_etcd(e: &EtcdStoreConfig) -> Result<(), String> {
    if e.endpoints.is_empty() || e.endpoints.len() > ETCD_ENDPOINTS_MAX {
        return Err(format!(
            "store.endpoints: give 1..={ETCD_ENDPOINTS_MAX} client URLs of the etcd members (found {})",
            e.endpoints.len()
        ));
    }
    let tls = e.endpoints.first().is_some_and(|first| first.starts_with("https://"));
    let scheme = if tls { "https://" } else { "http://" };
    for endpoint in &e.endpoints {
        let Some(rest) = endpoint.strip_prefix(scheme) else {
            return Err(if endpoint.starts_with("https://") || endpoint.starts_with("http://") {
                format!("store.endpoints: {endpoint:?}: give every member with one scheme, all http:// or all https://")
            } else {
                format!("store.endpoints: {endpoint:?} must be a client URL, http://host:port or https://host:port")
            });
        };
        let port_ok = rest.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
        if !port_ok || rest.contains('/') {
            return Err(format!("store.endpoints: {endpoint:?} must be a client URL, {scheme}host:port"));
        }
    }
    check_tls_files(tls, "https:// endpoints need the CA that signed the members' certificates", [&e.ca_file, &e.cert_file, &e.key_file])?;
    if !e.prefix.starts_with('/') || !e.prefix.ends_with('/') || e.prefix.len() < 2 {
        return Err(format!(
            "store.prefix: {:?} must start and end with '/' and name something (the default is {ETCD_PREFIX_DEFAULT})",
            e.prefix
        ));
    }
    if e.username.as_deref().is_some_and(str::is_empty) {
        return Err("store.username: must not be empty; leave it out when the cluster has no authentication".into());
    }
    if e.username.is_none() && (e.password.is_some() || e.password_file.is_some()) {
        return Err("store.username: missing; a password needs the user it belongs to".into());
    }
    Ok(())
}

/// `ca_file`, `cert_file` and `key_file` (in that order) as `https` (whether the URLs are
/// `https://`) needs them; `why_ca` says why a missing CA is needed.
fn check_tls_files(https: bool, why_ca: &str, [ca, cert, key]: [&Option<PathBuf>; 3]) -> Result<(), String> {
    if https && ca.is_none() {
        return Err(format!("store.ca_file: missing; {why_ca}"));
    }
    if !https {
        for (name, set) in [("ca_file", ca.is_some()), ("cert_file", cert.is_some()), ("key_file", key.is_some())] {
            if set {
                return Err(format!("store.{name}: only for https:// endpoints"));
            }
        }
    }
    if cert.is_some() != key.is_some() {
        return Err("store.cert_file: give store.cert_file and store.key_file together (the client's certificate and its key)".into());
    }
    Ok(())
}

/// The TLS files' contents, relative to the config at `config_path`; `None` without a CA.
fn read_tls_files(
    config_path: &Path,
    ca: &Option<PathBuf>,
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
) -> Result<Option<Box<TlsPem>>, String> {
    let Some(ca) = ca else { return Ok(None) };
    let read = |name: &str, file: &Path| read_pem(&format!("store.{name}"), &crate::daemon::relative_to_config(config_path, file));
    let identity = match (cert, key) {
        (Some(cert), Some(key)) => Some((read("cert_file", cert)?, read("key_file", key)?)),
        _ => None,
    };
    Ok(Some(Box::new(TlsPem { ca: read("ca_file", ca)?, identity })))
}

/// The PEM file `path` for the config key `key` (`store.ca_file`), at most
/// [`TLS_FILE_BYTES_MAX`] bytes.
pub fn read_pem(key: &str, path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))?;
    let mut pem = Vec::new();
    file.take(TLS_FILE_BYTES_MAX + 1).read_to_end(&mut pem).map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))?;
    if pem.len() as u64 > TLS_FILE_BYTES_MAX {
        return Err(format!("{key}: {} is larger than {TLS_FILE_BYTES_MAX} bytes; is it the right file?", path.display()));
    }
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!("{key}: {} is not PEM (no -----BEGIN line)", path.display()));
    }
    Ok(pem)
}

/// The first line of `path`, at most [`PASSWORD_FILE_BYTES_MAX`] bytes.
fn read_password(path: &Path) -> Result<Secret, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("store.password_file: cannot read {}: {e}", path.display()))?;
    let mut text = String::new();
    file.take(PASSWORD_FILE_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("store.password_file: cannot read {}: {e}", path.display()))?;
    if text.len() as u64 > PASSWORD_FILE_BYTES_MAX {
        return Err(format!(
            "store.password_file: {} is larger than {PASSWORD_FILE_BYTES_MAX} bytes; is it the right file?",
            path.display()
        ));
    }
    let password = text.lines().next().unwrap_or_default().trim_end_matches('\r');
    if password.is_empty() {
        return Err(format!("store.password_file: {} is empty", path.display()));
    }
    Ok(Secret(password.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Doc {
        id: String,
        store: StoreConfig,
    }

    fn parse(store: &str) -> Result<StoreConfig, String> {
        toml::from_str::<Doc>(&format!("id = \"x\"\n[store]\n{store}")).map(|d| d.store).map_err(|e| e.to_string())
    }

    /// The control API stays the default, so existing files keep working.
    #[test]
    fn without_a_kind_the_store_is_the_control_api() {
        let Ok(StoreConfig::Control(c)) = parse("url = \"http://127.0.0.1:8053\"\ntoken = \"t\"") else { panic!("control") };
        assert_eq!((c.url.as_str(), c.token.as_deref()), ("http://127.0.0.1:8053", Some("t")));
    }

    #[test]
    fn etcd_takes_endpoints_and_defaults_the_prefix() {
        let Ok(StoreConfig::Etcd(e)) = parse("kind = \"etcd\"\nendpoints = [\"http://10.0.0.1:2379\", \"http://etcd-2:2379\"]") else {
            panic!("etcd")
        };
        assert_eq!(e.endpoints.len(), 2);
        assert_eq!(e.prefix, ETCD_PREFIX_DEFAULT);
        assert!(e.credentials().is_none());
    }

    /// Each mistake is named by its key and, through TOML, its line.
    #[test]
    fn bad_store_tables_name_the_key_and_line() {
        let cases = [
            ("kind = \"zookeeper\"", "store.kind"),
            ("kind = \"etcd\"", "store.endpoints: missing"),
            ("kind = \"etcd\"\nendpoints = []", "store.endpoints: give 1..=16"),
            ("kind = \"etcd\"\nendpoints = [\"10.0.0.1:2379\"]", "must be a client URL"),
            ("kind = \"etcd\"\nendpoints = [\"https://10.0.0.1:2379\"]", "store.ca_file: missing"),
            ("kind = \"etcd\"\nendpoints = [\"https://e:2379\", \"http://f:2379\"]", "one scheme"),
            ("kind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nca_file = \"ca.pem\"", "store.ca_file: only for https://"),
            ("kind = \"etcd\"\nendpoints = [\"https://e:2379\"]\nca_file = \"ca.pem\"\ncert_file = \"c.pem\"", "together"),
            ("url = \"http://a:1\"\nca_file = \"ca.pem\"", "store.ca_file: only for https://"),
            ("url = \"https://a:1\"", "store.ca_file: missing; an https:// url"),
            ("url = \"https://a:1\"\nca_file = \"ca.pem\"\nkey_file = \"k.pem\"", "together"),
            ("kind = \"etcd\"\nendpoints = [\"http://10.0.0.1\"]", "must be a client URL"),
            ("kind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nprefix = \"dnsplan\"", "store.prefix"),
            ("kind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nurl = \"http://a:1\"", "store.url: only for kind = \"control\""),
            ("kind = \"etcd\"\nendpoints = [\"http://e:2379\"]\npassword = \"hunter2-secret\"", "store.username: missing"),
            (
                "kind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nusername = \"u\"\npassword = \"hunter2-secret\"\npassword_file = \"p\"",
                "not both",
            ),
            ("kind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nusername = \"\"", "store.username"),
            ("url = \"http://a:1\"\nendpoints = [\"http://e:2379\"]", "store.endpoints: only for kind = \"etcd\""),
            ("token = \"t\"", "store.url: missing"),
            ("url = \"a:1\"", "store.url"),
            ("kind = \"etcd\"\nendpoint = [\"http://e:2379\"]", "unknown field `endpoint`"),
        ];
        for (text, want) in cases {
            let err = parse(text).err().unwrap_or_default();
            assert!(err.contains(want), "{text:?}: want {want:?} in {err}");
            // Checks of the table point at its `[store]` line, unknown keys at their own.
            assert!(["line 2", "line 3", "line 4"].iter().any(|l| err.contains(l)), "{text:?}: no line in {err}");
            assert!(!err.contains("hunter2"), "{text:?}: the password is shown in {err}");
        }
    }

    /// The password comes from the environment, else the file (relative to the config), else
    /// the table; errors name the file and never show the password.
    #[test]
    fn passwords_come_from_env_file_or_table_and_are_never_shown() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("planner.toml");
        std::fs::write(dir.path().join("etcd.pass"), "s3cret-from-file\n").expect("write");
        let mut store = parse("kind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nusername = \"dnsplan\"\npassword_file = \"etcd.pass\"")
            .expect("parses");
        store.resolve(&config).expect("resolves");
        let StoreConfig::Etcd(e) = &store else { panic!("etcd") };
        let (user, password) = e.credentials().expect("credentials");
        assert_eq!((user.as_str(), password.expose()), ("dnsplan", "s3cret-from-file"));
        assert!(!format!("{store:?}").contains("s3cret"), "{store:?}");

        let mut missing =
            parse("kind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nusername = \"dnsplan\"\npassword_file = \"nope\"").expect("parses");
        let err = missing.resolve(&config).err().unwrap_or_default();
        assert!(err.contains("store.password_file") && err.contains("nope"), "{err}");
        let mut no_password = parse("kind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nusername = \"dnsplan\"").expect("parses");
        let err = no_password.resolve(&config).err().unwrap_or_default();
        assert!(err.contains(ETCD_PASSWORD_ENV), "{err}");
        std::fs::write(dir.path().join("empty.pass"), "\n").expect("write");
        let mut empty =
            parse("kind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nusername = \"u\"\npassword_file = \"empty.pass\"").expect("parses");
        assert!(empty.resolve(&config).err().unwrap_or_default().contains("is empty"));
    }

    /// TLS files are read relative to the config; each must be PEM; the key is never shown.
    #[test]
    fn tls_files_are_read_relative_to_the_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("enactor.toml");
        let pem = |what: &str| format!("-----BEGIN {what}-----\nMIIB\n-----END {what}-----\n");
        std::fs::write(dir.path().join("ca.pem"), pem("CERTIFICATE")).expect("write");
        std::fs::write(dir.path().join("client.pem"), pem("CERTIFICATE")).expect("write");
        std::fs::write(dir.path().join("client.key"), pem("PRIVATE KEY")).expect("write");
        std::fs::write(dir.path().join("not.pem"), "hunter2-key").expect("write");
        let table = "kind = \"etcd\"\nendpoints = [\"https://e:2379\"]\nca_file = \"ca.pem\"";
        let mut store = parse(&format!("{table}\ncert_file = \"client.pem\"\nkey_file = \"client.key\"")).expect("parses");
        store.resolve(&config).expect("resolves");
        let StoreConfig::Etcd(e) = &store else { panic!("etcd") };
        let tls = e.tls.as_ref().expect("tls");
        assert_eq!(tls.ca, pem("CERTIFICATE").into_bytes());
        assert_eq!(tls.identity.as_ref().map(|(_, key)| key.clone()), Some(pem("PRIVATE KEY").into_bytes()));
        assert!(!format!("{store:?}").contains("PRIVATE KEY"), "{store:?}");
        let mut ca_only = parse(table).expect("parses");
        ca_only.resolve(&config).expect("resolves");
        let StoreConfig::Etcd(e) = &ca_only else { panic!("etcd") };
        assert!(e.tls.as_ref().is_some_and(|t| t.identity.is_none()));

        let mut bad = parse(&format!("{table}\ncert_file = \"client.pem\"\nkey_file = \"not.pem\"")).expect("parses");
        let err = bad.resolve(&config).err().unwrap_or_default();
        assert!(err.contains("store.key_file") && err.contains("not PEM") && !err.contains("hunter2"), "{err}");
        let mut missing = parse("kind = \"etcd\"\nendpoints = [\"https://e:2379\"]\nca_file = \"nope.pem\"").expect("parses");
        let err = missing.resolve(&config).err().unwrap_or_default();
        assert!(err.contains("store.ca_file") && err.contains("nope.pem"), "{err}");
    }
}
