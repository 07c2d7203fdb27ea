//! The UDP fast path against the reference path: for every query the fast path answers, the
//! answer must say what `answer::respond` says (same header, question, authority, additional
//! section, EDNS, and the same answer records up to the order weighted sampling chooses) in
//! the same number of bytes, so both compress names alike (as NSD does: `tests/answer_size.rs`).
//! The cases include NXDOMAIN and NODATA (the SOA's names compressed against questions in any
//! case) and the apex NS answer with glue, also with more glue than fits the client's size.
//! Also: it takes the common queries (it is not always falling back), it never panics on
//! mutated packets, and an incremental snapshot answers like one built from scratch.

use dnsplan_authority::query::answer::{AnswerLimits, Transport, respond};
use dnsplan_authority::query::fast::{Fast, respond_fast};
use dnsplan_authority::zone::dns_zone::StaticZone;
use dnsplan_authority::zone::snapshot::Snapshot;
use dnsplan_common::store::{ActiveDelta, ActiveRecord, ActiveSnapshot, ActiveState};
use dnsplan_common::{DnsName, Endpoint, Generation, Target, ZoneId};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, Record, RecordType};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::sync::{Arc, LazyLock};

/// Besides the config's `ns1.example.test.`: an in-zone name server with glue, and two out of
/// the zone (no glue), the second of which compresses against the first.
const ZONE_FILE: &str = "\
www   300 IN CNAME api
c1    300 IN CNAME c2
c2    300 IN CNAME www
gone  300 IN CNAME missing
bare  300 IN CNAME txt
loop1 300 IN CNAME loop2
loop2 300 IN CNAME loop1
out   300 IN CNAME example.org.
txt   300 IN TXT \"hello\"
mixed 300 IN TXT \"static beside managed\"
a.b.c 300 IN A 192.0.2.9
@     3600 IN NS ns2
@     3600 IN NS a.ns.other.net.
@     3600 IN NS b.ns.other.net.
ns1   3600 IN A 192.0.2.1
ns1   3600 IN AAAA 2001:db8::53
ns2   3600 IN A 192.0.2.2
ns2   3600 IN A 192.0.2.3
ns2   3600 IN AAAA 2001:db8::54
";

fn zone() -> Arc<StaticZone> {
    zone_from(ZONE_FILE)
}

fn zone_from(zone_file: &str) -> Arc<StaticZone> {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("zone.db"), zone_file).expect("write zone");
    let config = dnsplan_tests::stack::dns_zone_config(Some("zone.db"));
    Arc::new(StaticZone::load(&config, dir.path()).expect("zone"))
}

/// Thirteen more in-zone name servers (`ns03`..`ns15`) with an A and an AAAA each: the apex
/// NS answer's glue does not all fit 512 bytes, nor most EDNS sizes below 1232.
fn many_servers_zone() -> Arc<StaticZone> {
    let mut text = String::new();
    for i in 3..=15 {
        text.push_str(&format!("@ 3600 IN NS ns{i:02}\nns{i:02} 3600 IN A 192.0.2.{i}\nns{i:02} 3600 IN AAAA 2001:db8::{i}\n"));
    }
    zone_from(&text)
}

fn serving(targets: &[(&str, u32)]) -> ActiveRecord {
    let zone = ZoneId::parse("a").expect("zone");
    let targets = targets.iter().map(|(a, w)| Target { address: a.parse().expect("address"), zone: zone.clone(), weight: *w }).collect();
    ActiveRecord { generation: Generation(1), state: ActiveState::Serving(Endpoint { ttl_secs: 30, targets }) }
}

fn active() -> ActiveSnapshot {
    let mut active = ActiveSnapshot { applied_changes: 7, ..ActiveSnapshot::default() };
    let many: Vec<String> = (1..=12).map(|i| format!("10.0.1.{i}")).collect();
    let many: Vec<(&str, u32)> = many.iter().map(|a| (a.as_str(), 1)).collect();
    for (name, record) in [
        ("api.example.test.", serving(&[("10.0.0.1", 1), ("10.0.0.2", 1), ("2001:db8::1", 1)])),
        ("one.example.test.", serving(&[("10.0.0.3", 5)])),
        ("weighted.example.test.", serving(&[("10.0.0.4", 1), ("10.0.0.5", 9), ("10.0.0.6", 0)])),
        ("zero.example.test.", serving(&[("10.0.0.7", 0), ("10.0.0.8", 0)])),
        ("v6only.example.test.", serving(&[("2001:db8::2", 1)])),
        ("many.example.test.", serving(&many)),
        ("mixed.example.test.", serving(&[("10.0.0.9", 1)])),
        ("deep.x.y.example.test.", serving(&[("10.0.0.10", 1)])),
    ] {
        active.endpoints.insert(DnsName::parse(name).expect("name"), record);
    }
    active
}

