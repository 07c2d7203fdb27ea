//! `[dns] xdp`: the shipped `dnsplan-authority`, with its config file, answers UDP over AF_XDP
//! on a veth, byte for byte as its sockets answer. Two network namespaces of the test's own
//! joined by a veth pair: the authority in one (listening on every IPv4 address and its IPv6
//! one, XDP on its end of the pair), a client in the other. Every query is asked over the veth
//! (IPv4 and IPv6: the XDP path) and over loopback inside the authority's namespace (the
//! sockets), and the two answers must be the same bytes; `dnsplan_dns_xdp_answers_total` must
//! count every answer the veth got, so the answers compared did come over XDP.
//!
//! The queries: one of every kind the zone answers, then random ones (names, cases, types,
//! EDNS sizes, flags, and a quarter with bytes of the question or OPT record changed), the
//! fast path's differential test (`tests/fast_path.rs`) carried over the wire. The server
//! allows 4096-byte UDP answers and the zone has TXT records too large for the veth's MTU
//! (1500): where the sockets send such an answer (fragmented), XDP sends it truncated, the
//! sockets' answer with TC=1 and no records (`rrl::slip`), so the client asks over TCP. Needs
//! root and `ip` (iproute2).

mod support;

use dnsplan_authority::query::rrl;
use hickory_proto::rr::RecordType;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;
use support::{Ask, AuthorityProcess, Netns, ZONE_FILE, build_query, config_text, ip};

const PORT: u16 = 5300;
/// The queries at the end of `queries()` that no path answers.
const DROPPED: usize = 2;
/// The random queries asked.
const RANDOM: usize = 400;
/// The most bytes of DNS message a reply can carry on the veth (MTU 1500): IPv4, IPv6.
const ROOM: [usize; 2] = [1472, 1452];

/// The test zone, with `big` (an answer of about 3,000 bytes) and `mid` (1,461 bytes: it fits
/// an IPv4 reply on the veth, not an IPv6 one), and a name with 20 addresses.
fn zone() -> String {
    let strings = |count: usize, len: usize| {
        (0..count).map(|i| format!("\"{}\"", char::from(b'a' + i as u8).to_string().repeat(len))).collect::<Vec<_>>().join(" ")
    };
    let mut zone = format!("{ZONE_FILE}big IN TXT {}\nmid IN TXT {}\n", strings(12, 250), strings(6, 233));
    for i in 1..=20 {
        zone.push_str(&format!("many IN A 192.0.2.{i}\n"));
    }
    zone
}

/// The answer to each of `queries` sent to `server` from a fresh socket, `None` where none came:
/// the last `dropped` queries are ones no path answers, waited for briefly; the others get up
/// to 5 s, so a loaded machine's slow answer is not taken for a missing one.
fn answers(server: SocketAddr, queries: &[Vec<u8>], dropped: usize) -> Vec<Option<Vec<u8>>> {
    let local: SocketAddr = if server.is_ipv4() { "0.0.0.0:0".parse() } else { "[::]:0".parse() }.expect("address");
    let socket = UdpSocket::bind(local).expect("a client socket");
    queries
        .iter()
        .enumerate()
        .map(|(i, query)| {
            let wait = if i + dropped >= queries.len() { Duration::from_millis(300) } else { Duration::from_secs(5) };
            socket.set_read_timeout(Some(wait)).expect("timeout");
            socket.send_to(query, server).expect("send");
            let mut buf = vec![0u8; 65_535];
            socket.recv_from(&mut buf).ok().map(|(len, _)| buf[..len].to_vec())
        })
        .collect()
}

