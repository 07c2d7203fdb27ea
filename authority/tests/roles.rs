//! The control API's roles, from outside: the `dnsplan-authority` binary with
//! `[[control.credential]]` tables in its config file, asked over HTTP.
//!
//! - every route of `access::ROUTES` (the first zone's and an added zone's), asked with no
//!   token, a wrong one, and a credential of each role: refused (401, 403) exactly when the
//!   table says so, and each refusal counted by credential and status;
//! - a plan is published only by the role of its author (planner: `plan`, operator:
//!   `operate`), and the audit line names the credential;
//! - credentials rotated without a restart: on SIGHUP, and when the file changes; a file that
//!   does not load keeps the credentials in force.

mod support;

use dnsplan_authority::control::access::{self, Need, ROUTES, Role};
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::{Author, Store, StoreError};
use std::time::Duration;
use support::{AuthorityProcess, field, message};

const WAIT: Duration = support::PROCESS_WAIT;

fn token_of(role: Role) -> String {
    format!("{role}-token-0123456789abcdef")
}

/// A `[[control.credential]]` table per role, named `<role>-1`, each with its own token.
fn credential_tables(roles: &[Role], token: impl Fn(Role) -> String) -> String {
    roles
        .iter()
        .map(|r| {
            format!("[[control.credential]]\nname = \"{r}-1\"\nroles = [\"{r}\"]\nsha256 = \"{}\"\n", access::token_sha256(&token(*r)))
        })
        .collect()
}

/// The test config (`support::config_text`) without `control.token`, with `tables` in
/// `[control]` and `reload_check_secs`.
fn config(dir: &std::path::Path, tables: &str, reload_check_secs: u64) -> String {
    let text = support::config_text(&dir.join("data"), 8).replace(&format!("token = \"{}\"\n", support::TOKEN), "");
    // The tables belong to [control]: put them right after its keys, before [dns_zone].
    text.replace("[dns_zone]\n", &format!("reload_check_secs = {reload_check_secs}\n{tables}[dns_zone]\n"))
}

/// A path of the table with its parameters filled in.
fn concrete(path: &str) -> String {
    path.replace("{zone}", "other.test.")
        .replace("{generation}", "1")
        .replace("{endpoint}", "api.example.test.")
        .replace("{origin}", "static.test.")
        .replace("{address}", "192.0.2.1")
        .replace("{action}", "fail")
}

