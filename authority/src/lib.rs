//! dnsplan's authority: the authoritative DNS server for the managed DNS zone, and the
//! control API through which planners and enactors reach the store it serves from.
//!
//! `answer` is the pure query path and `fast` its allocation-free UDP shortcut (`wire` holds
//! the raw byte reads both use, `compress` the name compression of the answers written by
//! hand), and `rrl` limits UDP answers per client; `snapshot` the immutable state they read;
//! `follower` builds it from the store and swaps in each change; `server` (with `udp`) the
//! UDP and TCP shell; `control` the HTTP API and `control_server` its bounded HTTP server;
//! `transfer` feeds secondaries (AXFR, IXFR from `journal`, TSIG), `notify` tells them of
//! changes and `secondary_check` reads their zones back to see that they hold ours; `accept` and `budget` keep both listeners within the process's descriptors;
//! `local_state` keeps the state served on disk for an authority on etcd; `run` the wiring of
//! one authority process.

pub mod accept;
pub mod answer;
pub mod args;
pub mod budget;
pub mod compress;
pub mod config;
pub mod control;
pub mod control_gate;
pub mod control_server;
pub mod dns_zone;
pub mod fast;
pub mod follower;
pub mod image;
pub mod journal;
pub mod local_log;
pub mod local_state;
pub mod metrics;
pub mod notify;
pub mod rrl;
pub mod run;
pub mod secondary_check;
pub mod server;
pub mod snapshot;
pub mod transfer;
pub mod udp;
pub mod ui;
pub mod wire;
mod zone_text;
