//! Per-packet problems are counted, never logged (at INFO or above) one line per packet: a
//! client that can make the server write a line per query can fill its disk with spoofed
//! packets. Its own test binary, because it installs a process-wide log subscriber.

mod support;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

const DEADLINE: Duration = Duration::from_secs(10);

/// Keeps every event at INFO or above (target and fields), and enables everything, so that
/// nothing is hidden by a level filter.
#[derive(Clone, Default)]
struct Capture {
    lines: Arc<Mutex<Vec<String>>>,
}

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        if *meta.level() <= Level::INFO {
            let mut fields = Fields(format!("{} {}:", meta.level(), meta.target()));
            event.record(&mut fields);
            self.lines.lock().expect("capture lock").push(fields.0);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// The packet: a query for the apex with an OPT record whose client-subnet option
/// claims 8 bytes and has 5 (50 bytes in all). hickory's decoder wrote a 190-byte WARN line
/// for each one.
fn truncated_client_subnet() -> Vec<u8> {
    let mut p = query_without_edns("example.test.", RecordType::A, 1);
    p.extend_from_slice(&[0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 9]); // OPT, 1232, RDLENGTH 9
    p.extend_from_slice(&[0, 8, 0, 8, 0, 1, 24, 0, 192]); // ECS, length 8, family 1, /24, one byte
    p
}

/// A well-framed client-subnet option with an unknown family.
fn unknown_family_client_subnet() -> Vec<u8> {
    let mut p = query_without_edns("api.example.test.", RecordType::A, 1);
    p.extend_from_slice(&[0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 8]);
    p.extend_from_slice(&[0, 8, 0, 4, 0, 9, 0, 0]);
    p
}

/// An OPT record with the truncated option in the answer section, where hickory
/// decodes it (and warns) before refusing the message.
fn opt_in_the_answer_section() -> Vec<u8> {
    let mut p = truncated_client_subnet();
    p[6..12].copy_from_slice(&[0, 1, 0, 0, 0, 0]);
    p
}

/// The same, claiming a TSIG signature (a TSIG record last, with empty RDATA): it goes to the
/// transfer path, whose TSIG check decodes the message too.
fn signed_opt_in_the_answer_section() -> Vec<u8> {
    let mut p = opt_in_the_answer_section();
    p[10..12].copy_from_slice(&[0, 1]);
    p.extend_from_slice(&[3, b'k', b'e', b'y', 0, 0, 250, 0, 255, 0, 0, 0, 0, 0, 0]);
    p
}

fn query_without_edns(name: &str, qtype: RecordType, additional: u16) -> Vec<u8> {
    let mut msg = Message::new(0x5151, MessageType::Query, OpCode::Query);
    msg.add_query(Query::query(Name::from_ascii(name).expect("name"), qtype));
    let mut p = msg.to_vec().expect("encode");
    p[10..12].copy_from_slice(&additional.to_be_bytes());
    p
}

/// `dnsplan_dns_malformed_total{reason}` from `/metrics`.
async fn malformed(control: &str, reason: &str) -> anyhow::Result<u64> {
    let text = reqwest::get(format!("{control}/metrics")).await?.text().await?;
    let series = format!("dnsplan_dns_malformed_total{{reason=\"{reason}\"}} ");
    let line = text.lines().find(|l| l.starts_with(&series)).ok_or_else(|| anyhow::anyhow!("no {series} in /metrics:\n{text}"))?;
    Ok(line[series.len()..].trim().parse()?)
}

/// Malformed EDNS options (the truncated client subnet, an unknown family) are
/// answered FORMERR and counted as `edns_option`; an OPT record in the answer section is
/// FORMERR and counted as `unparsable`; short packets and responses are dropped and counted,
/// over UDP and TCP (over TCP they were not counted before);
/// and none of it writes a line at INFO or above. Before, the truncated option was answered
/// as if it were absent, hickory logged a WARN line for each packet (this test saw 20 for
/// 20), and nothing was counted. Without the decode running under no subscriber, the OPT
/// record in the answer section still logs a line each. The same packet claiming a TSIG
/// signature (the transfer path, whose TSIG check decodes it too) is answered and counted
/// alike, silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_packets_are_counted_not_logged() -> anyhow::Result<()> {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(capture.clone())?;
    let dir = tempfile::tempdir()?;
    let auth = TestAuthority::start(dir.path(), 8).await?;
    publish_and_apply(&auth.store, &plan(1, &[("api.example.test.", endpoint(20, vec![target("10.9.0.1", "a", 1)]))])).await?;
    until(auth.dns, "api.example.test.", RecordType::A, DEADLINE, |m| !m.answers.is_empty()).await?;
    let logged_before = capture.lines.lock().expect("capture lock").len();

    const ROUNDS: usize = 20;
    let truncated = truncated_client_subnet();
    assert_eq!(truncated.len(), 50, "the issue's 50-byte packet");
    let mut formerr = Vec::new();
    for _ in 0..ROUNDS {
        for packet in [truncated.clone(), unknown_family_client_subnet(), opt_in_the_answer_section(), signed_opt_in_the_answer_section()] {
            let reply = exchange_udp(auth.dns, &packet, Duration::from_secs(2)).await?.expect("an answer");
            formerr.push((packet.len(), reply));
        }
        let mut response = build_query("api.example.test.", RecordType::A, Ask::default());
        response[2] |= 0x80;
        for dropped in [&response[..], &[0u8; 11][..]] {
            assert!(exchange_udp(auth.dns, dropped, Duration::from_millis(100)).await?.is_none(), "dropped");
        }
    }
    // A good query after the bad ones from the same address; once it is answered, the
    // others were read (the dropped ones perhaps by another socket's loop: their counts are
    // waited for below).
    let (m, _) = ask(auth.dns, "api.example.test.", RecordType::A, Ask::default()).await?;
    assert_eq!(m.answers.len(), 1);
    // Over TCP: a response and a short packet on one connection, then a query. The connection
    // reads in order, so once the query is answered the two before it were counted.
    let mut tcp = tokio::net::TcpStream::connect(auth.dns).await?;
    let mut response = build_query("api.example.test.", RecordType::A, Ask::default());
    response[2] |= 0x80;
    let query = build_query("api.example.test.", RecordType::A, Ask::default());
    for packet in [&response[..], &[0u8; 11][..], &query[..]] {
        tcp.write_all(&(packet.len() as u16).to_be_bytes()).await?;
        tcp.write_all(packet).await?;
    }
    let len = tcp.read_u16().await?;
    let mut reply = vec![0; usize::from(len)];
    tcp.read_exact(&mut reply).await?;
    assert_eq!(Message::from_vec(&reply)?.answers.len(), 1, "the query after the dropped ones is answered over TCP");

    let lines = capture.lines.lock().expect("capture lock")[logged_before..].to_vec();
    assert!(lines.is_empty(), "{} lines logged for bad packets, the first: {:?}", lines.len(), lines.first());
    for (asked, reply) in &formerr {
        let m = Message::from_vec(reply)?;
        assert_eq!((m.metadata.id, m.metadata.response_code), (0x5151, ResponseCode::FormErr), "a malformed option: FORMERR");
        assert!(reply.len() <= *asked, "a FORMERR is no bigger than its query");
    }
    let counted = Instant::now();
    let rounds = ROUNDS as u64;
    for (reason, want) in [("edns_option", 2 * rounds), ("unparsable", 2 * rounds), ("response", rounds + 1), ("short", rounds + 1)] {
        // The dropped packets are counted when the server reads them, which may be after
        // the client gave up waiting: wait for the count, with a deadline.
        loop {
            let got = malformed(&auth.control, reason).await?;
            if got == want {
                break;
            }
            assert!(got < want && counted.elapsed() < DEADLINE, "dnsplan_dns_malformed_total{{reason={reason:?}}}: {got}, want {want}");
            tokio::task::yield_now().await;
        }
    }
    auth.stop().await
}
