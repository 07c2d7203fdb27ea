//! Zone transfers to secondaries, and TSIG on every signed query.
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
//!
//! IXFR (RFC 1995) is answered with the SOA alone when the secondary already has the current
//! serial, with one condensed difference from its serial (`journal`: each changed name once,
//! its old records deleted and its new ones added) when the in-memory history reaches back
//! to it, and otherwise with the whole zone in AXFR form (RFC 1995 §4 allows it; every
//! secondary accepts it). Over UDP an allowed IXFR gets the current SOA alone, so a secondary
//! that is behind asks again over TCP (RFC 1995 §2). AXFR over UDP is REFUSED (RFC 5936 §4.2
//! does not define it).
//!
//! Who may transfer is `TransferPolicy`: a client whose address is in no allowed prefix, or
//! that does not sign when a key is required, is REFUSED; nothing about keys is said to it. A
//! client that signs with a key it may not use, with a wrong MAC or at a time outside the
//! fudge gets NOTAUTH with the TSIG error (BADKEY, BADSIG, BADTIME), as RFC 8945 §5.2
//! requires; BADKEY echoes the client's own key name, nothing of ours. Every message of an
//! allowed, signed transfer is signed (RFC 8945 §5.3.1).
//!
//! Any other signed query (a secondary's SOA query before it transfers) is answered as
//! `answer::respond` answers it and signed with the request's key, from any address: without
//! a signed answer a secondary with a key discards it.
//!
//! Encoding runs on a blocking thread (a 1,000,000-name zone takes a core for a while), at
//! most `dns.transfer.transfers_max` at once, handing each message to the connection through
//! a channel of `MESSAGES_QUEUED` so that a slow secondary holds at most that many messages
//! in memory. `notify` sends NOTIFY.

use crate::answer::{Outcome, Transport, respond};
use crate::compress::{POINTER_TARGET_MAX, is_label_start};
use crate::config::{TransferConfig, normal_key_name};
use crate::follower::Serving;
use crate::notify::NotifyTarget;
use crate::rrl::IpPrefix;
use crate::snapshot::{Entry, Snapshot, serial_newer, wire_key};
use crate::wire;
use dnsplan_common::tsig::{self, RequestError, ResponseSigner, TSIG_RECORD_BYTES_MAX, TsigKey, TsigKeyError, VerifiedRequest};
use hickory_proto::ProtoError;
use hickory_proto::op::{Message, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder, NameEncoding};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// Largest message of a transfer, its TSIG record included: what the 2-byte TCP length prefix
/// can say (RFC 5936 §2.2). Only a record too big for `MESSAGE_POINTABLE_BYTES` makes one
/// this large.
pub const MESSAGE_BYTES_MAX: usize = 65_535;
/// A transfer message is closed once it holds this many bytes: every offset below it can be
/// the target of a 14-bit compression pointer, so every owner in the message can be pointed
/// at. Knot's choice too; each message then costs one TSIG record (about 0.5%) more.
pub const MESSAGE_POINTABLE_BYTES: usize = POINTER_TARGET_MAX;
/// Changed names the IXFR history keeps by default (`dns.transfer.ixfr_history_names_max`).
pub const IXFR_HISTORY_NAMES_DEFAULT: usize = 100_000;
/// Messages encoded ahead of the connection: enough to keep the socket busy while the next is
/// encoded, few enough (at most 128 KiB) that a stalled secondary holds little memory.
pub const MESSAGES_QUEUED: usize = 2;

const TYPE_AXFR: u16 = 252;
const TYPE_IXFR: u16 = 251;

/// Who may transfer the zone, with which keys.
pub struct TransferPolicy {
    keys: Vec<TsigKey>,
    /// Each allowed prefix and the index of its key in `keys` (`None`: unsigned, only when
    /// `tsig_required` is off).
    secondaries: Vec<(IpPrefix, Option<usize>)>,
    tsig_required: bool,
    /// Transfers being encoded (`dns.transfer.transfers_max`).
    permits: Arc<Semaphore>,
    /// The secondaries to NOTIFY after each change, with their keys.
    notify: Vec<NotifyTarget>,
    ixfr_history_names_max: usize,
}

