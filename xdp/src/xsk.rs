//! AF_XDP sockets (xdpilone's rings over memory mapped here): one per receive queue, each with
//! its own UMEM of `FRAMES` frames, served by one thread. A frame goes round: the fill ring,
//! the receive ring with a query in it, the transmit ring with the reply written over the
//! query, the completion ring, the fill ring again. A frame that is not a query to our port
//! goes straight back to the fill ring.

use crate::frame::{self, Query};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use xdpilone::xdp::XdpDesc;
use xdpilone::{DeviceQueue, IfInfo, RingRx, RingTx, Socket, SocketConfig, Umem, UmemConfig, User};

/// Frames of one queue's UMEM.
pub const FRAMES: u32 = 4096;
/// Bytes of a frame: the smallest the kernel takes in aligned mode, more than an Ethernet
/// MTU's packet (a reply larger than the frame or the MTU is not sent: `Handler::answer`).
pub const FRAME_BYTES: u32 = 2048;
/// Entries of each ring.
const RING: u32 = 2048;
/// Descriptors handled per round.
const BATCH: usize = 64;
/// How often a queue gives its handler its counts while it serves.
const COUNTS_EVERY: Duration = Duration::from_secs(1);
/// How long a queue with nothing to read sleeps in `poll` before it looks at `stop` again.
const IDLE_POLL_MS: libc::c_int = 100;

/// How the socket moves frames (`XDP_COPY` / `XDP_ZEROCOPY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copy {
    /// The kernel copies each frame: every driver, generic XDP included.
    Copy,
    /// The driver's DMA buffers are the UMEM: drivers that support it, in driver mode.
    ZeroCopy,
}

/// An error of the AF_XDP socket calls: which, and the system's error.
#[derive(Debug)]
pub struct XskError {
    pub call: &'static str,
    pub error: String,
}

impl std::fmt::Display for XskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AF_XDP {}: {}", self.call, self.error)
    }
}

impl std::error::Error for XskError {}

fn xsk(call: &'static str) -> impl FnOnce(xdpilone::Errno) -> XskError {
    move |errno| XskError { call, error: errno.to_string() }
}

/// What one of a listener's queues does with the queries it reads (a closure taking what
/// `answer` takes is one: its batches and counts are not looked at).
pub trait Handler: Send + 'static {
    /// Called before each batch of queries read together (at most 64, arrived within
    /// microseconds): what every answer of the batch may share, such as a clock reading.
    fn batch(&mut self) {}

    /// Writes into `out` the answer to `query`, the DNS message `client` sent; `false` for no
    /// answer. `room`: the most bytes an answer can have and still leave in one frame on this
    /// interface (its MTU, the frame's size), so an answer above it is sent truncated or not
    /// at all (`Counts::too_large`).
    fn answer(&mut self, query: &[u8], client: SocketAddr, room: usize, out: &mut Vec<u8>) -> bool;

    /// The queue's counts since it was opened, given now and then (at most once a second while
    /// it serves) and once when it stops.
    fn counts(&mut self, _counts: &Counts) {}
}

impl<F: FnMut(&[u8], SocketAddr, usize, &mut Vec<u8>) -> bool + Send + 'static> Handler for F {
    fn answer(&mut self, query: &[u8], client: SocketAddr, room: usize, out: &mut Vec<u8>) -> bool {
        self(query, client, room, out)
    }
}

/// What one queue's socket lost since it was opened: the kernel's counts (`XDP_STATISTICS`;
/// zero on kernels before 5.9 for the three that need it) and ours.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Frames the kernel dropped because the receive ring was full: the queue's thread did not
    /// keep up.
    pub rx_ring_full: u64,
    /// Frames dropped because the fill ring had no free frame.
    pub fill_ring_empty: u64,
    /// Frames dropped for other reasons (a frame too large for the UMEM's frames).
    pub rx_dropped: u64,
    /// Descriptors the kernel refused (never expected: a defect of ours).
    pub invalid: u64,
    /// Replies written but not sent: the transmit ring stayed full.
    pub tx_ring_full: u64,
    /// Answers the handler gave that did not fit in `room` and were not sent.
    pub too_large: u64,
}

/// Page-aligned anonymous memory for a UMEM, unmapped when dropped.
struct Area {
    base: NonNull<u8>,
    len: usize,
}

impl Area {
    fn new(len: usize) -> std::io::Result<Area> {
        // SAFETY: an anonymous private mapping at an address of the kernel's choice; no
        // existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap gave a null address"))?;
        Ok(Area { base, len })
    }

    fn as_slice_ptr(&self) -> NonNull<[u8]> {
        NonNull::slice_from_raw_parts(self.base, self.len)
    }

