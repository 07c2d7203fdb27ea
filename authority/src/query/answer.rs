//! The query path: one DNS message in, one DNS message out (or nothing), from a snapshot.
//!
//! Pure apart from the random source for weighted sampling: no I/O, no locks, no waiting.
//! Decisions, in order: drop what is not a query (too short for a header, or a response);
//! FORMERR for what does not parse or asks more than one question; NOTIMP for opcodes other
//! than QUERY; BADVERS for EDNS versions above 0; REFUSED for other classes, zone transfers
//! and names outside the DNS zone; then NOERROR with answers, NODATA (NOERROR, SOA in
//! authority) or NXDOMAIN (SOA in authority). Negative answers carry the SOA with TTL
//! min(SOA TTL, SOA MINIMUM) (RFC 2308). The server advertises its own EDNS UDP payload size
//! and copies the query's DO bit (RFC 3225).
//! The apex NS answer carries glue: the in-zone name servers' A RRsets, then their AAAA RRsets
//! (what an A or AAAA query at each name answers), in NS order, as NSD and Knot send it.
//! UDP answers that do not fit the client's size lose glue a whole RRset at a time from the
//! end, without TC (glue is additional data, RFC 2181 §9; RFC 9471's TC rule is for
//! referrals, which this server does not make); an answer that still does not fit is sent
//! with TC=1 and no records.
//!
//! Names are compressed as NSD compresses them: hickory's encoder compresses a name only
//! against names of the same case, so every name in an answer takes the question's case for
//! the labels it shares with the question's name, and lower case for the rest
//! (`in_question_case`); the SOA's owner, MNAME and RNAME then point into a question in any
//! case, as on the fast path.
//!
//! ANY is answered minimally (RFC 8482): one RRset of the name, not all of them, over every
//! transport. A query whose OPT record's options do not frame, or whose client-subnet option
//! is malformed (RFC 7871 §6), is FORMERR. Nothing here logs per packet: what was wrong with a
//! packet is in `Outcome::malformed`, which the listeners count; hickory's decoder, which
//! logs at WARN about options that do not frame, runs with no subscriber.

use crate::query::wire;
use crate::zone::snapshot::{Entry, Family, Found, Managed, Snapshot, wire_key};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use rand::{Rng, RngExt};

/// Smallest UDP payload every client accepts (RFC 1035).
pub const UDP_PAYLOAD_BYTES_MIN: u16 = 512;
/// Largest TCP message (the 2-byte length prefix).
pub const TCP_MESSAGE_BYTES_MAX: usize = 65_535;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct AnswerLimits {
    /// The EDNS UDP payload size this server advertises and the most it sends over UDP.
    /// 1232 avoids IP fragmentation on common paths (DNS flag day 2020).
    pub edns_udp_payload_bytes: u16,
    /// Most addresses per answer.
    pub answer_addresses_max: usize,
}

impl Default for AnswerLimits {
    fn default() -> Self {
        AnswerLimits { edns_udp_payload_bytes: 1_232, answer_addresses_max: 8 }
    }
}

/// What happened, for metrics and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub qtype: Option<RecordType>,
    pub rcode: ResponseCode,
    pub truncated: bool,
    pub bytes: usize,
    /// What was wrong with the query, when it was answered FORMERR for it.
    pub malformed: Option<Malformed>,
}

/// What was wrong with a packet that is not a well-formed query. Counted per reason
/// (`dnsplan_dns_malformed_total`), never logged per packet: the packets are the client's
/// choice, and a spoofed flood of them would otherwise fill the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// Shorter than a DNS header: dropped.
    Short = 0,
    /// A response (QR=1), not a query: dropped, so two servers never answer each other.
    Response = 1,
    /// The message does not decode: FORMERR.
    Unparsable = 2,
    /// The OPT record's options do not frame, or a client-subnet option is malformed: FORMERR.
    EdnsOption = 3,
}

impl Malformed {
    /// Every reason, each at the index of its discriminant.
    pub const ALL: [Malformed; 4] = [Malformed::Short, Malformed::Response, Malformed::Unparsable, Malformed::EdnsOption];

