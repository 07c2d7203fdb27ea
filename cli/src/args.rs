//! The `dnsplan` command line, in the library so that deployment files can be checked
//! against the real flags.

use crate::{commands, output};
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser)]
#[command(version, about = "dnsplan: authoritative DNS that follows health-checked, fenced plans")]
pub struct Cli {
    /// The control API of the stack to operate.
    #[arg(long, global = true, env = "DNSPLAN_CONTROL", default_value = "http://127.0.0.1:8053")]
    pub control: String,
    /// The control API's bearer token (for writes).
    #[arg(long, global = true, env = "DNSPLAN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Read the token from this stack config (dnsplan.toml's `token`) when none is given.
    #[arg(long, global = true)]
    pub stack_config: Option<PathBuf>,
    /// Output format of read commands.
    #[arg(long, global = true, value_enum, default_value_t = output::Format::Text)]
    pub output: output::Format,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the authority, the planner, three enactors and demo backends in one process.
    Up {
        /// The stack's config (default: the built-in examples/dnsplan.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The embedded store's directory (default: data_dir of the config, ./dnsplan-data).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Serve DNS here (UDP and TCP) instead of the config's address.
        #[arg(long)]
        dns: Option<SocketAddr>,
        /// Serve the control API here instead of the config's address.
        #[arg(long = "listen-control")]
        listen_control: Option<SocketAddr>,
        #[arg(long, value_parser = ["text", "json"], default_value = "text")]
        log_format: String,
    },
    /// Serve demo backends (HTTP answering `ok`, TCP accepting) for the compose stack.
    DemoBackend {
        /// HTTP listen addresses.
        #[arg(long)]
        http: Vec<SocketAddr>,
        /// TCP listen addresses.
        #[arg(long)]
        tcp: Vec<SocketAddr>,
    },
    #[command(flatten)]
    Ops(commands::Command),
}
