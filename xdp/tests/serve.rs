//! Queries served over AF_XDP, end to end: two network namespaces of the test's own joined by a
//! veth pair, the listener on the server's end, a client's ordinary UDP socket on the other.
//! Then bursts, each sent whole before its answers are read: every reply comes back. A kernel
//! UDP socket on the same port in the server's namespace shows which path answered:
//! with the listener attached every answer is the XDP path's; once it is stopped, the kernel's.
//! An answer of exactly the room the veth's MTU leaves is sent; one a byte larger is not, and
//! is counted (`Counts::too_large`).
//! Needs root and `ip` (iproute2): without them the test fails and says which is missing.

use dnsplan_xdp::listener::{Counts, Destinations, Handler, Listener};
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

const PORT: u16 = 5353;

/// The test's handler: "xdp:" and the query; to a query starting "fill", as many bytes as the
/// room the MTU leaves; to one starting "over", a byte more. Keeps the last counts given.
struct Echo {
    counts: Arc<Mutex<Counts>>,
}

impl Handler for Echo {
    fn answer(&mut self, query: &[u8], _client: SocketAddr, room: usize, out: &mut Vec<u8>) -> bool {
        out.extend_from_slice(b"xdp:");
        out.extend_from_slice(query);
        if query.starts_with(b"fill") {
            out.resize(room, b'.');
        } else if query.starts_with(b"over") {
            out.resize(room + 1, b'.');
        }
        true
    }

    fn counts(&mut self, counts: &Counts) {
        *self.counts.lock().expect("counts") = *counts;
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|err| panic!("ip (iproute2) is needed: {err}"));
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// A network namespace of the test's own, removed when dropped.
struct Netns(String);

impl Netns {
    fn new(role: &str) -> Netns {
        let ns = Netns(format!("dnsplan-xdp-{role}-{}", std::process::id()));
        ip(&["netns", "add", &ns.0]);
        ns
    }

    /// Moves the calling thread into this namespace.
    fn enter(&self) {
        use std::os::fd::AsRawFd;
        let path = format!("/run/netns/{}", self.0);
        let file = std::fs::File::open(&path).unwrap_or_else(|err| panic!("{path}: {err}"));
        // SAFETY: `file` is an open namespace file for the duration of the call; setns changes
        // only this thread's namespace.
        let ret = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(ret, 0, "setns {path}: {} (needs CAP_SYS_ADMIN)", std::io::Error::last_os_error());
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Sends `query` from `client` to `server` and returns the answer, from any source: the
/// kernel's wildcard socket replies from the address the kernel picks, which with two
/// addresses on the interface need not be the one asked.
fn ask_kernel(client: &UdpSocket, server: SocketAddr, query: &[u8]) -> Vec<u8> {
    client.send_to(query, server).expect("send");
    let mut buf = [0u8; 2048];
    let (len, _) = client.recv_from(&mut buf).unwrap_or_else(|err| panic!("no answer from {server} to {query:?}: {err}"));
    buf[..len].to_vec()
}

/// Sends `query` from `client` to `server` and returns the answer.
fn ask(client: &UdpSocket, server: SocketAddr, query: &[u8]) -> Vec<u8> {
    client.send_to(query, server).expect("send");
    let mut buf = [0u8; 2048];
    let (len, from) = client.recv_from(&mut buf).unwrap_or_else(|err| panic!("no answer from {server} to {query:?}: {err}"));
    assert_eq!(from, server, "the answer comes from the address asked");
    buf[..len].to_vec()
}

#[test]
fn queries_are_answered_over_xdp_and_by_the_kernel_once_it_is_stopped() {
    let (srv, cli) = (Netns::new("srv"), Netns::new("cli"));
    ip(&["-n", &srv.0, "link", "add", "xa", "type", "veth", "peer", "name", "xb", "netns", &cli.0]);
    for (ns, dev, v4, v6) in [(&srv, "xa", "10.99.0.1/24", "fd99::1/64"), (&cli, "xb", "10.99.0.2/24", "fd99::2/64")] {
        ip(&["-n", &ns.0, "addr", "add", v4, "dev", dev]);
        ip(&["-n", &ns.0, "addr", "add", v6, "dev", dev, "nodad"]);
        ip(&["-n", &ns.0, "link", "set", dev, "up"]);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
    }
    // A second address of each family on the server's side, which the listener does not
    // listen on: its datagrams are the kernel's (another server's, on a shared machine).
    ip(&["-n", &srv.0, "addr", "add", "10.99.0.3/24", "dev", "xa"]);
    ip(&["-n", &srv.0, "addr", "add", "fd99::3/64", "dev", "xa", "nodad"]);

    // The server: a kernel socket on the port, then the listener on xa (in its own thread,
    // which enters the namespace; the listener's queue threads are made there too).
    let (to_server, commands) = mpsc::channel::<&str>();
    let (ready, started) = mpsc::channel();
    let counts = Arc::new(Mutex::new(Counts::default()));
    let server = std::thread::spawn({
        let srv = Netns(srv.0.clone());
        let counts = counts.clone();
        move || {
            srv.enter();
            std::mem::forget(srv); // the outer handle removes the namespace
            let kernel = UdpSocket::bind(("::", PORT)).expect("a kernel socket on the port");
            let kernel_thread = std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while let Ok((len, from)) = kernel.recv_from(&mut buf) {
                    let mut answer = b"kernel:".to_vec();
                    answer.extend_from_slice(&buf[..len]);
                    if &buf[..len] == b"quit" {
                        break;
                    }
                    let _ = kernel.send_to(&answer, from);
                }
            });
            let ours: [std::net::IpAddr; 2] = ["10.99.0.1".parse().expect("address"), "fd99::1".parse().expect("address")];
            let listener = Listener::start("xa", PORT, &Destinations::listening_on(&ours), |_queue| Echo { counts: counts.clone() })
                .unwrap_or_else(|err| panic!("the listener on xa: {err}"));
            ready.send((listener.mode, listener.copy)).expect("ready");
            assert_eq!(commands.recv(), Ok("stop"));
            let answered = listener.stop();
            ready.send((dnsplan_xdp::bpf::Mode::Generic, dnsplan_xdp::xsk::Copy::Copy)).expect("stopped");
            assert_eq!(commands.recv(), Ok("quit"));
            let quit = UdpSocket::bind("127.0.0.1:0").expect("socket");
            let _ = quit.send_to(b"quit", ("127.0.0.1", PORT));
            kernel_thread.join().expect("the kernel socket's thread");
            answered
        }
    });
    let (mode, copy) = started.recv().expect("the listener started");
    eprintln!("listener attached in {mode:?} mode, {copy:?}");

