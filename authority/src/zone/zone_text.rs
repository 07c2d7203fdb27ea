//! Master-file text the reader we use (hickory's `Parser`) does not take, made into text it
//! takes before it reads it:
//!
//! - **Decimal escapes** (`\DDD`, RFC 1035 5.1): the reader decodes them wrongly (`"\065"`
//!   came out as the bytes `\216\133`, not `A`), so each escape of printable ASCII is written
//!   as the character's own escape `\X`, which means the same in every field; an escape of
//!   anything else is refused with its line ([`decimal_escapes`]).
//! - **Records the reader has no form for** ([`records_it_cannot_read`]): the generic form of
//!   RFC 3597 (`TYPE65000 \# 3 abcdef`, or `\#` after any type's name), `TYPEnnn` for a type
//!   it knows (`TYPE1 10.0.0.1`), SPF (TXT's form, type 99) and RP (two names, type 17). Each
//!   such record is read here and its type and data are replaced in the text by `TXT
//!   "<marker>"`, so the reader still sees its owner, TTL and class and applies its rules to
//!   them (a blank owner, `$TTL`, the last TTL); the loader swaps the decoded data back in by
//!   the marker. A generic record of a type the reader knows is decoded into that type (so
//!   `TYPE1 \# 4 0a000001` is an A record like any other, checked and served as one); one of
//!   a type it does not know is served as its bytes. DNAME (either form) is refused: it would
//!   answer for its own name only, not for the names below it that it redirects; so is LOC in
//!   its own form (take the generic form), and meta types (OPT, TSIG, AXFR, ...).
//!
//! Lines are kept (a rewritten record keeps its newlines), so the reader's errors name the
//! right line. Records in `$INCLUDE`d files are not seen here: the reader alone reads them.

use hickory_proto::rr::rdata::NULL;
use hickory_proto::rr::{Name, RData, RecordType};
use hickory_proto::serialize::binary::{BinDecoder, BinEncodable, Restrict};
use std::borrow::Cow;
use std::collections::HashMap;
use std::str::FromStr;

/// `text` with every decimal escape `\DDD` of printable ASCII written as the character's own
/// escape `\X`; the line and digits of the first escape of anything else.
pub(crate) fn decimal_escapes(text: &str) -> Result<Cow<'_, str>, (usize, String)> {
    if !text.contains('\\') {
        return Ok(Cow::Borrowed(text));
    }
    let mut out = String::with_capacity(text.len());
    let mut line = 1;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\n' {
            line += 1;
        }
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.peek().copied() {
            Some(d) if d.is_ascii_digit() => {
                let digits: String = (0..3).filter_map(|_| chars.next_if(char::is_ascii_digit)).collect();
                let value = digits.parse::<u32>().ok().filter(|_| digits.len() == 3);
                match value.and_then(|v| u8::try_from(v).ok()).filter(|b| (0x20..=0x7e).contains(b)) {
                    Some(byte) => {
                        out.push('\\');
                        out.push(char::from(byte));
                    }
                    None => return Err((line, digits)),
                }
            }
            // Any other escape, `\\` included, goes through whole.
            Some(next) => {
                out.push('\\');
                out.push(next);
                chars.next();
                if next == '\n' {
                    line += 1;
                }
            }
            None => out.push('\\'),
        }
    }
    Ok(Cow::Owned(out))
}

/// The text for the reader, and the data of each record taken out of it, by marker.
pub(crate) struct Rewritten<'a> {
    pub text: Cow<'a, str>,
    pub data: HashMap<String, RData>,
}

impl Rewritten<'_> {
    /// The data a placeholder record stands for: `Some` when `data` is `TXT "<marker>"`.
    pub fn replacement(&self, data: &RData) -> Option<&RData> {
        let RData::TXT(txt) = data else { return None };
        let [only] = &txt.txt_data[..] else { return None };
        self.data.get(std::str::from_utf8(only).ok()?)
    }
}

