//! The authority as a reflector, over real UDP on loopback: a flood of one query from one
//! client prefix is cut to the configured rate, the rest dropped except every `slip`-th,
//! which goes out truncated; the flood comes back smaller than it went in; other and exempt
//! prefixes are answered meanwhile; and ANY gets one RRset (RFC 8482), over UDP and TCP.
//!
//! Loopback is 127.0.0.0/8, so clients bind 127.0.1.1, 127.0.2.1... to be different /24s.

mod support;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::*;
use tokio::net::UdpSocket;

const DEADLINE: Duration = Duration::from_secs(10);
/// How long a client waits for the answer to its barrier query before sending it again.
const BARRIER_WAIT: Duration = Duration::from_secs(2);
const BARRIER_TRIES: usize = 3;

/// One answer per second after a burst of 4, every second limited answer slipped; the test's
/// own client (127.0.0.1) and 127.0.2.0/24 exempt.
const RRL: &str = r#"
[dns.rrl]
responses_per_sec = 1
burst_responses = 4
slip = 2
exempt = ["127.0.0.1", "127.0.2.0/24"]
"#;
const BURST: usize = 4;
const RATE_PER_SEC: f64 = 1.0;
const FLOOD: usize = 200;
const GROUP: usize = 20;
const GROUPS: usize = FLOOD / GROUP;

fn query(id: u16, name: &str, qtype: RecordType) -> Vec<u8> {
    let mut msg = Message::new(id, MessageType::Query, OpCode::Query);
    msg.add_query(Query::query(Name::from_ascii(name).expect("test names are valid"), qtype));
    msg.metadata.recursion_desired = true;
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    msg.set_edns(edns);
    msg.to_vec().expect("test queries encode")
}

async fn client(addr: &str) -> anyhow::Result<UdpSocket> {
    Ok(UdpSocket::bind(format!("{addr}:0")).await?)
}

/// Receives one datagram, or `None` after `wait`.
async fn recv(socket: &UdpSocket, wait: Duration) -> anyhow::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; 65_535];
    match tokio::time::timeout(wait, socket.recv(&mut buf)).await {
        Ok(len) => Ok(Some(buf[..len?].to_vec())),
        Err(_) => Ok(None),
    }
}

/// `dnsplan_dns_rrl_total{action}` from `/metrics`.
async fn rrl_total(control: &str, action: &str) -> anyhow::Result<u64> {
    let text = reqwest::get(format!("{control}/metrics")).await?.text().await?;
    let series = format!("dnsplan_dns_rrl_total{{action=\"{action}\"}} ");
    let line = text.lines().find(|l| l.starts_with(&series)).ok_or_else(|| anyhow::anyhow!("no {series} in /metrics:\n{text}"))?;
    Ok(line[series.len()..].trim().parse()?)
}

/// What came back for a flood.
#[derive(Debug, Default)]
struct Tally {
    full: usize,
    slipped: usize,
    bytes_in: usize,
    bytes_out: usize,
}

/// 200 identical queries from 127.0.1.1 in groups of 20, each group followed by a barrier:
/// a query for a name of its own (its own bucket), from the same socket, whose answer comes
/// after every answer to the group (one socket's datagrams are answered in order). So every
/// answer the flood gets is read before the next group, and nothing is lost to a full buffer.
/// Nothing waits on time except the barrier, which is sent again if it got no answer (if it
/// shared the flood's bucket it may be dropped).
async fn flood(server: SocketAddr) -> anyhow::Result<Tally> {
    let socket = client("127.0.1.1").await?;
    let mut tally = Tally::default();
    for g in 0..GROUPS {
        for j in 0..GROUP {
            let q = query((g * GROUP + j) as u16, "api.example.test.", RecordType::A);
            tally.bytes_in += q.len();
            socket.send_to(&q, server).await?;
        }
        let barrier_id = 0xf000 + g as u16;
        let barrier = query(barrier_id, &format!("b{g}.example.test."), RecordType::A);
        let mut barrier_answered = false;
        for _ in 0..BARRIER_TRIES {
            socket.send_to(&barrier, server).await?;
            // Every datagram read here is an answer to the group or the barrier; at most
            // GROUP + BARRIER_TRIES of them.
            for _ in 0..GROUP + BARRIER_TRIES {
                let Some(answer) = recv(&socket, BARRIER_WAIT).await? else { break };
                let m = Message::from_vec(&answer)?;
                if m.metadata.id == barrier_id {
                    barrier_answered = true;
                    break;
                }
                anyhow::ensure!(usize::from(m.metadata.id) < FLOOD, "an answer to a query not sent: {m:?}");
                tally.bytes_out += answer.len();
                if m.metadata.truncation {
                    anyhow::ensure!(m.answers.is_empty() && m.queries.len() == 1, "a slip carries the question only: {m:?}");
                    anyhow::ensure!(m.edns.is_some(), "a slip keeps the OPT record of an EDNS query");
                    anyhow::ensure!(m.metadata.authoritative && m.metadata.response_code == ResponseCode::NoError);
                    tally.slipped += 1;
                } else {
                    anyhow::ensure!(m.answers.len() == 2, "a full answer: {m:?}");
                    tally.full += 1;
                }
            }
            if barrier_answered {
                break;
            }
        }
        anyhow::ensure!(barrier_answered, "group {g}: the barrier got no answer in {BARRIER_TRIES} tries");
    }
    Ok(tally)
}

