//! The operator commands, against a running stack's control API (`RemoteStore` and the status
//! routes). [`CliError`] maps every failure to the documented exit codes. `rollback` and
//! `verify` call `workflow`; `plans publish` calls `plan_file`. `status` prints the planner's
//! `deferred` as a HELD BACK section (at most `HELD_BACK_LINES_MAX` lines; the JSON has them
//! all), and `plans explain` of the latest plan ends with it (deferrals are relative to the
//! latest plan, and no plan records them); it also prints the authority's secondaries (a
//! summary line and each one's serial and state). `zone export` names the applied-change and
//! content-change counts it read, not a serial (the SOA serial is the authority's
//! `serial_base` plus the content-change count).
//!
//! One file per group of commands: `status`, `plans` (with `rollback` and `cleanup`), `verify`,
//! `endpoints` (with `zone export` and `backend`); `reach` finds the DNS servers to ask and says
//! why the stack does not answer.

use crate::output::{self, Format, table};
use crate::plan_file::{self, addresses, diff};
use crate::workflow::{self, RollbackRequest};
use clap::Subcommand;
use dnsplan_common::status::{Deferred, PlannerStatus, SecondaryState, SecondaryStatus, Status};
use dnsplan_common::store::lease::now_unix_ms;
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::store::zones::ManagedZones;
use dnsplan_common::{ActiveState, EndpointName, Generation, PauseState, Provenance, Store, StoreError, ValidatedPlan};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

mod endpoints;
mod plans;
mod reach;
mod status;
#[cfg(test)]
mod tests;
mod verify;
mod zones;

// Each command's file uses the shared items above and the others' through these.
use endpoints::*;
use plans::*;
use reach::*;
use status::*;
use verify::*;

