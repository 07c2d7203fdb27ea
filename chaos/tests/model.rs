//! The model check: the fenced protocol keeps every property over every interleaving of
//! three generations, two enactors with arbitrary delays and cleanup; the 2025 protocol does
//! not, and the checker finds the counterexample, printed as a trace.
//!
//! Removing either protection from the fenced model once made the first test fail: a write
//! that ignores the fence (`active plan never deleted` and `never backwards`), and cleanup by
//! age alone (`active plan never deleted`).

use dnsplan_chaos::{PlanModel, Variant, trace};
use stateright::{Checker, Model};

#[test]
fn the_fenced_protocol_holds_exhaustively() {
    let checker = PlanModel::new(Variant::Fenced).checker().spawn_bfs().join();
    assert!(checker.is_done(), "the state space must be explored completely");
    checker.assert_properties();
    assert!(checker.unique_state_count() > 50, "too few states explored: {}", checker.unique_state_count());
    assert!(checker.discovery("latest plan served").is_some(), "the latest plan must be reachable");
}

#[test]
fn the_2025_protocol_is_caught_with_a_readable_trace() {
    let checker = PlanModel::new(Variant::Naive).checker().spawn_bfs().join();
    for property in ["never empty", "active plan never deleted"] {
        let path = checker.discovery(property).unwrap_or_else(|| panic!("no counterexample for {property:?}"));
        let text = trace(path);
        println!("{property}:\n{text}");
        assert!(text.contains("reads plan") && text.contains("cleanup"), "{text}");
        if property == "never empty" {
            assert!(text.trim_end().ends_with("serving NOTHING"), "{text}");
        }
    }
    assert!(checker.discovery("never backwards").is_some(), "the old plan written over the new one");
}
