//! dnsplan's AF_XDP path for UDP queries (Linux): an XDP program sends the UDP datagrams to the
//! DNS port from an interface's receive queues to AF_XDP sockets, whose frames the authority
//! answers with the same fast path as its sockets.
//!
//! The workspace forbids unsafe code; this crate is where the XDP path's is, each block with
//! the reason it is sound: the `bpf(2)` calls (`bpf`). The frames are read and written by safe
//! code (`frame`), and the program is written by safe code (`program`).
//!
//! Built so far: the frames, the program, and loading, running and attaching it. Not yet: the
//! sockets and their rings, and the authority's listener on them.

pub mod bpf;
pub mod frame;
pub mod listener;
pub mod program;
pub mod xsk;
