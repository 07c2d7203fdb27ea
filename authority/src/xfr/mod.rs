//! Zone transfers and secondaries: AXFR and IXFR out, TSIG-signed answers, NOTIFY, and the
//! check that each secondary holds our zone. Imports from `serving` and below, never from
//! `follow`.
//!
//! - `respond.rs`: every message that is not a TCP transfer (plain, signed, IXFR over UDP).
//! - `pack.rs`: records encoded into transfer messages, owners compressed, signed.
//! - `transfer.rs`: a transfer over TCP, from access check to the last message.
//! - `notify.rs`: NOTIFY after every change, and what each secondary serves.
//! - `secondary_check.rs`: a secondary's zone read back by AXFR and compared with ours.

pub mod notify;
pub mod pack;
pub mod respond;
pub mod secondary_check;
pub mod transfer;
