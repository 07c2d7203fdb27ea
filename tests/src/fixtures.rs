//! Plans and endpoints for tests, with content derived from the generation so that any
//! active record can be checked against the plan it claims to come from.

use dnsplan_common::{Author, DnsName, Endpoint, EndpointName, Generation, Plan, Target, ValidatedPlan, ZoneId};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

pub const DNS_ZONE: &str = "example.test.";

pub fn name(label: &str) -> EndpointName {
    DnsName::parse(&format!("{label}.{DNS_ZONE}")).expect("fixture names are valid")
}

pub fn dns_zone() -> DnsName {
    DnsName::parse(DNS_ZONE).expect("fixture DNS zone is valid")
}

/// The records generation `g` gives every endpoint: two addresses that encode `g`.
pub fn endpoint_for(g: Generation) -> Endpoint {
    let [.., hi, lo] = g.0.to_be_bytes();
    let target = |last: u8, zone: &str| Target {
        address: IpAddr::V4(Ipv4Addr::new(10, hi, lo, last)),
        zone: ZoneId::parse(zone).expect("valid zone"),
        weight: 1,
    };
    Endpoint { ttl_secs: 30, targets: vec![target(1, "a"), target(2, "b")] }
}

pub fn planner() -> Author {
    Author::Planner { id: "planner-test".into() }
}

pub fn operator() -> Author {
    Author::Operator { name: "alice".into() }
}

/// Plan `g` (parent `g - 1`) serving `endpoints` with `endpoint_for(g)`.
pub fn plan(g: u64, endpoints: &[EndpointName], author: Author) -> ValidatedPlan {
    plan_in(&dns_zone(), g, endpoints, author)
}

/// Endpoint `label` of DNS zone `zone`.
pub fn name_in(zone: &DnsName, label: &str) -> EndpointName {
    DnsName::parse(&format!("{label}.{zone}")).expect("fixture names are valid")
}

/// [`plan`] for DNS zone `zone`.
pub fn plan_in(zone: &DnsName, g: u64, endpoints: &[EndpointName], author: Author) -> ValidatedPlan {
    let generation = Generation(g);
    let plan = Plan {
        generation,
        parent_generation: Generation(g - 1),
        created_at_unix_ms: 1_700_000_000_000 + g,
        author,
        reason: format!("test plan {g}"),
        dns_zone: zone.clone(),
        endpoints: endpoints.iter().map(|n| (n.clone(), endpoint_for(generation))).collect::<BTreeMap<_, _>>(),
        retired: BTreeSet::new(),
        rollback_of: None,
        provenance: vec![],
    };
    ValidatedPlan::new(plan).expect("fixture plans are valid")
}

/// The bytes of the files under `path` (a store on disk), 0 when it cannot be read.
pub fn dir_bytes(path: &std::path::Path) -> u64 {
    fn walk(path: &std::path::Path) -> std::io::Result<u64> {
        let mut total = 0;
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            total += if meta.is_dir() { walk(&entry.path())? } else { meta.len() };
        }
        Ok(total)
    }
    walk(path).unwrap_or(0)
}
