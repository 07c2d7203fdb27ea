//! Verification over DNS: after a plan is applied, each changed endpoint must answer, at the
//! authority, with addresses from that plan only (A and AAAA for the families it has).
//!
//! The authority swaps its snapshot a moment after the store changes, so each check is retried
//! until the verify timeout; a newer plan published meanwhile ends verification early.

use crate::config::VerifySettings;
use dnsplan_common::dns_probe::{self, RecordType};
use dnsplan_common::{Endpoint, EndpointName};
use rand::seq::IndexedRandom;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// One name and family to check, with the addresses the plan allows there.
#[derive(Clone, Debug)]
pub struct Check {
    pub endpoint: EndpointName,
    pub qtype: RecordType,
    pub allowed: BTreeSet<IpAddr>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Served,
    /// A newer plan appeared; this one no longer has to be what is served.
    Superseded,
    Mismatch {
        failing: usize,
        example: String,
    },
}

/// The checks for `changed` endpoints of `plan`, at most `max` endpoints (a random sample).
pub fn checks_for(records: &BTreeMap<EndpointName, Endpoint>, changed: &[EndpointName], max: usize) -> Vec<Check> {
    let chosen: Vec<&EndpointName> =
        if changed.len() > max { changed.sample(&mut rand::rng(), max).collect() } else { changed.iter().collect() };
    let mut checks = Vec::new();
    for name in chosen {
        let Some(endpoint) = records.get(name) else { continue }; // retired: nothing to serve
        let v4: BTreeSet<IpAddr> = endpoint.targets.iter().map(|t| t.address).filter(IpAddr::is_ipv4).collect();
        let v6: BTreeSet<IpAddr> = endpoint.targets.iter().map(|t| t.address).filter(IpAddr::is_ipv6).collect();
        for (qtype, allowed) in [(RecordType::A, v4), (RecordType::AAAA, v6)] {
            if !allowed.is_empty() {
                checks.push(Check { endpoint: name.clone(), qtype, allowed });
            }
        }
    }
    checks
}

/// Runs `checks` against the authority until all pass, `superseded()` says a newer plan
/// exists, or the timeout passes.
pub async fn run(checks: &mut Vec<Check>, settings: &VerifySettings, superseded: impl Fn() -> bool) -> Outcome {
    let deadline = Instant::now() + settings.timeout;
    let mut pause = Duration::from_millis(5);
    let mut example = String::new();
    loop {
        if superseded() {
            return Outcome::Superseded;
        }
        let mut failing = Vec::new();
        for check in checks.drain(..) {
            let per_query = settings.timeout.min(Duration::from_secs(1));
            match dns_probe::query(settings.dns_server, check.endpoint.as_str(), check.qtype, per_query).await {
                Ok(answer) if answer.has_addresses() && answer.addresses.is_subset(&check.allowed) => {}
                Ok(answer) => {
                    example = format!(
                        "{} {} answered {:?} {:?}, the plan has {:?}",
                        check.endpoint, check.qtype, answer.rcode, answer.addresses, check.allowed
                    );
                    failing.push(check);
                }
                Err(err) => {
                    example = format!("{} {}: {err}", check.endpoint, check.qtype);
                    failing.push(check);
                }
            }
        }
        *checks = failing;
        if checks.is_empty() {
            return Outcome::Served;
        }
        if Instant::now() + pause >= deadline {
            return Outcome::Mismatch { failing: checks.len(), example };
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}
