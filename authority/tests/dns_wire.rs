//! The authority over the wire: a real authority on loopback UDP and TCP, plans published and
//! applied through the control API, and a real DNS client (hickory-proto messages on our own
//! sockets, and `dig` where it is installed).

mod support;

use dnsplan_common::Store;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{DNSClass, RData, RecordType};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;
use support::*;

const DEADLINE: Duration = Duration::from_secs(10);

fn soa_of(msg: &hickory_proto::op::Message) -> Option<(u32, u32)> {
    msg.authorities.iter().chain(msg.answers.iter()).find_map(|r| match &r.data {
        RData::SOA(s) => Some((r.ttl, s.serial)),
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_the_dns_zone_correctly() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    let api = plan(
        1,
        &[("api.example.test.", endpoint(20, vec![target("10.0.0.1", "a", 1), target("10.0.0.2", "b", 1), target("2001:db8::1", "c", 1)]))],
    );
    publish_and_apply(&auth.store, &api).await?;
    let served = until(auth.dns, "api.example.test.", RecordType::A, DEADLINE, |m| !m.answers.is_empty()).await?;
    let want_v4: BTreeSet<IpAddr> = ["10.0.0.1".parse()?, "10.0.0.2".parse()?].into();
    assert_eq!(addresses(&served), want_v4, "A answers only the v4 targets");
    assert!(served.answers.iter().all(|r| r.ttl == 20), "TTL comes from the plan");
    assert!(served.metadata.authoritative && !served.metadata.recursion_available, "AA=1, RA=0");

    let (aaaa, _) = ask(auth.dns, "api.example.test.", RecordType::AAAA, Ask::default()).await?;
    assert_eq!(addresses(&aaaa), ["2001:db8::1".parse::<IpAddr>()?].into(), "AAAA answers only the v6 target");

    // Case is preserved and the owner name compresses to a pointer at the question (0xC00C).
    let (mixed, raw) = ask(auth.dns, "Api.EXAMPLE.test.", RecordType::A, Ask::default()).await?;
    assert_eq!(mixed.answers[0].name.to_string(), "Api.EXAMPLE.test.");
    let question_end = 12 + "Api.EXAMPLE.test.".len() + 1 + 4;
    assert_eq!(&raw[question_end..question_end + 2], &[0xC0, 0x0C], "answer owner is a compression pointer to the question");

    // Apex: SOA and NS; the SOA serial is the content-change counter.
    let (soa, _) = ask(auth.dns, "example.test.", RecordType::SOA, Ask::default()).await?;
    let content = auth.store.active_all().await?.content_changes as u32;
    assert_eq!(soa_of(&soa).map(|s| s.1), Some(content));
    let (ns, _) = ask(auth.dns, "example.test.", RecordType::NS, Ask::default()).await?;
    assert_eq!(ns.answers.len(), 1);

    // Negative answers: (name, type, rcode, answers)
    let cases: &[(&str, RecordType, ResponseCode, usize)] = &[
        ("nope.example.test.", RecordType::A, ResponseCode::NXDomain, 0),
        ("deep.nope.example.test.", RecordType::AAAA, ResponseCode::NXDomain, 0),
        ("api.example.test.", RecordType::TXT, ResponseCode::NoError, 0),
        ("_udp.example.test.", RecordType::A, ResponseCode::NoError, 0), // empty non-terminal
        ("sip.example.test.", RecordType::AAAA, ResponseCode::NoError, 0),
        ("sip.example.test.", RecordType::A, ResponseCode::NoError, 1),
        ("www.example.test.", RecordType::A, ResponseCode::NoError, 3), // the CNAME, then api's two addresses
        ("_sip._udp.example.test.", RecordType::SRV, ResponseCode::NoError, 1),
        ("example.test.", RecordType::TXT, ResponseCode::NoError, 1),
    ];
    for (name, qtype, rcode, answers) in cases {
        let (m, _) = ask(auth.dns, name, *qtype, Ask::default()).await?;
        assert_eq!((m.metadata.response_code, m.answers.len()), (*rcode, *answers), "{name} {qtype}");
        assert!(m.metadata.authoritative, "{name} {qtype}: AA");
        if *answers == 0 {
            // RFC 2308: the SOA in authority, TTL min(SOA TTL 300, MINIMUM 30).
            assert_eq!(soa_of(&m).map(|s| s.0), Some(30), "{name} {qtype}: negative SOA TTL");
        }
    }
    let (www, _) = ask(auth.dns, "www.example.test.", RecordType::A, Ask::default()).await?;
    assert_eq!(www.answers[0].record_type(), RecordType::CNAME);
    assert_eq!(addresses(&www), want_v4, "the CNAME followed in the zone: api's addresses");

    // REFUSED: outside the DNS zone, another class, zone transfers.
    for (name, qtype, class) in [
        ("example.com.", RecordType::A, DNSClass::IN),
        ("test.", RecordType::SOA, DNSClass::IN),
        ("version.bind.", RecordType::TXT, DNSClass::CH),
        ("example.test.", RecordType::AXFR, DNSClass::IN),
    ] {
        let (m, _) = ask(auth.dns, name, qtype, Ask { class, tcp: qtype == RecordType::AXFR, ..Ask::default() }).await?;
        assert_eq!(m.metadata.response_code, ResponseCode::Refused, "{name} {qtype} {class}");
        assert!(!m.metadata.authoritative, "{name}: no AA on REFUSED");
    }

    // TCP answers the same.
    let (tcp, _) = ask(auth.dns, "api.example.test.", RecordType::A, Ask { tcp: true, ..Ask::default() }).await?;
    assert_eq!(addresses(&tcp), want_v4);
    auth.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edns_and_truncation() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 64).await?;
    let many: Vec<_> = (1..=40).map(|i| target(&format!("2001:db8::{i:x}"), "a", 1)).collect();
    publish_and_apply(&auth.store, &plan(1, &[("big.example.test.", endpoint(60, many))])).await?;
    until(auth.dns, "big.example.test.", RecordType::AAAA, DEADLINE, |m| !m.answers.is_empty()).await?;

    // The server advertises its own payload size, not the client's.
    let (m, _) = ask(auth.dns, "big.example.test.", RecordType::AAAA, Ask { edns: Some(4096), ..Ask::default() }).await?;
    assert_eq!(m.edns.as_ref().map(|e| e.max_payload()), Some(1232));
    assert_eq!(m.answers.len(), 40, "40 AAAA fit in 1232 bytes");
    // No EDNS in, no EDNS out; 512 bytes cannot hold 40 AAAA: TC=1, and TCP has them all.
    let (small, raw) = ask(auth.dns, "big.example.test.", RecordType::AAAA, Ask { edns: None, ..Ask::default() }).await?;
    assert!(small.edns.is_none());
    assert!(small.metadata.truncation && small.answers.is_empty() && raw.len() <= 512, "TC=1 within 512 bytes");
    let (tcp, _) = ask(auth.dns, "big.example.test.", RecordType::AAAA, Ask { edns: None, tcp: true, ..Ask::default() }).await?;
    assert!(!tcp.metadata.truncation && tcp.answers.len() == 40);
    // EDNS version 1 is answered BADVERS.
    let (bad, _) = ask(auth.dns, "big.example.test.", RecordType::AAAA, Ask { edns_version: 1, ..Ask::default() }).await?;
    // Extended rcode 16 (BADVERS; hickory decodes 16 under its other name, BADSIG).
    assert_eq!(u16::from(bad.metadata.response_code), 16, "{:?}", bad.metadata.response_code);
    assert_eq!(bad.edns.as_ref().map(|e| e.version()), Some(0), "we answer with the version we speak");
    auth.stop().await
}

/// Weights 1:2:7 with one address per answer: observed shares within 5 standard deviations of
/// the expected ones over 3,000 queries; a zero-weight target is never chosen while others
/// have weight, and an all-zero family is still served (never empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_sampling_follows_weights() -> anyhow::Result<()> {
    const QUERIES: usize = 3_000;
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 1).await?;
    let targets = vec![
        target("10.1.0.1", "a", 1),
        target("10.1.0.2", "b", 2),
        target("10.1.0.7", "c", 7),
        target("10.1.0.9", "c", 0),
        target("2001:db8::9", "c", 0),
    ];
    publish_and_apply(&auth.store, &plan(1, &[("w.example.test.", endpoint(5, targets))])).await?;
    until(auth.dns, "w.example.test.", RecordType::A, DEADLINE, |m| !m.answers.is_empty()).await?;
    let mut counts: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for _ in 0..QUERIES {
        let (m, _) = ask(auth.dns, "w.example.test.", RecordType::A, Ask::default()).await?;
        assert_eq!(m.answers.len(), 1);
        for a in addresses(&m) {
            *counts.entry(a).or_default() += 1;
        }
    }
    assert!(!counts.contains_key(&"10.1.0.9".parse()?), "zero-weight target served: {counts:?}");
    for (addr, weight) in [("10.1.0.1", 1.0), ("10.1.0.2", 2.0), ("10.1.0.7", 7.0)] {
        let p: f64 = weight / 10.0;
        let expected = p * QUERIES as f64;
        let sigma = (QUERIES as f64 * p * (1.0 - p)).sqrt();
        let got = *counts.get(&addr.parse()?).unwrap_or(&0) as f64;
        assert!((got - expected).abs() < 5.0 * sigma, "{addr}: {got} answers, expected {expected:.0} ± {:.0}", 5.0 * sigma);
    }
    let (v6, _) = ask(auth.dns, "w.example.test.", RecordType::AAAA, Ask::default()).await?;
    assert_eq!(addresses(&v6), ["2001:db8::9".parse::<IpAddr>()?].into(), "an all-zero family is served rather than empty");
    auth.stop().await
}

