//! The status output's pure parts: the unmanaged line's length and the secondaries' states.

use super::*;

/// Teeth: with every name joined (as status did), the line for 2,002 names is 44,209 bytes
/// and this fails.
#[test]
fn the_unmanaged_line_stays_short_however_many_there_are() {
    let names: Vec<EndpointName> = (0..2_002).map(|i| EndpointName::parse(&format!("e{i:05}.example.test.")).expect("name")).collect();
    let line = unmanaged_line(&names);
    assert!(line.len() < 400, "{} bytes", line.len());
    assert!(line.contains("2002 endpoint(s)") && line.contains("e00000.example.test.") && line.contains("and 1997 more"), "{line}");
    assert!(line.contains("dnsplan endpoints list"), "{line}");
    let one = unmanaged_line(&names[..1]);
    assert!(!one.contains("more"), "{one}");
}

/// The secondaries of `/v1/status` read into the status table: current (its zone read back
/// and equal at our serial), behind (with the serial it was told of), unreachable (with
/// why), at our serial but not known equal (not read back, differing, unreadable); and the
/// status the authority writes is the one the CLI reads.
///
/// Teeth: with `is_current` looking at the serial alone (`!behind`), the row of 5304 (at
/// our serial, its zone never read back) read "current" and the test failed there.
#[test]
fn secondaries_read_and_say_their_state() {
    let secondary = |port: u16, notified: Option<u32>, serial: Option<u32>, behind: bool| SecondaryStatus {
        address: SocketAddr::from(([127, 0, 0, 1], port)),
        notified_serial: notified,
        serial,
        behind,
        last_error: None,
        content_equal_serial: None,
        content_differs: None,
        content_error: None,
    };
    let secondaries = vec![
        SecondaryStatus { content_equal_serial: Some(12), ..secondary(5301, Some(12), Some(12), false) },
        secondary(5302, Some(12), Some(11), true),
        SecondaryStatus { last_error: Some("connection refused".into()), ..secondary(5303, None, None, true) },
        SecondaryStatus { content_equal_serial: Some(11), ..secondary(5304, Some(12), Some(12), false) },
        SecondaryStatus {
            content_differs: Some("at serial 12: 1 of our records missing, 1 not ours".into()),
            ..secondary(5305, Some(12), Some(12), false)
        },
        SecondaryStatus { content_error: Some("the AXFR was answered REFUSED".into()), ..secondary(5306, Some(12), Some(12), false) },
    ];
    let status = Status {
        latest: Generation(3),
        paused: None,
        serial: 12,
        applied_changes: 12,
        managed_endpoints: 0,
        dns: Vec::new(),
        id: String::new(),
        authorities: Vec::new(),
        heartbeats: Vec::new(),
        endpoints: BTreeMap::new(),
        endpoints_more: false,
        secondaries,
    };
    // Through JSON, as the CLI reads it from the authority.
    let read: Status = serde_json::from_value(serde_json::to_value(&status).expect("writes")).expect("reads");
    assert_eq!(read, status);
    let rows: Vec<Vec<String>> = read.secondaries.iter().map(|s| secondary_row(s, read.serial)).collect();
    assert_eq!(rows[0], ["127.0.0.1:5301", "12", "current"]);
    assert_eq!(rows[1], ["127.0.0.1:5302", "11", "BEHIND (notified of 12)"]);
    assert_eq!(rows[2], ["127.0.0.1:5303", "?", "UNREACHABLE: connection refused"]);
    // At our serial, but its zone not found equal there: not current.
    assert_eq!(rows[3], ["127.0.0.1:5304", "12", "UNVERIFIED (zone not read back yet)"]);
    assert_eq!(rows[4], ["127.0.0.1:5305", "12", "DIFFERS at serial 12: 1 of our records missing, 1 not ours"]);
    assert_eq!(rows[5], ["127.0.0.1:5306", "12", "UNVERIFIED: the AXFR was answered REFUSED"]);
    // A status with a field this build does not know is refused, not half read.
    let mut drifted = serde_json::to_value(&status).expect("writes");
    drifted["renamed"] = serde_json::json!(1);
    assert!(serde_json::from_value::<Status>(drifted).is_err());
}
