//! Response-rate limiting (RRL) of UDP answers, as NSD, Knot and BIND do it: a client prefix
//! (`/24`, `/56` by default) gets at most `responses_per_sec` of the same answer, after a burst
//! of `burst_responses`; past that, answers are dropped, except every `slip`-th, which goes out
//! truncated (TC=1, no records) so a real client asks again over TCP, where it is answered in
//! full. Spoofed queries cannot reach TCP, so a reflected flood is cut to what the slips carry:
//! about a query's size each.
//!
//! "The same answer" is a class of responses: a positive answer is keyed by its query name
//! and type; NODATA by the name; every NXDOMAIN of the zone shares one key (random names do not
//! make new keys); every error (REFUSED, FORMERR, NOTIMP...) another. Keys hash, with a
//! process-wide random seed, into a fixed table of `table_size` buckets allocated at start;
//! keys that collide share a bucket (so a collision can only limit more, never less). Each
//! bucket is a GCRA token bucket in one atomic word (the time at which it is next full) plus a
//! counter of limited answers for the slip. No lock and no allocation per packet; the clock is
//! read once per `recvmmsg` batch. TCP is never limited (its clients cannot be spoofed).
//!
//! This module decides; `udp` applies the decision and `metrics` counts it.

use crate::query::answer::Outcome;
use crate::query::wire::{skip_name, u16_at};
use crate::zone::snapshot::NAME_WIRE_BYTES_MAX;
use foldhash::quality::SeedableRandomState;
use hickory_proto::op::ResponseCode;
use serde::Deserialize;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

/// Most exempt prefixes. Each packet is compared with every one of them.
pub const EXEMPT_PREFIXES_MAX: usize = 64;
/// Range of `table_size`: from a table that still spreads a few hundred clients to one of
/// 256 MiB (16 bytes a bucket).
pub const TABLE_SIZE_MIN: usize = 1_024;
pub const TABLE_SIZE_MAX: usize = 1 << 24;
/// Highest `responses_per_sec` and `burst_responses`: one answer per microsecond, far above
/// any one client's need and within the nanosecond arithmetic's range.
pub const RESPONSES_PER_SEC_MAX: u32 = 1_000_000;
/// Highest `slip`; BIND allows 10, Knot 100.
pub const SLIP_MAX: u32 = 100;
/// Tries to update one bucket against other threads updating it. A bucket that busy is
/// being flooded: the answer is limited.
const CAS_ATTEMPTS_MAX: usize = 8;

/// What to do with one UDP answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Send,
    Drop,
    /// Send it truncated (`slip`).
    Slip,
}

/// The classes of answers that are limited apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AnswerClass {
    /// NOERROR with records, or truncated for size: keyed by name and type.
    Positive = 1,
    /// NOERROR without records: keyed by name.
    NoData = 2,
    /// NXDOMAIN: one key for the zone.
    NxDomain = 3,
    /// Every other rcode: one key.
    Error = 4,
}

impl AnswerClass {
    pub fn of(outcome: &Outcome, response: &[u8]) -> AnswerClass {
        match outcome.rcode {
            ResponseCode::NoError if outcome.truncated || u16_at(response, 6).unwrap_or(0) > 0 => AnswerClass::Positive,
            ResponseCode::NoError => AnswerClass::NoData,
            ResponseCode::NXDomain => AnswerClass::NxDomain,
            _ => AnswerClass::Error,
        }
    }
}

/// An address prefix: `192.0.2.0/24`, `2001:db8::/32`, or an address alone (all its bits).
///
/// Invariant: `len` is at most the family's bit count and `addr` has no bit set beyond it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

impl IpPrefix {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, unmapped(ip)) {
            (IpAddr::V4(p), IpAddr::V4(a)) => u32::from(a) & mask_v4(self.len) == u32::from(p),
            (IpAddr::V6(p), IpAddr::V6(a)) => u128::from(a) & mask_v6(self.len) == u128::from(p),
            _ => false,
        }
    }
}

impl FromStr for IpPrefix {
    type Err = String;

