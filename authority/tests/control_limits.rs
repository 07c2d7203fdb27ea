//! What a client can hold of the control API: half-sent requests and bodies and idle
//! keep-alive connections are closed after their timeouts, connections over the cap wait to
//! be accepted, full-state reads are served a few at a time and status summaries one at a
//! time, and a normal request is answered while abusive ones are held.
//!
//! Before the limits (axum's `serve`, which sets no timer for hyper), half-sent requests and
//! idle connections were held for as long as the client liked and every connection was
//! accepted; each test below failed then (checked once by serving with `axum::serve` again).

mod support;

use dnsplan_authority::config::AuthorityConfig;
use dnsplan_authority::run::{Bound, run_with_store};
use dnsplan_common::store::zones::{ManagedZone, ManagedZones};
use dnsplan_common::store::{CleanupDecision, CleanupReport, Lease};
use dnsplan_common::{
    ActiveRecord, ActiveSnapshot, ApplyOutcome, Endpoint, EndpointName, Generation, Heartbeat, PauseState, PlanSummary, SledStore, Store,
    StoreResult, StoreVersion, ValidatedPlan,
};
use dnsplan_common::{DnsName, StoreError};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long anything we wait for may take; far more than it needs.
const DEADLINE: Duration = Duration::from_secs(30);
/// Half-sent requests held at once: more than a handful, fewer than the cap.
const HALF_SENT: usize = 200;

struct Control {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Control {
    /// An authority whose `[control]` table has `limits` (TOML lines) besides listen and token.
    async fn start(dir: &Path, limits: &str) -> anyhow::Result<Control> {
        Control::start_with(SledStore::open(dir.join("data"))?, dir, limits).await
    }

    /// As `start`, on `store`.
    async fn start_with<S: ManagedZones>(store: S, dir: &Path, limits: &str) -> anyhow::Result<Control> {
        std::fs::write(dir.join("zone.db"), support::ZONE_FILE)?;
        let text = format!(
            "data_dir = \"{data}\"\n[dns]\nlisten = [\"127.0.0.1:0\"]\n[control]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n{limits}\n\
             [dns_zone]\norigin = \"example.test.\"\nns = [\"ns1.example.test.\"]\nmaster_file = \"zone.db\"\n\
             [dns_zone.soa]\nmname = \"ns1.example.test.\"\nrname = \"hostmaster.example.test.\"\n",
            data = dir.join("data").display(),
            token = support::TOKEN,
        );
        let path = dir.join("authority.toml");
        std::fs::write(&path, text)?;
        let config = AuthorityConfig::load(&path)?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<Bound>();
        let dir = dir.to_path_buf();
        let task = tokio::spawn(async move {
            run_with_store(store, config, &dir, async move { stop_rx.await.unwrap_or(()) }, move |b| {
                let _ = bound_tx.send(b);
            })
            .await
        });
        let bound = bound_rx.await.map_err(|_| anyhow::anyhow!("authority stopped before binding"))?;
        Ok(Control { addr: bound.control, stop: Some(stop_tx), task })
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(DEADLINE, &mut self.task).await???;
        Ok(())
    }
}

const VERSION_REQUEST: &[u8] = b"GET /v1/version HTTP/1.1\r\nHost: test\r\n\r\n";

/// Reads until the server closes the connection (end of file or reset); `Err` on timeout.
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> Result<Vec<u8>, tokio::time::error::Elapsed> {
    tokio::time::timeout(wait, async {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return seen,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
}

/// Reads one whole response to `VERSION_REQUEST` (its body is short JSON with a length).
async fn read_response(stream: &mut TcpStream) -> anyhow::Result<String> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(DEADLINE, stream.read(&mut buf)).await??;
        anyhow::ensure!(n > 0, "closed after {:?}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&seen).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>()))
                .transpose()?;
            if length.is_some_and(|len| body.len() >= len) {
                return Ok(text);
            }
        }
    }
}

async fn version_answers(addr: SocketAddr) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().timeout(DEADLINE).build()?;
    let resp = client.get(format!("http://{addr}/v1/version")).send().await?;
    anyhow::ensure!(resp.status() == 200, "GET /v1/version: {}", resp.status());
    Ok(())
}

