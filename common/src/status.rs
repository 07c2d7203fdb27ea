//! The authority's `/v1/status` and the planner's (`PlannerStatus`, also at `/v1/planner`):
//! one type each for the daemon that serves it and the CLI and status page that read it, so
//! that neither drifts from the other (a field renamed on one side is a compile error, not a
//! value the other silently reads as its default).

use crate::generation::Generation;
use crate::names::EndpointName;
use crate::store::{ActiveRecord, AuthorityReport, Heartbeat, Lease, PauseState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

/// What `/v1/status` reports: a summary whose size does not grow with the zone. The serving
/// figures come from the snapshot the authority serves; the store is read only for the small
/// records and one page of endpoints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Status {
    pub latest: Generation,
    pub paused: Option<PauseState>,
    pub serial: u32,
    pub applied_changes: u64,
    pub managed_endpoints: usize,
    /// Where this authority serves DNS (UDP and TCP each), so that clients ask it there.
    pub dns: Vec<SocketAddr>,
    /// This authority's id among `authorities`.
    pub id: String,
    /// Every authority's last report on the store (on etcd; none on the embedded store), with
    /// its age by this authority's clock.
    pub authorities: Vec<AuthorityStatus>,
    pub heartbeats: Vec<Heartbeat>,
    /// The first `limit` endpoints after `after`, in name order.
    pub endpoints: BTreeMap<EndpointName, ActiveRecord>,
    /// More endpoints follow the last one listed (page on with `after`).
    pub endpoints_more: bool,
    /// Each secondary notified (`[[dns.transfer.secondaries]]` with `notify`): the serial it
    /// was last seen serving, whether it is behind, and whether its zone was found equal.
    pub secondaries: Vec<SecondaryStatus>,
}

/// An authority's report as `/v1/status` lists it, with its age.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorityStatus {
    pub id: String,
    pub dns: Vec<SocketAddr>,
    pub serial: u32,
    pub applied_changes: u64,
    pub at_unix_ms: u64,
    /// How long before the status was read the report was written, by the clock of the
    /// authority that read it.
    pub age_ms: u64,
}

impl AuthorityStatus {
    /// `report` as read at `now_unix_ms`.
    pub fn of(report: AuthorityReport, now_unix_ms: u64) -> AuthorityStatus {
        AuthorityStatus {
            age_ms: now_unix_ms.saturating_sub(report.at_unix_ms),
            id: report.id,
            dns: report.dns,
            serial: report.serial,
            applied_changes: report.applied_changes,
            at_unix_ms: report.at_unix_ms,
        }
    }
}

/// What is known of one secondary the authority notifies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecondaryStatus {
    pub address: SocketAddr,
    /// The last serial it acknowledged a NOTIFY for.
    pub notified_serial: Option<u32>,
    /// The serial its SOA showed when last asked.
    pub serial: Option<u32>,
    /// Its serial is older (RFC 1982) than the one served here, or unknown.
    pub behind: bool,
    /// Why the last NOTIFY or SOA query failed, until one succeeds.
    pub last_error: Option<String>,
    /// The serial at which its whole zone, read by AXFR, was last found equal to ours. The
    /// secondary is current only when this is the serial served here.
    pub content_equal_serial: Option<u32>,
    /// What the last check found different (serial, records missing and extra, a few of
    /// them), until a check finds the zone equal.
    pub content_differs: Option<String>,
    /// Why the last check could not compare (the AXFR refused, a timeout), until one does.
    pub content_error: Option<String>,
}

