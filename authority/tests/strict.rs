//! The control API is strict about what it takes and careful about what it logs: unknown JSON
//! fields and query parameters are refused (a plan with `"evil": true` used to be published),
//! unknown routes and methods answer JSON errors, an oversized JSON plan is refused by its
//! declared size before it is read, and audit lines are written only after the store accepted
//! the operation, with every text escaped (a reason with a newline used to forge a log line,
//! and a pause refused as too long was logged as done).

mod support;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use support::{TOKEN, TestAuthority};

async fn call(req: reqwest::RequestBuilder) -> anyhow::Result<(u16, Value)> {
    let resp = req.bearer_auth(TOKEN).send().await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{status}: not JSON ({e}): {text}"))?
    };
    Ok((status, body))
}

fn plan_json() -> Value {
    json!({
        "generation": 1, "parent_generation": 0, "created_at_unix_ms": 0,
        "author": {"Operator": {"name": "alice"}}, "reason": "by hand", "dns_zone": "example.test.",
        "endpoints": {"api.example.test.": {"ttl_secs": 30, "targets": [{"address": "192.0.2.1", "zone": "a", "weight": 1}]}},
        "retired": [], "rollback_of": null, "provenance": []
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_routes_and_oversized_plans_are_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", auth.control);
    let publish = |body: Value| client.post(url("/v1/plans")).header("content-type", "application/json").body(body.to_string());

    let mut evil = plan_json();
    evil["evil"] = json!(true);
    let mut nested = plan_json();
    nested["endpoints"]["api.example.test."]["targets"][0]["evil"] = json!(1);
    for (what, body) in [("top level", evil), ("in a target", nested)] {
        let (status, body) = call(publish(body)).await?;
        assert_eq!(status, 400, "an unknown field {what}: {body}");
        assert!(body["message"].as_str().is_some_and(|m| m.contains("evil")), "{what}: {body}");
    }
    let (status, body) = call(client.put(url("/v1/pause")).json(&json!({"reason": "r", "by": "b", "since_unix_ms": 1, "x": 1}))).await?;
    assert_eq!(status, 400, "{body}");
    assert_eq!(dnsplan_common::Store::latest(&auth.store).await?.0, 0, "nothing was published");
    let (status, body) = call(publish(plan_json())).await?;
    assert_eq!(status, 204, "the same plan without the unknown field: {body}");

    for (req, want) in [
        (client.get(url("/v1/plans?from=0&limit=1&evil=1")), 400),
        (client.get(url("/v1/nope")), 404),
        (client.delete(url("/v1/version")), 405),
    ] {
        let (status, body) = call(req).await?;
        assert_eq!(status, want, "{body}");
        assert!(body["message"].is_string() && body["error"]["kind"].is_string(), "a JSON error body: {body}");
    }

    // Declared larger than a JSON plan may be: refused on the headers alone, before the body
    // (which this client never sends) is read.
    let (status, body) = declare_oversized_plan(&auth.control).await?;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["kind"], "too_long", "{body}");
    auth.stop().await
}

/// Publishes `plan_json` as plan 1 and applies its endpoint with a JSON batch; returns that
/// batch and the JSON answer.
async fn published_and_applied(auth: &TestAuthority, client: &reqwest::Client) -> anyhow::Result<(Value, Value)> {
    let url = |path: &str| format!("{}{path}", auth.control);
    let (status, body) =
        call(client.post(url("/v1/plans")).header("content-type", "application/json").body(plan_json().to_string())).await?;
    assert_eq!(status, 204, "{body}");
    let records = plan_json()["endpoints"]["api.example.test."].clone();
    let item = json!({"generation": 1, "items": [{"endpoint": "api.example.test.", "records": records}]});
    let (status, body) = call(client.post(url("/v1/apply")).json(&item)).await?;
    assert_eq!(status, 200, "{body}");
    Ok((item, body))
}

/// `POST /v1/apply` takes a batch as JSON or as a codec envelope (what `RemoteStore` sends),
/// and refuses an envelope it cannot read with a 400 that says so, writing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_apply_takes_json_or_an_envelope() -> anyhow::Result<()> {
    use dnsplan_common::store::Store;
    use dnsplan_common::store::wire::ApplyManyRequest;
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", auth.control);
    let (item, body) = published_and_applied(&auth, &client).await?;
    assert!(body[0]["Ok"]["Switched"].is_object(), "JSON batch: {body}");

    let batch: ApplyManyRequest = serde_json::from_value(item)?;
    let envelope = |bytes: Vec<u8>| client.post(url("/v1/apply")).header("content-type", "application/octet-stream").body(bytes);
    let (status, body) = call(envelope(dnsplan_common::codec::encode(&batch))).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body[0]["Ok"], "Unchanged", "envelope batch: {body}");

    // Damaged in transit: the envelope's checksum catches it.
    let mut bad = dnsplan_common::codec::encode(&batch);
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    let (status, body) = call(envelope(bad)).await?;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| m.contains("apply batch envelope")), "{body}");
    let active = auth.store.active(&dnsplan_common::DnsName::parse("api.example.test")?).await?;
    assert_eq!(active.map(|a| a.generation.0), Some(1), "the refused batch wrote nothing");
    auth.stop().await
}