/// Queries of every kind the test zone answers: positive, CNAME, NXDOMAIN, NODATA, the apex's
/// SOA, NS with glue, TXT, SRV; with and without EDNS, with DO, a 512-byte client; mixed case;
/// answers too large for the veth; then `RANDOM` random ones; and, last, the `DROPPED` the
/// server drops (a response, a truncated header).
fn queries(rng: &mut SmallRng) -> Vec<Vec<u8>> {
    let plain = Ask::default();
    let mut out = Vec::new();
    let asks = [
        plain,
        Ask { edns: None, ..plain },
        Ask { dnssec_ok: true, ..plain },
        Ask { edns: Some(512), ..plain },
        Ask { edns: Some(1500), ..plain },
        Ask { edns: Some(4096), ..plain },
    ];
    for ask in asks {
        for (name, qtype) in [
            ("big.example.test.", RecordType::TXT),
            ("mid.example.test.", RecordType::TXT),
            ("many.example.test.", RecordType::A),
            ("sip.example.test.", RecordType::A),
            ("SiP.ExAmple.TEST.", RecordType::A),
            ("www.example.test.", RecordType::A),
            ("missing.example.test.", RecordType::A),
            ("sip.example.test.", RecordType::AAAA),
            ("example.test.", RecordType::SOA),
            ("example.test.", RecordType::NS),
            ("example.test.", RecordType::TXT),
            ("_sip._udp.example.test.", RecordType::SRV),
            ("elsewhere.invalid.", RecordType::A),
        ] {
            out.push(build_query(name, qtype, ask));
        }
    }
    out.extend(random_queries(rng));
    let mut response = build_query("sip.example.test.", RecordType::A, plain);
    response[2] |= 0x80;
    out.push(response);
    out.push(vec![0x12, 0x34, 0x01]);
    out
}

/// `RANDOM` queries: names of the zone and not (each letter's case drawn), types, EDNS (none,
/// any size, 4096), DO, RD and CD drawn; a quarter with one to three bytes after the header
/// changed (the question and OPT record: what the server answers, FORMERR included, rather
/// than drops).
fn random_queries(rng: &mut SmallRng) -> Vec<Vec<u8>> {
    const NAMES: [&str; 12] =
        ["", "sip", "www", "ns1", "big", "mid", "many", "_sip._udp", "missing", "a.b.missing", "x.sip", "elsewhere.invalid."];
    const TYPES: [RecordType; 12] = [
        RecordType::A,
        RecordType::AAAA,
        RecordType::TXT,
        RecordType::SRV,
        RecordType::NS,
        RecordType::SOA,
        RecordType::MX,
        RecordType::CNAME,
        RecordType::ANY,
        RecordType::DS,
        RecordType::DNSKEY,
        RecordType::Unknown(99),
    ];
    (0..RANDOM)
        .map(|_| {
            let name = NAMES[rng.random_range(0..NAMES.len())];
            let name = match name {
                "" => "example.test.".to_string(),
                n if n.ends_with('.') => n.to_string(),
                n => format!("{n}.example.test."),
            };
            let name: String = name.chars().map(|c| if rng.random_bool(0.3) { c.to_ascii_uppercase() } else { c }).collect();
            let edns = match rng.random_range(0..4) {
                0 => None,
                1 => Some(4096),
                _ => Some(rng.random_range(0..5000)),
            };
            let ask = Ask { edns, dnssec_ok: rng.random_bool(0.5), ..Ask::default() };
            let mut query = build_query(&name, TYPES[rng.random_range(0..TYPES.len())], ask);
            if rng.random_bool(0.5) {
                query[2] &= !0x01; // RD
            }
            if rng.random_bool(0.3) {
                query[3] |= 0x10; // CD
            }
            if rng.random_bool(0.25) {
                for _ in 0..rng.random_range(1..=3) {
                    let at = rng.random_range(12..query.len());
                    query[at] = rng.random();
                }
            }
            query
        })
        .collect()
}

/// What XDP must send where the sockets sent `on_sockets`, over IPv4 (`family` 0) or IPv6 (1):
/// the same, or its truncated form when it does not fit the veth's MTU.
fn over_xdp_expected(on_sockets: &Option<Vec<u8>>, family: usize) -> Option<Vec<u8>> {
    let mut answer = on_sockets.clone()?;
    if answer.len() > ROOM[family] {
        rrl::slip(&mut answer);
    }
    Some(answer)
}

