//! The zone layer: the DNS zone and the immutable state the query path reads. Knows nothing
//! of the store's followers, listeners, transfers or the control API.
//!
//! - `zone_text.rs`: master-file text hickory's reader does not take, made into text it takes.
//! - `dns_zone.rs`: the static part of the zone (origin, SOA, NS, static records).
//! - `compress.rs`: name compression for the answers written by hand.
//! - `serial.rs`: SOA serials and their RFC 1982 comparison.
//! - `snapshot.rs`: the immutable serving snapshot, sharded, shared between versions.
//! - `signed.rs`: a signed zone's snapshot: the NSEC chain and the RRSIGs kept with each name.
//! - `records.rs`: the zone's records as a secondary should serve them, in transfer order.
//! - `journal.rs`: the in-memory history IXFR answers from.

pub mod chain;
pub mod compress;
pub mod dns_zone;
pub mod journal;
pub mod records;
pub mod serial;
pub mod signed;
pub mod snapshot;
mod zone_text;
