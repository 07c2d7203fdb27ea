//! Plan generations: the one number every safety decision compares.
//!
//! A generation is a `u64` that only ever grows. `Generation::NONE` (zero) stands for
//! "no plan yet": the parent of the first plan and the latest generation of an empty store.
//! The SOA serial is derived from other counters mod 2^32 and is never compared for safety.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A plan's number. Strictly increasing across published plans; see `Store::publish`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct Generation(pub u64);

impl Generation {
    /// Before any plan: the latest generation of an empty store and the parent of plan 1.
    pub const NONE: Generation = Generation(0);
    /// The first generation of a store (of a zone added again under a removed zone's name: its
    /// `Store::generation_base` plus one).
    pub const FIRST: Generation = Generation(1);

    /// The generation after this one, or `None` at `u64::MAX` (a store that old is refused
    /// rather than wrapped, because wrapping would make a new plan look older).
    pub fn next(self) -> Option<Generation> {
        self.0.checked_add(1).map(Generation)
    }

    /// `self - n`, saturating at `NONE`.
    pub fn saturating_sub(self, n: u64) -> Generation {
        Generation(self.0.saturating_sub(n))
    }

    pub fn is_none(self) -> bool {
        self == Generation::NONE
    }

    /// Big-endian bytes: the key order of every store equals the numeric order.
    pub fn to_be_bytes(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }

    pub fn from_be_bytes(bytes: [u8; 8]) -> Generation {
        Generation(u64::from_be_bytes(bytes))
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_order_matches_numeric_order() {
        let pairs = [(0u64, 1u64), (255, 256), (u32::MAX as u64, u32::MAX as u64 + 1), (1, u64::MAX)];
        for (a, b) in pairs {
            assert!(Generation(a).to_be_bytes() < Generation(b).to_be_bytes(), "{a} vs {b}");
            assert_eq!(Generation::from_be_bytes(Generation(a).to_be_bytes()), Generation(a));
        }
        assert_eq!(Generation(u64::MAX).next(), None);
        assert_eq!(Generation(3).saturating_sub(5), Generation::NONE);
    }
}
