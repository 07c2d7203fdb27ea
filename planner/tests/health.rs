//! Health probes against real TCP and HTTP listeners on loopback that the test starts, stops
//! and slows down.

use axum::http::StatusCode;
use axum::routing::get;
use dnsplan_common::EndpointName;
use dnsplan_planner::config::{Check, PlannerConfig};
use dnsplan_planner::decide::Health;
use dnsplan_planner::health::{HealthBook, probe, spawn_checks};
use dnsplan_planner::metrics::{Metrics, ResultLabels};
use dnsplan_tests::backends::{Behaviour, backend};
use prometheus_client::registry::Registry;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The check of a one-endpoint config with `check` as its TOML inline table.
fn check(check: &str) -> Check {
    let text = format!(
        "id = \"p\"\ndns_zone = \"example.test.\"\n[store]\nurl = \"http://127.0.0.1:1\"\n[[endpoint]]\nname = \"api.example.test.\"\nttl_secs = 30\ncheck = {check}\n[[endpoint.target]]\naddress = \"127.0.0.1\"\nzone = \"a\"\n"
    );
    let config = PlannerConfig::parse(&text).expect("valid test config");
    config.endpoints().next().and_then(|e| e.check.clone()).expect("a check")
}

async fn http_backend() -> anyhow::Result<SocketAddr> {
    let app = axum::Router::new()
        .route("/ok", get(|| async { "all ok here" }))
        .route("/sick", get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "no") }))
        .route(
            "/slow",
            get(|| async {
                // A backend that answers after the probe's timeout: a gray failure.
                tokio::time::sleep(Duration::from_secs(2)).await;
                "late"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

#[tokio::test]
async fn tcp_checks_follow_the_listener() -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let tcp = check(&format!("{{ kind = \"tcp\", port = {port}, timeout_ms = 300 }}"));
    let localhost: IpAddr = "127.0.0.1".parse()?;
    assert_eq!(probe(&client, localhost, &tcp).await, Ok(()));
    drop(listener);
    let down = probe(&client, localhost, &tcp).await;
    assert!(down.as_ref().is_err_and(|e| e.contains("connect")), "{down:?}");
    Ok(())
}

#[tokio::test]
async fn http_checks_status_body_and_time() -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let addr = http_backend().await?;
    let ip = addr.ip();
    let port = addr.port();
    let http = |rest: &str| check(&format!("{{ kind = \"http\", port = {port}, timeout_ms = 300{rest} }}"));
    assert_eq!(probe(&client, ip, &http(", path = \"/ok\"")).await, Ok(()));
    assert_eq!(probe(&client, ip, &http(", path = \"/ok\", body_contains = \"ok\"")).await, Ok(()));
    let wrong_body = probe(&client, ip, &http(", path = \"/ok\", body_contains = \"healthy\"")).await;
    assert!(wrong_body.as_ref().is_err_and(|e| e.contains("body does not contain")), "{wrong_body:?}");
    let sick = probe(&client, ip, &http(", path = \"/sick\"")).await;
    assert!(sick.as_ref().is_err_and(|e| e.contains("status 503")), "{sick:?}");
    assert_eq!(probe(&client, ip, &http(", path = \"/sick\", expect = \"503\"")).await, Ok(()));
    let missing = probe(&client, ip, &http(", path = \"/nope\"")).await;
    assert!(missing.as_ref().is_err_and(|e| e.contains("status 404")), "{missing:?}");
    let slow = probe(&client, ip, &http(", path = \"/slow\"")).await;
    assert!(slow.as_ref().is_err_and(|e| e.contains("timed out")), "{slow:?}");
    Ok(())
}

#[test]
fn bad_check_configs_are_clear_errors() {
    let base = "id = \"p\"\ndns_zone = \"example.test.\"\n[store]\nurl = \"http://127.0.0.1:1\"\n[[endpoint]]\nname = \"api.example.test.\"\nttl_secs = 30\n";
    let target = "[[endpoint.target]]\naddress = \"127.0.0.1\"\nzone = \"a\"\n";
    let cases = [
        (format!("{base}check = {{ kind = \"udp\", port = 1 }}\n{target}"), "kind \"udp\" is not a check"),
        (format!("{base}check = {{ kind = \"tcp\", port = 1, path = \"/\" }}\n{target}"), "for kind = \"http\" checks only"),
        (format!("{base}check = {{ kind = \"http\", port = 1, expect = \"2xy\" }}\n{target}"), "not a status class"),
        (format!("{base}check = {{ kind = \"tcp\", port = 1, rise = 0 }}\n{target}"), "line 8"),
        (format!("{base}check = {{ kind = \"tcp\", port = 1, colour = 1 }}\n{target}"), "colour"),
        (format!("{base}{target}"), "has no check"),
        (format!("{base}check = {{ kind = \"tcp\", port = 1 }}\n{target}[policy]\nfail_open_below = 1.5\n"), "not a fraction"),
        (format!("{base}check = {{ kind = \"tcp\", port = 1 }}\n{target}{target}"), "appears more than once"),
        (format!("{base}check = {{ kind = \"tcp\", port = 1 }}\n{target}[planner]\ndecide_interval_ms = 5000\n"), "a third of"),
    ];
    for (text, want) in cases {
        let err = PlannerConfig::parse(&text).expect_err(want);
        assert!(err.contains(want), "{want:?} not in: {err}");
    }
    let outside = format!("{base}check = {{ kind = \"tcp\", port = 1 }}\n{target}").replace("api.example.test.", "api.other.test.");
    let err = PlannerConfig::parse(&outside).expect_err("outside");
    assert!(err.contains("line 5") && err.contains("outside the DNS zone"), "{err}");
}

/// `[[zone]]` tables: each zone is planned with its own endpoints (inside it, named once across
/// every zone) and policy (or the top-level one); a zone planned twice, an endpoint outside its
/// zone or one zone's endpoint named again in another is a clear error with its line.
#[test]
fn zone_tables_are_checked_and_each_planned_alone() {
    let first = "id = \"p\"\ndns_zone = \"example.test.\"\n[store]\nurl = \"http://127.0.0.1:1\"\n[policy]\nfail_open_below = 0.3\n\
                 [[endpoint]]\nname = \"api.example.test.\"\nttl_secs = 30\ncheck = { kind = \"tcp\", port = 1 }\n\
                 [[endpoint.target]]\naddress = \"127.0.0.1\"\nzone = \"a\"\n";
    let zone = |origin: &str, name: &str, policy: &str| {
        format!(
            "[[zone]]\ndns_zone = \"{origin}\"\n{policy}[[zone.endpoint]]\nname = \"{name}\"\nttl_secs = 30\n\
             check = {{ kind = \"tcp\", port = 1 }}\n[[zone.endpoint.target]]\naddress = \"127.0.0.2\"\nzone = \"a\"\n"
        )
    };
    let text = format!(
        "{first}{}{}",
        zone("shop.test.", "api.shop.test.", ""),
        zone("blog.test.", "www.blog.test.", "[zone.policy]\nfail_open_below = 0.7\n")
    );
    let config = PlannerConfig::parse(&text).expect("valid");
    let zones = config.each_zone();
    let summary: Vec<(String, bool, f64, Vec<String>)> = zones
        .iter()
        .map(|z| (z.dns_zone.to_string(), z.added_zone, z.policy.fail_open_below.0, z.endpoints().map(|e| e.name.to_string()).collect()))
        .collect();
    assert_eq!(
        summary,
        [
            ("example.test.".into(), false, 0.3, vec!["api.example.test.".into()]),
            ("shop.test.".into(), true, 0.3, vec!["api.shop.test.".into()]),
            ("blog.test.".into(), true, 0.7, vec!["www.blog.test.".into()]),
        ]
    );
    assert_eq!(config.all_endpoints().count(), 3, "the health checks cover every zone's endpoints");
    let cases = [
        (format!("{first}{}", zone("example.test.", "x.example.test.", "")), "zone example.test. is planned twice"),
        (
            format!("{first}{}{}", zone("shop.test.", "a.shop.test.", ""), zone("shop.test.", "b.shop.test.", "")),
            "zone shop.test. is planned twice",
        ),
        (format!("{first}{}", zone("shop.test.", "api.other.test.", "")), "outside the DNS zone shop.test."),
        (
            format!("{first}{}{}", zone("shop.test.", "api.x.shop.test.", ""), zone("x.shop.test.", "api.x.shop.test.", "")),
            "configured twice",
        ),
        (format!("{first}[[zone]]\ndns_zone = \"shop.test.\"\n"), "has no [[zone.endpoint]]"),
        (format!("{first}{}", zone("shop.test.", "api.shop.test.", "[zone.policy]\ncapacity_headroom = 0.5\n")), "capacity_headroom"),
    ];
    for (text, want) in cases {
        let err = PlannerConfig::parse(&text).expect_err(want);
        assert!(err.contains(want) && err.contains("line "), "{want:?} not in: {err}");
    }
}

/// Targets of the hanging-backends test, and how many of them hang.
const TARGETS: u8 = 48;
const HANGING: u8 = 16;
const INTERVAL_MS: u64 = 250;
const FALL: u64 = 2;

/// 48 targets on 127.0.2.N, probed every 250 ms with `probe_concurrency` 2, of which 16
/// accept and never answer: a target that starts failing with a 500 must still be found down
/// within about `fall` intervals, and the others must keep their probe rate.
///
/// Teeth: with every probe holding its permit until its timeout (the pool before), the
/// failing target was found down only after 3.8 s (100 targets, 25 hanging; bound 1.05 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_that_hang_do_not_delay_the_probes_of_the_others() -> anyhow::Result<()> {
    let failing = Arc::new(AtomicBool::new(false));
    let address = |n: u8| IpAddr::from([127, 0, 2, n]);
    let mut port = 0;
    for n in 1..=TARGETS {
        let behaviour = match n {
            1 => Behaviour::FailsLater,
            n if n > TARGETS - HANGING => Behaviour::Hangs,
            _ => Behaviour::Ok,
        };
        port = backend(address(n), port, behaviour, failing.clone()).await?;
    }
    let mut text =
        "id = \"p\"\ndns_zone = \"example.test.\"\n[store]\nurl = \"http://127.0.0.1:1\"\n[planner]\nprobe_concurrency = 2\n".to_string();
    for n in 1..=TARGETS {
        text.push_str(&format!(
            "[[endpoint]]\nname = \"t{n}.example.test.\"\nttl_secs = 30\ncheck = {{ kind = \"http\", port = {port}, interval_ms = {INTERVAL_MS}, timeout_ms = {INTERVAL_MS}, rise = 1, fall = {FALL} }}\n[[endpoint.target]]\naddress = \"{}\"\nzone = \"a\"\n",
            address(n)
        ));
    }
    let config = PlannerConfig::parse(&text).map_err(anyhow::Error::msg)?;
    let book = Arc::new(HealthBook::default());
    let metrics = Arc::new(Metrics::register(&mut Registry::default(), "p"));
    let _checks = spawn_checks(&config, book.clone(), metrics.clone());
    let watched = (EndpointName::parse("t1.example.test.")?, address(1));
    let health_of = || book.view().get(&watched).copied();

    // Every answering target up, the hanging ones down.
    let deadline = Instant::now() + Duration::from_secs(10);
    let down = |view: &dnsplan_planner::decide::HealthView| view.values().filter(|h| **h == Health::Down).count();
    while health_of() != Some(Health::Up) || down(&book.view()) < HANGING as usize {
        anyhow::ensure!(Instant::now() < deadline, "the targets were not all probed within 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let probes = || {
        metrics.probes.get_or_create(&ResultLabels { result: "ok" }).get()
            + metrics.probes.get_or_create(&ResultLabels { result: "fail" }).get()
    };
    let (before, window) = (probes(), Instant::now());

    failing.store(true, Ordering::SeqCst);
    let failed_at = Instant::now();
    let bound = Duration::from_millis(INTERVAL_MS * (FALL + 1) + 500);
    while health_of() != Some(Health::Down) {
        anyhow::ensure!(failed_at.elapsed() < Duration::from_secs(5), "the failing target was not found down within 5 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let found = failed_at.elapsed();
    assert!(found <= bound, "found down after {found:?}, more than {bound:?} ({} intervals and one)", FALL);

    // The answering targets keep their rate: one probe per interval each, counted over a
    // window of a second (the window's length, not a synchronisation).
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let rate = (probes() - before) as f64 / window.elapsed().as_secs_f64();
    let want = f64::from(TARGETS - HANGING) * 1000.0 / INTERVAL_MS as f64;
    assert!(rate >= 0.7 * want, "{rate:.0} probes/s of answering targets, want about {want:.0}");
    assert_eq!(metrics.probe_slow_targets.get(), i64::from(HANGING), "every hanging target is slow, no other");
    Ok(())
}
