//! What each plan says of each endpoint (`contents`, `contents_full`, `contents_chunks`).

use super::*;

/// Names in one `contents_chunks` value: a batch of applies in name order reads a few chunks.
pub(super) const CONTENT_CHUNK_NAMES: usize = 256;

/// Set while a publish writes its `contents` entries in batches ahead of the transaction that
/// makes its plan visible (the generation, big-endian); that transaction removes it. Found
/// later, the publish did not commit (an error, or a crash), and its entries, which belong to
/// no plan, are removed before anything else reads or writes `contents`.
pub(super) const META_CONTENTS_PENDING: &[u8] = b"contents_pending";

/// `contents` entries a publish writes inside its transaction; more are written ahead, in
/// batches (see [`META_CONTENTS_PENDING`]). An insert in a sled transaction costs about 14 µs,
/// in a batch about a tenth of that: a 100,000-endpoint plan took 1.4 s in one transaction.
pub(super) const CONTENTS_IN_TXN_MAX: usize = 1_024;

/// The key of what plan `generation` says of `name`. Names never hold a 0 byte, so the
/// separator keeps one name's keys apart from a longer name's that starts with it.
pub(super) fn content_key(name: &EndpointName, generation: Generation) -> Vec<u8> {
    let mut key = Vec::with_capacity(name.as_str().len() + 9);
    key.extend_from_slice(name.as_str().as_bytes());
    key.push(0);
    key.extend_from_slice(&generation.to_be_bytes());
    key
}

/// The generation of a `contents` key.
pub(super) fn content_generation(key: &[u8]) -> StoreResult<Generation> {
    let tail = key.len().checked_sub(8).and_then(|at| key.get(at..)).and_then(|t| <[u8; 8]>::try_from(t).ok());
    tail.map(Generation::from_be_bytes).ok_or_else(|| corrupt("plan content key", codec::CodecError::Truncated { len: key.len() }))
}

/// A run of one plan's whole content, in name byte order (`contents_chunks`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct ContentChunk {
    pub(super) entries: Vec<(CompactString, PlanEntry)>,
}

impl codec::Record for ContentChunk {
    const KIND: u8 = 11;
    const KIND_NAME: &'static str = "plan content chunk";
    const BODY_BYTES_MAX: usize = codec::BODY_BYTES_MAX;
}

/// The key of the chunk of plan `generation`'s whole content that starts at `first`.
pub(super) fn chunk_key(generation: Generation, first: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + first.len());
    key.extend_from_slice(&generation.to_be_bytes());
    key.extend_from_slice(first);
    key
}

/// What a publish writes: `contents` entries of the names the plan changes, or chunks of every
/// name it serves or retires (`full`).
pub(super) struct ContentWrite {
    pub(super) entries: Vec<(Vec<u8>, Vec<u8>)>,
    pub(super) chunks: Vec<(Vec<u8>, Vec<u8>)>,
    pub(super) full: bool,
}

impl ContentWrite {
    pub(super) fn whole(plan: &crate::plan::Plan) -> ContentWrite {
        let served = plan.endpoints.iter().map(|(name, records)| (name.as_str(), PlanEntry::Serve(records.clone())));
        let retired = plan.retired.iter().map(|name| (name.as_str(), PlanEntry::Retire));
        let mut all: Vec<(&str, PlanEntry)> = served.chain(retired).collect();
        all.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let chunks = all
            .chunks(CONTENT_CHUNK_NAMES)
            .map(|run| {
                let entries: Vec<(CompactString, PlanEntry)> = run.iter().map(|(name, entry)| ((*name).into(), entry.clone())).collect();
                (chunk_key(plan.generation, run[0].0.as_bytes()), codec::encode(&ContentChunk { entries }))
            })
            .collect();
        ContentWrite { entries: Vec::new(), chunks, full: true }
    }

    pub(super) fn changes(changes: &PlanChanges) -> ContentWrite {
        let entries = changes.changes.iter().map(|(name, entry)| (content_key(name, changes.to), codec::encode(entry))).collect();
        ContentWrite { entries, chunks: Vec::new(), full: false }
    }

    /// Values to write: a chunk counts as one.
    pub(super) fn len(&self) -> usize {
        self.entries.len() + self.chunks.len()
    }
}

/// Reads plan `generation`'s content name by name (see `Inner::content_at`), keeping what the
/// next name of a batch is likely to need: the newest whole generation at or below it, and the
/// chunk read last with where the next one starts.
pub(super) struct ContentReader {
    pub(super) generation: Generation,
    pub(super) whole: Option<Generation>,
    /// The plan itself is the newest whole content, and it is in chunks: a whole content has no
    /// `contents` entries, so a name is not looked up there at all.
    pub(super) chunks_only: bool,
    pub(super) chunk: Option<ReadChunk>,
}

/// The chunk read last: its key, the key of the chunk after it in the same whole content
/// (`None`: it is the last), and its entries.
pub(super) type ReadChunk = (sled::IVec, Option<sled::IVec>, Vec<(CompactString, PlanEntry)>);

