//! Watching a running stack the way its users would, and judging what was seen.
//!
//! A DNS prober asks the authority (or one of its secondaries) for every managed name in turn
//! and records each answer; a store observer records every active snapshot together with the
//! oldest stored plan read just before it. [`check`] reads both histories against the plans that were published and
//! reports every violation of the invariants: no empty answer, only published data served,
//! no generation going backwards, no active plan deleted (nor its addresses served after a
//! checkpoint), no endpoint vanishing.

use dnsplan_common::dns_probe::{self, DnsAnswer, RecordType};
use dnsplan_common::{ActiveSnapshot, ActiveState, DnsName, EndpointName, Generation, Store, StoreVersion, ValidatedPlan};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Most answers one prober records; the prober stops by itself there.
pub const ANSWERS_MAX: usize = 200_000;
/// Most snapshots one observer records.
pub const SNAPSHOTS_MAX: usize = 20_000;
const QUERY_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the authority may take to serve what the store holds.
const CATCH_UP_WITHIN: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct Answer {
    pub name: EndpointName,
    pub result: Result<DnsAnswer, String>,
    /// For an answer asked at a checkpoint: the oldest stored plan, read before the watched
    /// server caught up with the store. Plans below it were deleted before this answer, and
    /// cleanup never deletes an active plan, so an answer only they serve is a deleted plan's.
    pub deleted_below: Option<Generation>,
    /// When the query was sent and when its answer came back, on the watcher's clock (a
    /// counter every send and every receipt moves). The prober and a checkpoint ask at the
    /// same time, so answers are recorded in the order their tasks ran, not in the order the
    /// server gave them: one asked before a change can be recorded after one asked after it.
    pub asked: u64,
    pub answered: u64,
}

#[derive(Clone, Debug)]
pub struct Observed {
    /// Oldest stored plan, read just before `snapshot` (plans below it were deleted).
    pub horizon: Generation,
    pub snapshot: ActiveSnapshot,
}

#[derive(Debug, Default)]
pub struct History {
    pub answers: Vec<Answer>,
    pub snapshots: Vec<Observed>,
}

/// A prober and an observer running until [`Watcher::stop`]. Both append to the same history
/// that [`Watcher::checkpoint`] adds to, each when its task gets to it (answers carry when
/// they were asked and answered, which is what `check` orders them by).
pub struct Watcher<S: Store> {
    stop: watch::Sender<bool>,
    prober: JoinHandle<()>,
    /// `None` for a watcher of a secondary: the authority's watcher observes the store.
    observer: Option<JoinHandle<()>>,
    shared: Shared<S>,
}

#[derive(Clone)]
struct Shared<S: Store> {
    dns: SocketAddr,
    origin: DnsName,
    names: Vec<EndpointName>,
    store: S,
    history: Arc<Mutex<History>>,
    /// The clock of `Answer::asked` and `Answer::answered`.
    clock: Arc<AtomicU64>,
}

impl<S: Store> Shared<S> {
    fn push_answer(&self, answer: Answer) -> usize {
        let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        history.answers.push(answer);
        history.answers.len()
    }

    async fn ask(&self, name: &EndpointName) -> Answer {
        let asked = self.clock.fetch_add(1, Ordering::SeqCst);
        let result = dns_probe::query(self.dns, name.as_str(), RecordType::A, QUERY_TIMEOUT).await.map_err(|e| e.to_string());
        let answered = self.clock.fetch_add(1, Ordering::SeqCst);
        Answer { name: name.clone(), result, deleted_below: None, asked, answered }
    }

    /// Records one snapshot; false when the store could not be read.
    async fn observe_once(&self) -> bool {
        // Horizon first: both it and (fenced) active generations only grow, so an active
        // generation below a horizon read earlier was deleted while active.
        let Ok(list) = self.store.list(Generation::NONE, 1).await else { return false };
        let horizon = list.first().map(|p| p.generation).unwrap_or_default();
        let Ok(snapshot) = self.store.active_all().await else { return false };
        let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        if history.snapshots.len() < SNAPSHOTS_MAX {
            history.snapshots.push(Observed { horizon, snapshot });
        }
        true
    }