#[derive(Subcommand)]
pub enum Command {
    /// Latest plan, pause and breaker, every endpoint's active plan and addresses, enactors.
    Status,
    /// Published plans: list, show, diff, explain.
    Plans {
        #[command(subcommand)]
        command: PlansCommand,
    },
    /// Publish a new plan with an older plan's content (roll forward), pause automation
    /// unless --keep-automation, and wait until it is enacted and served.
    Rollback {
        /// The generation whose content the new plan carries.
        #[arg(long)]
        to: u64,
        /// Why: recorded in the plan, the pause and the audit log.
        #[arg(long)]
        reason: String,
        /// Leave automation running (the planner may change the result again at once).
        #[arg(long)]
        keep_automation: bool,
        /// Who rolls back (default: $USER).
        #[arg(long)]
        by: Option<String>,
        /// The DNS server to check the result on (default: the stack's own, as its status says).
        #[arg(long, env = "DNSPLAN_DNS")]
        dns: Option<SocketAddr>,
        /// How long to wait for the rollback to be enacted and served.
        #[arg(long, default_value_t = 60)]
        wait_secs: u64,
    },
    /// Endpoints of the latest plan: list them (managed by the planner or kept as served), or
    /// retire one the planner no longer manages.
    Endpoints {
        #[command(subcommand)]
        command: EndpointsCommand,
    },
    /// Stop automation from publishing (operators still can).
    Pause {
        /// Why: shown by `dnsplan status` until someone resumes.
        #[arg(long)]
        reason: String,
        /// Who pauses (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Let automation publish again (this also clears a tripped breaker).
    Resume,
    /// Ask DNS for every managed endpoint and compare with the active state; check that the
    /// latest plan's content is served everywhere and say which endpoints and enactors lag.
    Verify {
        /// The DNS servers to ask, each (repeat it, or separate them with commas: several
        /// authorities, or secondaries); default: every address the stack's status says it
        /// serves DNS on.
        #[arg(long, env = "DNSPLAN_DNS", value_delimiter = ',')]
        dns: Vec<SocketAddr>,
        /// How long the latest plan may take to be enacted before verify fails.
        #[arg(long, default_value_t = 10)]
        wait_secs: u64,
    },
    /// Delete old plans (never an active or newer one); --dry-run shows what would go.
    Cleanup {
        /// Say what would be deleted, and why the rest is kept; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Keep at least this many of the newest plans.
        #[arg(long, default_value_t = 20)]
        retain: u64,
    },
    /// The DNS zones served: export the managed one, list, add and remove static ones.
    Zone {
        #[command(subcommand)]
        command: ZoneCommand,
    },
    /// The demo backends of `dnsplan up`: list, fail, heal.
    Backend {
        #[command(subcommand)]
        command: BackendCommand,
    },
}

#[derive(Subcommand)]
pub enum PlansCommand {
    /// The newest plans, newest last.
    List {
        /// How many plans to show.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// One plan: who, why, and every endpoint's targets.
    Show {
        /// The plan's generation.
        generation: u64,
    },
    /// What changes from plan A to plan B, as - and + lines.
    Diff {
        /// The older plan's generation.
        from: u64,
        /// The newer plan's generation.
        to: u64,
    },
    /// Why each change in a plan was made (its provenance).
    Explain {
        /// The plan's generation.
        generation: u64,
    },
    /// Publish a plan from a TOML file (the shape `plans show N --output toml` prints; `-`
    /// reads standard input). Shows the changes against the latest plan and what the guards
    /// say; publishes only with --yes, then pauses automation (unless --keep-automation) and
    /// waits until the plan is enacted and served, as a rollback does.
    Publish {
        /// The plan as TOML, in the shape `plans show --output toml` prints (`-`: standard input).
        file: PathBuf,
        /// Why: recorded in the plan and the audit log.
        #[arg(long)]
        reason: String,
        /// Publish. Without it nothing is written.
        #[arg(long)]
        yes: bool,
        /// Leave automation running (the planner may change the result again at once).
        #[arg(long)]
        keep_automation: bool,
        /// Who publishes (default: $USER).
        #[arg(long)]
        by: Option<String>,
        /// The DNS server to check the result on (default: the stack's own, as its status says).
        #[arg(long, env = "DNSPLAN_DNS")]
        dns: Option<SocketAddr>,
        /// How long to wait for the plan to be enacted and served.
        #[arg(long, default_value_t = 60)]
        wait_secs: u64,
    },
}

#[derive(Subcommand)]
pub enum ZoneCommand {
    /// The managed records as they are served, as an RFC 1035 master file.
    Export,
    /// Every zone served: the managed one and the static ones beside it.
    List,
    /// Serve the master file FILE as a static zone (its SOA and apex NS in it), at once and
    /// after restarts; a zone added before is replaced when FILE's SOA serial is newer. With
    /// --managed, add a zone to the store instead: plans change its endpoints (`--zone NAME`
    /// on the plan commands, enactors' `dns_zones`), FILE gives its SOA, NS and static records.
    Add {
        /// The master file.
        file: std::path::PathBuf,
        /// The zone's name (default: the file's leading `$ORIGIN`).
        #[arg(long)]
        origin: Option<String>,
        /// Add the zone to the store, managed by plans, on every authority of the store.
        #[arg(long)]
        managed: bool,
    },
    /// Stop serving the static zone NAME, added with `zone add`. With --managed, remove the
    /// zone NAME from the store: every authority stops serving it, and the late writes of its
    /// enactors and planner are refused.
    Remove {
        /// The zone's name, e.g. `example.org.`.
        name: String,
        /// Remove a zone the store manages (added with `zone add --managed`).
        #[arg(long)]
        managed: bool,
    },
    /// DNSSEC signing keys of a zone, made on this machine (no control API is asked).
    Key {
        #[command(subcommand)]
        command: ZoneKeyCommand,
    },
    /// The DS record for the parent zone of ORIGIN, from its signing key FILE, or from a key
    /// directory: the DS of the KSK its CDS names now (no control API is asked; the private
    /// key is never printed).
    Ds {
        /// The zone's signing key (PEM, mode 0600), as `dnsplan zone key new` wrote it.
        #[arg(long, required_unless_present = "key_dir", conflicts_with = "key_dir")]
        key: Option<PathBuf>,
        /// The zone's key directory, as `dnsplan zone key init` made it.
        #[arg(long = "key-dir", value_name = "DIR")]
        key_dir: Option<PathBuf>,
        /// The zone the key signs, e.g. `example.org.` (with --key; a key directory names it).
        #[arg(long = "dns-zone", value_name = "ORIGIN", required_unless_present = "key_dir")]
        origin: Option<dnsplan_common::DnsName>,
        /// Print a JSON object (origin, key_tag, algorithm, digest_type, digest, public_key,
        /// ds) instead of the record line; as `--output json` does.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum ZoneKeyCommand {
    /// A new signing key for the zone ORIGIN, written to FILE (mode 0600, never over an
    /// existing file). Prints its key tag, the `[dns_zone.dnssec]` table for authority.toml,
    /// the DS record for the parent zone and a trust anchor for testing with delv; never the
    /// private key.
    New {
        /// Where to write the private key (PEM, PKCS#8); must not exist.
        file: PathBuf,
        /// The zone the key signs, e.g. `example.org.`.
        #[arg(long = "dns-zone", value_name = "ORIGIN")]
        origin: dnsplan_common::DnsName,
        /// The DNSSEC algorithm: ecdsap256sha256 (13, the most deployed) or ed25519 (15).
        #[arg(long, default_value = "ecdsap256sha256", value_parser = dnsplan_common::dnssec::ZoneAlgorithm::parse)]
        algorithm: dnsplan_common::dnssec::ZoneAlgorithm,
    },
    /// A key directory for the zone ORIGIN (`key_dir` in authority.toml): a KSK, whose DS goes
    /// to the parent, and a ZSK the authority rolls by itself (pre-publication), with their
    /// schedule in DIR/keys.toml. Prints the table for authority.toml and the DS.
    Init {
        /// The directory to make (mode 0700); it may exist empty.
        dir: PathBuf,
        /// The zone the keys sign, e.g. `example.org.`.
        #[arg(long = "dns-zone", value_name = "ORIGIN")]
        origin: dnsplan_common::DnsName,
        /// The DNSSEC algorithm of new keys: ecdsap256sha256 (13) or ed25519 (15).
        #[arg(long, default_value = "ecdsap256sha256", value_parser = dnsplan_common::dnssec::ZoneAlgorithm::parse)]
        algorithm: dnsplan_common::dnssec::ZoneAlgorithm,
        /// The zone's key file of today (`key_file`): it becomes the KSK, so the DS at the
        /// parent stays valid, and the new ZSK signs once every cache has it.
        #[arg(long = "from-key", value_name = "FILE")]
        from_key: Option<PathBuf>,
        /// How long a ZSK signs before the next does; 0: rolled only by `zone key roll --zsk`.
        #[arg(long, default_value_t = 30)]
        zsk_lifetime_days: u32,
        /// TTL of the DNSKEY, CDS and CDNSKEY RRsets.
        #[arg(long, default_value_t = 3600)]
        dnskey_ttl_secs: u32,
        /// How long a change takes to reach every secondary.
        #[arg(long, default_value_t = 3600)]
        propagation_delay_secs: u32,
        /// The longest TTL in the zone.
        #[arg(long, default_value_t = 86400)]
        max_ttl_secs: u32,
        /// The TTL of the zone's DS RRset at the parent.
        #[arg(long, default_value_t = 86400)]
        parent_ds_ttl_secs: u32,
    },
    /// A key-encryption key (`kek_file` in authority.toml) for a key directory shared
    /// through the store: 32 random bytes written to FILE (mode 0600, never over a file).
    /// Every authority of the zone needs a copy of the same file; the store only ever holds
    /// the private keys sealed with it.
    Kek {
        /// Where to write the key; must not exist.
        file: PathBuf,
    },
    /// The keys of the key directory DIR: each key's role, state and times, and what the
    /// schedule does next.
    List {
        /// The key directory, as `dnsplan zone key init` made it.
        dir: PathBuf,
    },
    /// Start a roll now: --zsk publishes a new ZSK that signs once every cache has it (the
    /// authority also rolls the ZSK by itself at the end of its lifetime); --ksk publishes a
    /// new KSK that signs the DNSKEY RRset beside the old one, and that CDS and CDNSKEY name
    /// once every cache has it: then give the parent its DS and run `zone key ds-seen`.
    Roll {
        /// The key directory, as `dnsplan zone key init` made it.
        dir: PathBuf,
        /// Roll the zone-signing key (pre-publication).
        #[arg(long, conflicts_with = "ksk", required_unless_present = "ksk")]
        zsk: bool,
        /// Roll the key-signing key (double signature, CDS and CDNSKEY moved after the lead).
        #[arg(long)]
        ksk: bool,
    },
    /// End a KSK roll: the parent serves the new KSK's DS, so the old KSK is removed once the
    /// parent's DS TTL has passed. With --parent, refused unless that server answers the DS.
    DsSeen {
        /// The key directory, as `dnsplan zone key init` made it.
        dir: PathBuf,
        /// A name server of the parent zone (ADDRESS or ADDRESS:PORT) asked for the zone's DS.
        #[arg(long, value_name = "ADDRESS")]
        parent: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum EndpointsCommand {
    /// Every endpoint of the latest plan, who manages it, and its active plan.
    List,
    /// Publish a plan that retires NAME (it then answers NXDOMAIN). Refused while the planner
    /// manages NAME: remove it from the planner's config first.
    Retire {
        /// The endpoint's DNS name.
        name: String,
        /// Why: recorded in the plan and the audit log.
        #[arg(long)]
        reason: String,
        /// Who retires it (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum BackendCommand {
    /// Every demo backend, its kind, and whether it is up or failed.
    List,
    /// Make a demo backend fail its health checks (close its listeners).
    Fail {
        /// The backend's address, as `dnsplan backend list` shows it.
        address: IpAddr,
    },
    /// Bring it back.
    Heal {
        /// The backend's address, as `dnsplan backend list` shows it.
        address: IpAddr,
    },
}

/// `--ca-file`, `--cert-file` and `--key-file`, read.
pub struct TlsFiles {
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    /// The files' contents; `None` without `--ca-file`.
    pub fn read(
        ca: Option<&std::path::Path>,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> CliResult<Option<TlsFiles>> {
        let read = |flag: &str, path: &std::path::Path| dnsplan_common::store_config::read_pem(flag, path).map_err(CliError::Failed);
        let Some(ca) = ca else {
            return match cert {
                Some(_) => Err(CliError::Failed("--cert-file: a client certificate needs --ca-file (the control API's CA)".into())),
                None => Ok(None),
            };
        };
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((read("--cert-file", cert)?, read("--key-file", key)?)),
            _ => None,
        };
        Ok(Some(TlsFiles { ca: read("--ca-file", ca)?, identity }))
    }

    fn client_tls(&self) -> dnsplan_common::store::remote::ClientTls<'_> {
        dnsplan_common::store::remote::ClientTls {
            ca: &self.ca,
            identity: self.identity.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice())),
        }
    }
}

/// A failed command and its exit code.
#[derive(Debug)]
pub enum CliError {
    Unreachable(String),
    Unauthorized(String),
    Refused(String),
    Failed(String),
    /// The control API answered, but the store behind it (etcd) did not.
    StoreUnavailable(String),
}

/// How long the check of whether the control API answers at all may take, after a call failed.
const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

impl CliError {
    pub fn exit(self) -> ExitCode {
        let (code, message) = match self {
            CliError::Failed(m) => (1, m),
            CliError::Unreachable(m) => (3, m),
            CliError::Unauthorized(m) => (4, m),
            CliError::Refused(m) => (5, m),
            CliError::StoreUnavailable(m) => (6, m),
        };
        eprintln!("error: {message}");
        ExitCode::from(code)
    }
}

impl From<StoreError> for CliError {
    fn from(err: StoreError) -> CliError {
        match err {
            // Either the control API or the store behind it: `run` tells which.
            StoreError::Unavailable(m) => CliError::Unreachable(m),
            StoreError::Unauthorized => {
                CliError::Unauthorized("the control API refused the token; pass --token or set DNSPLAN_TOKEN to the stack's token".into())
            }
            StoreError::Forbidden(m) => CliError::Unauthorized(format!(
                "the control API refused the request: {m}; use a credential with that role (--token or DNSPLAN_TOKEN)"
            )),
            other => CliError::Refused(other.to_string()),
        }
    }
}

type CliResult<T> = Result<T, CliError>;

pub struct Client {
    store: RemoteStore,
    /// The added zone `--zone` named.
    zone: Option<dnsplan_common::DnsName>,
    http: reqwest::Client,
    control: String,
    format: Format,
    /// `--signing-key`: every plan this CLI publishes is signed with it.
    signing_key: Option<std::sync::Arc<dnsplan_common::signing::SigningKey>>,
}

impl Client {
    /// Signs every plan it publishes (rollbacks, retirements, plan files) with `key`.
    pub fn with_signing_key(self, key: Option<dnsplan_common::signing::SigningKey>) -> Client {
        Client { signing_key: key.map(std::sync::Arc::new), ..self }
    }

