//! What each added zone is now, for the metrics, the status page and `/v1/managed`: served
//! and following its store, served from what its directory kept, served with its store
//! failing, or live in the store and not served (and why). Kept by `AddedZones` as it starts
//! and drops zones; read at each scrape (`summary`), which walks every zone once: at 100,000
//! zones a few milliseconds, and the exposition stays bounded (`metrics::ZONE_SERIES_MAX`).

use crate::metrics::{ADDED_ZONE_STATES, AddedZonesSummary, SECONDARY_STATES, ZONE_SERIES_MAX};
use crate::serving::Serving;
use dnsplan_common::daemon::Reachability;
use dnsplan_common::names::DnsName;
use dnsplan_common::status::SecondaryState;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// One added zone as the authority holds it.
#[derive(Clone)]
pub enum Entry {
    /// Served from the state its directory kept; its store not read yet.
    Kept(Arc<Serving>),
    /// Served and followed; `reach` says whether its store answers the follower.
    Following { serving: Arc<Serving>, reach: Arc<Reachability> },
    /// Live in the store's registry and not served: why.
    NotServed(String),
}

impl Entry {
    /// The state's name (`metrics::ADDED_ZONE_STATES`).
    pub fn state(&self) -> &'static str {
        match self {
            Entry::Kept(_) => "kept",
            Entry::Following { reach, .. } if reach.is_down() => "store_failing",
            Entry::Following { .. } => "following",
            Entry::NotServed(_) => "not_served",
        }
    }

    /// What is served for the zone, if anything.
    pub fn serving(&self) -> Option<&Arc<Serving>> {
        match self {
            Entry::Kept(serving) | Entry::Following { serving, .. } => Some(serving),
            Entry::NotServed(_) => None,
        }
    }
}

/// Every added zone's entry, by name.
#[derive(Default)]
pub struct ZoneBook {
    zones: Mutex<BTreeMap<DnsName, Entry>>,
}

impl ZoneBook {
    pub fn set(&self, origin: &DnsName, entry: Entry) {
        self.lock().insert(origin.clone(), entry);
    }

    pub fn remove(&self, origin: &DnsName) {
        self.lock().remove(origin);
    }

    /// Keeps only the zones `keep` says yes to.
    pub fn retain(&self, keep: impl Fn(&DnsName) -> bool) {
        self.lock().retain(|origin, _| keep(origin));
    }

    pub fn get(&self, origin: &DnsName) -> Option<Entry> {
        self.lock().get(origin).cloned()
    }

