//! dnsplan's AF_XDP path for UDP queries (Linux): an XDP program sends the UDP datagrams to the
//! DNS port from an interface's receive queues to AF_XDP sockets, whose frames the authority
//! answers with the same fast path as its sockets.
//!
//! The workspace forbids unsafe code; this crate is where the XDP path's is, each block with
//! the reason it is sound: the `bpf(2)` calls (`bpf`), the UMEM's mapping and the frames taken
//! from it (`xsk`), the interface's index and queue count (`listener`). The frames are read and
//! written by safe code (`frame`), and the program is written by safe code (`program`).
//!
//! The authority's `[dns] xdp` starts a `listener::Listener` per interface, its queues calling
//! the same answer function as the sockets (`net::udp::answer_datagram`).

pub mod bpf;
pub mod frame;
pub mod listener;
pub mod program;
pub mod xsk;
