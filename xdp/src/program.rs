//! The XDP program, written here instruction by instruction (no unsafe code): a UDP datagram
//! to our port and one of our addresses (`Destinations`: the listener's, or any of a family it
//! listens on the wildcard of), IPv4 without options and not a fragment or IPv6 without
//! extension headers, is redirected to the AF_XDP socket of the queue it arrived on;
//! everything else (ARP, ICMP, TCP, other ports, other addresses, a family not listened on,
//! what it cannot read) goes on to the kernel, as does a datagram of a queue without a socket.
//!
//! Why by hand rather than C built with clang's BPF target and loaded by aya or libbpf: the
//! program is 35 instructions for the wildcards, and the toolchain that builds this workspace
//! has no BPF target;
//! the kernel's verifier checks it at every load and `tests/program.rs` runs it in the kernel
//! (`BPF_PROG_TEST_RUN`) on each kind of frame.

/// What an XDP program returns for a frame (`enum xdp_action`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Action {
    Aborted = 0,
    Drop = 1,
    Pass = 2,
    Tx = 3,
    Redirect = 4,
}

impl Action {
    pub fn from_code(code: u32) -> Option<Action> {
        [Action::Aborted, Action::Drop, Action::Pass, Action::Tx, Action::Redirect].into_iter().find(|a| *a as u32 == code)
    }
}

/// One eBPF instruction as the kernel reads it: opcode, registers (source in the high nibble),
/// offset and immediate, little-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    pub fn bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = (self.src << 4) | (self.dst & 0x0f);
        b[2..4].copy_from_slice(&self.off.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_le_bytes());
        b
    }
}

// Opcodes (linux/bpf_common.h, linux/bpf.h).
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const LDX_B: u8 = 0x71;
const MOV64_X: u8 = 0xbf;
const MOV64_K: u8 = 0xb7;
const ADD64_K: u8 = 0x07;
const AND64_K: u8 = 0x57;
const JGT_X: u8 = 0x2d;
const JEQ_K: u8 = 0x15;
const JNE_K: u8 = 0x55;
const JA: u8 = 0x05;
/// The 32-bit compares (`BPF_JMP32`): an address word loaded zero-extended is compared with
/// an immediate the 64-bit compares would sign-extend.
const JEQ32_K: u8 = 0x16;
const JNE32_K: u8 = 0x56;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const LD_IMM64: u8 = 0x18;
/// `src` of a 64-bit immediate load whose immediate is a map's file descriptor.
const PSEUDO_MAP_FD: u8 = 1;
/// `bpf_redirect_map` (linux/bpf.h's helper list).
const HELPER_REDIRECT_MAP: i32 = 51;

// Offsets in `struct xdp_md`.
const MD_DATA: i16 = 0;
const MD_DATA_END: i16 = 4;
const MD_RX_QUEUE: i16 = 16;

/// A jump target while the program is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Label {
    Ipv4,
    Ipv6,
    /// The IPv4 destination is one of ours.
    Ipv4Ours,
    /// The IPv6 destination is one of ours.
    Ipv6Ours,
    /// The IPv6 destination is not the `n`th address: try the next.
    Ipv6Next(usize),
    Redirect,
    Pass,
}

/// Which destinations of one address family the program takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Take<A> {
    /// None: the family is not listened on.
    Nothing,
    /// Any address (a wildcard listen address).
    Any,
    /// These addresses.
    Only(Vec<A>),
}

/// The destination addresses the program takes, by family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destinations {
    pub v4: Take<std::net::Ipv4Addr>,
    pub v6: Take<std::net::Ipv6Addr>,
}

impl Destinations {
    /// Any address of either family.
    pub fn any() -> Destinations {
        Destinations { v4: Take::Any, v6: Take::Any }
    }

    /// The addresses a server listens on: a wildcard (`0.0.0.0`, `::`) takes its whole
    /// family; a family with no address is not taken.
    pub fn listening_on(addresses: &[std::net::IpAddr]) -> Destinations {
        fn family<A: Copy + PartialEq>(all: impl Iterator<Item = (A, bool)>) -> Take<A> {
            let mut only = Vec::new();
            for (address, wildcard) in all {
                if wildcard {
                    return Take::Any;
                }
                if !only.contains(&address) {
                    only.push(address);
                }
            }
            if only.is_empty() { Take::Nothing } else { Take::Only(only) }
        }
        use std::net::IpAddr;
        Destinations {
            v4: family(addresses.iter().filter_map(|a| match a {
                IpAddr::V4(v4) => Some((*v4, v4.is_unspecified())),
                IpAddr::V6(_) => None,
            })),
            v6: family(addresses.iter().filter_map(|a| match a {
                IpAddr::V6(v6) => Some((*v6, v6.is_unspecified())),
                IpAddr::V4(_) => None,
            })),
        }
    }
}

/// A 32-bit word of the frame as a 32-bit load reads it (the machine's order), for a compare.
fn word(bytes: [u8; 4]) -> i32 {
    i32::from_le_bytes(bytes)
}

