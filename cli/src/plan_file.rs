//! Plans as files: `dnsplan plans show N --output toml` prints a plan, an operator edits it,
//! and `dnsplan plans publish FILE` shows what publishing it would do and publishes it only
//! with `--yes`.
//!
//! The file's endpoints and retirements are the new plan's content; everything else in it
//! (generation, author, reason, provenance, as printed) is stamped again at publish: the new
//! plan is `latest + 1` by the operator, with the reason given on the command line. The
//! preview compares with the latest plan, whatever plan the file was made from, so an edit of
//! an older plan shows everything it would undo. An endpoint of the latest plan that the file
//! leaves out is kept as the latest plan serves it (a name is only removed by retiring it,
//! as with `dnsplan endpoints retire`), and a name the planner manages cannot be retired from
//! a file either: its next plan would serve it again.
//!
//! The guards the preview reports: the plan's validation (an endpoint that would be empty, a
//! name outside the zone...: refused, never published); a retirement of a planner-managed
//! name (refused); each endpoint's removed weight, against the enactors' default limit (an
//! operator's plan is not limited by it, so it is a warning); and how many endpoints change,
//! against the planner's default breaker fraction (a warning too).

use crate::workflow;
use dnsplan_common::signing::{SigningKey, sign_with};
use dnsplan_common::store::lease::now_unix_ms;
use dnsplan_common::store::{next_generation, publish_against};
use dnsplan_common::{
    Author, DnsName, Endpoint, EndpointName, Generation, PauseState, Plan, Provenance, Store, StoreError, ValidatedPlan,
    removed_weight_fraction,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The provenance rule of an endpoint set from a file.
pub const FILE_RULE: &str = "operator-file";

/// A plan file: the shape `dnsplan plans show --output toml` prints. Only `endpoints` is
/// required; unknown keys are refused, so a misspelt key is an error and not a silent no-op.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanFile {
    /// The plan the file was printed from; only reported (the preview compares with the latest).
    #[serde(default)]
    pub generation: Option<Generation>,
    #[serde(default)]
    pub parent_generation: Option<Generation>,
    #[serde(default)]
    pub created_at_unix_ms: Option<u64>,
    #[serde(default)]
    pub author: Option<Author>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub rollback_of: Option<Generation>,
    #[serde(default)]
    pub provenance: Option<Vec<Provenance>>,
    /// Must be the stack's zone when given.
    #[serde(default)]
    pub dns_zone: Option<DnsName>,
    pub endpoints: BTreeMap<EndpointName, Endpoint>,
    #[serde(default)]
    pub retired: BTreeSet<EndpointName>,
}

impl PlanFile {
    /// Parses a file's text; the error names the line and the key.
    pub fn parse(text: &str) -> Result<PlanFile, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }
}

/// A plan as TOML, the shape `PlanFile` reads.
pub fn to_toml(plan: &Plan) -> Result<String, String> {
    toml::to_string(plan).map_err(|e| format!("cannot write plan {} as TOML: {e}", plan.generation))
}

/// What publishing a file would do.
#[derive(Debug, Serialize)]
pub struct Preview {
    /// The latest plan, which the new one would follow.
    pub latest: Generation,
    /// The new plan's generation.
    pub generation: Generation,
    /// The plan the file was printed from, when it says.
    pub based_on: Option<Generation>,
    /// `+`/`-` lines from the latest plan to the new one.
    pub changes: Vec<String>,
    /// Endpoints of the latest plan the file leaves out: kept as served.
    pub kept: Vec<EndpointName>,
    /// Endpoints losing weight, the largest first.
    pub removals: Vec<Removal>,
    /// The enactors' default `max_removal_fraction` (operator plans are not limited by it).
    pub removal_limit: f64,
    pub endpoints_changed: usize,
    pub endpoints_total: usize,
    /// The planner's default `breaker_endpoint_fraction`.
    pub breaker_fraction: f64,
    /// Warnings: what an operator should look at twice.
    pub warnings: Vec<String>,
    /// Why it cannot be published, if it cannot.
    pub refused: Option<String>,
    /// Whether it was published (only with `--yes`).
    pub published: bool,
    #[serde(skip)]
    pub plan: Option<ValidatedPlan>,
    /// The latest plan, which the new one is sent against as its changes.
    #[serde(skip)]
    pub parent: Option<Plan>,
}

/// Weight an endpoint would lose.
#[derive(Debug, Serialize)]
pub struct Removal {
    pub endpoint: EndpointName,
    pub fraction: f64,
}