static SNAPSHOT: LazyLock<Snapshot> = LazyLock::new(|| Snapshot::build(zone(), &active()));
/// The same zone and endpoints, signed (`[dns_zone.dnssec]`, ECDSA P-256).
static SIGNED: LazyLock<Snapshot> = LazyLock::new(|| {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("zone.db"), ZONE_FILE).expect("write zone");
    dnsplan_common::dnssec::ZoneKey::create(&dir.path().join("zone.key"), dnsplan_common::dnssec::ZoneAlgorithm::EcdsaP256Sha256)
        .expect("key");
    let mut config = dnsplan_tests::stack::dns_zone_config(Some("zone.db"));
    config.dnssec = Some(dnsplan_authority::zone::dns_zone::DnssecConfig::with_key_file("zone.key"));
    Snapshot::build(Arc::new(StaticZone::load(&config, dir.path()).expect("zone")), &active())
});
static MANY_SERVERS: LazyLock<Snapshot> = LazyLock::new(|| Snapshot::build(many_servers_zone(), &active()));

const NAMES: &[&str] = &[
    "api.example.test.",
    "API.Example.TEST.",
    "one.example.test.",
    "weighted.example.test.",
    "zero.example.test.",
    "v6only.example.test.",
    "many.example.test.",
    "mixed.example.test.",
    "deep.x.y.example.test.",
    "x.y.example.test.",
    "y.example.test.",
    "b.c.example.test.",
    "a.b.c.example.test.",
    "www.example.test.",
    "c1.example.test.",
    "gone.example.test.",
    "bare.example.test.",
    "loop1.example.test.",
    "out.example.test.",
    "txt.example.test.",
    "example.test.",
    "EXAMPLE.test.",
    "eXaMpLe.TeSt.",
    "ns1.example.test.",
    "x.ns1.example.test.",
    "X.Ns2.Example.Test.",
    "hostmaster.example.test.",
    "nope.example.test.",
    "NoPe.ExAmPlE.tEsT.",
    "deep.nope.example.test.",
    "example.org.",
    "test.",
    "xexample.test.",
];
const TYPES: &[RecordType] = &[
    RecordType::A,
    RecordType::AAAA,
    RecordType::TXT,
    RecordType::MX,
    RecordType::ANY,
    RecordType::SOA,
    RecordType::NS,
    RecordType::CNAME,
    RecordType::AXFR,
    RecordType::HTTPS,
];

fn query(id: u16, name: &str, qtype: RecordType, class: DNSClass, edns: Option<u16>, rd: bool, cd: bool) -> Vec<u8> {
    query_do(id, name, qtype, class, edns, rd, cd, false)
}

/// `query` with the DO bit (RFC 3225) set as `dnssec_ok` when there is EDNS.
#[allow(clippy::too_many_arguments)]
fn query_do(id: u16, name: &str, qtype: RecordType, class: DNSClass, edns: Option<u16>, rd: bool, cd: bool, dnssec_ok: bool) -> Vec<u8> {
    let mut msg = Message::new(id, MessageType::Query, OpCode::Query);
    let mut q = Query::query(Name::from_ascii(name).expect("name"), qtype);
    q.set_query_class(class);
    msg.add_query(q);
    msg.metadata.recursion_desired = rd;
    msg.metadata.checking_disabled = cd;
    if let Some(size) = edns {
        let mut e = Edns::new();
        e.set_max_payload(size).set_dnssec_ok(dnssec_ok);
        msg.set_edns(e);
    }
    msg.to_vec().expect("encode")
}

fn sorted(records: &[Record]) -> Vec<String> {
    let mut out: Vec<String> = records.iter().map(|r| r.to_string()).collect();
    out.sort();
    out
}

