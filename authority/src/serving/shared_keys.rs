//! A signed zone's key directory shared through its store (`kek_file` beside `key_dir`;
//! `dnsplan_common::dnssec_share`): each look takes the store's newer record, makes the rolls
//! the schedule calls for, and writes the directory back, compared with the version it read.

use crate::zone::dns_zone::ZoneSigner;
use dnsplan_common::dnssec_keys::{At, KEYS_FILE, KeyDir, Policy, SigningKeys};
use dnsplan_common::dnssec_share::{self, Kek, Shared};
use dnsplan_common::store::{KeysPut, KeysRecord, Store, StoreResult};
use hickory_proto::rr::Name;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

type Boxed<'a, T> = Pin<Box<dyn Future<Output = StoreResult<T>> + Send + 'a>>;

/// The two store calls sharing needs, for any store.
trait KeysStore: Send + Sync {
    fn read(&self) -> Boxed<'_, Option<KeysRecord>>;
    fn write(&self, expected: Option<u64>, bytes: Vec<u8>) -> Boxed<'_, KeysPut>;
}

impl<S: Store> KeysStore for S {
    fn read(&self) -> Boxed<'_, Option<KeysRecord>> {
        Box::pin(self.dnssec_keys())
    }
    fn write(&self, expected: Option<u64>, bytes: Vec<u8>) -> Boxed<'_, KeysPut> {
        Box::pin(self.put_dnssec_keys(expected, bytes))
    }
}

/// A zone's keys shared through its store, sealed with `kek`.
#[derive(Clone)]
pub struct SharedKeys {
    store: Arc<dyn KeysStore>,
    kek: Arc<Kek>,
}

impl std::fmt::Debug for SharedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedKeys({:?})", self.kek)
    }
}

/// What a look found to write back.
struct Push {
    expected: Option<u64>,
    bytes: Vec<u8>,
    digest: String,
}

/// How many times a look reads again after another authority wrote first.
const ATTEMPTS: usize = 3;

impl SharedKeys {
    pub fn new<S: Store>(store: S, kek: Arc<Kek>) -> SharedKeys {
        SharedKeys { store: Arc::new(store), kek }
    }

