//! DNS from the tests' side: one question over UDP, a whole zone by `dig AXFR`, and waits on a
//! zone's serial.

use super::WITHIN;
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, Record, RecordType};
use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

/// One UDP question, asked up to three times.
pub fn ask(server: SocketAddr, name: &str, qtype: RecordType) -> anyhow::Result<Message> {
    let mut query = Message::new(rand_id(), MessageType::Query, OpCode::Query);
    query.add_query(Query::query(Name::from_ascii(name)?, qtype));
    let bytes = query.to_vec()?;
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    socket.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut buf = [0u8; 4096];
    for _ in 0..3 {
        socket.send_to(&bytes, server)?;
        if let Ok((len, _)) = socket.recv_from(&mut buf) {
            return Ok(Message::from_vec(&buf[..len])?);
        }
    }
    anyhow::bail!("{server} did not answer {name} {qtype}")
}

/// A new message id for each question.
fn rand_id() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

pub fn section(records: &[Record]) -> Vec<String> {
    let mut out: Vec<String> = records.iter().map(|r| r.to_string().to_ascii_lowercase()).collect();
    out.sort();
    out
}

/// The whole zone by `dig AXFR`, as sorted lines.
pub fn axfr(server: SocketAddr, zone: &str) -> anyhow::Result<BTreeSet<String>> {
    axfr_with(server, zone, &[])
}

/// As [`axfr`], with `extra` arguments to dig (such as `-y` and a TSIG key).
pub fn axfr_with(server: SocketAddr, zone: &str, extra: &[&str]) -> anyhow::Result<BTreeSet<String>> {
    let out = Command::new("dig")
        .args(["-p", &server.port().to_string(), &format!("@{}", server.ip()), zone, "AXFR", "+time=5", "+tries=1", "+noall", "+answer"])
        .args(extra)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run dig (install dnsutils): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let records: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ").to_ascii_lowercase())
        .collect();
    anyhow::ensure!(
        records.iter().filter(|l| l.split(' ').nth(3) == Some("soa")).count() == 2,
        "no whole AXFR of {zone} from {server}:\n{text}"
    );
    Ok(records.into_iter().collect())
}

/// Waits until `server` answers `zone`'s SOA with `serial`.
pub fn until_serial(server: SocketAddr, zone: &str, serial: u32) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let answer = ask(server, zone, RecordType::SOA)?;
        let got = answer.answers.iter().find_map(|r| match &r.data {
            hickory_proto::rr::RData::SOA(soa) => Some(soa.serial),
            _ => None,
        });
        if got == Some(serial) {
            return Ok(());
        }
        anyhow::ensure!(start.elapsed() < WITHIN, "{server} serves {zone} at {got:?}, not {serial}, after {WITHIN:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn refused(server: SocketAddr, zone: &str) -> anyhow::Result<bool> {
    Ok(ask(server, zone, RecordType::SOA)?.metadata.response_code == ResponseCode::Refused)
}

/// Whether `server` answers IXFR of `zone` from `serial` (by `dig`, over TCP) incrementally
/// (RFC 1995: its second record is the SOA at `serial`) rather than with the whole zone.
pub fn ixfr_is_incremental(server: SocketAddr, zone: &str, serial: u32) -> anyhow::Result<bool> {
    let out = Command::new("dig")
        .args(["-p", &server.port().to_string(), &format!("@{}", server.ip()), zone, &format!("IXFR={serial}")])
        .args(["+time=5", "+tries=1", "+noall", "+answer"])
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run dig (install dnsutils): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let records: Vec<Vec<String>> = text
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_ascii_lowercase).collect())
        .collect();
    anyhow::ensure!(
        records.first().is_some_and(|r| r.get(3).map(String::as_str) == Some("soa")),
        "no IXFR of {zone} from {server}:\n{text}"
    );
    Ok(records.get(1).is_some_and(|r| r.get(3).map(String::as_str) == Some("soa") && r.get(6) == Some(&serial.to_string())))
}

/// The SOA serial `server` answers for `zone`.
pub fn serial(server: SocketAddr, zone: &str) -> anyhow::Result<u32> {
    let answer = ask(server, zone, RecordType::SOA)?;
    answer
        .answers
        .iter()
        .find_map(|r| match &r.data {
            hickory_proto::rr::RData::SOA(soa) => Some(soa.serial),
            _ => None,
        })
        .ok_or_else(|| anyhow::anyhow!("{server} answered {zone} SOA without a SOA ({})", answer.metadata.response_code))
}
