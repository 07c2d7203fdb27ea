//! Ethernet frames of UDP queries, read and answered (no unsafe code): what the XDP program
//! hands to the socket is checked again here in full, and a reply frame is written with its
//! addresses and ports swapped and its checksums computed.
//!
//! A frame the socket path would treat differently is refused (`None`), never guessed at:
//! IPv4 with options or fragmented, IPv6 with extension headers, a length that does not add
//! up, a bad IPv4 header checksum. The XDP program passes the first three kinds to the kernel
//! already. The UDP checksum of a query is not verified, as Knot's XDP path does not: a frame
//! from a veth or a local socket carries a partial one, left for an offload that never
//! happens (the receiving kernel trusts it), and a frame from a wire was checked by the
//! NIC's frame check sequence. Replies carry a full UDP checksum.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Ethernet II header: two addresses and the EtherType.
pub const ETH_BYTES: usize = 14;
/// IPv4 header without options.
pub const IPV4_BYTES: usize = 20;
/// IPv6 fixed header.
pub const IPV6_BYTES: usize = 40;
/// UDP header.
pub const UDP_BYTES: usize = 8;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const PROTO_UDP: u8 = 17;
/// The hop limit of every reply, as Linux's default (`net.ipv4.ip_default_ttl`).
pub const REPLY_HOP_LIMIT: u8 = 64;

/// A UDP datagram to our port, read from a frame: the addresses and ports to answer to, and
/// where the DNS message is in the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    /// The frame's source and destination MAC addresses.
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
    /// Where the UDP payload (the DNS message) starts and ends in the frame.
    pub payload_at: usize,
    pub payload_end: usize,
}

impl Query {
    /// The DNS message in `frame` (the frame this query was read from).
    pub fn payload<'a>(&self, frame: &'a [u8]) -> &'a [u8] {
        &frame[self.payload_at..self.payload_end]
    }

    /// The bytes of headers a reply to this query carries before its payload.
    pub fn reply_header_bytes(&self) -> usize {
        ETH_BYTES + if self.src.is_ipv4() { IPV4_BYTES } else { IPV6_BYTES } + UDP_BYTES
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn array<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at + N)?.try_into().ok()
}

/// The UDP datagram to `port` in `frame`, checked whole; `None` for anything else (see the
/// module's text).
pub fn parse(frame: &[u8], port: u16) -> Option<Query> {
    let dst_mac = array::<6>(frame, 0)?;
    let src_mac = array::<6>(frame, 6)?;
    let ip = ETH_BYTES;
    let (src, dst, udp, udp_len) = match be16(frame, 12)? {
        ETHERTYPE_IPV4 => {
            let header = frame.get(ip..ip + IPV4_BYTES)?;
            // Version 4, no options; not a fragment (MF clear, offset 0); UDP.
            if header[0] != 0x45 || be16(header, 6)? & 0x3fff != 0 || header[9] != PROTO_UDP {
                return None;
            }
            if checksum(&[header]) != 0 {
                return None;
            }
            let total = usize::from(be16(header, 2)?);
            // The frame may carry padding after the datagram (Ethernet's 60-byte minimum).
            if total < IPV4_BYTES + UDP_BYTES || ip + total > frame.len() {
                return None;
            }
            let src = Ipv4Addr::from(array::<4>(header, 12)?);
            let dst = Ipv4Addr::from(array::<4>(header, 16)?);
            (IpAddr::V4(src), IpAddr::V4(dst), ip + IPV4_BYTES, total - IPV4_BYTES)
        }
        ETHERTYPE_IPV6 => {
            let header = frame.get(ip..ip + IPV6_BYTES)?;
            if header[0] >> 4 != 6 || header[6] != PROTO_UDP {
                return None;
            }
            let payload = usize::from(be16(header, 4)?);
            if payload < UDP_BYTES || ip + IPV6_BYTES + payload > frame.len() {
                return None;
            }
            let src = Ipv6Addr::from(array::<16>(header, 8)?);
            let dst = Ipv6Addr::from(array::<16>(header, 24)?);
            (IpAddr::V6(src), IpAddr::V6(dst), ip + IPV6_BYTES, payload)
        }
        _ => return None,
    };
    let datagram = frame.get(udp..udp + udp_len)?;
    let (src_port, dst_port) = (be16(datagram, 0)?, be16(datagram, 2)?);
    if dst_port != port || usize::from(be16(datagram, 4)?) != udp_len {
        return None;
    }
    Some(Query { src_mac, dst_mac, src, dst, src_port, dst_port, payload_at: udp + UDP_BYTES, payload_end: udp + udp_len })
}