/// A token of one record: its place in the text and whether it was quoted (the span is then
/// inside the quotes).
#[derive(Clone, Copy)]
struct Token {
    start: usize,
    end: usize,
    quoted: bool,
}

/// One record or directive: its span (to the end of its last line), its first line, whether
/// its owner is left out (the line starts blank), and its tokens.
struct Entry {
    start: usize,
    end: usize,
    line: usize,
    blank_owner: bool,
    tokens: Vec<Token>,
}

/// Splits `text` into entries as RFC 1035 5.1 reads it: comments from `;`, quoted strings,
/// parentheses that carry an entry over lines, `\` escaping the next character.
fn entries(text: &str) -> Vec<Entry> {
    let b = text.as_bytes();
    let (mut i, mut line) = (0, 1);
    let mut out = Vec::new();
    while i < b.len() {
        let (start, first_line) = (i, line);
        let blank_owner = matches!(b[i], b' ' | b'\t');
        let mut depth = 0usize;
        let mut tokens = Vec::new();
        while i < b.len() {
            match b[i] {
                b'\n' => {
                    line += 1;
                    i += 1;
                    if depth == 0 {
                        break;
                    }
                }
                b' ' | b'\t' | b'\r' => i += 1,
                b';' => {
                    while i < b.len() && b[i] != b'\n' {
                        i += 1;
                    }
                }
                b'(' => {
                    depth += 1;
                    i += 1;
                }
                b')' => {
                    depth = depth.saturating_sub(1);
                    i += 1;
                }
                b'"' => {
                    i += 1;
                    let from = i;
                    while i < b.len() && b[i] != b'"' {
                        if b[i] == b'\n' {
                            line += 1;
                        }
                        i += if b[i] == b'\\' && i + 1 < b.len() { 2 } else { 1 };
                    }
                    tokens.push(Token { start: from, end: i.min(b.len()), quoted: true });
                    i += 1;
                }
                _ => {
                    let from = i;
                    while i < b.len() && !matches!(b[i], b' ' | b'\t' | b'\r' | b'\n' | b';' | b'(' | b')' | b'"') {
                        i += if b[i] == b'\\' && i + 1 < b.len() && b[i + 1] != b'\n' { 2 } else { 1 };
                    }
                    tokens.push(Token { start: from, end: i, quoted: false });
                }
            }
        }
        out.push(Entry { start, end: i.min(b.len()), line: first_line, blank_owner, tokens });
    }
    out
}

