//! The status page, for a shared screen during an incident: `GET /ui` and one page per plan,
//! `GET /ui/plans/{g}` (its diff against its parent and its explanation); for each zone the
//! store manages beside its first one, the same under `/ui/managed/{zone}`, and on `/ui` a
//! panel of those zones (how many in each state, the ones in trouble, the first by name, each
//! a link), bounded whatever their number.
//!
//! Server-rendered HTML with its style inline and no script or external asset, so it works
//! without internet; it reloads itself every `REFRESH_SECS`; it fits a phone's width. It is
//! read-only (writes stay in the CLI) and, like `/v1/status`, unauthenticated and bounded:
//! the newest `PLANS_SHOWN` plans, the first `ENDPOINTS_SHOWN` endpoints, and it takes the same
//! permits as `/v1/status` (`control.status_reads_max`).
//!
//! What it shows comes from the store (plans, pause and breaker, active records, enactors'
//! heartbeats, the planner's lease), the serving snapshot (SOA serial), the secondaries the
//! authority notifies (the serial each serves, `notify`), and, where the planner runs
//! in the same process (`dnsplan up`), the planner's own status (`Extras::planner_status`):
//! its last decision, what it is holding back (`deferred`) and each target's health.

use crate::serving::Serving;
use dnsplan_common::status::Health;
use dnsplan_common::store::lease::now_unix_ms;
use dnsplan_common::{ActiveState, Generation, Plan, Store, StoreError, diff_lines, target_list};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

/// Seconds between the page's own reloads.
pub const REFRESH_SECS: u32 = 5;
/// Plans in the timeline, newest first.
pub const PLANS_SHOWN: usize = 20;
/// Endpoints listed; the page says how many more there are.
pub const ENDPOINTS_SHOWN: usize = 100;

/// Zones listed by name on `/ui`, beside those in trouble.
pub const ZONES_SHOWN: usize = 50;

/// Where a zone's pages are: `/ui` for the store's first zone, `/ui/managed/{zone}` for one
/// added beside it.
#[derive(Clone, Debug)]
pub struct Base(String);

impl Base {
    pub fn first() -> Base {
        Base("/ui".into())
    }

    pub fn managed(zone: &str) -> Base {
        Base(format!("/ui/managed/{}", escape(zone)))
    }
}

/// The zones the store manages beside its first one, for `/ui`'s panel.
pub struct ZonesPanel {
    /// How many in each state, and the ones in trouble (`metrics::AddedZonesSummary`).
    pub summary: crate::metrics::AddedZonesSummary,
    /// The first `ZONES_SHOWN` zones by name, with their state.
    pub first: Vec<(String, &'static str)>,
}

/// The planner's status, when it runs in this process.
pub type PlannerStatus = Arc<dyn Fn() -> Option<dnsplan_common::status::PlannerStatus> + Send + Sync>;

/// Text made safe for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn ago(now_ms: u64, then_ms: u64) -> String {
    let secs = now_ms.saturating_sub(then_ms) / 1_000;
    match secs {
        0..=119 => format!("{secs}s ago"),
        120..=7_199 => format!("{}m ago", secs / 60),
        _ => format!("{}h ago", secs / 3_600),
    }
}

fn until(now_ms: u64, then_ms: u64) -> String {
    let secs = then_ms.saturating_sub(now_ms).div_ceil(1_000);
    match secs {
        0 => "now".into(),
        1..=119 => format!("in {secs}s"),
        _ => format!("in {}m {}s", secs / 60, secs % 60),
    }
}

const STYLE: &str = "body{font:15px/1.4 system-ui,sans-serif;margin:0;padding:12px;background:#fafafa;color:#111}\
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:20px 0 6px}\
.banner{padding:10px 12px;border-radius:6px;margin-bottom:8px;font-weight:600}\
.ok{background:#e3f4e6}.warn{background:#fff0c2}.bad{background:#fbd9d7}\
table{border-collapse:collapse;width:100%;background:#fff}td,th{border-bottom:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top}\
th{background:#f0f0f0}.wrap{overflow-x:auto}.muted{color:#666}.down{color:#b00020;font-weight:600}.up{color:#1b5e20}\
.plus{color:#1b5e20}.minus{color:#b00020}code{font-size:14px}a{color:#0645ad}";

