//! Zone transfer messages: records encoded into as many messages as they need, owners
//! compressed here, each message signed when the transfer is.
//!
//! AXFR (RFC 5936) over TCP sends the whole DNS zone as one moment of the serving state: the
//! snapshot loaded when the request arrives, held until the last message is written, whatever
//! the follower swaps in meanwhile. The SOA comes first and last; between them the apex's
//! static records, then every other name's records in the table's order: a managed
//! endpoint's eligible targets (those with weight above 0, or all of them when every weight
//! is 0: fail-open, never empty) with the plan's TTL, and the static records a managed name
//! does not shadow (its static A, AAAA and CNAME). Weights are not carried: a secondary
//! serves every eligible target alike. Messages close at `MESSAGE_POINTABLE_BYTES` (16 KiB,
//! as Knot's, so every owner can be pointed at) and never exceed `MESSAGE_BYTES_MAX` with
//! their TSIG record; owners are compressed here (`encode_messages`).

use crate::zone::compress::{POINTER_TARGET_MAX, is_label_start};
use crate::zone::records::zone_records;
use crate::zone::snapshot::{Snapshot, wire_key};
use dnsplan_common::tsig::{self, ResponseSigner, TSIG_RECORD_BYTES_MAX};
use hickory_proto::ProtoError;
use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{RData, Record};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder, NameEncoding};

/// Largest message of a transfer, its TSIG record included: what the 2-byte TCP length prefix
/// can say (RFC 5936 §2.2). Only a record too big for `MESSAGE_POINTABLE_BYTES` makes one
/// this large.
pub const MESSAGE_BYTES_MAX: usize = 65_535;
/// A transfer message is closed once it holds this many bytes: every offset below it can be
/// the target of a 14-bit compression pointer, so every owner in the message can be pointed
/// at. Knot's choice too; each message then costs one TSIG record (about 0.5%) more.
pub const MESSAGE_POINTABLE_BYTES: usize = POINTER_TARGET_MAX;

/// What a transfer sent, for the log and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    pub messages: usize,
    pub records: usize,
    pub bytes: usize,
}

