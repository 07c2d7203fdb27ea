//! The DNS TCP listener, answering from the current snapshot (`serving::Serving`); zone
//! transfers and signed queries go to `xfr`. UDP is
//! served by threads of its own (`udp::UdpServers`); building the snapshot and following the
//! store is `follower`'s job.
//!
//! Accepts back off on failure (`accept`), connections are capped (`dns.tcp_connections_max`,
//! fitted by `budget`; one over the cap is accepted and closed at once, so the client tries
//! another server) and closed after `dns.tcp_idle_timeout_secs` of silence. A packet it does
//! not answer (short, or a response) is counted by reason, as over UDP.
//!
//! Why this listener and the transfers are ours, not hickory-server's: its TCP transport
//! spawns a task for every accepted connection with no cap, no counted refusal and no place
//! for `budget`'s descriptor fit, so it would undo the bounds here and in `accept`; and its
//! `ResponseHandler::send_response` sends one message per request, so an AXFR of more than
//! 64 KiB, a chain of signed messages and a snapshot held across them do not fit its
//! request/response shape. Its catalog would also need the zone as hickory records, a second
//! copy of a snapshot that holds a million names. What we take from hickory is its message
//! encoder (with compression) and its TSIG, through common's `tsig`. UDP stays on our own
//! threads for the reasons in `udp`.

use crate::net::accept::{Acceptor, LogLimiter};
use crate::query::answer::{Malformed, TCP_MESSAGE_BYTES_MAX, Transport};
use crate::serving::Serving;
use crate::xfr::respond::{self, Kind};
use crate::xfr::transfer;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Most queries answered on one TCP connection before it is closed; bounds what one client
/// can hold on to.
pub const TCP_QUERIES_PER_CONNECTION_MAX: usize = 10_000;

#[derive(Clone, Copy, Debug)]
pub struct TcpLimits {
    pub idle_timeout: Duration,
    pub connections_max: usize,
}

/// Accepts TCP connections on `listener` until the task is dropped.
///
/// Failed accepts are waited out (`accept::Acceptor`: backoff, counted, logged at most once a
/// second). A connection over `limits.connections_max` is closed at once and counted
/// (`dnsplan_dns_tcp_refused_total`), so the client can try another server; the log says so
/// at most once a second.
pub async fn serve_tcp(listener: TcpListener, serving: Arc<Serving>, limits: TcpLimits) {
    let permits = Arc::new(Semaphore::new(limits.connections_max));
    let metrics = serving.metrics.connections.clone();
    let mut acceptor = Acceptor::new(listener, "DNS TCP", metrics.dns_tcp_accept_errors.clone());
    let mut refusals = LogLimiter::default();
    loop {
        let (stream, peer) = acceptor.accept().await;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics.dns_tcp_refused.inc();
            if let Some(suppressed) = refusals.allow(tokio::time::Instant::now()) {
                tracing::warn!(%peer, max = limits.connections_max, suppressed, "too many TCP connections; closing the new one");
            }
            continue;
        };
        let serving = serving.clone();
        let open = metrics.dns_tcp_open.clone();
        open.inc();
        tokio::spawn(async move {
            if let Err(err) = tcp_connection(stream, peer.ip(), &serving, limits.idle_timeout).await {
                tracing::debug!(%err, %peer, "TCP connection ended");
            }
            open.dec();
            drop(permit);
        });
    }
}

async fn tcp_connection(mut stream: TcpStream, peer: IpAddr, serving: &Arc<Serving>, idle: Duration) -> std::io::Result<()> {
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
        let packet = &buf[..len];
        // Another zone's question is answered by that zone (`zones`).
        let other = serving.others.as_ref().and_then(|others| others.pick(packet));
        if let Some(zone) = &other {
            zone.answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let zone = other.as_ref().unwrap_or(serving);
        if matches!(respond::kind(packet), Kind::Axfr | Kind::Ixfr) {
            transfer::transfer_tcp(&mut stream, packet, peer, zone, idle).await?;
            continue;
        }
        let snapshot = zone.snapshot.load();
        let Some((bytes, outcome)) = respond::respond_one(packet, Some(peer), &snapshot, zone, Transport::Tcp, &mut rng) else {
            // Not a query (too short, or a response): no answer, counted as over UDP.
            serving.metrics.observe_malformed(Malformed::of_dropped(&buf[..len]));
            continue;
        };
        drop(snapshot);
        transfer::write_framed(&mut stream, &bytes, idle).await?;
        serving.metrics.observe_query(&outcome, Transport::Tcp);
    }
    Ok(())
}
