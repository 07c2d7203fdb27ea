//! The RFC 2136 writer's pure parts: markers and their decisions, the UPDATE messages built (prerequisites,
//! one fence per name, never an empty endpoint), and how errors are described.

use super::*;
use dnsplan_common::plan::Target;
use dnsplan_common::tsig::Algorithm;

fn settings() -> Rfc2136Settings {
    Rfc2136Settings {
        server: SocketAddr::from(([127, 0, 0, 1], 53)),
        dns_zone: DnsName::parse("example.test.").expect("name"),
        key: TsigKey::new("dnsplan.", Algorithm::HmacSha256, vec![7; 32]).expect("key"),
        timeout: Duration::from_secs(1),
        attempts: 1,
        in_flight: IN_FLIGHT_DEFAULT,
        fence: Fence::Prerequisites,
    }
}

fn endpoint(targets: &[(&str, u32)]) -> Endpoint {
    Endpoint {
        ttl_secs: 30,
        targets: targets
            .iter()
            .map(|(a, w)| Target { address: a.parse().expect("address"), zone: "a".parse().expect("zone"), weight: *w })
            .collect(),
    }
}

/// The log line of a target error carries its cause: BADSIG and BADKEY, or a refused
/// connection, read differently. Teeth: the enactor printed `{err:#}`, which for these
/// errors is the outer message alone (the same line for BADSIG and BADKEY).
#[test]
fn an_error_is_described_with_its_cause() {
    let s = settings();
    let tsig = |source| TargetError::Tsig { server: s.server, zone: s.dns_zone.clone(), key: "dnsplan.".into(), source: Box::new(source) };
    let badsig = describe(&tsig(TsigFailure::BadSig { key: "dnsplan.".into() }));
    let badkey = describe(&tsig(TsigFailure::BadKey { key: "dnsplan.".into() }));
    assert!(badsig.contains("BADSIG") && badkey.contains("BADKEY"), "{badsig} / {badkey}");
    let refused = TargetError::Io { server: s.server, source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused) };
    assert!(describe(&refused).contains("connection refused"), "{}", describe(&refused));
    assert_ne!(format!("{:#}", tsig(TsigFailure::BadSig { key: "k".into() })), badsig, "the plain form has no cause");
}

#[test]
fn decisions_follow_the_marker() {
    let g = Generation(5);
    assert_eq!(decide(g, Marker::Absent), Decision::Write { expect: Marker::Absent });
    assert_eq!(decide(g, Marker::At(Generation(4))), Decision::Write { expect: Marker::At(Generation(4)) });
    assert_eq!(decide(g, Marker::At(g)), Decision::Unchanged);
    assert_eq!(decide(g, Marker::At(Generation(6))), Decision::Stale { active: Generation(6) });
}

#[test]
fn markers_are_fixed_width() {
    assert_eq!(marker_text(Generation(42)), "00000000000000000042");
    assert_eq!(marker_text(Generation(u64::MAX)).len(), MARKER_DIGITS);
    assert_eq!(parse_marker(marker_text(Generation(u64::MAX)).as_bytes()), Some(Generation(u64::MAX)));
    for bad in ["42", "0000000000000000004x", "000000000000000000042", "99999999999999999999"] {
        assert_eq!(parse_marker(bad.as_bytes()), None, "{bad}");
    }
}

