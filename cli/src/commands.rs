//! The operator commands, against a running stack's control API (`RemoteStore` and the status
//! routes). [`CliError`] maps every failure to the documented exit codes. `rollback` and
//! `verify` call `workflow`; `plans publish` calls `plan_file`. `status` prints the planner's
//! `deferred` as a HELD BACK section (at most `HELD_BACK_LINES_MAX` lines; the JSON has them
//! all), and `plans explain` of the latest plan ends with it (deferrals are relative to the
//! latest plan, and no plan records them); it also prints the authority's secondaries (a
//! summary line and each one's serial and state). `zone export` names the applied-change and
//! content-change counts it read, not a serial (the SOA serial is the authority's
//! `serial_base` plus the content-change count).

use crate::output::{self, Format, table};
use crate::plan_file::{self, addresses, diff};
use crate::workflow::{self, RollbackRequest};
use clap::Subcommand;
use dnsplan_common::status::{SecondaryState, SecondaryStatus, Status};
use dnsplan_common::store::lease::now_unix_ms;
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::{ActiveState, EndpointName, Generation, PauseState, Provenance, Store, StoreError, ValidatedPlan};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

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
    /// The served DNS zone.
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
            other => CliError::Refused(other.to_string()),
        }
    }
}

type CliResult<T> = Result<T, CliError>;

pub struct Client {
    store: RemoteStore,
    http: reqwest::Client,
    control: String,
    token: Option<String>,
    format: Format,
}

impl Client {
    pub fn new(control: &str, token: Option<String>, format: Format) -> CliResult<Client> {
        let store = RemoteStore::new(control, token.clone())?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| CliError::Failed(format!("cannot build an HTTP client: {e}")))?;
        Ok(Client { store, http, control: control.trim_end_matches('/').to_owned(), token, format })
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
            return Err(CliError::Refused(format!("{url} answered {}", resp.status())));
        }
        resp.json().await.map(Some).map_err(|e| CliError::Failed(format!("{url} sent a body this client cannot read: {e}")))
    }

    fn print_json(&self, value: &impl Serialize) -> CliResult<()> {
        let text = serde_json::to_string_pretty(value).map_err(|e| CliError::Failed(e.to_string()))?;
        crate::out!("{text}");
        Ok(())
    }
}

/// The authority's `/v1/status`, with what the CLI adds to it.
#[derive(Debug)]
struct StatusView {
    status: Status,
    /// The one-process stack's planner (`/v1/planner`), when there is one.
    planner: Option<serde_json::Value>,
    /// Endpoints of the latest plan the planner no longer manages.
    unmanaged: Vec<EndpointName>,
}

/// A secondary's line: its address, the serial it serves and whether it is current (see
/// `SecondaryView::is_current`).
fn secondary_row(s: &SecondaryStatus, served: u32) -> Vec<String> {
    let serial = s.serial.map_or_else(|| "?".to_owned(), |n| n.to_string());
    let state = match s.state(served) {
        SecondaryState::Unreachable(err) => format!("UNREACHABLE: {err}"),
        SecondaryState::Behind { notified: Some(n) } => format!("BEHIND (notified of {n})"),
        SecondaryState::Behind { notified: None } => "BEHIND".to_owned(),
        SecondaryState::Differs(what) => format!("DIFFERS {what}"),
        SecondaryState::Current => "current".to_owned(),
        SecondaryState::Unverified(Some(err)) => format!("UNVERIFIED: {err}"),
        SecondaryState::Unverified(None) => "UNVERIFIED (zone not read back yet)".to_owned(),
    };
    vec![s.address.to_string(), serial, state]
}

/// Runs `command`. A failure to reach the stack is told apart: the control API does not answer
/// (exit 3), or it answers and its store does not (exit 6).
pub async fn run(client: &Client, command: Command) -> CliResult<ExitCode> {
    match run_command(client, command).await {
        Err(CliError::Unreachable(detail)) => Err(client.why_unreachable(detail).await),
        other => other,
    }
}

/// Where DNS is asked when the stack does not say (an authority from before `dns` in its
/// status), and what a preview that asks nothing carries.
const DNS_FALLBACK: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 5353);

/// An authority whose report is older than this is gone or cut off from the store: `verify`
/// says so and does not ask it (authorities report every 5 s).
const AUTHORITY_REPORT_FRESH: Duration = Duration::from_secs(30);

/// `addr`, asked on loopback when it is a wildcard one.
fn reachable(mut addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() { std::net::Ipv4Addr::LOCALHOST.into() } else { std::net::Ipv6Addr::LOCALHOST.into() });
    }
    addr
}

impl Client {
    /// The DNS server to check answers on: `given` (`--dns`, `DNSPLAN_DNS`), else the first
    /// address the authority says it serves DNS on (a wildcard one asked on loopback).
    async fn dns(&self, given: Option<SocketAddr>) -> CliResult<SocketAddr> {
        if let Some(dns) = given {
            return Ok(dns);
        }
        let status: Option<Status> = self.get_json("/v1/status?limit=0").await?;
        Ok(status.and_then(|s| s.dns.into_iter().next()).map_or(DNS_FALLBACK, reachable))
    }