/// Runs both paths on `packet`; returns whether the fast path answered. Whichever answers,
/// an OPT record in the answer carries the query's DO bit (RFC 3225).
fn compare(packet: &[u8], snapshot: &Snapshot, limits: &AnswerLimits) -> Result<bool, TestCaseError> {
    let mut rng = SmallRng::seed_from_u64(7);
    let mut out = Vec::new();
    let fast = respond_fast(packet, snapshot, limits, &mut rng, &mut out);
    let slow = respond(packet, snapshot, Transport::Udp, limits, &mut rng);
    let asked_do = Message::from_vec(packet).ok().and_then(|m| m.edns).map(|e| e.flags().dnssec_ok);
    if let (Some(asked_do), Some((bytes, _))) = (asked_do, &slow) {
        let s = Message::from_vec(bytes).expect("reference answer parses");
        if let Some(edns) = &s.edns {
            prop_assert_eq!(edns.flags().dnssec_ok, asked_do, "the reference answer's DO bit");
        }
    }
    match fast {
        Fast::Slow => Ok(false),
        Fast::Drop => {
            prop_assert!(slow.is_none(), "fast path dropped what the reference answers");
            Ok(false)
        }
        Fast::Answered(outcome) => {
            let (slow_bytes, slow_outcome) = slow.ok_or_else(|| TestCaseError::fail("fast path answered what the reference drops"))?;
            let f = Message::from_vec(&out).map_err(|e| TestCaseError::fail(format!("fast answer does not parse: {e}")))?;
            let s = Message::from_vec(&slow_bytes).expect("reference answer parses");
            prop_assert_eq!(outcome.rcode, slow_outcome.rcode);
            prop_assert_eq!(outcome.qtype, slow_outcome.qtype);
            prop_assert_eq!(outcome.bytes, out.len());
            prop_assert_eq!(&f.metadata, &s.metadata, "header");
            prop_assert_eq!(&f.queries, &s.queries, "question");
            prop_assert_eq!(&f.authorities, &s.authorities, "authority");
            prop_assert_eq!(sorted(&f.additionals), sorted(&s.additionals), "additional");
            prop_assert_eq!(&f.edns, &s.edns, "EDNS");
            prop_assert_eq!(out.len(), slow_bytes.len(), "size: both compress names alike");
            prop_assert_eq!(f.answers.len(), s.answers.len(), "answer count");
            let name_all_fit = f.answers.len() < limits.answer_addresses_max;
            if name_all_fit {
                prop_assert_eq!(sorted(&f.answers), sorted(&s.answers), "answers");
            }
            prop_assert!(out.len() <= 1232);
            Ok(true)
        }
    }
}

fn limits() -> AnswerLimits {
    AnswerLimits { edns_udp_payload_bytes: 1232, answer_addresses_max: 8 }
}

#[test]
fn fast_path_answers_like_the_reference() -> Result<(), TestCaseError> {
    let mut fast = 0;
    let mut total = 0;
    for (i, name) in NAMES.iter().enumerate() {
        for qtype in TYPES {
            for (edns, dnssec_ok) in [(None, false), (Some(512), false), (Some(4096), false), (Some(1232), true), (Some(512), true)] {
                for (rd, cd) in [(false, false), (true, true)] {
                    let packet = query_do(i as u16, name, *qtype, DNSClass::IN, edns, rd, cd, dnssec_ok);
                    fast += usize::from(compare(&packet, &SNAPSHOT, &limits())?);
                    total += 1;
                }
            }
        }
        let chaos = query(1, name, RecordType::TXT, DNSClass::CH, None, false, false);
        prop_assert!(!compare(&chaos, &SNAPSHOT, &limits())?, "class CH must take the reference path");
    }
    // The common queries take the fast path: A/AAAA at managed and static names, NXDOMAIN,
    // NODATA, the apex NS.
    for (name, qtype) in [
        ("api.example.test.", RecordType::A),
        ("API.Example.TEST.", RecordType::AAAA),
        ("v6only.example.test.", RecordType::A),
        ("nope.example.test.", RecordType::A),
        ("NoPe.ExAmPlE.tEsT.", RecordType::A),
        ("x.ns1.example.test.", RecordType::A),
        ("x.y.example.test.", RecordType::A),
        ("one.example.test.", RecordType::MX),
        ("example.test.", RecordType::NS),
        ("eXaMpLe.TeSt.", RecordType::NS),
        // Static addresses and NODATA at a static name (a static zone's hosts).
        ("ns1.example.test.", RecordType::A),
        ("Ns1.example.test.", RecordType::AAAA),
        ("a.b.c.example.test.", RecordType::A),
        ("txt.example.test.", RecordType::AAAA),
    ] {
        let packet = query(9, name, qtype, DNSClass::IN, Some(1232), true, false);
        prop_assert!(compare(&packet, &SNAPSHOT, &limits())?, "{} {} should take the fast path", name, qtype);
    }
    for (name, qtype) in [("www.example.test.", RecordType::A), ("example.org.", RecordType::A), ("api.example.test.", RecordType::ANY)] {
        let packet = query(9, name, qtype, DNSClass::IN, Some(1232), true, false);
        prop_assert!(!compare(&packet, &SNAPSHOT, &limits())?, "{} {} must take the reference path", name, qtype);
    }
    prop_assert!(fast * 3 > total, "only {} of {} queries took the fast path", fast, total);
    Ok(())
}