    /// Why a packet that neither path answers was dropped (see `respond`'s first check).
    pub fn of_dropped(packet: &[u8]) -> Malformed {
        if packet.len() < 12 { Malformed::Short } else { Malformed::Response }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Malformed::Short => "short",
            Malformed::Response => "response",
            Malformed::Unparsable => "unparsable",
            Malformed::EdnsOption => "edns_option",
        }
    }
}

/// Answers one DNS message. `None` means: send nothing.
pub fn respond(
    packet: &[u8],
    snapshot: &Snapshot,
    transport: Transport,
    limits: &AnswerLimits,
    rng: &mut impl Rng,
) -> Option<(Vec<u8>, Outcome)> {
    if packet.len() < 12 || packet[2] & 0x80 != 0 {
        return None; // not a header, or a response: never answer (no reflection loops)
    }
    // Checked before hickory decodes: it drops malformed options silently (after a WARN line)
    // and answers as if they were not there; its client-subnet decoder fails on some
    // malformed options and not others.
    if wire::opt_rdata(packet).is_some_and(|options| !wire::edns_options_ok(options)) {
        return form_error(packet, Malformed::EdnsOption, transport);
    }
    // hickory logs at WARN when options do not frame, in any OPT record it decodes (one the
    // check above did not look at: a second one, one in the answer section): one line per
    // packet, worded by the client. The message is refused all the same.
    let decoded = tracing::dispatcher::with_default(&tracing::Dispatch::none(), || Message::from_vec(packet));
    let request = match decoded {
        Ok(m) => m,
        Err(_) => return form_error(packet, Malformed::Unparsable, transport),
    };
    let mut resp = Message::response(request.metadata.id, request.metadata.op_code);
    resp.metadata.recursion_desired = request.metadata.recursion_desired;
    resp.metadata.checking_disabled = request.metadata.checking_disabled;
    resp.metadata.recursion_available = false;
    if request.metadata.message_type != MessageType::Query {
        return None;
    }
    let udp_limit = match &request.edns {
        Some(edns) => edns.max_payload().clamp(UDP_PAYLOAD_BYTES_MIN, limits.edns_udp_payload_bytes.max(UDP_PAYLOAD_BYTES_MIN)),
        None => UDP_PAYLOAD_BYTES_MIN,
    };
    // A signed zone answers DO=1 with its signatures (`dnssec`), and a managed endpoint's
    // whole RRset, the one signed (in the sampler's weighted order).
    let dnssec = snapshot.is_signed() && request.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok);
    let whole = AnswerLimits { answer_addresses_max: FAMILY_TARGETS_MAX, ..*limits };
    let limits = if dnssec { &whole } else { limits };
    if let Some(asked) = &request.edns {
        let mut edns = Edns::new();
        // RFC 3225 §3: the DO bit of the query is copied into the response.
        edns.set_max_payload(limits.edns_udp_payload_bytes.max(UDP_PAYLOAD_BYTES_MIN))
            .set_version(0)
            .set_dnssec_ok(asked.flags().dnssec_ok);
        resp.set_edns(edns);
    }
    resp.add_queries(request.queries.iter().cloned());
    let qtype = request.queries.first().map(|q| q.query_type());
    if request.queries.len() != 1 {
        resp.metadata.response_code = ResponseCode::FormErr;
        return finish(resp, qtype, transport, udp_limit);
    }
    if request.metadata.op_code != OpCode::Query {
        resp.metadata.response_code = ResponseCode::NotImp;
        return finish(resp, qtype, transport, udp_limit);
    }
    if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
        resp.metadata.response_code = ResponseCode::BADVERS;
        return finish(resp, qtype, transport, udp_limit);
    }
    let query = &request.queries[0];
    let name = query.name().to_lowercase();
    if query.query_class() != DNSClass::IN
        || matches!(query.query_type(), RecordType::AXFR | RecordType::IXFR)
        || !snapshot.zone.origin.zone_of(&name)
    {
        resp.metadata.response_code = ResponseCode::Refused;
        return finish(resp, qtype, transport, udp_limit);
    }
    resp.metadata.authoritative = true;
    let mut glue_rrsets = Vec::new();
    let mut required_glue = 0;
    let qtype_asked = query.query_type();
    let data = match snapshot.find(&wire_key(&name)) {
        // DS at the cut is the parent's data, answered with authority (RFC 4035 §3.1.4.1).
        Found::Cut(cut) if qtype_asked == RecordType::DS && cut.key[..] == wire_key(&name)[..] => Some(cut),
        Found::Cut(cut) => {
            resp.metadata.authoritative = false;
            let (glue, required) = referral(&mut resp, cut, snapshot, limits, rng);
            (glue_rrsets, required_glue) = (glue, required);
            None
        }
        Found::Name(data) | Found::Wildcard(data) => Some(data),
        Found::Empty => {
            negative(&mut resp, snapshot, ResponseCode::NoError);
            None
        }
        Found::Missing => {
            negative(&mut resp, snapshot, ResponseCode::NXDomain);
            None
        }
    };
    if let Some(data) = data {
        // A wildcard's records take the name asked as owner (RFC 4592 §2.1.1), as every
        // answer here does.
        let mut answers = collect(query, data.managed.as_deref(), &data.statics.records(query.name()), limits, rng);
        let ends = follow_cnames(&mut answers, &name, qtype_asked, snapshot, limits, rng);
        if answers.is_empty() {
            negative(&mut resp, snapshot, ResponseCode::NoError);
        } else {
            if qtype_asked == RecordType::NS && name == snapshot.zone.origin {
                let glue = glue(snapshot, &answers, limits, rng);
                glue_rrsets = glue.iter().map(Vec::len).collect();
                resp.add_additionals(glue.into_iter().flatten());
            }
            resp.add_answers(answers);
            match ends {
                ChainEnd::Answered => {}
                // RFC 6604 §3: the rcode is the last name's; RFC 2308: with the SOA.
                ChainEnd::NoData => negative(&mut resp, snapshot, ResponseCode::NoError),
                ChainEnd::NxDomain => negative(&mut resp, snapshot, ResponseCode::NXDomain),
                // RFC 1034 §4.3.2 step 3b: the chain went into a delegation; the answer keeps
                // AA for the CNAMEs, the referral follows in the authority section.
                ChainEnd::Referral(cut) => (glue_rrsets, required_glue) = referral(&mut resp, cut, snapshot, limits, rng),
            }
        }
    }
    if dnssec {
        crate::query::dnssec::add_dnssec(&mut resp, snapshot, &name);
    }
    finish_with_glue(resp, &glue_rrsets, required_glue, qtype, transport, udp_limit)
}

