//! The README's tour, end to end: `dnsplan up` as a real process on free ports, walked with the
//! CLI and a DNS client. Each step is asserted; waits are on the store's change feed or on
//! DNS answers, each bounded.

mod support;

use dnsplan_common::Store;
use dnsplan_common::store::remote::RemoteStore;
use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_tour_works() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let up = up(dir.path())?;
    let store = RemoteStore::new(&up.control, Some(TOKEN.into()))?;
    let failed: IpAddr = "127.0.0.11".parse()?;

    // dig: all six api targets.
    until_dns(up.dns, "api.example.test.", |a| a.len() == 6).await?;
    // The demo zone is whole: its name server has an address, given with the apex NS as glue.
    // Teeth: without the built-in config's static records, this fails with "ns1.example.test.
    // never answered as wanted" (a lame name server).
    let ns1: IpAddr = "127.0.0.1".parse()?;
    assert_eq!(until_dns(up.dns, "ns1.example.test.", |_| true).await?, [ns1].into());
    let dig = Command::new("dig").args(["@127.0.0.1", "-p", &up.dns.port().to_string(), "+norec", "example.test.", "NS"]).output()?;
    let dig = String::from_utf8_lossy(&dig.stdout);
    let additional = dig.split(";; ADDITIONAL SECTION:").nth(1).unwrap_or_default();
    assert!(additional.lines().any(|l| l.starts_with("ns1.example.test.") && l.ends_with("127.0.0.1")), "no glue for ns1: {dig}");
    let status = ok(&dnsplan(&up, &["status"])?);
    assert!(status.contains("automation    running") && status.contains("enactor-c"), "{status}");

    // Fail a backend: the planner removes it, DNS stops answering it.
    ok(&dnsplan(&up, &["backend", "fail", "127.0.0.11"])?);
    let removed = until_plan(&store, |p| weight(p, "127.0.0.11") == Some(0)).await?;
    until_dns(up.dns, "api.example.test.", |a| !a.contains(&failed)).await?;
    let explain = ok(&dnsplan(&up, &["plans", "explain", &removed.generation().to_string()])?);
    assert!(explain.contains("127.0.0.11") && explain.contains("down"), "{explain}");

    // Roll back to plan 1: enacted, served, automation paused.
    // No --dns: the CLI asks the stack where it serves DNS (not 127.0.0.1:5353, where this
    // stack does not listen). Teeth: with the old default of 127.0.0.1:5353, the rollback
    // exited 1, "enacted but not served".
    let rollback = ok(&dnsplan(&up, &["rollback", "--to", "1", "--reason", "tour"])?);
    assert!(rollback.contains("enacted: all") && rollback.contains("served"), "{rollback}");
    until_dns(up.dns, "api.example.test.", |a| a.contains(&failed)).await?;
    let status = ok(&dnsplan(&up, &["status"])?);
    assert!(status.contains("PAUSED"), "{status}");
    let rolled = store.latest().await?;

    // Resume: the planner takes over again and removes the still-failed backend.
    ok(&dnsplan(&up, &["resume"])?);
    let again = until_plan(&store, |p| p.generation() > rolled && weight(p, "127.0.0.11") == Some(0)).await?;
    assert!(again.plan().author.to_string().starts_with("planner:"));
    until_dns(up.dns, "api.example.test.", |a| !a.contains(&failed)).await?;
    let verify = ok(&dnsplan(&up, &["verify"])?);
    assert!(verify.contains("2 of 2 endpoints served as active"), "{verify}");
    assert!(verify.contains("its content is served on every endpoint"), "{verify}");

    // Heal it: back in the answers.
    ok(&dnsplan(&up, &["backend", "heal", "127.0.0.11"])?);
    until_plan(&store, |p| weight(p, "127.0.0.11") == Some(1)).await?;
    until_dns(up.dns, "api.example.test.", |a| a.contains(&failed)).await?;

    // Diff and JSON output.
    let diff = ok(&dnsplan(&up, &["plans", "diff", &removed.generation().to_string(), &store.latest().await?.to_string()])?);
    assert!(diff.contains("+ api.example.test. 127.0.0.11 zone a weight 1"), "{diff}");
    let json: serde_json::Value = serde_json::from_str(&ok(&dnsplan(&up, &["--output", "json", "plans", "list"])?))?;
    assert!(json.as_array().is_some_and(|plans| plans.len() >= 5), "{json}");

    // A plan as a file: printed as TOML, edited (api without .11), previewed, then published
    // with --yes: enacted, served, automation paused.
    let latest = store.latest().await?;
    let printed = ok(&dnsplan(&up, &["--output", "toml", "plans", "show", &latest.to_string()])?);
    let mut file: toml::Table = printed.parse()?;
    let api = file
        .get_mut("endpoints")
        .and_then(|e| e.get_mut("api.example.test."))
        .and_then(|a| a.get_mut("targets"))
        .and_then(|t| t.as_array_mut())
        .ok_or_else(|| anyhow::anyhow!("no api targets in\n{printed}"))?;
    api.retain(|t| t.get("address").and_then(|a| a.as_str()) != Some("127.0.0.11"));
    let path = dir.path().join("plan.toml");
    std::fs::write(&path, toml::to_string(&file)?)?;
    let path = path.to_string_lossy().into_owned();
    let preview = ok(&dnsplan(&up, &["plans", "publish", &path, "--reason", "drain .11"])?);
    assert!(preview.contains("- api.example.test. 127.0.0.11 zone a weight 1") && preview.contains("not published"), "{preview}");
    assert_eq!(store.latest().await?, latest, "a preview publishes nothing");
    let published = ok(&dnsplan(&up, &["plans", "publish", &path, "--reason", "drain .11", "--yes"])?);
    assert!(published.contains("published plan") && published.contains("served"), "{published}");
    until_dns(up.dns, "api.example.test.", |a| !a.contains(&failed)).await?;
    let status = ok(&dnsplan(&up, &["status"])?);
    assert!(status.contains("PAUSED"), "{status}");

    // Clear errors and exit codes.
    let wrong = Command::new(env!("CARGO_BIN_EXE_dnsplan"))
        .args(["--control", &up.control, "--token", "wrong-token-0123456789", "pause", "--reason", "x"])
        .output()?;
    assert_eq!(wrong.status.code(), Some(4), "{}", String::from_utf8_lossy(&wrong.stderr));
    // A route nobody serves gets the control API's JSON error, from `dnsplan up` as from the
    // authority alone (`authority/tests/strict.rs`): one assembly. Teeth: with the JSON layer
    // only on the authority's own routes, `dnsplan up`'s merged router answered 404 with an
    // empty body, and this failed.
    let nope = reqwest::get(format!("{}/v1/nope", up.control)).await?;
    assert_eq!(nope.status(), 404);
    let body: serde_json::Value = nope.json().await?;
    assert!(body["message"].is_string() && body["error"]["kind"].is_string(), "a JSON error body: {body}");
    let down = Command::new(env!("CARGO_BIN_EXE_dnsplan")).args(["--control", "http://127.0.0.1:1", "status"]).output()?;
    assert_eq!(down.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&down.stderr).contains("is the stack running"));

    // Ctrl-C / SIGTERM: a clean stop.
    let mut up = up;
    let status = Command::new("kill").args(["-TERM", &up.child.id().to_string()]).status()?;
    assert!(status.success());
    let exit = up.child.wait()?;
    assert!(exit.success(), "exit after SIGTERM: {exit}");
    Ok(())
}