/// `\X` as X: the escapes left after [`decimal_escapes`].
fn unescape(token: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(token.len());
    let mut bytes = token.bytes();
    while let Some(c) = bytes.next() {
        if c == b'\\' {
            if let Some(next) = bytes.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn is_class(token: &str) -> bool {
    let upper = token.to_ascii_uppercase();
    matches!(upper.as_str(), "IN" | "CH" | "HS" | "CS")
        || upper.strip_prefix("CLASS").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The type code a type token names, with the types this module reads that the reader has
/// no name for.
fn type_code(token: &str) -> Option<u16> {
    let upper = token.to_ascii_uppercase();
    if let Some(digits) = upper.strip_prefix("TYPE") {
        return digits.parse().ok();
    }
    match upper.as_str() {
        "SPF" => Some(99),
        "RP" => Some(17),
        "LOC" => Some(29),
        _ => RecordType::from_str(&upper).ok().map(u16::from),
    }
}

/// Types never taken from a master file: meta types and query types (RFC 6895 3.1: OPT and
/// 128..=255, which hold TKEY, TSIG, IXFR, AXFR, ANY), and 0.
fn is_meta(code: u16) -> bool {
    code == 0 || code == 41 || (128..=255).contains(&code)
}

/// DNSSEC's records of the zone itself (SIG, KEY, NXT, RRSIG, NSEC, DNSKEY, NSEC3,
/// NSEC3PARAM, CDS, CDNSKEY): an unsigned zone would serve them without the signatures that
/// make them mean anything, and a signed zone (`zone::signed`) makes its own. DS is taken: it is the parent's data at a
/// delegation, the child's key digest (the loader refuses one away from a delegation).
fn is_dnssec(code: u16) -> bool {
    matches!(code, 24 | 25 | 30 | 46 | 47 | 48 | 50 | 51 | 59 | 60)
}

const DNAME: u16 = 39;

/// Reads the records of `text` the reader cannot (see the module docs) and rewrites them as
/// placeholders; `origin` completes relative names until a `$ORIGIN` says otherwise. An error
/// is the line and what is wrong.
pub(crate) fn records_it_cannot_read<'a>(text: &'a str, origin: &Name) -> Result<Rewritten<'a>, (usize, String)> {
    let mut marker_base = String::from("dnsplan-generic");
    while text.contains(&marker_base) {
        marker_base.push('-');
    }
    let mut origin = origin.clone();
    let mut data = HashMap::new();
    // Spans of the text to replace, in order.
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    for entry in entries(text) {
        let token = |t: &Token| &text[t.start..t.end];
        let Some(first) = entry.tokens.first() else { continue };
        if !entry.blank_owner && token(first).starts_with('$') {
            if token(first).eq_ignore_ascii_case("$ORIGIN")
                && let Some(name) = entry.tokens.get(1)
            {
                origin = Name::parse(token(name), Some(&origin)).map_err(|e| (entry.line, format!("$ORIGIN {}: {e}", token(name))))?;
            }
            continue;
        }
        // The owner, then a TTL and a class in either order, then the type.
        let mut at = usize::from(!entry.blank_owner);
        while let Some(t) = entry.tokens.get(at)
            && !t.quoted
            && (token(t).starts_with(|c: char| c.is_ascii_digit()) || is_class(token(t)))
        {
            at += 1;
        }
        let Some(type_token) = entry.tokens.get(at) else { continue };
        let rdata = &entry.tokens[at + 1..];
        let generic = rdata.first().is_some_and(|t| !t.quoted && token(t) == "\\#");
        let named = token(type_token);
        let upper = named.to_ascii_uppercase();
        let Some(code) = type_code(named) else { continue };
        let fail = |what: String| (entry.line, format!("{named}: {what}"));
        if code == DNAME {
            return Err(fail(
                "DNAME is not supported yet: it would answer for its own name only, not for the names below it that it \
                 redirects; list those names' records instead"
                    .into(),
            ));
        }
        if is_dnssec(code) {
            return Err(fail(
                "DNSSEC records (DNSKEY, RRSIG, NSEC, NSEC3, CDS, CDNSKEY) are not taken from a master file: dnsplan signs \
                 the zone itself ([dns_zone.dnssec]) and makes its own"
                    .into(),
            ));
        }
        let read = if generic {
            if is_meta(code) {
                return Err(fail(format!("type {code} is a meta or query type, not data a zone holds")));
            }
            Some(generic_data(code, &rdata[1..].iter().map(token).collect::<Vec<_>>()).map_err(fail)?)
        } else if upper.starts_with("TYPE") {
            match RecordType::from(code) {
                // A type the reader knows, by number: its own form follows.
                RecordType::Unknown(_) => {
                    return Err(fail(format!(
                        "type {code} has no form of its own here; write its data in the generic form: \\# LENGTH HEX"
                    )));
                }
                known if is_meta(code) => return Err(fail(format!("{known} is a meta or query type, not data a zone holds"))),
                known => {
                    edits.push((type_token.start, type_token.end, known.to_string()));
                    None
                }
            }
        } else {
            match upper.as_str() {
                "SPF" => Some(spf(&rdata.iter().map(|t| unescape(token(t))).collect::<Vec<_>>()).map_err(fail)?),
                "RP" => Some(rp(&rdata.iter().map(token).collect::<Vec<_>>(), &origin).map_err(fail)?),
                "LOC" => {
                    return Err(fail(
                        "LOC is taken in the generic form only (RFC 3597): TYPE29 \\# 16 followed by its 16 bytes in hex".into(),
                    ));
                }
                _ => None,
            }
        };
        let Some(read) = read else { continue };
        let marker = format!("{marker_base}-{}", data.len());
        let mut placeholder = String::new();
        if entry.blank_owner {
            placeholder.push(' ');
        }
        for t in &entry.tokens[..at] {
            placeholder.push_str(token(t));
            placeholder.push(' ');
        }
        placeholder.push_str(&format!("TXT \"{marker}\""));
        placeholder.extend(std::iter::repeat_n('\n', text[entry.start..entry.end].matches('\n').count()));
        edits.push((entry.start, entry.end, placeholder));
        data.insert(marker, read);
    }
    if edits.is_empty() {
        return Ok(Rewritten { text: Cow::Borrowed(text), data });
    }
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    for (start, end, replacement) in edits {
        out.push_str(&text[from..start]);
        out.push_str(&replacement);
        from = end;
    }
    out.push_str(&text[from..]);
    Ok(Rewritten { text: Cow::Owned(out), data })
}

/// RFC 3597 5: `\#`, the length in bytes, then the bytes in hex (in any number of tokens).
fn generic_data(code: u16, tokens: &[&str]) -> Result<RData, String> {
    let Some((length, hex)) = tokens.split_first() else { return Err("\\# without a length".into()) };
    let length: u16 = length.parse().map_err(|_| format!("the generic length {length:?} is not a number of bytes up to 65535"))?;
    let hex: String = hex.concat();
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("the generic data {hex:?} is not hex digits in pairs"));
    }
    let bytes: Vec<u8> = (0..hex.len()).step_by(2).filter_map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok()).collect();
    if bytes.len() != usize::from(length) {
        return Err(format!("the generic length says {length} bytes, but {} follow", bytes.len()));
    }
    let record_type = RecordType::from(code);
    if let RecordType::Unknown(_) = record_type {
        return Ok(RData::Unknown { code: record_type, rdata: if bytes.is_empty() { NULL::new() } else { NULL::with(bytes) } });
    }
    let mut decoder = BinDecoder::new(&bytes);
    let data = RData::read(&mut decoder, record_type, Restrict::new(length))
        .map_err(|e| format!("the generic data does not decode as {record_type}: {e}"))?;
    if decoder.index() != bytes.len() {
        return Err(format!("the generic data holds {} bytes after the {record_type} data", bytes.len() - decoder.index()));
    }
    Ok(data)
}