/// A signed zone: with DO=1 the fast path answers a name's addresses with their RRSIG (a
/// managed name's whole RRset, the one signed), as the reference path does, in as many bytes;
/// everything else with DO=1 (denial proofs above all) goes to the reference path; without
/// DO the answers are an unsigned zone's.
///
/// Teeth, checked once: with the fast path writing no RRSIG (its header still counting it),
/// both tests failed: the fast answer did not parse.
#[test]
fn a_signed_zone_answers_alike_on_both_paths() -> Result<(), TestCaseError> {
    prop_assert!(SIGNED.is_signed());
    for (i, name) in NAMES.iter().enumerate() {
        for qtype in TYPES {
            for (edns, dnssec_ok) in [(None, false), (Some(1232), false), (Some(1232), true), (Some(512), true), (Some(4096), true)] {
                let packet = query_do(i as u16, name, *qtype, DNSClass::IN, edns, true, false, dnssec_ok);
                compare(&packet, &SIGNED, &limits())?;
            }
        }
    }
    for (name, qtype) in [
        ("api.example.test.", RecordType::A),
        ("API.Example.TEST.", RecordType::AAAA),
        ("weighted.example.test.", RecordType::A),
        ("many.example.test.", RecordType::A),
        ("ns1.example.test.", RecordType::A),
    ] {
        let packet = query_do(9, name, qtype, DNSClass::IN, Some(1232), true, false, true);
        prop_assert!(compare(&packet, &SIGNED, &limits())?, "{} {} with DO should take the fast path", name, qtype);
        let mut rng = SmallRng::seed_from_u64(3);
        let mut out = Vec::new();
        respond_fast(&packet, &SIGNED, &limits(), &mut rng, &mut out);
        let answer = Message::from_vec(&out).expect("parses");
        prop_assert!(answer.answers.iter().any(|r| r.record_type() == RecordType::RRSIG), "{} {}: an RRSIG", name, qtype);
        if name.starts_with("many") {
            prop_assert_eq!(answer.answers.len(), 13, "the whole RRset of 12 and its RRSIG");
        }
    }
    let nx = query_do(9, "nope.example.test.", RecordType::A, DNSClass::IN, Some(1232), true, false, true);
    prop_assert!(!compare(&nx, &SIGNED, &limits())?, "NXDOMAIN with DO takes the reference path (its proofs)");
    Ok(())
}

/// RFC 3225: the answer's OPT record carries the query's DO bit, set or clear, on the fast
/// path (an answer, NXDOMAIN, NODATA) and the reference path (a static record, REFUSED).
#[test]
fn the_do_bit_is_copied() {
    for (name, qtype, fast_path) in [
        ("api.example.test.", RecordType::A, true),
        ("nope.example.test.", RecordType::A, true),
        ("one.example.test.", RecordType::MX, true),
        ("txt.example.test.", RecordType::TXT, false),
        ("example.org.", RecordType::A, false),
    ] {
        for dnssec_ok in [false, true] {
            let packet = query_do(5, name, qtype, DNSClass::IN, Some(1232), true, false, dnssec_ok);
            let mut rng = SmallRng::seed_from_u64(5);
            let mut out = Vec::new();
            let fast = respond_fast(&packet, &SNAPSHOT, &limits(), &mut rng, &mut out);
            assert_eq!(matches!(fast, Fast::Answered(_)), fast_path, "{name} {qtype}: which path");
            if fast_path {
                let answer = Message::from_vec(&out).expect("fast answer parses");
                let got = answer.edns.as_ref().map(|e| e.flags().dnssec_ok);
                assert_eq!(got, Some(dnssec_ok), "{name} {qtype}: the fast path's DO bit");
            }
            let (bytes, _) = respond(&packet, &SNAPSHOT, Transport::Udp, &limits(), &mut rng).expect("the reference answers");
            let answer = Message::from_vec(&bytes).expect("reference answer parses");
            let got = answer.edns.as_ref().map(|e| e.flags().dnssec_ok);
            assert_eq!(got, Some(dnssec_ok), "{name} {qtype}: the reference path's DO bit");
        }
    }
}

/// `query` with EDNS and `options` as the OPT record's RDATA.
fn with_options(name: &str, qtype: RecordType, options: &[u8]) -> Vec<u8> {
    let mut packet = query(0x77, name, qtype, DNSClass::IN, Some(1232), true, false);
    let rdlen_at = packet.len() - 2;
    assert_eq!(&packet[rdlen_at..], &[0, 0], "hickory writes an OPT record without options last");
    packet[rdlen_at..].copy_from_slice(&(options.len() as u16).to_be_bytes());
    packet.extend_from_slice(options);
    packet
}