    /// The DNS servers to check answers on, and notes on authorities not asked: `given`;
    /// else every address this authority serves DNS on (a wildcard one asked on loopback)
    /// and every address the other authorities of its store report (on etcd), those that
    /// reported in the last [`AUTHORITY_REPORT_FRESH`]; else the fallback.
    async fn dns_all(&self, given: Vec<SocketAddr>) -> CliResult<(Vec<SocketAddr>, Vec<String>)> {
        if !given.is_empty() {
            return Ok((given, Vec::new()));
        }
        let status: Option<Status> = self.get_json("/v1/status?limit=0").await?;
        let Some(status) = status else { return Ok((vec![DNS_FALLBACK], Vec::new())) };
        let mut all: Vec<SocketAddr> = Vec::new();
        let mut notes = Vec::new();
        let mut add = |dns: SocketAddr| {
            if !all.contains(&dns) {
                all.push(dns);
            }
        };
        status.dns.iter().copied().map(reachable).for_each(&mut add);
        for other in status.authorities.iter().filter(|a| a.id != status.id) {
            let age = Duration::from_millis(other.age_ms);
            if age > AUTHORITY_REPORT_FRESH {
                notes.push(format!(
                    "authority {} last reported {} s ago: gone or cut off from the store, not asked",
                    other.id,
                    age.as_secs()
                ));
                continue;
            }
            for &dns in &other.dns {
                if dns.ip().is_unspecified() {
                    notes.push(format!(
                        "authority {} reports DNS on {dns}, which says nothing of where to reach it: set its dns.advertise",
                        other.id
                    ));
                } else {
                    add(dns);
                }
            }
        }
        if all.is_empty() {
            all.push(DNS_FALLBACK);
        }
        Ok((all, notes))
    }

    fn store_unavailable(&self, detail: String) -> CliError {
        CliError::StoreUnavailable(format!(
            "{detail}; the control API at {} answers, but its store does not (on etcd: is etcd up and reachable from the authority?)",
            self.control
        ))
    }

    /// Whether the control API answers at all (`GET /healthz`, which needs nothing behind it).
    async fn why_unreachable(&self, detail: String) -> CliError {
        let url = format!("{}/healthz", self.control);
        match self.http.get(&url).timeout(HEALTH_CHECK_TIMEOUT).send().await {
            Ok(resp) if resp.status().is_success() => self.store_unavailable(detail),
            _ => CliError::Unreachable(format!(
                "{detail}; the control API at {} does not answer: is the stack running (`dnsplan up`)? Use --control to point elsewhere",
                self.control
            )),
        }
    }
}

/// Unmanaged endpoints `status` names on its line; the rest are counted (there may be
/// thousands, and `dnsplan endpoints list` lists them all).
const UNMANAGED_NAMED_MAX: usize = 5;

/// The `UNMANAGED` line of `status`: a count, a few names, the commands that list and retire.
fn unmanaged_line(unmanaged: &[EndpointName]) -> String {
    let named: Vec<String> = unmanaged.iter().take(UNMANAGED_NAMED_MAX).map(ToString::to_string).collect();
    let more = unmanaged.len().saturating_sub(named.len());
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    format!(
        "UNMANAGED     {} endpoint(s) not in the planner's config, kept as served: {}{more} (all: `dnsplan endpoints list`; retire with \
         `dnsplan endpoints retire NAME --reason TEXT`)",
        unmanaged.len(),
        named.join(", ")
    )
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
            client.store.pause(PauseState { reason: reason.clone(), by: by.clone(), since_unix_ms: now_unix_ms() }).await?;
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
        Command::Zone { command: ZoneCommand::Export } => zone_export(client).await,
        Command::Backend { command } => backend(client, command).await,
    }
}

fn operator_name() -> String {
    std::env::var("USER").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| "operator".into())
}