/// SPF (RFC 7208 3.1): TXT's data, of type 99.
fn spf(strings: &[Vec<u8>]) -> Result<RData, String> {
    if strings.is_empty() {
        return Err("no text".into());
    }
    let mut wire = Vec::new();
    for s in strings {
        let len = u8::try_from(s.len()).map_err(|_| format!("a string of {} bytes; each is at most 255", s.len()))?;
        wire.push(len);
        wire.extend_from_slice(s);
    }
    Ok(RData::Unknown { code: RecordType::from(99), rdata: NULL::with(wire) })
}

/// RP (RFC 1183 2.2): a mailbox and a name with TXT records, of type 17.
fn rp(tokens: &[&str], origin: &Name) -> Result<RData, String> {
    let [mailbox, text] = tokens else { return Err(format!("{} fields; RP takes a mailbox and a name", tokens.len())) };
    let mut wire = Vec::new();
    for field in [mailbox, text] {
        let name = if *field == "@" { origin.clone() } else { Name::parse(field, Some(origin)).map_err(|e| format!("{field}: {e}"))? };
        wire.extend(name.to_bytes().map_err(|e| format!("{field}: {e}"))?);
    }
    Ok(RData::Unknown { code: RecordType::from(17), rdata: NULL::with(wire) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::serialize::binary::BinDecodable;

    fn origin() -> Name {
        Name::from_ascii("example.test.").expect("name")
    }

    /// Each taken form becomes a placeholder on the same lines, with its data read.
    #[test]
    fn the_forms_the_reader_lacks_become_placeholders_with_their_data() {
        let text = "a 60 IN TYPE65000 \\# 3 abcdef\n\
                    \tTYPE1 \\# 4 0A000001 ; an A record\n\
                    b TYPE1 10.0.0.2\n\
                    c SPF \"v=spf1 -all\" \"and\\\"more\"\n\
                    d RP ( mbox.example.test.\n  @ )\n\
                    e TYPE65001 \\# 0\n\
                    f TXT \"untouched\"\n";
        let out = records_it_cannot_read(text, &origin()).expect("taken");
        assert_eq!(out.text.lines().count(), text.lines().count(), "lines are kept:\n{}", out.text);
        assert!(out.text.contains("b TYPE1".replace("TYPE1", "A").as_str()), "{}", out.text);
        assert!(out.text.contains("f TXT \"untouched\""));
        assert_eq!(out.data.len(), 5);
        let data: Vec<&RData> = (0..5).map(|n| &out.data[&format!("dnsplan-generic-{n}")]).collect();
        assert_eq!(data[0], &RData::Unknown { code: RecordType::Unknown(65000), rdata: NULL::with(vec![0xab, 0xcd, 0xef]) });
        assert_eq!(data[1], &RData::A("10.0.0.1".parse().expect("address")));
        let mut spf = vec![11];
        spf.extend_from_slice(b"v=spf1 -all");
        spf.push(8);
        spf.extend_from_slice(b"and\"more");
        assert_eq!(data[2], &RData::Unknown { code: RecordType::Unknown(99), rdata: NULL::with(spf) });
        let RData::Unknown { code, rdata } = data[3] else { panic!("RP is its bytes: {:?}", data[3]) };
        assert_eq!((*code, rdata.anything.len()), (RecordType::Unknown(17), 19 + 14));
        assert_eq!(data[4], &RData::Unknown { code: RecordType::Unknown(65001), rdata: NULL::new() });
        // Placeholders keep owner, TTL and class.
        assert!(
            out.text.starts_with("a 60 IN TXT \"dnsplan-generic-0\"\n\t") || out.text.starts_with("a 60 IN TXT \"dnsplan-generic-0\"\n ")
        );
    }

    /// What is not taken is refused with its line and why.
    #[test]
    fn what_is_not_taken_is_refused_with_its_line() {
        for (text, line, says) in [
            ("a TYPE65000 \\# 3 abcd\n", 1, "3 bytes, but 2 follow"),
            ("a A 10.0.0.1\nb TYPE65000 abcdef\n", 2, "generic form"),
            ("a TYPE1 \\# 3 0a0000\n", 1, "does not decode as A"),
            ("a DNAME b.example.test.\n", 1, "DNAME is not supported"),
            ("a TYPE39 \\# 1 00\n", 1, "DNAME is not supported"),
            ("a LOC 52 22 23.000 N 4 53 32.000 E -2.00m 0.00m 10000m 10m\n", 1, "generic form only"),
            ("a TYPE250 \\# 1 00\n", 1, "meta or query type"),
            ("a TYPE46 \\# 1 00\n", 1, "DNSSEC records"),
            ("a CDS 1 8 2 abcd\n", 1, "DNSSEC records"),
            ("a TYPE65000 \\# 2 zz00\n", 1, "hex digits"),
            ("a SPF\n", 1, "no text"),
        ] {
            let err = records_it_cannot_read(text, &origin()).err().unwrap_or_else(|| panic!("{text:?} was taken"));
            assert_eq!(err.0, line, "{text:?}: {err:?}");
            assert!(err.1.contains(says), "{text:?}: {err:?}");
        }
    }

    /// `$ORIGIN` completes relative names of the records read here.
    #[test]
    fn origin_directives_complete_relative_names() {
        let out = records_it_cannot_read("$ORIGIN sub.example.test.\nx RP mbox txt\n", &origin()).expect("taken");
        let RData::Unknown { rdata, .. } = &out.data["dnsplan-generic-0"] else { panic!("bytes") };
        let mut decoder = BinDecoder::new(&rdata.anything);
        let mailbox = Name::read(&mut decoder).expect("a name");
        assert_eq!(mailbox.to_ascii(), "mbox.sub.example.test.");
    }
}