/// EDNS options: a cookie and well-formed client subnets take the fast path and answer as
/// the reference does (which ignores them); options that do not frame and malformed client
/// subnets (RFC 7871 §6) leave the fast path, and the reference answers FORMERR.
#[test]
fn edns_options_agree() -> Result<(), TestCaseError> {
    let cookie = [0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8];
    for (options, fast_path) in [
        (&cookie[..], true),
        (&[0, 8, 0, 7, 0, 1, 24, 0, 192, 0, 2][..], true),
        (&[0, 8, 0, 4, 0, 2, 0, 0][..], true),
        (&[&cookie[..], &[0, 8, 0, 6, 0, 1, 16, 0, 10, 1][..]].concat()[..], true),
        (&[0, 8, 0, 8, 0, 1, 24, 0, 192][..], false),           // claims more than it has
        (&[0, 8, 0, 6, 0, 1, 24, 0, 192, 0][..], false),        // address cut short
        (&[0, 8, 0, 8, 0, 1, 24, 0, 192, 0, 2, 1][..], false),  // too many address bytes
        (&[0, 8, 0, 7, 0, 1, 20, 0, 192, 0, 0x21][..], false),  // a bit beyond the prefix
        (&[0, 8, 0, 4, 0, 7, 0, 0][..], false),                 // an unknown family
        (&[0, 8, 0, 8, 0, 1, 33, 0, 1, 2, 3, 4, 5][..], false), // a prefix above 32
        (&[0, 10, 0][..], false),                               // half an option header
    ] {
        for (name, qtype) in [("api.example.test.", RecordType::A), ("nope.example.test.", RecordType::A)] {
            let packet = with_options(name, qtype, options);
            prop_assert_eq!(compare(&packet, &SNAPSHOT, &limits())?, fast_path, "{} {} with options {:?}", name, qtype, options);
            if !fast_path {
                let mut rng = SmallRng::seed_from_u64(1);
                let (bytes, outcome) = respond(&packet, &SNAPSHOT, Transport::Udp, &limits(), &mut rng).expect("an answer");
                prop_assert_eq!(outcome.rcode, ResponseCode::FormErr, "options {:?}", options);
                prop_assert_eq!(outcome.malformed, Some(dnsplan_authority::query::answer::Malformed::EdnsOption));
                prop_assert_eq!(bytes.len(), 12, "FORMERR is the header alone");
            }
        }
    }
    Ok(())
}

/// The fast path's answer to `packet` on `snapshot`, parsed, or `None` if it fell back.
fn fast_answer(packet: &[u8], snapshot: &Snapshot) -> Option<Message> {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut out = Vec::new();
    match respond_fast(packet, snapshot, &limits(), &mut rng, &mut out) {
        Fast::Answered(_) => Some(Message::from_vec(&out).expect("fast answer parses")),
        _ => None,
    }
}

/// The apex NS answer carries the in-zone name servers' A and AAAA records as glue, A before
/// AAAA (NSD's order), and nothing for the servers outside the zone.
#[test]
fn apex_ns_carries_glue() {
    let packet = query(4, "Example.TEST.", RecordType::NS, DNSClass::IN, Some(1232), false, false);
    let answer = fast_answer(&packet, &SNAPSHOT).expect("the fast path answers the apex NS");
    let servers: Vec<String> = answer.answers.iter().map(|r| r.data.to_string().to_ascii_lowercase()).collect();
    let mut sorted_servers = servers.clone();
    sorted_servers.sort();
    assert_eq!(sorted_servers, ["a.ns.other.net.", "b.ns.other.net.", "ns1.example.test.", "ns2.example.test."]);
    let glue: Vec<(String, String)> =
        answer.additionals.iter().map(|r| (r.name.to_string().to_ascii_lowercase(), r.data.to_string())).collect();
    let mut want = Vec::new();
    for family in ["A", "AAAA"] {
        for server in servers.iter().filter(|s| s.ends_with(".example.test.")) {
            let addresses: &[&str] = match (server.as_str(), family) {
                ("ns1.example.test.", "A") => &["192.0.2.1"],
                ("ns1.example.test.", _) => &["2001:db8::53"],
                (_, "A") => &["192.0.2.2", "192.0.2.3"],
                _ => &["2001:db8::54"],
            };
            want.extend(addresses.iter().map(|a| (server.clone(), a.to_string())));
        }
    }
    assert_eq!(glue, want, "glue: every in-zone server's A, then every one's AAAA");
    assert!(!answer.metadata.truncation);
}

