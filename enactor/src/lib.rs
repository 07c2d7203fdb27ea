//! dnsplan's enactor: applies the newest plan endpoint by endpoint through the store's
//! generation fence, verifies it over DNS, cleans up through the store's guarded cleanup, and
//! reports heartbeats. Several run at once, one per availability zone.
//!
//! Plans are written through the store's fence, or (`[target] kind = "rfc2136"`) onto a DNS
//! primary we do not run, fenced by update prerequisites on per-name markers (`rfc2136`).
//!
//! `enactor` is the loop; `guard` the pure removal check; `verify` the DNS verification;
//! `config` the TOML config; `metrics` the Prometheus metrics (`http` the daemon's listener
//! for them); `hooks` the hook points tests use to hold an enactor at an exact point (no-ops
//! unless a test installs its own), and, with feature `testing` only, the naive 2025
//! behaviour of the race tests; `zones` the loops of zones the store manages beside its first.

pub mod args;
pub mod config;
pub mod enactor;
pub mod guard;
pub mod hooks;
pub mod http;
pub mod metrics;
pub mod rfc2136;
pub mod verify;
pub mod zones;

pub use config::{EnactorConfig, Settings};
pub use enactor::Enactor;
pub use metrics::{Families, Metrics};