/// FORMERR for a query that could not be read: the header's id, opcode and RD, no question,
/// no OPT record (the smallest answer: 12 bytes).
fn form_error(packet: &[u8], why: Malformed, transport: Transport) -> Option<(Vec<u8>, Outcome)> {
    let id = u16::from_be_bytes([packet[0], packet[1]]);
    let opcode = OpCode::from_u8((packet[2] >> 3) & 0x0f);
    let mut resp = Message::error_msg(id, opcode, ResponseCode::FormErr);
    resp.metadata.recursion_desired = packet[2] & 0x01 != 0;
    let (bytes, mut outcome) = finish(resp, None, transport, UDP_PAYLOAD_BYTES_MIN)?;
    outcome.malformed = Some(why);
    Some((bytes, outcome))
}

fn negative(resp: &mut Message, snapshot: &Snapshot, rcode: ResponseCode) {
    resp.metadata.response_code = rcode;
    let zone = &snapshot.zone;
    resp.add_authority(zone.soa_record(snapshot.serial, zone.negative_ttl_secs()));
}

/// A referral to the child zone at `cut` (RFC 1034 §4.3.2 step 3b): the cut's NS RRset in
/// the authority section and its name servers' addresses as glue in the additional section
/// (A RRsets, then AAAA RRsets, in NS order, as NSD sends them). Returns the glue RRsets'
/// sizes and how many of the first ones are required: RFC 9471 §3.1 wants every in-domain
/// name server's glue (a name at or below the cut, which only this referral can give) or
/// TC=1; other glue is left out when it does not fit. No DS here: a signed zone's referral
/// gets it, with its RRSIG, from `dnssec` when asked with DO=1 (NSD adds it only to signed
/// zones' referrals).
fn referral(resp: &mut Message, cut: &Entry, snapshot: &Snapshot, limits: &AnswerLimits, rng: &mut impl Rng) -> (Vec<usize>, usize) {
    let Some(cut_name) = cut.name() else { return (Vec::new(), 0) };
    let ns: Vec<Record> = cut.statics.records(&cut_name).into_iter().filter(|r| r.record_type() == RecordType::NS).collect();
    let mut rrsets = glue(snapshot, &ns, limits, rng);
    // The in-domain RRsets first, keeping NSD's order within each kind.
    rrsets.sort_by_key(|rrset| !rrset.first().is_some_and(|r| cut_name.zone_of(&r.name)));
    let required = rrsets.iter().filter(|rrset| rrset.first().is_some_and(|r| cut_name.zone_of(&r.name))).count();
    resp.add_authorities(ns);
    let sizes = rrsets.iter().map(Vec::len).collect();
    resp.add_additionals(rrsets.into_iter().flatten());
    (sizes, required)
}

