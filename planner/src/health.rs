//! Health checking, the I/O shell around the pure core: concurrent TCP and HTTP probes with a
//! timeout each and a bound on how many run at once, folded into per-target state with
//! rise/fall hysteresis.
//!
//! Each target has its own task, on its check's interval, so one target has at most one probe
//! in flight. `probe_concurrency` bounds the probes in flight of targets that answer: a probe
//! holds one of its permits for at most [`SLOW_PROBE_AFTER`], then gives it back and goes on
//! to its timeout outside the bound; while a target stays slow (its last probe took that
//! long, or timed out) its probes take no permit at all. So backends that accept and never
//! answer (a gray failure) cannot hold the permits for their whole timeout and delay every
//! other target's probe; they cost one socket each, at most one per target. The sizing rule:
//! `probe_concurrency` at least the probes/s of all targets times the time a probe of a
//! target that answers takes (64 covers 5,000 probes/s at 10 ms each), and file descriptors
//! for `probe_concurrency` plus every target that may hang (the daemon raises its limit to the
//! hard limit at start). When probes start later than one interval after their time, one WARN
//! line says so, with what is in flight; `dnsplan_planner_probe_lag_seconds` has the spread.
//!
//! A probe that fails on the checker's own side (no file descriptor, no buffer space, no
//! memory, no local address) says nothing about the target: it is [`Verdict::Inconclusive`],
//! which makes the target's health `Unknown` (the planner then keeps its weight), never
//! `Down`. Otherwise a planner that ran out of descriptors would remove healthy targets.

use crate::config::{Check, PlannerConfig, Probe};
use crate::decide::{Health, HealthView};
use crate::metrics::Metrics;
use dnsplan_common::EndpointName;
use rand::RngExt;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};

/// How long a probe holds a `probe_concurrency` permit at most (or its check's timeout, if
/// shorter); a target whose probe took that long is slow until a probe of it is quicker.
pub const SLOW_PROBE_AFTER: Duration = Duration::from_millis(100);

/// Most body bytes an HTTP check reads looking for `body_contains`.
pub const HTTP_BODY_BYTES_MAX: usize = 64 * 1024;

/// A target's verdict with rise/fall hysteresis. It starts `Unknown`: `rise` successes make
/// it `Up`, `fall` failures make it `Down`; after that, `fall` consecutive failures take an
/// up target down and `rise` consecutive successes bring a down one back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hysteresis {
    pub state: Health,
    successes: u32,
    failures: u32,
}

impl Default for Hysteresis {
    fn default() -> Self {
        Hysteresis { state: Health::Unknown, successes: 0, failures: 0 }
    }
}

impl Hysteresis {
    /// Folds one probe result in; true when the verdict changed.
    pub fn observe(&mut self, ok: bool, rise: u32, fall: u32) -> bool {
        let before = self.state;
        if ok {
            self.successes = self.successes.saturating_add(1);
            self.failures = 0;
            if self.state != Health::Up && self.successes >= rise {
                self.state = Health::Up;
            }
        } else {
            self.failures = self.failures.saturating_add(1);
            self.successes = 0;
            if self.state != Health::Down && self.failures >= fall {
                self.state = Health::Down;
            }
        }
        self.state != before
    }
}

/// Every target's hysteresis, shared by the probes (writers) and the planner (reader).
#[derive(Default)]
pub struct HealthBook {
    targets: Mutex<BTreeMap<(EndpointName, IpAddr), Hysteresis>>,
    /// Woken whenever a verdict changes, so that the planner decides at once.
    pub changed: Notify,
}

impl HealthBook {
    pub fn view(&self) -> HealthView {
        let targets = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        targets.iter().map(|(k, h)| (k.clone(), h.state)).collect()
    }

    pub fn observe(&self, endpoint: &EndpointName, address: IpAddr, ok: bool, check: &Check) -> bool {
        self.update(endpoint, address, |h| h.observe(ok, check.rise.get(), check.fall.get()))
    }

    /// The checker could not probe: the target's health is not known.
    pub fn unknown(&self, endpoint: &EndpointName, address: IpAddr) -> bool {
        self.update(endpoint, address, |h| {
            let changed = h.state != Health::Unknown;
            *h = Hysteresis::default();
            changed
        })
    }

    fn update(&self, endpoint: &EndpointName, address: IpAddr, f: impl FnOnce(&mut Hysteresis) -> bool) -> bool {
        let changed = {
            let mut targets = self.targets.lock().unwrap_or_else(|p| p.into_inner());
            f(targets.entry((endpoint.clone(), address)).or_default())
        };
        if changed {
            self.changed.notify_one();
        }
        changed
    }
}

/// What one probe says of its target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Up,
    /// The target failed the check; why, for the logs.
    Down(String),
    /// The checker could not probe (see the module docs); why, for the logs.
    Inconclusive(String),
}