    pub fn signing_key(&self) -> Option<&dnsplan_common::signing::SigningKey> {
        self.signing_key.as_deref()
    }

    /// Every command that reads or changes plans or status (plans, rollback, endpoints, pause,
    /// resume, cleanup, status, verify) goes to zone `zone` of the store: one added beside the
    /// first (`zone add --managed`), or the first zone by its name.
    pub async fn for_zone(mut self, zone: &str) -> CliResult<Client> {
        let origin = dnsplan_common::DnsName::parse(zone).map_err(|e| CliError::Failed(format!("--zone {zone:?}: {e}")))?;
        let live = self.store.zones().await?.into_iter().any(|z| z.origin == origin && z.is_live());
        if live {
            self.store = self.store.zone(&origin).await?;
            self.zone = Some(origin);
            return Ok(self);
        }
        let first = self.get_json::<dnsplan_common::status::ZoneList>("/v1/zones").await?.map(|list| list.managed);
        if first.as_deref().and_then(|f| dnsplan_common::DnsName::parse(f).ok()).as_ref() == Some(&origin) {
            return Ok(self);
        }
        Err(CliError::Refused(format!("zone {origin} is not managed by this stack; `dnsplan zone list` names the zones served")))
    }

    /// The authority's status of the zone `--zone` named (`/v1/status`, or
    /// `/v1/managed/{zone}/status`), with `query` (`?limit=0`, or empty).
    fn status_path(&self, query: &str) -> String {
        match &self.zone {
            Some(zone) => format!("/v1/managed/{zone}/status{query}"),
            None => format!("/v1/status{query}"),
        }
    }

