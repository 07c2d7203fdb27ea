//! `dnsplan status`: the stack's state, its secondaries, unmanaged endpoints and what the planner holds back.

use super::*;

/// The authority's `/v1/status`, with what the CLI adds to it.
#[derive(Debug)]
pub(super) struct StatusView {
    pub(super) status: Status,
    /// The one-process stack's planner (`/v1/planner`), when there is one.
    pub(super) planner: Option<PlannerStatus>,
    /// Endpoints of the latest plan the planner no longer manages.
    pub(super) unmanaged: Vec<EndpointName>,
}

/// A secondary's line: its address, the serial it serves and whether it is current (see
/// `SecondaryView::is_current`).
pub(super) fn secondary_row(s: &SecondaryStatus, served: u32) -> Vec<String> {
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

/// Unmanaged endpoints `status` names on its line; the rest are counted (there may be
/// thousands, and `dnsplan endpoints list` lists them all).
pub(super) const UNMANAGED_NAMED_MAX: usize = 5;

/// The `UNMANAGED` line of `status`: a count, a few names, the commands that list and retire.
pub(super) fn unmanaged_line(unmanaged: &[EndpointName]) -> String {
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

pub(super) async fn status(client: &Client) -> CliResult<ExitCode> {
    let status: Status = client
        .get_json(&client.status_path(""))
        .await?
        .ok_or_else(|| CliError::Refused(format!("no {} at this address", client.status_path(""))))?;
    // The planner of `dnsplan up` plans the first zone.
    let planner = match client.zone {
        Some(_) => None,
        None => client.get_json("/v1/planner").await.ok().flatten(),
    };
    let unmanaged = match status.latest {
        latest if latest.is_none() => Vec::new(),
        latest => workflow::unmanaged(&client.store, client.store.plan(latest).await?.plan()).await?.into_iter().collect(),
    };
    let view = StatusView { status, planner, unmanaged };
    if client.format == Format::Json {
        // The authority's status as it is, with the CLI's additions beside its keys.
        let mut json = serde_json::to_value(&view.status).map_err(|e| CliError::Refused(format!("status as JSON: {e}")))?;
        if let Some(map) = json.as_object_mut() {
            map.insert(
                "planner".into(),
                serde_json::to_value(&view.planner).map_err(|e| CliError::Refused(format!("status as JSON: {e}")))?,
            );
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
        Some(p) if p.is_breaker() => format!("BREAKER TRIPPED ({}) {}: {}", p.by, output::ago(p.since_unix_ms), p.reason),
        Some(p) => format!("PAUSED by {} {}: {}", p.by.name(), output::ago(p.since_unix_ms), p.reason),
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
        let active = if p.active { "active" } else { "standby" };
        crate::out!("planner       {} ({active}): {}", p.id, p.last_decision);
    }
    let held = held_back(planner_view.as_ref());
    if !held.is_empty() {
        crate::out!("HELD BACK     {} decision(s) the planner's rules defer:", held.len());
        print_held_back(held);
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
pub(super) const HELD_BACK_LINES_MAX: usize = 20;

/// The planner status's `deferred` list; empty without a planner.
pub(super) fn held_back(planner: Option<&PlannerStatus>) -> &[Deferred] {
    planner.map_or(&[], |p| p.deferred.as_slice())
}

/// One line each: rule, endpoint and target, when it is reconsidered, and the rule's account.
pub(super) fn print_held_back(held: &[Deferred]) {
    for h in held.iter().take(HELD_BACK_LINES_MAX) {
        let target = h.target.map(|t| format!(" {t}")).unwrap_or_default();
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
