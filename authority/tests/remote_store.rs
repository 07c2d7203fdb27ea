//! `RemoteStore` over a real socket to the control API passes the same conformance suite as
//! `SledStore`; the naive store served through the same API still fails it (the remote path
//! hides no violation); writes without the right token are refused.

use dnsplan_authority::control::access::Access;
use dnsplan_authority::control::routes::{Control, router};
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::store::zones::ManagedZones;
use dnsplan_common::{SledStore, Store, StoreError};
use dnsplan_tests::conformance::{Harness, run_all};
use dnsplan_tests::fixtures::{name, plan, planner};
use dnsplan_tests::naive::NaiveStore;
use dnsplan_tests::zone_checks::{added_beside_a_busy_zone, removal_fences_late_writes, zone, zones_are_isolated};

const TOKEN: &str = "test-token-0123456789";

async fn serve<S: ManagedZones>(store: S) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let ctl = Control::new(store, Access::token(TOKEN).expect("token"));
    let app = router(ctl.clone()).with_state(ctl);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}"))
}

struct OverSled {
    dir: tempfile::TempDir,
}

impl Harness for OverSled {
    type S = RemoteStore;
    async fn fresh(&self) -> anyhow::Result<RemoteStore> {
        let store = SledStore::open(tempfile::tempdir_in(self.dir.path())?.keep())?;
        Ok(RemoteStore::new(&serve(store).await?, Some(TOKEN.into()))?)
    }
}

struct OverNaive;

impl Harness for OverNaive {
    type S = RemoteStore;
    async fn fresh(&self) -> anyhow::Result<RemoteStore> {
        Ok(RemoteStore::new(&serve(NaiveStore::default()).await?, Some(TOKEN.into()))?)
    }
}

/// An added zone, through `/v1/managed/{zone}/...`, of a store whose first zone holds a plan,
/// is paused and has its planner lease held.
struct OverSledZone {
    dir: tempfile::TempDir,
}

impl Harness for OverSledZone {
    type S = RemoteStore;
    async fn fresh(&self) -> anyhow::Result<RemoteStore> {
        let store = SledStore::open(tempfile::tempdir_in(self.dir.path())?.keep())?;
        let root = RemoteStore::new(&serve(store).await?, Some(TOKEN.into()))?;
        added_beside_a_busy_zone(root).await
    }
}