/// With more glue than fits, whole RRsets are left out from the end (AAAA first), without TC
/// (RFC 2181 §9), and the answer still fits; the reference path leaves out the same ones.
#[test]
fn glue_that_does_not_fit_is_left_out() -> Result<(), TestCaseError> {
    let mut previous = 0;
    for edns in std::iter::once(None).chain((512..=1232).step_by(8).map(Some)) {
        let packet = query(6, "example.test.", RecordType::NS, DNSClass::IN, edns, false, false);
        prop_assert!(compare(&packet, &MANY_SERVERS, &limits())?, "apex NS with EDNS {:?} takes the fast path", edns);
        let answer = fast_answer(&packet, &MANY_SERVERS).expect("answered");
        let limit = usize::from(edns.unwrap_or(512));
        prop_assert!(answer.to_vec().expect("encode").len() <= limit);
        prop_assert!(!answer.metadata.truncation, "no TC for glue left out (EDNS {:?})", edns);
        prop_assert_eq!(answer.answers.len(), 14);
        let glue = &answer.additionals;
        if edns.is_some() {
            prop_assert!(glue.len() >= previous, "more room, no less glue (EDNS {:?})", edns);
            previous = glue.len();
        }
        let first_aaaa = glue.iter().position(|r| r.record_type() == RecordType::AAAA).unwrap_or(glue.len());
        prop_assert!(glue[first_aaaa..].iter().all(|r| r.record_type() == RecordType::AAAA), "A glue before AAAA glue");
        if edns.is_none() {
            prop_assert_eq!((first_aaaa, glue.len()), (13, 13), "512 bytes: every server's A, no AAAA");
        }
    }
    prop_assert_eq!(previous, 26, "1232 bytes: all the glue");
    Ok(())
}

/// While an in-zone name server is a managed endpoint, its glue is the plan's addresses: the
/// precompiled answer is not used, and the reference path's glue samples the plan.
#[test]
fn a_managed_name_server_gets_the_plans_glue() {
    let mut state = active();
    state.endpoints.insert(DnsName::parse("ns1.example.test.").expect("name"), serving(&[("10.9.9.9", 1)]));
    let snapshot = Snapshot::build(zone(), &state);
    let packet = query(8, "example.test.", RecordType::NS, DNSClass::IN, Some(1232), false, false);
    assert!(fast_answer(&packet, &snapshot).is_none(), "the precompiled glue would be the static address");
    let mut rng = SmallRng::seed_from_u64(8);
    let (bytes, _) = respond(&packet, &snapshot, Transport::Udp, &limits(), &mut rng).expect("answered");
    let answer = Message::from_vec(&bytes).expect("parses");
    let ns1: Vec<String> =
        answer.additionals.iter().filter(|r| r.name.to_string() == "ns1.example.test.").map(|r| r.data.to_string()).collect();
    assert_eq!(ns1, ["10.9.9.9"], "managed addresses replace the static A and AAAA");
    // Retired again: the precompiled answer is back.
    let mut delta = ActiveDelta { applied_changes: state.applied_changes + 1, full: false, ..ActiveDelta::default() };
    delta.endpoints.insert(
        DnsName::parse("ns1.example.test.").expect("name"),
        ActiveRecord { generation: Generation(2), state: ActiveState::Retired },
    );
    assert!(fast_answer(&packet, &snapshot.apply(&delta)).is_some());
}

#[test]
fn weighted_choices_follow_the_weights() {
    // weighted: 10.0.0.4 weight 1, 10.0.0.5 weight 9, 10.0.0.6 weight 0 (never while others weigh).
    let limits = AnswerLimits { edns_udp_payload_bytes: 1232, answer_addresses_max: 1 };
    let packet = query(1, "weighted.example.test.", RecordType::A, DNSClass::IN, None, false, false);
    let mut rng = SmallRng::seed_from_u64(11);
    let mut out = Vec::new();
    let mut heavy = 0;
    const ROUNDS: usize = 4_000;
    for _ in 0..ROUNDS {
        assert!(matches!(respond_fast(&packet, &SNAPSHOT, &limits, &mut rng, &mut out), Fast::Answered(_)));
        let answer = Message::from_vec(&out).expect("parses");
        assert_eq!(answer.answers.len(), 1);
        let address = answer.answers[0].data.to_string();
        assert_ne!(address, "10.0.0.6", "a zero-weight target was served beside weighted ones");
        heavy += usize::from(address == "10.0.0.5");
    }
    let share = heavy as f64 / ROUNDS as f64;
    assert!((0.86..0.94).contains(&share), "weight 9 of 10 got {share:.3} of the answers");
}

