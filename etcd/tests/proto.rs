//! The etcd API's generated code, checked in as `src/client/etcdserverpb.rs` so that building
//! dnsplan needs no `protoc`, is exactly what prost and tonic generate from
//! `proto/etcd.proto` today. A change to the proto file, or a new prost or tonic, fails here
//! until the code is generated again:
//!
//! ```sh
//! DNSPLAN_REGENERATE_PROTO=1 cargo test -p dnsplan-etcd --test proto
//! ```
//!
//! This test needs `protoc` (Debian's protobuf-compiler); nothing else does.

use std::path::Path;

#[test]
fn the_checked_in_etcd_api_code_is_what_protoc_generates() -> anyhow::Result<()> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let checked_in = manifest.join("src/client/etcdserverpb.rs");
    let proto = manifest.join("proto");
    let out = tempfile::tempdir()?;
    match std::process::Command::new(std::env::var_os("PROTOC").unwrap_or_else(|| "protoc".into())).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => anyhow::bail!(
            "protoc is not installed (Debian: apt-get install protobuf-compiler); only this test needs it, to check the generated code"
        ),
    }
    tonic_prost_build::configure().build_server(false).out_dir(out.path()).compile_protos(&[proto.join("etcd.proto")], &[proto])?;
    let generated = std::fs::read_to_string(out.path().join("etcdserverpb.rs"))?;
    if std::env::var_os("DNSPLAN_REGENERATE_PROTO").is_some() {
        std::fs::write(&checked_in, &generated)?;
        return Ok(());
    }
    let current = std::fs::read_to_string(&checked_in)?;
    anyhow::ensure!(
        current == generated,
        "{} is not what proto/etcd.proto generates now; run DNSPLAN_REGENERATE_PROTO=1 cargo test -p dnsplan-etcd --test proto",
        checked_in.display()
    );
    Ok(())
}