/// Glue for the apex NS RRset `answers`: each in-zone name server's A RRset (once per name,
/// in NS order), then each one's AAAA RRset, each what an A or AAAA query at the name answers
/// (the plan's sampled addresses at a managed name, else the static records). NSD's order:
/// when the answer does not fit, RRsets go from the end, so IPv4 glue for every server stays
/// longest.
fn glue(snapshot: &Snapshot, answers: &[Record], limits: &AnswerLimits, rng: &mut impl Rng) -> Vec<Vec<Record>> {
    let origin = &snapshot.zone.origin;
    let mut servers: Vec<Name> = Vec::new();
    for r in answers {
        if let RData::NS(ns) = &r.data {
            let server = ns.0.to_lowercase();
            if origin.zone_of(&server) && !servers.contains(&server) {
                servers.push(server);
            }
        }
    }
    let mut rrsets = Vec::new();
    for family in [RecordType::A, RecordType::AAAA] {
        for server in &servers {
            let Some(entry) = snapshot.get(server) else { continue };
            let asked = Query::query(server.clone(), family);
            // Only the family's records: a CNAME there would not be glue.
            let rrset: Vec<Record> = collect(&asked, entry.managed.as_deref(), &entry.statics.records(server), limits, rng)
                .into_iter()
                .filter(|r| r.record_type() == family)
                .collect();
            if !rrset.is_empty() {
                rrsets.push(rrset);
            }
        }
    }
    rrsets
}

/// `name` in the case of `question` for the labels they share at the end, and in lower case
/// before them. hickory's encoder compresses a name only against the same bytes, so this is
/// what lets a name point into a question in another case (0x20-randomised resolvers ask
/// in mixed case): the SOA's owner, MNAME and RNAME in a negative answer, the NS names and
/// their glue. What a name says is unchanged (RFC 4343: case does not matter).
fn in_question_case(name: &Name, question: &Name) -> Name {
    let labels: Vec<&[u8]> = name.iter().collect();
    let asked: Vec<&[u8]> = question.iter().collect();
    let shared = labels.iter().rev().zip(asked.iter().rev()).take_while(|(a, b)| a.eq_ignore_ascii_case(b)).count();
    let lower: Vec<Vec<u8>> = labels[..labels.len() - shared].iter().map(|l| l.to_ascii_lowercase()).collect();
    let all = lower.iter().map(Vec::as_slice).chain(asked[asked.len() - shared..].iter().copied());
    match Name::from_labels(all) {
        Ok(mut out) => {
            out.set_fqdn(name.is_fqdn());
            out
        }
        // Not reached (the labels were valid in `name` and `question`); lower case compresses
        // less, and is still the same name.
        Err(_) => name.to_lowercase(),
    }
}

