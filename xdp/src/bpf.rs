//! The `bpf(2)` calls the XDP path makes: an XSKMAP created, the program loaded (the verifier's
//! log in the error when it refuses), run on a frame in the kernel for the tests
//! (`BPF_PROG_TEST_RUN`), attached to an interface as a BPF link (detached when its file
//! descriptor closes, so a process killed with SIGKILL leaves nothing attached).
//!
//! Every call fills a zeroed `union bpf_attr` image by field offset (linux/bpf.h), then makes
//! the one system call; the unsafe code is that call and the taking of the descriptor it
//! returns.

use crate::program::{Action, Insn};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_LINK_CREATE: libc::c_long = 28;

const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `enum bpf_attach_type`'s `BPF_XDP`.
const BPF_XDP: u32 = 37;

/// How an XDP program is attached (`XDP_FLAGS_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// In the driver (native XDP), where the driver supports it.
    Driver,
    /// Generic XDP, after the kernel built its socket buffer: any interface, slower.
    Generic,
}

impl Mode {
    fn flags(self) -> u32 {
        match self {
            Mode::Generic => 1 << 1,
            Mode::Driver => 1 << 2,
        }
    }
}

/// A failed `bpf(2)` call: which, the system's error, and for a refused program the
/// verifier's last lines.
#[derive(Debug)]
pub struct BpfError {
    pub call: &'static str,
    pub error: std::io::Error,
    pub verifier: Option<String>,
}

impl std::fmt::Display for BpfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bpf {}: {}", self.call, self.error)?;
        if self.error.raw_os_error() == Some(libc::EPERM) {
            write!(f, " (needs CAP_BPF and CAP_NET_ADMIN, or root)")?;
        }
        if let Some(log) = &self.verifier {
            write!(f, "; the verifier said: {log}")?;
        }
        Ok(())
    }
}

impl std::error::Error for BpfError {}

/// A zeroed `union bpf_attr`, 128 bytes (more than any call here uses: the kernel takes the
/// fields it knows and requires the rest to be zero).
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }

    fn u32(&mut self, at: usize, value: u32) -> &mut Attr {
        self.0[at..at + 4].copy_from_slice(&value.to_ne_bytes());
        self
    }

    fn u64(&mut self, at: usize, value: u64) -> &mut Attr {
        self.0[at..at + 8].copy_from_slice(&value.to_ne_bytes());
        self
    }

    fn read_u32(&self, at: usize) -> u32 {
        u32::from_ne_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
    }

    /// Makes the call; a non-negative result is returned as it is.
    ///
    /// # Safety
    /// Every pointer written into the attribute must point to memory that is valid, for reads
    /// or (where the call writes) for writes, for the length written beside it, until the
    /// call returns.
    unsafe fn call(&mut self, cmd: libc::c_long, name: &'static str) -> Result<libc::c_long, BpfError> {
        let size = self.0.len() as libc::c_long;
        // SAFETY: `self.0` is a live, writable 128-byte buffer for the whole call; the pointers
        // inside it are valid per this function's contract.
        let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, self.0.as_mut_ptr(), size) };
        if ret < 0 { Err(BpfError { call: name, error: std::io::Error::last_os_error(), verifier: None }) } else { Ok(ret) }
    }

    /// As `call`, for a call that returns a new file descriptor.
    ///
    /// # Safety
    /// As `call`.
    unsafe fn call_fd(&mut self, cmd: libc::c_long, name: &'static str) -> Result<OwnedFd, BpfError> {
        // SAFETY: this function's contract is `call`'s.
        let fd = unsafe { self.call(cmd, name) }?;
        // SAFETY: a successful call of these commands returns a new descriptor that nothing
        // else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
    }
}

/// A new XSKMAP of `entries` entries (one per receive queue).
pub fn xsk_map(entries: u32) -> Result<OwnedFd, BpfError> {
    let mut attr = Attr::new();
    attr.u32(0, BPF_MAP_TYPE_XSKMAP).u32(4, 4).u32(8, 4).u32(12, entries);
    // SAFETY: no pointers in the attribute.
    unsafe { attr.call_fd(BPF_MAP_CREATE, "map create") }
}

/// Puts AF_XDP socket `socket` at `queue` of `map`.
pub fn set_socket(map: &OwnedFd, queue: u32, socket: &impl AsRawFd) -> Result<(), BpfError> {
    let key = queue;
    let value = socket.as_raw_fd() as u32;
    let mut attr = Attr::new();
    attr.u32(0, map.as_raw_fd() as u32).u64(8, &key as *const u32 as u64).u64(16, &value as *const u32 as u64);
    // SAFETY: `key` and `value` are live 4-byte values (the map's key and value sizes) until
    // the call returns.
    unsafe { attr.call(BPF_MAP_UPDATE_ELEM, "map update") }.map(drop)
}

/// Loads `program` as an XDP program named `name` (at most 15 bytes).
pub fn load(program: &[Insn], name: &str) -> Result<OwnedFd, BpfError> {
    let insns: Vec<u8> = program.iter().flat_map(Insn::bytes).collect();
    let license = c"Apache-2.0";
    let mut log = vec![0u8; 64 * 1024];
    let mut attr = Attr::new();
    attr.u32(0, BPF_PROG_TYPE_XDP)
        .u32(4, program.len() as u32)
        .u64(8, insns.as_ptr() as u64)
        .u64(16, license.as_ptr() as u64)
        .u32(24, 1)
        .u32(28, log.len() as u32)
        .u64(32, log.as_mut_ptr() as u64)
        .u32(68, BPF_XDP);
    let name = name.as_bytes();
    let len = name.len().min(15);
    attr.0[48..48 + len].copy_from_slice(&name[..len]);
    // SAFETY: `insns` (8 bytes an instruction, `program.len()` of them), the NUL-terminated
    // license and `log` (writable, its length given) live until the call returns.
    unsafe { attr.call_fd(BPF_PROG_LOAD, "program load") }.map_err(|mut err| {
        let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(log.len())]).into_owned();
        let tail: Vec<&str> = text.lines().rev().take(6).collect();
        err.verifier = (!tail.is_empty()).then(|| tail.into_iter().rev().collect::<Vec<_>>().join(" | "));
        err
    })
}

/// Runs `program` once in the kernel on `frame` (queue 0) and says what it returned.
pub fn test_run(program: &OwnedFd, frame: &[u8]) -> Result<Option<Action>, BpfError> {
    let mut attr = Attr::new();
    attr.u32(0, program.as_raw_fd() as u32).u32(8, frame.len() as u32).u64(16, frame.as_ptr() as u64).u32(32, 1);
    // SAFETY: `frame` is live and readable for its length until the call returns; no output
    // buffers are given.
    unsafe { attr.call(BPF_PROG_TEST_RUN, "program test run") }?;
    Ok(Action::from_code(attr.read_u32(4)))
}

/// Attaches `program` to interface `ifindex` in `mode`; detached when the returned link is
/// dropped (or the process exits).
pub fn attach(program: &OwnedFd, ifindex: u32, mode: Mode) -> Result<OwnedFd, BpfError> {
    let mut attr = Attr::new();
    attr.u32(0, program.as_raw_fd() as u32).u32(4, ifindex).u32(8, BPF_XDP).u32(12, mode.flags());
    // SAFETY: no pointers in the attribute.
    unsafe { attr.call_fd(BPF_LINK_CREATE, "link create") }
}
