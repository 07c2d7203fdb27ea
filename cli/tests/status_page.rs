//! The status page in a real browser: `dnsplan up` as a process, a backend failed through the
//! CLI, then `/ui` and the new plan's page opened in headless Chromium (Debian's `chromium`,
//! installed by `.ci/run`). The test reads the page as the browser built it (`--dump-dom`)
//! and saves a screenshot at a phone's width as a test artifact
//! (`target/tmp/status-page.png`).

mod support;

use dnsplan_common::Store;
use dnsplan_common::store::remote::RemoteStore;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// How long one Chromium run may take; far more than it needs.
const BROWSER_WITHIN: Duration = Duration::from_secs(90);

/// The browser's binary: `chromium` (Debian), or what `CHROMIUM` names.
fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into())
}

/// Runs headless Chromium with `args` and a profile of its own under `dir`; its stdout. A
/// missing browser is a failure that says what to install.
fn browser(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let profile = tempfile::tempdir_in(dir)?;
    let mut child = Command::new(chromium())
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}; install Debian's `chromium` package (.ci/run does)", chromium()))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::io::read_to_string(stdout));
    });
    let out = rx.recv_timeout(BROWSER_WITHIN);
    let _ = child.kill();
    let status = child.wait()?;
    match out {
        Ok(text) => {
            let text = text?;
            anyhow::ensure!(status.success() || !text.is_empty(), "chromium {args:?} failed: {status}");
            Ok(text)
        }
        Err(_) => anyhow::bail!("chromium {args:?} did not finish within {BROWSER_WITHIN:?}"),
    }
}

/// The page as the browser built it.
fn dom(dir: &Path, url: &str) -> anyhow::Result<String> {
    browser(dir, &["--dump-dom", url])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_a_failed_backend_and_its_plan() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let up = up(dir.path())?;
    let store = RemoteStore::new(&up.control, Some(TOKEN.into()))?;
    until_plan(&store, |p| p.plan().endpoints.len() == 2).await?;

    // A backend fails: the planner publishes a plan without it.
    ok(&dnsplan(&up, &["backend", "fail", "127.0.0.11"])?);
    let removed = until_plan(&store, |p| weight(p, "127.0.0.11") == Some(0)).await?;
    let g = removed.generation();
    // Enacted: the page then shows the endpoint at the new plan.
    let started = Instant::now();
    while store.active(&"api.example.test.".parse()?).await?.is_none_or(|r| r.generation < g) {
        anyhow::ensure!(started.elapsed() < WITHIN, "plan {g} was not enacted within {WITHIN:?}");
        let version = store.version().await?;
        store.wait_for_change(version, Duration::from_secs(1)).await?;
    }

    let index = format!("{}/ui", up.control);
    let page = dom(dir.path(), &index)?;
    for want in [
        "automation running".to_owned(),
        format!("latest plan <a href=\"/ui/plans/{g}\">{g}</a>"),
        // The planner's health of the failed target, beside its address.
        "127.0.0.11 <span class=\"muted\">zone a weight 0</span> <span class=\"down\">down</span>".to_owned(),
        // The planner's last decision (published, or no change since).
        "<p>last decision: ".to_owned(),
        "lease held by <b>planner</b>".to_owned(),
        "<td>enactor-a</td>".to_owned(),
    ] {
        assert!(page.contains(&want), "the status page lacks {want:?}:\n{page}");
    }

    // The plan's own page: its diff against its parent and why.
    let plan_page = dom(dir.path(), &format!("{}/ui/plans/{g}", up.control))?;
    for want in ["- api.example.test. 127.0.0.11 zone a weight 1", "+ api.example.test. 127.0.0.11 zone a weight 0", "down"] {
        assert!(plan_page.contains(want), "plan {g}'s page lacks {want:?}:\n{plan_page}");
    }

    // A screenshot at a phone's width, kept as an artifact.
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    browser(dir.path(), &[&format!("--screenshot={}", shot.display()), "--window-size=430,1400", &index])?;
    let png = std::fs::read(&shot).map_err(|e| anyhow::anyhow!("no screenshot at {}: {e}", shot.display()))?;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "not a screenshot: {} bytes", png.len());
    Ok(())
}