/// Where a secondary stands, the first that applies, for the CLI and the status page to show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecondaryState<'a> {
    /// The last NOTIFY or SOA query failed, why.
    Unreachable(&'a str),
    /// Its serial is older than the one served, or unknown; the serial it was notified of.
    Behind { notified: Option<u32> },
    /// Its zone was read back and found different: what differs.
    Differs(&'a str),
    /// At the serial served, with its zone found equal there.
    Current,
    /// At the serial served, its zone not (yet) found equal there: why it could not be read.
    Unverified(Option<&'a str>),
}

impl SecondaryStatus {
    /// Known to serve exactly the zone served here at `served`: its serial is ours and its
    /// zone was found equal at that serial (the serial alone does not say which records a
    /// secondary holds).
    pub fn is_current(&self, served: u32) -> bool {
        self.last_error.is_none() && !self.behind && self.serial == Some(served) && self.content_equal_serial == Some(served)
    }

    /// Where it stands against the serial served here.
    pub fn state(&self, served: u32) -> SecondaryState<'_> {
        match (&self.last_error, self.behind, &self.content_differs) {
            (Some(err), _, _) => SecondaryState::Unreachable(err),
            (None, true, _) => SecondaryState::Behind { notified: self.notified_serial },
            (None, false, Some(what)) => SecondaryState::Differs(what),
            _ if self.is_current(served) => SecondaryState::Current,
            _ => SecondaryState::Unverified(self.content_error.as_deref()),
        }
    }
}

/// The planner's status, as its `/v1/status` and `/v1/planner` serve it and the CLI and the
/// status page read it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannerStatus {
    pub id: String,
    pub active: bool,
    pub lease: Option<Lease>,
    pub paused: Option<PauseState>,
    pub last_decision: String,
    pub last_published: Option<Generation>,
    pub zone_shifted: Option<String>,
    /// What the last decision's rules held back, with the numbers and when each is
    /// reconsidered (see [`Deferred`]).
    pub deferred: Vec<Deferred>,
    pub targets: Vec<TargetStatus>,
}

/// A target's health in [`PlannerStatus`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetStatus {
    pub endpoint: EndpointName,
    pub address: IpAddr,
    pub zone: String,
    pub health: Health,
}

/// A target's health as the checks see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Up,
    Down,
    /// No verdict yet (just started): keep what the previous plan said.
    Unknown,
}

/// The rule that held a decision back. Serialised as its stable name ([`DeferredRule::as_str`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeferredRule {
    /// `removal_fraction_per_plan`: this plan already removes as much as one plan may.
    RemovalPerPlan,
    /// `removal_fraction_per_window`: the window's removals leave too little room.
    RemovalPerWindow,
    /// `capacity_headroom`: an impaired zone is not shifted away, the others cannot carry it.
    Capacity,
    /// An impaired zone is not shifted away while another zone is.
    ZoneOneAtATime,
    /// `zone_recovery_dwell_secs`: a shifted zone looks healthy but has not been for long enough.
    ZoneRecovery,
    /// `fail_open_below`: too few healthy targets, so dead ones are served too.
    FailOpen,
    /// `breaker_endpoint_fraction`: the plan changed too many endpoints and was not published.
    Breaker,
}

impl DeferredRule {
    /// Every rule, for metrics that must exist at 0.
    pub const ALL: [DeferredRule; 7] = [
        DeferredRule::RemovalPerPlan,
        DeferredRule::RemovalPerWindow,
        DeferredRule::Capacity,
        DeferredRule::ZoneOneAtATime,
        DeferredRule::ZoneRecovery,
        DeferredRule::FailOpen,
        DeferredRule::Breaker,
    ];

    /// The stable name (status JSON, metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            DeferredRule::RemovalPerPlan => "removal_per_plan",
            DeferredRule::RemovalPerWindow => "removal_per_window",
            DeferredRule::Capacity => "capacity",
            DeferredRule::ZoneOneAtATime => "zone_one_at_a_time",
            DeferredRule::ZoneRecovery => "zone_recovery",
            DeferredRule::FailOpen => "fail_open",
            DeferredRule::Breaker => "breaker",
        }
    }
}

impl std::fmt::Display for DeferredRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A decision a rule held back: what is served against health (or what was not published),
/// why, with the numbers, and when the planner looks at it again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deferred {
    pub rule: DeferredRule,
    pub endpoint: EndpointName,
    /// The target it is about; `None` for a whole endpoint (the breaker).
    pub target: Option<IpAddr>,
    /// What is held, the rule's numbers, and what it waits for.
    pub detail: String,
    /// When the rule can first let it through, if that is a time (the velocity window, the
    /// recovery dwell). `None`: it waits for health, capacity or an operator, as `detail` says;
    /// every decision looks again.
    pub reconsider_at_unix_ms: Option<u64>,
}

/// `GET /v1/zones`: the zone the store manages and every other zone the authority serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneList {
    pub managed: String,
    pub zones: Vec<ZoneInfo>,
}

/// One static zone served beside the managed one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneInfo {
    pub origin: String,
    pub serial: u32,
    /// Names with records.
    pub names: usize,
    /// `config` (the config file's `[[zones]]`) or `added` (at run time).
    pub source: String,
    /// Queries it answered since the authority started, or since it was added or replaced.
    pub queries: u64,
}
