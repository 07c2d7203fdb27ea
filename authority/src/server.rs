//! The DNS I/O shell: UDP and TCP listeners that feed `answer::respond` from the current
//! snapshot, and the follower that rebuilds and swaps the snapshot when the store changes.

use crate::answer::{AnswerLimits, TCP_MESSAGE_BYTES_MAX, Transport, respond};
use crate::dns_zone::StaticZone;
use crate::metrics::Metrics;
use crate::snapshot::Snapshot;
use crate::udp::Batch;
use arc_swap::ArcSwap;
use dnsplan_common::EndpointName;
use dnsplan_common::store::{ACTIVE_PAGE_MAX, Store, StoreResult, StoreVersion};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

/// Most queries answered on one TCP connection before it is closed; bounds what one client
/// can hold on to.
pub const TCP_QUERIES_PER_CONNECTION_MAX: usize = 10_000;
/// How long the follower waits on the store per long-poll before asking again.
const FOLLOW_WAIT: Duration = Duration::from_secs(30);
/// Pause after a failed store read before the follower retries.
const FOLLOW_RETRY: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug)]
pub struct TcpLimits {
    pub idle_timeout: Duration,
    pub connections_max: usize,
}

/// What the listeners share: the snapshot, limits and metrics.
pub struct Serving {
    pub snapshot: ArcSwap<Snapshot>,
    pub zone: Arc<StaticZone>,
    pub limits: AnswerLimits,
    pub metrics: Arc<Metrics>,
}

impl Serving {
    /// Loads the active state from `store` and builds the first snapshot (see `Loader`).
    pub async fn load<S: Store>(store: &S, zone: Arc<StaticZone>, limits: AnswerLimits, metrics: Arc<Metrics>) -> anyhow::Result<Serving> {
        let started = Instant::now();
        let snapshot = Loader::new(zone.clone()).finish(store).await?;
        metrics.observe_snapshot(&snapshot, None, started.elapsed().as_secs_f64());
        Ok(Serving { snapshot: ArcSwap::from_pointee(snapshot), zone, limits, metrics })
    }

    /// Rebuilds the snapshot whenever the store's applied-change counter moves. Runs until the
    /// task is dropped. Changes that arrive during a rebuild are picked up by the next one.
    pub async fn follow<S: Store>(self: Arc<Self>, store: S) {
        let mut seen = StoreVersion { applied_changes: self.snapshot.load().applied_changes, ..StoreVersion::default() };
        loop {
            match store.wait_for_change(seen, FOLLOW_WAIT).await {
                Ok(now) if now.applied_changes != seen.applied_changes => match self.rebuild(&store).await {
                    Ok(applied) => seen = StoreVersion { applied_changes: applied, ..now },
                    Err(err) => {
                        tracing::warn!(error = %format!("{err:#}"), "could not rebuild the snapshot; still serving the previous one");
                        tokio::time::sleep(FOLLOW_RETRY).await;
                    }
                },
                Ok(now) => seen = now,
                Err(err) => {
                    tracing::warn!(error = %format!("{err:#}"), "waiting on the store failed; still serving the current snapshot");
                    tokio::time::sleep(FOLLOW_RETRY).await;
                }
            }
        }
    }

    /// Brings the snapshot up to the store: merges what switched since the current snapshot,
    /// or rebuilds from the whole state when the store answers with it.
    async fn rebuild<S: Store>(&self, store: &S) -> anyhow::Result<u64> {
        let started = Instant::now();
        let current = self.snapshot.load_full();
        let delta = store.active_since(current.applied_changes).await?;
        let (snapshot, delta) = tokio::task::spawn_blocking(move || (current.apply(&delta), delta)).await?;
        let applied = snapshot.applied_changes;
        self.metrics.observe_snapshot(&snapshot, Some(&delta), started.elapsed().as_secs_f64());
        self.snapshot.store(Arc::new(snapshot));
        tracing::debug!(applied_changes = applied, "snapshot swapped");
        Ok(applied)
    }
}

/// Builds the first snapshot from the store a page at a time (`Store::active_page`), so a
/// large zone is never held twice, once decoded and once as the snapshot: the peak memory of
/// a start is the snapshot plus one page.
///
/// The pages are read at different moments. `finish` merges every endpoint that switched
/// after the first page was read (`active_since`), so the result is the store's state at one
/// applied-change count, whatever changed during the load. (If more than
/// `DELTA_ENDPOINTS_MAX` endpoints changed meanwhile, the store answers with the whole state
/// and the snapshot is rebuilt from it, at the old peak; only under that much churn.)
pub struct Loader {
    snapshot: Snapshot,
    after: Option<EndpointName>,
    since: Option<u64>,
    done: bool,
}

impl Loader {
    pub fn new(zone: Arc<StaticZone>) -> Loader {
        Loader { snapshot: Snapshot::statics_only(zone), after: None, since: None, done: false }
    }

