//! Validated names: DNS names (endpoint names and the DNS zone origin) and availability zone ids.
//!
//! Names are normalised once, at the boundary (lower case, absolute with a trailing dot), so
//! that equality and ordering everywhere else are plain string comparisons. Deserialising
//! runs the same validation, so a name read from disk or the network is as checked as one
//! typed by an operator.

use compact_str::CompactString;
use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// Longest DNS name in presentation form, trailing dot included (RFC 1035 §2.3.4: 255 octets on
/// the wire, which is 253 characters plus the root dot in text).
pub const DNS_NAME_CHARS_MAX: usize = 254;
/// Longest DNS label (RFC 1035 §2.3.4).
pub const DNS_LABEL_CHARS_MAX: usize = 63;
/// Longest availability zone id. Zone ids appear in metrics labels and CLI tables; 32
/// characters fits every cloud's naming (`eu-central-1a`, `use1-az6`) with room to spare.
pub const ZONE_ID_CHARS_MAX: usize = 32;

#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum NameError {
    #[error("DNS name is empty")]
    Empty,
    #[error("DNS name {name:?} is longer than {max} characters", max = DNS_NAME_CHARS_MAX)]
    TooLong { name: String },
    #[error("DNS name {name:?} has an empty label (two dots in a row, or a leading dot)")]
    EmptyLabel { name: String },
    #[error("DNS name {name:?} has a label longer than {max} characters", max = DNS_LABEL_CHARS_MAX)]
    LabelTooLong { name: String },
    #[error("DNS name {name:?} has character {ch:?}; use letters, digits, '-' and '_' only")]
    BadChar { name: String, ch: char },
    #[error("DNS name {name:?} has a label that starts or ends with '-'")]
    BadHyphen { name: String },
    #[error("zone id {id:?} is invalid: use 1 to {max} characters of a-z, 0-9 and '-'", max = ZONE_ID_CHARS_MAX)]
    BadZoneId { id: String },
}

/// An absolute, lower-case DNS name such as `api.example.test.`.
///
/// Accepts the name with or without the trailing dot; stores it with one.
// Invariant: the inner string is a valid, lower-case, absolute DNS name (see `parse`).
// A `CompactString` keeps names of up to 24 bytes inline, which most are: a plan of a million
// endpoints decodes, clones and drops without a heap allocation per name. It orders, compares
// and hashes as the `str` it holds.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "CompactString")]
pub struct DnsName(CompactString);

impl DnsName {
    pub fn parse(input: &str) -> Result<DnsName, NameError> {
        let trimmed = DnsName::check(input)?;
        let mut name = CompactString::with_capacity(trimmed.len() + 1);
        name.push_str(trimmed);
        name.make_ascii_lowercase();
        name.push('.');
        Ok(DnsName(name))
    }

    /// Validates `input` (with or without its trailing dot; the checks ignore case) and
    /// returns it without the dot.
    fn check(input: &str) -> Result<&str, NameError> {
        let trimmed = input.strip_suffix('.').unwrap_or(input);
        if trimmed.is_empty() {
            return Err(NameError::Empty);
        }
        if trimmed.len() + 1 > DNS_NAME_CHARS_MAX {
            return Err(NameError::TooLong { name: input.to_owned() });
        }
        for label in trimmed.split('.') {
            if label.is_empty() {
                return Err(NameError::EmptyLabel { name: input.to_owned() });
            }
            if label.len() > DNS_LABEL_CHARS_MAX {
                return Err(NameError::LabelTooLong { name: input.to_owned() });
            }
            if let Some(ch) = label.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_')) {
                return Err(NameError::BadChar { name: input.to_owned(), ch });
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(NameError::BadHyphen { name: input.to_owned() });
            }
        }
        Ok(trimmed)
    }

    /// The name in presentation form, with its trailing dot.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True when `self` is `origin` or below it.
    pub fn is_in(&self, origin: &DnsName) -> bool {
        self.0 == origin.0
            || (self.0.len() > origin.0.len()
                && self.0.ends_with(origin.0.as_str())
                && self.0.as_bytes()[self.0.len() - origin.0.len() - 1] == b'.')
    }
}

