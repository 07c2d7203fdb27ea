//! dnsplan's shared core: the plan model, the on-disk and on-wire codec, and the `Store`
//! contract with its embedded implementation on sled.
//!
//! This crate is the only one that defines wire and on-disk types. It holds no daemons; its
//! network code is what every daemon shares, each behind a feature: the store's HTTP client
//! (`remote`), a small DNS client (`dns`), TSIG keys and signatures (`tsig`), and the accept
//! loop and bounded HTTP server every daemon serves through (`server`).

#[cfg(feature = "server")]
pub mod accept;
pub mod changes;
pub mod codec;
#[cfg(feature = "daemon")]
pub mod daemon;
pub mod delta;
#[cfg(feature = "dns")]
pub mod dns_probe;
#[cfg(feature = "dnssec")]
pub mod dnssec;
#[cfg(feature = "dnssec")]
pub mod dnssec_keys;
#[cfg(feature = "dnssec")]
pub mod dnssec_share;
pub mod generation;
#[cfg(feature = "server")]
pub mod http_server;
pub mod names;
#[cfg(feature = "daemon")]
pub mod open_files;
pub mod plan;
pub mod signing;
pub mod status;
#[cfg(feature = "server")]
pub mod tls;
#[cfg(feature = "tsig")]
pub mod tsig;

pub use generation::Generation;
pub use names::{DnsName, EndpointName, NameError, ZoneId};
pub use plan::{
    Author, Endpoint, Plan, PlanSummary, Provenance, Target, ValidatedPlan, ValidationError, diff_lines, removed_weight_fraction,
    target_list, validate_endpoint,
};
pub mod store;
#[cfg(feature = "daemon")]
pub mod store_config;

pub use changes::{PlanChanges, PlanEntry};
pub use delta::{PlanDelta, PlanHead};

pub use store::sled::SledStore;
pub use store::{
    ActiveRecord, ActiveSnapshot, ActiveState, ApplyOutcome, Heartbeat, Lease, PauseState, Store, StoreError, StoreResult, StoreVersion,
};
