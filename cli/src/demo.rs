//! Demo backends for `dnsplan up`: one listener per target's health check (HTTP answering
//! `ok` on any path, or a plain TCP accept loop), each switchable off and on so that a person
//! can watch the planner react. "Off" closes the listener: connections are refused, as with a
//! dead process.

use anyhow::Context;
use dnsplan_planner::PlannerConfig;
use dnsplan_planner::config::Probe;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Http,
    Tcp,
}

/// One demo backend and its switch.
struct Backend {
    kind: Kind,
    healthy: watch::Sender<bool>,
}

#[derive(Debug, Serialize)]
pub struct BackendStatus {
    pub address: SocketAddr,
    pub kind: Kind,
    pub healthy: bool,
}

/// All demo backends, by listening address.
#[derive(Clone, Default)]
pub struct Backends {
    inner: Arc<Mutex<BTreeMap<SocketAddr, Backend>>>,
}

impl Backends {
    /// Starts a backend for every distinct (address, port) a check of `config` probes.
    pub async fn start(config: &PlannerConfig) -> anyhow::Result<Backends> {
        let backends = Backends::default();
        for ep in config.all_endpoints() {
            for target in &ep.targets {
                let Some(check) = ep.check_for(target) else { continue };
                let (port, kind) = match &check.probe {
                    Probe::Tcp { port } => (*port, Kind::Tcp),
                    Probe::Http { port, .. } => (*port, Kind::Http),
                };
                let addr = SocketAddr::new(target.address, port);
                if backends.inner.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&addr) {
                    continue;
                }
                // Bind once now, so that a port in use is an error at start, not later.
                let listener =
                    TcpListener::bind(addr).await.with_context(|| format!("binding the demo backend {addr} (is something else on it?)"))?;
                let (healthy, switch) = watch::channel(true);
                tokio::spawn(serve(addr, kind, Some(listener), switch));
                backends.inner.lock().unwrap_or_else(|p| p.into_inner()).insert(addr, Backend { kind, healthy });
            }
        }
        Ok(backends)
    }

    /// Switches every backend on `address` (any port); the number switched.
    pub fn set(&self, address: IpAddr, healthy: bool) -> usize {
        let backends = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = 0;
        for (addr, backend) in backends.iter() {
            if addr.ip() == address {
                backend.healthy.send_replace(healthy);
                n += 1;
            }
        }
        n
    }

    pub fn list(&self) -> Vec<BackendStatus> {
        let backends = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        backends.iter().map(|(address, b)| BackendStatus { address: *address, kind: b.kind, healthy: *b.healthy.borrow() }).collect()
    }
}

/// Serves HTTP on `http` and TCP on `tcp` addresses, always healthy (containers are failed
/// by stopping them). Returns once all listen; they serve until the process ends.
pub async fn serve_standalone(http: &[SocketAddr], tcp: &[SocketAddr]) -> anyhow::Result<()> {
    anyhow::ensure!(!http.is_empty() || !tcp.is_empty(), "give at least one --http or --tcp address");
    for (addrs, kind) in [(http, Kind::Http), (tcp, Kind::Tcp)] {
        for &addr in addrs {
            let listener = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
            let (switch_tx, switch) = watch::channel(true);
            tokio::spawn(async move {
                let _keep = switch_tx;
                serve(addr, kind, Some(listener), switch).await;
            });
            tracing::info!(%addr, ?kind, "demo backend listening");
        }
    }
    Ok(())
}

/// Serves while healthy; closes the listener while not, and binds again on heal.
async fn serve(addr: SocketAddr, kind: Kind, mut listener: Option<TcpListener>, mut switch: watch::Receiver<bool>) {
    loop {
        let healthy = *switch.borrow_and_update();
        if healthy && listener.is_none() {
            match TcpListener::bind(addr).await {
                Ok(l) => listener = Some(l),
                Err(err) => tracing::warn!(%addr, error = %err, "demo backend cannot listen again"),
            }
        }
        if !healthy {
            listener = None;
        }
        match &listener {
            Some(l) => {
                tokio::select! {
                    accepted = l.accept() => {
                        if let Ok((stream, _)) = accepted {
                            tokio::spawn(answer(kind, stream));
                        }
                    }
                    changed = switch.changed() => if changed.is_err() { return },
                }
            }
            None => {
                if switch.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// HTTP: read the request head, answer `200 ok`. TCP: accept and close.
async fn answer(kind: Kind, mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if kind == Kind::Tcp {
        return;
    }
    let mut buf = [0u8; 2048];
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), stream.read(&mut buf)).await;
    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n").await;
}
