//! Property tests of the pure query path: random and mutated packets never panic, and every
//! reply is a well-formed response to the same id with QR=1 that fits the transport.

use dnsplan_authority::query::answer::{AnswerLimits, Transport, respond};
use dnsplan_authority::zone::dns_zone::StaticZone;
use dnsplan_authority::zone::snapshot::Snapshot;
use dnsplan_common::store::{ActiveRecord, ActiveSnapshot, ActiveState};
use dnsplan_common::{DnsName, Endpoint, Generation, Target, ZoneId};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use proptest::prelude::*;
use rand::SeedableRng;
use std::sync::Arc;

fn snapshot() -> Snapshot {
    let config = dnsplan_tests::stack::dns_zone_config(None);
    let zone = Arc::new(StaticZone::load(&config, std::path::Path::new(".")).expect("zone"));
    let mut active = ActiveSnapshot { applied_changes: 3, ..ActiveSnapshot::default() };
    let targets = (1..=20)
        .map(|i| Target { address: format!("2001:db8::{i}").parse().expect("addr"), zone: ZoneId::parse("a").expect("zone"), weight: i })
        .collect();
    active.endpoints.insert(
        DnsName::parse("api.example.test").expect("name"),
        ActiveRecord { generation: Generation(1), state: ActiveState::Serving(Endpoint { ttl_secs: 30, targets }) },
    );
    Snapshot::build(zone, &active)
}

fn query(name: &str, qtype: RecordType) -> Vec<u8> {
    let mut msg = Message::new(0x1234, MessageType::Query, OpCode::Query);
    msg.add_query(Query::query(Name::from_ascii(name).expect("name"), qtype));
    msg.set_edns(Edns::new());
    msg.to_vec().expect("encode")
}

fn check(packet: &[u8], snap: &Snapshot) -> Result<(), TestCaseError> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let limits = AnswerLimits { edns_udp_payload_bytes: 1232, answer_addresses_max: 64 };
    for transport in [Transport::Udp, Transport::Tcp] {
        if let Some((bytes, outcome)) = respond(packet, snap, transport, &limits, &mut rng) {
            prop_assert_eq!(&bytes[0..2], &packet[0..2], "same id");
            prop_assert!(bytes[2] & 0x80 != 0, "QR=1");
            prop_assert!(Message::from_vec(&bytes).is_ok(), "reply parses");
            prop_assert_eq!(outcome.bytes, bytes.len());
            if transport == Transport::Udp {
                prop_assert!(bytes.len() <= 1232);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(packet in proptest::collection::vec(any::<u8>(), 0..700)) {
        check(&packet, &snapshot())?;
    }

    #[test]
    fn mutated_queries(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6), which in 0usize..4) {
        let names = [("api.example.test.", RecordType::AAAA), ("example.test.", RecordType::SOA), ("x.example.test.", RecordType::A), ("example.org.", RecordType::A)];
        let (name, qtype) = names[which];
        let mut packet = query(name, qtype);
        for (at, xor) in flips {
            let i = at % packet.len();
            packet[i] ^= xor.max(1);
        }
        check(&packet, &snapshot())?;
    }
}