impl Inner {
    /// Writes the `contents` entries of plan `generation`, not yet published, in batches,
    /// after marking them pending (on disk first). The caller holds the lock, and its
    /// transaction then removes the mark along with making the plan visible.
    pub(super) fn write_contents_ahead(&self, generation: Generation, contents: &ContentWrite) -> StoreResult<()> {
        self.meta.insert(META_CONTENTS_PENDING, &generation.to_be_bytes()).map_err(io)?;
        self.flush()?;
        for chunk in contents.entries.chunks(65_536) {
            let mut batch = self.contents.batch();
            for (key, value) in chunk {
                batch.insert(key.as_slice(), value.as_slice());
            }
            self.contents.apply_batch(batch).map_err(io)?;
        }
        for run in contents.chunks.chunks(256) {
            let mut batch = self.contents_chunks.batch();
            for (key, value) in run {
                batch.insert(key.as_slice(), value.as_slice());
            }
            self.contents_chunks.apply_batch(batch).map_err(io)?;
        }
        Ok(())
    }

    /// Removes the `contents` entries of a publish that wrote them ahead and did not commit,
    /// if any (see [`META_CONTENTS_PENDING`]): every entry of its generation, which no plan
    /// holds since the latest is below it. A scan of `contents`, only after such a failure.
    pub(super) fn remove_pending_contents(&self) -> StoreResult<()> {
        let Some(pending) = self.meta.get(META_CONTENTS_PENDING).map_err(io)? else { return Ok(()) };
        let bytes: [u8; 8] = pending
            .as_ref()
            .try_into()
            .map_err(|_| corrupt("pending contents mark", codec::CodecError::Truncated { len: pending.len() }))?;
        let generation = Generation::from_be_bytes(bytes);
        if generation > self.latest()? {
            let mut removed = 0usize;
            let mut batch = self.contents.batch();
            for entry in self.contents.iter() {
                let (key, _) = entry.map_err(io)?;
                if content_generation(&key)? == generation {
                    batch.remove(key);
                    removed += 1;
                    if removed.is_multiple_of(65_536) {
                        self.contents.apply_batch(std::mem::replace(&mut batch, self.contents.batch())).map_err(io)?;
                    }
                }
            }
            self.contents.apply_batch(batch).map_err(io)?;
            let mut chunks = self.contents_chunks.batch();
            for key in self.contents_chunks.scan_prefix(generation.to_be_bytes()).keys() {
                chunks.remove(key.map_err(io)?);
                removed += 1;
            }
            self.contents_chunks.apply_batch(chunks).map_err(io)?;
            tracing::warn!(%generation, removed, "removed the contents of a publish that did not commit");
        }
        self.meta.remove(META_CONTENTS_PENDING).map_err(io)?;
        self.flush()
    }

    /// A reader of plan `generation`'s content, for `content_at`.
    pub(super) fn content_reader(&self, generation: Generation) -> StoreResult<ContentReader> {
        let whole = self.contents_full.range(..=generation.to_be_bytes()).next_back().transpose().map_err(io)?;
        let whole = whole.map(|(key, _)| generation_key(&key)).transpose()?;
        let chunks_only = whole == Some(generation);
        Ok(ContentReader { generation, whole, chunks_only, chunk: None })
    }

    /// What plan `reader.generation` says of `name`, from `contents` and `contents_chunks`
    /// (see the module docs).
    pub(super) fn content_at(&self, name: &EndpointName, reader: &mut ContentReader) -> StoreResult<PlanEntry> {
        // A name has few entries (cleanup keeps about one), and sled reads forward faster than
        // backward: the newest is the last one read.
        let mut newest = None;
        if !reader.chunks_only {
            for entry in self.contents.range(content_key(name, Generation::NONE)..=content_key(name, reader.generation)) {
                newest = Some(entry.map_err(io)?);
            }
        }
        if let Some((key, value)) = newest {
            let written = content_generation(&key)?;
            // A plan written whole after this entry supersedes it.
            if reader.whole.is_none_or(|whole| written >= whole) {
                return codec::decode::<PlanEntry>(&value).map_err(|e| corrupt(format!("plan {written}'s content for {name}"), e));
            }
        }
        let Some(whole) = reader.whole else { return Ok(PlanEntry::Absent) };
        let probe = chunk_key(whole, name.as_str().as_bytes());
        let cached = reader.chunk.as_ref().is_some_and(|(key, next, _)| {
            key.as_ref() <= probe.as_slice() && next.as_ref().is_none_or(|next| probe.as_slice() < next.as_ref())
        });
        if !cached {
            let found = self.contents_chunks.range(chunk_key(whole, &[])..=probe.clone()).next_back();
            let Some(found) = found else { return Ok(PlanEntry::Absent) };
            let (key, value) = found.map_err(io)?;
            let next = self.contents_chunks.range::<&[u8], _>((std::ops::Bound::Excluded(key.as_ref()), std::ops::Bound::Unbounded)).next();
            let next = next.transpose().map_err(io)?.map(|(next, _)| next).filter(|next| next.starts_with(&whole.to_be_bytes()));
            let chunk = codec::decode::<ContentChunk>(&value).map_err(|e| corrupt(format!("plan {whole}'s content chunk"), e))?;
            reader.chunk = Some((key, next, chunk.entries));
        }
        let Some((_, _, entries)) = &reader.chunk else { return Ok(PlanEntry::Absent) };
        Ok(match entries.binary_search_by(|(n, _)| n.as_bytes().cmp(name.as_str().as_bytes())) {
            Ok(at) => entries[at].1.clone(),
            Err(_) => PlanEntry::Absent,
        })
    }

