//! One zone's part of a tree: the first zone's trees are its own (no key prefix); the zones
//! added beside it share one set of trees, `zones:<tree>`, each key prefixed with its zone's
//! [`zone_prefix`]. sled keeps a table of its trees that it rewrites whole when a tree is made
//! or dropped, so trees per zone made every addition and every start cost more with each zone
//! (5,000 zones: 67 s to start and 7.9 GB of disk); shared trees cost the same at any count.
//!
//! [`Keyed`] has the calls of `sled::Tree` the store makes, with the prefix added to every key
//! in and taken off every key out, so the store's code reads the same for every zone. Its
//! ranges stay inside the zone's prefix, and its transaction view ([`Keyed::view`]) and batches
//! ([`Keyed::batch`]) add it too.

use sled::IVec;
use sled::transaction::{TransactionalTree, UnabortableTransactionError};
use std::borrow::Cow;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

/// The key prefix of an added zone in the shared trees: the origin's length (2 bytes,
/// big-endian) and its text, so no zone's prefix is the start of another's.
pub(super) fn zone_prefix(origin: &str) -> Arc<[u8]> {
    let len = u16::try_from(origin.len()).unwrap_or(u16::MAX);
    let mut prefix = Vec::with_capacity(2 + origin.len());
    prefix.extend_from_slice(&len.to_be_bytes());
    prefix.extend_from_slice(origin.as_bytes());
    prefix.into()
}

