//! The XDP program in the kernel: loaded (the verifier accepts it), run on each kind of frame
//! (`BPF_PROG_TEST_RUN`), attached to a veth interface in a network namespace of the test's own
//! and detached when its link is dropped. Needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN)
//! and `ip` (iproute2): without them each test fails and says which is missing.

use dnsplan_xdp::bpf::{self, Mode};
use dnsplan_xdp::frame::{Query, write_reply};
use dnsplan_xdp::program::{Action, Destinations, instructions};
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::process::Command;

const PORT: u16 = 5353;

/// The program with `Drop` for a queue without a socket: in a test run no socket is bound, so
/// `Drop` means "redirected" and `Pass` means "left to the kernel".
fn program() -> (OwnedFd, OwnedFd) {
    program_for(&Destinations::any())
}

/// As `program`, taking `destinations` only.
fn program_for(destinations: &Destinations) -> (OwnedFd, OwnedFd) {
    let map = bpf::xsk_map(4).unwrap_or_else(|err| panic!("{err}"));
    use std::os::fd::AsRawFd;
    let prog =
        bpf::load(&instructions(PORT, destinations, map.as_raw_fd(), Action::Drop), "dnsplan_test").unwrap_or_else(|err| panic!("{err}"));
    (map, prog)
}

/// A frame from a client at `client` to our `PORT` at `server`, with a 12-byte payload.
fn query_frame(client: &str, server: &str) -> Vec<u8> {
    let (client, server): (IpAddr, IpAddr) = (client.parse().expect("address"), server.parse().expect("address"));
    // A reply from "client" to "server" is a frame from the client to the server.
    let from = Query {
        src_mac: [2; 6],
        dst_mac: [4; 6],
        src: server,
        dst: client,
        src_port: PORT,
        dst_port: 40000,
        payload_at: 0,
        payload_end: 0,
    };
    let mut out = vec![0u8; 200];
    let len = write_reply(&from, &[0x12; 12], &mut out).expect("fits");
    out.truncate(len);
    out
}

#[test]
fn the_program_redirects_udp_to_our_port_and_passes_everything_else() {
    let (_map, prog) = program();
    let run = |frame: &[u8]| bpf::test_run(&prog, frame).unwrap_or_else(|err| panic!("{err}"));
    let v4 = query_frame("192.0.2.1", "192.0.2.53");
    let v6 = query_frame("2001:db8::1", "2001:db8::53");
    assert_eq!(run(&v4), Some(Action::Drop), "IPv4 UDP to our port is redirected");
    assert_eq!(run(&v6), Some(Action::Drop), "IPv6 UDP to our port is redirected");
    let changed = |frame: &[u8], at: usize, byte: u8| {
        let mut f = frame.to_vec();
        f[at] = byte;
        f
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (changed(&v4, 37, (PORT as u8).wrapping_add(1)), "another port (IPv4)"),
        (changed(&v6, 57, (PORT as u8).wrapping_add(1)), "another port (IPv6)"),
        (changed(&v4, 14, 0x46), "IPv4 with options"),
        (changed(&v4, 20, 0x20), "IPv4, more fragments"),
        (changed(&v4, 21, 0x01), "IPv4, a fragment offset"),
        (changed(&v4, 23, 6), "IPv4 TCP"),
        (changed(&v6, 20, 0), "IPv6 with a hop-by-hop header"),
        (changed(&v4, 12, 0x08).iter().copied().enumerate().map(|(i, b)| if i == 13 { 0x06 } else { b }).collect(), "ARP"),
        (v4[..41].to_vec(), "a frame shorter than its headers (IPv4)"),
        (v6[..61].to_vec(), "a frame shorter than its headers (IPv6)"),
    ];
    for (frame, what) in cases {
        assert_eq!(run(&frame), Some(Action::Pass), "{what}");
    }
}