/// RFC 3225 over the wire: the answer's OPT record has DO=1 when the query's had, DO=0
/// otherwise, over UDP (fast and reference path) and TCP, for answers, negative answers,
/// REFUSED and BADVERS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_do_bit_is_copied() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    publish_and_apply(&auth.store, &plan(1, &[("api.example.test.", endpoint(20, vec![target("10.9.0.1", "a", 1)]))])).await?;
    until(auth.dns, "api.example.test.", RecordType::A, DEADLINE, |m| !m.answers.is_empty()).await?;
    for (name, qtype, tcp, edns_version) in [
        ("api.example.test.", RecordType::A, false, 0),  // fast path: an answer
        ("nope.example.test.", RecordType::A, false, 0), // fast path: NXDOMAIN
        ("example.test.", RecordType::TXT, false, 0),    // reference path: a static record
        ("example.org.", RecordType::A, false, 0),       // REFUSED
        ("api.example.test.", RecordType::A, false, 1),  // BADVERS
        ("api.example.test.", RecordType::A, true, 0),   // TCP
    ] {
        for dnssec_ok in [false, true] {
            let (m, _) = ask(auth.dns, name, qtype, Ask { tcp, edns_version, dnssec_ok, ..Ask::default() }).await?;
            let got = m.edns.as_ref().map(|e| e.flags().dnssec_ok);
            assert_eq!(got, Some(dnssec_ok), "{name} {qtype} tcp={tcp} version={edns_version}: DO in the answer's OPT");
        }
    }
    auth.stop().await
}