/// A whole page; `refresh` makes it reload itself (a plan's page never changes).
fn page(title: &str, body: &str, refresh: bool) -> String {
    let refresh = if refresh { format!("<meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">") } else { String::new() };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         {refresh}<title>{title}</title><style>{STYLE}</style></head>\
         <body>{body}</body></html>",
        title = escape(title),
    )
}

fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    out.push_str("<div class=\"wrap\"><table><tr>");
    for h in header {
        let _ = write!(out, "<th>{}</th>", escape(h));
    }
    out.push_str("</tr>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            // Cells arrive escaped (some carry links or classes).
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</table></div>");
}

/// The planner's targets: (endpoint, address) → health.
fn health_of(planner: Option<&dnsplan_common::status::PlannerStatus>) -> BTreeMap<(String, String), String> {
    let mut health = BTreeMap::new();
    for t in planner.into_iter().flat_map(|p| &p.targets) {
        let h = match t.health {
            Health::Up => "up",
            Health::Down => "down",
            Health::Unknown => "unknown",
        };
        health.insert((t.endpoint.to_string(), t.address.to_string()), h.to_owned());
    }
    health
}

/// `/ui`.
pub async fn index<S: Store>(
    store: &S,
    serving: &Serving,
    planner: Option<&PlannerStatus>,
    base: &Base,
    zones: Option<&ZonesPanel>,
) -> Result<String, StoreError> {
    let Base(base) = base;
    let now = now_unix_ms();
    let latest = store.latest().await?;
    let paused = store.paused().await?;
    let lease = store.lease().await?;
    let heartbeats = store.heartbeats().await?;
    let from = Generation(latest.0.saturating_sub(PLANS_SHOWN as u64 - 1).max(1));
    let mut plans = if latest.is_none() { Vec::new() } else { store.list(from, PLANS_SHOWN).await? };
    plans.reverse();
    let page_of = store.active_page(None, ENDPOINTS_SHOWN).await?;
    let snapshot = serving.snapshot.load();
    let planner = planner.and_then(|p| p());

    let mut body = String::new();
    if base != "/ui" {
        body.push_str("<p><a href=\"/ui\">← the store's first zone</a></p>");
    }
    let _ = write!(body, "<h1>dnsplan: {}</h1>", escape(&serving.zone.origin.to_string()));
    let _ = write!(
        body,
        "<div class=\"banner ok\">latest plan <a href=\"{base}/plans/{latest}\">{latest}</a> · SOA serial {} · {} managed endpoints</div>",
        snapshot.serial,
        snapshot.managed_count()
    );
    match &paused {
        Some(p) => {
            // A pause by the planner is its breaker.
            let (class, what, after) = if p.is_breaker() {
                ("bad", "BREAKER TRIPPED", " (an operator resumes with <code>dnsplan resume</code>)")
            } else {
                ("warn", "automation PAUSED", "")
            };
            // The breaker names its planner (`planner:ID`); an operator is named as they gave it.
            let by = if p.is_breaker() { p.by.to_string() } else { p.by.name().to_owned() };
            let (by, reason) = (escape(&by), escape(&p.reason));
            let _ = write!(body, "<div class=\"banner {class}\">{what} by {by} {}: {reason}{after}</div>", ago(now, p.since_unix_ms));
        }
        None => body.push_str("<div class=\"banner ok\">automation running</div>"),
    }

    // The planner: lease (from the store) and, in this process, its last decision and what
    // it holds back.
    body.push_str("<h2>Planner</h2>");
    match &lease {
        Some(l) if l.expires_at_unix_ms > now => {
            let _ = write!(
                body,
                "<p>lease held by <b>{}</b> (epoch {}), expires {}</p>",
                escape(&l.holder),
                l.epoch,
                until(now, l.expires_at_unix_ms)
            );
        }
        Some(l) => {
            let _ = write!(
                body,
                "<p class=\"down\">no planner holds the lease (last: {}, expired {})</p>",
                escape(&l.holder),
                ago(now, l.expires_at_unix_ms)
            );
        }
        None => body.push_str("<p class=\"down\">no planner has held the lease</p>"),
    }
    if let Some(p) = &planner {
        if !p.last_decision.is_empty() {
            let _ = write!(body, "<p>last decision: {}</p>", escape(&p.last_decision));
        }
        if let Some(zone) = &p.zone_shifted {
            let _ = write!(body, "<p class=\"down\">zone shifted away: {}</p>", escape(zone));
        }
        if !p.deferred.is_empty() {
            body.push_str("<h2>Held back</h2>");
            let rows: Vec<Vec<String>> = p
                .deferred
                .iter()
                .map(|d| {
                    let target = d.target.map(|t| t.to_string()).unwrap_or_default();
                    let when = d.reconsider_at_unix_ms.map(|t| until(now, t)).unwrap_or_else(|| "at the next change".into());
                    vec![escape(d.rule.as_str()), escape(d.endpoint.as_str()), escape(&target), escape(&d.detail), escape(&when)]
                })
                .collect();
            table(&mut body, &["RULE", "ENDPOINT", "TARGET", "WHY", "RECONSIDERED"], &rows);
        }
    }

    body.push_str("<h2>Plans</h2>");
    let rows: Vec<Vec<String>> = plans
        .iter()
        .map(|p| {
            let rollback = p.rollback_of.map(|g| format!(" (rollback of {g})")).unwrap_or_default();
            vec![
                format!("<a href=\"{base}/plans/{g}\">{g}</a>", g = p.generation),
                escape(&ago(now, p.created_at_unix_ms)),
                escape(&p.author.to_string()),
                escape(&format!("{}{rollback}", p.reason)),
            ]
        })
        .collect();
    table(&mut body, &["PLAN (its diff and why)", "CREATED", "AUTHOR", "REASON"], &rows);

    body.push_str("<h2>Endpoints</h2>");
    let health = health_of(planner.as_ref());
    let rows: Vec<Vec<String>> = page_of
        .endpoints
        .iter()
        .map(|(name, record)| {
            let served = match &record.state {
                ActiveState::Serving(e) => e
                    .targets
                    .iter()
                    .map(|t| {
                        let h = health.get(&(name.to_string(), t.address.to_string())).map(String::as_str).unwrap_or("");
                        let class = match h {
                            "down" => "down",
                            "up" => "up",
                            _ => "muted",
                        };
                        format!(
                            "{} <span class=\"muted\">zone {} weight {}</span> <span class=\"{class}\">{}</span>",
                            escape(&t.address.to_string()),
                            escape(t.zone.as_str()),
                            t.weight,
                            escape(h)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("<br>"),
                ActiveState::Retired => "<span class=\"muted\">(retired)</span>".into(),
            };
            vec![escape(name.as_str()), format!("<a href=\"{base}/plans/{g}\">{g}</a>", g = record.generation), served]
        })
        .collect();
    table(&mut body, &["ENDPOINT", "PLAN", "ADDRESSES"], &rows);
    if page_of.more {
        let _ = write!(
            body,
            "<p class=\"muted\">the first {ENDPOINTS_SHOWN} of {} endpoints; <code>dnsplan endpoints list</code> shows every one</p>",
            snapshot.managed_count()
        );
    }

    body.push_str("<h2>Enactors</h2>");
    let rows: Vec<Vec<String>> = heartbeats
        .iter()
        .map(|h| {
            let lag = latest.0.saturating_sub(h.last_applied.0);
            let lag = if lag == 0 { "0".to_owned() } else { format!("<span class=\"down\">{lag} plan(s)</span>") };
            vec![
                escape(&h.enactor_id),
                escape(h.zone.as_str()),
                h.last_applied.to_string(),
                lag,
                escape(&ago(now, h.at_unix_ms)),
                escape(&h.state),
            ]
        })
        .collect();
    table(&mut body, &["ENACTOR", "ZONE", "APPLIED", "LAG", "SEEN", "STATE"], &rows);
    let secondaries = serving.secondaries.lock().map(|s| s.clone()).unwrap_or_default();
    if !secondaries.is_empty() {
        body.push_str("<h2>Secondaries</h2>");
        let rows: Vec<Vec<String>> = secondaries.iter().map(|s| secondary_row(s, snapshot.serial)).collect();
        table(&mut body, &["SECONDARY", "SERIAL", "STATE"], &rows);
    }
    if let Some(zones) = zones {
        zones_panel(&mut body, zones);
    }
    let _ =
        write!(body, "<p class=\"muted\">read-only; reloads every {REFRESH_SECS}s; writes are the CLI's (<code>dnsplan --help</code>)</p>");
    Ok(page("dnsplan status", &body, true))
}

/// The zones managed beside the first: counts by state, those in trouble, the first by name.
fn zones_panel(body: &mut String, zones: &ZonesPanel) {
    use crate::metrics::ADDED_ZONE_STATES;
    let total: usize = zones.summary.states.iter().sum();
    if total == 0 {
        return;
    }
    body.push_str("<h2>Zones managed beside this one</h2>");
    let counts: Vec<String> =
        ADDED_ZONE_STATES.iter().zip(zones.summary.states).filter(|(_, n)| *n > 0).map(|(state, n)| format!("{n} {state}")).collect();
    let trouble = zones.summary.trouble.len() + zones.summary.unlisted;
    let class = if trouble == 0 { "ok" } else { "bad" };
    let _ = write!(body, "<div class=\"banner {class}\">{total} zones: {} · {trouble} in trouble</div>", counts.join(", "));
    let link = |zone: &str| format!("<a href=\"/ui/managed/{z}\">{z}</a>", z = escape(zone));
    if !zones.summary.trouble.is_empty() {
        let rows: Vec<Vec<String>> = zones
            .summary
            .trouble
            .iter()
            .map(|(zone, reason)| vec![link(zone), format!("<span class=\"down\">{}</span>", escape(reason))])
            .collect();
        table(body, &["ZONE IN TROUBLE", "WHY"], &rows);
        if zones.summary.unlisted > 0 {
            let _ = write!(body, "<p class=\"muted\">and {} more in trouble</p>", zones.summary.unlisted);
        }
    }
    let rows: Vec<Vec<String>> = zones.first.iter().map(|(zone, state)| vec![link(zone), escape(state)]).collect();
    table(body, &["ZONE", "STATE"], &rows);
    if total > zones.first.len() {
        let _ = write!(
            body,
            "<p class=\"muted\">the first {} of {total} zones; <code>dnsplan zone list</code> shows every one</p>",
            zones.first.len()
        );
    }
}

/// A secondary's row: its address, the serial it serves, and whether it is current: at the
/// serial served here (`served`) with its zone read back and found equal.
fn secondary_row(s: &crate::serving::SecondaryStatus, served: u32) -> Vec<String> {
    use dnsplan_common::status::SecondaryState;
    let serial = s.serial.map_or_else(|| "?".to_owned(), |n| n.to_string());
    let state = match s.state(served) {
        SecondaryState::Unreachable(err) => format!("<span class=\"down\">unreachable: {}</span>", escape(err)),
        SecondaryState::Behind { .. } => format!("<span class=\"down\">behind ({served} served here)</span>"),
        SecondaryState::Differs(what) => format!("<span class=\"down\">differs {}</span>", escape(what)),
        SecondaryState::Current => "current".to_owned(),
        SecondaryState::Unverified(Some(err)) => format!("<span class=\"down\">unverified: {}</span>", escape(err)),
        SecondaryState::Unverified(None) => "unverified (zone not read back yet)".to_owned(),
    };
    vec![escape(&s.address.to_string()), serial, state]
}

/// `/ui/plans/{g}`: who, why, the changes against its parent, and each endpoint's provenance.
pub async fn plan_page<S: Store>(store: &S, generation: Generation, base: &Base) -> Result<String, StoreError> {
    let now = now_unix_ms();
    let plan = store.plan(generation).await?.into_plan();
    let parent = match plan.parent_generation {
        g if g.is_none() => None,
        g => match store.plan(g).await {
            Ok(p) => Some(p.into_plan()),
            // Cleaned up: the page says so instead of failing.
            Err(StoreError::PlanNotFound(_)) => None,
            Err(err) => return Err(err),
        },
    };
    Ok(page(&format!("dnsplan plan {generation}"), &render_plan(&plan, parent.as_ref(), now, base), false))
}

fn render_plan(plan: &Plan, parent: Option<&Plan>, now: u64, Base(base): &Base) -> String {
    let mut body = String::new();
    let _ = write!(body, "<p><a href=\"{base}\">← status</a></p><h1>Plan {}</h1>", plan.generation);
    let _ = write!(
        body,
        "<p>by <b>{}</b> {} · parent {} · {} endpoints</p><p>reason: {}</p>",
        escape(&plan.author.to_string()),
        ago(now, plan.created_at_unix_ms),
        plan.parent_generation,
        plan.endpoints.len(),
        escape(&plan.reason)
    );
    if let Some(g) = plan.rollback_of {
        let _ = write!(body, "<p class=\"down\">rollback to the content of plan <a href=\"{base}/plans/{g}\">{g}</a></p>");
    }
    let _ = write!(body, "<h2>Changes against plan {}</h2>", plan.parent_generation);
    match parent {
        None if plan.parent_generation.is_none() => body.push_str("<p class=\"muted\">the first plan: everything is new</p>"),
        None => body.push_str("<p class=\"muted\">the parent plan was cleaned up</p>"),
        Some(parent) => {
            let lines = diff_lines(parent, plan);
            if lines.is_empty() {
                body.push_str("<p class=\"muted\">no differences</p>");
            }
            body.push_str("<pre>");
            for (sign, text) in lines {
                let class = if sign == '+' { "plus" } else { "minus" };
                let _ = writeln!(body, "<span class=\"{class}\">{sign} {}</span>", escape(&text));
            }
            body.push_str("</pre>");
        }
    }
    body.push_str("<h2>Explanation</h2>");
    let rows: Vec<Vec<String>> =
        plan.provenance.iter().map(|p| vec![escape(p.endpoint.as_str()), escape(&p.rule), escape(&p.detail)]).collect();
    table(&mut body, &["ENDPOINT", "RULE", "WHY"], &rows);
    body.push_str("<h2>Endpoints</h2>");
    let rows: Vec<Vec<String>> =
        plan.endpoints.iter().map(|(n, e)| vec![escape(n.as_str()), e.ttl_secs.to_string(), escape(&target_list(e))]).collect();
    table(&mut body, &["ENDPOINT", "TTL", "TARGETS (zone, weight)"], &rows);
    for name in &plan.retired {
        let _ = write!(body, "<p>retired: {}</p>", escape(name.as_str()));
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("<script>\"x\" & 'y'</script>"), "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/script&gt;");
    }

    /// A plan's page: its diff against the parent, and its provenance with every text
    /// escaped (a reason or detail is operator input).
    #[test]
    fn a_plan_page_shows_the_diff_and_escapes_what_people_wrote() {
        use dnsplan_common::{Author, DnsName, Endpoint, Provenance, Target, ZoneId};
        let name = DnsName::parse("api.example.test.").expect("name");
        let endpoint = |weight| Endpoint {
            ttl_secs: 30,
            targets: vec![Target { address: [192, 0, 2, 1].into(), zone: ZoneId::parse("a").expect("zone"), weight }],
        };
        let plan = |g: u64, weight| Plan {
            generation: Generation(g),
            parent_generation: Generation(g - 1),
            created_at_unix_ms: 0,
            author: Author::Operator { name: "<b>eve</b>".into() },
            reason: "drain <script>".into(),
            dns_zone: DnsName::parse("example.test.").expect("zone"),
            endpoints: [(name.clone(), endpoint(weight))].into(),
            retired: Default::default(),
            rollback_of: None,
            provenance: vec![Provenance { endpoint: name.clone(), rule: "operator".into(), detail: "a & b".into() }],
        };
        let page = render_plan(&plan(2, 0), Some(&plan(1, 1)), 0, &Base::first());
        assert!(page.contains("<span class=\"minus\">- api.example.test. 192.0.2.1 zone a weight 1</span>"), "{page}");
        assert!(page.contains("<span class=\"plus\">+ api.example.test. 192.0.2.1 zone a weight 0</span>"), "{page}");
        assert!(page.contains("drain &lt;script&gt;") && page.contains("&lt;b&gt;eve&lt;/b&gt;") && page.contains("a &amp; b"), "{page}");
        assert!(!page.contains("<script>") && !page.contains("<b>eve"), "{page}");
    }

    #[test]
    fn times_read_as_people_say_them() {
        assert_eq!(ago(200_000, 190_000), "10s ago");
        assert_eq!(ago(10_000_000, 0), "2h ago");
        assert_eq!(until(0, 250_000), "in 4m 10s");
        assert_eq!(until(5_000, 1_000), "now");
    }
}