    /// Before the zone is loaded: a key directory `path` with no `keys.toml` is made from the
    /// store's record. None there either: `make` makes the keys here (`create_keys`) and they
    /// are written to the store, compared with none (another authority that wrote first wins:
    /// its keys are taken instead); without `make`, an error saying how to make them.
    pub async fn pull_or_make<F>(&self, path: &Path, origin: &str, make: Option<F>) -> anyhow::Result<()>
    where
        F: FnOnce() -> anyhow::Result<()> + Send + 'static,
    {
        if path.join(KEYS_FILE).exists() {
            return Ok(());
        }
        let origin = if origin.ends_with('.') { origin.to_ascii_lowercase() } else { format!("{}.", origin.to_ascii_lowercase()) };
        let record = match self.store.read().await? {
            Some(record) => record,
            None => {
                let Some(make) = make else {
                    anyhow::bail!(
                        "zone {origin}: key directory {} has no {KEYS_FILE}, and the store holds no keys of the zone yet: make them on one \
                         authority with `dnsplan zone key init DIR --dns-zone {origin}` (it writes them to the store; the others then take them)",
                        path.display()
                    );
                };
                let (dir, kek) = (path.to_owned(), self.kek.clone());
                let (bytes, digest) = tokio::task::spawn_blocking(move || -> anyhow::Result<(Vec<u8>, String)> {
                    make()?;
                    Ok(dnssec_share::export(&dir, &kek, now())?)
                })
                .await??;
                match self.store.write(None, bytes).await? {
                    KeysPut::Written { version } => {
                        let dir = path.to_owned();
                        tokio::task::spawn_blocking(move || {
                            dnssec_share::set_shared(&dir, &Shared { version: Some(version), schedule_sha256: digest })
                        })
                        .await??;
                        tracing::info!(zone = %origin, key_dir = %path.display(), version, "wrote the zone's new DNSSEC keys to the store");
                        return Ok(());
                    }
                    KeysPut::Moved { .. } => {
                        // Another authority made the zone's keys first: its are the zone's.
                        let dir = path.to_owned();
                        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await??;
                        self.store.read().await?.ok_or_else(|| anyhow::anyhow!("zone {origin}: the store's DNSSEC keys went away"))?
                    }
                }
            }
        };
        let (path, kek) = (path.to_owned(), self.kek.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let digest = dnssec_share::import(&path, &record.bytes, &kek, &origin, now())?;
            dnssec_share::set_shared(&path, &Shared { version: Some(record.version), schedule_sha256: digest })?;
            tracing::info!(zone = %origin, key_dir = %path.display(), version = record.version, "took the zone's DNSSEC keys from the store");
            Ok(())
        })
        .await?
    }

    /// One look at key directory `path` of `origin` (`ZoneSigner::read_dir`, shared): the
    /// store's newer record taken, the rolls made (`rolls`), the directory written back when
    /// it changed. With the store away, the directory alone (its changes written back at a
    /// later look). Returns the keys to sign with at `now`.
    pub async fn look(&self, path: &Path, origin: &Name, rolls: bool, now: u32) -> Result<(SigningKeys, Policy), String> {
        let mut last = None;
        for _ in 0..ATTEMPTS {
            let record = match self.store.read().await {
                Ok(record) => Some(record),
                Err(err) => {
                    tracing::warn!(zone = %origin, error = %err, "the store's DNSSEC keys could not be read; the key directory is read alone");
                    None
                }
            };
            let known = record.is_some();
            let (dir, name, kek) = (path.to_owned(), origin.clone(), self.kek.clone());
            let (keys, push) = tokio::task::spawn_blocking(move || step(&dir, &name, &kek, record, rolls, now))
                .await
                .map_err(|e| format!("reading the key directory did not finish: {e}"))??;
            let Some(push) = push.filter(|_| known) else { return Ok(keys) };
            match self.store.write(push.expected, push.bytes).await {
                Ok(KeysPut::Written { version }) => {
                    let (dir, digest) = (path.to_owned(), push.digest);
                    let saved = tokio::task::spawn_blocking(move || {
                        dnssec_share::set_shared(&dir, &Shared { version: Some(version), schedule_sha256: digest })
                    })
                    .await;
                    match saved {
                        Ok(Ok(())) => tracing::info!(zone = %origin, version, "wrote the zone's DNSSEC keys to the store"),
                        Ok(Err(err)) => return Err(err.to_string()),
                        Err(err) => return Err(err.to_string()),
                    }
                    return Ok(keys);
                }
                Ok(KeysPut::Moved { current }) => {
                    tracing::info!(zone = %origin, expected = ?push.expected, ?current, "another authority wrote the zone's DNSSEC keys first; taking theirs");
                    last = Some(keys);
                }
                Err(err) => {
                    tracing::warn!(zone = %origin, error = %err, "the zone's DNSSEC keys could not be written to the store; written at a later look");
                    return Ok(keys);
                }
            }
        }
        last.ok_or_else(|| "no look finished".into())
    }
}

fn now() -> At {
    At(u64::from(crate::zone::signed::unix_now()))
}