    /// Waits (bounded) until the watched server's SOA serial shows at least the store's content
    /// changes as read now (serial_base 0).
    async fn authority_caught_up(&self) -> anyhow::Result<()> {
        let want = self.store.active_all().await?.content_changes as u32;
        let deadline = tokio::time::Instant::now() + CATCH_UP_WITHIN;
        loop {
            let soa = dns_probe::query(self.dns, self.origin.as_str(), RecordType::SOA, QUERY_TIMEOUT).await;
            // At or past what the store held when asked (the stack may have moved on since);
            // serial arithmetic as in RFC 1982.
            if matches!(&soa, Ok(a) if a.soa_serial.is_some_and(|s| s.wrapping_sub(want) < 1 << 31)) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("{} did not catch up with the store (serial {want}) within {CATCH_UP_WITHIN:?}: {soa:?}", self.dns);
            }
            tokio::task::yield_now().await;
        }
    }
}

impl<S: Store> Watcher<S> {
    /// As `start`, once the authority serves what the store held when asked (its SOA serial
    /// shows the store's content changes): a caller that waited for the store to reach a
    /// state must not probe before the authority has followed it there.
    pub async fn start_caught_up(dns: SocketAddr, origin: DnsName, names: Vec<EndpointName>, store: S) -> anyhow::Result<Watcher<S>> {
        let shared = Shared {
            dns,
            origin: origin.clone(),
            names: names.clone(),
            store: store.clone(),
            history: Arc::default(),
            clock: Arc::default(),
        };
        shared.authority_caught_up().await?;
        Ok(Watcher::start(dns, origin, names, store))
    }

    /// Watches `names` in the DNS zone `origin` served at `dns` from `store`.
    pub fn start(dns: SocketAddr, origin: DnsName, names: Vec<EndpointName>, store: S) -> Watcher<S> {
        let (stop, stopped) = watch::channel(false);
        let shared = Shared { dns, origin, names, store, history: Arc::default(), clock: Arc::default() };
        let prober = tokio::spawn(probe(shared.clone(), stopped.clone()));
        let observer = Some(tokio::spawn(observe(shared.clone(), stopped)));
        Watcher { stop, prober, observer, shared }
    }

    /// Watches `names` as served at `dns` by a secondary of the authority serving `store`:
    /// answers only, since the authority's own watcher records the store's snapshots. Its
    /// checkpoints wait for the secondary's SOA serial, which is the authority's once it has
    /// transferred the change.
    pub fn start_secondary(dns: SocketAddr, origin: DnsName, names: Vec<EndpointName>, store: S) -> Watcher<S> {
        let (stop, stopped) = watch::channel(false);
        let shared = Shared { dns, origin, names, store, history: Arc::default(), clock: Arc::default() };
        let prober = tokio::spawn(probe(shared.clone(), stopped));
        Watcher { stop, prober, observer: None, shared }
    }

    /// Once the authority serves what the store holds, records a snapshot and asks every name:
    /// whatever state the stack is in now is judged for certain, not only if the prober
    /// happened to look.
    pub async fn checkpoint(&self) -> anyhow::Result<()> {
        // Read first: the server then serves a state at least as new as the store's at this
        // read, whose active plans are all at or above this horizon (both only grow).
        let horizon = self.shared.store.list(Generation::NONE, 1).await?.first().map(|p| p.generation);
        self.shared.authority_caught_up().await?;
        if self.observer.is_some() {
            self.shared.observe_once().await;
        }
        for name in &self.shared.names {
            let answer = self.shared.ask(name).await;
            self.shared.push_answer(Answer { deleted_below: horizon, ..answer });
        }
        Ok(())
    }

