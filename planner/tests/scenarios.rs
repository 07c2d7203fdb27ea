//! The pure core, as scenarios: observations over time in, decisions out, compared as text.
//! Each step sets some targets' health at a time, decides, and (as the planner would) makes a
//! published plan the previous one and keeps the state of every decision carried out. What
//! the rules held back in each decision follows it as `~ held by RULE` lines.

use dnsplan_common::{Author, EndpointName, Generation, Plan, PlanChanges};
use dnsplan_planner::config::PlannerConfig;
use dnsplan_planner::decide::{Decision, Health, HealthView, PlannerState, decide};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::collections::BTreeSet;
use std::fmt::Write;

/// `endpoints` endpoints named e0.., each with `per_zone` targets in zones a, b, c. Target
/// addresses are 10.<endpoint>.<zone index>.<n>.
fn config(endpoints: usize, per_zone: usize, policy: &str) -> PlannerConfig {
    let mut text = format!("id = \"p1\"\ndns_zone = \"example.test.\"\n[store]\nurl = \"http://127.0.0.1:8053\"\n[policy]\n{policy}\n");
    for e in 0..endpoints {
        write!(text, "[[endpoint]]\nname = \"e{e}.example.test.\"\nttl_secs = 30\ncheck = {{ kind = \"tcp\", port = 80 }}\n").unwrap();
        for (zi, zone) in ["a", "b", "c"].iter().enumerate() {
            for n in 1..=per_zone {
                write!(text, "[[endpoint.target]]\naddress = \"10.{e}.{zi}.{n}\"\nzone = \"{zone}\"\n").unwrap();
            }
        }
    }
    PlannerConfig::parse(&text).expect("scenario config is valid")
}

/// One observation: at `t` seconds, these `(endpoint index, zone index, n)` targets are
/// down and every other target is up.
struct Step {
    t: u64,
    down: Vec<(usize, usize, usize)>,
}

fn run(config: &PlannerConfig, steps: &[Step]) -> String {
    let mut rng = SmallRng::seed_from_u64(7);
    let mut previous: Option<Plan> = None;
    let mut state = PlannerState::default();
    let mut out = String::new();
    for step in steps {
        let mut health = HealthView::new();
        for ep in config.endpoints() {
            for t in &ep.targets {
                health.insert((ep.name.clone(), t.address), Health::Up);
            }
        }
        for (e, z, n) in &step.down {
            let name = dnsplan_common::DnsName::parse(&format!("e{e}.example.test.")).unwrap();
            health.insert((name, format!("10.{e}.{z}.{n}").parse().unwrap()), Health::Down);
        }
        let outcome = decide(config, &health, previous.as_ref(), &state, step.t * 1_000, &mut rng);
        writeln!(out, "t={}s {}", step.t, outcome.decision.describe()).unwrap();
        for d in &outcome.deferred {
            let target = d.target.map(|t| format!(" {t}")).unwrap_or_default();
            let when = d.reconsider_at_unix_ms.map(|at| format!(" (reconsidered at t={}s)", at / 1_000)).unwrap_or_default();
            writeln!(out, "  ~ held by {} {}{target}: {}{when}", d.rule, d.endpoint, d.detail).unwrap();
        }
        match outcome.decision {
            Decision::Publish { endpoints, changed, provenance, reason } => {
                let g = previous.as_ref().map(|p| p.generation.0).unwrap_or(0) + 1;
                let plan = Plan {
                    generation: Generation(g),
                    parent_generation: Generation(g - 1),
                    created_at_unix_ms: step.t * 1_000,
                    author: Author::Planner { id: "p1".into() },
                    reason,
                    dns_zone: config.dns_zone.clone(),
                    endpoints,
                    retired: Default::default(),
                    rollback_of: None,
                    provenance,
                };
                // What the decision says it changed is what changed: the publish sends only those.
                let found: BTreeSet<EndpointName> = match &previous {
                    Some(p) => PlanChanges::between(p, &plan).expect("a small change").changes.into_keys().collect(),
                    None => plan.endpoints.keys().cloned().collect(),
                };
                assert_eq!(changed, found, "t={}s: the changed endpoints the decision names", step.t);
                previous = Some(plan);
                state = outcome.state;
            }
            Decision::NoChange => state = outcome.state,
            Decision::Breaker { .. } => {}
        }
    }
    out
}

