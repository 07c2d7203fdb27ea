//! A signed zone's NSEC owners in canonical order (RFC 4034 §6.1), kept in chunks that
//! snapshots share: a name that joins or leaves the chain copies its chunk (at most
//! `2 * CHUNK` names) and the list of chunks, not the whole chain. At 100,000 names a copy of
//! the whole chain was 100,000 allocations, and its drop as many frees, on every change that
//! added or removed a name.

use crate::zone::signed::canonical_cmp;
use std::sync::Arc;

/// Names per chunk when the chain is made; a chunk is split in two past twice this.
const CHUNK: usize = 512;

/// The NSEC owners, lower-case wire form, in canonical order, without duplicates.
#[derive(Clone, Debug, Default)]
pub struct NsecChain {
    /// Never an empty chunk.
    chunks: Vec<Arc<Vec<Box<[u8]>>>>,
    len: usize,
}

impl NsecChain {
    /// The chain of `owners`, already in canonical order without duplicates.
    pub fn from_sorted(owners: Vec<Box<[u8]>>) -> NsecChain {
        let len = owners.len();
        let mut chunks = Vec::with_capacity(len.div_ceil(CHUNK));
        let mut owners = owners.into_iter().peekable();
        while owners.peek().is_some() {
            chunks.push(Arc::new(owners.by_ref().take(CHUNK).collect()));
        }
        NsecChain { chunks, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `Ok(index)` of `key`, or `Err(index)` where it would go.
    pub fn search(&self, key: &[u8]) -> Result<usize, usize> {
        // The first chunk whose last name is not before `key` holds it, if any does.
        let at = self.chunks.partition_point(|chunk| chunk.last().is_some_and(|last| canonical_cmp(last, key).is_lt()));
        let before: usize = self.chunks[..at].iter().map(|c| c.len()).sum();
        match self.chunks.get(at) {
            Some(chunk) => match chunk.binary_search_by(|owner| canonical_cmp(owner, key)) {
                Ok(i) => Ok(before + i),
                Err(i) => Err(before + i),
            },
            None => Err(self.len),
        }
    }

    /// The owner at `index`.
    pub fn get(&self, index: usize) -> Option<&[u8]> {
        let (chunk, offset) = self.locate(index)?;
        self.chunks[chunk].get(offset).map(|owner| &owner[..])
    }

    /// The owner before `index`, the last one before the first (the chain is a ring).
    pub fn before(&self, index: usize) -> Option<&[u8]> {
        self.get(index.checked_sub(1).unwrap_or(self.len.checked_sub(1)?))
    }

    /// The owner after `index`, the first one after the last.
    pub fn after(&self, index: usize) -> Option<&[u8]> {
        self.get((index + 1).checked_rem(self.len)?)
    }

    /// Inserts `key` at `index` (as `search` gave it).
    pub fn insert(&mut self, index: usize, key: Box<[u8]>) {
        if self.chunks.is_empty() {
            self.chunks.push(Arc::new(vec![key]));
            self.len = 1;
            return;
        }
        // At the end of the chunk before, when `index` is past the last chunk's end.
        let (chunk, offset) = self.locate(index).unwrap_or_else(|| {
            let last = self.chunks.len() - 1;
            (last, self.chunks[last].len())
        });
        let names = Arc::make_mut(&mut self.chunks[chunk]);
        names.insert(offset, key);
        if names.len() > 2 * CHUNK {
            let upper = names.split_off(names.len() / 2);
            self.chunks.insert(chunk + 1, Arc::new(upper));
        }
        self.len += 1;
    }

    /// Removes the owner at `index`; nothing past the end.
    pub fn remove(&mut self, index: usize) {
        let Some((chunk, offset)) = self.locate(index) else { return };
        let names = Arc::make_mut(&mut self.chunks[chunk]);
        names.remove(offset);
        if names.is_empty() {
            self.chunks.remove(chunk);
        }
        self.len -= 1;
    }

    /// The chunk and offset of `index`, `None` past the end.
    fn locate(&self, mut index: usize) -> Option<(usize, usize)> {
        for (at, chunk) in self.chunks.iter().enumerate() {
            if index < chunk.len() {
                return Some((at, index));
            }
            index -= chunk.len();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(n: u16) -> Box<[u8]> {
        // One label of the number's digits, then the root: canonical order is the digits' order.
        let digits = format!("{n:05}");
        let mut key = vec![digits.len() as u8];
        key.extend_from_slice(digits.as_bytes());
        key.push(0);
        key.into()
    }

    proptest! {
        /// Any inserts and removes leave the chain equal to a sorted vector given the same,
        /// and a copy taken before is unchanged (the chunks it shares were copied).
        #[test]
        fn the_chain_is_a_sorted_vector(start in proptest::collection::btree_set(0u16..4000, 0..1500), ops in proptest::collection::vec((any::<bool>(), 0u16..4000), 0..600)) {
            let mut model: Vec<Box<[u8]>> = start.iter().map(|n| key(*n)).collect();
            let mut chain = NsecChain::from_sorted(model.clone());
            let before = chain.clone();
            let before_model = model.clone();
            for (add, n) in ops {
                let k = key(n);
                let want = model.binary_search_by(|o| canonical_cmp(o, &k));
                prop_assert_eq!(chain.search(&k), want);
                match (add, want) {
                    (true, Err(i)) => { model.insert(i, k.clone()); chain.insert(i, k); }
                    (false, Ok(i)) => { model.remove(i); chain.remove(i); }
                    _ => {}
                }
                prop_assert_eq!(chain.len(), model.len());
            }
            for (i, owner) in model.iter().enumerate() {
                prop_assert_eq!(chain.get(i), Some(&owner[..]));
                prop_assert_eq!(chain.after(i), model.get((i + 1) % model.len()).map(|o| &o[..]));
                prop_assert_eq!(chain.before(i), model.get(i.checked_sub(1).unwrap_or(model.len() - 1)).map(|o| &o[..]));
            }
            prop_assert_eq!(chain.get(model.len()), None);
            prop_assert!(chain.chunks.iter().all(|c| !c.is_empty() && c.len() <= 2 * CHUNK));
            for (i, owner) in before_model.iter().enumerate() {
                prop_assert_eq!(before.get(i), Some(&owner[..]));
            }
        }
    }
}
