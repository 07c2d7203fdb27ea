//! Zone transfers over TCP (AXFR, RFC 5936; IXFR, RFC 1995): access checked, then the zone,
//! its difference from the secondary's serial, the SOA alone or the refusal written to the
//! connection.
//!
//! IXFR (RFC 1995) is answered with the SOA alone when the secondary already has the current
//! serial, with one condensed difference from its serial (`journal`: each changed name once,
//! its old records deleted and its new ones added) when the in-memory history reaches back
//! to it, and otherwise with the whole zone in AXFR form (RFC 1995 §4 allows it; every
//! secondary accepts it). IXFR over UDP is `respond`'s.
//!
//! Encoding runs on a blocking thread (a 1,000,000-name zone takes a core for a while), at
//! most `dns.transfer.transfers_max` at once, handing each message to the connection through
//! a channel of `MESSAGES_QUEUED` so that a slow secondary holds at most that many messages
//! in memory. `notify` sends NOTIFY.

use crate::query::answer::{Outcome, Transport, respond};
use crate::serving::Serving;
use crate::serving::policy::Access;
use crate::xfr::pack::{encode_messages, ixfr_records, zone_messages};
use crate::xfr::respond::{decode, finish_one, soa_only, tsig_error};
use crate::zone::serial::serial_newer;
use dnsplan_common::tsig;
use hickory_proto::op::ResponseCode;
use hickory_proto::op::{Message, OpCode};
use hickory_proto::rr::{DNSClass, RData, RecordType};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Messages encoded ahead of the connection: enough to keep the socket busy while the next is
/// encoded, few enough (at most 128 KiB) that a stalled secondary holds little memory.
pub const MESSAGES_QUEUED: usize = 2;