/// The control API routes each added zone's calls to that zone's store: the suite through
/// `/v1/managed/{zone}`, the zones isolated and a removal fenced over HTTP as in the store.
/// Teeth: with `Zoned` answering every request with the first zone's store, all three fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remote_zones_pass_the_suite_are_isolated_and_fence_removal() -> anyhow::Result<()> {
    let report = run_all(&OverSledZone { dir: tempfile::tempdir()? }).await?;
    assert!(
        report.is_clean(),
        "RemoteStore on an added zone violates the Store contract:
{report}"
    );
    let (one, two) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let root = RemoteStore::new(&serve(SledStore::open(one.path())?).await?, Some(TOKEN.into()))?;
    let violations = zones_are_isolated(root, &zone("first.test.")).await?;
    assert!(violations.is_empty(), "{violations:?}");
    let root = RemoteStore::new(&serve(SledStore::open(two.path())?).await?, Some(TOKEN.into()))?;
    let violations = removal_fences_late_writes(root).await?;
    assert!(violations.is_empty(), "{violations:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remote_store_passes_the_suite() -> anyhow::Result<()> {
    let report = run_all(&OverSled { dir: tempfile::tempdir()? }).await?;
    assert!(report.is_clean(), "RemoteStore over SledStore violates the Store contract:\n{report}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn naive_store_behind_the_api_fails_the_suite() -> anyhow::Result<()> {
    let report = run_all(&OverNaive).await?;
    let failed = report.failed();
    for must_fail in ["cleanup_is_guarded", "retire_releases_cleanup", "race_2025_sequence", "plan_changes_cover_every_plan_between"] {
        assert!(failed.contains(must_fail), "the suite did not catch the naive store over HTTP in {must_fail}:\n{report}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_need_the_token() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let base = serve(SledStore::open(dir.path())?).await?;
    let plan1 = plan(1, &[name("x")], planner());
    for token in [None, Some("wrong-token-0123456789".to_string()), Some(format!("{TOKEN}x"))] {
        let store = RemoteStore::new(&base, token.clone())?;
        let r = store.publish(&plan1).await;
        assert!(matches!(r, Err(StoreError::Unauthorized)), "token {token:?}: {r:?}");
        // Reads stay open.
        assert_eq!(store.latest().await?, dnsplan_common::Generation::NONE);
    }
    let raw = reqwest::Client::new().post(format!("{base}/v1/cleanup")).body("{\"retain\":1}").send().await?;
    assert_eq!(raw.status(), 401);
    let body: serde_json::Value = raw.json().await?;
    assert!(body["message"].as_str().is_some_and(|m| m.contains("Bearer")), "{body}");
    let good = RemoteStore::new(&base, Some(TOKEN.into()))?;
    good.publish(&plan1).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_are_clear_errors() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let base = serve(SledStore::open(dir.path())?).await?;
    let client = reqwest::Client::new();
    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (client.post(format!("{base}/v1/plans")).bearer_auth(TOKEN).body(vec![1, 2, 3]), 400, "envelope"),
        (client.put(format!("{base}/v1/active/x.example.test.")).bearer_auth(TOKEN).body("{not json"), 400, "JSON"),
        (client.get(format!("{base}/v1/active/bad..name")), 400, "empty label"),
        (client.get(format!("{base}/v1/plans/abc")), 400, "not a number"),
        (client.get(format!("{base}/v1/plans/7")), 404, "not found"),
        (client.put(format!("{base}/v1/pause")).bearer_auth(TOKEN).body(vec![b'x'; 100_000]), 413, "too large"),
        (client.get(format!("{base}/v1/active?limit=0")), 400, "limit must be in 1..=4096"),
        (client.get(format!("{base}/v1/active?limit=5000")), 400, "limit must be in 1..=4096"),
        (client.get(format!("{base}/v1/active?after=x.example.test.")), 400, "after= needs limit="),
        (client.get(format!("{base}/v1/active?limit=2&after=bad..name")), 400, "empty label"),
    ];
    for (req, status, text) in cases {
        let resp = req.send().await?;
        assert_eq!(resp.status().as_u16(), status);
        let body = resp.text().await?;
        assert!(body.contains(text), "want {text:?} in {body}");
    }
    Ok(())
}

/// `curl` users can publish and read plans as JSON; the same validation applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_as_json() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let base = serve(SledStore::open(dir.path())?).await?;
    let client = reqwest::Client::new();
    let p = plan(1, &[name("x")], planner());
    let resp = client.post(format!("{base}/v1/plans")).bearer_auth(TOKEN).json(p.plan()).send().await?;
    assert_eq!(resp.status(), 204);
    let back: dnsplan_common::Plan =
        client.get(format!("{base}/v1/plans/1")).header("accept", "application/json").send().await?.json().await?;
    assert_eq!(&back, p.plan());
    let mut empty = plan(2, &[name("x")], planner()).into_plan();
    empty.endpoints.values_mut().for_each(|e| e.targets.clear());
    let resp = client.post(format!("{base}/v1/plans")).bearer_auth(TOKEN).json(&empty).send().await?;
    assert_eq!(resp.status(), 422);
    assert!(resp.text().await?.contains("no targets"));
    Ok(())
}

/// A plan's changes can be published as JSON too: the path names the plan, the body must be
/// that plan's changes, and the whole plan reads back; a change that would empty an endpoint
/// is refused like a whole plan that does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_changes_as_json() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let base = serve(SledStore::open(dir.path())?).await?;
    let client = reqwest::Client::new();
    let one = plan(1, &[name("x"), name("y")], planner());
    let resp = client.post(format!("{base}/v1/plans")).bearer_auth(TOKEN).json(one.plan()).send().await?;
    assert_eq!(resp.status(), 204);
    let two = plan(2, &[name("x"), name("y")], planner());
    let delta = dnsplan_common::PlanDelta::between(one.plan(), &two).expect("a small change");
    let resp = client.post(format!("{base}/v1/plans/3/changes")).bearer_auth(TOKEN).json(&delta).send().await?;
    assert_eq!(resp.status(), 400, "the body holds plan 2's changes, the path names plan 3");
    assert!(resp.text().await?.contains("not of plan 3"));
    let resp = client.post(format!("{base}/v1/plans/2/changes")).json(&delta).send().await?;
    assert_eq!(resp.status(), 401, "a publish of changes needs the token");
    let mut empty = delta.clone();
    empty.changes.insert(name("x"), dnsplan_common::PlanEntry::Serve(dnsplan_common::Endpoint { ttl_secs: 30, targets: vec![] }));
    let resp = client.post(format!("{base}/v1/plans/2/changes")).bearer_auth(TOKEN).json(&empty).send().await?;
    assert_eq!(resp.status(), 422);
    assert!(resp.text().await?.contains("no targets"));
    let resp = client.post(format!("{base}/v1/plans/2/changes")).bearer_auth(TOKEN).json(&delta).send().await?;
    assert_eq!(resp.status(), 204);
    let back: dnsplan_common::Plan =
        client.get(format!("{base}/v1/plans/2")).header("accept", "application/json").send().await?.json().await?;
    assert_eq!(&back, two.plan());
    Ok(())
}