    /// `None` when `state` is what plan `generation` says of `name`, else what the plan says.
    pub(super) fn content_mismatch(
        &self,
        name: &EndpointName,
        state: &ActiveState,
        reader: &mut ContentReader,
    ) -> StoreResult<Option<PlanSays>> {
        Ok(plan_says(&self.content_at(name, reader)?, state))
    }

    /// Removes the `contents` entries no plan from `horizon` on can resolve to: for each name,
    /// every entry older than its newest one at or below `horizon`, and that one too when it
    /// says `Absent`. Only names written by the plans `after..=horizon` can have such
    /// entries, found through those plans' change records; a plan among them written whole
    /// makes it a scan of every entry. Runs before those plans' records are removed.
    pub(super) fn prune_contents(&self, after: Generation, horizon: Generation) -> StoreResult<()> {
        let mut names = std::collections::BTreeSet::new();
        let mut whole = false;
        let mut g = after;
        while let Some(next) = g.next().filter(|n| *n <= horizon) {
            g = next;
            if self.contents_full.contains_key(g.to_be_bytes()).map_err(io)? {
                whole = true;
                break;
            }
            match self.plan_changes.get(g.to_be_bytes()).map_err(io)? {
                Some(bytes) => names.extend(decode_changes(&bytes).map_err(|e| corrupt("plan changes", e))?.changes.into_keys()),
                None => {
                    whole = true;
                    break;
                }
            }
        }
        // The newest whole content at or below the horizon: every entry older than it is
        // superseded. A name's newest entry saying `Absent` can go too, unless that content is
        // in chunks, which would then answer for the name.
        let base = self.contents_full.range(..=horizon.to_be_bytes()).next_back().transpose().map_err(io)?;
        let base = base.map(|(key, _)| generation_key(&key)).transpose()?;
        let base_chunked = match base {
            Some(base) => self.contents_chunks.scan_prefix(base.to_be_bytes()).next().is_some(),
            None => false,
        };
        let mut batch = self.contents.batch();
        let mut prune_name = |entries: &mut dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>| -> StoreResult<()> {
            // Entries of one name, oldest first, all at or below `horizon`.
            let mut previous: Option<(sled::IVec, sled::IVec)> = None;
            for entry in entries {
                let entry = entry.map_err(io)?;
                if base.is_some_and(|base| content_generation(&entry.0).is_ok_and(|g| g < base)) {
                    batch.remove(entry.0);
                    continue;
                }
                if let Some((key, _)) = previous.replace(entry) {
                    batch.remove(key);
                }
            }
            if let Some((key, value)) = previous
                && !base_chunked
                && codec::decode::<PlanEntry>(&value).is_ok_and(|e| e == PlanEntry::Absent)
            {
                batch.remove(key);
            }
            Ok(())
        };
        if whole {
            let mut current: Vec<u8> = Vec::new();
            let mut group: Vec<sled::Result<(sled::IVec, sled::IVec)>> = Vec::new();
            for entry in self.contents.iter() {
                let (key, value) = entry.map_err(io)?;
                let split = key.len().saturating_sub(9);
                let (name, generation) = (&key[..split], content_generation(&key)?);
                if name != current.as_slice() {
                    prune_name(&mut group.drain(..))?;
                    current = name.to_vec();
                }
                if generation <= horizon {
                    group.push(Ok((key, value)));
                }
            }
            prune_name(&mut group.drain(..))?;
            if let Some(base) = base {
                let mut markers = self.contents_full.batch();
                for key in self.contents_full.range(..base.to_be_bytes()).keys() {
                    markers.remove(key.map_err(io)?);
                }
                self.contents_full.apply_batch(markers).map_err(io)?;
                let mut chunks = self.contents_chunks.batch();
                for key in self.contents_chunks.range(..base.to_be_bytes()).keys() {
                    chunks.remove(key.map_err(io)?);
                }
                self.contents_chunks.apply_batch(chunks).map_err(io)?;
            }
        } else {
            for name in &names {
                prune_name(&mut self.contents.range(content_key(name, Generation::NONE)..=content_key(name, horizon)))?;
            }
        }
        self.contents.apply_batch(batch).map_err(io)
    }
}
