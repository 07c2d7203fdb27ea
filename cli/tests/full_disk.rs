//! A full disk under `dnsplan up`, as an operator meets it: the data directory is a small
//! tmpfs (in a mount namespace of the stack's own), operator plans are published until a
//! write fails, then the filesystem is grown. sled refuses every call after one failed write
//! until it is opened again; the store must say why while it cannot write (status, metric),
//! keep DNS answering, and write again within seconds of the space coming back, without a
//! restart.

mod support;

use dnsplan_common::plan::{Author, Plan};
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::{EndpointName, Store, StoreError, ValidatedPlan};
use std::process::Command;
use std::time::{Duration, Instant};
use support::{TOKEN, Up, dnsplan, spawn_up, until_dns, up_command};

/// The data directory's filesystem before and after it grows.
const SMALL: &str = "size=3m";
const GROWN: &str = "size=64m";
/// Endpoints each filling plan adds.
const FILL_ENDPOINTS: usize = 400;
/// Most filling plans: a 3 MiB filesystem is full long before.
const FILL_PLANS_MAX: usize = 400;
/// How long writes may take to come back once the filesystem has grown (the store reopens
/// every second).
const RESUME_WITHIN: Duration = Duration::from_secs(20);

fn require(tool: &str) -> anyhow::Result<()> {
    let found = Command::new(tool).arg("--version").output();
    anyhow::ensure!(found.is_ok(), "{tool} is not installed (Debian package util-linux or mount); this test needs it");
    Ok(())
}

/// The latest plan with `count` more endpoints, as an operator's plan after it.
fn grown(latest: &ValidatedPlan, label: &str, count: usize) -> anyhow::Result<ValidatedPlan> {
    let mut plan: Plan = latest.plan().clone();
    let records = plan.endpoints.values().next().cloned().ok_or_else(|| anyhow::anyhow!("plan {} serves nothing", plan.generation))?;
    for i in 0..count {
        plan.endpoints.insert(EndpointName::parse(&format!("{label}-{i}.example.test."))?, records.clone());
    }
    plan.parent_generation = plan.generation;
    plan.generation = plan.generation.next().ok_or_else(|| anyhow::anyhow!("generations exhausted"))?;
    plan.author = Author::Operator { name: "disk-filler".into() };
    plan.reason = format!("fill the disk: {label}");
    plan.retired.clear();
    plan.rollback_of = None;
    // Signed as the CLI signs with the demo token: `dnsplan up` trusts its demo key only.
    Ok(dnsplan_common::signing::SigningKey::demo().sign(ValidatedPlan::new(plan)?))
}

/// Publishes the latest plan grown by `count` endpoints named `label-N`, again after a
/// conflict with the planner.
async fn publish_grown(store: &RemoteStore, label: &str, count: usize) -> Result<(), StoreError> {
    loop {
        let latest = store.plan(store.latest().await?).await?;
        let plan = grown(&latest, label, count).map_err(|e| StoreError::BadRequest(e.to_string()))?;
        match store.publish(&plan).await {
            Err(StoreError::Conflict { .. }) => continue,
            other => return other,
        }
    }
}

async fn writes_failing(up: &Up) -> anyhow::Result<Option<bool>> {
    let text = reqwest::get(format!("{}/metrics", up.control)).await?.text().await?;
    Ok(text.lines().find_map(|l| l.strip_prefix("dnsplan_store_writes_failing ")).map(|v| v.trim() == "1"))
}

