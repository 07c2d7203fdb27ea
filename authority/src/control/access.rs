//! Who may do what on the control API: credentials, their roles, and the one table that says
//! which role each route needs.
//!
//! A credential is a bearer token with a name and roles, configured by the SHA-256 of its
//! token (`[[control.credential]]`), so a config file that leaks gives no token. Tokens are
//! random and at least `TOKEN_BYTES_MIN` bytes, so a fast hash is enough (a slow password
//! hash guards guessable secrets; nobody guesses 128 random bits). `control.token`, when
//! set, is one more credential, named `token`, with every role: the configs written before
//! roles keep working, and with it alone reads stay open as they were.
//!
//! Roles, each a set of writes; every credential may read:
//! - `read`: nothing more (dashboards, `dnsplan status`);
//! - `operate`: pause, resume, retire, publish an operator plan (a rollback is one);
//! - `enact`: apply, heartbeats (the enactors);
//! - `plan`: publish as the planner, hold the planner's lease;
//! - `admin`: cleanup, zones added and removed.
//!
//! Credentials are read again, with the TLS files, on SIGHUP and when the file changes
//! (`reload`).
//!
//! `ROUTES` lists every route with what it needs. A route the table does not list is refused
//! to everyone (and logged as a defect), a method it does not list for a route gets 405: a
//! new route or method cannot be open by omission. Once any
//! `[[control.credential]]` is set, every read needs a credential too, except `/healthz`,
//! `/readyz` and `/metrics`. A token is taken from `Authorization: Bearer <token>`, or as the
//! password of `Authorization: Basic` (what a browser sends for the status page when asked;
//! the user name is ignored).
//!
//! Every write is audited on `AUDIT_TARGET`, with the credential's name and the answer's
//! status: refused ones at warn, accepted ones at info, except heartbeats and the planner's
//! lease renewals, which come every few seconds and go at debug. Handlers that log what a
//! write did (a publish's generation, a pause's reason) add the credential's name.

use crate::metrics::RefusedLabels;
use crate::serving::AUDIT_TARGET;
use arc_swap::ArcSwap;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use dnsplan_common::store::wire::{ErrorBody, WireError};
use dnsplan_common::tls::PeerCertificate;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Deserialize;
use std::fmt;
use std::sync::Arc;

/// Shortest token a credential may have: 16 bytes of randomness resist guessing over HTTP.
pub const TOKEN_BYTES_MIN: usize = 16;
/// The name `control.token`'s credential is audited under.
pub const TOKEN_CREDENTIAL_NAME: &str = "token";
/// Most credentials a config may hold: each request hashes once and compares with each.
pub const CREDENTIALS_MAX: usize = 1_000;

/// A set of writes a credential may make. Every credential may read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Read,
    Operate,
    Enact,
    Plan,
    Admin,
}

impl Role {
    pub const ALL: [Role; 5] = [Role::Read, Role::Operate, Role::Enact, Role::Plan, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
            Role::Enact => "enact",
            Role::Plan => "plan",
            Role::Admin => "admin",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Roles as bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Roles(u8);

impl Roles {
    pub fn all() -> Roles {
        Role::ALL.into_iter().collect()
    }

    pub fn has(self, role: Role) -> bool {
        role == Role::Read || self.0 & role.bit() != 0
    }

    pub fn iter(self) -> impl Iterator<Item = Role> {
        Role::ALL.into_iter().filter(move |r| self.0 & r.bit() != 0)
    }
}

impl FromIterator<Role> for Roles {
    fn from_iter<I: IntoIterator<Item = Role>>(roles: I) -> Roles {
        Roles(roles.into_iter().fold(0, |bits, r| bits | r.bit()))
    }
}

impl fmt::Display for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Role::as_str).collect();
        write!(f, "[{}]", names.join(", "))
    }
}

/// One `[[control.credential]]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    /// Shown in audit lines and errors: who holds it (`enactor-eu1`, `alice`).
    pub name: String,
    pub roles: Vec<Role>,
    /// The SHA-256 of the token, in hex (`dnsplan credential new` prints it).
    #[serde(default)]
    pub sha256: Option<String>,
    /// Or a client certificate: one the CA of `control.tls.client_ca_file` signed for this DNS
    /// name (a subject alternative name), such as `enactor-eu1.dnsplan.internal`.
    #[serde(default)]
    pub client_cert: Option<String>,
}