    pub fn new(control: &str, token: Option<String>, tls: Option<&TlsFiles>, format: Format) -> CliResult<Client> {
        let tls = tls.map(TlsFiles::client_tls);
        // First, so that an https:// URL without --ca-file is said as such (exit 1), not as an
        // unreachable stack.
        let builder = dnsplan_common::store::remote::client_builder(control, tls.as_ref()).map_err(CliError::Failed)?;
        let store = RemoteStore::with_tls(control, token.clone(), tls.as_ref())?;
        // Every request carries the token: reads need a credential once roles are set.
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(t) = &token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {t}"))
                .map_err(|_| CliError::Failed("the token holds characters an HTTP header cannot carry".into()))?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let http = builder
            .timeout(Duration::from_secs(10))
            .default_headers(headers)
            .build()
            .map_err(|e| CliError::Failed(format!("cannot build an HTTP client: {e}")))?;
        Ok(Client { store, zone: None, http, control: control.trim_end_matches('/').to_owned(), format, signing_key: None })
    }

    async fn get_json<T: for<'de> Deserialize<'de>>(&self, path: &str) -> CliResult<Option<T>> {
        let url = format!("{}{path}", self.control);
        let resp = self.http.get(&url).send().await.map_err(|e| CliError::Unreachable(format!("cannot reach {url}: {e}")))?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if resp.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            let body: Option<dnsplan_common::store::wire::ErrorBody> = resp.json().await.ok();
            let detail = body.map(|b| b.message).unwrap_or_else(|| "503 Service Unavailable".into());
            return Err(self.store_unavailable(format!("{url}: {detail}")));
        }
        if !resp.status().is_success() {
            let status = resp.status();
            let body: Option<dnsplan_common::store::wire::ErrorBody> = resp.json().await.ok();
            return Err(match body {
                Some(body) => CliError::from(StoreError::from(body.error)),
                None => CliError::Refused(format!("{url} answered {status}")),
            });
        }
        resp.json().await.map(Some).map_err(|e| CliError::Failed(format!("{url} sent a body this client cannot read: {e}")))
    }

