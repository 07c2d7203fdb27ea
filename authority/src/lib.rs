//! dnsplan's authority: the authoritative DNS server for the managed DNS zone, and the
//! control API through which planners and enactors reach the store it serves from.
//!
//! `answer` is the pure query path; `snapshot` the immutable state it reads; `server` the UDP
//! and TCP shell and the follower that swaps snapshots; `control` the HTTP API; `run` the
//! wiring of one authority process.

pub mod answer;
pub mod args;
pub mod config;
pub mod control;
pub mod dns_zone;
pub mod metrics;
pub mod run;
pub mod server;
pub mod snapshot;