    /// Reads and merges the next page. `false` once the last page is in.
    pub async fn next_page<S: Store>(&mut self, store: &S) -> StoreResult<bool> {
        if self.done {
            return Ok(false);
        }
        let page = store.active_page(self.after.take(), ACTIVE_PAGE_MAX).await?;
        self.since.get_or_insert(page.applied_changes);
        self.snapshot.load_page(&page.endpoints);
        self.after = page.endpoints.last().map(|(name, _)| name.clone());
        self.done = !page.more || self.after.is_none();
        Ok(!self.done)
    }

    /// The snapshot, brought up to the store by the changes made during the load.
    pub async fn finish<S: Store>(mut self, store: &S) -> StoreResult<Snapshot> {
        while self.next_page(store).await? {}
        let delta = store.active_since(self.since.unwrap_or_default()).await?;
        Ok(self.snapshot.apply(&delta))
    }
}

/// Answers UDP queries on `socket` until the task is dropped.
///
/// After each wake-up it drains the socket in batches (`udp::Batch`: one `recvmmsg` and one
/// `sendmmsg` per up to 32 queries), so under load a query costs a fraction of a system call
/// and no trip through the reactor. Common queries are answered by `fast::respond_fast` into
/// reused buffers; the rest by `answer::respond`.
pub async fn serve_udp(socket: UdpSocket, serving: Arc<Serving>) {
    use std::os::fd::AsRawFd;
    let mut rng = SmallRng::from_rng(&mut rand::rng());
    let fd = socket.as_raw_fd();
    loop {
        if let Err(err) = socket.readable().await {
            tracing::warn!(%err, "UDP socket failed");
            continue;
        }
        loop {
            match socket.try_io(tokio::io::Interest::READABLE, || Batch::run(fd, &serving, &mut rng)) {
                Ok(_) => {}
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(err) => {
                    // ICMP errors from earlier sends surface here on some systems.
                    tracing::debug!(%err, "UDP receive failed");
                }
            }
        }
    }
}

/// `count` UDP sockets bound to `addr` with `SO_REUSEPORT`, so the kernel spreads queries
/// over one receive loop per core. Port 0 picks one port for all of them.
pub fn bind_udp(addr: std::net::SocketAddr, count: usize) -> std::io::Result<Vec<UdpSocket>> {
    use socket2::{Domain, Protocol, Socket, Type};
    let mut sockets = Vec::with_capacity(count.max(1));
    // SO_REUSEPORT would let us share a port with another live server of the same user, which
    // would split the traffic silently. A plain bind first fails with "address in use" then.
    let addr = std::net::UdpSocket::bind(addr)?.local_addr()?;
    for _ in 0..count.max(1) {
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            socket.set_only_v6(true)?;
        }
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        let std: std::net::UdpSocket = socket.into();
        sockets.push(UdpSocket::from_std(std)?);
    }
    Ok(sockets)
}

/// Accepts TCP connections on `listener` until the task is dropped.
pub async fn serve_tcp(listener: TcpListener, serving: Arc<Serving>, limits: TcpLimits) {
    let permits = Arc::new(Semaphore::new(limits.connections_max));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(err) => {
                tracing::warn!(%err, "TCP accept failed");
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max = limits.connections_max, "too many TCP connections; closing the new one");
            continue;
        };
        let serving = serving.clone();
        tokio::spawn(async move {
            if let Err(err) = tcp_connection(stream, &serving, limits.idle_timeout).await {
                tracing::debug!(%err, %peer, "TCP connection ended");
            }
            drop(permit);
        });
    }
}

async fn tcp_connection(mut stream: TcpStream, serving: &Serving, idle: Duration) -> std::io::Result<()> {
    let mut rng = SmallRng::from_rng(&mut rand::rng());
    let mut buf = vec![0u8; TCP_MESSAGE_BYTES_MAX];
    for _ in 0..TCP_QUERIES_PER_CONNECTION_MAX {
        let len = match tokio::time::timeout(idle, stream.read_u16()).await {
            Ok(Ok(len)) => usize::from(len),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(()), // idle: close quietly
        };
        match tokio::time::timeout(idle, stream.read_exact(&mut buf[..len])).await {
            Ok(r) => r?,
            Err(_) => return Ok(()),
        };
        let snapshot = serving.snapshot.load();
        let Some((bytes, outcome)) = respond(&buf[..len], &snapshot, Transport::Tcp, &serving.limits, &mut rng) else {
            continue;
        };
        let mut framed = Vec::with_capacity(bytes.len() + 2);
        framed.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
        framed.extend_from_slice(&bytes);
        tokio::time::timeout(idle, stream.write_all(&framed)).await.map_err(|_| std::io::ErrorKind::TimedOut)??;
        serving.metrics.observe_query(&outcome, Transport::Tcp);
    }
    Ok(())
}