/// A managed name that has data is never answered empty while plans keep changing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_empty_while_plans_change() -> anyhow::Result<()> {
    const PLANS: u64 = 40;
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    let e = |g: u64| endpoint(5, vec![target(&format!("10.2.{}.1", g % 250), "a", 1), target(&format!("10.2.{}.2", g % 250), "b", 1)]);
    publish_and_apply(&auth.store, &plan(1, &[("live.example.test.", e(1))])).await?;
    until(auth.dns, "live.example.test.", RecordType::A, DEADLINE, |m| !m.answers.is_empty()).await?;
    let dns = auth.dns;
    let prober = tokio::spawn(async move {
        let mut answers = 0usize;
        let mut last_serial = 0u32;
        let stop = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < stop {
            let (m, _) = ask(dns, "live.example.test.", RecordType::A, Ask::default()).await?;
            anyhow::ensure!(m.metadata.response_code == ResponseCode::NoError && !m.answers.is_empty(), "empty answer: {m:?}");
            let (soa, _) = ask(dns, "example.test.", RecordType::SOA, Ask::default()).await?;
            let serial = soa_of(&soa).map(|s| s.1).unwrap_or(0);
            anyhow::ensure!(serial >= last_serial, "SOA serial went back from {last_serial} to {serial}");
            last_serial = serial;
            answers += 1;
            if addresses(&m).contains(&format!("10.2.{}.1", PLANS % 250).parse::<IpAddr>()?) {
                return Ok(answers);
            }
        }
        anyhow::bail!("the last plan was not served within 30 s")
    });
    for g in 2..=PLANS {
        publish_and_apply(&auth.store, &plan(g, &[("live.example.test.", e(g))])).await?;
    }
    let answers = prober.await??;
    assert!(answers > 0);
    auth.stop().await
}

