//! The monitoring files under `deploy/`: the Prometheus alert rules, their unit tests and the
//! Grafana dashboard.
//!
//! `promtool` (Debian package `prometheus`, which `.ci/run` installs) checks the rules and
//! the compose stack's Prometheus config, runs `alerts.test.yml`, and parses every dashboard
//! query (as recording rules). A missing `promtool` fails, it is never skipped.
//!
//! Every metric name the rules and the dashboard query must be one the daemons export: the
//! one-process stack (`dnsplan up`, in process, the authority's, the planner's and the
//! enactors' registries behind one `/metrics`, the same registrations the separate daemons
//! serve) runs until it has published and applied a plan, answered a DNS query and holds
//! the lease, and its `/metrics` is compared with the names queried. prometheus-client lists
//! no family without a series, not even its `# TYPE` line, so a label family the rules
//! query (refusals, abandoned plans) is created at 0 by its daemon; a name that exists only
//! after some event would not be seen here, and the test says which. Turning
//! `dnsplan_enactor_lag_generations` into `dnsplan_enactor_lag_generation` in alerts.yml
//! made `rules_and_dashboard_query_only_exported_metrics` fail, naming it, and so did the
//! enactor without its refusal series at 0 (`dnsplan_enactor_refusals_total`), each checked
//! once.

use dnsplan_cli::up::{Overrides, Stack};
use dnsplan_common::dns_probe::{self, RecordType};
use dnsplan_tests::ports::free_port;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use yaml_rust2::{Yaml, YamlLoader};

/// How long the stack may take to publish and apply its first plan.
const WITHIN: Duration = Duration::from_secs(30);
/// Between two looks at `/metrics` while waiting.
const POLL: Duration = Duration::from_millis(100);
/// Series Prometheus makes itself for every target; the rules may use them.
const PROMETHEUS_OWN: [&str; 1] = ["up"];
/// What Grafana puts in place of its interval variables when a query is checked.
const GRAFANA_VARIABLES: [(&str, &str); 3] = [("$__rate_interval", "5m"), ("$__interval", "1m"), ("$__range", "1h")];
const BUILT_IN: &str = include_str!("../../examples/dnsplan.toml");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn alerts_path() -> PathBuf {
    root().join("deploy/prometheus/alerts.yml")
}

fn dashboard_path() -> PathBuf {
    root().join("deploy/grafana/dnsplan.json")
}

/// Runs `promtool ARGS` and fails with its output unless it succeeds.
fn promtool(args: &[&str]) -> anyhow::Result<()> {
    let output = match Command::new("promtool").args(args).current_dir(root().join("deploy/prometheus")).output() {
        Ok(output) => output,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "promtool is not installed: install the Debian package `prometheus` (apt-get install prometheus; .ci/run does); \
             these checks are not skipped without it"
        ),
        Err(err) => return Err(err.into()),
    };
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    anyhow::ensure!(output.status.success(), "promtool {}: {}\n{text}", args.join(" "), output.status);
    Ok(())
}

fn load_yaml(path: &Path) -> anyhow::Result<Yaml> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(YamlLoader::load_from_str(&text)?.into_iter().next().unwrap_or(Yaml::Null))
}

/// Every alert of alerts.yml: name and expression.
fn alerts() -> anyhow::Result<Vec<(String, String)>> {
    let doc = load_yaml(&alerts_path())?;
    let mut out = Vec::new();
    for group in doc["groups"].as_vec().map(Vec::as_slice).unwrap_or_default() {
        for rule in group["rules"].as_vec().map(Vec::as_slice).unwrap_or_default() {
            let name = rule["alert"].as_str().ok_or_else(|| anyhow::anyhow!("a rule without `alert` (recording rules are not used)"))?;
            let expr = rule["expr"].as_str().ok_or_else(|| anyhow::anyhow!("{name}: no expr"))?;
            out.push((name.to_owned(), expr.to_owned()));
        }
    }
    anyhow::ensure!(!out.is_empty(), "alerts.yml holds no alert");
    Ok(out)
}

/// Every query of the dashboard, with its panel's title, Grafana's variables replaced.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let title = panel["title"].as_str().unwrap_or_default();
        for target in panel["targets"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let mut expr = target["expr"].as_str().unwrap_or_default().to_owned();
            for (variable, value) in GRAFANA_VARIABLES {
                expr = expr.replace(variable, value);
            }
            out.push((title.to_owned(), expr));
        }
    }
    out
}