    /// The frame holding UMEM address `addr`, from `addr` to the end of its frame.
    ///
    /// # Safety
    /// The caller owns the frame (it is in none of the kernel's rings) for as long as the
    /// slice is used, and holds no other slice of it.
    unsafe fn frame_mut(&mut self, addr: u64) -> Option<&mut [u8]> {
        let at = usize::try_from(addr).ok()?;
        let end = (at / FRAME_BYTES as usize + 1) * FRAME_BYTES as usize;
        if end > self.len {
            return None;
        }
        // `wrapping_add` stays in the mapping (checked above), so the pointer is in bounds.
        let start = self.base.as_ptr().wrapping_add(at);
        // SAFETY: `start..start + (end - at)` lies inside the mapping (checked above), and the
        // caller owns those bytes exclusively (this function's contract).
        Some(unsafe { std::slice::from_raw_parts_mut(start, end - at) })
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are the mapping `new` made, unmapped once; the sockets that
        // used it were dropped before (the `Queue`'s fields drop in order, `area` last).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// One receive queue's AF_XDP socket, its rings and its UMEM.
pub struct Queue {
    rx: RingRx,
    tx: RingTx,
    device: DeviceQueue,
    _user: User,
    socket: Socket,
    _umem: Umem,
    /// Frames of the UMEM in none of the kernel's rings.
    spare: Vec<u64>,
    copy: Copy,
    /// Last, so that it is unmapped after the socket is closed.
    area: Area,
}

impl Queue {
    /// A socket on queue `queue` of interface `ifindex`, bound with `copy`.
    pub fn open(ifindex: u32, queue: u32, copy: Copy) -> Result<Queue, XskError> {
        let area = Area::new((FRAMES * FRAME_BYTES) as usize).map_err(|e| XskError { call: "mmap", error: e.to_string() })?;
        let config = UmemConfig { fill_size: RING, complete_size: RING, frame_size: FRAME_BYTES, headroom: 0, flags: 0 };
        // SAFETY: the area is page-aligned (mmap), `FRAMES * FRAME_BYTES` long, and outlives the
        // UMEM: `area` is the last field of `Queue`, dropped after `_umem` and every ring.
        let umem = unsafe { Umem::new(config, area.as_slice_ptr()) }.map_err(xsk("umem register"))?;
        let mut info = IfInfo::invalid();
        info.from_ifindex(ifindex).map_err(xsk("interface"))?;
        info.set_queue(queue);
        let socket = Socket::with_shared(&info, &umem).map_err(xsk("socket"))?;
        let device = umem.fq_cq(&socket).map_err(xsk("fill and completion rings"))?;
        let bind_flags = SocketConfig::XDP_BIND_NEED_WAKEUP
            | match copy {
                Copy::Copy => SocketConfig::XDP_BIND_COPY,
                Copy::ZeroCopy => SocketConfig::XDP_BIND_ZEROCOPY,
            };
        let user = umem
            .rx_tx(&socket, &SocketConfig { rx_size: NonZeroU32::new(RING), tx_size: NonZeroU32::new(RING), bind_flags })
            .map_err(xsk("receive and transmit rings"))?;
        let rx = user.map_rx().map_err(xsk("receive ring map"))?;
        let tx = user.map_tx().map_err(xsk("transmit ring map"))?;
        umem.bind(&user).map_err(xsk("bind"))?;
        let spare = (0..FRAMES).map(|i| u64::from(i) * u64::from(FRAME_BYTES)).collect();
        let mut queue = Queue { rx, tx, device, _user: user, socket, _umem: umem, spare, copy, area };
        queue.refill();
        Ok(queue)
    }

    /// The socket's descriptor, for the XSKMAP (borrowed: the queue keeps it).
    pub fn raw_fd(&self) -> libc::c_int {
        self.rx.as_raw_fd()
    }

    /// Frames back from the completion ring, then as many spare frames as fit into the fill
    /// ring.
    fn refill(&mut self) {
        {
            let mut done = self.device.complete(RING);
            while let Some(addr) = done.read() {
                self.spare.push(addr);
            }
            done.release();
        }
        if self.spare.is_empty() {
            return;
        }
        let put = {
            let mut fill = self.device.fill(self.spare.len() as u32);
            let put = fill.insert(self.spare.iter().rev().copied()) as usize;
            fill.commit();
            put
        };
        let keep = self.spare.len() - put;
        self.spare.truncate(keep);
        if self.device.needs_wakeup() {
            self.device.wake();
        }
    }

    /// Serves until `stop` is set: every query to `port` read is given to `handler` and its
    /// answer sent back in the same frame, if the IP packet fits `mtu`. Returns the queries
    /// answered.
    pub fn serve(&mut self, port: u16, mtu: usize, stop: &AtomicBool, handler: &mut impl Handler) -> u64 {
        let mut answered = 0;
        let mut out = Vec::with_capacity(FRAME_BYTES as usize);
        let mut descs = [XdpDesc { addr: 0, len: 0, options: 0 }; BATCH];
        let mut replies = Vec::with_capacity(BATCH);
        // The largest frame a reply can be: the UMEM's frame, the interface's MTU.
        let frame_max = (FRAME_BYTES as usize).min(mtu + frame::ETH_BYTES);
        let mut counts = Counts::default();
        let mut reported = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if reported.elapsed() >= COUNTS_EVERY {
                self.report(&mut counts, handler);
                reported = Instant::now();
            }
            self.refill();
            let mut count = 0;
            {
                let mut received = self.rx.receive(BATCH as u32);
                while let Some(desc) = received.read() {
                    descs[count] = desc;
                    count += 1;
                }
                received.release();
            }
            if count == 0 {
                // In copy mode each wake-up sends at most a few dozen frames (the kernel's
                // batch): replies still queued are pushed out before sleeping, or they would
                // wait for the next query to arrive.
                if self.tx.pending() > 0 {
                    self.push_out();
                } else {
                    self.wait();
                }
                continue;
            }
            handler.batch();
            replies.clear();
            for desc in &descs[..count] {
                // SAFETY: a descriptor read from the receive ring hands its frame to us until we
                // give it back to a ring; `frame_mut` is called once per descriptor.
                let reply = unsafe { self.area.frame_mut(desc.addr) }.and_then(|f| {
                    let received = f.get(..desc.len as usize)?;
                    let query: Query = frame::parse(received, port)?;
                    let client = SocketAddr::new(query.src, query.src_port);
                    let room = frame_max.saturating_sub(query.reply_header_bytes());
                    out.clear();
                    if !handler.answer(query.payload(received), client, room, &mut out) {
                        return None;
                    }
                    if out.len() > room {
                        counts.too_large += 1;
                        return None;
                    }
                    frame::write_reply(&query, &out, f).ok()
                });
                match reply {
                    Some(len) => replies.push(XdpDesc { addr: desc.addr, len: len as u32, options: 0 }),
                    None => self.spare.push(desc.addr),
                }
            }
            // A reservation may give fewer slots than free (xdpilone serves it from its cached
            // view of the kernel's head and looks again only when that shows none), so what
            // was not taken is offered again, after pushing the ring out when none was.
            let mut sent = 0;
            for _ in 0..4 {
                if sent == replies.len() {
                    break;
                }
                let taken = {
                    let mut sending = self.tx.transmit((replies.len() - sent) as u32);
                    let taken = sending.insert(replies[sent..].iter().copied()) as usize;
                    sending.commit();
                    taken
                };
                sent += taken;
                if taken == 0 {
                    self.push_out();
                }
            }
            answered += sent as u64;
            // A reply the transmit ring still has no room for is dropped (the client asks
            // again); its frame goes back to the spare ones.
            counts.tx_ring_full += (replies.len() - sent) as u64;
            self.spare.extend(replies[sent..].iter().map(|d| d.addr));
            if sent > 0 {
                self.push_out();
            }
        }
        self.report(&mut counts, handler);
        answered
    }

    /// Gives `handler` the queue's counts: the kernel's, read now, and ours in `counts`.
    fn report(&self, counts: &mut Counts, handler: &mut impl Handler) {
        if let Ok(kernel) = self.device.statistics_v2() {
            counts.rx_ring_full = kernel.rx_ring_full;
            counts.fill_ring_empty = kernel.rx_fill_ring_empty_descs;
            counts.rx_dropped = kernel.rx_dropped;
            counts.invalid = kernel.rx_invalid_descs + kernel.tx_invalid_descs;
        }
        handler.counts(counts);
    }

    /// Has the kernel send what the transmit ring holds. In copy mode a wake-up (`sendto`)
    /// sends at most the kernel's batch (32 frames) there and then, so it is repeated until
    /// the ring is empty: a reply left in it would wait for the next query, and a full ring
    /// drops replies. In zero-copy mode the driver sends on its own once woken.
    fn push_out(&mut self) {
        match self.copy {
            Copy::Copy => {
                // Bounded: each call sends at least one frame or the ring is empty.
                for _ in 0..RING {
                    if self.tx.pending() == 0 {
                        break;
                    }
                    self.tx.wake();
                }
            }
            Copy::ZeroCopy => {
                if self.tx.needs_wakeup() {
                    self.tx.wake();
                }
            }
        }
    }

    /// Sleeps until the receive ring has something, at most `IDLE_POLL_MS`.
    fn wait(&self) {
        let _ = &self.socket;
        let mut fd = libc::pollfd { fd: self.rx.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid `pollfd` for the duration of the call.
        unsafe { libc::poll(&mut fd, 1, IDLE_POLL_MS) };
    }
}