/// The SHA-256 of `token`, in lowercase hex: what `[[control.credential]]` holds.
pub fn token_sha256(token: &str) -> String {
    data_encoding::HEXLOWER.encode(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref())
}

/// A new random token of 24 bytes, in hex.
pub fn new_token() -> Result<String, String> {
    let mut bytes = [0u8; 24];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| "the system's random source failed".to_string())?;
    Ok(data_encoding::HEXLOWER.encode(&bytes))
}

struct Credential {
    name: Arc<str>,
    roles: Roles,
    /// What identifies the holder: a token's hash, or a client certificate's name.
    sha256: Option<[u8; 32]>,
    client_cert: Option<String>,
}

/// Who called: the credential's name and roles, put in the request's extensions for handlers.
#[derive(Clone, Debug)]
pub struct Caller {
    pub name: Arc<str>,
    pub roles: Roles,
}

impl Caller {
    /// The name for audit lines: the credential's, or `-` for an open read.
    pub fn name_of(caller: Option<&Caller>) -> &str {
        caller.map_or("-", |c| &c.name)
    }
}

/// The credentials in force.
pub struct Credentials {
    list: Vec<Credential>,
    /// Reads need no credential: only `control.token` is set, as before roles.
    reads_open: bool,
}

impl Credentials {
    /// From `control.token` (one more credential with every role, when set) and the
    /// `[[control.credential]]` tables; each refusal names the table and what to do.
    pub fn new(token: Option<&str>, tables: &[CredentialConfig], placeholder_allowed: bool) -> Result<Credentials, String> {
        if tables.len() > CREDENTIALS_MAX {
            return Err(format!("control.credential: {} credentials; the limit is {CREDENTIALS_MAX}", tables.len()));
        }
        let mut list = Vec::with_capacity(tables.len() + 1);
        if let Some(token) = token {
            if token.len() < TOKEN_BYTES_MIN {
                return Err(format!("control.token is shorter than {TOKEN_BYTES_MIN} bytes; use a long random token"));
            }
            list.push(Credential {
                name: TOKEN_CREDENTIAL_NAME.into(),
                roles: Roles::all(),
                sha256: Some(digest(token)),
                client_cert: None,
            });
        }
        let placeholders: Vec<String> = dnsplan_common::daemon::PLACEHOLDER_TOKENS.iter().map(|t| token_sha256(t)).collect();
        for (i, table) in tables.iter().enumerate() {
            let at = format!("control.credential[{i}] ({:?})", table.name);
            let name = table.name.trim();
            if name.is_empty() || name.len() > 64 || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return Err(format!("{at}: name must be 1 to 64 characters, without spaces or control characters"));
            }
            if name == TOKEN_CREDENTIAL_NAME && token.is_some() {
                return Err(format!("{at}: the name {TOKEN_CREDENTIAL_NAME:?} is control.token's; choose another"));
            }
            if list.iter().any(|c: &Credential| &*c.name == name) {
                return Err(format!("{at}: another credential has this name; names must be unique, as audit lines name them"));
            }
            if table.roles.is_empty() {
                return Err(format!("{at}: roles is empty; give at least one of read, operate, enact, plan, admin"));
            }
            let roles = table.roles.iter().copied().collect();
            let credential = match (&table.sha256, &table.client_cert) {
                (Some(hex), None) => {
                    let hex = hex.trim().to_ascii_lowercase();
                    let sha256 = data_encoding::HEXLOWER
                        .decode(hex.as_bytes())
                        .ok()
                        .and_then(|b| <[u8; 32]>::try_from(b).ok())
                        .ok_or_else(|| format!("{at}: sha256 is not 64 hex digits; `dnsplan credential hash` prints a token's"))?;
                    if !placeholder_allowed && placeholders.contains(&hex) {
                        return Err(format!(
                            "{at}: the token is a placeholder from the examples, which anyone can read; `dnsplan credential new` \
                             makes a random one"
                        ));
                    }
                    if list.iter().any(|c| c.sha256 == Some(sha256)) {
                        return Err(format!("{at}: another credential has the same token; each needs its own"));
                    }
                    Credential { name: name.into(), roles, sha256: Some(sha256), client_cert: None }
                }
                (None, Some(cert_name)) => {
                    let cert_name = cert_name.trim().trim_end_matches('.').to_ascii_lowercase();
                    if dns_name_ok(&cert_name).is_err() {
                        return Err(format!(
                            "{at}: client_cert {cert_name:?} is not a DNS name (a certificate's subject alternative name)"
                        ));
                    }
                    if list.iter().any(|c| c.client_cert.as_deref() == Some(cert_name.as_str())) {
                        return Err(format!("{at}: another credential names the same client certificate"));
                    }
                    Credential { name: name.into(), roles, sha256: None, client_cert: Some(cert_name) }
                }
                _ => return Err(format!("{at}: give sha256 (a token's) or client_cert (a certificate's DNS name), one of them")),
            };
            list.push(credential);
        }
        if list.is_empty() {
            return Err(format!(
                "no credential: set control.token (or {}) or at least one [[control.credential]]",
                dnsplan_common::daemon::TOKEN_ENV
            ));
        }
        Ok(Credentials { list, reads_open: tables.is_empty() })
    }

    /// The credential whose token is `given`. Every stored hash is compared, each in time
    /// independent of where it differs.
    fn identify(&self, given: &str) -> Option<Caller> {
        let hash = digest(given);
        let mut found = None;
        for c in &self.list {
            if c.sha256.is_some_and(|stored| crate::control::routes::token_matches(&hash, &stored)) {
                found = Some(Caller { name: c.name.clone(), roles: c.roles });
            }
        }
        found
    }

    /// The credential a verified client certificate stands for: the first whose
    /// `client_cert` the certificate names.
    fn identify_certificate(&self, cert: &PeerCertificate) -> Option<Caller> {
        self.list
            .iter()
            .filter_map(|c| Some((c, c.client_cert.as_deref()?)))
            .find(|(_, name)| dnsplan_common::tls::certificate_names(&cert.0, name))
            .map(|(c, _)| Caller { name: c.name.clone(), roles: c.roles })
    }

    /// Whether a credential is a client certificate (the TLS config must then take them).
    pub fn wants_client_certificates(&self) -> bool {
        self.list.iter().any(|c| c.client_cert.is_some())
    }

    /// The credentials' names and roles, for the log line of a reload.
    pub fn summary(&self) -> String {
        let items: Vec<String> = self.list.iter().map(|c| format!("{} {}", c.name, c.roles)).collect();
        items.join("; ")
    }

    pub fn reads_open(&self) -> bool {
        self.reads_open
    }
}

