//! The serving image: the entries an authority on the embedded store serves, kept on its own
//! disk, so that a restart answers without reading and decoding the store's whole active
//! state. At 1,000,000 endpoints that read took most of a start (see `bench/RESULTS.md`),
//! and it filled the store's page cache with records the authority never reads again.
//!
//! The file is `serving-image` in `data_dir`: common's envelope (magic, format version, kind
//! [`IMAGE_KIND`], length, CRC-32 of the body) around a run of bincode values: a [`Head`],
//! then one [`ImageEntry`] per managed name up to the end of the body, in the snapshot's own form (lower-case wire
//! name, generation, TTL and the eligible targets with their weights). Nothing in it needs
//! parsing or validating beyond checking each name's wire form. It is written whole to a
//! temporary file and renamed over the old one (`local_state::write_atomic_with`), so a crash
//! leaves the old image or the new one.
//!
//! **It is never served as it is.** The image holds the state at one applied-change count of
//! one store's history, named by a [`HistoryMark`] (the store's random id and the endpoint of
//! that change). At start the authority serves it only if the store still gives the same mark
//! for that count, and only after merging every endpoint switched since (`active_since`),
//! exactly as the follower merges a change. An image of another store, of a store restored
//! and gone on differently, of another DNS zone, a torn or corrupt file, or one so old that
//! the store answers with its whole state, is not used: the start reads the store's pages as
//! without an image, and says why in one log line. So an image can make a start faster, never
//! older than the store.
//!
//! It is written after a start that read the store's pages, then at most every
//! [`SAVE_INTERVAL`] while the served state changes, and at shutdown. An authority following
//! etcd keeps the same file as `served-state` (see `local_state`), written every 250 ms or
//! so, and serves it before the store answers, without a mark: that file is for answering
//! while etcd does not.

use crate::follow::local_state::{LOCAL_STATE_KIND, LocalState, paced, write_atomic_with};
use crate::serving::Serving;
use crate::serving::trusted::PlanCheck;
use crate::zone::dns_zone::StaticZone;
use crate::zone::snapshot::{Family, Managed, Snapshot};
use dnsplan_common::Generation;
use dnsplan_common::codec::{self, BodyReader, BodyWriter, Bytes, CodecError};
use dnsplan_common::store::{HistoryMark, Store};
use serde::{Deserialize, Serialize};
use std::io::{Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

/// The file's name in `data_dir`.
pub const FILE_NAME: &str = "serving-image";
/// The envelope kind of an image; `local_state`'s is 64, common's 1..=16. An image of another
/// kind (65: written before its head carried the content-change count, by a build before the
/// first release) is not used: the store's state is read instead, as without an image.
pub const IMAGE_KIND: u8 = 66;
const KIND_NAME: &str = "serving image";
/// Shortest time between two writes while the served state changes. A crash loses at most
/// this much of the image, which the next start merges from the store's change log.
pub const SAVE_INTERVAL: Duration = Duration::from_secs(30);

/// The image's first value.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Head {
    /// The DNS zone's origin in lower-case wire form.
    origin: Vec<u8>,
    applied_changes: u64,
    /// The store's content-change count at `applied_changes`: the serial derives from it.
    content_changes: u64,
    /// The state's place in the store's history, when the store gives one (the embedded
    /// store does; etcd does not).
    mark: Option<HistoryMark>,
}

/// The body and head of the image `bytes`.
fn open_image<'a>(bytes: &'a [u8]) -> Result<(BodyReader<'a>, Head), CodecError> {
    let body = codec::open(bytes, IMAGE_KIND, KIND_NAME, codec::BODY_BYTES_MAX)?;
    let mut reader = BodyReader::new(body, KIND_NAME);
    let head = reader.take()?;
    Ok((reader, head))
}

/// One managed name as served, as read (written as [`EntryOut`], the same encoding).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageEntry<'a> {
    /// Lower-case wire form.
    key: &'a [u8],
    generation: u64,
    ttl_secs: u32,
    /// The eligible IPv4 targets: 4 address bytes and a big-endian `u32` weight each.
    v4: &'a [u8],
    /// The eligible IPv6 targets: 16 address bytes and a big-endian `u32` weight each.
    v6: &'a [u8],
}

