//! Each added zone's own directory on the authority's disk, `data_dir/served-zones/<origin>/`:
//! the file `zone` (its origin, incarnation and master file, as the store gave them, written
//! before the zone is first served), its IXFR history (`serving::ixfr_log`, when secondaries
//! transfer it) and, on etcd, the state it served and the log of changes since
//! (`follow::kept`). So a restart keeps each zone's IXFR history, and an authority on etcd
//! answers for every zone it served at once, before etcd answers, as it does for the first.
//!
//! A directory whose `zone` file is missing, torn or of another origin is not served from
//! (a WARN line), and removed once the store's registry is read; so is the directory of a
//! zone the registry no longer has live at that incarnation.

use dnsplan_common::DnsName;
use dnsplan_common::codec;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The directory of the zones' directories, in `data_dir`.
pub const DIR_NAME: &str = "served-zones";
/// The file that names the zone in its directory.
const ZONE_FILE: &str = "zone";
/// The envelope kind of a [`SavedZone`] (`local_state` 64, the serving image 66, the IXFR
/// journal 67, the static zones' image 68).
pub const KIND: u8 = 69;

/// An added zone as the store gave it: what its directory's state was served for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedZone {
    pub origin: DnsName,
    /// The zone's incarnation in the store's registry: the state kept beside is of this one.
    pub incarnation: u64,
    /// Its master file (SOA, NS, static records).
    pub master: String,
}

impl codec::Record for SavedZone {
    const KIND: u8 = KIND;
    const KIND_NAME: &'static str = "added zone";
    const BODY_BYTES_MAX: usize = codec::BODY_BYTES_MAX;
}

/// The directory of zone `origin`.
pub fn dir_in(data_dir: &Path, origin: &DnsName) -> PathBuf {
    data_dir.join(DIR_NAME).join(origin.as_str())
}

/// Opens `zone`'s directory: kept as it is when its `zone` file is this zone's (the same
/// incarnation and master file); else anything kept there is removed and the `zone` file
/// written (fsynced) before anything is served from it.
pub fn open(data_dir: &Path, zone: &SavedZone) -> std::io::Result<PathBuf> {
    let dir = dir_in(data_dir, &zone.origin);
    if read_one(&dir).as_ref() == Ok(zone) {
        return Ok(dir);
    }
    remove(&dir)?;
    crate::follow::local_state::write_atomic(&dir.join(ZONE_FILE), &codec::encode(zone))?;
    Ok(dir)
}

/// Removes a zone's directory and what it holds; none is no error.
pub fn remove(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

/// A zone directory found at start.
pub struct Found {
    pub dir: PathBuf,
    /// The zone it is for; `Err` (why) when its `zone` file cannot be used.
    pub zone: Result<SavedZone, String>,
}

/// Every zone directory in `data_dir`, each with its `zone` file read back.
pub fn read_all(data_dir: &Path) -> std::io::Result<Vec<Found>> {
    let entries = match std::fs::read_dir(data_dir.join(DIR_NAME)) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let mut found = Vec::new();
    for entry in entries {
        let dir = entry?.path();
        let zone = read_one(&dir);
        found.push(Found { dir, zone });
    }
    found.sort_by(|a, b| a.dir.cmp(&b.dir));
    Ok(found)
}

fn read_one(dir: &Path) -> Result<SavedZone, String> {
    let path = dir.join(ZONE_FILE);
    let bytes = std::fs::read(&path).map_err(|err| format!("{}: {err}", path.display()))?;
    let zone: SavedZone = codec::decode(&bytes).map_err(|err| format!("{}: {err}", path.display()))?;
    if dir.file_name().and_then(|n| n.to_str()) != Some(zone.origin.as_str()) {
        return Err(format!("{}: the file is of zone {}, not of its directory's", path.display(), zone.origin));
    }
    Ok(zone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zone_file_is_read_back_and_a_damaged_or_misplaced_one_refused() {
        let data = tempfile::tempdir().unwrap();
        let zone = SavedZone { origin: DnsName::parse("shop.test").unwrap(), incarnation: 7, master: "@ SOA ...".into() };
        let dir = open(data.path(), &zone).unwrap();
        std::fs::write(dir.join("ixfr-journal"), b"kept").unwrap();
        assert_eq!(open(data.path(), &zone).unwrap(), dir);
        assert!(dir.join("ixfr-journal").exists(), "what the same incarnation kept is kept");
        let again = SavedZone { incarnation: 8, ..zone.clone() };
        let dir = open(data.path(), &again).unwrap();
        assert!(!dir.join("ixfr-journal").exists(), "what another incarnation kept is removed");
        let found = read_all(data.path()).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].zone.as_ref().unwrap(), &again);

        let other = data.path().join(DIR_NAME).join("other.test.");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::copy(dir.join(ZONE_FILE), other.join(ZONE_FILE)).unwrap();
        let mut torn = std::fs::read(dir.join(ZONE_FILE)).unwrap();
        torn.truncate(torn.len() - 3);
        std::fs::write(dir.join(ZONE_FILE), torn).unwrap();
        let found = read_all(data.path()).unwrap();
        assert_eq!(found.len(), 2);
        assert!(found.iter().all(|f| f.zone.is_err()), "{:?}", found.iter().map(|f| &f.zone).collect::<Vec<_>>());
        remove(&other).unwrap();
        remove(&other).unwrap();
    }
}
