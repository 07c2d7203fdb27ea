//! Answers to every message that is not a zone transfer over TCP: what kind of message a
//! listener has (`kind`), plain queries as `answer::respond` answers them, signed ones verified
//! and signed, and IXFR over UDP.
//!
//! Over UDP an allowed IXFR gets the current SOA alone, so a secondary that is behind asks again
//! over TCP (RFC 1995 §2). AXFR over UDP is REFUSED (RFC 5936 §4.2 does not define it).
//!
//! Any other signed query (a secondary's SOA query before it transfers) is answered as
//! `answer::respond` answers it and signed with the request's key, from any address: without
//! a signed answer a secondary with a key discards it.

use crate::query::answer::{Outcome, Transport, respond};
use crate::query::wire;
use crate::serving::Serving;
use crate::serving::policy::{Access, quiet};
use crate::zone::snapshot::Snapshot;
use dnsplan_common::tsig::{self, RequestError, ResponseSigner};
use hickory_proto::ProtoError;
use hickory_proto::op::{Message, OpCode, ResponseCode};
use hickory_proto::rr::RecordType;
use rand::Rng;
use std::net::IpAddr;

const TYPE_AXFR: u16 = 252;
const TYPE_IXFR: u16 = 251;

/// What kind of message a listener has, read from its bytes without decoding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Anything `answer::respond` answers alone (including what it drops or refuses).
    Plain,
    /// Ends with a TSIG record: its answer must be signed.
    Signed,
    Axfr,
    Ixfr,
}

/// The kind of `packet`: a standard query for AXFR or IXFR, a signed message, or plain.
pub fn kind(packet: &[u8]) -> Kind {
    if packet.len() < 12 || packet[2] & 0x80 != 0 {
        return Kind::Plain; // dropped by `respond`
    }
    let standard_query = (packet[2] >> 3) & 0x0f == 0 && wire::u16_at(packet, 4) == Some(1);
    match wire::question_type(packet) {
        Some(TYPE_AXFR) if standard_query => Kind::Axfr,
        Some(TYPE_IXFR) if standard_query => Kind::Ixfr,
        _ if wire::ends_with_tsig(packet) => Kind::Signed,
        _ => Kind::Plain,
    }
}

/// Answers a message that is not a zone transfer over TCP: plain queries as `respond` does,
/// signed ones verified and signed, AXFR over UDP REFUSED, IXFR over UDP with the current SOA
/// alone when allowed. `peer` is the client's address (`None`: unknown, never allowed).
pub fn respond_one(
    packet: &[u8],
    peer: Option<IpAddr>,
    snapshot: &Snapshot,
    serving: &Serving,
    transport: Transport,
    rng: &mut impl Rng,
) -> Option<(Vec<u8>, Outcome)> {
    match kind(packet) {
        Kind::Plain | Kind::Axfr => respond(packet, snapshot, transport, &serving.limits, rng),
        Kind::Signed => signed(packet, snapshot, serving, transport, rng),
        Kind::Ixfr => {
            let now = tsig::now_unix_secs();
            let access = peer.map_or(Access::Refused, |peer| serving.transfer.access(peer, packet, now));
            match access {
                Access::Refused => respond(packet, snapshot, transport, &serving.limits, rng),
                Access::Failed(error) => tsig_error(packet, &error, serving, now, transport, rng, snapshot),
                Access::Allowed(verified) => {
                    let Some(request) = decode(packet) else { return respond(packet, snapshot, transport, &serving.limits, rng) };
                    let bytes = soa_only(&request, snapshot, ResponseCode::NoError).ok()?;
                    finish_one(bytes, verified.map(|v| v.signer(now)), RecordType::IXFR, ResponseCode::NoError)
                }
            }
        }
    }
}

/// A signed message other than a TCP transfer: verified against every key, answered by
/// `respond` and signed; NOTAUTH with the TSIG error when the signature fails.
fn signed(packet: &[u8], snapshot: &Snapshot, serving: &Serving, transport: Transport, rng: &mut impl Rng) -> Option<(Vec<u8>, Outcome)> {
    let now = tsig::now_unix_secs();
    match quiet(|| tsig::verify_request(serving.transfer.keys(), packet, now)) {
        Ok(verified) => {
            let (bytes, mut outcome) = respond(packet, snapshot, transport, &serving.limits, rng)?;
            let signed = verified.signer(now).sign(&bytes).ok()?;
            outcome.bytes = signed.len();
            Some((signed, outcome))
        }
        // Not really signed (the TSIG record does not decode): `respond` says FORMERR.
        Err(RequestError::Unsigned | RequestError::Malformed) => respond(packet, snapshot, transport, &serving.limits, rng),
        Err(error) => tsig_error(packet, &error, serving, now, transport, rng, snapshot),
    }
}

pub(crate) fn tsig_error(
    packet: &[u8],
    error: &RequestError,
    serving: &Serving,
    now: u64,
    transport: Transport,
    rng: &mut impl Rng,
    snapshot: &Snapshot,
) -> Option<(Vec<u8>, Outcome)> {
    match quiet(|| tsig::error_response(packet, error, serving.transfer.keys(), now)) {
        Some(bytes) => {
            let qtype = wire::question_type(packet).map(RecordType::from);
            let outcome = Outcome { qtype, rcode: ResponseCode::NotAuth, truncated: false, bytes: bytes.len(), malformed: None };
            Some((bytes, outcome))
        }
        None => respond(packet, snapshot, transport, &serving.limits, rng),
    }
}

pub(crate) fn finish_one(
    bytes: Vec<u8>,
    signer: Option<ResponseSigner>,
    qtype: RecordType,
    rcode: ResponseCode,
) -> Option<(Vec<u8>, Outcome)> {
    let bytes = match signer {
        Some(mut signer) => signer.sign(&bytes).ok()?,
        None => bytes,
    };
    Some((bytes.clone(), Outcome { qtype: Some(qtype), rcode, truncated: false, bytes: bytes.len(), malformed: None }))
}

/// Decodes a request quietly (`quiet`).
pub(crate) fn decode(packet: &[u8]) -> Option<Message> {
    quiet(|| Message::from_vec(packet)).ok()
}

/// The answer with the question and, for NOERROR, the current SOA alone (an IXFR client
/// that is current, or any IXFR over UDP); NOTAUTH has no records.
pub(crate) fn soa_only(request: &Message, snapshot: &Snapshot, rcode: ResponseCode) -> Result<Vec<u8>, ProtoError> {
    let mut response = Message::response(request.metadata.id, OpCode::Query);
    response.metadata.authoritative = rcode == ResponseCode::NoError;
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.response_code = rcode;
    response.add_queries(request.queries.iter().cloned());
    if rcode == ResponseCode::NoError {
        response.add_answer(snapshot.zone.soa_record(snapshot.serial, snapshot.zone.soa_ttl_secs));
    }
    response.to_vec()
}
