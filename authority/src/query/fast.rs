//! The UDP fast path: the common query answered straight from the packet's bytes and the
//! snapshot, with no parse into a `Message`, no allocation and one hash lookup.
//!
//! It takes only what it can answer exactly as `answer::respond` would: a standard QUERY with
//! one question of class IN for a name inside the zone, no answer or authority records, at
//! most an EDNS version-0 OPT record, asking A or AAAA at a managed name, anything but ANY at a
//! managed name without static records, A or AAAA at a static name without a CNAME in a zone
//! without delegations (a static zone's hosts), NS at the apex (the answer `snapshot` precompiled,
//! with glue), or any type at a name that does not exist or is an empty non-terminal in a
//! zone without delegations and wildcards (in one with them, such a name may be below a cut or
//! covered by a wildcard, which the reference path works out). Managed names are never at or
//! below a cut (`snapshot` does not serve them there), so their answers stay here.
//! Everything else — other static records, ANY, other opcodes, other classes, zone transfers,
//! names outside the zone, EDNS versions above 0, answers that do not fit and anything
//! malformed (options that do not frame, a malformed client-subnet option) — goes to
//! `answer::respond`, which stays the reference. The tests in `tests/fast_path.rs` compare
//! the two, to the byte count. Response-rate limiting is applied to either path's answer
//! afterwards (`rrl`).
//!
//! Answers are as small as NSD's: the SOA of a negative answer has its owner, MNAME and RNAME
//! compressed against the question (`compress`), and glue that does not fit the client's
//! size is left out a whole RRset at a time, without TC (RFC 2181 §9), as NSD and Knot do.

use crate::query::answer::{AnswerLimits, FAMILY_TARGETS_MAX, Outcome, UDP_PAYLOAD_BYTES_MIN, sample_indices};
use crate::query::wire::{self, TYPE_OPT, u16_at};
use crate::zone::compress::{Written, write_name};
use crate::zone::signed::rrsigs;
use crate::zone::snapshot::{ApexNs, Entry, NAME_WIRE_BYTES_MAX, Snapshot, hash_key};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use rand::Rng;

/// What the fast path did with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fast {
    /// The answer is in the output buffer.
    Answered(Outcome),
    /// Not a query (too short, or a response): send nothing.
    Drop,
    /// Not for the fast path: ask `answer::respond`.
    Slow,
}

const TYPE_A: u16 = 1;
const TYPE_NS: u16 = 2;
const TYPE_SOA: u16 = 6;
const TYPE_AAAA: u16 = 28;
const TYPE_IXFR: u16 = 251;
const TYPE_AXFR: u16 = 252;
const TYPE_ANY: u16 = 255;
const CLASS_IN: u16 = 1;
/// RR header after a compressed owner: type, class, TTL, RDLENGTH.
const RR_FIXED_BYTES: usize = 2 + 2 + 2 + 4 + 2;
const OPT_BYTES: usize = 11;

/// The question as read from the packet.
struct Question {
    /// Lower-case wire form of the name.
    key: [u8; NAME_WIRE_BYTES_MAX],
    key_len: usize,
    /// Offset of each label in the packet.
    label_at: [u16; 128],
    labels: usize,
    qtype: u16,
    /// Where the question ends in the packet.
    end: usize,
}

fn read_question(p: &[u8]) -> Option<Question> {
    let mut q = Question { key: [0; NAME_WIRE_BYTES_MAX], key_len: 0, label_at: [0; 128], labels: 0, qtype: 0, end: 0 };
    let mut at = 12;
    loop {
        let len = usize::from(*p.get(at)?);
        if len == 0 {
            break;
        }
        // Compression pointers (0xC0) and the reserved label types have high bits set; labels
        // are at most 63 bytes. Queries carry their name in full.
        if len > 63 || q.labels == q.label_at.len() || q.key_len + 1 + len + 1 > NAME_WIRE_BYTES_MAX {
            return None;
        }
        let label = p.get(at + 1..at + 1 + len)?;
        q.label_at[q.labels] = at as u16;
        q.labels += 1;
        q.key[q.key_len] = len as u8;
        for (dst, src) in q.key[q.key_len + 1..].iter_mut().zip(label) {
            *dst = src.to_ascii_lowercase();
        }
        q.key_len += 1 + len;
        at += 1 + len;
    }
    q.key[q.key_len] = 0;
    q.key_len += 1;
    q.qtype = u16_at(p, at + 1)?;
    if u16_at(p, at + 3)? != CLASS_IN {
        return None;
    }
    q.end = at + 5;
    Some(q)
}

