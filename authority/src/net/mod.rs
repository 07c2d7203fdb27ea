//! The DNS listeners: sockets in, answers out, from `serving::Serving`, with transfers handed
//! to `xfr`.
//!
//! - `accept.rs`: the bounded accept loop (`dnsplan_common::accept`).
//! - `budget.rs`: how many connections fit in the open-file limit.
//! - `udp.rs`: batched UDP I/O, one thread per socket.
//! - `tcp.rs`: the DNS TCP listener.

pub mod accept;
pub mod budget;
pub mod tcp;
pub mod udp;