/// OS errors that are the checker's own trouble, not the target's.
const CHECKER_SIDE_ERRNOS: [nix::errno::Errno; 5] = [
    nix::errno::Errno::EMFILE,
    nix::errno::Errno::ENFILE,
    nix::errno::Errno::ENOBUFS,
    nix::errno::Errno::ENOMEM,
    nix::errno::Errno::EADDRNOTAVAIL,
];

/// Whether `err` or any of its sources is an OS error on the checker's side.
fn checker_side(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(code) = io.raw_os_error()
            && CHECKER_SIDE_ERRNOS.iter().any(|c| *c as i32 == code)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// One probe, classified (see [`Verdict`]).
pub async fn verdict(client: &reqwest::Client, address: IpAddr, check: &Check) -> Verdict {
    match attempt(client, address, check).await {
        Ok(()) => Verdict::Up,
        Err(Failure::Target(why)) => Verdict::Down(why),
        Err(Failure::Checker(why)) => Verdict::Inconclusive(why),
    }
}

/// One probe. `Err` says why it failed, for the logs; a failure on the checker's side is an
/// `Err` too (use [`verdict`] to tell them apart).
pub async fn probe(client: &reqwest::Client, address: IpAddr, check: &Check) -> Result<(), String> {
    match verdict(client, address, check).await {
        Verdict::Up => Ok(()),
        Verdict::Down(why) => Err(why),
        Verdict::Inconclusive(why) => Err(format!("inconclusive: {why}")),
    }
}

enum Failure {
    Target(String),
    Checker(String),
}

impl Failure {
    fn of(context: String, err: &(dyn std::error::Error + 'static)) -> Failure {
        let text = format!("{context}: {err}");
        if checker_side(err) { Failure::Checker(text) } else { Failure::Target(text) }
    }
}

impl From<String> for Failure {
    fn from(why: String) -> Failure {
        Failure::Target(why)
    }
}

async fn attempt(client: &reqwest::Client, address: IpAddr, check: &Check) -> Result<(), Failure> {
    let timeout = Duration::from_millis(check.timeout_ms.0);
    let attempt = async {
        match &check.probe {
            Probe::Tcp { port } => tokio::net::TcpStream::connect(SocketAddr::new(address, *port))
                .await
                .map(drop)
                .map_err(|e| Failure::of("connect".into(), &e)),
            Probe::Http { port, path, expect, body_contains } => {
                let host = match address {
                    IpAddr::V4(a) => a.to_string(),
                    IpAddr::V6(a) => format!("[{a}]"),
                };
                let resp =
                    client.get(format!("http://{host}:{port}{path}")).send().await.map_err(|e| Failure::of(format!("GET {path}"), &e))?;
                let status = resp.status().as_u16();
                if !expect.accepts(status) {
                    return Err(format!("GET {path}: status {status}").into());
                }
                if let Some(needle) = body_contains {
                    let body = read_prefix(resp).await?;
                    if !String::from_utf8_lossy(&body).contains(needle.as_str()) {
                        return Err(format!("GET {path}: body does not contain {needle:?}").into());
                    }
                }
                Ok(())
            }
        }
    };
    tokio::time::timeout(timeout, attempt).await.map_err(|_| Failure::Target(format!("timed out after {timeout:?}")))?
}

async fn read_prefix(mut resp: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while body.len() < HTTP_BODY_BYTES_MAX {
        match resp.chunk().await.map_err(|e| format!("reading the body: {e}"))? {
            Some(chunk) => body.extend_from_slice(&chunk[..chunk.len().min(HTTP_BODY_BYTES_MAX - body.len())]),
            None => break,
        }
    }
    Ok(body)
}

/// Whether probes run behind their interval, to say so once when they start to and once when
/// they stop.
#[derive(Default)]
struct Behind(AtomicBool);

impl Behind {
    /// A probe started `lag` after its time, on a check of `interval`.
    fn observe(&self, lag: Duration, interval: Duration, permits: &Semaphore, concurrency: usize, metrics: &Metrics) {
        if lag > interval {
            if !self.0.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    lag_ms = lag.as_millis() as u64,
                    interval_ms = interval.as_millis() as u64,
                    in_flight = metrics.probes_in_flight.get(),
                    slow_targets = metrics.probe_slow_targets.get(),
                    permits_free = permits.available_permits(),
                    probe_concurrency = concurrency,
                    "health probes run behind their interval: every probe_concurrency permit is taken by targets that answer slowly but within 100 ms; raise planner.probe_concurrency, or lengthen the checks' interval_ms"
                );
            }
        } else if lag < interval / 10 && self.0.swap(false, Ordering::Relaxed) {
            tracing::info!("health probes run on time again");
        }
    }
}