/// The steps that go on to `ours` when the IPv4 destination (`r2` the frame) is taken, else pass.
fn ipv4_destination(take: &Take<std::net::Ipv4Addr>, at: i16) -> Vec<Step> {
    match take {
        Take::Any => Vec::new(),
        Take::Nothing => vec![jump(JA, 0, 0, 0, Label::Pass)],
        Take::Only(addresses) => {
            let mut steps = vec![op(LDX_W, 5, 2, at, 0)];
            steps.extend(addresses.iter().map(|a| jump(JEQ32_K, 5, 0, word(a.octets()), Label::Ipv4Ours)));
            steps.push(jump(JA, 0, 0, 0, Label::Pass));
            steps.push(Step::At(Label::Ipv4Ours));
            steps
        }
    }
}

/// As `ipv4_destination`, for IPv6: each address compared a word at a time.
fn ipv6_destination(take: &Take<std::net::Ipv6Addr>, at: i16) -> Vec<Step> {
    match take {
        Take::Any => Vec::new(),
        Take::Nothing => vec![jump(JA, 0, 0, 0, Label::Pass)],
        Take::Only(addresses) => {
            let mut steps = Vec::new();
            for (n, address) in addresses.iter().enumerate() {
                let octets = address.octets();
                for (i, chunk) in octets.chunks_exact(4).enumerate() {
                    let bytes = [chunk[0], chunk[1], chunk[2], chunk[3]];
                    steps.push(op(LDX_W, 5, 2, at + 4 * i as i16, 0));
                    steps.push(jump(JNE32_K, 5, 0, word(bytes), Label::Ipv6Next(n)));
                }
                steps.push(jump(JA, 0, 0, 0, Label::Ipv6Ours));
                steps.push(Step::At(Label::Ipv6Next(n)));
            }
            steps.push(jump(JA, 0, 0, 0, Label::Pass));
            steps.push(Step::At(Label::Ipv6Ours));
            steps
        }
    }
}

enum Step {
    Op(Insn),
    /// A conditional (or, with `JA`, unconditional) jump to a label.
    Jump {
        code: u8,
        dst: u8,
        src: u8,
        imm: i32,
        to: Label,
    },
    At(Label),
}

