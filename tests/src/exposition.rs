//! Checks of a Prometheus text exposition that every daemon's metrics test makes.

/// Panics unless every `# HELP` and `# TYPE` line appears once: Prometheus refuses an
/// exposition that describes a family twice (a sub-registry per zone or per enactor did).
pub fn assert_each_family_described_once(text: &str) {
    let mut seen = std::collections::BTreeSet::new();
    for line in text.lines().filter(|l| l.starts_with("# HELP") || l.starts_with("# TYPE")) {
        assert!(seen.insert(line), "repeated: {line}\n{text}");
    }
}
