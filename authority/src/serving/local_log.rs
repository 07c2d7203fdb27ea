//! Persist before serve, for an authority on etcd: each change the follower swaps in is
//! appended to this log on the authority's own disk and fsynced *before* DNS answers with it,
//! so a restart (after SIGKILL, during an etcd outage) never answers with a state older than
//! one it answered with before. The saved state (`local_state`, rewritten whole and paced) is
//! the log's base: at start the log's changes after it are merged over it, and each time the
//! saved state is written the changes it holds leave the log.
//!
//! Format: `served-log` in `data_dir`, a sequence of records, each a little-endian u32 length
//! and an `ActiveDelta` codec envelope (kind, version, length, checksum, body). A record cut
//! short or failing its checksum at the end is a write the crash interrupted: it was never
//! answered with (the swap waits for the fsync), so it and anything after it are dropped and
//! the file is cut back to the last whole record.
//!
//! Not here: the saved state itself (`local_state`, `image`), and the embedded store, which is
//! on the same disk and durable itself, so an authority on it needs no log.

use dnsplan_common::codec;
use dnsplan_common::store::ActiveDelta;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The file's name in `data_dir`.
pub const FILE_NAME: &str = "served-log";
/// The log past which changes are no longer appended (the saved state is not being written:
/// a full or failing disk). The whole state of a large zone can be one record, so this holds
/// a few of those; serving goes on, and the failure is an ERROR line once.
pub const BYTES_MAX: u64 = 1 << 30;

pub fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("the log of served changes {path}: {what}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the log of served changes {path} holds {bytes} bytes, over its limit of {BYTES_MAX}: the saved state is not being written")]
    Full { path: PathBuf, bytes: u64 },
}

struct Open {
    file: File,
    /// Applied-change count and end offset of each record, oldest first.
    records: Vec<(u64, u64)>,
    len: u64,
}

/// The log, open for appends.
pub struct LocalLog {
    path: PathBuf,
    open: Mutex<Open>,
    /// An append failed and has not succeeded since: logged once, not on every change.
    failing: std::sync::atomic::AtomicBool,
}