#[test]
fn incremental_snapshots_answer_like_full_builds() -> Result<(), TestCaseError> {
    let zone = zone();
    let mut state = active();
    let mut snapshot = Snapshot::build(zone.clone(), &state);
    let steps: Vec<Vec<(&str, Option<ActiveRecord>)>> = vec![
        vec![("new.deeper.example.test.", Some(serving(&[("10.9.0.1", 1)]))), ("api.example.test.", Some(serving(&[("10.9.0.2", 1)])))],
        vec![("deep.x.y.example.test.", None)],
        vec![("new.deeper.example.test.", None), ("mixed.example.test.", None)],
        vec![("deep.x.y.example.test.", Some(serving(&[("10.9.0.3", 1)])))],
    ];
    for (step, changes) in steps.into_iter().enumerate() {
        let mut delta =
            ActiveDelta { applied_changes: state.applied_changes + changes.len() as u64, full: false, ..ActiveDelta::default() };
        for (name, record) in changes {
            let record = record.unwrap_or(ActiveRecord { generation: Generation(2), state: ActiveState::Retired });
            state.endpoints.insert(DnsName::parse(name).expect("name"), record.clone());
            delta.endpoints.insert(DnsName::parse(name).expect("name"), record);
        }
        state.applied_changes = delta.applied_changes;
        snapshot = snapshot.apply(&delta);
        let fresh = Snapshot::build(zone.clone(), &state);
        prop_assert_eq!(snapshot.managed_count(), fresh.managed_count(), "step {}", step);
        for name in NAMES.iter().chain(&["new.deeper.example.test.", "deeper.example.test."]) {
            for qtype in [RecordType::A, RecordType::TXT, RecordType::SOA] {
                let packet = query(3, name, qtype, DNSClass::IN, Some(1232), false, false);
                let mut rng = SmallRng::seed_from_u64(3);
                let a = respond(&packet, &snapshot, Transport::Udp, &limits(), &mut rng).map(|(b, _)| b);
                let mut rng = SmallRng::seed_from_u64(3);
                let b = respond(&packet, &fresh, Transport::Udp, &limits(), &mut rng).map(|(b, _)| b);
                prop_assert_eq!(a, b, "step {}: {} {} differs between incremental and full", step, name, qtype);
            }
        }
    }
    Ok(())
}

/// The first snapshot is read a page at a time. Writes between the pages (to names already
/// read and names not yet read, a new name and a retirement) must not leave it serving a
/// mix of moments: it must equal a fresh build from the store's state when the load ends.
#[tokio::test]
async fn a_paged_load_ends_at_one_moment_of_the_store() -> anyhow::Result<()> {
    use dnsplan_authority::follow::follower::Loader;
    use dnsplan_common::store::{ACTIVE_PAGE_MAX, APPLY_BATCH_MAX, ApplyItem};
    use dnsplan_common::{SledStore, Store};
    use dnsplan_tests::fixtures::{endpoint_for, name, plan, planner};

    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    // Two and a bit pages; names sort as n00000 ... n04195.
    let names: Vec<_> = (0..ACTIVE_PAGE_MAX + 100).map(|i| name(&format!("n{i:05}"))).collect();
    store.publish(&plan(1, &names, planner())).await?;
    let items: Vec<ApplyItem> = names.iter().map(|n| ApplyItem { endpoint: n.clone(), records: endpoint_for(Generation(1)) }).collect();
    for chunk in items.chunks(APPLY_BATCH_MAX) {
        store.apply_many(Generation(1), chunk).await?;
    }

    let mut loader = Loader::new(zone(), None);
    assert!(loader.next_page(&store).await?, "the first page is not the last");
    let (read, unread, fresh) = (&names[10], &names[ACTIVE_PAGE_MAX + 50], name("new"));
    let mut next = names.clone();
    next.push(fresh.clone());
    let mut retiring = plan(2, &next, dnsplan_tests::fixtures::operator()).into_plan();
    for gone in [&names[20], &names[ACTIVE_PAGE_MAX + 60]] {
        retiring.endpoints.remove(gone);
        retiring.retired.insert(gone.clone());
    }
    store.publish(&dnsplan_common::ValidatedPlan::new(retiring)?).await?;
    for n in [read, unread, &fresh] {
        store.apply(n, Generation(2), &endpoint_for(Generation(2))).await?;
    }
    store.retire(&names[20], Generation(2)).await?;
    store.retire(&names[ACTIVE_PAGE_MAX + 60], Generation(2)).await?;
    let loaded = loader.finish(&store).await?;

    let truth = store.active_all().await?;
    let built = Snapshot::build(zone(), &truth);
    assert_eq!(loaded.applied_changes, truth.applied_changes);
    assert_eq!(loaded.managed_count(), built.managed_count());
    assert_eq!(loaded.managed_count(), names.len() + 1 - 2);
    assert_eq!(loaded.generation_range(), built.generation_range());
    for n in next.iter().chain([&names[20]]) {
        let key = dnsplan_authority::zone::snapshot::wire_key(&Name::from_ascii(n.as_str())?);
        let (a, b) = (loaded.get_key(&key).and_then(|e| e.managed.clone()), built.get_key(&key).and_then(|e| e.managed.clone()));
        assert_eq!(a, b, "{n} differs between the paged load and a fresh build");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, ..ProptestConfig::default() })]

    #[test]
    fn random_queries_agree(name in 0usize..NAMES.len(), qtype in 0usize..TYPES.len(), edns in proptest::option::of(0u16..5000), id: u16, rd: bool, cd: bool, dnssec_ok: bool) {
        let packet = query_do(id, NAMES[name], TYPES[qtype], DNSClass::IN, edns, rd, cd, dnssec_ok);
        compare(&packet, &SNAPSHOT, &limits())?;
    }

    #[test]
    fn random_queries_with_many_name_servers_agree(name in 0usize..NAMES.len(), qtype in 0usize..TYPES.len(), edns in proptest::option::of(0u16..5000), id: u16, dnssec_ok: bool) {
        let packet = query_do(id, NAMES[name], TYPES[qtype], DNSClass::IN, edns, true, false, dnssec_ok);
        compare(&packet, &MANY_SERVERS, &limits())?;
    }

    #[test]
    fn mutated_queries_agree_or_fall_back(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4), name in 0usize..NAMES.len()) {
        let mut packet = query(0x4242, NAMES[name], RecordType::A, DNSClass::IN, Some(1232), true, false);
        for (at, xor) in flips {
            let i = at % packet.len();
            packet[i] ^= xor.max(1);
        }
        compare(&packet, &SNAPSHOT, &limits())?;
    }

    #[test]
    fn random_queries_to_a_signed_zone_agree(name in 0usize..NAMES.len(), qtype in 0usize..TYPES.len(), edns in proptest::option::of(0u16..5000), id: u16, dnssec_ok: bool) {
        let packet = query_do(id, NAMES[name], TYPES[qtype], DNSClass::IN, edns, true, false, dnssec_ok);
        compare(&packet, &SIGNED, &limits())?;
    }

    #[test]
    fn random_bytes_never_panic(packet in proptest::collection::vec(any::<u8>(), 0..600)) {
        compare(&packet, &SNAPSHOT, &limits())?;
    }
}

