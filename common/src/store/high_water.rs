//! The embedded store's high-water mark: a small file beside the store that says how far the
//! store has been, so that a store that opens behind it is noticed instead of served.
//!
//! sled takes a page with a bad checksum for the torn tail of a crash: it drops it and
//! everything written after it, and opens what is left without a word. A flipped bit in the
//! `db` file can so open as an empty store. Served as it is, the planner would publish plan 1
//! again, and the SOA serial would start over below what secondaries hold, so they would
//! ignore every later change (RFC 1982). The mark is the store's id, its applied-change count
//! and its latest plan, written and fdatasynced after each write that moved them, once the
//! store has flushed that write: so the mark is never ahead of what the store holds on disk.
//! At open, a store behind its mark is refused (`SledStore::open`), unless the operator accepts
//! the loss (`SledStore::open_accepting_loss`), which moves the applied-change count, and with
//! it the SOA serial, past everything the mark says was served.
//!
//! The file is `store-high-water` in the store's directory, so a copy of the whole directory
//! carries the mark that goes with it. It holds two slots of [`SLOT_BYTES`], written in turn,
//! each a common envelope (kind [`Mark::KIND`], CRC-32) of a [`Mark`] with a sequence
//! number: a write torn by a crash leaves the other slot, and the newest whole slot is the
//! mark. A file whose both slots are torn is refused like a store behind it: nothing says how
//! far the store had been.

use crate::codec::{self, CodecError, Record};
use crate::generation::Generation;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The mark's file name in the store's directory.
pub const FILE_NAME: &str = "store-high-water";
/// Bytes of one slot: a sealed [`Mark`] is well below it.
pub const SLOT_BYTES: usize = 64;

/// How far a store has been.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mark {
    /// Which of two slots is newer; never compared across stores.
    pub sequence: u64,
    /// The store's random id (`meta` key `store_id`).
    pub store_id: u64,
    pub applied_changes: u64,
    pub latest: Generation,
}

impl Record for Mark {
    const KIND: u8 = 15;
    const KIND_NAME: &'static str = "store high-water mark";
    const BODY_BYTES_MAX: usize = SLOT_BYTES - codec::HEADER_BYTES;
}

/// The mark's file, open for writing.
pub struct HighWater {
    path: PathBuf,
    file: File,
    /// The mark last written (or read), `None` before the first.
    last: Option<Mark>,
}

/// What the file at open says.
pub enum Found {
    /// No file: a new store, or one written before marks.
    None,
    Mark(Mark),
    /// A file with no whole slot.
    Torn,
}

impl HighWater {
    /// Opens (creating) the mark file in the store directory `dir` and reads it.
    pub fn open(dir: &Path) -> std::io::Result<(HighWater, Found)> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(FILE_NAME);
        let existed = match std::fs::metadata(&path) {
            Ok(_) => true,
            Err(err) if err.kind() == ErrorKind::NotFound => false,
            Err(err) => return Err(err),
        };
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
        let found = if existed { read(&file)? } else { Found::None };
        let last = match &found {
            Found::Mark(mark) => Some(*mark),
            _ => None,
        };
        Ok((HighWater { path, file, last }, found))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The mark last written or read.
    pub fn last(&self) -> Option<Mark> {
        self.last
    }

    /// Writes `store_id`, `applied_changes` and `latest` as the mark, unless the mark says so
    /// already, and fdatasyncs it. Call only once the store holds them on disk.
    pub fn advance(&mut self, store_id: u64, applied_changes: u64, latest: Generation) -> std::io::Result<()> {
        if self.last.is_some_and(|m| (m.store_id, m.applied_changes, m.latest) == (store_id, applied_changes, latest)) {
            return Ok(());
        }
        let sequence = self.last.map_or(1, |m| m.sequence + 1);
        let mark = Mark { sequence, store_id, applied_changes, latest };
        let mut slot = codec::encode(&mark);
        // Invariant: a mark is four integers, far below a slot.
        assert!(slot.len() <= SLOT_BYTES, "a sealed high-water mark fits its slot");
        slot.resize(SLOT_BYTES, 0);
        self.file.write_all_at(&slot, (sequence % 2) * SLOT_BYTES as u64)?;
        self.file.sync_data()?;
        self.last = Some(mark);
        Ok(())
    }
}

/// The newest whole slot of `file`.
fn read(file: &File) -> std::io::Result<Found> {
    let mut bytes = [0u8; 2 * SLOT_BYTES];
    let mut len = 0;
    while len < bytes.len() {
        match file.read_at(&mut bytes[len..], len as u64)? {
            0 => break,
            n => len += n,
        }
    }
    let newest = bytes[..len].chunks(SLOT_BYTES).filter_map(|slot| decode(slot).ok()).max_by_key(|mark| mark.sequence);
    Ok(newest.map_or(Found::Torn, Found::Mark))
}

fn decode(slot: &[u8]) -> Result<Mark, CodecError> {
    let len = slot.get(8..12).and_then(|b| b.try_into().ok()).map_or(0, u32::from_le_bytes) as usize;
    codec::decode::<Mark>(slot.get(..codec::HEADER_BYTES + len).unwrap_or(slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_whole_slot_is_the_mark_and_a_torn_write_leaves_the_other() {
        let dir = tempfile::tempdir().expect("dir");
        let (mut mark, found) = HighWater::open(dir.path()).expect("open");
        assert!(matches!(found, Found::None));
        mark.advance(7, 10, Generation(3)).expect("write");
        mark.advance(7, 12, Generation(4)).expect("write");
        drop(mark);
        let (_, found) = HighWater::open(dir.path()).expect("open");
        let Found::Mark(read) = found else { panic!("no mark read") };
        assert_eq!((read.store_id, read.applied_changes, read.latest), (7, 12, Generation(4)));

        // Tear the newest slot (sequence 2 sits in slot 0): the older one is the mark.
        let path = dir.path().join(FILE_NAME);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[codec::HEADER_BYTES + 1] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        let (_, found) = HighWater::open(dir.path()).expect("open");
        let Found::Mark(read) = found else { panic!("no mark read") };
        assert_eq!((read.applied_changes, read.latest), (10, Generation(3)));

        // Both torn: nothing says how far the store had been.
        bytes[SLOT_BYTES + codec::HEADER_BYTES + 1] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        assert!(matches!(HighWater::open(dir.path()).expect("open").1, Found::Torn));
    }
}
