//! The daemons are built without the enactor's feature `testing`, so a shipped enactor cannot
//! be switched into the naive 2025 mode: `Behaviour::Naive` and the code behind it exist only
//! with that feature.
//!
//! Cargo unifies a package's features over every package one build selects, so a crate that
//! asked for the feature as a normal dependency (the chaos harness did) would put it into the
//! daemons of any build that selects that crate too, such as a plain `cargo build --release` at
//! the root. This asks cargo how it resolves `dnsplan-enactor`'s features for the builds that
//! make the binaries: the root's plain build, the same with `--workspace`, and the Dockerfile's.
//! It also asks for a test build of the workspace, where the chaos harness's dev-dependency
//! turns the feature on, so that the check is seen to find the feature where it is.
//!
//! With the chaos harness depending on the enactor with `testing` as a normal dependency
//! again, `production_builds_leave_the_naive_enactor_out` failed: "a plain `cargo build
//! --release` at the root builds dnsplan-enactor with feature `testing` (the naive 2025
//! enactor): [\"testing\"]".

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The features cargo enables on `dnsplan-enactor` in a build with these selection flags;
/// `with_dev` resolves as a test build does (dev-dependencies included).
fn enactor_features(selection: &[String], with_dev: bool) -> Vec<String> {
    let edges = if with_dev { "normal,build,dev" } else { "normal,build" };
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--locked", "--edges", edges, "--invert", "dnsplan-enactor", "--depth", "0", "--format", "{p} features=[{f}]"])
        .args(selection)
        .current_dir(root())
        .output()
        .expect("cargo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "cargo tree {selection:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find(|l| l.starts_with("dnsplan-enactor ")).unwrap_or_else(|| panic!("no dnsplan-enactor in: {stdout}"));
    let (_, features) = line.split_once("features=[").unwrap_or_else(|| panic!("no features in: {line}"));
    features.trim_end_matches(']').split(',').filter(|f| !f.is_empty()).map(String::from).collect()
}

/// The Dockerfile's `cargo build` flags that choose packages and features (the others, such
/// as `--release`, do not change which features a package gets).
fn dockerfile_selection() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).expect("the Dockerfile is readable");
    let text = text.replace("\\\n", " ");
    let command = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("RUN cargo build"))
        .expect("the Dockerfile builds the binaries with `RUN cargo build`");
    let command = command.split("&&").next().unwrap_or_default();
    let mut words = command.split_whitespace();
    let mut selection = Vec::new();
    while let Some(word) = words.next() {
        match word {
            "-p" | "--package" | "--exclude" | "-F" | "--features" => {
                selection.push(word.to_string());
                selection.extend(words.next().map(String::from));
            }
            "--workspace" | "--all" | "--all-features" | "--no-default-features" => selection.push(word.to_string()),
            _ if word.starts_with("--features=") || word.starts_with("--package=") => selection.push(word.to_string()),
            _ => {}
        }
    }
    assert!(selection.iter().any(|w| w == "dnsplan-enactor"), "the Dockerfile no longer builds dnsplan-enactor: {command}");
    selection
}

#[test]
fn production_builds_leave_the_naive_enactor_out() {
    let builds = [
        ("a plain `cargo build --release` at the root", Vec::new()),
        ("`cargo build --release --workspace`", vec!["--workspace".to_string()]),
        ("the Dockerfile's build", dockerfile_selection()),
    ];
    for (build, selection) in builds {
        let features = enactor_features(&selection, false);
        assert!(
            !features.iter().any(|f| f == "testing"),
            "{build} builds dnsplan-enactor with feature `testing` (the naive 2025 enactor): {features:?}"
        );
    }
}

#[test]
fn the_check_finds_the_feature_in_a_test_build() {
    let features = enactor_features(&["--workspace".to_string()], true);
    assert!(
        features.iter().any(|f| f == "testing"),
        "a test build of the workspace has the naive enactor for the race tests: {features:?}"
    );
}