/// Static stability: state written, everything stopped, only the authority started again on
/// its own disk: the same answers over the wire, before any planner or enactor exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_last_applied_state_after_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    let p = plan(
        1,
        &[
            ("db.example.test.", endpoint(30, vec![target("10.3.0.1", "a", 1), target("10.3.0.2", "b", 3)])),
            ("api.example.test.", endpoint(30, vec![target("2001:db8::3", "a", 1)])),
        ],
    );
    publish_and_apply(&auth.store, &p).await?;
    let before_a = until(auth.dns, "db.example.test.", RecordType::A, DEADLINE, |m| addresses(m).len() == 2).await?;
    let before_aaaa = until(auth.dns, "api.example.test.", RecordType::AAAA, DEADLINE, |m| !m.answers.is_empty()).await?;
    auth.stop().await?;

    let again = TestAuthority::start(dir.path(), 8).await?;
    // No waiting: the very first answers must already be the applied state.
    let (after_a, _) = ask(again.dns, "db.example.test.", RecordType::A, Ask::default()).await?;
    let (after_aaaa, _) = ask(again.dns, "api.example.test.", RecordType::AAAA, Ask::default()).await?;
    assert_eq!(addresses(&after_a), addresses(&before_a));
    assert_eq!(addresses(&after_aaaa), addresses(&before_aaaa));
    again.stop().await
}

/// Malformed packets never crash the server: garbage gets FORMERR or silence, and the server
/// still answers afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_packets_get_formerr_or_silence() -> anyhow::Result<()> {
    use rand::{RngExt, SeedableRng};
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    let short = exchange_udp(auth.dns, &[0u8; 11], Duration::from_millis(300)).await?;
    assert!(short.is_none(), "an 11-byte packet got a reply");
    let mut response_bit = build_query("example.test.", RecordType::SOA, Ask::default());
    response_bit[2] |= 0x80;
    assert!(exchange_udp(auth.dns, &response_bit, Duration::from_millis(300)).await?.is_none(), "a response was answered");
    let mut garbage = build_query("example.test.", RecordType::SOA, Ask::default());
    garbage.truncate(20);
    let reply = exchange_udp(auth.dns, &garbage, Duration::from_secs(2)).await?.expect("FORMERR for a cut question");
    assert_eq!(reply[3] & 0x0f, 1, "rcode FORMERR");
    assert_eq!(&reply[0..2], &garbage[0..2], "same id");

    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    for _ in 0..2_000 {
        let len = rng.random_range(0..600);
        let mut packet: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if len > 2 {
            packet[2] &= 0x7f; // mostly queries, so the parser is exercised
        }
        socket.send_to(&packet, auth.dns).await?;
    }
    let (m, _) = ask(auth.dns, "example.test.", RecordType::SOA, Ask::default()).await?;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError, "server still answers after 2,000 random packets");
    auth.stop().await
}