/// With listen addresses, only datagrams to them are taken: another address of the same
/// family, a family not listened on, go to the kernel. Addresses whose words have the high bit
/// set (192.x, fd99::, 2001:db8::…:ffff) check the 32-bit compares.
#[test]
fn the_program_takes_only_the_addresses_listened_on() {
    let parse = |list: &[&str]| list.iter().map(|a| a.parse().expect("address")).collect::<Vec<IpAddr>>();
    for (listen, taken, passed) in [
        (
            parse(&["192.0.2.53", "2001:db8::53", "2001:db8::ffff:ffff"]),
            vec![("192.0.2.1", "192.0.2.53"), ("2001:db8::1", "2001:db8::53"), ("2001:db8::1", "2001:db8::ffff:ffff")],
            vec![("192.0.2.1", "192.0.2.54"), ("192.0.2.1", "10.0.0.53"), ("2001:db8::1", "2001:db8::54"), ("2001:db8::1", "fd99::53")],
        ),
        (
            parse(&["10.0.0.1", "172.16.0.1"]),
            vec![("192.0.2.1", "10.0.0.1"), ("192.0.2.1", "172.16.0.1")],
            vec![("192.0.2.1", "10.0.0.2"), ("2001:db8::1", "2001:db8::53")],
        ),
        (parse(&["0.0.0.0", "fd99::1"]), vec![("192.0.2.1", "198.51.100.7"), ("fd99::2", "fd99::1")], vec![("fd99::2", "fd99::3")]),
    ] {
        let (_map, prog) = program_for(&Destinations::listening_on(&listen));
        let run = |frame: &[u8]| bpf::test_run(&prog, frame).unwrap_or_else(|err| panic!("{err}"));
        for (client, server) in taken {
            assert_eq!(run(&query_frame(client, server)), Some(Action::Drop), "listening on {listen:?}: to {server} is redirected");
        }
        for (client, server) in passed {
            assert_eq!(run(&query_frame(client, server)), Some(Action::Pass), "listening on {listen:?}: to {server} is the kernel's");
        }
    }
}

/// Runs `args` with `ip`, failing the test with its error output.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|err| panic!("ip (iproute2) is needed: {err}"));
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// A network namespace of the test's own, removed when dropped.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn the_program_attaches_to_a_veth_and_leaves_with_its_link() {
    let ns = Netns(format!("dnsplan-xdp-{}", std::process::id()));
    ip(&["netns", "add", &ns.0]);
    ip(&["-n", &ns.0, "link", "add", "xa", "type", "veth", "peer", "name", "xb"]);
    ip(&["-n", &ns.0, "link", "set", "xa", "up"]);
    ip(&["-n", &ns.0, "link", "set", "xb", "up"]);
    let shows_xdp = || {
        let out = Command::new("ip").args(["-n", &ns.0, "-d", "link", "show", "xa"]).output().expect("ip");
        String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
    };
    let path = format!("/run/netns/{}", ns.0);
    for mode in [Mode::Driver, Mode::Generic] {
        // The link is made from a thread inside the namespace (setns changes only the thread).
        let path = path.clone();
        let link = std::thread::spawn(move || {
            enter_netns(&path);
            let (map, prog) = program();
            let ifindex = ifindex("xa");
            let link = bpf::attach(&prog, ifindex, mode).unwrap_or_else(|err| panic!("{mode:?}: {err}"));
            (map, prog, link)
        })
        .join()
        .expect("the namespace thread");
        assert!(shows_xdp(), "{mode:?}: ip link shows the program on xa");
        drop(link);
        assert!(!shows_xdp(), "{mode:?}: the program leaves with its link");
    }
}

/// Moves the calling thread into the network namespace at `path`.
fn enter_netns(path: &str) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap_or_else(|err| panic!("{path}: {err}"));
    // SAFETY: `file` is an open namespace file for the duration of the call; setns changes
    // only this thread's namespace.
    let ret = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(ret, 0, "setns {path}: {} (needs CAP_SYS_ADMIN)", std::io::Error::last_os_error());
}

/// The index of interface `name` in this thread's namespace.
fn ifindex(name: &str) -> u32 {
    let name = std::ffi::CString::new(name).expect("a name");
    // SAFETY: `name` is a NUL-terminated string that lives through the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(index, 0, "no interface {name:?}: {}", std::io::Error::last_os_error());
    index
}
