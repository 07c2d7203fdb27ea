//! The `dnsplan` command line, in the library so that deployment files can be checked
//! against the real flags, and the shell completions and man pages generated from it (so
//! they cannot drift from the flags the binary takes).

use crate::{commands, output};
use clap::{CommandFactory, Parser, Subcommand};
use dnsplan_common::daemon::LogArgs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(version, about = "dnsplan: authoritative DNS that follows health-checked, fenced plans")]
pub struct Cli {
    /// The control API of the stack to operate.
    #[arg(long, global = true, env = "DNSPLAN_CONTROL", default_value = "http://127.0.0.1:8053")]
    pub control: String,
    /// The control API's bearer token: `control.token`, or a `[[control.credential]]`'s.
    #[arg(long, global = true, env = "DNSPLAN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Read the token from this stack config (dnsplan.toml's `token`) when none is given.
    #[arg(long, global = true)]
    pub stack_config: Option<PathBuf>,
    /// For an `https://` control API: the CA that signed its certificate (PEM).
    #[arg(long, global = true, env = "DNSPLAN_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// A client certificate to present (PEM), for a `client_cert` credential; with --key-file.
    #[arg(long, global = true, env = "DNSPLAN_CERT_FILE", requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, global = true, env = "DNSPLAN_KEY_FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// Sign every plan this command publishes (rollback, retire, plans publish) with this
    /// Ed25519 key (PEM, mode 0600; `dnsplan key new`), for a stack with a keyring.
    #[arg(long, global = true, env = "DNSPLAN_SIGNING_KEY")]
    pub signing_key: Option<PathBuf>,
    /// Output format of read commands.
    #[arg(long, global = true, value_enum, default_value_t = output::Format::Text)]
    pub output: output::Format,
    /// The DNS zone the plan commands act on: one the store manages beside its first zone
    /// (`zone add --managed`). Without it, the store's first zone.
    #[arg(long, global = true, env = "DNSPLAN_ZONE")]
    pub zone: Option<String>,
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
        /// Open a store that went back behind its high-water mark (a damaged `db` file): keep
        /// what is left and move the SOA serial past everything served.
        #[arg(long)]
        accept_store_loss: bool,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Serve demo backends (HTTP answering `ok`, TCP accepting) for the compose stack.
    DemoBackend {
        /// HTTP listen addresses.
        #[arg(long)]
        http: Vec<SocketAddr>,
        /// TCP listen addresses.
        #[arg(long)]
        tcp: Vec<SocketAddr>,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Print a completion script for SHELL on stdout, e.g.
    /// `dnsplan completions bash > /etc/bash_completion.d/dnsplan`.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write man pages into DIR: dnsplan.1 and one per subcommand (dnsplan-rollback.1,
    /// dnsplan-plans-diff.1, ...), e.g. `dnsplan man --dir /usr/local/share/man/man1`.
    Man {
        /// The directory to write into (created if missing).
        #[arg(long)]
        dir: PathBuf,
    },
    /// Make credentials for the control API's roles (nothing is sent anywhere).
    Credential {
        #[command(subcommand)]
        command: CredentialCommand,
    },
    /// Make and show plan signing keys (nothing is sent anywhere).
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    #[command(flatten)]
    Ops(commands::Command),
}

#[derive(Subcommand)]
pub enum KeyCommand {
    /// A new Ed25519 plan signing key for NAME, written to FILE (mode 0600, never over an
    /// existing file); prints its public key and the `[[keyring.key]]` table that trusts it.
    New {
        /// Whose key it is, as the keyring and its errors will name it (`planner-eu1`, `alice`).
        name: String,
        /// Where to write the private key (PEM).
        #[arg(long)]
        file: PathBuf,
        /// The DNS zones it may author plans for (repeat; `*` for every zone).
        #[arg(long = "dns-zone", default_value = "*")]
        zones: Vec<String>,
        /// Whom it may sign as (repeat): `planner:ID`, `operator:NAME`, `planner:*`, `operator:*`.
        #[arg(long = "author", required = true)]
        authors: Vec<String>,
    },
    /// The public key of the private key in FILE.
    Public {
        /// The private key (PEM), as `key new` wrote it.
        file: PathBuf,
    },
}

#[derive(Subcommand)]
pub enum CredentialCommand {
    /// A new random token for NAME with ROLEs: prints the token (shown once) and the
    /// `[[control.credential]]` table for authority.toml, which holds only its SHA-256.
    New {
        /// Who holds it, as audit lines will name it (`enactor-eu1`, `alice`).
        name: String,
        /// A role it has (repeat for several): read, operate, enact, plan, admin.
        #[arg(long = "role", value_enum, required = true)]
        roles: Vec<dnsplan_authority::control::access::Role>,
    },
    /// The SHA-256 of a token read from standard input (one line), for a table's `sha256`.
    Hash,
}

/// The name the completion scripts complete and the man pages are titled with.
pub const BIN_NAME: &str = "dnsplan";

/// The completion script of `shell` for `dnsplan`. Into memory first: clap_complete panics
/// on a failed write, and a closed stdout (`| head`) must be an error, not a panic.
pub fn completion_script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), BIN_NAME, &mut script);
    script
}

/// Writes `dnsplan.1` and one page per subcommand, at every depth and not hidden
/// (`dnsplan-plans-diff.1`), into `dir`, creating it if missing; returns the files written.
pub fn write_man_pages(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    fn write(command: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
        // The package and version in every footer (a subcommand has no version of its own).
        let page = clap_mangen::Man::new(command.clone()).source(concat!("dnsplan ", env!("CARGO_PKG_VERSION")));
        written.push(page.generate_to(dir)?);
        for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
            write(sub, dir, written)?;
        }
        Ok(())
    }
    std::fs::create_dir_all(dir)?;
    // Built, so each subcommand has its display name (`dnsplan-plans-diff`) for its file
    // name and title; `help` is clap's, not a command of ours.
    let mut command = Cli::command().name(BIN_NAME).disable_help_subcommand(true);
    command.build();
    let mut written = Vec::new();
    write(&command, dir, &mut written)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every argument of every command says what it is for, so `--help`, the man pages and
    /// the completions never show a bare flag.
    #[test]
    fn every_argument_has_help() {
        fn walk(command: &clap::Command, path: &str, bare: &mut Vec<String>) {
            for arg in command.get_arguments() {
                if arg.get_help().is_none() && !matches!(arg.get_id().as_str(), "help" | "version") {
                    bare.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), bare);
            }
        }
        let mut bare = Vec::new();
        walk(&Cli::command(), "dnsplan", &mut bare);
        assert!(bare.is_empty(), "arguments without help: {bare:#?}");
    }
}
