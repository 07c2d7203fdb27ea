//! SOA serials: the serial of a content-change count, and RFC 1982 comparison of two serials.

/// The SOA serial of content-change count `content_changes`: `serial_base + content_changes`
/// mod 2^32. The count only grows (every apply transaction that changes what is served adds
/// one, in the store's own transaction, on disk or in etcd; one that only moves fences to a
/// newer plan with the same records adds none), so each new content has a serial newer in
/// RFC 1982 arithmetic than the one before, across the wrap from 2^32 - 1 to 0 too, as long
/// as a secondary does not miss 2^31 changes at once; and the same content keeps its serial,
/// so secondaries are not notified of nothing.
pub fn serial_of(serial_base: u32, content_changes: u64) -> u32 {
    serial_base.wrapping_add(content_changes as u32)
}

/// Whether serial `a` is newer than `b` in RFC 1982 arithmetic (§3.2, SERIAL_BITS 32): what
/// a secondary decides before it transfers. Neither is newer when they are equal or exactly
/// 2^31 apart (undefined in the RFC).
pub fn serial_newer(a: u32, b: u32) -> bool {
    let d = a.wrapping_sub(b);
    d != 0 && d < 1 << 31
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each applied change gives a serial newer than the last one in RFC 1982 arithmetic,
    /// across the wrap from 2^32 - 1 to 0 and from any `serial_base`; a store that starts
    /// over at 0 is older to the secondaries unless `serial_base` is set past their serial.
    #[test]
    fn serials_increase_in_rfc_1982_arithmetic_across_the_wrap() {
        let counts =
            [0u64, 1, 2, (1 << 31) - 1, 1 << 31, u64::from(u32::MAX) - 1, u64::from(u32::MAX), 1 << 32, (1 << 32) + 1, (1 << 33) + 7];
        for base in [0, 7, u32::MAX - 3, 1 << 31] {
            for pair in counts.windows(2) {
                let (before, after) = (serial_of(base, pair[0]), serial_of(base, pair[1]));
                if pair[1] - pair[0] < 1 << 31 {
                    assert!(serial_newer(after, before), "base {base}: count {} -> {}: serial {before} -> {after}", pair[0], pair[1]);
                    assert!(!serial_newer(before, after));
                }
            }
        }
        assert_eq!(serial_of(0, u64::from(u32::MAX) + 1), 0, "the wrap");
        assert!(serial_newer(0, u32::MAX) && serial_newer(3, u32::MAX - 3));
        assert!(!serial_newer(5, 5) && !serial_newer(0, 1 << 31) && !serial_newer(1 << 31, 0), "equal, or 2^31 apart: undefined");
        let held = serial_of(0, 123_456);
        assert!(!serial_newer(serial_of(0, 1), held), "a new, empty store's serials are older than the secondaries'");
        assert!(serial_newer(serial_of(held.wrapping_add(1), 0), held), "serial_base = their serial + 1 puts it right");
    }
}
