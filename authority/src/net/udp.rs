//! Batched UDP I/O: up to `BATCH` queries received with one `recvmmsg` and their answers sent
//! with one `sendmmsg`, so that under load the system-call cost is shared by a batch.
//!
//! Each UDP socket is served by a thread of its own (`UdpServers`), not by a task of the async
//! runtime: the runtime also runs the control API, and a busy control API must not delay an
//! answer. The thread waits in `poll(2)` on its socket and on a stop pipe, then drains the
//! socket in batches; the kernel wakes it when a query arrives, whatever the runtime's workers
//! are doing (`bench/status.sh` measures it against 8 clients polling `/v1/status`).
//!
//! The buffers and message headers live in the thread's `Batch`. A datagram the kernel
//! refuses to send (for its peer) is skipped; the rest of the batch is still sent
//! (`send_answers`). Each answer passes the response-rate limiter (`rrl`) before it is queued:
//! it is sent, dropped, or sent truncated (a slip).

use crate::query::answer::{Malformed, Outcome, Transport};
use crate::query::fast::{Fast, respond_fast};
use crate::query::rrl::{self, Rrl, Verdict};
use crate::serving::Serving;
use crate::xfr::respond;
use crate::zone::snapshot::Snapshot;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::io::{IoSlice, IoSliceMut, PipeReader, PipeWriter};
use std::net::{IpAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Queries per system call.
pub const BATCH: usize = 32;
/// Largest datagram received; the largest UDP payload.
const DATAGRAM_BYTES_MAX: usize = 65_535;

/// One thread's receive and send state.
pub struct Batch {
    recv: MultiHeaders<SockaddrStorage>,
    send: MultiHeaders<SockaddrStorage>,
    queries: Vec<Vec<u8>>,
    answers: Vec<Vec<u8>>,
    peers: Vec<Option<SockaddrStorage>>,
    outcomes: Vec<Outcome>,
    lengths: Vec<usize>,
    from: Vec<Option<SockaddrStorage>>,
}

/// The threads answering UDP queries, one per socket, and the interfaces served over AF_XDP
/// (`[dns] xdp`). Dropping it stops and joins them, and detaches the XDP programs.
pub struct UdpServers {
    /// Closing it wakes every thread's `poll` with a hang-up on the other end: the stop signal.
    stop: Option<PipeWriter>,
    threads: Vec<JoinHandle<()>>,
    xdp: Vec<dnsplan_xdp::listener::Listener>,
}

impl UdpServers {
    /// Starts one thread per socket, answering from `serving` until dropped.
    pub fn start(sockets: Vec<UdpSocket>, serving: Arc<Serving>) -> std::io::Result<UdpServers> {
        let (stop_read, stop_write) = std::io::pipe()?;
        let stop_read = Arc::new(stop_read);
        let mut servers = UdpServers { stop: Some(stop_write), threads: Vec::with_capacity(sockets.len()), xdp: Vec::new() };
        for (i, socket) in sockets.into_iter().enumerate() {
            let (serving, stop) = (serving.clone(), stop_read.clone());
            // On failure `servers` is dropped here, which stops the threads already started.
            let thread = std::thread::Builder::new().name(format!("dns-udp-{i}")).spawn(move || serve(&socket, &serving, &stop))?;
            servers.threads.push(thread);
        }
        Ok(servers)
    }
}

impl UdpServers {
    /// Answers the UDP queries to `port` at `addresses` (a wildcard: its whole family) that
    /// arrive on each of `interfaces` over AF_XDP, from
    /// `serving`, as the sockets answer them (`answer_datagram`); an interface that cannot be
    /// served so is said in one WARN line and left to the sockets.
    pub fn serve_xdp(&mut self, interfaces: &[String], addresses: &[std::net::IpAddr], port: u16, serving: &Arc<Serving>) {
        let destinations = dnsplan_xdp::listener::Destinations::listening_on(addresses);
        for name in interfaces {
            let started = dnsplan_xdp::listener::Listener::start(name, port, &destinations, |_queue| XdpQueue::new(serving.clone()));
            match started {
                Ok(listener) => {
                    tracing::info!(interface = %name, port, mode = ?listener.mode, copy = ?listener.copy, "answering UDP over AF_XDP");
                    self.xdp.push(listener);
                }
                Err(err) => tracing::warn!(interface = %name, error = %err, "not answering over AF_XDP; the sockets answer"),
            }
        }
    }
}

/// One AF_XDP queue's side of the authority: answers as the sockets do (`answer_datagram`),
/// with one snapshot and one clock reading per batch as they have; an answer larger than the
/// interface's MTU allows is sent truncated (TC=1, so the client asks again over TCP) where
/// the sockets would send it fragmented.
struct XdpQueue {
    serving: Arc<Serving>,
    rng: SmallRng,
    snapshot: Arc<Snapshot>,
    now: Option<rrl::Tick>,
    /// The queue's counts when last observed.
    counted: [u64; 6],
}

impl XdpQueue {
    fn new(serving: Arc<Serving>) -> XdpQueue {
        let snapshot = serving.snapshot.load_full();
        XdpQueue { serving, rng: SmallRng::from_rng(&mut rand::rng()), snapshot, now: None, counted: [0; 6] }
    }
}

impl dnsplan_xdp::listener::Handler for XdpQueue {
    fn batch(&mut self) {
        self.snapshot = self.serving.snapshot.load_full();
        self.now = self.serving.rrl.as_ref().map(Rrl::now);
    }

    fn answer(&mut self, query: &[u8], client: std::net::SocketAddr, room: usize, out: &mut Vec<u8>) -> bool {
        let serving = &self.serving;
        let Some(mut outcome) = answer_datagram(query, Some(client.ip()), serving, &self.snapshot, self.now, &mut self.rng, out) else {
            return false;
        };
        if out.len() > room {
            rrl::slip(out);
            outcome.truncated = true;
            outcome.bytes = out.len();
        }
        serving.metrics.observe_query(&outcome, Transport::Udp);
        serving.metrics.observe_xdp_answer();
        true
    }

    fn counts(&mut self, counts: &dnsplan_xdp::listener::Counts) {
        let now = [counts.rx_ring_full, counts.fill_ring_empty, counts.rx_dropped, counts.invalid, counts.tx_ring_full, counts.too_large];
        let mut lost = [0; 6];
        for ((lost, now), before) in lost.iter_mut().zip(now).zip(&mut self.counted) {
            *lost = now.saturating_sub(*before);
            *before = now;
        }
        self.serving.metrics.observe_xdp_dropped(lost);
    }
}

impl Drop for UdpServers {
    fn drop(&mut self) {
        drop(self.stop.take());
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// How long a thread waits after `poll` itself failed (out of kernel memory), so that a
/// failing call is not repeated in a busy loop.
const POLL_RETRY: Duration = Duration::from_millis(10);

/// One socket's loop: wait until it is readable, drain it in batches, until `stop` hangs up.
fn serve(socket: &UdpSocket, serving: &Serving, stop: &PipeReader) {
    let mut rng = SmallRng::from_rng(&mut rand::rng());
    let mut batch = Batch::new();
    let fd = socket.as_raw_fd();
    loop {
        let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN), PollFd::new(stop.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(err) => {
                tracing::debug!(%err, "waiting on the UDP socket failed");
                std::thread::sleep(POLL_RETRY);
                continue;
            }
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return;
        }
        loop {
            match batch.once(fd, serving, &mut rng) {
                Ok(_) => {}
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
                // ICMP errors from earlier sends surface here on some systems.
                Err(err) => tracing::debug!(%err, "UDP receive failed"),
            }
        }
    }
}

/// `count` non-blocking UDP sockets bound to `addr` with `SO_REUSEPORT`, so the kernel spreads
/// queries over one thread per core. Port 0 picks one port for all of them.
pub fn bind_udp(addr: std::net::SocketAddr, count: usize) -> std::io::Result<Vec<UdpSocket>> {
    use socket2::{Domain, Protocol, Socket, Type};
    let mut sockets = Vec::with_capacity(count.max(1));
    // SO_REUSEPORT would let us share a port with another live server of the same user, which
    // would split the traffic silently. A plain bind first fails with "address in use" then.
    // IPv6 only, as the sockets below: a dual-stack `[::]` would take IPv4's port too, and
    // `listen = ["0.0.0.0:53", "[::]:53"]` would fail on its second address.
    let probe = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        probe.set_only_v6(true)?;
    }
    probe.bind(&addr.into())?;
    let addr = probe.local_addr()?.as_socket().ok_or_else(|| std::io::Error::other("a UDP socket without an IP address"))?;
    drop(probe);
    for _ in 0..count.max(1) {
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            socket.set_only_v6(true)?;
        }
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        sockets.push(socket.into());
    }
    Ok(sockets)
}