/// [`ImageEntry`] as written: its byte fields as byte strings, each written at once.
#[derive(Serialize)]
struct EntryOut<'a> {
    key: Bytes<'a>,
    generation: u64,
    ttl_secs: u32,
    v4: Bytes<'a>,
    v6: Bytes<'a>,
}

#[derive(Debug, Error)]
pub enum ImageError {
    #[error("cannot read {path}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is {len} bytes, more than any state this build writes; it is not ours")]
    TooLarge { path: PathBuf, len: u64 },
    #[error("{path} is corrupt or torn")]
    Corrupt { path: PathBuf, source: CodecError },
    #[error("{path} is an image of another DNS zone")]
    OtherDnsZone { path: PathBuf },
    #[error("{path} holds a bad entry: {why}")]
    BadEntry { path: PathBuf, why: String },
}

/// The image's path in `data_dir`.
pub fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// Writes `snapshot`'s managed entries as the image of its state, with `mark`, the store's
/// history mark at the snapshot's applied-change count, replacing the file at `path`.
/// Returns the bytes written.
pub fn save(path: &Path, snapshot: &Snapshot, mark: Option<&HistoryMark>) -> std::io::Result<u64> {
    let mut written = 0;
    write_atomic_with(path, |file| {
        file.write_all(&[0; codec::HEADER_BYTES])?;
        let mut body = BodyWriter::new(std::io::BufWriter::new(&mut *file));
        body.put(&Head {
            origin: snapshot.origin_key.to_vec(),
            applied_changes: snapshot.applied_changes,
            content_changes: snapshot.content_changes,
            mark: mark.cloned(),
        })?;
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for entry in snapshot.managed() {
            let Some(managed) = &entry.managed else { continue };
            v4.clear();
            v6.clear();
            for (address, weight) in &managed.v4.targets {
                v4.extend_from_slice(&address.octets());
                v4.extend_from_slice(&weight.to_be_bytes());
            }
            for (address, weight) in &managed.v6.targets {
                v6.extend_from_slice(&address.octets());
                v6.extend_from_slice(&weight.to_be_bytes());
            }
            body.put(&EntryOut {
                key: Bytes(&entry.key),
                generation: managed.generation.0,
                ttl_secs: managed.ttl_secs,
                v4: Bytes(&v4),
                v6: Bytes(&v6),
            })?;
        }
        let (out, len, crc) = body.finish();
        out.into_inner().map_err(|err| err.into_error())?;
        let len = u32::try_from(len)
            .ok()
            .filter(|len| *len as usize <= codec::BODY_BYTES_MAX)
            .ok_or_else(|| std::io::Error::other(format!("the image would be {len} bytes, over the limit of {}", codec::BODY_BYTES_MAX)))?;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&codec::header(IMAGE_KIND, len, crc))?;
        written = codec::HEADER_BYTES as u64 + u64::from(len);
        Ok(())
    })?;
    Ok(written)
}

/// The image at `path` as a snapshot of `zone` at its applied-change count, with the mark of
/// that count; `Ok(None)` when there is no file. The caller checks the mark against the store
/// and merges what changed since before serving it. A file in `local_state`'s older format
/// (every active record, written by earlier versions on etcd) is read too, without a mark.
pub fn read(path: &Path, zone: Arc<StaticZone>) -> Result<Option<(Option<HistoryMark>, Snapshot)>, ImageError> {
    let Some(bytes) = read_file(path)? else { return Ok(None) };
    let corrupt = |source| ImageError::Corrupt { path: path.to_path_buf(), source };
    if bytes.get(6) == Some(&LOCAL_STATE_KIND) {
        let state: LocalState = codec::decode(&bytes).map_err(corrupt)?;
        if !state.dns_zone.as_str().eq_ignore_ascii_case(&zone.origin.to_ascii()) {
            return Err(ImageError::OtherDnsZone { path: path.to_path_buf() });
        }
        return Ok(Some((None, Snapshot::build(zone, &state.active()))));
    }
    let bad = |why: String| ImageError::BadEntry { path: path.to_path_buf(), why };
    let (mut reader, head) = open_image(&bytes).map_err(corrupt)?;
    let mut snapshot = Snapshot::statics_only(zone);
    if head.origin != *snapshot.origin_key {
        return Err(ImageError::OtherDnsZone { path: path.to_path_buf() });
    }
    while !reader.is_done() {
        let entry: ImageEntry = reader.take().map_err(corrupt)?;
        check_key(entry.key, &snapshot.origin_key).map_err(|why| bad(why.into()))?;
        let v4 = targets(entry.v4, |a: [u8; 4]| Ipv4Addr::from(a)).ok_or_else(|| bad("a torn IPv4 target list".into()))?;
        let v6 = targets(entry.v6, |a: [u8; 16]| Ipv6Addr::from(a)).ok_or_else(|| bad("a torn IPv6 target list".into()))?;
        if v4.targets.is_empty() && v6.targets.is_empty() {
            // Never served empty, whatever the file says.
            return Err(bad("a name without targets".into()));
        }
        let managed = Managed { generation: Generation(entry.generation), ttl_secs: entry.ttl_secs, v4, v6 };
        snapshot.load_served(entry.key, managed);
    }
    snapshot.finish_load(head.applied_changes, head.content_changes);
    Ok(Some((head.mark, snapshot)))
}

