//! The envelope every stored or transmitted value travels in, and its decoder.
//!
//! Layout (little-endian integers), 16 header bytes then the body:
//!
//! ```text
//! 0..4   magic  b"DNSP"
//! 4..6   format version (u16)
//! 6      kind (what the body is: plan, active record, ...)
//! 7      reserved, zero
//! 8..12  body length in bytes (u32)
//! 12..16 CRC-32 of the body (u32)
//! 16..   bincode 2 body (standard config)
//! ```
//!
//! Decoding never panics and never trusts a length before checking it against the kind's
//! limit: truncated, corrupted, oversized, mislabelled or future-version input is a typed
//! [`CodecError`]. Plans are validated after decoding, so a decoded plan is a
//! [`ValidatedPlan`].

use crate::plan::{Plan, PlanSignature, PlanSummary, ValidatedPlan, ValidationError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use thiserror::Error;

pub const MAGIC: [u8; 4] = *b"DNSP";
/// The format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u16 = 1;
pub const HEADER_BYTES: usize = 16;
/// Largest body of any kind: the largest plan (`ENDPOINTS_PER_PLAN_MAX` endpoints with a few
/// targets each encodes to about 100 MB). Anything claiming more is refused before allocating.
pub const BODY_BYTES_MAX: usize = 256 * 1024 * 1024;
/// Largest body of the small record kinds (active record, heartbeat, pause, summary).
pub const SMALL_BODY_BYTES_MAX: usize = 64 * 1024;

/// Serialisable so that a remote store's `Corrupt` error travels whole (see `store::wire`).
#[derive(Debug, Error, PartialEq, Eq, Clone, Serialize, Deserialize)]
pub enum CodecError {
    #[error("input is {len} bytes, shorter than the {HEADER_BYTES}-byte envelope header")]
    Truncated { len: usize },
    #[error("input does not start with the dnsplan magic bytes; it is not a dnsplan record")]
    BadMagic,
    #[error("format version {found} is newer than this build reads ({FORMAT_VERSION}); upgrade dnsplan")]
    FutureVersion { found: u16 },
    #[error("format version 0 is not a valid version")]
    ZeroVersion,
    #[error("expected a {expected} record, found kind {found}")]
    WrongKind { expected: Cow<'static, str>, found: u8 },
    #[error("body of {len} bytes exceeds the {max}-byte limit for a {kind} record")]
    TooLarge { kind: Cow<'static, str>, len: usize, max: usize },
    #[error("header declares a {declared}-byte body but {actual} bytes follow (truncated or padded)")]
    LengthMismatch { declared: usize, actual: usize },
    #[error("checksum mismatch: the record is corrupt")]
    ChecksumMismatch,
    #[error("body does not decode as a {kind} record: {detail}")]
    Body { kind: Cow<'static, str>, detail: String },
    #[error("plan failed validation")]
    Invalid(#[from] ValidationError),
}

/// A type that can travel in an envelope.
pub trait Record: Serialize + DeserializeOwned {
    const KIND: u8;
    const KIND_NAME: &'static str;
    const BODY_BYTES_MAX: usize;
}

fn config() -> impl bincode::config::Config {
    // The limit makes bincode refuse a collection length larger than the body could hold
    // before it allocates, so a hostile length prefix cannot exhaust memory.
    bincode::config::standard().with_limit::<BODY_BYTES_MAX>()
}

pub fn encode<T: Record>(value: &T) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_BYTES];
    // Invariant: every in-memory value of our types is serialisable; only I/O can fail.
    let written = bincode::serde::encode_into_std_write(value, &mut out, config());
    assert!(written.is_ok(), "encoding a {} into memory cannot fail", T::KIND_NAME);
    let body_len = out.len() - HEADER_BYTES;
    assert!(body_len <= T::BODY_BYTES_MAX, "we never build a {} larger than its limit", T::KIND_NAME);
    let crc = crc32fast::hash(&out[HEADER_BYTES..]);
    out[..HEADER_BYTES].copy_from_slice(&header(T::KIND, body_len as u32, crc));
    out
}

/// The envelope's header for a body of `body_len` bytes with CRC-32 `crc`, for a writer that
/// streams a body of its own format (and so computes the CRC as it goes).
pub fn header(kind: u8, body_len: u32, crc: u32) -> [u8; HEADER_BYTES] {
    let mut out = [0u8; HEADER_BYTES];
    out[0..4].copy_from_slice(&MAGIC);
    out[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[6] = kind;
    out[8..12].copy_from_slice(&body_len.to_le_bytes());
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out
}

/// An envelope of `kind` around `body` (at most `u32::MAX` bytes), for a body built whole.
pub fn seal(kind: u8, body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut out = header(kind, len, crc32fast::hash(body)).to_vec();
    out.extend_from_slice(body);
    out
}

/// The body of an envelope of `kind` (named `kind_name` in errors), checked as `decode`
/// checks it: magic, version, kind, length up to `body_bytes_max`, CRC.
pub fn open<'a>(bytes: &'a [u8], kind: u8, kind_name: &'static str, body_bytes_max: usize) -> Result<&'a [u8], CodecError> {
    let Some((header, body)) = bytes.split_at_checked(HEADER_BYTES) else {
        return Err(CodecError::Truncated { len: bytes.len() });
    };
    if header[0..4] != MAGIC {
        return Err(CodecError::BadMagic);
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version == 0 {
        return Err(CodecError::ZeroVersion);
    }
    if version > FORMAT_VERSION {
        return Err(CodecError::FutureVersion { found: version });
    }
    if header[6] != kind {
        return Err(CodecError::WrongKind { expected: kind_name.into(), found: header[6] });
    }
    let declared = u32::from_le_bytes([header[8], header[9], header[10], header[11]]) as usize;
    if declared > body_bytes_max {
        return Err(CodecError::TooLarge { kind: kind_name.into(), len: declared, max: body_bytes_max });
    }
    if declared != body.len() {
        return Err(CodecError::LengthMismatch { declared, actual: body.len() });
    }
    let crc = u32::from_le_bytes([header[12], header[13], header[14], header[15]]);
    if crc32fast::hash(body) != crc {
        return Err(CodecError::ChecksumMismatch);
    }
    Ok(body)
}

pub fn decode<T: Record>(bytes: &[u8]) -> Result<T, CodecError> {
    let body = open(bytes, T::KIND, T::KIND_NAME, T::BODY_BYTES_MAX)?;
    let (value, used) = bincode::serde::decode_from_slice::<T, _>(body, config())
        .map_err(|err| CodecError::Body { kind: T::KIND_NAME.into(), detail: err.to_string() })?;
    if used != body.len() {
        return Err(CodecError::Body { kind: T::KIND_NAME.into(), detail: format!("{} trailing bytes", body.len() - used) });
    }
    Ok(value)
}

/// Writes an envelope's body as a run of values, each in the codec's bincode form, computing
/// its length and CRC-32 as it goes: for a body too large to build in memory first. The
/// caller writes [`header`] of `finish`'s length and CRC in front of it.
pub struct BodyWriter<W> {
    out: W,
    crc: crc32fast::Hasher,
    len: u64,
    /// One value's encoding, written and summed in one piece.
    scratch: Vec<u8>,
}

impl<W: std::io::Write> BodyWriter<W> {
    pub fn new(out: W) -> BodyWriter<W> {
        BodyWriter { out, crc: crc32fast::Hasher::new(), len: 0, scratch: Vec::new() }
    }

    pub fn put<T: Serialize>(&mut self, value: &T) -> std::io::Result<()> {
        self.scratch.clear();
        bincode::serde::encode_into_std_write(value, &mut self.scratch, config()).map_err(|err| std::io::Error::other(err.to_string()))?;
        self.out.write_all(&self.scratch)?;
        self.crc.update(&self.scratch);
        self.len += self.scratch.len() as u64;
        Ok(())
    }

    /// The writer, and the body's length and CRC-32.
    pub fn finish(self) -> (W, u64, u32) {
        (self.out, self.len, self.crc.finalize())
    }
}

/// Bytes that serialise as one byte string (bincode: a length and the bytes, the same
/// encoding as a sequence of `u8`, written at once rather than a byte at a time). Read back
/// as `&[u8]`.
pub struct Bytes<'a>(pub &'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

/// Reads the values of a body `BodyWriter` wrote (after [`open`] checked it), one at a time;
/// borrowed fields point into the body.
pub struct BodyReader<'a> {
    rest: &'a [u8],
    kind_name: &'static str,
}

impl<'a> BodyReader<'a> {
    pub fn new(body: &'a [u8], kind_name: &'static str) -> BodyReader<'a> {
        BodyReader { rest: body, kind_name }
    }

    pub fn take<T: serde::Deserialize<'a>>(&mut self) -> Result<T, CodecError> {
        let (value, used) = bincode::serde::borrow_decode_from_slice::<T, _>(self.rest, config())
            .map_err(|err| CodecError::Body { kind: self.kind_name.into(), detail: err.to_string() })?;
        self.rest = &self.rest[used..];
        Ok(value)
    }

    /// Whether every byte was read.
    pub fn is_done(&self) -> bool {
        self.rest.is_empty()
    }
}

impl Record for Plan {
    const KIND: u8 = 1;
    const KIND_NAME: &'static str = "plan";
    const BODY_BYTES_MAX: usize = BODY_BYTES_MAX;
}

impl Record for PlanSummary {
    const KIND: u8 = 2;
    const KIND_NAME: &'static str = "plan summary";
    const BODY_BYTES_MAX: usize = SMALL_BODY_BYTES_MAX;
}

/// The envelope of a signed plan: its body is the plan's body (what a `plan` envelope holds,
/// and what the signature covers) followed by the [`PlanSignature`].
pub const SIGNED_PLAN_KIND: u8 = 18;
const SIGNED_PLAN_KIND_NAME: &str = "signed plan";

/// A plan's envelope: a `plan`, or a `signed plan` when it carries a signature.
pub fn encode_plan(plan: &ValidatedPlan) -> Vec<u8> {
    let mut out = encode(plan.plan());
    if let Some(signature) = plan.signature() {
        let written = bincode::serde::encode_into_std_write(signature, &mut out, config());
        assert!(written.is_ok(), "encoding a signature into memory cannot fail");
        let body_len = out.len() - HEADER_BYTES;
        let crc = crc32fast::hash(&out[HEADER_BYTES..]);
        out[..HEADER_BYTES].copy_from_slice(&header(SIGNED_PLAN_KIND, body_len as u32, crc));
    }
    out
}

/// Decodes and validates a plan, signed or not: what comes off the wire or the disk is
/// checked like a new one. A signature is decoded, not verified (a keyring does that).
pub fn decode_plan(bytes: &[u8]) -> Result<ValidatedPlan, CodecError> {
    if bytes.len() < HEADER_BYTES || bytes[6] != SIGNED_PLAN_KIND {
        return Ok(ValidatedPlan::new(decode::<Plan>(bytes)?)?);
    }
    let body = open(bytes, SIGNED_PLAN_KIND, SIGNED_PLAN_KIND_NAME, BODY_BYTES_MAX)?;
    let mut reader = BodyReader::new(body, SIGNED_PLAN_KIND_NAME);
    let plan: Plan = reader.take()?;
    let signature: PlanSignature = reader.take()?;
    if !reader.is_done() {
        return Err(CodecError::Body { kind: SIGNED_PLAN_KIND_NAME.into(), detail: "trailing bytes after the signature".into() });
    }
    Ok(ValidatedPlan::new(plan)?.with_signature(Some(signature)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::Generation;
    use crate::names::{DnsName, ZoneId};
    use crate::plan::{Author, Endpoint, Provenance, Target};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn sample_plan(endpoints: usize) -> ValidatedPlan {
        let zone = DnsName::parse("example.test").unwrap();
        let endpoints = (0..endpoints)
            .map(|i| {
                let name = DnsName::parse(&format!("e{i}.example.test")).unwrap();
                let targets = (0..3)
                    .map(|t| Target {
                        address: format!("10.0.{t}.{}", i % 250).parse().unwrap(),
                        zone: ZoneId::parse("a").unwrap(),
                        weight: 1 + t,
                    })
                    .collect();
                (name, Endpoint { ttl_secs: 30, targets })
            })
            .collect();
        let plan = Plan {
            generation: Generation(7),
            parent_generation: Generation(6),
            created_at_unix_ms: 1_700_000_000_000,
            author: Author::Planner { id: "planner-1".into() },
            reason: "backend 10.0.1.3 failed".into(),
            dns_zone: zone.clone(),
            endpoints,
            retired: BTreeSet::new(),
            rollback_of: None,
            provenance: vec![Provenance {
                endpoint: DnsName::parse("e0.example.test").unwrap(),
                rule: "fail-open".into(),
                detail: "1 of 3 healthy".into(),
            }],
        };
        ValidatedPlan::new(plan).unwrap()
    }

    #[test]
    fn round_trip() {
        let plan = sample_plan(20);
        let bytes = encode_plan(&plan);
        assert_eq!(decode_plan(&bytes).unwrap(), plan);
    }

    #[test]
    fn typed_errors_for_each_kind_of_damage() {
        let bytes = encode_plan(&sample_plan(3));
        let mut future = bytes.clone();
        future[4..6].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let mut wrong_kind = bytes.clone();
        wrong_kind[6] = 2;
        let mut huge = bytes.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x40;
        let mut padded = bytes.clone();
        padded.push(0);
        type Expect = fn(&CodecError) -> bool;
        let cases: Vec<(&[u8], Expect)> = vec![
            (&bytes[..5], |e| matches!(e, CodecError::Truncated { .. })),
            (&bytes[..bytes.len() - 1], |e| matches!(e, CodecError::LengthMismatch { .. })),
            (&padded, |e| matches!(e, CodecError::LengthMismatch { .. })),
            (b"not a dnsplan record", |e| matches!(e, CodecError::BadMagic)),
            (&future, |e| matches!(e, CodecError::FutureVersion { .. })),
            (&wrong_kind, |e| matches!(e, CodecError::WrongKind { .. })),
            (&huge, |e| matches!(e, CodecError::TooLarge { .. })),
            (&flipped, |e| matches!(e, CodecError::ChecksumMismatch)),
        ];
        for (input, want) in cases {
            let err = decode_plan(input).expect_err("damaged input must not decode");
            assert!(want(&err), "unexpected error {err:?}");
        }
    }

    #[test]
    fn a_valid_envelope_around_an_invalid_plan_is_refused() {
        let mut plan = sample_plan(1).into_plan();
        plan.endpoints.values_mut().for_each(|e| e.targets.clear());
        let bytes = encode(&plan);
        assert!(matches!(decode_plan(&bytes), Err(CodecError::Invalid(ValidationError::EmptyEndpoint { .. }))));
    }

    /// A body with a correct header and checksum but a hostile length prefix inside must not
    /// allocate its claimed size.
    #[test]
    fn hostile_inner_lengths_are_refused() {
        let mut body = Vec::new();
        body.extend_from_slice(&[7, 6, 0]); // generation, parent, created_at (varints)
        body.push(0); // Author::Planner
        body.push(251); // u16 varint marker, then a length for the id
        body.extend_from_slice(&u16::MAX.to_le_bytes());
        for claimed in [u64::MAX, 1 << 40] {
            let mut b = body.clone();
            b.truncate(4);
            b.push(253); // u64 varint marker
            b.extend_from_slice(&claimed.to_le_bytes());
            let mut bytes = vec![0; HEADER_BYTES];
            bytes.extend_from_slice(&b);
            bytes[0..4].copy_from_slice(&MAGIC);
            bytes[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
            bytes[6] = Plan::KIND;
            bytes[8..12].copy_from_slice(&(b.len() as u32).to_le_bytes());
            bytes[12..16].copy_from_slice(&crc32fast::hash(&b).to_le_bytes());
            assert!(matches!(decode_plan(&bytes), Err(CodecError::Body { .. })));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Random bytes never panic and never decode.
        #[test]
        fn random_bytes_are_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            prop_assert!(decode_plan(&bytes).is_err());
        }

        /// Random mutations of a real plan never panic; any that decode are valid plans.
        #[test]
        fn mutated_plans_never_panic(
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            cut in proptest::option::of(any::<usize>()),
            fix_header in any::<bool>(),
        ) {
            let mut bytes = encode_plan(&sample_plan(4));
            for (at, xor) in flips {
                let i = at % bytes.len();
                bytes[i] ^= xor.max(1);
            }
            if let Some(cut) = cut {
                bytes.truncate(cut % (bytes.len() + 1));
            }
            if fix_header && bytes.len() >= HEADER_BYTES {
                // Re-seal the damage so it reaches the bincode and validation layers.
                let body_len = (bytes.len() - HEADER_BYTES) as u32;
                let crc = crc32fast::hash(&bytes[HEADER_BYTES..]);
                bytes[0..4].copy_from_slice(&MAGIC);
                bytes[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
                bytes[6] = Plan::KIND;
                bytes[8..12].copy_from_slice(&body_len.to_le_bytes());
                bytes[12..16].copy_from_slice(&crc.to_le_bytes());
            }
            if let Ok(plan) = decode_plan(&bytes) {
                prop_assert!(ValidatedPlan::new(plan.into_plan()).is_ok());
            }
        }
    }
}
