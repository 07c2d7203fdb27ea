//! `dnsplan-authority --config authority.toml`: the authoritative DNS server and control API.

use anyhow::Context;
use clap::Parser;
use dnsplan_authority::args::Args;
use dnsplan_authority::config::AuthorityConfig;
use std::path::PathBuf;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    dnsplan_common::daemon::init(args.log.log_format);
    // Before any socket or file is opened: connections come out of this limit.
    dnsplan_common::open_files::raise_to_hard();
    // Before anything slow: a SIGTERM during start-up is then a clean stop, not a kill.
    let shutdown = dnsplan_common::daemon::shutdown_signal();
    let config = AuthorityConfig { accept_store_loss: args.accept_store_loss, ..AuthorityConfig::load(&args.config)? };
    let config_dir = args.config.parent().map(PathBuf::from).unwrap_or_default();
    let bound = |b: dnsplan_authority::run::Bound| {
        for addr in &b.dns {
            dnsplan_common::daemon::announce(&format!("dns      {addr} (udp, tcp)"));
        }
        dnsplan_common::daemon::announce(&format!("control  {}", b.control_url()));
    };
    dnsplan_authority::run::run(config, &config_dir, shutdown, bound).await.context("authority failed")
}
