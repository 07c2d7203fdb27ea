//! A damaged embedded store, as an operator meets it: `dnsplan up` serves and is killed,
//! bytes of its sled `db` file are flipped, and it is started again. sled opens such a store
//! as if the damage were a torn tail, without an error; `dnsplan up` must refuse it, name
//! the file and the ways out, and with `--accept-store-loss` serve again with a SOA serial
//! above everything it served before.

mod support;

use dnsplan_common::dns_probe::{self, RecordType};
use std::io::Read;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::{WITHIN, up, up_command, up_with};

/// The SOA serial `dns` answers for the zone, once it answers with one.
async fn serial(dns: SocketAddr) -> anyhow::Result<u32> {
    let deadline = Instant::now() + WITHIN;
    loop {
        if let Ok(answer) = dns_probe::query(dns, "example.test.", RecordType::SOA, Duration::from_secs(1)).await
            && let Some(serial) = answer.soa_serial
        {
            return Ok(serial);
        }
        anyhow::ensure!(Instant::now() < deadline, "{dns} never answered the zone's SOA");
        tokio::task::yield_now().await;
    }
}

/// Teeth: without the high-water check `dnsplan up` starts on the damaged store and the
/// refused start is not refused ("started on a store that went back"); without moving the
/// applied-change count, the accepted start answers a serial at or below the one served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_store_is_refused_and_accepting_the_loss_never_goes_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let served = {
        let up = up(dir.path())?;
        support::until_dns(up.dns, "api.example.test.", |a| !a.is_empty()).await?;
        serial(up.dns).await?
        // Dropped: SIGKILL.
    };

    // Flip bytes near the start of sled's log: sled takes it for a torn tail and drops it
    // and everything after.
    let db = dir.path().join("data").join("db");
    let mut bytes = std::fs::read(&db)?;
    anyhow::ensure!(bytes.len() > 164, "the store's db file is only {} bytes", bytes.len());
    for byte in &mut bytes[100..164] {
        *byte ^= 0xff;
    }
    std::fs::write(&db, &bytes)?;

    let mut refused = up_command(dir.path())?.stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let deadline = Instant::now() + WITHIN;
    let status = loop {
        if let Some(status) = refused.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            refused.kill()?;
            refused.wait()?;
            anyhow::bail!("dnsplan up started on a store that went back");
        }
        // A poll of the child's exit, bounded by the deadline.
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    refused.stderr.take().ok_or_else(|| anyhow::anyhow!("no stderr"))?.read_to_string(&mut stderr)?;
    assert_eq!(status.code(), Some(1), "{stderr}");
    for want in ["went back", "store-high-water", "--accept-store-loss", "restore a copy of the whole directory"] {
        assert!(stderr.contains(want), "the refusal does not say {want:?}: {stderr}");
    }

    {
        let up = up_with(dir.path(), &["--accept-store-loss"])?;
        let now = serial(up.dns).await?;
        assert!(now > served, "after accepting the loss the SOA serial is {now}, not above the {served} served before");
        support::until_dns(up.dns, "api.example.test.", |a| !a.is_empty()).await?;
    }
    // Accepted once: the next start needs no flag.
    let up = up(dir.path())?;
    support::until_dns(up.dns, "api.example.test.", |a| !a.is_empty()).await?;
    assert!(serial(up.dns).await? > served);
    Ok(())
}
