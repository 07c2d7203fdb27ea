//! The IXFR history on disk, so a restarted primary answers IXFR from where each secondary is
//! (as Knot's journal does) instead of sending every secondary the whole zone.
//!
//! Format: `ixfr-journal` in `data_dir`, a sequence of records, each a little-endian u32
//! length and a codec envelope (kind [`KIND`], version, length, CRC-32) around one swap: the
//! serial before and after, how many names it changed, the records it removed and added in DNS
//! wire form, and a digest of the static zone it was served with. Appended by the follower
//! before it swaps the change in; not fsynced: it is a cache of what secondaries could be sent,
//! never what is served, and what a crash loses only means a whole-zone transfer.
//!
//! Read back at start, it is trusted only as a chain of swaps, each from the serial the one
//! before went to, with the digest of the zone served now, ending at the serial served now;
//! anything else (a torn tail, a damaged record, another master file, a store that moved on
//! while the authority was down) leaves the history empty and the file started again, so IXFR
//! never sends a difference that does not lead to what is served. Bounded by
//! `dns.transfer.ixfr_journal_bytes_max`: past it, the older half is dropped (a new file
//! renamed over the old one).

use dnsplan_common::codec;
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::{BinDecodable, BinEncodable};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// The file's name in `data_dir`.
pub const FILE_NAME: &str = "ixfr-journal";
/// The envelope kind of a swap (`local_state` 64, the serving image 66).
pub const KIND: u8 = 67;

pub fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// One swap as written.
#[derive(Serialize, Deserialize)]
struct SavedSwap {
    zone: u64,
    from: u32,
    to: u32,
    names: u32,
    gone: Vec<Vec<u8>>,
    new: Vec<Vec<u8>>,
}

impl codec::Record for SavedSwap {
    const KIND: u8 = KIND;
    const KIND_NAME: &'static str = "IXFR journal swap";
    const BODY_BYTES_MAX: usize = codec::BODY_BYTES_MAX;
}

/// One swap read back: from `from` to `to`, over `names` names.
pub struct Restored {
    pub from: u32,
    pub to: u32,
    pub names: usize,
    pub gone: Vec<Record>,
    pub new: Vec<Record>,
}

struct Open {
    file: File,
    /// End offset of each record, oldest first.
    ends: Vec<u64>,
    len: u64,
}

/// The journal file, open for appends.
pub struct IxfrLog {
    path: PathBuf,
    zone: u64,
    bytes_max: u64,
    open: Mutex<Open>,
    /// An append failed and has not succeeded since: said once.
    failing: AtomicBool,
}

impl IxfrLog {
    /// Opens (or creates) the journal at `path` for the zone of digest `zone`, served at
    /// `served`, and reads back the chain of swaps that ends there (see the module docs);
    /// anything else in the file is dropped and the file started again.
    pub fn open(path: &Path, zone: u64, served: u32, bytes_max: u64) -> std::io::Result<(IxfrLog, Vec<Restored>)> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (mut chain, mut ends, mut at) = (Vec::<Restored>::new(), Vec::new(), 0usize);
        while let Some(len_bytes) = bytes.get(at..at + 4) {
            let len = u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
            let Some(body) = bytes.get(at + 4..at + 4 + len) else { break };
            let Some(swap) = codec::decode::<SavedSwap>(body).ok().and_then(|s| restore(s, zone)) else { break };
            at += 4 + len;
            ends.push(at as u64);
            if chain.last().is_some_and(|last| last.to != swap.from) {
                chain.clear();
            }
            chain.push(swap);
        }
        let whole = chain.last().is_some_and(|last| last.to == served) && at == bytes.len();
        if !whole {
            if !bytes.is_empty() {
                tracing::info!(
                    path = %path.display(),
                    served,
                    history_end = chain.last().map(|s| s.to),
                    "the IXFR history on disk does not lead to the serial served (another zone, a store that moved on, or a torn end); IXFR starts again from here"
                );
            }
            chain.clear();
            ends.clear();
            at = 0;
            file.set_len(0)?;
        }
        file.seek(SeekFrom::Start(at as u64))?;
        let log = IxfrLog {
            path: path.to_path_buf(),
            zone,
            bytes_max,
            open: Mutex::new(Open { file, ends, len: at as u64 }),
            failing: AtomicBool::new(false),
        };
        Ok((log, chain))
    }

    /// Appends the swap from `from` to `to` over `names` names that removed `gone` and added
    /// `new`, first dropping the older half of the file if it would pass its bound.
    pub fn append(&self, from: u32, to: u32, names: usize, gone: &[Record], new: &[Record]) -> std::io::Result<()> {
        let wire = |records: &[Record]| records.iter().map(|r| r.to_bytes()).collect::<Result<Vec<_>, _>>();
        let swap = SavedSwap {
            zone: self.zone,
            from,
            to,
            names: u32::try_from(names).unwrap_or(u32::MAX),
            gone: wire(gone).map_err(std::io::Error::other)?,
            new: wire(new).map_err(std::io::Error::other)?,
        };
        let body = codec::encode(&swap);
        let len = u32::try_from(body.len()).map_err(std::io::Error::other)?;
        let mut record = Vec::with_capacity(4 + body.len());
        record.extend_from_slice(&len.to_le_bytes());
        record.extend_from_slice(&body);
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if open.len + record.len() as u64 > self.bytes_max {
            self.drop_older_half(&mut open)?;
        }
        open.file.write_all(&record)?;
        open.len += record.len() as u64;
        let end = open.len;
        open.ends.push(end);
        Ok(())
    }

    /// As `append`, for the follower: a failure is a WARN line once (and INFO when appends
    /// work again); serving goes on, and a restart then sends the whole zone once.
    pub fn append_or_say(&self, from: u32, to: u32, names: usize, gone: &[Record], new: &[Record]) {
        match self.append(from, to, names, gone, new) {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(path = %self.path.display(), "the IXFR history is written to disk again");
                }
            }
            Err(err) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(path = %self.path.display(), error = %err, "cannot write the IXFR history to disk; after a restart secondaries get the whole zone once");
                }
                // A gap: what follows is no longer a chain from what the file holds.
                self.forget();
            }
        }
    }

    /// Empties the file: the swap just made is not written (a rebuild from the whole state,
    /// or a failed write), so the file's swaps no longer lead to what is served.
    pub fn forget(&self) {
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = open.file.set_len(0).and_then(|()| open.file.seek(SeekFrom::Start(0)).map(|_| ()));
        open.ends.clear();
        open.len = 0;
    }

    /// Keeps the newer half of the file's bytes (whole records), in a new file renamed over it.
    fn drop_older_half(&self, open: &mut Open) -> std::io::Result<()> {
        let keep_from = open.len.saturating_sub(self.bytes_max / 2);
        let first_kept = open.ends.iter().position(|&end| end > keep_from).unwrap_or(open.ends.len());
        let from = if first_kept == 0 { 0 } else { open.ends[first_kept - 1] };
        let mut rest = Vec::with_capacity((open.len - from) as usize);
        open.file.seek(SeekFrom::Start(from))?;
        open.file.read_to_end(&mut rest)?;
        let tmp = self.path.with_extension("tmp");
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&tmp)?;
        file.write_all(&rest)?;
        std::fs::rename(&tmp, &self.path)?;
        let ends = open.ends[first_kept..].iter().map(|end| end - from).collect();
        *open = Open { file, ends, len: rest.len() as u64 };
        Ok(())
    }

    /// The swaps the file holds (for tests and logs).
    pub fn swaps(&self) -> usize {
        self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).ends.len()
    }
}