    /// The first `n` zones by name, with their state.
    pub fn first(&self, n: usize) -> Vec<(String, &'static str)> {
        self.lock().iter().take(n).map(|(origin, entry)| (origin.to_string(), entry.state())).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<DnsName, Entry>> {
        self.zones.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The zones by state, their secondaries by state, and the zones in trouble by name (the
    /// first `ZONE_SERIES_MAX`), each with its worst reason.
    pub fn summary(&self) -> AddedZonesSummary {
        let entries: Vec<(String, Entry)> = self.lock().iter().map(|(origin, entry)| (origin.to_string(), entry.clone())).collect();
        let mut summary = AddedZonesSummary::default();
        for (origin, entry) in entries {
            let state = entry.state();
            if let Some(at) = ADDED_ZONE_STATES.iter().position(|s| *s == state) {
                summary.states[at] += 1;
            }
            let mut worst = (state != "following").then_some(state);
            if let Some(serving) = entry.serving() {
                let served = *serving.served_serial.borrow();
                let statuses = serving.secondaries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                for status in statuses.iter() {
                    let name = secondary_state(status.state(served));
                    if let Some(at) = SECONDARY_STATES.iter().position(|s| *s == name) {
                        summary.secondaries[at] += 1;
                    }
                    let reason = match name {
                        "unreachable" => "secondary_unreachable",
                        "differs" => "secondary_differs",
                        "behind" => "secondary_behind",
                        _ => continue,
                    };
                    if worst.is_none_or(|w| w.starts_with("secondary_") && rank(reason) < rank(w)) {
                        worst = Some(reason);
                    }
                }
            }
            if let Some(reason) = worst {
                if summary.trouble.len() < ZONE_SERIES_MAX {
                    summary.trouble.push((origin, reason));
                } else {
                    summary.unlisted += 1;
                }
            }
        }
        summary
    }
}

/// The order of the secondaries' reasons, the worst first.
fn rank(reason: &str) -> usize {
    ["secondary_unreachable", "secondary_differs", "secondary_behind"].iter().position(|r| *r == reason).unwrap_or(usize::MAX)
}

/// A secondary state's name (`metrics::SECONDARY_STATES`).
fn secondary_state(state: SecondaryState<'_>) -> &'static str {
    match state {
        SecondaryState::Current => "current",
        SecondaryState::Unverified(_) => "unverified",
        SecondaryState::Behind { .. } => "behind",
        SecondaryState::Differs(_) => "differs",
        SecondaryState::Unreachable(_) => "unreachable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::query::answer::AnswerLimits;
    use crate::serving::policy::TransferPolicy;
    use crate::zone::dns_zone::test_zone;
    use dnsplan_common::status::SecondaryStatus;

    fn serving(origin: &str, secondaries: &[(bool, Option<&str>)]) -> Arc<Serving> {
        let metrics = Arc::new(Metrics::new());
        let serving = Serving::for_static(test_zone(origin), AnswerLimits::default(), metrics, Arc::new(TransferPolicy::closed()));
        let served = *serving.served_serial.borrow();
        let statuses: Vec<SecondaryStatus> = secondaries
            .iter()
            .enumerate()
            .map(|(i, (behind, error))| SecondaryStatus {
                address: std::net::SocketAddr::from(([192, 0, 2, i as u8], 53)),
                notified_serial: Some(served),
                serial: Some(served),
                behind: *behind,
                last_error: error.map(String::from),
                content_equal_serial: Some(served),
                content_differs: None,
                content_error: None,
            })
            .collect();
        *serving.secondaries.lock().unwrap() = statuses;
        Arc::new(serving)
    }

    fn name(origin: &str) -> DnsName {
        DnsName::parse(origin).unwrap()
    }

    #[test]
    fn the_summary_counts_every_zone_and_names_at_most_the_cap_in_trouble() {
        let book = ZoneBook::default();
        let up = Arc::new(Reachability::new("up"));
        let down = Arc::new(Reachability::new("down"));
        down.mark_quietly(true);
        book.set(&name("a.test."), Entry::Following { serving: serving("a.test.", &[(false, None)]), reach: up.clone() });
        book.set(
            &name("b.test."),
            Entry::Following { serving: serving("b.test.", &[(true, None), (false, Some("timed out"))]), reach: up.clone() },
        );
        book.set(&name("c.test."), Entry::Following { serving: serving("c.test.", &[]), reach: down });
        book.set(&name("d.test."), Entry::Kept(serving("d.test.", &[])));
        book.set(&name("e.test."), Entry::NotServed("its master file: no SOA".into()));
        let summary = book.summary();
        assert_eq!(summary.states, [2, 1, 1, 1], "following, kept, store_failing, not_served");
        assert_eq!(summary.secondaries, [1, 0, 1, 0, 1], "current, unverified, behind, differs, unreachable");
        assert_eq!(
            summary.trouble,
            vec![
                ("b.test.".to_string(), "secondary_unreachable"),
                ("c.test.".to_string(), "store_failing"),
                ("d.test.".to_string(), "kept"),
                ("e.test.".to_string(), "not_served"),
            ]
        );
        assert_eq!(summary.unlisted, 0);

        for i in 0..ZONE_SERIES_MAX + 5 {
            book.set(&name(&format!("z{i:04}.test.")), Entry::NotServed("no store".into()));
        }
        let summary = book.summary();
        assert_eq!(summary.trouble.len(), ZONE_SERIES_MAX);
        assert_eq!(summary.unlisted, 4 + 5, "the zones in trouble past the cap, counted");
        book.retain(|origin| origin.as_str() == "a.test.");
        assert_eq!(book.summary().states, [1, 0, 0, 0]);
    }
}