    /// Stops both, takes a last checkpoint, and returns what was seen.
    pub async fn stop(mut self) -> anyhow::Result<History> {
        let _ = self.stop.send(true);
        (&mut self.prober).await?;
        if let Some(observer) = self.observer.as_mut() {
            observer.await?;
        }
        self.checkpoint().await?;
        let mut history = self.shared.history.lock().unwrap_or_else(|p| p.into_inner());
        Ok(std::mem::take(&mut *history))
    }
}

async fn probe<S: Store>(shared: Shared<S>, stopped: watch::Receiver<bool>) {
    loop {
        for name in &shared.names {
            if *stopped.borrow() {
                return;
            }
            if shared.push_answer(shared.ask(name).await) >= ANSWERS_MAX {
                return;
            }
        }
    }
}

async fn observe<S: Store>(shared: Shared<S>, mut stopped: watch::Receiver<bool>) {
    let mut seen = StoreVersion::default();
    for _ in 0..SNAPSHOTS_MAX {
        if *stopped.borrow() {
            return;
        }
        shared.observe_once().await;
        tokio::select! {
            version = shared.store.wait_for_change(seen, Duration::from_secs(1)) => match version {
                Ok(version) => seen = version,
                // The store is unreachable: retry at a bounded rate.
                Err(_) => { let _ = tokio::time::timeout(Duration::from_millis(100), stopped.changed()).await; }
            },
            _ = stopped.changed() => {}
        }
    }
}

/// What a scenario tolerates.
#[derive(Clone, Copy, Debug, Default)]
pub struct CheckOptions {
    /// A query that got no answer at all (the authority was down on purpose) is not a
    /// violation; resolvers retry another server. An answer without addresses always is.
    pub unanswered_ok: bool,
}

/// Every violation in `history`, given every plan that was published (by generation).
pub fn check(history: &History, published: &BTreeMap<Generation, ValidatedPlan>) -> Vec<String> {
    check_with(history, published, CheckOptions::default())
}