/// What the fast path reads from a query's OPT record.
#[derive(Clone, Copy)]
struct ClientEdns {
    /// The client's UDP payload size.
    payload: u16,
    /// The DO bit (RFC 3225), which the response's OPT record copies.
    dnssec_ok: bool,
}

/// The DO bit in the high byte of the OPT record's flags.
const FLAG_DO: u8 = 0x80;

/// The client's EDNS if the rest of the packet is exactly one well-formed version-0 OPT
/// record (options framed and the client subnet checked as `respond` checks them, but not
/// used). `Some(None)`: no EDNS and nothing after the question.
fn read_edns(p: &[u8], at: usize, additional: u16) -> Option<Option<ClientEdns>> {
    match additional {
        0 => (at == p.len()).then_some(None),
        1 => {
            if *p.get(at)? != 0 || u16_at(p, at + 1)? != TYPE_OPT || *p.get(at + 6)? != 0 {
                return None; // not an OPT at the root, or a version above 0 (BADVERS)
            }
            let payload = u16_at(p, at + 3)?;
            let dnssec_ok = *p.get(at + 7)? & FLAG_DO != 0;
            let rdlen = usize::from(u16_at(p, at + 9)?);
            let options = p.get(at + OPT_BYTES..)?;
            (options.len() == rdlen && wire::edns_options_ok(options)).then_some(Some(ClientEdns { payload, dnssec_ok }))
        }
        _ => None,
    }
}

/// Answers `packet` into `out` if it is for the fast path. `out` is cleared first.
pub fn respond_fast(packet: &[u8], snapshot: &Snapshot, limits: &AnswerLimits, rng: &mut impl Rng, out: &mut Vec<u8>) -> Fast {
    out.clear();
    let p = packet;
    if p.len() < 12 || p[2] & 0x80 != 0 {
        return Fast::Drop; // not a header, or a response: never answer (no reflection loops)
    }
    // OPCODE 0 (QUERY), one question, no answers, no authority.
    if (p[2] >> 3) & 0x0f != 0 || p[4..6] != [0, 1] || p[6..10] != [0, 0, 0, 0] {
        return Fast::Slow;
    }
    let Some(q) = read_question(p) else { return Fast::Slow };
    let Some(edns) = read_edns(p, q.end, u16::from_be_bytes([p[10], p[11]])) else { return Fast::Slow };
    if matches!(q.qtype, TYPE_AXFR | TYPE_IXFR) {
        return Fast::Slow;
    }
    // A signed zone's answers with DO=1 carry signatures: here for the addresses of a name
    // (`signatures`), by the reference path for everything else and for every denial proof
    // (`query::dnssec`).
    let dnssec = edns.is_some_and(|e| e.dnssec_ok) && snapshot.is_signed();
    if dnssec && !matches!(q.qtype, TYPE_A | TYPE_AAAA) {
        return Fast::Slow;
    }
    // Inside the zone: the name ends with the origin at a label boundary.
    let origin = &snapshot.origin_key;
    let origin_labels = snapshot.origin_labels;
    if q.labels < origin_labels
        || q.key_len < origin.len()
        || usize::from(q.label_at[q.labels - origin_labels]) - 12 != q.key_len - origin.len()
        || q.key[q.key_len - origin.len()..q.key_len] != origin[..]
    {
        return Fast::Slow;
    }
    let key = &q.key[..q.key_len];
    let entry = snapshot.get_hashed(key, hash_key(key));
    let udp_limit = match edns {
        Some(ClientEdns { payload, .. }) => {
            usize::from(payload.clamp(UDP_PAYLOAD_BYTES_MIN, limits.edns_udp_payload_bytes.max(UDP_PAYLOAD_BYTES_MIN)))
        }
        None => usize::from(UDP_PAYLOAD_BYTES_MIN),
    };
    let question = &p[12..q.end];
    match entry {
        Some(e) if e.has_data() => answer_at(p, question, &q, e, edns, snapshot, limits, udp_limit, rng, out),
        // A name without data of its own may be below a zone cut (a referral) or covered by
        // a wildcard: the reference path walks the zone for it.
        _ if snapshot.zone.has_cuts_or_wildcards() => Fast::Slow,
        // An empty non-terminal: NODATA.
        Some(_) => negative(p, question, &q, origin_labels, ResponseCode::NoError, edns, snapshot, limits, udp_limit, out),
        None => negative(p, question, &q, origin_labels, ResponseCode::NXDomain, edns, snapshot, limits, udp_limit, out),
    }
}