/// The UPDATE's sections, as text: one prerequisite on the marker, then delete A, AAAA
/// and the marker, add the weighted addresses and the new marker.
#[test]
fn an_update_replaces_the_addresses_and_the_marker_under_a_prerequisite() {
    let name = EndpointName::parse("api.example.test.").expect("name");
    let records = endpoint(&[("192.0.2.1", 1), ("192.0.2.2", 0), ("2001:db8::1", 0)]);
    let show = |m: &Message| {
        let line = |r: &Record| format!("{} {} {} {} {}", r.name, r.ttl, r.dns_class, r.record_type(), r.data);
        let pre: Vec<String> = m.prerequisites().iter().map(line).collect();
        let up: Vec<String> = m.updates().iter().map(line).collect();
        format!("pre: {}\nupdate: {}", pre.join("; "), up.join("; "))
    };
    let first = update_message(&settings(), &name, Generation(3), Some(&records), Marker::Absent).expect("message");
    assert_eq!(
        show(&first),
        "pre: _dnsplan.api.example.test. 0 NONE TXT UPDATE; api._dnsplan-retired.example.test. 0 NONE TXT UPDATE\n\
         update: api.example.test. 0 ANY A UPDATE; api.example.test. 0 ANY AAAA UPDATE; _dnsplan.api.example.test. 0 ANY TXT UPDATE; \
         api._dnsplan-retired.example.test. 0 ANY TXT UPDATE; \
         api.example.test. 30 IN A 192.0.2.1; api.example.test. 30 IN AAAA 2001:db8::1; \
         _dnsplan.api.example.test. 30 IN TXT 00000000000000000003"
    );
    let next = update_message(&settings(), &name, Generation(4), Some(&records), Marker::At(Generation(3))).expect("message");
    assert!(show(&next).starts_with("pre: _dnsplan.api.example.test. 0 IN TXT 00000000000000000003\n"), "{}", show(&next));
    // A retirement: the addresses and the marker go, the tombstone holds the generation.
    let retire = update_message(&settings(), &name, Generation(5), None, Marker::At(Generation(4))).expect("message");
    assert_eq!(
        show(&retire),
        "pre: _dnsplan.api.example.test. 0 IN TXT 00000000000000000004\n\
         update: api.example.test. 0 ANY A UPDATE; api.example.test. 0 ANY AAAA UPDATE; _dnsplan.api.example.test. 0 ANY TXT UPDATE; \
         api._dnsplan-retired.example.test. 0 ANY TXT UPDATE; api._dnsplan-retired.example.test. 1 IN TXT 00000000000000000005"
    );
    // Served again after it: requires the tombstone it read.
    let back = update_message(&settings(), &name, Generation(6), Some(&records), Marker::Retired(Generation(5))).expect("message");
    assert!(show(&back).starts_with("pre: api._dnsplan-retired.example.test. 0 IN TXT 00000000000000000005\n"), "{}", show(&back));
}

/// A message of several names fences each on its own marker: every name's prerequisite is
/// in it. Teeth: with only the first name's, a stale write of the others would go through
/// whenever the first name's marker had not moved.
#[test]
fn a_message_of_several_names_fences_each() {
    let records = endpoint(&[("192.0.2.1", 1)]);
    let group: Vec<(EndpointName, Endpoint, Marker)> = (0..3)
        .map(|i| (EndpointName::parse(&format!("n{i}.example.test.")).expect("name"), records.clone(), Marker::At(Generation(4 + i))))
        .collect();
    let message = group_message(&settings(), Generation(9), &group).expect("message").expect("a message");
    let fenced: Vec<String> = message.prerequisites().iter().map(|r| format!("{} {}", r.name, r.data)).collect();
    assert_eq!(
        fenced,
        [
            "_dnsplan.n0.example.test. 00000000000000000004",
            "_dnsplan.n1.example.test. 00000000000000000005",
            "_dnsplan.n2.example.test. 00000000000000000006"
        ]
    );
    assert_eq!(message.queries.len(), 1, "one zone section");
    assert!(group_message(&settings(), Generation(9), &[]).expect("empty").is_none());
}

/// Never empty: an endpoint without targets is refused before anything is built.
#[test]
fn an_empty_endpoint_is_never_sent() {
    let name = EndpointName::parse("api.example.test.").expect("name");
    let got = update_message(&settings(), &name, Generation(3), Some(&endpoint(&[])), Marker::Absent);
    assert!(matches!(got, Err(TargetError::Invalid(ValidationError::EmptyEndpoint { .. }))), "{got:?}");
    let outside = EndpointName::parse("api.other.test.").expect("name");
    let got = update_message(&settings(), &outside, Generation(3), Some(&endpoint(&[("192.0.2.1", 1)])), Marker::Absent);
    assert!(matches!(got, Err(TargetError::OutsideZone { .. })), "{got:?}");
}
