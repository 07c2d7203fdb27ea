//! Each rule that holds a decision back, as `deferred` says it: the rule, the target, the
//! numbers and when it is reconsidered. The decisions themselves are the scenarios' (in
//! `tests/scenarios.rs`); these check what is said about them.

use super::*;
use dnsplan_common::{Author, Generation};
use rand::SeedableRng;
use rand::rngs::SmallRng;

const S: u64 = 1_000;

/// `endpoints` endpoints e0.., each with `per_zone` targets in zones a, b, c, at
/// 10.<endpoint>.<zone index>.<n>; the default policy unless `policy` says otherwise.
fn config(endpoints: usize, per_zone: usize, policy: &str) -> PlannerConfig {
    let mut text = format!("id = \"p1\"\ndns_zone = \"example.test.\"\n[store]\nurl = \"http://127.0.0.1:8053\"\n[policy]\n{policy}\n");
    for e in 0..endpoints {
        text.push_str(&format!("[[endpoint]]\nname = \"e{e}.example.test.\"\nttl_secs = 30\ncheck = {{ kind = \"tcp\", port = 80 }}\n"));
        for (zi, zone) in ["a", "b", "c"].iter().enumerate() {
            for n in 1..=per_zone {
                text.push_str(&format!("[[endpoint.target]]\naddress = \"10.{e}.{zi}.{n}\"\nzone = \"{zone}\"\n"));
            }
        }
    }
    PlannerConfig::parse(&text).expect("test config is valid")
}

fn name(e: usize) -> EndpointName {
    EndpointName::parse(&format!("e{e}.example.test.")).expect("name")
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("address")
}

/// Every target up but `down` (addresses 10.<endpoint>.z.n).
fn health(config: &PlannerConfig, down: &[&str]) -> HealthView {
    let mut view = HealthView::new();
    for ep in config.endpoints() {
        for t in &ep.targets {
            let h = if down.contains(&t.address.to_string().as_str()) { Health::Down } else { Health::Up };
            view.insert((ep.name.clone(), t.address), h);
        }
    }
    view
}

/// The planner's part: a published decision becomes the previous plan, and the state of
/// every decision carried out is kept.
struct Run {
    config: PlannerConfig,
    previous: Option<Plan>,
    state: PlannerState,
    rng: SmallRng,
}

impl Run {
    /// The first plan, every target up, at t = 0.
    fn new(config: PlannerConfig) -> Run {
        let mut run = Run { config, previous: None, state: PlannerState::default(), rng: SmallRng::seed_from_u64(7) };
        let outcome = run.step(0, &[]);
        assert!(matches!(outcome.decision, Decision::Publish { .. }), "{outcome:?}");
        run
    }

    fn step(&mut self, at_ms: u64, down: &[&str]) -> Outcome {
        let outcome = decide(&self.config, &health(&self.config, down), self.previous.as_ref(), &self.state, at_ms, &mut self.rng);
        match &outcome.decision {
            Decision::Publish { endpoints, changed, provenance, reason } => {
                let before = self.previous.take();
                let g = before.as_ref().map_or(0, |p| p.generation.0) + 1;
                self.previous = Some(Plan {
                    generation: Generation(g),
                    parent_generation: Generation(g - 1),
                    created_at_unix_ms: at_ms,
                    author: Author::Planner { id: "p1".into() },
                    reason: reason.clone(),
                    dns_zone: self.config.dns_zone.clone(),
                    endpoints: endpoints.clone(),
                    retired: Default::default(),
                    rollback_of: None,
                    provenance: provenance.clone(),
                });
                let plan = self.previous.as_ref().unwrap();
                let found: BTreeSet<EndpointName> = match &before {
                    Some(p) => dnsplan_common::PlanChanges::between(p, plan).unwrap().changes.into_keys().collect(),
                    None => plan.endpoints.keys().cloned().collect(),
                };
                assert_eq!(changed, &found, "the changed endpoints the decision names");
                self.state = outcome.state.clone();
            }
            Decision::NoChange => self.state = outcome.state.clone(),
            Decision::Breaker { .. } => {}
        }
        outcome
    }