#[allow(clippy::too_many_arguments)]
fn answer_at(
    p: &[u8],
    question: &[u8],
    q: &Question,
    entry: &Entry,
    edns: Option<ClientEdns>,
    snapshot: &Snapshot,
    limits: &AnswerLimits,
    udp_limit: usize,
    rng: &mut impl Rng,
    out: &mut Vec<u8>,
) -> Fast {
    let origin_labels = snapshot.origin_labels;
    if q.qtype == TYPE_NS && q.labels == origin_labels {
        // The apex (the name is inside the zone and has as many labels as the origin).
        let Some(ns) = &snapshot.apex_ns else { return Fast::Slow };
        return apex_ns(p, question, q, ns, edns, limits, udp_limit, out);
    }
    let Some(m) = &entry.managed else { return static_addresses(p, question, q, entry, edns, snapshot, limits, udp_limit, out) };
    let mut picked = [0u8; FAMILY_TARGETS_MAX];
    let signed = Signatures::of(entry, q.qtype, edns, snapshot);
    match q.qtype {
        TYPE_A | TYPE_AAAA => {
            // Signed: the whole RRset, the one its signature covers, in the weighted order.
            let k = if signed.is_some() { FAMILY_TARGETS_MAX } else { limits.answer_addresses_max };
            let (count, rdlen) = if q.qtype == TYPE_A {
                (sample_indices(&m.v4, k, rng, &mut picked), 4)
            } else {
                (sample_indices(&m.v6, k, rng, &mut picked), 16)
            };
            if count == 0 {
                return negative(p, question, q, origin_labels, ResponseCode::NoError, edns, snapshot, limits, udp_limit, out);
            }
            let Some(signed) = signed.unwrap_or(Some(Signatures::NONE)) else { return Fast::Slow };
            let size =
                12 + question.len() + count * (2 + RR_FIXED_BYTES + rdlen) + signed.bytes + if edns.is_some() { OPT_BYTES } else { 0 };
            if size > udp_limit {
                return Fast::Slow; // `respond` truncates
            }
            header(p, out, ResponseCode::NoError, (count + signed.count) as u16, 0, u16::from(edns.is_some()));
            out.extend_from_slice(question);
            for &i in &picked[..count] {
                if q.qtype == TYPE_A {
                    address_record(out, q.qtype, m.ttl_secs, &m.v4.targets[usize::from(i)].0.octets());
                } else {
                    address_record(out, q.qtype, m.ttl_secs, &m.v6.targets[usize::from(i)].0.octets());
                }
            }
            signed.write(entry, q.qtype, out);
            if let Some(edns) = edns {
                opt(out, limits, edns.dnssec_ok);
            }
            Fast::Answered(outcome(q.qtype, ResponseCode::NoError, out.len()))
        }
        // ANY gathers static records too; the reference path answers it.
        TYPE_ANY => Fast::Slow,
        // Other types at a managed name: nothing unless a static record of that type exists.
        _ if entry.statics.is_empty() => {
            negative(p, question, q, origin_labels, ResponseCode::NoError, edns, snapshot, limits, udp_limit, out)
        }
        _ => Fast::Slow,
    }
}

