//! Property tests of the transfer path's pure parts on hostile input: random bytes and signed
//! AXFR and IXFR requests with bytes flipped, cut short or appended never panic; whatever is
//! answered is a well-formed response with the request's id; a request whose signature was
//! broken is never allowed; and an allowed one encodes into messages of at most 64 KiB.

use dnsplan_authority::metrics::Metrics;
use dnsplan_authority::query::answer::{AnswerLimits, Transport};
use dnsplan_authority::serving::Serving;
use dnsplan_authority::serving::policy::{Access, TransferConfig, TransferPolicy};
use dnsplan_authority::xfr::pack::{self, MESSAGE_BYTES_MAX};
use dnsplan_authority::xfr::respond;
use dnsplan_authority::zone::dns_zone::StaticZone;
use dnsplan_authority::zone::journal::Journal;
use dnsplan_authority::zone::snapshot::Snapshot;
use dnsplan_common::store::{ActiveRecord, ActiveSnapshot, ActiveState};
use dnsplan_common::tsig::{Algorithm, TsigKey, now_unix_secs};
use dnsplan_common::{DnsName, Endpoint, Generation, Target, ZoneId};
use hickory_proto::op::{Message, Query};
use hickory_proto::rr::rdata::SOA;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use proptest::prelude::*;
use rand::SeedableRng;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock, Mutex};

const SECRET: &str = "ZG5zcGxhbi10cmFuc2Zlci10ZXN0LXNlY3JldC0zMmI=";

/// 300 managed names, the fixtures' static zone, a key allowed from loopback. Built once:
/// the cases share it (it holds no state a case changes).
static SERVING: LazyLock<Serving> = LazyLock::new(|| {
    let config = dnsplan_tests::stack::dns_zone_config(None);
    let zone = Arc::new(StaticZone::load(&config, std::path::Path::new(".")).expect("zone"));
    let mut active = ActiveSnapshot { applied_changes: 300, ..ActiveSnapshot::default() };
    for i in 0..300u32 {
        let targets = vec![Target {
            address: format!("10.0.{}.{}", i / 256, i % 256).parse().expect("addr"),
            zone: ZoneId::parse("a").expect("zone"),
            weight: 1,
        }];
        active.endpoints.insert(
            DnsName::parse(&format!("ep{i}.example.test")).expect("name"),
            ActiveRecord { generation: Generation(1), state: ActiveState::Serving(Endpoint { ttl_secs: 30, targets }) },
        );
    }
    let snapshot = Snapshot::build(zone.clone(), &active);
    let transfer: TransferConfig = serde_json::from_value(serde_json::json!({
        "keys": [{ "name": "xfr.", "secret": SECRET }],
        "secondaries": [{ "address": "127.0.0.0/8", "key": "xfr." }],
    }))
    .expect("transfer config");
    let policy = TransferPolicy::from_config(&transfer, std::path::Path::new(".")).expect("policy");
    let serial = snapshot.serial;
    Serving {
        snapshot: arc_swap::ArcSwap::from_pointee(snapshot),
        zone,
        limits: AnswerLimits::default(),
        rrl: None,
        transfer: std::sync::Arc::new(policy),
        metrics: Arc::new(Metrics::new()),
        served_serial: tokio::sync::watch::Sender::new(serial),
        served_applied: tokio::sync::watch::Sender::new(0),
        secondaries: Arc::default(),
        journal: Mutex::new(Journal::new(serial, 1_000)),
        served_log: None,
        ixfr_log: None,
        others: None,
        answered: Default::default(),
        plan_check: None,
        writer: Default::default(),
    }
});

fn key() -> TsigKey {
    TsigKey::from_base64("xfr.", Algorithm::HmacSha256, SECRET).expect("key")
}

/// A signed AXFR, or an IXFR from serial 1.
fn signed(qtype: RecordType) -> Vec<u8> {
    let mut message = Message::query();
    message.add_query(Query::query(Name::from_ascii("example.test.").expect("name"), qtype));
    if qtype == RecordType::IXFR {
        let soa =
            SOA::new(Name::from_ascii("ns1.example.test.").expect("n"), Name::from_ascii("h.example.test.").expect("n"), 1, 0, 0, 0, 0);
        message.add_authority(Record::from_rdata(Name::from_ascii("example.test.").expect("n"), 0, RData::SOA(soa)));
    }
    key().sign_query(&mut message, now_unix_secs()).expect("signs");
    message.to_vec().expect("encodes")
}

fn check(packet: &[u8], mutated: bool) -> Result<(), TestCaseError> {
    let serving = &*SERVING;
    let snapshot = serving.snapshot.load_full();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let peer: IpAddr = "127.0.0.1".parse().expect("ip");
    for transport in [Transport::Udp, Transport::Tcp] {
        if let Some((bytes, outcome)) = respond::respond_one(packet, Some(peer), &snapshot, serving, transport, &mut rng) {
            prop_assert_eq!(&bytes[0..2], &packet[0..2], "same id");
            prop_assert!(bytes[2] & 0x80 != 0, "QR=1");
            prop_assert!(Message::from_vec(&bytes).is_ok(), "reply parses");
            prop_assert_eq!(outcome.bytes, bytes.len());
        }
    }
    let kind = respond::kind(packet);
    if matches!(kind, respond::Kind::Axfr | respond::Kind::Ixfr) {
        match serving.transfer.access(peer, packet, now_unix_secs()) {
            Access::Allowed(verified) => {
                // Allowed means verified (TSIG is required): only changes the MAC does not
                // cover (the header's id, which the TSIG's original id stands in for) pass.
                let request = Message::from_vec(packet).expect("verified requests decode");
                prop_assert!(!mutated || verified.is_some());
                let mut largest = 0;
                pack::zone_messages(&snapshot, &request, verified.map(|v| v.signer(now_unix_secs())), |m| {
                    largest = largest.max(m.len());
                    true
                })
                .map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
                prop_assert!(largest <= MESSAGE_BYTES_MAX);
            }
            Access::Refused | Access::Failed(_) => {}
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(packet in proptest::collection::vec(any::<u8>(), 0..700)) {
        check(&packet, false)?;
    }

    #[test]
    fn mutated_signed_requests(
        ixfr in any::<bool>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in proptest::option::of(any::<prop::sample::Index>()),
        tail in proptest::collection::vec(any::<u8>(), 0..8),
    ) {
        let mut packet = signed(if ixfr { RecordType::IXFR } else { RecordType::AXFR });
        let original = packet.clone();
        for (at, value) in flips {
            let at = at.index(packet.len());
            packet[at] = value;
        }
        if let Some(cut) = cut {
            packet.truncate(cut.index(packet.len() + 1));
        }
        packet.extend(tail);
        check(&packet, packet != original)?;
    }
}

/// The unmutated requests are allowed and sent whole; a request changed after signing is not.
#[test]
fn signed_requests_are_allowed_and_changed_ones_are_not() {
    let peer: IpAddr = "127.0.0.1".parse().expect("ip");
    for qtype in [RecordType::AXFR, RecordType::IXFR] {
        let packet = signed(qtype);
        assert!(matches!(SERVING.transfer.access(peer, &packet, now_unix_secs()), Access::Allowed(Some(_))));
        let mut changed = packet.clone();
        changed[3] ^= 0x10; // the AD bit
        assert!(matches!(SERVING.transfer.access(peer, &changed, now_unix_secs()), Access::Failed(_)));
    }
}
