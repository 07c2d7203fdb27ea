//! The follower's check of what it is about to serve, when a keyring is configured: an
//! active record is served only when it is exactly what a plan of its generation says, and
//! that plan carries a valid signature by a key the keyring trusts for its zone and author.
//!
//! The store checks a publish and each apply's content itself, but a writer with access to
//! etcd can go around those checks: write a plan, or an active record, straight into it. The
//! check here is made on what the store hands the follower, so such a record is never served:
//! a changed record is left out of the merge (the name keeps serving what it served), and when
//! the whole state is read (at start, or after falling behind the store's change log) it is
//! not served at all. Each is logged at error and counted in
//! `dnsplan_untrusted_records_total`.
//!
//! Cost: each generation met is read whole and verified once, then kept (the few newest);
//! records follow the newest plans, so a follower reads each new plan once.

use crate::metrics::Metrics;
use dnsplan_common::changes::PlanEntry;
use dnsplan_common::signing::Keyring;
use dnsplan_common::store::{ActiveRecord, Store, StoreError, StoreResult, plan_says};
use dnsplan_common::{EndpointName, Generation, Plan};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

/// Plans kept verified: the active state of a zone spans a few generations at a time.
const PLANS_KEPT: usize = 8;

/// What a generation's plan is to the follower.
#[derive(Clone)]
enum Trust {
    Trusted(Arc<Plan>),
    /// Not trusted (why is logged once, when found).
    Refused,
}

/// What one read refused: how many records, and the first with why.
#[derive(Default)]
struct Refused {
    count: u64,
    first: Option<(EndpointName, String)>,
}

impl Refused {
    /// `true` when `why` is `None` (the record is trusted); else counts it.
    fn unless(&mut self, why: Option<String>, name: &EndpointName) -> bool {
        let Some(why) = why else { return true };
        self.count += 1;
        self.first.get_or_insert_with(|| (name.clone(), why));
        false
    }
}

/// Why `record` of `name` is not trusted, `None` when a trusted plan says it.
fn says(trust: &BTreeMap<Generation, Trust>, name: &EndpointName, record: &ActiveRecord) -> Option<String> {
    match trust.get(&record.generation) {
        Some(Trust::Trusted(plan)) => plan_says(&PlanEntry::of(plan, name), &record.state)
            .map(|instead| format!("{name} is not what its trusted plan {} says (the plan {instead})", record.generation)),
        _ => Some(format!("{name} is of plan {}, which is not trusted", record.generation)),
    }
}

pub struct PlanCheck {
    keyring: Arc<Keyring>,
    plans: Mutex<VecDeque<(Generation, Trust)>>,
    metrics: Arc<Metrics>,
}

impl PlanCheck {
    pub fn new(keyring: Arc<Keyring>, metrics: Arc<Metrics>) -> Arc<PlanCheck> {
        Arc::new(PlanCheck { keyring, plans: Mutex::new(VecDeque::new()), metrics })
    }

    /// Removes each of `records` that no trusted plan says.
    pub async fn keep_trusted<S: Store>(&self, store: &S, records: &mut Vec<(EndpointName, ActiveRecord)>) -> StoreResult<()> {
        let trust = self.trust_all(store, records.iter().map(|(_, r)| r.generation)).await?;
        let mut refused = Refused::default();
        records.retain(|(name, record)| refused.unless(says(&trust, name, record), name));
        self.report(refused);
        Ok(())
    }

    /// As `keep_trusted`, of a map (an `active_since` answer).
    pub async fn keep_trusted_map<S: Store>(&self, store: &S, records: &mut BTreeMap<EndpointName, ActiveRecord>) -> StoreResult<()> {
        let trust = self.trust_all(store, records.values().map(|r| r.generation)).await?;
        let mut refused = Refused::default();
        records.retain(|name, record| refused.unless(says(&trust, name, record), name));
        self.report(refused);
        Ok(())
    }

    /// One line for all the records one read refused, not one per record.
    fn report(&self, refused: Refused) {
        let Some((first, why)) = refused.first else { return };
        self.metrics.untrusted_records.inc_by(refused.count);
        tracing::error!(
            records = refused.count,
            first = %first,
            "not serving {} active records: {why}; they were written around the store's checks, or by an author the \
             keyring does not trust (each name keeps what it served)",
            refused.count
        );
    }

    async fn trust_all<S: Store>(
        &self,
        store: &S,
        generations: impl Iterator<Item = Generation>,
    ) -> StoreResult<BTreeMap<Generation, Trust>> {
        let mut trust = BTreeMap::new();
        for generation in generations.collect::<BTreeSet<_>>() {
            trust.insert(generation, self.trust(store, generation).await?);
        }
        Ok(trust)
    }

    async fn trust<S: Store>(&self, store: &S, generation: Generation) -> StoreResult<Trust> {
        if let Some((_, trust)) = self.lock().iter().find(|(g, _)| *g == generation) {
            return Ok(trust.clone());
        }
        // Only a signature's verdict is kept: a plan not found or not readable now is asked
        // for again when a record of it comes next.
        let (trust, keep) = match store.plan(generation).await {
            Ok(plan) if plan.generation() != generation => {
                tracing::error!(generation = generation.0, "the store gave plan {} when asked for {generation}", plan.generation());
                (Trust::Refused, false)
            }
            Ok(plan) => match self.keyring.verify(&plan) {
                Ok(key) => {
                    tracing::debug!(generation = generation.0, key, "plan signature verified");
                    (Trust::Trusted(Arc::new(plan.into_plan())), true)
                }
                Err(err) => {
                    tracing::error!(error = %err, "records of this plan are not served");
                    (Trust::Refused, true)
                }
            },
            // No plan: nothing can say the record (a record of a plan never published, or one
            // whose plan is gone, which cleanup never does to an active generation).
            Err(StoreError::PlanNotFound(_) | StoreError::Pruned { .. }) => {
                tracing::error!(generation = generation.0, "records of this generation are not served: the store holds no such plan");
                (Trust::Refused, false)
            }
            Err(StoreError::Corrupt { what, source }) => {
                tracing::error!(error = %source, what, "records of this generation are not served: its plan does not decode");
                (Trust::Refused, false)
            }
            Err(err) => return Err(err),
        };
        if !keep {
            return Ok(trust);
        }
        let mut plans = self.lock();
        if plans.len() == PLANS_KEPT {
            plans.pop_front();
        }
        plans.push_back((generation, trust.clone()));
        Ok(trust)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(Generation, Trust)>> {
        self.plans.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
