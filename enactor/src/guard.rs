//! The enactor's second line of defence against incorrect plans, as a pure function: a plan
//! that would stop serving too much of an endpoint's active weight in one step is refused.

use dnsplan_common::{ActiveSnapshot, ActiveState, Endpoint, EndpointName, Generation, removed_weight_fraction};
use std::collections::BTreeMap;

/// The endpoint a plan would strip the most, when that is more than `max_fraction`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExcessiveRemoval {
    pub endpoint: EndpointName,
    pub fraction: f64,
    pub max_fraction: f64,
    /// How many endpoints are over the limit in all.
    pub endpoints_over: usize,
}

impl std::fmt::Display for ExcessiveRemoval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "it would stop serving {:.0}% of {}'s active weight in one step (limit {:.0}%; {} endpoint(s) over the limit); \
             an operator's plan or rollback is not limited",
            self.fraction * 100.0,
            self.endpoint,
            self.max_fraction * 100.0,
            self.endpoints_over
        )
    }
}

/// Compares what plan `generation` serves (all of it, or only what it changed: an endpoint
/// it does not change removes nothing) with what is active now. Endpoints already at the
/// plan's generation or newer, new endpoints, and endpoints the plan leaves out are not
/// removals.
pub fn excessive_removal(
    generation: Generation,
    serve: &BTreeMap<EndpointName, Endpoint>,
    active: &ActiveSnapshot,
    max_fraction: f64,
) -> Option<ExcessiveRemoval> {
    let mut worst: Option<ExcessiveRemoval> = None;
    let mut over = 0;
    for (name, next) in serve {
        let Some(record) = active.endpoints.get(name) else { continue };
        let ActiveState::Serving(current) = &record.state else { continue };
        if record.generation >= generation {
            continue;
        }
        let fraction = removed_weight_fraction(current, next);
        if fraction > max_fraction {
            over += 1;
            if worst.as_ref().is_none_or(|w| fraction > w.fraction) {
                worst = Some(ExcessiveRemoval { endpoint: name.clone(), fraction, max_fraction, endpoints_over: 0 });
            }
        }
    }
    worst.map(|w| ExcessiveRemoval { endpoints_over: over, ..w })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dnsplan_common::{ActiveRecord, DnsName, Target, ZoneId};

    fn endpoint(addresses: &[(&str, u32)]) -> Endpoint {
        let targets =
            addresses.iter().map(|(a, w)| Target { address: a.parse().unwrap(), zone: ZoneId::parse("a").unwrap(), weight: *w }).collect();
        Endpoint { ttl_secs: 30, targets }
    }

    fn serve(endpoints: &[(&str, Endpoint)]) -> BTreeMap<EndpointName, Endpoint> {
        endpoints.iter().map(|(n, e)| (DnsName::parse(n).unwrap(), e.clone())).collect()
    }

    fn active(g: u64, endpoints: &[(&str, Endpoint)]) -> ActiveSnapshot {
        let endpoints: BTreeMap<_, _> = endpoints
            .iter()
            .map(|(n, e)| (DnsName::parse(n).unwrap(), ActiveRecord { generation: Generation(g), state: ActiveState::Serving(e.clone()) }))
            .collect();
        ActiveSnapshot { applied_changes: 1, content_changes: 1, endpoints }
    }

    #[test]
    fn refuses_only_removals_above_the_limit() {
        let four = endpoint(&[("192.0.2.1", 1), ("192.0.2.2", 1), ("192.0.2.3", 1), ("192.0.2.4", 1)]);
        let now = active(1, &[("api.example.test.", four.clone()), ("db.example.test.", four.clone())]);
        let half = endpoint(&[("192.0.2.1", 1), ("192.0.2.2", 1)]);
        let one = endpoint(&[("192.0.2.1", 1)]);
        // Half of the weight is at the limit, not above it.
        assert_eq!(excessive_removal(Generation(2), &serve(&[("api.example.test.", half.clone())]), &now, 0.5), None);
        let refusal =
            excessive_removal(Generation(2), &serve(&[("api.example.test.", half), ("db.example.test.", one)]), &now, 0.5).unwrap();
        assert_eq!(refusal.endpoint.as_str(), "db.example.test.");
        assert_eq!(refusal.fraction, 0.75);
        assert_eq!(refusal.endpoints_over, 1);
        assert!(refusal.to_string().contains("75%"), "{refusal}");
    }

    #[test]
    fn new_left_out_and_already_newer_endpoints_are_not_removals() {
        let two = endpoint(&[("192.0.2.1", 1), ("192.0.2.2", 1)]);
        let other = endpoint(&[("198.51.100.1", 1)]);
        // db is already at generation 5: the plan cannot move it, so it removes nothing there.
        let mut now = active(1, &[("api.example.test.", two.clone())]);
        now.endpoints.insert(
            DnsName::parse("db.example.test.").unwrap(),
            ActiveRecord { generation: Generation(5), state: ActiveState::Serving(two.clone()) },
        );
        let p = serve(&[("new.example.test.", other.clone()), ("db.example.test.", other)]);
        assert_eq!(excessive_removal(Generation(3), &p, &now, 0.1), None);
    }
}