/// A swap read back, if it is of zone `zone` and its records decode.
fn restore(swap: SavedSwap, zone: u64) -> Option<Restored> {
    if swap.zone != zone {
        return None;
    }
    let records = |wire: &[Vec<u8>]| wire.iter().map(|w| Record::from_bytes(w).ok()).collect::<Option<Vec<_>>>();
    Some(Restored { from: swap.from, to: swap.to, names: swap.names as usize, gone: records(&swap.gone)?, new: records(&swap.new)? })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, RData};

    fn a(name: &str, ttl: u32, last: u8) -> Record {
        Record::from_rdata(Name::from_ascii(name).expect("name"), ttl, RData::A(A::new(10, 0, 0, last)))
    }

    /// Swaps read back as written when they lead to the serial served; not when they lead
    /// elsewhere, are of another zone, or end torn (and the file starts again); the older
    /// half goes past the bound.
    #[test]
    fn the_history_reads_back_only_as_a_chain_to_the_serial_served() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = path_in(dir.path());
        let (log, restored) = IxfrLog::open(&path, 7, 10, 1 << 20)?;
        assert!(restored.is_empty());
        log.append(10, 11, 1, &[a("x.example.test.", 60, 1)], &[a("x.example.test.", 90, 1)])?;
        log.append(11, 12, 1, &[], &[a("y.example.test.", 30, 2)])?;
        drop(log);
        let (log, restored) = IxfrLog::open(&path, 7, 12, 1 << 20)?;
        let got: Vec<(u32, u32, usize, usize)> = restored.iter().map(|s| (s.from, s.to, s.gone.len(), s.new.len())).collect();
        assert_eq!(got, [(10, 11, 1, 1), (11, 12, 0, 1)]);
        assert_eq!(restored[0].new[0].ttl, 90, "the TTL is kept");
        drop(log);
        for (zone, served, why) in [(8, 12, "another zone"), (7, 13, "another serial")] {
            let (_, restored) = IxfrLog::open(&path, zone, served, 1 << 20)?;
            assert!(restored.is_empty(), "{why}");
        }
        assert_eq!(std::fs::metadata(&path)?.len(), 0, "started again");

        let (log, _) = IxfrLog::open(&path, 7, 20, 1 << 20)?;
        log.append(20, 21, 1, &[], &[a("z.example.test.", 30, 3)])?;
        drop(log);
        let whole = std::fs::read(&path)?;
        std::fs::write(&path, &whole[..whole.len() - 2])?;
        let (_, restored) = IxfrLog::open(&path, 7, 21, 1 << 20)?;
        assert!(restored.is_empty(), "a torn end");

        let (log, _) = IxfrLog::open(&path, 7, 0, 600)?;
        for serial in 0..20 {
            log.append(serial, serial + 1, 1, &[], &[a("w.example.test.", 30, serial as u8)])?;
        }
        assert!(std::fs::metadata(&path)?.len() <= 600, "bounded");
        let kept = log.swaps();
        drop(log);
        let (_, restored) = IxfrLog::open(&path, 7, 20, 600)?;
        assert_eq!(restored.len(), kept);
        assert!(kept > 1 && kept < 20 && restored.last().is_some_and(|s| s.to == 20) && restored[0].from == 20 - kept as u32);
        Ok(())
    }
}
