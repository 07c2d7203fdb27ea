//! Where the CLI reaches the stack: the DNS servers to check answers on, and why the control API
//! or its store does not answer.

use super::*;

/// Where DNS is asked when the stack does not say (an authority from before `dns` in its
/// status), and what a preview that asks nothing carries.
pub(super) const DNS_FALLBACK: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 5353);

/// An authority whose report is older than this is gone or cut off from the store: `verify`
/// says so and does not ask it (authorities report every 5 s).
pub(super) const AUTHORITY_REPORT_FRESH: Duration = Duration::from_secs(30);

/// `addr`, asked on loopback when it is a wildcard one.
pub(super) fn reachable(mut addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() { std::net::Ipv4Addr::LOCALHOST.into() } else { std::net::Ipv6Addr::LOCALHOST.into() });
    }
    addr
}

impl Client {
    /// The DNS server to check answers on: `given` (`--dns`, `DNSPLAN_DNS`), else the first
    /// address the authority says it serves DNS on (a wildcard one asked on loopback).
    pub(super) async fn dns(&self, given: Option<SocketAddr>) -> CliResult<SocketAddr> {
        if let Some(dns) = given {
            return Ok(dns);
        }
        let status: Option<Status> = self.get_json(&self.status_path("?limit=0")).await?;
        Ok(status.and_then(|s| s.dns.into_iter().next()).map_or(DNS_FALLBACK, reachable))
    }

    /// The DNS servers to check answers on, and notes on authorities not asked: `given`;
    /// else every address this authority serves DNS on (a wildcard one asked on loopback)
    /// and every address the other authorities of its store report (on etcd), those that
    /// reported in the last [`AUTHORITY_REPORT_FRESH`]; else the fallback.
    pub(super) async fn dns_all(&self, given: Vec<SocketAddr>) -> CliResult<(Vec<SocketAddr>, Vec<String>)> {
        if !given.is_empty() {
            return Ok((given, Vec::new()));
        }
        let status: Option<Status> = self.get_json(&self.status_path("?limit=0")).await?;
        let Some(status) = status else { return Ok((vec![DNS_FALLBACK], Vec::new())) };
        let mut all: Vec<SocketAddr> = Vec::new();
        let mut notes = Vec::new();
        let mut add = |dns: SocketAddr| {
            if !all.contains(&dns) {
                all.push(dns);
            }
        };
        status.dns.iter().copied().map(reachable).for_each(&mut add);
        for other in status.authorities.iter().filter(|a| a.id != status.id) {
            let age = Duration::from_millis(other.age_ms);
            if age > AUTHORITY_REPORT_FRESH {
                notes.push(format!(
                    "authority {} last reported {} s ago: gone or cut off from the store, not asked",
                    other.id,
                    age.as_secs()
                ));
                continue;
            }
            for &dns in &other.dns {
                if dns.ip().is_unspecified() {
                    notes.push(format!(
                        "authority {} reports DNS on {dns}, which says nothing of where to reach it: set its dns.advertise",
                        other.id
                    ));
                } else {
                    add(dns);
                }
            }
        }
        if all.is_empty() {
            all.push(DNS_FALLBACK);
        }
        Ok((all, notes))
    }

    pub(super) fn store_unavailable(&self, detail: String) -> CliError {
        CliError::StoreUnavailable(format!(
            "{detail}; the control API at {} answers, but its store does not (on etcd: is etcd up and reachable from the authority?)",
            self.control
        ))
    }

    /// Whether the control API answers at all (`GET /healthz`, which needs nothing behind it).
    pub(super) async fn why_unreachable(&self, detail: String) -> CliError {
        let url = format!("{}/healthz", self.control);
        match self.http.get(&url).timeout(HEALTH_CHECK_TIMEOUT).send().await {
            Ok(resp) if resp.status().is_success() => self.store_unavailable(detail),
            _ => CliError::Unreachable(format!(
                "{detail}; the control API at {} does not answer: is the stack running (`dnsplan up`)? Use --control to point elsewhere",
                self.control
            )),
        }
    }
}
