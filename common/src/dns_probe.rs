//! A small DNS client (feature `dns`): asks one server for a name's A or AAAA records over UDP,
//! falling back to TCP when the answer is truncated, and reports what a resolver would see.
//! Enactors verify applied plans with it; tests and the chaos prober watch answers with it.

use hickory_proto::op::{Edns, MessageType, OpCode, Query};
pub use hickory_proto::op::{Message, ResponseCode};
pub use hickory_proto::rr::RecordType;
use hickory_proto::rr::{Name, RData};
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// The EDNS UDP payload size we offer (the DNS flag day 2020 value).
pub const EDNS_PAYLOAD_BYTES: u16 = 1_232;

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("{0:?} is not a valid DNS name")]
    BadName(String),
    #[error("no answer from {server} within {timeout:?}")]
    Timeout { server: SocketAddr, timeout: Duration },
    #[error("DNS I/O with {server} failed")]
    Io { server: SocketAddr, source: std::io::Error },
    #[error("malformed DNS reply from {server}: {detail}")]
    Malformed { server: SocketAddr, detail: String },
}

/// What one query got back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsAnswer {
    pub rcode: ResponseCode,
    pub authoritative: bool,
    /// A or AAAA addresses in the answer section.
    pub addresses: BTreeSet<IpAddr>,
    /// The SOA serial from the authority section (negative answers), if any.
    pub soa_serial: Option<u32>,
}

impl DnsAnswer {
    /// NOERROR with at least one address: what a managed name must always answer.
    pub fn has_addresses(&self) -> bool {
        self.rcode == ResponseCode::NoError && !self.addresses.is_empty()
    }
}

/// Asks `server` for `name`'s `qtype` records with a timeout on the whole exchange.
pub async fn query(server: SocketAddr, name: &str, qtype: RecordType, timeout: Duration) -> Result<DnsAnswer, ProbeError> {
    query_message(server, name, qtype, timeout).await.map(|reply| summarise(&reply))
}

/// As `query`, the whole reply.
pub async fn query_message(server: SocketAddr, name: &str, qtype: RecordType, timeout: Duration) -> Result<Message, ProbeError> {
    match tokio::time::timeout(timeout, exchange(server, name, qtype)).await {
        Ok(result) => result,
        Err(_) => Err(ProbeError::Timeout { server, timeout }),
    }
}

async fn exchange(server: SocketAddr, name: &str, qtype: RecordType) -> Result<Message, ProbeError> {
    let io = |source| ProbeError::Io { server, source };
    let qname = Name::from_ascii(name).map_err(|_| ProbeError::BadName(name.into()))?;
    let id: u16 = rand::random();
    let mut msg = Message::new(id, MessageType::Query, OpCode::Query);
    msg.add_query(Query::query(qname, qtype));
    let mut edns = Edns::new();
    edns.set_max_payload(EDNS_PAYLOAD_BYTES);
    msg.set_edns(edns);
    let packet = msg.to_vec().map_err(|e| ProbeError::Malformed { server, detail: e.to_string() })?;

    let local: SocketAddr = if server.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let socket = UdpSocket::bind(local).await.map_err(io)?;
    socket.connect(server).await.map_err(io)?;
    socket.send(&packet).await.map_err(io)?;
    let mut buf = vec![0u8; usize::from(EDNS_PAYLOAD_BYTES).max(4_096)];
    let reply = loop {
        let len = socket.recv(&mut buf).await.map_err(io)?;
        // Ignore strays (another query's late reply) and anything that is not a response to
        // this question; the caller's timeout bounds the wait. The check of QR matters: while
        // the server's port is free (a restart), the system can give this very socket that
        // port, and a socket connected to itself receives its own query, which would read as
        // NOERROR with no address.
        match Message::from_vec(&buf[..len]) {
            Ok(reply) if answers(&reply, id, &msg) => break reply,
            _ => continue,
        }
    };
    if reply.metadata.truncation { exchange_tcp(server, &packet, id).await } else { Ok(reply) }
}

async fn exchange_tcp(server: SocketAddr, packet: &[u8], id: u16) -> Result<Message, ProbeError> {
    let io = |source| ProbeError::Io { server, source };
    let mut stream = TcpStream::connect(server).await.map_err(io)?;
    let len = u16::try_from(packet.len()).map_err(|_| ProbeError::Malformed { server, detail: "query too long".into() })?;
    stream.write_all(&len.to_be_bytes()).await.map_err(io)?;
    stream.write_all(packet).await.map_err(io)?;
    let len = stream.read_u16().await.map_err(io)?;
    let mut buf = vec![0u8; usize::from(len)];
    stream.read_exact(&mut buf).await.map_err(io)?;
    let reply = Message::from_vec(&buf).map_err(|e| ProbeError::Malformed { server, detail: e.to_string() })?;
    let query = Message::from_vec(packet).map_err(|e| ProbeError::Malformed { server, detail: e.to_string() })?;
    if !answers(&reply, id, &query) {
        return Err(ProbeError::Malformed {
            server,
            detail: "the reply is not a response to the query (id, QR or question differ)".into(),
        });
    }
    Ok(reply)
}

/// Whether `reply` is a response (QR=1) to `query`: same id and same question.
fn answers(reply: &Message, id: u16, query: &Message) -> bool {
    reply.metadata.id == id && reply.metadata.message_type == MessageType::Response && reply.queries == query.queries
}

fn summarise(reply: &Message) -> DnsAnswer {
    let addresses = reply
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect();
    let soa_serial = reply.authorities.iter().chain(reply.answers.iter()).find_map(|r| match &r.data {
        RData::SOA(soa) => Some(soa.serial),
        _ => None,
    });
    DnsAnswer { rcode: reply.metadata.response_code, authoritative: reply.metadata.authoritative, addresses, soa_serial }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A UDP "server" that sends every packet back, with QR set when `as_response`.
    async fn reflector(as_response: bool) -> SocketAddr {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let addr = socket.local_addr().expect("addr");
        tokio::spawn(async move {
            let mut buf = [0u8; 4_096];
            while let Ok((len, peer)) = socket.recv_from(&mut buf).await {
                if as_response && len > 2 {
                    buf[2] |= 0x80;
                }
                let _ = socket.send_to(&buf[..len], peer).await;
            }
        });
        addr
    }

    /// A socket that receives its own query (the system gave the probe the server's free port
    /// during a restart, so it is connected to itself) must not take it for an answer: it
    /// would read as NOERROR with no address. Without the QR check this returned Ok.
    #[tokio::test]
    async fn its_own_query_is_not_an_answer() {
        let echo = reflector(false).await;
        let got = query(echo, "api.example.test.", RecordType::A, Duration::from_millis(300)).await;
        assert!(matches!(got, Err(ProbeError::Timeout { .. })), "a query came back as an answer: {got:?}");
        let responder = reflector(true).await;
        let got = query(responder, "api.example.test.", RecordType::A, Duration::from_secs(2)).await;
        assert!(got.is_ok_and(|a| a.rcode == ResponseCode::NoError && a.addresses.is_empty()), "a response is an answer");
    }
}
