//! dnsplan's enactor: applies the newest plan endpoint by endpoint through the store's
//! generation fence, verifies it over DNS, cleans up through the store's guarded cleanup, and
//! reports heartbeats. Several run at once, one per availability zone.
//!
//! `enactor` is the loop; `guard` the pure removal check; `verify` the DNS verification;
//! `config` the TOML config; `metrics` the Prometheus metrics; `hooks` (feature `testing`)
//! the fault hooks and the naive 2025 behaviour used by the race tests.

pub mod args;
pub mod config;
pub mod enactor;
pub mod guard;
#[cfg(feature = "testing")]
pub mod hooks;
pub mod metrics;
pub mod verify;

pub use config::{EnactorConfig, Settings};
pub use enactor::Enactor;
pub use metrics::Metrics;