/// Answers a zone transfer request over TCP: access checked, then the zone (or the SOA
/// alone, or the refusal) written to `stream`, each write within `idle`.
pub async fn transfer_tcp(
    stream: &mut TcpStream,
    packet: &[u8],
    peer: IpAddr,
    serving: &Arc<Serving>,
    idle: Duration,
) -> std::io::Result<()> {
    let now = tsig::now_unix_secs();
    let snapshot = serving.snapshot.load_full();
    let mut rng = SmallRng::from_rng(&mut rand::rng());
    let verified = match serving.transfer.access(peer, packet, now) {
        Access::Refused => {
            tracing::debug!(%peer, "zone transfer refused: not an allowed secondary, or unsigned");
            serving.metrics.observe_transfer("refused");
            return write_one(stream, respond(packet, &snapshot, Transport::Tcp, &serving.limits, &mut rng), serving, idle).await;
        }
        Access::Failed(error) => {
            tracing::debug!(%peer, %error, "zone transfer refused: TSIG");
            serving.metrics.observe_transfer("tsig_failed");
            let answer = tsig_error(packet, &error, serving, now, Transport::Tcp, &mut rng, &snapshot);
            return write_one(stream, answer, serving, idle).await;
        }
        Access::Allowed(verified) => verified,
    };
    let Some(request) = decode(packet) else {
        return write_one(stream, respond(packet, &snapshot, Transport::Tcp, &serving.limits, &mut rng), serving, idle).await;
    };
    let query = &request.queries[0];
    let qtype = query.query_type();
    let signer = verified.as_ref().map(|v| v.signer(now));
    // Only the zone we serve, by its apex: anything else is not ours to transfer.
    if query.query_class() != DNSClass::IN || query.name().to_lowercase() != snapshot.zone.origin {
        serving.metrics.observe_transfer("not_auth");
        let answer =
            soa_only(&request, &snapshot, ResponseCode::NotAuth).ok().and_then(|b| finish_one(b, signer, qtype, ResponseCode::NotAuth));
        return write_one(stream, answer, serving, idle).await;
    }
    let mut snapshot = snapshot;
    let mut diff = None;
    if qtype == RecordType::IXFR {
        let Some(client_serial) = request.authorities.iter().find_map(|r| match &r.data {
            RData::SOA(soa) => Some(soa.serial),
            _ => None,
        }) else {
            // RFC 1995 §3: the request carries the client's SOA.
            let mut answer = Message::error_msg(request.metadata.id, OpCode::Query, ResponseCode::FormErr);
            answer.add_queries(request.queries.iter().cloned());
            let answer = answer.to_vec().ok().and_then(|b| finish_one(b, signer, qtype, ResponseCode::FormErr));
            return write_one(stream, answer, serving, idle).await;
        };
        // The snapshot and the history at one moment (the follower swaps under the lock).
        {
            let journal = serving.journal.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            snapshot = serving.snapshot.load_full();
            if journal.end() == snapshot.serial && serial_newer(snapshot.serial, client_serial) {
                diff = journal.diff_since(client_serial).map(|d| ixfr_records(&snapshot, client_serial, d));
            }
        }
        // Current, or ahead of this authority (one behind the store, or a store replaced
        // without `serial_base`): nothing newer to send.
        if !serial_newer(snapshot.serial, client_serial) {
            serving.metrics.observe_transfer("current");
            let answer =
                soa_only(&request, &snapshot, ResponseCode::NoError).ok().and_then(|b| finish_one(b, signer, qtype, ResponseCode::NoError));
            return write_one(stream, answer, serving, idle).await;
        }
    }
    let incremental = diff.is_some();
    let Ok(Ok(permit)) = tokio::time::timeout(idle, serving.transfer.permits().clone().acquire_owned()).await else {
        tracing::warn!(%peer, "zone transfer refused: {} already running for longer than the TCP idle timeout", "transfers_max");
        serving.metrics.observe_transfer("busy");
        return write_one(stream, respond(packet, &snapshot, Transport::Tcp, &serving.limits, &mut rng), serving, idle).await;
    };
    let started = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(MESSAGES_QUEUED);
    let encoding = {
        let snapshot = snapshot.clone();
        tokio::task::spawn_blocking(move || {
            let send = |message| tx.blocking_send(message).is_ok();
            let result = match diff {
                Some(records) => encode_messages(records.into_iter(), &request, signer, send),
                None => zone_messages(&snapshot, &request, signer, send),
            };
            drop(permit);
            result
        })
    };
    let mut written = Ok(());
    while let Some(message) = rx.recv().await {
        if let Err(err) = write_framed(stream, &message, idle).await {
            written = Err(err);
            break;
        }
    }
    drop(rx); // stops the encoder if the connection failed
    let key = verified.as_ref().map(|v| v.key.name().to_string());
    match encoding.await {
        Ok(Ok(sent)) => {
            serving.metrics.observe_transfer(if incremental { "incremental" } else { "sent" });
            serving.metrics.observe_query(
                &Outcome { qtype: Some(qtype), rcode: ResponseCode::NoError, truncated: false, bytes: sent.bytes, malformed: None },
                Transport::Tcp,
            );
            tracing::info!(%peer, ?key, serial = snapshot.serial, %qtype, incremental, messages = sent.messages, records = sent.records,
                bytes = sent.bytes, elapsed_ms = started.elapsed().as_millis() as u64, "zone transferred");
        }
        Ok(Err(err)) => {
            serving.metrics.observe_transfer("failed");
            tracing::warn!(%peer, ?key, serial = snapshot.serial, error = %format!("{err:#}"), "zone transfer stopped");
        }
        Err(err) => {
            serving.metrics.observe_transfer("failed");
            tracing::warn!(%peer, %err, "zone transfer encoder failed");
        }
    }
    written
}

async fn write_one(stream: &mut TcpStream, answer: Option<(Vec<u8>, Outcome)>, serving: &Serving, idle: Duration) -> std::io::Result<()> {
    let Some((bytes, outcome)) = answer else { return Ok(()) };
    write_framed(stream, &bytes, idle).await?;
    serving.metrics.observe_query(&outcome, Transport::Tcp);
    Ok(())
}

/// One message with its 2-byte length prefix, written within `idle`.
pub async fn write_framed(stream: &mut TcpStream, message: &[u8], idle: Duration) -> std::io::Result<()> {
    let mut framed = Vec::with_capacity(message.len() + 2);
    framed.extend_from_slice(&(message.len() as u16).to_be_bytes());
    framed.extend_from_slice(message);
    tokio::time::timeout(idle, stream.write_all(&framed)).await.map_err(|_| std::io::ErrorKind::TimedOut)?
}