/// 200 identical queries at loopback speed from one /24, limited to 1/s after a burst of 4
/// with slip 2: 4 (plus one a second) are answered, of the rest every second one is sent
/// truncated (exactly: the server's counters and what the client got agree) and the others
/// dropped; the bytes that come back are fewer than those sent (without the limiter each
/// answer is 1.8 times its query). Meanwhile an exempt prefix and other prefixes get full
/// answers.
///
/// Without the limiter (`udp::Batch::once` never asking `rrl`) all 200 were answered in full
/// and nothing slipped, so the first assertion failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_prefix_is_cut_to_the_rate_and_slips() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start_with(dir.path(), 8, RRL).await?;
    let two = endpoint(30, vec![target("10.0.0.1", "a", 1), target("10.0.0.2", "b", 1)]);
    let mut names = vec![("api.example.test.".to_string(), two.clone())];
    names.extend((0..GROUPS).map(|g| (format!("b{g}.example.test."), two.clone())));
    let entries: Vec<(&str, _)> = names.iter().map(|(n, e)| (n.as_str(), e.clone())).collect();
    publish_and_apply(&auth.store, &plan(1, &entries)).await?;
    for (name, _) in &names {
        until(auth.dns, name, RecordType::A, DEADLINE, |m| !m.answers.is_empty()).await?;
    }

    let started = Instant::now();
    let tally = flood(auth.dns).await?;
    let elapsed_secs = started.elapsed().as_secs_f64();

    let refilled = (elapsed_secs * RATE_PER_SEC).ceil() as usize;
    assert!(
        (BURST..=BURST + refilled).contains(&tally.full),
        "{} of {FLOOD} answered in full in {elapsed_secs:.2} s; want the burst of {BURST} plus at most {refilled}: {tally:?}",
        tally.full
    );
    let (dropped, slipped) = (rrl_total(&auth.control, "dropped").await?, rrl_total(&auth.control, "slipped").await?);
    let limited = dropped + slipped;
    // Every limited answer came from the flood's bucket (a barrier that shared it would be
    // among them and counted by the same counter, so the proportion holds either way).
    assert!(limited as usize >= FLOOD - tally.full, "limited {limited}, flood {FLOOD}, full {}", tally.full);
    assert_eq!(slipped, limited / 2, "every second limited answer slips: dropped {dropped}, slipped {slipped}");
    assert_eq!(tally.slipped as u64, slipped, "the client got every slip the server counted");
    let amplification = tally.bytes_out as f64 / tally.bytes_in as f64;
    eprintln!("flood of {FLOOD}: {tally:?}, dropped {dropped}, slipped {slipped}, amplification {amplification:.3}");
    assert!(amplification < 1.0, "the flood came back {amplification:.2} times its size: {tally:?}");

    // Other prefixes have buckets of their own (a hash collision with the flooded bucket, 1
    // in 262,144, could limit one; two of three must be answered), and exempt ones none.
    let q = query(1, "api.example.test.", RecordType::A);
    let mut answered = 0;
    for other in ["127.0.3.1", "127.0.4.1", "127.0.5.1"] {
        let socket = client(other).await?;
        socket.send_to(&q, auth.dns).await?;
        let answer = recv(&socket, BARRIER_WAIT).await?.map(|a| Message::from_vec(&a)).transpose()?;
        answered += usize::from(answer.is_some_and(|m| !m.metadata.truncation && m.answers.len() == 2));
    }
    assert!(answered >= 2, "only {answered} of 3 other prefixes were answered in full");
    let exempt = client("127.0.2.1").await?;
    for _ in 0..2 * BURST {
        exempt.send_to(&q, auth.dns).await?;
        let answer = recv(&exempt, BARRIER_WAIT).await?.ok_or_else(|| anyhow::anyhow!("the exempt prefix got no answer"))?;
        let m = Message::from_vec(&answer)?;
        assert!(!m.metadata.truncation && m.answers.len() == 2, "the exempt prefix is answered in full: {m:?}");
    }
    auth.stop().await
}

/// RFC 8482: ANY gets one RRset, over UDP and TCP: at the apex (SOA, NS and TXT) the SOA, at
/// a managed name with both families the A records, at a static name its records. Before,
/// ANY at the apex answered every RRset (4.3 times the query's size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_gets_one_rrset() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    let both = endpoint(30, vec![target("10.0.0.1", "a", 1), target("2001:db8::1", "b", 1)]);
    publish_and_apply(&auth.store, &plan(1, &[("api.example.test.", both)])).await?;
    until(auth.dns, "api.example.test.", RecordType::A, DEADLINE, |m| !m.answers.is_empty()).await?;
    for (name, want) in [
        ("example.test.", RecordType::SOA),
        ("api.example.test.", RecordType::A),
        ("sip.example.test.", RecordType::A),
        ("www.example.test.", RecordType::CNAME),
    ] {
        for tcp in [false, true] {
            let (m, raw) = ask(auth.dns, name, RecordType::ANY, Ask { tcp, ..Ask::default() }).await?;
            assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{name} ANY tcp={tcp}");
            let types: BTreeSet<RecordType> = m.answers.iter().map(|r| r.record_type()).collect();
            assert_eq!(types, [want].into(), "{name} ANY tcp={tcp}: one RRset, {want}: {m:?}");
            assert!(!m.metadata.truncation);
            if name == "example.test." {
                let asked = build_query(name, RecordType::ANY, Ask::default()).len();
                let ratio = raw.len() as f64 / asked as f64;
                assert!(ratio < 3.0, "ANY at the apex: {} bytes for a {asked}-byte query ({ratio:.2} times)", raw.len());
            }
        }
    }
    // NXDOMAIN and REFUSED are as for any other type.
    let (m, _) = ask(auth.dns, "nope.example.test.", RecordType::ANY, Ask::default()).await?;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    auth.stop().await
}
