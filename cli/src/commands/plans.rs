//! `dnsplan plans`, `rollback` and `cleanup`: plans listed, shown, explained, published from a file,
//! rolled back, and cleaned up.

use super::*;

pub(super) async fn plan_or_explain(client: &Client, generation: Generation) -> CliResult<ValidatedPlan> {
    client.store.plan(generation).await.map_err(|e| match e {
        StoreError::PlanNotFound(_) | StoreError::Pruned { .. } => {
            CliError::Refused(format!("plan {generation} is not stored (never published, or cleaned up); see `dnsplan plans list`"))
        }
        other => other.into(),
    })
}

pub(super) async fn plans(client: &Client, command: PlansCommand) -> CliResult<ExitCode> {
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
            // Whether the stack trusts the key is its keyring's to say; this is whose it is.
            match plan.signature() {
                Some(s) => crate::out!("signed by the key {}", dnsplan_common::signing::public_key_text(&s.public_key)),
                None => crate::out!("not signed"),
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
                client.get_json::<PlannerStatus>("/v1/planner").await.ok().flatten()
            } else {
                None
            };
            if client.format == Format::Json {
                let mut out = serde_json::json!({"generation": p.generation, "reason": p.reason, "author": p.author.to_string(), "provenance": p.provenance});
                if let Some(p) = &planner {
                    out["deferred"] = serde_json::to_value(&p.deferred).map_err(|e| CliError::Refused(format!("deferred as JSON: {e}")))?;
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
                print_held_back(held);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn rollback(
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
    let plan = workflow::publish_rollback(&client.store, &request, client.signing_key()).await?;
    if !keep_automation {
        crate::out!("automation paused (resume with `dnsplan resume`)");
    }
    let g = plan.generation();
    crate::out!("published plan {g} with the content of plan {to}");
    wait_enacted_and_served(client, &plan, dns, wait).await
}

/// Waits until `plan` is enacted and served on `dns`, saying how it goes.
pub(super) async fn wait_enacted_and_served(client: &Client, plan: &ValidatedPlan, dns: SocketAddr, wait: Duration) -> CliResult<ExitCode> {
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
pub(super) async fn publish_file(
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
        plan_file::publish(&client.store, &mut preview, &by, keep_automation, client.signing_key()).await.map_err(|err| match err {
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

pub(super) fn print_preview(preview: &plan_file::Preview, keep_automation: bool) {
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

pub(super) async fn cleanup(client: &Client, dry_run: bool, retain: u64) -> CliResult<ExitCode> {
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
