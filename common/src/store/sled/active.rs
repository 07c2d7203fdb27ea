//! The active set: runs of active records, fence counts, the change log, and their reads.

use super::*;

/// The key of the first run of `active_runs`: below every name (names hold no 0 byte).
pub(super) const FIRST_RUN: &[u8] = &[0];

/// Most records in one `active_runs` value; a longer run is split when written.
pub(super) const ACTIVE_RUN_MAX: usize = 128;

/// Change-log entries kept for `active_since` followers.
pub const CHANGE_LOG_KEPT: u64 = 1 << 20;

/// How often (in applied changes) the change log is trimmed.
pub(super) const CHANGE_LOG_TRIM_EVERY: u64 = 1 << 16;

/// The active runs as stored, read under the lock and decoded after it.
pub(super) struct RunBytes {
    pub(super) applied_changes: u64,
    pub(super) content_changes: u64,
    pub(super) runs: Vec<sled::IVec>,
}

impl RunBytes {
    /// Runs and the records in them are in name order, so the map is built in one pass
    /// (`BTreeMap::from_iter` over sorted entries), not an insert per name.
    pub(super) fn decode(self) -> StoreResult<ActiveSnapshot> {
        let mut entries = Vec::new();
        for run in self.runs {
            for (name, record) in codec::decode::<ActiveRun>(&run).map_err(|e| corrupt("active run", e))?.records {
                entries.push((parse_name(name.as_bytes(), "active endpoint name")?, record));
            }
        }
        Ok(ActiveSnapshot {
            applied_changes: self.applied_changes,
            content_changes: self.content_changes,
            endpoints: entries.into_iter().collect(),
        })
    }
}

/// `active_since` as read under the lock: the delta, or the whole state still to decode.
pub(super) enum Since {
    Delta(ActiveDelta),
    Whole(RunBytes),
}

/// A run of active records in name byte order (`active_runs`).
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct ActiveRun {
    pub(super) records: Vec<(CompactString, ActiveRecord)>,
}

impl codec::Record for ActiveRun {
    const KIND: u8 = 12;
    const KIND_NAME: &'static str = "active run";
    const BODY_BYTES_MAX: usize = codec::BODY_BYTES_MAX;
}

/// A run read during one operation: where the next run starts (`None`: it is the last), its
/// records, and whether the operation changed them.
#[derive(Default)]
pub(super) struct LoadedRun {
    pub(super) next: Option<Vec<u8>>,
    pub(super) records: Vec<(CompactString, ActiveRecord)>,
    pub(super) dirty: bool,
}

impl LoadedRun {
    pub(super) fn find(&self, name: &EndpointName) -> Result<usize, usize> {
        self.records.binary_search_by(|(n, _)| n.as_bytes().cmp(name.as_str().as_bytes()))
    }
}

/// The runs of `active_runs` one operation has read, by key; changed in memory and written
/// together at its end (`Runs::writes`).
#[derive(Default)]
pub(super) struct Runs {
    pub(super) loaded: std::collections::BTreeMap<Vec<u8>, LoadedRun>,
}

impl Runs {
    /// The changed runs as keys and values to write, each split into runs of at most
    /// `ACTIVE_RUN_MAX` records of about equal length; a split-off run is keyed by its first
    /// name.
    pub(super) fn writes(self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        for (key, run) in self.loaded {
            if !run.dirty {
                continue;
            }
            let mut rest = run.records;
            let pieces = rest.len().div_ceil(ACTIVE_RUN_MAX).max(1);
            let size = rest.len().div_ceil(pieces).max(1);
            let mut piece_key = key;
            loop {
                let tail = rest.split_off(size.min(rest.len()));
                out.push((piece_key, codec::encode(&ActiveRun { records: rest })));
                let Some((first, _)) = tail.first() else { break };
                piece_key = first.as_bytes().to_vec();
                rest = tail;
            }
        }
        out
    }
}

/// A `fence_counts` value, decoded: how many endpoints serve with the fence, and one of them
/// (empty when not known).
#[derive(Debug, Default, PartialEq)]
pub(super) struct FenceCount {
    pub(super) count: u64,
    pub(super) witness: Vec<u8>,
}

impl FenceCount {
    pub(super) fn decode(value: &[u8]) -> StoreResult<FenceCount> {
        let (count, witness) =
            value.split_first_chunk::<8>().ok_or_else(|| corrupt("fence count", codec::CodecError::Truncated { len: value.len() }))?;
        Ok(FenceCount { count: u64::from_be_bytes(*count), witness: witness.to_vec() })
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut value = Vec::with_capacity(8 + self.witness.len());
        value.extend_from_slice(&self.count.to_be_bytes());
        value.extend_from_slice(&self.witness);
        value
    }