/// Starts one probing task per target (each on its check's interval, with a random start
/// offset so that probes spread out) and returns their handles; dropping the set stops them.
/// See the module docs for how `probe_concurrency` bounds them.
pub fn spawn_checks(config: &PlannerConfig, book: Arc<HealthBook>, metrics: Arc<Metrics>) -> tokio::task::JoinSet<()> {
    let concurrency = config.planner.probe_concurrency.0.min(10_000) as usize;
    let permits = Arc::new(Semaphore::new(concurrency));
    let behind = Arc::new(Behind::default());
    // No connection reuse: each probe tests a fresh connection, as a client would make one.
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap_or_default();
    let mut tasks = tokio::task::JoinSet::new();
    for ep in config.all_endpoints() {
        for target in &ep.targets {
            let Some(check) = ep.check_for(target).cloned() else { continue }; // config validation requires one
            let (book, metrics, permits, client, behind) = (book.clone(), metrics.clone(), permits.clone(), client.clone(), behind.clone());
            let (endpoint, address, zone) = (ep.name.clone(), target.address, target.zone.clone());
            tasks.spawn(async move {
                let interval = Duration::from_millis(check.interval_ms.0);
                let slow_after = SLOW_PROBE_AFTER.min(Duration::from_millis(check.timeout_ms.0));
                let offset = Duration::from_millis(rand::rng().random_range(0..check.interval_ms.0));
                let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + offset / 4, interval);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut slow = false;
                loop {
                    let due = ticks.tick().await;
                    let permit = if slow {
                        None
                    } else {
                        let Ok(permit) = permits.acquire().await else { return };
                        Some(permit)
                    };
                    let lag = due.elapsed();
                    metrics.probe_lag_seconds.observe(lag.as_secs_f64());
                    behind.observe(lag, interval, &permits, concurrency, &metrics);
                    metrics.probes_in_flight.inc();
                    let started = tokio::time::Instant::now();
                    let probe = verdict(&client, address, &check);
                    tokio::pin!(probe);
                    let result = match tokio::time::timeout(slow_after, &mut probe).await {
                        Ok(result) => result,
                        Err(_slow) => {
                            // The permit goes back: the rest of this probe waits outside the bound.
                            drop(permit);
                            probe.await
                        }
                    };
                    metrics.probes_in_flight.dec();
                    let was_slow = std::mem::replace(&mut slow, started.elapsed() >= slow_after);
                    if slow != was_slow {
                        metrics.probe_slow_targets.inc_by(if slow { 1 } else { -1 });
                    }
                    let changed = match &result {
                        Verdict::Up => {
                            metrics.probe("ok");
                            book.observe(&endpoint, address, true, &check)
                        }
                        Verdict::Down(_) => {
                            metrics.probe("fail");
                            book.observe(&endpoint, address, false, &check)
                        }
                        Verdict::Inconclusive(_) => {
                            metrics.probe("inconclusive");
                            book.unknown(&endpoint, address)
                        }
                    };
                    if changed {
                        let health = book.view().get(&(endpoint.clone(), address)).copied().unwrap_or(Health::Unknown);
                        match &result {
                            Verdict::Up => tracing::info!(%endpoint, %address, %zone, ?health, "target health changed"),
                            Verdict::Down(why) => tracing::warn!(%endpoint, %address, %zone, ?health, reason = %why, "target health changed"),
                            // Logged once per change, not per probe: a checker out of
                            // descriptors must not flood the log.
                            Verdict::Inconclusive(why) => {
                                tracing::warn!(%endpoint, %address, %zone, reason = %why, "cannot check the target from here: its health is unknown and its weight stays")
                            }
                        }
                    }
                }
            });
        }
    }
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An OS error on the checker's side is found however deep in the source chain (reqwest
    /// wraps hyper's, which wraps the connect error); the target's own refusal is not one.
    #[test]
    fn checker_side_errors_are_found_in_the_source_chain() {
        #[derive(Debug)]
        struct Wrapped(std::io::Error);
        impl std::fmt::Display for Wrapped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("client error")
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        for errno in CHECKER_SIDE_ERRNOS {
            assert!(checker_side(&Wrapped(std::io::Error::from_raw_os_error(errno as i32))), "{errno}");
        }
        for errno in [nix::errno::Errno::ECONNREFUSED, nix::errno::Errno::EHOSTUNREACH, nix::errno::Errno::ETIMEDOUT] {
            assert!(!checker_side(&Wrapped(std::io::Error::from_raw_os_error(errno as i32))), "{errno}");
        }
    }

    #[test]
    fn hysteresis_needs_streaks() {
        let mut h = Hysteresis::default();
        assert!(!h.observe(true, 2, 3));
        assert_eq!(h.state, Health::Unknown);
        assert!(h.observe(true, 2, 3));
        assert_eq!(h.state, Health::Up);
        // Two failures and a success: still up, the failure streak starts again.
        for ok in [false, false, true, false, false] {
            assert!(!h.observe(ok, 2, 3), "flapped on {ok}");
        }
        assert!(h.observe(false, 2, 3));
        assert_eq!(h.state, Health::Down);
        assert!(!h.observe(true, 2, 3));
        assert!(h.observe(true, 2, 3));
        assert_eq!(h.state, Health::Up);
    }
}