/// `GET /v1/changes` answers JSON by default (curl, older clients) and a codec envelope with
/// `Accept: application/octet-stream` (what `RemoteStore` asks for); both say the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_come_as_json_or_an_envelope() -> anyhow::Result<()> {
    use dnsplan_common::store::ActiveDelta;
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", auth.control);
    published_and_applied(&auth, &client).await?;
    let resp = client.get(url("/v1/changes?since=0")).send().await?;
    assert!(resp.headers()["content-type"].to_str()?.starts_with("application/json"));
    let json: ActiveDelta = resp.json().await?;
    let resp = client.get(url("/v1/changes?since=0")).header("accept", "application/octet-stream").send().await?;
    assert_eq!(resp.headers()["content-type"].to_str()?, "application/octet-stream");
    let envelope: ActiveDelta = dnsplan_common::codec::decode(&resp.bytes().await?)?;
    assert_eq!(envelope, json);
    assert_eq!(envelope.endpoints.len(), 1, "{envelope:?}");
    auth.stop().await
}

/// Sends only the headers of a JSON plan declared one byte over the limit, and reads the
/// answer.
async fn declare_oversized_plan(control: &str) -> anyhow::Result<(u16, Value)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = control.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "POST /v1/plans HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        control_json_plan_max() + 1
    );
    stream.write_all(head.as_bytes()).await?;
    let mut answer = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(20), stream.read_to_end(&mut answer)).await??;
    let text = String::from_utf8_lossy(&answer);
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| anyhow::anyhow!("not an HTTP answer: {text}"))?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    Ok((status, serde_json::from_str(body.trim()).map_err(|e| anyhow::anyhow!("{e}: {text}"))?))
}

fn control_json_plan_max() -> usize {
    dnsplan_authority::control::routes::JSON_PLAN_BODY_BYTES_MAX
}

#[test]
fn audit_lines_follow_the_store_and_cannot_be_forged() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("zone.db"), support::ZONE_FILE)?;
    let config = dir.path().join("authority.toml");
    std::fs::write(&config, support::config_text(&dir.path().join("data"), 8))?;
    let log = std::fs::File::create(dir.path().join("log"))?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_dnsplan-authority"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()?;
    let mut control = None;
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        if let Some(url) = line?.strip_prefix("control").map(|rest| rest.trim().to_owned()) {
            control = Some(url);
            break;
        }
    }
    let control = control.ok_or_else(|| anyhow::anyhow!("the authority did not say where it listens"))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let outcome = runtime.block_on(async {
        let client = reqwest::Client::new();
        let pause = |reason: String| {
            client.put(format!("{control}/v1/pause")).json(&json!({"reason": reason, "by": "mallory", "since_unix_ms": 1}))
        };
        let (status, body) = call(pause("drill\nFORGED automation resumed".into())).await?;
        anyhow::ensure!(status == 204, "pause: {status} {body}");
        let (status, body) = call(pause("x".repeat(10_000))).await?;
        anyhow::ensure!(status == 413, "an over-long reason: {status} {body}");
        anyhow::Ok(())
    });
    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    let exit = child.wait()?;
    outcome?;
    assert!(killed.success() && exit.success(), "exit after SIGTERM: {exit}");
    let mut text = String::new();
    std::fs::File::open(dir.path().join("log"))?.read_to_string(&mut text)?;
    let paused: Vec<&str> = text.lines().filter(|l| l.contains("automation paused")).collect();
    assert_eq!(paused.len(), 1, "one audit line for the one accepted pause:\n{text}");
    assert!(paused[0].contains("dnsplan::audit") && paused[0].contains(r#""drill\nFORGED automation resumed""#), "escaped: {}", paused[0]);
    assert!(!text.lines().any(|l| l.starts_with("FORGED")), "a forged line:\n{text}");
    Ok(())
}