/// Many clients that send half a request head are all disconnected after
/// `header_timeout_secs`, and a normal request is answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_are_closed_after_the_header_timeout() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let control = Control::start(dir.path(), "header_timeout_secs = 1").await?;
    let started = Instant::now();
    let mut held = Vec::with_capacity(HALF_SENT);
    for _ in 0..HALF_SENT {
        let mut stream = TcpStream::connect(control.addr).await?;
        stream.write_all(b"GET /v1/version HTTP/1.1\r\nHost: te").await?;
        held.push(stream);
    }
    version_answers(control.addr).await?;
    let (mut closed, deadline) = (0, Instant::now() + DEADLINE);
    for stream in &mut held {
        if closed_within(stream, deadline.saturating_duration_since(Instant::now())).await.is_ok() {
            closed += 1;
        }
    }
    assert_eq!(closed, HALF_SENT, "half-sent requests closed");
    assert!(started.elapsed() >= Duration::from_secs(1), "closed before the timeout");
    control.stop().await
}

/// A keep-alive connection that sends nothing after its answer is closed after
/// `header_timeout_secs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_closed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let control = Control::start(dir.path(), "header_timeout_secs = 1").await?;
    let mut stream = TcpStream::connect(control.addr).await?;
    stream.write_all(VERSION_REQUEST).await?;
    let answer = read_response(&mut stream).await?;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(closed_within(&mut stream, DEADLINE).await.is_ok(), "the idle connection is still open after {DEADLINE:?}");
    control.stop().await
}

/// A request whose body stops coming fails after `body_timeout_secs`, and its connection
/// closes; a normal request is answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_bodies_time_out() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let control = Control::start(dir.path(), "body_timeout_secs = 1").await?;
    let mut held = Vec::new();
    for _ in 0..50 {
        let mut stream = TcpStream::connect(control.addr).await?;
        let head = format!(
            "POST /v1/heartbeats HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"id\":",
            support::TOKEN
        );
        stream.write_all(head.as_bytes()).await?;
        held.push(stream);
    }
    version_answers(control.addr).await?;
    let (mut failed, deadline) = (0, Instant::now() + DEADLINE);
    for stream in &mut held {
        if let Ok(seen) = closed_within(stream, deadline.saturating_duration_since(Instant::now())).await {
            let text = String::from_utf8_lossy(&seen);
            assert!(text.is_empty() || text.starts_with("HTTP/1.1 4"), "{text}");
            failed += 1;
        }
    }
    assert_eq!(failed, held.len(), "half-sent bodies ended");
    control.stop().await
}

/// With `connections_max` connections open, the next one is not served until one closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_wait_for_a_free_slot() -> anyhow::Result<()> {
    const CAP: usize = 4;
    let dir = tempfile::tempdir()?;
    let control = Control::start(dir.path(), &format!("connections_max = {CAP}\nheader_timeout_secs = 60")).await?;
    let mut open = Vec::new();
    for _ in 0..CAP {
        let mut stream = TcpStream::connect(control.addr).await?;
        stream.write_all(VERSION_REQUEST).await?;
        read_response(&mut stream).await?;
        open.push(stream);
    }
    // The kernel completes the handshake; the server does not take the connection yet.
    let mut waiting = TcpStream::connect(control.addr).await?;
    waiting.write_all(VERSION_REQUEST).await?;
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(500), waiting.read(&mut byte)).await;
    assert!(early.is_err(), "a connection over the cap was served: {early:?}");
    drop(open.pop());
    let answer = read_response(&mut waiting).await?;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(open);
    control.stop().await
}