/// Builds the plan `file` describes on top of the store's latest plan and says what
/// publishing it would do. Nothing is written.
pub async fn preview<S: Store>(store: &S, file: PlanFile, reason: &str, by: &str) -> Result<Preview, StoreError> {
    let latest = store.latest().await?;
    // A zone without a plan yet (one just added to the store): the file's plan is its first,
    // compared with nothing.
    let current = if latest == Generation::NONE {
        let Some(dns_zone) = store.dns_zone().await?.or_else(|| file.dns_zone.clone()) else {
            return Err(StoreError::BadRequest("the store has no plan and no DNS zone yet: name it with dns_zone in the file".into()));
        };
        Plan {
            generation: Generation::NONE,
            parent_generation: Generation::NONE,
            created_at_unix_ms: 0,
            author: Author::Operator { name: by.to_owned() },
            reason: String::new(),
            dns_zone,
            endpoints: BTreeMap::new(),
            retired: BTreeSet::new(),
            rollback_of: None,
            provenance: Vec::new(),
        }
    } else {
        store.plan(latest).await?.into_plan()
    };
    let generation = next_generation(store, latest).await?;
    let removal_limit = dnsplan_enactor::config::ApplyConfig::default().max_removal_fraction;
    let breaker_fraction = dnsplan_planner::config::Policy::default().breaker_endpoint_fraction.0;
    let mut preview = Preview {
        latest,
        generation,
        based_on: file.generation,
        changes: Vec::new(),
        kept: Vec::new(),
        removals: Vec::new(),
        removal_limit,
        endpoints_changed: 0,
        endpoints_total: 0,
        breaker_fraction,
        warnings: Vec::new(),
        refused: None,
        published: false,
        plan: None,
        parent: None,
    };
    if let Some(zone) = &file.dns_zone
        && zone != &current.dns_zone
    {
        preview.refused = Some(format!("the file is for DNS zone {zone}; this stack serves {}", current.dns_zone));
        return Ok(preview);
    }
    if let Some(based_on) = file.generation
        && based_on != latest
    {
        preview.warnings.push(format!(
            "the file was made from plan {based_on}; the latest is {latest}: the changes below are against plan {latest} and undo what came since"
        ));
    }
    let managed: BTreeSet<EndpointName> = {
        let unmanaged = workflow::unmanaged(store, &current).await?;
        current.endpoints.keys().filter(|n| !unmanaged.contains(*n)).cloned().collect()
    };
    if let Some(name) = file.retired.iter().find(|n| managed.contains(*n)) {
        preview.refused = Some(format!(
            "the planner manages {name}: a retirement would last only until its next plan; remove it from the planner's config first"
        ));
        return Ok(preview);
    }
    if let Some(name) = file.retired.iter().find(|n| file.endpoints.contains_key(*n)) {
        preview.refused = Some(format!("{name} is both served and retired in the file"));
        return Ok(preview);
    }
    let by_operator = format!("set from a file by {by}");
    let mut provenance: Vec<Provenance> =
        file.endpoints.keys().map(|n| Provenance { endpoint: n.clone(), rule: FILE_RULE.into(), detail: by_operator.clone() }).collect();
    provenance.extend(file.retired.iter().map(|n| Provenance {
        endpoint: n.clone(),
        rule: FILE_RULE.into(),
        detail: format!("retired by {by}: {reason}"),
    }));
    let mut endpoints = file.endpoints;
    for (name, records) in &current.endpoints {
        if !endpoints.contains_key(name) && !file.retired.contains(name) {
            preview.kept.push(name.clone());
            endpoints.insert(name.clone(), records.clone());
            provenance.push(Provenance {
                endpoint: name.clone(),
                rule: FILE_RULE.into(),
                detail: format!("not in the file: kept as plan {latest} serves it"),
            });
        }
    }
    let plan = Plan {
        generation,
        parent_generation: latest,
        created_at_unix_ms: now_unix_ms(),
        author: Author::Operator { name: by.to_owned() },
        reason: reason.to_owned(),
        dns_zone: current.dns_zone.clone(),
        endpoints,
        retired: file.retired,
        rollback_of: None,
        provenance,
    };
    preview.changes = diff(&current, &plan).into_iter().map(|(sign, text)| format!("{sign} {text}")).collect();
    preview.endpoints_total = plan.endpoints.len() + plan.retired.len();
    preview.endpoints_changed = plan.endpoints.iter().filter(|(n, e)| current.endpoints.get(*n) != Some(*e)).count()
        + plan.retired.iter().filter(|n| !current.retired.contains(*n)).count();
    for (name, next) in &plan.endpoints {
        if let Some(active) = current.endpoints.get(name) {
            let fraction = removed_weight_fraction(active, next);
            if fraction > 0.0 {
                preview.removals.push(Removal { endpoint: name.clone(), fraction });
            }
        }
    }
    preview.removals.sort_by(|a, b| b.fraction.total_cmp(&a.fraction).then_with(|| a.endpoint.cmp(&b.endpoint)));
    let over: Vec<&Removal> = preview.removals.iter().filter(|r| r.fraction > removal_limit).collect();
    if let Some(worst) = over.first() {
        preview.warnings.push(format!(
            "{} endpoint(s) lose more than {:.0}% of their weight (the enactors' default limit, which does not apply to an operator's plan), most of all {} ({:.0}%)",
            over.len(),
            removal_limit * 100.0,
            worst.endpoint,
            worst.fraction * 100.0
        ));
    }
    if preview.endpoints_total > 0 && preview.endpoints_changed as f64 > breaker_fraction * preview.endpoints_total as f64 {
        preview.warnings.push(format!(
            "it changes {} of {} endpoints: the planner's breaker would stop a plan of its own changing more than {:.0}%",
            preview.endpoints_changed,
            preview.endpoints_total,
            breaker_fraction * 100.0
        ));
    }
    if preview.changes.is_empty() {
        preview.refused = Some(format!("the file changes nothing in plan {latest}"));
        return Ok(preview);
    }
    match ValidatedPlan::new(plan) {
        Ok(plan) => preview.plan = Some(plan),
        Err(err) => preview.refused = Some(format!("the plan is invalid: {err}")),
    }
    preview.parent = (latest != Generation::NONE).then_some(current);
    Ok(preview)
}