    fn print_json(&self, value: &impl Serialize) -> CliResult<()> {
        let text = serde_json::to_string_pretty(value).map_err(|e| CliError::Failed(e.to_string()))?;
        crate::out!("{text}");
        Ok(())
    }
}

/// Runs `command`. A failure to reach the stack is told apart: the control API does not answer
/// (exit 3), or it answers and its store does not (exit 6).
pub async fn run(client: &Client, command: Command) -> CliResult<ExitCode> {
    match run_command(client, command).await {
        Err(CliError::Unreachable(detail)) => Err(client.why_unreachable(detail).await),
        other => other,
    }
}

async fn run_command(client: &Client, command: Command) -> CliResult<ExitCode> {
    if client.format == Format::Toml && !matches!(command, Command::Plans { command: PlansCommand::Show { .. } }) {
        return Err(CliError::Failed(
            "--output toml is for `dnsplan plans show` (the file `plans publish` reads); use text or json".into(),
        ));
    }
    match command {
        Command::Status => status(client).await,
        Command::Plans { command } => plans(client, command).await,
        Command::Rollback { to, reason, keep_automation, by, dns, wait_secs } => {
            let dns = client.dns(dns).await?;
            rollback(client, Generation(to), &reason, keep_automation, by, dns, Duration::from_secs(wait_secs)).await
        }
        Command::Endpoints { command } => endpoints(client, command).await,
        Command::Pause { reason, by } => {
            let by = by.unwrap_or_else(operator_name);
            client.store.pause(PauseState::by_operator(reason.clone(), by.clone(), now_unix_ms())).await?;
            crate::out!("automation paused by {by}: {reason}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Resume => {
            client.store.resume().await?;
            crate::out!("automation resumed");
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify { dns, wait_secs } => {
            let (servers, notes) = client.dns_all(dns).await?;
            verify(client, &servers, &notes, Duration::from_secs(wait_secs)).await
        }
        Command::Cleanup { dry_run, retain } => cleanup(client, dry_run, retain).await,
        Command::Zone { command } => zones::zone(client, command).await,
        Command::Backend { command } => backend(client, command).await,
    }
}

fn operator_name() -> String {
    std::env::var("USER").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| "operator".into())
}
