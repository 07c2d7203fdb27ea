//! dnsplan's planner: health-checks every target, decides the next plan with the
//! static-stability rules, and publishes it with a compare-and-swap on the latest generation,
//! under a lease that keeps one planner active.
//!
//! `decide` is the pure core; `health` the probes and their hysteresis; `planner` the loop
//! (lease, decide, publish); `zones` a planner per zone of the config, in one process;
//! `config` the TOML config; `metrics` the Prometheus metrics; `http` the daemon's own
//! listener for them and its status.

pub mod args;
pub mod config;
pub mod decide;
pub mod health;
pub mod http;
pub mod metrics;
pub mod planner;
pub mod zones;

pub use config::PlannerConfig;
pub use planner::Planner;