/// Publishes the previewed plan: pauses automation first unless `keep_automation` (as a
/// rollback does, so the planner does not undo it), then publishes with the latest plan the
/// preview compared with as parent. A plan published in between is a conflict: the preview
/// is stale, so nothing is retried.
pub async fn publish<S: Store>(
    store: &S,
    preview: &mut Preview,
    by: &str,
    keep_automation: bool,
    key: Option<&SigningKey>,
) -> Result<(), StoreError> {
    let Some(plan) = preview.plan.take().map(|plan| sign_with(key, plan)) else { return Ok(()) };
    let plan = &*preview.plan.insert(plan);
    if !keep_automation {
        let reason = format!("plan {} published from a file: {}", plan.generation(), plan.plan().reason);
        store.pause(PauseState::by_operator(reason, by, now_unix_ms())).await?;
    }
    publish_against(store, preview.parent.as_ref(), plan, None).await?;
    preview.published = true;
    Ok(())
}

/// An endpoint's targets, as every command prints them.
pub use dnsplan_common::target_list as addresses;

/// `(sign, text)` lines from plan `a` to plan `b`.
pub use dnsplan_common::diff_lines as diff;

#[cfg(test)]
mod tests {
    use super::*;
    use dnsplan_common::{SledStore, Target, ZoneId};

    fn name(label: &str) -> EndpointName {
        DnsName::parse(&format!("{label}.example.test.")).expect("name")
    }

    fn endpoint(targets: &[(u8, u32)]) -> Endpoint {
        Endpoint {
            ttl_secs: 30,
            targets: targets
                .iter()
                .map(|(last, weight)| Target {
                    address: [192, 0, 2, *last].into(),
                    zone: ZoneId::parse("a").expect("zone"),
                    weight: *weight,
                })
                .collect(),
        }
    }

    /// Plan 1, the planner's: api (.1 and .2) and db (.9), both managed by the planner.
    async fn store_with_plan(dir: &std::path::Path) -> SledStore {
        let store = SledStore::open(dir.join("store")).expect("store");
        let plan = ValidatedPlan::new(Plan {
            generation: Generation(1),
            parent_generation: Generation::NONE,
            created_at_unix_ms: 0,
            author: Author::Planner { id: "planner-a".into() },
            reason: "start".into(),
            dns_zone: DnsName::parse("example.test.").expect("zone"),
            endpoints: [(name("api"), endpoint(&[(1, 1), (2, 1)])), (name("db"), endpoint(&[(9, 1)]))].into(),
            retired: BTreeSet::new(),
            rollback_of: None,
            provenance: Vec::new(),
        })
        .expect("valid");
        store.publish(&plan).await.expect("publish");
        store
    }

