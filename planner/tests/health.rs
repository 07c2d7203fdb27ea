//! Health probes against real TCP and HTTP listeners on loopback that the test starts, stops
//! and slows down.

use axum::http::StatusCode;
use axum::routing::get;
use dnsplan_planner::config::{Check, PlannerConfig};
use dnsplan_planner::health::probe;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

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