fn op(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Step {
    Step::Op(Insn { code, dst, src, off, imm })
}

fn jump(code: u8, dst: u8, src: u8, imm: i32, to: Label) -> Step {
    Step::Jump { code, dst, src, imm, to }
}

/// The program for UDP port `port` at `destinations`, redirecting to the XSKMAP whose file
/// descriptor is `xsk_map_fd`, keyed by receive queue. `fallback` is what a frame for a queue
/// without a socket gets: `Pass` in service (the kernel's socket path answers it), `Drop` in
/// the tests that tell "redirected" from "passed" without a socket.
pub fn instructions(port: u16, destinations: &Destinations, xsk_map_fd: i32, fallback: Action) -> Vec<Insn> {
    use crate::frame::{ETH_BYTES, IPV4_BYTES, IPV6_BYTES, UDP_BYTES};
    // A 16-bit load reads the frame's bytes in the machine's order; the constants compared
    // with it are written so, as the network's big-endian bytes read little-endian.
    let net16 = |v: u16| i32::from(u16::from_le_bytes(v.to_be_bytes()));
    let eth = ETH_BYTES as i16;
    let v4_end = (ETH_BYTES + IPV4_BYTES + UDP_BYTES) as i32;
    let v6_end = (ETH_BYTES + IPV6_BYTES + UDP_BYTES) as i32;
    // Registers: r1 context (then helper arguments), r6 the context kept, r2 data, r3
    // data_end, r4 a bound, r5 a field.
    let mut steps = vec![
        op(MOV64_X, 6, 1, 0, 0),
        op(LDX_W, 2, 1, MD_DATA, 0),
        op(LDX_W, 3, 1, MD_DATA_END, 0),
        op(MOV64_X, 4, 2, 0, 0),
        op(ADD64_K, 4, 0, 0, v4_end),
        jump(JGT_X, 4, 3, 0, Label::Pass),
        op(LDX_H, 5, 2, 12, 0),
        jump(JEQ_K, 5, 0, net16(0x0800), Label::Ipv4),
        jump(JEQ_K, 5, 0, net16(0x86dd), Label::Ipv6),
        jump(JA, 0, 0, 0, Label::Pass),
        Step::At(Label::Ipv4),
        // Version 4 and a 20-byte header; UDP; flags and fragment offset: MF clear, offset 0.
        op(LDX_B, 5, 2, eth, 0),
        jump(JNE_K, 5, 0, 0x45, Label::Pass),
        op(LDX_B, 5, 2, eth + 9, 0),
        jump(JNE_K, 5, 0, 17, Label::Pass),
        op(LDX_H, 5, 2, eth + 6, 0),
        op(AND64_K, 5, 0, 0, net16(0x3fff)),
        jump(JNE_K, 5, 0, 0, Label::Pass),
        op(LDX_H, 5, 2, eth + IPV4_BYTES as i16 + 2, 0),
        jump(JNE_K, 5, 0, net16(port), Label::Pass),
    ];
    // The destination (IPv4 header byte 16) is ours.
    steps.extend(ipv4_destination(&destinations.v4, eth + 16));
    steps.extend([
        jump(JA, 0, 0, 0, Label::Redirect),
        Step::At(Label::Ipv6),
        op(MOV64_X, 4, 2, 0, 0),
        op(ADD64_K, 4, 0, 0, v6_end),
        jump(JGT_X, 4, 3, 0, Label::Pass),
        // Next header UDP (no extension headers).
        op(LDX_B, 5, 2, eth + 6, 0),
        jump(JNE_K, 5, 0, 17, Label::Pass),
        op(LDX_H, 5, 2, eth + IPV6_BYTES as i16 + 2, 0),
        jump(JNE_K, 5, 0, net16(port), Label::Pass),
    ]);
    // The destination (IPv6 header byte 24) is ours.
    steps.extend(ipv6_destination(&destinations.v6, eth + 24));
    steps.extend([
        Step::At(Label::Redirect),
        op(LDX_W, 2, 6, MD_RX_QUEUE, 0),
        op(LD_IMM64, 1, PSEUDO_MAP_FD, 0, xsk_map_fd),
        op(0, 0, 0, 0, 0),
        op(MOV64_K, 3, 0, 0, fallback as i32),
        op(CALL, 0, 0, 0, HELPER_REDIRECT_MAP),
        op(EXIT, 0, 0, 0, 0),
        Step::At(Label::Pass),
        op(MOV64_K, 0, 0, 0, Action::Pass as i32),
        op(EXIT, 0, 0, 0, 0),
    ]);
    resolve(&steps)
}

/// The instructions with each jump's offset counted from the instruction after it.
fn resolve(steps: &[Step]) -> Vec<Insn> {
    let mut at = Vec::new();
    let mut slot = 0i16;
    for step in steps {
        match step {
            Step::At(label) => at.push((*label, slot)),
            _ => slot += 1,
        }
    }
    let target = |label: Label| at.iter().find(|(l, _)| *l == label).map(|(_, s)| *s);
    let mut out = Vec::new();
    for step in steps {
        match *step {
            Step::Op(insn) => out.push(insn),
            Step::Jump { code, dst, src, imm, to } => {
                // Invariant: every label jumped to is placed above.
                let to = target(to).expect("a label of this program");
                let off = to - out.len() as i16 - 1;
                out.push(Insn { code, dst, src, off, imm });
            }
            Step::At(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_land_on_their_labels_and_the_program_ends_in_exit() {
        let program = instructions(53, &Destinations::any(), 7, Action::Pass);
        assert_eq!(program.len(), 35, "the count ARCHITECTURE and the module give");
        assert_eq!(program.last().map(|i| i.code), Some(EXIT));
        for (i, insn) in program.iter().enumerate() {
            if matches!(insn.code, JGT_X | JEQ_K | JNE_K | JA | JEQ32_K | JNE32_K) {
                let to = i as i64 + 1 + i64::from(insn.off);
                assert!((0..program.len() as i64).contains(&to), "jump {i} to {to}");
                assert!(to > i as i64, "jumps go forward (the verifier refuses loops)");
            }
        }
        let map = program.iter().find(|i| i.code == LD_IMM64).expect("the map load");
        assert_eq!((map.src, map.imm), (PSEUDO_MAP_FD, 7));
        assert_eq!(Insn { code: 0xb7, dst: 0, src: 0, off: 0, imm: 2 }.bytes(), [0xb7, 0, 0, 0, 2, 0, 0, 0]);
    }

    #[test]
    fn destinations_follow_the_listen_addresses() {
        let parse = |list: &[&str]| Destinations::listening_on(&list.iter().map(|a| a.parse().expect("address")).collect::<Vec<_>>());
        assert_eq!(parse(&["0.0.0.0", "::"]), Destinations::any());
        assert_eq!(parse(&["192.0.2.1", "0.0.0.0"]).v4, Take::Any, "a wildcard takes its family");
        let one = parse(&["192.0.2.1", "192.0.2.1", "192.0.2.2"]);
        assert_eq!(one.v4, Take::Only(vec!["192.0.2.1".parse().expect("a"), "192.0.2.2".parse().expect("a")]));
        assert_eq!(one.v6, Take::Nothing, "IPv6 not listened on");
        // Every jump of a program with addresses of both families lands inside it.
        let both = parse(&["192.0.2.1", "2001:db8::1", "2001:db8::2"]);
        let program = instructions(53, &both, 7, Action::Pass);
        for (i, insn) in program.iter().enumerate() {
            if matches!(insn.code, JGT_X | JEQ_K | JNE_K | JA | JEQ32_K | JNE32_K) {
                let to = i as i64 + 1 + i64::from(insn.off);
                assert!(to > i as i64 && to < program.len() as i64, "jump {i} to {to}");
            }
        }
    }
}
