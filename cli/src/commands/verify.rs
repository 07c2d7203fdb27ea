//! `dnsplan verify`: every DNS server asked, and what it answers compared with what is applied.

use super::*;

/// Checks every serving endpoint of the active state on each of `servers`; with more than one,
/// says which lags.
pub(super) async fn verify(client: &Client, servers: &[SocketAddr], notes: &[String], wait: Duration) -> CliResult<ExitCode> {
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