/// Teeth: without the reopen (`Shared::failed` not starting it), every write after the
/// filesystem has grown still fails, and the test fails with "writes did not resume".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_resume_once_the_full_disk_has_room_again() -> anyhow::Result<()> {
    for tool in ["unshare", "nsenter"] {
        require(tool)?;
    }
    let namespace = Command::new("unshare").args(["--mount", "--propagation", "private", "--", "true"]).output()?;
    anyhow::ensure!(
        namespace.status.success(),
        "this test mounts a small tmpfs in a mount namespace of its own, which needs root (CI runs as root): {}",
        String::from_utf8_lossy(&namespace.stderr)
    );
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data)?;
    // `dnsplan up` as shipped, in a mount namespace whose data directory is a small tmpfs.
    let shipped = up_command(dir.path())?;
    let mut wrapped = Command::new("unshare");
    wrapped
        .args(["--mount", "--propagation", "private", "--", "sh", "-c", r#"mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@""#])
        .args(["sh", SMALL])
        .arg(&data)
        .arg(shipped.get_program())
        .args(shipped.get_args())
        .env_remove("DNSPLAN_TOKEN");
    let up = spawn_up(&mut wrapped)?;
    let store = RemoteStore::new(&up.control, Some(TOKEN.into()))?;
    until_dns(up.dns, "api.example.test.", |a| !a.is_empty()).await?;
    assert_eq!(writes_failing(&up).await?, Some(false), "dnsplan_store_writes_failing is missing or set on a new stack");

    // Fill it.
    let mut failed = None;
    for round in 0..FILL_PLANS_MAX {
        if let Err(err) = publish_grown(&store, &format!("fill{round}"), FILL_ENDPOINTS).await {
            failed = Some((round, err));
            break;
        }
    }
    let Some((round, err)) = failed else { anyhow::bail!("{FILL_PLANS_MAX} plans of {FILL_ENDPOINTS} endpoints did not fill {SMALL}") };
    eprintln!("the publish of plan {round} failed: {err}");

    // While it cannot write: the metric, `dnsplan status` and the publishes say why; DNS answers.
    let deadline = Instant::now() + Duration::from_secs(10);
    while writes_failing(&up).await? != Some(true) {
        anyhow::ensure!(Instant::now() < deadline, "dnsplan_store_writes_failing never went to 1 after: {err}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = dnsplan(&up, &["status"])?;
    let said = String::from_utf8_lossy(&status.stderr);
    assert_eq!(status.status.code(), Some(6), "status while the disk is full: {said}");
    for want in ["writes fail", "No space left on device", "bytes free on the disk of", "free space there"] {
        assert!(said.contains(want), "status does not say {want:?}: {said}");
    }
    let refused = publish_grown(&store, "refused", 1).await.expect_err("a publish on a full disk");
    assert!(refused.to_string().contains("writes fail"), "{refused}");
    until_dns(up.dns, "api.example.test.", |a| !a.is_empty()).await?;

    // Grow the filesystem, as an operator would, in the stack's own mount namespace.
    let pid = up.child.id().to_string();
    let grow = Command::new("nsenter")
        .args(["--target", &pid, "--mount", "--", "mount", "-o"])
        .arg(format!("remount,{GROWN}"))
        .arg(&data)
        .output()?;
    anyhow::ensure!(grow.status.success(), "growing the tmpfs failed: {}", String::from_utf8_lossy(&grow.stderr));

    let grown_at = Instant::now();
    loop {
        match publish_grown(&store, "after", 1).await {
            Ok(()) => break,
            Err(err) if grown_at.elapsed() < RESUME_WITHIN => {
                let _ = err;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => anyhow::bail!("writes did not resume within {RESUME_WITHIN:?} of the disk growing: {err}"),
        }
    }
    eprintln!("writes resumed {:?} after the disk grew", grown_at.elapsed());
    assert_eq!(writes_failing(&up).await?, Some(false), "dnsplan_store_writes_failing still 1 after a write succeeded");
    let status = dnsplan(&up, &["status"])?;
    assert!(status.status.success(), "status after the disk grew: {}", String::from_utf8_lossy(&status.stderr));
    // The plan published after it is applied and served.
    until_dns(up.dns, "after-0.example.test.", |a| !a.is_empty()).await?;
    Ok(())
}