    pub(super) fn join(&mut self, name: &EndpointName) {
        self.count += 1;
        if self.witness.is_empty() {
            self.witness = name.as_str().as_bytes().to_vec();
        }
    }

    pub(super) fn leave(&mut self, name: &EndpointName, generation: Generation) -> StoreResult<()> {
        self.count = self.count.checked_sub(1).ok_or_else(|| {
            corrupt(
                format!("fence count of plan {generation}"),
                codec::CodecError::Body { kind: "fence count".into(), detail: format!("{name} serves with it, but its count is 0") },
            )
        })?;
        if self.witness == name.as_str().as_bytes() {
            self.witness.clear();
        }
        Ok(())
    }
}

/// The names of one `changes` entry (a batch), oldest first.
pub(super) fn log_names(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|byte| *byte == 0)
}

/// The count of the first switch of the `changes` entry `key` → `value`.
pub(super) fn log_first(key: &[u8], value: &[u8]) -> StoreResult<u64> {
    let last = change_key(key)?;
    let len = log_names(value).count() as u64;
    last.checked_add(1).and_then(|end| end.checked_sub(len)).filter(|_| !value.is_empty()).ok_or_else(|| {
        corrupt(
            "change log entry",
            codec::CodecError::Body { kind: "change log".into(), detail: format!("{len} names end at change {last}") },
        )
    })
}