/// The applied-change count of the state saved at `path` (checksum checked, entries not
/// read); `Ok(None)` when there is no file.
pub fn saved_applied_changes(path: &Path) -> Result<Option<u64>, ImageError> {
    let Some(bytes) = read_file(path)? else { return Ok(None) };
    let corrupt = |source| ImageError::Corrupt { path: path.to_path_buf(), source };
    if bytes.get(6) == Some(&LOCAL_STATE_KIND) {
        return codec::decode::<LocalState>(&bytes).map(|state| Some(state.applied_changes)).map_err(corrupt);
    }
    Ok(Some(open_image(&bytes).map_err(corrupt)?.1.applied_changes))
}

/// The file's bytes, `None` when there is none; a file larger than any envelope is refused
/// before it is read.
fn read_file(path: &Path) -> Result<Option<Vec<u8>>, ImageError> {
    let io = |source| ImageError::Io { path: path.to_path_buf(), source };
    let len = match std::fs::metadata(path) {
        Ok(meta) => meta.len(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(io(err)),
    };
    if len > (codec::HEADER_BYTES + codec::BODY_BYTES_MAX) as u64 {
        return Err(ImageError::TooLarge { path: path.to_path_buf(), len });
    }
    std::fs::read(path).map(Some).map_err(io)
}

/// A lower-case wire-form name inside the zone (the origin or below it) whose origin is `origin`.
fn check_key(key: &[u8], origin: &[u8]) -> Result<(), &'static str> {
    if key.len() > 255 || !key.ends_with(origin) {
        return Err("a name outside the DNS zone");
    }
    let mut at = 0;
    while at < key.len() - origin.len() {
        let len = usize::from(key[at]);
        if len == 0 || len > 63 {
            return Err("a name with a bad label length");
        }
        if key.get(at + 1..at + 1 + len).is_none_or(|label| label.iter().any(u8::is_ascii_uppercase)) {
            return Err("a name that is not lower-case wire form");
        }
        at += 1 + len;
    }
    if at != key.len() - origin.len() { Err("a name whose labels overrun the DNS zone's") } else { Ok(()) }
}

/// Targets packed as `N` address bytes and a big-endian weight each; `None` when torn.
fn targets<T: Copy, const A: usize, const N: usize>(packed: &[u8], address: impl Fn([u8; A]) -> T) -> Option<Family<T, N>> {
    let chunks = packed.chunks_exact(A + 4);
    if !chunks.remainder().is_empty() {
        return None;
    }
    let mut family = Family::<T, N>::default();
    for chunk in chunks {
        let (a, w) = chunk.split_at(A);
        family.targets.push((address(a.try_into().ok()?), u32::from_be_bytes(w.try_into().ok()?)));
    }
    Some(family)
}