/// A or AAAA at a name with static records only (a static zone's names, the name servers'
/// addresses): its records of the type in zone order, as `answer::collect` gives them, or
/// NODATA. A name with a CNAME, any other type, and every name of a zone with delegations (it
/// may be at or below a cut) go to the reference path.
#[allow(clippy::too_many_arguments)]
fn static_addresses(
    p: &[u8],
    question: &[u8],
    q: &Question,
    entry: &Entry,
    edns: Option<ClientEdns>,
    snapshot: &Snapshot,
    limits: &AnswerLimits,
    udp_limit: usize,
    out: &mut Vec<u8>,
) -> Fast {
    if !matches!(q.qtype, TYPE_A | TYPE_AAAA) || !snapshot.zone.cuts.is_empty() {
        return Fast::Slow;
    }
    let wanted = RecordType::from(q.qtype);
    let mut count = 0;
    for r in entry.statics.raw() {
        match r.rtype {
            RecordType::CNAME => return Fast::Slow,
            t if t == wanted && r.rdata.len() == if q.qtype == TYPE_A { 4 } else { 16 } => count += 1,
            _ => {}
        }
    }
    if count == 0 {
        return negative(p, question, q, snapshot.origin_labels, ResponseCode::NoError, edns, snapshot, limits, udp_limit, out);
    }
    let Some(signed) = Signatures::of(entry, q.qtype, edns, snapshot).unwrap_or(Some(Signatures::NONE)) else { return Fast::Slow };
    let rdlen = if q.qtype == TYPE_A { 4 } else { 16 };
    let size = 12 + question.len() + count * (2 + RR_FIXED_BYTES + rdlen) + signed.bytes + if edns.is_some() { OPT_BYTES } else { 0 };
    if size > udp_limit || count + signed.count > usize::from(u16::MAX) {
        return Fast::Slow; // `respond` truncates
    }
    header(p, out, ResponseCode::NoError, (count + signed.count) as u16, 0, u16::from(edns.is_some()));
    out.extend_from_slice(question);
    for r in entry.statics.raw().filter(|r| r.rtype == wanted && r.rdata.len() == rdlen) {
        address_record(out, q.qtype, r.ttl, r.rdata);
    }
    signed.write(entry, q.qtype, out);
    if let Some(edns) = edns {
        opt(out, limits, edns.dnssec_ok);
    }
    Fast::Answered(outcome(q.qtype, ResponseCode::NoError, out.len()))
}

/// The RRSIGs a DO=1 answer of a signed zone carries with the addresses of one name: how
/// many, and their bytes as written (owner a pointer to the question, RDATA as signed).
#[derive(Clone, Copy)]
struct Signatures {
    count: usize,
    bytes: usize,
}

impl Signatures {
    const NONE: Signatures = Signatures { count: 0, bytes: 0 };

    /// `None`: no signatures asked (no DO, or an unsigned zone). `Some(None)`: asked, but the
    /// name has none for the type (the reference path answers).
    fn of(entry: &Entry, qtype: u16, edns: Option<ClientEdns>, snapshot: &Snapshot) -> Option<Option<Signatures>> {
        if !(edns.is_some_and(|e| e.dnssec_ok) && snapshot.is_signed()) {
            return None;
        }
        let (count, bytes) =
            rrsigs(entry, RecordType::from(qtype)).fold((0, 0), |(n, b), r| (n + 1, b + 2 + RR_FIXED_BYTES + r.rdata.len()));
        Some((count > 0).then_some(Signatures { count, bytes }))
    }

    fn write(self, entry: &Entry, qtype: u16, out: &mut Vec<u8>) {
        if self.count == 0 {
            return;
        }
        for r in rrsigs(entry, RecordType::from(qtype)) {
            out.extend_from_slice(&[0xc0, 0x0c]);
            out.extend_from_slice(&u16::from(RecordType::RRSIG).to_be_bytes());
            out.extend_from_slice(&CLASS_IN.to_be_bytes());
            out.extend_from_slice(&r.ttl.to_be_bytes());
            out.extend_from_slice(&(r.rdata.len() as u16).to_be_bytes());
            out.extend_from_slice(r.rdata);
        }
    }
}

/// One A or AAAA record of the answer: its owner a pointer to the question's name at offset 12
/// (in the client's case), class IN, `ttl`, the address's bytes.
fn address_record(out: &mut Vec<u8>, qtype: u16, ttl: u32, address: &[u8]) {
    out.extend_from_slice(&[0xc0, 0x0c]);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out.extend_from_slice(&ttl.to_be_bytes());
    out.extend_from_slice(&(address.len() as u16).to_be_bytes());
    out.extend_from_slice(address);
}