async fn status(client: &Client) -> CliResult<ExitCode> {
    let status: Status = client.get_json("/v1/status").await?.ok_or_else(|| CliError::Refused("no /v1/status at this address".into()))?;
    let planner = client.get_json("/v1/planner").await.ok().flatten();
    let unmanaged = match status.latest {
        latest if latest.is_none() => Vec::new(),
        latest => workflow::unmanaged(&client.store, client.store.plan(latest).await?.plan()).await?.into_iter().collect(),
    };
    let view = StatusView { status, planner, unmanaged };
    if client.format == Format::Json {
        // The authority's status as it is, with the CLI's additions beside its keys.
        let mut json = serde_json::to_value(&view.status).map_err(|e| CliError::Refused(format!("status as JSON: {e}")))?;
        if let Some(map) = json.as_object_mut() {
            map.insert("planner".into(), view.planner.clone().unwrap_or(serde_json::Value::Null));
            map.insert("unmanaged".into(), serde_json::json!(view.unmanaged));
        }
        client.print_json(&json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let (status, planner_view) = (&view.status, &view.planner);
    crate::out!("latest plan   {}", status.latest);
    if !status.dns.is_empty() {
        crate::out!("dns           {}", status.dns.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "));
    }
    for (i, a) in status.authorities.iter().enumerate() {
        let label = if i == 0 { format!("authorities   {} reporting:", status.authorities.len()) } else { " ".repeat(27) };
        let dns = a.dns.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
        let age = Duration::from_millis(a.age_ms).as_secs();
        crate::out!("{label} {} DNS {dns} serial {} ({age} s ago)", a.id, a.serial);
    }
    let automation = match &status.paused {
        None => "running".to_owned(),
        Some(p) if p.by.starts_with("planner:") => format!("BREAKER TRIPPED ({}) {}: {}", p.by, output::ago(p.since_unix_ms), p.reason),
        Some(p) => format!("PAUSED by {} {}: {}", p.by, output::ago(p.since_unix_ms), p.reason),
    };
    crate::out!("automation    {automation}");
    crate::out!("serial        {}", status.serial);
    if !status.secondaries.is_empty() {
        let behind = status.secondaries.iter().filter(|s| s.behind).count();
        let other = status.secondaries.iter().filter(|s| !s.behind && !s.is_current(status.serial)).count();
        let summary = match (behind, other) {
            (0, 0) => "all current".to_owned(),
            (0, n) => format!("{n} NOT KNOWN CURRENT (zone differs or not read back)"),
            (b, 0) => format!("{b} BEHIND"),
            (b, n) => format!("{b} BEHIND, {n} NOT KNOWN CURRENT"),
        };
        crate::out!("secondaries   {} notified, {summary}", status.secondaries.len());
    }
    if let Some(p) = planner_view {
        let active = if p["active"].as_bool() == Some(true) { "active" } else { "standby" };
        crate::out!("planner       {} ({active}): {}", p["id"].as_str().unwrap_or("?"), p["last_decision"].as_str().unwrap_or(""));
    }
    let held = held_back(planner_view.as_ref());
    if !held.is_empty() {
        crate::out!("HELD BACK     {} decision(s) the planner's rules defer:", held.len());
        print_held_back(&held);
    }
    if !view.unmanaged.is_empty() {
        crate::out!("{}", unmanaged_line(&view.unmanaged));
    }
    crate::out!();
    let rows: Vec<Vec<String>> = status
        .endpoints
        .iter()
        .map(|(name, r)| {
            let served = match &r.state {
                ActiveState::Serving(e) => addresses(e),
                ActiveState::Retired => "(retired)".into(),
            };
            vec![name.to_string(), r.generation.to_string(), served]
        })
        .collect();
    crate::out_raw!("{}", table(&["ENDPOINT", "PLAN", "ADDRESSES (zone, weight)"], &rows));
    if status.endpoints_more {
        crate::out!("... {} endpoints in all; `dnsplan endpoints list` shows every one", status.managed_endpoints);
    }
    crate::out!();
    let rows: Vec<Vec<String>> = status
        .heartbeats
        .iter()
        .map(|h| {
            vec![
                h.enactor_id.clone(),
                h.zone.to_string(),
                h.last_applied.to_string(),
                h.lag().to_string(),
                h.state.clone(),
                output::ago(h.at_unix_ms),
            ]
        })
        .collect();
    crate::out_raw!("{}", table(&["ENACTOR", "ZONE", "APPLIED", "LAG", "STATE", "SEEN"], &rows));
    if !status.secondaries.is_empty() {
        crate::out!();
        let rows: Vec<Vec<String>> = status.secondaries.iter().map(|s| secondary_row(s, status.serial)).collect();
        crate::out_raw!("{}", table(&["SECONDARY", "SERIAL", "STATE"], &rows));
    }
    Ok(ExitCode::SUCCESS)
}

/// Most held-back decisions `status` and `plans explain` print (a mass failure can hold one
/// per target); `--output json` has every one.
const HELD_BACK_LINES_MAX: usize = 20;

/// One of the planner's `deferred` decisions, as `/v1/planner` serves it.
#[derive(Debug, Deserialize)]
struct HeldBack {
    rule: String,
    endpoint: String,
    #[serde(default)]
    target: Option<String>,
    detail: String,
    #[serde(default)]
    reconsider_at_unix_ms: Option<u64>,
}

/// The planner status's `deferred` list; empty without a planner or from an older one.
fn held_back(planner: Option<&serde_json::Value>) -> Vec<HeldBack> {
    planner.and_then(|p| p.get("deferred")).and_then(|d| serde_json::from_value(d.clone()).ok()).unwrap_or_default()
}

/// One line each: rule, endpoint and target, when it is reconsidered, and the rule's account.
fn print_held_back(held: &[HeldBack]) {
    for h in held.iter().take(HELD_BACK_LINES_MAX) {
        let target = h.target.as_deref().map(|t| format!(" {t}")).unwrap_or_default();
        let when = match h.reconsider_at_unix_ms {
            Some(at) => format!("reconsidered {}", output::until(at)),
            None => "waits for a change".to_owned(),
        };
        crate::out!("  {:<18}  {}{target}  {when}: {}", h.rule, h.endpoint, h.detail);
    }
    if held.len() > HELD_BACK_LINES_MAX {
        crate::out!("  ... and {} more (`--output json` lists every one)", held.len() - HELD_BACK_LINES_MAX);
    }
}

async fn endpoints(client: &Client, command: EndpointsCommand) -> CliResult<ExitCode> {
    match command {
        EndpointsCommand::List => {
            let latest = client.store.latest().await?;
            if latest.is_none() {
                crate::out!("no plan published yet");
                return Ok(ExitCode::SUCCESS);
            }
            let plan = client.store.plan(latest).await?.into_plan();
            let unmanaged = workflow::unmanaged(&client.store, &plan).await?;
            let active = client.store.active_all().await?;
            let rows: Vec<(String, &'static str, String, String)> = plan
                .endpoints
                .iter()
                .map(|(name, records)| {
                    let who = if unmanaged.contains(name) { "UNMANAGED (kept as served)" } else { "planner" };
                    let at = active.endpoints.get(name).map_or("-".to_owned(), |r| r.generation.to_string());
                    (name.to_string(), who, at, addresses(records))
                })
                .collect();
            if client.format == Format::Json {
                let out: Vec<_> = rows
                    .iter()
                    .map(|(n, who, at, _)| serde_json::json!({"endpoint": n, "managed": *who == "planner", "active": at}))
                    .collect();
                client.print_json(&serde_json::json!({"latest": latest, "endpoints": out}))?;
            } else {
                let table_rows: Vec<Vec<String>> =
                    rows.iter().map(|(n, who, at, a)| vec![n.clone(), (*who).to_owned(), at.clone(), a.clone()]).collect();
                crate::out_raw!("{}", table(&["ENDPOINT", "MANAGED BY", "ACTIVE", "ADDRESSES (zone, weight)"], &table_rows));
            }
            Ok(ExitCode::SUCCESS)
        }
        EndpointsCommand::Retire { name, reason, by } => {
            let name = EndpointName::parse(&name).map_err(|e| CliError::Refused(format!("not an endpoint name: {e}")))?;
            let by = by.unwrap_or_else(operator_name);
            let plan = workflow::publish_retirement(&client.store, &name, &reason, &by).await.map_err(|e| match e {
                workflow::RetireError::Store(err) => CliError::from(err),
                other => CliError::Refused(other.to_string()),
            })?;
            crate::out!("published plan {}: retires {name} ({reason}); it answers NXDOMAIN once enacted", plan.generation());
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn plan_or_explain(client: &Client, generation: Generation) -> CliResult<ValidatedPlan> {
    client.store.plan(generation).await.map_err(|e| match e {
        StoreError::PlanNotFound(_) | StoreError::Pruned { .. } => {
            CliError::Refused(format!("plan {generation} is not stored (never published, or cleaned up); see `dnsplan plans list`"))
        }
        other => other.into(),
    })
}

async fn plans(client: &Client, command: PlansCommand) -> CliResult<ExitCode> {
    match command {
        PlansCommand::List { limit } => {
            let latest = client.store.latest().await?;
            let from = Generation(latest.0.saturating_sub(limit.max(1) as u64 - 1).max(1));
            let list = client.store.list(from, limit).await?;
            if client.format == Format::Json {
                client.print_json(&list)?;
                return Ok(ExitCode::SUCCESS);
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|p| {
                    let rollback = p.rollback_of.map(|g| format!(" (rollback of {g})")).unwrap_or_default();
                    vec![
                        p.generation.to_string(),
                        output::ago(p.created_at_unix_ms),
                        p.author.to_string(),
                        p.endpoint_count.to_string(),
                        format!("{}{rollback}", p.reason),
                    ]
                })
                .collect();
            crate::out_raw!("{}", table(&["PLAN", "CREATED", "AUTHOR", "ENDPOINTS", "REASON"], &rows));
        }
        PlansCommand::Show { generation } => {
            let plan = plan_or_explain(client, Generation(generation)).await?;
            if client.format == Format::Json {
                client.print_json(plan.plan())?;
                return Ok(ExitCode::SUCCESS);
            }
            if client.format == Format::Toml {
                crate::out_raw!("{}", plan_file::to_toml(plan.plan()).map_err(CliError::Failed)?);
                return Ok(ExitCode::SUCCESS);
            }
            let p = plan.plan();
            crate::out!("plan {} (parent {}) by {} {}", p.generation, p.parent_generation, p.author, output::ago(p.created_at_unix_ms));
            crate::out!("reason: {}", p.reason);
            if let Some(g) = p.rollback_of {
                crate::out!("rollback of plan {g}");
            }
            crate::out!();
            let rows: Vec<Vec<String>> =
                p.endpoints.iter().map(|(n, e)| vec![n.to_string(), e.ttl_secs.to_string(), addresses(e)]).collect();
            crate::out_raw!("{}", table(&["ENDPOINT", "TTL", "TARGETS (zone, weight)"], &rows));
            for name in &p.retired {
                crate::out!("retired: {name}");
            }
        }
        PlansCommand::Diff { from, to } => {
            let (a, b) = (plan_or_explain(client, Generation(from)).await?, plan_or_explain(client, Generation(to)).await?);
            let lines = diff(a.plan(), b.plan());
            if client.format == Format::Json {
                client.print_json(&lines.iter().map(|(s, t)| format!("{s} {t}")).collect::<Vec<_>>())?;
                return Ok(ExitCode::SUCCESS);
            }
            crate::out!("plan {from} -> plan {to}");
            if lines.is_empty() {
                crate::out!("(no differences)");
            }
            for (sign, text) in lines {
                crate::out!("{}", output::diff_line(sign, &text));
            }
        }
        PlansCommand::Publish { file, reason, yes, keep_automation, by, dns, wait_secs } => {
            let dns = if yes { client.dns(dns).await? } else { dns.unwrap_or(DNS_FALLBACK) };
            return publish_file(client, &file, &reason, yes, keep_automation, by, dns, Duration::from_secs(wait_secs)).await;
        }
        PlansCommand::Explain { generation } => {
            let plan = plan_or_explain(client, Generation(generation)).await?;
            let p = plan.plan();
            // What the planner holds back now is relative to the latest plan, so it is shown
            // with that one: it is no part of any plan (a deferral often publishes nothing).
            let planner = if p.generation == client.store.latest().await? {
                client.get_json::<serde_json::Value>("/v1/planner").await.ok().flatten()
            } else {
                None
            };
            if client.format == Format::Json {
                let mut out = serde_json::json!({"generation": p.generation, "reason": p.reason, "author": p.author.to_string(), "provenance": p.provenance});
                if let Some(deferred) = planner.as_ref().and_then(|p| p.get("deferred")) {
                    out["deferred"] = deferred.clone();
                }
                client.print_json(&out)?;
                return Ok(ExitCode::SUCCESS);
            }
            crate::out!("plan {} by {}: {}", p.generation, p.author, p.reason);
            let mut by_endpoint: BTreeMap<&EndpointName, Vec<&Provenance>> = BTreeMap::new();
            for entry in &p.provenance {
                by_endpoint.entry(&entry.endpoint).or_default().push(entry);
            }
            for (name, entries) in by_endpoint {
                crate::out!("{name}");
                for e in entries {
                    crate::out!("  {:<16} {}", e.rule, e.detail);
                }
            }
            let held = held_back(planner.as_ref());
            if !held.is_empty() {
                crate::out!("held back now against this plan (the planner's last decision; not part of the plan):");
                print_held_back(&held);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn rollback(
    client: &Client,
    to: Generation,
    reason: &str,
    keep_automation: bool,
    by: Option<String>,
    dns: SocketAddr,
    wait: Duration,
) -> CliResult<ExitCode> {
    // A missing plan is a clear error before anything is paused.
    plan_or_explain(client, to).await?;
    let request = RollbackRequest { to, reason: reason.to_owned(), by: by.unwrap_or_else(operator_name), keep_automation };
    let plan = workflow::publish_rollback(&client.store, &request).await?;
    if !keep_automation {
        crate::out!("automation paused (resume with `dnsplan resume`)");
    }
    let g = plan.generation();
    crate::out!("published plan {g} with the content of plan {to}");
    wait_enacted_and_served(client, &plan, dns, wait).await
}

/// Waits until `plan` is enacted and served on `dns`, saying how it goes.
async fn wait_enacted_and_served(client: &Client, plan: &ValidatedPlan, dns: SocketAddr, wait: Duration) -> CliResult<ExitCode> {
    let g = plan.generation();
    let deadline = Instant::now() + wait;
    let enacted = workflow::wait_enacted(&client.store, plan.plan(), deadline, |behind| {
        crate::out!("waiting: {} endpoint(s) do not serve plan {g}'s content yet, e.g. {}", behind.len(), behind[0].endpoint);
    })
    .await?;
    if let Err(behind) = enacted {
        return Err(CliError::Failed(format!(
            "not enacted within {wait:?}: {} endpoint(s) behind, e.g. {}",
            behind.len(),
            behind[0].endpoint
        )));
    }
    crate::out!("enacted: all {} endpoints serve plan {g}'s content", plan.plan().endpoints.len());
    if let Err(problem) = workflow::wait_served(dns, plan.plan(), deadline).await {
        return Err(CliError::Failed(format!("enacted but not served within {wait:?}: {problem}")));
    }
    crate::out!("served: every endpoint answers with plan {g}'s addresses on {dns}");
    Ok(ExitCode::SUCCESS)
}

/// `dnsplan plans publish FILE`: preview, and with `yes` publish and wait.
#[allow(clippy::too_many_arguments)]
async fn publish_file(
    client: &Client,
    file: &Path,
    reason: &str,
    yes: bool,
    keep_automation: bool,
    by: Option<String>,
    dns: SocketAddr,
    wait: Duration,
) -> CliResult<ExitCode> {
    let text = if file == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).map_err(|e| CliError::Failed(format!("cannot read the plan from standard input: {e}")))?
    } else {
        std::fs::read_to_string(file).map_err(|e| CliError::Failed(format!("cannot read {}: {e}", file.display())))?
    };
    let parsed = plan_file::PlanFile::parse(&text).map_err(|e| CliError::Refused(format!("{} is not a plan file: {e}", file.display())))?;
    let by = by.unwrap_or_else(operator_name);
    let mut preview = plan_file::preview(&client.store, parsed, reason, &by).await?;
    if yes && preview.refused.is_none() {
        plan_file::publish(&client.store, &mut preview, &by, keep_automation).await.map_err(|err| match err {
            StoreError::Conflict { latest, .. } => CliError::Refused(format!(
                "plan {latest} was published while this one was being checked; run the command again to see the changes against it"
            )),
            other => CliError::from(other),
        })?;
    }
    if client.format == Format::Json {
        client.print_json(&preview)?;
    } else {
        print_preview(&preview, keep_automation);
    }
    if let Some(why) = &preview.refused {
        return Err(CliError::Refused(format!("not published: {why}")));
    }
    match (&preview.plan, preview.published) {
        (Some(plan), true) => wait_enacted_and_served(client, plan, dns, wait).await,
        _ => Ok(ExitCode::SUCCESS),
    }
}

fn print_preview(preview: &plan_file::Preview, keep_automation: bool) {
    let based = preview.based_on.map(|g| format!(" (the file was made from plan {g})")).unwrap_or_default();
    crate::out!("plan {} would follow plan {}{based}", preview.generation, preview.latest);
    crate::out!("changes against plan {}:", preview.latest);
    if preview.changes.is_empty() {
        crate::out!("  (none)");
    }
    for line in &preview.changes {
        let (sign, text) = line.split_at(1);
        crate::out!("  {}", output::diff_line(sign.chars().next().unwrap_or(' '), text.trim_start()));
    }
    if !preview.kept.is_empty() {
        crate::out!("{} endpoint(s) not in the file are kept as plan {} serves them", preview.kept.len(), preview.latest);
    }
    crate::out!(
        "guards: {} of {} endpoints change (planner's breaker: {:.0}%); largest weight removed: {} (enactors' limit: {:.0}%, not applied to an operator's plan)",
        preview.endpoints_changed,
        preview.endpoints_total,
        preview.breaker_fraction * 100.0,
        preview.removals.first().map_or("none".to_owned(), |r| format!("{:.0}% of {}", r.fraction * 100.0, r.endpoint)),
        preview.removal_limit * 100.0,
    );
    for warning in &preview.warnings {
        crate::out!("warning: {warning}");
    }
    match (&preview.refused, preview.published) {
        (Some(_), _) => {}
        (None, true) => {
            if !keep_automation {
                crate::out!("automation paused (resume with `dnsplan resume`)");
            }
            crate::out!("published plan {}", preview.generation);
        }
        (None, false) => crate::out!("not published: run again with --yes to publish plan {}", preview.generation),
    }
}

/// Checks every serving endpoint of the active state on each of `servers`; with more than one,
/// says which lags.
async fn verify(client: &Client, servers: &[SocketAddr], notes: &[String], wait: Duration) -> CliResult<ExitCode> {
    let latest = client.store.latest().await?;
    let (behind, enactors) = if latest.is_none() {
        (Vec::new(), Vec::new())
    } else {
        let plan = client.store.plan(latest).await?;
        let deadline = Instant::now() + wait;
        let behind = workflow::wait_enacted(&client.store, plan.plan(), deadline, |_| {}).await?.err().unwrap_or_default();
        (behind, workflow::enactors_behind(latest, &client.store.heartbeats().await?))
    };
    let active = client.store.active_all().await?;
    let mut rows = Vec::new();
    let mut failed = 0;
    // Per server, the endpoints it does not serve as active.
    let mut lagging: Vec<usize> = vec![0; servers.len()];
    for (name, record) in &active.endpoints {
        let ActiveState::Serving(endpoint) = &record.state else { continue };
        let mut problems = Vec::new();
        for (i, &dns) in servers.iter().enumerate() {
            if let Err(problem) = workflow::check_served(dns, name, endpoint).await {
                lagging[i] += 1;
                problems.push(if servers.len() > 1 { format!("on {dns}: {problem}") } else { problem });
            }
        }
        let result = if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) };
        if result.is_err() {
            failed += 1;
        }
        rows.push((name.to_string(), record.generation, result));
    }
    let ok = failed == 0 && behind.is_empty();
    if client.format == Format::Json {
        let endpoints: Vec<_> = rows
            .iter()
            .map(|(n, g, r)| serde_json::json!({"endpoint": n, "generation": g, "ok": r.is_ok(), "problem": r.as_ref().err()}))
            .collect();
        let dns: Vec<_> = servers
            .iter()
            .zip(&lagging)
            .map(|(dns, lag)| serde_json::json!({"dns": dns, "ok": *lag == 0, "endpoints_not_served": lag}))
            .collect();
        client.print_json(&serde_json::json!({
            "latest": latest,
            "ok": ok,
            "dns": dns,
            "notes": notes,
            "endpoints": endpoints,
            "endpoints_behind": behind,
            "enactors_behind": enactors,
        }))?;
    } else {
        let table_rows: Vec<Vec<String>> = rows
            .iter()
            .map(|(n, g, r)| {
                vec![
                    n.clone(),
                    g.to_string(),
                    match r {
                        Ok(()) => "ok".into(),
                        Err(p) => format!("MISMATCH: {p}"),
                    },
                ]
            })
            .collect();
        crate::out_raw!("{}", table(&["ENDPOINT", "PLAN", "DNS"], &table_rows));
        crate::out!("{} of {} endpoints served as active", rows.len() - failed, rows.len());
        if servers.len() > 1 {
            for (dns, lag) in servers.iter().zip(&lagging) {
                match lag {
                    0 => crate::out!("  DNS {dns}: serves every endpoint as active"),
                    n => crate::out!("  DNS {dns}: LAGS: {n} endpoint(s) not served as active"),
                }
            }
        }
        for note in notes {
            crate::out!("  {note}");
        }
        if behind.is_empty() {
            crate::out!("latest plan {latest}: its content is served on every endpoint");
        } else {
            crate::out!("latest plan {latest}: NOT served within {wait:?} on {} endpoint(s):", behind.len());
            for b in &behind {
                let at = b.active.map_or("never applied".to_owned(), |g| format!("at plan {g}"));
                crate::out!("  {} {at}, {} plan(s) behind", b.endpoint, b.plans_behind);
            }
        }
        for e in &enactors {
            crate::out!("enactor {} last applied plan {} ({} plan(s) behind, {})", e.enactor_id, e.last_applied, e.plans_behind, e.state);
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

async fn cleanup(client: &Client, dry_run: bool, retain: u64) -> CliResult<ExitCode> {
    let decision = if dry_run { client.store.cleanup_preview(retain).await? } else { client.store.cleanup(retain).await? };
    if client.format == Format::Json {
        client.print_json(&decision)?;
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if dry_run { "would delete" } else { "deleted" };
    match decision.deleted() {
        Some((first, last)) => crate::out!("{verb} plans {first}..={last}"),
        None => crate::out!("nothing to delete"),
    }
    if let Some((g, name)) = &decision.oldest_active {
        crate::out!("oldest active plan: {g} (at {name}); it and every newer plan are kept");
    }
    if let Some((first, last)) = decision.kept_for_rollback {
        crate::out!("kept for rollback: {first}..={last}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn zone_export(client: &Client) -> CliResult<ExitCode> {
    let active = client.store.active_all().await?;
    let latest = client.store.latest().await?;
    // The SOA serial is the authority's (`serial_base` + content changes); this read is the
    // store's, so it names the counts it was taken at.
    crate::out!(
        "; managed records served by dnsplan after {} applied changes, {} of content (plan {latest}; the SOA serial is serial_base + {})",
        active.applied_changes,
        active.content_changes,
        active.content_changes
    );
    crate::out!("; weights as comments; the static records (SOA, NS, master file) are in the authority's config");
    for (name, record) in &active.endpoints {
        let ActiveState::Serving(e) = &record.state else { continue };
        for t in &e.targets {
            let rtype = if t.address.is_ipv4() { "A" } else { "AAAA" };
            crate::out!("{name} {} IN {rtype} {} ; zone {} weight {} plan {}", e.ttl_secs, t.address, t.zone, t.weight, record.generation);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn backend(client: &Client, command: BackendCommand) -> CliResult<ExitCode> {
    let (address, action) = match command {
        BackendCommand::List => {
            let list: serde_json::Value = client
                .get_json("/v1/demo/backends")
                .await?
                .ok_or_else(|| CliError::Refused("this stack has no demo backends (`dnsplan up` has)".into()))?;
            if client.format == Format::Json {
                client.print_json(&list)?;
            } else {
                let rows: Vec<Vec<String>> = list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|b| {
                        vec![
                            b["address"].as_str().unwrap_or("?").to_owned(),
                            b["kind"].as_str().unwrap_or("?").to_owned(),
                            if b["healthy"].as_bool() == Some(true) { "up".into() } else { "FAILED".into() },
                        ]
                    })
                    .collect();
                crate::out_raw!("{}", table(&["BACKEND", "KIND", "STATE"], &rows));
            }
            return Ok(ExitCode::SUCCESS);
        }
        BackendCommand::Fail { address } => (address, "fail"),
        BackendCommand::Heal { address } => (address, "heal"),
    };
    let url = format!("{}/v1/demo/backends/{address}/{action}", client.control);
    let mut req = client.http.post(&url);
    if let Some(t) = &client.token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.map_err(|e| CliError::Unreachable(format!("cannot reach {url}: {e}")))?;
    match resp.status().as_u16() {
        200 => {
            crate::out!("{address}: {}", if action == "fail" { "failed (listeners closed)" } else { "healed (listening again)" });
            Ok(ExitCode::SUCCESS)
        }
        401 => Err(CliError::Unauthorized("the stack refused the token; pass --token or set DNSPLAN_TOKEN".into())),
        404 => Err(CliError::Refused(format!("no demo backend on {address} (see `dnsplan backend list`)"))),
        other => Err(CliError::Refused(format!("{url} answered {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Teeth: with every name joined (as status did), the line for 2,002 names is 44,209 bytes
    /// and this fails.
    #[test]
    fn the_unmanaged_line_stays_short_however_many_there_are() {
        let names: Vec<EndpointName> = (0..2_002).map(|i| EndpointName::parse(&format!("e{i:05}.example.test.")).expect("name")).collect();
        let line = unmanaged_line(&names);
        assert!(line.len() < 400, "{} bytes", line.len());
        assert!(line.contains("2002 endpoint(s)") && line.contains("e00000.example.test.") && line.contains("and 1997 more"), "{line}");
        assert!(line.contains("dnsplan endpoints list"), "{line}");
        let one = unmanaged_line(&names[..1]);
        assert!(!one.contains("more"), "{one}");
    }

    /// The secondaries of `/v1/status` read into the status table: current (its zone read back
    /// and equal at our serial), behind (with the serial it was told of), unreachable (with
    /// why), at our serial but not known equal (not read back, differing, unreadable); and the
    /// status the authority writes is the one the CLI reads.
    ///
    /// Teeth: with `is_current` looking at the serial alone (`!behind`), the row of 5304 (at
    /// our serial, its zone never read back) read "current" and the test failed there.
    #[test]
    fn secondaries_read_and_say_their_state() {
        let secondary = |port: u16, notified: Option<u32>, serial: Option<u32>, behind: bool| SecondaryStatus {
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            notified_serial: notified,
            serial,
            behind,
            last_error: None,
            content_equal_serial: None,
            content_differs: None,
            content_error: None,
        };
        let secondaries = vec![
            SecondaryStatus { content_equal_serial: Some(12), ..secondary(5301, Some(12), Some(12), false) },
            secondary(5302, Some(12), Some(11), true),
            SecondaryStatus { last_error: Some("connection refused".into()), ..secondary(5303, None, None, true) },
            SecondaryStatus { content_equal_serial: Some(11), ..secondary(5304, Some(12), Some(12), false) },
            SecondaryStatus {
                content_differs: Some("at serial 12: 1 of our records missing, 1 not ours".into()),
                ..secondary(5305, Some(12), Some(12), false)
            },
            SecondaryStatus { content_error: Some("the AXFR was answered REFUSED".into()), ..secondary(5306, Some(12), Some(12), false) },
        ];
        let status = Status {
            latest: Generation(3),
            paused: None,
            serial: 12,
            applied_changes: 12,
            managed_endpoints: 0,
            dns: Vec::new(),
            id: String::new(),
            authorities: Vec::new(),
            heartbeats: Vec::new(),
            endpoints: BTreeMap::new(),
            endpoints_more: false,
            secondaries,
        };
        // Through JSON, as the CLI reads it from the authority.
        let read: Status = serde_json::from_value(serde_json::to_value(&status).expect("writes")).expect("reads");
        assert_eq!(read, status);
        let rows: Vec<Vec<String>> = read.secondaries.iter().map(|s| secondary_row(s, read.serial)).collect();
        assert_eq!(rows[0], ["127.0.0.1:5301", "12", "current"]);
        assert_eq!(rows[1], ["127.0.0.1:5302", "11", "BEHIND (notified of 12)"]);
        assert_eq!(rows[2], ["127.0.0.1:5303", "?", "UNREACHABLE: connection refused"]);
        // At our serial, but its zone not found equal there: not current.
        assert_eq!(rows[3], ["127.0.0.1:5304", "12", "UNVERIFIED (zone not read back yet)"]);
        assert_eq!(rows[4], ["127.0.0.1:5305", "12", "DIFFERS at serial 12: 1 of our records missing, 1 not ours"]);
        assert_eq!(rows[5], ["127.0.0.1:5306", "12", "UNVERIFIED: the AXFR was answered REFUSED"]);
        // A status with a field this build does not know is refused, not half read.
        let mut drifted = serde_json::to_value(&status).expect("writes");
        drifted["renamed"] = serde_json::json!(1);
        assert!(serde_json::from_value::<Status>(drifted).is_err());
    }
}
