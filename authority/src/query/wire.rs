//! Raw reads of a DNS message's bytes, without decoding it into a `Message` and without
//! allocating: where the OPT record's options are, and whether they are well formed.
//!
//! Shared by the fast path (which answers only queries whose options pass) and the reference
//! path (which answers FORMERR to those that do not, before hickory decodes the message), so
//! the two agree by construction. Answering is not this module's business.

/// RR type OPT (RFC 6891).
pub const TYPE_OPT: u16 = 41;
/// EDNS option code of the client subnet (RFC 7871).
const OPTION_CLIENT_SUBNET: u16 = 8;
/// Most labels in a name: 255 bytes of one-byte labels and their length bytes.
const NAME_LABELS_MAX: usize = 128;

pub fn u16_at(p: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*p.get(at)?, *p.get(at + 1)?]))
}

/// Where the name at `at` ends: after its root label or its compression pointer. `None` when
/// it runs past the packet or uses a reserved label type.
pub fn skip_name(p: &[u8], mut at: usize) -> Option<usize> {
    for _ in 0..NAME_LABELS_MAX {
        let len = *p.get(at)?;
        match len {
            0 => return Some(at + 1),
            1..=63 => at += 1 + usize::from(len),
            0xc0..=0xff => {
                p.get(at + 1)?;
                return Some(at + 2);
            }
            _ => return None,
        }
    }
    None
}

/// The RDATA (the options) of the first OPT record in the additional section of `p`, a
/// message of at least a header. `None` when there is none, or when the message does not
/// frame up to it (hickory's decoder then refuses it).
pub fn opt_rdata(p: &[u8]) -> Option<&[u8]> {
    let count = |at: usize| usize::from(u16_at(p, at).unwrap_or(0));
    let (questions, answers, authority, additional) = (count(4), count(6), count(8), count(10));
    let mut at = 12;
    // Every question and record takes at least 5 bytes, so a loop ends at the packet's end
    // long before its count when the count lies.
    for _ in 0..questions {
        at = skip_name(p, at)? + 4;
    }
    for i in 0..answers + authority + additional {
        at = skip_name(p, at)?;
        let rtype = u16_at(p, at)?;
        let rdlen = usize::from(u16_at(p, at + 8)?);
        let rdata = p.get(at + 10..at + 10 + rdlen)?;
        if rtype == TYPE_OPT && i >= answers + authority {
            return Some(rdata);
        }
        at += 10 + rdlen;
    }
    None
}

/// RR type TSIG (RFC 8945).
pub const TYPE_TSIG: u16 = 250;

/// The type asked by the first question of `p`, a message of at least a header with one
/// question or more. `None` when it does not frame.
pub fn question_type(p: &[u8]) -> Option<u16> {
    if u16_at(p, 4)? == 0 {
        return None;
    }
    u16_at(p, skip_name(p, 12)?)
}

/// Whether the last record of `p` is a TSIG record (where RFC 8945 §5.1 puts it): the
/// message is signed, or claims to be. `false` when the message does not frame.
pub fn ends_with_tsig(p: &[u8]) -> bool {
    let count = |at: usize| usize::from(u16_at(p, at).unwrap_or(0));
    let (questions, records) = (count(4), count(6) + count(8) + count(10));
    if records == 0 || count(10) == 0 {
        return false;
    }
    let mut at = 12;
    // As in `opt_rdata`: every question and record takes at least 5 bytes.
    for _ in 0..questions {
        let Some(end) = skip_name(p, at) else { return false };
        at = end + 4;
    }
    let mut last = 0;
    for _ in 0..records {
        let Some(end) = skip_name(p, at) else { return false };
        let (Some(rtype), Some(rdlen)) = (u16_at(p, end), u16_at(p, end + 8)) else { return false };
        last = rtype;
        at = end + 10 + usize::from(rdlen);
        if at > p.len() {
            return false;
        }
    }
    last == TYPE_TSIG
}

/// Whether an OPT record's RDATA is well formed: each option's length stays inside it and the
/// last one ends at its end, and a client-subnet option has a known family, prefix lengths
/// within the family's, exactly the address bytes its source prefix needs and no address bit
/// set beyond that prefix (RFC 7871 §6, which asks for FORMERR otherwise). Other options'
/// contents are not read: we implement none of them.
pub fn edns_options_ok(options: &[u8]) -> bool {
    let mut at = 0;
    // Each option takes at least its 4-byte header, so this ends within `len / 4` rounds.
    while at < options.len() {
        let (Some(code), Some(len)) = (u16_at(options, at), u16_at(options, at + 2)) else { return false };
        let start = at + 4;
        let end = start + usize::from(len);
        let Some(data) = options.get(start..end) else { return false };
        if code == OPTION_CLIENT_SUBNET && !client_subnet_ok(data) {
            return false;
        }
        at = end;
    }
    true
}