/// A store whose `active_all` waits until `open` is set, counting the callers inside it.
#[derive(Clone)]
struct Gated {
    inner: SledStore,
    open: tokio::sync::watch::Sender<bool>,
    inside: Arc<AtomicUsize>,
    inside_max: Arc<AtomicUsize>,
}

impl Store for Gated {
    async fn publish(&self, plan: &ValidatedPlan) -> StoreResult<()> {
        self.inner.publish(plan).await
    }
    async fn publish_leased(&self, plan: &ValidatedPlan, lease: &Lease) -> StoreResult<()> {
        self.inner.publish_leased(plan, lease).await
    }
    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> StoreResult<Lease> {
        self.inner.acquire_lease(holder, ttl).await
    }
    async fn release_lease(&self, lease: &Lease) -> StoreResult<()> {
        self.inner.release_lease(lease).await
    }
    async fn lease(&self) -> StoreResult<Option<Lease>> {
        self.inner.lease().await
    }
    async fn plan(&self, generation: Generation) -> StoreResult<ValidatedPlan> {
        self.inner.plan(generation).await
    }
    async fn latest(&self) -> StoreResult<Generation> {
        self.inner.latest().await
    }
    async fn generation_base(&self) -> StoreResult<Generation> {
        self.inner.generation_base().await
    }
    async fn list_unchecked(&self, from: Generation, limit: usize) -> StoreResult<Vec<PlanSummary>> {
        self.inner.list(from, limit).await
    }
    async fn apply(&self, endpoint: &EndpointName, generation: Generation, records: &Endpoint) -> StoreResult<ApplyOutcome> {
        self.inner.apply(endpoint, generation, records).await
    }
    async fn retire(&self, endpoint: &EndpointName, generation: Generation) -> StoreResult<ApplyOutcome> {
        self.inner.retire(endpoint, generation).await
    }
    async fn active(&self, endpoint: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        self.inner.active(endpoint).await
    }
    async fn active_all(&self) -> StoreResult<ActiveSnapshot> {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.inside_max.fetch_max(now, Ordering::SeqCst);
        let mut open = self.open.subscribe();
        let _ = open.wait_for(|open| *open).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
        self.inner.active_all().await
    }
    async fn cleanup_preview(&self, retain: u64) -> StoreResult<CleanupDecision> {
        self.inner.cleanup_preview(retain).await
    }
    async fn cleanup(&self, retain: u64) -> StoreResult<CleanupReport> {
        self.inner.cleanup(retain).await
    }
    async fn pause_unchecked(&self, state: PauseState) -> StoreResult<()> {
        self.inner.pause(state).await
    }
    async fn resume(&self) -> StoreResult<()> {
        self.inner.resume().await
    }
    async fn paused(&self) -> StoreResult<Option<PauseState>> {
        self.inner.paused().await
    }
    async fn heartbeat_unchecked(&self, heartbeat: Heartbeat) -> StoreResult<()> {
        self.inner.heartbeat(heartbeat).await
    }
    async fn heartbeats(&self) -> StoreResult<Vec<Heartbeat>> {
        self.inner.heartbeats().await
    }
    async fn version(&self) -> StoreResult<StoreVersion> {
        self.inner.version().await
    }
    async fn wait_for_change_unchecked(&self, seen: StoreVersion, timeout: Duration) -> StoreResult<StoreVersion> {
        self.inner.wait_for_change(seen, timeout).await
    }
}