    fn from_str(s: &str) -> Result<IpPrefix, String> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| format!("{s:?} is not an address or a prefix such as 192.0.2.0/24"))?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => bits,
            Some(l) => {
                l.parse::<u8>().ok().filter(|&l| l <= bits).ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {bits}"))?
            }
        };
        let masked = match addr {
            IpAddr::V4(a) => u32::from(a) & mask_v4(len) == u32::from(a),
            IpAddr::V6(a) => u128::from(a) & mask_v6(len) == u128::from(a),
        };
        if !masked {
            return Err(format!("{s:?} has address bits set beyond /{len}; write the prefix's first address"));
        }
        Ok(IpPrefix { addr, len })
    }
}

impl TryFrom<String> for IpPrefix {
    type Error = String;

    fn try_from(s: String) -> Result<IpPrefix, String> {
        s.parse()
    }
}

impl std::fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

fn mask_v4(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

fn mask_v6(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

/// An IPv4 client seen through an IPv6 socket (`::ffff:a.b.c.d`) is an IPv4 client.
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The limiter's settings, checked (`config::RrlConfig::settings`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RrlSettings {
    pub responses_per_sec: u32,
    pub burst_responses: u32,
    pub slip: u32,
    pub ipv4_prefix_len: u8,
    pub ipv6_prefix_len: u8,
    pub table_size: usize,
    pub exempt: Vec<IpPrefix>,
}

#[derive(Default)]
struct Bucket {
    /// GCRA's theoretical arrival time, in nanoseconds since `Rrl::epoch`: the bucket holds
    /// `(now + burst - tat) / interval` answers. 0 (long ago) is a full bucket.
    tat_ns: AtomicU64,
    /// Answers this bucket limited, for the slip.
    limited: AtomicU32,
}

impl Bucket {
    /// Takes one answer from the bucket at `now_ns`; false when it is empty.
    fn take(&self, now_ns: u64, interval_ns: u64, burst_ns: u64) -> bool {
        let mut tat = self.tat_ns.load(Ordering::Relaxed);
        for _ in 0..CAS_ATTEMPTS_MAX {
            let next = tat.max(now_ns) + interval_ns;
            if next > now_ns + burst_ns {
                return false;
            }
            match self.tat_ns.compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(seen) => tat = seen,
            }
        }
        false
    }
}

/// The limiter: the bucket table and its settings. Shared by every UDP loop.
pub struct Rrl {
    /// Invariant: `table_size` buckets, allocated once.
    buckets: Box<[Bucket]>,
    /// Randomly seeded, so that no client can choose queries that land in another's bucket.
    hasher: SeedableRandomState,
    interval_ns: u64,
    burst_ns: u64,
    slip: u32,
    v4_mask: u32,
    v6_mask: u128,
    exempt: Vec<IpPrefix>,
    epoch: Instant,
}

/// A moment on the limiter's clock (nanoseconds since it started).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tick(pub u64);

impl Rrl {
    pub fn new(settings: &RrlSettings) -> Rrl {
        Rrl::with_hasher(settings, SeedableRandomState::random())
    }

    fn with_hasher(settings: &RrlSettings, hasher: SeedableRandomState) -> Rrl {
        assert!((1..=RESPONSES_PER_SEC_MAX).contains(&settings.responses_per_sec));
        assert!((1..=RESPONSES_PER_SEC_MAX).contains(&settings.burst_responses));
        assert!(settings.slip <= SLIP_MAX);
        assert!((TABLE_SIZE_MIN..=TABLE_SIZE_MAX).contains(&settings.table_size));
        assert!(settings.exempt.len() <= EXEMPT_PREFIXES_MAX);
        let interval_ns = 1_000_000_000 / u64::from(settings.responses_per_sec);
        Rrl {
            buckets: (0..settings.table_size).map(|_| Bucket::default()).collect(),
            hasher,
            interval_ns,
            burst_ns: interval_ns * u64::from(settings.burst_responses),
            slip: settings.slip,
            v4_mask: mask_v4(settings.ipv4_prefix_len.min(32)),
            v6_mask: mask_v6(settings.ipv6_prefix_len.min(128)),
            exempt: settings.exempt.clone(),
            epoch: Instant::now(),
        }
    }

