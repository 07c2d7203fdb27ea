//! Name compression (RFC 1035 §4.1.4) for the answers written by hand: the fast path's
//! negative answers (the SOA's MNAME and RNAME) and the precompiled apex NS answer in
//! `snapshot`. Allocation-free: the caller keeps the names already written in a slice.
//!
//! A name is written as its labels up to the longest suffix (at a label boundary) that is
//! already in the message, case-insensitively, and then a pointer to it, as NSD does: a
//! pointer into the question gives the question's case to what follows it, which DNS allows
//! (RFC 4343). The reference path gets the same bytes from hickory's encoder, which compares
//! names case-sensitively, by giving each name the question's case first
//! (`answer::in_question_case`); `tests/fast_path.rs` holds the two to the same length.
//!
//! What goes into the message is not this module's business, nor reading messages (`wire`).

/// Largest offset a compression pointer can hold (14 bits).
pub const POINTER_TARGET_MAX: usize = 0x3fff;

/// A name already in the message, which later names may point into.
#[derive(Clone, Copy, Debug)]
pub struct Written<'a> {
    /// The whole name in lower-case wire form, ending in the root label.
    pub key: &'a [u8],
    /// How many bytes of `key` (whole labels) are written out literally at `at`; the rest of
    /// the name is a pointer to an earlier name, which is where later names find it.
    pub literal: usize,
    /// Offset of the name in the message.
    pub at: usize,
}

impl<'a> Written<'a> {
    /// A name written in full at `at` (the question's, for one).
    pub fn whole(key: &'a [u8], at: usize) -> Written<'a> {
        Written { key, literal: key.len().saturating_sub(1), at }
    }

    /// Where the suffix `suffix` of this name starts in the message, if this name has it at
    /// a label boundary inside its literal part and a pointer can reach it.
    fn find(&self, suffix: &[u8]) -> Option<usize> {
        let start = self.key.len().checked_sub(suffix.len())?;
        if start >= self.literal || self.at + start > POINTER_TARGET_MAX || !is_label_start(self.key, start) {
            return None;
        }
        (&self.key[start..] == suffix).then_some(self.at + start)
    }
}

/// Whether a label starts at `offset` of the wire-form name `key`.
pub fn is_label_start(key: &[u8], offset: usize) -> bool {
    let mut at = 0;
    while at < offset {
        match key.get(at) {
            Some(&len) if len > 0 => at += 1 + usize::from(len),
            _ => return false,
        }
    }
    at == offset
}

/// Appends `name` (lower-case wire form, ending in the root label) to `out`, which holds the
/// message from its first byte: its labels up to the longest suffix one of `written` has,
/// then a pointer to that suffix. Returns the name as written, for later names.
pub fn write_name<'a>(out: &mut Vec<u8>, name: &'a [u8], written: &[Written<'_>]) -> Written<'a> {
    let at = out.len();
    let mut label = 0;
    while let Some(&len) = name.get(label).filter(|&&len| len > 0) {
        let suffix = &name[label..];
        if let Some(target) = written.iter().find_map(|w| w.find(suffix)) {
            out.extend_from_slice(&name[..label]);
            out.extend_from_slice(&(0xc000 | target as u16).to_be_bytes());
            return Written { key: name, literal: label, at };
        }
        label += 1 + usize::from(len);
    }
    out.extend_from_slice(name);
    Written::whole(name, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for label in text.split('.').filter(|l| !l.is_empty()) {
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
        out.push(0);
        out
    }

    #[test]
    fn names_point_at_their_longest_suffix() {
        let question = key("x.ns1.example.test.");
        let mut out = vec![0u8; 12];
        out.extend_from_slice(&question);
        let q = Written::whole(&question, 12);
        // Below the question's name: the whole suffix is a pointer.
        let mname = key("ns1.example.test.");
        let m = write_name(&mut out, &mname, &[q]);
        assert_eq!(&out[12 + question.len()..], &[0xc0, 12 + 2]);
        assert_eq!(m.literal, 0);
        // A sibling: one label, then the origin inside the question.
        let before = out.len();
        let rname = key("hostmaster.example.test.");
        write_name(&mut out, &rname, &[q, m]);
        assert_eq!(out[before..before + 11], key("hostmaster.")[..11]);
        assert_eq!(&out[before + 11..], &[0xc0, 12 + 2 + 4]);
        // Outside the question's names: written in full, and then pointed into.
        let other = key("a.ns.other.net.");
        let before = out.len();
        let o = write_name(&mut out, &other, &[q]);
        assert_eq!(&out[before..], &other[..]);
        let sibling = key("b.ns.other.net.");
        let before = out.len();
        write_name(&mut out, &sibling, &[q, o]);
        assert_eq!(&out[before..], &[1, b'b', 0xc0, (o.at + 2) as u8]);
    }

    #[test]
    fn suffixes_match_at_label_boundaries_only() {
        // One label, "a\004test": its last bytes spell the name "test." but no label starts
        // there, so a pointer to them would read a different name.
        let written = [6, b'a', 4, b't', b'e', b's', b't', 0];
        let w = Written::whole(&written, 12);
        assert_eq!(w.find(&key("test.")), None);
        assert_eq!(w.find(&written), Some(12));
    }

    #[test]
    fn pointers_stay_within_14_bits() {
        let written = key("example.test.");
        let far = Written::whole(&written, POINTER_TARGET_MAX + 1);
        let mut out = Vec::new();
        let name = key("ns1.example.test.");
        write_name(&mut out, &name, &[far]);
        assert_eq!(out, name, "no pointer to an offset beyond 14 bits");
    }
}