/// The smallest key above every key that starts with `prefix`; `None` when there is none (the
/// prefix is empty or all 0xff).
fn past(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A zone's part of a sled tree (see the module docs).
#[derive(Clone)]
pub(super) struct Keyed {
    tree: sled::Tree,
    prefix: Arc<[u8]>,
}

impl Keyed {
    /// The whole of `tree` (the first zone's trees).
    pub(super) fn whole(tree: sled::Tree) -> Keyed {
        Keyed { tree, prefix: Arc::from(Vec::new()) }
    }

    /// The keys of `tree` that start with `prefix` (an added zone's).
    pub(super) fn part(tree: sled::Tree, prefix: Arc<[u8]>) -> Keyed {
        Keyed { tree, prefix }
    }

    fn key<'a>(&self, key: &'a [u8]) -> Cow<'a, [u8]> {
        if self.prefix.is_empty() { Cow::Borrowed(key) } else { Cow::Owned([&self.prefix[..], key].concat()) }
    }

    fn iter_of(&self, iter: sled::Iter) -> Iter {
        Iter { inner: iter, strip: self.prefix.len() }
    }

    pub(super) fn get(&self, key: impl AsRef<[u8]>) -> sled::Result<Option<IVec>> {
        self.tree.get(self.key(key.as_ref()))
    }

    pub(super) fn contains_key(&self, key: impl AsRef<[u8]>) -> sled::Result<bool> {
        self.tree.contains_key(self.key(key.as_ref()))
    }

    pub(super) fn insert(&self, key: impl AsRef<[u8]>, value: impl Into<IVec>) -> sled::Result<Option<IVec>> {
        self.tree.insert(self.key(key.as_ref()), value)
    }

    pub(super) fn remove(&self, key: impl AsRef<[u8]>) -> sled::Result<Option<IVec>> {
        self.tree.remove(self.key(key.as_ref()))
    }

    /// The zone's keys in `range` (keys without the prefix).
    pub(super) fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Iter {
        let bound = |bound: Bound<&K>| match bound {
            Bound::Included(key) => Bound::Included(self.key(key.as_ref()).into_owned()),
            Bound::Excluded(key) => Bound::Excluded(self.key(key.as_ref()).into_owned()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let start = match bound(range.start_bound()) {
            Bound::Unbounded if !self.prefix.is_empty() => Bound::Included(self.prefix.to_vec()),
            start => start,
        };
        let end = match bound(range.end_bound()) {
            Bound::Unbounded => past(&self.prefix).map_or(Bound::Unbounded, Bound::Excluded),
            end => end,
        };
        self.iter_of(self.tree.range::<Vec<u8>, _>((start, end)))
    }

    /// Every key of the zone.
    pub(super) fn iter(&self) -> Iter {
        self.range::<&[u8], _>(..)
    }

    /// The zone's keys that start with `prefix`.
    pub(super) fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Iter {
        self.iter_of(self.tree.scan_prefix(self.key(prefix.as_ref())))
    }

    pub(super) fn first(&self) -> sled::Result<Option<(IVec, IVec)>> {
        self.iter().next().transpose()
    }

    /// How many keys the zone has: sled's count of the tree, or a scan of the zone's part
    /// (both walk the keys).
    pub(super) fn len(&self) -> usize {
        if self.prefix.is_empty() { self.tree.len() } else { self.iter().count() }
    }

    /// Whether the zone has no key.
    pub(super) fn is_empty(&self) -> sled::Result<bool> {
        Ok(self.first()?.is_none())
    }

    /// Sets `key` to `new` if it holds `old` (sled's `compare_and_swap`); the outer result is
    /// sled's error, the inner says whether the swap was made.
    pub(super) fn compare_and_swap(
        &self,
        key: impl AsRef<[u8]>,
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> sled::Result<Result<(), sled::CompareAndSwapError>> {
        self.tree.compare_and_swap(self.key(key.as_ref()), old, new)
    }

    /// A batch of writes to the zone's part, applied by [`Keyed::apply_batch`].
    pub(super) fn batch(&self) -> Batch {
        Batch { batch: sled::Batch::default(), prefix: self.prefix.clone() }
    }

    pub(super) fn apply_batch(&self, batch: Batch) -> sled::Result<()> {
        self.tree.apply_batch(batch.batch)
    }

    /// The tree, for a transaction over several (its view is [`Keyed::view`]'s).
    pub(super) fn tree(&self) -> &sled::Tree {
        &self.tree
    }

    /// The zone's part of `view`, a transaction's view of this tree.
    pub(super) fn view<'a>(&'a self, view: &'a TransactionalTree) -> View<'a> {
        View { view, keyed: self }
    }

    /// Removes every key of the zone, in batches; returns how many.
    pub(super) fn clear(&self) -> sled::Result<usize> {
        let mut removed = 0;
        loop {
            let mut batch = sled::Batch::default();
            let mut n = 0;
            for key in self.tree.scan_prefix(&self.prefix[..]).keys().take(65_536) {
                batch.remove(key?);
                n += 1;
            }
            if n == 0 {
                return Ok(removed);
            }
            self.tree.apply_batch(batch)?;
            removed += n;
        }
    }
}

/// The keys and values of a zone's part of a tree, the prefix taken off each key.
pub(super) struct Iter {
    inner: sled::Iter,
    strip: usize,
}

impl Iter {
    fn strip(&self, item: sled::Result<(IVec, IVec)>) -> sled::Result<(IVec, IVec)> {
        item.map(|(key, value)| (key.subslice(self.strip, key.len().saturating_sub(self.strip)), value))
    }

    pub(super) fn keys(self) -> impl DoubleEndedIterator<Item = sled::Result<IVec>> {
        self.map(|item| item.map(|(key, _)| key))
    }

    pub(super) fn values(self) -> impl DoubleEndedIterator<Item = sled::Result<IVec>> {
        self.map(|item| item.map(|(_, value)| value))
    }
}

impl Iterator for Iter {
    type Item = sled::Result<(IVec, IVec)>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.inner.next()?;
        Some(self.strip(item))
    }
}

impl DoubleEndedIterator for Iter {
    fn next_back(&mut self) -> Option<Self::Item> {
        let item = self.inner.next_back()?;
        Some(self.strip(item))
    }
}

/// Writes to a zone's part of a tree, applied at once.
pub(super) struct Batch {
    batch: sled::Batch,
    prefix: Arc<[u8]>,
}

impl Batch {
    fn key(&self, key: &[u8]) -> Vec<u8> {
        [&self.prefix[..], key].concat()
    }

    pub(super) fn insert(&mut self, key: impl AsRef<[u8]>, value: impl Into<IVec>) {
        let key = self.key(key.as_ref());
        self.batch.insert(key, value);
    }

    pub(super) fn remove(&mut self, key: impl AsRef<[u8]>) {
        let key = self.key(key.as_ref());
        self.batch.remove(key);
    }
}

/// A zone's part of a tree in a transaction.
pub(super) struct View<'a> {
    view: &'a TransactionalTree,
    keyed: &'a Keyed,
}