/// The precompiled apex NS answer, with as much of its glue as fits `udp_limit` (whole
/// RRsets, in order); the reference path truncates when the NS RRset itself does not fit.
#[allow(clippy::too_many_arguments)]
fn apex_ns(
    p: &[u8],
    question: &[u8],
    q: &Question,
    ns: &ApexNs,
    edns: Option<ClientEdns>,
    limits: &AnswerLimits,
    udp_limit: usize,
    out: &mut Vec<u8>,
) -> Fast {
    let fixed = 12 + question.len() + if edns.is_some() { OPT_BYTES } else { 0 };
    if fixed + ns.answers_end > udp_limit {
        return Fast::Slow;
    }
    let (end, glue) = ns.glue.iter().rev().find(|(end, _)| fixed + end <= udp_limit).copied().unwrap_or((ns.answers_end, 0));
    header(p, out, ResponseCode::NoError, ns.answers, 0, glue + u16::from(edns.is_some()));
    out.extend_from_slice(question);
    // The wire's pointers expect the question at 12 with the origin's length, which a name
    // at the apex has (queries carry names uncompressed).
    out.extend_from_slice(&ns.wire[..end]);
    if let Some(edns) = edns {
        opt(out, limits, edns.dnssec_ok);
    }
    Fast::Answered(outcome(q.qtype, ResponseCode::NoError, out.len()))
}

#[allow(clippy::too_many_arguments)]
fn negative(
    p: &[u8],
    question: &[u8],
    q: &Question,
    origin_labels: usize,
    rcode: ResponseCode,
    edns: Option<ClientEdns>,
    snapshot: &Snapshot,
    limits: &AnswerLimits,
    udp_limit: usize,
    out: &mut Vec<u8>,
) -> Fast {
    // A signed zone's denial proofs with DO=1: the reference path (`query::dnssec`).
    if edns.is_some_and(|e| e.dnssec_ok) && snapshot.is_signed() {
        return Fast::Slow;
    }
    header(p, out, rcode, 0, 1, u16::from(edns.is_some()));
    out.extend_from_slice(question);
    // Owner: a pointer to where the origin starts inside the question's name.
    let origin_at = q.label_at[q.labels - origin_labels];
    out.extend_from_slice(&(0xc000 | origin_at).to_be_bytes());
    out.extend_from_slice(&TYPE_SOA.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out.extend_from_slice(&snapshot.zone.negative_ttl_secs().to_be_bytes());
    let rdlength_at = out.len();
    out.extend_from_slice(&[0, 0]);
    // MNAME and RNAME point into the question where they share a suffix with it (the origin
    // at least, for names in the zone), RNAME into MNAME where that is longer.
    let [mname, rname] = &*snapshot.soa_names;
    let asked = Written::whole(&q.key[..q.key_len], 12);
    let mname = write_name(out, mname, &[asked]);
    write_name(out, rname, &[asked, mname]);
    out.extend_from_slice(&snapshot.soa_tail);
    let rdlength = (out.len() - rdlength_at - 2) as u16;
    out[rdlength_at..rdlength_at + 2].copy_from_slice(&rdlength.to_be_bytes());
    if let Some(edns) = edns {
        opt(out, limits, edns.dnssec_ok);
    }
    if out.len() > udp_limit {
        out.clear();
        return Fast::Slow; // `respond` truncates
    }
    Fast::Answered(outcome(q.qtype, rcode, out.len()))
}

/// The response header: the query's id, QR and AA set, RD and CD copied, RA clear.
fn header(p: &[u8], out: &mut Vec<u8>, rcode: ResponseCode, answers: u16, authority: u16, additional: u16) {
    out.extend_from_slice(&p[0..2]);
    out.push(0x80 | 0x04 | (p[2] & 0x01));
    out.push((p[3] & 0x10) | (u16::from(rcode) as u8 & 0x0f));
    out.extend_from_slice(&[0, 1]);
    out.extend_from_slice(&answers.to_be_bytes());
    out.extend_from_slice(&authority.to_be_bytes());
    out.extend_from_slice(&additional.to_be_bytes());
}

/// Our OPT record: root owner, our UDP payload size, extended rcode 0, version 0, the
/// query's DO bit (RFC 3225 §3) and no other flags, no options.
fn opt(out: &mut Vec<u8>, limits: &AnswerLimits, dnssec_ok: bool) {
    out.push(0);
    out.extend_from_slice(&TYPE_OPT.to_be_bytes());
    out.extend_from_slice(&limits.edns_udp_payload_bytes.max(UDP_PAYLOAD_BYTES_MIN).to_be_bytes());
    let flags = if dnssec_ok { FLAG_DO } else { 0 };
    out.extend_from_slice(&[0, 0, flags, 0, 0, 0]);
}

fn outcome(qtype: u16, rcode: ResponseCode, bytes: usize) -> Outcome {
    Outcome { qtype: Some(RecordType::from(qtype)), rcode, truncated: false, bytes, malformed: None }
}