/// Names and roles only: no hash is ever printed.
impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials({})", self.summary())
    }
}

/// Whether `name` is a DNS name a certificate can carry.
fn dns_name_ok(name: &str) -> Result<(), ()> {
    match dnsplan_common::tls::ServerName::try_from(name) {
        Ok(dnsplan_common::tls::ServerName::DnsName(_)) => Ok(()),
        _ => Err(()),
    }
}

fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// What a route needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Nothing: health, readiness, metrics.
    Open,
    /// Any credential, or none while reads are open.
    Read,
    /// A credential with this role.
    Role(Role),
    /// Publishing a plan: `plan` for the planner's plans, `operate` for an operator's; the
    /// handler checks the plan's author against the caller's roles.
    Publish,
    /// Heartbeats and lease renewals: `Role`, audited at debug.
    Frequent(Role),
}

impl Need {
    fn allows(self, roles: Roles) -> bool {
        match self {
            Need::Open | Need::Read => true,
            Need::Role(r) | Need::Frequent(r) => roles.has(r),
            Need::Publish => roles.has(Role::Plan) || roles.has(Role::Operate),
        }
    }

    fn needed(self) -> String {
        match self {
            Need::Open | Need::Read => "read".into(),
            Need::Role(r) | Need::Frequent(r) => r.to_string(),
            Need::Publish => "plan (a planner's plan) or operate (an operator's)".into(),
        }
    }
}