    fn weight(&self, e: usize, address: &str) -> Option<u32> {
        let plan = self.previous.as_ref()?;
        plan.endpoints.get(&name(e))?.targets.iter().find(|t| t.address == ip(address)).map(|t| t.weight)
    }
}

fn rules(deferred: &[Deferred]) -> Vec<&'static str> {
    deferred.iter().map(|d| d.rule.as_str()).collect()
}

/// The case: three of an endpoint's six targets fail at once (one per zone, so no
/// zone is impaired). The plan removes two (a third each, 33%) and keeps the third: the
/// per-plan limit (34%) is what holds it, listed with the numbers and reconsidered when
/// this plan's removal leaves the 300 s window. The next decision publishes nothing and
/// says the window holds it now, until the same time; then it goes.
#[test]
fn three_of_six_failing_at_once_defers_the_third_removal() {
    let mut run = Run::new(config(2, 2, ""));
    let down = ["10.0.0.1", "10.0.1.1", "10.0.2.1"];
    let t0 = 60 * S;
    let outcome = run.step(t0, &down);
    assert!(matches!(outcome.decision, Decision::Publish { .. }), "{outcome:?}");
    let kept: Vec<&str> = down.iter().copied().filter(|a| run.weight(0, a) == Some(1)).collect();
    assert_eq!(kept.len(), 1, "two removed, one kept: {:?}", run.previous);
    let [held] = outcome.deferred.as_slice() else { panic!("one deferral: {:?}", outcome.deferred) };
    assert_eq!(held.rule, DeferredRule::RemovalPerPlan);
    assert_eq!((&held.endpoint, held.target), (&name(0), Some(ip(kept[0]))));
    for number in ["this plan removes 33%", "removing it (17%) too would make 50%", "removal_fraction_per_plan (34%)"] {
        assert!(held.detail.starts_with("down, still served: ") && held.detail.contains(number), "{number:?} in {held:?}");
    }
    assert_eq!(held.reconsider_at_unix_ms, Some(t0 + 300 * S), "when this plan's removal leaves the window");
    assert_eq!(summarize(&outcome.deferred), Some(format!("1 deferred: removal_per_plan e0.example.test. {}", kept[0])));

    let outcome = run.step(t0 + S, &down);
    assert_eq!(outcome.decision, Decision::NoChange);
    let [held] = outcome.deferred.as_slice() else { panic!("one deferral: {:?}", outcome.deferred) };
    assert_eq!((held.rule, held.target), (DeferredRule::RemovalPerWindow, Some(ip(kept[0]))));
    for number in ["33% of the endpoint's weight was removed in the last 300 s", "removing it (25%) too would make 58%"] {
        assert!(held.detail.contains(number), "{number:?} in {held:?}");
    }
    assert_eq!(held.reconsider_at_unix_ms, Some(t0 + 300 * S));

    let outcome = run.step(t0 + 300 * S, &down);
    assert!(matches!(outcome.decision, Decision::Publish { .. }), "{outcome:?}");
    assert_eq!(run.weight(0, kept[0]), Some(0));
    assert_eq!(outcome.deferred, vec![]);
}

/// Removals spread out: the window holds the third, and it is reconsidered when the
/// oldest removal leaves the window (enough room then), not when the newest does.
#[test]
fn the_window_limit_is_reconsidered_when_its_oldest_removal_expires() {
    let mut run = Run::new(config(2, 2, "window_secs = 300"));
    run.step(10 * S, &["10.0.0.1"]);
    run.step(100 * S, &["10.0.0.1", "10.0.1.1"]);
    assert_eq!((run.weight(0, "10.0.0.1"), run.weight(0, "10.0.1.1")), (Some(0), Some(0)));
    let outcome = run.step(200 * S, &["10.0.0.1", "10.0.1.1", "10.0.2.1"]);
    assert_eq!(outcome.decision, Decision::NoChange);
    let [held] = outcome.deferred.as_slice() else { panic!("one deferral: {:?}", outcome.deferred) };
    assert_eq!((held.rule, held.target), (DeferredRule::RemovalPerWindow, Some(ip("10.0.2.1"))));
    // 1/6 at 10 s and 1/5 of what was left at 100 s: 37% used, 13% left, 25% asked.
    assert!(held.detail.contains("37% of the endpoint's weight was removed") && held.detail.contains("(25%)"), "{held:?}");
    assert_eq!(held.reconsider_at_unix_ms, Some(310 * S));
    let outcome = run.step(310 * S, &["10.0.0.1", "10.0.1.1", "10.0.2.1"]);
    assert!(matches!(outcome.decision, Decision::Publish { .. }), "{outcome:?}");
    assert_eq!(outcome.deferred, vec![]);
}

