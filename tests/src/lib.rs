//! Test support shared across dnsplan's crates: the `Store` conformance suite, which every
//! store implementation must pass, and a deliberately naive store that must fail it.
//!
//! The suite reports violations instead of panicking, so that the same code proves two
//! things: a real store has none, and the naive store (check-then-act apply, age-only
//! cleanup, unfenced publish) has some. A suite that passes the naive store is broken.
//!
//! `zone_checks` checks a store's zones (`ManagedZones`): isolation, and the fence of a removal.
//!
//! `etcd` starts a real etcd cluster on loopback for the store on etcd.
//!
//! `daemon` starts real daemon processes and follows their JSON logs; `stack` runs an
//! authority in-process over any store; `watch` probes it over DNS, observes
//! the store, and checks the invariants over what was seen. `knot` runs a real Knot DNS server
//! (`knotd`) on a loopback port for the tests of RFC 2136 targets and secondaries, `bind` a real
//! BIND 9 (`named`) the same way, `nsd` a real NSD for answer sizes and secondaries.

pub mod backends;
pub mod bind;
pub mod certs;
pub mod conformance;
pub mod counterpart;
pub mod daemon;
pub mod etcd;
pub mod exposition;
pub mod fixtures;
pub mod knot;
pub mod naive;
pub mod nsd;
pub mod pdns;
pub mod ports;
pub mod stack;
pub mod watch;
pub mod zone_checks;