/// As `check`, with a scenario's tolerances.
pub fn check_with(history: &History, published: &BTreeMap<Generation, ValidatedPlan>, options: CheckOptions) -> Vec<String> {
    let mut violations = Vec::new();
    // Addresses each published plan gives each name.
    let mut served_by: BTreeMap<&EndpointName, Vec<(Generation, BTreeSet<IpAddr>)>> = BTreeMap::new();
    for (g, plan) in published {
        for (name, endpoint) in &plan.plan().endpoints {
            served_by.entry(name).or_default().push((*g, endpoint.targets.iter().map(|t| t.address).collect()));
        }
    }
    // Each answer's plans (the lowest and highest that serve what it got).
    let mut judged: Vec<Option<(Generation, Generation)>> = vec![None; history.answers.len()];
    for (i, answer) in history.answers.iter().enumerate() {
        let got = match &answer.result {
            Ok(got) if got.has_addresses() => got,
            Ok(got) => {
                violations.push(format!(
                    "answer {i}: {} answered {:?} with no address (AA={}, SOA serial in the authority section: {:?})",
                    answer.name, got.rcode, got.authoritative, got.soa_serial
                ));
                continue;
            }
            Err(_) if options.unanswered_ok => continue,
            Err(err) => {
                violations.push(format!("answer {i}: {} got no answer: {err}", answer.name));
                continue;
            }
        };
        let candidates: Vec<Generation> = served_by
            .get(&answer.name)
            .map(|plans| plans.iter().filter(|(_, allowed)| got.addresses.is_subset(allowed)).map(|(g, _)| *g).collect())
            .unwrap_or_default();
        let (Some(lowest), Some(highest)) = (candidates.iter().min(), candidates.iter().max()) else {
            violations.push(format!("answer {i}: {} answered {:?}, which no published plan serves", answer.name, got.addresses));
            continue;
        };
        judged[i] = Some((*lowest, *highest));
        if let Some(horizon) = answer.deleted_below
            && *highest < horizon
        {
            violations.push(format!(
                "answer {i}: {} served plan {highest}'s addresses after it was deleted (oldest stored plan {horizon})",
                answer.name
            ));
        }
    }
    // Going backwards: an answer older than one that came back before it was asked. Answers
    // in flight at the same time are not ordered by the server's history, so each is held to
    // the floor its name had when it was asked, raised by every answer received until then.
    let mut events: Vec<(u64, usize)> = Vec::with_capacity(history.answers.len() * 2);
    for (i, answer) in history.answers.iter().enumerate() {
        events.extend([(answer.asked, i), (answer.answered, i)]);
    }
    events.sort_unstable();
    let mut floor: BTreeMap<&EndpointName, Generation> = BTreeMap::new();
    let mut at_ask: Vec<Generation> = vec![Generation::NONE; history.answers.len()];
    for (tick, i) in events {
        let answer = &history.answers[i];
        if tick == answer.asked {
            at_ask[i] = floor.get(&answer.name).copied().unwrap_or_default();
        } else if let Some((lowest, _)) = judged[i] {
            let raised = floor.entry(&answer.name).or_default();
            *raised = (*raised).max(lowest);
        }
    }
    for (i, answer) in history.answers.iter().enumerate() {
        if let Some((_, highest)) = judged[i]
            && highest < at_ask[i]
        {
            violations.push(format!(
                "answer {i}: {} went backwards: served plan {highest} after plan {} had been served",
                answer.name, at_ask[i]
            ));
        }
    }

    let mut last: BTreeMap<&EndpointName, Generation> = BTreeMap::new();
    for (i, observed) in history.snapshots.iter().enumerate() {
        for (name, record) in &observed.snapshot.endpoints {
            if let Some(before) = last.get(name)
                && record.generation < *before
            {
                violations.push(format!("snapshot {i}: {name}'s active generation went back from {before} to {}", record.generation));
            }
            if matches!(record.state, ActiveState::Serving(_)) && record.generation < observed.horizon {
                violations.push(format!(
                    "snapshot {i}: {name} is active at plan {}, which was deleted (oldest stored plan {})",
                    record.generation, observed.horizon
                ));
            }
            last.insert(name, record.generation);
        }
        for name in last.keys() {
            if !observed.snapshot.endpoints.contains_key(*name) {
                violations.push(format!("snapshot {i}: {name} had records and now has none"));
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{endpoint_for, name, plan, planner};

    /// An answer serving plan `g` for e0, asked and answered at these ticks.
    fn answer(g: u64, asked: u64, answered: u64) -> Answer {
        let addresses = endpoint_for(Generation(g)).targets.iter().map(|t| t.address).collect();
        let got = DnsAnswer { rcode: dns_probe::ResponseCode::NoError, authoritative: true, addresses, soa_serial: None };
        Answer { name: name("e0"), result: Ok(got), deleted_below: None, asked, answered }
    }

    fn backwards(answers: Vec<Answer>) -> Vec<String> {
        let published = (1..=2).map(|g| (Generation(g), plan(g, &[name("e0")], planner()))).collect();
        check(&History { answers, snapshots: Vec::new() }, &published).into_iter().filter(|v| v.contains("went backwards")).collect()
    }

    /// Plan 1 asked after plan 2 came back is going backwards, whatever order the answers
    /// were recorded in; plan 1 asked before plan 2 came back is not (the two were in flight
    /// at once, and the server may have changed in between).
    #[test]
    fn answers_are_ordered_by_when_they_were_asked_and_answered() {
        assert_eq!(backwards(vec![answer(2, 0, 1), answer(1, 2, 3)]).len(), 1, "asked after plan 2 came back");
        assert_eq!(backwards(vec![answer(1, 2, 3), answer(2, 0, 1)]).len(), 1, "the same, recorded the other way round");
        assert_eq!(backwards(vec![answer(2, 1, 2), answer(1, 0, 3)]), Vec::<String>::new(), "in flight at once");
        assert_eq!(backwards(vec![answer(1, 0, 1), answer(2, 2, 3)]), Vec::<String>::new(), "forwards");
    }
}