/// The image of `store` at `path` brought up to the store's state, with the applied-change
/// count it was saved at; `None` (said in a log line) when there is none or it cannot be
/// used: then the caller reads the store's pages.
pub async fn resume<S: Store>(store: &S, path: &Path, zone: Arc<StaticZone>, check: Option<&PlanCheck>) -> Option<(u64, Snapshot)> {
    let started = Instant::now();
    let file = path.to_path_buf();
    let (mark, snapshot) = match tokio::task::spawn_blocking(move || read(&file, zone)).await {
        Ok(Ok(Some(read))) => read,
        Ok(Ok(None)) => {
            tracing::info!(path = %path.display(), "no serving image yet; reading the store's active state");
            return None;
        }
        Ok(Err(err)) => {
            tracing::warn!(error = %format!("{:#}", anyhow::Error::new(err)), "the serving image is not used; reading the store's active state");
            return None;
        }
        Err(err) => {
            tracing::warn!(error = %err, "reading the serving image failed; reading the store's active state");
            return None;
        }
    };
    let since = snapshot.applied_changes;
    let unused = |why: String| {
        tracing::info!(path = %path.display(), applied_changes = since, "the serving image is not used: {why}; reading the store's active state");
    };
    match store.history_mark(since).await {
        Ok(Some(now)) if Some(&now) == mark.as_ref() => {}
        Ok(Some(_)) | Ok(None) => {
            unused("the store's history at its applied-change count is not the one it was saved from (another store, or one restored and gone on differently)".into());
            return None;
        }
        Err(err) => {
            unused(format!("cannot read the store's history mark: {err}"));
            return None;
        }
    }
    let delta = match store.active_since(since).await {
        Ok(mut delta) if !delta.full => {
            if let Some(check) = check
                && let Err(err) = check.keep_trusted_map(store, &mut delta.endpoints).await
            {
                unused(format!("cannot check the changes since it against their plans: {err}"));
                return None;
            }
            delta
        }
        Ok(_) => {
            unused("the store no longer holds every change since it (or too many)".into());
            return None;
        }
        Err(err) => {
            unused(format!("cannot read the changes since it: {err}"));
            return None;
        }
    };
    let merged = delta.endpoints.len();
    let snapshot = match tokio::task::spawn_blocking(move || snapshot.apply(&delta)).await {
        Ok(snapshot) => snapshot,
        Err(err) => {
            unused(format!("merging the changes since it failed: {err}"));
            return None;
        }
    };
    tracing::info!(
        path = %path.display(),
        endpoints = snapshot.managed_count(),
        saved_at = since,
        applied_changes = snapshot.applied_changes,
        merged,
        secs = started.elapsed().as_secs_f64(),
        "serving image loaded and brought up to the store"
    );
    Some((since, snapshot))
}

/// Writes the image of what `serving` serves: after a start that did not use one, then at
/// most every [`SAVE_INTERVAL`] while it changes (or `SAVE_PACING` times the last write, if
/// longer), and once more by `save_now` at shutdown.
pub struct Keeper {
    path: PathBuf,
    /// The shortest time between two writes (before `local_state::paced`).
    floor: Duration,
    /// The applied-change count last written; held through each write, so a write left
    /// running by a cancelled `keep_saved` and the one at shutdown take turns.
    saved: Mutex<Option<u64>>,
    /// On etcd, the log of changes served since the saved state: what a write saved leaves it.
    served_log: Option<Arc<crate::serving::local_log::LocalLog>>,
}

impl Keeper {
    /// `saved`: the count of the image loaded at start, `None` when none was (then it is
    /// written at once); `floor`: the shortest time between two writes ([`SAVE_INTERVAL`] on
    /// the embedded store, `local_state::SAVE_INTERVAL` on etcd).
    pub fn new(path: PathBuf, saved: Option<u64>, floor: Duration) -> Arc<Keeper> {
        Arc::new(Keeper { path, floor, saved: Mutex::new(saved), served_log: None })
    }

    /// As `new`, emptying `served_log` of what each write saves.
    pub fn with_served_log(
        path: PathBuf,
        saved: Option<u64>,
        floor: Duration,
        served_log: Arc<crate::serving::local_log::LocalLog>,
    ) -> Arc<Keeper> {
        Arc::new(Keeper { path, floor, saved: Mutex::new(saved), served_log: Some(served_log) })
    }

