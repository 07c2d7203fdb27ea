//! The `dnsplan-authority` command line, in the library so that deployment files can be checked
//! against the real flags.

use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
#[command(version, about = "dnsplan's authoritative DNS server and control API")]
pub struct Args {
    /// Path to authority.toml.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Open an embedded store that went back behind its high-water mark (a damaged `db`
    /// file): keep what is left and move the SOA serial past everything served.
    #[arg(long)]
    pub accept_store_loss: bool,
    #[command(flatten)]
    pub log: dnsplan_common::daemon::LogArgs,
}