    const FILE: &str = r#"
generation = 1
[endpoints."api.example.test."]
ttl_secs = 30
targets = [{ address = "192.0.2.1", zone = "a", weight = 1 }]
"#;

    /// What `plans show --output toml` prints reads back as the same content.
    #[tokio::test]
    async fn a_printed_plan_reads_back() {
        let dir = tempfile::tempdir().expect("dir");
        let store = store_with_plan(dir.path()).await;
        let plan = store.plan(Generation(1)).await.expect("plan").into_plan();
        let text = to_toml(&plan).expect("toml");
        let file = PlanFile::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!((file.generation, &file.endpoints, &file.retired), (Some(Generation(1)), &plan.endpoints, &plan.retired));
        assert_eq!(file.author, Some(plan.author));
    }

    /// The file drops api's .2: the preview shows that line, 50% of api's weight removed
    /// (over the enactors' default limit: a warning), db kept as served, nothing written.
    #[tokio::test]
    async fn the_preview_says_what_would_change_and_writes_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let store = store_with_plan(dir.path()).await;
        let preview = preview(&store, PlanFile::parse(FILE).expect("file"), "drain .2", "alice").await.expect("preview");
        assert_eq!(preview.refused, None);
        assert_eq!((preview.latest, preview.generation), (Generation(1), Generation(2)));
        assert_eq!(preview.changes, ["- api.example.test. 192.0.2.2 zone a weight 1"]);
        assert_eq!(preview.kept, [name("db")]);
        assert_eq!((preview.removals.len(), preview.removals[0].fraction), (1, 0.5));
        assert_eq!((preview.endpoints_changed, preview.endpoints_total), (1, 2));
        assert!(preview.warnings.is_empty(), "{:?}", preview.warnings);
        let plan = preview.plan.as_ref().expect("a plan").plan();
        assert_eq!(plan.endpoints[&name("db")], endpoint(&[(9, 1)]), "db kept as plan 1 serves it");
        assert_eq!(plan.author, Author::Operator { name: "alice".into() });
        assert_eq!(store.latest().await.expect("latest"), Generation(1), "a preview writes nothing");
    }

    /// What the guards refuse, each with its reason; and a file with a key it does not know.
    #[tokio::test]
    async fn refusals_name_their_reason() {
        let dir = tempfile::tempdir().expect("dir");
        let store = store_with_plan(dir.path()).await;
        let cases = [
            (FILE.replace("targets = [{ address = \"192.0.2.1\", zone = \"a\", weight = 1 }]", "targets = []"), "no targets"),
            (format!("retired = [\"db.example.test.\"]\n{FILE}"), "the planner manages db.example.test."),
            (format!("dns_zone = \"other.test.\"\n{FILE}"), "DNS zone other.test."),
            (
                FILE.replace(
                    "192.0.2.1\", zone = \"a\", weight = 1 }]",
                    "192.0.2.1\", zone = \"a\", weight = 1 }, { address = \"192.0.2.2\", zone = \"a\", weight = 1 }]",
                ),
                "changes nothing",
            ),
        ];
        for (text, want) in cases {
            let file = match PlanFile::parse(&text) {
                Ok(file) => file,
                Err(err) => panic!("{want}: {err}"),
            };
            let preview = preview(&store, file, "r", "alice").await.expect("preview");
            let why = preview.refused.unwrap_or_default();
            assert!(why.contains(want), "want {want:?}, got {why:?}");
            assert!(preview.plan.is_none());
        }
        let err = PlanFile::parse(&format!("{FILE}\nendpionts = 1\n")).expect_err("an unknown key");
        assert!(err.contains("endpionts"), "{err}");
    }

    /// Published with automation paused; a plan published between the preview and the
    /// publish is a conflict (the preview is stale), never silently overwritten.
    #[tokio::test]
    async fn publish_pauses_and_a_stale_preview_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let store = store_with_plan(dir.path()).await;
        let mut first = preview(&store, PlanFile::parse(FILE).expect("file"), "drain .2", "alice").await.expect("preview");
        let mut stale = preview(&store, PlanFile::parse(FILE).expect("file"), "drain .2", "bob").await.expect("preview");
        publish(&store, &mut first, "alice", false, None).await.expect("published");
        assert!(first.published);
        assert_eq!(store.latest().await.expect("latest"), Generation(2));
        assert_eq!(store.paused().await.expect("paused").map(|p| p.by), Some(Author::Operator { name: "alice".into() }));
        let err = publish(&store, &mut stale, "bob", true, None).await.expect_err("stale");
        assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
        assert!(!stale.published);
    }
}