impl LocalLog {
    /// Opens (or creates) the log at `path` and reads the changes it holds after
    /// `after` (the applied-change count of the saved state), oldest first. A torn tail is cut
    /// off; a record that does not decode ends the reading there, with a WARN line.
    pub fn open(path: &Path, after: u64) -> Result<(LocalLog, Vec<ActiveDelta>), LogError> {
        let io = |what: &'static str| move |source| LogError::Io { path: path.to_path_buf(), what, source };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io("create its directory"))?;
        }
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(io("open"))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io("read"))?;
        let (mut records, mut changes, mut at) = (Vec::new(), Vec::new(), 0usize);
        while let Some(len_bytes) = bytes.get(at..at + 4) {
            let len = u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
            let Some(body) = bytes.get(at + 4..at + 4 + len) else { break };
            match dnsplan_common::codec::decode::<ActiveDelta>(body) {
                Ok(delta) => {
                    at += 4 + len;
                    records.push((delta.applied_changes, at as u64));
                    if delta.applied_changes > after {
                        changes.push(delta);
                    }
                }
                Err(err) => {
                    tracing::warn!(path = %path.display(), offset = at, error = %err, "a record of the log of served changes does not decode; the log is read up to it");
                    break;
                }
            }
        }
        if at < bytes.len() {
            tracing::info!(path = %path.display(), bytes = bytes.len() - at, "cut off the end of the log of served changes (a write a crash interrupted)");
            file.set_len(at as u64).map_err(io("truncate"))?;
            file.sync_all().map_err(io("fsync"))?;
        }
        file.seek(SeekFrom::Start(at as u64)).map_err(io("seek"))?;
        let open = Mutex::new(Open { file, records, len: at as u64 });
        Ok((LocalLog { path: path.to_path_buf(), open, failing: Default::default() }, changes))
    }

    /// Appends `delta` and waits until it is on disk.
    pub fn append(&self, delta: &ActiveDelta) -> Result<(), LogError> {
        let io = |what: &'static str| move |source| LogError::Io { path: self.path.clone(), what, source };
        let body = codec::encode(delta);
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if open.len > BYTES_MAX {
            return Err(LogError::Full { path: self.path.clone(), bytes: open.len });
        }
        let len = u32::try_from(body.len()).map_err(|_| LogError::Full { path: self.path.clone(), bytes: body.len() as u64 })?;
        let mut record = Vec::with_capacity(4 + body.len());
        record.extend_from_slice(&len.to_le_bytes());
        record.extend_from_slice(&body);
        open.file.write_all(&record).map_err(io("append"))?;
        open.file.sync_data().map_err(io("fsync"))?;
        open.len += record.len() as u64;
        let end = open.len;
        open.records.push((delta.applied_changes, end));
        Ok(())
    }

    /// As `append`, for the follower: a failure is an ERROR line once (and INFO when appends
    /// work again), and the change is served anyway. Answering with the store's newer state
    /// beats answering with an older one because this disk fails; the guarantee after a
    /// restart then rests on the saved state alone.
    pub fn append_or_say(&self, delta: &ActiveDelta) {
        use std::sync::atomic::Ordering;
        match self.append(delta) {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(path = %self.path.display(), "the log of served changes is written again");
                }
            }
            Err(err) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::error!(error = %format!("{:#}", anyhow::Error::new(err)), "cannot log a served change before serving it; serving it anyway (a restart may answer with the older saved state until the store answers)");
                }
            }
        }
    }

    /// The saved state now holds every change up to `saved`: those leave the log. The rest
    /// are copied to a new file renamed over the old one (fsynced, then the directory).
    pub fn compact(&self, saved: u64) -> Result<(), LogError> {
        let io = |what: &'static str| move |source| LogError::Io { path: self.path.clone(), what, source };
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let covered = open.records.iter().take_while(|(applied, _)| *applied <= saved).count();
        if covered == 0 {
            return Ok(());
        }
        if covered == open.records.len() {
            open.file.set_len(0).map_err(io("truncate"))?;
            open.file.seek(SeekFrom::Start(0)).map_err(io("seek"))?;
            open.file.sync_all().map_err(io("fsync"))?;
            open.records.clear();
            open.len = 0;
            return Ok(());
        }
        let from = open.records[covered - 1].1;
        let mut rest = Vec::with_capacity((open.len - from) as usize);
        open.file.seek(SeekFrom::Start(from)).map_err(io("seek"))?;
        open.file.read_to_end(&mut rest).map_err(io("read"))?;
        let tmp = self.path.with_extension("tmp");
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&tmp).map_err(io("create"))?;
        file.write_all(&rest).map_err(io("write"))?;
        file.sync_all().map_err(io("fsync"))?;
        std::fs::rename(&tmp, &self.path).map_err(io("rename"))?;
        if let Some(dir) = self.path.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(io("fsync the directory"))?;
        }
        let records = open.records[covered..].iter().map(|(applied, end)| (*applied, end - from)).collect();
        *open = Open { file, records, len: rest.len() as u64 };
        Ok(())
    }

    /// The records held (for tests and logs).
    pub fn records(&self) -> usize {
        self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).records.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dnsplan_common::store::{ActiveRecord, ActiveState};
    use dnsplan_common::{DnsName, Endpoint, Generation, Target, ZoneId};

    fn delta(applied: u64) -> ActiveDelta {
        let target = Target { address: "10.0.0.1".parse().expect("address"), zone: ZoneId::parse("a").expect("zone"), weight: 1 };
        let record =
            ActiveRecord { generation: Generation(applied), state: ActiveState::Serving(Endpoint { ttl_secs: 30, targets: vec![target] }) };
        let name = DnsName::parse(&format!("e{applied}.example.test.")).expect("name");
        ActiveDelta { applied_changes: applied, content_changes: applied, full: false, endpoints: [(name, record)].into_iter().collect() }
    }

    fn applied(changes: &[ActiveDelta]) -> Vec<u64> {
        changes.iter().map(|d| d.applied_changes).collect()
    }

    #[test]
    fn changes_read_back_after_the_saved_state_and_compaction_drops_the_saved_ones() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = path_in(dir.path());
        let (log, changes) = LocalLog::open(&path, 0)?;
        assert!(changes.is_empty());
        for a in 1..=5 {
            log.append(&delta(a))?;
        }
        drop(log);
        let (log, changes) = LocalLog::open(&path, 2)?;
        assert_eq!(applied(&changes), [3, 4, 5]);
        log.compact(3)?;
        assert_eq!(log.records(), 2);
        log.append(&delta(6))?;
        drop(log);
        let (log, changes) = LocalLog::open(&path, 0)?;
        assert_eq!(applied(&changes), [4, 5, 6]);
        log.compact(6)?;
        drop(log);
        assert_eq!(std::fs::metadata(&path)?.len(), 0);
        Ok(())
    }

    /// A record cut short by a crash is dropped and the file cut back, so appends go on after
    /// the last whole record; a flipped byte ends the reading at that record.
    #[test]
    fn a_torn_or_damaged_record_ends_the_log_there() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = path_in(dir.path());
        let (log, _) = LocalLog::open(&path, 0)?;
        for a in 1..=3 {
            log.append(&delta(a))?;
        }
        drop(log);
        let whole = std::fs::read(&path)?;
        std::fs::write(&path, &whole[..whole.len() - 3])?;
        let (log, changes) = LocalLog::open(&path, 0)?;
        assert_eq!(applied(&changes), [1, 2]);
        log.append(&delta(4))?;
        drop(log);
        let (_, changes) = LocalLog::open(&path, 0)?;
        assert_eq!(applied(&changes), [1, 2, 4]);

        let mut bytes = std::fs::read(&path)?;
        let second = bytes.len() / 2;
        bytes[second] ^= 0x40;
        std::fs::write(&path, &bytes)?;
        let (_, changes) = LocalLog::open(&path, 0)?;
        assert!(applied(&changes).len() < 3, "a damaged record was read: {:?}", applied(&changes));
        Ok(())
    }
}