impl TryFrom<CompactString> for DnsName {
    type Error = NameError;
    /// `parse` that keeps the string: decoding a plan builds every name this way.
    fn try_from(mut value: CompactString) -> Result<Self, Self::Error> {
        DnsName::check(&value)?;
        value.make_ascii_lowercase();
        if !value.ends_with('.') {
            value.push('.');
        }
        Ok(DnsName(value))
    }
}

impl TryFrom<String> for DnsName {
    type Error = NameError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        DnsName::try_from(CompactString::from(value))
    }
}

impl Serialize for DnsName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl From<DnsName> for String {
    fn from(value: DnsName) -> String {
        value.0.into_string()
    }
}

impl fmt::Display for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for DnsName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DnsName::parse(s)
    }
}

/// The DNS name of a managed endpoint. Whether it lies inside the managed DNS zone is checked
/// where the DNS zone is known: in plan validation.
pub type EndpointName = DnsName;

/// An availability zone id such as `a` or `eu-central-1a` (health vocabulary, not DNS).
// Invariant: 1..=ZONE_ID_CHARS_MAX characters of [a-z0-9-].
// Inline, as `DnsName`: every target of every endpoint carries one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "CompactString")]
pub struct ZoneId(CompactString);

impl ZoneId {
    pub fn parse(input: &str) -> Result<ZoneId, NameError> {
        ZoneId::try_from(CompactString::from(input))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<CompactString> for ZoneId {
    type Error = NameError;
    fn try_from(value: CompactString) -> Result<Self, Self::Error> {
        let ok = !value.is_empty()
            && value.len() <= ZONE_ID_CHARS_MAX
            && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if ok { Ok(ZoneId(value)) } else { Err(NameError::BadZoneId { id: value.into_string() }) }
    }
}

impl TryFrom<String> for ZoneId {
    type Error = NameError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        ZoneId::try_from(CompactString::from(value))
    }
}

impl Serialize for ZoneId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl From<ZoneId> for String {
    fn from(value: ZoneId) -> String {
        value.0.into_string()
    }
}

impl fmt::Display for ZoneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for ZoneId {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ZoneId::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_are_normalised_and_checked() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("API.Example.test", Ok("api.example.test.")),
            ("api.example.test.", Ok("api.example.test.")),
            ("_svc.x", Ok("_svc.x.")),
            ("", Err("empty")),
            (".", Err("empty")),
            ("a..b", Err("empty label")),
            ("-a.b", Err("starts or ends")),
            ("a b.c", Err("character")),
        ];
        for (input, want) in cases {
            match (DnsName::parse(input), want) {
                (Ok(n), Ok(w)) => assert_eq!(n.as_str(), *w),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{input:?}: {e}"),
                (got, want) => panic!("{input:?}: got {got:?}, want {want:?}"),
            }
        }
        let long_label = "a".repeat(64);
        assert!(matches!(DnsName::parse(&long_label), Err(NameError::LabelTooLong { .. })));
        let long_name = vec!["a".repeat(63); 5].join(".");
        assert!(matches!(DnsName::parse(&long_name), Err(NameError::TooLong { .. })));
    }

    #[test]
    fn containment_respects_label_boundaries() {
        let origin = DnsName::parse("example.test").unwrap();
        for (name, inside) in [("example.test", true), ("a.example.test", true), ("badexample.test", false), ("test", false)] {
            assert_eq!(DnsName::parse(name).unwrap().is_in(&origin), inside, "{name}");
        }
    }

    #[test]
    fn zone_ids() {
        assert!(ZoneId::parse("eu-central-1a").is_ok());
        assert!(ZoneId::parse("").is_err());
        assert!(ZoneId::parse("A").is_err());
        assert!(ZoneId::parse(&"a".repeat(33)).is_err());
    }
}
