//! `[dns] xdp`: the shipped `dnsplan-authority`, with its config file, answers UDP over AF_XDP
//! on a veth, byte for byte as its sockets answer. Two network namespaces of the test's own
//! joined by a veth pair: the authority in one (listening on every IPv4 address and its IPv6
//! one, XDP on its end of
//! the pair), a client in the other. Every query is asked over the veth (IPv4 and IPv6: the
//! XDP path) and over loopback inside the authority's namespace (the sockets), and the two
//! answers must be the same bytes; `dnsplan_dns_xdp_answers_total` must count every answer
//! the veth got, so the answers compared did come over XDP. Needs root and `ip` (iproute2).

mod support;

use hickory_proto::rr::RecordType;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;
use support::{Ask, AuthorityProcess, Netns, build_query, config_text, ip};

const PORT: u16 = 5300;
/// The queries at the end of `queries()` that no path answers.
const DROPPED: usize = 2;

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
/// and, last, the `DROPPED` the server drops (a response, a truncated header).
fn queries() -> Vec<Vec<u8>> {
    let plain = Ask::default();
    let mut out = Vec::new();
    let asks = [plain, Ask { edns: None, ..plain }, Ask { dnssec_ok: true, ..plain }, Ask { edns: Some(512), ..plain }];
    for ask in asks {
        for (name, qtype) in [
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
    let mut response = build_query("sip.example.test.", RecordType::A, plain);
    response[2] |= 0x80;
    out.push(response);
    out.push(vec![0x12, 0x34, 0x01]);
    out
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
    let text = config_text(&dir.path().join("data"), 8).replacen(
        "[dns]\nlisten = [\"127.0.0.1:0\"]",
        &format!("[dns]\nlisten = [\"0.0.0.0:{PORT}\", \"[fd98::1]:{PORT}\"]\nxdp = [\"xa\"]"),
        1,
    ) + "[dns.rrl]\nenabled = false\n";
    assert!(text.contains("xdp = [\"xa\"]"), "the config names the interface: {text}");
    let path = dir.path().to_path_buf();
    let authority = srv.run(move || AuthorityProcess::start(&path, &text))?;
    let attached = authority.log_until("saying whether XDP is used", |line| {
        let m = support::message(line);
        m == "answering UDP over AF_XDP" || m == "not answering over AF_XDP; the sockets answer"
    })?;
    assert_eq!(support::message(&attached), "answering UDP over AF_XDP", "{attached}");
    eprintln!("XDP on xa: mode {}, {}", support::field(&attached, "mode"), support::field(&attached, "copy"));

    let queries = queries();
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

    for (i, query) in queries.iter().enumerate() {
        assert_eq!(over_xdp_v4[i], on_sockets[i], "query {i} over IPv4 XDP and on the sockets: {query:02x?}");
        assert_eq!(over_xdp_v6[i], on_sockets[i], "query {i} over IPv6 XDP and on the sockets: {query:02x?}");
    }
    let answered = on_sockets.iter().filter(|a| a.is_some()).count();
    assert_eq!(answered, queries.len() - DROPPED, "every query is answered but the ones dropped");
    let counted = metrics
        .lines()
        .find_map(|l| l.strip_prefix("dnsplan_dns_xdp_answers_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no dnsplan_dns_xdp_answers_total in the metrics:\n{metrics}"));
    assert_eq!(counted as usize, 2 * answered, "every answer over the veth came over XDP");
    Ok(())
}