    /// Runs until the task is dropped. A failed write is an ERROR line once and INFO when
    /// writing works again; the next start then merges more, or reads the store.
    pub async fn keep_saved<S: Store>(self: Arc<Self>, serving: Arc<Serving>, store: S) {
        let mut failing = false;
        let mut wait = self.saved.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).is_some();
        let mut last_write = Duration::ZERO;
        let mut swaps = serving.served_applied.subscribe();
        loop {
            if wait {
                tokio::time::sleep(paced(self.floor, last_write)).await;
                // Then asleep until the state served moves past what was written (a failed
                // write is tried again at once, paced): no timer wakes a quiet zone.
                let saved = *self.saved.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if swaps.wait_for(|applied| Some(*applied) != saved).await.is_err() {
                    return;
                }
            }
            wait = true;
            let started = Instant::now();
            let saved = self.clone().save_now(&serving, &store).await;
            last_write = started.elapsed();
            match saved {
                Ok(_) if failing => {
                    tracing::info!(path = %self.path.display(), "the serving image is written again");
                    failing = false;
                }
                Ok(_) => {}
                Err(err) => {
                    if !failing {
                        tracing::error!(error = %format!("{err:#}"), path = %self.path.display(), "cannot write the serving image; the next start reads the store's whole active state");
                    }
                    failing = true;
                }
            }
        }
    }

    /// Writes the image now if the served state moved since the last write; the bytes
    /// written (0 when nothing moved). The store's history mark goes with it when the store
    /// answers with one; an etcd store has none, and an unreachable one cannot stop the write
    /// (the file is for starting while it is unreachable).
    pub async fn save_now<S: Store>(self: Arc<Self>, serving: &Serving, store: &S) -> anyhow::Result<u64> {
        let snapshot = serving.snapshot.load_full();
        if *self.saved.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) == Some(snapshot.applied_changes) {
            return Ok(0);
        }
        let mark = store.history_mark(snapshot.applied_changes).await.ok().flatten();
        let (started, applied) = (Instant::now(), snapshot.applied_changes);
        let keeper = self.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            let mut saved = keeper.saved.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let bytes = save(&keeper.path, &snapshot, mark.as_ref())?;
            *saved = Some(snapshot.applied_changes);
            if let Some(log) = &keeper.served_log {
                log.compact(snapshot.applied_changes).map_err(std::io::Error::other)?;
            }
            Ok::<_, std::io::Error>(bytes)
        })
        .await??;
        tracing::debug!(applied_changes = applied, bytes, secs = started.elapsed().as_secs_f64(), "serving image written");
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zone::dns_zone::test_zone as zone_of;
    use dnsplan_common::store::{ActiveRecord, ActiveSnapshot, ActiveState};
    use dnsplan_common::{DnsName, Endpoint, Target, ZoneId};

    fn zone() -> Arc<StaticZone> {
        zone_of("example.test.")
    }

    fn serving(g: u64, targets: &[(&str, u32)]) -> ActiveRecord {
        let zone = ZoneId::parse("a").expect("zone");
        let targets =
            targets.iter().map(|(a, w)| Target { address: a.parse().expect("address"), zone: zone.clone(), weight: *w }).collect();
        ActiveRecord { generation: Generation(g), state: ActiveState::Serving(Endpoint { ttl_secs: 30 + g as u32, targets }) }
    }

    fn mark(applied_changes: u64) -> HistoryMark {
        HistoryMark { store_id: 7, applied_changes, change: DnsName::parse("a.example.test.").ok() }
    }

    #[test]
    fn an_image_reads_back_as_the_snapshot_it_was_saved_from() {
        let name = |n: &str| DnsName::parse(n).expect("name");
        let endpoints = [
            (name("a.example.test."), serving(3, &[("10.0.0.1", 1), ("10.0.0.2", 3)])),
            (name("b.deep.example.test."), serving(4, &[("2001:db8::1", 2), ("10.0.0.3", 2), ("2001:db8::2", 2)])),
            (name("zero.example.test."), serving(5, &[("10.0.0.4", 0), ("10.0.0.5", 0)])),
            (name("some-zero.example.test."), serving(5, &[("10.0.0.6", 0), ("10.0.0.7", 4)])),
            (name("gone.example.test."), ActiveRecord { generation: Generation(6), state: ActiveState::Retired }),
        ];
        let snapshot =
            Snapshot::build(zone(), &ActiveSnapshot { applied_changes: 9, content_changes: 5, endpoints: endpoints.into_iter().collect() });
        let dir = tempfile::tempdir().expect("tempdir");
        let path = path_in(dir.path());
        assert!(save(&path, &snapshot, Some(&mark(9))).expect("save") > codec::HEADER_BYTES as u64);
        let (read_mark, read) = read(&path, zone()).expect("read").expect("an image");
        assert_eq!(read_mark, Some(mark(9)));
        assert_eq!(
            (read.applied_changes, read.content_changes, read.serial),
            (snapshot.applied_changes, snapshot.content_changes, snapshot.serial)
        );
        assert_eq!(read.managed_count(), 4);
        assert_eq!(read.managed_count(), snapshot.managed_count());
        assert_eq!(read.generation_range(), snapshot.generation_range());
        for entry in snapshot.managed() {
            assert_eq!(read.get_key(&entry.key).and_then(|e| e.managed.as_ref()), entry.managed.as_ref(), "{:?}", entry.name());
        }
        // `deep` has no data but a name below it: still an empty non-terminal.
        let deep = crate::zone::snapshot::wire_key(&hickory_proto::rr::Name::from_ascii("deep.example.test.").expect("name"));
        assert!(read.is_empty_non_terminal(&hickory_proto::rr::Name::from_ascii("deep.example.test.").expect("name")));
        assert!(read.get_key(&deep).is_some_and(|e| !e.has_data()));
    }

    /// An image of another kind (65, before its head carried the content-change count) is not
    /// read: its reader names the kind, and `resume` then reads the store as without an image.
    #[test]
    fn an_image_of_another_kind_is_not_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = path_in(dir.path());
        save(&path, &Snapshot::build(zone(), &ActiveSnapshot::default()), None).expect("save");
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[6] = 65;
        std::fs::write(&path, &bytes).expect("write");
        let Err(err) = read(&path, zone()) else { panic!("an image of another kind was read") };
        let text = format!("{:#}", anyhow::Error::new(err));
        assert!(text.contains("serving image") && text.contains("65"), "{text}");
    }

    #[test]
    fn an_image_of_another_zone_is_refused() {
        let snapshot = Snapshot::build(zone(), &ActiveSnapshot::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let path = path_in(dir.path());
        save(&path, &snapshot, None).expect("save");
        assert!(matches!(read(&path, zone_of("other.test.")), Err(ImageError::OtherDnsZone { .. })));
        assert!(read(&dir.path().join("absent"), zone()).expect("no file is no error").is_none());
    }

    /// A file an earlier version wrote on etcd (every active record) is still served, so an
    /// upgrade does not lose static stability; the next write replaces it.
    #[test]
    fn the_older_format_is_read() {
        let name = |n: &str| DnsName::parse(n).expect("name");
        let endpoints = [
            (name("a.example.test."), serving(3, &[("10.0.0.1", 1)])),
            (name("gone.example.test."), ActiveRecord { generation: Generation(6), state: ActiveState::Retired }),
        ];
        let state = LocalState { dns_zone: name("example.test."), applied_changes: 12, endpoints: endpoints.into_iter().collect() };
        let dir = tempfile::tempdir().expect("tempdir");
        let path = path_in(dir.path());
        crate::follow::local_state::write_atomic(&path, &codec::encode(&state)).expect("write");
        assert_eq!(saved_applied_changes(&path).expect("reads"), Some(12));
        let (mark, loaded) = read(&path, zone()).expect("reads").expect("a state");
        assert_eq!((mark, loaded.applied_changes, loaded.managed_count()), (None, 12, 1));
        assert!(matches!(read(&path, zone_of("other.test.")), Err(ImageError::OtherDnsZone { .. })));

        // Damage is refused whole, saying which file and why, in either format.
        let good = codec::encode(&state);
        let mut future = good.clone();
        future[4] = 9;
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x80;
        for (bytes, want) in [(future, "newer than this build"), (flipped, "checksum"), (good[..good.len() - 3].to_vec(), "truncated")] {
            crate::follow::local_state::write_atomic(&path, &bytes).expect("write");
            let Err(err) = read(&path, zone()) else { panic!("{want}: the damaged file was read") };
            let text = format!("{:#}", anyhow::Error::new(err));
            assert!(text.contains(want) && text.contains(&path.display().to_string()), "want {want:?} in {text}");
        }
        let huge = std::fs::File::create(&path).expect("create");
        huge.set_len((codec::HEADER_BYTES + codec::BODY_BYTES_MAX + 1) as u64).expect("a sparse file");
        assert!(matches!(read(&path, zone()), Err(ImageError::TooLarge { .. })), "a file over the limit is refused before it is read");
    }

    #[test]
    fn only_wire_names_inside_the_zone_are_taken() {
        let origin = [7, b'e', b'x', b'a', b'm', b'p', b'l', b'e', 4, b't', b'e', b's', b't', 0];
        let with = |labels: &[u8]| [labels, &origin[..]].concat();
        assert_eq!(check_key(&with(&[1, b'a']), &origin), Ok(()));
        assert_eq!(check_key(&origin, &origin), Ok(()));
        assert!(check_key(&with(&[1, b'A']), &origin).is_err(), "upper case");
        assert!(check_key(&with(&[3, b'a']), &origin).is_err(), "a label running into the origin");
        assert!(check_key(&with(&[0]), &origin).is_err(), "an empty label");
        assert!(check_key(&with(&[64]), &origin).is_err(), "a label over 63 bytes");
        assert!(check_key(&[1, b'a', 5, b'o', b't', b'h', b'e', b'r', 0], &origin).is_err(), "outside the zone");
        assert!(check_key(&with(&[2, b'a']), &origin).is_err(), "labels overrunning the origin");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 500, ..proptest::prelude::ProptestConfig::default() })]

        /// A damaged image, re-sealed so that it reaches the parser, never panics; one that
        /// reads has only names of the zone, each with a target.
        #[test]
        fn damaged_images_never_panic(
            flips in proptest::collection::vec((proptest::prelude::any::<usize>(), proptest::prelude::any::<u8>()), 1..8),
            cut in proptest::option::of(proptest::prelude::any::<usize>()),
        ) {
            let name = |n: &str| DnsName::parse(n).expect("name");
            let endpoints = [
                (name("a.example.test."), serving(3, &[("10.0.0.1", 1), ("10.0.0.2", 3)])),
                (name("b.deep.example.test."), serving(4, &[("2001:db8::1", 2), ("10.0.0.3", 2)])),
            ];
            let snapshot = Snapshot::build(zone(), &ActiveSnapshot { applied_changes: 9, content_changes: 9, endpoints: endpoints.into_iter().collect() });
            let dir = tempfile::tempdir().expect("tempdir");
            let path = path_in(dir.path());
            save(&path, &snapshot, Some(&mark(9))).expect("save");
            let mut bytes = std::fs::read(&path).expect("read");
            for (at, xor) in flips {
                let i = codec::HEADER_BYTES + at % (bytes.len() - codec::HEADER_BYTES);
                bytes[i] ^= xor.max(1);
            }
            if let Some(cut) = cut {
                bytes.truncate(codec::HEADER_BYTES + cut % (bytes.len() - codec::HEADER_BYTES + 1));
            }
            // Re-sealed, so that the damage reaches the parser.
            std::fs::write(&path, codec::seal(IMAGE_KIND, &bytes[codec::HEADER_BYTES..])).expect("write");
            if let Ok(Some((_, read))) = read(&path, zone()) {
                for entry in read.managed() {
                    let managed = entry.managed.as_ref().expect("managed");
                    proptest::prop_assert!(!(managed.v4.is_empty() && managed.v6.is_empty()));
                    proptest::prop_assert!(check_key(&entry.key, &read.origin_key).is_ok());
                }
            }
        }
    }

    #[test]
    fn torn_target_lists_are_refused() {
        assert!(targets::<Ipv4Addr, 4, 4>(&[10, 0, 0, 1, 0, 0, 0, 1, 10], Ipv4Addr::from).is_none());
        let family = targets::<Ipv4Addr, 4, 4>(&[10, 0, 0, 1, 0, 0, 0, 1, 10, 0, 0, 2, 0, 0, 0, 2], Ipv4Addr::from).expect("whole");
        assert_eq!(family.targets.as_slice(), &[(Ipv4Addr::new(10, 0, 0, 1), 1), (Ipv4Addr::new(10, 0, 0, 2), 2)]);
        assert!(!family.uniform());
    }
}