/// Every name of every record in `resp` (owners and the names in SOA, NS, CNAME, PTR and MX
/// RDATA) in the question's case (`in_question_case`), so that it compresses as on the fast
/// path and as NSD compresses it.
fn fold_case(resp: &mut Message) {
    let Some(question) = resp.queries.first().map(|q| q.name().clone()) else { return };
    let fold = |name: &mut Name| *name = in_question_case(name, &question);
    for r in resp.answers.iter_mut().chain(resp.authorities.iter_mut()).chain(resp.additionals.iter_mut()) {
        fold(&mut r.name);
        match &mut r.data {
            RData::SOA(soa) => {
                fold(&mut soa.mname);
                fold(&mut soa.rname);
            }
            RData::NS(ns) => fold(&mut ns.0),
            RData::CNAME(cname) => fold(&mut cname.0),
            RData::PTR(ptr) => fold(&mut ptr.0),
            RData::MX(mx) => fold(&mut mx.exchange),
            _ => {}
        }
    }
}

/// Most CNAMEs followed inside the zone for one answer; a longer chain (or a loop) ends at
/// the last CNAME, which the resolver follows itself.
pub const CNAME_CHAIN_MAX: usize = 8;

/// How an answer that starts with a CNAME ends inside the zone.
enum ChainEnd<'a> {
    /// With data, a CNAME out of the zone, or no CNAME at all.
    Answered,
    /// At a name without data of the type asked (NODATA).
    NoData,
    /// At a name that does not exist.
    NxDomain,
    /// At or below a delegation: a referral follows.
    Referral(&'a Entry),
}

/// Follows an answer that is one CNAME (asked at `name` for `qtype`) through the zone, as
/// RFC 1034 §4.3.2 step 3a asks of an authoritative server: each target's answer is added,
/// up to [`CNAME_CHAIN_MAX`] CNAMEs, never twice the same name; says how the chain ended.
fn follow_cnames<'a>(
    answers: &mut Vec<Record>,
    name: &Name,
    qtype: RecordType,
    snapshot: &'a Snapshot,
    limits: &AnswerLimits,
    rng: &mut impl Rng,
) -> ChainEnd<'a> {
    if matches!(qtype, RecordType::CNAME | RecordType::ANY) {
        return ChainEnd::Answered;
    }
    let mut seen = vec![name.clone()];
    for _ in 0..CNAME_CHAIN_MAX {
        let target = match answers.last().map(|r| &r.data) {
            Some(RData::CNAME(target)) => target.0.to_lowercase(),
            _ => return ChainEnd::Answered,
        };
        if !snapshot.zone.origin.zone_of(&target) || seen.contains(&target) {
            return ChainEnd::Answered;
        }
        let more = match snapshot.find(&wire_key(&target)) {
            Found::Name(data) | Found::Wildcard(data) => {
                collect(&Query::query(target.clone(), qtype), data.managed.as_deref(), &data.statics.records(&target), limits, rng)
            }
            Found::Cut(cut) => return ChainEnd::Referral(cut),
            Found::Empty => return ChainEnd::NoData,
            Found::Missing => return ChainEnd::NxDomain,
        };
        if more.is_empty() {
            return ChainEnd::NoData;
        }
        answers.extend(more);
        seen.push(target);
    }
    ChainEnd::Answered
}