    /// The limiter's clock now.
    pub fn now(&self) -> Tick {
        Tick(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Whether to send `response`, our answer to `query` from `peer`, at `now`.
    pub fn decide(&self, peer: IpAddr, query: &[u8], response: &[u8], outcome: &Outcome, now: Tick) -> Verdict {
        let peer = unmapped(peer);
        if self.exempt.iter().any(|p| p.contains(peer)) {
            return Verdict::Send;
        }
        let class = AnswerClass::of(outcome, response);
        let qtype = outcome.qtype.map_or(0, u16::from);
        let bucket = &self.buckets[self.index(self.key(peer, class, qtype, query))];
        if bucket.take(now.0, self.interval_ns, self.burst_ns) {
            return Verdict::Send;
        }
        let limited = bucket.limited.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        if self.slip != 0 && limited.is_multiple_of(self.slip) { Verdict::Slip } else { Verdict::Drop }
    }

    fn key(&self, peer: IpAddr, class: AnswerClass, qtype: u16, query: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        match peer {
            IpAddr::V4(a) => {
                h.write_u8(4);
                h.write_u32(u32::from(a) & self.v4_mask);
            }
            IpAddr::V6(a) => {
                h.write_u8(6);
                h.write_u128(u128::from(a) & self.v6_mask);
            }
        }
        h.write_u8(class as u8);
        match class {
            AnswerClass::Positive => {
                h.write_u16(qtype);
                write_qname(&mut h, query);
            }
            AnswerClass::NoData => write_qname(&mut h, query),
            AnswerClass::NxDomain | AnswerClass::Error => {}
        }
        h.finish()
    }

    fn index(&self, key: u64) -> usize {
        // Lemire's multiply-shift: uniform over any table size, no division.
        ((u128::from(key) * self.buckets.len() as u128) >> 64) as usize
    }
}

/// Hashes the query's name in lower case, straight from the packet (on the stack). A name
/// that does not read to its end hashes as far as it reads: such a query got FORMERR, whose
/// key has no name.
fn write_qname(h: &mut impl Hasher, query: &[u8]) {
    let mut name = [0u8; NAME_WIRE_BYTES_MAX];
    let mut len = 0;
    let mut at = 12;
    for _ in 0..NAME_WIRE_BYTES_MAX {
        let Some(&label) = query.get(at) else { break };
        if label == 0 || label > 63 {
            break;
        }
        let end = at + 1 + usize::from(label);
        let Some(bytes) = query.get(at..end) else { break };
        let Some(dst) = name.get_mut(len..len + bytes.len()) else { break };
        for (d, s) in dst.iter_mut().zip(bytes) {
            *d = s.to_ascii_lowercase(); // length bytes are below 64, never letters
        }
        len += bytes.len();
        at = end;
    }
    h.write(&name[..len]);
}

/// Turns `response`, one of our own answers, into its slip: the same header with TC=1 and no
/// records, the question, and the OPT record when the answer has one — what `answer::respond`
/// sends for an answer too big for UDP. The client asks again over TCP. Allocates nothing:
/// the answer only shrinks.
///
/// Our answers carry at most one question, written out without compression, and their OPT
/// record, if any, has no options and is written last (after the glue of an apex NS answer);
/// anything else (never seen) is cut to the header alone, still a valid TC=1 answer.
pub fn slip(response: &mut Vec<u8>) {
    if response.len() < 12 {
        return; // not an answer of ours: every one has a header
    }
    let question_end = match u16_at(response, 4) {
        Some(0) => Some(12),
        Some(1) => skip_name(response, 12).map(|end| end + 4).filter(|&end| end <= response.len()),
        _ => None,
    };
    let len = response.len();
    let opt_at = len.saturating_sub(OPT_BYTES);
    let has_opt = question_end.and_then(|end| last_record_at(response, end)) == Some(opt_at)
        && response[opt_at] == 0
        && u16_at(response, opt_at + 1) == Some(crate::query::wire::TYPE_OPT)
        && u16_at(response, opt_at + 9) == Some(0);
    let mut opt = [0u8; OPT_BYTES];
    if has_opt {
        opt.copy_from_slice(&response[opt_at..]);
    }
    match question_end {
        Some(end) => response.truncate(end),
        None => {
            response.truncate(12);
            response[4..6].copy_from_slice(&[0, 0]);
        }
    }
    response[2] |= 0x02; // TC
    response[6..12].copy_from_slice(&[0, 0, 0, 0, 0, u8::from(has_opt)]);
    if has_opt {
        response.extend_from_slice(&opt);
    }
}

/// Where the last record of `response` starts, its records starting at `at` (after the
/// question), if they frame exactly to its end.
fn last_record_at(response: &[u8], mut at: usize) -> Option<usize> {
    let records: usize = [6, 8, 10].iter().map(|&count_at| u16_at(response, count_at).map_or(0, usize::from)).sum();
    let mut last = None;
    for _ in 0..records {
        last = Some(at);
        let fixed_at = skip_name(response, at)?; // type, class, TTL, RDLENGTH
        at = fixed_at + 10 + usize::from(u16_at(response, fixed_at + 8)?);
        if at > response.len() {
            return None;
        }
    }
    last.filter(|_| at == response.len())
}

/// An OPT record without options: root owner, type, class (payload), TTL (flags), RDLENGTH.
const OPT_BYTES: usize = 11;

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RData, Record, RecordType};

