//! The query layer: one DNS message in, one out, from a snapshot (`zone`), with no store, no
//! network and no lock.
//!
//! - `wire.rs`: raw reads of a message's bytes, without decoding it.
//! - `answer.rs`: the reference query path.
//! - `fast.rs`: the allocation-free UDP path, saying what `answer` says in as many bytes.
//! - `rrl.rs`: response-rate limiting of UDP answers.

pub mod answer;
pub mod dnssec;
pub mod fast;
pub mod rrl;
pub mod wire;