impl Inner {
    /// The run that holds (or would hold) `name`: from `runs` if read already, else read from
    /// the store. An empty store gives an empty first run.
    pub(super) fn run_of<'a>(&self, runs: &'a mut Runs, name: &[u8]) -> StoreResult<&'a mut LoadedRun> {
        let cached = runs
            .loaded
            .range::<[u8], _>((std::ops::Bound::Unbounded, std::ops::Bound::Included(name)))
            .next_back()
            .filter(|(_, run)| run.next.as_deref().is_none_or(|next| name < next))
            .map(|(key, _)| key.clone());
        let key = match cached {
            Some(key) => key,
            None => {
                let found = self.active_runs.range::<&[u8], _>(..=name).next_back().transpose().map_err(io)?;
                let (key, records) = match found {
                    Some((key, value)) => (key.to_vec(), codec::decode::<ActiveRun>(&value).map_err(|e| corrupt("active run", e))?.records),
                    None => (FIRST_RUN.to_vec(), Vec::new()),
                };
                let next = self
                    .active_runs
                    .range::<&[u8], _>((std::ops::Bound::Excluded(key.as_slice()), std::ops::Bound::Unbounded))
                    .next()
                    .transpose()
                    .map_err(io)?
                    .map(|(next, _)| next.to_vec());
                runs.loaded.insert(key.clone(), LoadedRun { next, records, dirty: false });
                key
            }
        };
        Ok(runs.loaded.entry(key).or_default())
    }

    /// `name`'s active record, through `runs`.
    pub(super) fn active_in(&self, runs: &mut Runs, name: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        let run = self.run_of(runs, name.as_str().as_bytes())?;
        Ok(run.find(name).ok().map(|at| run.records[at].1.clone()))
    }

    pub(super) fn read_active(&self, name: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        self.active_in(&mut Runs::default(), name)
    }

    /// The fenced write shared by `apply` and `retire`.
    pub(super) fn switch(&self, name: &EndpointName, generation: Generation, state: ActiveState) -> StoreResult<ApplyOutcome> {
        let mut results = self.switch_many(generation, vec![(name.clone(), state)])?;
        // Invariant: one result per item.
        assert_eq!(results.len(), 1, "switch_many returned {} results for one item", results.len());
        results.remove(0)
    }

    /// The fenced write of `apply_many`: every item compared against its own fence under the
    /// writer lock, and every switch committed in one transaction and flushed once.
    pub(super) fn switch_many(
        &self,
        generation: Generation,
        items: Vec<(EndpointName, ActiveState)>,
    ) -> StoreResult<Vec<StoreResult<ApplyOutcome>>> {
        // Pair check: plans were validated at build and publish; check again at apply.
        let valid: Vec<StoreResult<()>> = items
            .iter()
            .map(|(name, state)| match state {
                ActiveState::Serving(records) => validate_endpoint(name, records).map_err(StoreError::from),
                ActiveState::Retired => Ok(()),
            })
            .collect();
        let _guard = self.guard()?;
        check_generation(generation, self.latest()?, self.horizon()?)?;
        let (mut applied, mut content) = self.counts()?;
        let mut content_moved = false;
        let mut results = Vec::with_capacity(items.len());
        // The names switched, in order, for the change log.
        let mut switched: Vec<EndpointName> = Vec::new();
        let mut runs = Runs::default();
        let mut reader = self.content_reader(generation)?;
        // The fence counts this batch changes, read once each.
        let mut counts: std::collections::BTreeMap<Generation, FenceCount> = Default::default();
        for ((name, state), valid) in items.into_iter().zip(valid) {
            if let Err(err) = valid {
                results.push(Err(err));
                continue;
            }
            // The content check and the fence are decided here, under the writer lock, in the
            // same critical section that writes: no earlier reading of either is trusted.
            let run = self.run_of(&mut runs, name.as_str().as_bytes())?;
            let at = run.find(&name);
            // Already serving exactly this at this generation: the write that put it there
            // passed the content check against the same plan, and plans do not change, so the
            // check would pass again and nothing is written. Enactors of one zone each send
            // every endpoint of a full plan, so most items end here, and the content read (the
            // larger part of a write's time under the lock) is saved for the writes.
            if let Ok(at) = at
                && run.records[at].1.generation == generation
                && run.records[at].1.state == state
            {
                results.push(Ok(ApplyOutcome::Unchanged));
                continue;
            }
            if let Some(plan) = self.content_mismatch(&name, &state, &mut reader)? {
                results.push(Err(StoreError::ContentMismatch { endpoint: name, generation, plan }));
                continue;
            }
            let current = at.ok().map(|at| &run.records[at].1);
            let previous = match fence_step(&name, current.map(|a| a.generation), generation) {
                Ok(ApplyOutcome::Switched { previous }) => previous,
                decided => {
                    results.push(decided);
                    continue;
                }
            };
            let was_serving = current.is_some_and(|a| matches!(a.state, ActiveState::Serving(_)));
            let serves = matches!(state, ActiveState::Serving(_));
            content_moved |= content_changed(current.map(|a| &a.state), &state);
            let record = ActiveRecord { generation, state };
            match at {
                Ok(at) => run.records[at].1 = record,
                Err(at) => run.records.insert(at, (name.as_str().into(), record)),
            }
            run.dirty = true;
            applied = applied.wrapping_add(1);
            if was_serving {
                self.fence_count(&mut counts, previous)?.leave(&name, previous)?;
            }
            if serves {
                self.fence_count(&mut counts, generation)?.join(&name);
            }
            switched.push(name);
            results.push(Ok(ApplyOutcome::Switched { previous }));
        }
        if switched.is_empty() {
            return Ok(results);
        }
        let mut log = Vec::with_capacity(switched.iter().map(|name| name.as_str().len() + 1).sum());
        for name in &switched {
            if !log.is_empty() {
                log.push(0);
            }
            log.extend_from_slice(name.as_str().as_bytes());
        }
        if content_moved {
            content = content.wrapping_add(1);
        }
        let run_writes = runs.writes();
        let counts: Vec<(Generation, Option<Vec<u8>>)> =
            counts.into_iter().map(|(g, count)| (g, (count.count > 0).then(|| count.encode()))).collect();
        (self.active_runs.tree(), self.fence_counts.tree(), self.meta.tree(), self.changes.tree())
            .transaction(|(active_runs, fence_counts, meta, changes)| {
                let (active_runs, fence_counts) = (self.active_runs.view(active_runs), self.fence_counts.view(fence_counts));
                let (meta, changes) = (self.meta.view(meta), self.changes.view(changes));
                for (key, run) in &run_writes {
                    active_runs.insert(key.as_slice(), run.as_slice())?;
                }
                for (g, value) in &counts {
                    match value {
                        Some(value) => fence_counts.insert(g.to_be_bytes(), value.as_slice())?,
                        None => fence_counts.remove(g.to_be_bytes())?,
                    };
                }
                changes.insert(applied.to_be_bytes(), log.as_slice())?;
                meta.insert(META_APPLIED, &applied.to_be_bytes())?;
                meta.insert(META_CONTENT, &content.to_be_bytes())?;
                Ok::<_, ConflictableTransactionError<StoreError>>(())
            })
            .map_err(tx_error)?;
        self.flush()?;
        self.publish_version()?;
        let before = applied - switched.len() as u64;
        if before / CHANGE_LOG_TRIM_EVERY != applied / CHANGE_LOG_TRIM_EVERY {
            self.trim_change_log(applied)?;
        }
        Ok(results)
    }

    /// The fence count of `generation` in `counts`, read from the store on first use.
    pub(super) fn fence_count<'a>(
        &self,
        counts: &'a mut std::collections::BTreeMap<Generation, FenceCount>,
        generation: Generation,
    ) -> StoreResult<&'a mut FenceCount> {
        Ok(match counts.entry(generation) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => {
                let stored = self.fence_counts.get(generation.to_be_bytes()).map_err(io)?;
                entry.insert(stored.map(|value| FenceCount::decode(&value)).transpose()?.unwrap_or_default())
            }
        })
    }

    /// Drops change-log entries older than the last `CHANGE_LOG_KEPT`. Followers further
    /// behind get the whole state from `active_since`, so this never loses a change.
    pub(super) fn trim_change_log(&self, applied: u64) -> StoreResult<()> {
        let keep_from = applied.saturating_sub(CHANGE_LOG_KEPT) + 1;
        let mut batch = self.changes.batch();
        for key in self.changes.range(..keep_from.to_be_bytes().to_vec()).keys() {
            batch.remove(key.map_err(io)?);
        }
        self.changes.apply_batch(batch).map_err(io)
    }

    pub(super) fn active_all(&self) -> StoreResult<ActiveSnapshot> {
        let runs = {
            let _guard = self.guard()?;
            self.active_runs_locked()?
        };
        runs.decode()
    }

    #[cfg(test)]
    pub(super) fn active_all_locked(&self) -> StoreResult<ActiveSnapshot> {
        self.active_runs_locked()?.decode()
    }

    /// Every active run's bytes with the applied-change count they go with, read under the
    /// writer lock: values sled shares, so this is cheap, and decoding them (most of a second
    /// at 1,000,000 endpoints) happens after the lock is released.
    pub(super) fn active_runs_locked(&self) -> StoreResult<RunBytes> {
        let (applied_changes, content_changes) = self.counts()?;
        let runs = self.active_runs.iter().values().collect::<Result<Vec<_>, _>>().map_err(io)?;
        Ok(RunBytes { applied_changes, content_changes, runs })
    }

    pub(super) fn active_page(&self, after: Option<&EndpointName>, limit: usize) -> StoreResult<ActivePage> {
        let _guard = self.guard()?;
        let mut page = ActivePage { applied_changes: self.meta_u64(META_APPLIED, 0)?, endpoints: Vec::with_capacity(limit), more: false };
        let after = after.map(|a| a.as_str().as_bytes());
        // The run that holds `after` (or would), then the runs after it.
        let start = match after {
            Some(a) => self.active_runs.range::<&[u8], _>(..=a).next_back().transpose().map_err(io)?.map(|(key, _)| key),
            None => None,
        };
        let start = start.map_or_else(|| FIRST_RUN.to_vec(), |key| key.to_vec());
        'runs: for run in self.active_runs.range(start..).values() {
            let run = codec::decode::<ActiveRun>(&run.map_err(io)?).map_err(|e| corrupt("active run", e))?;
            for (name, record) in run.records {
                if after.is_some_and(|a| name.as_bytes() <= a) {
                    continue;
                }
                if page.endpoints.len() == limit {
                    page.more = true;
                    break 'runs;
                }
                page.endpoints.push((parse_name(name.as_bytes(), "active endpoint name")?, record));
            }
        }
        Ok(page)
    }

    pub(super) fn active_since(&self, since: u64) -> StoreResult<ActiveDelta> {
        match self.active_since_locked(since)? {
            Since::Delta(delta) => Ok(delta),
            // The whole state, decoded after the lock is released.
            Since::Whole(runs) => runs.decode().map(ActiveDelta::from),
        }
    }

    pub(super) fn active_since_locked(&self, since: u64) -> StoreResult<Since> {
        let _guard = self.guard()?;
        let (applied, content) = self.counts()?;
        if since == applied {
            return Ok(Since::Delta(ActiveDelta {
                applied_changes: applied,
                content_changes: content,
                full: false,
                endpoints: Default::default(),
            }));
        }
        // The log must hold every change after `since`: its first entry is `since + 1` or
        // older. A follower ahead of the store (a store that was replaced) gets everything.
        let first = self.changes.first().map_err(io)?.map(|(key, names)| log_first(&key, &names)).transpose()?;
        if since > applied || first.is_none_or(|first| first > since + 1) {
            return self.active_runs_locked().map(Since::Whole);
        }
        let mut names = std::collections::BTreeSet::new();
        for entry in self.changes.range((since + 1).to_be_bytes()..) {
            let (key, batch) = entry.map_err(io)?;
            let first = log_first(&key, &batch)?;
            // The batch holding `since + 1` may start before it.
            let skip = usize::try_from((since + 1).saturating_sub(first)).unwrap_or(usize::MAX);
            names.extend(log_names(&batch).skip(skip).map(<[u8]>::to_vec));
            if names.len() > DELTA_ENDPOINTS_MAX {
                return self.active_runs_locked().map(Since::Whole);
            }
        }
        let mut delta = ActiveDelta { applied_changes: applied, content_changes: content, full: false, endpoints: Default::default() };
        let mut runs = Runs::default();
        for key in names {
            let name = parse_name(&key, "change log")?;
            let record = self.active_in(&mut runs, &name)?.ok_or_else(|| {
                corrupt(format!("change log names {name}, which has no active record"), codec::CodecError::Truncated { len: 0 })
            })?;
            delta.endpoints.insert(name, record);
        }
        Ok(Since::Delta(delta))
    }
}