    cli.enter();
    // To the address not listened on, while the program is attached: the kernel answers.
    for (client, other) in [("10.99.0.2:0", "10.99.0.3"), ("[fd99::2]:0", "fd99::3")] {
        let socket = UdpSocket::bind(client).expect("client socket");
        socket.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let other = SocketAddr::new(other.parse().expect("address"), PORT);
        assert_eq!(ask_kernel(&socket, other, b"elsewhere"), b"kernel:elsewhere", "a datagram to {other}, not ours, is the kernel's");
    }
    for (client, server) in [("10.99.0.2:0", "10.99.0.1"), ("[fd99::2]:0", "fd99::1")] {
        let socket = UdpSocket::bind(client).expect("client socket");
        socket.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let server = SocketAddr::new(server.parse().expect("address"), PORT);
        for i in 0..100 {
            let query = format!("query {i} to {server}");
            let mut want = b"xdp:".to_vec();
            want.extend_from_slice(query.as_bytes());
            assert_eq!(ask(&socket, server, query.as_bytes()), want, "query {i} over XDP");
        }
        // The veth's MTU is 1500: an IPv4 reply leaves 1472 bytes of UDP payload, an IPv6 one
        // 1452. The answer one byte over is not sent: the next query's answer is the next one
        // read.
        let room = if server.is_ipv4() { 1472 } else { 1452 };
        assert_eq!(ask(&socket, server, b"fill").len(), room, "an answer of the whole room, to {server}");
        socket.send_to(b"over", server).expect("send");
        let next = ask(&socket, server, b"after over");
        assert_eq!(String::from_utf8_lossy(&next), "xdp:after over", "no answer too large for the MTU was sent by {server}");
    }
    // Bursts: each round's queries all sent before any answer is read, so the transmit ring
    // takes many replies at once; over more rounds than the ring has slots, a reservation
    // meets xdpilone's stale view of the ring and gets fewer slots than asked. Every reply must
    // come back (they were dropped before the rest was offered again). 64 a round stays within
    // what the client socket holds unread.
    let socket = UdpSocket::bind("10.99.0.2:0").expect("client socket");
    socket.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let burst_to = SocketAddr::from(([10, 99, 0, 1], PORT));
    const BURST: usize = 64;
    const ROUNDS: usize = 96;
    let mut buf = [0u8; 2048];
    for round in 0..ROUNDS {
        for i in 0..BURST {
            socket.send_to(format!("burst {round} {i}").as_bytes(), burst_to).expect("send");
        }
        let mut seen = [false; BURST];
        for _ in 0..BURST {
            let Ok((len, _)) = socket.recv_from(&mut buf) else { break };
            let text = String::from_utf8_lossy(&buf[..len]).into_owned();
            if let Some(i) = text.strip_prefix(&format!("xdp:burst {round} ")).and_then(|n| n.parse::<usize>().ok()) {
                seen[i] = true;
            }
        }
        let missing = seen.iter().filter(|s| !**s).count();
        assert_eq!(missing, 0, "answers missing from burst {round} of {BURST}");
    }
    to_server.send("stop").expect("stop");
    started.recv().expect("stopped");
    for (client, server) in [("10.99.0.2:0", "10.99.0.1"), ("[fd99::2]:0", "fd99::1")] {
        let socket = UdpSocket::bind(client).expect("client socket");
        socket.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let server = SocketAddr::new(server.parse().expect("address"), PORT);
        let mut want = b"kernel:".to_vec();
        want.extend_from_slice(b"after");
        assert_eq!(ask_kernel(&socket, server, b"after"), want, "the kernel answers once the program is detached");
    }
    to_server.send("quit").expect("quit");
    let answered = server.join().expect("the server thread");
    assert_eq!(answered as usize, 204 + BURST * ROUNDS, "the listener counts what it answered");
    let counts = *counts.lock().expect("counts");
    assert_eq!(counts.too_large, 2, "the answers too large for the MTU are counted: {counts:?}");
    assert_eq!(counts.invalid, 0, "no descriptor refused: {counts:?}");
}