/// A target that is alone more than a plan may remove waits for its health, not a time.
#[test]
fn a_target_above_the_plan_limit_waits_for_health() {
    // Two targets, both in zone a: with zone_impaired_fraction 1.0 one failure does not
    // impair the zone, and 1 of 2 healthy is not below fail_open_below (50%).
    let mut text = String::from(
        "id = \"p1\"\ndns_zone = \"example.test.\"\n[store]\nurl = \"http://127.0.0.1:8053\"\n[policy]\nzone_impaired_fraction = 1.0\n",
    );
    text.push_str("[[endpoint]]\nname = \"e0.example.test.\"\nttl_secs = 30\ncheck = { kind = \"tcp\", port = 80 }\n");
    text.push_str("[[endpoint.target]]\naddress = \"10.0.0.1\"\nzone = \"a\"\n[[endpoint.target]]\naddress = \"10.0.0.2\"\nzone = \"a\"\n");
    let mut run = Run::new(PlannerConfig::parse(&text).expect("valid"));
    let outcome = run.step(10 * S, &["10.0.0.1"]);
    assert_eq!(outcome.decision, Decision::NoChange);
    let [held] = outcome.deferred.as_slice() else { panic!("one deferral: {:?}", outcome.deferred) };
    assert_eq!((held.rule, held.target), (DeferredRule::RemovalPerPlan, Some(ip("10.0.0.1"))));
    assert!(held.detail.contains("removing it would take 50% of the endpoint's weight, above removal_fraction_per_plan (34%)"), "{held:?}");
    assert!(held.detail.contains("until its health or the config changes"), "{held:?}");
    assert_eq!(held.reconsider_at_unix_ms, None);
}

/// Too few healthy targets: every dead one is served, and each is listed as fail_open
/// with how many are healthy and how many it takes.
#[test]
fn fail_open_lists_the_dead_targets_it_serves() {
    let mut run = Run::new(config(1, 2, "zone_impaired_fraction = 1.0"));
    let down = ["10.0.0.1", "10.0.1.1", "10.0.1.2", "10.0.2.1"];
    let outcome = run.step(10 * S, &down);
    assert_eq!(outcome.decision, Decision::NoChange, "fail open keeps serving everything");
    assert_eq!(rules(&outcome.deferred), vec!["fail_open"; 4]);
    let targets: Vec<IpAddr> = outcome.deferred.iter().filter_map(|d| d.target).collect();
    assert_eq!(targets, down.iter().map(|a| ip(a)).collect::<Vec<_>>());
    let detail = &outcome.deferred[0].detail;
    assert!(detail.contains("2 of 6 targets healthy, below fail_open_below (50%)") && detail.contains("until at least 3"), "{detail}");
    assert!(outcome.deferred.iter().all(|d| d.reconsider_at_unix_ms.is_none()));
}

/// An impaired zone the others cannot carry is held: its dead targets are listed under
/// capacity, with the capacity there is and the capacity needed.
#[test]
fn a_zone_held_for_capacity_lists_its_dead_targets() {
    let mut config = config(1, 2, "");
    config.endpoints[0].get_mut().demand = Some(5.0);
    let mut run = Run::new(config);
    let outcome = run.step(10 * S, &["10.0.0.1", "10.0.0.2"]);
    assert_eq!(rules(&outcome.deferred), vec!["capacity", "capacity"]);
    let held = &outcome.deferred[0];
    assert_eq!(held.target, Some(ip("10.0.0.1")));
    for number in
        ["zone a impaired (2 of 2 targets down, threshold 50%)", "has 4 of the 6 capacity needed", "capacity_headroom 1.2 x demand 5"]
    {
        assert!(held.detail.contains(number), "{number:?} in {held:?}");
    }
    assert_eq!(held.reconsider_at_unix_ms, None);
}

