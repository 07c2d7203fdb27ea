//! dnsplan's chaos harness and model check.
//!
//! `model` is a stateright model of the plan protocol, checked exhaustively in its fenced form
//! and shown to fail in its 2025 form. `race` is the deterministic `aws-2025-race` scenario on
//! the real authority. `harness` runs real authority and enactor processes under faults; `etcd`
//! runs them on a real etcd cluster under faults of etcd itself.
//! The `dnsplan-chaos` binary runs the named scenarios.

pub mod etcd;
pub mod harness;
pub mod model;
pub mod proxy;
pub mod race;

pub use model::{Action, PlanModel, State, Variant};

/// A counterexample as numbered steps a person can follow.
pub fn trace(path: stateright::Path<State, Action>) -> String {
    let steps: Vec<(State, Option<Action>)> = path.into();
    let mut out = String::new();
    let name = |i: usize| char::from(b'A' + (i % 26) as u8);
    for (n, (state, _)) in steps.iter().enumerate().skip(1) {
        let what = match steps[n - 1].1 {
            Some(Action::Publish) => format!("planner publishes plan {}", state.latest),
            Some(Action::Read(i)) => match state.enactors[i] {
                model::Enactor::Holding(g) => format!("enactor {} reads plan {g} (and is then delayed)", name(i)),
                model::Enactor::Idle => format!("enactor {} reads nothing", name(i)),
            },
            Some(Action::Write(i)) => format!("enactor {} writes its plan: the endpoint is at generation {}", name(i), state.active),
            Some(Action::Cleanup) => {
                format!("cleanup: oldest stored plan is now {}", (1..=state.latest).find(|g| state.stored & (1 << g) != 0).unwrap_or(0))
            }
            None => String::new(),
        };
        let served = if state.served == 0 { "NOTHING".to_owned() } else { format!("plan {}", state.served) };
        out.push_str(&format!("{n}. {what}; serving {served}\n"));
    }
    out
}