/// Queries that keep a route from waiting (a long poll answers at once).
fn query_of(path: &str) -> &'static str {
    match path {
        "/v1/wait" => "?latest=0&applied_changes=0&control_changes=0&timeout_ms=0",
        _ => "",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_is_refused_to_every_role_the_table_does_not_give_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let authority = AuthorityProcess::start(dir.path(), &config(dir.path(), &credential_tables(&Role::ALL, token_of), 2))?;
    let http = reqwest::Client::builder().timeout(WAIT).build()?;
    // The first zone's routes, and an added zone's beside each of the store's routes.
    let mut routes: Vec<(&str, String, Need)> = Vec::new();
    for (method, path, need) in ROUTES {
        if path.starts_with("/v1/demo") || *path == "/v1/planner" {
            continue; // `dnsplan up`'s own routes: not served by the authority alone.
        }
        routes.push((method, path.to_string(), *need));
        let store_route = ["/v1/managed", "/v1/zones", "/v1/status"].iter().all(|p| !path.starts_with(p));
        if let Some(rest) = path.strip_prefix("/v1/").filter(|_| store_route) {
            routes.push((method, format!("/v1/managed/{{zone}}/{rest}"), *need));
        }
    }
    let mut checked = 0;
    let mut failures = Vec::new();
    // Refusals seen, by the credential's name (`-` for none) and status: the metric must agree.
    let mut refusals: std::collections::BTreeMap<(String, u16), u64> = Default::default();
    let callers: Vec<(String, Option<String>)> =
        [("no token".to_string(), None), ("a wrong token".into(), Some("wrong-token-0123456789".into()))]
            .into_iter()
            .chain(Role::ALL.iter().map(|r| (format!("role {r}"), Some(token_of(*r)))))
            .collect();
    for (method, path, need) in &routes {
        let url = format!("{}{}{}", authority.control, concrete(path), query_of(path));
        for (who, token) in &callers {
            let mut req = http.request(reqwest::Method::from_bytes(method.as_bytes())?, &url);
            if let Some(token) = token {
                req = req.bearer_auth(token);
            }
            let status = req.send().await?.status().as_u16();
            let role = Role::ALL.iter().find(|r| Some(token_of(**r)) == *token).copied();
            let allowed = match (need, role) {
                (Need::Open, _) => true,
                (_, None) => false,
                (Need::Read, Some(_)) => true,
                (Need::Role(r) | Need::Frequent(r), Some(has)) => *r == has,
                (Need::Publish, Some(has)) => matches!(has, Role::Plan | Role::Operate),
            };
            let refused = matches!(status, 401 | 403);
            if refused {
                let name = role.map_or("-".to_string(), |r| format!("{r}-1"));
                *refusals.entry((name, status)).or_default() += 1;
            }
            if allowed == refused {
                failures.push(format!("{method} {path} by {who}: {status}, {}", if allowed { "should pass" } else { "should be refused" }));
            }
            if !allowed && role.is_none() && status != 401 || !allowed && role.is_some() && status != 403 {
                failures.push(format!("{method} {path} by {who}: {status}, want {}", if role.is_none() { 401 } else { 403 }));
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{} of {checked} requests answered wrongly:\n{}", failures.len(), failures.join("\n"));
    assert!(checked > 400, "only {checked} requests");
    let metrics = http.get(format!("{}/metrics", authority.control)).send().await?.text().await?;
    for ((credential, status), count) in &refusals {
        let line = format!("dnsplan_control_refused_total{{credential=\"{credential}\",status=\"{status}\"}} {count}");
        assert!(
            metrics.lines().any(|l| l == line),
            "want {line:?} in:\n{}",
            metrics.lines().filter(|l| l.contains("refused")).collect::<Vec<_>>().join("\n")
        );
    }
    // A browser on the status page is asked for a password, and a token given as one is taken.
    let ui = http.get(format!("{}/ui", authority.control)).send().await?;
    assert_eq!(ui.status().as_u16(), 401);
    let challenge = ui.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(challenge.starts_with("Basic "), "{challenge:?}");
    let ui = http.get(format!("{}/ui", authority.control)).basic_auth("anyone", Some(token_of(Role::Read))).send().await?;
    assert_eq!(ui.status().as_u16(), 200);
    // A refused write is audited with the credential that tried.
    let refused = authority
        .log_until("auditing a refused write", |l| message(l).starts_with("write refused") && field(l, "credential") == "read-1")?;
    assert_eq!(refused.get("target").and_then(|t| t.as_str()), Some(dnsplan_authority::control::routes::AUDIT_TARGET));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_is_published_only_by_its_authors_role() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let authority = AuthorityProcess::start(dir.path(), &config(dir.path(), &credential_tables(&Role::ALL, token_of), 2))?;
    let store = |role: Role| RemoteStore::new(&authority.control, Some(token_of(role)));
    let by_planner = support::plan(1, &[("api.example.test.", support::endpoint(60, vec![support::target("192.0.2.1", "az1", 1)]))]);
    let mut raw = by_planner.plan().clone();
    raw.author = Author::Operator { name: "alice".into() };
    let by_operator = dnsplan_common::ValidatedPlan::new(raw)?;
    for (role, plan) in [(Role::Operate, &by_planner), (Role::Plan, &by_operator), (Role::Enact, &by_planner), (Role::Admin, &by_operator)]
    {
        match store(role)?.publish(plan).await {
            Err(StoreError::Forbidden(why)) => assert!(why.contains(&format!("{role}-1")), "{role}: {why}"),
            other => panic!("a plan by {} published with role {role}: {other:?}", plan.plan().author),
        }
    }
    assert_eq!(store(Role::Read)?.latest().await?, dnsplan_common::Generation(0), "a refused plan was stored");
    store(Role::Plan)?.publish(&by_planner).await?;
    let audit = authority.log_until("auditing the publish", |l| message(l) == "plan published")?;
    assert_eq!(field(&audit, "credential"), "plan-1", "{audit}");
    // An operator's plan on top, by the operate role.
    let mut raw = by_operator.plan().clone();
    (raw.generation, raw.parent_generation) = (dnsplan_common::Generation(2), dnsplan_common::Generation(1));
    store(Role::Operate)?.publish(&dnsplan_common::ValidatedPlan::new(raw)?).await?;
    assert_eq!(store(Role::Read)?.latest().await?, dnsplan_common::Generation(2));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_rotated_without_a_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let old = |r: Role| token_of(r);
    let new = |r: Role| format!("{r}-rotated-0123456789abcdef");
    // Checked on SIGHUP only, so the reload below is the signal's.
    let authority = AuthorityProcess::start(dir.path(), &config(dir.path(), &credential_tables(&[Role::Enact, Role::Read], old), 0))?;
    let path = dir.path().join("authority.toml");
    let pause_state = |token: String| {
        let control = authority.control.clone();
        async move {
            let resp = reqwest::Client::new().get(format!("{control}/v1/pause")).bearer_auth(token).send().await?;
            anyhow::Ok(resp.status().as_u16())
        }
    };
    assert_eq!(pause_state(old(Role::Enact)).await?, 200);
    assert_eq!(pause_state(new(Role::Enact)).await?, 401);

    std::fs::write(&path, config(dir.path(), &credential_tables(&[Role::Enact, Role::Read], new), 0))?;
    authority.signal("-HUP")?;
    let reloaded = authority.log_until("of a reload", |l| message(l) == "control credentials reloaded")?;
    assert_eq!(field(&reloaded, "reason"), "SIGHUP");
    assert!(!reloaded.to_string().contains(&access::token_sha256(&new(Role::Enact))), "a hash in the log: {reloaded}");
    assert_eq!(pause_state(old(Role::Enact)).await?, 401, "the rotated-out token still works");
    assert_eq!(pause_state(new(Role::Enact)).await?, 200);

    // A file that does not load leaves the credentials in force.
    std::fs::write(&path, "this is not TOML [")?;
    authority.signal("-HUP")?;
    let refused = authority.log_until("of a refused reload", |l| message(l).starts_with("control credentials not reloaded"))?;
    assert!(field(&refused, "error").contains("authority.toml"), "{refused}");
    assert_eq!(pause_state(new(Role::Enact)).await?, 200);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_config_file_is_read_again_without_a_signal() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let authority = AuthorityProcess::start(dir.path(), &config(dir.path(), &credential_tables(&[Role::Operate], token_of), 1))?;
    let new = "operate-by-file-0123456789abcdef".to_string();
    std::fs::write(dir.path().join("authority.toml"), config(dir.path(), &credential_tables(&[Role::Operate], |_| new.clone()), 1))?;
    let reloaded = authority.log_until("of a reload", |l| message(l) == "control credentials reloaded")?;
    assert_eq!(field(&reloaded, "reason"), "a file changed");
    let resume = |token: String| {
        let control = authority.control.clone();
        async move {
            anyhow::Ok(reqwest::Client::new().delete(format!("{control}/v1/pause")).bearer_auth(token).send().await?.status().as_u16())
        }
    };
    assert_eq!(resume(token_of(Role::Operate)).await?, 401);
    assert_eq!(resume(new.clone()).await?, 204);
    Ok(())
}