/// What became of one batch's answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendTally {
    /// Taken by the kernel.
    pub sent: usize,
    /// Refused for their own peer (an address the kernel will not send to) and skipped.
    pub failed: usize,
    /// Not tried: the socket's send buffer was full.
    pub unsent: usize,
}

/// Sends `answers[i]` to `peers[i]` with as few `sendmmsg` calls as it takes and calls
/// `on_sent(i)` for each answer the kernel took.
///
/// `sendmmsg` stops at the first datagram it cannot send: it reports the ones before it, and
/// a call that starts at that datagram fails. That error belongs to the one datagram (its
/// peer is a broadcast address, port 0, unreachable...), so it is skipped, logged at debug
/// and counted, and the rest of the batch is sent. Only a full send buffer (`EAGAIN`) ends
/// the batch: it is the socket's state, every later datagram would meet it too. Lost UDP
/// answers are asked again by their clients.
pub fn send_answers(
    fd: RawFd,
    headers: &mut MultiHeaders<SockaddrStorage>,
    answers: &[Vec<u8>],
    peers: &[Option<SockaddrStorage>],
    mut on_sent: impl FnMut(usize),
) -> SendTally {
    let total = answers.len().min(peers.len());
    let mut tally = SendTally::default();
    let mut next = 0;
    // Each call sends at least one datagram or skips one, so this takes at most `total` calls.
    while next < total {
        let slices: Vec<[IoSlice<'_>; 1]> = answers[next..total].iter().map(|a| [IoSlice::new(a)]).collect();
        let result = sendmmsg(fd, headers, slices.iter(), &peers[next..total], [] as [ControlMessage<'_>; 0], MsgFlags::MSG_DONTWAIT)
            .map(|results| results.count());
        match result {
            Ok(n) if n > 0 => {
                let n = n.min(total - next);
                (next..next + n).for_each(&mut on_sent);
                tally.sent += n;
                next += n;
            }
            // Nothing taken and no error: not expected of the kernel; do not spin on it.
            Ok(_) | Err(Errno::EAGAIN) => {
                tally.unsent = total - next;
                tracing::debug!(unsent = tally.unsent, "UDP send buffer full; answers dropped");
                break;
            }
            Err(err) => {
                tracing::debug!(%err, peer = ?peers[next], "UDP answer not sent; skipping it");
                tally.failed += 1;
                next += 1;
            }
        }
    }
    tally
}

/// The client's address, for the rate limiter.
fn peer_ip(peer: &SockaddrStorage) -> Option<IpAddr> {
    if let Some(v4) = peer.as_sockaddr_in() {
        return Some(IpAddr::V4(v4.ip()));
    }
    peer.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
}

/// The answer to one UDP datagram `query` from `peer`, written into `out`, as every UDP path
/// gives it (these sockets and the XDP queues): another zone's question answered from that
/// zone's snapshot, the fast path else the reference path, a datagram that gets no answer
/// counted as malformed, then the response-rate limiter (`now`: its clock, read once per
/// batch) sends it, drops it or slips it. `None`: nothing to send.
pub fn answer_datagram(
    query: &[u8],
    peer: Option<IpAddr>,
    serving: &Serving,
    snapshot: &Snapshot,
    now: Option<rrl::Tick>,
    rng: &mut SmallRng,
    out: &mut Vec<u8>,
) -> Option<Outcome> {
    // Another zone's question is answered from that zone's snapshot (`zones`).
    let other = serving.others.as_ref().and_then(|others| others.pick(query));
    let other_snapshot = other.as_ref().map(|zone| zone.snapshot.load());
    let (zone, snapshot): (&Serving, &Snapshot) = match (&other, &other_snapshot) {
        (Some(zone), Some(other_snapshot)) => {
            zone.answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            (zone, other_snapshot)
        }
        _ => (serving, snapshot),
    };
    let mut outcome = match respond_fast(query, snapshot, &zone.limits, rng, out) {
        Fast::Answered(outcome) => outcome,
        Fast::Drop => {
            serving.metrics.observe_malformed(Malformed::of_dropped(query));
            return None;
        }
        Fast::Slow => match respond::respond_one(query, peer, snapshot, zone, Transport::Udp, rng) {
            Some((bytes, outcome)) => {
                out.clear();
                out.extend_from_slice(&bytes);
                outcome
            }
            None => {
                serving.metrics.observe_malformed(Malformed::of_dropped(query));
                return None;
            }
        },
    };
    if let (Some(rrl), Some(now), Some(peer)) = (&serving.rrl, now, peer) {
        match rrl.decide(peer, query, out, &outcome, now) {
            Verdict::Send => {}
            Verdict::Drop => {
                serving.metrics.observe_rrl_dropped(&outcome);
                return None;
            }
            Verdict::Slip => {
                rrl::slip(out);
                outcome.bytes = out.len();
                serving.metrics.observe_rrl_slipped();
            }
        }
    }
    Some(outcome)
}

impl Batch {
    fn new() -> Batch {
        Batch {
            recv: MultiHeaders::preallocate(BATCH, None),
            send: MultiHeaders::preallocate(BATCH, None),
            queries: (0..BATCH).map(|_| vec![0; DATAGRAM_BYTES_MAX]).collect(),
            answers: (0..BATCH).map(|_| Vec::with_capacity(1_500)).collect(),
            peers: Vec::with_capacity(BATCH),
            outcomes: Vec::with_capacity(BATCH),
            lengths: Vec::with_capacity(BATCH),
            from: Vec::with_capacity(BATCH),
        }
    }

    /// Receives what is waiting on `fd` (at most `BATCH`), answers it and sends the answers.
    /// Returns how many datagrams were received; `WouldBlock` when the socket is drained.
    fn once(&mut self, fd: RawFd, serving: &Serving, rng: &mut SmallRng) -> std::io::Result<usize> {
        self.lengths.clear();
        self.from.clear();
        let mut datagrams = 0;
        {
            let mut slices: Vec<[IoSliceMut<'_>; 1]> = self.queries.iter_mut().map(|q| [IoSliceMut::new(q)]).collect();
            let received = recvmmsg(fd, &mut self.recv, slices.iter_mut(), MsgFlags::MSG_DONTWAIT, None).map_err(std::io::Error::from)?;
            for msg in received {
                datagrams += 1;
                // A datagram cut short by the buffer is not a query anyone sends; skip it.
                if msg.flags.contains(MsgFlags::MSG_TRUNC) {
                    continue;
                }
                self.lengths.push(msg.bytes);
                self.from.push(msg.address);
            }
        }
        let received = self.lengths.len();
        self.peers.clear();
        self.outcomes.clear();
        let snapshot = serving.snapshot.load();
        // One clock reading per batch: the batch arrived within microseconds.
        let now = serving.rrl.as_ref().map(Rrl::now);
        let mut answered = 0;
        for i in 0..received {
            let query = &self.queries[i][..self.lengths[i]];
            let out = &mut self.answers[answered];
            let peer = self.from[i].as_ref().and_then(peer_ip);
            let Some(outcome) = answer_datagram(query, peer, serving, &snapshot, now, rng, out) else { continue };
            self.peers.push(self.from[i]);
            self.outcomes.push(outcome);
            answered += 1;
        }
        drop(snapshot);
        let outcomes = &self.outcomes;
        let tally = send_answers(fd, &mut self.send, &self.answers[..answered], &self.peers, |i| {
            serving.metrics.observe_query(&outcomes[i], Transport::Udp);
        });
        serving.metrics.observe_udp_unsent(tally.failed + tally.unsent);
        if datagrams < BATCH {
            // The socket had no more than this: report it empty, so the caller waits in `poll`
            // instead of spending a system call to learn it. (`poll` returns at once if a
            // datagram arrived meanwhile.)
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        Ok(datagrams)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, UdpSocket};
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    /// How long a receiver waits for a datagram sent on loopback before the test fails.
    const RECV_DEADLINE: Duration = Duration::from_secs(5);

    fn receiver() -> (UdpSocket, SocketAddr) {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
        socket.set_read_timeout(Some(RECV_DEADLINE)).expect("timeout");
        let addr = socket.local_addr().expect("address");
        (socket, addr)
    }

    fn recv(socket: &UdpSocket) -> Vec<u8> {
        let mut buf = [0u8; 64];
        let (len, _) = socket.recv_from(&mut buf).expect("a datagram before the deadline");
        buf[..len].to_vec()
    }

    /// One batch over a real socket with answers for peers the kernel refuses (port 0, the
    /// broadcast address without `SO_BROADCAST`, no address at all) between answers for two
    /// real clients: every real client gets its answers. Before `send_answers` skipped the
    /// failing datagram, the first refusal dropped every answer after it.
    #[test]
    fn a_refused_peer_does_not_stop_the_batch() {
        let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let (a, a_addr) = receiver();
        let (b, b_addr) = receiver();
        let port_zero: SocketAddr = "127.0.0.1:0".parse().expect("address");
        let broadcast: SocketAddr = "255.255.255.255:53".parse().expect("address");
        let peers: Vec<Option<SockaddrStorage>> = vec![
            Some(a_addr.into()),
            Some(port_zero.into()),
            Some(b_addr.into()),
            Some(broadcast.into()),
            None,
            Some(a_addr.into()),
            Some(b_addr.into()),
        ];
        let answers: Vec<Vec<u8>> = (0..peers.len()).map(|i| format!("answer {i}").into_bytes()).collect();
        let mut headers = MultiHeaders::preallocate(BATCH, None);
        let mut taken = Vec::new();
        let tally = send_answers(server.as_raw_fd(), &mut headers, &answers, &peers, |i| taken.push(i));

        assert_eq!(taken, [0, 2, 5, 6], "the answers the kernel took");
        assert_eq!(tally, SendTally { sent: 4, failed: 3, unsent: 0 });
        assert_eq!(recv(&a), b"answer 0");
        assert_eq!(recv(&a), b"answer 5");
        assert_eq!(recv(&b), b"answer 2");
        assert_eq!(recv(&b), b"answer 6");
    }
}
