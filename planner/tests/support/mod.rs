//! Shared by the planner's tests: real TCP backends on loopback and a config pointing at them.
#![allow(dead_code)]

use dnsplan_common::{Generation, SledStore, Store, ValidatedPlan};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket};

/// How long a test waits for the planner to do something.
pub const WITHIN: Duration = Duration::from_secs(20);

/// Each listener's accept queue. A probe's connection stays queued (nobody accepts it): with the
/// 128 a listener gets by default, a target probed every 50 ms stops completing handshakes
/// after 6.4 s, and every check times out at once (seen as a flaky test that ran long under
/// load). 4,096 (the kernel's usual cap, `net.core.somaxconn`) lasts over three minutes.
pub const BACKLOG: u32 = 4096;

/// A listener on `addr` with a [`BACKLOG`]-long accept queue.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Six listeners per endpoint, two per zone, all on one port: api on 127.0.1.x, db on 127.0.2.x.
/// They never accept: the kernel completes each probe's handshake into the listener's queue,
/// which [`BACKLOG`] keeps from filling for the length of a test.
pub struct Backends {
    pub port: u16,
    listeners: BTreeMap<IpAddr, Option<TcpListener>>,
}

impl Backends {
    pub async fn start() -> anyhow::Result<Backends> {
        let first = listen("127.0.1.1:0".parse()?)?;
        let port = first.local_addr()?.port();
        let mut listeners = BTreeMap::new();
        listeners.insert("127.0.1.1".parse()?, Some(first));
        for net in [1, 2] {
            for host in 1..=6 {
                let ip: IpAddr = format!("127.0.{net}.{host}").parse()?;
                if let std::collections::btree_map::Entry::Vacant(slot) = listeners.entry(ip) {
                    slot.insert(Some(listen(SocketAddr::new(ip, port))?));
                }
            }
        }
        Ok(Backends { port, listeners })
    }

    pub fn stop(&mut self, ip: &str) -> anyhow::Result<()> {
        self.listeners.insert(ip.parse()?, None);
        Ok(())
    }

    pub async fn start_again(&mut self, ip: &str) -> anyhow::Result<()> {
        let ip: IpAddr = ip.parse()?;
        self.listeners.insert(ip, Some(listen(SocketAddr::new(ip, self.port))?));
        Ok(())
    }
}

pub fn config_text(port: u16, policy: &str) -> String {
    let mut text = format!(
        "id = \"p1\"\ndns_zone = \"example.test.\"\n[store]\nurl = \"http://127.0.0.1:1\"\n[planner]\ndecide_interval_ms = 50\nlease_ttl_ms = 1000\n[policy]\n{policy}\n"
    );
    for (net, name) in [(1, "api"), (2, "db")] {
        text.push_str(&format!(
            "[[endpoint]]\nname = \"{name}.example.test.\"\nttl_secs = 30\ncheck = {{ kind = \"tcp\", port = {port}, interval_ms = 50, timeout_ms = 50, rise = 1, fall = 2 }}\n"
        ));
        for (i, zone) in ["a", "a", "b", "b", "c", "c"].iter().enumerate() {
            text.push_str(&format!("[[endpoint.target]]\naddress = \"127.0.{net}.{}\"\nzone = \"{zone}\"\n", i + 1));
        }
    }
    text
}

/// Waits on the store (not a timer) until the latest plan satisfies `want`.
pub async fn wait_plan(store: &SledStore, want: impl Fn(&ValidatedPlan) -> bool) -> anyhow::Result<ValidatedPlan> {
    let wait = async {
        loop {
            let version = store.version().await?;
            if version.latest > Generation::NONE {
                let plan = store.plan(version.latest).await?;
                if want(&plan) {
                    return anyhow::Ok(plan);
                }
            }
            store.wait_for_change(version, WITHIN).await?;
        }
    };
    tokio::time::timeout(WITHIN, wait).await.map_err(|_| anyhow::anyhow!("no plan matched within {WITHIN:?}"))?
}

pub fn weight(plan: &ValidatedPlan, endpoint: &str, address: &str) -> Option<u32> {
    let name = dnsplan_common::DnsName::parse(endpoint).ok()?;
    let address: IpAddr = address.parse().ok()?;
    plan.plan().endpoints.get(&name)?.targets.iter().find(|t| t.address == address).map(|t| t.weight)
}
