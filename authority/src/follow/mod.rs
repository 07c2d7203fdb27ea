//! Following the store: the first snapshot built from it, each change merged and swapped
//! into `serving::Serving`, and the state served kept on the authority's own disk. Imports
//! from `serving` and below, never from `xfr`.
//!
//! - `follower.rs`: the DNS zone check, `Loader`, and `Serving::load`, `follow` and `rebuild`.
//! - `image.rs`: the serving image of an authority on the embedded store.
//! - `local_state.rs`: the state last served, on disk, for an authority on etcd.
//! - `kept.rs`: that state and the log of changes served since, read back and kept, per zone.

pub mod follower;
pub mod image;
pub mod kept;
pub mod local_state;