/// The blocking part of a look, the directory locked: `record` is the store's (`None`: the
/// store did not answer).
fn step(
    path: &Path,
    origin: &Name,
    kek: &Kek,
    record: Option<Option<KeysRecord>>,
    rolls: bool,
    now: u32,
) -> Result<((SigningKeys, Policy), Option<Push>), String> {
    let at = At(u64::from(now));
    let zone = origin.to_ascii();
    let _lock = KeyDir::lock(path).map_err(|e| e.to_string())?;
    let mut shared = dnssec_share::shared(path).map_err(|e| e.to_string())?;
    let local = dnssec_share::schedule_digest(path).map_err(|e| e.to_string())?;
    if let Some(Some(record)) = &record
        && shared.version != Some(record.version)
    {
        let changed_here = local.as_ref().is_some_and(|d| *d != shared.schedule_sha256);
        // A copy of the store's directory (as authorities sharing by copies had) is taken as
        // it is; another one is refused.
        let foreign = local.is_some() && local != dnssec_share::record_digest(&record.bytes);
        if shared.version.is_none() && foreign {
            // Never shared, and not what the store holds: the directory may hold the keys
            // whose DS the parent has. Taking the store's would make the zone bogus.
            let theirs = dnssec_share::record_zone(&record.bytes).unwrap_or_default();
            return Err(format!(
                "key directory {} was never shared and holds other keys than the store's (of {theirs}): \
                 keep one set. To take the store's, move the directory away; to keep this one, its keys \
                 must be the store's first (start this authority first, on a store with none)",
                path.display()
            ));
        }
        if changed_here && shared.version.is_some() {
            tracing::warn!(zone, key_dir = %path.display(), "the key directory's changes since the store's version {:?} are replaced by its version {}, written meanwhile by another authority", shared.version, record.version);
        }
        let digest = dnssec_share::import(path, &record.bytes, kek, &zone, at).map_err(|e| e.to_string())?;
        shared = Shared { version: Some(record.version), schedule_sha256: digest };
        dnssec_share::set_shared(path, &shared).map_err(|e| e.to_string())?;
        tracing::info!(zone, version = record.version, "took the zone's DNSSEC keys from the store");
    }
    let keys = ZoneSigner::read_dir_locked(path, origin, rolls, now)?;
    let digest = dnssec_share::schedule_digest(path).map_err(|e| e.to_string())?;
    let store_has = matches!(&record, Some(Some(_)));
    let push = match record {
        Some(_) if !store_has || digest.as_deref() != Some(shared.schedule_sha256.as_str()) => {
            let (bytes, digest) = dnssec_share::export(path, kek, at).map_err(|e| e.to_string())?;
            Some(Push { expected: if store_has { shared.version } else { None }, bytes, digest })
        }
        _ => None,
    };
    Ok((keys, push))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dnsplan_common::SledStore;
    use dnsplan_common::dnssec::ZoneAlgorithm;

    const ORIGIN: &str = "example.test.";

    /// `dnsplan zone key roll --zsk DIR` (or `--ksk`), as the CLI makes it.
    fn roll(dir: &Path, now: u32, ksk: bool) {
        let _lock = KeyDir::lock(dir).expect("lock");
        let mut keys = KeyDir::load(dir, At(u64::from(now))).expect("load");
        if ksk {
            keys.roll_ksk(At(u64::from(now))).expect("roll");
        } else {
            keys.roll_zsk(At(u64::from(now))).expect("roll");
        }
        keys.save().expect("save");
    }

    /// Two authorities' directories shared through one store: the second is made from the
    /// store's record; a roll made on either reaches the other at its next look; of two rolls
    /// made at once from one version, the first written wins and the other directory takes
    /// it; a directory never shared that holds other keys is refused, not overwritten, and one
    /// that is a copy of the store's (sharing by copies before) is taken as it is. Checked once:
    /// with the never-shared check against the directory's own digest, the copy was refused.
    #[tokio::test]
    async fn directories_shared_through_the_store_converge_and_a_foreign_one_is_refused() {
        let tmp = tempfile::tempdir().expect("dir");
        let store = SledStore::open(tmp.path().join("store")).expect("store");
        let kek = Arc::new(Kek::create(&tmp.path().join("kek")).expect("kek"));
        let origin = Name::from_ascii(ORIGIN).expect("name");
        let now = crate::zone::signed::unix_now();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        KeyDir::init(&a, ORIGIN, ZoneAlgorithm::Ed25519, None, Policy::default(), At(u64::from(now))).expect("init");
        let shared = SharedKeys::new(store.clone(), kek.clone());

        // A copy of a's directory made before it was shared, as authorities sharing by copies
        // hold one.
        let copy = tmp.path().join("copy");
        std::fs::create_dir(&copy).expect("copy dir");
        for entry in std::fs::read_dir(&a).expect("read a").flatten() {
            std::fs::copy(entry.path(), copy.join(entry.file_name())).expect("copy");
        }
        let (keys_a, _) = shared.look(&a, &origin, true, now).await.expect("look a");
        let first = store.dnssec_keys().await.expect("read").expect("written by the first look");
        let (keys_copy, _) = shared.look(&copy, &origin, true, now).await.expect("a copy of the store's keys is taken as it is");
        assert!(keys_copy.same_keys(&keys_a), "{} / {}", keys_copy.summary(), keys_a.summary());
        shared.pull_or_make(&b, ORIGIN, None::<fn() -> anyhow::Result<()>>).await.expect("pull b");
        let (keys_b, _) = shared.look(&b, &origin, true, now).await.expect("look b");
        assert!(keys_a.same_keys(&keys_b), "{} / {}", keys_a.summary(), keys_b.summary());
        assert_eq!(store.dnssec_keys().await.expect("read").map(|r| r.version), Some(first.version), "nothing new to write");

        roll(&b, now + 1, false);
        let (keys_b, _) = shared.look(&b, &origin, true, now + 1).await.expect("look b");
        let (keys_a, _) = shared.look(&a, &origin, true, now + 1).await.expect("look a");
        assert!(keys_a.same_keys(&keys_b), "the roll made on b reached a: {} / {}", keys_a.summary(), keys_b.summary());
        assert_eq!(keys_a.dnskeys.len(), 3, "the KSK and two ZSKs: {}", keys_a.summary());

        // Both start a KSK roll from the same version; a writes first.
        let before = store.dnssec_keys().await.expect("read").expect("record");
        roll(&a, now + 2, true);
        roll(&b, now + 2, true);
        let (keys_a, _) = shared.look(&a, &origin, true, now + 2).await.expect("look a");
        let (keys_b, _) = shared.look(&b, &origin, true, now + 2).await.expect("look b");
        assert!(keys_a.same_keys(&keys_b), "b took a's roll: {} / {}", keys_a.summary(), keys_b.summary());
        assert_eq!(keys_a.ksks.len(), 2, "one KSK roll, not two: {}", keys_a.summary());
        let after = store.dnssec_keys().await.expect("read").expect("record");
        assert_ne!(after.version, before.version);
        assert_eq!(std::fs::read(a.join(KEYS_FILE)).expect("a"), std::fs::read(b.join(KEYS_FILE)).expect("b"), "one schedule on both");

        let c = tmp.path().join("c");
        KeyDir::init(&c, ORIGIN, ZoneAlgorithm::Ed25519, None, Policy::default(), At(u64::from(now))).expect("init");
        let err = shared.look(&c, &origin, true, now + 3).await.expect_err("a foreign directory");
        assert!(err.contains("never shared"), "{err}");
        assert_eq!(store.dnssec_keys().await.expect("read").map(|r| r.version), Some(after.version), "the store is untouched");
    }

    /// Two authorities add the same zone at once: both find no keys in the store and both make
    /// some (the barrier holds each until the other has made its own); of their writes,
    /// compared with none, one lands, and the other authority drops its keys and takes the
    /// winner's. Checked once: with sled's write not compared, both directories kept their own
    /// keys.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn of_two_authorities_making_a_zones_keys_at_once_one_writes_and_both_sign_with_its() {
        let tmp = tempfile::tempdir().expect("dir");
        let store = SledStore::open(tmp.path().join("store")).expect("store");
        let kek = Arc::new(Kek::create(&tmp.path().join("kek")).expect("kek"));
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let mut tasks = tokio::task::JoinSet::new();
        for name in ["a", "b"] {
            let (shared, barrier) = (SharedKeys::new(store.clone(), kek.clone()), barrier.clone());
            let dir = tmp.path().join(name).join("keys");
            tasks.spawn(async move {
                let made = dir.clone();
                let make = move || {
                    std::fs::create_dir_all(made.parent().expect("parent"))?;
                    KeyDir::init(&made, ORIGIN, ZoneAlgorithm::Ed25519, None, Policy::default(), now())?;
                    barrier.wait();
                    anyhow::Ok(())
                };
                shared.pull_or_make(&dir, ORIGIN, Some(make)).await.map(|()| dir)
            });
        }
        let mut schedules = Vec::new();
        while let Some(done) = tasks.join_next().await {
            let dir = done.expect("task").expect("pull or make");
            schedules.push(std::fs::read(dir.join(KEYS_FILE)).expect("keys.toml"));
        }
        assert_eq!(schedules[0], schedules[1], "both directories hold the keys written first");
        let record = store.dnssec_keys().await.expect("read").expect("record");
        let tags = |text: &[u8]| -> Vec<String> {
            String::from_utf8_lossy(text).lines().filter(|l| l.starts_with("tag = ")).map(str::to_owned).collect()
        };
        assert_eq!(tags(&schedules[0]), tags(&record.bytes), "the store's keys");
    }
}