/// Every route of the control API, `dnsplan up`'s demo routes included, with what it needs.
/// Routes of an added zone (`/v1/managed/{zone}/...`) need what the first zone's do.
pub const ROUTES: &[(&str, &str, Need)] = &[
    ("GET", "/healthz", Need::Open),
    ("GET", "/readyz", Need::Open),
    ("GET", "/metrics", Need::Open),
    ("GET", "/v1/status", Need::Read),
    ("GET", "/ui", Need::Read),
    ("GET", "/ui/plans/{generation}", Need::Read),
    ("GET", "/ui/managed/{zone}", Need::Read),
    ("GET", "/ui/managed/{zone}/plans/{generation}", Need::Read),
    ("GET", "/v1/managed/{zone}/status", Need::Read),
    ("GET", "/v1/zones", Need::Read),
    ("PUT", "/v1/zones/{origin}", Need::Role(Role::Admin)),
    ("DELETE", "/v1/zones/{origin}", Need::Role(Role::Admin)),
    ("GET", "/v1/managed", Need::Read),
    ("GET", "/v1/managed-version", Need::Read),
    ("GET", "/v1/managed/{zone}", Need::Read),
    ("PUT", "/v1/managed/{zone}", Need::Role(Role::Admin)),
    ("DELETE", "/v1/managed/{zone}", Need::Role(Role::Admin)),
    ("GET", "/v1/plans", Need::Read),
    ("POST", "/v1/plans", Need::Publish),
    ("GET", "/v1/plans/{generation}", Need::Read),
    ("GET", "/v1/plans/{generation}/changes", Need::Read),
    ("POST", "/v1/plans/{generation}/changes", Need::Publish),
    ("POST", "/v1/apply", Need::Role(Role::Enact)),
    ("GET", "/v1/version", Need::Read),
    ("GET", "/v1/generation-base", Need::Read),
    ("GET", "/v1/dnssec-keys", Need::Role(Role::Admin)),
    ("PUT", "/v1/dnssec-keys", Need::Role(Role::Admin)),
    ("GET", "/v1/wait", Need::Read),
    ("GET", "/v1/active", Need::Read),
    ("GET", "/v1/active/{endpoint}", Need::Read),
    ("PUT", "/v1/active/{endpoint}", Need::Role(Role::Enact)),
    ("POST", "/v1/active/{endpoint}/retire", Need::Role(Role::Operate)),
    ("GET", "/v1/changes", Need::Read),
    ("GET", "/v1/cleanup", Need::Read),
    ("POST", "/v1/cleanup", Need::Role(Role::Admin)),
    ("GET", "/v1/pause", Need::Read),
    ("PUT", "/v1/pause", Need::Role(Role::Operate)),
    ("DELETE", "/v1/pause", Need::Role(Role::Operate)),
    ("GET", "/v1/heartbeats", Need::Read),
    ("POST", "/v1/heartbeats", Need::Frequent(Role::Enact)),
    ("GET", "/v1/lease", Need::Read),
    ("POST", "/v1/lease", Need::Frequent(Role::Plan)),
    ("DELETE", "/v1/lease", Need::Role(Role::Plan)),
    ("GET", "/v1/planner", Need::Read),
    ("GET", "/v1/demo/backends", Need::Read),
    ("POST", "/v1/demo/backends/{address}/{action}", Need::Role(Role::Operate)),
];

/// What `method` on the route `path` (axum's matched path) needs; `None` for a route the
/// table does not list.
pub fn need(method: &Method, path: &str) -> Option<Need> {
    // HEAD is answered as GET.
    let method = if method == Method::HEAD { "GET" } else { method.as_str() };
    let path = table_path(path);
    ROUTES.iter().find(|(m, p, _)| *m == method && *p == path).map(|(_, _, n)| *n)
}

/// The methods the table lists for the route `path`.
fn methods_of(path: &str) -> Vec<&'static str> {
    let path = table_path(path);
    ROUTES.iter().filter(|(_, p, _)| *p == path).map(|(m, _, _)| *m).collect()
}

/// The table's route for `path`: an added zone's store routes are the first zone's.
fn table_path(path: &str) -> String {
    match path.strip_prefix("/v1/managed/{zone}/") {
        Some(rest) if rest != "status" => format!("/v1/{rest}"),
        _ => path.to_owned(),
    }
}

