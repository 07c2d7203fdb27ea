//! `/v1/status` is a summary whose size does not grow with the zone: one page of endpoints
//! (100 by default), the counts from the serving snapshot, and paging with `after`. It used to
//! read and return the whole active state (at 100,000 endpoints, 728 ms and 17.8 MB per call,
//! holding the store's lock); this test then saw all 250 endpoints in one answer.

mod support;

use dnsplan_common::store::ApplyItem;
use dnsplan_common::{Generation, Store};
use serde_json::Value;
use support::{TestAuthority, endpoint, plan, target};

const ENDPOINTS: usize = 250;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_is_a_summary_with_one_page_of_endpoints() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    let names: Vec<String> = (0..ENDPOINTS).map(|i| format!("e{i:03}.example.test.")).collect();
    let records = endpoint(30, vec![target("10.1.0.1", "a", 1)]);
    let entries: Vec<(&str, _)> = names.iter().map(|n| (n.as_str(), records.clone())).collect();
    let first = plan(1, &entries);
    auth.store.publish(&first).await?;
    let items: Vec<ApplyItem> = first.plan().endpoints.iter().map(|(n, r)| ApplyItem { endpoint: n.clone(), records: r.clone() }).collect();
    auth.store.apply_many(Generation(1), &items).await?;
    let client = reqwest::Client::new();
    let get = |query: &str| {
        let (client, url) = (client.clone(), format!("{}/v1/status{query}", auth.control));
        async move {
            let resp = client.get(url).send().await?;
            anyhow::Ok((resp.status().as_u16(), resp.json::<Value>().await?))
        }
    };
    // The serving snapshot follows the store; wait until it holds every endpoint.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        let (code, status) = get("").await?;
        assert_eq!(code, 200, "{status}");
        if status["managed_endpoints"] == ENDPOINTS {
            break status;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the snapshot never held every endpoint: {status}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let page = status["endpoints"].as_object().expect("endpoints");
    assert_eq!(page.len(), 100, "one page of endpoints by default");
    assert_eq!(status["endpoints_more"], true);
    assert_eq!(status["latest"], 1);
    assert!(page.contains_key("e000.example.test.") && page.contains_key("e099.example.test."));

    let (_, next) = get("?limit=200&after=e099.example.test.").await?;
    let next = next["endpoints"].as_object().expect("endpoints").keys().cloned().collect::<Vec<_>>();
    assert_eq!(next.len(), 150);
    assert_eq!(next.first().map(String::as_str), Some("e100.example.test."));
    let (_, none) = get("?limit=0").await?;
    assert!(none["endpoints"].as_object().is_some_and(|e| e.is_empty()));
    for bad in ["?limit=5000", "?after=not%20a%20name", "?colour=blue", "?limit=x"] {
        let (code, body) = get(bad).await?;
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body["message"].as_str().is_some(), "{bad}: a JSON error: {body}");
    }
    auth.stop().await
}
