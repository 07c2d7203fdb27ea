//! `dnsplan endpoints`, `zone export` and `backend`: what the zone holds, and the demo's backends.

use super::*;

pub(super) async fn endpoints(client: &Client, command: EndpointsCommand) -> CliResult<ExitCode> {
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
            let plan =
                workflow::publish_retirement(&client.store, &name, &reason, &by, client.signing_key()).await.map_err(|e| match e {
                    workflow::RetireError::Store(err) => CliError::from(err),
                    other => CliError::Refused(other.to_string()),
                })?;
            crate::out!("published plan {}: retires {name} ({reason}); it answers NXDOMAIN once enacted", plan.generation());
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub(super) async fn zone_export(client: &Client) -> CliResult<ExitCode> {
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

pub(super) async fn backend(client: &Client, command: BackendCommand) -> CliResult<ExitCode> {
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
    let resp = client.http.post(&url).send().await.map_err(|e| CliError::Unreachable(format!("cannot reach {url}: {e}")))?;
    match resp.status().as_u16() {
        200 => {
            crate::out!("{address}: {}", if action == "fail" { "failed (listeners closed)" } else { "healed (listening again)" });
            Ok(ExitCode::SUCCESS)
        }
        401 => Err(CliError::Unauthorized("the stack refused the token; pass --token or set DNSPLAN_TOKEN".into())),
        403 => Err(CliError::Unauthorized(format!("the stack refused this credential: {url} needs the operate role"))),
        404 => Err(CliError::Refused(format!("no demo backend on {address} (see `dnsplan backend list`)"))),
        other => Err(CliError::Refused(format!("{url} answered {other}"))),
    }
}