/// An enactor upgraded before its authority: the authority reads batch applies as JSON only
/// (modelled by refusing envelopes as an older one did, with its JSON parser's error), and
/// `RemoteStore` sends that batch and every later one as JSON. An authority that reads
/// envelopes gets them: the first batch is sent once, as an envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_fall_back_to_json_for_an_authority_that_reads_only_json() -> anyhow::Result<()> {
    use axum::response::IntoResponse;
    use dnsplan_common::store::wire::{ErrorBody, WireError};
    use dnsplan_common::{ApplyOutcome, Generation};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    let envelopes = Arc::new(AtomicU32::new(0));
    let json_only = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let dir = tempfile::tempdir()?;
    let ctl = Control::new(SledStore::open(dir.path())?, Access::token(TOKEN).expect("token"));
    let (seen, refuse) = (envelopes.clone(), json_only.clone());
    let app = router(ctl.clone()).with_state(ctl).layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let (seen, refuse) = (seen.clone(), refuse.clone());
            async move {
                let envelope = req.headers().get("content-type").is_some_and(|v| v.as_bytes() == b"application/octet-stream");
                if req.uri().path() == "/v1/apply" && envelope {
                    seen.fetch_add(1, Ordering::SeqCst);
                    if refuse.load(Ordering::SeqCst) {
                        let detail = "expected value at line 1 column 1".to_owned();
                        let body = ErrorBody { message: format!("bad request: {detail}"), error: WireError::BadRequest { detail } };
                        return (axum::http::StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
                    }
                }
                next.run(req).await
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let p = plan(1, &[name("x"), name("y")], planner());
    let items: Vec<_> = p
        .plan()
        .endpoints
        .iter()
        .map(|(endpoint, records)| dnsplan_common::store::ApplyItem { endpoint: endpoint.clone(), records: records.clone() })
        .collect();
    let older = RemoteStore::new(&base, Some(TOKEN.into()))?;
    older.publish(&p).await?;
    for (batch, want) in [(&items[..1], 1), (&items[1..], 1)] {
        let results = older.apply_many(Generation(1), batch).await?;
        assert!(results.iter().all(|r| matches!(r, Ok(ApplyOutcome::Switched { .. }))), "{results:?}");
        assert_eq!(envelopes.load(Ordering::SeqCst), want, "one envelope refused, then JSON only");
    }
    json_only.store(false, Ordering::SeqCst);
    let newer = RemoteStore::new(&base, Some(TOKEN.into()))?;
    let results = newer.apply_many(Generation(1), &items).await?;
    assert!(results.iter().all(|r| matches!(r, Ok(ApplyOutcome::Unchanged))), "{results:?}");
    assert_eq!(envelopes.load(Ordering::SeqCst), 2, "an authority that reads envelopes gets one");
    Ok(())
}