/// The planner says what it holds back: three of api's six backends fail (one per zone, so
/// no zone is impaired); the velocity limits let two go and keep serving the third, and
/// `dnsplan status` names it in a HELD BACK line with the rule, the numbers and when it is
/// reconsidered, as do `--output json`, `plans explain` of the latest plan and the status
/// page. Without the
/// planner's deferrals, status said only "no change (latest plan N)" and this failed waiting
/// for the line (seen once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_says_which_dead_backend_is_held_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let up = up(dir.path())?;
    let store = RemoteStore::new(&up.control, Some(TOKEN.into()))?;
    until_dns(up.dns, "api.example.test.", |a| a.len() == 6).await?;

    let failed = ["127.0.0.11", "127.0.0.13", "127.0.0.15"];
    for address in failed {
        ok(&dnsplan(&up, &["backend", "fail", address])?);
    }
    let plan = until_plan(&store, |p| failed.iter().filter(|a| weight(p, a) == Some(0)).count() == 2).await?;
    let third = failed.iter().copied().find(|a| weight(&plan, a) == Some(1)).ok_or_else(|| anyhow::anyhow!("none kept: {plan:?}"))?;

    // The planner decides every 500 ms; poll status (bounded) until a decision says so.
    let deadline = Instant::now() + WITHIN;
    let (status, line) = loop {
        let status = ok(&dnsplan(&up, &["status"])?);
        if let Some(line) = status.lines().find(|l| l.starts_with("  removal_per_") && l.contains(third)) {
            break (status.clone(), line.to_owned());
        }
        anyhow::ensure!(Instant::now() < deadline, "no held-back line for {third} within {WITHIN:?}:\n{status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.contains("HELD BACK     1 decision(s)") && status.contains("1 deferred: removal_per_"), "{status}");
    assert!(line.contains(&format!("api.example.test. {third}  reconsidered in ")), "{line}");
    assert!(line.contains("down, still served: ") && line.contains('%'), "{line}");

    let json: serde_json::Value = serde_json::from_str(&ok(&dnsplan(&up, &["--output", "json", "status"])?))?;
    let held = &json["planner"]["deferred"];
    assert_eq!(held.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(held[0]["target"].as_str(), Some(third), "{json}");
    assert!(held[0]["reconsider_at_unix_ms"].as_u64().is_some(), "{json}");

    let explain = ok(&dnsplan(&up, &["plans", "explain", &store.latest().await?.to_string()])?);
    assert!(explain.contains("held back now") && explain.contains(third), "{explain}");

    // The status page lists it under "Held back" (server-rendered: the HTML says it).
    let page = reqwest::get(format!("{}/ui", up.control)).await?.text().await?;
    let held = page.split("<h2>Held back</h2>").nth(1).ok_or_else(|| anyhow::anyhow!("no Held back section:\n{page}"))?;
    let held = held.split("<h2>").next().unwrap_or_default();
    assert!(held.contains(third) && held.contains("removal_per_"), "{held}");
    Ok(())
}

/// `verify` with several DNS servers asks each and names the one that lags: here a second
/// server (NSD on a zone file, as a secondary left behind would be) still serves `api` at an
/// address no plan has, while the stack serves the active state.
///
/// Teeth: a verify that asked only the first server exited 0 here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_asks_every_dns_server_and_names_the_one_that_lags() -> anyhow::Result<()> {
    use dnsplan_tests::nsd::{Nsd, NsdSpec, NsdZone};
    let dir = tempfile::tempdir()?;
    let up = up(dir.path())?;
    until_dns(up.dns, "api.example.test.", |a| a.len() == 6).await?;
    let stale = "$ORIGIN example.test.\n@ 300 IN SOA ns1 hostmaster 1 3600 600 604800 30\n@ 300 IN NS ns1\nns1 300 IN A 127.0.0.1\n\
                 api 30 IN A 192.0.2.1\ndb 30 IN A 127.0.0.21\n";
    let nsd = Nsd::start(&NsdSpec {
        zones: vec![NsdZone { origin: "example.test.".into(), text: Some(stale.into()), zone_extra: Vec::new() }],
        keys: Vec::new(),
        server_extra: Vec::new(),
    })
    .await?;
    let both = format!("{},{}", up.dns, nsd.addr());
    let out = dnsplan(&up, &["verify", "--dns", &both])?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("1 of 2 endpoints served as active"), "{text}");
    assert!(text.contains(&format!("DNS {}: serves every endpoint as active", up.dns)), "{text}");
    assert!(text.contains(&format!("DNS {}: LAGS: 1 endpoint(s) not served as active", nsd.addr())), "{text}");
    assert!(text.contains(&format!("on {}: api.example.test. A", nsd.addr())), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&String::from_utf8_lossy(&dnsplan(&up, &["--output", "json", "verify", "--dns", &both])?.stdout))?;
    assert_eq!(json["dns"][1]["endpoints_not_served"], 1, "{json}");
    assert_eq!(json["dns"][0]["ok"], true, "{json}");
    // Without --dns: the stack's own, which serves everything.
    let own = ok(&dnsplan(&up, &["verify"])?);
    assert!(own.contains("2 of 2 endpoints served as active"), "{own}");
    Ok(())
}