/// Why a reply was not written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyError {
    /// The reply does not fit the frame buffer (or a UDP length).
    TooLarge { needed: usize, room: usize },
}

/// Writes into `out` the frame answering `query` with `answer` as its UDP payload: MAC
/// addresses, IP addresses and ports swapped, lengths and checksums computed, hop limit
/// `REPLY_HOP_LIMIT`; IPv4 with DF set and identification 0, as Linux sends a datagram that
/// does not fragment. Returns the frame's length.
pub fn write_reply(query: &Query, answer: &[u8], out: &mut [u8]) -> Result<usize, ReplyError> {
    let headers = query.reply_header_bytes();
    let needed = headers + answer.len();
    let udp_len = UDP_BYTES + answer.len();
    if needed > out.len() || udp_len > usize::from(u16::MAX) - IPV4_BYTES {
        return Err(ReplyError::TooLarge { needed, room: out.len() });
    }
    let out = &mut out[..needed];
    out[0..6].copy_from_slice(&query.src_mac);
    out[6..12].copy_from_slice(&query.dst_mac);
    let udp = match (query.dst, query.src) {
        (IpAddr::V4(from), IpAddr::V4(to)) => {
            out[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
            let ip = &mut out[ETH_BYTES..ETH_BYTES + IPV4_BYTES];
            ip[0] = 0x45;
            ip[1] = 0;
            ip[2..4].copy_from_slice(&((IPV4_BYTES + udp_len) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&[0, 0]);
            ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
            ip[8] = REPLY_HOP_LIMIT;
            ip[9] = PROTO_UDP;
            ip[10..12].copy_from_slice(&[0, 0]);
            ip[12..16].copy_from_slice(&from.octets());
            ip[16..20].copy_from_slice(&to.octets());
            let sum = checksum(&[ip]);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            ETH_BYTES + IPV4_BYTES
        }
        (IpAddr::V6(from), IpAddr::V6(to)) => {
            out[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
            let ip = &mut out[ETH_BYTES..ETH_BYTES + IPV6_BYTES];
            ip[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
            ip[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            ip[6] = PROTO_UDP;
            ip[7] = REPLY_HOP_LIMIT;
            ip[8..24].copy_from_slice(&from.octets());
            ip[24..40].copy_from_slice(&to.octets());
            ETH_BYTES + IPV6_BYTES
        }
        // `parse` gives both addresses of one family.
        _ => return Err(ReplyError::TooLarge { needed, room: 0 }),
    };
    let datagram = &mut out[udp..];
    datagram[0..2].copy_from_slice(&query.dst_port.to_be_bytes());
    datagram[2..4].copy_from_slice(&query.src_port.to_be_bytes());
    datagram[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    datagram[6..8].copy_from_slice(&[0, 0]);
    datagram[UDP_BYTES..].copy_from_slice(answer);
    let mut sum = udp_checksum(query.dst, query.src, datagram);
    // A computed zero is sent as all ones (RFC 768): zero means "no checksum".
    if sum == 0 {
        sum = 0xffff;
    }
    datagram[6..8].copy_from_slice(&sum.to_be_bytes());
    Ok(needed)
}

/// The UDP checksum field's value for `datagram` (its own checksum field included as it is)
/// between `src` and `dst`: 0 when the datagram's checksum is right.
fn udp_checksum(src: IpAddr, dst: IpAddr, datagram: &[u8]) -> u16 {
    let len = (datagram.len() as u32).to_be_bytes();
    let proto = [0, 0, 0, PROTO_UDP];
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let length = (datagram.len() as u16).to_be_bytes();
            checksum(&[&s.octets(), &d.octets(), &[0, PROTO_UDP], &length, datagram])
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => checksum(&[&s.octets(), &d.octets(), &len, &proto, datagram]),
        _ => 1,
    }
}

/// The Internet checksum (RFC 1071) of the concatenation of `parts`: the one's complement of
/// the one's complement sum of its 16-bit words, an odd last byte padded with zero. Every part
/// but the last has an even length (headers and pseudo-headers).
pub fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    for part in parts {
        let mut words = part.chunks_exact(2);
        for word in &mut words {
            sum += u64::from(u16::from_be_bytes([word[0], word[1]]));
        }
        if let [last] = words.remainder() {
            sum += u64::from(*last) << 8;
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A query frame as a client's kernel would send it, built field by field here (not by
    /// `write_reply`), with `pad` bytes of Ethernet padding after it.
    fn client_frame(q: &Query, payload: &[u8], pad: usize) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&q.dst_mac);
        f.extend_from_slice(&q.src_mac);
        let udp_len = (UDP_BYTES + payload.len()) as u16;
        let mut datagram = Vec::new();
        datagram.extend_from_slice(&q.src_port.to_be_bytes());
        datagram.extend_from_slice(&q.dst_port.to_be_bytes());
        datagram.extend_from_slice(&udp_len.to_be_bytes());
        datagram.extend_from_slice(&[0, 0]);
        datagram.extend_from_slice(payload);
        let sum = match udp_checksum(q.src, q.dst, &datagram) {
            0 => 0xffff,
            s => s,
        };
        datagram[6..8].copy_from_slice(&sum.to_be_bytes());
        match (q.src, q.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
                let mut ip = vec![0x45, 0];
                ip.extend_from_slice(&(20 + udp_len).to_be_bytes());
                ip.extend_from_slice(&[0x12, 0x34, 0x40, 0, 63, PROTO_UDP, 0, 0]);
                ip.extend_from_slice(&s.octets());
                ip.extend_from_slice(&d.octets());
                let sum = checksum(&[&ip]);
                ip[10..12].copy_from_slice(&sum.to_be_bytes());
                f.extend_from_slice(&ip);
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                f.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
                f.extend_from_slice(&[0x60, 0x0a, 0xbc, 0xde]);
                f.extend_from_slice(&udp_len.to_be_bytes());
                f.extend_from_slice(&[PROTO_UDP, 63]);
                f.extend_from_slice(&s.octets());
                f.extend_from_slice(&d.octets());
            }
            _ => unreachable!("one family"),
        }
        f.extend_from_slice(&datagram);
        f.extend(std::iter::repeat_n(0, pad));
        f
    }

    fn query_strategy() -> impl Strategy<Value = (Query, Vec<u8>, usize)> {
        let addresses = prop_oneof![
            (any::<[u8; 4]>(), any::<[u8; 4]>()).prop_map(|(s, d)| (IpAddr::from(s), IpAddr::from(d))),
            (any::<[u8; 16]>(), any::<[u8; 16]>()).prop_map(|(s, d)| (IpAddr::from(s), IpAddr::from(d))),
        ];
        (
            any::<[u8; 6]>(),
            any::<[u8; 6]>(),
            addresses,
            any::<u16>(),
            any::<u16>(),
            proptest::collection::vec(any::<u8>(), 0..600),
            0..20usize,
        )
            .prop_map(|(src_mac, dst_mac, (src, dst), src_port, dst_port, payload, pad)| {
                let headers = ETH_BYTES + if src.is_ipv4() { IPV4_BYTES } else { IPV6_BYTES } + UDP_BYTES;
                let q = Query { src_mac, dst_mac, src, dst, src_port, dst_port, payload_at: headers, payload_end: headers + payload.len() };
                (q, payload, pad)
            })
    }

    proptest! {
        #[test]
        fn any_bytes_are_read_without_panic(frame in proptest::collection::vec(any::<u8>(), 0..200), port in any::<u16>()) {
            let _ = parse(&frame, port);
        }

        #[test]
        fn a_client_frame_reads_back_whole((q, payload, pad) in query_strategy()) {
            let frame = client_frame(&q, &payload, pad);
            prop_assert_eq!(parse(&frame, q.dst_port), Some(q));
            prop_assert_eq!(q.payload(&frame), &payload[..]);
            prop_assert_eq!(parse(&frame, q.dst_port.wrapping_add(1)), None, "another port");
        }

        /// Every byte of an IPv4 header, changed, makes the frame refused (its checksum) or
        /// read as something else: nothing misread is answered.
        #[test]
        fn a_changed_ipv4_header_byte_is_refused((q, payload, _) in query_strategy(), at in ETH_BYTES..ETH_BYTES + IPV4_BYTES, flip in 1..=255u8) {
            prop_assume!(q.src.is_ipv4());
            let mut frame = client_frame(&q, &payload, 0);
            frame[at] ^= flip;
            prop_assert_ne!(parse(&frame, q.dst_port), Some(q), "byte {} changed", at);
        }

        /// A reply's UDP checksum is right: the sum over its pseudo-header and datagram is 0.
        #[test]
        fn a_reply_carries_a_full_udp_checksum((q, _, _) in query_strategy(), answer in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut out = vec![0u8; 2048];
            let len = write_reply(&q, &answer, &mut out).expect("fits");
            let udp = q.reply_header_bytes() - UDP_BYTES;
            prop_assert_eq!(udp_checksum(q.dst, q.src, &out[udp..len]), 0);
        }

        #[test]
        fn a_reply_goes_back_where_the_query_came_from((q, _, _) in query_strategy(), answer in proptest::collection::vec(any::<u8>(), 0..1400)) {
            let mut out = vec![0u8; 2048];
            let len = write_reply(&q, &answer, &mut out).expect("fits");
            let reply = parse(&out[..len], q.src_port).expect("a reply reads as a datagram to the client's port");
            prop_assert_eq!((reply.src_mac, reply.dst_mac), (q.dst_mac, q.src_mac));
            prop_assert_eq!((reply.src, reply.dst), (q.dst, q.src));
            prop_assert_eq!((reply.src_port, reply.dst_port), (q.dst_port, q.src_port));
            prop_assert_eq!(reply.payload(&out[..len]), &answer[..]);
            prop_assert_eq!(len, q.reply_header_bytes() + answer.len());
        }
    }

    /// A query from `client` to port 53 at `server` with a payload of `payload` bytes.
    fn query_to_53(client: &str, server: &str, payload: usize) -> Query {
        let src: IpAddr = client.parse().expect("address");
        let headers = ETH_BYTES + if src.is_ipv4() { IPV4_BYTES } else { IPV6_BYTES } + UDP_BYTES;
        Query {
            src_mac: [2; 6],
            dst_mac: [4; 6],
            src,
            dst: server.parse().expect("address"),
            src_port: 40000,
            dst_port: 53,
            payload_at: headers,
            payload_end: headers + payload,
        }
    }

    #[test]
    fn what_the_kernel_would_not_answer_is_refused() {
        let q = query_to_53("192.0.2.1", "192.0.2.53", 12);
        let good = client_frame(&q, &[7; 12], 0);
        assert_eq!(parse(&good, 53), Some(q));
        let refused = |change: &dyn Fn(&mut Vec<u8>), why: &str| {
            let mut frame = good.clone();
            change(&mut frame);
            assert_eq!(parse(&frame, 53), None, "{why}");
        };
        refused(&|f| f[14] = 0x46, "IPv4 options");
        refused(&|f| f[20] |= 0x20, "more fragments");
        refused(&|f| f[21] = 1, "a fragment offset");
        refused(&|f| f[23] = 6, "TCP");
        refused(&|f| f.truncate(50), "shorter than its IP length");
        refused(&|f| f[12] = 0x08 + 1, "another EtherType");
        refused(&|f| f[24] ^= 1, "a bad IPv4 header checksum");
        refused(&|f| f[39] += 1, "a UDP length that is not the IP length's");
        // A partial UDP checksum (a veth's, a local socket's) is answered.
        let mut partial = good.clone();
        partial[40..42].copy_from_slice(&[0x14, 0xfb]);
        assert_eq!(parse(&partial, 53), Some(q), "a partial UDP checksum");
    }

    #[test]
    fn a_reply_too_large_for_its_frame_is_refused() {
        let q = parse(&client_frame(&query_to_53("2001:db8::1", "2001:db8::53", 0), &[], 0), 53).expect("a query");
        let mut out = [0u8; 100];
        assert_eq!(write_reply(&q, &[0; 39], &mut out), Err(ReplyError::TooLarge { needed: 101, room: 100 }));
        assert_eq!(write_reply(&q, &[0; 38], &mut out), Ok(100));
    }
}