fn all_up(t: u64) -> Step {
    Step { t, down: vec![] }
}

/// Compares with `tests/snapshots/<name>.txt`. With `DNSPLAN_BLESS=1` the snapshot is
/// written instead; a reviewed snapshot is then committed with the change that moved it.
fn assert_snapshot(name: &str, got: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots").join(format!("{name}.txt"));
    if std::env::var_os("DNSPLAN_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("snapshot dir");
        std::fs::write(&path, got).expect("snapshot written");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (run with DNSPLAN_BLESS=1 to create it)", path.display()));
    assert_eq!(got, want, "\n--- got ---\n{got}\n--- want ({}) ---\n{want}", path.display());
}

#[test]
fn gray_zone_shifts_once_and_does_not_flap() {
    let config = config(2, 2, "zone_recovery_dwell_secs = 60");
    // Half of zone a flaps: its first target in each endpoint goes down and up every 10 s.
    let flap = |t| Step { t, down: vec![(0, 0, 1), (1, 0, 1)] };
    let steps = [all_up(0), flap(10), all_up(20), flap(30), all_up(40), all_up(50), all_up(60), all_up(70), all_up(100), all_up(110)];
    let got = run(&config, &steps);
    assert_snapshot("gray_zone", &got);
}

#[test]
fn every_target_down_fails_open() {
    let config = config(1, 2, "");
    let all: Vec<_> = (0..3).flat_map(|z| (1..=2).map(move |n| (0, z, n))).collect();
    let steps = [all_up(0), Step { t: 10, down: all.clone() }, Step { t: 20, down: all[..4].to_vec() }, all_up(30)];
    let got = run(&config, &steps);
    assert_snapshot("fail_open", &got);
}

#[test]
fn a_slow_drain_respects_the_velocity_window() {
    let config = config(1, 4, "zone_impaired_fraction = 0.75\nwindow_secs = 60");
    let first = vec![(0, 0, 1), (0, 1, 1), (0, 2, 1)];
    let more: Vec<_> = first.iter().copied().chain([(0, 0, 2), (0, 1, 2), (0, 2, 2)]).collect();
    let steps = [
        all_up(0),
        Step { t: 10, down: first },
        Step { t: 20, down: more.clone() },
        Step { t: 30, down: more.clone() },
        Step { t: 85, down: more },
    ];
    let got = run(&config, &steps);
    assert_snapshot("slow_drain", &got);
}

#[test]
fn a_mass_change_trips_the_breaker() {
    let config = config(6, 2, "");
    let steps = [
        all_up(0),
        Step { t: 10, down: vec![(0, 0, 1), (1, 1, 1), (2, 2, 1), (3, 0, 1)] },
        Step { t: 20, down: vec![(0, 0, 1), (1, 1, 1)] },
    ];
    let got = run(&config, &steps);
    assert_snapshot("breaker", &got);
}

#[test]
fn an_impaired_zone_without_spare_capacity_is_held() {
    // Demand 5 of 6 capacity: the other zones (4) cannot carry it, so zone a stays.
    let mut config = config(1, 2, "");
    config.endpoints[0].get_mut().demand = Some(5.0);
    let steps = [all_up(0), Step { t: 10, down: vec![(0, 0, 1)] }, Step { t: 20, down: vec![(0, 0, 1), (0, 0, 2)] }];
    let got = run(&config, &steps);
    assert_snapshot("zone_held", &got);
}