/// The same checks through `dig`, as an operator would run them (skipped where dig is absent;
/// `.ci/run` installs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dig_agrees() -> anyhow::Result<()> {
    if std::process::Command::new("dig").arg("-v").output().is_err() {
        eprintln!("dig is not installed; skipping");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    publish_and_apply(&auth.store, &plan(1, &[("api.example.test.", endpoint(20, vec![target("10.9.0.1", "a", 1)]))])).await?;
    until(auth.dns, "api.example.test.", RecordType::A, DEADLINE, |m| !m.answers.is_empty()).await?;
    let port = auth.dns.port().to_string();
    let dig = |args: &[&str]| -> anyhow::Result<String> {
        let out = std::process::Command::new("dig").args(["@127.0.0.1", "-p", &port, "+tries=1", "+time=2"]).args(args).output()?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    for (args, wants) in [
        (vec!["api.example.test", "A"], vec!["status: NOERROR", "flags: qr aa rd;", "10.9.0.1", "udp: 1232"]),
        (vec!["+tcp", "api.example.test", "A"], vec!["status: NOERROR", "10.9.0.1", "(TCP)"]),
        (vec!["nope.example.test", "A"], vec!["status: NXDOMAIN", "IN\tSOA"]),
        (vec!["example.org", "A"], vec!["status: REFUSED"]),
        // RFC 3225: DO is copied from the query's OPT record.
        (vec!["+dnssec", "api.example.test", "A"], vec!["status: NOERROR", "flags: do;", "10.9.0.1"]),
        (vec!["+dnssec", "nope.example.test", "A"], vec!["status: NXDOMAIN", "flags: do;"]),
        (vec!["+dnssec", "+tcp", "api.example.test", "A"], vec!["flags: do;", "(TCP)"]),
        (vec!["api.example.test", "A"], vec!["EDNS: version: 0, flags:; udp: 1232"]),
    ] {
        let out = dig(&args)?;
        for want in wants {
            assert!(out.contains(want), "dig {args:?}: want {want:?} in\n{out}");
        }
    }
    auth.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    publish_and_apply(&auth.store, &plan(1, &[("api.example.test.", endpoint(20, vec![target("10.9.0.1", "a", 1)]))])).await?;
    until(auth.dns, "api.example.test.", RecordType::A, DEADLINE, |m| !m.answers.is_empty()).await?;
    ask(auth.dns, "nope.example.test.", RecordType::A, Ask::default()).await?;
    let client = reqwest::Client::new();
    let text = client.get(format!("{}/metrics", auth.control)).send().await?.text().await?;
    for want in [
        "dnsplan_dns_queries_total{qtype=\"A\",rcode=\"No Error\",transport=\"udp\"}",
        "dnsplan_dns_queries_total{qtype=\"A\",rcode=\"Non-Existent Domain\",transport=\"udp\"}",
        "dnsplan_store_applies_total{outcome=\"switched\"} 1",
        "dnsplan_active_generation{endpoint=\"api.example.test.\"} 1",
        "dnsplan_snapshot_swap_seconds_count",
        "dnsplan_dns_response_bytes_bucket",
        "dnsplan_dns_udp_unsent_total 0",
    ] {
        assert!(text.contains(want), "want {want:?} in /metrics:\n{text}");
    }
    for path in ["/healthz", "/readyz", "/v1/status"] {
        let resp = client.get(format!("{}{path}", auth.control)).send().await?;
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
    }

    // The per-endpoint series follow each change (they are updated from the delta, not
    // rebuilt): a new endpoint appears, a moved one changes, a retired one goes away.
    let two = endpoint(20, vec![target("10.9.0.2", "a", 1)]);
    publish_and_apply(&auth.store, &plan(2, &[("api.example.test.", two.clone()), ("web.example.test.", two.clone())])).await?;
    until(auth.dns, "web.example.test.", RecordType::A, DEADLINE, |m| !m.answers.is_empty()).await?;
    let text = client.get(format!("{}/metrics", auth.control)).send().await?.text().await?;
    for want in
        ["dnsplan_active_generation{endpoint=\"api.example.test.\"} 2", "dnsplan_active_generation{endpoint=\"web.example.test.\"} 2"]
    {
        assert!(text.contains(want), "want {want:?} in /metrics:\n{text}");
    }
    let mut retire = plan(3, &[("api.example.test.", two)]).into_plan();
    retire.author = dnsplan_common::Author::Operator { name: "wire-test".into() };
    retire.retired.insert(dnsplan_common::DnsName::parse("web.example.test.")?);
    publish_and_apply(&auth.store, &dnsplan_common::ValidatedPlan::new(retire)?).await?;
    until(auth.dns, "web.example.test.", RecordType::A, DEADLINE, |m| m.metadata.response_code == ResponseCode::NXDomain).await?;
    let text = client.get(format!("{}/metrics", auth.control)).send().await?.text().await?;
    assert!(text.contains("dnsplan_active_generation{endpoint=\"api.example.test.\"} 3"), "api at 3 in /metrics:\n{text}");
    assert!(!text.contains("web.example.test."), "the retired endpoint's series is gone from /metrics:\n{text}");
    auth.stop().await
}

/// A store whose plans are for example.test. and an authority configured for other.test.: it
/// must refuse to start, naming both zones and what to change, instead of serving none of
/// the store's names. (Without `follow::follower::check_dns_zone` it binds and serves: the test sees
/// it bound and fails.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_store_of_another_dns_zone() -> anyhow::Result<()> {
    use dnsplan_authority::config::AuthorityConfig;
    use dnsplan_authority::run::run;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    {
        let store = dnsplan_common::SledStore::open(&data)?;
        publish_and_apply(&store, &plan(1, &[("api.example.test.", endpoint(20, vec![target("10.9.0.1", "a", 1)]))])).await?;
    }
    let config_path = dir.path().join("authority.toml");
    let text = config_text(&data, 8).replace("example.test.", "other.test.").replace("master_file = \"zone.db\"\n", "");
    std::fs::write(&config_path, text)?;
    let config = AuthorityConfig::load(&config_path)?;
    let (bound_tx, mut bound_rx) = tokio::sync::oneshot::channel();
    let started = run(config, dir.path(), std::future::pending(), move |b| {
        let _ = bound_tx.send(b);
    });
    let err = tokio::select! {
        result = started => result.expect_err("the authority started on a store of another DNS zone"),
        bound = &mut bound_rx => panic!("the authority serves a store of example.test. as other.test.: {bound:?}"),
    };
    let text = format!("{err:#}");
    for want in ["example.test.", "other.test.", "latest plan 1", "set dns_zone.origin = \"example.test.\"", "data_dir"] {
        assert!(text.contains(want), "{want:?} not in: {text}");
    }

    // The same store with the right origin serves it.
    let auth = TestAuthority::start(dir.path(), 8).await?;
    let (m, _) = ask(auth.dns, "api.example.test.", RecordType::A, Ask::default()).await?;
    assert_eq!(addresses(&m), ["10.9.0.1".parse::<IpAddr>()?].into());
    auth.stop().await
}