#[test]
fn the_shipped_authority_answers_over_xdp_as_its_sockets_do() -> anyhow::Result<()> {
    let (srv, cli) = (Netns::new("axdp-srv"), Netns::new("axdp-cli"));
    ip(&["-n", &srv.0, "link", "add", "xa", "type", "veth", "peer", "name", "xb", "netns", &cli.0]);
    for (ns, dev, v4, v6) in [(&srv, "xa", "10.98.0.1/24", "fd98::1/64"), (&cli, "xb", "10.98.0.2/24", "fd98::2/64")] {
        ip(&["-n", &ns.0, "addr", "add", v4, "dev", dev]);
        ip(&["-n", &ns.0, "addr", "add", v6, "dev", dev, "nodad"]);
        ip(&["-n", &ns.0, "link", "set", dev, "up"]);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
    }

    let dir = tempfile::tempdir()?;
    let text = config_text(&dir.path().join("data"), 8)
        .replacen(
            "[dns]\nlisten = [\"127.0.0.1:0\"]",
            &format!("[dns]\nlisten = [\"0.0.0.0:{PORT}\", \"[fd98::1]:{PORT}\"]\nxdp = [\"xa\"]"),
            1,
        )
        .replacen("[dns]\n", "[dns]\nedns_udp_payload_bytes = 4096\n", 1)
        + "[dns.rrl]\nenabled = false\n";
    assert!(text.contains("xdp = [\"xa\"]"), "the config names the interface: {text}");
    let path = dir.path().to_path_buf();
    let authority = srv.run(move || AuthorityProcess::start_zone(&path, &text, &zone()))?;
    let attached = authority.log_until("saying whether XDP is used", |line| {
        let m = support::message(line);
        m == "answering UDP over AF_XDP" || m == "not answering over AF_XDP; the sockets answer"
    })?;
    assert_eq!(support::message(&attached), "answering UDP over AF_XDP", "{attached}");
    eprintln!("XDP on xa: mode {}, {}", support::field(&attached, "mode"), support::field(&attached, "copy"));

    let seed: u64 = rand::random();
    let queries = queries(&mut SmallRng::seed_from_u64(seed));
    let (q4, q6) = (queries.clone(), queries.clone());
    let over_xdp_v4 = cli.run(move || answers(SocketAddr::from(([10, 98, 0, 1], PORT)), &q4, DROPPED));
    let over_xdp_v6 = cli.run(move || answers(format!("[fd98::1]:{PORT}").parse().expect("address"), &q6, DROPPED));
    let q = queries.clone();
    let control = authority.control.clone();
    let (on_sockets, metrics) = srv.run(move || {
        let on_sockets = answers(SocketAddr::from(([127, 0, 0, 1], PORT)), &q, DROPPED);
        let metrics = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(async { reqwest::get(format!("{control}/metrics")).await?.text().await });
        (on_sockets, metrics)
    });
    let metrics = metrics?;

    let mut truncated = [0; 2];
    for (i, query) in queries.iter().enumerate() {
        for (family, over_xdp) in [&over_xdp_v4, &over_xdp_v6].into_iter().enumerate() {
            let want = over_xdp_expected(&on_sockets[i], family);
            truncated[family] += usize::from(want != on_sockets[i]);
            assert_eq!(
                over_xdp[i],
                want,
                "query {i} (seed {seed}) over IPv{} XDP and on the sockets ({} bytes): {query:02x?}",
                [4, 6][family],
                on_sockets[i].as_ref().map_or(0, Vec::len)
            );
        }
    }
    // `big` over either family and `mid` over IPv6 alone, each asked with EDNS 4096 (and 1500).
    assert!(truncated[0] >= 1 && truncated[1] > truncated[0], "answers too large for the veth were asked: {truncated:?}");
    let answered = on_sockets.iter().filter(|a| a.is_some()).count();
    assert_eq!(answered, queries.len() - DROPPED, "every query is answered but the ones dropped");
    let counted = metrics
        .lines()
        .find_map(|l| l.strip_prefix("dnsplan_dns_xdp_answers_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no dnsplan_dns_xdp_answers_total in the metrics:\n{metrics}"));
    assert_eq!(counted as usize, 2 * answered, "every answer over the veth came over XDP");
    for reason in ["too_large", "invalid"] {
        let series = format!("dnsplan_dns_xdp_dropped_total{{reason=\"{reason}\"}} 0");
        assert!(metrics.lines().any(|l| l == series), "{series} in the metrics:\n{metrics}");
    }
    Ok(())
}