/// Answers for `query` at one name. Owner names are the query's own name, so they compress
/// to a pointer at the question and keep the client's 0x20 case.
fn collect(query: &Query, managed: Option<&Managed>, statics: &[Record], limits: &AnswerLimits, rng: &mut impl Rng) -> Vec<Record> {
    let owner: &Name = query.name();
    let qtype = query.query_type();
    if qtype == RecordType::ANY {
        return minimal_any(owner, managed, statics, limits, rng);
    }
    let mut out = Vec::new();
    if let Some(m) = managed {
        if qtype == RecordType::A {
            out.extend(addresses_v4(owner, m, limits, rng));
        }
        if qtype == RecordType::AAAA {
            out.extend(addresses_v6(owner, m, limits, rng));
        }
    }
    // A CNAME answers every type at its name (RFC 1034 §3.6.2); resolvers follow it.
    let cname = statics.iter().find(|r| r.record_type() == RecordType::CNAME);
    if let Some(r) = cname.filter(|_| managed.is_none() && qtype != RecordType::CNAME) {
        return vec![owned(r, owner)];
    }
    for r in statics {
        let t = r.record_type();
        // Managed addresses replace static ones at the same name.
        let shadowed = managed.is_some() && matches!(t, RecordType::A | RecordType::AAAA);
        if !shadowed && t == qtype {
            out.push(owned(r, owner));
        }
    }
    out
}

/// ANY answered with one RRset (RFC 8482 §4.1), not everything at the name: the first of the
/// managed addresses (A, else AAAA) and then the name's static RRsets in zone order (at the
/// apex, the SOA). A full ANY answer is the largest a name has, which made it the favourite
/// of reflection attacks; resolvers that need a type ask for it.
fn minimal_any(owner: &Name, managed: Option<&Managed>, statics: &[Record], limits: &AnswerLimits, rng: &mut impl Rng) -> Vec<Record> {
    if let Some(m) = managed {
        if !m.v4.is_empty() {
            return addresses_v4(owner, m, limits, rng).collect();
        }
        if !m.v6.is_empty() {
            return addresses_v6(owner, m, limits, rng).collect();
        }
    }
    let shadowed = |t: RecordType| managed.is_some() && matches!(t, RecordType::A | RecordType::AAAA);
    let Some(first) = statics.iter().map(Record::record_type).find(|&t| !shadowed(t)) else { return Vec::new() };
    statics.iter().filter(|r| r.record_type() == first).map(|r| owned(r, owner)).collect()
}

fn addresses_v4<'a>(owner: &'a Name, m: &Managed, limits: &AnswerLimits, rng: &mut impl Rng) -> impl Iterator<Item = Record> + 'a {
    let ttl = m.ttl_secs;
    sample(&m.v4, limits.answer_addresses_max, rng).into_iter().map(move |a| Record::from_rdata(owner.clone(), ttl, RData::A(A(a))))
}

fn addresses_v6<'a>(owner: &'a Name, m: &Managed, limits: &AnswerLimits, rng: &mut impl Rng) -> impl Iterator<Item = Record> + 'a {
    let ttl = m.ttl_secs;
    sample(&m.v6, limits.answer_addresses_max, rng).into_iter().map(move |a| Record::from_rdata(owner.clone(), ttl, RData::AAAA(AAAA(a))))
}

/// `r` with the query's own name as owner.
fn owned(r: &Record, owner: &Name) -> Record {
    let mut r = r.clone();
    r.name = owner.clone();
    r
}

/// Most targets one family can have (the plan limit).
pub const FAMILY_TARGETS_MAX: usize = dnsplan_common::plan::TARGETS_PER_ENDPOINT_MAX;

/// Chooses up to `k` of `family`'s targets, weighted, without replacement, and returns them in
/// answer order. Writes indices into `out` and returns how many; allocates nothing.
///
/// Weighted: Efraimidis–Spirakis: each target gets the key `ln(u) / weight` and the `k`
/// largest keys win, in key order, so the answer order is weighted too. Equal weights: a
/// uniform partial shuffle, the same distribution without logarithms. Zero-weight targets
/// never reach here unless every weight is zero (see `snapshot::Family`), and then all weigh
/// the same.
pub fn sample_indices<T, const N: usize>(family: &Family<T, N>, k: usize, rng: &mut impl Rng, out: &mut [u8; FAMILY_TARGETS_MAX]) -> usize {
    let n = family.targets.len().min(FAMILY_TARGETS_MAX);
    let k = k.min(n);
    for (i, slot) in out.iter_mut().enumerate().take(n) {
        *slot = i as u8;
    }
    if family.uniform() {
        for i in 0..k {
            let j = rng.random_range(i..n);
            out.swap(i, j);
        }
        return k;
    }
    let mut keys = [0f64; FAMILY_TARGETS_MAX];
    for (key, (_, w)) in keys.iter_mut().zip(family.targets.iter()) {
        let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
        *key = u.ln() / f64::from(*w);
    }
    // Partial selection sort: k is small (the answer size).
    for i in 0..k {
        let mut best = i;
        for j in i + 1..n {
            if keys[usize::from(out[j])] > keys[usize::from(out[best])] {
                best = j;
            }
        }
        out.swap(i, best);
    }
    k
}

