//! Health checking, the I/O shell around the pure core: concurrent TCP and HTTP probes with a
//! timeout each and a bound on how many run at once, folded into per-target state with
//! rise/fall hysteresis.

use crate::config::{Check, PlannerConfig, Probe};
use crate::decide::{Health, HealthView};
use crate::metrics::Metrics;
use dnsplan_common::EndpointName;
use rand::RngExt;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};

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
        let changed = {
            let mut targets = self.targets.lock().unwrap_or_else(|p| p.into_inner());
            targets.entry((endpoint.clone(), address)).or_default().observe(ok, check.rise.get(), check.fall.get())
        };
        if changed {
            self.changed.notify_one();
        }
        changed
    }
}

/// One probe. `Err` says why it failed, for the logs.
pub async fn probe(client: &reqwest::Client, address: IpAddr, check: &Check) -> Result<(), String> {
    let timeout = Duration::from_millis(check.timeout_ms.0);
    let attempt = async {
        match &check.probe {
            Probe::Tcp { port } => {
                tokio::net::TcpStream::connect(SocketAddr::new(address, *port)).await.map(drop).map_err(|e| format!("connect: {e}"))
            }
            Probe::Http { port, path, expect, body_contains } => {
                let host = match address {
                    IpAddr::V4(a) => a.to_string(),
                    IpAddr::V6(a) => format!("[{a}]"),
                };
                let resp = client.get(format!("http://{host}:{port}{path}")).send().await.map_err(|e| format!("GET {path}: {e}"))?;
                let status = resp.status().as_u16();
                if !expect.accepts(status) {
                    return Err(format!("GET {path}: status {status}"));
                }
                if let Some(needle) = body_contains {
                    let body = read_prefix(resp).await?;
                    if !String::from_utf8_lossy(&body).contains(needle.as_str()) {
                        return Err(format!("GET {path}: body does not contain {needle:?}"));
                    }
                }
                Ok(())
            }
        }
    };
    tokio::time::timeout(timeout, attempt).await.map_err(|_| format!("timed out after {timeout:?}"))?
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

/// Starts one probing task per target (each on its check's interval, with a random start
/// offset so that probes spread out) and returns their handles; dropping the set stops them.
pub fn spawn_checks(config: &PlannerConfig, book: Arc<HealthBook>, metrics: Arc<Metrics>) -> tokio::task::JoinSet<()> {
    let permits = Arc::new(Semaphore::new(config.planner.probe_concurrency.0.min(10_000) as usize));
    // No connection reuse: each probe tests a fresh connection, as a client would make one.
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap_or_default();
    let mut tasks = tokio::task::JoinSet::new();
    for ep in config.endpoints() {
        for target in &ep.targets {
            let Some(check) = ep.check_for(target).cloned() else { continue }; // config validation requires one
            let (book, metrics, permits, client) = (book.clone(), metrics.clone(), permits.clone(), client.clone());
            let (endpoint, address, zone) = (ep.name.clone(), target.address, target.zone.clone());
            tasks.spawn(async move {
                let interval = Duration::from_millis(check.interval_ms.0);
                let offset = Duration::from_millis(rand::rng().random_range(0..check.interval_ms.0));
                let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + offset / 4, interval);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    ticks.tick().await;
                    let Ok(_permit) = permits.acquire().await else { return };
                    let result = probe(&client, address, &check).await;
                    metrics.probe(result.is_ok());
                    if book.observe(&endpoint, address, result.is_ok(), &check) {
                        let verdict = book.view().get(&(endpoint.clone(), address)).copied().unwrap_or(Health::Unknown);
                        match &result {
                            Ok(()) => tracing::info!(%endpoint, %address, %zone, ?verdict, "target health changed"),
                            Err(why) => tracing::warn!(%endpoint, %address, %zone, ?verdict, reason = %why, "target health changed"),
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
