//! The serving image on the embedded store (`image`): a restart serves it only brought up to
//! the store, and never an image of another history; a bad image costs only time.

mod support;

use dnsplan_authority::follow::image;
use dnsplan_authority::zone::dns_zone::StaticZone;
use dnsplan_authority::zone::snapshot::{Family, Managed, wire_key};
use dnsplan_common::store::sled::SledStore;
use dnsplan_common::{Generation, Store};
use hickory_proto::rr::{Name, RecordType};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use support::*;

const DEADLINE: Duration = Duration::from_secs(10);

fn db(address: &str) -> [(&'static str, dnsplan_common::Endpoint); 1] {
    [("db.example.test.", endpoint(30, vec![target(address, "a", 1)]))]
}

/// Runs an authority on `dir` until `db.example.test.` answers `address` (after the plan is
/// published and applied through it), then stops it, which writes the image.
async fn serve_and_stop(dir: &Path, plan: &dnsplan_common::ValidatedPlan, address: &str) -> anyhow::Result<()> {
    let auth = TestAuthority::start(dir, 8).await?;
    publish_and_apply(&auth.store, plan).await?;
    let want: IpAddr = address.parse()?;
    until(auth.dns, "db.example.test.", RecordType::A, DEADLINE, |m| addresses(m) == [want].into()).await?;
    auth.stop().await
}

fn zone_of(dir: &Path) -> anyhow::Result<Arc<StaticZone>> {
    let config = dnsplan_authority::config::AuthorityConfig::load(&dir.join("authority.toml"))?;
    Ok(Arc::new(StaticZone::load(&config.dns_zone, dir)?))
}

async fn first_answer(auth: &TestAuthority, name: &str) -> anyhow::Result<std::collections::BTreeSet<IpAddr>> {
    let (msg, _) = ask(auth.dns, name, RecordType::A, Ask::default()).await?;
    Ok(addresses(&msg))
}

/// An image written at shutdown is served at the next start, with what the store applied
/// while the authority was down merged in before the first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_serves_the_image_brought_up_to_the_store() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    serve_and_stop(dir.path(), &plan(1, &db("10.3.0.1")), "10.3.0.1").await?;
    let path = image::path_in(&dir.path().join("data"));
    let (mark, mut saved) = image::read(&path, zone_of(dir.path())?)?.expect("the image is written at shutdown");
    let mark = mark.expect("the embedded store gives a history mark");
    assert_eq!((mark.applied_changes, saved.applied_changes), (1, 1), "the image holds the state after plan 1's one switch");

    // Marked so that its use shows: a name only the image has (same mark, so it is used).
    let only_here = Managed {
        generation: Generation(1),
        ttl_secs: 30,
        v4: Family { targets: [("10.9.9.9".parse()?, 1)].into_iter().collect() },
        v6: Family::default(),
    };
    saved.load_served(&wire_key(&Name::from_ascii("only-here.example.test.")?), only_here);
    saved.finish_load(mark.applied_changes, saved.content_changes);
    image::save(&path, &saved, Some(&mark))?;

    // While the authority is down, plan 2 moves db (as an enactor on this store would).
    {
        let store = SledStore::open(dir.path().join("data"))?;
        let two = plan(2, &db("10.3.0.9"));
        publish_and_apply(&store, &two).await?;
        // What the next start will serve before its first answer (the follower would catch
        // up a moment later, so over the wire a missing merge shows only by chance).
        let (saved_at, resumed) = image::resume(&store, &path, zone_of(dir.path())?, None).await.expect("the image is this store's");
        assert_eq!(saved_at, 1);
        assert_eq!(resumed.applied_changes, 2);
        let db_name = dnsplan_common::DnsName::parse("db.example.test.")?;
        assert_eq!(
            resumed.managed_generation(&db_name),
            Some(Generation(2)),
            "the image is resumed without the change the store applied after it"
        );
    }

    let again = TestAuthority::start(dir.path(), 8).await?;
    // No waiting: the first answers are the image's and the store's since.
    assert_eq!(first_answer(&again, "only-here.example.test.").await?, ["10.9.9.9".parse::<IpAddr>()?].into(), "the image was not served");
    assert_eq!(
        first_answer(&again, "db.example.test.").await?,
        ["10.3.0.9".parse::<IpAddr>()?].into(),
        "the image was served without the change the store applied after it"
    );
    again.stop().await?;
    let (_, saved) = image::read(&path, zone_of(dir.path())?)?.expect("image");
    assert_eq!(saved.applied_changes, 2, "the stop writes the image of the state served");
    Ok(())
}

/// An image from another store at the same applied-change count is not served: its history
/// mark is not the store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_of_another_store_is_not_served() -> anyhow::Result<()> {
    let (one, two) = (tempfile::tempdir()?, tempfile::tempdir()?);
    serve_and_stop(one.path(), &plan(1, &db("10.3.0.1")), "10.3.0.1").await?;
    serve_and_stop(two.path(), &plan(1, &db("10.3.0.2")), "10.3.0.2").await?;
    let image_two = image::path_in(&two.path().join("data"));
    std::fs::copy(image::path_in(&one.path().join("data")), &image_two)?;

    let again = TestAuthority::start(two.path(), 8).await?;
    assert_eq!(first_answer(&again, "db.example.test.").await?, ["10.3.0.2".parse::<IpAddr>()?].into(), "another store's image was served");
    again.stop().await?;
    let store = SledStore::open(two.path().join("data"))?;
    let (mark, _) = image::read(&image_two, zone_of(two.path())?)?.expect("image");
    assert_eq!(mark, store.history_mark(1).await?, "the stop writes this store's own image over the other's");
    Ok(())
}

/// A torn or corrupt image costs the start its speed, nothing else: the store's state is
/// served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_image_is_not_served() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    serve_and_stop(dir.path(), &plan(1, &db("10.3.0.1")), "10.3.0.1").await?;
    let path = image::path_in(&dir.path().join("data"));
    let mut bytes = std::fs::read(&path)?;
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&path, &bytes)?;
    assert!(matches!(image::read(&path, zone_of(dir.path())?), Err(image::ImageError::Corrupt { .. })));
    std::fs::write(&path, &bytes[..bytes.len() / 2])?;
    assert!(matches!(image::read(&path, zone_of(dir.path())?), Err(image::ImageError::Corrupt { .. })));

    let again = TestAuthority::start(dir.path(), 8).await?;
    assert_eq!(first_answer(&again, "db.example.test.").await?, ["10.3.0.1".parse::<IpAddr>()?].into());
    again.stop().await?;
    assert!(image::read(&path, zone_of(dir.path())?)?.is_some(), "the stop writes a good image over the torn one");
    Ok(())
}