/// One zone at a time: while zone a is shifted, impaired zone b is held; once zone a looks
/// healthy, both the hold and zone a's return are reconsidered when its dwell ends.
#[test]
fn a_second_zone_waits_for_the_first_and_the_dwell_is_listed() {
    let mut run = Run::new(config(1, 2, "fail_open_below = 0.1\nzone_recovery_dwell_secs = 60"));
    run.step(10 * S, &["10.0.0.1", "10.0.0.2"]);
    assert_eq!(run.state.shifted.as_ref().map(|s| s.zone.as_str()), Some("a"));
    let outcome = run.step(20 * S, &["10.0.0.1", "10.0.0.2", "10.0.1.1", "10.0.1.2"]);
    assert_eq!(rules(&outcome.deferred), vec!["zone_one_at_a_time"; 2]);
    let held = &outcome.deferred[0];
    assert_eq!(held.target, Some(ip("10.0.1.1")));
    assert!(held.detail.contains("zone b impaired (2 of 2 targets down") && held.detail.contains("while zone a is"), "{held:?}");
    assert_eq!(held.reconsider_at_unix_ms, None, "zone a is not healthy yet");

    let outcome = run.step(30 * S, &["10.0.1.1", "10.0.1.2"]);
    assert_eq!(rules(&outcome.deferred), vec!["zone_recovery", "zone_recovery", "zone_one_at_a_time", "zone_one_at_a_time"]);
    assert_eq!(outcome.deferred[0].target, Some(ip("10.0.0.1")));
    assert!(outcome.deferred[0].detail.starts_with("up, not served: zone a was shifted away"), "{:?}", outcome.deferred[0]);
    assert!(outcome.deferred.iter().all(|d| d.reconsider_at_unix_ms == Some(90 * S)), "{:?}", outcome.deferred);
}

/// A tripped breaker lists every endpoint the stopped plan would have changed, and what
/// each change was; nothing is reconsidered until an operator resumes.
#[test]
fn the_breaker_lists_the_changes_it_stopped() {
    let mut run = Run::new(config(6, 2, ""));
    let outcome = run.step(10 * S, &["10.0.0.1", "10.1.1.1", "10.2.2.1", "10.3.0.1"]);
    assert!(matches!(outcome.decision, Decision::Breaker { .. }), "{outcome:?}");
    assert_eq!(rules(&outcome.deferred), vec!["breaker"; 4]);
    let endpoints: Vec<&EndpointName> = outcome.deferred.iter().map(|d| &d.endpoint).collect();
    assert_eq!(endpoints, vec![&name(0), &name(1), &name(2), &name(3)]);
    let first = &outcome.deferred[0];
    assert_eq!((first.target, first.reconsider_at_unix_ms), (None, None));
    assert!(first.detail.contains("would change: 10.0.0.1 (zone a) weight 1 -> 0: down"), "{first:?}");
    assert!(first.detail.contains("4 of 6 endpoints, above the breaker's 50% (and at least 3)"), "{first:?}");
    assert_eq!(summarize(&outcome.deferred), Some("4 deferred: breaker 4".into()));
}

/// The JSON name of every rule is its stable name (the status page and alerts use it).
#[test]
fn rules_serialise_as_their_stable_names() {
    for rule in DeferredRule::ALL {
        assert_eq!(serde_json::to_value(rule).expect("serialises"), serde_json::json!(rule.as_str()));
    }
}

/// Nothing held back, nothing listed.
#[test]
fn nothing_is_deferred_when_the_rules_let_everything_through() {
    let mut run = Run::new(config(2, 2, ""));
    let outcome = run.step(10 * S, &["10.0.0.1"]);
    assert!(matches!(outcome.decision, Decision::Publish { .. }));
    assert_eq!((outcome.deferred, summarize(&[])), (vec![], None));
}
