//! The authority's own copy of the last state it served, on its own disk, for an authority
//! that follows a store on other machines (etcd): static stability. Read once at start, so the
//! authority answers at once from it while the store is unreachable; written after swaps
//! (paced: [`SAVE_INTERVAL`], [`paced`]) so it stays close to what is served. Not the store:
//! nothing else reads it, no fence is checked against it. An authority on the embedded store
//! keeps the same kind of file under another name (`serving-image`), used only when the store
//! vouches for it (see `image`).
//!
//! The file is `served-state` in `data_dir`, written by `image::Keeper` in the serving image's
//! format: the snapshot's own entries, so no second copy of the state is kept in memory to
//! write it. It is replaced whole: written to a temporary file beside it, fsynced, renamed
//! over it, and the directory fsynced ([`write_atomic_with`]), so a crash leaves the old file
//! or the new one, never a mix. A file that does not decode (torn, corrupt, another version,
//! another DNS zone) is refused whole, with a log line saying why, and the authority waits
//! for the store instead: it never serves a part of one.
//!
//! Earlier versions wrote [`LocalState`] (kind [`LOCAL_STATE_KIND`]: the DNS zone, the
//! applied-change count and every active record, retired ones included); such a file is still
//! read (`image::read`), and replaced by the next write. This type lives here rather than in
//! common, which holds the shared on-disk types, because no other crate reads or writes it.

use dnsplan_common::codec::{self, Record};
use dnsplan_common::store::{ActiveRecord, ActiveSnapshot};
use dnsplan_common::{DnsName, EndpointName};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The file's name in `data_dir`.
pub const FILE_NAME: &str = "served-state";
/// The envelope kind of a [`LocalState`]; common's kinds are 1..=8, so this stays clear of
/// theirs.
pub const LOCAL_STATE_KIND: u8 = 64;
/// Quiet time after a swap before the file is written, and so the shortest time between two
/// writes: a storm of swaps writes once per interval (the state is rewritten whole, so writing
/// on every swap of a large zone would cost more than serving), and a crash loses at most this
/// much, which the follower fetches again from the store.
pub const SAVE_INTERVAL: Duration = Duration::from_millis(250);
/// A write of the whole state is followed by at least this many times its own duration
/// before the next, so saving takes at most a tenth of a core however large the zone: at
/// 1,000,000 endpoints a write takes about 0.26 s (48 MB), so under constant change the file
/// is written every 2.6 s instead of every 250 ms.
pub const SAVE_PACING: u32 = 10;

/// The wait before the next write of a file rewritten whole: `floor`, or [`SAVE_PACING`]
/// times the last write if that is longer.
pub fn paced(floor: Duration, last_write: Duration) -> Duration {
    floor.max(last_write.saturating_mul(SAVE_PACING))
}

/// What the file holds: the state served at one applied-change count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalState {
    /// The DNS zone it was served for; a file of another zone is refused.
    pub dns_zone: DnsName,
    pub applied_changes: u64,
    pub endpoints: BTreeMap<EndpointName, ActiveRecord>,
}

impl Record for LocalState {
    const KIND: u8 = LOCAL_STATE_KIND;
    const KIND_NAME: &'static str = "served state";
    const BODY_BYTES_MAX: usize = codec::BODY_BYTES_MAX;
}

impl LocalState {
    pub fn active(&self) -> ActiveSnapshot {
        // Written before the content-change count: the serial derived from the applied count.
        ActiveSnapshot { applied_changes: self.applied_changes, content_changes: self.applied_changes, endpoints: self.endpoints.clone() }
    }
}

/// The file of `data_dir`.
pub fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// Replaces the file at `path` with `bytes` atomically: a temporary file beside it, fsynced,
/// renamed over it, the directory fsynced.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, |file| file.write_all(bytes))
}

/// Replaces the file at `path` with what `write` writes into a new file, atomically as
/// [`write_atomic`] does. A failed `write` leaves the old file in place.
pub fn write_atomic_with(path: &Path, write: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let temp = path.with_extension("tmp");
    {
        let mut file = std::fs::File::create(&temp)?;
        if let Err(err) = write(&mut file).and_then(|()| file.sync_all()) {
            let _ = std::fs::remove_file(&temp);
            return Err(err);
        }
    }
    std::fs::rename(&temp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_of_a_large_state_are_paced_by_their_cost() {
        assert_eq!(paced(SAVE_INTERVAL, Duration::ZERO), SAVE_INTERVAL);
        assert_eq!(paced(SAVE_INTERVAL, Duration::from_millis(20)), SAVE_INTERVAL, "a small state keeps the quiet time");
        assert_eq!(paced(SAVE_INTERVAL, Duration::from_millis(260)), Duration::from_millis(2_600), "1,000,000 endpoints");
        assert_eq!(paced(SAVE_INTERVAL, Duration::MAX), Duration::MAX, "no overflow");
    }
}