/// RFC 7871 §6: FAMILY (1 IPv4, 2 IPv6), SOURCE PREFIX-LENGTH, SCOPE PREFIX-LENGTH, ADDRESS
/// cut to the source prefix.
fn client_subnet_ok(data: &[u8]) -> bool {
    let (Some(family), Some(&source), Some(&scope)) = (u16_at(data, 0), data.get(2), data.get(3)) else { return false };
    let bits_max = match family {
        1 => 32,
        2 => 128,
        _ => return false,
    };
    if source > bits_max || scope > bits_max {
        return false;
    }
    let address = &data[4..];
    if address.len() != usize::from(source).div_ceil(8) {
        return false;
    }
    match (address.last(), source % 8) {
        (Some(&last), partial) if partial != 0 => last & (0xff >> partial) == 0,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn option(code: u16, data: &[u8]) -> Vec<u8> {
        let mut o = code.to_be_bytes().to_vec();
        o.extend_from_slice(&(data.len() as u16).to_be_bytes());
        o.extend_from_slice(data);
        o
    }

    #[test]
    fn options_frame_or_not() {
        assert!(edns_options_ok(&[]));
        assert!(edns_options_ok(&option(10, &[1, 2, 3, 4, 5, 6, 7, 8])), "a cookie");
        assert!(edns_options_ok(&[option(10, &[1; 8]), option(12, &[0; 3])].concat()), "a cookie and padding");
        let mut cut = option(10, &[1; 8]);
        cut.truncate(10);
        assert!(!edns_options_ok(&cut), "an option longer than the RDATA");
        assert!(!edns_options_ok(&[0, 10, 0]), "half an option header");
    }

    #[test]
    fn client_subnet_is_checked() {
        for (data, ok, why) in [
            (&[0, 1, 24, 0, 192, 0, 2][..], true, "IPv4 /24"),
            (&[0, 1, 0, 0][..], true, "IPv4 /0, no address"),
            (&[0, 2, 56, 0, 0x20, 1, 0xd, 0xb8, 0, 0, 0][..], true, "IPv6 /56"),
            (&[0, 1, 20, 0, 192, 0, 0x20][..], true, "IPv4 /20, last bits clear"),
            (&[0, 1, 20, 0, 192, 0, 0x21][..], false, "a bit set beyond the source prefix"),
            (&[0, 1, 24, 0, 192, 0][..], false, "an address cut short"),
            (&[0, 1, 24, 0, 192, 0, 2, 1][..], false, "too many address bytes"),
            (&[0, 1, 33, 0, 1, 2, 3, 4, 0][..], false, "a source prefix above 32"),
            (&[0, 1, 24, 33, 192, 0, 2][..], false, "a scope prefix above 32"),
            (&[0, 3, 0, 0][..], false, "an unknown family"),
            (&[0, 1, 24][..], false, "a header cut short"),
        ] {
            assert_eq!(edns_options_ok(&option(OPTION_CLIENT_SUBNET, data)), ok, "{why}");
        }
    }

    #[test]
    fn the_opt_record_is_found_after_other_records() {
        // Header: one question, one answer, one additional.
        let mut p = vec![0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1];
        p.extend_from_slice(&[1, b'a', 0, 0, 1, 0, 1]); // a. A IN
        p.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 10, 0, 0, 1]); // answer
        let options = option(10, &[7; 8]);
        p.extend_from_slice(&[0, 0, 41, 4, 0xd0, 0, 0, 0, 0]);
        p.extend_from_slice(&(options.len() as u16).to_be_bytes());
        p.extend_from_slice(&options);
        assert_eq!(opt_rdata(&p), Some(&options[..]));
        p.truncate(p.len() - 1);
        assert_eq!(opt_rdata(&p), None, "an OPT record cut short is hickory's to refuse");
    }

    #[test]
    fn a_tsig_record_is_found_last_and_the_question_type_read() {
        // Header: one question, two additional (an OPT, then a TSIG with empty RDATA).
        let mut p = vec![0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 2];
        p.extend_from_slice(&[1, b'a', 0, 0, 252, 0, 1]); // a. AXFR IN
        p.extend_from_slice(&[0, 0, 41, 4, 0xd0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(question_type(&p), Some(252));
        assert!(!ends_with_tsig(&p), "counts say two additional records, one is there");
        p.extend_from_slice(&[3, b'k', b'e', b'y', 0, 0, 250, 0, 255, 0, 0, 0, 0, 0, 0]);
        assert!(ends_with_tsig(&p));
        p[11] = 1; // only the OPT record counted: the TSIG is not part of the message
        assert!(!ends_with_tsig(&p));
        assert_eq!(question_type(&p[..14]), None);
    }
}