/// What a transfer request may do.
#[derive(Debug)]
pub enum Access {
    /// Not from an allowed address, or unsigned where a signature is required.
    Refused,
    /// Signed, and the signature failed a check: NOTAUTH with the TSIG error.
    Failed(RequestError),
    /// Allowed; signed with this key when `Some`.
    Allowed(Option<VerifiedRequest>),
}

impl TransferPolicy {
    /// Nobody may transfer; signed queries are checked against no key (BADKEY).
    pub fn closed() -> TransferPolicy {
        TransferPolicy {
            keys: Vec::new(),
            secondaries: Vec::new(),
            tsig_required: true,
            permits: Arc::new(Semaphore::new(1)),
            notify: Vec::new(),
            ixfr_history_names_max: IXFR_HISTORY_NAMES_DEFAULT,
        }
    }

    /// The policy of `[dns.transfer]` (checked by `TransferConfig::check`); reads secret files
    /// relative to `config_dir`.
    pub fn from_config(config: &TransferConfig, config_dir: &Path) -> Result<TransferPolicy, TsigKeyError> {
        let keys = tsig::keys_from_config(&config.keys, config_dir)?;
        let secondaries: Vec<(IpPrefix, Option<usize>)> = config
            .secondaries
            .iter()
            .map(|s| {
                let key = s.key.as_ref().and_then(|name| {
                    let wanted = normal_key_name(name);
                    keys.iter().position(|k| k.name().to_string() == wanted)
                });
                (s.address, key)
            })
            .collect();
        let notify = config
            .secondaries
            .iter()
            .zip(&secondaries)
            .filter_map(|(s, (_, key))| s.notify.map(|addr| NotifyTarget { addr, key: key.map(|i| keys[i].clone()) }))
            .collect();
        Ok(TransferPolicy {
            keys,
            secondaries,
            tsig_required: config.tsig_required,
            permits: Arc::new(Semaphore::new(config.transfers_max.max(1))),
            notify,
            ixfr_history_names_max: config.ixfr_history_names_max,
        })
    }

    /// Changed names the IXFR history keeps.
    pub fn ixfr_history_names_max(&self) -> usize {
        self.ixfr_history_names_max
    }

    /// The secondaries to NOTIFY after each change.
    pub fn notify_targets(&self) -> &[NotifyTarget] {
        &self.notify
    }

    /// Every configured key.
    pub fn keys(&self) -> &[TsigKey] {
        &self.keys
    }

    /// Whether `packet`, a transfer request from `peer`, may be answered, as of
    /// `now_unix_secs`. The address is checked first, so a client outside every prefix
    /// learns nothing about keys.
    pub fn access(&self, peer: IpAddr, packet: &[u8], now_unix_secs: u64) -> Access {
        let allowed: Vec<Option<usize>> = self.secondaries.iter().filter(|(p, _)| p.contains(peer)).map(|(_, k)| *k).collect();
        if allowed.is_empty() {
            return Access::Refused;
        }
        let keys = allowed.iter().flatten().map(|&i| &self.keys[i]);
        match quiet(|| tsig::verify_request(keys, packet, now_unix_secs)) {
            Ok(verified) => Access::Allowed(Some(verified)),
            Err(RequestError::Unsigned) if !self.tsig_required && allowed.contains(&None) => Access::Allowed(None),
            Err(RequestError::Unsigned | RequestError::Malformed) => Access::Refused,
            Err(failed) => Access::Failed(failed),
        }
    }
}

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