/// The metric names a PromQL expression selects: identifiers outside strings, label
/// matchers and ranges that are not functions, aggregations, keywords or label lists.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Words followed by a parenthesised list of label names.
    const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    // Operators and aggregations: never metric names, even without a `(` right after them
    // (`sum by (le) (...)`).
    const RESERVED: [&str; 20] = [
        "and",
        "or",
        "unless",
        "offset",
        "bool",
        "atan2",
        "inf",
        "nan",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "group",
        "stddev",
        "stdvar",
        "quantile",
        "topk",
        "bottomk",
        "count_values",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let skip_quoted = |mut i: usize| {
        let quote = chars[i];
        i += 1;
        while i < chars.len() && chars[i] != quote {
            i += if chars[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    let skip_to = |mut i: usize, close: char| {
        while i < chars.len() && chars[i] != close {
            i = if matches!(chars[i], '"' | '\'' | '`') { skip_quoted(i) } else { i + 1 };
        }
        i + 1
    };
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            i = skip_quoted(i);
        } else if c == '{' {
            i = skip_to(i, '}');
        } else if c == '[' {
            i = skip_to(i, ']');
        } else if c.is_ascii_digit() || c == '$' {
            // Numbers and durations (`3600`, `1m`, `0.99`), Grafana variables.
            i += 1;
            while i < chars.len() && (is_word(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && is_word(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let call = chars.get(next) == Some(&'(');
            if LABEL_LISTS.contains(&word.as_str()) {
                if call {
                    i = skip_to(next, ')');
                }
            } else if !call && !RESERVED.contains(&word.as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn metric_names_reads_promql() {
    let expr = r#"histogram_quantile(0.99, sum by (le, enactor) (rate(dnsplan_a_bucket{job=~"x.*", reason!="by"}[$__rate_interval])))
        and on (planner) group_left(kind) dnsplan_b offset 1m > bool 3 or time() - dnsplan_c:rate5m unless sum without(x) (dnsplan_d)"#;
    let want: BTreeSet<String> = ["dnsplan_a_bucket", "dnsplan_b", "dnsplan_c:rate5m", "dnsplan_d"].iter().map(|s| s.to_string()).collect();
    assert_eq!(metric_names(expr), want);
    assert_eq!(metric_names(r#"up{job=~"dnsplan-.*"} == 0"#), BTreeSet::from(["up".to_owned()]));
}

/// The rules and the compose stack's Prometheus config are valid, every alert's unit tests
/// pass, and every alert has a test where it fires and one where it stays quiet.
#[test]
fn alert_rules_pass_promtool_and_their_tests() -> anyhow::Result<()> {
    promtool(&["check", "rules", "alerts.yml"])?;
    promtool(&["check", "config", "prometheus.yml"])?;
    promtool(&["test", "rules", "alerts.test.yml"])?;

    let tests = load_yaml(&root().join("deploy/prometheus/alerts.test.yml"))?;
    let (mut fires, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for test in tests["tests"].as_vec().map(Vec::as_slice).unwrap_or_default() {
        for case in test["alert_rule_test"].as_vec().map(Vec::as_slice).unwrap_or_default() {
            let name = case["alertname"].as_str().unwrap_or_default().to_owned();
            match case["exp_alerts"].as_vec() {
                Some(expected) if !expected.is_empty() => fires.insert(name),
                _ => quiet.insert(name),
            };
        }
    }
    for (name, _) in alerts()? {
        assert!(fires.contains(&name), "alerts.test.yml never expects {name} to fire");
        assert!(quiet.contains(&name), "alerts.test.yml never expects {name} to stay quiet");
    }
    Ok(())
}

/// The dashboard imports: one Prometheus data-source variable that every panel and query
/// uses, unique panel ids on a 24-column grid, and queries promtool parses.
#[test]
fn dashboard_is_importable_and_its_queries_parse() -> anyhow::Result<()> {
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(dashboard_path())?)?;
    assert_eq!(dashboard["uid"].as_str(), Some("dnsplan"));
    assert!(dashboard["id"].is_null(), "an exported dashboard has no id, so it imports as new");
    assert!(dashboard.get("__inputs").is_none(), "no import-time inputs: the data source is a variable, which provisioning also fills");
    let variables = dashboard["templating"]["list"].as_array().cloned().unwrap_or_default();
    assert!(
        variables.iter().any(|v| v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"),
        "no `datasource` variable over Prometheus data sources"
    );
    let source = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(ids.insert(panel["id"].as_u64().unwrap_or(0)), "{title}: panel id repeated or missing");
        let (x, w) = (panel["gridPos"]["x"].as_u64().unwrap_or(99), panel["gridPos"]["w"].as_u64().unwrap_or(99));
        assert!(x + w <= 24, "{title}: beyond the 24-column grid");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"], source, "{title}: data source");
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            assert_eq!(target["datasource"], source, "{title}: query data source");
            assert!(target["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "{title}: empty query");
        }
    }

    // promtool parses PromQL only in rule files: each query becomes a recording rule.
    let dir = tempfile::tempdir()?;
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, (_, expr)) in dashboard_queries(&dashboard).iter().enumerate() {
        rules.push_str(&format!("      - record: dashboard:query_{n}\n        expr: {}\n", serde_json::to_string(expr)?));
    }
    let path = dir.path().join("dashboard-queries.yml");
    std::fs::write(&path, rules)?;
    promtool(&["check", "rules", path.to_str().unwrap_or_default()])
}

/// The sample names of an exposition (`name{labels} value` and `name value` lines).
fn exported_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// Every metric the rules and the dashboard query is in a running stack's `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_dashboard_query_only_exported_metrics() -> anyhow::Result<()> {
    let mut queried: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, expr) in alerts()? {
        for metric in metric_names(&expr) {
            queried.entry(metric).or_default().insert(format!("alert {name}"));
        }
    }
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(dashboard_path())?)?;
    for (panel, expr) in dashboard_queries(&dashboard) {
        for metric in metric_names(&expr) {
            queried.entry(metric).or_default().insert(format!("panel {panel:?}"));
        }
    }

    // `dnsplan up` in this process, its demo backends on ports nobody else uses.
    let dir = tempfile::tempdir()?;
    let config = BUILT_IN.replace("18080", &free_port()?.to_string()).replace("15432", &free_port()?.to_string());
    let config_path = dir.path().join("dnsplan.toml");
    std::fs::write(&config_path, config)?;
    let loopback_any: SocketAddr = "127.0.0.1:0".parse()?;
    let overrides = Overrides {
        data_dir: Some(dir.path().join("data")),
        dns: Some(loopback_any),
        control: Some(loopback_any),
        accept_store_loss: false,
    };
    let stack = Stack::load(Some(&config_path), overrides)?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(stack.run(
        async move {
            let _ = stop_rx.await;
        },
        move |ready| {
            let _ = ready_tx.send((ready.dns, ready.control));
        },
    ));
    let (dns, control) = match ready_rx.await {
        Ok(bound) => bound,
        Err(_) => anyhow::bail!("the stack stopped before it was ready: {:?}", task.await?),
    };
    let zones = ["a", "b", "c"];
    let result = async {
        // A DNS query of our own, so the query counters have a series.
        dns_probe::query(dns, "api.example.test.", RecordType::A, Duration::from_secs(5)).await?;
        let url = format!("http://{control}/metrics");
        let started = Instant::now();
        // Until every enactor has applied a plan and a planner holds the lease.
        let text = loop {
            let text = reqwest::get(&url).await?.error_for_status()?.text().await?;
            let applied = zones.iter().all(|z| {
                let prefix = format!("dnsplan_enactor_plans_applied_total{{enactor=\"enactor-{z}\"}} ");
                text.lines().any(|l| l.strip_prefix(&prefix).is_some_and(|n| n != "0"))
            });
            if applied && text.lines().any(|l| l == "dnsplan_lease_held 1") && text.contains("dnsplan_dns_queries_total{") {
                break text;
            }
            anyhow::ensure!(started.elapsed() < WITHIN, "the stack did not apply a plan everywhere within {WITHIN:?}:\n{text}");
            tokio::time::sleep(POLL).await;
        };
        anyhow::Ok(text)
    }
    .await;
    let _ = stop_tx.send(());
    task.await??;
    let exported = exported_names(&result?);

    let missing: Vec<String> = queried
        .iter()
        .filter(|(name, _)| !exported.contains(*name) && !PROMETHEUS_OWN.contains(&name.as_str()))
        .map(|(name, users)| format!("{name} (in {})", users.iter().cloned().collect::<Vec<_>>().join(", ")))
        .collect();
    assert!(
        missing.is_empty(),
        "queried but not exported by the daemons (a typo, or a family with no series until an event):\n  {}\nexported: {exported:#?}",
        missing.join("\n  ")
    );
    assert!(queried.keys().any(|n| n.starts_with("dnsplan_")), "the rules and the dashboard query no dnsplan metric at all");
    Ok(())
}

/// `promtool check metrics` on `text` (stdin): fails with its output unless it passes.
fn promtool_check_metrics(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            anyhow::bail!("promtool is not installed: install the Debian package `prometheus`; this check is not skipped without it")
        }
        Err(err) => return Err(err.into()),
    };
    let mut stdin = child.stdin.take().ok_or_else(|| anyhow::anyhow!("no stdin"))?;
    let input = text.to_owned();
    // Written from a thread: promtool may answer before it has read everything.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output()?;
    let _ = writer.join();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    // promtool reads the Prometheus text format, where a counter's samples carry the family's
    // name; OpenMetrics (what `/metrics` serves) describes the family `x` and names its
    // samples `x_total`. So promtool finds `x_total` "without help" while `# HELP x` is
    // there: exit 3 (lint findings) with only such lines is a pass. A parse error (a second
    // HELP line, a malformed sample) is exit 1, and any other finding fails too.
    const LINT_FINDINGS: i32 = 3;
    let only_open_metrics_counters = output.status.code() == Some(LINT_FINDINGS)
        && said.lines().filter(|l| !l.trim().is_empty()).all(|line| {
            line.strip_suffix(" no help text")
                .and_then(|name| name.strip_suffix("_total"))
                .is_some_and(|family| text.lines().any(|l| l.starts_with(&format!("# HELP {family} "))))
        });
    anyhow::ensure!(
        output.status.success() || only_open_metrics_counters,
        "promtool check metrics: {}\n{said}\n--- the exposition:\n{text}",
        output.status
    );
    Ok(())
}

/// The one-process stack's `/metrics` (the authority's registry and the planner's and three
/// enactors' behind one endpoint) is exposition text Prometheus accepts: `promtool check
/// metrics` parses and lints it. With each enactor registering its families again (a
/// labelled sub-registry each), every `dnsplan_enactor_*` `# HELP` and `# TYPE` line came
/// three times and promtool said "second HELP line for metric name
/// dnsplan_enactor_apply_duration_seconds"; checked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_stack_metrics_pass_promtool() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = BUILT_IN.replace("18080", &free_port()?.to_string()).replace("15432", &free_port()?.to_string());
    let config_path = dir.path().join("dnsplan.toml");
    std::fs::write(&config_path, config)?;
    let loopback_any: SocketAddr = "127.0.0.1:0".parse()?;
    let overrides = Overrides {
        data_dir: Some(dir.path().join("data")),
        dns: Some(loopback_any),
        control: Some(loopback_any),
        accept_store_loss: false,
    };
    let stack = Stack::load(Some(&config_path), overrides)?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(stack.run(
        async move {
            let _ = stop_rx.await;
        },
        move |ready| {
            let _ = ready_tx.send((ready.dns, ready.control));
        },
    ));
    let (dns, control) = match ready_rx.await {
        Ok(bound) => bound,
        Err(_) => anyhow::bail!("the stack stopped before it was ready: {:?}", task.await?),
    };
    let result = async {
        // A DNS query, so the query families have series too.
        dns_probe::query(dns, "api.example.test.", RecordType::A, Duration::from_secs(5)).await?;
        let url = format!("http://{control}/metrics");
        let started = Instant::now();
        // Until every enactor has applied a plan: then every family has its series.
        loop {
            let text = reqwest::get(&url).await?.error_for_status()?.text().await?;
            let applied = ["a", "b", "c"].iter().all(|z| {
                let prefix = format!("dnsplan_enactor_plans_applied_total{{enactor=\"enactor-{z}\"}} ");
                text.lines().any(|l| l.strip_prefix(&prefix).is_some_and(|n| n != "0"))
            });
            if applied {
                break anyhow::Ok(text);
            }
            anyhow::ensure!(started.elapsed() < WITHIN, "the stack did not apply a plan everywhere within {WITHIN:?}:\n{text}");
            tokio::time::sleep(POLL).await;
        }
    }
    .await;
    let _ = stop_tx.send(());
    task.await??;
    promtool_check_metrics(&result?)
}