/// The token a request presents: a bearer token, or a Basic password.
fn presented(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    if let Some(token) = value.strip_prefix("Bearer ") {
        return Some(token.trim().to_owned());
    }
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = data_encoding::BASE64.decode(encoded.trim().as_bytes()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    text.split_once(':').map(|(_, password)| password.to_owned())
}

/// The credentials in force, swapped whole by a reload, and the count of refusals.
#[derive(Clone)]
pub struct Access {
    credentials: Arc<ArcSwap<Credentials>>,
    refused: Family<RefusedLabels, Counter>,
}

impl Access {
    pub fn new(credentials: Credentials) -> Access {
        Access { credentials: Arc::new(ArcSwap::from_pointee(credentials)), refused: Family::default() }
    }

    /// Refusals are counted in `refused` (`dnsplan_control_refused_total`).
    pub fn with_refusals_counted(mut self, refused: Family<RefusedLabels, Counter>) -> Access {
        self.refused = refused;
        self
    }

    /// Puts `credentials` in force for every request from now on.
    pub fn replace(&self, credentials: Credentials) {
        self.credentials.store(Arc::new(credentials));
    }

    pub fn current(&self) -> Arc<Credentials> {
        self.credentials.load_full()
    }

    fn count_refusal(&self, credential: &str, status: StatusCode) {
        self.refused.get_or_create(&RefusedLabels { credential: credential.to_owned(), status: status.as_u16() }).inc();
    }
}

fn refusal(status: StatusCode, error: WireError, message: String, basic: bool) -> Response {
    let mut response = (status, axum::Json(ErrorBody { error, message })).into_response();
    if status == StatusCode::UNAUTHORIZED {
        let challenge = if basic { "Basic realm=\"dnsplan control API\"" } else { "Bearer" };
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    }
    response
}

/// The middleware: checks the caller against `ROUTES`, puts `Caller` in the request's
/// extensions, and audits every write.
pub async fn guard(State(access): State<Access>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_default();
    let Some(needs) = need(&method, &route) else {
        let methods = methods_of(&route);
        if !methods.is_empty() {
            // A method the route does not take: answered here, never by a handler the table
            // does not list.
            let detail = format!("{route} takes {}, not {method}", methods.join(", "));
            let mut response = refusal(
                StatusCode::METHOD_NOT_ALLOWED,
                WireError::BadRequest { detail: detail.clone() },
                format!("bad request: {detail}"),
                false,
            );
            if let Ok(allow) = HeaderValue::from_str(&methods.join(", ")) {
                response.headers_mut().insert(header::ALLOW, allow);
            }
            return response;
        }
        tracing::error!(method = %method, route = %route, "a control API route is not in the access table; refused to everyone");
        return refusal(
            StatusCode::FORBIDDEN,
            WireError::Forbidden { detail: format!("{method} {route} is not in the access table") },
            format!("{method} {route} is refused to everyone: it is not in the control API's access table"),
            false,
        );
    };
    if needs == Need::Open {
        return next.run(req).await;
    }
    let write = !matches!(needs, Need::Read);
    let credentials = access.current();
    let caller = match presented(req.headers()) {
        Some(token) => credentials.identify(&token),
        None => req.extensions().get::<PeerCertificate>().and_then(|cert| credentials.identify_certificate(cert)),
    };
    let path = req.uri().path().to_owned();
    let Some(caller) = caller else {
        if !write && credentials.reads_open() {
            return next.run(req).await;
        }
        let given = req.headers().contains_key(header::AUTHORIZATION);
        if write {
            tracing::warn!(target: AUDIT_TARGET, method = %method, path = ?path, credential = "-", status = 401, "write refused: no known credential");
        }
        access.count_refusal("-", StatusCode::UNAUTHORIZED);
        let what = if write { "this write" } else { "this read" };
        let message = if given {
            format!("{what} was refused: the token is not one of the control API's credentials")
        } else {
            format!("{what} needs a credential: 'Authorization: Bearer <token>' (the CLI's --token or DNSPLAN_TOKEN)")
        };
        return refusal(StatusCode::UNAUTHORIZED, WireError::Unauthorized, message, !write);
    };
    if !needs.allows(caller.roles) {
        let detail = format!("credential {:?} has roles {}; {method} {route} needs {}", &*caller.name, caller.roles, needs.needed());
        tracing::warn!(target: AUDIT_TARGET, method = %method, path = ?path, credential = %caller.name, status = 403, "write refused: {detail}");
        access.count_refusal(&caller.name, StatusCode::FORBIDDEN);
        return refusal(StatusCode::FORBIDDEN, WireError::Forbidden { detail: detail.clone() }, format!("refused: {detail}"), false);
    }
    let name = caller.name.clone();
    let mut req = req;
    req.extensions_mut().insert(caller);
    let response = next.run(req).await;
    if write {
        let status = response.status().as_u16();
        if matches!(needs, Need::Frequent(_)) && response.status().is_success() {
            tracing::debug!(target: AUDIT_TARGET, method = %method, path = ?path, credential = %name, status, "write");
        } else if response.status().is_success() {
            tracing::info!(target: AUDIT_TARGET, method = %method, path = ?path, credential = %name, status, "write");
        } else {
            tracing::info!(target: AUDIT_TARGET, method = %method, path = ?path, credential = %name, status, "write answered with an error");
        }
    }
    response
}

impl Access {
    /// `control.token` alone, as before roles: every role, reads open.
    pub fn token(token: &str) -> Result<Access, String> {
        Credentials::new(Some(token), &[], true).map(Access::new)
    }
}

/// Whether a credential with `roles` may publish a plan by `author`.
pub fn may_publish(roles: Roles, author: &dnsplan_common::plan::Author) -> Result<(), String> {
    let role = if author.is_operator() { Role::Operate } else { Role::Plan };
    if roles.has(role) { Ok(()) } else { Err(format!("a plan by {author} needs the {role} role; this credential has {roles}")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str, roles: &[Role], token: &str) -> CredentialConfig {
        CredentialConfig { name: name.into(), roles: roles.to_vec(), sha256: Some(token_sha256(token)), client_cert: None }
    }

    #[test]
    fn tokens_are_found_by_their_hash_and_roles_kept() {
        let c = Credentials::new(
            None,
            &[
                table("enactor-a", &[Role::Enact], "enact-token-0123456789"),
                table("ops", &[Role::Operate, Role::Admin], "ops-token-0123456789"),
            ],
            false,
        )
        .unwrap();
        let caller = c.identify("enact-token-0123456789").unwrap();
        assert_eq!(&*caller.name, "enactor-a");
        assert!(caller.roles.has(Role::Enact) && caller.roles.has(Role::Read) && !caller.roles.has(Role::Operate));
        assert_eq!(&*c.identify("ops-token-0123456789").unwrap().name, "ops");
        assert!(c.identify("ops-token-012345678").is_none());
        assert!(!c.reads_open());
        let legacy = Credentials::new(Some("legacy-token-0123456789"), &[], false).unwrap();
        assert!(legacy.reads_open());
        assert_eq!(legacy.identify("legacy-token-0123456789").unwrap().roles, Roles::all());
    }

    #[test]
    fn bad_tables_are_refused_with_what_to_do() {
        let t = "a-token-of-twenty-bytes";
        for (tables, says) in [
            (vec![table("a b", &[Role::Read], t)], "without spaces"),
            (vec![table("a", &[], t)], "roles is empty"),
            (vec![table("a", &[Role::Read], t), table("a", &[Role::Read], "another-token-0123456")], "unique"),
            (vec![table("a", &[Role::Read], t), table("b", &[Role::Read], t)], "same token"),
            (
                vec![CredentialConfig { name: "a".into(), roles: vec![Role::Read], sha256: Some("abc".into()), client_cert: None }],
                "64 hex digits",
            ),
            (vec![CredentialConfig { name: "a".into(), roles: vec![Role::Read], sha256: None, client_cert: None }], "one of them"),
            (
                vec![CredentialConfig { name: "a".into(), roles: vec![Role::Read], sha256: None, client_cert: Some("not a name".into()) }],
                "not a DNS name",
            ),
            (vec![table("a", &[Role::Read], "change-me-to-a-long-random-token")], "placeholder"),
            (vec![], "no credential"),
        ] {
            let err = Credentials::new(None, &tables, false).err().unwrap_or_default();
            assert!(err.contains(says), "{says}: {err}");
        }
        assert!(Credentials::new(Some("short"), &[], false).unwrap_err().contains("shorter"));
    }

    #[test]
    fn added_zones_routes_need_what_the_first_zones_need() {
        for (method, path, needs) in ROUTES {
            let Some(rest) = path.strip_prefix("/v1/") else { continue };
            if ["zones", "managed", "demo"].iter().any(|p| rest.starts_with(p)) || *path == "/v1/status" {
                continue;
            }
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            assert_eq!(need(&method, &format!("/v1/managed/{{zone}}/{rest}")), Some(*needs), "{method} {path}");
        }
        assert_eq!(need(&Method::GET, "/v1/managed/{zone}/status"), Some(Need::Read));
        assert_eq!(need(&Method::HEAD, "/v1/plans"), Some(Need::Read));
        assert_eq!(need(&Method::PATCH, "/v1/plans"), None);
    }
}
