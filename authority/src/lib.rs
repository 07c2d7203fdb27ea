//! dnsplan's authority: the authoritative DNS server for the managed DNS zone, and the
//! control API through which planners and enactors reach the store it serves from.
//!
//! Layers, bottom to top; a module imports only from the layers below it or from its own
//! directory:
//!
//! 1. `zone`: the DNS zone, the immutable snapshot the query path reads, serials, the
//!    zone's records in transfer order and the IXFR history.
//! 2. `query`: one message in, one out, from a snapshot (`answer`, `fast`, `wire`, `rrl`).
//! 3. `metrics`: the Prometheus metrics.
//! 4. `serving`: `Serving`, the state every listener, transfer and follower shares, with the
//!    transfer policy and TSIG keys (`policy`) and the log of served changes (`local_log`).
//! 5. `follow` and `xfr`, side by side, neither importing the other: `follow` builds the
//!    snapshot from the store and swaps in each change (and keeps the state served on disk);
//!    `xfr` feeds secondaries (AXFR, IXFR, TSIG, NOTIFY, the check of their zones).
//! 6. `net`: the DNS listeners (UDP, TCP) and their connection caps.
//! 7. `control`: the control API (routes, front door, HTTP server, status page).
//! 8. `config` and `args`: the config file and the command line.
//! 9. `added`, `reload` and `run`: the zones the store manages beside its first one, each
//!    served and followed (`added`, which uses `follow` and `xfr`); the control API's
//!    credentials and TLS read again from the config file (`reload`); the wiring of one
//!    authority process.

pub mod added;
pub mod args;
pub mod config;
pub mod control;
pub mod follow;
pub mod metrics;
pub mod net;
pub mod query;
pub mod reload;
pub mod run;
pub mod serving;
pub mod xfr;
pub mod zone;