impl View<'_> {
    pub(super) fn insert(&self, key: impl AsRef<[u8]>, value: impl Into<IVec>) -> Result<Option<IVec>, UnabortableTransactionError> {
        self.view.insert(self.keyed.key(key.as_ref()).as_ref(), value)
    }

    pub(super) fn remove(&self, key: impl AsRef<[u8]>) -> Result<Option<IVec>, UnabortableTransactionError> {
        self.view.remove(self.keyed.key(key.as_ref()).as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trees() -> (sled::Db, Keyed, Keyed, Keyed) {
        let db = sled::Config::new().temporary(true).open().expect("db");
        let tree = db.open_tree("t").expect("tree");
        let (a, b) = (Keyed::part(tree.clone(), zone_prefix("a.")), Keyed::part(tree.clone(), zone_prefix("ab.")));
        (db, Keyed::whole(tree), a, b)
    }

    /// Two zones in one tree see only their own keys, through every call; the whole tree sees
    /// both, prefixed.
    #[test]
    fn zones_sharing_a_tree_see_only_their_keys() {
        let (_db, whole, a, b) = trees();
        for (zone, keys) in [(&a, [1u8, 2, 3]), (&b, [0u8, 2, 255])] {
            for k in keys {
                zone.insert([k], vec![k]).expect("insert");
            }
        }
        let keys = |iter: Iter| iter.keys().map(|k| k.expect("key").to_vec()).collect::<Vec<_>>();
        assert_eq!(keys(a.iter()), [[1], [2], [3]]);
        assert_eq!(keys(b.iter()), [[0], [2], [255]]);
        assert_eq!(keys(a.range(..[3u8])), [[1], [2]]);
        assert_eq!(keys(b.range([1u8]..)), [[2], [255]]);
        assert_eq!(b.range(..=[2u8]).next_back().expect("last").expect("read").0.to_vec(), [2]);
        assert_eq!(a.first().expect("first").expect("a key").0.to_vec(), [1]);
        assert_eq!((a.len(), b.len(), whole.len()), (3, 3, 6));
        assert_eq!(a.get([0u8]).expect("get"), None);
        assert!(b.contains_key([0u8]).expect("contains"));
        assert_eq!(keys(a.scan_prefix([2u8])), [[2]]);

        let mut batch = a.batch();
        batch.remove([1u8]);
        batch.insert([9u8], vec![9]);
        a.apply_batch(batch).expect("batch");
        assert_eq!(keys(a.iter()), [[2], [3], [9]]);
        assert_eq!(keys(b.iter()), [[0], [2], [255]]);

        use sled::Transactional;
        (a.tree(), b.tree())
            .transaction(|(ta, tb)| {
                a.view(ta).insert([7u8], vec![7])?;
                b.view(tb).remove([0u8])?;
                Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
            })
            .expect("transaction");
        assert_eq!(keys(a.iter()), [[2], [3], [7], [9]]);
        assert_eq!(keys(b.iter()), [[2], [255]]);

        assert_eq!(a.clear().expect("clear"), 4);
        assert_eq!((a.len(), b.len()), (0, 2));
    }

    #[test]
    fn past_is_the_first_key_after_a_prefix() {
        assert_eq!(past(&[1, 2]), Some(vec![1, 3]));
        assert_eq!(past(&[1, 255]), Some(vec![2]));
        assert_eq!(past(&[255, 255]), None);
        assert_eq!(past(&[]), None);
    }
}