/// `sample_indices` as addresses.
pub fn sample<T: Copy, const N: usize>(family: &Family<T, N>, k: usize, rng: &mut impl Rng) -> Vec<T> {
    let mut picked = [0u8; FAMILY_TARGETS_MAX];
    let count = sample_indices(family, k, rng, &mut picked);
    picked[..count].iter().map(|&i| family.targets[usize::from(i)].0).collect()
}

fn finish(resp: Message, qtype: Option<RecordType>, transport: Transport, udp_limit: u16) -> Option<(Vec<u8>, Outcome)> {
    finish_with_glue(resp, &[], 0, qtype, transport, udp_limit)
}

/// Encodes `resp`, whose additional section is glue RRsets of the sizes `glue_rrsets`: as many
/// of them (from the first) as fit the transport, and TC=1 with no records if the rest does
/// not fit or the first `required_glue` RRsets do not (a referral's in-domain glue).
fn finish_with_glue(
    mut resp: Message,
    glue_rrsets: &[usize],
    required_glue: usize,
    qtype: Option<RecordType>,
    transport: Transport,
    udp_limit: u16,
) -> Option<(Vec<u8>, Outcome)> {
    fold_case(&mut resp);
    let rcode = resp.metadata.response_code;
    let limit = match transport {
        Transport::Udp => usize::from(udp_limit),
        Transport::Tcp => TCP_MESSAGE_BYTES_MAX,
    };
    let mut glue_rrsets = glue_rrsets.iter();
    let bytes = loop {
        let encoded = resp.to_vec();
        if encoded.as_ref().is_ok_and(|b| b.len() > limit) {
            // Glue is additional data: leave out its last RRset and try again (RFC 2181 §9:
            // no TC for it), down to the required glue. Only the apex NS answer and
            // referrals have any, a few RRsets.
            if glue_rrsets.len() > required_glue
                && let Some(&len) = glue_rrsets.next_back()
            {
                resp.additionals.truncate(resp.additionals.len().saturating_sub(len));
                continue;
            }
        }
        break encoded;
    };
    let bytes = match bytes {
        Ok(b) => b,
        Err(err) => {
            // Counted as SERVFAIL in `dnsplan_dns_queries_total` (nothing else answers it). Not
            // logged above debug: if a query can cause it, every copy of that query would
            // write a line.
            tracing::debug!(%err, "could not encode a response; sending SERVFAIL");
            let fail = Message::error_msg(resp.metadata.id, resp.metadata.op_code, ResponseCode::ServFail);
            let bytes = fail.to_vec().ok()?;
            let outcome = Outcome { qtype, rcode: ResponseCode::ServFail, truncated: false, bytes: bytes.len(), malformed: None };
            return Some((bytes, outcome));
        }
    };
    if bytes.len() <= limit {
        let outcome = Outcome { qtype, rcode, truncated: false, bytes: bytes.len(), malformed: None };
        return Some((bytes, outcome));
    }
    // Too big for this transport: header, question and OPT only, with TC=1. The client
    // retries over TCP (RFC 7766).
    let mut truncated = resp.truncate();
    truncated.metadata.truncation = true;
    let bytes = truncated.to_vec().ok()?;
    let outcome = Outcome { qtype, rcode, truncated: true, bytes: bytes.len(), malformed: None };
    Some((bytes, outcome))
}