/// Why a transfer stopped before its last message.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("encoding a message")]
    Encode(#[source] ProtoError),
    #[error("signing a message: {0}")]
    Sign(#[source] tsig::TsigFailure),
    #[error("record {0} does not fit in a message")]
    Oversized(String),
    #[error("the connection went away")]
    Gone,
}

/// Encodes the zone of `snapshot` as the answer to `request` (whose first question is the
/// zone's apex), message by message, each signed when `signer` is given, handing each to
/// `send` until it returns `false` (the connection is gone).
pub fn zone_messages(
    snapshot: &Snapshot,
    request: &Message,
    signer: Option<ResponseSigner>,
    send: impl FnMut(Vec<u8>) -> bool,
) -> Result<Sent, TransferError> {
    encode_messages(zone_records(snapshot), request, signer, send)
}

/// An IXFR answer from `diff` (records gone, records new) between serial `from` and the
/// serial of `snapshot`: the new SOA, the old SOA, what is gone, the new SOA, what is new,
/// the new SOA (RFC 1995 §4, one condensed difference).
pub fn ixfr_records(snapshot: &Snapshot, from: u32, diff: (Vec<Record>, Vec<Record>)) -> Vec<Record> {
    let zone = &snapshot.zone;
    let now = zone.soa_record(snapshot.serial, zone.soa_ttl_secs);
    let (gone, new) = diff;
    let mut out = Vec::with_capacity(gone.len() + new.len() + 4);
    out.push(now.clone());
    out.push(zone.soa_record(from, zone.soa_ttl_secs));
    out.extend(gone);
    out.push(now.clone());
    out.extend(new);
    out.push(now);
    out
}

/// Encodes `records` (every owner inside the zone whose apex is the request's question) as
/// the answer to `request` in as many messages as they need (see `zone_messages`).
///
/// Owners are compressed here, not by hickory's encoder, which stops compressing after 120
/// names a message (a bound on its CPU cost against crafted messages) and so wrote every
/// owner of a transfer in full (99 MB for 1,000,000 names against Knot's 56 MB). A record's
/// owner is a pointer to the previous record's when they are the same name, else its labels
/// below the apex and a pointer to the question's name (the apex); so are the names in SOA,
/// NS and CNAME RDATA. Pointers reach 14 bits, so
/// a message is closed once it reaches `MESSAGE_POINTABLE_BYTES`, as Knot does, and every
/// owner in it can be pointed at; a record alone may fill a message up to
/// `MESSAGE_BYTES_MAX`. Names in other RDATA (MX, SRV, ...) are written in full.
pub fn encode_messages(
    records: impl Iterator<Item = Record>,
    request: &Message,
    mut signer: Option<ResponseSigner>,
    mut send: impl FnMut(Vec<u8>) -> bool,
) -> Result<Sent, TransferError> {
    let hard = MESSAGE_BYTES_MAX - if signer.is_some() { TSIG_RECORD_BYTES_MAX } else { 0 };
    let question: &Query = &request.queries[0];
    let apex = wire_key(question.name());
    let mut head = Vec::with_capacity(12 + apex.len() + 4);
    {
        let mut encoder = BinEncoder::new(&mut head);
        encoder.emit_vec(&[0; 12]).map_err(TransferError::Encode)?;
        encoder.set_name_encoding(NameEncoding::Uncompressed);
        question.emit(&mut encoder).map_err(TransferError::Encode)?;
    }
    let mut records = records.peekable();
    let mut carry: Option<Record> = None;
    let mut sent = Sent::default();
    loop {
        let mut buf = Vec::with_capacity(MESSAGE_POINTABLE_BYTES + 1_024);
        buf.extend_from_slice(&head);
        let mut count: u16 = 0;
        let mut previous: Option<(Vec<u8>, u16)> = None;
        while let Some(record) = carry.take().or_else(|| records.next()) {
            let start = buf.len();
            let owner = write_record(&mut buf, &record, &apex, previous.as_ref())?;
            let fits = if count == 0 { buf.len() <= hard } else { buf.len() <= MESSAGE_POINTABLE_BYTES.min(hard) };
            if !fits {
                buf.truncate(start);
                if count == 0 {
                    return Err(TransferError::Oversized(record.name.to_string()));
                }
                carry = Some(record);
                break;
            }
            previous = owner;
            count += 1;
            if count == u16::MAX || buf.len() >= MESSAGE_POINTABLE_BYTES {
                break;
            }
        }
        // Header: the request's id, QR and AA, RD copied, NOERROR, one question.
        buf[0..2].copy_from_slice(&request.metadata.id.to_be_bytes());
        buf[2] = 0x80 | 0x04 | u8::from(request.metadata.recursion_desired);
        buf[3] = 0;
        buf[4..6].copy_from_slice(&1u16.to_be_bytes());
        buf[6..8].copy_from_slice(&count.to_be_bytes());
        buf[8..12].fill(0);
        let message = match signer.as_mut() {
            Some(signer) => signer.sign(&buf).map_err(TransferError::Sign)?,
            None => buf,
        };
        assert!(message.len() <= MESSAGE_BYTES_MAX, "a transfer message of {} bytes", message.len());
        sent.messages += 1;
        sent.records += usize::from(count);
        sent.bytes += message.len();
        if !send(message) {
            return Err(TransferError::Gone);
        }
        if carry.is_none() && records.peek().is_none() {
            return Ok(sent);
        }
    }
}

/// Appends `name` (lower-case wire form): its labels below `apex` and a pointer to the
/// question's name when it is at or below the apex, else in full.
fn write_name(buf: &mut Vec<u8>, name: &[u8], apex: &[u8]) {
    let pointer = (0xc000 | QUESTION_AT).to_be_bytes();
    if name.len() >= apex.len() && name.ends_with(apex) && is_label_start(name, name.len() - apex.len()) {
        buf.extend_from_slice(&name[..name.len() - apex.len()]);
        buf.extend_from_slice(&pointer);
    } else {
        buf.extend_from_slice(name);
    }
}

/// Where the question's name (the apex) starts in every message.
const QUESTION_AT: u16 = 12;

/// Appends `record` to `buf` (a message from its first byte) with its owner compressed (see
/// `encode_messages`); returns the owner and where later records may point for it.
fn write_record(
    buf: &mut Vec<u8>,
    record: &Record,
    apex: &[u8],
    previous: Option<&(Vec<u8>, u16)>,
) -> Result<Option<(Vec<u8>, u16)>, TransferError> {
    let owner = wire_key(&record.name);
    let at = buf.len();
    let pointer = |to: u16| (0xc000 | to).to_be_bytes();
    let target = match previous {
        Some((name, to)) if *name == owner => {
            buf.extend_from_slice(&pointer(*to));
            Some(*to)
        }
        _ if owner == apex => {
            buf.extend_from_slice(&pointer(QUESTION_AT));
            Some(QUESTION_AT)
        }
        // Below the apex: its own labels, then the apex; later records of this owner point
        // here. (Outside the apex it is written in full; not reached: the zone's records are
        // all inside it.)
        _ => {
            write_name(buf, &owner, apex);
            u16::try_from(at).ok().filter(|&at| usize::from(at) <= POINTER_TARGET_MAX)
        }
    };
    buf.extend_from_slice(&u16::from(record.record_type()).to_be_bytes());
    buf.extend_from_slice(&u16::from(record.dns_class).to_be_bytes());
    buf.extend_from_slice(&record.ttl.to_be_bytes());
    let rdlength_at = buf.len();
    buf.extend_from_slice(&[0, 0]);
    match &record.data {
        RData::A(a) => buf.extend_from_slice(&a.0.octets()),
        RData::AAAA(a) => buf.extend_from_slice(&a.0.octets()),
        // RFC 1035's own types, whose RDATA names may be compressed (RFC 3597 §4): against
        // the apex, as owners are.
        RData::SOA(soa) => {
            write_name(buf, &wire_key(&soa.mname), apex);
            write_name(buf, &wire_key(&soa.rname), apex);
            for field in [soa.serial, soa.refresh as u32, soa.retry as u32, soa.expire as u32, soa.minimum] {
                buf.extend_from_slice(&field.to_be_bytes());
            }
        }
        RData::NS(ns) => write_name(buf, &wire_key(&ns.0), apex),
        RData::CNAME(cname) => write_name(buf, &wire_key(&cname.0), apex),
        other => {
            let mut rdata = Vec::new();
            let mut encoder = BinEncoder::new(&mut rdata);
            encoder.set_name_encoding(NameEncoding::Uncompressed);
            other.emit(&mut encoder).map_err(TransferError::Encode)?;
            buf.extend_from_slice(&rdata);
        }
    }
    let rdlength = u16::try_from(buf.len() - rdlength_at - 2).map_err(|_| TransferError::Oversized(record.name.to_string()))?;
    buf[rdlength_at..rdlength_at + 2].copy_from_slice(&rdlength.to_be_bytes());
    Ok(target.map(|to| (owner, to)))
}