    const SEC: u64 = 1_000_000_000;

    /// A fixed hash seed, so which keys share a bucket is the same on every run (none of the
    /// tests' keys do with this seed and table).
    fn limiter(settings: &RrlSettings) -> Rrl {
        Rrl::with_hasher(settings, SeedableRandomState::fixed())
    }

    fn settings(rate: u32, burst: u32, slip: u32) -> RrlSettings {
        RrlSettings {
            responses_per_sec: rate,
            burst_responses: burst,
            slip,
            ipv4_prefix_len: 24,
            ipv6_prefix_len: 56,
            table_size: TABLE_SIZE_MIN,
            exempt: vec!["192.0.2.128/25".parse().expect("prefix")],
        }
    }

    fn query(name: &str, qtype: RecordType) -> Vec<u8> {
        let mut m = Message::new(7, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_ascii(name).expect("name"), qtype));
        m.to_vec().expect("encode")
    }

    fn outcome(rcode: ResponseCode, qtype: RecordType) -> Outcome {
        Outcome { qtype: Some(qtype), rcode, truncated: false, bytes: 0, malformed: None }
    }

    /// A header with `answers` records (all `AnswerClass::of` reads of a response).
    fn response(answers: u16) -> Vec<u8> {
        let mut r = vec![0u8; 12];
        r[6..8].copy_from_slice(&answers.to_be_bytes());
        r
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    struct Ask<'a> {
        rrl: &'a Rrl,
        at: Tick,
    }

    impl Ask<'_> {
        fn a(&self, peer: &str, name: &str) -> Verdict {
            let q = query(name, RecordType::A);
            self.rrl.decide(ip(peer), &q, &response(1), &outcome(ResponseCode::NoError, RecordType::A), self.at)
        }
    }

    #[test]
    fn a_burst_then_the_rate() {
        let rrl = limiter(&settings(10, 5, 0));
        let ask = Ask { rrl: &rrl, at: Tick(SEC) };
        let sent = (0..20).filter(|_| ask.a("198.51.100.7", "api.example.test.") == Verdict::Send).count();
        assert_eq!(sent, 5, "the burst");
        // Half a second later: 10/s refills 5.
        let ask = Ask { rrl: &rrl, at: Tick(SEC + SEC / 2) };
        let sent = (0..20).filter(|_| ask.a("198.51.100.7", "api.example.test.") == Verdict::Send).count();
        assert_eq!(sent, 5, "half a second at 10/s");
        // Long idle: full again, no more than the burst.
        let ask = Ask { rrl: &rrl, at: Tick(100 * SEC) };
        let sent = (0..20).filter(|_| ask.a("198.51.100.7", "api.example.test.") == Verdict::Send).count();
        assert_eq!(sent, 5, "idle refills to the burst, not beyond");
    }

    #[test]
    fn every_slip_th_limited_answer_slips() {
        for slip in [0, 1, 2, 3] {
            let rrl = limiter(&settings(1, 1, slip));
            let ask = Ask { rrl: &rrl, at: Tick(SEC) };
            let verdicts: Vec<Verdict> = (0..13).map(|_| ask.a("198.51.100.7", "api.example.test.")).collect();
            assert_eq!(verdicts[0], Verdict::Send);
            let slipped = verdicts.iter().filter(|&&v| v == Verdict::Slip).count();
            let want = if slip == 0 { 0 } else { 12 / slip as usize };
            assert_eq!(slipped, want, "slip {slip}: {verdicts:?}");
            assert_eq!(verdicts.iter().filter(|&&v| v == Verdict::Drop).count(), 12 - want);
        }
    }

    #[test]
    fn clients_share_their_prefix_and_exempt_ones_are_not_limited() {
        let rrl = limiter(&settings(1, 2, 0));
        let ask = Ask { rrl: &rrl, at: Tick(SEC) };
        assert_eq!(ask.a("198.51.100.7", "api.example.test."), Verdict::Send);
        assert_eq!(ask.a("198.51.100.200", "api.example.test."), Verdict::Send, "the same /24");
        assert_eq!(ask.a("198.51.100.9", "api.example.test."), Verdict::Drop, "the /24's bucket is empty");
        assert_eq!(ask.a("::ffff:198.51.100.9", "api.example.test."), Verdict::Drop, "IPv4 through an IPv6 socket");
        assert_eq!(ask.a("198.51.101.7", "api.example.test."), Verdict::Send, "the next /24");
        assert_eq!(ask.a("198.51.100.7", "www.example.test."), Verdict::Send, "another answer");
        for _ in 0..10 {
            assert_eq!(ask.a("192.0.2.200", "api.example.test."), Verdict::Send, "exempt");
        }
        for _ in 0..2 {
            assert_eq!(ask.a("2001:db8:0:ff::1", "api.example.test."), Verdict::Send);
        }
        assert_eq!(ask.a("2001:db8:0:1::2", "api.example.test."), Verdict::Drop, "the same /56");
        assert_eq!(ask.a("2001:db8:0:100::1", "api.example.test."), Verdict::Send, "the next /56");
    }

    #[test]
    fn answers_are_keyed_by_class() {
        let rrl = limiter(&settings(1, 1, 0));
        let at = Tick(SEC);
        let peer = ip("198.51.100.7");
        let decide = |name: &str, qtype: RecordType, rcode: ResponseCode, answers: u16| {
            rrl.decide(peer, &query(name, qtype), &response(answers), &outcome(rcode, qtype), at)
        };
        // NXDOMAIN: one key for every name.
        assert_eq!(decide("a.example.test.", RecordType::A, ResponseCode::NXDomain, 0), Verdict::Send);
        assert_eq!(decide("b.example.test.", RecordType::A, ResponseCode::NXDomain, 0), Verdict::Drop);
        // Errors: one key for every name.
        assert_eq!(decide("example.org.", RecordType::A, ResponseCode::Refused, 0), Verdict::Send);
        assert_eq!(decide("example.net.", RecordType::MX, ResponseCode::FormErr, 0), Verdict::Drop);
        // NODATA: by name, whatever the type.
        assert_eq!(decide("api.example.test.", RecordType::MX, ResponseCode::NoError, 0), Verdict::Send);
        assert_eq!(decide("API.example.test.", RecordType::TXT, ResponseCode::NoError, 0), Verdict::Drop);
        assert_eq!(decide("web.example.test.", RecordType::TXT, ResponseCode::NoError, 0), Verdict::Send);
        // Positive: by name and type, in any case.
        assert_eq!(decide("api.example.test.", RecordType::A, ResponseCode::NoError, 1), Verdict::Send);
        assert_eq!(decide("Api.Example.TEST.", RecordType::A, ResponseCode::NoError, 1), Verdict::Drop);
        assert_eq!(decide("api.example.test.", RecordType::AAAA, ResponseCode::NoError, 1), Verdict::Send);
    }

    #[test]
    fn prefixes_parse_strictly() {
        let p: IpPrefix = "10.0.0.0/8".parse().expect("prefix");
        assert!(p.contains(ip("10.255.0.1")) && !p.contains(ip("11.0.0.1")) && !p.contains(ip("::1")));
        assert!("::1".parse::<IpPrefix>().expect("prefix").contains(ip("::1")));
        assert!("0.0.0.0/0".parse::<IpPrefix>().expect("prefix").contains(ip("203.0.113.9")));
        assert_eq!("192.0.2.1".parse::<IpPrefix>().expect("prefix").to_string(), "192.0.2.1/32");
        for bad in ["10.0.0.1/8", "10.0.0.0/33", "2001:db8::/129", "example.test", "10.0.0.0/x", ""] {
            assert!(bad.parse::<IpPrefix>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_slip_is_the_header_question_and_opt() {
        let mut m = Message::new(0x4242, MessageType::Response, OpCode::Query);
        m.metadata.authoritative = true;
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii("Api.example.test.").expect("name"), RecordType::A));
        for i in 1..=4 {
            m.add_answer(Record::from_rdata(
                Name::from_ascii("Api.example.test.").expect("name"),
                30,
                RData::A(std::net::Ipv4Addr::new(10, 0, 0, i).into()),
            ));
        }
        let mut edns = Edns::new();
        edns.set_max_payload(1232).set_dnssec_ok(true);
        m.set_edns(edns);
        let answer = m.to_vec().expect("encode");
        let mut slipped = answer.clone();
        slip(&mut slipped);
        let s = Message::from_vec(&slipped).expect("a slip parses");
        assert!(s.metadata.truncation && s.metadata.authoritative && s.metadata.recursion_desired);
        assert_eq!((s.metadata.id, s.metadata.response_code), (0x4242, ResponseCode::NoError));
        assert_eq!(s.queries, m.queries, "the question");
        assert!(s.answers.is_empty() && s.authorities.is_empty() && s.additionals.is_empty());
        assert_eq!(s.edns.as_ref().map(|e| (e.max_payload(), e.flags().dnssec_ok)), Some((1232, true)), "the OPT record");
        assert!(slipped.len() < answer.len());

        // Glue before the OPT record (an apex NS answer): the OPT record is still found.
        m.add_additional(Record::from_rdata(
            Name::from_ascii("ns1.example.test.").expect("name"),
            300,
            RData::A(std::net::Ipv4Addr::new(192, 0, 2, 1).into()),
        ));
        let mut slipped = m.to_vec().expect("encode");
        slip(&mut slipped);
        let s = Message::from_vec(&slipped).expect("a slip parses");
        assert!(s.metadata.truncation && s.answers.is_empty() && s.additionals.is_empty());
        assert_eq!(s.edns.as_ref().map(|e| e.max_payload()), Some(1232), "the OPT record after glue");

        // No EDNS: no OPT in the slip, even when the last record's bytes could pass for one
        // (an AAAA address ending in an OPT record's bytes).
        m.edns = None;
        m.additionals.clear();
        m.add_additional(Record::from_rdata(
            Name::from_ascii("ns1.example.test.").expect("name"),
            300,
            RData::AAAA("2001:db8:0:29::".parse::<std::net::Ipv6Addr>().expect("address").into()),
        ));
        let mut slipped = m.to_vec().expect("encode");
        slip(&mut slipped);
        let s = Message::from_vec(&slipped).expect("a slip parses");
        assert!(s.metadata.truncation && s.edns.is_none() && s.answers.is_empty() && s.queries.len() == 1);
        let mut slipped = m.to_vec().expect("encode");
        slip(&mut slipped);
        let s = Message::from_vec(&slipped).expect("a slip parses");
        assert!(s.metadata.truncation && s.edns.is_none() && s.answers.is_empty() && s.queries.len() == 1);
    }
}
