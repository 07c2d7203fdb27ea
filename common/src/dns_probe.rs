//! A small DNS client (feature `dns`): asks one server for a name's A or AAAA records over UDP,
//! falling back to TCP when the answer is truncated, and reports what a resolver would see.
//! Enactors verify applied plans with it; tests and the chaos prober watch answers with it.

pub use hickory_proto::op::ResponseCode;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
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
    match tokio::time::timeout(timeout, exchange(server, name, qtype)).await {
        Ok(result) => result,
        Err(_) => Err(ProbeError::Timeout { server, timeout }),
    }
}

async fn exchange(server: SocketAddr, name: &str, qtype: RecordType) -> Result<DnsAnswer, ProbeError> {
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
        // Ignore strays (another query's late reply); the caller's timeout bounds the wait.
        match Message::from_vec(&buf[..len]) {
            Ok(reply) if reply.metadata.id == id => break reply,
            _ => continue,
        }
    };
    let reply = if reply.metadata.truncation { exchange_tcp(server, &packet, id).await? } else { reply };
    Ok(summarise(&reply))
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
    if reply.metadata.id != id {
        return Err(ProbeError::Malformed { server, detail: "reply id does not match the query".into() });
    }
    Ok(reply)
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