/// Full-state reads beyond `full_reads_max` wait for one to finish; other routes are served
/// meanwhile. Without the limit all of them read the store at once (checked once by removing
/// the layer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_state_reads_are_served_a_few_at_a_time() -> anyhow::Result<()> {
    const FULL_READS_MAX: usize = 2;
    const READERS: usize = 6;
    let dir = tempfile::tempdir()?;
    let (open, _) = tokio::sync::watch::channel(false);
    let store = Gated { inner: SledStore::open(dir.path())?, open, inside: Arc::default(), inside_max: Arc::default() };
    let ctl = dnsplan_authority::control::routes::Control::new(
        store.clone(),
        dnsplan_authority::control::access::Access::token(support::TOKEN).expect("token"),
    )
    .with_full_reads_max(FULL_READS_MAX);
    let app = dnsplan_authority::control::routes::router(ctl.clone()).with_state(ctl);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    let client = reqwest::Client::builder().timeout(DEADLINE).build()?;
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let request = client.get(format!("http://{addr}/v1/active"));
            tokio::spawn(async move { request.send().await.map(|r| r.status()) })
        })
        .collect();
    let started = Instant::now();
    while store.inside.load(Ordering::SeqCst) < FULL_READS_MAX {
        assert!(started.elapsed() < DEADLINE, "the full reads did not reach the store");
        tokio::task::yield_now().await;
    }
    // The others are queued: a cheap read is answered while they wait, and none gets in.
    version_answers(addr).await?;
    assert_eq!(store.inside_max.load(Ordering::SeqCst), FULL_READS_MAX);
    store.open.send_replace(true);
    for reader in readers {
        assert_eq!(reader.await??, 200);
    }
    assert_eq!(store.inside_max.load(Ordering::SeqCst), FULL_READS_MAX);
    Ok(())
}

/// `/v1/status` summaries beyond `status_reads_max` wait for one to finish; other routes are
/// served meanwhile. Without the limit every poller computes its summary at once, on every
/// core (checked once by removing the layer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_summaries_are_computed_one_at_a_time() -> anyhow::Result<()> {
    const READERS: usize = 4;
    let dir = tempfile::tempdir()?;
    // Open while the authority loads its first snapshot (a page read goes through the gate).
    let (open, _) = tokio::sync::watch::channel(true);
    let store = Gated { inner: SledStore::open(dir.path().join("data"))?, open, inside: Arc::default(), inside_max: Arc::default() };
    let control = Control::start_with(store.clone(), dir.path(), "status_reads_max = 1").await?;
    store.open.send_replace(false);
    store.inside_max.store(0, Ordering::SeqCst);

    let client = reqwest::Client::builder().timeout(DEADLINE).build()?;
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let request = client.get(format!("http://{}/v1/status", control.addr));
            tokio::spawn(async move { request.send().await.map(|r| r.status()) })
        })
        .collect();
    let started = Instant::now();
    while store.inside.load(Ordering::SeqCst) < 1 {
        assert!(started.elapsed() < DEADLINE, "no status read reached the store");
        tokio::task::yield_now().await;
    }
    version_answers(control.addr).await?;
    assert_eq!(store.inside_max.load(Ordering::SeqCst), 1, "status reads in the store at once");
    store.open.send_replace(true);
    for reader in readers {
        assert_eq!(reader.await??, 200);
    }
    assert_eq!(store.inside_max.load(Ordering::SeqCst), 1, "status reads in the store at once");
    control.stop().await
}

/// The gate is the first zone's; no zone is added beside it.
impl ManagedZones for Gated {
    async fn zone(&self, origin: &DnsName) -> StoreResult<Gated> {
        Err(StoreError::ZoneGone { zone: origin.clone() })
    }
    async fn add_zone(&self, origin: &DnsName, _master: &str) -> StoreResult<bool> {
        Err(StoreError::BadRequest(format!("the gated store has one zone; {origin} is not added")))
    }
    async fn zone_master(&self, origin: &DnsName) -> StoreResult<String> {
        Err(StoreError::ZoneGone { zone: origin.clone() })
    }

    async fn remove_zone(&self, _origin: &DnsName) -> StoreResult<bool> {
        Ok(false)
    }
    async fn zones(&self) -> StoreResult<Vec<ManagedZone>> {
        Ok(Vec::new())
    }
    async fn registry_version(&self) -> StoreResult<u64> {
        Ok(0)
    }
}
