//! Batched UDP I/O: up to `BATCH` queries received with one `recvmmsg` and their answers sent
//! with one `sendmmsg`, so that under load the system-call cost is shared by a batch.
//!
//! The buffers and message headers live in a thread-local `Batch` (the headers hold raw
//! pointers, so they cannot live in a future that moves between threads); the async loop in
//! `server::serve_udp` calls `Batch::run` from `UdpSocket::try_io` whenever the socket is
//! readable.

use crate::answer::{Outcome, Transport, respond};
use crate::fast::{Fast, respond_fast};
use crate::follower::Serving;
use nix::sys::socket::{ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
use rand::rngs::SmallRng;
use std::cell::RefCell;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::RawFd;

/// Queries per system call.
pub const BATCH: usize = 32;
/// Largest datagram received; the largest UDP payload.
const DATAGRAM_BYTES_MAX: usize = 65_535;

/// One thread's receive and send state.
pub struct Batch {
    recv: MultiHeaders<SockaddrStorage>,
    send: MultiHeaders<SockaddrStorage>,
    queries: Vec<Vec<u8>>,
    answers: Vec<Vec<u8>>,
    peers: Vec<Option<SockaddrStorage>>,
    outcomes: Vec<Outcome>,
    lengths: Vec<usize>,
    from: Vec<Option<SockaddrStorage>>,
}

thread_local! {
    static BATCH_STATE: RefCell<Option<Batch>> = const { RefCell::new(None) };
}

impl Batch {
    fn new() -> Batch {
        Batch {
            recv: MultiHeaders::preallocate(BATCH, None),
            send: MultiHeaders::preallocate(BATCH, None),
            queries: (0..BATCH).map(|_| vec![0; DATAGRAM_BYTES_MAX]).collect(),
            answers: (0..BATCH).map(|_| Vec::with_capacity(1_500)).collect(),
            peers: Vec::with_capacity(BATCH),
            outcomes: Vec::with_capacity(BATCH),
            lengths: Vec::with_capacity(BATCH),
            from: Vec::with_capacity(BATCH),
        }
    }

    /// Receives what is waiting on `fd` (at most `BATCH`), answers it and sends the answers.
    /// Returns how many datagrams were received; `WouldBlock` when the socket is drained.
    pub fn run(fd: RawFd, serving: &Serving, rng: &mut SmallRng) -> std::io::Result<usize> {
        BATCH_STATE.with(|cell| {
            let mut slot = cell.borrow_mut();
            let batch = slot.get_or_insert_with(Batch::new);
            batch.once(fd, serving, rng)
        })
    }

    fn once(&mut self, fd: RawFd, serving: &Serving, rng: &mut SmallRng) -> std::io::Result<usize> {
        self.lengths.clear();
        self.from.clear();
        let mut datagrams = 0;
        {
            let mut slices: Vec<[IoSliceMut<'_>; 1]> = self.queries.iter_mut().map(|q| [IoSliceMut::new(q)]).collect();
            let received = recvmmsg(fd, &mut self.recv, slices.iter_mut(), MsgFlags::MSG_DONTWAIT, None).map_err(std::io::Error::from)?;
            for msg in received {
                datagrams += 1;
                // A datagram cut short by the buffer is not a query anyone sends; skip it.
                if msg.flags.contains(MsgFlags::MSG_TRUNC) {
                    continue;
                }
                self.lengths.push(msg.bytes);
                self.from.push(msg.address);
            }
        }
        let received = self.lengths.len();
        self.peers.clear();
        self.outcomes.clear();
        let snapshot = serving.snapshot.load();
        let mut answered = 0;
        for i in 0..received {
            let query = &self.queries[i][..self.lengths[i]];
            let out = &mut self.answers[answered];
            let outcome = match respond_fast(query, &snapshot, &serving.limits, rng, out) {
                Fast::Answered(outcome) => outcome,
                Fast::Drop => continue,
                Fast::Slow => match respond(query, &snapshot, Transport::Udp, &serving.limits, rng) {
                    Some((bytes, outcome)) => {
                        out.clear();
                        out.extend_from_slice(&bytes);
                        outcome
                    }
                    None => continue,
                },
            };
            self.peers.push(self.from[i]);
            self.outcomes.push(outcome);
            answered += 1;
        }
        drop(snapshot);
        let mut sent = 0;
        while sent < answered {
            let slices: Vec<[IoSlice<'_>; 1]> = self.answers[sent..answered].iter().map(|a| [IoSlice::new(a)]).collect();
            match sendmmsg(
                fd,
                &mut self.send,
                slices.iter(),
                &self.peers[sent..answered],
                [] as [ControlMessage<'_>; 0],
                MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(results) => {
                    let n = results.count();
                    if n == 0 {
                        break;
                    }
                    sent += n;
                }
                Err(err) => {
                    // A full send buffer or an unreachable peer: UDP answers may be lost, and
                    // the client asks again.
                    tracing::debug!(%err, unsent = answered - sent, "UDP send failed");
                    break;
                }
            }
        }
        for outcome in &self.outcomes[..sent] {
            serving.metrics.observe_query(outcome, Transport::Udp);
        }
        if datagrams < BATCH {
            // The socket had no more than this: report it empty, so the caller waits for the
            // next readiness event instead of spending a system call to learn it. (Tokio
            // keeps the readiness if a datagram arrived meanwhile.)
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        Ok(datagrams)
    }
}
