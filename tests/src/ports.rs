//! Free loopback ports for the servers tests start (ours and their counterparts), outside the
//! kernel's ephemeral range. A port the kernel handed out as ephemeral can be taken again by any
//! outgoing connection or client socket (a prober's query, an etcd client) between the pick and
//! the server's bind, or while a server is down for a restart on the same port; then the server
//! cannot bind and the test fails for a reason of its own. Below the range, only another
//! server's explicit bind can take it, and each port is handed out once per process.

use std::collections::BTreeSet;
use std::net::{TcpListener, UdpSocket};
use std::sync::Mutex;

/// Ports already handed out by this process: two picks never collide, even before either is bound.
static HANDED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The lowest port picked: above the well-known and most registered ones.
const LOWEST: u16 = 10_000;

/// One port free for both UDP and TCP on 127.0.0.1 now, outside the ephemeral range.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(free_ports(1)?[0])
}

/// `n` distinct ports, each as `free_port` gives.
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let below = ephemeral_low().max(LOWEST + 1_000);
    let span = u32::from(below - LOWEST);
    let mut handed = HANDED.lock().unwrap_or_else(|p| p.into_inner());
    let mut ports = Vec::with_capacity(n);
    // A random start, so that processes that run at once rarely try the same ports first.
    let start = rand::random_range(0..span);
    for step in 0..span {
        if ports.len() == n {
            break;
        }
        let port = LOWEST + ((start + step) % span) as u16;
        if handed.contains(&port) {
            continue;
        }
        let (udp, tcp) = (UdpSocket::bind(("127.0.0.1", port)), TcpListener::bind(("127.0.0.1", port)));
        if udp.is_ok() && tcp.is_ok() {
            handed.insert(port);
            ports.push(port);
        }
    }
    anyhow::ensure!(ports.len() == n, "only {} of {n} loopback ports free below {below}", ports.len());
    Ok(ports)
}

/// The first port of the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), 32768
/// when it cannot be read.
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_free_and_below_the_ephemeral_range() {
        let ports = free_ports(32).expect("ports");
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), 32, "{ports:?}");
        assert!(ports.iter().all(|p| (LOWEST..ephemeral_low().max(LOWEST + 1_000)).contains(p)), "{ports:?}");
        let again = free_port().expect("port");
        assert!(!distinct.contains(&again), "a port handed out twice: {again}");
        UdpSocket::bind(("127.0.0.1", again)).expect("free for UDP");
        TcpListener::bind(("127.0.0.1", again)).expect("free for TCP");
    }
}
