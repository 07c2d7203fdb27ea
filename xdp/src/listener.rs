//! An interface served by XDP: one AF_XDP socket and thread per receive queue, the XSKMAP, and
//! the program attached (driver mode, else generic); everything detached and closed when the
//! `Listener` is dropped.

use crate::bpf::{self, BpfError, Mode};
pub use crate::program::Destinations;
use crate::program::{self, Action};
use crate::xsk::{Copy, Queue, XskError};
pub use crate::xsk::{Counts, Handler};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// Why an interface could not be served by XDP (the listener then serves on sockets).
#[derive(Debug)]
pub enum XdpError {
    NoInterface { name: String, error: std::io::Error },
    Bpf(BpfError),
    Socket { queue: u32, error: XskError },
    Thread(std::io::Error),
}

impl std::fmt::Display for XdpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            XdpError::NoInterface { name, error } => write!(f, "no interface {name}: {error}"),
            XdpError::Bpf(err) => write!(f, "{err}"),
            XdpError::Socket { queue, error } => write!(f, "queue {queue}: {error}"),
            XdpError::Thread(err) => write!(f, "cannot start a queue's thread: {err}"),
        }
    }
}

impl std::error::Error for XdpError {}

/// An interface served by XDP.
pub struct Listener {
    /// Dropped first: the program leaves the interface before the sockets close.
    _link: OwnedFd,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<u64>>,
    _program: OwnedFd,
    _map: Arc<OwnedFd>,
    /// How the program is attached and how the sockets move frames.
    pub mode: Mode,
    pub copy: Copy,
}

impl Listener {
    /// Serves UDP port `port` at `destinations` on interface `name` (other datagrams go to the
    /// kernel): `make(queue)` gives each queue's `Handler`. The interface's MTU is read once,
    /// here: an answer that would make a larger IP packet is not sent as it is
    /// (`Handler::answer`'s `room`).
    pub fn start<H: Handler>(
        name: &str,
        port: u16,
        destinations: &Destinations,
        mut make: impl FnMut(u32) -> H,
    ) -> Result<Listener, XdpError> {
        let ifindex = ifindex(name)?;
        let queues = rx_queues(name);
        let mtu = mtu(name)?;
        let map = Arc::new(bpf::xsk_map(queues).map_err(XdpError::Bpf)?);
        let program =
            bpf::load(&program::instructions(port, destinations, map.as_raw_fd(), Action::Pass), "dnsplan_dns").map_err(XdpError::Bpf)?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let mut copy = Copy::ZeroCopy;
        let stop_all = |threads: Vec<JoinHandle<u64>>, stop: &AtomicBool| {
            stop.store(true, Ordering::Relaxed);
            threads.into_iter().for_each(|t| drop(t.join()));
        };
        for queue in 0..queues {
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let (map, thread_stop) = (map.clone(), stop.clone());
            let mut handler = make(queue);
            let thread = std::thread::Builder::new()
                .name(format!("xdp-{name}-{queue}"))
                .spawn(move || {
                    // Zero-copy where the driver takes it, else copy.
                    let opened = Queue::open(ifindex, queue, Copy::ZeroCopy)
                        .map(|q| (q, Copy::ZeroCopy))
                        .or_else(|_| Queue::open(ifindex, queue, Copy::Copy).map(|q| (q, Copy::Copy)));
                    let mut q = match opened {
                        Ok((q, copy)) => match bpf::set_socket(&map, queue, &q.raw_fd()) {
                            Ok(()) => {
                                let _ = ready_tx.send(Ok(copy));
                                q
                            }
                            Err(err) => {
                                let _ = ready_tx.send(Err(XdpError::Bpf(err)));
                                return 0;
                            }
                        },
                        Err(error) => {
                            let _ = ready_tx.send(Err(XdpError::Socket { queue, error }));
                            return 0;
                        }
                    };
                    q.serve(port, mtu, &thread_stop, &mut handler)
                })
                .map_err(XdpError::Thread)?;
            threads.push(thread);
            match ready_rx.recv() {
                Ok(Ok(c)) => {
                    if c == Copy::Copy {
                        copy = Copy::Copy;
                    }
                }
                Ok(Err(err)) => {
                    stop_all(threads, &stop);
                    return Err(err);
                }
                Err(_) => {
                    stop_all(threads, &stop);
                    return Err(XdpError::Thread(std::io::Error::other("a queue's thread ended before it was ready")));
                }
            }
        }
        let attached = bpf::attach(&program, ifindex, Mode::Driver)
            .map(|link| (link, Mode::Driver))
            .or_else(|_| bpf::attach(&program, ifindex, Mode::Generic).map(|link| (link, Mode::Generic)));
        match attached {
            Ok((link, mode)) => Ok(Listener { _link: link, stop, threads, _program: program, _map: map, mode, copy }),
            Err(err) => {
                stop_all(threads, &stop);
                Err(XdpError::Bpf(err))
            }
        }
    }