/// In-zone CNAMEs are followed, as RFC 1034 §4.3.2 step 3a asks and NSD does: the chain and
/// the last name's answer; NXDOMAIN when the chain ends at a name that does not exist (RFC
/// 6604 §3) and NODATA when it ends at one without the type, each with the SOA; a loop or a
/// name outside the zone ends the chain at its last CNAME.
///
/// Teeth, checked once: without `follow_cnames`, `c1 A` answered only `c1 CNAME c2` and
/// `gone A` NOERROR.
#[test]
fn in_zone_cnames_are_followed() {
    let mut rng = SmallRng::seed_from_u64(5);
    let ask = |name: &str, qtype: RecordType, rng: &mut SmallRng| {
        let packet = query(7, name, qtype, DNSClass::IN, Some(1232), false, false);
        let (bytes, _) = respond(&packet, &SNAPSHOT, Transport::Udp, &limits(), rng).expect("answered");
        Message::from_vec(&bytes).expect("decodes")
    };
    let chain = |m: &Message| m.answers.iter().map(|r| format!("{} {}", r.name.to_lowercase(), r.record_type())).collect::<Vec<_>>();
    let c1 = ask("c1.example.test.", RecordType::A, &mut rng);
    assert_eq!(c1.metadata.response_code, ResponseCode::NoError);
    assert_eq!(
        chain(&c1),
        ["c1.example.test. CNAME", "c2.example.test. CNAME", "www.example.test. CNAME", "api.example.test. A", "api.example.test. A"],
        "{c1:?}"
    );
    assert!(c1.authorities.is_empty(), "a positive answer has no SOA");
    let gone = ask("gone.example.test.", RecordType::A, &mut rng);
    assert_eq!((gone.metadata.response_code, chain(&gone)), (ResponseCode::NXDomain, vec!["gone.example.test. CNAME".to_string()]));
    assert_eq!(gone.authorities.first().map(|r| r.record_type()), Some(RecordType::SOA));
    let bare = ask("bare.example.test.", RecordType::A, &mut rng);
    assert_eq!((bare.metadata.response_code, chain(&bare)), (ResponseCode::NoError, vec!["bare.example.test. CNAME".to_string()]));
    assert_eq!(bare.authorities.first().map(|r| r.record_type()), Some(RecordType::SOA), "NODATA at the end of the chain");
    let looped = ask("loop1.example.test.", RecordType::A, &mut rng);
    assert_eq!(chain(&looped), ["loop1.example.test. CNAME", "loop2.example.test. CNAME"]);
    let out = ask("out.example.test.", RecordType::A, &mut rng);
    assert_eq!((out.metadata.response_code, chain(&out)), (ResponseCode::NoError, vec!["out.example.test. CNAME".to_string()]));
    // Asked for the CNAME itself: only it.
    assert_eq!(chain(&ask("c1.example.test.", RecordType::CNAME, &mut rng)), ["c1.example.test. CNAME"]);
}