fn tsig_error(
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

fn finish_one(bytes: Vec<u8>, signer: Option<ResponseSigner>, qtype: RecordType, rcode: ResponseCode) -> Option<(Vec<u8>, Outcome)> {
    let bytes = match signer {
        Some(mut signer) => signer.sign(&bytes).ok()?,
        None => bytes,
    };
    Some((bytes.clone(), Outcome { qtype: Some(qtype), rcode, truncated: false, bytes: bytes.len(), malformed: None }))
}

/// Runs `f` with no tracing subscriber: hickory's decoder logs client-chosen text at WARN for
/// some malformed options (see `answer`), and every TSIG check decodes the client's message.
fn quiet<T>(f: impl FnOnce() -> T) -> T {
    tracing::dispatcher::with_default(&tracing::Dispatch::none(), f)
}

/// Decodes a request quietly (`quiet`).
fn decode(packet: &[u8]) -> Option<Message> {
    quiet(|| Message::from_vec(packet)).ok()
}

/// The answer with the question and, for NOERROR, the current SOA alone (an IXFR client
/// that is current, or any IXFR over UDP); NOTAUTH has no records.
fn soa_only(request: &Message, snapshot: &Snapshot, rcode: ResponseCode) -> Result<Vec<u8>, ProtoError> {
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

/// Every record of the zone in transfer order: the SOA, the apex's records, every other
/// name's, the SOA again.
pub fn zone_records(snapshot: &Snapshot) -> impl Iterator<Item = Record> + '_ {
    let soa = snapshot.zone.soa_record(snapshot.serial, snapshot.zone.soa_ttl_secs);
    let apex = snapshot.get_key(&snapshot.origin_key);
    let others = snapshot.entries().filter(|e| *e.key != *snapshot.origin_key);
    std::iter::once(soa.clone()).chain(apex.into_iter().chain(others).flat_map(entry_records)).chain(std::iter::once(soa))
}

/// The records of one name as a secondary should serve them: what `answer::collect` serves
/// for each type, every eligible target (weights are not carried), no SOA (it frames the
/// transfer).
pub fn entry_records(entry: &Entry) -> Vec<Record> {
    let mut out = Vec::new();
    if let Some(m) = &entry.managed
        && let Some(name) = entry.name()
    {
        out.extend(m.v4.targets.iter().map(|(a, _)| Record::from_rdata(name.clone(), m.ttl_secs, RData::A(A(*a)))));
        out.extend(m.v6.targets.iter().map(|(a, _)| Record::from_rdata(name.clone(), m.ttl_secs, RData::AAAA(AAAA(*a)))));
    }
    let shadowed = |t: RecordType| entry.managed.is_some() && matches!(t, RecordType::A | RecordType::AAAA | RecordType::CNAME);
    out.extend(entry.statics.iter().filter(|r| r.record_type() != RecordType::SOA && !shadowed(r.record_type())).cloned());
    out
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
    let Ok(Ok(permit)) = tokio::time::timeout(idle, serving.transfer.permits.clone().acquire_owned()).await else {
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

#[cfg(test)]
mod tests {
    use crate::snapshot::{serial_newer, serial_of};

    /// Each applied change gives a serial newer than the last one in RFC 1982 arithmetic,
    /// across the wrap from 2^32 - 1 to 0 and from any `serial_base`; a store that starts
    /// over at 0 is older to the secondaries unless `serial_base` is set past their serial.
    #[test]
    fn serials_increase_in_rfc_1982_arithmetic_across_the_wrap() {
        let counts =
            [0u64, 1, 2, (1 << 31) - 1, 1 << 31, u64::from(u32::MAX) - 1, u64::from(u32::MAX), 1 << 32, (1 << 32) + 1, (1 << 33) + 7];
        for base in [0, 7, u32::MAX - 3, 1 << 31] {
            for pair in counts.windows(2) {
                let (before, after) = (serial_of(base, pair[0]), serial_of(base, pair[1]));
                if pair[1] - pair[0] < 1 << 31 {
                    assert!(serial_newer(after, before), "base {base}: count {} -> {}: serial {before} -> {after}", pair[0], pair[1]);
                    assert!(!serial_newer(before, after));
                }
            }
        }
        assert_eq!(serial_of(0, u64::from(u32::MAX) + 1), 0, "the wrap");
        assert!(serial_newer(0, u32::MAX) && serial_newer(3, u32::MAX - 3));
        assert!(!serial_newer(5, 5) && !serial_newer(0, 1 << 31) && !serial_newer(1 << 31, 0), "equal, or 2^31 apart: undefined");
        let held = serial_of(0, 123_456);
        assert!(!serial_newer(serial_of(0, 1), held), "a new, empty store's serials are older than the secondaries'");
        assert!(serial_newer(serial_of(held.wrapping_add(1), 0), held), "serial_base = their serial + 1 puts it right");
    }
}