    /// Detaches the program, stops the queues and returns the queries they answered.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        std::mem::take(&mut self.threads).into_iter().map(|t| t.join().unwrap_or(0)).sum()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in std::mem::take(&mut self.threads) {
            let _ = thread.join();
        }
    }
}

fn ifindex(name: &str) -> Result<u32, XdpError> {
    let c = std::ffi::CString::new(name)
        .map_err(|_| XdpError::NoInterface { name: name.to_string(), error: std::io::Error::other("a NUL in the name") })?;
    // SAFETY: `c` is a NUL-terminated string that lives through the call.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        return Err(XdpError::NoInterface { name: name.to_string(), error: std::io::Error::last_os_error() });
    }
    Ok(index)
}

/// Runs `request` on an `ifreq` naming interface `name`, `fill` having set its union first;
/// the `ifreq` after the call, or the system's error.
fn ifreq_ioctl(name: &str, request: libc::c_ulong, fill: impl FnOnce(&mut libc::ifreq)) -> std::io::Result<libc::ifreq> {
    // SAFETY: `ifreq` is plain data; zeroed is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes().take(libc::IFNAMSIZ - 1)) {
        *dst = src as libc::c_char;
    }
    fill(&mut ifr);
    // SAFETY: a plain datagram socket, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `ifr` names the interface; what `fill` put in its union is the request's
    // argument (a value, or a pointer to memory that outlives the call, as `rx_queues`'s).
    let ret = unsafe { libc::ioctl(fd, request, &mut ifr) };
    let error = std::io::Error::last_os_error();
    // SAFETY: `fd` is the socket opened above, closed once.
    unsafe { libc::close(fd) };
    if ret < 0 { Err(error) } else { Ok(ifr) }
}

/// The MTU of interface `name` (`SIOCGIFMTU`).
fn mtu(name: &str) -> Result<usize, XdpError> {
    const SIOCGIFMTU: libc::c_ulong = 0x8921;
    let ifr = ifreq_ioctl(name, SIOCGIFMTU, |_| {}).map_err(|error| XdpError::NoInterface { name: name.to_string(), error })?;
    // SAFETY: `SIOCGIFMTU` answered, so the union holds the MTU (every field is plain data).
    let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
    Ok(usize::try_from(mtu).unwrap_or(0))
}

/// The receive queues of interface `name` (`ETHTOOL_GCHANNELS`: the combined and receive-only
/// channels), 1 when the driver does not say.
fn rx_queues(name: &str) -> u32 {
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    // struct ethtool_channels: cmd, max_rx, max_tx, max_other, max_combined, rx_count,
    // tx_count, other_count, combined_count.
    let mut channels = [0u32; 9];
    channels[0] = ETHTOOL_GCHANNELS;
    let asked = ifreq_ioctl(name, SIOCETHTOOL, |ifr| ifr.ifr_ifru.ifru_data = channels.as_mut_ptr().cast());
    if asked.is_err() { 1 } else { (channels[5] + channels[8]).max(1) }
}
